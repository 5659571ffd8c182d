"""Join predictions with their outcomes by id, with an event-time TTL and memory bounds.

Events are processed in record order.  The *watermark* is the largest event time seen so far,
in record order, over **every** event (predictions, outcomes and labeled events alike), so
it is a function of the record order only and never of batch boundaries.  A prediction waits
in the pending buffer until its outcome arrives; an outcome that arrives first waits in the
early-outcome buffer until its prediction arrives.  Either expires when its timestamp plus
``ttl`` falls behind the watermark: a prediction then counts as *expired*, an outcome as an
*orphan*.

Every decision is a function of the record order only: expiry is checked lazily at the
moment of a match, and the buffers are swept (expired entries forgotten and counted) each time
the watermark crosses a multiple of ``ttl / 4`` -- a grid of event time, so the sweeps happen
at the same records whatever the batch boundaries, and a state rebuilt from a checkpoint and
fed the same records gives the same joins, evictions and counters.  Sweeps therefore also run
while sources are followed, not only when read-once sources are exhausted.

Memory bounds: at most ``max_pending`` predictions and ``max_pending`` early outcomes are
held, and both buffers together hold at most ``max_bytes`` (ids, segments and payloads: their
lengths plus a fixed per-entry overhead).  Inserting beyond a bound evicts the oldest entry
(counted as expired, resp. orphan) in O(1) amortised: each buffer's insertion order is also kept
in a queue with lazy deletion (:class:`_Fifo`), because ``next(iter(dict))`` walks the slots
of every earlier deletion at the front of a dict -- with two million pending predictions that
made each eviction cost milliseconds.

References
----------
Akidau et al. The Dataflow Model. VLDB 2015 -- event time, watermarks (Sec. 2.3) and allowed
lateness (Sec. 3.3).
"""

from __future__ import annotations

import base64
import math
import zlib
from collections import deque
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from calmon.events.decoder import LABELED, PREDICTION, ModelBatch
from calmon.formats.jsonio import pack_array, unpack_array
from calmon.state.delays import LabelDelays

#: 2: pending payloads as a :func:`calmon.formats.jsonio.pack_array` document; 1 (no ``version`` key,
#: still read): a bare base64 string of zlib-compressed float64.
STATE_VERSION = 2
#: Bytes counted per buffered entry besides the characters of its id and segment (object headers, tuple, dict
#: slot, order queue item, time).
ENTRY_OVERHEAD = 256
#: Default byte bound of the two buffers together (``limits.max_join_bytes``).
MAX_BYTES = 512 * 1024 * 1024

Pending = tuple[str, float, str, Any]  #: (model, ts, segment, payload: float score or probability row)
Early = tuple[str, float, int]  #: (model or "", ts, label)
#: A joined pair: (prediction ts, segment, label, payload, id, record index of its completing event, delay)
_Pair = tuple[float, str, int, Any, str, int, float]


@dataclass
class JoinedBatch:
    """Labeled events produced by joins for one model (in record order of their completing event)."""

    model: str
    classes: int
    ts: np.ndarray
    segment: np.ndarray
    label: np.ndarray
    score: np.ndarray | None = None
    probs: np.ndarray | None = None
    ids: np.ndarray | None = None  #: the event id of each pair (object array)
    #: Record index (in the decoded batch) of each pair's completing event: merges joins with labeled events in
    #: record order (the change detectors need one order whatever the batch boundaries).
    index: np.ndarray | None = None
    #: Outcome time minus prediction time of each pair (NaN: the outcome carried no time).
    delay: np.ndarray | None = None

    def __len__(self) -> int:
        return int(self.ts.size)


@dataclass
class JoinCounters:
    joined: dict[str, int] = field(default_factory=dict)
    expired: dict[str, int] = field(default_factory=dict)
    duplicates: dict[str, int] = field(default_factory=dict)
    orphans: int = 0

    def to_dict(self) -> dict[str, Any]:
        return {"joined": dict(self.joined), "expired": dict(self.expired), "duplicates": dict(self.duplicates),
                "orphans": self.orphans}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> JoinCounters:
        return cls({str(k): int(v) for k, v in d["joined"].items()},
                   {str(k): int(v) for k, v in d["expired"].items()},
                   {str(k): int(v) for k, v in d["duplicates"].items()}, int(d["orphans"]))


def _inc(d: dict[str, int], key: str, by: int = 1) -> None:
    d[key] = d.get(key, 0) + by


