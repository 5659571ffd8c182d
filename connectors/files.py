"""File source: JSONL and CSV files or directories, read once or followed like ``tail -F``.

The source implements :class:`connectors.base.Source`. Records are whole lines: JSONL lines are
passed through as they are, CSV rows are converted to JSON objects (see :class:`CsvConverter`), so
the decoder sees one JSON document per record whatever the file format.

Reading is chunked (``os.read`` of about a megabyte, ``bytes.split`` on newlines), so reading and
splitting alone runs at several million lines per second on JSONL (see ``scripts/bench_files.py``).

Positions
---------
:meth:`FileSource.position` returns a JSON-serialisable dict::

    {"version": 1, "kind": "files", "source": NAME,
     "files": [{"path": P, "dev": D, "ino": I, "offset": BYTES, "line": NEXT_LINE_NUMBER,
                "fp": SHA1_HEX, "fp_len": N, "done": BOOL}, ...]}

``offset`` is the byte offset just after the last newline whose line has been returned by
:meth:`FileSource.read`; ``fp`` is the SHA-1 of the first ``fp_len`` (at most 1024) bytes of the
file, used to reject a reused inode. :meth:`FileSource.seek` finds each file again by inode (at
its recorded path, or, after a rotation by rename, elsewhere in the same directory), so a restart
continues exactly after the last record of the checkpoint, without losing or repeating a line.

References
----------
The ``tail -F`` semantics (follow the name, finish a renamed file, restart a truncated one) are
those of GNU coreutils ``tail --follow=name --retry``.
"""

from __future__ import annotations

import csv
import fnmatch
import glob
import hashlib
import json
import logging
import os
import re
import stat as stat_mod
import time
from dataclasses import dataclass
from typing import Any

from connectors.base import Batch

__all__ = ["FileSource", "CsvConverter", "POSITION_VERSION"]

log = logging.getLogger(__name__)

POSITION_VERSION = 1
_FP_MAX = 1024
_BOM = b"\xef\xbb\xbf"
_JSONL_SUFFIXES = (".jsonl", ".ndjson", ".json")
_CSV_SUFFIXES = (".csv",)
_COMPRESSED = (".gz", ".bz2", ".xz", ".zst", ".lz4", ".zip")  # never matched by globs/directories

# --------------------------------------------------------------------------------------------------
# CSV conversion
# --------------------------------------------------------------------------------------------------

_NUM = rb"(-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?(?:[eE][+-]?[0-9]+)?)"
_STR = rb"([\x20\x21\x23-\x2b\x2d-\x5b\x5d-\x7e]+)"  # printable ASCII except '"', ',' and '\'
_INT = rb"(-?(?:0|[1-9][0-9]*))"
_SKIP = rb"[^,\"]*"
_NUM_RE = re.compile(_NUM)
_STRING_KEYS = ("id", "model", "type", "segment")
_P_RE = re.compile(r"^p([0-9]+)$")


