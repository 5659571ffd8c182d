"""Exact empirical smCE by the dual dynamic program, from raw events or a grid's cells.

See :mod:`calmon.algorithms.smooth` for the program and its references.
"""

from __future__ import annotations

import heapq
from typing import Any

import numpy as np

from calmon.stats.grid import ScoreGrid

__all__ = ["check_raw", "merge_points", "smce_dp", "smce_points", "smce", "check_single_grid", "grid_points",
           "smce_grid"]

#: Quantisation error of a ScoreGrid sum (units 2**-28, rounded): at most half a unit per event.
_GRID_QUANTUM = 2.0 ** -29


# -- validation and preparation --------------------------------------------------------------------
def check_raw(z: Any, y: Any) -> tuple[np.ndarray, np.ndarray]:
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


def merge_points(v: Any, r: Any, total: float) -> tuple[np.ndarray, np.ndarray]:
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
def smce_dp(v: np.ndarray, c: np.ndarray, pivot: int | None = None) -> float:
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
    vu, c = merge_points(v, r, total)
    return smce_dp(vu, c)


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
    z, y = check_raw(z, y)
    return smce_points(z, y - z, z.size)


# -- binned statistics -----------------------------------------------------------------------------
def check_single_grid(grid: ScoreGrid) -> None:
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
    check_single_grid(grid)
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
