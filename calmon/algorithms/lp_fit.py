"""Algorithm 2 ("Multiclass Calibration") of Bairaktari & Nguyen on level-set statistics.

Phase 1 finds the heavy bins B from pool 0.  Every heavy bin starts as its own group of G with
prediction ``rho(v)`` and its own piece of M (size ``2**0``).  A priority queue holds the groups
whose estimated error ``|P pred - E|`` exceeds ``beta / 2``; the worst is moved to
``pi(pred with class j set to E_j / P)``, and if that lands in the level set of another group
the two merge, their pieces of M combining like a binary carry (one piece per power-of-two size,
each size estimated from its own sample pools).  The loop stops when no group is violated or
at the iteration cap of Lemma 14.

References
----------
Bairaktari, Nguyen. Multiclass calibration under the probability-weighted l_p error (seeds 000 and
001 in ../shared/seeds): Algorithm 2, Theorem 7, Lemmas 8-9 (estimates and pools), 14 (iteration cap).
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass
from typing import Any, TypedDict

import numpy as np

from calmon.algorithms.lp_map import LevelSetMap
from calmon.algorithms.lp_params import (
    beta_of,
    check_p,
    iteration_cap,
    lambda_of,
    pools_needed,
    squared_error_bound,
    theorem7_budget,
)
from calmon.algorithms.simplex import project_simplex
from calmon.stats.levelset import LevelSetStats, level_keys, rho

__all__ = ["LPFit", "LPGroup", "LPPiece", "fit_lp", "fit_lp_raw"]


class LPPiece(TypedDict):
    """A piece of M: ``2**size_exp`` heavy bins (indices into ``heavy_keys``) and its estimates."""

    size_exp: int
    bins: list[int]
    P: float
    E: list[float]


class LPGroup(TypedDict):
    """A group of G: its bins, prediction, summed estimates, estimated error per class and pieces."""

    bins: list[int]
    pred: list[float]
    P: float
    E: list[float]
    error: list[float]
    pieces: list[LPPiece]


@dataclass
class LPFit:
    """Result of :func:`fit_lp`: the map ``h``, diagnostics, and the final groups and pieces.

    ``groups`` lists, per group of G: ``bins`` (indices into ``heavy_keys``), ``pieces`` (the
    pieces of M inside it: ``{"size_exp", "bins", "P", "E"}``), ``pred``, ``P`` and ``E`` (sums
    of the piece estimates) and ``error`` (the estimated ``|P pred - E|`` per class).

    Examples
    --------
    >>> fit = fit_lp_raw(np.tile([[0.6, 0.4]], (100, 1)), np.repeat([0, 1], 50), eps=0.1, pools=1)
    >>> fit.diagnostics["heavy_bins"], len(fit.groups), fit.groups[0]["bins"]
    (1, 1, [0])
    """

    map: LevelSetMap
    diagnostics: dict[str, Any]
    heavy_keys: np.ndarray
    groups: list[LPGroup]


class _Estimator:
    """Pool bookkeeping and (optionally noisy) estimates of piece masses and label masses."""

    def __init__(self, stats: LevelSetStats, n_sizes: int, noise: bool, alpha: float,
                 rng: np.random.Generator) -> None:
        pools = stats.pools
        self.n_pool = stats.n_pool
        self.counts_pool = stats.counts_pool
        self.sizes = stats.pool_sizes.astype(np.float64)
        self.mass_pool = [1 + (2 * i) % (pools - 1) if pools > 1 else 0 for i in range(n_sizes)]
        self.label_pool = [1 + (2 * i + 1) % (pools - 1) if pools > 1 else 0 for i in range(n_sizes)]
        self.noise = noise
        self.alpha = alpha
        self.rng = rng
        self.queries = [0] * n_sizes

    def scale(self, pool: int) -> float:
        """Laplace scale ``8 / (m alpha)`` of Lemma 9 for a pool of ``m`` samples."""
        return 8.0 / (max(self.sizes[pool], 1.0) * self.alpha)

    def estimate(self, bins: np.ndarray, size_exp: int) -> tuple[float, np.ndarray]:
        """``(P, E)`` of the bins (rows of the statistics) from the pools of piece size ``2**size_exp``."""
        mp, lp = self.mass_pool[size_exp], self.label_pool[size_exp]
        self.queries[size_exp] += 1
        pm = self.n_pool[mp, bins].sum() / max(self.sizes[mp], 1.0)
        em = self.counts_pool[lp, bins].sum(axis=0) / max(self.sizes[lp], 1.0)
        if self.noise:
            pm = pm + self.rng.laplace(0.0, self.scale(mp))
            em = em + self.rng.laplace(0.0, self.scale(lp), size=em.shape)
        return float(pm), em.astype(np.float64)


@dataclass
class _Piece:
    size_exp: int
    bins: list[int]
    mass: float          # P: estimated probability of the piece
    labels: np.ndarray   # E: estimated probability of the piece and each class


@dataclass
class _Group:
    bins: list[int]
    pieces: dict[int, int]  # size exponent -> piece id; at most one piece per size
    pred: np.ndarray
    version: int = 0        # bumped on every change; stale heap entries carry an old version


def _key_bytes(pred: np.ndarray, lam: int) -> bytes:
    return level_keys(pred, lam).astype("<i4").tobytes()


@dataclass
class _Setup:
    """Everything fixed before the loop: parameters, Phase 1 and the estimator."""

    stats: LevelSetStats  # at resolution lam
    eps: float
    p: float
    delta: float
    beta: float
    lam: int
    mu: np.ndarray        # Phase-1 bin masses (pool 0)
    heavy: np.ndarray     # rows of the heavy bins B
    n_sizes: int
    est: _Estimator
    cap: int

    @property
    def heavy_keys(self) -> np.ndarray:
        return self.stats.keys[self.heavy]


def _at_lambda(stats: LevelSetStats, eps: float, p: float, lam: int | None) -> LevelSetStats:
    """The statistics at Algorithm 2's resolution (coarsened from a multiple of it)."""
    lam_target = lambda_of(eps, p) if lam is None else int(lam)
    if stats.lam == lam_target:
        return stats
    if stats.lam % lam_target:
        raise ValueError(f"level-set statistics have lambda={stats.lam}, Algorithm 2 at eps={eps}, p={p} "
                         f"needs lambda={lam_target} (or a multiple of it)")
    return stats.coarsen(lam_target)


