"""Reference solvers of the smCE linear program (HiGHS) and the witness function they yield.

The exact value comes from :func:`~calmon.algorithms.smooth.dp.smce_points`; these LPs check it and
give an optimal ``w`` (the direction of the miscalibration).
"""

from __future__ import annotations

from typing import Any

import numpy as np
from scipy import sparse
from scipy.optimize import linprog

from calmon.algorithms.smooth.dp import check_raw, grid_points, merge_points
from calmon.stats.grid import ScoreGrid

__all__ = ["LP_MAX_POINTS", "smce_chain_lp", "smce_pairwise_lp", "smce_witness"]

#: Largest number of distinct points accepted by the LP reference (HiGHS: ~4 s CPU at 1e5 points).
LP_MAX_POINTS = 200_000


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
    vu, c = merge_points(v, r, total)
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
    vu, c = merge_points(v, r, total)
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
        z, y = check_raw(z, y)
        value, vu, x = smce_chain_lp(z, y - z, z.size)
    else:
        raise ValueError("give raw z and y, or a grid")
    return {"value": value, "points": vu, "w": np.clip(x, -1.0, 1.0)}
