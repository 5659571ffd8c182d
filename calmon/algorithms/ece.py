"""First calibration metrics from binned statistics, with raw-array twins for checking.

Conventions: ``z`` is the binary score P(y = 1) or the top-label confidence; ``y`` the 0/1
outcome (label, or top-label correctness).  The l2-ECE estimators use the scalar binary form
(Z = P(y = 1), Y in {0, 1}); the paper's one-hot statistic for K = 2 is exactly twice it.
"""

from __future__ import annotations

import functools
from typing import Any

import numpy as np

from calmon.stats.grid import QUANTUM_BITS, ScoreGrid, cell_index

#: ``ndarray.sum`` without its wrappers (the same reduction)
_sum = np.add.reduce
_SCALE = float(2**QUANTUM_BITS)
#: Below this many events a fine grid's float field sums, and its Brier sum, are exact (scores in [0, 1],
#: outcomes in {0, 1}: every cell value and partial sum is a multiple of 2**-28 below 2**25)
_EXACT_EVENTS = 2**23


def ece_l1(grid: ScoreGrid) -> float:
    """Binned l1-ECE: ``sum_i |sum y_i - sum z_i| / n`` over the grid's equal-width bins.

    With 15 bins this is the ECE of Guo et al. (2017) reported in the T-Cal tables.

    Examples
    --------
    >>> import numpy as np
    >>> g = ScoreGrid(15); g.update(np.array([0.9, 0.9]), np.array([1, 0]))
    >>> round(ece_l1(g), 3)
    0.4

    References
    ----------
    Guo, Pleiss, Sun, Weinberger. On calibration of modern neural networks. ICML 2017, eq. (3).
    """
    n = grid.count
    return float(np.abs(grid.sum_y - grid.sum_z).sum() / n) if n else float("nan")


def ece_l1_raw(z: np.ndarray, y: np.ndarray, bins: int = 15) -> float:
    """Raw-array twin of :func:`ece_l1` (same bin rule: ``min(floor(z * bins), bins - 1)``)."""
    z = np.asarray(z, dtype=np.float64)
    y = np.asarray(y, dtype=np.float64)
    idx = cell_index(z, bins)
    diff = np.bincount(idx, weights=y - z, minlength=bins)
    return float(np.abs(diff).sum() / len(z)) if len(z) else float("nan")


def l2_ece_squared(grid: ScoreGrid, bins: int | None = None, debiased: bool = True) -> float:
    """Plug-in or debiased (DPE) estimate of l2-ECE^2 at ``bins`` equal-width bins.

    ``T^b = (1/n) sum_i S_i^2 / N_i`` (eq. 5) and ``T^d = (1/n) sum_i (S_i^2 - Q_i) / N_i`` (eq. 6)
    with ``S_i = sum (y - z)`` and ``Q_i = sum (y - z)^2 = sum y - 2 sum zy + sum z^2`` over bin i
    (scalar binary convention; the paper's one-hot K = 2 statistic is twice this).

    Parameters
    ----------
    grid
        Fine statistics; ``bins`` must divide ``grid.bins`` (defaults to the grid's own bins).
    debiased
        ``True`` for the DPE (unbiased under calibration, may be negative), ``False`` for plug-in.

    Examples
    --------
    >>> import numpy as np
    >>> rng = np.random.default_rng(0); z = rng.random(20000); y = (rng.random(20000) < z)
    >>> g = ScoreGrid(64); g.update(z, y)
    >>> abs(l2_ece_squared(g, 8)) < 1e-3
    True

    References
    ----------
    Lee, Huang, Hassani, Dobriban. T-Cal: an optimal test for the calibration of predictive
    models. JMLR 2023, eqs. (5) and (6).
    """
    g = grid if bins is None or bins == grid.bins else grid.coarsen(bins)
    return l2_ece_squared_sums(g.n, g.sum_y - g.sum_z, g.sum_y - 2.0 * g.sum_zy + g.sum_zz, debiased)


def l2_ece_squared_raw(z: np.ndarray, y: np.ndarray, bins: int, debiased: bool = True) -> float:
    """Raw-array twin of :func:`l2_ece_squared` (same bin rule, the sums taken from the events).

    Only the occupied bins are materialised, so ``bins`` may be as large as ``2**28``.

    Examples
    --------
    >>> z = np.array([0.1, 0.2, 0.8, 0.9]); y = np.array([0, 1, 1, 1])
    >>> round(l2_ece_squared_raw(z, y, 2, debiased=False), 4), round(l2_ece_squared_raw(z, y, 2), 4)
    (0.0725, -0.015)
    """
    z = np.asarray(z, dtype=np.float64)
    r = np.asarray(y, dtype=np.float64) - z
    _, inv = np.unique(cell_index(z, bins), return_inverse=True)
    inv = inv.ravel()
    counts = np.bincount(inv).astype(np.float64)
    return l2_ece_squared_sums(counts, np.bincount(inv, r), np.bincount(inv, r * r), debiased)


