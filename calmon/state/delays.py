"""Label delay: a bounded sketch of prediction-to-outcome delays, and the join advice drawn from it.

The delay of a pair is its outcome's event time minus its prediction's (issue #32: labels 0.1-20 h
late against a one-hour ``join.ttl`` lost 98 % of them without a word).  It is measured at the join
(:class:`calmon.state.join.Joiner`) and, for outcomes that arrive after their prediction expired, from a
sample of the expired predictions' times, so the delays the TTL cut off are seen too.

:class:`DelaySketch` keeps counts in fixed log-spaced bins (about 9 % wide, 1 s to 400 days, plus the
Prometheus bucket bounds :data:`PROMETHEUS_BUCKETS` exactly): its memory never grows with the records, a
quantile is the upper edge of the bin it falls in (never below the true value), and the Prometheus
histogram ``calmon_label_delay_seconds`` is read from the same counts.

:func:`join_advice` turns the counters and the sketch into the warning the agent logs and
``/api/status`` shows: how many predictions expired unjoined and how many outcomes came after their
prediction expired, and the ``join.ttl`` that would have kept them (the p99 of the observed delays,
rounded up).  Before any such outcome has come, expired predictions are evidence only when the joined
delays run up to the TTL (:func:`ttl_reach`): the warning then asks for at least twice the TTL.
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypedDict

import numpy as np

__all__ = ["PROMETHEUS_BUCKETS", "EDGES", "DelaySketch", "DelayQuantiles", "DelayTable", "JoinAdvisor",
           "JoinWarning", "LabelDelays", "join_advice", "suggest_ttl", "ttl_reach"]

#: The ``le`` bounds of ``calmon_label_delay_seconds`` (seconds): seconds to a month, 13 buckets (and +Inf).
PROMETHEUS_BUCKETS = (1.0, 10.0, 60.0, 300.0, 900.0, 3600.0, 3 * 3600.0, 6 * 3600.0, 12 * 3600.0, 86400.0,
                      2 * 86400.0, 7 * 86400.0, 30 * 86400.0)
#: Upper bin edges: a log grid of eight bins per doubling from 1 s to 2**25 s (388 days), with the Prometheus
#: bounds added so that their cumulative counts are exact.  A value ``x`` falls in the first bin with
#: ``x <= edge``; values beyond the last edge in an overflow bin.
_GRID = 2.0 ** (np.arange(0, 25 * 8 + 1) / 8)
EDGES = np.unique(np.concatenate([_GRID, PROMETHEUS_BUCKETS]))
# Binning by the logarithm instead of a binary search (np.searchsorted on unsorted delays cost more than the rest
# of a batch's delay work together): cell k of the grid is (_GRID[k-1], _GRID[k]], with -inf/inf at both ends;
# its bin in EDGES is _CELL_BIN[k], one less for values up to the Prometheus bound inside the cell, if any.
_LOWER = np.concatenate([[-np.inf], _GRID, [np.inf]])
_CELL_BIN = np.concatenate([np.searchsorted(EDGES, _GRID), [EDGES.size]])
_INSIDE = np.full(_GRID.size + 1, -np.inf)
for _b in PROMETHEUS_BUCKETS:
    if _b not in _GRID:
        _INSIDE[np.searchsorted(_GRID, _b)] = _b


def _bins(d: np.ndarray) -> np.ndarray:
    """``np.searchsorted(EDGES, d, side="left")`` for finite ``d >= 0``, by the logarithm (exact at every edge).

    Examples
    --------
    >>> x = np.concatenate([EDGES, np.nextafter(EDGES, 0), np.nextafter(EDGES, np.inf), [0.0, 0.3, 1e12]])
    >>> bool(np.array_equal(_bins(x), np.searchsorted(EDGES, x, side="left")))
    True
    """
    with np.errstate(divide="ignore"):
        k = np.clip(np.ceil(8 * np.log2(d)), 0, _GRID.size).astype(np.int64)
    k -= d <= _LOWER[k]  # the logarithm's rounding, corrected by one comparison each way
    k += d > _LOWER[k + 1]
    return _CELL_BIN[k] - (d <= _INSIDE[k])
#: Changing :data:`EDGES` changes this: a checkpointed sketch of other edges is dropped, not misread.
EDGES_VERSION = 1


class DelayQuantiles(TypedDict):
    """Observed label delays of one model (seconds, upper bin edges: never below the true quantile)."""

    count: int
    p50: float | None
    p90: float | None
    p99: float | None
    max: float | None


class JoinWarning(TypedDict):
    """One entry of ``/api/status``'s top-level ``warnings`` (rendered by the status page)."""

    code: str
    message: str
    count: int
    setting: str
    suggested: str


