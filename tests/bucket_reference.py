"""An eager reference of a bucket and of a model's rings, independent of the fold (for tests).

:class:`RefBucket` computes a bucket's statistics as the grids and the model statistics define them, batch of
events by batch of events (:meth:`ModelStats.update <calmon.stats.model.ModelStats.update>`,
:meth:`ScoreGrid.update <calmon.stats.grid.ScoreGrid.update>`): no combined cell axis, no waiting folds, no
bincounts.  :class:`RefWindows` adds events ring by ring, each ring grouping its events by bucket itself
(:meth:`TieredRing.add <calmon.state.windows.TieredRing.add>` given their times).  Their documents have the form of
:class:`~calmon.state.buckets.BucketStats`'s and :class:`~calmon.state.buckets.ModelWindows`'s, so the fold's
results are compared with them document by document.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from calmon.state.buckets import ModelWindows
from calmon.stats.grid import ScoreGrid
from calmon.stats.model import ModelStats


def _top(probs: np.ndarray, labels: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Top-label confidence and correctness, ties to the lowest class."""
    top = np.asarray(probs).argmax(axis=1)
    return np.asarray(probs)[np.arange(top.size), top], (top == labels).astype(np.float64)


class RefBucket:
    """A bucket updated eagerly: model statistics, reliability grid and prediction-side grid."""

    def __init__(self, classes: int = 2, bins: int = 1024, reservoir: int = 256, levelset_lambda: int | None = None,
                 reliability_bins: int = 20, seed: int = 0) -> None:
        self.stats = ModelStats(classes, bins=bins, ece_bins=15, reservoir=reservoir,
                                levelset_lambda=levelset_lambda, seed=seed)
        self.rel = ScoreGrid(reliability_bins)
        self.pred = ScoreGrid(256)

    @property
    def count(self) -> int:
        return self.stats.count

    def update(self, score: np.ndarray | None = None, probs: np.ndarray | None = None,
               labels: np.ndarray | None = None, predictions: bool = False) -> None:
        labels = np.asarray(labels, dtype=np.int64)
        self.stats.update(score=score, probs=probs, labels=labels)
        if probs is None:
            z, y = np.asarray(score, dtype=np.float64), labels.astype(np.float64)
        else:
            z, y = _top(probs, labels)
        self.rel.update(z, y)
        if predictions:
            self.pred.update(z, np.zeros(z.size))

    def update_predictions(self, score: np.ndarray | None = None, probs: np.ndarray | None = None) -> None:
        z = np.asarray(score if probs is None else np.max(probs, axis=1), dtype=np.float64)
        self.pred.update(z, np.zeros(z.size))

    def merge(self, other: RefBucket) -> None:
        self.stats.merge(other.stats)
        self.rel.merge(other.rel)
        self.pred.merge(other.pred)

    def copy(self) -> RefBucket:
        out = RefBucket.__new__(RefBucket)
        out.stats, out.rel, out.pred = self.stats.copy(), self.rel.copy(), self.pred.copy()
        return out

    def to_dict(self) -> dict[str, Any]:
        return {"format": "calmon.bucket", "stats": self.stats.to_dict(), "rel": self.rel.to_dict(),
                "pred": self.pred.to_dict()}


class RefWindows(ModelWindows):
    """A model's rings of :class:`RefBucket`, events added ring by ring."""

    def factory(self) -> RefBucket:  # type: ignore[override]
        return RefBucket(**self.params)

    def add(self, ts: np.ndarray, segment: np.ndarray, labels: np.ndarray, score: np.ndarray | None,
            probs: np.ndarray | None, watermark: float, predictions: bool = False) -> None:
        self._each(ts, segment, watermark, lambda b, i: b.update(None if score is None else score[i],
                                                                   None if probs is None else probs[i], labels[i],
                                                                   predictions))

    def add_predictions(self, ts: np.ndarray, segment: np.ndarray, score: np.ndarray | None, probs: np.ndarray | None,
                        watermark: float) -> None:
        self._each(ts, segment, watermark, lambda b, i: b.update_predictions(None if score is None else score[i],
                                                                               None if probs is None else probs[i]))

    def _each(self, ts: np.ndarray, segment: np.ndarray, watermark: float,
              update: Callable[[Any, np.ndarray], None]) -> None:
        """Each ring (``all``, then each allow-listed segment) gets its events: ``update(bucket, events)``."""
        if not ts.size:
            return
        for name, ring in self.rings.items():
            sel = np.arange(ts.size) if name == "all" else np.flatnonzero(segment == name)
            if sel.size:
                ring.add(ts[sel], lambda b, i, sel=sel: update(b, sel[i]), watermark)