def l2_ece_squared_sums(counts: np.ndarray, residual_sums: np.ndarray, squared_sums: np.ndarray,
                        debiased: bool = True) -> float:
    """Plug-in or debiased l2-ECE^2 from per-bin sums: the one implementation of eqs. (5)-(6).

    ``T^d = (1/n) sum_{N_i > 0} (S_i^2 - Q_i) / N_i`` (``T^b`` without ``Q_i``), ``n = sum N_i``.

    Parameters
    ----------
    counts
        Events per bin ``N_i`` (empty bins allowed; they contribute nothing).
    residual_sums
        ``S_i = sum (y - z)`` per bin.
    squared_sums
        ``Q_i = sum (y - z)^2`` per bin (unused for the plug-in).
    debiased
        DPE when ``True``, plug-in otherwise.

    Returns
    -------
    The estimate (scalar convention), NaN when there are no events.

    Examples
    --------
    >>> l2_ece_squared_sums(np.array([2.0, 0.0]), np.array([1.0, 0.0]), np.array([0.5, 0.0]))
    0.125
    """
    n_i = np.asarray(counts, dtype=np.float64)
    total = n_i.sum()
    if total <= 0:
        return float("nan")
    nz = n_i > 0
    s = np.asarray(residual_sums, dtype=np.float64)[nz]
    num = s * s - (np.asarray(squared_sums, dtype=np.float64)[nz] if debiased else 0.0)
    return float((num / n_i[nz]).sum() / total)


def brier(grid: ScoreGrid) -> float:
    """Mean squared error ``mean((z - y)^2)`` from the grid's sums."""
    n = grid.count
    return float((grid.sum_zz - 2.0 * grid.sum_zy + grid.sum_y).sum() / n) if n else float("nan")


def reliability(grid: ScoreGrid, bins: int | None = None) -> list[dict[str, Any]]:
    """Reliability-diagram points: per equal-width bin its edges, mean score, mean outcome and count.

    Examples
    --------
    >>> import numpy as np
    >>> g = ScoreGrid(4); g.update(np.array([0.1, 0.9]), np.array([0, 1]))
    >>> [(p["bin"], p["events"]) for p in reliability(g, 2)]
    [(0.0, 1), (0.5, 1)]
    """
    b = grid.bins if bins is None else bins
    # plain Python values, already JSON-clean: one read of the grid, one tolist(), and the cell means as Python
    # divisions (IEEE division: the same double as numpy's ``sum_z / n``, i.e. :attr:`ScoreGrid.mean_z`)
    ns, s_z, s_y = grid.fields(b)[0][:3].tolist()
    return [{"bin": lo, "hi": hi, "events": int(n), "mean_score": None if n == 0 else sz / n,
             "mean_outcome": None if n == 0 else sy / n}
            for (lo, hi), n, sz, sy in zip(_edges(b), ns, s_z, s_y)]


_EDGES: dict[int, tuple[tuple[float, float], ...]] = {}


def _edges(bins: int) -> tuple[tuple[float, float], ...]:
    """``(i / bins, (i + 1) / bins)`` per bin (cached: a configuration uses one or two bin counts)."""
    out = _EDGES.get(bins)
    if out is None:
        out = _EDGES[bins] = tuple((i / bins, (i + 1) / bins) for i in range(bins))
    return out


def classwise_ece(grid: ScoreGrid) -> float:
    """Class-wise ECE: the mean over classes of the binned l1-ECE of P(y = k) against 1[y = k].

    References
    ----------
    Kull et al. Beyond temperature scaling: obtaining well-calibrated multiclass probabilities
    with Dirichlet calibration. NeurIPS 2019, Section 3 (classwise-ECE).
    """
    if grid.channels is None:
        raise ValueError("classwise_ece needs a grid with one channel per class")
    n = grid.n.sum(axis=1)
    return float(np.mean(np.abs(grid.sum_y - grid.sum_z).sum(axis=1) / n))


