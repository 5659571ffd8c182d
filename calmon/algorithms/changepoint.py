"""When did calibration change? river's Page-Hinkley detector on block-standardised calibration residuals.

A window test says *whether* a window is miscalibrated; this says *when* calibration changed,
within a few thousand events instead of when a 24 h window tips.  Each (prediction ``p``,
outcome ``y``) pair -- binary score, or top-label confidence with ``y`` = correct -- feeds
three signals, each a weighted residual with mean zero under calibration
(``E[y | p] = p``):

``residual``
    ``w = 1``: the model's overall bias (scores too high or too low);
``confidence``
    ``w = 2p - 1``: over-confidence (scores pushed towards 0 and 1, e.g. a temperature < 1)
    makes ``(2p - 1)(y - p)`` negative, under-confidence positive;
``high``
    ``w = 1[p >= 0.8]``: miscalibration confined to the high scores.

Events are grouped into consecutive blocks of ``block`` events (in record order, so the result
does not depend on how the stream is cut into batches).  A block's statistic

    S = sum w (y - p) / sqrt(sum w^2 p (1 - p))

is approximately N(0, 1) under calibration whatever the scores (a CLT over the block; the
variance is the exact conditional one), so one detector setting holds its false-alarm rate on
any score distribution.  ``S``, its deviation from the running mean divided by the running standard deviation when that
exceeds 1 (a stationary miscalibrated stream has a larger variance than the calibrated null), feeds river's
:class:`~river.drift.PageHinkley` (two-sided, no forgetting), a CUSUM that signals when the mean
of ``S`` changes.  The change point is the
classical CUSUM estimate: the end of the block where the cumulative sum last reached its
extreme before the alarm.  Per event the cost is a few numpy operations; the detector runs once
per block.

The defaults (``block = 256``, ``delta = 0.25``, ``threshold = 20``) give an in-control average
run length of about 9e4 blocks two-sided (Siegmund's approximation
``(exp(2 delta h) - 2 delta h - 1) / (2 delta^2)`` per side), i.e. about one false alarm per 2e7
events and signal; ``benchmarks/changepoint_eval.py`` measures it and the detection delays.

References
----------
E. S. Page (1954). Continuous inspection schemes. Biometrika 41, 100-115.
D. Siegmund (1985). Sequential Analysis, Springer, eq. (2.56) (ARL of the CUSUM).

Examples
--------
>>> import numpy as np
>>> rng = np.random.default_rng(0)
>>> det = CalibrationChangeDetector()
>>> p = rng.uniform(0.05, 0.95, 200_000)
>>> y = (rng.uniform(size=p.size) < p).astype(float)
>>> det.update(p, y, np.arange(p.size, dtype=float))     # calibrated: nothing
[]
>>> q = rng.uniform(0.05, 0.95, 50_000)
>>> over = 1 / (1 + ((1 - q) / q) ** 0.5)                # temperature 2: under-confident scores
>>> y2 = (rng.uniform(size=q.size) < q).astype(float)
>>> changes = det.update(over, y2, 200_000 + np.arange(q.size, dtype=float))
>>> changes[0].signal, changes[0].change_point >= 200_000 - 512
('confidence', True)
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
from river import drift

__all__ = ["SIGNALS", "Change", "CalibrationChangeDetector"]

#: Signal name -> weight function of the score.
SIGNALS = ("residual", "confidence", "high")
HIGH_SCORE = 0.8
STATE_VERSION = 1
_SCALE = float(1 << 28)


def _terms(signal: str, p: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """A signal's fixed-point terms of each pair: exact integer block sums whatever the batch split (a restart
    replays identically)."""
    w = _weights(signal, p)
    num = np.rint(w * (y - p) * _SCALE).astype(np.int64)
    var = np.rint(w * w * p * (1.0 - p) * _SCALE).astype(np.int64)
    return num, var


def _weights(signal: str, p: np.ndarray) -> np.ndarray:
    if signal == "residual":
        return np.ones_like(p)
    if signal == "confidence":
        return 2.0 * p - 1.0
    return (p >= HIGH_SCORE).astype(np.float64)


@dataclass(frozen=True)
class Change:
    """A detected change: the signal, when it was detected and where it most likely started (event time)."""

    signal: str
    direction: str  #: "up" (outcomes above the scores) or "down"
    detected_at: float
    change_point: float
    events: int  #: events seen by the detector when it fired

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


class _Signal:
    """One signal: the open block's sums and a Page-Hinkley detector with change-point bookkeeping.

    It reads and restores the detector's private sums: river exposes no state export, and the
    checkpoint must hold the detector exactly (a restart gives the same detections).
    """

    def __init__(self, delta: float, threshold: float, min_blocks: int) -> None:
        self.ph = drift.PageHinkley(min_instances=min_blocks, delta=delta, threshold=threshold, alpha=1.0)
        self.num = 0     # sum w (y - p) of the open block, fixed point (units of 2^-28: exact, order-free)
        self.var = 0     # sum w^2 p (1 - p), fixed point
        self.count = 0   # events in the open block
        self.up_start = -math.inf    # block-end time where the increase sum was last at its minimum
        self.down_start = -math.inf  # ... the decrease sum at its maximum
        # running count, mean and M2 (Welford) of the block statistics since the last detection
        self.sn, self.smean, self.sm2 = 0, 0.0, 0.0

    def scale(self) -> float:
        """The block statistics' standard deviation so far, floored at 1 (their value under calibration).

        A stationary but miscalibrated stream inflates it (over-confident scores understate the
        outcomes' variance); dividing by it keeps such a stream from raising "changes" again and again.
        """
        return max(1.0, math.sqrt(self.sm2 / (self.sn - 1))) if self.sn >= 2 else 1.0

    def feed(self, s: float, ts: float) -> str | None:
        """Feed one block statistic; the direction of a detection, or None."""
        ph = self.ph
        if ph.drift_detected:  # the detector restarts with this block: so does the variance estimate
            self.sn, self.smean, self.sm2 = 0, 0.0, 0.0
        # scale the deviation from the running mean, not the statistic: dividing S itself would move its
        # mean whenever the scale estimate moves, which the detector would report as a change
        x = self.smean + (s - self.smean) / self.scale() if self.sn else s
        self.sn += 1
        d = s - self.smean
        self.smean += d / self.sn
        self.sm2 += d * (s - self.smean)
        ph.update(x)
        if ph._sum_increase <= ph._min_increase:  # the CUSUM extremes locate the change
            self.up_start = ts
        if ph._sum_decrease >= ph._max_decrease:
            self.down_start = ts
        if not ph.drift_detected:
            return None
        up = ph._sum_increase - ph._min_increase
        down = ph._max_decrease - ph._sum_decrease
        return "up" if up >= down else "down"

    def state(self) -> dict[str, Any]:
        ph = self.ph
        return {"num": self.num, "var": self.var, "count": self.count, "up_start": _num(self.up_start),
                "down_start": _num(self.down_start), "mean_n": ph._x_mean.n, "mean": ph._x_mean._mean,
                "sum_inc": ph._sum_increase, "sum_dec": ph._sum_decrease,
                "min_inc": _num(ph._min_increase), "max_dec": ph._max_decrease,
                "detected": ph.drift_detected, "scale": [self.sn, self.smean, self.sm2]}

    def load(self, d: Mapping[str, Any]) -> None:
        ph = self.ph
        self.num, self.var, self.count = int(d["num"]), int(d["var"]), int(d["count"])
        self.up_start, self.down_start = _float(d["up_start"]), _float(d["down_start"])
        ph._x_mean.n, ph._x_mean._mean = float(d["mean_n"]), float(d["mean"])
        vars(ph).update(_sum_increase=float(d["sum_inc"]), _sum_decrease=float(d["sum_dec"]),
                        _min_increase=_float(d["min_inc"]), _max_decrease=float(d["max_dec"]),
                        _drift_detected=bool(d["detected"]))
        sn, smean, sm2 = d["scale"]
        self.sn, self.smean, self.sm2 = int(sn), float(smean), float(sm2)


def _num(x: float) -> float | str:
    return x if math.isfinite(x) else ("inf" if x > 0 else "-inf")


def _float(x: Any) -> float:
    return float(x)  # float("inf") / float("-inf") parse the strings written by _num


class CalibrationChangeDetector:
    """Sequential change detection on a model's calibration (see the module docstring).

    Parameters
    ----------
    block
        Events per block (the detection delay is at least one block).
    delta, threshold
        Page-Hinkley drift allowance and alarm threshold, in units of the N(0, 1) block statistic.
    min_blocks
        Blocks before the first alarm can be raised (the running mean needs a few).
    signals
        Which of :data:`SIGNALS` to run.
    """

    def __init__(self, block: int = 256, delta: float = 0.25, threshold: float = 20.0, min_blocks: int = 30,
                 signals: tuple[str, ...] = SIGNALS) -> None:
        if block < 16:
            raise ValueError(f"block must be >= 16 events, got {block}")
        if not (delta > 0 and threshold > 0):
            raise ValueError("delta and threshold must be positive")
        unknown = sorted(set(signals) - set(SIGNALS))
        if unknown:
            raise ValueError(f"unknown signals {unknown} (known: {', '.join(SIGNALS)})")
        self.block = int(block)
        self.delta = float(delta)
        self.threshold = float(threshold)
        self.min_blocks = int(min_blocks)
        self.signals = {s: _Signal(self.delta, self.threshold, min_blocks) for s in signals}
        self.events = 0
        self.detections = {s: 0 for s in signals}
        self.last: dict[str, Change] = {}

    def update(self, p: np.ndarray, y: np.ndarray, ts: np.ndarray) -> list[Change]:
        """Add pairs in record order: scores (or top-label confidences) ``p``, outcomes ``y`` in {0, 1}, event times."""
        p = np.clip(np.asarray(p, dtype=np.float64), 0.0, 1.0)
        y = np.asarray(y, dtype=np.float64)
        ts = np.asarray(ts, dtype=np.float64)
        out: list[Change] = []
        for name, sig in self.signals.items():
            out.extend(self._update_signal(name, sig, p, y, ts))
        self.events += int(p.size)
        return out

    def _update_signal(self, name: str, sig: _Signal, p: np.ndarray, y: np.ndarray, ts: np.ndarray) -> list[Change]:
        num, var = _terms(name, p, y)
        return self._accumulate(name, sig, num, var, ts)

    def _accumulate(self, name: str, sig: _Signal, num: np.ndarray, var: np.ndarray, ts: np.ndarray) -> list[Change]:
        """Add one signal's fixed-point terms of pairs in record order; close every block they complete.

        The open block is completed first, the sums of the full blocks after it are taken in one reshaped
        sum each (integer sums: the same as block by block), and only the detector is fed block by block."""
        out: list[Change] = []
        n = num.size
        first = min(self.block - sig.count, n)  # the pairs that complete (or extend) the open block
        sig.num += int(num[:first].sum())
        sig.var += int(var[:first].sum())
        sig.count += first
        if sig.count < self.block:
            return out
        full = (n - first) // self.block  # whole blocks after it
        stop = first + full * self.block
        nums, vars_ = [sig.num], [sig.var]
        if full:
            nums += num[first:stop].reshape(full, self.block).sum(axis=1).tolist()
            vars_ += var[first:stop].reshape(full, self.block).sum(axis=1).tolist()
        ends = range(first, stop + 1, self.block)  # each closed block's end (exclusive) in these pairs
        for bnum, bvar, end, end_ts in zip(nums, vars_, ends, ts[np.asarray(ends) - 1].tolist()):
            stat = bnum / math.sqrt(bvar * _SCALE) if bvar > 0 else 0.0
            direction = sig.feed(stat, end_ts)
            if direction is not None:
                cp = sig.up_start if direction == "up" else sig.down_start
                change = Change(name, direction, end_ts, cp if math.isfinite(cp) else end_ts, self.events + end)
                self.detections[name] += 1
                self.last[name] = change
                out.append(change)
        sig.num, sig.var, sig.count = int(num[stop:].sum()), int(var[stop:].sum()), n - stop
        return out

    @staticmethod
    def update_many(detectors: Sequence[CalibrationChangeDetector], bounds: Sequence[int], p: np.ndarray,
                    y: np.ndarray, ts: np.ndarray) -> None:
        """:meth:`update` of several detectors at once: detector ``i`` gets the pairs ``bounds[i]:bounds[i + 1]``.

        The same as calling ``update`` detector by detector (block sums are integers, so summing a detector's
        terms as one slice of the batch's arrays gives the same sums), with one vectorised pass per signal over
        the whole batch: at a thousand models a batch holds a few dozen pairs per model and completes a block for
        few of them, so those only add three sums per signal (issue #15).  Every detector must have the same
        signals.

        Examples
        --------
        >>> a, b = CalibrationChangeDetector(block=16), CalibrationChangeDetector(block=16)
        >>> p, y = np.full(40, 0.3), (np.arange(40) % 2).astype(np.float64)
        >>> CalibrationChangeDetector.update_many([a, b], [0, 10, 40], p, y, np.arange(40.0))
        >>> ref = CalibrationChangeDetector(block=16)
        >>> _ = ref.update(p[10:], y[10:], np.arange(10.0, 40.0))
        >>> b.to_dict() == ref.to_dict(), a.events, a.signals["residual"].count
        (True, 10, 10)
        """
        if not detectors:
            return
        p = np.clip(np.asarray(p, dtype=np.float64), 0.0, 1.0)
        y = np.asarray(y, dtype=np.float64)
        ts = np.asarray(ts, dtype=np.float64)
        lo, hi = list(bounds[:-1]), list(bounds[1:])
        if any(a >= b for a, b in zip(lo, hi)):
            raise ValueError("update_many: every detector needs at least one pair")
        for name in detectors[0].signals:
            num, var = _terms(name, p, y)
            nsum, vsum = np.add.reduceat(num, lo).tolist(), np.add.reduceat(var, lo).tolist()
            for det, a, b, ns, vs in zip(detectors, lo, hi, nsum, vsum):
                sig = det.signals[name]
                if sig.count + (b - a) < det.block:  # no block completes: only the sums move
                    sig.num += ns
                    sig.var += vs
                    sig.count += b - a
                else:
                    det._accumulate(name, sig, num[a:b], var[a:b], ts[a:b])
        for det, a, b in zip(detectors, lo, hi):
            det.events += b - a

    # -- checkpoint -----------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        return {"version": STATE_VERSION, "block": self.block, "delta": self.delta, "threshold": self.threshold,
                "min_blocks": self.min_blocks, "events": self.events, "detections": dict(self.detections),
                "last": {k: v.to_dict() for k, v in self.last.items()},
                "signals": {k: s.state() for k, s in self.signals.items()}}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> CalibrationChangeDetector:
        if d.get("version") != STATE_VERSION:
            raise ValueError(f"change detector state version {d.get('version')!r}, expected {STATE_VERSION}")
        out = cls(int(d["block"]), float(d["delta"]), float(d["threshold"]), int(d["min_blocks"]),
                  tuple(d["signals"]))
        out.events = int(d["events"])
        out.detections = {str(k): int(v) for k, v in d["detections"].items()}
        out.last = {str(k): Change(**v) for k, v in d["last"].items()}
        for k, s in d["signals"].items():
            out.signals[k].load(s)
        return out
