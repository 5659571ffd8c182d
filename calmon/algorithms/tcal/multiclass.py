"""Canonical multiclass T-Cal (K > 2): debiased l2-ECE^2 of the whole probability vector, adaptive over scales.

Cells are the spec's cube partition of the simplex: a probability vector ``z`` falls in the cell
``(floor(m z_1), ..., floor(m z_K))`` (each clipped to ``m - 1``), which has volume
``Theta(m^-(K-1))`` and diameter ``Theta(1/m)`` and is nested across ``m = 2**b``.  Per cell ``c``
with ``N_c`` events, class counts ``C_c``, score sums ``Z_c`` (vectors) and ``Q_c = sum ||e_y - z||**2``:

* DPE (eq. 6, one-hot convention): ``T^d = (1/n) sum_c (||C_c - Z_c||**2 - Q_c) / N_c``;
* exact null variance given the scores: with ``Sigma_j = diag(z_j) - z_j z_j^T`` (the covariance of
  ``e_y - z_j`` under calibration), ``Var T^d = (2/n**2) sum_c (||M_c||_F**2 - sum_j ||Sigma_j||_F**2) / N_c**2``,
  ``M_c = sum_{j in c} Sigma_j`` (because ``E (r_j . r_j')**2 = tr(Sigma_j Sigma_j')`` for independent residuals).

The adaptive test (Algorithm 2) tests every ``m = 2**b``, ``b = 1..B`` with ``B`` of eq. (7) for K classes.
Critical values: Y-only Monte Carlo, keeping the scores and drawing ``y* ~ Categorical(z)`` (Appendix C.3):
observed and simulated statistics are exchangeable under the null, so the rank p-value is exact on the full
data and, conditionally on the sample, on a uniform reservoir sample.  The levels are combined either

* ``"minp"`` (default): single-step min-p over the joint null (Westfall & Young 1993): ``M = min_b q_b(T_b)``
  with ``q_b`` a per-level tail fitted on an independent pilot batch of null draws (three-moment chi-square
  with the exact variance and the pilot's third moment), and the Monte Carlo rank p-value of ``M`` among
  fresh null draws -- exact, and adapted to the levels' correlation (no Bonferroni factor); or
* ``"bonferroni"``: Algorithm 2 as printed, level ``alpha / B`` per scale (conservative for correlated levels).

Both are curtailed (Besag-Clifford p-values once the answer is settled).  Screens: an exact Cantelli bound may
reject first, and a normal approximation far from rejection may accept first (see :func:`canonical_tcal_test`).

References
----------
Lee, Huang, Hassani, Dobriban. T-Cal: An optimal test for the calibration of predictive models.
JMLR 24 (2023): Sections 2-3, eqs. (5)-(7), Theorem 3, Algorithm 2, Appendix C.3.
Besag, Clifford. Sequential Monte Carlo p-values. Biometrika 78 (1991).
Westfall, Young. Resampling-Based Multiple Testing (Wiley, 1993): single-step min-p adjustment.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from calmon.algorithms.tcal.estimators import check_bins, n_levels
from calmon.algorithms.tcal.tails import cantelli_pvalue, q_params, q_transform
from calmon.stats.grid import cell_index

__all__ = ["COMBINES", "check_probs", "cube_cells", "CubeLevel", "canonical_tcal_test"]

#: Largest ``draws x events x classes`` array one Monte Carlo batch may allocate.
_BATCH_ELEMENTS = 4_000_000
#: Relative tolerance (in null standard deviations) counting near-ties as exceedances (conservative).
_TIE_TOL = 1e-7


def check_probs(probs: np.ndarray, labels: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Validated ``(n, K >= 2)`` probabilities (rows summing to 1 within 1e-3) and integer labels."""
    p = np.asarray(probs, dtype=np.float64)
    lab = np.asarray(labels)
    if p.ndim != 2 or p.shape[1] < 2 or lab.shape != (p.shape[0],):
        raise ValueError(f"need probs of shape (n, K >= 2) and labels of shape (n,), got {p.shape}, {lab.shape}")
    if not np.all(np.isfinite(p)) or np.any((p < 0) | (p > 1)):
        raise ValueError("probabilities must be finite and lie in [0, 1]")
    if p.shape[0] and np.max(np.abs(p.sum(axis=1) - 1.0)) > 1e-3:
        raise ValueError("probability rows must sum to 1 (within 1e-3)")
    if lab.size and (not np.issubdtype(lab.dtype, np.integer) or lab.min() < 0 or lab.max() >= p.shape[1]):
        raise ValueError(f"labels must be integers in [0, {p.shape[1] - 1}]")
    return p, lab.astype(np.int64)


