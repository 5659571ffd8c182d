"""The river metric base of calmon's calibration metrics: pairs in, exact revertible grid state.

A :class:`CalibrationMetric` is a river ``ClassificationMetric`` fed probabilities
(``requires_labels`` is false, so ``evaluate.progressive_val_score`` hands it
``predict_proba_one``'s dict).  It reduces every ``(y_true, y_pred)`` to a (score, outcome) pair
(:mod:`calmon.river.pairs`) and keeps calmon's own sufficient statistics of the pairs
(:mod:`calmon.river.state`); subclasses compute their value from that grid with the same
functions ``calmon check`` uses, and cache it until the next ``update`` or ``revert``.

It derives from ``ClassificationMetric`` rather than ``BinaryMetric`` because one class serves
binary models and, with ``top_label=True``, multiclass ones; it shares no confusion matrix
(a calibration error is not a function of one).
"""

from __future__ import annotations

import abc
from collections.abc import Hashable
from typing import Generic, TypeVar

from river import base, metrics

from calmon.river.pairs import Prediction, binary_pair, top_label_pair
from calmon.river.state import GridAccumulator
from calmon.stats.grid import ScoreGrid

__all__ = ["CalibrationMetric", "check_dyadic"]

#: What a metric computes from its grid (a float, or a richer result such as a test's).
V = TypeVar("V")


def check_dyadic(bins: int) -> None:
    """``ValueError`` unless ``bins`` is a power of two >= 2 (the fine grid's scales must be exact coarsenings)."""
    if int(bins) != bins or bins < 2 or int(bins) & (int(bins) - 1):
        raise ValueError(f"bins must be a power of two >= 2, got {bins!r}")


class CalibrationMetric(metrics.base.ClassificationMetric, abc.ABC, Generic[V]):
    """A river metric over calmon's binned statistics of (score, outcome) pairs.

    Parameters
    ----------
    bins
        Equal-width cells of the grid on [0, 1] the value is computed from.
    top_label
        ``False``: binary, the score is ``P(y = pos_val)``.  ``True``: multiclass top-label, the
        score is the largest probability and the outcome whether its class is ``y_true``.
    pos_val
        The positive label of a binary model.

    Notes
    -----
    Sample weights are not supported (``works_with_weights`` is false): the statistics count
    events exactly, and a weight other than 1 raises ``ValueError``.
    """

    _fmt = ".2%"

    def __init__(self, bins: int, top_label: bool = False, pos_val: Hashable = True) -> None:
        # ClassificationMetric.__init__ is not called: it would build an unused confusion matrix.
        self.bins = int(bins)
        self.top_label = bool(top_label)
        self.pos_val = pos_val
        self._state = GridAccumulator(self.bins)
        self._cache: tuple[int, V] | None = None

    # -- river's metric interface ----------------------------------------------------------
    def update(self, y_true: Hashable, y_pred: Prediction, w: float = 1.0) -> None:
        """Count one prediction with its observed label."""
        self._state.add(*self._pair(y_true, y_pred, w))

    def revert(self, y_true: Hashable, y_pred: Prediction, w: float = 1.0) -> None:
        """Forget a prediction counted before: the state becomes exactly what it was without it."""
        self._state.remove(*self._pair(y_true, y_pred, w))

    @property
    def requires_labels(self) -> bool:
        return False

    @property
    def works_with_weights(self) -> bool:
        return False

    def works_with(self, model: base.Estimator) -> bool:
        """Classifiers, binary or multiclass (any ``predict_proba_one`` gives a top label); pipelines ending in one."""
        return isinstance(model, base.Classifier)

    def __repr__(self) -> str:
        # river's Metric.__repr__ strips trailing zeros, which would also eat an exponent's "0" (1e-10 -> 1e-1)
        return f"{type(self).__name__}: {self.get():{self._fmt}}"

    # -- state -------------------------------------------------------------------------------
    @property
    def n(self) -> int:
        """Number of pairs currently counted."""
        return self._state.count

    @property
    def grid(self) -> ScoreGrid:
        """calmon's statistics of the counted pairs (do not modify)."""
        return self._state.grid

    def _cached(self) -> V:
        """The value of :meth:`_compute` for the current state, computed at most once per state."""
        if self._cache is None or self._cache[0] != self._state.version:
            self._cache = (self._state.version, self._compute(self.grid))
        return self._cache[1]

    @abc.abstractmethod
    def _compute(self, grid: ScoreGrid) -> V:
        """What :meth:`get` reports, from a non-empty or empty grid."""

    def _pair(self, y_true: Hashable, y_pred: Prediction, w: float) -> tuple[float, float]:
        if w != 1.0:
            raise ValueError(f"{type(self).__name__} counts events; sample weights are not supported (w={w})")
        return top_label_pair(y_true, y_pred) if self.top_label else binary_pair(y_true, y_pred, self.pos_val)
