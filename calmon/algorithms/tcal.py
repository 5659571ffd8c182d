"""T-Cal: debiased l2-ECE and the adaptive calibration test (Lee, Huang, Hassani, Dobriban, JMLR 2023).

Convention
----------
Binary predictors (and top-label confidence with ``y`` = correct) use the *scalar* form of the
authors' code: ``z = P(y = 1)``, residual ``r = y - z``.  The paper's one-hot form for K = 2 counts both
coordinates and is exactly **twice** the scalar value; :func:`theorem3_threshold` converts.  For K > 2
(:func:`ece2_multiclass_raw`) the one-hot form is used with cube cells ``floor(m z_k)`` (clipped).

Per cell ``i`` (``N_i`` events, ``S_i = sum r``, ``Q_i = sum r**2``):

* plug-in, eq. (5):   ``T^b = (1/n) sum_{N_i >= 1} S_i**2 / N_i``
* debiased (DPE), eq. (6): ``T^d = (1/n) sum_{N_i >= 1} (S_i**2 - Q_i) / N_i``

From a :class:`~calmon.stats.grid.ScoreGrid`: ``S = sum_y - sum_z``, ``Q = sum_y - 2 sum_zy + sum_zz``.
Under calibration and conditionally on the scores, ``E T^d = 0`` and
``Var T^d = (2/n**2) sum_i (V_i**2 - W_i) / N_i**2`` with ``V = sum z(1-z)`` (= ``sum_z - sum_zz``) and
``W = sum (z(1-z))**2`` (= ``sum_vv``): exact, and available from the grid.

Critical values
---------------
``"mc-raw"`` (a)
    Y-only Monte Carlo on raw scores (full data or a reservoir sample): keep ``z``, draw ``y* ~ Ber(z)``.
    Observed and simulated statistics are exchangeable under the null, so the rank p-value
    ``(1 + #{T* >= T}) / (R + 1)`` is exact (Appendix C.3).  Identical scores are grouped into atoms and
    drawn as ``Bin(count, z)`` -- still exact.
``"mc-grid"`` (b)
    The same on the fine grid: per non-empty fine cell ``k ~ Bin(N, zbar)``; every coarser level is
    aggregated from the same draws (joint null across levels).  Approximate (the within-cell spread of
    ``z`` is ignored; the binomial slightly over-disperses, which errs on the conservative side);
    the error shrinks with the cell width.
``"cantelli"`` (c)
    One-sided Chebyshev (Cantelli) bound ``P(T >= t) <= s2 / (s2 + t**2)`` with the exact null variance
    ``s2``: a valid, conservative p-value needing no simulation.
``"theorem3"`` (c)
    The closed-form threshold of Theorem 3, ``sqrt(2 K**2 / a) * min(m**((K-1)/2) / n, m**(-(K-1)/2))``
    (one-hot units), turned into a p-value ``min(1, 2 K**2 c**2 / T_onehot**2)``.

``"moment3"``
    Pearson's three-moment chi-square approximation with the exact null variance and third cumulant
    ``E T^3 = (8/n^3) sum_i (e2(mu3) + 6 e3(v)) / N_i^3`` (``e_k`` elementary symmetric polynomials of the
    ``v_j = z_j(1-z_j)`` and ``mu3_j = v_j (1 - 2 z_j)`` in bin ``i``).  Not exact, but in our checks within
    Monte Carlo error of 20,000 draws down to p ~ 1e-3.

Combining levels
----------------
``combine="bonferroni"`` is Algorithm 2 (level ``alpha / L`` per scale).  ``combine="minp"`` is a max-type
combination over the joint null: ``M = min_b q_b(T_b)`` with ``q_b`` the three-moment tail of level ``b``
(a fixed continuous transform given the scores), and the exact Monte Carlo rank p-value of ``M``.

Speed
-----
Monte Carlo is *curtailed*: draws stop as soon as no level can reach rejection any more (every level
has more than ``alpha_b (R + 1) - 1`` exceedances); the reported p-value of such a level is the
Besag-Clifford sequential p-value ``h / L``, which is valid, and the decision is identical to that of
the full ``R``-draw test on the same random stream.  With ``screen=True`` the exact Cantelli bound is
tried first (when it already rejects, no simulation is run), then the three-moment approximation: when it
puts every level's p-value above ``accept_margin`` (4) times the level's alpha, the test accepts without
simulating.  Rejections therefore always come from an exact bound or the exact Monte Carlo test.

References
----------
Lee, Huang, Hassani, Dobriban. T-Cal: An optimal test for the calibration of predictive models.
JMLR 24 (2023): eqs. (5)-(7), Algorithms 1-2, Theorems 3 and 5, Appendix B.4 and C.3.
Besag, Clifford. Sequential Monte Carlo p-values. Biometrika 78 (1991).
Westfall, Young. Resampling-based multiple testing (1993): min-p combinations over a joint null.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from scipy import sparse, special

from calmon.algorithms.binomial_test import binomial_test, discrete_support, grid_discrete_support
from calmon.algorithms.ece import l2_ece_squared
from calmon.stats.grid import ScoreGrid, cell_index
from calmon.testers import CalibrationData, register_tester

METHODS = ("auto", "mc-raw", "mc-grid", "cantelli", "theorem3", "moment3", "binomial")
COMBINES = ("bonferroni", "minp")
#: Elements (draws x atoms) simulated per batch; bounds memory to a few tens of MB.
_BATCH_ELEMENTS = 2_000_000
#: Relative tolerance (in null standard deviations) counting near-ties as exceedances (conservative).
_TIE_TOL = 1e-7


# ----------------------------------------------------------------------------------------------------------
# validation and small helpers
# ----------------------------------------------------------------------------------------------------------
def _check_binary(z: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    z = np.asarray(z, dtype=np.float64)
    y = np.asarray(y, dtype=np.float64)
    if z.ndim != 1 or y.shape != z.shape:
        raise ValueError(f"z and y must be 1-d arrays of the same length, got shapes {z.shape} and {y.shape}")
    if not np.all(np.isfinite(z)) or np.any((z < 0) | (z > 1)):
        raise ValueError("scores z must be finite and lie in [0, 1]")
    if np.any((y != 0) & (y != 1)):
        raise ValueError("outcomes y must be 0 or 1")
    return z, y


def _check_bins(bins: int) -> int:
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
    z, y = _check_binary(z, y)
    bins = _check_bins(bins)
    if z.size == 0:
        raise ValueError("need at least one sample")
    c = _raw_cells(z, y, bins)
    num = c["S"] ** 2 - (c["Q"] if debiased else 0.0)
    return float((num / c["N"]).sum() / z.size)


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
    z, _ = _check_binary(z, np.zeros_like(np.asarray(z, dtype=np.float64)))
    bins = _check_bins(bins)
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
    bins = _check_bins(bins)
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
def _check_grid(grid: ScoreGrid) -> None:
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
    _check_grid(grid)
    g = grid if bins is None or bins == grid.bins else grid.coarsen(_check_bins(bins))
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


def cantelli_pvalue(statistic: float, variance: float) -> float:
    """One-sided Chebyshev (Cantelli) bound on ``P(T >= t)`` for a mean-zero ``T``.

    Parameters
    ----------
    statistic
        Observed ``t``.
    variance
        Exact null variance of ``T``.

    Returns
    -------
    ``variance / (variance + t**2)`` for ``t > 0``, else 1.

    Examples
    --------
    >>> cantelli_pvalue(3.0, 1.0)
    0.1
    """
    if statistic <= 0:
        return 1.0
    if variance <= 0:
        return 0.0
    return float(variance / (variance + statistic * statistic))


def three_moment_pvalue(statistic: float, variance: float, third: float) -> float:
    """Approximate ``P(T >= t)`` by a shifted, scaled chi-square matching mean 0, variance and third cumulant.

    ``T ~ a (chi2_nu - nu)`` with ``a = k3 / (4 k2)`` and ``nu = 8 k2**3 / k3**2`` (Pearson's three-moment
    approximation, standard for quadratic forms); a normal tail when ``k3 <= 0``.  An approximation, used
    only to *accept* clear cases before simulating (with a safety margin), never to reject.

    Parameters
    ----------
    statistic
        Observed ``t``.
    variance, third
        Null variance ``k2`` and third cumulant ``k3`` of ``T``.

    Returns
    -------
    The approximate upper-tail probability.

    Examples
    --------
    >>> round(three_moment_pvalue(2.0, 2.0, 8.0), 4)  # exactly chi2_1 - 1: P(chi2_1 >= 3)
    0.0833
    """
    if variance <= 0:
        return 1.0 if statistic <= 0 else 0.0
    if third <= 0:
        return float(special.ndtr(-statistic / math.sqrt(variance)))
    a = third / (4.0 * variance)
    nu = 8.0 * variance**3 / third**2
    return float(special.chdtrc(nu, max(nu + statistic / a, 0.0)))


# ----------------------------------------------------------------------------------------------------------
# the Monte Carlo engine: atoms (raw distinct scores, or non-empty fine cells) and their level segments
# ----------------------------------------------------------------------------------------------------------
@dataclass
class _Level:
    bins: int
    starts_all: np.ndarray  # atom index where each non-empty cell starts (cells are contiguous atom runs)
    keep: np.ndarray  # cells with N >= 2 (a single event contributes exactly 0 to the DPE)
    N: np.ndarray  # kept cells only, as Z, ZZ, V, W
    Z: np.ndarray  # sum z over the cell
    ZZ: np.ndarray  # sum z^2
    V: np.ndarray
    W: np.ndarray
    P3: np.ndarray
    M1: np.ndarray
    M2: np.ndarray
    source: int = -1  # level whose cells this level's cells are unions of (-1: the atoms)
    full: bool = True  # sums of all cells (usable as a source) or of the kept cells only
    matrix: Any = None  # sparse 0/1 matrix summing source rows into this level's cells


@dataclass
class _Atoms:
    """Sorted atoms: N events with (approximately) one score each; draws are Bin(N, p)."""

    n: int
    N: np.ndarray
    p: np.ndarray
    zsum: np.ndarray
    zzsum: np.ndarray
    V: np.ndarray
    W: np.ndarray
    k_obs: np.ndarray  # observed positives
    g_obs: np.ndarray  # observed sum y(1 - 2z)
    exact: bool
    key: np.ndarray  # raw: the score; grid: the fine cell index
    P3: np.ndarray  # sum v^3 (grid: W^2 / V, exact when the cell's scores are equal)
    M1: np.ndarray  # sum E r^3 = sum v (1 - 2z) (grid: V (1 - 2 zbar))
    M2: np.ndarray  # sum (E r^3)^2 (grid: M1^2 / N)
    fine_bins: int | None = None
    levels: list[_Level] = field(default_factory=list)
    _plan: list[int] | None = None

    @classmethod
    def from_raw(cls, z: np.ndarray, y: np.ndarray) -> _Atoms:
        vals, inv, cnt = np.unique(z, return_inverse=True, return_counts=True)
        inv = inv.ravel()
        k = np.bincount(inv, weights=y, minlength=vals.size)
        v = vals * (1.0 - vals)
        N = cnt.astype(np.float64)
        mu3 = v * (1.0 - 2.0 * vals)
        return cls(n=z.size, N=N, p=vals, zsum=vals * N, zzsum=vals * vals * N, V=v * N, W=v * v * N,
                   k_obs=k, g_obs=k * (1.0 - 2.0 * vals), exact=True, key=vals, P3=N * v**3, M1=N * mu3,
                   M2=N * mu3**2)

    @classmethod
    def from_grid(cls, grid: ScoreGrid) -> _Atoms:
        n = grid.n
        ok = np.flatnonzero(n > 0)
        N = n[ok]
        sz, szz, sy, szy = grid.sum_z[ok], grid.sum_zz[ok], grid.sum_y[ok], grid.sum_zy[ok]
        p = np.clip(sz / N, 0.0, 1.0)
        V = np.maximum(sz - szz, 0.0)
        W = grid.sum_vv[ok]
        M1 = V * (1.0 - 2.0 * p)
        with np.errstate(invalid="ignore", divide="ignore"):
            P3 = np.where(V > 0, W * W / np.where(V > 0, V, 1.0), 0.0)
        return cls(n=int(N.sum()), N=N, p=p, zsum=sz, zzsum=szz, V=V, W=W, k_obs=np.rint(sy),
                   g_obs=sy - 2.0 * szy, exact=False, key=ok, P3=P3, M1=M1, M2=M1 * M1 / N, fine_bins=grid.bins)

    def add_level(self, bins: int) -> _Level:
        if self.fine_bins is None:
            idx = cell_index(self.key, bins)
        else:
            if self.fine_bins % bins:
                raise ValueError(f"level with {bins} bins does not divide the grid's {self.fine_bins} cells")
            idx = self.key // (self.fine_bins // bins)
        starts = np.r_[0, np.flatnonzero(np.diff(idx)) + 1]
        sums = {name: np.add.reduceat(getattr(self, name), starts)
                for name in ("N", "zsum", "zzsum", "V", "W", "P3", "M1", "M2")}
        keep = sums["N"] >= 2
        lev = _Level(bins=bins, starts_all=starts, keep=keep, N=sums["N"][keep], Z=sums["zsum"][keep],
                     ZZ=sums["zzsum"][keep], V=sums["V"][keep], W=sums["W"][keep], P3=sums["P3"][keep],
                     M1=sums["M1"][keep], M2=sums["M2"][keep])
        self.levels.append(lev)
        self._plan = None
        return lev

    def _make_plan(self) -> list[int]:
        """Order levels finest first; choose for each how its cell sums are computed.

        A level with many cells (more than half the atoms: mostly singletons) sums only its kept cells
        straight from the atoms; a coarser level sums all its cells from the finest level computed in
        full that it coarsens (dyadic levels nest), so the total work is a few passes over the atoms.
        """
        order = sorted(range(len(self.levels)), key=lambda j: -self.levels[j].starts_all.size)
        A = self.N.size
        atom_ids = np.arange(A)
        full_done: list[int] = []
        for j in order:
            lev = self.levels[j]
            cells = lev.starts_all.size
            owner = np.repeat(np.arange(cells), np.diff(np.r_[lev.starts_all, A]))  # cell of each atom
            if 2 * cells > A:
                rows = np.flatnonzero(lev.keep[owner])
                kept_id = np.cumsum(lev.keep) - 1
                lev.source, lev.full = -1, False
                lev.matrix = sparse.csr_matrix((np.ones(rows.size), (kept_id[owner[rows]], atom_ids[rows])),
                                               shape=(int(lev.keep.sum()), A))
                continue
            lev.source, lev.full = -1, True
            src_starts, src_size = np.arange(A), A
            for i in reversed(full_done):  # the coarsest finer level that nests: fewest rows to sum
                cand = self.levels[i].starts_all
                pos = np.searchsorted(cand, lev.starts_all)
                if np.all(pos < cand.size) and np.array_equal(cand[pos], lev.starts_all):
                    lev.source, src_starts, src_size = i, cand, cand.size
                    break
            src_owner = owner[src_starts]  # this level's cell of each source row
            lev.matrix = sparse.csr_matrix((np.ones(src_size), (src_owner, np.arange(src_size))),
                                           shape=(cells, src_size))
            full_done.append(j)
        self._plan = order
        return order

    def observed(self) -> tuple[np.ndarray, np.ndarray]:
        """Observed DPE and plug-in at every level (segment sums; no simulation plan needed)."""
        dpe = np.zeros(len(self.levels))
        plug = np.zeros(len(self.levels))
        s_atom = self.k_obs - self.zsum
        q_atom = self.g_obs + self.zzsum
        for j, lev in enumerate(self.levels):
            N = np.add.reduceat(self.N, lev.starts_all)
            S = np.add.reduceat(s_atom, lev.starts_all)
            Q = np.add.reduceat(q_atom, lev.starts_all)
            plug[j] = (S * S / N).sum() / self.n
            k = lev.keep
            dpe[j] = ((S[k] * S[k] - Q[k]) / N[k]).sum() / self.n
        return dpe, plug

    def variance(self, lev: _Level) -> float:
        return float(2.0 / self.n**2 * (np.maximum(lev.V**2 - lev.W, 0.0) / lev.N**2).sum())

    def third_cumulant(self, lev: _Level) -> float:
        """``E (T^d)^3`` under the null: ``(8 / n^3) sum_c (e2(mu3) + 6 e3(v)) / N_c^3`` (see module notes)."""
        e3 = (lev.V**3 - 3.0 * lev.V * lev.W + 2.0 * lev.P3) / 6.0
        e2m = (lev.M1**2 - lev.M2) / 2.0
        return float(8.0 / self.n**3 * ((e2m + 6.0 * e3) / lev.N**3).sum())

    def stats(self, k: np.ndarray, g: np.ndarray) -> np.ndarray:
        """DPE at every level from per-atom positives ``k`` and ``sum y(1-2z)`` ``g`` of shape (atoms, r).

        Returns an array of shape ``(r, levels)``.  Cell sums of a level are ``reduceat`` sums of the
        cells of the finest level it coarsens (or of the atoms), so nested dyadic levels cost little more
        than the finest one.
        """
        order = self._plan if self._plan is not None else self._make_plan()
        r = k.shape[1]
        X = np.concatenate([k, g], axis=1)
        cell_sums: dict[int, np.ndarray] = {}
        out = np.zeros((r, len(self.levels)))
        for j in order:
            lev = self.levels[j]
            C = lev.matrix @ (X if lev.source < 0 else cell_sums[lev.source])
            if lev.full:
                cell_sums[j] = C
                C = C[lev.keep]
            if lev.N.size == 0:
                continue
            S = C[:, :r] - lev.Z[:, None]
            Q = C[:, r:] + lev.ZZ[:, None]
            S *= S
            S -= Q
            out[:, j] = (1.0 / lev.N) @ S / self.n
        return out

    def draw(self, r: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
        """``r`` null draws of per-atom positives (Bernoulli for single events), shape (atoms, r).

        Draws are generated draw-major, so the stream of draws does not depend on the batch sizes.
        """
        A = self.N.size
        k = np.empty((A, r))
        one = self.N == 1
        if one.all():
            k[:] = (rng.random((r, A)) < self.p).T
        elif not one.any():
            k[:] = rng.binomial(self.N.astype(np.int64), self.p, size=(r, A)).T
        else:
            u = rng.random((r, int(one.sum())))
            b = rng.binomial(self.N[~one].astype(np.int64), self.p[~one], size=(r, int((~one).sum())))
            k[one] = (u < self.p[one]).T
            k[~one] = b.T
        return k, k * (1.0 - 2.0 * self.p)[:, None]


def simulate_null(z: np.ndarray | None = None, grid: ScoreGrid | None = None, *, bins: Sequence[int],
                  draws: int, rng: np.random.Generator | int | None = None) -> np.ndarray:
    """Null draws of the DPE at several scales: Y-only on raw scores ``z`` (exact) or on a grid (approximate).

    Parameters
    ----------
    z
        Raw scores (exact Y-only law: ``y* ~ Ber(z)``); or ``None`` to use ``grid``.
    grid
        Fine :class:`ScoreGrid` (per cell ``k ~ Bin(N, zbar)``).
    bins
        Numbers of bins (for a grid, divisors of ``grid.bins``).
    draws
        Number of draws.
    rng
        Generator or seed.

    Returns
    -------
    Array ``(draws, len(bins))`` of simulated DPE values (scalar convention), all scales from the same draws.

    Examples
    --------
    >>> z = np.random.default_rng(0).uniform(size=500)
    >>> simulate_null(z, bins=[4, 16], draws=3, rng=0).shape
    (3, 2)
    """
    rng = rng if isinstance(rng, np.random.Generator) else np.random.default_rng(rng)
    if z is not None:
        z, _ = _check_binary(z, np.zeros(np.shape(z)))
        atoms = _Atoms.from_raw(z, np.zeros_like(z))
    elif grid is not None:
        _check_grid(grid)
        atoms = _Atoms.from_grid(grid)
    else:
        raise ValueError("give raw scores z or a grid")
    for m in bins:
        atoms.add_level(_check_bins(m))
    cap = max(1, _BATCH_ELEMENTS // max(1, atoms.N.size))
    out = []
    for lo in range(0, int(draws), cap):
        k, g = atoms.draw(min(cap, int(draws) - lo), rng)
        out.append(atoms.stats(k, g))
    return np.vstack(out) if out else np.zeros((0, len(bins)))


def _kth_largest(x: np.ndarray, k: int) -> float | None:
    if k < 1 or k > x.size:
        return None
    return float(np.partition(x, x.size - k)[x.size - k])


def _finite(x: float | None) -> float | None:
    return None if x is None or not math.isfinite(x) else float(x)


def _q_params(var: np.ndarray, k3: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Per-level parameters of the three-moment tail used to put levels on one scale (min-p)."""
    chi = (var > 0) & (k3 > 0)
    a = np.where(chi, k3 / np.where(var > 0, 4.0 * var, 1.0), 1.0)
    nu = np.where(chi, 8.0 * var**3 / np.where(chi, k3, 1.0) ** 2, 1.0)
    return chi, a, nu, np.sqrt(var)


