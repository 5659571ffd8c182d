"""Isotonic regression calibration by weighted pool-adjacent-violators, on raw scores or on bins.

The fitted map is the non-decreasing step function minimising the weighted squared error at the
distinct training scores (ties pooled first), evaluated between them by linear interpolation and
clipped outside the training range -- the same prediction rule as scikit-learn's
``IsotonicRegression(out_of_bounds="clip")``.  From a :class:`~calmon.stats.grid.ScoreGrid` every
non-empty cell is one point (mean score, fraction of positives, weight = count).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from calmon.calibration.base import Calibrator
from calmon.calibration.params import check_binary, grid_cells, param_array


def pava(y: np.ndarray, w: np.ndarray) -> np.ndarray:
    """Weighted pool-adjacent-violators: the non-decreasing fit minimising ``sum w (y - f)^2``.

    Parameters
    ----------
    y
        Values in the order of the covariate, shape (m,).
    w
        Positive weights, shape (m,).

    Returns
    -------
    numpy.ndarray
        Fitted non-decreasing values, shape (m,).

    Examples
    --------
    >>> pava(np.array([1.0, 3.0, 2.0, 4.0]), np.array([1.0, 1.0, 1.0, 1.0])).tolist()
    [1.0, 2.5, 2.5, 4.0]
    >>> pava(np.array([3.0, 1.0]), np.array([3.0, 1.0])).tolist()
    [2.5, 2.5]

    References
    ----------
    Ayer, Brunk, Ewing, Reid, Silverman (1955); Barlow et al., "Statistical inference under order
    restrictions" (1972); Zadrozny & Elkan (2002) for calibration.
    """
    y = np.asarray(y, dtype=np.float64)
    w = np.asarray(w, dtype=np.float64)
    if y.shape != w.shape or y.ndim != 1:
        raise ValueError("y and w must be 1-d arrays of the same length")
    if (w <= 0).any():
        raise ValueError("PAVA weights must be positive")
    m = y.size
    val = np.empty(m)
    wt = np.empty(m)
    cnt = np.empty(m, dtype=np.int64)
    top = -1
    for i in range(m):  # amortised O(m): each point is merged at most once
        v, ww, c = y[i], w[i], 1
        while top >= 0 and val[top] > v:
            tw = wt[top] + ww
            v = (val[top] * wt[top] + v * ww) / tw
            ww = tw
            c += cnt[top]
            top -= 1
        top += 1
        val[top], wt[top], cnt[top] = v, ww, c
    return np.repeat(val[: top + 1], cnt[: top + 1])


def _unique_weighted(x: np.ndarray, y: np.ndarray, w: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    order = np.argsort(x, kind="stable")
    x, y, w = x[order], y[order], w[order]
    ux, start = np.unique(x, return_index=True)
    sw = np.add.reduceat(w, start)
    sy = np.add.reduceat(w * y, start)
    return ux, sy / sw, sw


class IsotonicCalibrator(Calibrator):
    """Isotonic regression (non-decreasing) calibration map.

    Examples
    --------
    >>> import numpy as np
    >>> cal = IsotonicCalibrator().fit(np.array([0.1, 0.3, 0.5, 0.7]), np.array([0, 1, 0, 1]))
    >>> cal.predict(np.array([0.0, 0.4, 0.9])).tolist()
    [0.0, 0.5, 1.0]

    References
    ----------
    Zadrozny & Elkan, "Transforming classifier scores into accurate multiclass probability estimates",
    KDD 2002; T-Cal (Lee et al., JMLR 2023) Tables 1-3 row "isotonic".
    """

    method = "isotonic"
    kind = "binary"

    def __init__(self) -> None:
        super().__init__()
        self.x_thresholds = np.array([0.0, 1.0])
        self.y_thresholds = np.array([0.0, 1.0])

    def _fit_points(self, x: np.ndarray, y: np.ndarray, w: np.ndarray) -> IsotonicCalibrator:
        keep = w > 0
        x, y, w = x[keep], y[keep], w[keep]
        if x.size == 0:
            raise ValueError("isotonic calibration needs at least one observation with positive weight")
        ux, uy, uw = _unique_weighted(x, y, w)
        fy = pava(uy, uw)
        if fy.size > 2:  # drop interior points equal to both neighbours (prediction unchanged)
            keep_pt = np.ones(fy.size, dtype=bool)
            keep_pt[1:-1] = (fy[1:-1] != fy[:-2]) | (fy[1:-1] != fy[2:])
            ux, fy = ux[keep_pt], fy[keep_pt]
        self.x_thresholds, self.y_thresholds = ux, fy
        self.fitted = True
        return self

    def fit(self, x: np.ndarray, y: np.ndarray, sample_weight: np.ndarray | None = None) -> IsotonicCalibrator:
        """Fit on raw scores in [0, 1] and 0/1 labels (optional non-negative weights)."""
        z, yy, w = check_binary(x, y, sample_weight)
        self._fit_points(z, yy, np.ones_like(z) if w is None else w)
        self.training = {"n": int(z.size), "source": "raw"}
        return self

    def fit_grid(self, grid: Any) -> IsotonicCalibrator:
        """Fit on the non-empty cells of a single-channel grid (mean score, positive fraction, count)."""
        n, zbar, t = grid_cells(grid, "isotonic calibration")
        self._fit_points(zbar, t, n)
        self.training = {"n": int(n.sum()), "source": "grid", "bins": int(grid.bins)}
        return self

    def predict(self, x: np.ndarray) -> np.ndarray:
        """Linear interpolation of the fitted steps, clipped outside the training range."""
        self._check_fitted()
        z, _, _ = check_binary(x)
        return np.interp(z, self.x_thresholds, self.y_thresholds)

    def get_params(self) -> dict[str, Any]:
        return {"x": self.x_thresholds.tolist(), "y": self.y_thresholds.tolist()}

    @classmethod
    def from_params(cls, params: dict[str, Any]) -> IsotonicCalibrator:
        x = param_array(params, "x")
        y = param_array(params, "y")
        if x.shape != y.shape or (np.diff(x) <= 0).any() or (np.diff(y) < 0).any() or (y < 0).any() or (y > 1).any():
            raise ValueError("isotonic parameters need increasing x and non-decreasing y in [0, 1] of equal length")
        cal = cls()
        cal.x_thresholds, cal.y_thresholds = x, y
        cal.fitted = True
        return cal
