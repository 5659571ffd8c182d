"""Tester ``"ldtc"``: lower distance to calibration by LP on binned data and the tolerant rule of Theorem 4.

The adapter bins the data and picks the resolution; the LP and the rule are in
:mod:`calmon.algorithms.ldtc`.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from calmon.algorithms.ldtc import (
    ldtc_grid,
    ldtc_null_pvalue,
    ldtc_tolerant,
    sample_resolution,
    theorem4_resolution,
    u_grid,
)
from calmon.stats.data import CalibrationData
from calmon.stats.grid import ScoreGrid

__all__ = ["ldtc_tester"]

#: Cells of the grid raw events are binned on.
_RAW_GRID_BINS = 4096


def ldtc_tester(data: CalibrationData, *, alpha: float, mc: int, rng: np.random.Generator,
                eps1: float | None = None, eps2: float = 0.0, C: float = 36.0, bins: int = 256,
                max_bins: int = 1024, grid_points: int = 101, max_grid: int = 401, min_eps1: float = 0.05,
                min_n: int = 20, null_mc: int = 99, null_bins: int = 16, null_points: int = 17,
                error_scale: float = 1.0) -> dict[str, Any]:
    """Tester ``ldtc``: dCE by LP on binned data, a null-simulation p-value, and the tolerant rule of Theorem 4.

    Raw data are first binned on a 4096-cell grid (or the data's own grid is used), then coarsened
    to ``bins`` cells (more if Theorem 4's resolution needs it, up to ``max_bins``).  Under the p-value rule
    the estimate decides nothing, so its LP is solved no finer than its sampling scale: cells and u-grid
    halved from that resolution while ``error_bound <= error_scale / sqrt(n)``
    (:func:`~calmon.algorithms.ldtc.sample_resolution`; 64 x 26 at n = 900, 128 x 51 up to n ~ 5,500, the
    resolution above beyond).  The p-value and the decision do not depend on it.

    Decision (the same rule as the ``smce`` tester, so the two answer the same question):

    * ``eps1`` given: the tolerant rule of Theorem 4 (``rule = "theorem4"``);
    * else, when ``min(mc, null_mc) > 0``: "miscalibrated" iff ``p_value < alpha`` (``rule = "p-value"``),
      the p-value of :func:`~calmon.algorithms.ldtc.ldtc_null_pvalue` (H0: perfect calibration);
    * else Theorem 4 with ``eps2 = 0`` and ``eps1 = max(sqrt(C/n), min_eps1)``, the smallest gap this
      sample can resolve (``rule = "theorem4-default"``).

    ``value``/``estimate``/``bounds`` always describe dCE at the LP resolution; ``threshold`` is the
    critical quantity of the rule used (Theorem 4's ``eps2 + (eps1 - eps2)/2``, or ``None`` for the p-value rule,
    whose statistic is the coarse ``null_statistic``).

    Parameters
    ----------
    data
        :class:`~calmon.stats.data.CalibrationData` with a grid and/or raw data.
    alpha, mc, rng
        Level of the p-value rule; null replicates (capped by ``null_mc``); generator.
    eps1, eps2, C
        Theorem 4 parameters.
    bins, max_bins
        LP cells (powers of two dividing the fine grid).
    grid_points, max_grid
        u-grid size: at least ``grid_points`` and ``6/(eps1 - eps2) + 1``, at most ``max_grid``.
    min_eps1
        Floor for the default ``eps1``.
    min_n
        Fewer events give "insufficient data".
    error_scale
        Under the p-value rule, the estimate's error bound may reach ``error_scale / sqrt(n)`` (``0``: the
        resolution above, as before #35.2).
    null_mc, null_bins, null_points
        Cap on the null replicates (raised to ``ceil(2/alpha)`` so that a rejection is possible; each one LP
        solve, ~0.5-1 ms warm-started; the simulation is curtailed once the p-value cannot fall below
        ``alpha``), cells and u-grid points of the p-value's statistic.

    Returns
    -------
    dict
        ``statistic`` (= ``estimate``), ``value`` (dCE^U of the binned data), ``bounds``, ``error_bound``,
        ``threshold``, ``p_value`` (None without simulation), ``null_statistic``, ``decision``, ``rule``,
        ``method``, ``eps1``, ``eps2``, ``bins``, ``u_points``.

    Examples
    --------
    >>> rng = np.random.default_rng(4)
    >>> z = rng.random(20000); y = (rng.random(20000) < z).astype(float)
    >>> res = ldtc_tester(CalibrationData(n=20000, z=z, y=y, raw_is_complete=True), alpha=0.05, mc=0, rng=rng)
    >>> res["decision"]
    'calibrated'
    """
    grid, source = _binned(data)
    n = grid.count
    out: dict[str, Any] = {"method": "ldtc", "p_value": None, "n": int(n), "source": source}
    explicit = eps1 is not None
    if eps1 is None:
        eps2 = 0.0
        eps1 = min(1.0, max(math.sqrt(C / max(n, 1)), min_eps1))
    if not 0.0 <= eps2 < eps1 <= 1.0:
        raise ValueError(f"Theorem 4 needs 0 <= eps2 < eps1 <= 1, got eps1={eps1}, eps2={eps2}")
    if n < min_n:
        out.update({"statistic": None, "value": None, "bounds": None, "threshold": eps2 + (eps1 - eps2) / 2,
                    "decision": "insufficient data", "eps1": eps1, "eps2": eps2})
        return out
    draws = min(int(mc), max(int(null_mc), math.ceil(2.0 / alpha)))  # at least enough to reject at alpha
    simulate = draws > 0 and grid.bins % null_bins == 0
    b, m = theorem4_resolution(eps1 - eps2, grid.bins, bins, max_bins, grid_points, max_grid)
    if simulate and not explicit and error_scale > 0:
        # the p-value decides: the estimate is shown, not tested, so no finer than its sampling scale (#35.2)
        b, m = sample_resolution(n, grid.bins, b, m, error_scale)
    res = ldtc_grid(grid, bins=b, u=u_grid(m))
    tol = ldtc_tolerant(res["estimate"], n, eps1, eps2, C, error_bound=res["error_bound"])
    out.update({"statistic": res["estimate"], "value": res["value"], "estimate": res["estimate"],
                "bounds": res["bounds"], "error_bound": res["error_bound"], "grid_error": res["grid_error"],
                "binning_error": res["binning_error"], "threshold": tol["threshold"],
                "decision": tol["decision"], "eps1": eps1, "eps2": eps2, "n_required": tol["n_required"],
                "bins": res["bins"], "u_points": m, "rule": "theorem4" if explicit else "theorem4-default"})
    if simulate:
        nul = ldtc_null_pvalue(grid, mc=draws, rng=rng, bins=null_bins, points=null_points, alpha=alpha)
        out.update({"p_value": nul["p_value"], "null_statistic": nul["statistic"], "mc": nul["mc_draws"],
                    "null_method": f"binomial/grid{nul['bins']}/u{nul['points']}"})
        if not explicit:
            out.update({"decision": "miscalibrated" if nul["p_value"] < alpha else "calibrated",
                        "rule": "p-value", "threshold": None})
    return out


def _binned(data: CalibrationData) -> tuple[ScoreGrid, str]:
    """Complete raw data (or a sample when there is no grid) binned on a fine grid, else the data's grid."""
    grid = data.grid
    if data.z is not None and data.y is not None and (data.raw_is_complete or grid is None):
        z = np.asarray(data.z, dtype=np.float64).ravel()
        y = np.asarray(data.y, dtype=np.float64).ravel()
        if z.shape != y.shape:
            raise ValueError("raw scores and outcomes differ in length")
        bad_z = z.size and (not np.all(np.isfinite(z)) or z.min() < 0 or z.max() > 1)
        if bad_z or not np.all((y == 0) | (y == 1)):
            raise ValueError("scores must lie in [0, 1] and outcomes in {0, 1}")
        binned = ScoreGrid(_RAW_GRID_BINS)
        binned.update(z, y)
        return binned, "raw"
    if grid is not None:
        if grid.channels is not None:
            raise ValueError("the ldtc tester needs a single-channel grid")
        return grid, f"grid{grid.bins}"
    raise ValueError("the ldtc tester needs raw scores/outcomes or a ScoreGrid")