def _pending_cost(key: str, seg: str, payload: Any) -> int:
    width = 24 if isinstance(payload, float) else 112 + 8 * int(np.size(payload))
    return ENTRY_OVERHEAD + len(key) + len(seg) + width


def _early_cost(key: str) -> int:
    return ENTRY_OVERHEAD + len(key)


class _Fifo:
    """The insertion order of a dict's entries: O(1) amortised oldest entry, by lazy deletion.

    Every insertion appends ``(key, entry)``; an item is live while the dict still maps ``key``
    to that very ``entry`` object.  Dead items are skipped when the oldest is asked for, and the
    queue is rebuilt from the dict (whose iteration order is the insertion order) once more than
    half of it is dead, so its length stays within twice the dict's plus a constant.
    """

    __slots__ = ("items",)

    def __init__(self) -> None:
        self.items: deque[tuple[str, Any]] = deque()

    def oldest(self, d: dict[str, Any]) -> str:
        items = self.items
        while True:
            key, entry = items[0]
            if d.get(key) is entry:
                return key
            items.popleft()

    def compact(self, d: dict[str, Any]) -> None:
        if len(self.items) > 2 * len(d) + 1024:
            self.items = deque(d.items())


def event_watermarks(models: dict[str, ModelBatch], start: float) -> dict[str, np.ndarray]:
    """The watermark at each event (running max of event times in record order, from ``start``).

    Every kind of event counts; missing times (NaN) do not move it.

    Examples
    --------
    >>> from calmon.events.decoder import Decoder
    >>> b = Decoder().decode([b'{"model": "m", "ts": 5, "score": 0.5, "label": 1}',
    ...                       b'{"id": "a", "model": "n", "ts": 3, "score": 0.5}',
    ...                       b'{"model": "m", "ts": 9, "score": 0.5, "label": 0}'])
    >>> {k: v.tolist() for k, v in event_watermarks(b.models, 4.0).items()}
    {'m': [5.0, 9.0], 'n': [5.0]}
    """
    names = [n for n, mb in models.items() if len(mb)]
    if not names:
        return {}
    idx = np.concatenate([models[n].index for n in names])
    ts = np.concatenate([np.asarray(models[n].ts, np.float64) for n in names])
    order = np.argsort(idx, kind="stable")
    wm_sorted = np.fmax.accumulate(np.concatenate([[start], ts[order]]))[1:]
    wm = np.empty_like(wm_sorted)
    wm[order] = wm_sorted
    offsets = np.cumsum([0] + [len(models[n]) for n in names])
    return {n: wm[offsets[i]:offsets[i + 1]] for i, n in enumerate(names)}


