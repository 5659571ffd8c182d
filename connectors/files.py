"""File source: JSONL, CSV, compressed, Parquet and Arrow files or directories, read once or followed (``tail -F``).

The source implements :class:`connectors.base.Source`. Records are whole lines: JSONL lines are
passed through as they are, CSV rows are converted to JSON objects (see
:class:`calmon.formats.csvrows.CsvConverter`; with ``schema_columns``, :class:`calmon.formats.csvobjects.CsvObjects`),
Parquet/Arrow rows too (:mod:`calmon.formats.parquet`), so the decoder sees one JSON document per record
whatever the file format.

Whole files
-----------
gzip/zstd/bzip2/xz files (JSON Lines or CSV inside) and Parquet/Arrow IPC files are read whole, once complete
(:mod:`connectors.filewhole`): at once by a read-once source; by a following source once their size and
modification time have not changed for ``settle`` seconds (write such files elsewhere and rename them
in, or let only log rotation compress), a Parquet or Arrow IPC file only once it has its footer (until then it
waits: not an error). A truncated or corrupt stream is logged and listed in :attr:`FileSource.errors`
(lines before the damage are delivered) and retried only if the file changes, never in a loop. A
finished whole file stays in the position (``done``) while it is matched: it is never read twice.

A compressed file is decompressed in bounded pieces (:mod:`calmon.formats.compressed`), one read taking in at
most :data:`connectors.filewhole.READ_BUDGET` decompressed bytes (or ``max_records`` lines) of it, so memory
does not depend on what a file holds and a read returns (with fewer records, or ``None`` when following)
instead of decompressing gigabytes first; files are still read in order. A stream that expands more than
``max_expansion_ratio`` times (over any 64 MiB of output) is a decompression bomb: the lines before are
delivered, then the rest of the file as one record the decoder rejects as ``decompression_bomb`` (so it is
counted and dead-lettered), and the file is done. A file named like Parquet that is not one is logged once
and not read. Whole files that were not read to their end are counted by reason in
:attr:`FileSource.rejected_files`.

Reading is chunked (``os.read`` of about a megabyte, ``bytes.split`` on newlines), so reading and
splitting alone runs at several million lines per second on JSONL (see ``benchmarks/bench_files.py``).

Positions
---------
:meth:`FileSource.position` and :meth:`FileSource.seek`: the position format, and how a restart finds each
file again (by inode and fingerprint, also after a rotation), are described in :mod:`connectors.filepositions`.

References
----------
The ``tail -F`` semantics (follow the name, finish a renamed file, restart a truncated one) are
those of GNU coreutils ``tail --follow=name --retry``.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Collection, Mapping, Sequence
from typing import Any, cast

from calmon.formats.compressed import MAX_EXPANSION_RATIO, DecompressionBomb
from calmon.formats.csvobjects import CsvObjects
from calmon.formats.csvrows import CsvConverter
from calmon.formats.parquet import IncompleteTable, NoTableLibrary, NotATable, TableError
from connectors.base import Batch
from connectors.filepositions import check_position, position_of, restore_entries
from connectors.filescan import FORMATS, FileSpecs
from connectors.filetrack import BOM, FP_MAX, LineSkip, TrackedFile, csv_header, skip_to_end
from connectors.filewhole import READ_BUDGET, CompressedLines, open_reader
from connectors.lineorigins import LineOrigins

__all__ = ["FileSource", "CsvConverter"]

log = logging.getLogger(__name__)


class FileSource:
    """Read JSONL/CSV files, globs or directories once, or follow them like ``tail -F``.

    Parameters
    ----------
    paths
        A path, glob or directory, or a list of them. A directory contributes its regular,
        non-hidden files whose names match ``pattern`` (default by format: ``*.jsonl``,
        ``*.ndjson``, ``*.json`` and/or ``*.csv``). Files are read in sorted path order.
    format
        ``"jsonl"``, ``"csv"``, ``"parquet"`` or ``"auto"`` (by extension and magic bytes; otherwise by
        the first byte: ``{`` is JSONL, anything else CSV). Compressed files (``.gz``, ``.zst``) are
        read when a path, glob or ``pattern`` names them (see :mod:`connectors.filescan`).
    follow
        False: read every file to its end (a last line without newline included), then
        :attr:`exhausted` becomes True. True: keep following: new files in directories/globs are
        picked up, a renamed (rotated) file is read to its end before it is dropped, a truncated
        file restarts at 0, and a last line without newline is held back until its newline arrives.
    name
        Source name for metrics and dead letters (default ``"files"``).
    start
        Where existing files begin when following without a prior :meth:`seek`: ``"beginning"``
        (default) or ``"end"`` (only new lines). Files appearing later always start at 0.
    pattern
        Glob for file names inside directories (e.g. ``"*.log"``).
    chunk_bytes
        Minimum read size per ``os.read``.
    poll_interval
        Sleep between polls while following and idle (seconds).
    rotate_grace
        Seconds a renamed or deleted file stays open after it was read to its end, for writers
        that still append to it just after the rotation.
    origins
        Attach ``"path:line"`` origins to each batch (a :class:`~connectors.lineorigins.LineOrigins`: runs
        of line numbers, an origin formatted only when it is read).
    max_line_bytes
        A line longer than this is read past without being buffered and delivered as one
        :class:`calmon.events.decoder.OversizedRecord` (its first bytes, real length and SHA-256), which
        the decoder rejects as ``too_large``; give the agent's ``limits.max_record_bytes``.
    settle
        Seconds a compressed or Parquet file must stay unchanged before a following source reads it.
    max_expansion_ratio
        Cap on decompressed / compressed bytes of a compressed file, over every 64 MiB of output (default
        100; ``None``: no cap). JSON Lines expand 5-25 times; a file above the cap is rejected as a
        decompression bomb (see the module docstring).
    schema_columns
        ``None``: records in the canonical schema. With a schema mapping, the columns it reads
        (:attr:`calmon.events.schema.Mapping.columns`, ``"all"`` for every column): CSV and Parquet rows then
        keep their own column names and only those Parquet columns are read.

    Examples
    --------
    >>> import tempfile, pathlib
    >>> d = pathlib.Path(tempfile.mkdtemp())
    >>> _ = (d / "a.jsonl").write_text('{"score": 0.2, "label": 0}\\n{"score": 0.9, "label": 1}\\n')
    >>> src = FileSource(d, name="demo")
    >>> b = src.read()
    >>> len(b.records), b.origins[1].endswith("a.jsonl:2"), src.exhausted
    (2, True, False)
    >>> src.read() is None, src.exhausted
    (True, True)
    >>> src.seek(b.position); src.read() is None
    True
    """

    def __init__(
        self,
        paths: str | os.PathLike[str] | Sequence[str | os.PathLike[str]],
        format: str = "auto",  # noqa: A002 - the documented keyword
        follow: bool = False,
        name: str = "files",
        *,
        start: str = "beginning",
        pattern: str | None = None,
        chunk_bytes: int = 1 << 20,
        poll_interval: float = 0.1,
        rotate_grace: float = 1.0,
        origins: bool = True,
        max_line_bytes: int = 1 << 20,
        settle: float = 1.0,
        schema_columns: Collection[str] | str | None = None,
        max_expansion_ratio: float | None = MAX_EXPANSION_RATIO,
    ) -> None:
        if format not in FORMATS:
            raise ValueError(f"format must be one of {', '.join(FORMATS)}, got {format!r}")
        if start not in ("beginning", "end"):
            raise ValueError(f"start must be 'beginning' or 'end', got {start!r}")
        if chunk_bytes < 1 or max_line_bytes < 1 or poll_interval <= 0 or rotate_grace < 0:
            raise ValueError("chunk_bytes, max_line_bytes, poll_interval must be positive, rotate_grace >= 0")
        if max_expansion_ratio is not None and (isinstance(max_expansion_ratio, bool) or not (
                isinstance(max_expansion_ratio, (int, float)) and max_expansion_ratio >= 1)):
            raise ValueError(f"max_expansion_ratio must be a number >= 1 (or null: no cap), "
                             f"got {max_expansion_ratio!r}")
        if isinstance(paths, (str, os.PathLike)):
            paths = [paths]
        specs = [os.fspath(p) for p in paths]
        if not specs:
            raise ValueError("FileSource needs at least one path, glob or directory")
        self.name = name
        self.format = format
        self.follow = bool(follow)
        self.start = start
        self.chunk_bytes = int(chunk_bytes)
        self.poll_interval = float(poll_interval)
        self.rotate_grace = float(rotate_grace)
        self.with_origins = bool(origins)
        self.max_line_bytes = int(max_line_bytes)
        self.settle = float(settle)
        self.schema_columns = schema_columns
        self.max_expansion_ratio = None if max_expansion_ratio is None else float(max_expansion_ratio)
        self.errors: list[str] = []  # whole files that could not be read to their end: "path: why"
        #: whole files rejected, by reason: decompression_bomb, corrupt_stream, not_parquet, unreadable,
        #: needs_pyarrow (a Parquet/Arrow file without the ``parquet`` extra installed)
        self.rejected_files: dict[str, int] = {}
        self._specs = FileSpecs(specs, format, pattern, must_exist=not self.follow, name=name)
        self._files: dict[tuple[int, int], TrackedFile] = {}
        self._order: list[TrackedFile] = []
        self._seeked = False
        self._scanned = False
        self._last_scan = 0.0
        self._avg_line = 128.0
        self._exhausted = False
        self._closed = False
        self._busy = False  # a compressed file stopped at its read budget in this pass
        self.lost: list[dict[str, Any]] = []  # position entries seek() could not find
        if not self.follow:
            self._rescan()

    # ------------------------------------------------------------------ discovery
    def _open(self, f: TrackedFile) -> bool:
        if f.fd is not None:
            return True
        try:
            fd = os.open(f.path, os.O_RDONLY)
        except OSError:
            return False
        st = os.fstat(fd)
        if (st.st_dev, st.st_ino) != f.key():
            os.close(fd)
            return False
        f.fd = fd
        f.buf, f.skip = b"", None
        if f.fmt == "?":
            f.fmt, f.whole = self._specs.kind_of(f.path, fd)
        f.size = st.st_size
        if f.whole:
            f.head = os.pread(fd, FP_MAX, 0)
            return True
        if f.offset > st.st_size:  # truncated while we were away
            f.rewind()
        os.lseek(fd, f.offset, os.SEEK_SET)
        return True

    def _rescan(self) -> None:
        now = time.monotonic()
        self._last_scan = now
        initial = not self._scanned and not self._seeked
        self._scanned = True
        seen: set[tuple[int, int]] = set()
        for path, st in self._specs.scan():
            key = (st.st_dev, st.st_ino)
            seen.add(key)
            f = self._files.get(key)
            if f is None:
                f = TrackedFile(path, st.st_dev, st.st_ino, "?", size=st.st_size)
                self._files[key] = f
                if self.follow:
                    if not self._open(f):
                        del self._files[key]
                        continue
                    if initial and self.start == "end":
                        self._to_end(f)
            else:
                f.path = path
                f.size = st.st_size
                if not f.matched:
                    f.matched, f.detached_at = True, None
            f.observe(st.st_size, st.st_mtime_ns, now)
        for f in list(self._files.values()):
            if f.key() not in seen and f.whole and (f.done or not self.follow):
                f.close()  # a finished (or, read once, vanished) whole file: nothing more to read
                if self.follow:
                    del self._files[f.key()]
            elif f.key() not in seen and f.matched:
                f.matched = False
                f.detached_at = now
        self._order = sorted(
            self._files.values(), key=lambda f: (f.matched, f.detached_at or 0.0, f.path)
        )

    def _to_end(self, f: TrackedFile) -> None:
        """``start="end"``: existing lines are skipped; an existing whole file counts as read."""
        if f.whole:
            f.done = True
            f.close()
        else:
            skip_to_end(f, self.max_line_bytes)

    # ------------------------------------------------------------------ whole files
    def _complete(self, f: TrackedFile) -> bool:
        """Whether a whole file may be read now (see the module docstring)."""
        if not self.follow:
            return True
        if f.failed is not None and f.failed == f.seen:
            return False  # failed as it is now: wait for a change
        quiet = min(time.time() - f.seen[1] / 1e9, time.monotonic() - f.seen_since)
        return f.seen[0] > 0 and (quiet >= self.settle or not f.matched)

    def _start_whole(self, f: TrackedFile) -> bool:
        """Open the reader of a whole file at its position; False if it is not readable (yet)."""
        try:
            f.reader = open_reader(f, self.schema_columns, self.max_line_bytes, self.chunk_bytes,
                                   self.max_expansion_ratio)
            if isinstance(f.reader, CompressedLines) and f.fmt == "csv" and f.offset > 0 and f.reader.header:
                f.conv = self._csv_converter(f.reader.header)
        except IncompleteTable as exc:
            if not self.follow:
                self._whole_failed(f, str(exc))
            else:
                log.info("%s: %s is not complete yet (%s)", self.name, f.path, exc)
                f.failed = f.seen
            return False
        except NotATable as exc:
            self._whole_failed(f, str(exc), "not_parquet")
            return False
        except NoTableLibrary as exc:  # skipped with the line naming the extra; read again if the file changes
            self._whole_failed(f, str(exc), "needs_pyarrow")
            return False
        except (TableError, OSError) as exc:
            self._whole_failed(f, str(exc))
            return False
        return True

    def _whole_failed(self, f: TrackedFile, why: str, reason: str = "unreadable") -> None:
        log.error("%s: %s: %s (lines before it were read; retried if the file changes)", self.name, f.path, why)
        self.errors.append(f"{f.path}: {why}")
        self.rejected_files[reason] = self.rejected_files.get(reason, 0) + 1
        f.failed = f.seen
        if f.reader is not None:
            f.reader.close()
            f.reader = None
        if not self.follow:
            f.done = True
            f.close()

    def _read_whole(self, f: TrackedFile, need: int, out: list[bytes], origins: LineOrigins | None) -> int:
        """Append up to ``need`` records of a compressed or table file (once it is complete)."""
        if f.reader is None and not (self._complete(f) and self._start_whole(f)):
            return 0
        r = f.reader
        assert r is not None
        got = seen = 0
        start = (r.produced, r.offset) if isinstance(r, CompressedLines) else (0, 0)
        while got < need and not r.finished:
            try:
                segs = r.read(need - got)
            except TableError as exc:
                f.offset, f.line = r.offset, r.offset + 1  # a table: rows before the damage were returned
                self._whole_failed(f, str(exc))
                return got
            if not segs:
                break
            for seg in segs:
                if seg.oversized is not None:
                    out.append(seg.oversized)
                    if origins is not None:
                        origins.add(f.path, range(seg.first, seg.first + 1))
                    got += 1
                    seen += 1
                elif seg.lines:
                    got += self._emit(f, seg.lines, seg.first, out, origins)
                    seen += len(seg.lines)
            if isinstance(r, CompressedLines) and (r.paused or seen >= need or max(
                    r.produced - start[0], r.offset - start[1]) >= READ_BUDGET):
                self._busy = True  # (blank lines or a long line: more to do at once, perhaps without records)
                break
        f.offset = r.offset
        f.line = r.line if isinstance(r, CompressedLines) else r.offset + 1
        if r.finished:
            if isinstance(r, CompressedLines) and r.reason == DecompressionBomb.reason:
                log.error("%s: %s: %s (%d lines before it were read; the rest is one %s record)", self.name, f.path,
                          r.error, r.line - 1, r.reason)
                self.errors.append(f"{f.path}: {r.error}")
                self.rejected_files[r.reason] = self.rejected_files.get(r.reason, 0) + 1
                f.done, f.failed = True, None  # its rejection was delivered: never read again
                f.close()
            elif isinstance(r, CompressedLines) and r.error is not None:
                self._whole_failed(f, r.error, r.reason or "corrupt_stream")
            else:
                f.done, f.failed = True, None
                f.close()
        return got

    # ------------------------------------------------------------------ reading
    def _read_file(self, f: TrackedFile, need: int, out: list[bytes], origins: LineOrigins | None) -> int:
        """Append up to ``need`` records of ``f`` to ``out``; returns how many were appended."""
        if f.done:
            return 0
        if f.fd is None and not self._open(f):
            if not self.follow:  # vanished between the scan and its turn
                log.warning("%s: cannot open %s, skipped", self.name, f.path)
                self.lost.append({"path": f.path, "dev": f.dev, "ino": f.ino, "offset": f.offset})
                f.done = True
            return 0
        if f.whole:
            return self._read_whole(f, need, out, origins)
        final = not self.follow or (not f.matched and f.detached_at is not None
                                    and time.monotonic() - f.detached_at >= self.rotate_grace)
        if self.follow and not f.unchanged():
            log.info("%s: %s was truncated or rewritten, reading from the start", self.name, f.path)
            f.rewind()
        if f.fmt == "csv" and f.conv is None and f.offset > 0:
            f.conv = csv_header(f, self._csv_converter)
        got = 0
        while got < need:
            if f.skip is not None:
                line = f.skip.line
                rec = self._skip_line(f, final)
                if rec is None:
                    break
                out.append(rec)
                if origins is not None:
                    origins.add(f.path, range(line, line + 1))
                got += 1
                continue
            n, eof = self._read_lines(f, need - got, final, out, origins)
            got += n
            if eof:
                break
        if f.read_pos() >= f.size or got == 0:
            self._check_eof(f, final)
        return got

    def _read_lines(self, f: TrackedFile, want: int, final: bool, out: list[bytes],
                    origins: LineOrigins | None) -> tuple[int, bool]:
        """Read and split one chunk: ``(records appended, at end of file)``."""
        assert f.fd is not None
        buf = f.buf
        eof = False
        if buf.count(b"\n") < want:
            size = max(self.chunk_bytes, min(int(want * self._avg_line * 1.1), 64 << 20))
            chunk = os.read(f.fd, size)
            if chunk:
                buf = buf + chunk if buf else chunk
            else:
                eof = True
        if not buf:
            return 0, True
        parts = buf.split(b"\n", want)
        rest = parts.pop()
        nl = len(parts)
        consumed = len(buf) - len(rest)
        first_line = f.line
        if f.offset == 0 and parts and parts[0].startswith(BOM):
            parts[0] = parts[0][3:]
        if nl < want and len(rest) >= self.max_line_bytes:  # one unterminated line too long to hold: skip it
            f.skip = LineSkip(f.line + nl)
            f.skip.feed(rest)
            rest = b""
        elif eof and rest and final:
            parts.append(rest)  # last line without newline of a finished file
            consumed += len(rest)
            rest = b""
        f.consume(consumed, buf[max(0, consumed - FP_MAX):consumed])
        f.line += nl
        f.buf = rest
        if not parts:
            return 0, eof
        self._avg_line = 0.9 * self._avg_line + 0.1 * min(consumed / len(parts), self.max_line_bytes)
        return self._emit(f, parts, first_line, out, origins), eof

    def _skip_line(self, f: TrackedFile, final: bool) -> bytes | None:
        """Read past an overlong line without keeping it; the record once its end is known, else None."""
        assert f.fd is not None and f.skip is not None
        while True:
            chunk = os.read(f.fd, self.chunk_bytes)
            if not chunk:
                return f.finish_skip(newline=False) if final else None
            cut = chunk.find(b"\n")
            if cut < 0:
                f.skip.feed(chunk)
                continue
            f.skip.feed(chunk[:cut])
            f.buf = chunk[cut + 1:]
            return f.finish_skip(newline=True)

    def _emit(self, f: TrackedFile, parts: list[bytes], first_line: int, out: list[bytes],
              origins: LineOrigins | None) -> int:
        lines_no: list[int] | range = range(first_line, first_line + len(parts))
        if min(map(len, parts), default=2) <= 1 and (b"" in parts or b"\r" in parts):  # one pass for the usual batch
            keep = [i for i, p in enumerate(parts) if p and p != b"\r"]
            parts = [parts[i] for i in keep]
            lines_no = [first_line + i for i in keep]
        if not parts:
            return 0
        if f.fmt == "csv":
            if f.conv is None:
                f.conv = self._csv_converter(parts[0])
                if f.conv.error is not None:
                    log.warning("%s: CSV header of %s rejected: %s", self.name, f.path, f.conv.error)
                    # the header itself goes to the decoder (and the dead letters) as it is
                else:
                    parts = parts[1:]
                    lines_no = lines_no[1:]
            parts = f.conv.convert(parts)
        out.extend(parts)
        if origins is not None:
            origins.add(f.path, lines_no)
        return len(parts)

    def _csv_converter(self, header: bytes) -> CsvConverter | CsvObjects:
        return CsvConverter(header) if self.schema_columns is None else CsvObjects(header)

    def _check_eof(self, f: TrackedFile, final: bool) -> None:
        """At EOF: detect truncation, finish read-once files, drop drained rotated files."""
        if f.fd is None:
            return
        try:
            st = os.fstat(f.fd)
        except OSError:
            return
        f.size = st.st_size
        readpos = f.read_pos()
        if st.st_size < readpos:  # truncated (copytruncate): start again from 0
            log.info("%s: %s truncated (%d < %d), reading from the start",
                     self.name, f.path, st.st_size, readpos)
            f.rewind()
            return
        if st.st_size > readpos or f.skip is not None:
            return
        if not self.follow:
            if not f.buf:
                f.done = True
                f.close()
        elif final and not f.buf:
            f.close()
            del self._files[f.key()]
            self._order = [g for g in self._order if g is not f]

    def read(self, max_records: int = 65536, timeout: float = 0.5) -> Batch | None:
        """Next batch of at most ``max_records`` records, or None if nothing arrived in ``timeout`` s.

        Parameters
        ----------
        max_records
            Upper bound on the number of records.
        timeout
            Seconds to wait for data when following (a read-once source never waits).

        Returns
        -------
        Batch or None
        """
        if self._closed:
            raise ValueError(f"FileSource {self.name!r} is closed")
        if max_records < 1:
            raise ValueError("max_records must be >= 1")
        deadline = time.monotonic() + max(0.0, timeout)
        while True:
            due = not self._scanned or time.monotonic() - self._last_scan >= self.poll_interval
            if self.follow and due:
                self._rescan()
            out: list[bytes] = []
            origins = LineOrigins() if self.with_origins else None
            self._busy = False
            for f in list(self._order):
                if len(out) >= max_records:
                    break
                self._read_file(f, max_records - len(out), out, origins)
                if self._busy:
                    break  # files stay in order: the next ones wait for the next read
            if out:
                # Batch.origins is typed list[str]; its readers only index, iterate and take len()
                return Batch(out, self.position(), self.name, cast("list[str] | None", origins))
            if not self.follow:
                if all(f.done for f in self._files.values()):
                    self._exhausted = True
                    return None
                continue  # a file still had bytes (e.g. only blank lines); keep going
            now = time.monotonic()
            if now >= deadline:
                return None
            if not self._busy:
                time.sleep(min(self.poll_interval, deadline - now))

    @property
    def exhausted(self) -> bool:
        """True once a read-once source has delivered every line (never while following)."""
        return self._exhausted

    def lag_bytes(self) -> int:
        """Bytes known to be in the files but not yet returned (from the last size seen)."""
        return sum(max(0, f.size - (f.offset if not f.whole else f.reader.raw_pos
                                    if isinstance(f.reader, CompressedLines) else 0))
                   for f in self._files.values() if not f.done)

    # ------------------------------------------------------------------ positions
    def position(self) -> dict[str, Any]:
        """The position just after the last record returned by :meth:`read` (JSON-serialisable)."""
        return position_of(self.name, self._order)

    def seek(self, position: Mapping[str, Any]) -> None:
        """Continue right after ``position`` (as returned by :meth:`position`).

        Each file is found again by inode (and verified by its fingerprint), at its recorded path or,
        after a rotation by rename, under another name in the same directory. A file that cannot be
        found is listed in :attr:`lost` (and logged); one now shorter than its offset was truncated
        and is read again from 0. Files not in the position are read from their beginning.

        Parameters
        ----------
        position
            A dict returned by :meth:`position` (possibly after a JSON round trip).
        """
        at_offset = check_position(position, self.name)  # version 1 fingerprinted the first bytes
        for f in self._files.values():
            f.close()
        self._files = {}
        self.lost = []
        for got in restore_entries(position["files"], at_offset, self.follow, self.name):
            if isinstance(got, dict):
                log.warning("%s: %s (inode %s) not found, %s bytes after offset %s may be lost",
                            self.name, got["path"], got["ino"], "the", got["offset"])
                self.lost.append(got)
            elif got.done or self._open(got):  # a done file stays closed
                self._files[got.key()] = got
        self._seeked = True
        self._scanned = False
        self._exhausted = False
        self._rescan()

    def close(self) -> None:
        """Close every open file (idempotent)."""
        for f in self._files.values():
            f.close()
        self._closed = True

    def __enter__(self) -> FileSource:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
