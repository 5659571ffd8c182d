"""Positions of :class:`connectors.files.FileSource`: what was read, and the files found again on a restart.

Positions
---------
:meth:`connectors.files.FileSource.position` returns a JSON-serialisable dict::

    {"version": 2, "kind": "files", "source": NAME,
     "files": [{"path": P, "dev": D, "ino": I, "offset": BYTES, "line": NEXT_LINE_NUMBER,
                "fp": SHA1_HEX, "fp_len": N, "done": BOOL}, ...]}

A whole file's entry adds ``"whole"`` (``gzip``, ``zstd``, ``bzip2``, ``xz`` or ``table``) and ``"unit"``: for a
compressed file ``offset`` is the **decompressed** byte offset (``unit: decompressed``; a restart decompresses the
file again and skips that many bytes), for a table the index of the next row (``unit: row``); ``fp``
fingerprints the file's first bytes.

``offset`` is the byte offset just after the last newline whose line has been returned by
:meth:`connectors.files.FileSource.read`; ``fp`` is the SHA-1 of the ``fp_len`` (at most 1024) bytes before the
offset (version 1, still read: the first bytes of the file), used to reject a reused inode.
:meth:`connectors.files.FileSource.seek` finds each file again by inode (at its recorded path, or, after a
rotation by rename, elsewhere in the same directory), so a restart continues exactly after the last record of
the checkpoint, without losing or repeating a line.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

from connectors.filetrack import FP_MAX, TrackedFile, locate

__all__ = ["POSITION_VERSION", "position_of", "check_position", "restore_entries"]

POSITION_VERSION = 2


def position_of(name: str, files: Iterable[TrackedFile]) -> dict[str, Any]:
    """The position of the source ``name`` whose files are ``files``, in reading order (see the module notes).

    Examples
    --------
    >>> position_of("demo", [])
    {'version': 2, 'kind': 'files', 'source': 'demo', 'files': []}
    """
    entries = []
    for f in files:
        fp, fp_len = f.fingerprint()
        entry = {"path": f.path, "dev": f.dev, "ino": f.ino, "offset": f.offset, "line": f.line,
                 "fp": fp, "fp_len": fp_len, "done": f.done}
        if f.whole:
            entry.update(whole=f.whole, unit="row" if f.whole == "table" else "decompressed")
        entries.append(entry)
    return {"version": POSITION_VERSION, "kind": "files", "source": name, "files": entries}


def check_position(position: Mapping[str, Any], name: str) -> bool:
    """Reject what is not a file-source position (``ValueError``); whether fingerprints are of the bytes
    before the offset (version 2) rather than of the first bytes (version 1).

    Examples
    --------
    >>> check_position({"version": 1, "kind": "files", "files": []}, "demo")
    False
    """
    if not isinstance(position, Mapping) or position.get("kind") != "files" or "files" not in position:
        raise ValueError(f"FileSource {name!r}: not a file-source position: {position!r:.200}")
    if int(position.get("version", 0)) > POSITION_VERSION:
        raise ValueError(f"FileSource {name!r}: position version {position.get('version')} is newer "
                         f"than supported ({POSITION_VERSION})")
    return int(position.get("version", 0)) >= 2


def restore_entries(entries: Iterable[Mapping[str, Any]], at_offset: bool, follow: bool, name: str
                    ) -> Iterator[TrackedFile | dict[str, Any]]:
    """The files of a position's ``entries`` found again, one by one, as they are found.

    Yields a :class:`~connectors.filetrack.TrackedFile` at its recorded offset, line and state (closed; one
    not ``done`` is to be opened and kept only if it opens), or a copy of an entry whose file cannot be found
    (lost). A finished file that was removed since is skipped when not following: nothing is left to read.
    A malformed entry raises ``ValueError``.
    """
    for e in entries:
        try:
            loc = locate(e, at_offset)
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"FileSource {name!r}: bad position entry {e!r}: {exc}") from exc
        if loc is None and e.get("done") and not follow:
            continue  # a finished file that was removed since: nothing left to read
        if loc is None:
            yield dict(e)
            continue
        p, fd = loc
        st = os.fstat(fd)
        f = TrackedFile(p, st.st_dev, st.st_ino, "?", offset=int(e["offset"]), line=int(e.get("line", 1)),
                        done=bool(e.get("done", False)), size=st.st_size)
        if e.get("whole"):
            if f.done:  # a finished whole file stays finished (never read twice)
                f.whole, f.head = str(e["whole"]), os.pread(fd, FP_MAX, 0)
                os.close(fd)
                yield f
                continue
        elif f.offset <= st.st_size:
            f.fd = fd
            f.load_tail()
            f.fd = None
        os.close(fd)
        if not (f.done and not follow):
            f.done = False
        yield f