def cube_cells(probs: np.ndarray, bins: int) -> tuple[np.ndarray, int]:
    """Cell of each row in the cube partition with ``bins`` cells per axis: ``(inverse index, cell count)``.

    Examples
    --------
    >>> inv, k = cube_cells(np.array([[0.6, 0.3, 0.1], [0.7, 0.2, 0.1], [0.1, 0.1, 0.8]]), 2)
    >>> inv.tolist(), k
    ([0, 0, 1], 2)
    """
    idx = cell_index(probs, check_bins(bins))
    k = idx.shape[1]
    if k * math.log2(max(bins, 2)) < 62:  # one integer key per cell: cheaper than unique over rows
        key = idx @ (np.int64(bins) ** np.arange(k, dtype=np.int64))
        _, inv = np.unique(key, return_inverse=True)
    else:
        _, inv = np.unique(idx, axis=0, return_inverse=True)
    inv = np.asarray(inv).ravel()
    return inv, int(inv.max()) + 1 if inv.size else 0


@dataclass
class CubeLevel:
    """One scale: the cells of every event and the per-cell score sums the statistic needs.

    Examples
    --------
    >>> p = np.array([[0.6, 0.3, 0.1], [0.7, 0.2, 0.1], [0.1, 0.1, 0.8]])
    >>> lv = CubeLevel.build(p, 2)
    >>> lv.members.tolist(), lv.N.tolist(), round(float(lv.statistic(np.array([0, 1, 2]))[0]), 4)
    ([0, 1], [2.0], -0.17)
    """

    bins: int
    n: int  # all events, including those alone in their cell
    members: np.ndarray  # events sharing their cell with another one
    inv: np.ndarray  # their cell
    N: np.ndarray
    Z: np.ndarray  # (cells, K) score sums
    zz: np.ndarray  # per cell sum of ||z||**2
    probs: np.ndarray
    _lin: np.ndarray | None = None

    @classmethod
    def build(cls, probs: np.ndarray, bins: int) -> CubeLevel:
        """The level with ``bins`` cells per axis; cells holding one event are dropped (their DPE term is 0)."""
        inv, cells = cube_cells(probs, bins)
        shared = np.bincount(inv, minlength=cells)[inv] >= 2
        members = np.flatnonzero(shared)
        _, inv = np.unique(inv[members], return_inverse=True)
        sub = probs[members]
        cells = int(inv.max()) + 1 if inv.size else 0
        k = probs.shape[1]
        N = np.bincount(inv, minlength=cells).astype(np.float64)
        Z = np.stack([np.bincount(inv, sub[:, j], minlength=cells) for j in range(k)], axis=1).reshape(cells, k)
        zz = np.bincount(inv, (sub * sub).sum(axis=1), minlength=cells)
        return cls(bins=bins, n=probs.shape[0], members=members, inv=inv, N=N, Z=Z, zz=zz, probs=sub)

    def statistic(self, labels: np.ndarray) -> np.ndarray:
        """DPE (one-hot) for each row of ``labels`` (shape ``(R, n)`` or ``(n,)``): shape ``(R,)``.

        ``||C - Z||**2 - Q = sum_k C_k**2 + sum_j 2 (z_j,y_j - Z_y_j) + ||Z||**2 - N - zz`` per cell: only the
        squared class counts need a histogram; the rest is a per-event lookup and a constant.
        """
        lab = np.atleast_2d(labels)[:, self.members]
        r = lab.shape[0]
        cells, k = self.Z.shape
        key = (np.arange(r, dtype=np.int64) * (cells * k))[:, None] + (self.inv * k)[None, :] + lab
        counts = np.bincount(key.ravel(), minlength=r * cells * k).reshape(r, cells * k).astype(np.float64)
        quad = (counts * counts) @ np.repeat(1.0 / self.N, k)
        lin = self._linear[np.arange(lab.shape[1])[None, :], lab].sum(axis=1)
        return (quad + lin + self._const) / self.n

    def plugin(self, dpe: float, r2: np.ndarray) -> float:
        """Plug-in estimate (eq. 5) from this level's DPE and every event's ``||e_y - z||**2``."""
        alone = r2.sum() - r2[self.members].sum()
        shared = (np.bincount(self.inv, r2[self.members], minlength=self.N.size) / self.N).sum()
        return float(dpe + (alone + shared) / self.n)

    @property
    def _linear(self) -> np.ndarray:
        """Per event and class ``2 (z_jk - Z_c(j),k) / N_c(j)``."""
        if self._lin is None:
            w = 1.0 / self.N[self.inv]
            self._lin = 2.0 * (self.probs - self.Z[self.inv]) * w[:, None]
        return self._lin

    @property
    def _const(self) -> float:
        return float((((self.Z * self.Z).sum(axis=1) - self.N - self.zz) / self.N).sum())

    def variance(self) -> float:
        """Exact null variance of the DPE given the scores (module docstring)."""
        p = self.probs
        sq = (p * p).sum(axis=1)
        own = sq - 2.0 * (p**3).sum(axis=1) + sq**2  # ||Sigma_j||_F**2
        cells, k = self.Z.shape
        order = np.argsort(self.inv, kind="stable")
        starts = np.searchsorted(self.inv[order], np.arange(cells))
        ps = p[order]
        M = -np.add.reduceat(ps[:, :, None] * ps[:, None, :], starts, axis=0) if cells else np.zeros((0, k, k))
        M[:, np.arange(k), np.arange(k)] += self.Z
        frob = (M * M).sum(axis=(1, 2))
        own_c = np.bincount(self.inv, own, minlength=cells)
        return float(2.0 / self.n**2 * (np.maximum(frob - own_c, 0.0) / self.N**2).sum())