def _setup(stats: LevelSetStats, eps: float, p: float, delta: float, *, lam: int | None, noise: bool,
           seed: int, max_iter: int | None) -> _Setup:
    if not isinstance(stats, LevelSetStats):
        raise ValueError(f"fit_lp needs LevelSetStats, got {type(stats).__name__}")
    p = check_p(p)
    beta = beta_of(eps, p)
    if not 0.0 < delta < 1.0:
        raise ValueError(f"delta must lie in (0, 1), got {delta}")
    stats = _at_lambda(stats, eps, p, lam)
    m1 = float(stats.pool_sizes[0])
    mu = stats.n_pool[0] / m1 if m1 > 0 else np.zeros(stats.num_bins)
    heavy = np.flatnonzero(mu >= beta / 6.0)
    nb = len(heavy)
    n_sizes = int(math.floor(math.log2(nb))) + 1 if nb else 1
    big_l = (math.ceil(math.log2(nb)) + 1) if nb else 1
    est = _Estimator(stats, n_sizes, noise, beta / (36.0 * big_l), np.random.default_rng(seed))
    cap = iteration_cap(beta, stats.lam) if max_iter is None else int(max_iter)
    return _Setup(stats=stats, eps=eps, p=p, delta=delta, beta=beta, lam=stats.lam, mu=mu, heavy=heavy,
                  n_sizes=n_sizes, est=est, cap=cap)


