"""Temperature scaling of multiclass probability vectors and of binary or top-label scores.

Multiclass: ``softmax(log p / T)``; binary and top-label scores: ``sigmoid(logit(z) / T)``, the same map on the
two-class logit (Guo et al. 2017 define it on the logits, of which a binary score has one). One parameter
``T > 0`` fitted by maximum likelihood: the NLL is convex in ``beta = 1 / T``, so the stationary point is found by a
bracketed root search on its derivative. The logits are recovered from stored probabilities (``log max(p, eps)``,
softmax being invariant to a per-row constant; ``logit`` of scores clipped to ``[eps, 1 - eps]``). Binary scores can
also be fitted from binned statistics (the weighted likelihood of the cells' mean scores, like Platt's).
"""

from __future__ import annotations

from typing import Any

import numpy as np
from scipy import optimize, special

from calmon.calibration.base import Calibrator
from calmon.calibration.params import check_binary, check_multiclass, param_choice, param_float
from calmon.calibration.platt import logit
from calmon.stats.data import CalibrationData

LOG_EPS = 1e-12


def _logits(p: np.ndarray) -> np.ndarray:
    return np.log(np.maximum(p, LOG_EPS))


def temperature_nll(beta: float, logits: np.ndarray, labels: np.ndarray) -> tuple[float, float]:
    """Mean NLL of ``softmax(beta * logits)`` and its derivative in ``beta``."""
    z = beta * logits
    lse = special.logsumexp(z, axis=1)
    rows = np.arange(labels.size)
    q = np.exp(z - lse[:, None])
    nll = float(np.mean(lse - z[rows, labels]))
    grad = float(np.mean((q * logits).sum(axis=1) - logits[rows, labels]))
    return nll, grad


def binary_temperature_nll(beta: float, u: np.ndarray, t: np.ndarray, w: np.ndarray) -> tuple[float, float]:
    """Weighted mean NLL of ``sigmoid(beta * u)`` against fractional targets ``t`` and its derivative in ``beta``."""
    eta = beta * u
    nll = float(np.sum(w * (np.logaddexp(0.0, eta) - t * eta)) / np.sum(w))
    grad = float(np.sum(w * (special.expit(eta) - t) * u) / np.sum(w))
    return nll, grad


