"""Histogram binning with equal-mass bins, on raw scores or on a fine score grid.

The score range is cut after the empirical quantiles ``k / B`` of the training scores (a group of
tied scores is never split; duplicate cut points are removed, so heavy ties give fewer bins); each
bin predicts the (weighted) fraction of positives of its training points.  From a
:class:`~calmon.stats.grid.ScoreGrid` the cut points are cell boundaries where the cumulative count
first reaches ``k n / B``.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from calmon.calibration.base import Calibrator
from calmon.calibration.params import check_binary, param_array, param_float


class HistogramCalibrator(Calibrator):
    """Equal-mass histogram binning.

    Parameters
    ----------
    bins
        Number of bins ``B`` (default 15).

    Examples
    --------
    >>> import numpy as np
    >>> cal = HistogramCalibrator(bins=2).fit(np.array([0.1, 0.2, 0.7, 0.9]), np.array([0, 1, 1, 1]))
    >>> cal.predict(np.array([0.05, 0.95])).tolist()
    [0.5, 1.0]

    References
    ----------
    Zadrozny & Elkan, "Obtaining calibrated probability estimates from decision trees and naive
    Bayesian classifiers", ICML 2001; Kumar, Liang, Ma, "Verified uncertainty calibration", NeurIPS
    2019 (equal-mass bins); T-Cal Tables 1-3 row "histogram binning".
    """

    method = "histogram"
    kind = "binary"

    def __init__(self, bins: int = 15) -> None:
        super().__init__()
        if int(bins) != bins or bins < 1:
            raise ValueError(f"bins must be a positive integer, got {bins!r}")
        self.bins = int(bins)
        self.edges = np.zeros(0)
        self.values = np.array([0.5])

    def _finish(self, idx: np.ndarray, y: np.ndarray, w: np.ndarray) -> None:
        k = self.edges.size + 1
        sw = np.bincount(idx, weights=w, minlength=k)
        sy = np.bincount(idx, weights=w * y, minlength=k)
        total = np.sum(w * y) / np.sum(w)
        self.values = np.where(sw > 0, sy / np.where(sw > 0, sw, 1.0), total)
        self.fitted = True

    def fit(self, x: np.ndarray, y: np.ndarray, sample_weight: np.ndarray | None = None) -> HistogramCalibrator:
        """Fit on raw scores in [0, 1] and 0/1 labels."""
        z, yy, w = check_binary(x, y, sample_weight)
        w = np.ones_like(z) if w is None else w
        if w.sum() <= 0:
            raise ValueError("histogram binning needs at least one observation with positive weight")
        order = np.argsort(z, kind="stable")
        cw = np.cumsum(w[order])
        targets = cw[-1] * np.arange(1, self.bins) / self.bins
        zs = z[order]
        pos = np.searchsorted(cw, targets, side="left")  # first sorted index reaching each mass target
        # a cut is the next distinct score after that point (a tie group stays in one bin, on the left,
        # as with grid cells); scores equal to a cut go right
        nxt = np.searchsorted(zs, zs[np.clip(pos, 0, z.size - 1)], side="right")
        cuts = zs[nxt[nxt < z.size]]
        self.edges = np.unique(cuts)
        self._finish(np.searchsorted(self.edges, z, side="right"), yy, w)
        self.training = {"n": int(z.size), "source": "raw"}
        return self

    def fit_grid(self, grid: Any) -> HistogramCalibrator:
        """Fit on a single-channel grid: cut points at cell edges of the cumulative count."""
        if getattr(grid, "channels", None) is not None:
            raise ValueError("histogram binning from a grid needs a single-channel grid")
        n = grid.n
        total = n.sum()
        if total <= 0:
            raise ValueError("cannot fit histogram binning on an empty grid")
        cn = np.cumsum(n)
        targets = total * np.arange(1, self.bins) / self.bins
        cell = np.searchsorted(cn, targets, side="left")  # cell where the target is reached
        cuts = np.unique(grid.edges[np.clip(cell + 1, 1, grid.bins - 1)])
        first = np.flatnonzero(n > 0)
        self.edges = cuts[cuts > grid.edges[first[0]]]
        idx = np.searchsorted(self.edges, grid.centers, side="right")
        keep = n > 0
        self._finish(idx[keep], np.clip(grid.sum_y[keep] / n[keep], 0, 1), n[keep])
        self.training = {"n": int(total), "source": "grid", "bins": int(grid.bins)}
        return self

    def predict(self, x: np.ndarray) -> np.ndarray:
        """The value of the bin each score falls in."""
        self._check_fitted()
        z, _, _ = check_binary(x)
        return self.values[np.searchsorted(self.edges, z, side="right")]

    def get_params(self) -> dict[str, Any]:
        return {"bins": self.bins, "edges": self.edges.tolist(), "values": self.values.tolist()}

    @classmethod
    def from_params(cls, params: dict[str, Any]) -> HistogramCalibrator:
        cal = cls(bins=int(param_float(params, "bins", lo=1)))
        edges = np.asarray(params.get("edges", []), dtype=np.float64)
        values = param_array(params, "values")
        if edges.ndim != 1 or values.size != edges.size + 1 or not np.isfinite(edges).all():
            raise ValueError("histogram parameters need len(values) == len(edges) + 1")
        if (np.diff(edges) <= 0).any() or (values < 0).any() or (values > 1).any():
            raise ValueError("histogram edges must increase and values lie in [0, 1]")
        cal.edges, cal.values = edges, values
        cal.fitted = True
        return cal
