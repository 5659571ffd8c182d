"""Tail bounds and approximations of the debiased l2-ECE under calibration, and critical-value helpers.

The Cantelli bound is exact (valid, conservative); the three-moment chi-square approximation is not
and is used only to accept clear cases or to put levels on one scale for the min-p combination.
"""

from __future__ import annotations

import math

import numpy as np
from scipy import special

__all__ = ["cantelli_pvalue", "three_moment_pvalue", "approx_critical", "cantelli_pvalues", "three_moment_pvalues",
           "approx_criticals", "chi_params", "q_params", "q_transform", "kth_largest", "finite_or_none"]


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


def approx_critical(variance: float, third: float, level: float) -> float | None:
    if variance <= 0:
        return None
    if third <= 0:
        return float(math.sqrt(variance) * special.ndtri(1.0 - level))
    a = third / (4.0 * variance)
    nu = 8.0 * variance**3 / third**2
    return float(a * (special.chdtri(nu, level) - nu))


# ----------------------------------------------------------------------------------------------------------
# the same, every level at once (bit for bit the scalar functions above)
# ----------------------------------------------------------------------------------------------------------
def chi_params(variance: np.ndarray, third: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``a = k3 / (4 k2)`` and ``nu = 8 k2**3 / k3**2``; the powers are libm's ``pow`` (as on the scalars of
    the per-level functions: numpy's array ``**`` may round them differently)."""
    a = third / (4.0 * variance)
    cube = np.array([v**3 for v in variance.tolist()])
    square = np.array([k**2 for k in third.tolist()])
    return a, 8.0 * cube / square


def cantelli_pvalues(statistic: np.ndarray, variance: np.ndarray) -> np.ndarray:
    """:func:`cantelli_pvalue` of every level.

    Examples
    --------
    >>> cantelli_pvalues(np.array([3.0, -1.0, 1.0]), np.array([1.0, 1.0, 0.0])).tolist()
    [0.1, 1.0, 0.0]
    """
    with np.errstate(invalid="ignore", divide="ignore"):
        bound = variance / (variance + statistic * statistic)
    return np.where(statistic <= 0, 1.0, np.where(variance <= 0, 0.0, bound))


def three_moment_pvalues(statistic: np.ndarray, variance: np.ndarray, third: np.ndarray,
                         chi: tuple[np.ndarray, np.ndarray] | None = None) -> np.ndarray:
    """:func:`three_moment_pvalue` of every level (levels with ``variance <= 0``: 1 or 0); ``chi``: the
    :func:`chi_params` of every level when all variances and third cumulants are positive (computed here if not
    given).

    Examples
    --------
    >>> three_moment_pvalues(np.array([2.0, 1.0]), np.array([2.0, 0.0]), np.array([8.0, 1.0])).round(4).tolist()
    [0.0833, 0.0]
    """
    if chi is not None or ((variance > 0).all() and (third > 0).all()):  # usual: every level's chi-square tail
        a, nu = chi if chi is not None else chi_params(variance, third)
        x = nu + statistic / a
        return special.chdtrc(nu, np.where(0.0 > x, 0.0, x))  # Python's max(x, 0.0), NaN and -0.0 kept
    out = np.where(statistic <= 0, 1.0, 0.0)
    live = ~(variance <= 0)  # NaN as in the scalar function: not "<= 0"
    norm = live & (third <= 0)
    chisq = live & ~(third <= 0)
    if norm.any():
        out[norm] = special.ndtr(-statistic[norm] / np.sqrt(variance[norm]))
    if chisq.any():
        a, nu = chi_params(variance[chisq], third[chisq])
        x = nu + statistic[chisq] / a
        out[chisq] = special.chdtrc(nu, np.where(0.0 > x, 0.0, x))
    return out


def approx_criticals(variance: np.ndarray, third: np.ndarray, level: float,
                     chi: tuple[np.ndarray, np.ndarray] | None = None) -> list[float | None]:
    """:func:`approx_critical` of every level (``chi`` as in :func:`three_moment_pvalues`).

    Examples
    --------
    >>> [round(c, 4) for c in approx_criticals(np.array([1.0]), np.array([0.0]), 0.05)]
    [1.6449]
    """
    if chi is not None or ((variance > 0).all() and (third > 0).all()):
        a, nu = chi if chi is not None else chi_params(variance, third)
        return list((a * (special.chdtri(nu, level) - nu)).tolist())
    out = np.zeros(variance.size)
    live = ~(variance <= 0)
    norm = live & (third <= 0)
    chisq = live & ~(third <= 0)
    if norm.any():
        out[norm] = np.sqrt(variance[norm]) * special.ndtri(1.0 - level)
    if chisq.any():
        a, nu = chi_params(variance[chisq], third[chisq])
        out[chisq] = a * (special.chdtri(nu, level) - nu)
    return [c if ok else None for c, ok in zip(out.tolist(), live.tolist())]


def kth_largest(x: np.ndarray, k: int) -> float | None:
    if k < 1 or k > x.size:
        return None
    return float(np.partition(x, x.size - k)[x.size - k])


def finite_or_none(x: float | None) -> float | None:
    return None if x is None or not math.isfinite(x) else float(x)


def q_params(var: np.ndarray, k3: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Per-level parameters of the three-moment tail used to put levels on one scale (min-p)."""
    chi = (var > 0) & (k3 > 0)
    a = np.where(chi, k3 / np.where(var > 0, 4.0 * var, 1.0), 1.0)
    nu = np.where(chi, 8.0 * var**3 / np.where(chi, k3, 1.0) ** 2, 1.0)
    return chi, a, nu, np.sqrt(var)


def q_transform(T: np.ndarray, par: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]) -> np.ndarray:
    """Approximate upper-tail probability of each level's statistic, shape of ``T`` (rows: draws)."""
    chi, a, nu, sd = par
    with np.errstate(invalid="ignore", divide="ignore"):
        q_chi = special.chdtrc(nu, np.maximum(nu + T / a, 0.0))
        q_norm = special.ndtr(-T / np.where(sd > 0, sd, 1.0))
    q = np.where(chi, q_chi, q_norm)
    # a level without variance, or a tail the special functions cannot evaluate, is never significant
    return np.where((sd > 0) & ~np.isnan(q), q, 1.0)
