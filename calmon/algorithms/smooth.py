"""Exact empirical smooth calibration error (smCE) and its tolerant / null-simulation testers.

The empirical smCE of predictions ``v`` with outcomes ``y`` is the value of the chain linear program
(paper eq. 11 restricted to adjacent constraints by Lemma 7)::

    smCE = max_{x in [-1, 1]^n} sum_i c_i x_i   s.t. |x_{i+1} - x_i| <= v_{i+1} - v_i,
    c_i = (y_i - v_i) / n,  v sorted.

The paper solves it approximately in O(n log n / eps).  Here it is solved *exactly* in O(n log n) by
the dual dynamic program of the spec (``shared/specs/smooth-calibration.md``): with ``C_i`` the
cumulative residual sums and ``d_i = v_{i+1} - v_i``,

    smCE = min_{z_0 = 0, z_n = C_n} sum_i |z_i - z_{i-1}| + sum_{i<n} d_i |z_i - C_i|.

The convex piecewise-linear cost-to-come ``F_i`` always has slope -1 left of its breakpoints and +1
right of them (total breakpoint weight 2).  A step adds ``d_i |z - C_i|`` (one breakpoint of weight
``2 d_i``) and then takes the infimal convolution with ``|.|`` -- which removes weight ``d_i`` from
each outer end.  ``F`` is stored as its left intercept plus the breakpoint weights (a list indexed
by the breakpoint's rank among all positions, known in advance), with a min-heap for the left end
and a max-heap for the right end split at the initial kink; removing weight ``r`` at position ``p``
from the left lowers the intercept by ``r p``.  Each step does one push and amortised O(1) pops.

The same DP serves weighted points (e.g. the cells of a :class:`~calmon.stats.grid.ScoreGrid`, each
with its exact residual sum ``sum y - sum z``): ties merge, only ``c`` changes.

References
----------
Hu, Tian, Yang. Testing Calibration in Subquadratic Time (2024): Definition 3 (smCE), eq. (11)
(empirical LP), Lemma 7 (adjacent constraints suffice), Lemma 12 (dCE/2 <= smCE <= 2 dCE),
Theorem 3 (tolerant tester).  Blasiok, Gopalan, Hu, Nakkiran. A unifying theory of distance from
calibration (STOC 2023) -- smooth calibration error.
"""

from __future__ import annotations

import heapq
import math
from typing import Any

import numpy as np
from scipy import sparse
from scipy.optimize import linprog

from calmon.stats.grid import ScoreGrid
from calmon.testers import CalibrationData, register_tester

__all__ = [
    "smce", "smce_points", "smce_grid", "grid_points", "smce_chain_lp", "smce_pairwise_lp", "smce_witness",
    "smce_null_pvalue", "smce_null_pvalue_grid", "smce_tolerant", "smce_tester",
]

#: Largest number of distinct points accepted by the LP reference (HiGHS: ~4 s CPU at 1e5 points).
LP_MAX_POINTS = 200_000
#: Quantisation error of a ScoreGrid sum (units 2**-28, rounded): at most half a unit per event.
_GRID_QUANTUM = 2.0 ** -29


# -- validation and preparation --------------------------------------------------------------------
def _check_raw(z: Any, y: Any) -> tuple[np.ndarray, np.ndarray]:
    z = np.asarray(z, dtype=np.float64).ravel()
    y = np.asarray(y, dtype=np.float64).ravel()
    if z.shape != y.shape:
        raise ValueError(f"scores and outcomes must have the same length, got {z.size} and {y.size}")
    if z.size == 0:
        raise ValueError("need at least one sample, got an empty array")
    if not np.all(np.isfinite(z)) or z.min() < 0.0 or z.max() > 1.0:
        raise ValueError("scores must be finite and lie in [0, 1]")
    if not np.all((y == 0.0) | (y == 1.0)):
        raise ValueError("outcomes must be 0 or 1")
    return z, y


