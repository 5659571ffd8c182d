"""The Monte Carlo engine of T-Cal: atoms (raw distinct scores, or non-empty fine cells) and their levels.

Under calibration, and conditionally on the scores, the outcomes of an atom of ``N`` events with
score ``p`` are ``Bin(N, p)``; every dyadic level's cell sums are unions of atoms (or of a finer
level's cells), so one set of draws gives the joint null of all levels.

:meth:`Atoms.draw` and :meth:`Atoms.stats` define the draws and the level statistics; :class:`Simulator`,
the Monte Carlo kernel, computes the same, bit for bit, as CSR products into one preallocated arena
(reused per thread) instead of freshly allocated arrays.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from scipy import sparse

from calmon.algorithms.tcal.binomial import BinomialSampler
from calmon.algorithms.tcal.estimators import (
    check_binary,
    check_bins,
    check_grid,
    grid_level_cells,
    level_cell_sums,
    level_sums,
    single_tail,
)
from calmon.stats.grid import QUANTUM_BITS, ScoreGrid, cell_index

try:  # scipy's CSR x dense kernel, called on preallocated output (``M @ X`` allocates a fresh zeroed result)
    from scipy.sparse._sparsetools import csr_matvecs as _csr_matvecs
except ImportError:  # pragma: no cover - layout of scipy's private modules
    _csr_matvecs = None

__all__ = ["Atoms", "Level", "Simulator", "simulate_null", "BATCH_ELEMENTS"]

#: Elements (draws x atoms) simulated per batch; bounds memory to a few tens of MB.
BATCH_ELEMENTS = 2_000_000
#: Grid windows up to this many events have exact cell sums of their fixed-point statistics in any order.
_EXACT_EVENTS = 1 << 21
_UNITS = float(2**QUANTUM_BITS)


@dataclass
class Level:
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
class Atoms:
    """Sorted atoms: N events with (approximately) one score each; draws are Bin(N, p).

    Examples
    --------
    >>> a = Atoms.from_raw(np.array([0.2, 0.2, 0.7]), np.array([0.0, 1.0, 1.0]))
    >>> a.N.tolist(), a.p.tolist(), a.k_obs.tolist()
    ([2.0, 1.0], [0.2, 0.7], [1.0, 1.0])
    """

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
    _levels: list[Level] = field(default_factory=list)
    #: Levels measured by :meth:`add_levels` whose :class:`Level` objects are not built yet.
    _levels_pending: list[tuple[Any, ...]] = field(default_factory=list)
    _plan: list[int] | None = None
    _sampler: BinomialSampler | None = None

    @classmethod
    def from_raw(cls, z: np.ndarray, y: np.ndarray) -> Atoms:
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
    def from_grid(cls, grid: ScoreGrid) -> Atoms:
        n = grid.n
        ok = np.flatnonzero(n > 0)
        N = n[ok]
        sz, szz, sy, szy = grid.sum_z[ok], grid.sum_zz[ok], grid.sum_y[ok], grid.sum_zy[ok]
        p = np.minimum(np.maximum(sz / N, 0.0), 1.0)  # np.clip, without its wrapper's overhead
        V = np.maximum(sz - szz, 0.0)
        W = grid.sum_vv[ok]
        M1 = V * (1.0 - 2.0 * p)
        with np.errstate(invalid="ignore", divide="ignore"):
            P3 = np.where(V > 0, W * W / np.where(V > 0, V, 1.0), 0.0)
        return cls(n=int(N.sum()), N=N, p=p, zsum=sz, zzsum=szz, V=V, W=W, k_obs=np.rint(sy),
                   g_obs=sy - 2.0 * szy, exact=False, key=ok, P3=P3, M1=M1, M2=M1 * M1 / N, fine_bins=grid.bins)

    def add_level(self, bins: int) -> Level:
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
        lev = Level(bins=bins, starts_all=starts, keep=keep, N=sums["N"][keep], Z=sums["zsum"][keep],
                     ZZ=sums["zzsum"][keep], V=sums["V"][keep], W=sums["W"][keep], P3=sums["P3"][keep],
                     M1=sums["M1"][keep], M2=sums["M2"][keep])
        self.levels.append(lev)  # after any pending ones
        self._plan = None
        return lev

    def add_levels(self, bins: Sequence[int]) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """:meth:`add_level` for every entry of ``bins``, and per level the observed DPE and plug-in (eqs. 5-6),
        exact null variance and third cumulant: :meth:`observed`, :meth:`variance`, :meth:`third_cumulant`.

        The same numbers bit for bit, in a few array passes instead of a dozen calls per level: every level's
        cell sums come from one ``reduceat`` over the atoms tiled once per level (the segments are the ones
        :meth:`add_level` sums, so each cell adds the same terms in the same order) -- or, for a grid's
        fixed-point sums, from exact cumulative sums -- and the per-level sums over cells are segment sums
        with a leading zero, which is how ``ndarray.sum`` adds (pairwise).  The :class:`Level` objects are
        built when :attr:`levels` is first read (the screens never do).
        """
        ms = [check_bins(m) for m in bins]
        level, start, end = self._cells(ms)
        L = len(ms)
        cells = np.bincount(level, minlength=L)
        S_atom, Q_atom = self.k_obs - self.zsum, self.g_obs + self.zzsum
        # np.array copies a list of rows like np.stack, at a third of its overhead
        fixed = self._fixed_sums(np.array([self.N, self.zsum, self.zzsum, self.V, self.W, S_atom, Q_atom]), start,
                                 end, cells)
        if fixed is not None:
            N, S = fixed[0], fixed[5]
            keep = N >= 2
            rounded = level_cell_sums(np.array([self.P3, self.M1, self.M2]), level, start, cells)
            Nk, Z, ZZ, V, W, Sk, Qk = fixed.compress(keep, axis=1)
            P3, M1, M2 = rounded.compress(keep, axis=1)
        else:
            sums = level_cell_sums(np.array([self.N, self.zsum, self.zzsum, self.V, self.W, self.P3, self.M1, self.M2,
                                             S_atom, Q_atom]), level, start, cells)
            N, S = sums[0], sums[8]
            keep = N >= 2
            Nk, Z, ZZ, V, W, P3, M1, M2, Sk, Qk = sums.compress(keep, axis=1)
        plug = level_sums((S * S / N)[None, :], level, L)[0] / self.n
        e3 = (V**3 - 3.0 * V * W + 2.0 * P3) / 6.0
        e2m = (M1**2 - M2) / 2.0
        terms = np.array([(Sk * Sk - Qk) / Nk, np.maximum(V**2 - W, 0.0) / Nk**2, (e2m + 6.0 * e3) / Nk**3])
        kept_level = level[keep]
        dpe, var, k3 = level_sums(terms, kept_level, L)
        self._levels_pending.append((ms, cells, start, keep, np.bincount(kept_level, minlength=L),
                                     (Nk, Z, ZZ, V, W, P3, M1, M2)))
        self._plan = None
        return dpe / self.n, plug, 2.0 / self.n**2 * var, 8.0 / self.n**3 * k3

    def _fixed_sums(self, X: np.ndarray, start: np.ndarray, end: np.ndarray, cells: np.ndarray) -> np.ndarray | None:
        """Cell sums of a grid's fixed-point rows ``X`` from cumulative sums, or ``None`` (raw data, huge grids).

        :meth:`from_grid` (which alone sets ``fine_bins``) takes these rows from the grid's fixed point: multiples
        of 2**-28 whose absolute values add up to less than ``4 n``.  Below 2**25, every partial sum is exact, so
        a cell's sum -- reduceat's, whatever order it adds in -- is a difference of cumulative sums, taken in
        integer units (faster than float ones).
        """
        if self.fine_bins is None or self.n > _EXACT_EVENTS:
            return None
        A = X.shape[1]
        C = np.zeros((X.shape[0], A + 1), dtype=np.int64)
        (X * _UNITS).astype(np.int64).cumsum(axis=1, out=C[:, 1:])
        head, tail = single_tail(cells, A)  # trailing levels of single-atom cells: the atoms themselves
        out = np.empty((X.shape[0], head + tail * A))
        np.multiply(C.take(end[:head], axis=1) - C.take(start[:head], axis=1), 1.0 / _UNITS, out=out[:, :head])
        out[:, head:].reshape(X.shape[0], tail, A)[...] = X[:, None, :]
        return out

    @property
    def levels(self) -> list[Level]:
        """The levels added so far, in order."""
        while self._levels_pending:
            ms, cells, start, keep, kept, arrays = self._levels_pending.pop(0)
            off, koff = np.cumsum(cells) - cells, np.cumsum(kept) - kept
            for j, m in enumerate(ms):
                c, k = slice(off[j], off[j] + cells[j]), slice(koff[j], koff[j] + kept[j])
                self._levels.append(Level(m, start[c], keep[c], *(x[k] for x in arrays)))
        return self._levels

    def _cells(self, ms: list[int]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Every level's non-empty cells, levels in order: level, first atom and end (one past the last)."""
        A = self.N.size
        if self.fine_bins is None:
            brk = np.empty((len(ms), A), dtype=bool)
            brk[:, 0] = True
            per = max(1, BATCH_ELEMENTS // A)  # levels at a time (bounds memory on large raw data)
            for lo in range(0, len(ms), per):
                m = np.array(ms[lo:lo + per])[:, None]  # cell_index of these levels at once
                idx = (self.key[None, :] * m).astype(np.int64)
                np.minimum(idx, m - 1, out=idx)
                np.maximum(idx, 0, out=idx)
                np.not_equal(idx[:, 1:], idx[:, :-1], out=brk[lo:lo + per, 1:])
            flat = np.flatnonzero(brk)
            level, start = np.divmod(flat, A)
            end = np.empty_like(start)
            end[:-1] = start[1:]
            end[end == 0] = A  # the next cell starts a level: this one ends with the atoms
            end[-1] = A
            return level, start, end
        bounds, lev = grid_level_cells(self.fine_bins, tuple(ms))
        before = np.zeros(self.fine_bins + 1, dtype=np.int64)  # atoms before each fine cell
        before[self.key + 1] = 1
        before.cumsum(out=before)
        se = before.take(bounds)  # first atom and end of every cell
        ok = se[1] > se[0]
        start, end = se.compress(ok, axis=1)
        return lev.compress(ok), start, end

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

    def variance(self, lev: Level) -> float:
        return float(2.0 / self.n**2 * (np.maximum(lev.V**2 - lev.W, 0.0) / lev.N**2).sum())

    def third_cumulant(self, lev: Level) -> float:
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
        # k and g summed apart: each column of a sparse product is summed on its own, so this is the
        # product of the two stacked side by side, without the copy
        sums: dict[int, tuple[np.ndarray, np.ndarray]] = {}
        out = np.zeros((r, len(self.levels)))
        for j in order:
            lev = self.levels[j]
            src_k, src_g = (k, g) if lev.source < 0 else sums[lev.source]
            Ck, Cg = lev.matrix @ src_k, lev.matrix @ src_g
            if lev.full:
                sums[j] = (Ck, Cg)
                Ck, Cg = Ck[lev.keep], Cg[lev.keep]
            if lev.N.size == 0:
                continue
            S = Ck - lev.Z[:, None]
            Cg += lev.ZZ[:, None]
            S *= S
            S -= Cg
            out[:, j] = (1.0 / lev.N) @ S / self.n
        return out

    def draw(self, r: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
        """``r`` null draws of per-atom positives (Bernoulli for single events), shape (atoms, r).

        Draws are generated draw-major, so the stream of draws does not depend on the batch sizes (when the
        atoms are all singletons or all of several events).  The Monte Carlo uses :class:`Simulator`, which
        gives ``stats(*draw(r, rng))`` bit for bit at a fraction of the memory traffic.
        Atoms of several events are drawn by :class:`~calmon.algorithms.tcal.binomial.BinomialSampler`,
        bit for bit ``rng.binomial`` (built once per atoms and reused by every batch).
        """
        A = self.N.size
        one = self.N == 1
        if one.all():
            k = (rng.random((r, A)) < self.p).T.astype(np.float64)
        else:
            if self._sampler is None:
                many = ~one
                self._sampler = BinomialSampler.build(self.N[many].astype(np.int64), self.p[many])
            if not one.any():
                k = self._sampler.draw(rng, r)
            else:
                k = np.empty((A, r))
                u = rng.random((r, int(one.sum())))
                b = self._sampler.draw(rng, r)
                k[one] = (u < self.p[one]).T
                k[~one] = b
        return k, k * (1.0 - 2.0 * self.p)[:, None]

    def sampler(self) -> BinomialSampler:
        """The sampler of the atoms of several events (in atom order), built once."""
        if self._sampler is None:
            many = self.N != 1
            self._sampler = BinomialSampler.build(self.N[many].astype(np.int64), self.p[many])
        return self._sampler

    def simulator(self, max_draws: int = 0) -> Simulator:
        """A :class:`Simulator` of these atoms' levels, buffers sized for batches of ``max_draws`` (it holds
        them: drop it when done)."""
        return Simulator(self, max_draws)


# ----------------------------------------------------------------------------------------------------------
# the Monte Carlo kernel: the draws and level statistics of the atoms, in place
# ----------------------------------------------------------------------------------------------------------
def _csr_into(indptr: np.ndarray, indices: np.ndarray, data: np.ndarray, x: np.ndarray, out: np.ndarray) -> None:
    """``out = M @ x`` for the CSR matrix ``M`` = (data, indices, indptr), summing each row's entries in
    stored order (scipy's ``csr_matvecs``, the kernel behind ``M @ x``); ``x`` and ``out`` C-contiguous."""
    if _csr_matvecs is None:  # pragma: no cover
        out[...] = sparse.csr_matrix((data, indices, indptr), shape=(out.shape[0], x.shape[0])) @ x
        return
    if not out.flags.c_contiguous:  # the kernel writes through a flat view
        raise ValueError("output of the cell sums must be C-contiguous")
    out.fill(0.0)
    _csr_matvecs(out.shape[0], x.shape[0], x.shape[1], indptr, indices, data, x.reshape(-1), out.reshape(-1))


def _unfused() -> bool:
    """Whether the CSR kernel rounds ``w k`` before adding it (no fused multiply-add), so that summing
    with the weights ``w = 1 - 2p`` folded into the matrix equals summing ``g = k w``, bit for bit."""
    if _csr_matvecs is None:  # pragma: no cover
        return False
    a = np.full(1, 1.0 + 2.0**-30)
    x, out = np.full(8, 1.0 + 2.0**-30), np.full(8, -1.0)
    _csr_matvecs(1, 1, 8, np.array([0, 1], dtype=np.int32), np.zeros(1, dtype=np.int32), a, x, out)
    return bool(np.all(out == a * x - 1.0))


_FOLD = _unfused()
#: Arenas up to this size are kept (one per thread) for the next simulator: first touches of fresh
#: pages cost about as much as the whole Monte Carlo of a small window.
_KEEP_BYTES = 48 << 20
_ARENA = threading.local()


@dataclass
class _Step:
    """One level's cell sums: a CSR product giving ``[Ck; Cg]`` (k sums over g sums) from its source."""

    level: int
    source: int  # level whose stacked sums are summed (-1: the draws)
    indptr: np.ndarray
    indices: np.ndarray
    data: np.ndarray
    rows: int  # 2 x cells summed
    kept: np.ndarray | None  # cells kept among the summed ones (None: all of them)
    Z: np.ndarray
    ZZ: np.ndarray
    inv_N: np.ndarray
    slot: int = 0  # row offset of its sums in the arena
    read_later: bool = False  # a coarser level sums these sums: do not modify them


def _stacked(m: Any, cols: np.ndarray, shift: int, w: np.ndarray | None
             ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """CSR arrays of ``[M; M diag(w)]`` (``w`` given: columns shared) or ``blockdiag(M, M)`` (second block's
    columns shifted by ``shift``), ``M``'s columns renamed ``cols``; a row's entries keep their order."""
    nnz = int(m.indptr[-1])
    idx = cols[m.indices].astype(np.int32)
    second = (idx, m.data * w[idx]) if w is not None else (idx + shift, m.data)
    return (np.concatenate([m.indptr, m.indptr[1:] + nnz]).astype(np.int32),
            np.concatenate([idx, second[0]]).astype(np.int32), np.concatenate([m.data, second[1]]).astype(np.float64))


class Simulator:
    """Null draws of the DPE at every level of :class:`Atoms`, bit for bit
    ``stats(*draw(r, rng))``.

    Same draws from the same ``rng`` stream and the same floating-point operations, in the same order, as
    :meth:`Atoms.draw` then :meth:`Atoms.stats`,
    with far less memory traffic: the draws ``k`` go straight into an atom-major buffer (singleton atoms
    first, then the sampler's atoms in its order: nothing is scattered); each level's cell sums ``[Ck; Cg]``
    are one CSR product whose row entries keep the original order (so each sum adds the same terms in the
    same order) -- from the draws with the weights ``1 - 2p`` folded in (``g = k (1 - 2p)`` is never formed;
    only when the CSR kernel does not fuse multiply-adds, checked at import) or from a finer level's sums;
    sums no coarser level reads are finished in place.  All buffers live in one arena whose regions are
    reused once dead, and the arena itself is reused by the next simulator of the thread (:meth:`release`).

    Examples
    --------
    >>> a = Atoms.from_raw(np.random.default_rng(0).uniform(size=300), np.zeros(300))
    >>> _ = a.add_level(4), a.add_level(64)
    >>> T = a.simulator()(50, np.random.default_rng(1))
    >>> bool(np.array_equal(T, a.stats(*a.draw(50, np.random.default_rng(1)))))
    True
    """

    def __init__(self, atoms: Atoms, max_draws: int = 0) -> None:
        self.atoms = atoms
        one = atoms.N == 1
        self.n_one = int(one.sum())
        many = np.flatnonzero(~one)
        self.sampler = atoms.sampler() if many.size else None
        tail = many[self.sampler.order] if self.sampler is not None else many
        self.perm = np.concatenate([np.flatnonzero(one), tail])  # buffer row -> atom
        self.p_one = atoms.p[self.perm[: self.n_one]]
        self.w = (1.0 - 2.0 * atoms.p)[self.perm]
        self.steps = self._plan_steps()
        self._r = 0
        self._arena = np.empty(0)
        self._grow(max_draws)

    def _plan_steps(self) -> list[_Step]:
        """Each level's CSR product, and its region of the arena (dead sums' regions are reused)."""
        atoms, A = self.atoms, self.perm.size
        order = atoms._plan if atoms._plan is not None else atoms._make_plan()
        pos = np.empty(A, dtype=np.int64)
        pos[self.perm] = np.arange(A)  # atom -> buffer row
        steps: list[_Step] = []
        for j in order:
            lev = atoms.levels[j]
            m, src = lev.matrix, lev.source
            w = (self.w if _FOLD else None) if src < 0 else None
            cols = pos if src < 0 else np.arange(m.shape[1])
            kept = np.flatnonzero(lev.keep) if lev.full and not lev.keep.all() else None
            steps.append(_Step(j, src, *_stacked(m, cols, A if src < 0 else m.shape[1], w), 2 * m.shape[0],
                               kept, lev.Z[:, None], lev.ZZ[:, None], 1.0 / lev.N))
        last = {st.level: i for i, st in enumerate(steps)}
        for i, st in enumerate(steps):
            if st.source >= 0:
                last[st.source] = i
                steps[[s.level for s in steps].index(st.source)].read_later = True
        # regions of the arena after the draws (k, or [k; g]): first fit among dead ones
        base = A * (1 if _FOLD else 2)
        live: list[tuple[int, int, int]] = []  # (start, rows, level)
        top = base
        for i, st in enumerate(steps):
            live = [x for x in live if last[x[2]] >= i]
            start = base
            for s0, rows, _ in sorted(live):
                if start + st.rows <= s0:
                    break
                start = max(start, s0 + rows)
            st.slot = start
            live.append((start, st.rows, st.level))
            top = max(top, start + st.rows)
        copies = max([st.inv_N.size for st in steps if st.read_later or st.kept is not None], default=0)
        self._scratch = top  # S and G of levels whose sums are read later
        self._rows = max(top + 2 * copies, base + A)  # the uniforms use the region after the draws
        return steps

    def _grow(self, r: int) -> None:
        """An arena for batches of ``r`` draws (the thread's kept one when large enough)."""
        if r <= self._r:
            return
        need = self._rows * r
        kept = getattr(_ARENA, "arena", None)
        if kept is not None and kept.size >= need:
            self._arena, _ARENA.arena = kept, None
        else:
            self._arena = np.empty(need)
        self._r = r

    def release(self) -> None:
        """Hand the arena to the thread's next simulator (when not too large); the simulator is spent."""
        if 0 < self._arena.nbytes <= _KEEP_BYTES:
            kept = getattr(_ARENA, "arena", None)
            if kept is None or kept.size < self._arena.size:
                _ARENA.arena = self._arena
        self._arena, self._r = np.empty(0), 0

    def _region(self, row: int, rows: int, r: int) -> np.ndarray:
        return self._arena[row * r: (row + rows) * r].reshape(rows, r)

    def __call__(self, r: int, rng: np.random.Generator) -> np.ndarray:
        """``r`` null draws: array ``(r, levels)``, equal to ``atoms.stats(*atoms.draw(r, rng))``."""
        self._grow(r)
        A, n1 = self.perm.size, self.n_one
        base = A * (1 if _FOLD else 2)
        kg = self._region(0, base, r)
        k = kg[:A]
        work = self._arena[base * r:]
        if n1:
            u = rng.random(out=work[: r * n1].reshape(r, n1))
            np.less(u, self.p_one, out=k[:n1].T)
        if self.sampler is not None:
            self.sampler.draw_into(rng, k[n1:], work)
        if not _FOLD:
            np.multiply(k, self.w[:, None], out=kg[A:])
        return self._stats(kg, r)

    def _stats(self, kg: np.ndarray, r: int) -> np.ndarray:
        """:meth:`Atoms.stats` of the draws ``kg`` (buffer rows), its operations in its order."""
        out = np.zeros((r, len(self.atoms.levels)))
        sums: dict[int, np.ndarray] = {}
        for st in self.steps:
            C = self._region(st.slot, st.rows, r)
            _csr_into(st.indptr, st.indices, st.data, kg if st.source < 0 else sums[st.source], C)
            sums[st.level] = C
            c, half = st.inv_N.size, st.rows // 2
            if c == 0:
                continue
            if st.kept is None and not st.read_later:  # Ck - Z and Cg + ZZ in place
                S, G = C[:half], C[half:]
                S -= st.Z
                G += st.ZZ
            elif st.kept is None:  # Ck - Z and Cg + ZZ, leaving the sums coarser levels read
                S, G = self._region(self._scratch, c, r), self._region(self._scratch + c, c, r)
                np.subtract(C[:half], st.Z, out=S)
                np.add(C[half:], st.ZZ, out=G)
            else:  # Ck[keep] - Z and Cg[keep] + ZZ
                S, G = self._region(self._scratch, c, r), self._region(self._scratch + c, c, r)
                np.take(C[:half], st.kept, axis=0, out=S, mode="clip")  # mode "raise" would buffer
                S -= st.Z
                np.take(C[half:], st.kept, axis=0, out=G, mode="clip")
                G += st.ZZ
            S *= S
            S -= G
            out[:, st.level] = st.inv_N @ S / self.atoms.n
        return out


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
        z, _ = check_binary(z, np.zeros(np.shape(z)))
        atoms = Atoms.from_raw(z, np.zeros_like(z))
    elif grid is not None:
        check_grid(grid)
        atoms = Atoms.from_grid(grid)
    else:
        raise ValueError("give raw scores z or a grid")
    for m in bins:
        atoms.add_level(check_bins(m))
    cap = max(1, BATCH_ELEMENTS // max(1, atoms.N.size))
    sim = atoms.simulator(min(cap, int(draws)))
    out = [sim(min(cap, int(draws) - lo), rng) for lo in range(0, int(draws), cap)]
    sim.release()
    return np.vstack(out) if out else np.zeros((0, len(bins)))
