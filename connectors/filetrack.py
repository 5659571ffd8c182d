"""One followed file of :class:`connectors.files.FileSource`: its identity, offsets and fingerprint.

A file is tracked by ``(st_dev, st_ino)``, never by name, so a rename (log rotation) keeps its
reading state. Its fingerprint is the SHA-1 of the (at most 1024) bytes just *before* its offset,
kept in memory as ``tail``: it describes the bytes now at the position, so a checkpointed position
refers to a file only when the inode *and* those bytes match (which rejects an inode reused by a
new file), and a followed file whose bytes before the position changed (truncated, then rewritten
past the old size before the next poll; ``copytruncate``) is read again from its start instead of
losing or repeating lines, across restarts too.

A line longer than the source's limit is skipped while it is read (:class:`LineSkip`: its first
bytes, size and SHA-256), never buffered whole, and handed on as one
:class:`calmon.events.decoder.OversizedRecord`.
"""

from __future__ import annotations

import hashlib
import os
import stat as stat_mod
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from calmon.formats.csvobjects import CsvObjects
from calmon.formats.csvrows import CsvConverter
from calmon.formats.records import PREFIX_BYTES, OversizedRecord

__all__ = ["TrackedFile", "Segment", "WholeReader", "LineSkip", "fingerprint", "locate", "skip_to_end", "csv_header",
           "FP_MAX", "BOM"]

FP_MAX = 1024
BOM = b"\xef\xbb\xbf"


@dataclass
class LineSkip:
    """A line longer than the limit, being read past: first bytes, size so far, running SHA-256, last bytes.

    Examples
    --------
    >>> sk = LineSkip(line=3)
    >>> sk.feed(b"a" * 5000); sk.feed(b"b" * 10)
    >>> r = sk.record()
    >>> len(r), bytes(r)[:2], len(bytes(r)), sk.tail[-2:]
    (5010, b'aa', 4096, b'bb')
    """

    line: int
    prefix: bytes = b""
    size: int = 0
    tail: bytes = b""
    sha: Any = field(default_factory=hashlib.sha256)

    def feed(self, data: bytes) -> None:
        if len(self.prefix) < PREFIX_BYTES:
            self.prefix += data[:PREFIX_BYTES - len(self.prefix)]
        self.sha.update(data)
        self.size += len(data)
        self.tail = (self.tail + data[-FP_MAX:])[-FP_MAX:]

    def record(self) -> OversizedRecord:
        return OversizedRecord(self.prefix, self.size, self.sha.hexdigest())


@dataclass
class Segment:
    """Records delivered together: contiguous ``lines`` (or table records) from number ``first``, or one
    ``oversized`` line read past without being held."""

    first: int
    lines: list[bytes] | None = None
    oversized: OversizedRecord | None = None


class WholeReader(Protocol):
    """A reader of a file read whole (compressed lines or a table: :mod:`connectors.filewhole`)."""

    offset: int  # the position to checkpoint: decompressed bytes (compressed lines) or rows (tables) returned

    @property
    def finished(self) -> bool: ...

    def read(self, want: int) -> list[Segment]: ...

    def close(self) -> None: ...


