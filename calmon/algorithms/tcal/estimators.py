"""T-Cal estimators: plug-in and debiased l2-ECE^2, their exact null variance, and the scale rules.

Scalar convention for binary scores (the paper's one-hot K = 2 value is twice it); one-hot cube
cells for K > 2.  See :mod:`calmon.algorithms.tcal` for the formulas.

References
----------
Lee, Huang, Hassani, Dobriban. T-Cal: An optimal test for the calibration of predictive models.
JMLR 24 (2023): eqs. (5)-(7), Algorithm 1, Theorem 3.
"""

from __future__ import annotations

import functools
import math

import numpy as np

from calmon.algorithms.ece import l2_ece_squared, l2_ece_squared_raw
from calmon.stats.grid import ScoreGrid, cell_index

__all__ = [
    "check_binary", "check_bins", "check_grid", "n_levels", "theorem3_bins", "theorem3_threshold", "ece2_raw",
    "null_variance_raw", "ece2_multiclass_raw", "grid_cells", "ece2_grid", "null_variance_grid", "level_cell_sums",
    "single_tail", "level_sums", "grid_level_cells",
]

#: Elements (levels x atoms) of the tiled atoms summed per ``reduceat`` by :func:`level_cell_sums`.
_TILE_ELEMENTS = 1 << 16