def _merge_points(v: Any, r: Any, total: float) -> tuple[np.ndarray, np.ndarray]:
    """Sort points, merge ties, and scale residual sums ``r`` by ``1/total``: returns (v_unique, c)."""
    v = np.asarray(v, dtype=np.float64).ravel()
    r = np.asarray(r, dtype=np.float64).ravel()
    if v.shape != r.shape:
        raise ValueError(f"points and residual sums must have the same length, got {v.size} and {r.size}")
    if v.size == 0:
        raise ValueError("need at least one point")
    if not (np.all(np.isfinite(v)) and np.all(np.isfinite(r))):
        raise ValueError("points and residual sums must be finite")
    if v.min() < 0.0 or v.max() > 1.0:
        raise ValueError("points must lie in [0, 1]")
    if not (np.isfinite(total) and total > 0):
        raise ValueError(f"total (number of events) must be positive, got {total}")
    order = np.argsort(v)  # ties are merged below, so stability is not needed
    v, r = v[order], r[order]
    if v.size > 1 and np.any(v[1:] == v[:-1]):
        vu, start = np.unique(v, return_index=True)
        r = np.add.reduceat(r, start)
        v = vu
    return v, r / float(total)


# -- the exact dynamic program ---------------------------------------------------------------------
def _smce_dp(v: np.ndarray, c: np.ndarray, pivot: int | None = None) -> float:
    """Chain-LP value for strictly increasing ``v`` and weights ``c`` (see module docstring).

    Breakpoints are identified by their rank among all breakpoint positions (computed once with
    ``argsort``), weights live in a list indexed by rank.  Breakpoints ranked below the pivot sit in
    the min-heap ``lo`` only, those above it in the max-heap ``hi`` only, the pivot in both; the left
    end is then ``lo``'s minimum and the right end ``hi``'s maximum as long as both heaps hold a live
    breakpoint.  With the pivot at the initial kink (position 0, weight 2) that is always the case in
    exact arithmetic -- at most ``sum d_i <= 1`` is removed from each side -- so every point is pushed
    once.  Should a heap run empty (round-off; or any other ``pivot``, used by the tests), both heaps
    are rebuilt to hold every live breakpoint and later points go into both (lazy deletion).
    """
    cum = np.cumsum(c)
    m = cum.size
    d = np.diff(v)
    pos = np.empty(m)
    pos[0] = 0.0  # breakpoint 0: the kink of F_1(z) = |z|; breakpoint i + 1: the one inserted at step i
    pos[1:] = cum[:-1]
    order = np.argsort(pos)  # any order of equal positions gives the same value
    rank = np.empty(m, dtype=np.int64)
    rank[order] = np.arange(m)
    where = pos[order].tolist()  # position by rank
    weight = [0.0] * m  # weight by rank (0 = removed or not yet inserted)
    r0 = int(rank[0])
    pv = r0 if pivot is None else int(pivot)
    weight[r0] = 2.0
    lo: list[int] = [r0] if r0 <= pv else []
    hi: list[int] = [-r0] if r0 >= pv else []
    both = False
    push, pop = heapq.heappush, heapq.heappop
    a = float(np.dot(d, cum[:-1]))  # F(z) = a - z left of all breakpoints, before removals
    removed = 0.0  # sum of (weight x position) removed from the left end

    def merged() -> tuple[list[int], list[int]]:
        live = sorted({r for r in lo if weight[r] > 0.0} | {-r for r in hi if weight[-r] > 0.0})
        return live, [-r for r in reversed(live)]

    for di, r in zip(d.tolist(), rank[1:].tolist()):
        weight[r] = di + di
        if both:
            push(lo, r)
            push(hi, -r)
        elif r < pv:
            push(lo, r)
        elif r > pv:
            push(hi, -r)
        else:
            push(lo, r)
            push(hi, -r)
        # infimal convolution with |.|: remove weight di from the left end (tracking the intercept) ...
        rem = di
        while True:
            if not lo:
                if both or not hi:
                    break
                lo, hi = merged()
                both = True
                continue
            q = lo[0]
            w = weight[q]
            if w <= 0.0:
                pop(lo)
                continue
            if w > rem:
                weight[q] = w - rem
                removed += rem * where[q]
                break
            removed += w * where[q]
            rem -= w
            weight[q] = 0.0
            pop(lo)
            if rem <= 0.0:
                break
        # ... and from the right end (the left intercept does not change)
        rem = di
        while True:
            if not hi:
                if both or not lo:
                    break
                lo, hi = merged()
                both = True
                continue
            q = -hi[0]
            w = weight[q]
            if w <= 0.0:
                pop(hi)
                continue
            if w > rem:
                weight[q] = w - rem
                break
            rem -= w
            weight[q] = 0.0
            pop(hi)
            if rem <= 0.0:
                break
    cn = float(cum[-1])
    wts = np.array(weight)
    value = a - removed - cn + float(np.dot(wts, np.maximum(0.0, cn - np.array(where))))
    return max(value, abs(cn))  # smCE >= |C_n| (w = +-1); guards round-off only


