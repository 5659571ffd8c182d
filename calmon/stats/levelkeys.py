"""Level-set geometry of the simplex: the rounding R, integer bin keys and the canonical points rho.

A prediction ``u`` falls in the level set ``v = R(u)`` with ``R(u)_i = floor(lambda * u_i) / lambda``;
a bin is named by its integer key ``c = lambda * v``. These pure functions are shared by the streaming
statistics (:mod:`calmon.stats.levelset`) and the l_p algorithms.

References
----------
Bairaktari, Nguyen. Multiclass calibration under the probability-weighted l_p error: Section 2.
"""

from __future__ import annotations

import math

import numpy as np

__all__ = ["ROUND_TOL", "level_keys", "unique_keys", "rho"]

#: One rounding tolerance for every use of R (``floor(lambda * u + ROUND_TOL)``): 0.3 * 10 is
#: 2.9999999999999996 in binary floating point and must land in bin 3.  It must stay below 1 / K
#: (see :func:`rho`), which holds for any K < 1e9.
ROUND_TOL = 1e-9


def level_keys(probs: np.ndarray, lam: int) -> np.ndarray:
    """Integer level-set keys ``floor(lam * u + ROUND_TOL)`` of probability rows (the rounding R).

    Parameters
    ----------
    probs
        Probabilities of shape ``(n, K)`` (or ``(K,)``); rows are used as given (normalise first).
    lam
        Grid resolution lambda.

    Returns
    -------
    numpy.ndarray
        int64 keys of the same shape, clipped to ``0..lam``; the bin is ``key / lam``.

    Examples
    --------
    >>> level_keys(np.array([[0.3, 0.7, 0.0]]), 10).tolist()
    [[3, 7, 0]]
    """
    k = np.floor(np.asarray(probs, dtype=np.float64) * lam + ROUND_TOL).astype(np.int64)
    np.clip(k, 0, lam, out=k)
    return k


def unique_keys(keys: np.ndarray, lam: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Distinct rows of integer level-set keys: ``(unique rows, index of first occurrence, inverse)``.

    Rows are encoded as one int64 in base ``lam + 1`` when ``K log2(lam + 1) < 62`` (fast 1-d
    ``numpy.unique``), else compared as raw bytes.

    Examples
    --------
    >>> u, first, inv = unique_keys(np.array([[1, 0], [0, 1], [1, 0]]), 1)
    >>> u.tolist(), inv.tolist()
    ([[1, 0], [0, 1]], [0, 1, 0])
    """
    keys = np.asarray(keys, dtype=np.int64)
    k = keys.shape[1]
    if k * math.log2(lam + 1) < 62:
        code = keys @ ((lam + 1) ** np.arange(k, dtype=np.int64))
        _, first, inv = np.unique(code, return_index=True, return_inverse=True)
    else:
        view = np.ascontiguousarray(keys.astype("<i4")).view(np.dtype((np.void, 4 * k))).ravel()
        _, first, inv = np.unique(view, return_index=True, return_inverse=True)
    return keys[first], first, inv.ravel()


def rho(keys: np.ndarray, lam: int) -> np.ndarray:
    """The canonical simplex point of a level set: ``rho(v)_i = v_i + (1 - sum v) / K``.

    Parameters
    ----------
    keys
        Integer keys ``lam * v`` of shape ``(n, K)`` or ``(K,)``.
    lam
        Grid resolution.

    Returns
    -------
    numpy.ndarray
        float64 points of the simplex with ``R(rho(v)) = v`` (exactly, under :data:`ROUND_TOL`).

    Examples
    --------
    >>> rho(np.array([3, 6, 0]), 10).round(4).tolist()
    [0.3333, 0.6333, 0.0333]
    """
    c = np.asarray(keys, dtype=np.float64)
    k = c.shape[-1]
    slack = (lam - c.sum(axis=-1, keepdims=True)) / k
    return (c + slack) / lam