# ----------------------------------------------------------------------------------------------------------
# validation and small helpers
# ----------------------------------------------------------------------------------------------------------
def check_binary(z: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    z = np.asarray(z, dtype=np.float64)
    y = np.asarray(y, dtype=np.float64)
    if z.ndim != 1 or y.shape != z.shape:
        raise ValueError(f"z and y must be 1-d arrays of the same length, got shapes {z.shape} and {y.shape}")
    if not np.all(np.isfinite(z)) or np.any((z < 0) | (z > 1)):
        raise ValueError("scores z must be finite and lie in [0, 1]")
    if np.any((y != 0) & (y != 1)):
        raise ValueError("outcomes y must be 0 or 1")
    return z, y


def check_bins(bins: int) -> int:
    if int(bins) != bins or bins < 1:
        raise ValueError(f"number of bins must be a positive integer, got {bins!r}")
    return int(bins)


def n_levels(n: int, classes: int = 2) -> int:
    """Number of dyadic scales of adaptive T-Cal, ``B = ceil((2/(K-1)) log2(n / sqrt(ln n)))`` (eq. 7).

    Parameters
    ----------
    n
        Sample size.
    classes
        Number of classes K.

    Returns
    -------
    ``B >= 1`` (1 when ``n < 3``).

    Examples
    --------
    >>> n_levels(10_000), n_levels(50_000)
    (24, 28)

    References
    ----------
    T-Cal paper, eq. (7) and Algorithm 2 (the authors' code uses floor; we follow the paper's ceil).
    """
    if classes < 2:
        raise ValueError(f"classes must be >= 2, got {classes}")
    if n < 3:
        return 1
    return max(1, math.ceil((2.0 / (classes - 1)) * math.log2(n / math.sqrt(math.log(n)))))


def theorem3_bins(n: int, s: float, classes: int = 2) -> int:
    """Optimal number of bins of Theorem 3, ``m* = floor(n**(2 / (4 s + K - 1)))`` (at least 1).

    Parameters
    ----------
    n
        Sample size.
    s
        Hoelder smoothness of the mis-calibration curve.
    classes
        Number of classes K.

    Returns
    -------
    ``m*``.

    Examples
    --------
    >>> theorem3_bins(10_000, 0.6)
    225
    """
    if s <= 0:
        raise ValueError(f"smoothness s must be positive, got {s}")
    return max(1, int(math.floor(n ** (2.0 / (4.0 * s + classes - 1)))))


def theorem3_threshold(n: int, bins: int, alpha: float, classes: int = 2, scalar: bool = True) -> float:
    """Closed-form critical value of Theorem 3 (Chebyshev), valid but conservative.

    Parameters
    ----------
    n
        Sample size.
    bins
        Number of bins ``m`` (per axis).
    alpha
        Level.
    classes
        Number of classes K.
    scalar
        For K = 2, return the threshold in the scalar convention (half the one-hot threshold).

    Returns
    -------
    ``sqrt(2 K**2 / alpha) * min(m**((K-1)/2) / n, m**(-(K-1)/2))`` (halved when ``scalar``).

    Examples
    --------
    >>> round(theorem3_threshold(10_000, 16, 0.05, scalar=False), 6)
    0.00506

    References
    ----------
    T-Cal paper, Algorithm 1 and Theorem 3.
    """
    if not 0 < alpha < 1:
        raise ValueError(f"alpha must lie in (0, 1), got {alpha}")
    c = min(bins ** ((classes - 1) / 2) / n, bins ** (-(classes - 1) / 2))
    t = math.sqrt(2.0 * classes**2 / alpha) * c
    return t / 2.0 if (scalar and classes == 2) else t


# ----------------------------------------------------------------------------------------------------------
# estimators from raw samples
# ----------------------------------------------------------------------------------------------------------
def _raw_cells(z: np.ndarray, y: np.ndarray, bins: int) -> dict[str, np.ndarray]:
    idx = cell_index(z, bins)
    _, inv = np.unique(idx, return_inverse=True)
    r = y - z
    v = z * (1.0 - z)
    return {"N": np.bincount(inv).astype(np.float64), "S": np.bincount(inv, r), "Q": np.bincount(inv, r * r),
            "V": np.bincount(inv, v), "W": np.bincount(inv, v * v)}


def ece2_raw(z: np.ndarray, y: np.ndarray, bins: int, debiased: bool = True) -> float:
    """Plug-in (eq. 5) or debiased (DPE, eq. 6) estimate of l2-ECE^2 from raw binary samples.

    Parameters
    ----------
    z, y
        Scores ``P(y = 1)`` (or top-label confidence) in [0, 1] and 0/1 outcomes, shape ``(n,)``.
    bins
        Number of equal-width bins ``m``; ``z = 1`` falls in the last bin.
    debiased
        ``True`` for the DPE ``T^d`` (can be negative), ``False`` for the plug-in ``T^b``.

    Returns
    -------
    The estimate in the scalar convention (the paper's one-hot value for K = 2 is twice this).

    Examples
    --------
    >>> z = np.array([0.1, 0.2, 0.8, 0.9]); y = np.array([0, 1, 1, 1])
    >>> round(ece2_raw(z, y, 2, debiased=False), 4), round(ece2_raw(z, y, 2), 4)
    (0.0725, -0.015)

    References
    ----------
    T-Cal paper, eqs. (5) and (6).
    """
    z, y = check_binary(z, y)
    bins = check_bins(bins)
    if z.size == 0:
        raise ValueError("need at least one sample")
    return l2_ece_squared_raw(z, y, bins, debiased)


def null_variance_raw(z: np.ndarray, bins: int) -> float:
    """Exact variance of the DPE under calibration, conditionally on the scores.

    ``Var(T^d | Z) = (2 / n**2) sum_i (V_i**2 - W_i) / N_i**2`` with ``V_i = sum z(1-z)`` and
    ``W_i = sum (z(1-z))**2`` over bin ``i``.

    Parameters
    ----------
    z
        Scores in [0, 1], shape ``(n,)``.
    bins
        Number of equal-width bins.

    Returns
    -------
    The variance (scalar convention).

    Examples
    --------
    >>> round(null_variance_raw(np.array([0.5, 0.5]), 1), 6)
    0.015625
    """
    z, _ = check_binary(z, np.zeros_like(np.asarray(z, dtype=np.float64)))
    bins = check_bins(bins)
    c = _raw_cells(z, np.zeros_like(z), bins)
    return float(2.0 / z.size**2 * ((c["V"] ** 2 - c["W"]) / c["N"] ** 2).sum())


def ece2_multiclass_raw(probs: np.ndarray, labels: np.ndarray, bins: int, debiased: bool = True) -> float:
    """Plug-in or debiased l2-ECE^2 for K classes (one-hot convention, cube cells).

    A sample falls in the cell ``(floor(m z_1), ..., floor(m z_K))`` (each clipped to ``m - 1``): cubes of
    side ``1/m`` intersected with the simplex, nested across ``m = 2**b``.

    Parameters
    ----------
    probs
        Probability vectors, shape ``(n, K)``, rows in the simplex.
    labels
        Class indices in ``0..K-1``, shape ``(n,)``.
    bins
        Cells per axis ``m``.
    debiased
        DPE (eq. 6) when ``True``, plug-in (eq. 5) otherwise.

    Returns
    -------
    The estimate of ``E ||E[Y|Z] - Z||_2**2`` (for K = 2 twice :func:`ece2_raw` on ``probs[:, 1]``).

    Examples
    --------
    >>> p = np.array([[0.9, 0.1], [0.8, 0.2], [0.2, 0.8], [0.1, 0.9]])
    >>> round(ece2_multiclass_raw(p, np.array([1, 0, 1, 1]), 2), 4)  # 2 x ece2_raw on column 1
    -0.08

    References
    ----------
    T-Cal paper, eqs. (5)-(6); cube partition: Section 3.1 ("any partition with Theta(m^-(K-1)) volumes").
    """
    probs = np.asarray(probs, dtype=np.float64)
    labels = np.asarray(labels)
    if probs.ndim != 2 or probs.shape[1] < 2 or labels.shape != (probs.shape[0],):
        raise ValueError(f"need probs of shape (n, K >= 2) and labels of shape (n,), got {probs.shape}, "
                         f"{labels.shape}")
    if probs.shape[0] == 0:
        raise ValueError("need at least one sample")
    if not np.all(np.isfinite(probs)) or np.any((probs < 0) | (probs > 1)):
        raise ValueError("probabilities must be finite and lie in [0, 1]")
    n, k = probs.shape
    if not np.issubdtype(labels.dtype, np.integer) or labels.min() < 0 or labels.max() >= k:
        raise ValueError(f"labels must be integers in [0, {k - 1}]")
    bins = check_bins(bins)
    idx = cell_index(probs, bins)
    _, inv = np.unique(idx, axis=0, return_inverse=True)
    inv = inv.ravel()
    r = -probs.copy()
    r[np.arange(n), labels] += 1.0
    N = np.bincount(inv).astype(np.float64)
    S2 = sum(np.bincount(inv, r[:, j], minlength=N.size) ** 2 for j in range(k))
    Q = np.bincount(inv, (r * r).sum(axis=1), minlength=N.size)
    return float(((S2 - (Q if debiased else 0.0)) / N).sum() / n)


# ----------------------------------------------------------------------------------------------------------
# estimators from binned statistics
# ----------------------------------------------------------------------------------------------------------
def check_grid(grid: ScoreGrid) -> None:
    if not isinstance(grid, ScoreGrid):
        raise ValueError(f"expected a ScoreGrid, got {type(grid).__name__}")
    if grid.channels is not None:
        raise ValueError("T-Cal needs a single-channel grid (binary score or top-label confidence)")


def grid_cells(grid: ScoreGrid, bins: int | None = None) -> dict[str, np.ndarray]:
    """Per-cell ``N, S, Q, V, W`` of a grid coarsened to ``bins`` cells (non-empty cells only).

    Parameters
    ----------
    grid
        Single-channel :class:`ScoreGrid`.
    bins
        Number of cells (must divide ``grid.bins``); default the grid's own.

    Returns
    -------
    dict of float arrays ``N, S, Q, V, W`` over the non-empty cells.

    Examples
    --------
    >>> g = ScoreGrid(bins=4); g.update(np.array([0.1, 0.2, 0.9]), np.array([0, 1, 1]))
    >>> grid_cells(g, 2)["N"].tolist()
    [2.0, 1.0]
    """
    check_grid(grid)
    g = grid if bins is None or bins == grid.bins else grid.coarsen(check_bins(bins))
    n = g.n
    ok = n > 0
    sy, sz, szz, szy = g.sum_y[ok], g.sum_z[ok], g.sum_zz[ok], g.sum_zy[ok]
    return {"N": n[ok], "S": sy - sz, "Q": sy - 2.0 * szy + szz, "V": sz - szz, "W": g.sum_vv[ok]}


def ece2_grid(grid: ScoreGrid, bins: int | None = None, debiased: bool = True) -> float:
    """Plug-in or debiased l2-ECE^2 (scalar convention) from binned sufficient statistics.

    Parameters
    ----------
    grid
        Single-channel :class:`ScoreGrid`.
    bins
        Number of equal-width cells (divides ``grid.bins``); default the grid's own.
    debiased
        DPE (eq. 6) when ``True``, plug-in (eq. 5) otherwise.

    Returns
    -------
    The estimate; equals :func:`ece2_raw` on the same data up to the grid's 2**-28 fixed point.

    Examples
    --------
    >>> g = ScoreGrid(bins=4); g.update(np.array([0.1, 0.2, 0.8, 0.9]), np.array([0, 1, 1, 1]))
    >>> round(ece2_grid(g, 2, debiased=False), 4), round(ece2_grid(g, 2), 4)
    (0.0725, -0.015)

    References
    ----------
    T-Cal paper, eqs. (5)-(6), with the additive statistics of the spec.
    """
    if grid.count == 0:
        raise ValueError("grid is empty")
    return l2_ece_squared(grid, bins, debiased)


def null_variance_grid(grid: ScoreGrid, bins: int | None = None) -> float:
    """Exact null variance of the DPE from a grid (see :func:`null_variance_raw`).

    Parameters
    ----------
    grid
        Single-channel :class:`ScoreGrid`.
    bins
        Number of cells (divides ``grid.bins``).

    Returns
    -------
    ``(2 / n**2) sum_i (V_i**2 - W_i) / N_i**2``.

    Examples
    --------
    >>> g = ScoreGrid(bins=2); g.update(np.array([0.5, 0.5]), np.array([0, 1]))
    >>> round(null_variance_grid(g, 1), 6)
    0.015625
    """
    c = grid_cells(grid, bins)
    n = c["N"].sum()
    if n == 0:
        raise ValueError("grid is empty")
    return float(2.0 / n**2 * (np.maximum(c["V"] ** 2 - c["W"], 0.0) / c["N"] ** 2).sum())


# ----------------------------------------------------------------------------------------------------------
# cell sums of every level at once (the Monte Carlo engine's atoms, :meth:`Atoms.add_levels`)
# ----------------------------------------------------------------------------------------------------------
def level_cell_sums(X: np.ndarray, level: np.ndarray, start: np.ndarray, cells: np.ndarray) -> np.ndarray:
    """``(rows, cells)``: rows of ``X`` (atoms) summed over every level's cells, bit for bit one ``reduceat`` per
    level (the atoms tiled once per level, a few levels at a time on many atoms).  Trailing levels whose cells
    are single atoms (the grid's own cells, fine levels of raw data) are the atoms themselves."""
    A = X.shape[1]
    L = cells.size - single_tail(cells, A)[1]
    per = max(1, _TILE_ELEMENTS // A)
    parts = []
    first = 0
    for lo in range(0, L, per):
        hi = min(lo + per, L)
        last = first + int(cells[lo:hi].sum())
        parts.append(np.add.reduceat(np.tile(X, (1, hi - lo)), (level[first:last] - lo) * A + start[first:last],
                                     axis=1))
        first = last
    if L < cells.size:
        parts.append(np.tile(X, (1, cells.size - L)))
    return parts[0] if len(parts) == 1 else np.concatenate(parts, axis=1)


def single_tail(cells: np.ndarray, atoms: int) -> tuple[int, int]:
    """Cells before the trailing levels whose cells are single atoms, and how many such levels."""
    L = cells.size
    while L and cells[L - 1] == atoms:
        L -= 1
    return int(cells[:L].sum()), cells.size - L


def level_sums(v: np.ndarray, level: np.ndarray, levels: int) -> np.ndarray:
    """``(rows, levels)``: each row of ``v`` summed over the entries of each level (``level``: non-decreasing),
    bit for bit ``v[:, level == j].sum(axis=1)`` -- a zero ahead of each level's entries: ``ndarray.sum`` starts
    from it."""
    pad = np.zeros((v.shape[0], level.size + levels))
    pad[:, np.arange(1, level.size + 1) + level] = v  # after the zeros of its own and the earlier levels
    firsts = np.arange(levels)
    return np.add.reduceat(pad, level.searchsorted(firsts) + firsts, axis=1)


@functools.lru_cache(maxsize=64)
def grid_level_cells(fine: int, ms: tuple[int, ...]) -> tuple[np.ndarray, np.ndarray]:
    """Every cell of levels ``ms`` of a grid of ``fine`` cells: its first fine cell and one past its last
    (``(2, cells)``), and its level."""
    bad = [m for m in ms if fine % m]
    if bad:
        raise ValueError(f"level with {bad[0]} bins does not divide the grid's {fine} cells")
    lo = np.concatenate([np.arange(m) * (fine // m) for m in ms])
    bounds = np.stack([lo, lo + np.repeat([fine // m for m in ms], ms)])
    lev = np.repeat(np.arange(len(ms)), ms)
    bounds.setflags(write=False)
    lev.setflags(write=False)
    return bounds, lev