@dataclass
class DelaySketch:
    """Counts of delays in the bins of :data:`EDGES` (plus overflow), their sum, and their number.

    Examples
    --------
    >>> s = DelaySketch()
    >>> s.observe(np.array([30.0, 60.0, 7200.0]))
    >>> s.count, s.total, s.quantile(0.5), s.quantile(1.0) >= 7200.0
    (3, 7290.0, 60.0, True)
    >>> s.cumulative()[PROMETHEUS_BUCKETS.index(60.0)]  # delays <= 60 s: exact at a Prometheus bound
    2
    >>> DelaySketch.from_dict(s.to_dict()) == s
    True
    """

    counts: np.ndarray = field(default_factory=lambda: np.zeros(EDGES.size + 1, dtype=np.int64))
    total: float = 0.0

    def __eq__(self, other: object) -> bool:
        return (isinstance(other, DelaySketch) and self.total == other.total
                and bool(np.array_equal(self.counts, other.counts)))

    @property
    def count(self) -> int:
        return int(self.counts.sum())

    def observe(self, delays: np.ndarray, weight: int = 1) -> None:
        """Count ``delays`` (seconds; negative ones as 0: an outcome stamped before its prediction), each
        ``weight`` times (a sampled observation stands for ``weight`` of them)."""
        d = np.maximum(np.asarray(delays, dtype=np.float64), 0.0)
        d = d[np.isfinite(d)]
        if not d.size:
            return
        np.add.at(self.counts, _bins(d), weight)
        self.total += float(d.sum()) * weight

    def quantile(self, q: float) -> float | None:
        """The upper edge of the bin holding the ``q``-quantile (``None`` when empty; ``inf`` in the overflow)."""
        n = self.count
        if not n:
            return None
        i = int(np.searchsorted(np.cumsum(self.counts), max(1, math.ceil(q * n)), side="left"))
        return float(EDGES[i]) if i < EDGES.size else math.inf

    def cumulative(self) -> list[int]:
        """Cumulative counts at each bound of :data:`PROMETHEUS_BUCKETS` (``le`` semantics)."""
        cum = np.cumsum(self.counts)
        return [int(cum[int(np.searchsorted(EDGES, b))]) for b in PROMETHEUS_BUCKETS]

    def summary(self) -> DelayQuantiles:
        """Count and quantiles (``/api/status``'s join section)."""
        return {"count": self.count, "p50": self.quantile(0.5), "p90": self.quantile(0.9),
                "p99": self.quantile(0.99), "max": self.quantile(1.0)}

    def copy(self) -> DelaySketch:
        return DelaySketch(self.counts.copy(), self.total)

    def to_dict(self) -> dict[str, Any]:
        """Sparse checkpoint form: the non-empty bins."""
        nz = np.flatnonzero(self.counts)
        return {"edges": EDGES_VERSION, "bins": nz.tolist(), "counts": self.counts[nz].tolist(), "sum": self.total}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> DelaySketch:
        out = cls()
        if int(d.get("edges", 0)) != EDGES_VERSION:  # written with other bins: start again (observability only)
            return out
        bins = np.asarray(d["bins"], dtype=np.int64)
        if bins.size and (bins.min() < 0 or bins.max() >= out.counts.size):
            raise ValueError("delays: bin index out of range")
        out.counts[bins] = np.asarray(d["counts"], dtype=np.int64)
        out.total = float(d["sum"])
        return out


_UNITS = (("d", 86400.0), ("h", 3600.0), ("m", 60.0), ("s", 1.0))


