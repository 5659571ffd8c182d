"""Multiclass calibration under the probability-weighted l_p error (Bairaktari & Nguyen).

Contents
--------
* the level-set rounding ``R``, the canonical point ``rho`` and the simplex projection ``pi``;
* the plug-in estimate of ``Err_p`` (Definition 6), the largest cell error and a debiased
  estimate of ``Err_2**2``, from :class:`~calmon.stats.levelset.LevelSetStats` or from raw arrays;
* Algorithm 2 (:func:`fit_lp`): Phase 1 heavy bins, groups G with predictions, power-of-two
  estimation pieces M with one sample pool per piece size and estimate type, optional seeded
  Laplace noise (Lemma 9), a priority queue of violations, merges, the iteration cap of
  Lemma 14, and the option to pass predictions in light bins through unchanged;
* the tester ``"lp"`` (registered in :mod:`calmon.testers`): Err_p against a tolerance ``eps``
  with simultaneous empirical-Bernstein bounds.

Notation: ``K`` classes, bins ``v = R(f(x))`` with keys ``c = lambda v``.  For a bin v and class
j, ``Err(f, v, j) = |E[(f(x)_j - y_j) 1[R(f(x)) = v]]|`` and
``Err_p(f) = (sum_{v, j} Err(f, v, j)**p)**(1/p)`` (``max`` for p = inf).

References
----------
Bairaktari, Nguyen. Multiclass calibration under the probability-weighted l_p error (seeds 000 and
001 in ../shared/seeds): Definition 6 (Err_p), Algorithm 2, Theorem 7 (guarantee and sample
complexity), Lemmas 8-9 (estimates and pools), 11-13 (squared error), 14 (iteration cap).
Maurer, Pontil. Empirical Bernstein bounds and sample variance penalization. COLT 2009, Theorem 4.
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from calmon.algorithms.simplex import project_simplex
from calmon.stats.levelset import ROUND_TOL, LevelSetStats, default_pools, level_keys, rho, unique_keys
from calmon.testers import CalibrationData, register_tester

__all__ = [
    "ROUND_TOL", "R", "rho", "project_simplex", "level_keys", "beta_of", "lambda_of", "pools_needed",
    "lp_error", "lp_error_raw", "LevelSetMap", "LPFit", "fit_lp", "fit_lp_raw", "theorem7_budget",
    "squared_error_bound", "iteration_cap", "lp_test", "lp_tester", "default_pools", "unique_keys",
]


# -- parameters --------------------------------------------------------------------------------------
def _check_p(p: float) -> float:
    p = float(p)
    if not (p > 1.0):
        raise ValueError(f"p must be > 1 (p = 1 is the ECE, which needs exp(K) samples), got {p}")
    return p


def beta_of(eps: float, p: float = math.inf) -> float:
    """Algorithm 2's ``beta = eps**(p/(p-1)) * 2**(-1/(p-1))`` (``eps`` for p = inf), computed in logs.

    Examples
    --------
    >>> beta_of(0.1), round(beta_of(0.1, 2), 6)
    (0.1, 0.005)
    """
    if not 0.0 < eps < 1.0:
        raise ValueError(f"eps must lie in (0, 1), got {eps}")
    p = _check_p(p)
    if math.isinf(p):
        return float(eps)
    return math.exp(p / (p - 1.0) * math.log(eps) - math.log(2.0) / (p - 1.0))


def lambda_of(eps: float, p: float = math.inf) -> int:
    """Level-set resolution ``lambda = ceil(1/beta)`` (with a 1e-9 guard against 1/0.1 = 10.000000000000002).

    Examples
    --------
    >>> lambda_of(0.1), lambda_of(0.1, 2)
    (10, 200)
    """
    return int(math.ceil(1.0 / beta_of(eps, p) - 1e-9))


def pools_needed(eps: float, p: float = math.inf) -> int:
    """Pools for Phase 1 plus a mass and a label pool per piece size ``2**0 .. 2**floor(log2(6/beta))``.

    Examples
    --------
    >>> pools_needed(0.1)
    13
    """
    b = beta_of(eps, p)
    return 1 + 2 * (int(math.floor(math.log2(6.0 / b))) + 1)


def R(probs: np.ndarray, lam: int) -> np.ndarray:
    """The level set ``R(u)_i = floor(lam u_i) / lam`` (one tolerance: :data:`ROUND_TOL`).

    Examples
    --------
    >>> R(np.array([0.3, 0.7]), 10).tolist()
    [0.3, 0.7]
    """
    return level_keys(probs, lam) / lam


def iteration_cap(beta: float, lam: int) -> int:
    """Lemma 14: ``T <= (9 + (36/lambda) log2(36/beta)) / beta**2``.

    Examples
    --------
    >>> iteration_cap(0.1, 10)
    3958
    """
    return int(math.ceil((9.0 + 36.0 / lam * math.log2(36.0 / beta)) / beta**2))


def squared_error_bound(beta: float, lam: int) -> float:
    """Additive rise of the squared error allowed by Lemmas 11 and 13: ``(4/lambda)(1 + log2(36/beta))``.

    Examples
    --------
    >>> round(squared_error_bound(0.1, 10), 3)
    3.797
    """
    return 4.0 / lam * (1.0 + math.log2(36.0 / beta))


def _log_num_levelsets(lam: int, k: int) -> float:
    return math.lgamma(lam + k + 1) - math.lgamma(lam + 1) - math.lgamma(k + 1)


def theorem7_budget(eps: float, p: float, delta: float, classes: int, heavy_bins: int,
                    lam: int | None = None) -> dict[str, Any]:
    """Samples the proof of Theorem 7 asks for, with its explicit constants.

    Phase 1 (Lemma 8 / 16): ``ln(4/(a d))/(2 a**2) + (4/(3a)) ln(2|V|/d)`` with ``a = beta/12``,
    ``d = delta/3`` and ``|V| <= C(lambda + K, K)`` (Lemma 3).  Each piece size ``2**i`` and each
    estimate type (Lemma 9 / 17): ``32 ln(4 n k' / d') / alpha**2`` with ``alpha = beta / (36 L)``,
    ``L = ceil(log2|B|) + 1``, ``d' = delta / (3L)``, ``n = |B| / 2**i`` disjoint queries and
    ``k' = 1`` (mass) or ``K`` (labels).

    Returns
    -------
    dict
        ``phase1``, ``per_pool`` (list of {size, mass, labels}), ``total`` and ``log10_total``.

    Examples
    --------
    >>> b = theorem7_budget(0.1, math.inf, 0.05, 10, 60)
    >>> 1e10 < b["total"] < 1e11
    True
    """
    beta = beta_of(eps, p)
    lam = lambda_of(eps, p) if lam is None else int(lam)
    if not 0.0 < delta < 1.0:
        raise ValueError(f"delta must lie in (0, 1), got {delta}")
    nb = max(int(heavy_bins), 1)
    a1, d1 = beta / 12.0, delta / 3.0
    phase1 = math.log(4.0 / (a1 * d1)) / (2 * a1**2) + 4.0 / (3 * a1) * (
        math.log(2.0 / d1) + _log_num_levelsets(lam, classes))
    big_l = math.ceil(math.log2(nb)) + 1
    alpha = beta / (36.0 * big_l)
    dprime = delta / (3.0 * big_l)
    per_pool = []
    for i in range(int(math.floor(math.log2(nb))) + 1):
        nq = max(1, nb >> i)
        per_pool.append({"size": 2**i,
                         "mass": 32.0 * math.log(4.0 * nq / dprime) / alpha**2,
                         "labels": 32.0 * math.log(4.0 * nq * classes / dprime) / alpha**2})
    total = phase1 + sum(q["mass"] + q["labels"] for q in per_pool)
    return {"phase1": phase1, "per_pool": per_pool, "total": total, "log10_total": math.log10(total),
            "alpha": alpha, "beta": beta, "lam": lam}


# -- the l_p error -------------------------------------------------------------------------------------
def _norm_p(cells: np.ndarray, p: float) -> float:
    if cells.size == 0:
        return 0.0
    m = float(cells.max())
    if math.isinf(p) or m == 0.0:
        return m
    return m * float(np.sum((cells / m) ** p)) ** (1.0 / p)


def _error_summary(keys: np.ndarray, d: np.ndarray, q: np.ndarray | None, n_total: int, p: float,
                   lam: int, overflow: int = 0) -> dict[str, Any]:
    cells = np.abs(d) / n_total
    out: dict[str, Any] = {"p": p if math.isfinite(p) else "inf", "lam": lam, "n": int(n_total),
                           "bins": int(len(keys)), "err_p": _norm_p(cells, p),
                           "err_inf": float(cells.max()) if cells.size else 0.0,
                           "err_2": _norm_p(cells, 2.0), "overflow_mass": overflow / n_total}
    if cells.size:
        b, j = np.unravel_index(int(np.argmax(cells)), cells.shape)
        out["max_cell"] = {"bin": (keys[b] / lam).tolist(), "class": int(j), "error": float(cells[b, j])}
    if q is not None and n_total > 1:
        sq = float(np.sum(d * d - q)) / (n_total * (n_total - 1.0))
        out["err2_sq_debiased"] = sq
        out["err2_debiased"] = math.sqrt(max(sq, 0.0))
    return out


def lp_error(stats: LevelSetStats, p: float = math.inf) -> dict[str, Any]:
    """Plug-in ``Err_p`` of the predictor summarised by level-set statistics (all pools together).

    ``Err^(v, j) = |sum_{x in v} f(x)_j - #{x in v: y = j}| / N``; ``err_p`` is their l_p norm,
    ``err_inf``/``max_cell`` the largest cell, and ``err2_sq_debiased =
    sum_{v,j} (D**2 - Q) / (N (N - 1))`` with ``D = sum (f_j - y_j)``, ``Q = sum (f_j - y_j)**2`` over
    the bin -- unbiased for ``Err_2**2`` because the summands ``X_i = (f_j - y_j) 1[v]`` are iid with
    ``E[D**2] = N E[X**2] + N (N - 1) E[X]**2`` and ``E[Q] = N E[X**2]``.

    Parameters
    ----------
    stats
        Level-set statistics at resolution ``stats.lam``.
    p
        Exponent > 1 (``math.inf`` for the largest cell error).

    Returns
    -------
    dict
        ``err_p``, ``err_inf``, ``err_2``, ``err2_sq_debiased``, ``err2_debiased``, ``max_cell``,
        ``n``, ``bins``, ``overflow_mass`` (events beyond the bin cap, not in any cell).

    Examples
    --------
    >>> s = LevelSetStats(2, 2, pools=1)
    >>> s.update(np.array([[0.8, 0.2], [0.8, 0.2]]), np.array([1, 1]))
    >>> round(lp_error(s)["err_inf"], 6)
    0.8
    """
    p = _check_p(p)
    n_total = stats.count
    if n_total == 0:
        raise ValueError("lp_error needs at least one event")
    d = stats.sum_f - stats.counts
    return _error_summary(stats.keys, d, stats.sum_sq, n_total, p, stats.lam, stats.overflow_count)


def lp_error_raw(probs: np.ndarray, target: np.ndarray, lam: int, p: float = math.inf,
                 bin_probs: np.ndarray | None = None) -> dict[str, Any]:
    """``Err_p`` from raw arrays (an independent implementation of :func:`lp_error`).

    Parameters
    ----------
    probs
        Predictions ``h(x)``, shape ``(n, K)``.
    target
        Class indices ``(n,)`` (labels: plug-in estimate), or a probability matrix ``(n, K)`` of the
        true conditional class probabilities (then the value is exact up to the sampling of x --
        used for ground-truth experiments).
    lam
        Level-set resolution.
    p
        Exponent > 1 or ``math.inf``.
    bin_probs
        Predictions that define the bins (default ``probs``): ``Err(h, v, j)`` bins by ``R(h(x))``.

    Returns
    -------
    dict
        As :func:`lp_error` (the debiased term only for label targets).

    Examples
    --------
    >>> round(lp_error_raw(np.array([[0.8, 0.2], [0.8, 0.2]]), np.array([1, 1]), 2)["err_inf"], 6)
    0.8
    """
    p = _check_p(p)
    h = np.asarray(probs, dtype=np.float64)
    if h.ndim != 2:
        raise ValueError(f"probs must have shape (n, K), got {h.shape}")
    n, k = h.shape
    if n == 0:
        raise ValueError("lp_error_raw needs at least one event")
    t = np.asarray(target)
    if t.ndim == 1:
        if t.shape[0] != n:
            raise ValueError("labels and probs differ in length")
        y = np.zeros((n, k))
        y[np.arange(n), t.astype(np.int64)] = 1.0
        labels = True
    else:
        if t.shape != h.shape:
            raise ValueError(f"target probabilities must have shape {h.shape}, got {t.shape}")
        y = t.astype(np.float64)
        labels = False
    b = h if bin_probs is None else np.asarray(bin_probs, dtype=np.float64)
    keys = level_keys(b / b.sum(axis=1, keepdims=True), lam)
    uk, _, inv = unique_keys(keys, lam)
    diff = h - y
    d = np.stack([np.bincount(inv, weights=diff[:, j], minlength=len(uk)) for j in range(k)], axis=1)
    q = None
    if labels:
        q = np.stack([np.bincount(inv, weights=diff[:, j] ** 2, minlength=len(uk)) for j in range(k)], axis=1)
    return _error_summary(uk, d, q, n, p, lam)


# -- the calibrator map ------------------------------------------------------------------------------
@dataclass
class LevelSetMap:
    """The output ``h`` of Algorithm 2: bins of B mapped to group predictions.

    ``h(x) = preds[group_of[R(f(x))]]`` if ``R(f(x))`` is a heavy bin, else ``rho(R(f(x)))``, or
    ``f(x)`` itself when ``passthrough`` is set (light bins keep the guarantee: their cells have
    mass below beta/4 either way, and passing through cannot raise the squared error).

    Examples
    --------
    >>> m = LevelSetMap(lam=2, classes=2, keys=np.array([[1, 0]]), group_of=np.array([0]),
    ...                 preds=np.array([[0.7, 0.3]]))
    >>> m.predict(np.array([[0.6, 0.4], [0.1, 0.9]])).tolist()
    [[0.7, 0.3], [0.25, 0.75]]
    """

    lam: int
    classes: int
    keys: np.ndarray
    group_of: np.ndarray
    preds: np.ndarray
    passthrough: bool = False
    _index: dict[bytes, int] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        k = int(self.classes)
        if k < 2:
            raise ValueError(f"classes must be >= 2, got {k}")
        self.classes = k
        self.keys = np.asarray(self.keys, dtype=np.int64).reshape(-1, k)
        self.group_of = np.asarray(self.group_of, dtype=np.int64).reshape(-1)
        self.preds = np.asarray(self.preds, dtype=np.float64).reshape(-1, k)
        if len(self.group_of) != len(self.keys):
            raise ValueError("group_of must have one entry per heavy bin")
        if len(self.keys) and (self.group_of.min() < 0 or self.group_of.max() >= len(self.preds)):
            raise ValueError("group_of refers to a missing group")
        if self.preds.size and (not np.isfinite(self.preds).all() or (self.preds < -1e-12).any()
                                or np.abs(self.preds.sum(axis=1) - 1.0).max() > 1e-6):
            raise ValueError("group predictions must be points of the simplex")
        self._index = {self.keys[i].astype("<i4").tobytes(): int(self.group_of[i])
                       for i in range(len(self.keys))}

    def predict(self, probs: np.ndarray) -> np.ndarray:
        """Calibrated probabilities for predictions ``probs`` of shape ``(n, K)``."""
        f = np.asarray(probs, dtype=np.float64)
        if f.ndim != 2 or f.shape[1] != self.classes:
            raise ValueError(f"probs must have shape (n, {self.classes}), got {f.shape}")
        f = f / f.sum(axis=1, keepdims=True)
        keys = level_keys(f, self.lam)
        out = f.copy() if self.passthrough else rho(keys, self.lam)
        if not self._index or len(f) == 0:
            return out
        uk, _, inv = unique_keys(keys, self.lam)
        gid = np.array([self._index.get(uk[i].astype("<i4").tobytes(), -1) for i in range(len(uk))],
                       dtype=np.int64)[inv]
        hit = gid >= 0
        out[hit] = self.preds[gid[hit]]
        return out

    def to_params(self) -> dict[str, Any]:
        return {"lam": int(self.lam), "classes": self.classes, "keys": self.keys.tolist(),
                "group_of": self.group_of.tolist(), "preds": self.preds.tolist(),
                "passthrough": bool(self.passthrough)}

    @classmethod
    def from_params(cls, d: dict[str, Any]) -> LevelSetMap:
        lam = d["lam"]
        if isinstance(lam, bool) or not isinstance(lam, int) or lam < 1:
            raise ValueError(f"lam must be a positive integer, got {lam!r}")
        k = d["classes"]
        if isinstance(k, bool) or not isinstance(k, int) or k < 2:
            raise ValueError(f"classes must be an integer >= 2, got {k!r}")
        keys = np.asarray(d["keys"], dtype=np.int64).reshape(-1, k)
        if (keys < 0).any() or (keys.sum(axis=1) > lam).any():
            raise ValueError("keys must be level-set keys (non-negative integers summing to at most lam)")
        if len({r.tobytes() for r in keys}) != len(keys):
            raise ValueError("keys must be distinct")
        preds = np.asarray(d["preds"], dtype=np.float64).reshape(-1, k)
        return cls(lam=lam, classes=k, keys=keys, group_of=np.asarray(d["group_of"], dtype=np.int64),
                   preds=preds, passthrough=bool(d.get("passthrough", False)))


# -- Algorithm 2 ---------------------------------------------------------------------------------------
@dataclass
class LPFit:
    """Result of :func:`fit_lp`: the map ``h``, diagnostics, and the final groups and pieces.

    ``groups`` lists, per group of G: ``bins`` (indices into ``heavy_keys``), ``pieces`` (the
    pieces of M inside it: ``{"size_exp", "bins", "P", "E"}``), ``pred``, ``P`` and ``E`` (sums
    of the piece estimates) and ``error`` (the estimated ``|P pred - E|`` per class).
    """

    map: LevelSetMap
    diagnostics: dict[str, Any]
    heavy_keys: np.ndarray
    groups: list[dict[str, Any]]


class _Estimator:
    """Pool bookkeeping and (optionally noisy) estimates of piece masses and label masses."""

    def __init__(self, stats: LevelSetStats, n_sizes: int, noise: bool, alpha: float,
                 rng: np.random.Generator) -> None:
        pools = stats.pools
        self.n_pool = stats.n_pool
        self.counts_pool = stats.counts_pool
        self.sizes = stats.pool_sizes.astype(np.float64)
        self.phase1 = 0
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
        mp, lp = self.mass_pool[size_exp], self.label_pool[size_exp]
        self.queries[size_exp] += 1
        pm = self.n_pool[mp, bins].sum() / max(self.sizes[mp], 1.0)
        em = self.counts_pool[lp, bins].sum(axis=0) / max(self.sizes[lp], 1.0)
        if self.noise:
            pm = pm + self.rng.laplace(0.0, self.scale(mp))
            em = em + self.rng.laplace(0.0, self.scale(lp), size=em.shape)
        return float(pm), em.astype(np.float64)


def _key_bytes(pred: np.ndarray, lam: int) -> bytes:
    return level_keys(pred, lam).astype("<i4").tobytes()


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
    if not isinstance(stats, LevelSetStats):
        raise ValueError(f"fit_lp needs LevelSetStats, got {type(stats).__name__}")
    p = _check_p(p)
    beta = beta_of(eps, p)
    if not 0.0 < delta < 1.0:
        raise ValueError(f"delta must lie in (0, 1), got {delta}")
    lam_target = lambda_of(eps, p) if lam is None else int(lam)
    if stats.lam != lam_target:
        if stats.lam % lam_target:
            raise ValueError(f"level-set statistics have lambda={stats.lam}, Algorithm 2 at eps={eps}, p={p} "
                             f"needs lambda={lam_target} (or a multiple of it)")
        stats = stats.coarsen(lam_target)
    lam = lam_target
    k = stats.classes
    rng = np.random.default_rng(seed)
    thresh = beta / 2.0

    # Phase 1: heavy bins from pool 0
    sizes = stats.pool_sizes
    m1 = float(sizes[0])
    n_pool = stats.n_pool
    mu = n_pool[0] / m1 if m1 > 0 else np.zeros(stats.num_bins)
    heavy = np.flatnonzero(mu >= beta / 6.0)
    heavy_keys = stats.keys[heavy]
    nb = len(heavy)
    n_sizes = int(math.floor(math.log2(nb))) + 1 if nb else 1
    big_l = (math.ceil(math.log2(nb)) + 1) if nb else 1
    alpha = beta / (36.0 * big_l)
    est = _Estimator(stats, n_sizes, noise, alpha, rng)
    cap = iteration_cap(beta, lam) if max_iter is None else int(max_iter)

    # pieces of M and groups of G; piece bins index into `heavy`
    pieces: dict[int, dict[str, Any]] = {}
    groups: dict[int, dict[str, Any]] = {}
    keymap: dict[bytes, int] = {}
    for g in range(nb):
        pm, em = est.estimate(heavy[[g]], 0)
        pieces[g] = {"size_exp": 0, "bins": [g], "P": pm, "E": em}
        pred = rho(heavy_keys[g], lam)
        groups[g] = {"bins": [g], "pieces": {0: g}, "pred": pred, "version": 0}
        keymap[_key_bytes(pred, lam)] = g
    next_piece = nb

    def sums(gid: int) -> tuple[float, np.ndarray]:
        ps = groups[gid]["pieces"].values()
        return (float(sum(pieces[i]["P"] for i in ps)),
                np.sum([pieces[i]["E"] for i in ps], axis=0))

    def error(gid: int) -> np.ndarray:
        pb, eb = sums(gid)
        return np.abs(pb * groups[gid]["pred"] - eb)

    heap: list[tuple[float, int, int]] = []
    skipped = 0

    def push(gid: int) -> None:
        nonlocal skipped
        pb, _ = sums(gid)
        err = error(gid)
        if err.max() > thresh:
            if pb <= 1e-12:  # guard: no usable mass estimate (empty or noisy pool)
                skipped += 1
                return
            heapq.heappush(heap, (-float(err.max()), gid, groups[gid]["version"]))

    for g in range(nb):
        push(g)

    t = merges = piece_merges = 0
    while heap and t < cap:
        _, gid, ver = heapq.heappop(heap)
        if gid not in groups or groups[gid]["version"] != ver:
            continue
        grp = groups[gid]
        pb, eb = sums(gid)
        err = np.abs(pb * grp["pred"] - eb)
        j = int(np.argmax(err))
        if err[j] <= thresh:
            continue
        z = grp["pred"].copy()
        z[j] = min(eb[j] / pb, 1.0)
        new_pred = project_simplex(z)
        del keymap[_key_bytes(grp["pred"], lam)]
        kb = _key_bytes(new_pred, lam)
        other = keymap.get(kb)
        if other is None:
            grp["pred"] = new_pred
        else:
            og = groups.pop(other)
            pb_other, _ = sums_of(og, pieces)
            grp["pred"] = og["pred"] if pb <= pb_other else new_pred
            grp["bins"] = grp["bins"] + og["bins"]
            merges += 1
            # merge the pieces of M inside the new group: binary carry over sizes
            mine = dict(grp["pieces"])
            carry = dict(og["pieces"])
            for e in sorted(carry):
                pid = carry[e]
                while e in mine:
                    a = mine.pop(e)
                    bins = pieces[a]["bins"] + pieces[pid]["bins"]
                    del pieces[a], pieces[pid]
                    e += 1
                    if e >= len(est.mass_pool):  # cannot happen while |group| <= |B|
                        raise RuntimeError("piece size exceeds |B|")
                    pm, em = est.estimate(heavy[bins], e)
                    pid = next_piece
                    next_piece += 1
                    pieces[pid] = {"size_exp": e, "bins": bins, "P": pm, "E": em}
                    piece_merges += 1
                mine[e] = pid
            grp["pieces"] = mine
        keymap[kb] = gid
        grp["version"] += 1
        t += 1
        push(gid)

    # compact output
    gids = sorted(groups)
    gindex = {g: i for i, g in enumerate(gids)}
    group_of = np.empty(nb, dtype=np.int64)
    out_groups = []
    for g in gids:
        grp = groups[g]
        for b in grp["bins"]:
            group_of[b] = gindex[g]
        pb, eb = sums(g)
        out_groups.append({"bins": sorted(grp["bins"]), "pred": grp["pred"].tolist(), "P": pb,
                           "E": eb.tolist(),
                           "error": np.abs(pb * grp["pred"] - eb).tolist(),
                           "pieces": [{"size_exp": pieces[i]["size_exp"], "bins": sorted(pieces[i]["bins"]),
                                       "P": pieces[i]["P"], "E": pieces[i]["E"].tolist()}
                                      for e, i in sorted(grp["pieces"].items())]})
    preds = np.array([groups[g]["pred"] for g in gids]) if gids else np.zeros((0, k))
    hmap = LevelSetMap(lam=lam, classes=k, keys=heavy_keys, group_of=group_of, preds=preds,
                       passthrough=passthrough)
    max_err = max((max(g["error"]) for g in out_groups), default=0.0)
    pending = any(gid in groups and groups[gid]["version"] == ver for _, gid, ver in heap)
    budget = theorem7_budget(eps, p, delta, k, nb, lam)
    roles_needed = 1 + 2 * n_sizes
    diagnostics = {
        "eps": eps, "p": p if math.isfinite(p) else "inf", "delta": delta, "beta": beta, "lam": lam,
        "threshold": thresh, "classes": k, "bins_observed": stats.num_bins, "heavy_bins": nb,
        "heavy_mass_phase1": float(mu[heavy].sum()) if nb else 0.0, "groups": len(gids),
        "iterations": t, "iteration_cap": cap, "merges": merges, "piece_merges": piece_merges,
        "stopped": "iteration cap" if pending else "converged", "max_error_estimate": float(max_err),
        "skipped_groups": skipped, "passthrough": passthrough, "noise": noise,
        "noise_scales": ({"phase1": None, "mass": [est.scale(q) for q in est.mass_pool],
                          "labels": [est.scale(q) for q in est.label_pool]} if noise else None),
        "seed": seed, "pools": stats.pools, "pools_needed": roles_needed,
        "pools_shared": stats.pools < roles_needed, "pool_sizes": sizes.tolist(),
        "pool_roles": {"phase1": 0, "mass": est.mass_pool, "labels": est.label_pool},
        "queries_per_size": est.queries, "samples_used": stats.count, "overflow_events": stats.overflow_count,
        "budget": budget, "budget_ratio": budget["total"] / max(stats.count, 1),
        "squared_error_bound": squared_error_bound(beta, lam),
    }
    return LPFit(map=hmap, diagnostics=diagnostics, heavy_keys=heavy_keys, groups=out_groups)


def sums_of(group: dict[str, Any], pieces: dict[int, dict[str, Any]]) -> tuple[float, np.ndarray]:
    """``(Pbar, Ebar)`` of a group: sums of the estimates of the pieces of M inside it."""
    ps = list(group["pieces"].values())
    return float(sum(pieces[i]["P"] for i in ps)), np.sum([pieces[i]["E"] for i in ps], axis=0)


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


# -- the tester -----------------------------------------------------------------------------------------
def _cell_table(stats: LevelSetStats) -> tuple[np.ndarray, np.ndarray, int, int]:
    return stats.sum_f - stats.counts, stats.sum_sq, stats.count, stats.overflow_count


def _bounds(d: np.ndarray, q: np.ndarray, n: int, level: float, p: float,
            overflow: int) -> tuple[float, float]:
    """Simultaneous (Bonferroni over observed cells) empirical-Bernstein bounds on Err_p."""
    m = max(d.size, 1)
    lg = math.log(4.0 * m / level)
    var = np.maximum(q - d * d / n, 0.0) / max(n - 1, 1)  # sample variance of X = (f_j - y_j) 1[v]
    w = np.sqrt(2.0 * var * lg / n) + 14.0 * lg / (3.0 * max(n - 1, 1))
    est = np.abs(d) / n
    lower = _norm_p(np.maximum(est - w, 0.0).ravel(), p)
    up_cells = (est + w).ravel()
    of = overflow / n
    if math.isinf(p):
        upper = max(_norm_p(up_cells, p), of)
    else:
        upper = (_norm_p(up_cells, p) ** p + 2.0 * of**p) ** (1.0 / p)
    return lower, upper


def lp_test(stats: LevelSetStats, eps: float = 0.1, p: float = math.inf,
            alpha: float = 0.05) -> dict[str, Any]:
    """Test ``H0: Err_p(f) <= eps`` against ``Err_p(f) > eps`` at level ``alpha``.

    Per cell (v, j) the mean ``mu = E[(f_j - y_j) 1[v]]`` gets an empirical-Bernstein interval
    (Maurer & Pontil 2009, Thm 4, for a variable in [-1, 1]: half-width ``sqrt(2 V ln(4m/a)/N) +
    14 ln(4m/a) / (3 (N - 1))``) at level ``a/m`` (Bonferroni over the m observed cells).  Then
    ``lower = ||max(|D|/N - w, 0)||_p`` and ``upper = ||(|D|/N + w)||_p`` (plus the overflow mass)
    hold simultaneously with probability ``1 - a``.  The p-value is the smallest ``a`` with
    ``lower(a) > eps``.  Decision: ``miscalibrated`` if p < alpha, ``calibrated`` if
    ``upper(alpha) <= eps``, else ``insufficient data``.

    Returns
    -------
    dict
        ``statistic`` (plug-in Err_p), ``p_value``, ``decision``, ``method``, ``lower``, ``upper``,
        ``eps``, ``p``, ``lam``, ``max_cell``, ``err2_debiased``, ``n``, ``bins``.

    Examples
    --------
    >>> s = LevelSetStats(2, 10, pools=1)
    >>> s.update(np.tile([[0.9, 0.1]], (4000, 1)), np.repeat([0, 1], 2000))
    >>> lp_test(s, eps=0.1)["decision"]
    'miscalibrated'
    """
    p = _check_p(p)
    if not 0.0 < eps < 1.0:
        raise ValueError(f"eps must lie in (0, 1), got {eps}")
    d, q, n, overflow = _cell_table(stats)
    base: dict[str, Any] = {"method": "lp", "eps": eps, "p": p if math.isfinite(p) else "inf",
                            "lam": stats.lam, "n": int(n)}
    if n < 2:
        return {**base, "statistic": None, "p_value": None, "decision": "insufficient data"}
    summary = lp_error(stats, p)
    lower, upper = _bounds(d, q, n, alpha, p, overflow)
    lo_a, hi_a = -30.0, 0.0  # bisection on log10(a)
    if _bounds(d, q, n, 1.0, p, overflow)[0] <= eps:
        pval = 1.0
    elif _bounds(d, q, n, 1e-30, p, overflow)[0] > eps:
        pval = 1e-30
    else:
        for _ in range(50):
            mid = 0.5 * (lo_a + hi_a)
            if _bounds(d, q, n, 10.0**mid, p, overflow)[0] > eps:
                hi_a = mid
            else:
                lo_a = mid
        pval = 10.0**hi_a
    if pval < alpha:
        decision = "miscalibrated"
    elif upper <= eps:
        decision = "calibrated"
    else:
        decision = "insufficient data"
    return {**base, "statistic": summary["err_p"], "p_value": pval, "decision": decision, "lower": lower,
            "upper": upper, "alpha": alpha, "err_inf": summary["err_inf"], "err_2": summary["err_2"],
            "err2_debiased": summary.get("err2_debiased"), "max_cell": summary.get("max_cell"),
            "bins": summary["bins"], "overflow_mass": summary["overflow_mass"]}


@register_tester("lp")
def lp_tester(data: CalibrationData, *, alpha: float, mc: int, rng: np.random.Generator, eps: float = 0.1,
              p: float = math.inf, lam: int | None = None, **params: Any) -> dict[str, Any]:
    """Tester ``lp``: Err_p vs ``eps`` from ``data.levelset`` (a window) or raw multiclass arrays.

    ``mc`` and ``rng`` are unused (the bounds are analytic).  The resolution is ``lam`` (default
    Algorithm 2's ``ceil(1/beta(eps, p))``); level-set statistics are coarsened to it when their
    lambda is a multiple of it, and used at their own lambda otherwise (the result's ``lam`` says
    which).
    """
    if params:
        raise ValueError(f"unknown parameters for tester 'lp': {sorted(params)}")
    p = float(p)
    want = int(lam) if lam else lambda_of(eps, p)
    if data.levelset is not None:
        stats = data.levelset
        if want != stats.lam:
            if lam is not None and stats.lam % want:
                raise ValueError(f"tester 'lp': level-set statistics have lambda={stats.lam}, which is not a "
                                 f"multiple of lam={want}")
            if stats.lam % want == 0:
                stats = stats.coarsen(want)
        source = "levelset"
    elif data.probs is not None and data.labels is not None:
        probs = np.asarray(data.probs, dtype=np.float64)
        stats = LevelSetStats(probs.shape[1], want, pools=1)
        stats.update(probs, data.labels)
        source = "raw" if data.raw_is_complete else "reservoir"
    else:
        return {"method": "lp", "statistic": None, "p_value": None, "decision": "insufficient data",
                "reason": "needs multiclass probabilities and labels or level-set statistics"}
    out = lp_test(stats, eps=eps, p=p, alpha=alpha)
    out["source"] = source
    return out

