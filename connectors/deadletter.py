"""Dead-letter sink writing rejected records as JSON lines, exactly once with the checkpoint.

Each rejected record becomes one line::

    {"reason": "not_json", "source": "files", "origin": "events.jsonl:17", "record": "<raw text>"}

When the raw bytes are not valid UTF-8 the line carries ``"record": "<base64>"`` and
``"record_encoding": "base64"``. A record longer than ``max_record_bytes`` (64 KiB by default; a
200 MB line must not become a 200 MB dead letter) keeps only its first bytes, with
``"truncated": true``, its full ``"size"`` in bytes and the ``"sha256"`` of the whole record; a
:class:`calmon.events.decoder.OversizedRecord` (a line the file source skipped without keeping it) brings
its own size and digest. :meth:`FileDeadLetterSink.position` flushes (and fsyncs) and returns
the file's size; the agent stores it in the checkpoint together with the statistics and the source
positions, and on restart :meth:`FileDeadLetterSink.seek` truncates the file back to that size, so
the records re-read after the restart are not written twice.

The file is appended to, so a process that starts without a checkpoint must checkpoint the
sink's :meth:`~FileDeadLetterSink.position` (its baseline) before it writes any dead letter:
otherwise the lines flushed by a run killed before its first checkpoint stay in the file and the
next run, which re-reads the same records from the start, appends them a second time.
"""

from __future__ import annotations

import base64
import hashlib
import logging
import os
from collections.abc import Mapping
from typing import Any

import msgspec

from calmon.formats.records import OversizedRecord
from connectors.base import RecordMeta

__all__ = ["FileDeadLetterSink", "DEADLETTER_POSITION_VERSION"]

log = logging.getLogger(__name__)

DEADLETTER_POSITION_VERSION = 1
_enc = msgspec.json.Encoder()