def suggest_ttl(seconds: float) -> str:
    """A duration of ``join.ttl``'s syntax at least ``seconds``, rounded up to a whole unit.

    Examples
    --------
    >>> suggest_ttl(73080.0), suggest_ttl(3 * 86400 + 1), suggest_ttl(90), suggest_ttl(0.2)
    ('21h', '4d', '90s', '1s')
    """
    for unit, size in _UNITS:
        if seconds >= 2 * size or unit == "s":  # at least two of the unit: "21h", not "1d"
            return f"{max(1, math.ceil(seconds / size - 1e-9))}{unit}"
    raise AssertionError("unreachable")


def _human(seconds: float) -> str:
    for unit, size in _UNITS:
        if seconds >= size or unit == "s":
            return f"{seconds / size:.3g}{unit}"
    raise AssertionError("unreachable")


#: Joined delays needed before their shape below the TTL is read (:func:`ttl_reach`).
REACH_MIN = 50
#: Density of the joined delays just below the TTL, relative to their mean density up to it, from which the
#: TTL is taken to cut the delays off (a uniform delay cut at the TTL gives 1; an exponential one cut at its
#: mean 0.58, at twice its mean 0.31, at its p99 0.05).
REACH_DENSITY = 0.5


def ttl_reach(ttl: float, delays: DelaySketch) -> float | None:
    """How densely the observed delays run up to ``ttl``: the share of delays in the last bins below it
    (about its last 10 %) over that window's share of ``(0, ttl]``; ``None`` below :data:`REACH_MIN` delays.

    Delays that stop well before the TTL give about 0; delays cut off by the TTL about 1 or more.

    Examples
    --------
    >>> cut = DelaySketch(); cut.observe(np.linspace(360, 3600, 500))        # 0.1-20 h delays, ttl 1 h: cut
    >>> done = DelaySketch(); done.observe(np.linspace(360, 3 * 3600, 500))  # 0.1-3 h delays, ttl 12 h
    >>> round(ttl_reach(3600.0, cut), 1), round(ttl_reach(12 * 3600.0, done), 1)
    (1.1, 0.0)
    """
    top = int(np.searchsorted(EDGES, ttl * (1 + 1e-9), side="right"))  # bins [0, top) end at or below ttl
    lo = int(np.searchsorted(EDGES, 0.9 * ttl, side="right"))
    if top == 0:
        return None
    e_top, e_lo = float(EDGES[top - 1]), (float(EDGES[lo - 1]) if lo else 0.0)
    n_all, n_near = int(delays.counts[:top].sum()), int(delays.counts[lo:top].sum())
    if n_all < REACH_MIN or e_top <= e_lo:
        return None
    return (n_near / n_all) / ((e_top - e_lo) / e_top)


