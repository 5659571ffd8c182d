"""One followed file of :class:`connectors.files.FileSource`: its identity, offsets and fingerprint.

A file is tracked by ``(st_dev, st_ino)``, never by name, so a rename (log rotation) keeps its
reading state. ``fp`` is the SHA-1 of its first ``fp_len`` (at most 1024) bytes: a checkpointed
position refers to a file only when the inode *and* the fingerprint match, which rejects an inode
number reused by a new file.
"""

from __future__ import annotations

import hashlib
import os
import stat as stat_mod
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from calmon.csvrows import CsvConverter

__all__ = ["TrackedFile", "fingerprint", "locate", "skip_to_end", "csv_header", "FP_MAX", "BOM"]

FP_MAX = 1024
BOM = b"\xef\xbb\xbf"


@dataclass(eq=False)
class TrackedFile:
    """Reading state of one file (see the module docstring).

    Examples
    --------
    >>> f = TrackedFile("a.jsonl", dev=1, ino=42, fmt="jsonl")
    >>> f.key(), f.offset, f.line
    ((1, 42), 0, 1)
    """

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

    def update_fp(self) -> None:
        """Extend the fingerprint while the file has fewer than :data:`FP_MAX` consumed bytes in it."""
        if self.fp_len < FP_MAX and self.offset > self.fp_len and self.fd is not None:
            n = min(self.offset, FP_MAX)
            self.fp, self.fp_len = fingerprint(self.fd, n), n

    def close(self) -> None:
        """Close the descriptor (if open) and drop the read-ahead buffer."""
        if self.fd is not None:
            try:
                os.close(self.fd)
            except OSError:
                pass
            self.fd = None
        self.buf = b""


def fingerprint(fd: int, n: int) -> str:
    """SHA-1 (hex) of the first ``n`` bytes of an open file."""
    return hashlib.sha1(os.pread(fd, n, 0), usedforsecurity=False).hexdigest()


def locate(e: Mapping[str, Any]) -> tuple[str, int] | None:
    """Find the file of a position entry again: ``(path, open fd)`` or None.

    Looks at the recorded path, then at files with the same inode in the same directory (a
    rotation by rename); the fingerprint (or, without one, the device) must match.
    """
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
    os.lseek(f.fd, end, os.SEEK_SET)


def csv_header(f: TrackedFile) -> CsvConverter:
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
                return CsvConverter(line.rstrip(b"\r"))
    return CsvConverter(b"")
