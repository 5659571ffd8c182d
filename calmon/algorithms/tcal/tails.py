"""Tail bounds and approximations of the debiased l2-ECE under calibration, and critical-value helpers.

The Cantelli bound is exact (valid, conservative); the three-moment chi-square approximation is not
and is used only to accept clear cases or to put levels on one scale for the min-p combination.
"""

from __future__ import annotations

import math

import numpy as np
from scipy import special

__all__ = ["cantelli_pvalue", "three_moment_pvalue", "approx_critical", "q_params", "q_transform", "kth_largest",
           "finite_or_none"]


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
