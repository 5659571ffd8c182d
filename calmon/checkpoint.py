"""Atomic, generational checkpoints of the agent's state (statistics, join buffer, positions).

File format
-----------
Each generation is one JSON file ``checkpoint-<generation, 12 digits>.json`` in the store's
directory::

    {"format": "calmon-checkpoint", "version": 1, "generation": 7,
     "created": "2026-11-21T23:59:59.123456Z", "sha256": "<hex of the state bytes>", "state": {...}}

``state`` is the document given to :meth:`CheckpointStore.save` (numpy arrays inside it are already
base64 strings, see ``ScoreGrid.to_dict``); ``sha256`` is the SHA-256 of the exact bytes of the
``state`` value as written in the file (the text between ``"state":`` and the final ``}``), so a
damaged file is detected. Non-finite floats are written as ``NaN``/``Infinity`` (as Python's
``json`` does) so that they survive the round trip.

Writing is atomic (:func:`calmon.jsonio.write_bytes_atomic`): the document goes to a temporary
``.checkpoint-<g>.json.*.tmp``, which is fsynced, renamed over its final name with ``os.replace``
and followed by an fsync of the directory. A crash leaves either the previous generation or the
new one, never a torn final file; a stray temporary file (also the ``checkpoint-<g>.json.tmp`` of
earlier versions) is ignored by :meth:`CheckpointStore.load` and removed by the next
:meth:`CheckpointStore.save`. The newest
``keep`` generations are kept; :meth:`CheckpointStore.load` returns the newest one that verifies,
falling back to older generations when the newest is damaged.
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import json
import logging
import os
import re
from pathlib import Path
from typing import Any

import numpy as np

from calmon.jsonio import write_bytes_atomic

__all__ = ["CheckpointStore", "CheckpointError", "FORMAT", "VERSION"]

log = logging.getLogger(__name__)

FORMAT = "calmon-checkpoint"
VERSION = 1
_NAME = re.compile(r"^checkpoint-([0-9]{12})\.json$")
_STATE_KEY = b'"state":'


class CheckpointError(ValueError):
    """Checkpoint files exist but none of them can be read."""


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


class CheckpointStore:
    """Save and load checkpoints atomically in a directory, keeping the last ``keep`` generations.

    Parameters
    ----------
    directory
        The state directory (created if missing).
    keep
        Number of generations kept (>= 1; default 3).

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
    """

    def __init__(self, directory: str | os.PathLike[str], keep: int = 3) -> None:
        if int(keep) < 1:
            raise ValueError(f"keep must be >= 1, got {keep}")
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.keep = int(keep)
        #: The file :meth:`load` last returned the state of (for messages naming it).
        self.loaded_path: Path | None = None

    # ------------------------------------------------------------------ helpers
    def generations(self) -> list[int]:
        """Generation numbers of the final checkpoint files present, ascending."""
        out = []
        for name in os.listdir(self.directory):
            m = _NAME.match(name)
            if m:
                out.append(int(m.group(1)))
        return sorted(out)

    def path_of(self, generation: int) -> Path:
        """The file of a generation."""
        return self.directory / f"checkpoint-{generation:012d}.json"

    # ------------------------------------------------------------------ save
    def save(self, doc: dict[str, Any]) -> Path:
        """Write ``doc`` as the next generation, atomically; prune old generations.

        Parameters
        ----------
        doc
            JSON-serialisable state (numpy scalars and arrays are converted; prefer base64 blobs
            for large arrays).

        Returns
        -------
        Path
            The file written.
        """
        if not isinstance(doc, dict):
            raise ValueError(f"checkpoint state must be a dict, got {type(doc).__name__}")
        gens = self.generations()
        gen = (gens[-1] + 1) if gens else 1
        state = json.dumps(doc, separators=(",", ":"), allow_nan=True, default=_default).encode("utf-8")
        created = _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
        head = {"format": FORMAT, "version": VERSION, "generation": gen, "created": created,
                "sha256": hashlib.sha256(state).hexdigest()}
        blob = json.dumps(head, separators=(",", ":"))[:-1].encode() + b"," + _STATE_KEY + state + b"}\n"
        final = self.path_of(gen)
        write_bytes_atomic(final, blob)
        self._prune(gen)
        return final

    def _prune(self, newest: int) -> None:
        for g in self.generations():
            if g <= newest - self.keep:
                try:
                    self.path_of(g).unlink()
                except FileNotFoundError:
                    pass
        for name in os.listdir(self.directory):
            if name.startswith(("checkpoint-", ".checkpoint-")) and name.endswith(".tmp"):
                try:
                    (self.directory / name).unlink()
                except FileNotFoundError:
                    pass

    # ------------------------------------------------------------------ load
    def read(self, generation: int) -> dict[str, Any]:
        """Read and verify one generation; raises :class:`CheckpointError` when it is damaged.

        Parameters
        ----------
        generation
            Generation number (see :meth:`generations`).

        Returns
        -------
        dict
            The state document.
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
        state = top.get("state")
        if not isinstance(state, dict):
            raise CheckpointError(f"{path}: 'state' missing or not an object")
        digest = top.get("sha256")
        if digest is not None:
            i = data.find(_STATE_KEY)
            body = data[i + len(_STATE_KEY):].rstrip()
            if i < 0 or not body.endswith(b"}") or hashlib.sha256(body[:-1]).hexdigest() != digest:
                raise CheckpointError(f"{path}: checksum mismatch (file damaged or edited; "
                                      f"set \"sha256\": null to accept an edited file)")
        return state

    def load(self) -> dict[str, Any] | None:
        """The newest checkpoint that verifies, or None when there is none.

        Temporary files of an interrupted save are ignored; a damaged newest generation is
        skipped (with a warning) in favour of the previous one.

        Returns
        -------
        dict or None
            The state document given to :meth:`save`.

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
            except CheckpointError as exc:
                log.warning("skipping damaged checkpoint: %s", exc)
                errors.append(str(exc))
                continue
            self.loaded_path = self.path_of(g)
            return state
        if gens:
            raise CheckpointError(f"no readable checkpoint in {self.directory}: " + "; ".join(errors))
        return None
