"""Polynomial scaling: least-squares regression of the outcome on a polynomial in the score, truncated to [0, 1].

The calibrated score is ``clip(sum_d c_d x**d, 0, 1)`` with ``x = 2 z - 1`` (a centred covariate keeps the
normal equations well conditioned) and ``c`` minimising ``sum_i w_i (y_i - sum_d c_d x_i**d)**2``
(a tiny ridge ``l2 * ||c||**2`` keeps a degenerate sample solvable).  From a
:class:`~calmon.stats.grid.ScoreGrid` every non-empty cell contributes its mean score with weight ``n`` and
target ``sum_y / n``: the exact least-squares fit of the binned data (it differs from the raw fit by the
within-cell spread of ``z``, of the order of the squared cell width).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from calmon.calibration.base import Calibrator
from calmon.calibration.params import check_binary, grid_cells, param_array, param_float


def fit_polynomial(z: np.ndarray, t: np.ndarray, w: np.ndarray, degree: int, l2: float = 1e-10) -> np.ndarray:
    """Weighted least-squares coefficients of ``t`` on ``1, x, ..., x**degree`` with ``x = 2 z - 1``.

    Examples
    --------
    >>> z = np.array([0.0, 0.5, 1.0]); fit_polynomial(z, 0.2 + 0.5 * z, np.ones(3), 1).round(6).tolist()
    [0.45, 0.25]
    """
    x = 2.0 * np.asarray(z, dtype=np.float64) - 1.0
    V = np.vander(x, degree + 1, increasing=True)
    sw = np.sqrt(np.asarray(w, dtype=np.float64))
    A = np.vstack([V * sw[:, None], np.sqrt(l2 * max(float(np.sum(w)), 1.0)) * np.eye(degree + 1)])
    b = np.concatenate([np.asarray(t, dtype=np.float64) * sw, np.zeros(degree + 1)])
    coef, *_ = np.linalg.lstsq(A, b, rcond=None)
    return np.asarray(coef, dtype=np.float64)


class PolynomialCalibrator(Calibrator):
    """Polynomial scaling (the "polynomial" row of the T-Cal tables).

    Parameters
    ----------
    degree
        Polynomial degree (the T-Cal paper: 3 for CIFAR-10, 5 for CIFAR-100 and ImageNet; default 3).
    l2
        Ridge coefficient relative to the total weight.

    Examples
    --------
    >>> rng = np.random.default_rng(0)
    >>> z = rng.uniform(size=20000); y = (rng.uniform(size=z.size) < z ** 2).astype(float)
    >>> cal = PolynomialCalibrator(degree=2).fit(z, y)
    >>> cal.predict(np.array([0.0, 0.5, 1.0])).round(2).tolist()
    [0.0, 0.25, 1.0]

    References
    ----------
    Lee, Huang, Hassani, Dobriban. T-Cal (JMLR 2023), Section 4.2 and Tables 1-3 ("polynomial": least
    squares on a polynomial of the score, predictions truncated to [0, 1]).
    """

    method = "polynomial"
    kind = "binary"

    def __init__(self, degree: int = 3, l2: float = 1e-10) -> None:
        super().__init__()
        if isinstance(degree, bool) or int(degree) != degree or not 0 <= degree <= 15:
            raise ValueError(f"degree must be an integer in [0, 15], got {degree!r}")
        if not (l2 >= 0 and np.isfinite(l2)):
            raise ValueError(f"l2 must be finite and >= 0, got {l2!r}")
        self.degree, self.l2 = int(degree), float(l2)
        self.coef = np.zeros(self.degree + 1)

    def fit(self, x: np.ndarray, y: np.ndarray, sample_weight: np.ndarray | None = None) -> PolynomialCalibrator:
        """Fit on raw scores in [0, 1] and 0/1 labels (optional weights)."""
        z, yy, w = check_binary(x, y, sample_weight)
        w = np.ones_like(z) if w is None else w
        if z.size == 0 or w.sum() <= 0:
            raise ValueError("polynomial scaling needs at least one observation with positive weight")
        self.coef = fit_polynomial(z, yy, w, self.degree, self.l2)
        self.fitted = True
        self.training = {"n": int(z.size), "source": "raw"}
        return self

    def fit_grid(self, grid: Any) -> PolynomialCalibrator:
        """Weighted least squares on the cell means of a single-channel grid."""
        n, zbar, t = grid_cells(grid, "polynomial scaling")
        self.coef = fit_polynomial(zbar, t, n, self.degree, self.l2)
        self.fitted = True
        self.training = {"n": int(n.sum()), "source": "grid", "bins": int(grid.bins)}
        return self

    def predict(self, x: np.ndarray) -> np.ndarray:
        """``clip(polynomial(2 z - 1), 0, 1)``."""
        self._check_fitted()
        z, _, _ = check_binary(x)
        return np.clip(np.polynomial.polynomial.polyval(2.0 * z - 1.0, self.coef), 0.0, 1.0)

    def get_params(self) -> dict[str, Any]:
        return {"degree": self.degree, "l2": self.l2, "basis": "x = 2z - 1, increasing powers",
                "coef": self.coef.tolist()}

    @classmethod
    def from_params(cls, params: dict[str, Any]) -> PolynomialCalibrator:
        cal = cls(degree=int(param_float(params, "degree", lo=0, hi=15)), l2=param_float(params, "l2", lo=0.0))
        coef = param_array(params, "coef")
        if coef.size != cal.degree + 1:
            raise ValueError(f"polynomial of degree {cal.degree} needs {cal.degree + 1} coefficients")
        cal.coef = coef
        cal.fitted = True
        return cal