def _draw_labels(cum: np.ndarray, draws: int, rng: np.random.Generator) -> np.ndarray:
    """``draws`` independent label vectors ``y*_j ~ Categorical(z_j)`` (rows: draws).

    ``y* = #{k < K - 1: u > cum_k}`` column by column: the same labels as ``min(#{k: u > cum_k}, K - 1)``
    without the ``draws x n x K`` boolean array.
    """
    u = rng.random((draws, cum.shape[0]))
    y = np.zeros(u.shape, dtype=np.int64)
    for col in cum[:, :-1].T:
        y += u > col
    return y


class _NullStack:
    """Every level's DPE for a batch of simulated label vectors: the values of :meth:`CubeLevel.statistic`.

    Per cell ``||C - Z||**2 - Q = sum_k (C_k**2 - 2 C_k Z_k) + 2 sum_j z_j,y_j + ||Z||**2 - N - zz``, so a
    level needs its class-count histogram (``C``) and one per-event gather ``z_j,y_j`` shared by all levels
    (a matrix product with the per-event weights ``1/N_c``).  The histograms of coarse levels, where nearly
    every event shares its cell, are sums of a finer level's (the cube cells are nested): one bincount
    over the events serves them all; finer levels count only the events sharing their cell.
    """

    def __init__(self, probs: np.ndarray, levels: list[CubeLevel]) -> None:
        n, k = probs.shape
        self.n, self.k, self.levels = n, k, levels
        self._flat = probs.ravel()
        self._row = np.arange(n, dtype=np.int64) * k
        w2 = np.zeros((n, len(levels)))
        for i, lv in enumerate(levels):
            w2[lv.members, i] = 2.0 / lv.N[lv.inv]
        self.w2 = w2
        self.const = np.array([lv._const for lv in levels])
        self.hub_cells, self.hub_of, self.starts, self.coarse = self._hub(probs)

    def _hub(self, probs: np.ndarray) -> tuple[int, np.ndarray, list[np.ndarray], list[tuple[np.ndarray, np.ndarray]]]:
        """The finest level (prefix) whose full cells, at most ``n / K`` of them, refine every coarser one."""
        full = [cube_cells(probs, lv.bins) for lv in self.levels]
        hub = -1
        for i, (inv, cells) in enumerate(full):
            if cells * self.k > self.n or not all(_refines(inv, cells, full[j][0]) for j in range(i)):
                break
            hub = i
        if hub < 0:
            return 0, np.zeros(0, dtype=np.int64), [], []
        inv_h, cells_h = full[hub]
        parents = []
        for j in range(hub + 1):
            par = np.zeros(cells_h, dtype=np.int64)
            par[inv_h] = full[j][0]
            parents.append(par)
        order = np.lexsort(parents[::-1])  # hub cells sorted so that each coarser cell is a contiguous run
        rank = np.empty(cells_h, dtype=np.int64)
        rank[order] = np.arange(cells_h)
        hub_of = rank[inv_h]
        starts: list[np.ndarray] = []
        coarse: list[tuple[np.ndarray, np.ndarray]] = []
        for par in parents:
            ps = par[order]
            new = np.concatenate([[True], ps[1:] != ps[:-1]])
            seg = np.cumsum(new) - 1
            starts.append(np.flatnonzero(new))
            coarse.append(self._weights(probs, seg[hub_of], int(seg[-1]) + 1))
        return cells_h, hub_of, starts, coarse

    def _weights(self, probs: np.ndarray, inv: np.ndarray, cells: int) -> tuple[np.ndarray, np.ndarray]:
        """``(1/N_c repeated per class, 2 Z_ck / N_c)`` flattened; 0 for a cell with one event (no pair)."""
        N = np.bincount(inv, minlength=cells).astype(np.float64)
        w = np.where(N >= 2, 1.0 / np.maximum(N, 1.0), 0.0)
        Z = np.stack([np.bincount(inv, probs[:, j], minlength=cells) for j in range(self.k)], axis=1)
        return np.repeat(w, self.k), (2.0 * Z * w[:, None]).ravel()

    def statistics(self, y: np.ndarray) -> np.ndarray:
        """``(R, L)`` DPE of every level for the label rows ``y`` (shape ``(R, n)``)."""
        r, k = y.shape[0], self.k
        g = np.take(self._flat, self._row[None, :] + y)  # z_j,y_j
        out = g @ self.w2 + self.const[None, :]
        hub = len(self.starts)
        if hub:
            key = (np.arange(r, dtype=np.int64) * (self.hub_cells * k))[:, None] + self.hub_of[None, :] * k + y
            counts = np.bincount(key.ravel(), minlength=r * self.hub_cells * k).reshape(r, self.hub_cells, k)
            for i in range(hub):
                a = np.add.reduceat(counts, self.starts[i], axis=1).reshape(r, -1).astype(np.float64)
                out[:, i] += (a * a) @ self.coarse[i][0] - a @ self.coarse[i][1]
        for i in range(hub, len(self.levels)):
            lv = self.levels[i]
            cells = lv.N.size + 1  # the last cell collects the events alone in theirs (weight 0)
            if 4 * lv.members.size > self.n:  # indexing every row by the members costs more than counting all
                base, lab = self._fine_base(i), y
            else:
                base, lab = lv.inv * k, y[:, lv.members]
            key = (np.arange(r, dtype=np.int64) * (cells * k))[:, None] + base[None, :] + lab
            a = np.bincount(key.ravel(), minlength=r * cells * k).reshape(r, cells * k)[:, :-k].astype(np.float64)
            out[:, i] += (a * a) @ np.repeat(1.0 / lv.N, k) - a @ (2.0 * lv.Z / lv.N[:, None]).ravel()
        return out / self.n

    def _fine_base(self, i: int) -> np.ndarray:
        """Per event ``k`` times its cell at level ``i``, the extra last cell for events alone in theirs."""
        lv = self.levels[i]
        base = np.full(self.n, lv.N.size * self.k, dtype=np.int64)
        base[lv.members] = lv.inv * self.k
        return base