class _Run:
    """The state of Algorithm 2's loop: pieces of M, groups of G, the level-set index and the queue."""

    def __init__(self, setup: _Setup) -> None:
        self.est = setup.est
        self.heavy = setup.heavy
        self.lam = setup.lam
        self.thresh = setup.beta / 2.0
        self.pieces: dict[int, _Piece] = {}
        self.groups: dict[int, _Group] = {}
        self.keymap: dict[bytes, int] = {}  # level set of a group's prediction -> group id
        self.heap: list[tuple[float, int, int]] = []
        self.iterations = self.merges = self.piece_merges = self.skipped = 0
        heavy_keys = setup.heavy_keys
        nb = len(self.heavy)
        for g in range(nb):
            pm, em = self.est.estimate(self.heavy[[g]], 0)
            self.pieces[g] = _Piece(0, [g], pm, em)
            pred = rho(heavy_keys[g], self.lam)
            self.groups[g] = _Group(bins=[g], pieces={0: g}, pred=pred)
            self.keymap[_key_bytes(pred, self.lam)] = g
        self.next_piece = nb
        for g in range(nb):
            self.push(g)

    def sums(self, grp: _Group) -> tuple[float, np.ndarray]:
        """``(Pbar, Ebar)`` of a group: sums of the estimates of the pieces of M inside it."""
        ps = list(grp.pieces.values())
        return (float(sum(self.pieces[i].mass for i in ps)),
                np.sum([self.pieces[i].labels for i in ps], axis=0))

    def push(self, gid: int) -> None:
        """Queue the group if it violates the threshold (worst error first)."""
        grp = self.groups[gid]
        pb, eb = self.sums(grp)
        err = np.abs(pb * grp.pred - eb)
        if err.max() > self.thresh:
            if pb <= 1e-12:  # guard: no usable mass estimate (empty or noisy pool)
                self.skipped += 1
                return
            heapq.heappush(self.heap, (-float(err.max()), gid, grp.version))

    def run(self, cap: int) -> None:
        """Fix violated groups, worst first, until none is left or ``cap`` updates were made."""
        while self.heap and self.iterations < cap:
            _, gid, ver = heapq.heappop(self.heap)
            grp = self.groups.get(gid)
            if grp is not None and grp.version == ver:
                self._update(gid, grp)

    def pending(self) -> bool:
        """True if a live violation is still queued (the loop stopped at the cap)."""
        return any(gid in self.groups and self.groups[gid].version == ver for _, gid, ver in self.heap)

    def _update(self, gid: int, grp: _Group) -> None:
        pb, eb = self.sums(grp)
        err = np.abs(pb * grp.pred - eb)
        j = int(np.argmax(err))
        if err[j] <= self.thresh:
            return
        z = grp.pred.copy()
        z[j] = min(eb[j] / pb, 1.0)
        new_pred = project_simplex(z)
        del self.keymap[_key_bytes(grp.pred, self.lam)]
        kb = _key_bytes(new_pred, self.lam)
        other = self.keymap.get(kb)
        if other is None:
            grp.pred = new_pred
        else:
            self._absorb(grp, pb, self.groups.pop(other), new_pred)
        self.keymap[kb] = gid
        grp.version += 1
        self.iterations += 1
        self.push(gid)

    def _absorb(self, grp: _Group, mass: float, other: _Group, new_pred: np.ndarray) -> None:
        """Merge ``other`` into ``grp``; the heavier group's prediction survives."""
        other_mass, _ = self.sums(other)
        grp.pred = other.pred if mass <= other_mass else new_pred
        grp.bins = grp.bins + other.bins
        self.merges += 1
        grp.pieces = self._carry(dict(grp.pieces), dict(other.pieces))

    def _carry(self, mine: dict[int, int], carry: dict[int, int]) -> dict[int, int]:
        """Add the pieces ``carry`` to ``mine`` like binary numbers: equal sizes merge into the next size."""
        for e in sorted(carry):
            pid = carry[e]
            while e in mine:
                a = mine.pop(e)
                bins = self.pieces[a].bins + self.pieces[pid].bins
                del self.pieces[a], self.pieces[pid]
                e += 1
                if e >= len(self.est.mass_pool):  # cannot happen while |group| <= |B|
                    raise RuntimeError("piece size exceeds |B|")
                pid = self._new_piece(e, bins)
                self.piece_merges += 1
            mine[e] = pid
        return mine

    def _new_piece(self, size_exp: int, bins: list[int]) -> int:
        pm, em = self.est.estimate(self.heavy[bins], size_exp)
        pid = self.next_piece
        self.next_piece += 1
        self.pieces[pid] = _Piece(size_exp, bins, pm, em)
        return pid

    def group_info(self, grp: _Group) -> LPGroup:
        """The JSON-ready description of a final group."""
        pb, eb = self.sums(grp)
        pieces: list[LPPiece] = [{"size_exp": self.pieces[i].size_exp, "bins": sorted(self.pieces[i].bins),
                                  "P": self.pieces[i].mass, "E": self.pieces[i].labels.tolist()}
                                 for _, i in sorted(grp.pieces.items())]
        return {"bins": sorted(grp.bins), "pred": grp.pred.tolist(), "P": pb, "E": eb.tolist(),
                "error": np.abs(pb * grp.pred - eb).tolist(), "pieces": pieces}