def summary(stats: Any, l2_bins: int | None = None, top_label: bool = False) -> dict[str, Any]:
    """All first metrics of a :class:`~calmon.stats.model.ModelStats`.

    Returns ``count``, ``accuracy`` (binary: of the 0.5 threshold; multiclass or ``top_label``
    statistics of confidence vs correctness: top-1),
    ``base_rate`` (binary), ``mean_confidence``, ``brier`` (full multiclass Brier score when
    K > 2), ``ece`` (15-bin l1), ``ece_l2_plugin`` / ``ece_l2_debiased`` (squared l2-ECE at
    ``l2_bins`` dyadic bins; default :func:`default_l2_bins`), ``l2_bins`` and, for K > 2, ``classwise_ece``.
    """
    fine: ScoreGrid = stats.fine
    totals = fine.totals()
    n = totals[0]  # fine.count
    out: dict[str, Any] = {"count": n, "classes": stats.classes}
    if n == 0:
        return out
    if l2_bins is None:
        l2_bins = _default_l2_bins(n, fine.bins)
    # every field of the l2 grid (and of the fine grid, if needed) from one read (each field property converts
    # a whole field); the formulas are those of brier(), l2_ece_squared() and ece_l1(), term for term, on
    # arrays of the same values and layout, so the floats are the same; the accuracy's two halves are summed
    # counts (exact)
    if n < _EXACT_EVENTS:
        # the fine grid's float sums below are exact (multiples of 2**-28 below 2**25, every partial sum too),
        # so they are its integer totals converted once: the same floats without reading its cells
        g = fine.fields(l2_bins)[0]
        _, tz, ty, tzz, tzy, _ = totals
        fine_sum_z, sum_y = tz / _SCALE, ty / _SCALE
        fine_brier = float((tzz - 2 * tzy + ty) / _SCALE / n)
    else:
        f, g = fine.fields(fine.bins, l2_bins) if l2_bins != fine.bins else fine.fields() * 2
        fine_sum_z, sum_y = _sum(f[1]), float(_sum(f[2]))
        fine_brier = float(_sum(f[3] - 2.0 * f[4] + f[2]) / n)
    if stats.classes == 2 and not top_label:
        y0, y1, n0 = _halves(g, fine)  # cell 1 of the 2-cell grid holds exactly the scores >= 0.5
        correct = y1 + (n0 - y0)
        out["accuracy"] = correct / n
        out["base_rate"] = sum_y / n
        out["brier"] = fine_brier
    elif stats.classes == 2:  # top-label confidence vs correctness only
        out["accuracy"] = sum_y / n
        out["brier"] = fine_brier
    else:
        out["accuracy"] = sum_y / n
        out["brier"] = brier_multiclass(stats.classwise)
        out["top_label_brier"] = fine_brier
        out["classwise_ece"] = classwise_ece(stats.classwise)
    out["mean_confidence"] = float(fine_sum_z / n)
    out["ece"] = _ece_l1(stats.ece)
    out["l2_bins"] = l2_bins
    gy = g[2]
    out["ece_l2_plugin"], out["ece_l2_debiased"] = _l2_both(g[0], gy - g[1], gy - 2.0 * g[4] + g[3])
    return out


def _halves(g: np.ndarray, fine: ScoreGrid) -> tuple[float, float, float]:
    """``coarsen(2)``'s outcome sums and its first count, from the fields ``g`` of an even coarsening (else
    read from ``fine``).  Python sums of counts, exact in any order (integers below 2**53, or multiples of
    2**-28 below 2**25), so the floats of the integer sums the coarsening makes."""
    if g.shape[1] % 2:
        (y0, y1), (n0, _) = fine.fields(2)[0][[2, 0]].tolist()
        return y0, y1, n0
    h = g.shape[1] // 2
    ys, ns = g[[2, 0]].tolist()
    return sum(ys[:h]), sum(ys[h:]), sum(ns[:h])


def _ece_l1(grid: ScoreGrid) -> float:
    """:func:`ece_l1` from one read of the grid (the same operations on arrays of the same values)."""
    n = grid.count
    if not n:
        return float("nan")
    f = grid.fields()[0]
    return float(_sum(np.abs(f[2] - f[1])) / n)


def _l2_both(counts: np.ndarray, s: np.ndarray, q: np.ndarray) -> tuple[float, float]:
    """``(l2_ece_squared_sums(..., debiased=False), l2_ece_squared_sums(..., debiased=True))`` in one pass
    (the same operations on the same arrays: ``x - 0.0`` is ``x``, so the plug-in is the same float)."""
    total = _sum(counts)
    if total <= 0:
        return float("nan"), float("nan")
    nz = counts > 0
    ss = s[nz]
    sq, nn = ss * ss, counts[nz]
    return float(_sum(sq / nn) / total), float(_sum((sq - q[nz]) / nn) / total)


def brier_multiclass(classwise: ScoreGrid) -> float:
    """Multiclass Brier score ``mean sum_k (p_k - 1[y = k])^2`` from the class-wise grid."""
    n = classwise.n[0].sum()
    return float((classwise.sum_zz - 2.0 * classwise.sum_zy + classwise.sum_y).sum() / n)


@functools.lru_cache(maxsize=4096)
def _default_l2_bins(n: int, grid_bins: int) -> int:
    """:func:`default_l2_bins`, cached (windows' counts repeat across rounds)."""
    return default_l2_bins(n, grid_bins)


def default_l2_bins(n: int, grid_bins: int) -> int:
    """Dyadic bins nearest below T-Cal's ``m* = n^(2/(4s + K - 1))`` for K = 2 and smoothness s = 1.

    (Algorithm 1; the adaptive test scans all levels, this is the single reporting scale.)
    """
    m = max(n, 2) ** 0.4
    return int(min(2 ** max(int(np.floor(np.log2(m))), 1), grid_bins))