def _refines(fine: np.ndarray, cells: int, coarse: np.ndarray) -> bool:
    """Whether every cell of the ``fine`` labelling lies inside one cell of the ``coarse`` labelling."""
    par = np.full(cells, -1, dtype=np.int64)
    par[fine] = coarse
    return bool(np.array_equal(par[fine], coarse))


COMBINES = ("minp", "bonferroni")


def canonical_tcal_test(probs: np.ndarray, labels: np.ndarray, *, alpha: float = 0.05, mc: int = 2000,
                        rng: np.random.Generator | int | None = None, bins: Sequence[int] | None = None,
                        max_level: int | None = None, combine: str = "minp", screen: bool = True,
                        min_resolution: bool = True, curtail: bool = True, accept_margin: float | None = 4.0,
                        cantelli_share: float = 0.05, pilot: int = 200) -> dict[str, Any]:
    """Adaptive canonical T-Cal for K classes (Algorithm 2 with the cube partition of the simplex).

    Parameters
    ----------
    probs, labels
        Probability vectors ``(n, K)`` and class indices ``(n,)``: full data or a uniform sample.
    alpha, mc, rng
        Level, Monte Carlo draws ``R`` (with ``min_resolution`` raised to ``ceil(20 / alpha)`` for min-p,
        ``ceil(20 L / alpha)`` for Bonferroni over ``L`` levels), generator or seed.
    bins
        Cells per axis of each level; default ``2, 4, ..., 2**B`` with ``B`` of eq. (7) for K classes
        (capped at ``max_level``).
    combine
        ``"minp"`` (default): the single-step min-p combination of Westfall & Young over the joint Y-only null
        of all levels -- ``M = min_b q_b(T_b)`` with ``q_b`` the three-moment chi-square tail of level ``b``
        (exact variance, third moment of ``pilot`` independent null draws: a transform fixed before the
        observed and the ``R`` counted draws meet, so they stay exchangeable), p-value the rank of ``M`` among
        the draws' own ``M``; exact, no Bonferroni factor.  ``"bonferroni"``: Algorithm 2 as printed
        (``alpha / L`` per level, p-value ``min(1, L min_b p_b)``), conservative for correlated levels.
    screen
        Decide without simulating in clear cases.  *Reject* when the exact Cantelli bound already rejects:
        with min-p the bound spends the share ``cantelli_share`` of ``alpha`` (reject when
        ``L min_b cantelli_b <= cantelli_share alpha``) and the Monte Carlo runs at the rest, so the union of the
        two rejection regions has probability at most ``alpha`` (p-value ``min(1, L min_b cantelli_b / share,
        p_mc / (1 - share))``).  *Accept* when the normal approximation puts every level's p-value above
        ``accept_margin`` times ``alpha`` (min-p: its p-value is at least the smallest per-level one) or
        ``alpha / L`` (Bonferroni): an accept screen can only lower the rejection rate, and the statistic's
        right skew keeps the true p-value above ``alpha`` at margin 4 even for a chi-square(1) shape.
    curtail
        Stop simulating once the test can no longer reject (Besag-Clifford p-values; same decision as the full
        ``R``-draw test on the same stream).
    pilot
        Null draws fitting the min-p transform (0: normal tails, i.e. the maximum standardised statistic).

    Returns
    -------
    dict like :func:`~calmon.algorithms.tcal.tcal_test`'s: ``statistic`` (DPE at the most significant level,
    one-hot convention), ``p_value`` (combined over levels), ``decision``, ``method`` (``"mc-raw"`` or
    ``"cantelli"``), ``combine``, ``bins``, ``statistics``, ``p_values`` (per level), ``null_sd``, ``B_eq7``,
    ``classes``, ``mc_draws``.

    Examples
    --------
    >>> rng = np.random.default_rng(0)
    >>> p = rng.dirichlet(np.ones(3), size=2000)
    >>> y = (rng.random((2000, 1)) > p.cumsum(axis=1)).sum(axis=1)
    >>> canonical_tcal_test(p, y, rng=1)["decision"]
    'calibrated'
    >>> q = p ** 3 / (p ** 3).sum(axis=1, keepdims=True)  # over-confident
    >>> r = canonical_tcal_test(q, y, rng=1)
    >>> r["decision"], r["combine"]
    ('miscalibrated', 'minp')

    References
    ----------
    T-Cal paper (seed 003): eqs. (6)-(7), Algorithm 2, Theorem 3 (K > 2), Appendix C.3 (Y-only resampling).
    Westfall, Young (1993), Section 2.6 / Algorithm 2.8: single-step min-p over the joint resampling null.
    """
    _check_options(alpha, mc, combine, cantelli_share, pilot)
    p, lab = check_probs(probs, labels)
    n, k = p.shape
    gen = rng if isinstance(rng, np.random.Generator) else np.random.default_rng(rng)
    b_eq7 = n_levels(max(n, 1), k)
    if bins is None:
        top = b_eq7 if max_level is None else min(b_eq7, int(max_level))
        bins_list = [2**b for b in range(1, top + 1)]
    else:
        bins_list = [check_bins(m) for m in bins]
    base: dict[str, Any] = {"method": "mc-raw", "alpha": alpha, "n": int(n), "classes": int(k), "B_eq7": b_eq7,
                            "combine": combine, "convention": "one-hot",
                            "partition": "cube cells floor(m z_k) of the simplex"}
    if n < 2 or not bins_list:
        return {**base, "statistic": None, "p_value": None, "decision": "insufficient data", "bins": [],
                "statistics": [], "p_values": [], "reason": "fewer than two events"}
    levels = [CubeLevel.build(p, m) for m in bins_list]
    r2 = 1.0 - 2.0 * p[np.arange(n), lab] + (p * p).sum(axis=1)  # ||e_y - z||**2
    obs = np.array([lv.statistic(lab)[0] for lv in levels])
    var = np.array([lv.variance() for lv in levels])
    if not np.any(var > 0):
        return {**base, "statistic": None, "p_value": None, "decision": "insufficient data", "bins": bins_list,
                "statistics": obs.tolist(), "p_values": [], "reason": "no cell holds two non-degenerate events"}
    cant = np.array([cantelli_pvalue(t, v) for t, v in zip(obs, var)])
    base.update(bins=bins_list, statistics=[float(t) for t in obs], null_sd=[float(s) for s in np.sqrt(var)],
                plugin=[lv.plugin(obs_l, r2) for lv, obs_l in zip(levels, obs)],
                cantelli_p_values=[float(c) for c in cant])
    opts = _McOptions(alpha=alpha, mc=int(mc), rng=gen, min_resolution=min_resolution, curtail=curtail,
                      pilot=int(pilot), share=cantelli_share if screen else 0.0)
    pv, adjusted, best, fields = _decide(levels, obs, var, cant, p, opts, screen, accept_margin, combine)
    return {**base, **fields, "p_values": [float(x) for x in pv], "p_value": adjusted,
            "adjusted_p_value": adjusted, "statistic": float(obs[best]), "statistic_bins": bins_list[best],
            "decision": "miscalibrated" if adjusted <= alpha else "calibrated"}