def _output_map(run: _Run, setup: _Setup, passthrough: bool) -> LevelSetMap:
    """The map h: heavy bin -> index of its group (groups in id order) -> prediction."""
    gids = sorted(run.groups)
    group_of = np.empty(len(setup.heavy), dtype=np.int64)
    for i, g in enumerate(gids):
        group_of[run.groups[g].bins] = i
    k = setup.stats.classes
    preds = np.array([run.groups[g].pred for g in gids]) if gids else np.zeros((0, k))
    return LevelSetMap(lam=setup.lam, classes=k, keys=setup.heavy_keys, group_of=group_of, preds=preds,
                       passthrough=passthrough)


def _diagnostics(setup: _Setup, run: _Run, groups: list[LPGroup], *, passthrough: bool, noise: bool,
                 seed: int) -> dict[str, Any]:
    stats, est, nb, p = setup.stats, setup.est, len(setup.heavy), setup.p
    budget = theorem7_budget(setup.eps, p, setup.delta, stats.classes, nb, setup.lam)
    roles_needed = 1 + 2 * setup.n_sizes
    return {
        "eps": setup.eps, "p": p if math.isfinite(p) else "inf", "delta": setup.delta, "beta": setup.beta,
        "lam": setup.lam, "threshold": run.thresh, "classes": stats.classes, "bins_observed": stats.num_bins,
        "heavy_bins": nb, "heavy_mass_phase1": float(setup.mu[setup.heavy].sum()) if nb else 0.0,
        "groups": len(groups), "iterations": run.iterations, "iteration_cap": setup.cap, "merges": run.merges,
        "piece_merges": run.piece_merges, "stopped": "iteration cap" if run.pending() else "converged",
        "max_error_estimate": float(max((max(g["error"]) for g in groups), default=0.0)),
        "skipped_groups": run.skipped, "passthrough": passthrough, "noise": noise,
        "noise_scales": ({"phase1": None, "mass": [est.scale(q) for q in est.mass_pool],
                          "labels": [est.scale(q) for q in est.label_pool]} if noise else None),
        "seed": seed, "pools": stats.pools, "pools_needed": roles_needed,
        "pools_shared": stats.pools < roles_needed, "pool_sizes": stats.pool_sizes.tolist(),
        "pool_roles": {"phase1": 0, "mass": est.mass_pool, "labels": est.label_pool},
        "queries_per_size": est.queries, "samples_used": stats.count, "overflow_events": stats.overflow_count,
        "budget": budget, "budget_ratio": budget["total"] / max(stats.count, 1),
        "squared_error_bound": squared_error_bound(setup.beta, setup.lam),
    }


