"""T-Cal's Monte Carlo kernel: :class:`Simulator`, null draws of the DPE at every level of an atoms' set.

The draws and the level statistics of :meth:`~calmon.algorithms.tcal.atoms.Atoms.draw` and
:meth:`~calmon.algorithms.tcal.atoms.Atoms.stats`, bit for bit, computed as CSR products into one
preallocated arena (reused per thread) instead of freshly allocated arrays.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
from scipy import sparse

try:  # scipy's CSR x dense kernel, called on preallocated output (``M @ X`` allocates a fresh zeroed result)
    from scipy.sparse._sparsetools import csr_matvecs as _csr_matvecs
except ImportError:  # pragma: no cover - layout of scipy's private modules
    _csr_matvecs = None

if TYPE_CHECKING:
    from calmon.algorithms.tcal.atoms import Atoms
__all__ = ["Simulator"]


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
    """Null draws of the DPE at every level of :class:`~calmon.algorithms.tcal.atoms.Atoms`, bit for bit
    ``stats(*draw(r, rng))``.

    Same draws from the same ``rng`` stream and the same floating-point operations, in the same order, as
    :meth:`~calmon.algorithms.tcal.atoms.Atoms.draw` then :meth:`~calmon.algorithms.tcal.atoms.Atoms.stats`,
    with far less memory traffic: the draws ``k`` go straight into an atom-major buffer (singleton atoms
    first, then the sampler's atoms in its order: nothing is scattered); each level's cell sums ``[Ck; Cg]``
    are one CSR product whose row entries keep the original order (so each sum adds the same terms in the
    same order) -- from the draws with the weights ``1 - 2p`` folded in (``g = k (1 - 2p)`` is never formed;
    only when the CSR kernel does not fuse multiply-adds, checked at import) or from a finer level's sums;
    sums no coarser level reads are finished in place.  All buffers live in one arena whose regions are
    reused once dead, and the arena itself is reused by the next simulator of the thread (:meth:`release`).

    Examples
    --------
    >>> from calmon.algorithms.tcal.atoms import Atoms
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
        """:meth:`~calmon.algorithms.tcal.atoms.Atoms.stats` of the draws ``kg`` (buffer rows), its operations in
        its order."""
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