def _check_options(alpha: float, mc: int, combine: str, share: float, pilot: int) -> None:
    if not 0.0 < alpha < 1.0:
        raise ValueError(f"alpha must lie in (0, 1), got {alpha}")
    if int(mc) != mc or mc < 1:
        raise ValueError(f"mc must be a positive integer, got {mc!r}")
    if combine not in COMBINES:
        raise ValueError(f"combine must be one of {COMBINES}, got {combine!r}")
    if not 0.0 <= share < 1.0:
        raise ValueError(f"cantelli_share must lie in [0, 1), got {share!r}")
    if int(pilot) != pilot or pilot < 0:
        raise ValueError(f"pilot must be a non-negative integer, got {pilot!r}")


@dataclass(frozen=True)
class _McOptions:
    """Monte Carlo settings of :func:`canonical_tcal_test`; ``share``: alpha spent by the Cantelli screen."""

    alpha: float
    mc: int
    rng: np.random.Generator
    min_resolution: bool
    curtail: bool
    pilot: int
    share: float


def _decide(levels: list[CubeLevel], obs: np.ndarray, var: np.ndarray, cant: np.ndarray, probs: np.ndarray,
            opts: _McOptions, screen: bool, accept_margin: float | None,
            combine: str) -> tuple[np.ndarray, float, int, dict[str, Any]]:
    """Screens, then the Monte Carlo: ``(per-level p-values, combined p-value, best level, fields)``."""
    L, alpha = len(levels), opts.alpha
    gauss = np.array([0.5 * math.erfc(t / math.sqrt(2.0 * v)) if v > 0 else 1.0 for t, v in zip(obs, var)])
    minp = combine == "minp"
    # Bonferroni: the screen at alpha (Algorithm 2's per-level bound); min-p: at its own share of alpha
    reject_at = opts.share * alpha if minp else alpha
    if screen and reject_at > 0 and L * cant.min() <= reject_at:
        adj = min(1.0, L * float(cant.min()) / (opts.share if minp else 1.0))
        fields = {"method": "cantelli", "screen": "cantelli-reject", "mc_draws": 0}
        return cant, adj, int(np.argmin(cant)), {**fields, "cantelli_share": opts.share} if minp else fields
    if screen and accept_margin and gauss.min() >= accept_margin * (alpha if minp else alpha / L):
        adj = float(gauss.min()) if minp else min(1.0, L * float(gauss.min()))
        return gauss, adj, int(np.argmin(gauss)), {"screen": "approx-accept", "mc_draws": 0, "exact": False}
    if not minp:
        R = max(opts.mc, math.ceil(20 * L / alpha)) if opts.min_resolution else opts.mc
        pv, fields = _monte_carlo(levels, obs, var, probs, R, alpha / L, opts.rng, opts.curtail)
        return pv, min(1.0, L * float(pv.min())), int(np.argmin(pv)), fields
    R = max(opts.mc, math.ceil(20 / alpha)) if opts.min_resolution else opts.mc
    mc_alpha = (1.0 - opts.share) * alpha
    pv, p_mc, best, fields = _minp_monte_carlo(levels, obs, var, probs, R, mc_alpha, opts)
    adj = min(1.0, p_mc / (1.0 - opts.share))
    if opts.share > 0:
        adj = min(adj, L * float(cant.min()) / opts.share)
    return pv, adj, best, {**fields, "cantelli_share": opts.share, "mc_p_value": p_mc}


