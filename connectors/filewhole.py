"""Whole-file readers of :class:`connectors.files.FileSource`: compressed JSON Lines or CSV, Parquet and Arrow.

These files are read once they are complete, never followed while written: a compressed stream cannot be
told apart from a cut-short one until it ends, and a Parquet file has no footer (no schema, no row groups)
until its writer closes it. The source decides when a file is complete (see
:class:`connectors.files.FileSource`); a reader here then delivers its records in order:

* :class:`CompressedLines`: the lines of a gzip, zstd, bzip2 or xz file, decompressed from its start. Its position
  is the **decompressed** byte offset just after the last returned line (and that line's number); after a
  restart the file is decompressed again from its start and the bytes before the offset are skipped,
  which costs a decompression pass but no state. A stream that ends inside a member or frame (a truncated
  copy) or is corrupt stops the file with :attr:`CompressedLines.error`; its complete lines before that
  point are delivered.
* :class:`TableRows`: the rows of a Parquet or Arrow IPC file as JSON records
  (:func:`calmon.formats.parquet.batch_records`); its position is the row index of the next row (whole row
  groups before it are skipped unread on restart).

Examples
--------
>>> import gzip, os, tempfile
>>> fd, path = tempfile.mkstemp(suffix=".jsonl.gz")
>>> _ = os.write(fd, gzip.compress(b'{"a": 1}\\n\\n{"a": 2}'))
>>> r = CompressedLines(fd, "gzip", offset=0, line=1, max_line_bytes=1 << 20)
>>> [(s.first, s.lines) for s in r.read(10)], r.offset, r.finished, r.error
([(1, [b'{"a": 1}', b'', b'{"a": 2}'])], 18, True, None)
>>> r = CompressedLines(fd, "gzip", offset=9, line=2, max_line_bytes=1 << 20)
>>> [(s.first, s.lines) for s in r.read(10)]
[(2, [b'', b'{"a": 2}'])]
>>> r.close(); os.close(fd)
"""

from __future__ import annotations

import os
from collections.abc import Collection, Iterator
from dataclasses import dataclass
from typing import Any

from calmon.formats.compressed import CorruptStream, Decompressor
from calmon.formats.parquet import (
    RowPlan,
    TableError,
    TableFile,
    batch_records,
    canonical_plan,
    mapped_plan,
    table_kind,
)
from calmon.formats.records import OversizedRecord
from connectors.filetrack import LineSkip, TrackedFile

__all__ = ["Segment", "CompressedLines", "TableRows", "ALL_COLUMNS", "open_reader"]

ALL_COLUMNS = "all"  # schema_columns value: a mapping that reads every column
_ARROW_SUFFIXES = (".arrow", ".feather", ".ipc")


@dataclass
class Segment:
    """Records delivered together: contiguous ``lines`` (or table records) from number ``first``, or one
    ``oversized`` line read past without being held."""

    first: int
    lines: list[bytes] | None = None
    oversized: OversizedRecord | None = None


