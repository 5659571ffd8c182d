"""First calibration metrics from binned statistics, with raw-array twins for checking.

Conventions: ``z`` is the binary score P(y = 1) or the top-label confidence; ``y`` the 0/1
outcome (label, or top-label correctness).  The l2-ECE estimators use the scalar binary form
(Z = P(y = 1), Y in {0, 1}); the paper's one-hot statistic for K = 2 is exactly twice it.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from calmon.stats.grid import ScoreGrid, cell_index


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
    g = grid if bins is None or bins == grid.bins else grid.coarsen(bins)
    # plain Python values, already JSON-clean: one tolist() per field, and the cell means as Python
    # divisions (IEEE division: the same double as numpy's ``sum_z / n``, i.e. :attr:`ScoreGrid.mean_z`)
    edges = _edges(g.bins)
    return [{"bin": lo, "hi": hi, "events": int(n), "mean_score": None if n == 0 else sz / n,
             "mean_outcome": None if n == 0 else sy / n}
            for (lo, hi), n, sz, sy in zip(edges, g.n.tolist(), g.sum_z.tolist(), g.sum_y.tolist())]


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
    n = fine.count
    out: dict[str, Any] = {"count": n, "classes": stats.classes}
    if n == 0:
        return out
    if l2_bins is None:
        l2_bins = default_l2_bins(n, fine.bins)
    # each field of the fine grid read once (a read converts the whole field); the formulas are those of
    # brier(), l2_ece_squared() and ece_l1(), term for term, so the floats are the same.  The accuracy's two
    # cells come from the small l2 grid (integer sums: the same cells whichever grid they are summed from).
    g = fine if l2_bins == fine.bins else fine.coarsen(l2_bins)
    fy, fz, fzz, fzy = fine.sum_y, fine.sum_z, fine.sum_zz, fine.sum_zy
    fine_brier = float((fzz - 2.0 * fzy + fy).sum() / n)
    sum_y = float(fy.sum())
    if stats.classes == 2 and not top_label:
        upper = (g if g.bins % 2 == 0 else fine).coarsen(2)  # cell 1 holds exactly the scores >= 0.5
        (y0, y1), n0 = upper.sum_y.tolist(), upper.n.tolist()[0]
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
    out["mean_confidence"] = float(fz.sum() / n)
    out["ece"] = ece_l1(stats.ece)
    out["l2_bins"] = l2_bins
    gy, gz, gzz, gzy = (fy, fz, fzz, fzy) if g is fine else (g.sum_y, g.sum_z, g.sum_zz, g.sum_zy)
    out["ece_l2_plugin"], out["ece_l2_debiased"] = _l2_both(g.n, gy - gz, gy - 2.0 * gzy + gzz)
    return out


def _l2_both(counts: np.ndarray, s: np.ndarray, q: np.ndarray) -> tuple[float, float]:
    """``(l2_ece_squared_sums(..., debiased=False), l2_ece_squared_sums(..., debiased=True))`` in one pass
    (the same operations on the same arrays: ``x - 0.0`` is ``x``, so the plug-in is the same float)."""
    total = counts.sum()
    if total <= 0:
        return float("nan"), float("nan")
    nz = counts > 0
    ss = s[nz]
    sq, nn = ss * ss, counts[nz]
    return float((sq / nn).sum() / total), float(((sq - q[nz]) / nn).sum() / total)


def brier_multiclass(classwise: ScoreGrid) -> float:
    """Multiclass Brier score ``mean sum_k (p_k - 1[y = k])^2`` from the class-wise grid."""
    n = classwise.n[0].sum()
    return float((classwise.sum_zz - 2.0 * classwise.sum_zy + classwise.sum_y).sum() / n)


def default_l2_bins(n: int, grid_bins: int) -> int:
    """Dyadic bins nearest below T-Cal's ``m* = n^(2/(4s + K - 1))`` for K = 2 and smoothness s = 1.

    (Algorithm 1; the adaptive test scans all levels, this is the single reporting scale.)
    """
    m = max(n, 2) ** 0.4
    return int(min(2 ** max(int(np.floor(np.log2(m))), 1), grid_bins))
