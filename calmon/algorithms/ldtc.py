"""Lower distance to calibration (LDTC, dCE) by linear programming, and the tolerant tester of Theorem 4.

For a distribution on ``V x {0, 1}`` with ``V`` finite (raw distinct scores, or the centres of a
grid's cells) and a grid ``U`` of candidate calibrated predictions containing 0 and 1, the
U-restricted LDTC is the transport-type LP of Lemma 16::

    min  sum |u - v| Pi(u, v, y)   over Pi >= 0
    s.t. sum_u Pi(u, v, y) = D(v, y)                          for every (v, y) with D(v, y) > 0
         (1 - u) sum_v Pi(u, v, 1) = u sum_v Pi(u, v, 0)      for every u in U

solved with scipy's HiGHS -- :func:`ldtc_lp` as written (the reference, with its dual), and for binned data
and the null simulation in the exact equivalent CDF form of :mod:`calmon.algorithms.ldtc_cdf` (``|U| + 4K``
variables instead of ``2 |V| |U|``; the same optimum, 10-20x faster).  Error bounds relative to the raw empirical dCE:

* grid: ``dCE <= dCE^U <= dCE + s`` with ``s`` the largest gap of ``U`` (Lemma 15, read conservatively:
  an s-spaced grid is an s/2-cover);
* binning: moving every score to its cell centre moves dCE by at most ``h/2`` (``h = 1/bins``), because
  dCE is 1-Lipschitz under moving ``v`` with ``y`` fixed.

So ``dCE(raw) in [dCE^U - s - h/2, dCE^U + h/2]``.

p-value (:func:`ldtc_null_pvalue`): the statistic is dCE^U of the grid coarsened to a few cells, each at
its mean score; the null redraws every cell's positives as ``Binomial(N, mean score)`` and re-solves the
LP (the same LP matrix, new right-hand side; eight replicates per HiGHS call).  The rank p-value is exact
for that binomial null, whose variance ``N zbar (1 - zbar)`` is at least the exact ``sum z (1 - z)``
(conservative, as for smCE).  The simulation is curtailed (Besag-Clifford) once the observed value cannot
be significant.

References
----------
Hu, Tian, Yang. Testing Calibration in Subquadratic Time (2024): Definition 1 (LDTC), Definition 7
(U-LDTC), Lemma 15 (grid error), Lemma 16/17 (the LP), Theorem 4 (tolerant tester).  Blasiok,
Gopalan, Hu, Nakkiran (STOC 2023), Lemma 7.6 and 7.11.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from scipy import sparse
from scipy.optimize import linprog

from calmon.algorithms.ldtc_cdf import ldtc_cdf, shared_lp
from calmon.stats.grid import ScoreGrid

__all__ = ["u_grid", "ldtc_lp", "ldtc_dual_value", "ldtc", "ldtc_grid", "ldtc_tolerant", "theorem4_resolution",
           "sample_resolution", "FixedLP", "ldtc_null_pvalue"]

#: Null replicates solved per HiGHS call (:meth:`~calmon.algorithms.ldtc_cdf.CdfLP.solve_many`).
_NULL_BLOCK = 8
#: Largest LP accepted (number of variables 2 |V| |U| after dropping empty (v, y) pairs).
MAX_VARIABLES = 3_000_000


def u_grid(points: int = 101) -> np.ndarray:
    """Equally spaced grid on [0, 1] containing 0 and 1.

    Parameters
    ----------
    points
        Number of grid points (at least 2).

    Returns
    -------
    numpy.ndarray
        ``linspace(0, 1, points)``.

    Examples
    --------
    >>> u_grid(5).tolist()
    [0.0, 0.25, 0.5, 0.75, 1.0]
    """
    if int(points) != points or points < 2:
        raise ValueError(f"the u-grid needs at least 2 points (0 and 1), got {points!r}")
    return np.linspace(0.0, 1.0, int(points))


def ldtc_lp(v: Any, n1: Any, n0: Any, u: Any = None, *, return_dual: bool = False) -> dict[str, Any]:
    """U-restricted lower distance to calibration of weighted points by the LP of Lemma 16 (HiGHS).

    Parameters
    ----------
    v
        Scores in [0, 1] (distinct or not).
    n1, n0
        Number (or mass) of outcomes 1 and 0 at each score.
    u
        Grid of calibrated predictions; must contain 0 and 1 (default ``u_grid(101)``).
    return_dual
        Also return the dual multipliers of the calibration rows (``lambda_u``), which certify the
        value: ``sum_v D(v,1) min_u(|u-v| - (1-u) l_u) + D(v,0) min_u(|u-v| + u l_u)`` equals it.

    Returns
    -------
    dict
        ``value`` (dCE^U), ``grid_error`` (largest gap of U), ``u``, ``mass_u`` (marginal of u),
        ``mean_y_u`` (E[y | u], equal to u where mass_u > 0), and ``dual`` when asked.

    Examples
    --------
    >>> round(ldtc_lp([0.3], [6], [4], u_grid(11))["value"], 6)   # one score 0.3 with 60 % positives
    0.3
    >>> round(ldtc_lp([0.2, 0.8], [2, 8], [8, 2])["value"], 6)     # calibrated
    0.0
    """
    v = np.asarray(v, dtype=np.float64).ravel()
    n1 = np.asarray(n1, dtype=np.float64).ravel()
    n0 = np.asarray(n0, dtype=np.float64).ravel()
    u = u_grid(101) if u is None else np.unique(np.asarray(u, dtype=np.float64).ravel())
    if not (v.shape == n1.shape == n0.shape) or v.size == 0:
        raise ValueError(f"v, n1, n0 must be non-empty and of equal length, got {v.size}, {n1.size}, "
                         f"{n0.size}")
    if not (np.all(np.isfinite(v)) and v.min() >= 0.0 and v.max() <= 1.0):
        raise ValueError("scores must be finite and lie in [0, 1]")
    if np.any(n1 < 0) or np.any(n0 < 0) or not np.isfinite(n1.sum() + n0.sum()) or n1.sum() + n0.sum() <= 0:
        raise ValueError("outcome counts must be non-negative, finite and not all zero")
    if u.size < 2 or u[0] != 0.0 or u[-1] != 1.0 or u.min() < 0.0 or u.max() > 1.0:
        raise ValueError("the u-grid must lie in [0, 1] and contain both 0 and 1 "
                         "(else the LP can be infeasible)")
    total = n1.sum() + n0.sum()
    pv = np.concatenate([v, v])
    py = np.concatenate([np.ones(v.size), np.zeros(v.size)])
    pm = np.concatenate([n1, n0]) / total
    keep = pm > 0
    pv, py, pm = pv[keep], py[keep], pm[keep]
    npair, m = pv.size, u.size
    if npair * m > MAX_VARIABLES:
        raise ValueError(f"LP too large: {npair} (v, y) pairs x {m} grid points > {MAX_VARIABLES} variables; "
                         "bin the data or use a coarser u-grid")
    cost = np.abs(u[None, :] - pv[:, None]).ravel()
    cols = np.arange(npair * m)
    pair_of = np.repeat(np.arange(npair), m)
    u_of = np.tile(np.arange(m), npair)
    coef = np.where(py[pair_of] == 1.0, 1.0 - u[u_of], -u[u_of])
    a_eq = sparse.csr_matrix((np.concatenate([np.ones(cols.size), coef]),
                              (np.concatenate([pair_of, npair + u_of]), np.concatenate([cols, cols]))),
                             shape=(npair + m, npair * m))
    b_eq = np.concatenate([pm, np.zeros(m)])
    # HiGHS' simplex takes 0.2-4 s on 256 x 101 depending on the data; the interior-point method
    # (with crossover to a vertex) takes a steady ~0.5 s, so it is used for the larger LPs
    method = "highs-ipm" if cost.size > 20_000 else "highs"
    res = linprog(cost, A_eq=a_eq, b_eq=b_eq, bounds=(0.0, None), method=method)
    if res.status != 0:
        raise RuntimeError(f"HiGHS failed on the LDTC LP: {res.message}")
    pi = np.asarray(res.x).reshape(npair, m)
    mass_u = pi.sum(axis=0)
    with np.errstate(invalid="ignore", divide="ignore"):
        ysum = (pi * py[:, None]).sum(axis=0)
        mean_y = np.where(mass_u > 1e-12, ysum / np.where(mass_u > 0, mass_u, 1), np.nan)
    out: dict[str, Any] = {"value": max(0.0, float(res.fun)), "grid_error": float(np.max(np.diff(u))), "u": u,
                           "mass_u": mass_u, "mean_y_u": mean_y}
    if return_dual:
        out["dual"] = np.asarray(res.eqlin.marginals)[npair:]
    return out


def ldtc_dual_value(v: Any, n1: Any, n0: Any, u: Any, lam: Any) -> float:
    """Value of the LP dual of Lemma 16 at multipliers ``lam`` (a lower bound on dCE^U for any ``lam``).

    ``sum_v D(v,1) min_u(|u - v| - (1 - u) lam_u) + D(v,0) min_u(|u - v| + u lam_u)``.

    Parameters
    ----------
    v, n1, n0, u
        As in :func:`ldtc_lp`.
    lam
        One multiplier per grid point.

    Returns
    -------
    float
        Dual objective (weak duality: <= dCE^U; equal at an optimal ``lam``).

    Examples
    --------
    >>> round(ldtc_dual_value([0.3], [6], [4], u_grid(11), np.zeros(11)), 6)   # lam = 0 gives 0
    0.0
    """
    v = np.asarray(v, dtype=np.float64).ravel()
    n1 = np.asarray(n1, dtype=np.float64).ravel()
    n0 = np.asarray(n0, dtype=np.float64).ravel()
    u = np.asarray(u, dtype=np.float64).ravel()
    lam = np.asarray(lam, dtype=np.float64).ravel()
    dist = np.abs(u[None, :] - v[:, None])
    phi1 = (dist - (1.0 - u)[None, :] * lam[None, :]).min(axis=1)
    phi0 = (dist + u[None, :] * lam[None, :]).min(axis=1)
    total = n1.sum() + n0.sum()
    return float((n1 * phi1 + n0 * phi0).sum() / total)


def ldtc(z: Any, y: Any, u: Any = None) -> dict[str, Any]:
    """U-restricted LDTC of raw samples (no binning; one point per distinct score).

    Parameters
    ----------
    z
        Scores in [0, 1].
    y
        Outcomes in {0, 1}.
    u
        Grid containing 0 and 1 (default ``u_grid(101)``).

    Returns
    -------
    dict
        As :func:`ldtc_lp`, plus ``bounds`` ``[value - grid_error, value]`` on the empirical dCE.

    Examples
    --------
    >>> res = ldtc([0.1, 0.1, 0.9, 0.9], [0, 0, 1, 1], u_grid(11))   # under-confident
    >>> round(res["value"], 6)
    0.08
    """
    z = np.asarray(z, dtype=np.float64).ravel()
    y = np.asarray(y, dtype=np.float64).ravel()
    if z.shape != y.shape or z.size == 0:
        raise ValueError(f"scores and outcomes must be non-empty and of equal length, "
                         f"got {z.size} and {y.size}")
    if not np.all((y == 0.0) | (y == 1.0)):
        raise ValueError("outcomes must be 0 or 1")
    vu, inv = np.unique(z, return_inverse=True)
    n1 = np.bincount(inv, weights=y, minlength=vu.size)
    n0 = np.bincount(inv, minlength=vu.size) - n1
    out = ldtc_lp(vu, n1, n0, u)
    out["bounds"] = [max(0.0, out["value"] - out["grid_error"]), out["value"]]
    return out


def ldtc_grid(grid: ScoreGrid, bins: int = 256, u: Any = None) -> dict[str, Any]:
    """LDTC from binned statistics: cells (coarsened to ``bins``) at their centres, LP by HiGHS.

    Parameters
    ----------
    grid
        Single-channel :class:`ScoreGrid`.
    bins
        Number of cells for the LP (must divide ``grid.bins``; default 256).
    u
        Grid containing 0 and 1 (default ``u_grid(101)``).

    Returns
    -------
    dict
        ``value`` (dCE^U of the binned data), ``grid_error``, ``binning_error`` (h/2),
        ``bounds`` ``[value - grid_error - h/2, value + h/2]`` on the raw empirical dCE, ``estimate``
        (centre of the bounds) and ``error_bound`` (their half-width), ``bins``, ``n``.

    Examples
    --------
    >>> rng = np.random.default_rng(0)
    >>> z = rng.random(4000); y = (rng.random(4000) < z).astype(float)
    >>> g = ScoreGrid(4096); g.update(z, y)
    >>> res = ldtc_grid(g, bins=64, u=u_grid(21))
    >>> res["bounds"][0] <= ldtc(z, y, u_grid(21))["value"] <= res["bounds"][1] + 0.05
    True
    """
    if not isinstance(grid, ScoreGrid) or grid.channels is not None:
        raise ValueError("ldtc_grid needs a single-channel ScoreGrid")
    if grid.count == 0:
        raise ValueError("the grid holds no events")
    if bins < grid.bins:
        grid = grid.coarsen(bins)
    n = grid.n
    n1 = np.clip(grid.sum_y, 0.0, None)
    n0 = np.clip(n - grid.sum_y, 0.0, None)
    # every cell, empty ones with mass 0: windows on one grid share one LP model (warm-started, ldtc_cdf);
    # the value is ldtc_lp's on the non-empty cells, 10-50x faster
    out = ldtc_cdf(grid.centers, n1, n0, u_grid(101) if u is None else u)
    h2 = 0.5 / grid.bins
    lo = max(0.0, out["value"] - out["grid_error"] - h2)
    hi = out["value"] + h2
    out.update({"binning_error": h2, "bounds": [lo, hi], "estimate": 0.5 * (lo + hi),
                "error_bound": 0.5 * (hi - lo), "bins": grid.bins, "n": int(n.sum())})
    return out


def ldtc_tolerant(beta: float, n: int, eps1: float, eps2: float = 0.0, C: float = 36.0,
                  error_bound: float = 0.0) -> dict[str, Any]:
    """Decision of the (eps1, eps2)-tolerant tester of Theorem 4 from a dCE estimate ``beta``.

    ``alpha = eps1 - eps2``; "calibrated" iff ``beta <= eps2 + alpha/2``.  Needs ``eps1 > eps2``,
    ``n >= C / alpha^2`` and an estimation error (grid + binning) of at most ``alpha/3``; otherwise
    "insufficient data".  ``C`` is not given by the paper; 36 makes ``alpha/6 >= 1/sqrt(n)``.

    Parameters
    ----------
    beta
        dCE estimate.
    n
        Number of samples.
    eps1, eps2
        Far / close thresholds, ``0 <= eps2 < eps1 <= 1``.
    C
        Sample-size constant.
    error_bound
        Half-width of the deterministic error of ``beta``.

    Returns
    -------
    dict
        ``decision``, ``threshold``, ``alpha``, ``n_required``.

    Examples
    --------
    >>> ldtc_tolerant(0.01, 100000, eps1=0.05)["decision"]
    'calibrated'
    >>> ldtc_tolerant(0.04, 100000, eps1=0.05)["decision"]
    'miscalibrated'

    References
    ----------
    Hu, Tian, Yang (2024), Theorem 4.
    """
    if not 0.0 <= eps2 < eps1 <= 1.0:
        raise ValueError(f"Theorem 4 needs 0 <= eps2 < eps1 <= 1, got eps1={eps1}, eps2={eps2}")
    if C <= 0:
        raise ValueError(f"C must be positive, got {C}")
    alpha_t = eps1 - eps2
    threshold = eps2 + alpha_t / 2.0
    n_req = int(math.ceil(C / alpha_t**2 - 1e-9))
    if n < n_req or error_bound > alpha_t / 3.0:
        decision = "insufficient data"
    else:
        decision = "calibrated" if beta <= threshold else "miscalibrated"
    return {"decision": decision, "threshold": threshold, "alpha": alpha_t, "n_required": n_req}


def theorem4_resolution(alpha_t: float, fine_bins: int, min_bins: int, max_bins: int, grid_points: int,
                max_grid: int) -> tuple[int, int]:
    """LP resolution for Theorem 4: u-grid of >= 6/alpha points (s/2 <= alpha/12), cells with h/2 <= alpha/6.

    The total error bound ``s/2 + h/2`` then stays below ``alpha/4 < alpha/3`` (capped by the maxima).
    Returns ``(cells, u_points)``: cells from ``min_bins`` doubling up to ``max_bins`` (dividing
    ``fine_bins``), u-grid points between ``grid_points`` and ``max_grid``.

    Examples
    --------
    >>> theorem4_resolution(0.06, 4096, 256, 1024, 101, 401)
    (256, 101)
    """
    m = min(max(grid_points, int(math.ceil(6.0 / alpha_t)) + 1), max_grid)
    b = min_bins
    while b < max_bins and 0.5 / b > alpha_t / 6.0 and fine_bins % (2 * b) == 0:
        b *= 2
    return min(b, fine_bins), m


def sample_resolution(n: int, fine_bins: int, bins: int, points: int, scale: float = 1.0, min_bins: int = 64
                      ) -> tuple[int, int]:
    """LP resolution of a dCE *estimate*: the coarsest one whose error bound stays within the sampling scale.

    The empirical dCE of ``n`` samples is itself known to about ``1/sqrt(n)`` (Theorem 4 of Hu, Tian, Yang 2024
    needs ``n >= C / alpha^2`` to resolve a gap ``alpha``), so resolving its binned value more finely than that
    costs LP time without adding information.  Starting from ``(bins, points)`` (the finest used), cells and
    u-grid spacing are halved together -- ``(256, 101) -> (128, 51) -> (64, 26)`` -- while the estimate's
    deterministic error bound ``(s + h) / 2`` (grid gap ``s``, cell width ``h``: :func:`ldtc_grid`'s
    ``error_bound``) stays at most ``scale / sqrt(n)`` and the cells at least ``min_bins``.  The LP's cost falls
    about threefold a step (``benchmarks/bench_nulls.py``).

    Parameters
    ----------
    n
        Number of samples.
    fine_bins
        Cells of the data's grid (the result divides it).
    bins, points
        The finest resolution (cells dividing ``fine_bins``, u-grid points).
    scale
        Multiple of ``1/sqrt(n)`` the error bound may reach (``0``: always ``(bins, points)``).
    min_bins
        Fewest cells.

    Returns
    -------
    tuple
        ``(cells, u_points)``.

    Examples
    --------
    >>> sample_resolution(900, 4096, 256, 101), sample_resolution(3000, 4096, 256, 101)
    ((64, 26), (128, 51))
    >>> sample_resolution(20000, 4096, 256, 101), sample_resolution(900, 4096, 256, 101, scale=0.0)
    ((256, 101), (256, 101))
    """
    b, m = min(bins, fine_bins), int(points)
    limit = scale / math.sqrt(max(n, 1))
    while b // 2 >= min_bins and m > 3 and fine_bins % (b // 2) == 0:
        nb, nm = b // 2, (m - 1) // 2 + 1
        if (1.0 / (nm - 1) + 1.0 / nb) / 2.0 > limit:
            break
        b, m = nb, nm
    return b, m


class FixedLP:
    """The LP of Lemma 16 for fixed points ``v`` and grid ``u``: only the masses change between solves.

    Examples
    --------
    >>> lp = FixedLP(np.array([0.3]), u_grid(11))
    >>> round(lp.solve(np.array([6.0]), np.array([4.0])), 6)
    0.3
    """

    def __init__(self, v: np.ndarray, u: np.ndarray) -> None:
        self.v = np.asarray(v, dtype=np.float64).ravel()
        self.u = np.asarray(u, dtype=np.float64).ravel()
        k, m = self.v.size, self.u.size
        pv = np.concatenate([self.v, self.v])
        py = np.concatenate([np.ones(k), np.zeros(k)])
        if 2 * k * m > MAX_VARIABLES:
            raise ValueError(f"LP too large: {2 * k} (v, y) pairs x {m} grid points")
        self.cost = np.abs(self.u[None, :] - pv[:, None]).ravel()
        cols = np.arange(2 * k * m)
        pair_of = np.repeat(np.arange(2 * k), m)
        u_of = np.tile(np.arange(m), 2 * k)
        coef = np.where(py[pair_of] == 1.0, 1.0 - self.u[u_of], -self.u[u_of])
        self.a_eq = sparse.csr_matrix((np.concatenate([np.ones(cols.size), coef]),
                                       (np.concatenate([pair_of, 2 * k + u_of]), np.concatenate([cols, cols]))),
                                      shape=(2 * k + m, 2 * k * m))

    def solve(self, n1: np.ndarray, n0: np.ndarray) -> float:
        """dCE^U of ``n1`` positives and ``n0`` negatives at the points."""
        total = float(n1.sum() + n0.sum())
        b_eq = np.concatenate([n1 / total, n0 / total, np.zeros(self.u.size)])
        res = linprog(self.cost, A_eq=self.a_eq, b_eq=b_eq, bounds=(0.0, None), method="highs")
        if res.status != 0:
            raise RuntimeError(f"HiGHS failed on the LDTC LP: {res.message}")
        return max(0.0, float(res.fun))


def ldtc_null_pvalue(grid: ScoreGrid, *, mc: int = 199, rng: np.random.Generator | None = None, bins: int = 16,
                     points: int = 17, alpha: float = 0.05, curtail: bool = True) -> dict[str, Any]:
    """Null-simulation p-value of binned dCE^U under perfect calibration (module docstring).

    Parameters
    ----------
    grid
        Single-channel :class:`ScoreGrid` (``bins`` must divide ``grid.bins``).
    mc
        Null replicates ``R`` (one LP solve each).
    rng
        Random generator.
    bins, points
        Cells of the statistic (each at its mean score) and u-grid points: small, because every replicate
        solves an LP with ``2 bins points`` variables.
    alpha
        Level for the curtailment: the simulation stops at the ``h = floor(alpha (R + 1)) + 1``-th exceedance
        (the p-value is then Besag-Clifford's ``h / draws``, and the decision at ``alpha`` is the full test's).
    curtail
        Stop early as above.

    Returns
    -------
    dict
        ``statistic`` (observed coarse dCE^U), ``p_value``, ``mc_requested``, ``mc_draws``, ``curtailed``,
        ``bins``, ``points``.

    Examples
    --------
    >>> rng = np.random.default_rng(0)
    >>> z = rng.random(3000); g = ScoreGrid(4096); g.update(z, (rng.random(3000) < z).astype(float))
    >>> ldtc_null_pvalue(g, mc=99, rng=rng)["p_value"] > 0.05
    True
    >>> g2 = ScoreGrid(4096); g2.update(z, (rng.random(3000) < z ** 2).astype(float))
    >>> ldtc_null_pvalue(g2, mc=99, rng=rng)["p_value"] <= 0.05
    True

    References
    ----------
    Hu, Tian, Yang (2024), Lemma 16 (the LP); Besag, Clifford (1991) for the curtailed p-value.
    """
    if not isinstance(grid, ScoreGrid) or grid.channels is not None or grid.count == 0:
        raise ValueError("ldtc_null_pvalue needs a non-empty single-channel ScoreGrid")
    if int(mc) != mc or mc < 1:
        raise ValueError(f"mc must be a positive integer, got {mc!r}")
    if grid.bins % bins:
        raise ValueError(f"null bins {bins} must divide the grid's {grid.bins} cells")
    rng = np.random.default_rng() if rng is None else rng
    g = grid.coarsen(bins) if bins < grid.bins else grid
    keep = g.n > 0
    N = np.rint(g.n[keep])
    zbar = np.clip(g.sum_z[keep] / g.n[keep], 0.0, 1.0)
    n1 = np.clip(g.sum_y[keep], 0.0, N)
    lp = shared_lp(zbar, u_grid(points))
    obs = lp.solve(n1, N - n1)
    h = math.floor(alpha * (mc + 1)) + 1
    exceed = done = 0
    tol = 1e-9
    iN = N.astype(np.int64)
    while done < mc:
        # replicates in blocks of _NULL_BLOCK LPs per HiGHS call; taken in order, so the curtailed simulation
        # stops at the same replicate as one drawn one by one (the rest of the block is discarded)
        k = rng.binomial(iN, zbar, size=(min(_NULL_BLOCK, mc - done), iN.size)).astype(np.float64)
        hits = lp.solve_many(k, N - k) >= obs - tol
        for hit in hits:
            exceed += int(hit)
            done += 1
            if curtail and exceed >= h:
                break
        if curtail and exceed >= h:
            break
    p = h / done if (exceed >= h and done < mc) else (1.0 + exceed) / (mc + 1.0)
    return {"statistic": obs, "p_value": float(min(1.0, p)), "mc_requested": int(mc), "mc_draws": done,
            "curtailed": bool(done < mc), "bins": int(g.bins), "points": int(points)}