class TemperatureCalibrator(Calibrator):
    """Temperature scaling: ``softmax(log p / T)`` for K-class probabilities, ``sigmoid(logit(z) / T)`` for scores.

    The kind follows the data it is fitted on: probabilities (n, K) make a multiclass calibrator, scores (n,) a
    binary one (binary or top-label scores). ``T > 1`` pulls over-confident scores towards the middle.

    Parameters
    ----------
    t_min, t_max
        Search interval for ``T`` (the fit is clipped to it).

    Examples
    --------
    >>> import numpy as np
    >>> rng = np.random.default_rng(0); n, k = 5000, 4
    >>> logits = 2.0 * rng.normal(size=(n, k))
    >>> true = np.exp(logits) / np.exp(logits).sum(1, keepdims=True)
    >>> labels = (rng.uniform(size=(n, 1)) > true.cumsum(1)).sum(1)
    >>> over = np.exp(3 * logits) / np.exp(3 * logits).sum(1, keepdims=True)  # over-confident by 3x
    >>> round(TemperatureCalibrator().fit(over, labels).temperature, 0)
    3.0
    >>> z = rng.uniform(0.02, 0.98, 20000)
    >>> y = (rng.uniform(size=z.size) < z).astype(float)
    >>> sharp = special.expit(2 * logit(z))  # a binary model over-confident by 2x on the logit
    >>> cal = TemperatureCalibrator().fit(sharp, y)
    >>> cal.kind, round(cal.temperature, 1)
    ('binary', 2.0)

    References
    ----------
    Guo, Pleiss, Sun, Weinberger, "On calibration of modern neural networks", ICML 2017, Section 4.2.
    """

    method = "temperature"
    kind = "multiclass"
    kinds = ("binary", "multiclass")

    def __init__(self, t_min: float = 0.01, t_max: float = 100.0) -> None:
        super().__init__()
        if not 0 < t_min < t_max < np.inf:
            raise ValueError(f"need 0 < t_min < t_max < inf, got {t_min}, {t_max}")
        self.t_min, self.t_max = float(t_min), float(t_max)
        self.temperature = 1.0

    def fit(self, x: np.ndarray, y: np.ndarray, sample_weight: np.ndarray | None = None) -> TemperatureCalibrator:
        """Fit on probabilities ``x`` (n, K) and class indices ``y``, or on scores ``x`` (n,) and labels in {0, 1}."""
        if np.ndim(x) == 1:
            z, yy, w = check_binary(x, y, sample_weight)
            if z.size == 0:
                raise ValueError("cannot fit temperature scaling on an empty sample")
            return self._fit_binary(logit(z), yy, np.ones_like(z) if w is None else w, int(z.size), "raw")
        if sample_weight is not None:
            raise ValueError("temperature scaling of probabilities does not take sample weights")
        p, lab = check_multiclass(x, y)
        if p.shape[0] == 0:
            raise ValueError("cannot fit temperature scaling on an empty sample")
        logits = _logits(p)
        self.temperature = self._solve(lambda b: temperature_nll(b, logits, lab)[1])
        self.kind = "multiclass"
        self.classes = int(p.shape[1])
        self.fitted = True
        self.training = {"n": int(p.shape[0]), "source": "raw"}
        return self

    def fit_grid(self, grid: Any) -> TemperatureCalibrator:
        """Binary temperature from a single-channel :class:`~calmon.stats.grid.ScoreGrid` (cells' mean scores)."""
        if getattr(grid, "channels", None) is not None:
            raise ValueError("temperature scaling from a grid needs a single-channel grid")
        n = grid.n
        keep = n > 0
        if not keep.any():
            raise ValueError("cannot fit temperature scaling on an empty grid")
        zbar = grid.sum_z[keep] / n[keep]
        t = np.clip(grid.sum_y[keep] / n[keep], 0.0, 1.0)
        self._fit_binary(logit(zbar), t, n[keep].astype(np.float64), int(n.sum()), "grid")
        self.training["bins"] = int(grid.bins)
        return self

    def fit_data(self, data: CalibrationData) -> TemperatureCalibrator:
        """Multiclass when the data carry probabilities and labels, else binary (raw, grid or reservoir)."""
        self.kind = "multiclass" if data.probs is not None and data.labels is not None else "binary"
        super().fit_data(data)
        return self

    def _fit_binary(self, u: np.ndarray, t: np.ndarray, w: np.ndarray, n: int, source: str) -> TemperatureCalibrator:
        self.temperature = self._solve(lambda b: binary_temperature_nll(b, u, t, w)[1])
        self.kind = "binary"
        self.classes = 2
        self.fitted = True
        self.training = {"n": n, "source": source}
        return self

    def _solve(self, g: Any) -> float:
        """``T = 1 / beta`` where the NLL's derivative ``g(beta)`` is zero, clipped to ``[t_min, t_max]``."""
        lo, hi = 1.0 / self.t_max, 1.0 / self.t_min
        glo, ghi = g(lo), g(hi)
        if glo >= 0:
            beta = lo
        elif ghi <= 0:
            beta = hi
        else:
            beta = optimize.brentq(g, lo, hi, xtol=1e-14, rtol=1e-12, maxiter=200)
        return float(1.0 / beta)

    def predict(self, x: np.ndarray) -> np.ndarray:
        """Rescaled probabilities, shape (n, K), or rescaled scores, shape (n,), as fitted."""
        self._check_fitted()
        if self.kind == "binary":
            z, _, _ = check_binary(x)
            return np.asarray(special.expit(logit(z) / self.temperature))
        p, _ = check_multiclass(x)
        if self.classes is not None and p.shape[1] != self.classes:
            raise ValueError(f"calibrator was fitted on {self.classes} classes, got {p.shape[1]}")
        return special.softmax(_logits(p) / self.temperature, axis=1)

    def get_params(self) -> dict[str, Any]:
        return {"temperature": self.temperature, "t_min": self.t_min, "t_max": self.t_max, "kind": self.kind}

    @classmethod
    def from_params(cls, params: dict[str, Any]) -> TemperatureCalibrator:
        cal = cls(t_min=param_float(params, "t_min", lo=1e-300), t_max=param_float(params, "t_max", lo=1e-300))
        cal.temperature = param_float(params, "temperature", lo=cal.t_min, hi=cal.t_max)
        # documents written before binary temperature scaling carry no kind: they are multiclass
        cal.kind = param_choice({"kind": params.get("kind", "multiclass")}, "kind", cls.kinds)
        cal.classes = 2 if cal.kind == "binary" else cal.classes
        cal.fitted = True
        return cal