def join_advice(ttl: float, expired: Mapping[str, int], late_outcomes: Mapping[str, int],
                delays: Iterable[DelaySketch]) -> JoinWarning | None:
    """The ``join_expired`` or ``join_ttl_reached`` warning, or ``None`` when the TTL loses nothing seen.

    ``join_expired``: outcomes came after their prediction expired; ``count`` is their number (the labels
    the TTL lost) and their delays, with those of the pairs joined, give the value: the p99 of every observed
    delay, rounded up (:func:`suggest_ttl`).  ``join_ttl_reached``: no such outcome yet, but predictions
    expired unjoined while the joined delays run up to the TTL (:func:`ttl_reach`), so their outcomes may
    still come and be lost; ``count`` is the expired predictions, and the value at least twice the TTL (the
    delays beyond it are not seen yet).  Predictions expiring while the delays stop well before the TTL are
    no evidence (many never get an outcome).

    Examples
    --------
    >>> s = DelaySketch(); s.observe(np.linspace(360, 72000, 1000))
    >>> w = join_advice(3600.0, {"m": 42}, {"m": 17}, [s])
    >>> w["setting"], w["suggested"], w["count"]
    ('join.ttl', '20h', 17)
    >>> w["message"]  # doctest: +NORMALIZE_WHITESPACE
    '42 predictions expired unjoined and 17 outcomes arrived after their prediction expired: set join.ttl >= 20h
     (p99 of observed label delays 19.9h)'
    >>> join_advice(86400.0, {"m": 42}, {}, [s]) is None   # delays stop well before the TTL
    True
    >>> cut = DelaySketch(); cut.observe(np.linspace(360, 3600, 500))   # joined delays run up to the TTL
    >>> w = join_advice(3600.0, {"m": 42}, {}, [cut])
    >>> w["code"], w["suggested"], w["count"]
    ('join_ttl_reached', '2h', 42)
    """
    late = sum(late_outcomes.values())
    n_exp = sum(expired.values())
    if not late and not n_exp:
        return None
    merged = DelaySketch()
    for sk in delays:
        merged.counts += sk.counts
    if not late:
        reach = ttl_reach(ttl, merged)
        if reach is None or reach < REACH_DENSITY:
            return None
        suggested = suggest_ttl(2 * ttl)
        msg = (f"{n_exp} predictions expired unjoined and the observed label delays run up to join.ttl "
               f"({_human(ttl)}): their outcomes may still come and be lost; set join.ttl >= {suggested} "
               f"(at least twice the current value; outcomes arriving after expiry will measure it)")
        return {"code": "join_ttl_reached", "message": msg, "count": n_exp, "setting": "join.ttl",
                "suggested": suggested}
    value, what = merged.quantile(0.99), "p99 of observed label delays"
    if value is None or value <= ttl:  # over 99 % joined: keep the few late ones too
        value, what = merged.quantile(1.0), "longest observed label delay"
    if value is None or value <= ttl:  # delays not measured (outcomes without times): at least double
        value, what = 2 * ttl, "twice the current join.ttl; no delay measured"
    value = min(value, float(EDGES[-1]))  # beyond the sketch's range: its last edge
    suggested = suggest_ttl(value)
    msg = (f"{n_exp} predictions expired unjoined and {late} outcomes arrived after their prediction expired: "
           f"set join.ttl >= {suggested} ({what} {_human(value)})")
    return {"code": "join_expired", "message": msg, "count": late, "setting": "join.ttl",
            "suggested": suggested}


#: Expired predictions remembered (a hash sample of them) to time the outcomes that come after them.
SAMPLE_CAP = 16384
#: Sampled expired predictions are forgotten this many TTLs of event time after their own time.
SAMPLE_AGE = 64


def _sampled(key: str, level: int) -> bool:
    """Whether id ``key`` is in the sample at ``level`` (one id in ``2**level``, by CRC-32: the same in every
    process, so a restored state samples the same ids)."""
    return level == 0 or zlib.crc32(key.encode("utf-8", "surrogatepass")) & ((1 << level) - 1) == 0


@dataclass(frozen=True)
class DelayTable:
    """Every model's delay counts as one matrix (a copy), read with a few array operations whatever the number
    of models: a ``/metrics`` scrape or a status document at a thousand models does no per-model numpy work.

    Examples
    --------
    >>> d = LabelDelays(); d.observe_batch({"a": np.array([5.0, 50.0, 5000.0]), "b": np.array([7200.0])})
    >>> t = d.table()
    >>> t.summaries()["a"]["count"], t.summaries()["b"]["p50"] >= 7200.0, t.merged().count
    (3, True, 4)
    >>> t.histograms()["a"]["buckets"][:3]  # le 1 s, 10 s, 1 min
    [(1.0, 0), (10.0, 1), (60.0, 2)]
    """

    names: list[str]
    counts: np.ndarray  #: model x bin
    totals: np.ndarray  #: sum of the delays per model

    def quantiles(self, qs: Sequence[float]) -> np.ndarray:
        """Model x ``qs``: the upper edge of the bin holding each quantile (NaN for a model without delays,
        inf in the overflow bin)."""
        cum = np.cumsum(self.counts, axis=1)
        n = cum[:, -1] if cum.size else np.zeros(0, dtype=np.int64)
        edges = np.concatenate([EDGES, [np.inf]])
        out = np.full((len(self.names), len(qs)), np.nan)
        for j, q in enumerate(qs):
            target = np.maximum(1, np.ceil(q * n))
            idx = np.minimum((cum < target[:, None]).sum(axis=1), EDGES.size)
            out[:, j] = np.where(n > 0, edges[idx], np.nan)
        return out

    def summaries(self) -> dict[str, DelayQuantiles]:
        """Count and quantiles per model (``/api/status``'s join section)."""
        qs = self.quantiles((0.5, 0.9, 0.99, 1.0)).tolist()
        counts = self.counts.sum(axis=1).tolist()

        def num(x: float) -> float | None:
            return None if x != x else x

        return {m: {"count": int(c), "p50": num(q[0]), "p90": num(q[1]), "p99": num(q[2]), "max": num(q[3])}
                for m, c, q in zip(self.names, counts, qs)}

    def histograms(self) -> dict[str, DelayHistogramDoc]:
        """Per model: cumulative counts at each bound of :data:`PROMETHEUS_BUCKETS`, the sum and the count."""
        cum = np.cumsum(self.counts, axis=1)
        at = cum[:, np.searchsorted(EDGES, PROMETHEUS_BUCKETS)].tolist() if cum.size else []
        n = cum[:, -1].tolist() if cum.size else []
        return {m: {"buckets": list(zip(PROMETHEUS_BUCKETS, row)), "sum": total, "count": int(c)}
                for m, row, total, c in zip(self.names, at, self.totals.tolist(), n)}

    def merged(self) -> DelaySketch:
        """Every model's delays in one sketch."""
        return DelaySketch(self.counts.sum(axis=0) if self.counts.size else np.zeros(EDGES.size + 1, np.int64),
                           float(self.totals.sum()))


