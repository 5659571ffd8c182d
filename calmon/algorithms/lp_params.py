"""Parameters of Algorithm 2 (Bairaktari & Nguyen): beta, lambda, pools, caps and the sample budget.

Every quantity here is a closed-form function of ``eps``, ``p`` (and ``delta``, ``K``, ``|B|``);
the estimators live in :mod:`calmon.algorithms.lp_errors`, the algorithm in
:mod:`calmon.algorithms.lp_fit`.

References
----------
Bairaktari, Nguyen. Multiclass calibration under the probability-weighted l_p error (seeds 000 and
001 in ../shared/seeds): Algorithm 2, Theorem 7, Lemmas 8-9, 11-14.
"""

from __future__ import annotations

import math
from typing import TypedDict

import numpy as np

from calmon.stats.levelset import level_keys

__all__ = ["check_p", "beta_of", "lambda_of", "pools_needed", "R", "iteration_cap", "squared_error_bound",
           "theorem7_budget", "PoolBudget", "Theorem7Budget"]


class PoolBudget(TypedDict):
    """Samples one piece size ``2**i`` asks for: a mass pool and a label pool."""

    size: int
    mass: float
    labels: float


class Theorem7Budget(TypedDict):
    """The sample budget of Theorem 7's proof (see :func:`theorem7_budget`)."""

    phase1: float
    per_pool: list[PoolBudget]
    total: float
    log10_total: float
    alpha: float
    beta: float
    lam: int


def check_p(p: float) -> float:
    """``p`` as a float, ``ValueError`` unless ``p > 1`` (``math.inf`` allowed).

    Examples
    --------
    >>> check_p(2), check_p(math.inf)
    (2.0, inf)
    """
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
    p = check_p(p)
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
    """The level set ``R(u)_i = floor(lam u_i) / lam`` (one tolerance: ``calmon.stats.levelset.ROUND_TOL``).

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
                    lam: int | None = None) -> Theorem7Budget:
    """Samples the proof of Theorem 7 asks for, with its explicit constants.

    Phase 1 (Lemma 8 / 16): ``ln(4/(a d))/(2 a**2) + (4/(3a)) ln(2|V|/d)`` with ``a = beta/12``,
    ``d = delta/3`` and ``|V| <= C(lambda + K, K)`` (Lemma 3).  Each piece size ``2**i`` and each
    estimate type (Lemma 9 / 17): ``32 ln(4 n k' / d') / alpha**2`` with ``alpha = beta / (36 L)``,
    ``L = ceil(log2|B|) + 1``, ``d' = delta / (3L)``, ``n = |B| / 2**i`` disjoint queries and
    ``k' = 1`` (mass) or ``K`` (labels).

    Returns
    -------
    Theorem7Budget
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
    per_pool: list[PoolBudget] = []
    for i in range(int(math.floor(math.log2(nb))) + 1):
        nq = max(1, nb >> i)
        per_pool.append({"size": 2**i,
                         "mass": 32.0 * math.log(4.0 * nq / dprime) / alpha**2,
                         "labels": 32.0 * math.log(4.0 * nq * classes / dprime) / alpha**2})
    total = phase1 + sum(q["mass"] + q["labels"] for q in per_pool)
    return {"phase1": phase1, "per_pool": per_pool, "total": total, "log10_total": math.log10(total),
            "alpha": alpha, "beta": beta, "lam": lam}
