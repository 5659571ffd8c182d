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
"""

from __future__ import annotations

import fnmatch
import glob
import os
import stat as stat_mod

from connectors.filetrack import BOM

__all__ = ["FileSpecs", "JSONL_SUFFIXES", "CSV_SUFFIXES", "COMPRESSED"]

JSONL_SUFFIXES = (".jsonl", ".ndjson", ".json")
CSV_SUFFIXES = (".csv",)
COMPRESSED = (".gz", ".bz2", ".xz", ".zst", ".lz4", ".zip")  # never matched by globs/directories


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
            sfx = {"jsonl": JSONL_SUFFIXES, "csv": CSV_SUFFIXES}.get(format, JSONL_SUFFIXES + CSV_SUFFIXES)
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
                for p in sorted(glob.glob(s)):
                    if not p.lower().endswith(COMPRESSED):
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

    def format_of(self, path: str, fd: int | None) -> str:
        """``"jsonl"`` or ``"csv"``: the configured format, else by extension, else by the first byte."""
        if self.format != "auto":
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
