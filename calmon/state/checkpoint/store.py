"""Atomic, generational checkpoints: a manifest per generation, plus pack files of changed blobs.

File format
-----------
Each generation has one JSON *manifest* ``checkpoint-<generation, 12 digits>.json``::

    {"format": "calmon-checkpoint", "version": 3, "generation": 7,
     "created": "2026-11-21T23:59:59.123456Z", "packs": [5, 7], "sha256": "<hex of the state bytes>",
     "state": {...}}

``state`` is the document given to :meth:`CheckpointStore.save`; ``sha256`` is the SHA-256 of the
exact bytes of the ``state`` value as written in the file (the text between ``"state":`` and the
final ``}``), so a damaged file is detected (``"sha256": null`` accepts an edited one).
Non-finite floats are written as ``NaN``/``Infinity`` (as Python's ``json`` does).

Inside ``state`` a value may be a *blob reference* ``{"pack": 5, "at": 61, "len": 33864, "crc": ...}``
(:class:`~calmon.state.checkpoint.packs.BlobRef`): the document stored at that offset of the pack file
``pack-000000000005.jsonl`` (:mod:`calmon.state.checkpoint.packs`).  ``packs`` lists every pack the
manifest refers to (it is absent when it refers to none).  The agent stores each bucket of its
rings as a blob and writes, per generation, only the buckets that changed since the previous one
(:mod:`calmon.state.checkpoint.incremental`); a bucket that did not change keeps its reference into an
older pack.  Version 3 (written now) is version 2 whose bucket blobs may be *packed* documents
(``calmon.bucket`` version 2: every array of a bucket in one compressed payload, see
:mod:`calmon.stats.packed`), which a version-2 reader would not understand -- so it refuses them by
the version number instead.  Version-2 manifests (buckets as unpacked documents) and version-1
manifests (no ``packs``, every bucket inline) are still read.  The names, versions and schema of
these documents are in :mod:`calmon.state.checkpoint.schema`.

Writing order and atomicity
---------------------------
1. the new pack goes to a temporary file, is fsynced, renamed to its final name and the
   directory fsynced (:class:`~calmon.state.checkpoint.packs.PackWriter`);
2. the manifest is written atomically (:func:`calmon.formats.jsonio.write_bytes_atomic`: temporary
   file, fsync, ``os.replace``, directory fsync) -- **the commit point**;
3. manifests older than the newest ``keep`` are removed, then every pack no remaining manifest
   refers to, and stray temporary files.

A crash before step 2 leaves the previous manifest and its packs untouched (the new pack is
an unreferenced file, removed or overwritten later); a crash after it leaves the new
generation.  :meth:`CheckpointStore.load` returns the newest generation that verifies -- its manifest
(checksum, schema) *and* every blob it refers to (pack present and long enough, CRC) -- falling back to
older generations when the newest is damaged (a truncated or lost pack, a flipped byte), with a warning
naming the file and the reason; since packs are only removed when no kept manifest refers to them, each
of the ``keep`` newest generations stays restorable.  A generation is restored whole (state, source and
dead-letter positions from the same manifest), so a fallback re-reads what the skipped generations had
covered and counts nothing twice.
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import json
import logging
import mmap
import os
import re
import zlib
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np

from calmon.formats.jsonio import write_bytes_atomic
from calmon.state.checkpoint.packs import PACK_NAME, CheckpointError, PackReader, PackWriter, is_ref, pack_path
from calmon.state.checkpoint.schema import FORMAT, VERSION, ManifestDoc, SchemaError, convert

__all__ = ["CheckpointStore", "CheckpointError", "FORMAT", "VERSION", "encode", "inline_refs"]

log = logging.getLogger(__name__)

_NAME = re.compile(r"^checkpoint-([0-9]{12})\.json$")
_STATE_KEY = b'"state":'


def _default(o: Any) -> Any:
    if isinstance(o, np.generic):
        return o.item()
    if isinstance(o, np.ndarray):
        return o.tolist()
    if isinstance(o, (set, frozenset, tuple)):
        return list(o)
    if isinstance(o, Path):
        return str(o)
    raise TypeError(f"checkpoint state is not JSON-serialisable: {type(o).__name__}")


def encode(doc: Any) -> bytes:
    """Compact JSON bytes of a checkpoint document (numpy values converted, ``NaN`` kept)."""
    return json.dumps(doc, separators=(",", ":"), allow_nan=True, default=_default).encode("utf-8")


class CheckpointStore:
    """Save and load checkpoint generations atomically in a directory, keeping the last ``keep``.

    Parameters
    ----------
    directory
        The state directory (created if missing).
    keep
        Number of generations kept restorable (>= 1; default 3).

    Examples
    --------
    >>> import tempfile
    >>> store = CheckpointStore(tempfile.mkdtemp(), keep=2)
    >>> store.load() is None
    True
    >>> for i in range(3):
    ...     _ = store.save({"events": i, "positions": {"files": []}})
    >>> store.load()["events"], store.generations()
    (2, [2, 3])

    A generation with blobs: write the pack first, then the manifest that refers to it.

    >>> gen = store.next_generation()
    >>> pack = store.open_pack(gen)
    >>> ref = pack.append(b'{"n": 41}')
    >>> _ = pack.commit()
    >>> _ = store.save({"bucket": ref}, generation=gen, packs=[gen])
    >>> store.inline(store.load())
    {'bucket': {'n': 41}}
    """

    def __init__(self, directory: str | os.PathLike[str], keep: int = 3) -> None:
        if int(keep) < 1:
            raise ValueError(f"keep must be >= 1, got {keep}")
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.keep = int(keep)
        #: The file :meth:`load` last returned the state of (for messages naming it).
        self.loaded_path: Path | None = None
        #: Packs each manifest refers to (filled as manifests are written or read; see :meth:`_prune`).
        self._packs_of: dict[int, frozenset[int]] = {}

    # ------------------------------------------------------------------ names
    def generations(self) -> list[int]:
        """Generation numbers of the final manifest files present, ascending."""
        return sorted(int(m.group(1)) for m in map(_NAME.match, os.listdir(self.directory)) if m)

    def pack_generations(self) -> list[int]:
        """Generation numbers of the final pack files present, ascending."""
        return sorted(int(m.group(1)) for m in map(PACK_NAME.match, os.listdir(self.directory)) if m)

    def path_of(self, generation: int) -> Path:
        """The manifest file of a generation."""
        return self.directory / f"checkpoint-{generation:012d}.json"

    def next_generation(self) -> int:
        """The number of the next generation (after every manifest and pack present)."""
        return max([0, *self.generations(), *self.pack_generations()]) + 1

    def open_pack(self, generation: int) -> PackWriter:
        """A writer of the pack of ``generation`` (commit it before :meth:`save` of that generation)."""
        return PackWriter(self.directory, generation)

    def reader(self) -> PackReader:
        """A reader of blob references of this directory (close it, or use it as a context manager)."""
        return PackReader(self.directory)

    # ------------------------------------------------------------------ save
    def save(self, doc: dict[str, Any], *, generation: int | None = None, packs: Iterable[int] = (),
             state: bytes | None = None) -> Path:
        """Write ``doc`` as a generation's manifest, atomically; prune old generations and packs.

        Parameters
        ----------
        doc
            JSON-serialisable state (numpy scalars and arrays are converted; prefer packed arrays).
        generation
            Its number (default :meth:`next_generation`; give the one its pack was opened with).
        packs
            Generations of the packs ``doc`` refers to (their files must already be committed).
        state
            ``doc`` already encoded by :func:`encode` (saves encoding it twice).

        Returns
        -------
        Path
            The manifest written.
        """
        if not isinstance(doc, dict):
            raise ValueError(f"checkpoint state must be a dict, got {type(doc).__name__}")
        gen = self.next_generation() if generation is None else int(generation)
        body = encode(doc) if state is None else state
        created = _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
        refs = frozenset(int(p) for p in packs)
        head: dict[str, Any] = {"format": FORMAT, "version": VERSION, "generation": gen, "created": created}
        if refs:
            head["packs"] = sorted(refs)
        head["sha256"] = hashlib.sha256(body).hexdigest()
        blob = json.dumps(head, separators=(",", ":"))[:-1].encode() + b"," + _STATE_KEY + body + b"}\n"
        final = self.path_of(gen)
        write_bytes_atomic(final, blob)  # the commit point
        self._packs_of[gen] = refs
        self._prune()
        return final

    def _prune(self) -> None:
        """Keep the newest ``keep`` manifests, the packs they refer to, and no temporary file."""
        gens = self.generations()
        for g in gens[:-self.keep]:
            _unlink(self.path_of(g))
            self._packs_of.pop(g, None)
        live: set[int] = set()
        for g in gens[-self.keep:]:
            live |= self._packs_referenced(g)
        for p in self.pack_generations():
            if p not in live:
                _unlink(pack_path(self.directory, p))
        for name in os.listdir(self.directory):
            if name.startswith(("checkpoint-", ".checkpoint-", ".pack-")) and name.endswith(".tmp"):
                _unlink(self.directory / name)

    def _packs_referenced(self, generation: int) -> frozenset[int]:
        """The ``packs`` of a manifest (read from its head once; a damaged manifest refers to none)."""
        got = self._packs_of.get(generation)
        if got is None:
            try:
                got = frozenset(convert(_read_head(self.path_of(generation)), ManifestDoc).packs or ())
            except (OSError, ValueError, TypeError) as exc:
                log.warning("checkpoint %s: cannot read its pack list (%s); it is not restorable",
                            self.path_of(generation), exc)
                got = frozenset()
            self._packs_of[generation] = got
        return got

    # ------------------------------------------------------------------ load
    def read(self, generation: int) -> dict[str, Any]:
        """Read and verify one manifest; raises :class:`CheckpointError` when it is damaged.

        Parameters
        ----------
        generation
            Generation number (see :meth:`generations`).

        Returns
        -------
        dict
            The state document (blob references not resolved: see :meth:`inline` and :meth:`reader`).
        """
        path = self.path_of(generation)
        try:
            data = path.read_bytes()
        except OSError as exc:
            raise CheckpointError(f"{path}: {exc}") from exc
        try:
            top = json.loads(data)
        except (ValueError, UnicodeDecodeError) as exc:
            raise CheckpointError(f"{path}: not valid JSON ({exc})") from exc
        if not isinstance(top, dict) or top.get("format") != FORMAT:
            raise CheckpointError(f"{path}: not a calmon checkpoint")
        version = top.get("version")
        if not isinstance(version, int) or version > VERSION:
            raise CheckpointError(f"{path}: checkpoint version {version!r} is not supported (max {VERSION})")
        try:
            head = convert(top, ManifestDoc)
        except SchemaError as exc:
            raise CheckpointError(f"{path}: {exc}") from None
        state, packs, digest = head.state, head.packs or [], head.sha256
        if state is None:
            raise CheckpointError(f"{path}: 'state' missing or not an object")
        if digest is not None:
            i = data.find(_STATE_KEY)
            body = data[i + len(_STATE_KEY):].rstrip()
            if i < 0 or not body.endswith(b"}") or hashlib.sha256(body[:-1].strip()).hexdigest() != digest:
                raise CheckpointError(f"{path}: checksum mismatch (file damaged or edited; "
                                      f"set \"sha256\": null to accept an edited file)")
        self._packs_of[generation] = frozenset(packs)
        return state

    def verify(self, generation: int, state: Any) -> None:
        """Check that every blob ``state`` refers to can be read: its pack exists and holds the blob's bytes,
        whose CRC matches (each referenced pack mapped once; the restore reads the bytes again from the page cache).

        Raises
        ------
        CheckpointError
            Naming the manifest, the field, the pack file and the reason (``file too short``: a truncated pack).
        """
        by_pack: dict[Any, list[Any]] = {}
        for ref in _refs(state):
            by_pack.setdefault(ref.get("pack"), []).append(ref)
        for pack, refs in by_pack.items():
            with _mapped(self.directory, pack) as data:
                bad = next((ref for ref in refs if not _intact(data, ref)), None)
            if bad is not None:  # read it the reader's way, for the message naming the field and the reason
                try:
                    with self.reader() as reader:
                        reader.read(bad, _path_of(state, bad) or "?")
                except CheckpointError as exc:
                    raise CheckpointError(f"{self.path_of(generation)}: {exc}") from None
                raise CheckpointError(f"{self.path_of(generation)}: blob reference {bad!r:.80} cannot be read")

    def load(self, verify: bool = True) -> dict[str, Any] | None:
        """The newest generation's state that verifies, or None when there is none.

        Temporary files of an interrupted save are ignored; a damaged newest generation -- its manifest, or
        with ``verify`` a blob it refers to (:meth:`verify`) -- is skipped with a warning naming the file and
        the reason, in favour of the previous one.

        Returns
        -------
        dict or None
            The state document given to :meth:`save` (blob references not resolved).

        Raises
        ------
        CheckpointError
            If checkpoint files exist but none of them verifies (starting from scratch would
            silently drop the state, so the agent must decide).
        """
        gens = self.generations()
        errors = []
        for g in reversed(gens):
            try:
                state = self.read(g)
                if verify:
                    self.verify(g, state)
            except CheckpointError as exc:
                log.warning("skipping damaged checkpoint: %s%s", exc,
                            "; falling back to the previous generation" if g != gens[0] else "")
                errors.append(str(exc))
                continue
            self.loaded_path = self.path_of(g)
            return state
        if gens:
            raise CheckpointError(f"no readable checkpoint in {self.directory}: " + "; ".join(errors))
        return None

    def inline(self, state: Any) -> Any:
        """A copy of ``state`` with every blob reference replaced by its document (tools and tests;
        the agent resolves its rings one model at a time instead, see :mod:`calmon.state.checkpoint.incremental`)."""
        with self.reader() as reader:
            return inline_refs(state, reader)


def inline_refs(node: Any, reader: PackReader, field: str = "", raw: bool = False) -> Any:
    """A copy of ``node`` with every blob reference replaced by its document (errors name ``field`` and below);
    with ``raw``, by the blob's bytes as stored (CRC checked, not parsed: the caller decodes them)."""
    if is_ref(node):
        return reader.read(node, field) if raw else reader.load(node, field)
    sep = "." if field else ""
    if isinstance(node, dict):
        return {k: inline_refs(v, reader, f"{field}{sep}{k}", raw) for k, v in node.items()}
    if isinstance(node, list):
        return [inline_refs(v, reader, f"{field}{sep}{i}", raw) for i, v in enumerate(node)]
    return node


