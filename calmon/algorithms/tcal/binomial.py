"""Binomial draws bit-identical to ``Generator.binomial(n, p, size=(r, m))``, vectorised over draws.

T-Cal's Monte Carlo (:meth:`calmon.algorithms.tcal.atoms.Atoms.draw`) draws ``Bin(N_a, p_a)`` for every
atom ``a`` in every replication.  numpy draws an array of binomials one element at a time, recomputing
the per-parameter constants whenever ``(n, p)`` changes from one element to the next -- every element
here -- which made the draws most of a T-Cal round's cost.

For ``min(p, 1 - p) n <= 30`` numpy uses the inversion algorithm (Kachitvichyanukul and Schmeiser 1988,
BINV; ``random_binomial_inversion`` in numpy's ``distributions.c``): one uniform ``U = next_double()``, a
multiple of ``2**-53``; ``px_0 = q**n``; at step ``k`` it stops with ``X = k`` when the running ``u_k``
(``u_0 = U``, ``u_k = u_{k-1} - px_{k-1}``) is ``<= px_k``, else moves on with
``px_{k+1} = ((n - k) p px_k) / ((k + 1) q)``.  The ``px_k`` of an atom do not depend on ``U``, and
``u_k`` is a non-decreasing function of ``U`` (each floating-point subtraction is), so "moves past step
``k``" holds exactly for ``U`` at or above a threshold ``T_k``: the smallest multiple of ``2**-53`` for
which it holds, found once per atom and step by bisection, replaying numpy's arithmetic operation by
operation.  Then ``X = #{k : U >= max_{j <= k} T_j}``, a few comparisons per draw.  The uniforms are
``Generator.random``'s, in the same (C) order, and the constants are computed as in C (``exp(n log q)``
with the C library through :mod:`math`), so the draws -- and every T-Cal p-value computed from them --
are unchanged.

Where the replay could differ, numpy draws instead (the generator put back first): an atom with
``p = 0`` (numpy consumes no uniform), an atom drawn by BTPE (``min(p, 1 - p) n > 30``, a variable
number of uniforms), a draw running past the bound (numpy draws a second uniform), or thresholds that
would cost more than the draws.  ``tests/test_tcal_binomial.py`` compares with ``Generator.binomial``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

__all__ = ["BinomialSampler"]

#: Above this ``min(p, 1 - p) n`` numpy uses BTPE instead of inversion.
_INVERSION_MAX = 30.0
_ULP = 2.0**-53
_TOP = 2**53  # U < 1: no threshold at or above this is ever reached


@dataclass(frozen=True)
class BinomialSampler:
    """Draws of ``Bin(n_a, p_a)`` for fixed atoms, as ``Generator.binomial(n, p, size=(r, m))`` gives them.

    Examples
    --------
    >>> n, p = np.array([2, 5, 1, 30]), np.array([0.1, 0.7, 0.5, 0.02])
    >>> s = BinomialSampler.build(n, p)
    >>> a = s.draw(np.random.default_rng(3), 1000)
    >>> b = np.random.default_rng(3).binomial(n, p, size=(1000, 4)).T
    >>> bool(np.array_equal(a, b)), s.replayable
    (True, True)
    """

    n: np.ndarray
    p: np.ndarray
    #: ``(m, K)``: ``U >= thresholds[a, k]`` moves atom ``a`` past step ``k`` (running maxima; 2.0: never),
    #: atoms in ``order`` (most reachable steps first); ``None``: numpy draws.
    thresholds: np.ndarray | None
    bound: np.ndarray
    flip: np.ndarray
    #: Atoms by decreasing number of reachable steps, and per step how many atoms (a prefix) reach it.
    order: np.ndarray
    reach: tuple[int, ...]

    @property
    def replayable(self) -> bool:
        """Whether draws are replayed (else numpy draws them)."""
        return self.thresholds is not None

    @classmethod
    def build(cls, n: np.ndarray, p: np.ndarray) -> BinomialSampler:
        """The sampler of atoms ``n`` (events, int) with probabilities ``p``."""
        n = np.asarray(n, dtype=np.int64)
        p = np.asarray(p, dtype=np.float64)
        flip = p > 0.5
        bound = np.zeros(n.size, dtype=np.int64)
        tables = _px_tables(n, p, flip, bound)
        if tables is None:
            return cls(n, p, None, bound, flip, np.arange(n.size), ())
        t = _thresholds(*tables, bound)
        steps = (t < 2.0).sum(axis=1)
        order = np.argsort(-steps, kind="stable")
        reach = tuple(int((steps > k).sum()) for k in range(int(steps.max(initial=0))))
        return cls(n, p, t[order], bound[order], flip, order, reach)

    def draw(self, rng: np.random.Generator, r: int) -> np.ndarray:
        """``r`` draws of every atom, atom-major: ``rng.binomial(n, p, size=(r, m)).T`` (float64, shape
        ``(m, r)``); ``rng`` ends where numpy would leave it."""
        m = self.n.size
        if self.thresholds is None:
            return rng.binomial(self.n, self.p, size=(r, m)).T.astype(np.float64)
        state = rng.bit_generator.state
        u = rng.random((r, m)).T[self.order]  # atom-major, contiguous per atom
        x = np.zeros((m, r), dtype=np.int8)  # bound <= 30 + 10 sqrt(31) < 127
        for k, c in enumerate(self.reach):  # the atoms reaching step k are a prefix: work ~ sum of their steps
            x[:c] += u[:c] >= self.thresholds[:c, k, None]
        if np.any(x > self.bound[:, None]):  # numpy draws a second uniform for such a draw
            rng.bit_generator.state = state
            return rng.binomial(self.n, self.p, size=(r, m)).T.astype(np.float64)
        out = np.empty((m, r))
        out[self.order] = x
        flip = np.flatnonzero(self.flip)
        out[flip] = self.n[flip, None] - out[flip]
        return out

    def draw_into(self, rng: np.random.Generator, out: np.ndarray, work: np.ndarray) -> None:
        """As :meth:`draw`, written into ``out`` (``(m, r)``, C-contiguous) with atoms in ``order``.

        ``out[i]`` holds the draws of atom ``order[i]``; ``work`` is a contiguous float64 scratch of at least
        ``m r`` elements.  No ``(m, r)`` array is allocated: the uniforms are drawn into ``work`` and gathered into
        ``out``, which then receives the counts (values, and the ``rng`` stream, exactly as :meth:`draw`).
        """
        m, r = out.shape
        if self.thresholds is None:
            out[...] = rng.binomial(self.n, self.p, size=(r, m)).T[self.order]
            return
        state = rng.bit_generator.state
        u = rng.random(out=work[: r * m].reshape(r, m))  # draw-major, as numpy's (r, m) draws
        np.take(u.T, self.order, axis=0, out=out, mode="clip")  # atom-major; "raise" would buffer
        # the uniforms are in ``out`` now: counts and step masks reuse their scratch (no fresh pages)
        x = work.view(np.int8)[: m * r].reshape(m, r)
        mask = work.view(np.bool_)[m * r: 2 * m * r].reshape(m, r)
        x.fill(0)
        for k, c in enumerate(self.reach):
            np.add(x[:c], np.greater_equal(out[:c], self.thresholds[:c, k, None], out=mask[:c]), out=x[:c])
        if np.any(np.greater(x, self.bound[:, None], out=mask)):
            rng.bit_generator.state = state
            out[...] = rng.binomial(self.n, self.p, size=(r, m)).T[self.order]
            return
        # n - x for flipped atoms, x otherwise: integers, so -x + n is exact
        flip = self.flip[self.order]
        np.multiply(x, np.where(flip, -1.0, 1.0)[:, None], out=out)
        out += np.where(flip, self.n[self.order], 0)[:, None]


def _px_tables(n: np.ndarray, p: np.ndarray, flip: np.ndarray, bound: np.ndarray
               ) -> tuple[np.ndarray, np.ndarray] | None:
    """``px_k`` per atom and step (``(m, K)``, steps past an atom's bound unused) and steps per atom."""
    m = n.size
    if m == 0:
        return None
    pp, qq, qn = np.empty(m), np.empty(m), np.empty(m)
    for i, (ni, pi, fi) in enumerate(zip(n.tolist(), p.tolist(), flip.tolist())):
        if ni <= 0 or pi == 0.0 or not 0.0 <= pi <= 1.0:
            return None  # numpy consumes no uniform (or reports an error)
        pv = 1.0 - pi if fi else pi
        if pv * ni > _INVERSION_MAX:
            return None  # BTPE
        q = 1.0 - pv
        npv = ni * pv
        pp[i], qq[i] = pv, q
        qn[i] = math.exp(ni * math.log(q))  # q >= 0.5: the C library's exp and log, as numpy's C code
        bound[i] = int(min(float(ni), npv + 10.0 * math.sqrt(npv * q + 1)))
    steps = bound + 1  # steps 0..bound
    K = int(steps.max())
    if int(steps.sum()) * K > 1_000_000:  # the bisection would cost more than it saves
        return None
    px = np.zeros((m, K))
    px[:, 0] = qn
    for k in range(1, K):
        # ((n - X + 1) * p * px) / (X * q) with X = k, left to right as in C
        px[:, k] = ((n - k + 1).astype(np.float64) * pp * px[:, k - 1]) / (float(k) * qq)
    return px, steps


def _thresholds(px: np.ndarray, steps: np.ndarray, bound: np.ndarray) -> np.ndarray:
    """Per atom and step the smallest ``U`` moving past it (running maxima over steps), by bisection."""
    m, K = px.shape
    k, atom = np.nonzero(np.arange(K)[:, None] < steps[None, :])  # by step: those past step j are a suffix
    first = np.searchsorted(k, np.arange(K), side="right")  # pairs (atom, k) with k > j start here
    lo = np.zeros(atom.size, dtype=np.int64)
    hi = np.full(atom.size, _TOP, dtype=np.int64)
    cols = [px[atom[first[j]:], j] for j in range(K)]
    last = px[atom, k]
    u = np.empty(atom.size)
    for _ in range(54):
        mid = (lo + hi) // 2
        np.multiply(mid, _ULP, out=u)  # exact: mid < 2**53
        for j in range(K - 1):  # u_j = u_{j-1} - px_{j-1}, in numpy's order
            u[first[j]:] -= cols[j]
        past = u > last
        hi = np.where(past, mid, hi)
        lo = np.where(past, lo, mid + 1)
    t = np.full((m, K), 2.0)
    t[atom, k] = np.where(lo >= _TOP, 2.0, lo.astype(np.float64) * _ULP)
    return np.maximum.accumulate(t, axis=1)
