"""Join predictions with their outcomes by id, with an event-time TTL and a memory bound.

Events are processed in record order.  The *watermark* is the largest event time seen so far
(events without a timestamp take the current watermark).  A prediction waits in the pending
buffer until its outcome arrives; an outcome that arrives first waits in the early-outcome
buffer until its prediction arrives.  Either expires when its timestamp plus ``ttl`` falls
behind the watermark: a prediction then counts as *expired*, an outcome as an *orphan*.

Every decision is a function of the record order only: expiry is checked lazily at the
moment of a match, and the periodic :meth:`Joiner.sweep` (which frees memory) removes only
entries that could no longer match.  So a state rebuilt from a checkpoint and fed the same
records gives the same joins, whatever the batch boundaries.

Memory bound: at most ``max_pending`` predictions and ``max_pending`` early outcomes are
held; inserting beyond it evicts the oldest entry (counted as expired, resp. orphan).

References
----------
Akidau et al. The Dataflow Model. VLDB 2015 -- event time, watermarks and allowed lateness.
"""

from __future__ import annotations

import base64
import zlib
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from calmon.events import LABELED, OUTCOME, PREDICTION, ModelBatch
from calmon.jsonio import pack_array, unpack_array

#: 2: pending payloads as a :func:`calmon.jsonio.pack_array` document; 1 (no ``version`` key,
#: still read): a bare base64 string of zlib-compressed float64.
STATE_VERSION = 2


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
        return cls(dict(d["joined"]), dict(d["expired"]), dict(d["duplicates"]), int(d["orphans"]))


def _inc(d: dict[str, int], key: str, by: int = 1) -> None:
    d[key] = d.get(key, 0) + by


