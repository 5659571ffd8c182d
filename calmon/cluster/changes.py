"""Change detectors in cluster mode: the deltas carry each range's labeled pairs in record order.

A change detector (:mod:`calmon.algorithms.changepoint`) is sequential: it needs one ordered stream of
a model's labeled pairs, which no merged bucket keeps.  So the ingest stage records, per range and
model, the pairs its ingestion would have fed the detectors -- event time, score (or top-label
confidence) and outcome, in record order (:class:`PairRecorder` stands in for the partition's
:class:`~calmon.state.monitors.ChangeMonitor`) -- and the delta carries them (three arrays in the binary
record, 24 bytes a labeled pair).  The evaluator owning the model feeds its own detectors with them
when it merges the delta (:func:`feed`), so the detectors, their metrics and alerts live where the
model's windows do.  Exactly once follows the deltas: a repeated range is dropped before it is fed, and a
model's snapshot carries its detectors' state with its windows.

Order: within a range the pairs keep record order; ranges of different input partitions arrive in the
order the evaluator reads them, which interleaves the partitions differently from one process reading
the same topics.  A detector's blocks of ``changes.block`` pairs therefore differ in composition, not in
distribution: a drift that moves the block statistic by several standard errors is detected by both, at
most a few blocks apart (``tests/test_cluster_changes.py``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from calmon.algorithms.changepoint import CalibrationChangeDetector
from calmon.config.schema import ChangesConfig
from calmon.state.monitors import ChangeMonitor

__all__ = ["Pairs", "PairRecorder", "feed", "restore_detector"]


@dataclass(frozen=True)
class Pairs:
    """One model's labeled pairs of one range, in record order (float64 arrays of one length)."""

    ts: np.ndarray
    p: np.ndarray
    y: np.ndarray

    def __len__(self) -> int:
        return int(self.ts.size)

    def check(self) -> None:
        """``ValueError`` unless the arrays have one length, finite times, scores in [0, 1] and outcomes 0/1."""
        n = self.ts.size
        if self.ts.ndim != 1 or self.p.shape != (n,) or self.y.shape != (n,):
            raise ValueError(f"pairs of shapes {self.ts.shape}, {self.p.shape}, {self.y.shape}")
        if not (np.isfinite(self.ts).all() and ((self.p >= 0) & (self.p <= 1)).all()
                and ((self.y == 0) | (self.y == 1)).all()):
            raise ValueError("pairs need finite times, scores in [0, 1] and outcomes 0 or 1")


class PairRecorder(ChangeMonitor):
    """A partition's change monitor in the ingest stage: it keeps the pairs it is fed, per model, instead of
    detecting (:meth:`take` hands them over once per range)."""

    def __init__(self, cfg: ChangesConfig) -> None:
        super().__init__(cfg)
        self._got: dict[str, list[tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]]] = {}

    def feed(self, names: Sequence[str], part: np.ndarray, index: np.ndarray, ts: np.ndarray, p: np.ndarray,
             y: np.ndarray) -> None:
        if not self.cfg.enabled or not part.size:
            return
        for i, name in enumerate(names):
            sel = np.flatnonzero(part == i)
            if sel.size:
                self._got.setdefault(name, []).append((index[sel], ts[sel], p[sel], y[sel]))

    def take(self) -> dict[str, Pairs]:
        """The pairs fed since the last call, per model, in record order (ties in the order fed)."""
        out: dict[str, Pairs] = {}
        for name, chunks in self._got.items():
            index, ts, p, y = (np.concatenate(c) for c in zip(*chunks))
            order = np.argsort(index, kind="stable")
            out[name] = Pairs(np.asarray(ts[order], dtype=np.float64), np.asarray(p[order], dtype=np.float64),
                              np.asarray(y[order], dtype=np.float64))
        self._got = {}
        return out


def feed(monitor: ChangeMonitor, model: str, pairs: Pairs) -> None:
    """Feed one delta's pairs of ``model`` to the evaluator's detectors (in the delta's record order)."""
    n = len(pairs)
    if n and monitor.cfg.enabled:
        monitor.feed([model], np.zeros(n, dtype=np.int64), np.arange(n), pairs.ts, pairs.p, pairs.y)


def restore_detector(monitor: ChangeMonitor, model: str, doc: Mapping[str, Any] | None) -> None:
    """Install a model's detector state from its snapshot (``None``: the model had none yet).

    Raises ``ValueError``, ``KeyError`` or ``TypeError`` when the document is damaged.
    """
    if doc is None:
        monitor.detectors.pop(model, None)
        return
    det = CalibrationChangeDetector.from_dict(dict(doc))
    if tuple(det.signals) != tuple(monitor.cfg.signals) or det.block != monitor.cfg.block:
        raise ValueError(f"detector of model {model!r} has signals {tuple(det.signals)} and blocks of {det.block}, "
                         f"configured {tuple(monitor.cfg.signals)} and {monitor.cfg.block}")
    monitor.detectors[model] = det