def _q_transform(T: np.ndarray, par: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]) -> np.ndarray:
    """Approximate upper-tail probability of each level's statistic, shape of ``T`` (rows: draws)."""
    chi, a, nu, sd = par
    with np.errstate(invalid="ignore", divide="ignore"):
        q_chi = special.chdtrc(nu, np.maximum(nu + T / a, 0.0))
        q_norm = special.ndtr(-T / np.where(sd > 0, sd, 1.0))
    q = np.where(chi, q_chi, q_norm)
    return np.where(sd > 0, q, 1.0)


# ----------------------------------------------------------------------------------------------------------
# the test
# ----------------------------------------------------------------------------------------------------------
def tcal_test(z: np.ndarray | None = None, y: np.ndarray | None = None, grid: ScoreGrid | None = None, *,
              alpha: float = 0.05, mc: int = 2000, rng: np.random.Generator | int | None = None,
              method: str = "mc-raw", bins: Sequence[int] | None = None, combine: str = "bonferroni",
              screen: bool = True, min_resolution: bool = True, max_level: int | None = None,
              curtail: bool = True, accept_margin: float | None = 4.0) -> dict[str, Any]:
    """Adaptive T-Cal (Algorithm 2) -- or T-Cal at given scales -- from raw samples or a fine grid.

    Parameters
    ----------
    z, y
        Raw scores and 0/1 outcomes (full data or a reservoir sample); used by ``"mc-raw"`` and, when no
        grid is given, by ``"cantelli"``/``"theorem3"``.
    grid
        Fine single-channel :class:`ScoreGrid` (used by ``"mc-grid"``; by ``"cantelli"``/``"theorem3"``
        when ``z`` is not given).
    alpha
        Level of the test.
    mc
        Number ``R`` of Monte Carlo draws (raised to ``ceil(20 L / alpha)`` for ``L`` levels when
        ``min_resolution``).
    rng
        Generator or seed.
    method
        ``"mc-raw"`` (a), ``"mc-grid"`` (b), ``"cantelli"`` or ``"theorem3"`` (c), or ``"moment3"``: the
        three-moment chi-square approximation of :func:`three_moment_pvalue` (exact null variance and third
        cumulant; an approximation, no simulation).
    bins
        Numbers of bins to test; default the dyadic scales ``2, 4, ..., 2**B`` with ``B`` of eq. (7),
        capped at the grid depth (grid data) or at ``max_level``.
    combine
        ``"bonferroni"`` (Algorithm 2: level ``alpha / L`` per scale, adjusted p-value
        ``min(1, L min_b p_b)``) or ``"minp"``: max-type combination, the statistic
        ``M = min_b q_b(T_b)`` (``q_b`` the three-moment tail of level ``b``, a fixed continuous transform)
        with its exact Monte Carlo rank p-value over the joint null of all levels (Monte Carlo methods only).
    screen
        Try the exact Cantelli bound first and skip the simulation when it already rejects.
    min_resolution
        Raise ``R`` to at least ``20 L / alpha`` (so the rank p-value can resolve ``alpha / L``).
    max_level
        Cap on the dyadic exponent for raw data.
    curtail
        Stop simulating once no level can reject any more (Bonferroni only); the decision is the
        one of the full ``R``-draw test on the same stream of draws.
    accept_margin
        With ``screen``, accept without simulating when the three-moment approximation
        (:func:`three_moment_pvalue`) puts every level's p-value above ``accept_margin`` times its level
        (``None`` or 0 disables this approximate screen; the Cantelli screen is exact).

    Returns
    -------
    JSON-serialisable dict: ``levels`` (exponents ``b`` when dyadic), ``bins``, ``statistics`` (DPE per
    level, scalar convention), ``plugin`` (plug-in per level), ``null_sd``, ``critical_values`` (reject
    level ``b`` when the DPE exceeds it; ``None`` when not resolvable), ``p_values``, ``cantelli_p_values``,
    ``adjusted_p_value`` (= ``p_value``), ``decision``, ``method``, ``combine``, ``statistic`` (DPE at the
    level with the smallest p-value), ``n``, ``B_eq7``, ``mc_requested`` and ``mc_draws``.

    Examples
    --------
    >>> rng = np.random.default_rng(0)
    >>> z = rng.uniform(size=2000); y = (rng.uniform(size=2000) < z).astype(float)
    >>> r = tcal_test(z, y, alpha=0.05, mc=500, rng=1, bins=[4, 16])
    >>> r["decision"], len(r["p_values"])
    ('calibrated', 2)
    >>> yb = (rng.uniform(size=2000) < np.clip(1.3 * z - 0.15, 0, 1)).astype(float)
    >>> tcal_test(z, yb, rng=1)["decision"]
    'miscalibrated'

    References
    ----------
    T-Cal paper: eqs. (6)-(7), Algorithms 1-2, Theorems 3 and 5, Appendix C.3 (Y-only bootstrap).
    """
    if not 0.0 < alpha < 1.0:
        raise ValueError(f"alpha must lie in (0, 1), got {alpha}")
    if int(mc) != mc or mc < 1:
        raise ValueError(f"mc must be a positive integer, got {mc!r}")
    if method not in METHODS[1:6]:
        raise ValueError(f"method must be one of {METHODS[1:6]}, got {method!r}")
    if combine not in COMBINES:
        raise ValueError(f"combine must be one of {COMBINES}, got {combine!r}")
    if combine == "minp" and not method.startswith("mc"):
        raise ValueError("combine='minp' needs a Monte Carlo method ('mc-raw' or 'mc-grid')")
    rng = rng if isinstance(rng, np.random.Generator) else np.random.default_rng(rng)

    use_raw = method == "mc-raw" or (method in ("cantelli", "theorem3", "moment3") and z is not None)
    if use_raw:
        if z is None or y is None:
            raise ValueError(f"method {method!r} needs raw scores z and outcomes y")
        z, y = _check_binary(z, y)
        if z.size == 0:
            return _insufficient(method, alpha, 0, "no samples")
        atoms = _Atoms.from_raw(z, y)
        depth = None
    else:
        if grid is None:
            raise ValueError(f"method {method!r} needs a grid (or raw z, y)")
        _check_grid(grid)
        if grid.count == 0:
            return _insufficient(method, alpha, 0, "empty grid")
        atoms = _Atoms.from_grid(grid)
        depth = (grid.bins & -grid.bins).bit_length() - 1  # largest 2**d dividing bins
    n = atoms.n
    B = n_levels(n)
    dyadic = bins is None
    if dyadic:
        top = B if depth is None else min(B, depth)
        if max_level is not None:
            top = min(top, int(max_level))
        if top < 1:
            return _insufficient(method, alpha, n, "grid has no dyadic level")
        bins_list = [2**b for b in range(1, top + 1)]
    else:
        bins_list = [_check_bins(m) for m in bins]
        if not bins_list:
            raise ValueError("bins must not be empty")
    for m in bins_list:
        atoms.add_level(m)
    L = len(bins_list)
    a_b = alpha / L if combine == "bonferroni" else alpha

    obs, plugin = atoms.observed()
    var = np.array([atoms.variance(lev) for lev in atoms.levels])
    sd = np.sqrt(var)
    if not np.any(var > 0):
        return _insufficient(method, alpha, n, "no bin holds two events with non-degenerate scores")
    cant = np.array([cantelli_pvalue(t, v) for t, v in zip(obs, var)])
    k3 = np.array([atoms.third_cumulant(lev) for lev in atoms.levels])
    approx = np.array([three_moment_pvalue(t, v, k) for t, v, k in zip(obs, var, k3)])
    result: dict[str, Any] = {
        "alpha": alpha, "n": n, "B_eq7": B, "bins": bins_list,
        "levels": [m.bit_length() - 1 if m & (m - 1) == 0 else None for m in bins_list],
        "levels_capped": bool(dyadic and len(bins_list) < B),
        "statistics": [float(t) for t in obs], "null_sd": [float(s) for s in sd],
        "cantelli_p_values": [float(p) for p in cant], "approx_p_values": [float(p) for p in approx],
        "combine": combine, "screen": None,
        "convention": "scalar (one-hot K=2 value is 2x)",
    }
    result["plugin"] = [float(v) for v in plugin]

    if method == "cantelli" or (screen and method.startswith("mc") and L * cant.min() <= alpha):
        pv = cant
        crit = [float(s * math.sqrt((1 - a_b) / a_b)) for s in sd]
        result.update(method="cantelli", screened_from=None if method == "cantelli" else method,
                      mc_requested=0, mc_draws=0, screen=None if method == "cantelli" else "cantelli-reject")
        adj = float(min(1.0, L * pv.min()))
    elif screen and method.startswith("mc") and accept_margin and approx.min() >= accept_margin * a_b:
        # every level is far from rejection by the three-moment approximation: accept without simulating
        pv = approx
        crit = [_approx_critical(v, k, a_b) for v, k in zip(var, k3)]
        result.update(method=method, screen="approx-accept", mc_requested=0, mc_draws=0, exact=False)
        adj = float(min(1.0, L * pv.min())) if combine == "bonferroni" else float(pv.min())
    elif method == "moment3":
        pv = approx
        crit = [_approx_critical(v, k, a_b) for v, k in zip(var, k3)]
        result.update(method="moment3", mc_requested=0, mc_draws=0, exact=False)
        adj = float(min(1.0, L * pv.min()))
    elif method == "theorem3":
        c = np.array([min(m**0.5 / n, m**-0.5) for m in bins_list])
        t1 = 2.0 * obs  # one-hot units, K = 2
        pv = np.where(t1 > 0, np.minimum(1.0, 8.0 * c**2 / np.where(t1 > 0, t1, 1.0) ** 2), 1.0)
        crit = [theorem3_threshold(n, m, a_b) for m in bins_list]
        result.update(method="theorem3", mc_requested=0, mc_draws=0)
        adj = float(min(1.0, L * pv.min()))
    else:
        R = int(mc)
        if min_resolution:
            R = max(R, math.ceil(20 * (L if combine == "bonferroni" else 1) / alpha))
        tol = _TIE_TOL * sd
        minp = combine == "minp"
        h = math.floor(a_b * (R + 1)) + 1
        exceed = np.zeros(L, dtype=np.int64)
        stop_at = np.zeros(L, dtype=np.int64)  # draw index of the h-th exceedance (0: not reached)
        # max-type combination: M = min_b q_b(T_b) with q_b the (fixed, continuous) three-moment tail of
        # level b; its Monte Carlo rank p-value is exact by exchangeability and has no ties
        qpar = _q_params(var, k3)
        m_obs = float(_q_transform(obs[None, :], qpar).min()) if minp else 0.0
        exceed_m, stop_m = 0, 0
        draws: list[np.ndarray] = []
        done = 0
        batch = 64
        cap = max(1, _BATCH_ELEMENTS // max(1, atoms.N.size))
        while done < R:
            r = min(batch, cap, R - done)
            k, g = atoms.draw(r, rng)
            T = atoms.stats(k, g)
            draws.append(T)
            ex = T >= obs - tol
            cum = np.cumsum(ex, axis=0) + exceed
            for j in np.flatnonzero((stop_at == 0) & (cum[-1] >= h)):
                stop_at[j] = done + 1 + int(np.argmax(cum[:, j] >= h))
            exceed = cum[-1]
            if minp:
                cm = np.cumsum(_q_transform(T, qpar).min(axis=1) <= m_obs * (1 + 1e-9)) + exceed_m
                if stop_m == 0 and cm[-1] >= h:
                    stop_m = done + 1 + int(np.argmax(cm >= h))
                exceed_m = int(cm[-1])
            done += r
            if curtail and (stop_m > 0 if minp else np.all(stop_at > 0)):
                break
            # next batch: enough for the slowest pending statistic at its observed exceedance rate
            pending_e = np.array([exceed_m]) if minp else exceed[stop_at == 0]
            if pending_e.size == 0 or (minp and stop_m > 0):
                batch = 4 * done
                continue
            rate = np.maximum(pending_e, 1) / done
            batch = int(min(max(32, 1.2 * np.max((h - pending_e) / rate)), 4 * done))
        Tall = np.vstack(draws)
        full = (1.0 + exceed) / (R + 1.0)
        if minp:
            pv = (1.0 + exceed) / (done + 1.0)  # per-level Monte Carlo p-values (informative)
        else:
            # Besag-Clifford p-value h / L for levels whose simulation was curtailed; rank p-value otherwise
            pv = np.where(stop_at > 0, h / np.maximum(stop_at, 1), full) if done < R else full
        kk = math.floor((alpha / L) * (done + 1))
        crit = [_kth_largest(Tall[:, j], kk) for j in range(L)]
        result.update(method=method, mc_requested=R, mc_draws=done, curtailed=bool(done < R),
                      exact=atoms.exact)
        if minp:
            adj = h / stop_m if (done < R and stop_m > 0) else (1.0 + exceed_m) / (R + 1.0)
            result["minp_statistic"] = m_obs
        else:
            adj = float(min(1.0, L * pv.min()))
    best = int(np.argmin(pv))
    result.update(
        p_values=[float(p) for p in pv], critical_values=[_finite(c) for c in crit],
        adjusted_p_value=adj, p_value=adj, statistic=float(obs[best]), statistic_bins=bins_list[best],
        decision="miscalibrated" if adj <= alpha else "calibrated")
    return result


def _approx_critical(variance: float, third: float, level: float) -> float | None:
    if variance <= 0:
        return None
    if third <= 0:
        return float(math.sqrt(variance) * special.ndtri(1.0 - level))
    a = third / (4.0 * variance)
    nu = 8.0 * variance**3 / third**2
    return float(a * (special.chdtri(nu, level) - nu))


def _insufficient(method: str, alpha: float, n: int, reason: str) -> dict[str, Any]:
    return {"statistic": None, "p_value": None, "adjusted_p_value": None, "decision": "insufficient data",
            "method": method, "alpha": alpha, "n": n, "reason": reason, "levels": [], "bins": [],
            "statistics": [], "critical_values": [], "p_values": []}


# ----------------------------------------------------------------------------------------------------------
# tester registration
# ----------------------------------------------------------------------------------------------------------
@register_tester("tcal")
def tcal_tester(data: CalibrationData, *, alpha: float, mc: int, rng: np.random.Generator,
                method: str = "auto", combine: str = "bonferroni", levels: Sequence[int] | None = None,
                bins: Sequence[int] | None = None, screen: bool = True, discrete: bool | None = None,
                discrete_max_values: int = 50, raw_max: int = 200_000, **params: Any) -> dict[str, Any]:
    """Tester ``"tcal"``: adaptive T-Cal from a file's raw data or a window's statistics.

    Parameters
    ----------
    data
        What the caller has: ``z``/``y`` (full data when ``raw_is_complete``, else a reservoir sample)
        and/or the fine ``grid``.
    alpha, mc, rng
        Level, Monte Carlo draws, generator (see :func:`tcal_test`).
    method
        ``"auto"`` (default): exact binomial test when the predictions take few distinct values
        (Appendix B.4); else Y-only Monte Carlo on raw data when complete (``"mc-raw"``), else Monte Carlo
        on the fine grid (``"mc-grid"``), else on the reservoir sample.  Or one of ``"mc-raw"``,
        ``"mc-grid"``, ``"cantelli"``, ``"theorem3"``, ``"binomial"``.
    combine
        ``"bonferroni"`` or ``"minp"``.
    levels, bins
        Dyadic exponents ``b`` (bins ``2**b``) or explicit numbers of bins; default eq. (7).
    screen
        Cantelli screen before Monte Carlo.
    discrete
        Force (``True``) or forbid (``False``) the binomial test; ``None`` decides automatically.
    discrete_max_values
        At most this many distinct values (and at least 10 events per value) count as discrete.
    raw_max
        ``"auto"`` uses the exact raw Monte Carlo on complete raw data only up to this many events; larger
        files use the grid (the cost of the raw simulation grows with n, the grid's does not).

    Returns
    -------
    The dict of :func:`tcal_test` (or :func:`~calmon.algorithms.binomial_test.binomial_test`) with
    ``source`` (``"raw"``, ``"grid"``, ``"reservoir"``).

    Examples
    --------
    >>> from calmon.testers import run_tester
    >>> rng = np.random.default_rng(0); z = rng.uniform(size=3000); y = (rng.uniform(size=3000) < z) * 1.0
    >>> g = ScoreGrid(); g.update(z, y)
    >>> run_tester("tcal", CalibrationData(n=3000, grid=g), mc=300)["method"]
    'mc-grid'
    """
    if params:
        raise ValueError(f"unknown tcal parameter(s): {', '.join(sorted(params))}")
    if method not in METHODS:
        raise ValueError(f"tcal method must be one of {METHODS}, got {method!r}")
    if levels is not None and bins is not None:
        raise ValueError("give levels (dyadic exponents) or bins, not both")
    if levels is not None:
        bins = [2 ** int(b) for b in levels]
    has_raw = data.z is not None and data.y is not None and len(data.z) > 0
    complete = has_raw and data.raw_is_complete
    grid = data.grid
    if grid is not None and grid.channels is not None:
        grid = None
    if grid is not None and grid.count == 0:
        grid = None
    if complete and (grid is None or len(data.z) <= raw_max or method not in ("auto", "binomial")):
        source = "raw"
    elif grid is not None:
        source = "grid"
    elif has_raw:
        source = "reservoir"
    else:
        return _insufficient(method, alpha, int(data.n or 0), "no grid and no raw samples")

    if method in ("auto", "binomial") and discrete is not False:
        if source == "grid":
            sup = grid_discrete_support(grid, discrete_max_values)
        else:
            sup = discrete_support(data.z, data.y, discrete_max_values)
        if sup is not None and (method == "binomial" or discrete is None or discrete):
            out = binomial_test(*sup, alpha=alpha)
            out["source"] = source
            out["n"] = int(np.sum(sup[1]))
            return out
        if method == "binomial" or discrete:
            raise ValueError("predictions take too many distinct values for the binomial test "
                             f"(more than {discrete_max_values}, or fewer than 10 events per value)")
    if method == "auto":
        method = "mc-grid" if source == "grid" else "mc-raw"
    use_z = source != "grid" and method != "mc-grid"
    if method == "mc-grid" and grid is None:
        raise ValueError("method 'mc-grid' needs a grid")
    if method == "mc-raw" and not has_raw:
        raise ValueError("method 'mc-raw' needs raw scores (full data or a reservoir)")
    out = tcal_test(data.z if use_z else None, data.y if use_z else None, None if use_z else grid,
                    alpha=alpha, mc=mc, rng=rng, method=method, bins=bins, combine=combine, screen=screen)
    out["source"] = "grid" if not use_z else ("raw" if complete else "reservoir")
    return out