class Joiner:
    """Prediction/outcome join keyed by event id.

    Parameters
    ----------
    ttl
        Seconds of event time a prediction (or early outcome) waits.
    max_pending
        Entry bound of each of the two buffers.
    max_bytes
        Byte bound of the two buffers together (``limits.max_join_bytes``).

    Examples
    --------
    >>> from calmon.events.decoder import Decoder
    >>> dec, j = Decoder(), Joiner(ttl=60)
    >>> b = dec.decode([b'{"id": "a", "model": "m", "ts": 100, "score": 0.9}',
    ...                 b'{"id": "b", "model": "m", "ts": 101, "score": 0.2}',
    ...                 b'{"id": "a", "model": "m", "ts": 130, "label": 1}'])
    >>> out = j.process(b.models)
    >>> out["m"].label.tolist(), out["m"].ts.tolist(), j.pending_count()
    ([1], [100.0], {'m': 1})
    >>> _ = j.process(dec.decode([b'{"id": "z", "model": "m", "ts": 200, "label": 0}']).models)
    >>> j.counters.expired, j.pending_count()  # the watermark crossed a sweep boundary (every ttl/4)
    ({'m': 1}, {})
    """

    def __init__(self, ttl: float, max_pending: int = 1_000_000, max_bytes: int = MAX_BYTES) -> None:
        if not ttl > 0:
            raise ValueError(f"ttl must be positive, got {ttl}")
        if max_pending < 1:
            raise ValueError(f"max_pending must be >= 1, got {max_pending}")
        if max_bytes < 1:
            raise ValueError(f"max_bytes must be >= 1, got {max_bytes}")
        self.ttl = float(ttl)
        self.max_pending = int(max_pending)
        self.max_bytes = int(max_bytes)
        self.watermark = float("-inf")
        #: the next watermark at which the buffers are swept (a multiple of ``ttl / 4``)
        self.next_sweep = float("-inf")
        self.pending: dict[str, Pending] = {}
        self.early: dict[str, Early] = {}
        self._pending_order, self._early_order = _Fifo(), _Fifo()
        self.nbytes = 0  #: bytes counted against ``max_bytes``
        self._pending_by_model: dict[str, int] = {}
        self.classes: dict[str, int] = {}
        self.counters = JoinCounters()
        #: Per source, the newest event time its records carried (not filled in): the time a record of that
        #: source without one takes (:class:`calmon.state.ingest.Ingestor`).
        self.source_times: dict[str, float] = {}
        #: Ids of early outcomes that carried no time (theirs is the watermark at their arrival): no delay.
        self.untimed: set[str] = set()
        #: Label delays, and the outcomes that came after their prediction expired.
        self.delays = LabelDelays()

    @property
    def sweep_every(self) -> float:
        """Event-time period of the sweeps (``ttl / 4``; infinite TTL: never)."""
        return self.ttl / 4

    # -- state ---------------------------------------------------------------------------------
    def pending_count(self) -> dict[str, int]:
        """Predictions waiting for an outcome, per model."""
        return {m: c for m, c in self._pending_by_model.items() if c}

    def _add_pending(self, key: str, entry: Pending) -> None:
        self.pending[key] = entry
        self._pending_order.items.append((key, entry))
        self.nbytes += _pending_cost(key, entry[2], entry[3])
        _inc(self._pending_by_model, entry[0])

    def _drop_pending(self, key: str) -> Pending:
        entry = self.pending.pop(key)
        self.nbytes -= _pending_cost(key, entry[2], entry[3])
        _inc(self._pending_by_model, entry[0], -1)
        return entry

    def _add_early(self, key: str, entry: Early) -> None:
        self.early[key] = entry
        self._early_order.items.append((key, entry))
        self.nbytes += _early_cost(key)

    def _drop_early(self, key: str) -> Early:
        self.nbytes -= _early_cost(key)
        if self.untimed:
            self.untimed.discard(key)
        return self.early.pop(key)

    def _evict_pending(self) -> None:
        key = self._pending_order.oldest(self.pending)
        name, _, seg, payload = self.pending.pop(key)  # _drop_pending inlined: once per record at the cap
        self.nbytes -= _pending_cost(key, seg, payload)
        self._pending_by_model[name] -= 1
        expired = self.counters.expired
        expired[name] = expired.get(name, 0) + 1

    def _evict_early(self) -> None:
        self._drop_early(self._early_order.oldest(self.early))
        self.counters.orphans += 1

    def _bound(self) -> None:
        """Evict the oldest entries beyond the entry bounds, then the oldest predictions beyond the byte bound.

        Beyond the byte bound predictions go first (they hold the payloads), early outcomes only
        when no prediction is left.
        """
        if len(self.pending) > self.max_pending:
            self._evict_pending()
        if len(self.early) > self.max_pending:
            self._evict_early()
        while self.nbytes > self.max_bytes and (self.pending or self.early):
            if self.pending:
                self._evict_pending()
            else:
                self._evict_early()

    def sweep(self, watermark: float | None = None) -> None:
        """Forget entries that can no longer match (``ts + ttl < watermark``); counts them."""
        wm = self.watermark if watermark is None else watermark
        cutoff = wm - self.ttl
        delays = self.delays
        for k in [k for k, e in self.pending.items() if e[1] < cutoff]:
            name, ts, _, _ = self._drop_pending(k)
            _inc(self.counters.expired, name)
            delays.expire(k, name, ts)
        delays.prune(wm, self.ttl)
        dead = [k for k, e in self.early.items() if e[1] < cutoff]
        for k in dead:
            self._drop_early(k)
        self.counters.orphans += len(dead)

    def _maybe_sweep(self, wm: float) -> None:
        every = self.sweep_every
        if not math.isfinite(every):  # an infinite TTL never expires anything: never check again
            self.next_sweep = math.inf
            return
        if not math.isfinite(wm):
            return
        if self.next_sweep != float("-inf"):
            self.sweep(wm)
        self.next_sweep = (math.floor(wm / every) + 1) * every

    # -- processing -------------------------------------------------------------------------
    def process(self, models: dict[str, ModelBatch], watermarks: dict[str, np.ndarray] | None = None,
                now: float | None = None) -> dict[str, JoinedBatch]:
        """Join the prediction and outcome events of one decoded batch.

        Parameters
        ----------
        models
            ``DecodedBatch.models``; events are taken in their record order (``ModelBatch.index``).
            The times of predictions must be filled (the ingestor does: :mod:`calmon.state.ingest`); an
            outcome without a time (NaN) is joined by id and takes its prediction's time, moves no
            watermark and, waiting for its prediction, expires ``ttl`` after the watermark at its arrival.
        watermarks
            :func:`event_watermarks` of ``models`` from :attr:`watermark`, if the caller has it.
        now
            The time an outcome without one waits from when no event carried a time yet (``None``: it
            waits from the watermark, then the first sweep forgets it).

        Returns
        -------
        dict
            model -> :class:`JoinedBatch` of the pairs completed by this batch.
        """
        for name, mb in models.items():
            if name:
                self.classes[name] = mb.classes
        wms = event_watermarks(models, self.watermark) if watermarks is None else watermarks
        out: dict[str, list[_Pair]] = {}
        pending, early, by_model, order = self.pending, self.early, self._pending_by_model, self._pending_order.items
        ttl, next_sweep = self.ttl, self.next_sweep
        for name, kind, t, key, seg, label, payload, wm, cost, rec in zip(*_record_columns(models, wms)):
            if wm >= next_sweep:
                self._maybe_sweep(wm)
                next_sweep = self.next_sweep
            if kind != PREDICTION:
                prev = pending.get(key)
                if prev is None or prev[1] + ttl < wm or (name and name != prev[0]):  # not a plain match
                    self._on_outcome(name, key, t, label, wm, out, rec, now)
                    continue
                # the common case inlined (same as _on_outcome's match): this loop is the agent's hot path
                del pending[key]
                pname, pseg, ppay = prev[0], prev[2], prev[3]
                self.nbytes -= _pending_cost(key, pseg, ppay) if type(ppay) is not float else (
                    ENTRY_OVERHEAD + 24 + len(key) + len(pseg))
                by_model[pname] -= 1
                got = out.get(pname)
                if got is None:
                    got = out[pname] = []
                got.append((prev[1], pseg, label, ppay, key, rec, t - prev[1]))
                continue
            if key in pending or key in early:  # a duplicate id or an early outcome: the slow path
                self._on_prediction(name, key, t, seg, payload, wm, out, rec)
                continue
            # the common case inlined (same as _add_pending + _bound)
            pending[key] = entry = (name, t, seg, payload)
            order.append((key, entry))
            self.nbytes += cost + len(key) + len(seg)
            by_model[name] = by_model.get(name, 0) + 1
            if len(pending) > self.max_pending or self.nbytes > self.max_bytes:
                self._bound()
        self._pending_order.compact(pending)
        self._early_order.compact(early)
        joined = self.counters.joined
        for name, items in out.items():  # every pair in ``out`` is one join (counted here, not per event)
            joined[name] = joined.get(name, 0) + len(items)
        for arr in wms.values():
            if arr.size:
                self.watermark = max(self.watermark, float(arr.max()))
        batches = self._joined(out)
        if batches:
            self.delays.observe_batch({name: jb.delay for name, jb in batches.items() if jb.delay is not None})
        return batches

    def _on_prediction(self, name: str, key: str, t: float, seg: str, payload: Any, wm: float,
                       out: dict[str, list[_Pair]], rec: int) -> None:
        prev = self.pending.get(key)
        if prev is not None:
            if prev[1] + self.ttl >= wm:
                _inc(self.counters.duplicates, name)
                return
            _inc(self.counters.expired, self._drop_pending(key)[0])
        got = self.early.get(key)
        if got is not None and got[0] in ("", name):
            delay = math.nan if key in self.untimed else got[1] - t
            self._drop_early(key)
            if got[1] + self.ttl >= wm:
                out.setdefault(name, []).append((t, seg, got[2], payload, key, rec, delay))  # counted by process
                return
            self.counters.orphans += 1
        self._add_pending(key, (name, t, seg, payload))
        self._bound()

    def _on_outcome(self, name: str, key: str, t: float, label: int, wm: float,
                    out: dict[str, list[_Pair]], rec: int, now: float | None = None) -> None:
        prev = self.pending.get(key)
        if prev is not None and name in ("", prev[0]):
            self._drop_pending(key)
            if prev[1] + self.ttl >= wm:
                out.setdefault(prev[0], []).append((prev[1], prev[2], label, prev[3], key, rec, t - prev[1]))
                return  # counted by process
            _inc(self.counters.expired, prev[0])
            self.delays.late_outcome(key, prev[0], t - prev[1])  # NaN (no time): counted, not timed
        elif prev is None:
            self.delays.outcome_after_expiry(key, t)
        if key in self.early:
            self.counters.orphans += 1  # a second outcome for the same id: the first one stays
            return
        if t != t:  # no time: it waits from the event time of its arrival, and gives no delay
            t = wm if wm > -math.inf or now is None else now
            self.untimed.add(key)
        self._add_early(key, (name, t, label))
        self._bound()

    def _joined(self, out: dict[str, list[_Pair]]) -> dict[str, JoinedBatch]:
        """The pairs of every model as columns: those of the binary models built once for the batch and
        sliced per model (issue #15: no per-model array building at a thousand models), in ``out``'s order."""
        binary = [name for name in out if self.classes.get(name, 2) == 2]
        built: dict[str, JoinedBatch] = {}
        if binary:
            items = [it for name in binary for it in out[name]]
            ends = np.cumsum([len(out[name]) for name in binary]).tolist()
            cols = list(zip(*items))  # one transposition instead of a comprehension per column
            ts = np.array(cols[0], dtype=np.float64)
            seg = np.array(cols[1], dtype=object)
            lab = np.array(cols[2], dtype=np.int64)
            score = np.array(cols[3], dtype=np.float64)
            ids = np.array(cols[4], dtype=object)
            rec = np.array(cols[5], dtype=np.int64)
            delay = np.array(cols[6], dtype=np.float64)
            for name, a, b in zip(binary, [0, *ends], ends):
                built[name] = JoinedBatch(name, 2, ts[a:b], seg[a:b], lab[a:b], score=score[a:b], ids=ids[a:b],
                                          index=rec[a:b], delay=delay[a:b])
        return {name: built[name] if name in built else self._joined_batch(name, items)
                for name, items in out.items()}

    def _joined_batch(self, name: str, items: list[_Pair]) -> JoinedBatch:
        k = self.classes.get(name, 2)
        ts = np.array([i[0] for i in items], dtype=np.float64)
        seg = np.array([i[1] for i in items], dtype=object)
        lab = np.array([i[2] for i in items], dtype=np.int64)
        ids = np.array([i[4] for i in items], dtype=object)
        rec = np.array([i[5] for i in items], dtype=np.int64)
        delay = np.array([i[6] for i in items], dtype=np.float64)
        if k == 2:
            return JoinedBatch(name, 2, ts, seg, lab, score=np.array([i[3] for i in items], np.float64), ids=ids,
                               index=rec, delay=delay)
        return JoinedBatch(name, k, ts, seg, lab, probs=np.vstack([i[3] for i in items]), ids=ids, index=rec,
                           delay=delay)

    # -- checkpoint ----------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        """Columnar, pickle-free state (buffers in insertion order, payloads as compressed float64)."""
        scores = [e[3] for e in self.pending.values()]
        flat = np.concatenate([np.atleast_1d(np.asarray(s, np.float64)) for s in scores]) if scores else np.zeros(0)
        widths = [int(np.size(s)) if not isinstance(s, float) else 0 for s in scores]
        return {
            "version": STATE_VERSION, "ttl": self.ttl, "max_pending": self.max_pending,
            "watermark": None if self.watermark == float("-inf") else self.watermark,
            "next_sweep": None if self.next_sweep == float("-inf") else self.next_sweep,
            "pending": {"ids": list(self.pending), "models": [e[0] for e in self.pending.values()],
                        "ts": [e[1] for e in self.pending.values()], "segments": [e[2] for e in self.pending.values()],
                        "widths": widths, "payload": pack_array(flat, "<f8")},
            "early": {"ids": list(self.early), "models": [e[0] for e in self.early.values()],
                      "ts": [e[1] for e in self.early.values()], "labels": [e[2] for e in self.early.values()]},
            "classes": dict(self.classes),
            "counters": self.counters.to_dict(),
            "sources": dict(self.source_times), "untimed": sorted(self.untimed), "delays": self.delays.to_dict(),
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any], max_bytes: int = MAX_BYTES) -> Joiner:
        """Rebuild from :meth:`to_dict` output (version-1 documents, without ``version``, included).

        Raises ``ValueError``, ``KeyError`` or ``TypeError`` on a malformed document (the caller
        validates the checkpoint schema first, see :mod:`calmon.state.checkpoint.schema`).
        """
        version = d.get("version", 1)
        if version not in (1, STATE_VERSION):
            raise ValueError(f"join state version {version!r} is not supported (max {STATE_VERSION})")
        out = cls(d["ttl"], d["max_pending"], max_bytes)
        out.watermark = float("-inf") if d["watermark"] is None else float(d["watermark"])
        nxt = d.get("next_sweep")
        out.next_sweep = float("-inf") if nxt is None else float(nxt)
        p = d["pending"]
        flat = _payload_v1(p["payload"]) if version == 1 else unpack_array(p["payload"], "<f8")
        if len(flat) != sum(w or 1 for w in p["widths"]):
            raise ValueError("join.pending.payload: length does not match widths")
        pos = 0
        for key, model, ts, seg, width in zip(p["ids"], p["models"], p["ts"], p["segments"], p["widths"], strict=True):
            if width == 0:
                payload: Any = float(flat[pos])
                pos += 1
            else:
                payload = flat[pos:pos + width].copy()
                pos += width
            out._add_pending(str(key), (str(model), float(ts), str(seg), payload))
        e = d["early"]
        for key, model, ts, label in zip(e["ids"], e["models"], e["ts"], e["labels"], strict=True):
            out._add_early(str(key), (str(model), float(ts), int(label)))
        out.classes = {str(k): int(v) for k, v in d["classes"].items()}
        out.counters = JoinCounters.from_dict(d["counters"])
        # absent from checkpoints written before #31.1/#32.4: no source times yet, no delays measured
        out.source_times = {str(k): float(v) for k, v in (d.get("sources") or {}).items()}
        out.untimed = {str(k) for k in d.get("untimed") or ()} & out.early.keys()
        out.delays = LabelDelays.from_dict(d.get("delays"))
        return out