class CsvConverter:
    """Convert CSV rows (bytes, one line each, no newline) to JSON-object bytes.

    Recognised columns (case-insensitive, surrounding blanks ignored) are one of the layouts
    ``score,label`` (binary P(y=1) and 0/1 label), ``p0,...,p{K-1},label`` (K class probabilities
    and class index) or ``confidence,correct`` (top-label confidence and 0/1 correctness, emitted as
    ``score`` and ``label``), plus the optional ``id, model, ts, type, segment``. Other columns are
    ignored. Numbers become JSON numbers, ``ts`` a number when numeric and a string otherwise (RFC
    3339); an empty cell omits its field (an outcome row leaves the score empty).

    A malformed row never raises: a row with the wrong number of fields, invalid UTF-8 or a
    header without any known column is passed through as the raw line (rejected by the decoder as
    ``not_json``/``not_object``), and a non-numeric value in a numeric column is emitted as a JSON
    string (rejected as ``bad_type``).

    Parameters
    ----------
    header
        The header line (bytes, without newline).

    Examples
    --------
    >>> c = CsvConverter(b"id,score,label")
    >>> for r in c.convert([b"a1,0.25,1", b"a2,,0", b"a3,high,1", b"a4,0.5"]):
    ...     print(r.decode())
    {"id":"a1","score":0.25,"label":1}
    {"id":"a2","label":0}
    {"id":"a3","score":"high","label":1}
    a4,0.5
    >>> CsvConverter(b"p0,p1,p2,label").convert([b"0.2,0.3,0.5,2"])
    [b'{"probs":[0.2,0.3,0.5],"label":2}']
    """

    def __init__(self, header: bytes) -> None:
        self.error: str | None = None
        try:
            text = header.decode("utf-8")
        except UnicodeDecodeError:
            text = ""
            self.error = "header is not UTF-8"
        if text.startswith("\ufeff"):
            text = text[1:]
        names = [c.strip().lower() for c in next(csv.reader([text]), [])] if text else []
        self.ncols = len(names)
        # (column index, json key, kind) with kind in num|int|str|ts ; probs handled separately
        cols: list[tuple[int, str, str]] = []
        probs: dict[int, int] = {}
        seen: set[str] = set()
        for i, name in enumerate(names):
            m = _P_RE.match(name)
            if name in seen:
                self.error = f"duplicate column {name!r}"
            seen.add(name)
            if m:
                probs[int(m.group(1))] = i
            elif name in ("score", "confidence"):
                cols.append((i, "score", "num"))
            elif name in ("label", "correct"):
                cols.append((i, "label", "int"))
            elif name in _STRING_KEYS:
                cols.append((i, name, "str"))
            elif name == "ts":
                cols.append((i, "ts", "ts"))
        keys = [k for _, k, _ in cols]
        if keys.count("score") > 1 or keys.count("label") > 1:
            self.error = "conflicting columns (score/confidence or label/correct twice)"
        if probs and "score" in keys:
            self.error = "both score and p0..pK columns"
        if probs and sorted(probs) != list(range(len(probs))):
            self.error = "probability columns must be p0..p{K-1} without gaps"
        if not cols and not probs and self.error is None:
            self.error = "no known column (expected score,label | p0..p{K-1},label | confidence,correct)"
        self.cols = cols
        self.prob_idx = [probs[k] for k in sorted(probs)]
        self.header = names
        if self.error is None:
            self._build_fast()

    # the fast path: one regex match and one bytes % tuple per row
    def _build_fast(self) -> None:
        kinds: dict[int, tuple[str, str]] = {i: (k, kind) for i, k, kind in self.cols}
        pset = set(self.prob_idx)
        pats_num: list[bytes] = []
        pats_str: list[bytes] = []
        order: list[int] = []  # capture order (column indices)
        for i in range(self.ncols):
            if i in kinds:
                kind = kinds[i][1]
                num = _INT if kind == "int" else _NUM
                pats_num.append(_STR if kind == "str" else num)
                pats_str.append(_STR if kind in ("str", "ts") else num)
                order.append(i)
            elif i in pset:
                pats_num.append(_NUM)
                pats_str.append(_NUM)
                order.append(i)
            else:
                pats_num.append(_SKIP)
                pats_str.append(_SKIP)
        # the JSON template: fields in a fixed order (type, id, model, ts, segment, score/probs, label)
        pos = {col: j for j, col in enumerate(order)}
        rank = {"type": 0, "id": 1, "model": 2, "ts": 3, "segment": 4, "score": 5, "label": 7}
        fields = sorted(self.cols, key=lambda c: rank[c[1]])
        has_ts = any(k == "ts" for _, k, _ in self.cols)

        def template(ts_quoted: bool) -> tuple[bytes, list[int]]:
            parts: list[bytes] = []
            idx: list[int] = []
            items: list[tuple[int, bytes, list[int]]] = []
            for i, k, kind in fields:
                quoted = kind == "str" or (kind == "ts" and ts_quoted)
                items.append((rank[k], (b'"%s":"%%s"' if quoted else b'"%s":%%s') % k.encode(), [pos[i]]))
            if self.prob_idx:
                inner = b",".join([b"%s"] * len(self.prob_idx))
                items.append((6, b'"probs":[' + inner + b"]", [pos[i] for i in self.prob_idx]))
            items.sort(key=lambda t: t[0])
            for _, frag, ix in items:
                parts.append(frag)
                idx.extend(ix)
            return b"{" + b",".join(parts) + b"}", idx

        self._rx_num = re.compile(b",".join(pats_num))
        self._tpl_num, self._idx_num = template(False)
        self._rx_str = re.compile(b",".join(pats_str)) if has_ts else None
        self._tpl_str, self._idx_str = template(True)
        self._identity_num = self._idx_num == sorted(self._idx_num)
        self._identity_str = self._idx_str == sorted(self._idx_str)

    def convert(self, lines: list[bytes]) -> list[bytes]:
        """Convert rows to JSON-object bytes (one output per input row, same order).

        Parameters
        ----------
        lines
            CSV rows without their newline (a trailing ``\\r`` is ignored).

        Returns
        -------
        list of bytes
            One record per row.
        """
        if self.error is not None:
            return list(lines)
        out: list[bytes] = []
        append = out.append
        rx_num = self._rx_num.fullmatch
        rx_str = self._rx_str.fullmatch if self._rx_str is not None else None
        tpl_num, tpl_str = self._tpl_num, self._tpl_str
        idx_num, idx_str = self._idx_num, self._idx_str
        ident_num, ident_str = self._identity_num, self._identity_str
        slow = self._slow
        for line in lines:
            if line[-1:] == b"\r":
                line = line[:-1]
            m = rx_num(line)
            if m is not None:
                g = m.groups()
                append(tpl_num % (g if ident_num else tuple([g[j] for j in idx_num])))
                continue
            if rx_str is not None:
                m = rx_str(line)
                if m is not None:
                    g = m.groups()
                    append(tpl_str % (g if ident_str else tuple([g[j] for j in idx_str])))
                    continue
            append(slow(line))
        return out

    @staticmethod
    def _number(cell: str, integer: bool) -> Any:
        cell = cell.strip()
        if integer and cell.lower() in ("true", "false"):
            return 1 if cell.lower() == "true" else 0
        if not integer and _NUM_RE.fullmatch(cell.encode("ascii", "replace")):
            return _Raw(cell)
        try:
            v = float(cell)
        except ValueError:
            return cell  # a string where a number belongs: the decoder rejects it (bad_type)
        if v != v:
            return _Raw("NaN")  # non-finite: rejected by the decoder as non_finite
        if v in (float("inf"), float("-inf")):
            return _Raw("Infinity" if v > 0 else "-Infinity")
        if integer and v.is_integer():
            return int(v)  # "1.0" -> 1, as calmon check reads CSV labels
        return _Raw(repr(v))

    def _slow(self, line: bytes) -> bytes:
        try:
            text = line.decode("utf-8")
        except UnicodeDecodeError:
            return line
        if text.startswith("\ufeff"):
            text = text[1:]
        try:
            row = next(csv.reader([text]), [])
        except csv.Error:
            return line
        if len(row) != self.ncols:
            return line
        obj: dict[str, Any] = {}
        for i, key, kind in self.cols:
            cell = row[i]
            if cell.strip() == "":
                continue
            if kind == "str":
                obj[key] = cell
            elif kind == "ts":
                v = self._number(cell, False)
                obj[key] = v if isinstance(v, _Raw) else cell.strip()
            else:
                obj[key] = self._number(cell, kind == "int")
        if self.prob_idx:
            cells = [row[i] for i in self.prob_idx]
            if any(c.strip() for c in cells):
                obj["probs"] = [self._number(c, False) if c.strip() else None for c in cells]
        return _dumps(obj)


