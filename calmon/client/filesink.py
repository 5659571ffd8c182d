"""A JSON Lines file with size- and time-based rotation, for ``calmon run``'s file source.

Rotation renames the active file (``events.jsonl``) to a timestamped sibling
(``events-20261123T021500.123456Z.jsonl``) in the same directory and opens a new active file.
A rename keeps the inode, so a following :class:`connectors.files.FileSource` (tracking files by
device and inode) finishes the renamed file and starts the new one at byte 0: nothing is lost or
read twice. Rotated names sort before the active one and in time order, and match the same
directory (``*.jsonl``) or glob (``events*.jsonl``), so an agent that was down during a rotation
reads them too. Only a regular file rotates: a device or a fifo is written to, never renamed.

Each event is one ``os.write`` of a whole line on an ``O_APPEND`` descriptor: a reader never sees
half an event except while that call runs (and the file source holds a partial last line back).
"""

from __future__ import annotations

import logging
import os
import stat
import threading
import time
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path

from calmon.client.forking import after_fork_in_child

__all__ = ["RotatingFileSink"]

log = logging.getLogger(__name__)


class RotatingFileSink:
    """Append event lines to a JSONL file, rotating it by size and/or age; never raises on write.

    Parameters
    ----------
    path
        The active file; ``{pid}`` is replaced by the process id, also in a forked child, which
        then writes its own file (two processes must not rotate the same file).
    max_bytes
        Rotate before a write that would make the active file larger than this (None: no limit).
    max_age
        Rotate before a write once the active file has been open this many seconds (None: never).
    fsync
        fsync the file before a rotation and its directory after (durable rotations; slower).
    clock
        Monotonic clock for ``max_age`` (tests pass a fake one).

    Examples
    --------
    >>> import tempfile, pathlib
    >>> d = pathlib.Path(tempfile.mkdtemp())
    >>> sink = RotatingFileSink(d / "events.jsonl", max_bytes=30)
    >>> for i in range(3):
    ...     sink.write(str(i), b'{"id":"%d","label":1}\\n' % i)
    >>> _ = sink.close(); sink.counters()["sent"], sink.counters()["rotations"], len(list(d.iterdir()))
    (3, 2, 3)
    """

    def __init__(self, path: str | os.PathLike[str], max_bytes: int | None = 64 << 20,
                 max_age: float | None = None, fsync: bool = False,
                 clock: Callable[[], float] = time.monotonic) -> None:
        if max_bytes is not None and max_bytes <= 0:
            raise ValueError(f"max_bytes must be positive or None, got {max_bytes!r}")
        if max_age is not None and not max_age > 0:
            raise ValueError(f"max_age must be positive seconds or None, got {max_age!r}")
        self._template = str(path)
        self.path = Path(self._template.replace("{pid}", str(os.getpid())))
        if self.path.is_dir():
            raise ValueError(f"{self.path} is a directory; give the active file's path")
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.max_bytes = max_bytes
        self.max_age = max_age
        self.fsync = fsync
        self._clock = clock
        self._lock = threading.Lock()
        self._fd: int | None = None
        self._closed = False
        self._size = 0
        self._opened = 0.0
        self._rotates = False
        self.sent = self.errors = self.rotations = 0
        self.last_error = ""
        self._open()  # a path that cannot be opened is a configuration error: raise it now
        if "{pid}" in self._template:
            after_fork_in_child(self, RotatingFileSink._after_fork)

    def _after_fork(self) -> None:
        """In a forked child: leave the parent's file to the parent and open this process's own."""
        self._lock = threading.Lock()  # the parent's lock may have been held at the fork
        self.sent = self.errors = self.rotations = 0
        if self._fd is not None:
            os.close(self._fd)  # the child's copy of the descriptor only
            self._fd = None
        self.path = Path(self._template.replace("{pid}", str(os.getpid())))
        if not self._closed:
            try:
                self._open()
            except OSError as exc:  # retried on the next write
                self.last_error = str(exc)

    def _open(self) -> None:
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        st = os.fstat(fd)
        self._fd, self._size, self._opened = fd, st.st_size, self._clock()
        # only a regular file is rotated: renaming a device or fifo (/dev/null, a pipe to a reader) moves it away
        self._rotates = stat.S_ISREG(st.st_mode)

    def _due(self, n: int) -> bool:
        if self._size == 0 or not self._rotates:
            return False
        if self.max_bytes is not None and self._size + n > self.max_bytes:
            return True
        return self.max_age is not None and self._clock() - self._opened >= self.max_age

    def _rotated_name(self) -> Path:
        stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%S.%fZ")
        stem, suffix = self.path.stem, self.path.suffix
        target = self.path.with_name(f"{stem}-{stamp}{suffix}")
        n = 0
        while target.exists():  # two rotations within a microsecond; "_" sorts after "." (time order kept)
            n += 1
            target = self.path.with_name(f"{stem}-{stamp}_{n}{suffix}")
        return target

    def _rotate_locked(self) -> None:
        if self._fd is not None:
            if self.fsync:
                os.fsync(self._fd)
            os.rename(self.path, self._rotated_name())
            os.close(self._fd)
            self._fd = None
            if self.fsync:
                from calmon.formats.jsonio import (
                    fsync_dir,  # imported here: the default path stays standard-library only
                )
                fsync_dir(self.path.parent)
            self.rotations += 1
        self._open()

    def rotate(self) -> None:
        """Rotate now (if the active file is not empty, and is a regular file)."""
        with self._lock:
            if self._size and self._rotates:
                self._rotate_locked()

    def write(self, key: str, line: bytes) -> None:
        """Append one event line (``key`` is unused: files keep arrival order)."""
        with self._lock:
            try:
                if self._closed:
                    raise OSError(f"sink for {self.path} is closed")
                if self._fd is None:
                    self._open()  # the previous open failed: try again
                elif self._due(len(line)):
                    self._rotate_locked()
                assert self._fd is not None
                self._write_all(self._fd, line)
                self.sent += 1
            except OSError as exc:  # disk full, permissions, a removed directory: counted, never raised
                self.errors += 1
                if self.errors == 1 or str(exc) != self.last_error:
                    log.warning("calmon client: cannot write %s: %s", self.path, exc)
                self.last_error = str(exc)

    def _write_all(self, fd: int, line: bytes) -> None:
        done = 0
        try:
            while done < len(line):
                done += os.write(fd, line[done:])
        except OSError:
            if done:  # end the partial line, so that only this event is lost (dead-lettered), not the next
                try:
                    self._size += os.write(fd, b"\n")
                except OSError:
                    pass
            self._size += done
            raise
        self._size += done

    def flush(self, timeout: float | None = None) -> bool:
        """Lines are written on each call; True (fsync it with ``fsync=True`` on rotation or close)."""
        return True

    def close(self, timeout: float | None = None) -> bool:
        """Close the active file (it stays in place; a new sink appends to it)."""
        with self._lock:
            self._closed = True
            if self._fd is not None:
                if self.fsync:
                    os.fsync(self._fd)
                os.close(self._fd)
                self._fd = None
        return True

    def counters(self) -> dict[str, int]:
        """``sent`` (lines written), ``errors``, ``rotations``, ``dropped_full`` (always 0), ``pending`` (0)."""
        with self._lock:
            return {"sent": self.sent, "dropped_full": 0, "errors": self.errors, "pending": 0,
                    "rotations": self.rotations}
