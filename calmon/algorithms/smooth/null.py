"""Null simulation of smCE under perfect calibration, and the tolerant rule of Theorem 3.

The simulation is curtailed (Besag and Clifford 1991): it stops once ``h = ceil(alpha (mc + 1))``
null statistics reached the observed one, since the full simulation could then no longer reject at
``alpha``.  The decision equals the full simulation's on the same draws (the level is unchanged) and
the reported p-value ``h / L`` after ``L`` draws is itself valid; a calibrated window typically
stops after ~``2 h`` draws instead of ``mc``.

References
----------
Hu, Tian, Yang. Testing Calibration in Subquadratic Time (2024): Theorem 3 and Lemma 12.
Besag, Clifford. Sequential Monte Carlo p-values. Biometrika 78(2), 301-304 (1991).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np

from calmon.algorithms.smooth.dp import check_raw, grid_points, smce_dp, smce_points
from calmon.stats.grid import ScoreGrid

__all__ = ["smce_null_pvalue", "smce_null_pvalue_grid", "smce_tolerant"]


# -- null simulation -------------------------------------------------------------------------------
def _mc_summary(observed: float, null: np.ndarray, alpha: float) -> dict[str, Any]:
    """Monte Carlo p-value ``(1 + #{T* >= T}) / (mc + 1)`` (tie tolerance 1e-12) and null quantiles."""
    tol = 1e-12 * max(1.0, abs(observed))
    qs = np.quantile(null, [0.5, 0.95, 0.99]).tolist()
    return {"statistic": float(observed), "p_value": float((1 + np.count_nonzero(null >= observed - tol))
                                                           / (null.size + 1)),
            "mc": int(null.size), "critical_value": float(np.quantile(null, 1.0 - alpha, method="higher")),
            "null_quantiles": dict(zip(("q50", "q95", "q99"), qs))}


def _simulate(observed: float, draw: Callable[[int], np.ndarray], mc: int, alpha: float, curtail: bool,
              chunk: int) -> dict[str, Any]:
    """Null statistics ``draw(k)`` in chunks until ``mc`` draws or, curtailed, ``h`` exceedances.

    Stopped after ``L < mc`` draws with ``h = ceil(alpha (mc + 1))`` exceedances the p-value is
    Besag and Clifford's ``h / L`` (> alpha, as the full simulation's would be); otherwise the usual
    ``(1 + G) / (mc + 1)``.  Draws computed past the stopping point are discarded.
    """
    tol = 1e-12 * max(1.0, abs(observed))
    h = math.ceil(alpha * (mc + 1)) if curtail else mc + 1
    parts: list[np.ndarray] = []
    done = exceed = 0
    while done < mc:
        vals = draw(min(chunk, mc - done))
        hits = exceed + np.cumsum(vals >= observed - tol)
        if hits[-1] >= h:
            vals = vals[: int(np.argmax(hits >= h)) + 1]
        parts.append(vals)
        done += vals.size
        exceed = int(hits[vals.size - 1])
        if exceed >= h:
            break
    null = np.concatenate(parts)
    out = _mc_summary(observed, null, alpha)
    if done < mc:
        out["p_value"] = h / done
    return {**out, "mc_requested": int(mc), "curtailed": bool(done < mc)}


def smce_null_pvalue(z: Any, y: Any, *, mc: int = 999, rng: np.random.Generator | None = None,
                     observed: float | None = None, alpha: float = 0.05, curtail: bool = True) -> dict[str, Any]:
    """Exact parametric-bootstrap p-value of smCE under perfect calibration: resample ``y* ~ Bern(z)``.

    Parameters
    ----------
    z, y
        Raw predictions and outcomes.
    mc
        Number of null replicates; cost ``mc`` DP solves of size n.
    rng
        Random generator.
    observed
        Precomputed smCE of (z, y), if available.
    alpha
        Level of the curtailing rule and of the reported critical value (the null's ``1 - alpha`` quantile).
    curtail
        Stop early once the p-value is surely above ``alpha`` (Besag-Clifford; same decision).

    Returns
    -------
    dict
        ``statistic``, ``p_value``, ``critical_value``, ``null_quantiles`` (50/95/99 %), ``mc`` (draws made),
        ``mc_requested`` and ``curtailed``.

    Examples
    --------
    >>> rng = np.random.default_rng(1)
    >>> z = rng.random(300); y = (rng.random(300) < z).astype(float)
    >>> res = smce_null_pvalue(z, y, mc=99, rng=rng)
    >>> 0.0 < res["p_value"] <= 1.0
    True
    """
    z, y = check_raw(z, y)
    if mc < 1:
        raise ValueError(f"mc must be a positive integer, got {mc}")
    rng = np.random.default_rng() if rng is None else rng
    order = np.argsort(z, kind="stable")
    zs = z[order]
    n = zs.size
    vu, start = np.unique(zs, return_index=True)
    obs = smce_points(z, y - z, n) if observed is None else float(observed)
    zsum = np.add.reduceat(zs, start)

    def draw(k: int) -> np.ndarray:
        out = np.empty(k)
        for b in range(k):
            ystar = (rng.random(n) < zs).astype(np.float64)
            out[b] = smce_dp(vu, (np.add.reduceat(ystar, start) - zsum) / n)
        return out

    return _simulate(obs, draw, mc, alpha, curtail, chunk=8)


def smce_null_pvalue_grid(grid: ScoreGrid, *, mc: int = 999, rng: np.random.Generator | None = None,
                          bins: int | None = 1024, point: str = "center", alpha: float = 0.05,
                          curtail: bool = True) -> dict[str, Any]:
    """Null-simulation p-value of binned smCE: per cell ``k* ~ Binomial(N, mean score)``.

    The statistic is the smCE of the (optionally coarsened) grid; each replicate redraws the
    cell's outcome count and keeps the cell's score sum.  The binomial variance
    ``N zbar (1 - zbar)`` is at least the exact null variance ``sum z (1 - z)``, which errs on
    the conservative side.

    Parameters
    ----------
    grid
        Single-channel :class:`ScoreGrid`.
    mc
        Number of replicates.
    rng
        Random generator.
    bins
        Resolution of the statistic (must divide ``grid.bins``; ``None`` keeps it): a coarser grid
        makes each replicate cheaper at a binning error of at most ``1/(2 bins)``.
    point
        Cell representative, see :func:`grid_points`.
    alpha
        Level of the curtailing rule and of the reported critical value.
    curtail
        Stop early once the p-value is surely above ``alpha`` (Besag-Clifford; same decision).

    Returns
    -------
    dict
        ``statistic``, ``p_value``, ``critical_value``, ``null_quantiles``, ``mc`` (draws made),
        ``mc_requested``, ``curtailed``, ``bins``.

    Examples
    --------
    >>> rng = np.random.default_rng(2)
    >>> z = rng.random(5000); y = (rng.random(5000) < z).astype(float)
    >>> g = ScoreGrid(4096); g.update(z, y)
    >>> res = smce_null_pvalue_grid(g, mc=99, rng=rng, bins=256)
    >>> 0.0 < res["p_value"] <= 1.0, res["bins"]
    (True, 256)
    """
    if mc < 1:
        raise ValueError(f"mc must be a positive integer, got {mc}")
    rng = np.random.default_rng() if rng is None else rng
    if bins is not None and bins < grid.bins:
        grid = grid.coarsen(bins)
    pts = grid_points(grid, point)
    v, total, cnt = pts["v"], pts["total"], pts["n"]
    order = np.argsort(v, kind="stable")
    v, r, cnt, pbar = v[order], pts["r"][order], cnt[order], np.clip(pts["p"][order], 0.0, 1.0)
    obs = smce_dp(v, r / total)
    zsum = pbar * cnt
    icnt = cnt.astype(np.int64)

    def draw(m: int) -> np.ndarray:
        counts = rng.binomial(icnt, pbar, size=(m, icnt.size))
        return np.array([smce_dp(v, (k - zsum) / total) for k in counts])

    # chunks of 32 draws: small enough to stop soon after h exceedances, large enough to vectorise the draws
    return {**_simulate(obs, draw, mc, alpha, curtail, chunk=32), "bins": grid.bins}


# -- tolerant tester (Theorem 3) -------------------------------------------------------------------
def smce_tolerant(beta: float, n: int, eps1: float, eps2: float = 0.0, C: float = 64.0,
                  error_bound: float = 0.0) -> dict[str, Any]:
    """Decision of the (eps1, eps2)-tolerant tester of Theorem 3 from an smCE estimate ``beta``.

    ``alpha = eps1/2 - 2 eps2``; answer "calibrated" iff ``beta <= 2 eps2 + alpha/2``.  Needs
    ``eps1 > 4 eps2`` and ``n >= C / (eps1 - 4 eps2)^2`` ("insufficient data" otherwise).  The paper
    leaves ``C`` unspecified; the default 64 makes ``alpha/4 = (eps1 - 4 eps2)/8 >= 1/sqrt(n)``,
    about the 99.9th percentile of the null smCE (0.35/sqrt(n) median, 1.1/sqrt(n) at 99 %).

    Parameters
    ----------
    beta
        smCE estimate (exact empirical value, or a binned value).
    n
        Number of samples behind ``beta``.
    eps1, eps2
        Far / close thresholds on dCE, ``0 <= eps2``, ``eps1 > 4 eps2``.
    C
        Sample-size constant.
    error_bound
        Known estimation error of ``beta`` (binning); it must stay below ``alpha/4`` (else
        "insufficient data").

    Returns
    -------
    dict
        ``decision``, ``threshold``, ``alpha``, ``n_required``.

    Examples
    --------
    >>> smce_tolerant(0.01, 100000, eps1=0.1)["decision"]
    'calibrated'
    >>> smce_tolerant(0.06, 100000, eps1=0.1)["decision"]
    'miscalibrated'
    >>> smce_tolerant(0.01, 100, eps1=0.1)["decision"]
    'insufficient data'

    References
    ----------
    Hu, Tian, Yang (2024), Theorem 3 and Lemma 12.
    """
    if not (0.0 <= eps2 and eps1 <= 1.0):
        raise ValueError(f"need 0 <= eps2 and eps1 <= 1, got eps1={eps1}, eps2={eps2}")
    if not eps1 > 4.0 * eps2:
        raise ValueError(f"Theorem 3 needs eps1 > 4 eps2, got eps1={eps1}, eps2={eps2} (use the ldtc tester)")
    if C <= 0:
        raise ValueError(f"C must be positive, got {C}")
    alpha_t = eps1 / 2.0 - 2.0 * eps2
    threshold = 2.0 * eps2 + alpha_t / 2.0
    n_req = int(math.ceil(C / (eps1 - 4.0 * eps2) ** 2 - 1e-9))
    if n < n_req or error_bound > alpha_t / 4.0:
        decision = "insufficient data"
    else:
        decision = "calibrated" if beta <= threshold else "miscalibrated"
    return {"decision": decision, "threshold": threshold, "alpha": alpha_t, "n_required": n_req}