class Joiner:
    """Prediction/outcome join keyed by event id.

    Parameters
    ----------
    ttl
        Seconds of event time a prediction (or early outcome) waits.
    max_pending
        Memory bound for each of the two buffers.

    Examples
    --------
    >>> from calmon.events import Decoder
    >>> dec, j = Decoder(), Joiner(ttl=60)
    >>> b = dec.decode([b'{"id": "a", "model": "m", "ts": 100, "score": 0.9}',
    ...                 b'{"id": "b", "model": "m", "ts": 101, "score": 0.2}',
    ...                 b'{"id": "a", "model": "m", "ts": 130, "label": 1}'])
    >>> out = j.process(b.models)
    >>> out["m"].label.tolist(), out["m"].ts.tolist(), j.pending_count()
    ([1], [100.0], {'m': 1})
    >>> _ = j.process(dec.decode([b'{"id": "z", "model": "m", "ts": 200, "label": 0}']).models)
    >>> j.sweep(); j.counters.expired, j.pending_count()
    ({'m': 1}, {})
    """

    def __init__(self, ttl: float, max_pending: int = 1_000_000) -> None:
        if not ttl > 0:
            raise ValueError(f"ttl must be positive, got {ttl}")
        if max_pending < 1:
            raise ValueError(f"max_pending must be >= 1, got {max_pending}")
        self.ttl = float(ttl)
        self.max_pending = int(max_pending)
        self.watermark = float("-inf")
        #: id -> (model, ts, segment, payload) with payload a float score or a probability row
        self.pending: dict[str, tuple[str, float, str, Any]] = {}
        #: id -> (model or "", ts, label)
        self.early: dict[str, tuple[str, float, int]] = {}
        self._pending_by_model: dict[str, int] = {}
        self.classes: dict[str, int] = {}
        self.counters = JoinCounters()

    # -- state ---------------------------------------------------------------------------------
    def pending_count(self) -> dict[str, int]:
        """Predictions waiting for an outcome, per model."""
        return {m: c for m, c in self._pending_by_model.items() if c}

    def _drop_pending(self, key: str) -> tuple[str, float, str, Any]:
        entry = self.pending.pop(key)
        _inc(self._pending_by_model, entry[0], -1)
        return entry

    def sweep(self) -> None:
        """Forget entries that can no longer match (``ts + ttl < watermark``); counts them."""
        cutoff = self.watermark - self.ttl
        dead = [k for k, e in self.pending.items() if e[1] < cutoff]
        for k in dead:
            model = self._drop_pending(k)[0]
            _inc(self.counters.expired, model)
        dead = [k for k, e in self.early.items() if e[1] < cutoff]
        for k in dead:
            del self.early[k]
        self.counters.orphans += len(dead)

    # -- processing -------------------------------------------------------------------------
    def process(self, models: dict[str, ModelBatch]) -> dict[str, JoinedBatch]:
        """Join the prediction and outcome events of one decoded batch (labeled events are ignored).

        Parameters
        ----------
        models
            ``DecodedBatch.models``; events are taken in their record order (``ModelBatch.index``).
            Event times must already be filled (no NaN; the runtime uses the arrival time).

        Returns
        -------
        dict
            model -> :class:`JoinedBatch` of the pairs completed by this batch.
        """
        parts, which, rows = self._record_order(models)
        if not parts:
            return {}
        out: dict[str, list[tuple[float, str, int, Any, str]]] = {}
        pending, early, ttl, counters = self.pending, self.early, self.ttl, self.counters
        wm = self.watermark
        mbs = [(name, mb, mb.kind.tolist(), mb.ts.tolist(), mb.ids.tolist(), mb.segment.tolist(),
                mb.label.tolist(), None if mb.score is None else mb.score.tolist(), mb.probs)
               for name, mb, _ in parts]
        for w, r in zip(which.tolist(), rows.tolist()):
            name, mb, kind, tsl, ids, segs, labels, scores, probs = mbs[w]
            t = tsl[r]
            if t > wm:
                wm = t
            key = ids[r]
            if kind[r] == PREDICTION:
                payload = scores[r] if scores is not None else probs[r]
                prev = pending.get(key)
                if prev is not None:
                    if prev[1] + ttl >= wm:
                        _inc(counters.duplicates, name)
                        continue
                    self._drop_pending(key)
                    _inc(counters.expired, prev[0])
                got = early.get(key)
                if got is not None and got[0] in ("", name):
                    del early[key]
                    if got[1] + ttl >= wm:
                        out.setdefault(name, []).append((t, segs[r], got[2], payload, key))
                        _inc(counters.joined, name)
                        continue
                    counters.orphans += 1
                pending[key] = (name, t, segs[r], payload)
                _inc(self._pending_by_model, name)
                if len(pending) > self.max_pending:
                    oldest = next(iter(pending))
                    _inc(counters.expired, self._drop_pending(oldest)[0])
            elif kind[r] == OUTCOME:
                prev = pending.get(key)
                if prev is not None and name in ("", prev[0]):
                    self._drop_pending(key)
                    if prev[1] + ttl >= wm:
                        out.setdefault(prev[0], []).append((prev[1], prev[2], labels[r], prev[3], key))
                        _inc(counters.joined, prev[0])
                        continue
                    _inc(counters.expired, prev[0])
                if key in early:
                    counters.orphans += 1  # a second outcome for the same id: the first one stays
                    continue
                early[key] = (name, t, labels[r])
                if len(early) > self.max_pending:
                    del early[next(iter(early))]
                    counters.orphans += 1
        self.watermark = wm
        return {name: self._joined_batch(name, items) for name, items in out.items()}

    def _record_order(self, models: dict[str, ModelBatch]) -> tuple[list[tuple[str, ModelBatch, np.ndarray]],
                                                                     np.ndarray, np.ndarray]:
        """The non-labeled events of every model, merged in record order as (model part, row) pairs."""
        parts = []
        for name, mb in models.items():
            if name:
                self.classes[name] = mb.classes
            sel = np.flatnonzero(mb.kind != LABELED)
            if sel.size:
                parts.append((name, mb, sel))
        if not parts:
            return parts, np.zeros(0, np.int64), np.zeros(0, np.int64)
        order = np.argsort(np.concatenate([mb.index[sel] for _, mb, sel in parts]), kind="stable")
        which = np.concatenate([np.full(sel.size, i) for i, (_, _, sel) in enumerate(parts)])[order]
        rows = np.concatenate([sel for _, _, sel in parts])[order]
        return parts, which, rows

    def _joined_batch(self, name: str, items: list[tuple[float, str, int, Any, str]]) -> JoinedBatch:
        k = self.classes.get(name, 2)
        ts = np.array([i[0] for i in items], dtype=np.float64)
        seg = np.array([i[1] for i in items], dtype=object)
        lab = np.array([i[2] for i in items], dtype=np.int64)
        ids = np.array([i[4] for i in items], dtype=object)
        if k == 2:
            return JoinedBatch(name, 2, ts, seg, lab, score=np.array([i[3] for i in items], np.float64), ids=ids)
        return JoinedBatch(name, k, ts, seg, lab, probs=np.vstack([i[3] for i in items]), ids=ids)

    # -- checkpoint ----------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        """Columnar, pickle-free state (buffers in insertion order, payloads as compressed float64)."""
        scores = [e[3] for e in self.pending.values()]
        flat = np.concatenate([np.atleast_1d(np.asarray(s, np.float64)) for s in scores]) if scores else np.zeros(0)
        widths = [int(np.size(s)) if not isinstance(s, float) else 0 for s in scores]
        return {
            "version": STATE_VERSION, "ttl": self.ttl, "max_pending": self.max_pending,
            "watermark": None if self.watermark == float("-inf") else self.watermark,
            "pending": {"ids": list(self.pending), "models": [e[0] for e in self.pending.values()],
                        "ts": [e[1] for e in self.pending.values()], "segments": [e[2] for e in self.pending.values()],
                        "widths": widths, "payload": pack_array(flat, "<f8")},
            "early": {"ids": list(self.early), "models": [e[0] for e in self.early.values()],
                      "ts": [e[1] for e in self.early.values()], "labels": [e[2] for e in self.early.values()]},
            "classes": dict(self.classes),
            "counters": self.counters.to_dict(),
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Joiner:
        """Rebuild from :meth:`to_dict` output (version-1 documents, without ``version``, included)."""
        version = d.get("version", 1)
        if version not in (1, STATE_VERSION):
            raise ValueError(f"join state version {version!r} is not supported (max {STATE_VERSION})")
        out = cls(d["ttl"], d["max_pending"])
        out.watermark = float("-inf") if d["watermark"] is None else float(d["watermark"])
        p = d["pending"]
        flat = _payload_v1(p["payload"]) if version == 1 else unpack_array(p["payload"], "<f8")
        pos = 0
        for key, model, ts, seg, width in zip(p["ids"], p["models"], p["ts"], p["segments"], p["widths"]):
            if width == 0:
                payload: Any = float(flat[pos])
                pos += 1
            else:
                payload = flat[pos:pos + width].copy()
                pos += width
            out.pending[key] = (model, float(ts), seg, payload)
            _inc(out._pending_by_model, model)
        e = d["early"]
        for key, model, ts, label in zip(e["ids"], e["models"], e["ts"], e["labels"]):
            out.early[key] = (model, float(ts), int(label))
        out.classes = {k: int(v) for k, v in d["classes"].items()}
        out.counters = JoinCounters.from_dict(d["counters"])
        return out


def _payload_v1(packed: str) -> np.ndarray:
    """Pending payloads of a version-1 state: zlib-compressed little-endian float64 in bare base64."""
    return np.frombuffer(zlib.decompress(base64.b64decode(packed)), dtype="<f8")