@dataclass(eq=False)
class TrackedFile:
    """Reading state of one file (see the module docstring).

    Examples
    --------
    >>> f = TrackedFile("a.jsonl", dev=1, ino=42, fmt="jsonl")
    >>> f.key(), f.offset, f.line
    ((1, 42), 0, 1)
    >>> f.consume(2001, b"x" * 2000 + bytes([10])); f.offset, len(f.tail), f.fingerprint()[1]
    (2001, 1024, 1024)
    """

    path: str
    dev: int
    ino: int
    fmt: str
    offset: int = 0  # bytes consumed (just after the last returned line's newline)
    line: int = 1  # number of the line starting at ``offset``
    tail: bytes = b""  # the (at most FP_MAX) bytes just before ``offset``
    done: bool = False  # read-once: delivered to EOF
    fd: int | None = None
    buf: bytes = b""  # bytes read past ``offset``, not yet returned
    skip: LineSkip | None = None  # an overlong line being read past ``offset``
    size: int = 0  # last known size
    matched: bool = True  # still matched by a path/glob/dir spec
    detached_at: float | None = None  # when the name stopped pointing at this inode
    conv: CsvConverter | CsvObjects | None = None
    #: whole-file reading (:mod:`connectors.filewhole`): ``"gzip"``, ``"zstd"``, ``"bzip2"``, ``"xz"`` or
    #: ``"table"``; None: plain lines
    whole: str | None = None
    reader: WholeReader | None = None
    head: bytes = b""  # a whole file's first (at most FP_MAX) raw bytes: its fingerprint
    seen: tuple[int, int] = (-1, -1)  # (size, mtime_ns) at the last scan
    seen_since: float = 0.0  # monotonic time since which ``seen`` has not changed
    failed: tuple[int, int] | None = None  # ``seen`` when a whole file failed: retried once it changes

    def key(self) -> tuple[int, int]:
        return (self.dev, self.ino)

    def consume(self, n: int, last: bytes) -> None:
        """Move the offset past ``n`` bytes of returned lines, whose last bytes are ``last`` (up to FP_MAX)."""
        self.offset += n
        self.tail = last[-FP_MAX:] if len(last) >= FP_MAX else (self.tail + last)[-FP_MAX:]

    def finish_skip(self, newline: bool) -> OversizedRecord:
        """The skipped line as one record; the offset moves past it (and its newline)."""
        assert self.skip is not None
        sk, self.skip = self.skip, None
        self.offset += sk.size + newline
        self.line += newline
        self.tail = (sk.tail + b"\n" * newline)[-FP_MAX:]
        return sk.record()

    def read_pos(self) -> int:
        """The file offset of the next byte to read."""
        return self.offset + (self.skip.size if self.skip is not None else 0) + len(self.buf)

    def rewind(self) -> None:
        """Start again from the beginning (the file was truncated or rewritten)."""
        self.offset, self.line, self.tail, self.buf, self.skip, self.conv = 0, 1, b"", b"", None, None
        if self.fd is not None:
            os.lseek(self.fd, 0, os.SEEK_SET)

    def fingerprint(self) -> tuple[str, int]:
        """``(SHA-1 hex, length)`` of the bytes before the offset (a whole file: of its first bytes)."""
        data = self.head if self.whole else self.tail
        return hashlib.sha1(data, usedforsecurity=False).hexdigest(), len(data)

    def observe(self, size: int, mtime_ns: int, now: float) -> None:
        """Note the size and modification time seen by a scan (a whole file is read once they settle)."""
        if (size, mtime_ns) != self.seen:
            self.seen, self.seen_since = (size, mtime_ns), now

    def unchanged(self) -> bool:
        """Whether the bytes before the offset are still those that were read (one ``pread``)."""
        if self.fd is None or not self.tail or self.whole:
            return True
        n = len(self.tail)
        return os.pread(self.fd, n, self.offset - n) == self.tail

    def load_tail(self) -> None:
        """Read the bytes before the offset from the open file (after a seek)."""
        assert self.fd is not None
        n = min(self.offset, FP_MAX)
        self.tail = os.pread(self.fd, n, self.offset - n) if n else b""

    def close(self) -> None:
        """Close the descriptor (if open) and drop the read-ahead buffer."""
        if self.reader is not None:
            self.reader.close()
            self.reader = None
        if self.fd is not None:
            try:
                os.close(self.fd)
            except OSError:
                pass
            self.fd = None
        self.buf = b""
        self.skip = None


def fingerprint(fd: int, n: int, at: int = 0) -> str:
    """SHA-1 (hex) of ``n`` bytes of an open file from offset ``at``."""
    return hashlib.sha1(os.pread(fd, n, at), usedforsecurity=False).hexdigest()


def locate(e: Mapping[str, Any], at_offset: bool = True) -> tuple[str, int] | None:
    """Find the file of a position entry again: ``(path, open fd)`` or None.

    Looks at the recorded path, then at files with the same inode in the same directory (a
    rotation by rename); the fingerprint must match: of the ``fp_len`` bytes before the offset
    (``at_offset``, position version 2) or of the first ``fp_len`` bytes (version 1, and entries of
    whole files, whose ``unit`` is ``"decompressed"`` or ``"row"``: their offset is not a file offset). A file now
    shorter than the offset was truncated: it is returned (and read again from its start). Without
    a fingerprint, the device must match.
    """
    path, ino, dev = str(e["path"]), int(e["ino"]), int(e["dev"])
    at_offset = at_offset and e.get("unit", "byte") == "byte"
    fp, fp_len, offset = str(e.get("fp", "")), int(e.get("fp_len", 0)), int(e.get("offset", 0))
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
        if ok and fp_len > 0 and at_offset:
            ok = st.st_dev == dev and (st.st_size < offset or fingerprint(fd, fp_len, offset - fp_len) == fp)
        elif ok and fp_len > 0:
            ok = st.st_size >= fp_len and fingerprint(fd, fp_len) == fp
        elif ok:
            ok = st.st_dev == dev
        if ok:
            return p, fd
        os.close(fd)
    return None


def skip_to_end(f: TrackedFile, max_line_bytes: int) -> None:
    """Move an open file to just after its last complete line, counting lines (``start="end"``)."""
    assert f.fd is not None
    size = os.fstat(f.fd).st_size
    tail = os.pread(f.fd, min(size, max_line_bytes), max(0, size - max_line_bytes))
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
    f.load_tail()
    os.lseek(f.fd, end, os.SEEK_SET)


def csv_header(f: TrackedFile, make: Callable[[bytes], CsvConverter | CsvObjects] = CsvConverter
               ) -> CsvConverter | CsvObjects:
    """The converter of a CSV file opened past its beginning, from its first non-blank line."""
    assert f.fd is not None
    data = b""
    while len(data) < f.offset:
        more = os.pread(f.fd, min(65536, f.offset - len(data)), len(data))
        if not more:
            break
        data += more
        for line in data.split(b"\n")[:-1]:
            if line.strip(b"\r"):
                return make(line.rstrip(b"\r"))
    return make(b"")