def smce_points(v: Any, r: Any, total: float) -> float:
    """Exact smCE of weighted points: ``max_w sum_k r_k w(v_k) / total`` over 1-Lipschitz ``w`` into [-1, 1].

    Parameters
    ----------
    v
        Point positions in [0, 1] (any order, ties allowed).
    r
        Residual sum at each point (``sum (y - z)`` of the events it represents).
    total
        Number of events (the normaliser ``n``).

    Returns
    -------
    float
        The smooth calibration error.

    Examples
    --------
    >>> round(smce_points([0.0, 1.0], [0.3, -0.3], 10), 4)   # Lipschitz: w(0) - w(1) <= 1
    0.03
    >>> round(smce_points([0.5, 0.6], [1.0, -1.0], 10), 4)   # Lipschitz: w(0.5) - w(0.6) <= 0.1
    0.01

    References
    ----------
    Hu, Tian, Yang (2024), eq. (11) and Lemma 7; DP: spec ``smooth-calibration.md``.
    """
    vu, c = _merge_points(v, r, total)
    return _smce_dp(vu, c)


def smce(z: Any, y: Any) -> float:
    """Exact empirical smooth calibration error of raw predictions ``z`` and outcomes ``y``, O(n log n).

    Parameters
    ----------
    z
        Predicted probabilities P(y = 1) in [0, 1].
    y
        Outcomes in {0, 1}.

    Returns
    -------
    float
        ``sup_w |mean((y - z) w(z))|`` over 1-Lipschitz ``w: [0, 1] -> [-1, 1]``.

    Examples
    --------
    >>> round(smce([0.1, 0.1, 0.9, 0.9], [0, 1, 1, 1]), 4)   # residual 0.8/4 at 0.1, 0.2/4 at 0.9; w = 1
    0.25
    >>> smce([0.5, 0.5], [0, 1])
    0.0

    References
    ----------
    Hu, Tian, Yang (2024), Definition 3 and eq. (11).
    """
    z, y = _check_raw(z, y)
    return smce_points(z, y - z, z.size)


# -- binned statistics -----------------------------------------------------------------------------
def _single_grid(grid: ScoreGrid) -> None:
    if not isinstance(grid, ScoreGrid):
        raise ValueError(f"expected a ScoreGrid, got {type(grid).__name__}")
    if grid.channels is not None:
        raise ValueError("smCE needs a single-channel grid; pick one with grid.channel(k)")
    if grid.count == 0:
        raise ValueError("the grid holds no events")


