"""Smooth calibration error as a river metric: :class:`SmoothCE`, the exact smCE of the binned pairs."""

from __future__ import annotations

from collections.abc import Hashable
from typing import TypedDict

from calmon.algorithms.smooth import smce_grid
from calmon.river.base import CalibrationMetric
from calmon.stats.grid import ScoreGrid

__all__ = ["SmoothCE"]

_POINTS = ("center", "mean")


class _Value(TypedDict):
    value: float
    error_bound: float


class SmoothCE(CalibrationMetric[_Value]):
    """Smooth calibration error (smCE) of the predictions, computed exactly from calmon's grid.

    The value is ``max_w (1/n) sum_j w(v_j) r_j`` over 1-Lipschitz ``w`` with values in [-1, 1],
    where the points ``v_j`` are the non-empty cells of a ``bins``-cell equal-width grid (their
    centres with ``point="center"``, their mean scores with ``"mean"``) and ``r_j`` the exact
    residual sums ``sum (y - p)`` of the pairs in cell ``j`` -- the smCE of the binned
    predictions, solved exactly (no LP tolerance) by :func:`calmon.algorithms.smooth.smce_grid`,
    the value calmon's ``smce`` tester reports when it works from a grid.  It is within
    :attr:`error_bound` (``(h/2) mean|y - p|`` for ``"center"``, ``h mean|y - p|`` for ``"mean"``,
    ``h = 1/bins``, plus ``2**-29`` of fixed-point rounding) of the
    smCE of the raw pairs that ``calmon check --tests smce`` reports for a file; when every
    score is a cell centre the two are the same number.  0 before the first update.

    Parameters
    ----------
    bins
        Cells of the grid (default the agent's fine grid, 4096).
    point
        Cell representative: ``"center"`` or ``"mean"``.
    top_label, pos_val
        As in :class:`~calmon.river.ECE`.

    Examples
    --------
    >>> from river import datasets, evaluate, linear_model, preprocessing
    >>> import calmon.river

    >>> model = preprocessing.StandardScaler() | linear_model.LogisticRegression()
    >>> metric = calmon.river.SmoothCE()
    >>> evaluate.progressive_val_score(datasets.Phishing(), model, metric)
    SmoothCE: 4.38%
    >>> metric.error_bound < 1e-4
    True

    References
    ----------
    Hu, Tian, Yang. Testing calibration in subquadratic time (2024), Definition 3 and eq. (11);
    Blasiok, Gopalan, Hu, Nakkiran. A unifying theory of distance from calibration. STOC 2023.
    """

    def __init__(self, bins: int = 4096, point: str = "center", top_label: bool = False,
                 pos_val: Hashable = True) -> None:
        if point not in _POINTS:
            raise ValueError(f"point must be one of {_POINTS}, got {point!r}")
        super().__init__(bins, top_label, pos_val)
        self.point = point

    @property
    def bigger_is_better(self) -> bool:
        return False

    @property
    def error_bound(self) -> float:
        """Bound on the distance between :meth:`get` and the smCE of the raw pairs."""
        return self._cached()["error_bound"]

    def get(self) -> float:
        return self._cached()["value"]

    def _compute(self, grid: ScoreGrid) -> _Value:
        if not grid.count:
            return {"value": 0.0, "error_bound": 0.0}
        res = smce_grid(grid, point=self.point)
        return {"value": float(res["value"]), "error_bound": float(res["error_bound"])}