class _Raw(str):
    """A validated JSON number literal, written as is."""


def _dumps(obj: dict[str, Any]) -> bytes:
    def enc(v: Any) -> str:
        if isinstance(v, _Raw):
            return str.__str__(v)
        if isinstance(v, list):
            return "[" + ",".join(enc(x) for x in v) + "]"
        return json.dumps(v)

    return ("{" + ",".join(f"{json.dumps(k)}:{enc(v)}" for k, v in obj.items()) + "}").encode("utf-8")


# --------------------------------------------------------------------------------------------------
# File tracking
# --------------------------------------------------------------------------------------------------


@dataclass(eq=False)
class _File:
    path: str
    dev: int
    ino: int
    fmt: str
    offset: int = 0  # bytes consumed (just after the last returned line's newline)
    line: int = 1  # number of the line starting at ``offset``
    fp: str = ""
    fp_len: int = 0
    done: bool = False  # read-once: delivered to EOF
    fd: int | None = None
    buf: bytes = b""  # bytes read past ``offset``, not yet returned
    size: int = 0  # last known size
    matched: bool = True  # still matched by a path/glob/dir spec
    detached_at: float | None = None  # when the name stopped pointing at this inode
    conv: CsvConverter | None = None

    def key(self) -> tuple[int, int]:
        return (self.dev, self.ino)


