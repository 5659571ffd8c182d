"""Bounded HTTP connections: header and idle deadlines, and a cap on open connections.

The standard :class:`http.server.ThreadingHTTPServer` gives each connection a thread that
waits for a request for as long as the client keeps the socket open, so idle or slow clients
(500 idle keep-alive sockets, a slowloris trickling one header byte at a time) pile up threads
without bound.  :class:`ConnectionTable` bounds them:

* a connection waiting for a request is *idle*; its deadline is ``header_timeout`` after it
  was accepted (the whole request head must arrive by then, however slowly it trickles) and
  ``idle_timeout`` after the previous response on a keep-alive connection;
* a reaper thread shuts down the sockets of idle connections past their deadline, which ends
  their threads (their blocked ``recv`` returns);
* at most ``max_connections`` are open: a new connection beyond it evicts the longest-idle
  one, so a scrape always gets through while any connection is merely waiting; if every
  connection is busy serving a request, the new one is refused (closed at once).

A connection serving a request is *busy* and never evicted (its writes are bounded by the
socket timeout the handler sets).
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

__all__ = ["HTTPLimits", "ConnectionTable"]


@dataclass(frozen=True)
class HTTPLimits:
    """The exporter's connection limits (``exporter.header_timeout``, ``idle_timeout``, ``max_connections``).

    Examples
    --------
    >>> HTTPLimits().max_connections
    64
    """

    header_timeout: float = 10.0
    idle_timeout: float = 60.0
    max_connections: int = 64

    def __post_init__(self) -> None:
        if not (self.header_timeout > 0 and self.idle_timeout > 0):
            raise ValueError("header_timeout and idle_timeout must be positive")
        if self.max_connections < 1:
            raise ValueError(f"max_connections must be >= 1, got {self.max_connections}")


@dataclass
class _Conn:
    sock: socket.socket
    busy: bool
    deadline: float  #: monotonic time an idle connection is closed at
    since: float  #: monotonic time it became idle (eviction order)


class ConnectionTable:
    """Open connections with their state and deadlines, and the reaper thread that enforces them.

    Parameters
    ----------
    limits
        Deadlines and cap.
    clock
        Monotonic clock (tests).

    Examples
    --------
    >>> a, b = socket.socketpair()
    >>> table = ConnectionTable(HTTPLimits(max_connections=1))
    >>> table.admit(a)
    True
    >>> c, d = socket.socketpair()
    >>> table.admit(c), len(table)  # ``a`` was idle: evicted for ``c``
    (True, 1)
    >>> for s in (a, b, c, d):
    ...     s.close()
    """

    def __init__(self, limits: HTTPLimits, clock: Callable[[], float] = time.monotonic) -> None:
        self.limits = limits
        self.clock = clock
        self._lock = threading.Lock()
        self._conns: dict[int, _Conn] = {}
        self.evicted = 0  #: idle connections closed to admit a new one
        self.refused = 0  #: connections refused because every slot was busy
        self.expired = 0  #: idle connections closed at their deadline
        self._stop = threading.Event()
        self._reaper: threading.Thread | None = None

    def __len__(self) -> int:
        with self._lock:
            return len(self._conns)

    def admit(self, sock: socket.socket) -> bool:
        """Register a new connection (idle, header deadline); False if it must be refused."""
        now = self.clock()
        victim = None
        with self._lock:
            if len(self._conns) >= self.limits.max_connections:
                idle = [c for c in self._conns.values() if not c.busy]
                if not idle:
                    self.refused += 1
                    return False
                victim = min(idle, key=lambda c: c.since)
                del self._conns[id(victim.sock)]
                self.evicted += 1
            self._conns[id(sock)] = _Conn(sock, False, now + self.limits.header_timeout, now)
        if victim is not None:
            _shutdown(victim.sock)
        return True

    def rebind(self, old: socket.socket, new: socket.socket) -> None:
        """The connection's socket was wrapped (TLS): track the wrapper."""
        with self._lock:
            conn = self._conns.pop(id(old), None)
            if conn is not None:
                conn.sock = new
                self._conns[id(new)] = conn

    def busy(self, sock: socket.socket) -> None:
        """The request head arrived: serving, no deadline."""
        with self._lock:
            conn = self._conns.get(id(sock))
            if conn is not None:
                conn.busy = True

    def idle(self, sock: socket.socket) -> None:
        """A response was sent on a keep-alive connection: idle until the idle deadline."""
        now = self.clock()
        with self._lock:
            conn = self._conns.get(id(sock))
            if conn is not None:
                conn.busy, conn.since, conn.deadline = False, now, now + self.limits.idle_timeout

    def release(self, sock: socket.socket) -> None:
        """The connection's thread is done."""
        with self._lock:
            self._conns.pop(id(sock), None)

    def reap(self) -> int:
        """Shut down idle connections past their deadline; returns how many."""
        now = self.clock()
        with self._lock:
            late = [c for c in self._conns.values() if not c.busy and c.deadline <= now]
            for c in late:
                del self._conns[id(c.sock)]
            self.expired += len(late)
        for c in late:
            _shutdown(c.sock)
        return len(late)

    def start(self, every: float = 0.25) -> ConnectionTable:
        """Run :meth:`reap` every ``every`` seconds in a daemon thread."""
        def loop() -> None:
            while not self._stop.wait(every):
                self.reap()

        self._reaper = threading.Thread(target=loop, name="calmon-http-reaper", daemon=True)
        self._reaper.start()
        return self

    def stop(self) -> None:
        """Stop the reaper and shut every tracked connection down."""
        self._stop.set()
        if self._reaper is not None:
            self._reaper.join(timeout=5)
        with self._lock:
            conns, self._conns = list(self._conns.values()), {}
        for c in conns:
            _shutdown(c.sock)


def _shutdown(sock: socket.socket) -> None:
    """Wake the thread blocked on ``sock`` (its recv returns) without closing the fd under it."""
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except (OSError, ValueError):
        pass  # already closed by its own thread
