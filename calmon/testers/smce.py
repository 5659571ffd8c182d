"""Tester ``"smce"``: exact smooth calibration error, a null-simulation p-value and Theorem 3's tolerant rule.

The adapter picks the data (complete raw events, else the fine grid), the null simulation and the
decision rule; the algorithms are in :mod:`calmon.algorithms.smooth`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from calmon.algorithms.smooth import smce_null_pvalue, smce_null_pvalue_grid, smce_tolerant, smce_witness
from calmon.algorithms.smooth.dp import check_raw, check_single_grid, smce_grid, smce_points
from calmon.stats.data import CalibrationData
from calmon.stats.grid import ScoreGrid

__all__ = ["smce_tester"]

#: Cells of the grid built from raw events when no usable grid is given.
_RAW_GRID_BINS = 4096


@dataclass(frozen=True)
class _Estimate:
    """smCE of the data the tester uses: raw events (exact) or a grid (with its binning-error bound)."""

    value: float
    error_bound: float
    n: int
    source: str
    raw: tuple[np.ndarray, np.ndarray] | None
    grid: ScoreGrid | None

    def grid_or_binned(self) -> ScoreGrid:
        """The grid, or the raw events binned on a fine grid."""
        if self.grid is not None and self.grid.channels is None:
            return self.grid
        if self.raw is None:
            raise ValueError("the smce tester needs raw scores/outcomes or a ScoreGrid")
        g = ScoreGrid(_RAW_GRID_BINS)
        g.update(self.raw[0], self.raw[1])
        return g


def smce_tester(data: CalibrationData, *, alpha: float, mc: int, rng: np.random.Generator,
                eps1: float | None = None, eps2: float = 0.0, C: float = 64.0, null_bins: int = 256,
                null_mc: int = 199, raw_null_max: int = 2000, min_n: int = 20, point: str = "center",
                witness: bool = False, curtail: bool = True) -> dict[str, Any]:
    """Tester ``smce``: exact smCE, null-simulation p-value, and the Theorem 3 tolerant rule.

    Value: exact empirical smCE of the raw data when complete raw data is given, else of the fine
    grid (with its binning-error bound).  p-value (H0: perfectly calibrated): from raw data with
    ``n <= raw_null_max`` the exact resampling ``y* ~ Bern(z)``; otherwise the per-cell binomial
    null on the grid coarsened to ``null_bins``; at most ``min(mc, null_mc)`` draws (a Monte Carlo test
    with ``R`` draws has level exactly ``alpha`` whenever ``alpha (R + 1)`` is an integer -- 10 exceedances
    at R = 199 -- whatever ``R``; more draws only sharpen the p-value, Hope 1968), curtailed
    (Besag-Clifford: it stops once it can no longer reject, the same decision as all draws; ``mc``
    reports the draws made).  The defaults (256 cells, 199 draws) cost ~5 % of the former 1024 cells and
    ``evaluation.mc`` = 1000 draws on a miscalibrated window, with the level unchanged and the power
    within Monte Carlo error (docs/statistics/fast-nulls.md).
    Decision: without ``eps1`` "miscalibrated" iff
    ``p < alpha``; with ``eps1`` the tolerant rule of Theorem 3 (:func:`smce_tolerant`); with
    ``mc = 0`` and no ``eps1``, Theorem 3 with ``eps2 = 0`` and ``eps1 = sqrt(C/n)`` (threshold
    ``eps1/4 = 2/sqrt(n)`` for C = 64, above the null's 99.9th percentile).

    Parameters
    ----------
    data
        :class:`~calmon.stats.data.CalibrationData` (raw ``z``/``y`` and/or ``grid``).
    alpha
        Significance level of the p-value decision.
    mc
        Null replicates (0 skips the p-value).
    rng
        Random generator.
    eps1, eps2, C
        Tolerant-tester parameters (Theorem 3); ``eps1=None`` uses the p-value decision.
    null_bins
        Resolution of the binned null statistic (cells; binning moves it by at most ``1/(2 null_bins)``).
    null_mc
        Cap on the null draws (raised to ``ceil(2/alpha)`` so that a rejection stays possible).
    raw_null_max
        Largest raw sample resampled event by event.
    min_n
        Fewer events give "insufficient data".
    point
        Cell representative for grids.
    witness
        Also return the witness function (LP solve on the grid cells or raw points).
    curtail
        Stop the null simulation early when it cannot reject any more (``False``: all ``mc`` draws).

    Returns
    -------
    dict
        ``statistic`` (= ``value``), ``bounds``, ``error_bound``, ``threshold``, ``p_value``, ``decision``,
        ``method``, ``source``, ``n``, ``mc``, ``null_quantiles``; with ``witness`` also ``witness``.

    Examples
    --------
    >>> rng = np.random.default_rng(3)
    >>> z = rng.random(500); y = (rng.random(500) < z).astype(float)
    >>> data = CalibrationData(n=500, z=z, y=y, raw_is_complete=True)
    >>> res = smce_tester(data, alpha=0.05, mc=99, rng=rng)
    >>> res["decision"] in ("calibrated", "miscalibrated"), res["source"]
    (True, 'raw')
    """
    est = _estimate(data, point)
    value, err, n = est.value, est.error_bound, est.n
    out: dict[str, Any] = {"method": "smce", "p_value": None, "threshold": None, "mc": 0}
    out.update({"statistic": value, "value": value, "error_bound": err, "n": n, "source": est.source,
                "bounds": [max(0.0, value - err), value + err]})
    if n < min_n:
        out["decision"] = "insufficient data"
        return out
    if mc > 0:
        draws = min(int(mc), max(int(null_mc), math.ceil(2.0 / alpha)))
        out.update(_null(est, alpha, draws, rng, null_bins, raw_null_max, point, curtail))
    if eps1 is not None:
        tol = smce_tolerant(value, n, eps1, eps2, C, error_bound=err)
        out.update({"threshold": tol["threshold"], "decision": tol["decision"], "eps1": eps1, "eps2": eps2,
                    "n_required": tol["n_required"], "rule": "theorem3"})
    elif out["p_value"] is not None:
        out["decision"] = "miscalibrated" if out["p_value"] < alpha else "calibrated"
        out["rule"] = "p-value"
        out["threshold"] = out["critical_value"]
    else:  # no simulation asked for: Theorem 3 with eps2 = 0 and the smallest eps1 this n supports
        e1 = min(1.0, math.sqrt(C / n))
        tol = smce_tolerant(value, n, e1, 0.0, C, error_bound=err)
        out.update({"threshold": tol["threshold"], "decision": tol["decision"], "eps1": e1, "eps2": 0.0,
                    "n_required": tol["n_required"], "rule": "theorem3-default"})
    if witness:
        out["witness"] = _witness(est, point)
    return out


def _estimate(data: CalibrationData, point: str) -> _Estimate:
    """Exact smCE of complete raw data (or of a sample when there is no grid), else of the grid."""
    if data.z is not None and data.y is not None and (data.raw_is_complete or data.grid is None):
        z, y = check_raw(data.z, data.y)
        return _Estimate(smce_points(z, y - z, z.size), 0.0, int(z.size), "raw", (z, y), data.grid)
    if data.grid is not None:
        check_single_grid(data.grid)
        res = smce_grid(data.grid, point=point)
        return _Estimate(res["value"], res["error_bound"], int(data.grid.count), f"grid{data.grid.bins}", None,
                         data.grid)
    raise ValueError("the smce tester needs raw scores/outcomes or a ScoreGrid")


def _null(est: _Estimate, alpha: float, mc: int, rng: np.random.Generator, null_bins: int, raw_null_max: int,
          point: str, curtail: bool) -> dict[str, Any]:
    """p-value fields: exact Bernoulli resampling of a small raw sample, else the binomial grid null."""
    out: dict[str, Any] = {}
    if est.raw is not None and est.raw[0].size <= raw_null_max:
        nul = smce_null_pvalue(est.raw[0], est.raw[1], mc=mc, rng=rng, observed=est.value, alpha=alpha,
                               curtail=curtail)
        out["null_method"] = "bernoulli"
    else:
        g = est.grid_or_binned()
        nb = null_bins if g.bins % null_bins == 0 else None
        nul = smce_null_pvalue_grid(g, mc=mc, rng=rng, bins=nb, point=point, alpha=alpha, curtail=curtail)
        out["null_method"] = f"binomial/grid{nul['bins']}"
        out["null_statistic"] = nul["statistic"]
    out.update({"p_value": nul["p_value"], "mc": nul["mc"], "mc_requested": nul["mc_requested"],
                "curtailed": nul["curtailed"], "null_quantiles": nul["null_quantiles"],
                "critical_value": nul["critical_value"]})
    return out


def _witness(est: _Estimate, point: str) -> dict[str, list[float]]:
    """Witness ``w`` by an LP on the raw points (up to 20,000 distinct scores) or on 256 grid cells."""
    if est.raw is not None and np.unique(est.raw[0]).size <= 20000:
        wit = smce_witness(est.raw[0], est.raw[1])
    else:
        g = est.grid if est.grid is not None else est.grid_or_binned()
        wit = smce_witness(grid=g.coarsen(256) if g.bins % 256 == 0 else g, point=point)
    return {"points": wit["points"].tolist(), "w": wit["w"].tolist()}