class FileDeadLetterSink:
    """Append rejected records to a JSONL file; truncate back to a checkpointed size on restart.

    Parameters
    ----------
    path
        The dead-letter file (created with its parent directories if missing; appended to).
    fsync
        Whether :meth:`position` fsyncs the file before reporting its size (default True: the
        size in a checkpoint is then durable even across a power loss).
    buffer_bytes
        Lines are buffered in memory and written once this many bytes are pending (and on
        :meth:`flush`, :meth:`position` and :meth:`close`).
    max_record_bytes
        Longer records keep only their first ``max_record_bytes`` bytes, plus size and SHA-256.

    Examples
    --------
    >>> import json, tempfile, pathlib
    >>> p = pathlib.Path(tempfile.mkdtemp()) / "dead.jsonl"
    >>> sink = FileDeadLetterSink(p)
    >>> sink.write([b'{"score": 2}'], ["out_of_range"], "files", ["a.jsonl:3"])
    >>> pos = sink.position()
    >>> sink.write([b"\\xff\\xfe"], ["not_json"], "files")
    >>> sink.flush()
    >>> [json.loads(x)["reason"] for x in p.read_text().splitlines()]
    ['out_of_range', 'not_json']
    >>> json.loads(p.read_text().splitlines()[1])["record_encoding"]
    'base64'
    >>> sink.seek(pos)        # restart from the checkpoint: the second dead letter is dropped
    >>> [json.loads(x)["origin"] for x in p.read_text().splitlines()]
    ['a.jsonl:3']
    >>> sink.close()
    """

    def __init__(
        self, path: str | os.PathLike[str], *, fsync: bool = True, buffer_bytes: int = 1 << 20,
        max_record_bytes: int = 1 << 16,
    ) -> None:
        if buffer_bytes < 0:
            raise ValueError(f"buffer_bytes must be >= 0, got {buffer_bytes}")
        if max_record_bytes < 1:
            raise ValueError(f"max_record_bytes must be >= 1, got {max_record_bytes}")
        self.max_record_bytes = int(max_record_bytes)
        self.path = os.fspath(path)
        self.fsync = bool(fsync)
        self.buffer_bytes = int(buffer_bytes)
        parent = os.path.dirname(self.path)
        if parent:
            os.makedirs(parent, exist_ok=True)
        self._fd: int | None = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        self._pending: list[bytes] = []
        self._pending_bytes = 0
        self.written = 0  # records written by this process (before any seek)

    def _fd_or_raise(self) -> int:
        if self._fd is None:
            raise ValueError(f"dead-letter sink {self.path} is closed")
        return self._fd

    def write(
        self, records: list[bytes], reasons: list[str], source: str, origins: list[str] | None = None,
        meta: list[RecordMeta] | None = None,
    ) -> None:
        """Record rejected raw records with their reason codes.

        Parameters
        ----------
        records
            Raw records (bytes).
        reasons
            One reason code per record (e.g. ``calmon.events.decoder.REASONS``).
        source
            Source name.
        origins
            Optional per-record origins (``"file:line"``, ``"topic/partition@offset"``).
        meta
            Optional per-record transport metadata: a Kafka record's key and headers are kept
            (``key_b64``, ``headers`` as ``[name, base64 value]`` pairs) so a replay can rebuild the record.
        """
        self._fd_or_raise()
        if len(reasons) != len(records):
            raise ValueError(f"{len(records)} records but {len(reasons)} reasons")
        if origins is not None and len(origins) != len(records):
            raise ValueError(f"{len(records)} records but {len(origins)} origins")
        lines = []
        for i, rec in enumerate(records):
            doc: dict[str, Any] = {"reason": str(reasons[i]), "source": source,
                                   "origin": None if origins is None else origins[i]}
            doc.update(self._record_fields(rec))
            if meta is not None:
                doc.update(_meta_fields(meta[i]))
            lines.append(_enc.encode(doc))
        if not lines:
            return
        blob = b"\n".join(lines) + b"\n"
        self._pending.append(blob)
        self._pending_bytes += len(blob)
        self.written += len(lines)
        if self._pending_bytes >= self.buffer_bytes:
            self.flush()

    def _record_fields(self, rec: bytes | str) -> dict[str, Any]:
        """The ``record`` (text or base64) of a dead letter; a bounded prefix, size and hash if long."""
        if isinstance(rec, str):
            text = rec
            try:
                rec = text.encode("utf-8", "surrogateescape")  # the bytes a surrogateescape decode came from
            except UnicodeEncodeError:
                rec = text.encode("utf-8", "surrogatepass")
        size = len(rec)  # an OversizedRecord's real size
        raw = bytes(rec)[:self.max_record_bytes]
        out: dict[str, Any] = {}
        try:
            out["record"] = raw.decode("utf-8")
        except UnicodeDecodeError:
            out["record"] = base64.b64encode(raw).decode("ascii")
            out["record_encoding"] = "base64"
        if isinstance(rec, OversizedRecord) or size > self.max_record_bytes:
            digest = rec.sha256 if isinstance(rec, OversizedRecord) else hashlib.sha256(rec).hexdigest()
            out.update(truncated=True, size=size, sha256=digest)
        return out

    def flush(self) -> None:
        """Write buffered lines to the file (to the OS; :meth:`position` also fsyncs)."""
        fd = self._fd_or_raise()
        if not self._pending:
            return
        data = memoryview(b"".join(self._pending))
        self._pending.clear()
        self._pending_bytes = 0
        while data:
            n = os.write(fd, data)
            data = data[n:]

    def unacknowledged(self) -> int:
        """Dead letters buffered in memory (0 after :meth:`flush`: a write to the file is not refused later,
        and the checkpoint's :meth:`position` fsyncs it)."""
        return sum(blob.count(b"\n") for blob in self._pending)

    def position(self) -> dict[str, Any]:
        """Flush (and fsync) and return ``{"version", "path", "dev", "ino", "size"}`` for the checkpoint."""
        self.flush()
        fd = self._fd_or_raise()
        if self.fsync:
            os.fsync(fd)
        st = os.fstat(fd)
        return {"version": DEADLETTER_POSITION_VERSION, "path": self.path, "dev": st.st_dev, "ino": st.st_ino,
                "size": st.st_size}

    def seek(self, position: Mapping[str, Any]) -> None:
        """Drop dead letters written after ``position``: truncate the file to the checkpointed size.

        Buffered lines are discarded. Nothing is truncated when the file is no longer the one
        checkpointed (another inode: rotated or replaced), or when it is already shorter (a warning
        is logged: lines were lost, e.g. the file was cleared by hand).

        Parameters
        ----------
        position
            A dict returned by :meth:`position`.
        """
        fd = self._fd_or_raise()
        try:
            size, ino = int(position["size"]), int(position["ino"])
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"not a dead-letter position: {position!r:.200}") from exc
        if size < 0:
            raise ValueError(f"dead-letter position size must be >= 0, got {size}")
        self._pending.clear()
        self._pending_bytes = 0
        st = os.fstat(fd)
        if st.st_ino != ino:
            log.warning("dead-letter file %s is not the checkpointed one (inode %s != %s); not truncated",
                        self.path, st.st_ino, ino)
            return
        if st.st_size > size:
            os.ftruncate(fd, size)
            if self.fsync:
                os.fsync(fd)
        elif st.st_size < size:
            log.warning("dead-letter file %s is shorter (%d) than checkpointed (%d)",
                        self.path, st.st_size, size)

    def close(self) -> None:
        """Flush and close the file (idempotent)."""
        if self._fd is None:
            return
        try:
            self.flush()
        finally:
            os.close(self._fd)
            self._fd = None


def _meta_fields(m: RecordMeta) -> dict[str, Any]:
    """A record's key and headers as JSON (base64: both are arbitrary bytes); nothing when it has neither."""
    out: dict[str, Any] = {}
    if m.key is not None:
        out["key_b64"] = base64.b64encode(m.key).decode("ascii")
    if m.headers:
        out["headers"] = [[name, base64.b64encode(value).decode("ascii")] for name, value in m.headers]
    return out