def fit_lp(stats: LevelSetStats, eps: float = 0.1, p: float = math.inf, delta: float = 0.05, *,
           noise: bool = False, seed: int = 0, max_iter: int | None = None, passthrough: bool = False,
           lam: int | None = None) -> LPFit:
    """Algorithm 2 ("Multiclass Calibration") on level-set statistics.

    Parameters
    ----------
    stats
        Level-set statistics of ``(f(x), y)`` split into sample pools.  Pool 0 serves Phase 1;
        piece size ``2**i`` uses pool ``1 + 2i`` for masses and ``2 + 2i`` for labels (modulo
        ``pools - 1`` when there are fewer pools than roles -- reported as ``pools_shared``; with a
        single pool every estimate uses all samples).  ``stats.lam`` must equal ``lambda`` or be a
        multiple of it (then the statistics are coarsened).
    eps, p, delta
        Target ``Err_p <= eps`` with probability ``1 - delta`` (delta only enters the budget).
    noise
        Add Laplace noise ``Lap(8 / (m alpha))`` (Lemma 9, ``alpha = beta / (36 L)``) to every piece
        estimate, seeded by ``seed``.  Only meaningful with the theorem's sample sizes.
    max_iter
        Iteration cap (default: Lemma 14's bound).
    passthrough
        Output ``f(x)`` instead of ``rho(R(f(x)))`` in light bins.
    lam
        Override the resolution (default ``ceil(1/beta)``; other values leave the theorem).

    Returns
    -------
    LPFit
        The map, diagnostics (``iterations``, ``merges``, ``piece_merges``, ``heavy_bins``,
        ``groups``, ``stopped``, ``max_error_estimate``, ``budget`` vs ``samples_used``, ...) and groups.

    Examples
    --------
    >>> rng = np.random.default_rng(0)
    >>> q = rng.dirichlet([1, 1, 1], size=20000)
    >>> y = (rng.random(20000)[:, None] > np.cumsum(q, axis=1)).sum(axis=1)
    >>> f = 0.5 * q + 0.5 / 3                          # underconfident predictor
    >>> fit = fit_lp_raw(f, y, eps=0.1)
    >>> fit.diagnostics["stopped"], fit.diagnostics["max_error_estimate"] <= 0.05
    ('converged', True)
    """
    setup = _setup(stats, eps, p, delta, lam=lam, noise=noise, seed=seed, max_iter=max_iter)
    run = _Run(setup)
    run.run(setup.cap)
    groups = [run.group_info(run.groups[g]) for g in sorted(run.groups)]
    return LPFit(map=_output_map(run, setup, passthrough),
                 diagnostics=_diagnostics(setup, run, groups, passthrough=passthrough, noise=noise, seed=seed),
                 heavy_keys=setup.heavy_keys, groups=groups)


def fit_lp_raw(probs: np.ndarray, labels: np.ndarray, eps: float = 0.1, p: float = math.inf,
               delta: float = 0.05, *, ids: Any = None, pools: int | None = None, salt: int = 0,
               **options: Any) -> LPFit:
    """Algorithm 2 on raw arrays: build :class:`LevelSetStats` at ``lambda = ceil(1/beta)`` and fit.

    Parameters
    ----------
    probs, labels
        Predictions ``(n, K)`` and class indices ``(n,)``.
    eps, p, delta
        As :func:`fit_lp`.
    ids
        Event ids for pool routing (default: sequence numbers).
    pools
        Number of sample pools (default :func:`pools_needed` ``(eps, p)``; 1 = no sample splitting).
    salt
        Routing salt.
    **options
        Passed to :func:`fit_lp` (``noise``, ``seed``, ``max_iter``, ``passthrough``, ``lam``).

    Returns
    -------
    LPFit

    Examples
    --------
    >>> f = np.tile([[0.6, 0.3, 0.1]], (3000, 1)); y = np.repeat([0, 1, 2], 1000)
    >>> fit = fit_lp_raw(f, y, eps=0.1, pools=1)
    >>> h = fit.map.predict(f[:1])                   # every class within beta/2 of 1/3
    >>> bool(np.abs(h - 1 / 3).max() <= 0.05), fit.diagnostics["heavy_bins"]
    (True, 1)
    """
    probs = np.asarray(probs, dtype=np.float64)
    if probs.ndim != 2 or probs.shape[1] < 2:
        raise ValueError(f"probs must have shape (n, K) with K >= 2, got {probs.shape}")
    lam = options.get("lam") or lambda_of(eps, p)
    stats = LevelSetStats(probs.shape[1], lam, pools or pools_needed(eps, p), salt=salt)
    stats.update(probs, labels, ids)
    return fit_lp(stats, eps, p, delta, **options)

