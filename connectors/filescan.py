"""Which files a :class:`connectors.files.FileSource` reads: paths, globs and directories, and their format.

Examples
--------
>>> import tempfile, pathlib
>>> d = pathlib.Path(tempfile.mkdtemp())
>>> for n in ("b.csv", "a.jsonl", ".hidden.jsonl", "c.jsonl.gz", "notes.txt"):
...     _ = (d / n).write_text("x\\n")
>>> [pathlib.Path(p).name for p, _ in FileSpecs([str(d)]).scan()]
['a.jsonl', 'b.csv']
>>> FileSpecs([str(d / "*.csv")], "auto").format_of(str(d / "b.csv"), None)
'csv'
>>> FileSpecs([str(d / "*.jsonl.gz")]).kind_of(str(d / "c.jsonl.gz"), None), len(FileSpecs([str(d / "*.gz")]).scan())
(('jsonl', 'gzip'), 1)

Parquet and Arrow IPC files (``.parquet``, ``.pq``, ``.arrow``, ``.feather``, ``.ipc``) are matched by the
default patterns; a file matched by a path, glob or ``pattern`` is recognised by its first bytes whatever its
name (``PAR1``, ``ARROW1``, gzip/zstd/bzip2/xz magic).

Compressed files (``.gz``, ``.zst``, ``.bz2``, ``.xz``) are matched only by a path, glob or ``pattern`` that names their
suffix (``*.jsonl.gz``), never by the default patterns or by a glob such as ``app.jsonl*``: log rotation
often compresses lines that were already read from the live file into the same directory.
"""

from __future__ import annotations

import fnmatch
import glob
import os
import stat as stat_mod

from calmon.formats.compressed import codec_of, codec_of_name
from calmon.formats.parquet import TABLE_SUFFIXES, table_kind
from connectors.filetrack import BOM

__all__ = ["FileSpecs", "JSONL_SUFFIXES", "CSV_SUFFIXES", "TABLE_SUFFIXES", "COMPRESSED", "FORMATS"]

FORMATS = ("auto", "jsonl", "csv", "parquet")
JSONL_SUFFIXES = (".jsonl", ".ndjson", ".json")
CSV_SUFFIXES = (".csv",)
READABLE = (".gz", ".zst", ".bz2", ".xz")  # compressed suffixes read when a spec names them
COMPRESSED = (".gz", ".bz2", ".xz", ".zst", ".lz4", ".zip")  # never matched by globs that do not name them


class FileSpecs:
    """The path, glob and directory specifications of a source.

    Parameters
    ----------
    specs
        Paths, globs or directories (a directory contributes its regular, non-hidden files whose
        names match ``pattern``).
    format
        ``"jsonl"``, ``"csv"`` or ``"auto"``; also chooses the default name patterns.
    pattern
        Glob for file names inside directories (default by format).
    must_exist
        Raise ``ValueError`` for a plain path that is not a file (read-once sources).
    name
        Source name for error messages.
    """

    def __init__(self, specs: list[str], format: str = "auto", pattern: str | None = None,  # noqa: A002
                 must_exist: bool = False, name: str = "files") -> None:
        self.format = format
        if pattern is None:
            sfx = {"jsonl": JSONL_SUFFIXES, "csv": CSV_SUFFIXES, "parquet": TABLE_SUFFIXES}.get(
                format, JSONL_SUFFIXES + CSV_SUFFIXES + TABLE_SUFFIXES)
            self.patterns = ["*" + s for s in sfx]
        else:
            self.patterns = [pattern]
        self.specs: list[tuple[str, str]] = []
        for s in specs:
            if os.path.isdir(s):
                self.specs.append(("dir", s))
            elif glob.has_magic(s):
                self.specs.append(("glob", s))
            else:
                if must_exist and not os.path.isfile(s):
                    raise ValueError(f"FileSource {name!r}: no such file or directory: {s}")
                self.specs.append(("file", s))

    def scan(self) -> list[tuple[str, os.stat_result]]:
        """The regular files matched now, once per inode, sorted by path."""
        found: dict[tuple[int, int], tuple[str, os.stat_result]] = {}

        def add(p: str) -> None:
            try:
                st = os.stat(p)
            except OSError:
                return
            if stat_mod.S_ISREG(st.st_mode):
                found.setdefault((st.st_dev, st.st_ino), (p, st))

        for kind, s in self.specs:
            if kind == "file":
                add(s)
            elif kind == "glob":
                named = s.lower().endswith(READABLE)
                for p in sorted(glob.glob(s)):
                    if named or not p.lower().endswith(COMPRESSED):
                        add(p)
            else:
                try:
                    names = sorted(os.listdir(s))
                except OSError:
                    continue
                for n in names:
                    if not n.startswith(".") and any(fnmatch.fnmatchcase(n, pat) for pat in self.patterns):
                        add(os.path.join(s, n))
        return sorted(found.values(), key=lambda t: t[0])

    def kind_of(self, path: str, fd: int | None) -> tuple[str, str | None]:
        """``(format, whole)``: a Parquet or Arrow file is ``("table", "table")``; a compressed file
        ``(inner format, codec)`` (by the suffix before ``.gz``, default JSON Lines); else ``(format, None)``."""
        head = os.pread(fd, 8, 0) if fd is not None else b""
        if self.format == "parquet" or table_kind(head, path) is not None or path.lower().endswith(TABLE_SUFFIXES):
            return "table", "table"
        codec = codec_of_name(path) or codec_of(head)
        if codec is None:
            return self.format_of(path, fd), None
        inner = os.path.splitext(path)[0] if codec_of_name(path) else path
        fmt = self.format if self.format != "auto" else "csv" if inner.lower().endswith(CSV_SUFFIXES) else "jsonl"
        return fmt, codec

    def format_of(self, path: str, fd: int | None) -> str:
        """``"jsonl"`` or ``"csv"``: the configured format, else by extension, else by the first byte."""
        if self.format in ("jsonl", "csv"):
            return self.format
        low = path.lower()
        if low.endswith(CSV_SUFFIXES):
            return "csv"
        if low.endswith(JSONL_SUFFIXES):
            return "jsonl"
        if fd is not None:
            head = os.pread(fd, 64, 0).lstrip(BOM).lstrip()
            if head:
                return "jsonl" if head[:1] in (b"{", b"[") else "csv"
        return "jsonl"
