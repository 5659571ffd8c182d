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
>>> [(s.first, s.lines) for s in r.read(10)]  # (an empty line is passed over: no record)
[(3, [b'{"a": 2}'])]
>>> r.close(); os.close(fd)
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable, Collection, Iterator
from typing import Any

from calmon.formats.compressed import MAX_EXPANSION_RATIO, CorruptStream, DecompressedReader, DecompressionBomb
from calmon.formats.parquet import (
    RowPlan,
    TableError,
    TableFile,
    batch_records,
    canonical_plan,
    mapped_plan,
    table_kind,
)
from calmon.formats.records import PREFIX_BYTES, OversizedRecord
from connectors.filetrack import LineSkip, Segment, TrackedFile

__all__ = ["CompressedLines", "TableRows", "ALL_COLUMNS", "READ_BUDGET", "open_reader"]

ALL_COLUMNS = "all"  # schema_columns value: a mapping that reads every column
#: Decompressed bytes one :meth:`CompressedLines.read` takes in at most.
READ_BUDGET = 16 << 20
_ARROW_SUFFIXES = (".arrow", ".feather", ".ipc")


class CompressedLines:
    """The lines of a compressed file from a decompressed ``offset`` (see the module docstring).

    Parameters
    ----------
    source
        An open descriptor of the file (read with ``pread``; not closed here), or ``read(n)`` returning the
        next compressed bytes (standard input, ``calmon check``).
    codec
        One of :data:`calmon.formats.compressed.CODECS`.
    offset, line
        Decompressed offset and line number to start at (a checkpointed position).
    max_line_bytes
        A longer line is read past and delivered as one :class:`~calmon.formats.records.OversizedRecord`.
    raw_chunk
        Compressed bytes read at a time.
    max_ratio
        Cap on the expansion ratio (:class:`calmon.formats.compressed.Decompressor`; ``None``: none).
    budget
        Decompressed bytes one :meth:`read` takes in at most (then it returns what it has, with
        :attr:`paused` set): an endless line or a run of blank lines never holds up the other files.

    Notes
    -----
    Bytes held, whatever the stream: a read takes in at most ``budget`` + one chunk of the decompressor (a
    chunk is at most 1 MiB + :data:`calmon.formats.compressed.PIECE`, 9 MiB) and keeps for the next read only
    the lines of its last chunk past ``want`` and an unterminated line shorter than ``max_line_bytes`` (a longer
    one is hashed as it passes, never held). The buffer stays below ``budget`` + 2 chunks + ``max_line_bytes``,
    twice that while it is joined and split into the lines a read returns: 70 MiB with the defaults (1 MiB
    lines), plus the codec's own memory (at most 128 MiB; 8 MiB for zstd -19 and xz -6). Measured
    (``tests/test_bombs.py``): a process reading a 4 GiB line grows by 4 MiB, one reading 1 GiB of lines of
    1 MiB by 124 MiB (with the batch its caller still holds and the allocator's slack).
    """

    def __init__(self, source: int | Callable[[int], bytes], codec: str, offset: int, line: int,
                 max_line_bytes: int, raw_chunk: int = 1 << 18, max_ratio: float | None = MAX_EXPANSION_RATIO,
                 budget: int = READ_BUDGET) -> None:
        self.fd = source if isinstance(source, int) else None
        self.max_line_bytes = max_line_bytes
        self.budget = budget
        read: Callable[[int], bytes]
        if isinstance(source, int):
            fd = source

            def read(n: int) -> bytes:
                return os.pread(fd, n, self._src.raw_pos)
        else:
            read = source
        self._src = DecompressedReader(read, codec, max_ratio, raw_chunk=raw_chunk)
        self.offset = 0  # decompressed bytes before the next line to return
        self.line = 1
        self.eof = False  # the stream ended (cleanly or with ``error``)
        self.error: str | None = None
        self.reason: str | None = None  # of ``error``: ``corrupt_stream`` or ``decompression_bomb``
        self.paused = False  # the last read stopped at its budget
        self.header: bytes | None = None  # the first non-blank line (a CSV header), once seen
        self._buf = b""
        self._pend: list[bytes] = []  # pieces after ``_buf``, joined to it when lines are taken
        self._nl = 0  # newlines in ``_buf`` and ``_pend``
        self._spent = 0  # decompressed bytes taken in by this read
        self._skip: LineSkip | None = None
        self._bomb = False  # a decompression bomb's record is still to be returned
        self._skip_to(offset, line)

    @property
    def raw_pos(self) -> int:
        """Compressed bytes read so far."""
        return self._src.raw_pos

    @property
    def produced(self) -> int:
        """Decompressed bytes so far."""
        return self._src.produced

    @property
    def finished(self) -> bool:
        """Every line up to the end of the stream (or to the error) was returned."""
        return self.eof and self._skip is None and not self._bomb and (
            not (self._buf or self._pend) or self.error is not None)

    def _more(self) -> bool:
        """Decompress the next bytes into the buffer; False at the end of the stream (or at an error)."""
        if self.eof:
            return False
        try:
            piece = self._src.read()
        except CorruptStream as exc:
            self.error, self.reason, self.eof = str(exc), exc.reason, True
            self._bomb = isinstance(exc, DecompressionBomb)
            return False
        if not piece:
            self.eof = True
            return False
        self._spent += len(piece)
        self._nl += piece.count(b"\n")
        self._pend.append(piece)
        return True

    def _flush(self) -> None:
        """Join the pending pieces to the buffer (once, not at every piece)."""
        if self._pend:
            parts = [p for p in (self._buf, *self._pend) if p]
            self._buf = parts[0] if len(parts) == 1 else b"".join(parts)
            self._pend = []

    def _tail(self) -> int:
        """Length of the unterminated line at the end of the buffer."""
        n = 0
        for part in reversed(self._pend):
            cut = part.rfind(b"\n")
            if cut >= 0:
                return n + len(part) - cut - 1
            n += len(part)
        return n + len(self._buf) - self._buf.rfind(b"\n") - 1

    def _skip_to(self, offset: int, line: int) -> None:
        """Decompress and drop the first ``offset`` bytes (noting the first non-blank line on the way)."""
        while self.offset < offset:
            self._flush()
            if not self._buf and not self._more():
                if self.error is None:
                    self.error = f"decompressed stream is shorter ({self.offset} bytes) than the position ({offset})"
                    self.reason = "corrupt_stream"
                self.eof, self.offset, self.line = True, offset, line  # (what is before was delivered before)
                self._buf, self._pend, self._nl = b"", [], 0
                return
            if self.header is None:
                self._note_header()
            take = min(len(self._buf), offset - self.offset)
            self._nl -= self._buf.count(b"\n", 0, take)
            self._buf = self._buf[take:]
            self.offset += take
        self.line = line

    def _note_header(self) -> None:
        for ln in self._buf[:1 << 20].split(b"\n")[:-1]:
            if ln.strip(b"\r"):
                self.header = ln.rstrip(b"\r")
                return

    def read(self, want: int) -> list[Segment]:
        """Up to ``want`` more lines (blank lines included: the caller numbers and drops them; runs of empty
        lines are passed over here), taking in at most ``budget`` decompressed bytes; a decompression bomb
        ends the file with one ``oversized`` record whose reason is ``decompression_bomb`` (the lines before it
        are returned first)."""
        segs: list[Segment] = []
        got = 0
        self._spent = 0
        self.paused = False
        while got < want:
            if self._skip is not None:
                first = self._skip.line
                rec = self._skip_line()
                if rec is None:
                    self.paused = not self._bomb
                    break
                segs.append(Segment(first, oversized=rec))
                got += 1
                continue
            if self._nl < want - got and not self.eof:
                tail = self._tail()
                if tail >= self.max_line_bytes and not self._nl:
                    self._skip = LineSkip(self.line)
                    for part in (self._buf, *self._pend):
                        self._skip.feed(part)
                    self._buf, self._pend = b"", []
                    continue
                if tail < self.max_line_bytes and self._spent < self.budget:
                    self._more()
                    continue
                self.paused = tail < self.max_line_bytes
                if not self._nl:
                    break
                # else: return the complete lines before the long line, or before the budget ran out
            self._flush()
            if self._buf[:1] == b"\n":  # a run of empty lines is passed over at once (no record, no object)
                rest = self._buf.lstrip(b"\n")
                run = len(self._buf) - len(rest)
                self._buf, self._nl, self.offset, self.line = rest, self._nl - run, self.offset + run, self.line + run
                continue
            if not self._buf:
                break
            parts = self._buf.split(b"\n", want - got)
            rest = parts.pop()
            self._nl -= len(parts)
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
        if self._bomb and got < want and not self._nl:
            segs.append(Segment(self.line, oversized=self._bomb_record()))
        return segs

    def _skip_line(self) -> OversizedRecord | None:
        """Read past the rest of an overlong line; its record (at the end of the stream, without newline), or
        None when the budget ran out first (or a decompression bomb stopped the stream)."""
        sk = self._skip
        assert sk is not None
        while True:
            self._flush()
            cut = self._buf.find(b"\n")
            if cut >= 0:
                sk.feed(self._buf[:cut])
                self._buf = self._buf[cut + 1:]
                self._nl -= 1
                self.offset += sk.size + 1
                self.line += 1
                break
            sk.feed(self._buf)
            self._buf = b""
            if self._spent >= self.budget or (not self._more() and self._bomb):
                return None
            if self.eof and not self._buf:
                self.offset += sk.size
                break
        self._skip = None
        return sk.record()

    def _bomb_record(self) -> OversizedRecord:
        """The record a decompression bomb is dead-lettered as: the unfinished line's first bytes and digest;
        its size is the bytes decompressed when the stream was stopped (more than any record may have)."""
        self._flush()
        if self._skip is not None:
            prefix, digest = self._skip.prefix, self._skip.sha.hexdigest()
        else:
            prefix, digest = self._buf[:PREFIX_BYTES], hashlib.sha256(self._buf).hexdigest()
        self._skip, self._buf, self._bomb = None, b"", False
        size = max(self.produced, self.max_line_bytes + 1)
        return OversizedRecord(prefix, size, digest, reason=DecompressionBomb.reason)

    def close(self) -> None:
        self._buf, self._pend = b"", []


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
                raw_chunk: int, max_ratio: float | None = MAX_EXPANSION_RATIO) -> CompressedLines | TableRows:
    """The reader of an open whole file at its position (raises as :class:`TableRows` does)."""
    assert f.fd is not None and f.whole is not None
    if f.whole == "table":
        kind = table_kind(f.head, f.path) or ("arrow" if f.path.lower().endswith(_ARROW_SUFFIXES) else "parquet")
        return TableRows(f.fd, kind, f.offset, schema_columns)
    return CompressedLines(f.fd, f.whole, f.offset, f.line, max_line_bytes, raw_chunk, max_ratio)
