"""Temperature scaling of multiclass probability vectors, from raw data or a reservoir sample.

``softmax(log p / T)``: one parameter ``T > 0`` fitted by maximum likelihood (the NLL is convex in
``1 / T``, so the stationary point is found by a bracketed root search on its derivative).  The
logits are recovered from the probabilities as ``log max(p, eps)`` (softmax is invariant to the
per-row constant), so the calibrator works on stored probabilities.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from scipy import optimize, special

from calmon.calibration.base import Calibrator
from calmon.calibration.params import check_multiclass, param_float

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


class TemperatureCalibrator(Calibrator):
    """Temperature scaling ``softmax(log p / T)`` for K-class probabilities.

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

    References
    ----------
    Guo, Pleiss, Sun, Weinberger, "On calibration of modern neural networks", ICML 2017, Section 4.2.
    """

    method = "temperature"
    kind = "multiclass"

    def __init__(self, t_min: float = 0.01, t_max: float = 100.0) -> None:
        super().__init__()
        if not 0 < t_min < t_max < np.inf:
            raise ValueError(f"need 0 < t_min < t_max < inf, got {t_min}, {t_max}")
        self.t_min, self.t_max = float(t_min), float(t_max)
        self.temperature = 1.0

    def fit(self, x: np.ndarray, y: np.ndarray, sample_weight: np.ndarray | None = None) -> TemperatureCalibrator:
        """Fit on probabilities ``x`` (n, K) and class indices ``y``."""
        if sample_weight is not None:
            raise ValueError("temperature scaling does not take sample weights")
        p, lab = check_multiclass(x, y)
        if p.shape[0] == 0:
            raise ValueError("cannot fit temperature scaling on an empty sample")
        logits = _logits(p)
        lo, hi = 1.0 / self.t_max, 1.0 / self.t_min

        def g(b: float) -> float:
            return temperature_nll(b, logits, lab)[1]

        glo, ghi = g(lo), g(hi)
        if glo >= 0:
            beta = lo
        elif ghi <= 0:
            beta = hi
        else:
            beta = optimize.brentq(g, lo, hi, xtol=1e-14, rtol=1e-12, maxiter=200)
        self.temperature = float(1.0 / beta)
        self.classes = int(p.shape[1])
        self.fitted = True
        self.training = {"n": int(p.shape[0]), "source": "raw"}
        return self

    def predict(self, x: np.ndarray) -> np.ndarray:
        """Rescaled probabilities, shape (n, K)."""
        self._check_fitted()
        p, _ = check_multiclass(x)
        if self.classes is not None and p.shape[1] != self.classes:
            raise ValueError(f"calibrator was fitted on {self.classes} classes, got {p.shape[1]}")
        return special.softmax(_logits(p) / self.temperature, axis=1)

    def get_params(self) -> dict[str, Any]:
        return {"temperature": self.temperature, "t_min": self.t_min, "t_max": self.t_max}

    @classmethod
    def from_params(cls, params: dict[str, Any]) -> TemperatureCalibrator:
        cal = cls(t_min=param_float(params, "t_min", lo=1e-300), t_max=param_float(params, "t_max", lo=1e-300))
        cal.temperature = param_float(params, "temperature", lo=cal.t_min, hi=cal.t_max)
        cal.fitted = True
        return cal