def _fingerprint(fd: int, n: int) -> str:
    return hashlib.sha1(os.pread(fd, n, 0), usedforsecurity=False).hexdigest()


class FileSource:
    """Read JSONL/CSV files, globs or directories once, or follow them like ``tail -F``.

    Parameters
    ----------
    paths
        A path, glob or directory, or a list of them. A directory contributes its regular,
        non-hidden files whose names match ``pattern`` (default by format: ``*.jsonl``,
        ``*.ndjson``, ``*.json`` and/or ``*.csv``). Files are read in sorted path order.
    format
        ``"jsonl"``, ``"csv"`` or ``"auto"`` (by extension; otherwise by the first byte: ``{`` is
        JSONL, anything else CSV).
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
        Attach ``"path:line"`` origins to each batch (costs ~0.1 us per record).
    max_line_bytes
        A line longer than this without newline is delivered in pieces (rejected by the decoder)
        instead of being buffered without bound.

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
        paths: str | os.PathLike[str] | list[str | os.PathLike[str]],
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
        max_line_bytes: int = 16 << 20,
    ) -> None:
        if format not in ("jsonl", "csv", "auto"):
            raise ValueError(f"format must be 'jsonl', 'csv' or 'auto', got {format!r}")
        if start not in ("beginning", "end"):
            raise ValueError(f"start must be 'beginning' or 'end', got {start!r}")
        if chunk_bytes < 1 or max_line_bytes < 1 or poll_interval <= 0 or rotate_grace < 0:
            raise ValueError("chunk_bytes, max_line_bytes, poll_interval must be positive, rotate_grace >= 0")
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
        if pattern is None:
            both = _JSONL_SUFFIXES + _CSV_SUFFIXES
            sfx = {"jsonl": _JSONL_SUFFIXES, "csv": _CSV_SUFFIXES}.get(format, both)
            self._patterns = ["*" + s for s in sfx]
        else:
            self._patterns = [pattern]
        self._specs: list[tuple[str, str]] = []
        for s in specs:
            if os.path.isdir(s):
                self._specs.append(("dir", s))
            elif glob.has_magic(s):
                self._specs.append(("glob", s))
            else:
                if not follow and not os.path.isfile(s):
                    raise ValueError(f"FileSource {name!r}: no such file or directory: {s}")
                self._specs.append(("file", s))
        self._files: dict[tuple[int, int], _File] = {}
        self._order: list[_File] = []
        self._seeked = False
        self._scanned = False
        self._last_scan = 0.0
        self._avg_line = 128.0
        self._exhausted = False
        self._closed = False
        self.lost: list[dict[str, Any]] = []  # position entries seek() could not find
        if not self.follow:
            self._rescan()

    # ------------------------------------------------------------------ discovery
    def _scan(self) -> list[tuple[str, os.stat_result]]:
        found: dict[tuple[int, int], tuple[str, os.stat_result]] = {}

        def add(p: str) -> None:
            try:
                st = os.stat(p)
            except OSError:
                return
            if stat_mod.S_ISREG(st.st_mode):
                found.setdefault((st.st_dev, st.st_ino), (p, st))

        for kind, s in self._specs:
            if kind == "file":
                add(s)
            elif kind == "glob":
                for p in sorted(glob.glob(s)):
                    if not p.lower().endswith(_COMPRESSED):
                        add(p)
            else:
                try:
                    names = sorted(os.listdir(s))
                except OSError:
                    continue
                for n in names:
                    if not n.startswith(".") and any(fnmatch.fnmatchcase(n, pat) for pat in self._patterns):
                        add(os.path.join(s, n))
        return sorted(found.values(), key=lambda t: t[0])

    def _format_of(self, path: str, fd: int | None) -> str:
        if self.format != "auto":
            return self.format
        low = path.lower()
        if low.endswith(_CSV_SUFFIXES):
            return "csv"
        if low.endswith(_JSONL_SUFFIXES):
            return "jsonl"
        if fd is not None:
            head = os.pread(fd, 64, 0).lstrip(_BOM).lstrip()
            if head:
                return "jsonl" if head[:1] in (b"{", b"[") else "csv"
        return "jsonl"

    def _open(self, f: _File) -> bool:
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
        if f.offset > st.st_size:  # truncated while we were away
            f.offset, f.line, f.conv = 0, 1, None
        os.lseek(fd, f.offset, os.SEEK_SET)
        f.buf = b""
        f.size = st.st_size
        if f.fmt == "?":
            f.fmt = self._format_of(f.path, fd)
        return True

    def _close_file(self, f: _File) -> None:
        if f.fd is not None:
            try:
                os.close(f.fd)
            except OSError:
                pass
            f.fd = None
        f.buf = b""

    def _rescan(self) -> None:
        now = time.monotonic()
        self._last_scan = now
        initial = not self._scanned and not self._seeked
        self._scanned = True
        seen: set[tuple[int, int]] = set()
        for path, st in self._scan():
            key = (st.st_dev, st.st_ino)
            seen.add(key)
            f = self._files.get(key)
            if f is None:
                f = _File(path, st.st_dev, st.st_ino, "?", size=st.st_size)
                self._files[key] = f
                if self.follow:
                    if not self._open(f):
                        del self._files[key]
                        continue
                    if initial and self.start == "end":
                        self._skip_to_end(f)
            else:
                f.path = path
                f.size = st.st_size
                if not f.matched:
                    f.matched, f.detached_at = True, None
        for f in list(self._files.values()):
            if f.key() not in seen and f.matched:
                f.matched = False
                f.detached_at = now
        self._order = sorted(
            self._files.values(), key=lambda f: (f.matched, f.detached_at or 0.0, f.path)
        )

    def _skip_to_end(self, f: _File) -> None:
        assert f.fd is not None
        size = os.fstat(f.fd).st_size
        tail = os.pread(f.fd, min(size, self.max_line_bytes), max(0, size - self.max_line_bytes))
        cut = tail.rfind(b"\n")
        end = size - len(tail) + cut + 1 if cut >= 0 else 0
        lines, pos = 1, 0
        while pos < end:
            piece = os.pread(f.fd, min(16 << 20, end - pos), pos)
            if not piece:
                break
            lines += piece.count(b"\n")
            pos += len(piece)
        f.line = lines
        f.offset = end
        os.lseek(f.fd, end, os.SEEK_SET)

    # ------------------------------------------------------------------ reading
    def _header(self, f: _File) -> CsvConverter:
        """Read the CSV header (first line) of a file opened past its beginning."""
        assert f.fd is not None
        data = b""
        while len(data) < f.offset:
            more = os.pread(f.fd, min(65536, f.offset - len(data)), len(data))
            if not more:
                break
            data += more
            for line in data.split(b"\n")[:-1]:  # the first non-blank complete line
                if line.strip(b"\r"):
                    return CsvConverter(line.rstrip(b"\r"))
        return CsvConverter(b"")

    def _read_file(self, f: _File, need: int, out: list[bytes], origins: list[str] | None) -> int:
        """Append up to ``need`` records of ``f`` to ``out``; returns how many were appended."""
        if f.done:
            return 0
        if f.fd is None and not self._open(f):
            if not self.follow:  # vanished between the scan and its turn
                log.warning("%s: cannot open %s, skipped", self.name, f.path)
                self.lost.append({"path": f.path, "dev": f.dev, "ino": f.ino, "offset": f.offset})
                f.done = True
            return 0
        fd = f.fd
        assert fd is not None
        got = 0
        final = not self.follow or (not f.matched and f.detached_at is not None
                                    and time.monotonic() - f.detached_at >= self.rotate_grace)
        if f.fmt == "csv" and f.conv is None and f.offset > 0:
            f.conv = self._header(f)
        while got < need:
            want = need - got
            buf = f.buf
            eof = False
            if buf.count(b"\n") < want:
                size = max(self.chunk_bytes, min(int(want * self._avg_line * 1.1), 64 << 20))
                chunk = os.read(fd, size)
                if chunk:
                    buf = buf + chunk if buf else chunk
                else:
                    eof = True
            if not buf:
                break
            parts = buf.split(b"\n", want)
            rest = parts.pop()
            nl = len(parts)
            consumed = len(buf) - len(rest)
            first_line = f.line
            if f.offset == 0 and parts and parts[0].startswith(_BOM):
                parts[0] = parts[0][3:]
            if eof and rest and final:
                parts.append(rest)  # last line without newline of a finished file
                consumed += len(rest)
                rest = b""
            while len(rest) >= self.max_line_bytes:  # an unterminated line too long to hold back
                parts.append(rest[: self.max_line_bytes])
                consumed += self.max_line_bytes
                rest = rest[self.max_line_bytes:]
            f.offset += consumed
            f.line += nl
            f.buf = rest
            if parts:
                self._avg_line = 0.9 * self._avg_line + 0.1 * (consumed / max(len(parts), 1))
                got += self._emit(f, parts, first_line, out, origins)
            if eof:
                break
        if f.offset + len(f.buf) >= f.size or got == 0:
            self._check_eof(f, final)
        return got

    def _emit(self, f: _File, parts: list[bytes], first_line: int, out: list[bytes],
              origins: list[str] | None) -> int:
        lines_no: list[int] | range = range(first_line, first_line + len(parts))
        if b"" in parts or b"\r" in parts:
            keep = [i for i, p in enumerate(parts) if p and p != b"\r"]
            parts = [parts[i] for i in keep]
            lines_no = [first_line + i for i in keep]
        if not parts:
            return 0
        if f.fmt == "csv":
            if f.conv is None:
                f.conv = CsvConverter(parts[0])
                if f.conv.error is not None:
                    log.warning("%s: CSV header of %s rejected: %s", self.name, f.path, f.conv.error)
                    # the header itself goes to the decoder (and the dead letters) as it is
                else:
                    parts = parts[1:]
                    lines_no = lines_no[1:]
            parts = f.conv.convert(parts)
        out.extend(parts)
        if origins is not None:
            p = f.path
            origins.extend([f"{p}:{i}" for i in lines_no])
        return len(parts)

    def _check_eof(self, f: _File, final: bool) -> None:
        """At EOF: detect truncation, finish read-once files, drop drained rotated files."""
        if f.fd is None:
            return
        try:
            st = os.fstat(f.fd)
        except OSError:
            return
        f.size = st.st_size
        readpos = f.offset + len(f.buf)
        if st.st_size < readpos:  # truncated (copytruncate): start again from 0
            log.info("%s: %s truncated (%d < %d), reading from the start",
                     self.name, f.path, st.st_size, readpos)
            f.offset, f.line, f.buf, f.conv = 0, 1, b"", None
            os.lseek(f.fd, 0, os.SEEK_SET)
            return
        if st.st_size > readpos:
            return
        if not self.follow:
            if not f.buf:
                f.done = True
                self._update_fp(f)
                self._close_file(f)
        elif final and not f.buf:
            self._close_file(f)
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
            origins: list[str] | None = [] if self.with_origins else None
            for f in list(self._order):
                if len(out) >= max_records:
                    break
                self._read_file(f, max_records - len(out), out, origins)
            if out:
                return Batch(out, self.position(), self.name, origins, {"lag_bytes": self.lag_bytes()})
            if not self.follow:
                if all(f.done for f in self._files.values()):
                    self._exhausted = True
                    return None
                continue  # a file still had bytes (e.g. only blank lines); keep going
            now = time.monotonic()
            if now >= deadline:
                return None
            time.sleep(min(self.poll_interval, deadline - now))

    @property
    def exhausted(self) -> bool:
        """True once a read-once source has delivered every line (never while following)."""
        return self._exhausted

    def lag_bytes(self) -> int:
        """Bytes known to be in the files but not yet returned (from the last size seen)."""
        return sum(max(0, f.size - f.offset) for f in self._files.values() if not f.done)

    # ------------------------------------------------------------------ positions
    def _update_fp(self, f: _File) -> None:
        if f.fp_len < _FP_MAX and f.offset > f.fp_len and f.fd is not None:
            n = min(f.offset, _FP_MAX)
            f.fp, f.fp_len = _fingerprint(f.fd, n), n

    def position(self) -> dict[str, Any]:
        """The position just after the last record returned by :meth:`read` (JSON-serialisable)."""
        files = []
        for f in self._order:
            self._update_fp(f)
            files.append({"path": f.path, "dev": f.dev, "ino": f.ino, "offset": f.offset, "line": f.line,
                          "fp": f.fp, "fp_len": f.fp_len, "done": f.done})
        return {"version": POSITION_VERSION, "kind": "files", "source": self.name, "files": files}

    def _locate(self, e: dict[str, Any]) -> tuple[str, int] | None:
        """Find the file of a position entry: (path, fd) or None."""
        path, ino, dev = str(e["path"]), int(e["ino"]), int(e["dev"])
        fp, fp_len = str(e.get("fp", "")), int(e.get("fp_len", 0))
        candidates = [path]
        try:
            d = os.path.dirname(path) or "."
            with os.scandir(d) as it:
                candidates += [x.path for x in it if x.inode() == ino and x.path != path]
        except OSError:
            pass
        for p in candidates:
            try:
                fd = os.open(p, os.O_RDONLY)
            except OSError:
                continue
            st = os.fstat(fd)
            ok = st.st_ino == ino and stat_mod.S_ISREG(st.st_mode)
            if ok and fp_len > 0:
                ok = st.st_size >= fp_len and _fingerprint(fd, fp_len) == fp
            elif ok:
                ok = st.st_dev == dev
            if ok:
                return p, fd
            os.close(fd)
        return None

    def seek(self, position: dict[str, Any]) -> None:
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
        if not isinstance(position, dict) or position.get("kind") != "files" or "files" not in position:
            raise ValueError(f"FileSource {self.name!r}: not a file-source position: {position!r:.200}")
        if int(position.get("version", 0)) > POSITION_VERSION:
            raise ValueError(f"FileSource {self.name!r}: position version {position.get('version')} is newer "
                             f"than supported ({POSITION_VERSION})")
        for f in self._files.values():
            self._close_file(f)
        self._files = {}
        self.lost = []
        for e in position["files"]:
            try:
                loc = self._locate(e)
            except (KeyError, TypeError, ValueError) as exc:
                raise ValueError(f"FileSource {self.name!r}: bad position entry {e!r}: {exc}") from exc
            if loc is None and e.get("done") and not self.follow:
                continue  # a finished file that was removed since: nothing left to read
            if loc is None:
                log.warning("%s: %s (inode %s) not found, %s bytes after offset %s may be lost",
                            self.name, e["path"], e["ino"], "the", e["offset"])
                self.lost.append(dict(e))
                continue
            p, fd = loc
            st = os.fstat(fd)
            f = _File(p, st.st_dev, st.st_ino, "?", offset=int(e["offset"]), line=int(e.get("line", 1)),
                      fp=str(e.get("fp", "")), fp_len=int(e.get("fp_len", 0)),
                      done=bool(e.get("done", False)), size=st.st_size)
            os.close(fd)
            if f.done and not self.follow:
                self._files[f.key()] = f
                continue
            f.done = False
            if self._open(f):
                self._files[f.key()] = f
        self._seeked = True
        self._scanned = False
        self._exhausted = False
        self._rescan()

    def close(self) -> None:
        """Close every open file (idempotent)."""
        for f in self._files.values():
            self._close_file(f)
        self._closed = True

    def __enter__(self) -> FileSource:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