class CompressedLines:
    """The lines of a compressed file from a decompressed ``offset`` (see the module docstring).

    Parameters
    ----------
    fd
        An open descriptor of the file (read with ``pread``; not closed here).
    codec
        One of :data:`calmon.formats.compressed.CODECS`.
    offset, line
        Decompressed offset and line number to start at (a checkpointed position).
    max_line_bytes
        A longer line is read past and delivered as one :class:`~calmon.events.decoder.OversizedRecord`.
    raw_chunk
        Compressed bytes read at a time.
    """

    def __init__(self, fd: int, codec: str, offset: int, line: int, max_line_bytes: int,
                 raw_chunk: int = 1 << 18) -> None:
        self.fd = fd
        self.max_line_bytes = max_line_bytes
        self.raw_chunk = raw_chunk
        self.raw_pos = 0  # compressed bytes read so far
        self.offset = 0  # decompressed bytes before the next line to return
        self.line = 1
        self.eof = False  # the stream ended (cleanly or with ``error``)
        self.error: str | None = None
        self.header: bytes | None = None  # the first non-blank line (a CSV header), once seen
        self._dec = Decompressor(codec)
        self._buf = b""
        self._skip: LineSkip | None = None
        self._skip_to(offset, line)

    @property
    def finished(self) -> bool:
        """Every line up to the end of the stream (or to the error) was returned."""
        return self.eof and self._skip is None and (not self._buf or self.error is not None)

    def _more(self) -> bool:
        """Decompress the next raw chunk into the buffer; False at the end of the stream."""
        if self.eof:
            return False
        raw = os.pread(self.fd, self.raw_chunk, self.raw_pos)
        try:
            if not raw:
                self._dec.finish()
                self.eof = True
                return False
            self.raw_pos += len(raw)
            pieces = list(self._dec.feed(raw))
        except CorruptStream as exc:
            self.error, self.eof = str(exc), True
            return False
        if pieces:
            self._buf = b"".join([self._buf, *pieces]) if self._buf else b"".join(pieces)
        return True

    def _skip_to(self, offset: int, line: int) -> None:
        """Decompress and drop the first ``offset`` bytes (noting the first non-blank line on the way)."""
        while self.offset < offset:
            if not self._buf and not self._more():
                if self.error is None:
                    self.error = f"decompressed stream is shorter ({self.offset} bytes) than the position ({offset})"
                self.eof = True
                return
            if self.header is None:
                self._note_header()
            take = min(len(self._buf), offset - self.offset)
            self._buf = self._buf[take:]
            self.offset += take
        self.line = line

    def _note_header(self) -> None:
        for ln in self._buf[:1 << 20].split(b"\n")[:-1]:
            if ln.strip(b"\r"):
                self.header = ln.rstrip(b"\r")
                return

    def read(self, want: int) -> list[Segment]:
        """Up to ``want`` more lines (blank lines included: the caller numbers and drops them)."""
        segs: list[Segment] = []
        got = 0
        while got < want:
            if self._skip is not None:
                first = self._skip.line
                rec = self._skip_line()
                segs.append(Segment(first, oversized=rec))
                got += 1
                continue
            if self._buf.count(b"\n") < want - got and not self.eof:
                if b"\n" not in self._buf and len(self._buf) >= self.max_line_bytes:
                    self._skip = LineSkip(self.line)
                    self._skip.feed(self._buf)
                    self._buf = b""
                else:
                    self._more()
                continue
            if not self._buf:
                break
            parts = self._buf.split(b"\n", want - got)
            rest = parts.pop()
            if self.eof and rest and len(parts) < want - got and self.error is None:
                parts.append(rest)  # the last line of a complete stream, without newline
                rest = b""
            if not parts:
                break  # only the cut-off end of a damaged stream is left
            consumed = len(self._buf) - len(rest)
            if self.header is None:
                self._note_header()
            self._buf = rest
            self.offset += consumed
            segs.append(Segment(self.line, parts))
            self.line += len(parts)
            got += len(parts)
        return segs

    def _skip_line(self) -> OversizedRecord:
        """Read past the rest of an overlong line; its record (at the end of the stream, without newline)."""
        sk = self._skip
        assert sk is not None
        while True:
            cut = self._buf.find(b"\n")
            if cut >= 0:
                sk.feed(self._buf[:cut])
                self._buf = self._buf[cut + 1:]
                self.offset += sk.size + 1
                self.line += 1
                break
            sk.feed(self._buf)
            self._buf = b""
            if not self._more():
                self.offset += sk.size
                break
        self._skip = None
        return sk.record()

    def close(self) -> None:
        self._buf = b""


class TableRows:
    """The rows of a Parquet or Arrow IPC file from row ``start``, as JSON records.

    Parameters
    ----------
    fd
        An open descriptor of the file (duplicated: the reader closes its own copy).
    kind
        ``"parquet"`` or ``"arrow"``.
    start
        Row index to start at (a checkpointed position).
    schema_columns
        ``None``: rows in the canonical schema (:func:`calmon.formats.parquet.canonical_plan`); otherwise the
        columns a schema mapping reads (:data:`ALL_COLUMNS` for all), rows keeping the file's names.

    Raises
    ------
    calmon.formats.parquet.IncompleteTable
        No footer yet.
    calmon.formats.parquet.TableError
        An unreadable file, or no usable columns.
    """

    def __init__(self, fd: int, kind: str, start: int, schema_columns: Collection[str] | str | None = None,
                 batch_rows: int = 65_536) -> None:
        fileobj = os.fdopen(os.dup(fd), "rb")
        try:
            self.table = TableFile(fileobj, kind)
        except TableError:
            fileobj.close()
            raise
        try:
            self.plan: RowPlan = canonical_plan(self.table.names) if schema_columns is None else \
                mapped_plan(self.table.names, None if schema_columns == ALL_COLUMNS else frozenset(schema_columns))
        except TableError:
            self.table.close()
            raise
        self.offset = start  # index of the next row to return
        self._batches: Iterator[Any] = self.table.batches(self.plan.read, start, batch_rows)
        self._pending: list[bytes] = []
        self.eof = False

    @property
    def finished(self) -> bool:
        return self.eof and not self._pending

    def read(self, want: int) -> list[Segment]:
        """Up to ``want`` more rows (raises :class:`calmon.formats.parquet.TableError` on unreadable data)."""
        while len(self._pending) < want and not self.eof:
            batch = next(self._batches, None)
            if batch is None:
                self.eof = True
            else:
                self._pending.extend(batch_records(batch, self.plan))
        out, self._pending = self._pending[:want], self._pending[want:]
        if not out:
            return []
        seg = Segment(self.offset + 1, out)
        self.offset += len(out)
        return [seg]

    def close(self) -> None:
        self.table.close()


def open_reader(f: TrackedFile, schema_columns: Collection[str] | str | None, max_line_bytes: int,
                raw_chunk: int) -> CompressedLines | TableRows:
    """The reader of an open whole file at its position (raises as :class:`TableRows` does)."""
    assert f.fd is not None and f.whole is not None
    if f.whole == "table":
        kind = table_kind(f.head, f.path) or ("arrow" if f.path.lower().endswith(_ARROW_SUFFIXES) else "parquet")
        return TableRows(f.fd, kind, f.offset, schema_columns)
    return CompressedLines(f.fd, f.whole, f.offset, f.line, max_line_bytes, raw_chunk)