def grid_points(grid: ScoreGrid, point: str = "center") -> dict[str, Any]:
    """Weighted points of a grid's non-empty cells with their exact residual sums and binning-error bound.

    Parameters
    ----------
    grid
        Single-channel :class:`ScoreGrid`.
    point
        ``"center"`` (cell centre; error bound ``(h/2) mean|y - z|``) or ``"mean"`` (cell mean score;
        bound ``h mean|y - z|``), ``h = 1/bins``.

    Returns
    -------
    dict
        ``v`` (positions), ``r`` (residual sums), ``n`` (events per cell), ``p`` (mean score per cell),
        ``total``, ``mean_abs_residual``, ``error_bound``.

    Examples
    --------
    >>> g = ScoreGrid(bins=4)
    >>> g.update(np.array([0.1, 0.2, 0.9]), np.array([0, 1, 1]))
    >>> pts = grid_points(g)
    >>> pts["v"].tolist(), np.round(pts["r"], 6).tolist()
    ([0.125, 0.875], [0.7, 0.1])
    """
    if point not in ("center", "mean"):
        raise ValueError(f"point must be 'center' or 'mean', got {point!r}")
    _single_grid(grid)
    n = grid.n
    keep = n > 0
    sz, sy, szy = grid.sum_z[keep], grid.sum_y[keep], grid.sum_zy[keep]
    total = float(n.sum())
    h = 1.0 / grid.bins
    v = grid.centers[keep] if point == "center" else np.clip(sz / n[keep], 0.0, 1.0)
    mean_abs = max(0.0, float((sy + sz - 2.0 * szy).sum()) / total)
    factor = 0.5 if point == "center" else 1.0
    return {"v": v, "r": sy - sz, "n": n[keep], "p": sz / n[keep], "total": total,
            "mean_abs_residual": mean_abs, "error_bound": factor * h * mean_abs + _GRID_QUANTUM}


def smce_grid(grid: ScoreGrid, point: str = "center", bins: int | None = None) -> dict[str, float]:
    """smCE from binned statistics, with the binning-error bound relative to the raw events.

    Parameters
    ----------
    grid
        Single-channel :class:`ScoreGrid` (e.g. the 4096-cell fine grid).
    point
        Cell representative, see :func:`grid_points`.
    bins
        Optional coarser resolution (must divide ``grid.bins``).

    Returns
    -------
    dict
        ``value`` and ``error_bound`` with ``|value - smCE(raw)| <= error_bound``, plus ``bins``, ``n``.

    Examples
    --------
    >>> rng = np.random.default_rng(0)
    >>> z = rng.random(2000); y = (rng.random(2000) < z).astype(float)
    >>> g = ScoreGrid(4096); g.update(z, y)
    >>> res = smce_grid(g)
    >>> abs(res["value"] - smce(z, y)) <= res["error_bound"]
    True

    References
    ----------
    Spec ``smooth-calibration.md``, binning-error note: ``|smCE(binned) - smCE(raw)| <= (h/2) mean|y - v|``.
    """
    if bins is not None:
        grid = grid.coarsen(bins)
    pts = grid_points(grid, point)
    value = smce_points(pts["v"], pts["r"], pts["total"])
    return {"value": value, "error_bound": pts["error_bound"], "bins": grid.bins, "n": int(pts["total"])}


# -- LP references and witness ---------------------------------------------------------------------
def _lp(v: np.ndarray, c: np.ndarray, a_ub: sparse.spmatrix, b_ub: np.ndarray) -> tuple[float, np.ndarray]:
    # HiGHS tolerances are absolute (~1e-7): rescale the objective to max|c| = 1 (c ~ 1/n otherwise)
    scale = float(np.max(np.abs(c)))
    if scale == 0.0:
        return 0.0, np.zeros_like(c)
    res = linprog(-c / scale, A_ub=a_ub, b_ub=b_ub, bounds=(-1.0, 1.0), method="highs")
    if res.status != 0:
        raise RuntimeError(f"HiGHS failed on the smCE LP: {res.message}")
    x = np.asarray(res.x)
    return float(np.dot(c, x)), x


