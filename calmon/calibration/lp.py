"""The ``lp`` calibrator: Algorithm 2 of Bairaktari & Nguyen (multiclass calibration under the
probability-weighted l_p error), fitted from raw arrays or from level-set statistics.

The fitted map is a table: the resolution ``lambda``, the heavy level sets (integer keys), the
group of each heavy level set and one probability vector per group.  Predictions in light level
sets become ``rho(R(f(x)))`` (the paper) or stay ``f(x)`` (``passthrough=True``).  See
:mod:`calmon.algorithms.multiclass_lp` for the algorithm and its diagnostics.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from calmon.algorithms.multiclass_lp import LevelSetMap, LPFit, fit_lp, fit_lp_raw
from calmon.calibration.base import Calibrator, CalibratorError
from calmon.calibration.params import check_multiclass, param_float

#: Diagnostics copied into ``training`` (and the document) after a fit.
SUMMARY_KEYS = ("eps", "p", "delta", "beta", "lam", "heavy_bins", "groups", "iterations", "iteration_cap",
                "merges", "piece_merges", "stopped", "max_error_estimate", "skipped_groups", "pools",
                "pools_needed", "pools_shared", "samples_used", "overflow_events", "budget_ratio",
                "squared_error_bound", "bins_observed", "heavy_mass_phase1", "noise", "seed")


def _parse_p(p: Any) -> float:
    if isinstance(p, str):
        if p.strip().lower() in ("inf", "infinity", "+inf"):
            return math.inf
        try:
            p = float(p)
        except ValueError:
            raise ValueError(f"p must be a number > 1 or 'inf', got {p!r}") from None
    if isinstance(p, bool) or not isinstance(p, (int, float)) or not p > 1:
        raise ValueError(f"p must be a number > 1 or 'inf', got {p!r}")
    return float(p)


class LPCalibrator(Calibrator):
    """Multiclass recalibration with Err_p(h) <= eps (Algorithm 2), by level-set binning.

    Parameters
    ----------
    eps
        Target probability-weighted l_p calibration error.
    p
        Exponent > 1, or ``"inf"`` / ``math.inf`` (largest cell error).
    delta
        Failure probability (enters the reported Theorem 7 sample budget).
    pools
        Sample pools for raw fits (default: the number Algorithm 2 needs; 1 = no sample splitting).
    noise
        Laplace noise on the piece estimates (Lemma 9), seeded by ``seed``.
    seed
        Seed of the noise.
    max_iter
        Iteration cap (default Lemma 14's bound).
    passthrough
        Keep ``f(x)`` in light level sets instead of ``rho(R(f(x)))``.
    lam
        Override ``lambda = ceil(1/beta)``.
    salt
        Salt of the pool-routing hash.

    Examples
    --------
    >>> import json
    >>> import numpy as np
    >>> rng = np.random.default_rng(0)
    >>> q = rng.dirichlet([20, 20, 20], size=20000)
    >>> y = (rng.random(20000)[:, None] > np.cumsum(q, axis=1)).sum(axis=1)
    >>> f = np.exp(np.log(q) / 2 + [-1, 0, 1]); f /= f.sum(1, keepdims=True)   # T = 2 and a bias
    >>> cal = LPCalibrator(eps=0.05).fit(f, y)
    >>> cal.training["stopped"], cal.predict(f[:2]).shape
    ('converged', (2, 3))
    >>> from calmon.calibration import from_document
    >>> back = from_document(json.loads(json.dumps(cal.to_document())))
    >>> bool(np.allclose(back.predict(f), cal.predict(f)))
    True

    References
    ----------
    Bairaktari, Nguyen. Multiclass calibration under the probability-weighted l_p error (seed 000):
    Algorithm 2 and Theorem 7.
    """

    method = "lp"
    kind = "multiclass"

    def __init__(self, eps: float = 0.1, p: float | str = "inf", delta: float = 0.05,
                 pools: int | None = None, noise: bool = False, seed: int = 0, max_iter: int | None = None,
                 passthrough: bool = False, lam: int | None = None, salt: int = 0) -> None:
        super().__init__()
        if not 0.0 < float(eps) < 1.0:
            raise ValueError(f"eps must lie in (0, 1), got {eps}")
        if not 0.0 < float(delta) < 1.0:
            raise ValueError(f"delta must lie in (0, 1), got {delta}")
        for name, v in (("pools", pools), ("max_iter", max_iter), ("lam", lam)):
            if v is not None and (isinstance(v, bool) or int(v) != v or v < 1):
                raise ValueError(f"{name} must be a positive integer or None, got {v!r}")
        self.eps = float(eps)
        self.p = _parse_p(p)
        self.delta = float(delta)
        self.pools = None if pools is None else int(pools)
        self.noise = bool(noise)
        self.seed = int(seed)
        self.max_iter = None if max_iter is None else int(max_iter)
        self.passthrough = bool(passthrough)
        self.lam = None if lam is None else int(lam)
        self.salt = int(salt)
        self.map: LevelSetMap | None = None
        self.diagnostics: dict[str, Any] = {}

    def _options(self) -> dict[str, Any]:
        return {"noise": self.noise, "seed": self.seed, "max_iter": self.max_iter,
                "passthrough": self.passthrough, "lam": self.lam}

    def _finish(self, fit: LPFit, source: str) -> LPCalibrator:
        self.map = fit.map
        self.diagnostics = fit.diagnostics
        self.classes = int(fit.diagnostics["classes"])
        self.fitted = True
        summary = {k: fit.diagnostics[k] for k in SUMMARY_KEYS}
        summary["budget_total"] = fit.diagnostics["budget"]["total"]
        self.training = {"n": int(fit.diagnostics["samples_used"]), "source": source, **summary}
        return self

    def fit(self, x: np.ndarray, y: np.ndarray, sample_weight: np.ndarray | None = None,
            ids: Any = None) -> LPCalibrator:
        """Fit on probabilities ``x`` (n, K) and class indices ``y`` (optional event ``ids`` route pools)."""
        if sample_weight is not None:
            raise ValueError("the lp calibrator does not take sample weights")
        p, lab = check_multiclass(x, y)
        if p.shape[0] < 2:
            raise ValueError("the lp calibrator needs at least 2 labeled rows")
        fit = fit_lp_raw(p, lab, self.eps, self.p, self.delta, ids=ids, pools=self.pools, salt=self.salt,
                         **self._options())
        return self._finish(fit, "raw")

    def fit_levelset(self, stats: Any) -> LPCalibrator:
        """Fit on :class:`calmon.stats.levelset.LevelSetStats` (lambda: a multiple of ceil(1/beta))."""
        fit = fit_lp(stats, self.eps, self.p, self.delta, **self._options())
        return self._finish(fit, "levelset")

    def fit_data(self, data: Any) -> LPCalibrator:
        """Use the window's level-set statistics when present, else raw multiclass arrays."""
        if getattr(data, "levelset", None) is not None:
            self.fit_levelset(data.levelset)
        elif data.probs is not None and data.labels is not None:
            self.fit(data.probs, data.labels)
            self.training["source"] = "raw" if data.raw_is_complete else "reservoir"
        else:
            raise ValueError("calibrator 'lp' needs level-set statistics or multiclass probabilities and "
                             "labels")
        self.training["window_n"] = int(data.n)
        return self

    def predict(self, x: np.ndarray) -> np.ndarray:
        """Calibrated probabilities, shape (n, K)."""
        self._check_fitted()
        p, _ = check_multiclass(x)
        if self.classes is not None and p.shape[1] != self.classes:
            raise ValueError(f"calibrator was fitted on {self.classes} classes, got {p.shape[1]}")
        assert self.map is not None
        return self.map.predict(p)

    def get_params(self) -> dict[str, Any]:
        self._check_fitted()
        assert self.map is not None
        return {"eps": self.eps, "p": "inf" if math.isinf(self.p) else self.p, "delta": self.delta,
                "pools": self.pools, "noise": self.noise, "seed": self.seed, "max_iter": self.max_iter,
                "passthrough": self.passthrough, "lam_override": self.lam, "salt": self.salt,
                "classes": self.classes, "map": self.map.to_params()}

    @classmethod
    def from_params(cls, params: dict[str, Any]) -> LPCalibrator:
        try:
            cal = cls(eps=param_float(params, "eps", lo=0.0, hi=1.0), p=params.get("p", "inf"),
                      delta=param_float(params, "delta", lo=0.0, hi=1.0), pools=params.get("pools"),
                      noise=bool(params.get("noise", False)), seed=int(params.get("seed", 0)),
                      max_iter=params.get("max_iter"), passthrough=bool(params.get("passthrough", False)),
                      lam=params.get("lam_override"), salt=int(params.get("salt", 0)))
        except (TypeError, ValueError) as exc:
            raise CalibratorError(f"invalid lp parameters: {exc}") from exc
        m = params.get("map")
        if not isinstance(m, dict):
            raise CalibratorError("lp parameters need a 'map' object")
        cal.map = LevelSetMap.from_params(m)
        classes = params.get("classes")
        if isinstance(classes, bool) or not isinstance(classes, int) or classes < 2:
            raise CalibratorError(f"parameter 'classes' must be an integer >= 2, got {classes!r}")
        if cal.map.classes != classes:
            raise CalibratorError("map keys disagree with 'classes'")
        cal.classes = classes
        cal.fitted = True
        return cal