class DelayHistogramDoc(TypedDict):
    """``calmon_label_delay_seconds`` of one model: cumulative counts per ``le`` bound, sum and count."""

    buckets: list[tuple[float, int]]
    sum: float
    count: int


class LabelDelays:
    """The join's delay measurements: a :class:`DelaySketch` per model, a bounded sample of expired
    predictions, and the outcomes that came after their prediction expired (estimated from the sample).

    The sketches are the rows of one matrix (model x bin), so a batch's delays of every model are binned and
    added in a few array operations (issue #15: nothing per model but a dict lookup at a thousand models).
    The sample keeps the ids of one expired prediction in ``2**level`` (``level`` rises when more than
    :data:`SAMPLE_CAP` are held after forgetting those older than :data:`SAMPLE_AGE` TTLs), so its memory is
    bounded whatever the rate, and an outcome that finds its prediction in it counts ``2**level`` times.

    Examples
    --------
    >>> d = LabelDelays()
    >>> d.expire("a", "m", 100.0)
    >>> d.outcome_after_expiry("a", 4000.0), d.late, d.sketch("m").count
    (True, {'m': 1}, 1)
    >>> d.outcome_after_expiry("b", 4000.0)  # never seen: an orphan, not a late outcome
    False
    >>> d.observe_batch({"m": np.array([10.0, np.nan]), "n": np.array([np.nan])})  # NaN: no time, not counted
    >>> d.sketch("m").count, sorted(d.sketches())
    (2, ['m'])
    """

    __slots__ = ("rows", "counts", "totals", "late", "expired", "level")

    def __init__(self) -> None:
        self.rows: dict[str, int] = {}  #: model -> its row of ``counts``
        self.counts = np.zeros((0, EDGES.size + 1), dtype=np.int64)
        self.totals = np.zeros(0, dtype=np.float64)
        #: Outcomes that arrived after their prediction expired, per model (estimated: sampled x ``2**level``).
        self.late: dict[str, int] = {}
        #: Sampled expired predictions: id -> (model, prediction time).
        self.expired: dict[str, tuple[str, float]] = {}
        self.level = 0

    def _row(self, model: str) -> int:
        row = self.rows.get(model)
        if row is None:
            row = self.rows[model] = len(self.rows)
            if row >= self.counts.shape[0]:  # grow by doubling: amortised O(1) per model
                grow = max(8, self.counts.shape[0])
                self.counts = np.vstack([self.counts, np.zeros((grow, EDGES.size + 1), dtype=np.int64)])
                self.totals = np.concatenate([self.totals, np.zeros(grow)])
        return row

    def sketch(self, model: str) -> DelaySketch:
        """A copy of one model's sketch (empty if it has none)."""
        row = self.rows.get(model)
        if row is None:
            return DelaySketch()
        return DelaySketch(self.counts[row].copy(), float(self.totals[row]))

    def sketches(self) -> dict[str, DelaySketch]:
        """Copies of every model's sketch (one matrix copy; call under the state lock, use after)."""
        counts, totals = self.counts[:len(self.rows)].copy(), self.totals[:len(self.rows)].tolist()
        return {m: DelaySketch(counts[r], totals[r]) for m, r in self.rows.items()}

    def table(self) -> DelayTable:
        """A copy of every model's counts (one matrix copy: call under the state lock, read after)."""
        n = len(self.rows)
        return DelayTable(list(self.rows), self.counts[:n].copy(), self.totals[:n].copy())

    def observe(self, model: str, delays: np.ndarray, weight: int = 1) -> None:
        row = self._row(model)
        sk = DelaySketch(self.counts[row], float(self.totals[row]))  # a view of the row: observed in place
        sk.observe(delays, weight)
        self.totals[row] = sk.total

    def observe_batch(self, delays: Mapping[str, np.ndarray]) -> None:
        """Count the delays of one batch's pairs, model -> its delays (NaN: unknown, skipped), in one binning for
        the batch."""
        names = [n for n, d in delays.items() if d.size]
        if not names:
            return
        arrays = [delays[n] for n in names]
        d = arrays[0] if len(arrays) == 1 else np.concatenate(arrays)
        part = np.repeat(np.arange(len(names)), [a.size for a in arrays])
        ok = np.isfinite(d)
        if not ok.all():
            d, part = d[ok], part[ok]
        d = np.maximum(d, 0.0)
        nb, k = EDGES.size + 1, len(names)
        grid = np.bincount(part * nb + _bins(d), minlength=k * nb).reshape(k, nb)
        sums = np.bincount(part, weights=d, minlength=k)
        timed = np.flatnonzero(np.bincount(part, minlength=k))  # models with a delay known (a sketch only then)
        if timed.size < k:
            grid, sums, names = grid[timed], sums[timed], [names[i] for i in timed.tolist()]
        if not names:
            return
        rows = np.array([self._row(n) for n in names], dtype=np.int64)  # distinct: += is exact
        self.counts[rows] += grid
        self.totals[rows] += sums

    def expire(self, key: str, model: str, ts: float) -> None:
        """Remember (if sampled) a prediction expired unjoined."""
        if _sampled(key, self.level):
            self.expired[key] = (model, ts)

    def late_outcome(self, key: str, model: str, delay: float) -> None:
        """An outcome for prediction ``key`` came ``delay`` seconds after it, when it had already expired."""
        if _sampled(key, self.level):
            w = 1 << self.level
            self.late[model] = self.late.get(model, 0) + w
            self.observe(model, np.array([delay]), w)

    def outcome_after_expiry(self, key: str, t: float) -> bool:
        """Whether an outcome (time ``t``, NaN: unknown) without a waiting prediction is for a sampled expired
        one; if so it is counted and its delay observed."""
        hit = self.expired.pop(key, None)
        if hit is None:
            return False
        w = 1 << self.level
        self.late[hit[0]] = self.late.get(hit[0], 0) + w
        if t == t:
            self.observe(hit[0], np.array([t - hit[1]]), w)
        return True

    def prune(self, watermark: float, ttl: float) -> None:
        """Forget sampled predictions older than :data:`SAMPLE_AGE` TTLs; sample more sparsely beyond the cap."""
        if len(self.expired) <= SAMPLE_CAP:
            return
        cutoff = watermark - SAMPLE_AGE * ttl
        self.expired = {k: v for k, v in self.expired.items() if v[1] >= cutoff}
        while len(self.expired) > SAMPLE_CAP:
            self.level += 1
            self.expired = {k: v for k, v in self.expired.items() if _sampled(k, self.level)}

    def copy(self) -> LabelDelays:
        out = LabelDelays()
        out.rows, out.counts, out.totals = dict(self.rows), self.counts.copy(), self.totals.copy()
        out.late, out.expired, out.level = dict(self.late), dict(self.expired), self.level
        return out

    def to_dict(self) -> dict[str, Any]:
        ids = list(self.expired)
        return {"sketches": {m: s.to_dict() for m, s in self.sketches().items()}, "late": dict(self.late),
                "level": self.level, "expired": {"ids": ids, "models": [v[0] for v in self.expired.values()],
                                                 "ts": [v[1] for v in self.expired.values()]}}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any] | None) -> LabelDelays:
        """Rebuild from :meth:`to_dict` (``None``: a checkpoint written before delays were measured)."""
        out = cls()
        if d is None:
            return out
        for m, sd in d["sketches"].items():
            sk = DelaySketch.from_dict(sd)
            row = out._row(str(m))
            out.counts[row], out.totals[row] = sk.counts, sk.total
        out.late = {str(m): int(n) for m, n in d["late"].items()}
        e = d["expired"]
        out.expired = {str(k): (str(m), float(t)) for k, m, t in zip(e["ids"], e["models"], e["ts"], strict=True)}
        out.level = int(d["level"])
        return out


