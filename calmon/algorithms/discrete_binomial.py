"""Exact binomial calibration test for discrete-valued predictors (T-Cal paper, Appendix B.4).

When a predictor takes few distinct values ``v_1, ..., v_t`` (histogram binning, scaling-binning,
isotonic regression with few steps), calibration given the values is the intersection of the
point hypotheses ``M_i ~ Bin(N_i, v_i)`` where ``N_i`` predictions equal ``v_i`` and ``M_i`` of them are
positive.  Each is tested with an exact two-sided binomial test and the family is Bonferroni-corrected.
The test is exact conditionally on the predictions, whatever their distribution.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from scipy import stats

from calmon.stats.grid import ScoreGrid

#: Relative tolerance on the within-cell variance of the scores for a grid cell to count as one value.
_GRID_VAR_TOL = 1e-8


def discrete_support(z: np.ndarray, y: np.ndarray, max_values: int = 50,
                     min_per_value: float = 10.0) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    """Distinct prediction values with their counts and positives, if the predictor looks discrete.

    Parameters
    ----------
    z, y
        Scores in [0, 1] and 0/1 outcomes, shape ``(n,)``.
    max_values
        Largest number of distinct values treated as a discrete predictor.
    min_per_value
        Also require ``n / t >= min_per_value`` (so a small continuous sample is not mistaken for
        a discrete one).

    Returns
    -------
    ``(values, counts, positives)`` or ``None`` when ``z`` takes too many distinct values.

    Examples
    --------
    >>> import numpy as np
    >>> v, c, p = discrete_support(np.repeat([0.2, 0.7], 20), np.r_[np.zeros(16), np.ones(4), np.ones(20)])
    >>> v.tolist(), c.tolist(), p.tolist()
    ([0.2, 0.7], [20, 20], [4, 20])
    """
    z = np.asarray(z, dtype=np.float64)
    y = np.asarray(y, dtype=np.float64)
    if z.size == 0:
        return None
    values, inverse = np.unique(z, return_inverse=True)
    t = values.size
    if t > max_values or z.size < min_per_value * t:
        return None
    counts = np.bincount(inverse, minlength=t)
    positives = np.rint(np.bincount(inverse, weights=y, minlength=t)).astype(np.int64)
    return values, counts.astype(np.int64), positives


def grid_discrete_support(grid: ScoreGrid, max_values: int = 50,
                          min_per_value: float = 10.0) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    """Like :func:`discrete_support` from a fine :class:`ScoreGrid`.

    A non-empty cell counts as a single value when the variance of its scores,
    ``sum_zz / N - (sum_z / N)**2``, is zero up to the grid's fixed-point resolution; the value is then
    the cell mean.  Two distinct values closer than one fine cell (1/4096 by default) and in the same
    cell are not separated: the test then uses their mean.

    Parameters
    ----------
    grid
        Single-channel grid.
    max_values, min_per_value
        As in :func:`discrete_support` (one value per non-empty cell).

    Returns
    -------
    ``(values, counts, positives)`` or ``None``.

    Examples
    --------
    >>> import numpy as np
    >>> g = ScoreGrid(bins=4096)
    >>> g.update(np.repeat([0.2, 0.7], 20), np.r_[np.zeros(16), np.ones(4), np.ones(20)])
    >>> v, c, p = grid_discrete_support(g)
    >>> np.round(v, 6).tolist(), c.tolist(), p.tolist()
    ([0.2, 0.7], [20, 20], [4, 20])
    """
    if grid.channels is not None:
        raise ValueError("grid_discrete_support needs a single-channel grid")
    n = grid.n
    ok = n > 0
    t = int(ok.sum())
    if t == 0 or t > max_values or n.sum() < min_per_value * t:
        return None
    N, sz, szz, sy = n[ok], grid.sum_z[ok], grid.sum_zz[ok], grid.sum_y[ok]
    zbar = sz / N
    var = szz / N - zbar * zbar
    if np.any(var > _GRID_VAR_TOL):
        return None
    return np.clip(zbar, 0.0, 1.0), np.rint(N).astype(np.int64), np.rint(sy).astype(np.int64)


def binomial_pvalues(values: np.ndarray, counts: np.ndarray, positives: np.ndarray) -> np.ndarray:
    """Exact two-sided binomial p-values of ``positives[i] ~ Bin(counts[i], values[i])``.

    Uses scipy's ``binomtest`` (two-sided p-value: total probability of outcomes no more likely than
    the observed one).

    Parameters
    ----------
    values, counts, positives
        Arrays of shape ``(t,)``.

    Returns
    -------
    Array of ``t`` p-values.

    Examples
    --------
    >>> binomial_pvalues(np.array([0.5]), np.array([10]), np.array([5])).round(3).tolist()
    [1.0]
    """
    values = np.asarray(values, dtype=np.float64)
    counts = np.asarray(counts, dtype=np.int64)
    positives = np.asarray(positives, dtype=np.int64)
    if not (values.shape == counts.shape == positives.shape):
        raise ValueError("values, counts and positives must have the same shape")
    if np.any((positives < 0) | (positives > counts)):
        raise ValueError("positives must lie in [0, counts]")
    out = np.ones(values.size)
    for i, (v, c, k) in enumerate(zip(values, counts, positives)):
        if c == 0:
            continue
        if v <= 0.0 or v >= 1.0:
            out[i] = 1.0 if k == (c if v >= 1.0 else 0) else 0.0
        else:
            out[i] = stats.binomtest(int(k), int(c), float(v)).pvalue
    return out


def binomial_test(values: np.ndarray, counts: np.ndarray, positives: np.ndarray, alpha: float = 0.05
                  ) -> dict[str, Any]:
    """Multiple exact binomial test of calibration with Bonferroni correction (Appendix B.4).

    Parameters
    ----------
    values, counts, positives
        Distinct prediction values ``v_i``, number of predictions ``N_i`` equal to ``v_i`` and number
        ``M_i`` of positive outcomes among them.
    alpha
        Level of the test.

    Returns
    -------
    dict with ``values``, ``counts``, ``positives``, ``p_values`` (per value), ``adjusted_p_value``
    (``min(1, t * min p_i)``), ``decision`` and ``method`` = ``"binomial"``.

    Examples
    --------
    >>> r = binomial_test(np.array([0.1, 0.9]), np.array([100, 100]), np.array([10, 60]))
    >>> r["decision"], r["adjusted_p_value"] < 1e-6
    ('miscalibrated', True)

    References
    ----------
    Lee, Huang, Hassani, Dobriban (2023), T-Cal, JMLR -- Appendix B.4 (multiple binomial testing).
    """
    if not 0.0 < alpha < 1.0:
        raise ValueError(f"alpha must lie in (0, 1), got {alpha}")
    p = binomial_pvalues(values, counts, positives)
    t = p.size
    adjusted = float(min(1.0, t * p.min())) if t else 1.0
    return {
        "method": "binomial",
        "values": [float(v) for v in values],
        "counts": [int(c) for c in counts],
        "positives": [int(k) for k in positives],
        "p_values": [float(x) for x in p],
        "adjusted_p_value": adjusted,
        "p_value": adjusted,
        "statistic": float(np.max(np.abs(np.asarray(positives) - np.asarray(counts) * np.asarray(values))
                                  / np.maximum(np.asarray(counts), 1))) if t else 0.0,
        "decision": "miscalibrated" if adjusted <= alpha else "calibrated",
    }