def _refs(node: Any) -> Iterator[Any]:
    """Every blob reference inside ``node`` (depth first, no copy, no paths: a damaged one is named by
    :func:`_path_of` afterwards)."""
    stack = [node]
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            if is_ref(item):
                yield item
            else:
                stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)


@contextmanager
def _mapped(directory: Path, pack: Any) -> Iterator[memoryview | None]:
    """The bytes of a pack file, memory-mapped (None: no such pack; empty: an empty file)."""
    if type(pack) is not int:
        yield None
        return
    try:
        f = open(pack_path(directory, pack), "rb")  # noqa: SIM115 - closed below, after the map
    except OSError:
        yield None
        return
    with f:
        try:
            mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        except ValueError:  # an empty file cannot be mapped
            yield memoryview(b"")
            return
        view = memoryview(mm)
        try:
            yield view
        finally:
            view.release()
            mm.close()


def _intact(data: memoryview | None, ref: Any) -> bool:
    """Whether a blob reference has integer fields, lies inside its pack's bytes and matches its CRC."""
    at, n, crc = ref.get("at"), ref.get("len"), ref.get("crc")
    if data is None or type(at) is not int or type(n) is not int or at < 0 or n < 0 or at + n > len(data):
        return False
    return crc is None or (type(crc) is int and zlib.crc32(data[at:at + n]) == crc)


def _path_of(node: Any, target: Any, path: str = "") -> str | None:
    """The dotted path of the object ``target`` inside ``node`` (None: not found)."""
    if node is target:
        return path
    items = node.items() if isinstance(node, dict) else enumerate(node) if isinstance(node, list) else ()
    for k, v in items:
        if isinstance(v, (dict, list)):
            found = _path_of(v, target, f"{path}.{k}" if path else str(k))
            if found is not None:
                return found
    return None


def _read_head(path: Path) -> dict[str, Any]:
    """The fields of a manifest before ``"state"`` (without reading the state)."""
    data = b""
    with open(path, "rb") as f:
        while _STATE_KEY not in data:
            chunk = f.read(1 << 16)
            if not chunk:
                break
            data += chunk
    i = data.find(_STATE_KEY)
    if i > 0 and data[:i].rstrip().endswith(b","):
        head = json.loads(data[:i] + b'"state":null}')
    else:  # "state" is not last (a hand-written file): read it all
        head = json.loads(path.read_bytes())
    if not isinstance(head, dict):
        raise ValueError("not an object")
    return head


def _unlink(path: Path) -> None:
    try:
        path.unlink()
    except FileNotFoundError:
        pass