class JoinAdvisor:
    """Logs :func:`join_advice` as one warning, rate limited (wall clock).

    The first evidence (an outcome after its prediction expired) is logged ``first_after`` seconds
    later, or at the end of a read-once input (``final``), so a replay logs one line with all its
    numbers; then at most every ``every`` seconds, and only when more outcomes came late since.

    Examples
    --------
    >>> msgs = []
    >>> adv = JoinAdvisor(msgs.append, first_after=60, every=600)
    >>> d = LabelDelays(); d.expire("a", "m", 0.0); _ = d.outcome_after_expiry("a", 7200.0)
    >>> adv.tick(3600.0, {"m": 1}, d, now=0.0), adv.tick(3600.0, {"m": 1}, d, now=61.0), len(msgs)
    (False, True, 1)
    >>> adv.tick(3600.0, {"m": 1}, d, now=10_000.0, final=True)  # nothing new since: no second line
    False

    Predictions expiring while the joined delays run up to the TTL (``join_ttl_reached``, before any outcome
    came late) are logged once, on the same schedule; the sketch is read for it at most every ``first_after``
    seconds.

    >>> cut = LabelDelays(); cut.observe("m", np.linspace(360, 3600, 500))
    >>> adv = JoinAdvisor(msgs.append, first_after=60, every=600)
    >>> [adv.tick(3600.0, {"m": 9}, cut, now=t) for t in (0.0, 30.0, 61.0, 700.0)], msgs[-1][:38]
    ([False, False, True, False], '9 predictions expired unjoined and the')
    """

    def __init__(self, emit: Any, first_after: float = 60.0, every: float = 600.0) -> None:
        self.emit = emit
        self.first_after = first_after
        self.every = every
        self._seen_at: float | None = None  #: wall time the unlogged evidence was first seen
        self._logged_at = -math.inf
        self._logged_late = 0
        self._reach_seen_at: float | None = None  #: wall time expired predictions were first seen (no late yet)
        self._reach_checked_at = -math.inf
        self._reach_logged = False

    def tick(self, ttl: float, expired: Mapping[str, int], delays: LabelDelays, now: float,
             final: bool = False) -> bool:
        """Log the advice if it is due; True if a line was logged.  Cheap when nothing is due."""
        late = sum(delays.late.values())
        if late <= self._logged_late:
            return self._tick_reach(ttl, expired, delays, now, final) if not late else False
        if self._seen_at is None:
            self._seen_at = now
        due = final or (now - self._seen_at >= self.first_after and now - self._logged_at >= self.every)
        if not due:
            return False
        advice = join_advice(ttl, expired, delays.late, [delays.table().merged()])
        if advice is None:
            return False
        self.emit(advice["message"])
        self._logged_at, self._logged_late, self._seen_at = now, late, None
        return True

    def _tick_reach(self, ttl: float, expired: Mapping[str, int], delays: LabelDelays, now: float,
                    final: bool) -> bool:
        """The ``join_ttl_reached`` line: once, ``first_after`` seconds after predictions first expired."""
        if self._reach_logged or not any(expired.values()):
            return False
        if self._reach_seen_at is None:
            self._reach_seen_at = now
        if not final and (now - self._reach_seen_at < self.first_after
                          or now - self._reach_checked_at < self.first_after):
            return False
        self._reach_checked_at = now
        advice = join_advice(ttl, expired, {}, [delays.table().merged()])
        if advice is None:
            return False
        self.emit(advice["message"])
        self._reach_logged = True
        return True
