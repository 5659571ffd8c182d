"""Euclidean projection onto the probability simplex (vectorised, sort based).

``pi(z) = argmin_{u in simplex} ||u - z||_2`` is ``u_i = max(z_i - theta, 0)`` with the unique
``theta`` such that the result sums to one.  Sorting ``z`` in decreasing order, ``theta =
(sum_{i <= r} z_(i) - 1) / r`` for the largest ``r`` with ``z_(r) - (sum_{i <= r} z_(i) - 1) / r > 0``.

References
----------
Held, Wolfe, Crowder (1974); Duchi, Shalev-Shwartz, Singer, Chandra. Efficient projections onto
the l1-ball for learning in high dimensions. ICML 2008, Figure 1.  Used as ``pi`` in Algorithm 2 of
Bairaktari & Nguyen (seed 000, Section 2).
"""

from __future__ import annotations

import numpy as np


def project_simplex(z: np.ndarray) -> np.ndarray:
    """Project each row of ``z`` onto the probability simplex in Euclidean norm.

    Parameters
    ----------
    z
        Array of shape ``(K,)`` or ``(n, K)`` of finite values.

    Returns
    -------
    numpy.ndarray
        Same shape; each row is non-negative, sums to 1 and is the closest such point to the row of ``z``.

    Examples
    --------
    >>> project_simplex(np.array([0.5, 0.5, 0.5])).round(4).tolist()
    [0.3333, 0.3333, 0.3333]
    >>> project_simplex(np.array([[2.0, 0.0], [0.2, 0.3]])).round(4).tolist()
    [[1.0, 0.0], [0.45, 0.55]]
    """
    a = np.asarray(z, dtype=np.float64)
    if a.ndim not in (1, 2) or a.shape[-1] < 1:
        raise ValueError(f"project_simplex expects shape (K,) or (n, K), got {a.shape}")
    if not np.isfinite(a).all():
        raise ValueError("project_simplex needs finite inputs")
    x = np.atleast_2d(a)
    k = x.shape[1]
    u = -np.sort(-x, axis=1)
    css = np.cumsum(u, axis=1) - 1.0
    ind = np.arange(1, k + 1)
    cond = u - css / ind > 0
    r = k - np.argmax(cond[:, ::-1], axis=1)  # largest index with cond true (cond[:, 0] is always true)
    theta = css[np.arange(x.shape[0]), r - 1] / r
    out = np.maximum(x - theta[:, None], 0.0)
    return out[0] if a.ndim == 1 else out