def smce_chain_lp(v: Any, r: Any, total: float) -> tuple[float, np.ndarray, np.ndarray]:
    """Reference solver: the chain LP (adjacent Lipschitz constraints, Lemma 7) solved by HiGHS.

    Parameters
    ----------
    v, r, total
        Weighted points as in :func:`smce_points`.

    Returns
    -------
    value, points, x
        LP value, the sorted distinct points and an optimal witness ``x_k = w(points_k)``.

    Examples
    --------
    >>> value, pts, x = smce_chain_lp([0.0, 1.0], [0.3, -0.3], 10)
    >>> round(value, 6), round(float(x[0] - x[1]), 6)
    (0.03, 1.0)
    """
    vu, c = _merge_points(v, r, total)
    m = vu.size
    if m > LP_MAX_POINTS:
        raise ValueError(f"{m} distinct points is too many for the LP reference (max {LP_MAX_POINTS})")
    if m == 1:
        return abs(float(c[0])), vu, np.array([1.0 if c[0] >= 0 else -1.0])
    d = np.diff(vu)
    diff = sparse.diags([-np.ones(m - 1), np.ones(m - 1)], [0, 1], shape=(m - 1, m), format="csr")
    value, x = _lp(vu, c, sparse.vstack([diff, -diff]).tocsr(), np.concatenate([d, d]))
    return value, vu, x


def smce_pairwise_lp(v: Any, r: Any, total: float) -> float:
    """Reference solver: the full pairwise LP (eq. 11 with all n(n-1) Lipschitz rows), for small inputs.

    Parameters
    ----------
    v, r, total
        Weighted points as in :func:`smce_points` (at most 400 distinct points).

    Returns
    -------
    float
        LP value.

    Examples
    --------
    >>> round(smce_pairwise_lp([0.5, 0.6, 0.9], [1.0, -1.0, 0.5], 10), 6)
    0.06
    """
    vu, c = _merge_points(v, r, total)
    m = vu.size
    if m > 400:
        raise ValueError(f"the pairwise LP is quadratic; {m} points is too many (max 400)")
    if m == 1:
        return abs(float(c[0]))
    i, j = np.triu_indices(m, 1)
    rows = np.arange(i.size)
    a = sparse.csr_matrix((np.r_[np.ones(i.size), -np.ones(i.size)], (np.r_[rows, rows], np.r_[j, i])),
                          shape=(i.size, m))
    b = vu[j] - vu[i]
    value, _ = _lp(vu, c, sparse.vstack([a, -a]).tocsr(), np.concatenate([b, b]))
    return value


def smce_witness(z: Any = None, y: Any = None, *, grid: ScoreGrid | None = None,
                 point: str = "center") -> dict[str, Any]:
    """A witness function ``w`` attaining smCE, from an LP solve (HiGHS), on raw data or a grid.

    ``w > 0`` where outcomes exceed predictions (the model under-predicts), ``w < 0`` where it
    over-predicts; ``w`` is given at the distinct points and is linear in between.

    Parameters
    ----------
    z, y
        Raw predictions and outcomes (at most ``LP_MAX_POINTS`` distinct scores), or ``None``.
    grid
        Alternatively a :class:`ScoreGrid` (cells as weighted points).
    point
        Cell representative for a grid, see :func:`grid_points`.

    Returns
    -------
    dict
        ``value`` (LP value), ``points``, ``w`` (values at the points).

    Examples
    --------
    >>> wit = smce_witness([0.1, 0.1, 0.9, 0.9], [1, 1, 0, 0])   # under-predicts at 0.1, over at 0.9
    >>> round(wit["value"], 4), round(float(wit["w"][0] - wit["w"][1]), 4)
    (0.36, 0.8)
    """
    if grid is not None:
        pts = grid_points(grid, point)
        value, vu, x = smce_chain_lp(pts["v"], pts["r"], pts["total"])
    elif z is not None and y is not None:
        z, y = _check_raw(z, y)
        value, vu, x = smce_chain_lp(z, y - z, z.size)
    else:
        raise ValueError("give raw z and y, or a grid")
    return {"value": value, "points": vu, "w": np.clip(x, -1.0, 1.0)}


# -- null simulation -------------------------------------------------------------------------------
def _mc_summary(observed: float, null: np.ndarray, alpha: float) -> dict[str, Any]:
    """Monte Carlo p-value ``(1 + #{T* >= T}) / (mc + 1)`` (tie tolerance 1e-12) and null quantiles."""
    tol = 1e-12 * max(1.0, abs(observed))
    qs = np.quantile(null, [0.5, 0.95, 0.99]).tolist()
    return {"statistic": float(observed), "p_value": float((1 + np.count_nonzero(null >= observed - tol))
                                                           / (null.size + 1)),
            "mc": int(null.size), "critical_value": float(np.quantile(null, 1.0 - alpha, method="higher")),
            "null_quantiles": dict(zip(("q50", "q95", "q99"), qs))}


