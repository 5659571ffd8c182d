"""Pack files of an incremental checkpoint: append-once files of JSON blobs, referenced by offset.

A generation of the agent's checkpoint (see :mod:`calmon.state.checkpoint.store`) writes the buckets that
changed since the previous generation into one *pack* ``pack-<generation, 12 digits>.jsonl``:
a header line, then one JSON document per line::

    {"format": "calmon-checkpoint-pack", "version": 1, "generation": 7}
    {"format": "calmon.bucket", ...}
    ...

A manifest refers to a blob by a :class:`~calmon.state.checkpoint.schema.BlobRef` ``{"pack": 7, "at": 61,
"len": 33864, "crc": 2740110361}`` -- pack generation, byte offset, length and the CRC-32 of those bytes, so a
damaged or edited blob is detected and named (``"crc": null`` accepts an edited one). A pack is written to a
temporary file, fsynced, renamed to its final name and the directory fsynced *before* the manifest that refers
to it is written; a crash during the pack leaves a temporary file no manifest refers to
(removed by the next save).

Examples
--------
>>> import tempfile, pathlib
>>> d = pathlib.Path(tempfile.mkdtemp())
>>> w = PackWriter(d, 3)
>>> ref = w.append(b'{"x": 1}')
>>> w.commit(), ref["pack"], pack_path(d, 3).name
(True, 3, 'pack-000000000003.jsonl')
>>> with PackReader(d) as r:
...     r.read(ref, "models.m")
b'{"x": 1}'
"""

from __future__ import annotations

import json
import os
import re
import tempfile
import zlib
from pathlib import Path
from types import TracebackType
from typing import Any

from calmon.formats.jsonio import check_replaceable, fsync_dir
from calmon.state.checkpoint.schema import PACK_FORMAT, PACK_VERSION, BlobRef, BlobRefDoc, SchemaError, convert

__all__ = ["BlobRef", "CheckpointError", "PackReader", "PackWriter", "is_ref", "pack_path", "PACK_NAME"]

PACK_NAME = re.compile(r"^pack-([0-9]{12})\.jsonl$")
#: Bytes buffered before a write(2) while a pack is written.
_BUFFER = 1 << 20


class CheckpointError(ValueError):
    """Checkpoint files exist but cannot be read (the message names the file and, for a blob, the field)."""


def pack_path(directory: Path, generation: int) -> Path:
    """The pack file of a generation."""
    return directory / f"pack-{generation:012d}.jsonl"


def is_ref(value: Any) -> bool:
    """Whether a manifest value is a :class:`BlobRef` (an inline document never has ``pack`` and ``at``)."""
    return isinstance(value, dict) and "pack" in value and "at" in value


class PackWriter:
    """Write one pack: append blobs, then :meth:`commit` (durable, atomic) or :meth:`abort`.

    Parameters
    ----------
    directory
        The checkpoint directory.
    generation
        The generation whose manifest will refer to this pack.
    """

    def __init__(self, directory: Path, generation: int) -> None:
        self.generation = int(generation)
        self.final = pack_path(directory, generation)
        fd, tmp = tempfile.mkstemp(prefix=f".{self.final.name}.", suffix=".tmp", dir=directory)
        self._tmp = Path(tmp)
        self._file = os.fdopen(fd, "wb", buffering=_BUFFER)
        head = json.dumps({"format": PACK_FORMAT, "version": PACK_VERSION, "generation": self.generation},
                          separators=(",", ":")).encode() + b"\n"
        self._file.write(head)
        self.size = len(head)
        #: Blobs appended so far.
        self.count = 0

    def append(self, data: bytes) -> BlobRef:
        """Append one blob (a JSON document without newlines); returns its reference."""
        ref: BlobRef = {"pack": self.generation, "at": self.size, "len": len(data), "crc": zlib.crc32(data)}
        self._file.write(data)
        self._file.write(b"\n")
        self.size += len(data) + 1
        self.count += 1
        return ref

    def commit(self) -> bool:
        """Make the pack durable under its final name; an empty pack is discarded (returns False)."""
        if not self.count:
            self.abort()
            return False
        self._file.flush()
        os.fsync(self._file.fileno())
        self._file.close()
        check_replaceable(self.final)  # never a device, fifo or directory someone put under a pack's name
        os.replace(self._tmp, self.final)
        fsync_dir(self.final.parent)
        return True

    def abort(self) -> None:
        """Drop the temporary file (after an error)."""
        if not self._file.closed:
            self._file.close()
        try:
            self._tmp.unlink()
        except FileNotFoundError:
            pass


class PackReader:
    """Read blobs by reference, verifying their CRC; keeps one open file per pack until closed.

    Parameters
    ----------
    directory
        The checkpoint directory.
    """

    def __init__(self, directory: Path) -> None:
        self.directory = Path(directory)
        self._fds: dict[int, int] = {}

    def _fd(self, pack: int, field: str) -> int:
        fd = self._fds.get(pack)
        if fd is None:
            path = pack_path(self.directory, pack)
            try:
                fd = self._fds[pack] = os.open(path, os.O_RDONLY)
            except OSError as exc:
                raise CheckpointError(f"field {field}: blob in {path}: {exc.strerror or exc}") from None
        return fd

    def read(self, ref: Any, field: str) -> bytes:
        """The bytes of a blob; :class:`CheckpointError` naming the pack file and ``field`` when damaged."""
        if not is_ref(ref):
            raise CheckpointError(f"field {field}: a blob reference needs integer pack, at and len, got {ref!r:.80}")
        try:
            got = convert(ref, BlobRefDoc)
        except SchemaError as exc:
            raise CheckpointError(f"field {'.'.join(filter(None, (field, exc.field)))}: {exc.why}") from None
        pack, at, n, crc = got.pack, got.at, got.len, got.crc
        data = os.pread(self._fd(pack, field), n, at)
        if len(data) != n:
            raise CheckpointError(f"field {field}: blob in {pack_path(self.directory, pack)} at bytes {at}-{at + n}: "
                                  "file too short")
        if crc is not None and zlib.crc32(data) != crc:
            raise CheckpointError(f"field {field}: blob in {pack_path(self.directory, pack)} at bytes {at}-{at + n}: "
                                  "checksum mismatch (file damaged or edited; set its \"crc\" to null to accept an "
                                  "edited blob)")
        return data

    def load(self, ref: Any, field: str) -> Any:
        """The JSON document of a blob (see :meth:`read`)."""
        data = self.read(ref, field)
        try:
            return json.loads(data)
        except ValueError as exc:
            raise CheckpointError(f"field {field}: blob in {pack_path(self.directory, ref['pack'])} at bytes "
                                  f"{ref['at']}-{ref['at'] + ref['len']}: not valid JSON ({exc})") from None

    def close(self) -> None:
        for fd in self._fds.values():
            os.close(fd)
        self._fds.clear()

    def __enter__(self) -> PackReader:
        return self

    def __exit__(self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None) -> None:
        self.close()