def _next_batch(pending: np.ndarray, h: int, done: int) -> int:
    """Enough draws for the slowest pending level at its observed exceedance rate (at most 4x so far)."""
    if pending.size == 0:
        return 4 * done
    rate = np.maximum(pending, 1) / done
    return int(min(max(32, 1.2 * np.max((h - pending) / rate)), 4 * done))


def _monte_carlo(levels: list[CubeLevel], obs: np.ndarray, var: np.ndarray, probs: np.ndarray, R: int,
                 level_alpha: float, rng: np.random.Generator, curtail: bool) -> tuple[np.ndarray, dict[str, Any]]:
    """Rank p-values of the Y-only null, curtailed with Besag-Clifford p-values ``h / draws``."""
    n, k = probs.shape
    cum = np.cumsum(probs, axis=1)
    cum /= cum[:, -1:]
    h = math.floor(level_alpha * (R + 1)) + 1  # exceedances after which a level cannot reject
    threshold = obs - _TIE_TOL * np.sqrt(var)
    exceed = np.zeros(len(levels), dtype=np.int64)
    stop_at = np.zeros(len(levels), dtype=np.int64)
    done, batch = 0, 32
    cap = max(1, _BATCH_ELEMENTS // (n * k))
    stack = _NullStack(probs, levels)
    while done < R:
        size = min(batch, cap, R - done)
        y_star = _draw_labels(cum, size, rng)
        T = stack.statistics(y_star)
        cum_ex = np.cumsum(T >= threshold, axis=0) + exceed
        for j in np.flatnonzero((stop_at == 0) & (cum_ex[-1] >= h)):
            stop_at[j] = done + 1 + int(np.argmax(cum_ex[:, j] >= h))
        exceed = cum_ex[-1]
        done += size
        if curtail and np.all(stop_at > 0):
            break
        batch = _next_batch(exceed[stop_at == 0], h, done)
    full = (1.0 + exceed) / (R + 1.0)
    pv = np.where(stop_at > 0, h / np.maximum(stop_at, 1), full) if done < R else full
    return pv, {"mc_requested": R, "mc_draws": done, "curtailed": bool(done < R), "screen": None}


def _minp_monte_carlo(levels: list[CubeLevel], obs: np.ndarray, var: np.ndarray, probs: np.ndarray, R: int,
                      mc_alpha: float, opts: _McOptions) -> tuple[np.ndarray, float, int, dict[str, Any]]:
    """Single-step min-p rank p-value of ``M = min_b q_b(T_b)`` (Westfall & Young), curtailed (Besag-Clifford).

    ``q_b`` is fixed by the pilot draws before the counted ones, so given the scores the observed labels and
    the ``R`` counted draws are exchangeable under the null and ``(1 + #{M* <= M}) / (R + 1)`` is exact; ties
    (and near-ties within a relative 1e-9) count against the observation.  Returns ``(per-level p-values
    (informative), combined p-value, most significant level, fields)``.
    """
    n, k = probs.shape
    cum = np.cumsum(probs, axis=1)
    cum /= cum[:, -1:]
    stack = _NullStack(probs, levels)
    cap = max(1, _BATCH_ELEMENTS // (n * k))
    qpar = q_params(var, _pilot_third_moment(stack, cum, opts.pilot, cap, opts.rng))
    q_obs = q_transform(obs[None, :], qpar)[0]
    m_obs = float(q_obs.min()) * (1.0 + 1e-9)
    h = math.floor(mc_alpha * (R + 1)) + 1  # exceedances of M after which the test cannot reject
    threshold = obs - _TIE_TOL * np.sqrt(var)
    exceed = np.zeros(len(levels), dtype=np.int64)
    hits = stop = done = 0
    batch = 32
    while done < R:
        size = min(batch, cap, R - done)
        T = stack.statistics(_draw_labels(cum, size, opts.rng))
        exceed += (T >= threshold).sum(axis=0)
        running = np.cumsum(q_transform(T, qpar).min(axis=1) <= m_obs) + hits
        if stop == 0 and running[-1] >= h:
            stop = done + 1 + int(np.argmax(running >= h))
        hits, done = int(running[-1]), done + size
        if opts.curtail and stop:
            break
        batch = int(min(max(32, 1.2 * (h - hits) * done / max(hits, 1)), 4 * done))
    p_mc = h / stop if (done < R and stop) else (1.0 + hits) / (R + 1.0)
    fields = {"mc_requested": R, "mc_draws": done, "curtailed": bool(done < R), "screen": None,
              "pilot_draws": opts.pilot, "minp_statistic": float(q_obs.min())}
    return (1.0 + exceed) / (done + 1.0), float(p_mc), int(np.argmin(q_obs)), fields


def _pilot_third_moment(stack: _NullStack, cum: np.ndarray, draws: int, cap: int,
                        rng: np.random.Generator) -> np.ndarray:
    """Per level the mean of ``T**3`` over ``draws`` null draws (``E T = 0``): the third cumulant's estimate."""
    total = np.zeros(len(stack.levels))
    done = 0
    while done < draws:
        size = min(cap, draws - done)
        total += (stack.statistics(_draw_labels(cum, size, rng)) ** 3).sum(axis=0)
        done += size
    return total / max(draws, 1)
