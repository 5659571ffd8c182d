"""Per-bucket statistics and the per-model rings of buckets (the windowed statistics of one model).

A bucket holds a :class:`~calmon.stats.model.ModelStats` (fine grid, exact 15-bin ECE grid,
class-wise grid, reservoir, level-set statistics) plus a coarse equal-width grid for the
exported reliability diagram (20 bins by default, so the ``bin`` labels ``"0.00"..."0.95"``
are exact bins, not re-binned fine cells).

Memory of one (model, segment) for a binary model with ``bins`` fine cells and a reservoir of
``r`` rows: a bucket costs ``6 * 8 * (bins + 15 + 20) + 16 r`` bytes (about 54 kB at
``bins = 1024``, ``r = 256``; 201 kB at ``bins = 4096``), and the default tiers
(12 x 5 min, 24 x 1 h, 7 x 1 d) hold at most 45 buckets plus the archive: about 2.5 MB
(resp. 9.3 MB) whatever the number of events.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import numpy as np

from calmon.agent.windows import TieredRing
from calmon.stats.grid import ScoreGrid
from calmon.stats.model import ModelStats, top_label

FORMAT = "calmon.bucket"
#: Cells of the prediction-side grid (label-free estimates and score drift need no finer resolution).
PRED_BINS = 256


class BucketStats:
    """The statistics of one time bucket (or the sum of several): model statistics + reliability grid.

    Parameters
    ----------
    classes, bins, reservoir, levelset_lambda
        As for :class:`~calmon.stats.model.ModelStats`.
    reliability_bins
        Bins of the exported reliability diagram.

    Examples
    --------
    >>> import numpy as np
    >>> b = BucketStats(2, bins=64, reservoir=10)
    >>> b.update(score=np.array([0.1, 0.97]), labels=np.array([0, 1]))
    >>> b.count, b.rel.n[[2, 19]].tolist()
    (2, [1.0, 1.0])
    """

    __slots__ = ("stats", "rel", "pred")

    def __init__(self, classes: int = 2, bins: int = 1024, reservoir: int = 256, levelset_lambda: int | None = None,
                 reliability_bins: int = 20, seed: int = 0) -> None:
        self.stats = ModelStats(classes, bins=bins, ece_bins=15, reservoir=reservoir,
                                levelset_lambda=levelset_lambda, seed=seed)
        self.rel = ScoreGrid(reliability_bins)
        #: Prediction-side statistics: every prediction's score (top-label confidence) as it arrives, labels or not.
        self.pred = ScoreGrid(PRED_BINS)

    @property
    def count(self) -> int:
        return self.stats.count

    def update(self, score: np.ndarray | None = None, probs: np.ndarray | None = None,
               labels: np.ndarray | None = None, predictions: bool = False) -> None:
        """Add labeled events (binary ``score`` or multiclass ``probs``) with class ``labels``.

        ``predictions``: also count them on the prediction-side grid (labeled events; a joined pair's
        prediction was counted there when it arrived).
        """
        labels = np.asarray(labels, dtype=np.int64)
        self.stats.update(score=score, probs=probs, labels=labels)
        if probs is None:
            if score is None:
                raise ValueError("BucketStats.update needs score (binary) or probs (multiclass)")
            self.rel.update(score, labels.astype(np.float64))
            if predictions:
                self.pred.update(score, np.zeros(score.size))
        else:
            conf, correct = top_label(probs, labels)
            self.rel.update(conf, correct)
            if predictions:
                self.pred.update(conf, np.zeros(conf.size))

    def update_predictions(self, score: np.ndarray | None = None, probs: np.ndarray | None = None) -> None:
        """Add predictions (with or without their outcome) to the prediction-side grid."""
        z = np.max(probs, axis=1) if probs is not None else score
        if z is None:
            raise ValueError("BucketStats.update_predictions needs score (binary) or probs (multiclass)")
        self.pred.update(z, np.zeros(z.size))

    def merge(self, other: BucketStats) -> None:
        self.stats.merge(other.stats)
        self.rel.merge(other.rel)
        self.pred.merge(other.pred)

    def copy(self) -> BucketStats:
        import copy

        out = BucketStats.__new__(BucketStats)
        out.stats = copy.deepcopy(self.stats)
        out.rel = self.rel.copy()
        out.pred = self.pred.copy()
        return out

    def nbytes(self) -> int:
        return self.stats.nbytes() + self.rel.nbytes() + self.pred.nbytes()

    def to_dict(self) -> dict[str, Any]:
        return {"format": FORMAT, "stats": self.stats.to_dict(), "rel": self.rel.to_dict(), "pred": self.pred.to_dict()}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> BucketStats:
        if d.get("format") != FORMAT:
            raise ValueError("not a calmon bucket document")
        out = cls.__new__(cls)
        out.stats = ModelStats.from_dict(d["stats"])
        out.rel = ScoreGrid.from_dict(d["rel"])
        # buckets checkpointed before prediction-side statistics existed start with an empty grid
        out.pred = ScoreGrid.from_dict(d["pred"]) if "pred" in d else ScoreGrid(PRED_BINS)
        return out


class ModelWindows:
    """Rings of buckets of one model: segment ``"all"`` plus each allow-listed segment.

    Parameters
    ----------
    name, classes
        Model name and number of classes.
    tiers
        ``[(width, count), ...]`` of the rings.
    segments
        Allow-listed segment values.
    bins, reservoir, levelset_lambda, reliability_bins
        Bucket parameters (see :class:`BucketStats`).

    Examples
    --------
    >>> import numpy as np
    >>> mw = ModelWindows("m", 2, [(60, 5), (600, 3)], segments=["web"], bins=64, reservoir=8)
    >>> seg = np.array(["web", "app", "web"], dtype=object)
    >>> mw.add(np.array([0.0, 10.0, 700.0]), seg, np.array([1, 0, 1]), np.array([0.9, 0.2, 0.7]), None, 700.0)
    >>> mw.rings["all"].window_sum(None).count, mw.rings["web"].window_sum(None).count
    (3, 2)
    >>> mw.rings["all"].window_sum(300).count
    1
    """

    def __init__(self, name: str, classes: int, tiers: Iterable[tuple[float, int]], segments: Iterable[str] = (),
                 bins: int = 1024, reservoir: int = 256, levelset_lambda: int | None = None,
                 reliability_bins: int = 20) -> None:
        self.name = name
        self.classes = int(classes)
        self.tiers = [(float(w), int(c)) for w, c in tiers]
        self.segments = list(segments)
        self.params: dict[str, Any] = {"classes": self.classes, "bins": bins, "reservoir": reservoir,
                                       "levelset_lambda": levelset_lambda, "reliability_bins": reliability_bins}
        self.rings: dict[str, TieredRing[BucketStats]] = {
            seg: TieredRing(self.tiers, self.factory) for seg in ["all", *self.segments]}

    def factory(self) -> BucketStats:
        return BucketStats(**self.params)

    def add(self, ts: np.ndarray, segment: np.ndarray, labels: np.ndarray, score: np.ndarray | None,
            probs: np.ndarray | None, watermark: float, predictions: bool = False) -> None:
        """Add labeled events to segment ``all`` and to their allow-listed segment (``predictions``: see
        :meth:`BucketStats.update`)."""
        if ts.size == 0:
            return

        def adder(sel: np.ndarray | None) -> Any:
            def update(bucket: BucketStats, idx: np.ndarray) -> None:
                rows = idx if sel is None else sel[idx]
                bucket.update(None if score is None else score[rows], None if probs is None else probs[rows],
                              labels[rows], predictions)
            return update

        self._add_all(ts, segment, adder, watermark)

    def add_predictions(self, ts: np.ndarray, segment: np.ndarray, score: np.ndarray | None, probs: np.ndarray | None,
                        watermark: float) -> None:
        """Add predictions (labeled or not) to the prediction-side grids of segment ``all`` and their segment."""
        if ts.size == 0:
            return

        def adder(sel: np.ndarray | None) -> Any:
            def update(bucket: BucketStats, idx: np.ndarray) -> None:
                rows = idx if sel is None else sel[idx]
                bucket.update_predictions(None if score is None else score[rows],
                                          None if probs is None else probs[rows])
            return update

        self._add_all(ts, segment, adder, watermark)

    def _add_all(self, ts: np.ndarray, segment: np.ndarray, adder: Any, watermark: float) -> None:
        self.rings["all"].add(ts, adder(None), watermark)
        for seg in self.segments:
            sel = np.flatnonzero(segment == seg)
            if sel.size:
                self.rings[seg].add(ts[sel], adder(sel), watermark)

    def nbytes(self) -> int:
        total = 0
        for ring in self.rings.values():
            for tier in ring.buckets:
                total += sum(b.nbytes() for b in tier.values())
            if ring.archive is not None:
                total += ring.archive.nbytes()
        return total

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "params": self.params, "tiers": [list(t) for t in self.tiers],
                "segments": self.segments,
                "rings": {seg: ring.to_dict(lambda b: b.to_dict()) for seg, ring in self.rings.items()}}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ModelWindows:
        p = d["params"]
        out = cls(d["name"], p["classes"], d["tiers"], d["segments"], p["bins"], p["reservoir"],
                  p["levelset_lambda"], p["reliability_bins"])
        out.rings = {seg: TieredRing.from_dict(r, out.factory, BucketStats.from_dict) for seg, r in d["rings"].items()}
        return out
