"""The status pages as served: rendered once per round, cached as bytes, like ``/metrics``.

``/`` used to build the status document and render every model's diagrams on each request (p95 10 s at a
hundred models under load, while ``/metrics`` took 0.1 s).  :class:`StatusPages` renders the index once per
published round -- the first request after the round renders it, every other request is served the cached
bytes -- and re-renders at most every ``max_age`` seconds between rounds so the page's freshness line still
shows a scheduler that has stopped.  While one thread renders, the others are served the previous round's
bytes (stale-while-revalidate): a render never queues requests.

Pages chosen by a query string (filters, sort, page of the overview) and a model's page (``/model/NAME``)
are rendered on demand from the cached round: a query re-selects the precomputed overview rows (cost bounded
by the number of rows), a model page renders that model's windows only; the last :data:`KEEP` of each are
kept for the round.

Examples
--------
>>> doc = {"evaluations": [{"model": "m", "segment": "all", "window": "1h", "n": 5, "metrics": {},
...                         "reliability": [], "tests": {}}]}
>>> calls = []
>>> pages = StatusPages(lambda: calls.append(1) or doc, lambda: "round 1")
>>> a, b = pages.serve("/", {}), pages.serve("/", {})
>>> a is b, len(calls), pages.serve("/model/m", {}) is not None, pages.serve("/model/x", {})
(True, 1, True, None)
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import unquote

from calmon.exporter.status.page import IndexFrame, index_frame, render_model

__all__ = ["KEEP", "StatusPages"]

#: Pages chosen by a query, and model pages, kept per round (each).
KEEP = 64


@dataclass
class _Round:
    key: object
    at: float
    doc: dict[str, Any]
    frame: IndexFrame
    index: bytes
    queries: OrderedDict[tuple[tuple[str, tuple[str, ...]], ...], bytes] = field(default_factory=OrderedDict)
    models: OrderedDict[str, bytes | None] = field(default_factory=OrderedDict)
    lock: threading.Lock = field(default_factory=threading.Lock)


def _keep(cache: OrderedDict[Any, Any], key: Any, value: Any) -> None:
    cache[key] = value
    cache.move_to_end(key)
    while len(cache) > KEEP:
        cache.popitem(last=False)


class StatusPages:
    """Serve the status pages of the current round from a cache (see the module docstring).

    Parameters
    ----------
    document
        Builds the status document (``/api/status``); called once per render.
    version
        Identifies the published round (compared by identity): a new object means a new round to render.
    max_age
        Seconds after which the cached page is rendered again although the round did not change.
    clock
        Monotonic seconds (tests pass their own).
    """

    def __init__(self, document: Callable[[], dict[str, Any]], version: Callable[[], object],
                 max_age: float = 15.0, clock: Callable[[], float] = time.monotonic) -> None:
        self.document = document
        self.version = version
        self.max_age = max_age
        self.clock = clock
        self.renders = 0  # rounds rendered (for tests and benchmarks)
        self._round: _Round | None = None
        self._rendering = threading.Lock()

    def _fresh(self, r: _Round | None) -> bool:
        return r is not None and r.key is self.version() and self.clock() - r.at < self.max_age

    def current(self) -> _Round:
        """The cached round, rendered first if it is out of date and no other thread is rendering it."""
        r = self._round
        if self._fresh(r):
            assert r is not None
            return r
        # the first page ever waits for its render; later ones get the previous round meanwhile
        if not self._rendering.acquire(blocking=r is None):
            assert r is not None
            return r
        try:
            r = self._round
            if self._fresh(r):  # rendered by the thread we waited for
                assert r is not None
                return r
            key, at = self.version(), self.clock()
            doc = self.document()
            frame = index_frame(doc)
            r = self._round = _Round(key, at, doc, frame, frame.page().encode())
            self.renders += 1
            return r
        finally:
            self._rendering.release()

    def serve(self, path: str, query: Mapping[str, Sequence[str]]) -> bytes | None:
        """The body of ``path`` (``/`` or ``/model/NAME``, NAME percent-encoded) or ``None`` (not found)."""
        r = self.current()
        if path in ("/", "/index.html"):
            known = {k: tuple(v) for k, v in sorted(query.items())
                     if k in ("q", "verdict", "alert", "sort", "desc", "page")}
            if not known:
                return r.index
            key = tuple(known.items())
            with r.lock:
                hit = r.queries.get(key)
            if hit is None:
                hit = r.frame.page(known).encode()
                with r.lock:
                    _keep(r.queries, key, hit)
            return hit
        if path.startswith("/model/"):
            name = unquote(path[len("/model/"):])
            with r.lock:
                if name in r.models:
                    return r.models[name]
            page = render_model(r.doc, name)
            body = None if page is None else page.encode()
            with r.lock:
                _keep(r.models, name, body)
            return body
        return None