def _record_columns(models: dict[str, ModelBatch], wms: dict[str, np.ndarray]) -> tuple[list[Any], ...]:
    """The prediction and outcome events of every model merged in record order, as columns (lists): model, kind,
    ts, id, segment, label, payload (binary score or probability row), watermark, the entry cost of a pending
    prediction besides its id and segment, record index.

    Built with one concatenation and one gather per column for the whole batch (issue #15: at a thousand
    models a batch holds a few dozen events per model, so per-model conversions dominated the join).
    """
    parts = [(name, mb) for name, mb in models.items() if len(mb) and name in wms]
    if not parts:
        return ([],) * 10

    def column(get: Any) -> np.ndarray:
        return np.concatenate([get(mb) for _, mb in parts])

    kind = column(lambda mb: mb.kind)
    keep = np.flatnonzero(kind != LABELED)
    idx = column(lambda mb: mb.index)[keep]
    order = np.argsort(idx, kind="stable")  # record indices are unique: a permutation
    pos = keep[order]
    part = np.repeat(np.arange(len(parts)), [len(mb) for _, mb in parts])[pos]
    names = np.array([name for name, _ in parts], dtype=object)
    costs = np.array([ENTRY_OVERHEAD + (24 if mb.probs is None else 112 + 8 * int(mb.probs.shape[1]))
                      for _, mb in parts], dtype=np.int64)
    if all(mb.score is not None for _, mb in parts):
        payload: list[Any] = column(lambda mb: mb.score)[pos].tolist()
    else:  # multiclass models in the batch: their rows of probabilities as they are
        rows: list[Any] = []
        for _, mb in parts:
            if mb.score is not None:
                rows.extend(mb.score.tolist())
            else:
                rows.extend([] if mb.probs is None else list(mb.probs))
        payload = [rows[i] for i in pos.tolist()]
    return (names[part].tolist(), kind[pos].tolist(), column(lambda mb: mb.ts)[pos].tolist(),
            column(lambda mb: mb.ids)[pos].tolist(), column(lambda mb: mb.segment)[pos].tolist(),
            column(lambda mb: mb.label)[pos].tolist(), payload,
            np.concatenate([wms[name] for name, _ in parts])[pos].tolist(), costs[part].tolist(), idx[order].tolist())


def _payload_v1(packed: str) -> np.ndarray:
    """Pending payloads of a version-1 state: zlib-compressed little-endian float64 in bare base64."""
    return np.frombuffer(zlib.decompress(base64.b64decode(packed)), dtype="<f8")