def smce_null_pvalue(z: Any, y: Any, *, mc: int = 999, rng: np.random.Generator | None = None,
                     observed: float | None = None, alpha: float = 0.05) -> dict[str, Any]:
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
        Level for the reported critical value (the null's ``1 - alpha`` quantile).

    Returns
    -------
    dict
        ``statistic``, ``p_value``, ``critical_value``, ``null_quantiles`` (50/95/99 %) and ``mc``.

    Examples
    --------
    >>> rng = np.random.default_rng(1)
    >>> z = rng.random(300); y = (rng.random(300) < z).astype(float)
    >>> res = smce_null_pvalue(z, y, mc=99, rng=rng)
    >>> 0.0 < res["p_value"] <= 1.0
    True
    """
    z, y = _check_raw(z, y)
    if mc < 1:
        raise ValueError(f"mc must be a positive integer, got {mc}")
    rng = np.random.default_rng() if rng is None else rng
    order = np.argsort(z, kind="stable")
    zs = z[order]
    n = zs.size
    vu, start = np.unique(zs, return_index=True)
    obs = smce_points(z, y - z, n) if observed is None else float(observed)
    zsum = np.add.reduceat(zs, start)
    null = np.empty(mc)
    for b in range(mc):
        ystar = (rng.random(n) < zs).astype(np.float64)
        null[b] = _smce_dp(vu, (np.add.reduceat(ystar, start) - zsum) / n)
    return _mc_summary(obs, null, alpha)


def smce_null_pvalue_grid(grid: ScoreGrid, *, mc: int = 999, rng: np.random.Generator | None = None,
                          bins: int | None = 1024, point: str = "center", alpha: float = 0.05
                          ) -> dict[str, Any]:
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
        Level for the reported critical value.

    Returns
    -------
    dict
        ``statistic``, ``p_value``, ``critical_value``, ``null_quantiles``, ``mc``, ``bins``.

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
    obs = _smce_dp(v, r / total)
    zsum = pbar * cnt
    icnt = cnt.astype(np.int64)
    null = np.empty(mc)
    for start in range(0, mc, 256):  # draw in chunks of 256 replicates to bound memory
        counts = rng.binomial(icnt, pbar, size=(min(256, mc - start), icnt.size))
        for j, k in enumerate(counts):
            null[start + j] = _smce_dp(v, (k - zsum) / total)
    return {**_mc_summary(obs, null, alpha), "bins": grid.bins}


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


# -- registered tester -----------------------------------------------------------------------------
def _raw_from(data: CalibrationData) -> tuple[np.ndarray, np.ndarray] | None:
    if data.z is None or data.y is None:
        return None
    if data.raw_is_complete or data.grid is None:
        return _check_raw(data.z, data.y)
    return None


@register_tester("smce")
def smce_tester(data: CalibrationData, *, alpha: float, mc: int, rng: np.random.Generator,
                eps1: float | None = None, eps2: float = 0.0, C: float = 64.0, null_bins: int = 1024,
                raw_null_max: int = 2000, min_n: int = 20, point: str = "center",
                witness: bool = False) -> dict[str, Any]:
    """Registered tester ``smce``: exact smCE, null-simulation p-value, and the Theorem 3 tolerant rule.

    Value: exact empirical smCE of the raw data when complete raw data is given, else of the fine
    grid (with its binning-error bound).  p-value (H0: perfectly calibrated): from raw data with
    ``n <= raw_null_max`` the exact resampling ``y* ~ Bern(z)``; otherwise the per-cell binomial
    null on the grid coarsened to ``null_bins``.  Decision: without ``eps1`` "miscalibrated" iff
    ``p < alpha``; with ``eps1`` the tolerant rule of Theorem 3 (:func:`smce_tolerant`); with
    ``mc = 0`` and no ``eps1``, Theorem 3 with ``eps2 = 0`` and ``eps1 = sqrt(C/n)`` (threshold
    ``eps1/4 = 2/sqrt(n)`` for C = 64, above the null's 99.9th percentile).

    Parameters
    ----------
    data
        :class:`~calmon.testers.CalibrationData` (raw ``z``/``y`` and/or ``grid``).
    alpha
        Significance level of the p-value decision.
    mc
        Null replicates (0 skips the p-value).
    rng
        Random generator.
    eps1, eps2, C
        Tolerant-tester parameters (Theorem 3); ``eps1=None`` uses the p-value decision.
    null_bins
        Resolution of the binned null statistic.
    raw_null_max
        Largest raw sample resampled event by event.
    min_n
        Fewer events give "insufficient data".
    point
        Cell representative for grids.
    witness
        Also return the witness function (LP solve on the grid cells or raw points).

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
    raw = _raw_from(data)
    grid = data.grid
    out: dict[str, Any] = {"method": "smce", "p_value": None, "threshold": None, "mc": 0}
    if raw is not None:
        z, y = raw
        n = z.size
        value, err, source = smce_points(z, y - z, n), 0.0, "raw"
    elif grid is not None:
        _single_grid(grid)
        n = grid.count
        res = smce_grid(grid, point=point)
        value, err, source = res["value"], res["error_bound"], f"grid{grid.bins}"
    else:
        raise ValueError("the smce tester needs raw scores/outcomes or a ScoreGrid")
    out.update({"statistic": value, "value": value, "error_bound": err, "n": int(n), "source": source,
                "bounds": [max(0.0, value - err), value + err]})
    if n < min_n:
        out["decision"] = "insufficient data"
        return out
    if mc > 0:
        if raw is not None and raw[0].size <= raw_null_max:
            nul = smce_null_pvalue(raw[0], raw[1], mc=mc, rng=rng, observed=value, alpha=alpha)
            out["null_method"] = "bernoulli"
        else:
            g = grid
            if g is None or g.channels is not None:
                g = ScoreGrid(4096)
                g.update(raw[0], raw[1])
            nb = null_bins if g.bins % null_bins == 0 else None
            nul = smce_null_pvalue_grid(g, mc=mc, rng=rng, bins=nb, point=point, alpha=alpha)
            out["null_method"] = f"binomial/grid{nul['bins']}"
            out["null_statistic"] = nul["statistic"]
        out.update({"p_value": nul["p_value"], "mc": nul["mc"], "null_quantiles": nul["null_quantiles"],
                    "critical_value": nul["critical_value"]})
    if eps1 is not None:
        tol = smce_tolerant(value, n, eps1, eps2, C, error_bound=err)
        out.update({"threshold": tol["threshold"], "decision": tol["decision"], "eps1": eps1, "eps2": eps2,
                    "n_required": tol["n_required"], "rule": "theorem3"})
    elif out["p_value"] is not None:
        out["decision"] = "miscalibrated" if out["p_value"] < alpha else "calibrated"
        out["rule"] = "p-value"
        out["threshold"] = nul["critical_value"]
    else:  # no simulation asked for: Theorem 3 with eps2 = 0 and the smallest eps1 this n supports
        e1 = min(1.0, math.sqrt(C / n))
        tol = smce_tolerant(value, n, e1, 0.0, C, error_bound=err)
        out.update({"threshold": tol["threshold"], "decision": tol["decision"], "eps1": e1, "eps2": 0.0,
                    "n_required": tol["n_required"], "rule": "theorem3-default"})
    if witness:
        if raw is not None and np.unique(raw[0]).size <= 20000:
            wit = smce_witness(raw[0], raw[1])
        else:
            g = grid if grid is not None else ScoreGrid(4096)
            if grid is None:
                g.update(raw[0], raw[1])
            wit = smce_witness(grid=g.coarsen(256) if g.bins % 256 == 0 else g, point=point)
        out["witness"] = {"points": wit["points"].tolist(), "w": wit["w"].tolist()}
    return out
