"""Sparse cell sums: sorted unique cell indices with one int64 column of field sums per cell.

The storage of a :class:`~calmon.stats.grid.ScoreGrid` that holds few events: ``cells`` (sorted,
unique, int64 flat cell indices) and ``values`` (int64, shape ``(fields, len(cells))``).  Every
operation is exact integer arithmetic, so a sparse grid and a dense grid of the same events hold
the same numbers, and converting between them loses nothing.

Examples
--------
>>> import numpy as np
>>> c, v = aggregate(np.array([5, 1, 5]), np.array([[1, 1, 1], [10, 20, 30]]))
>>> c.tolist(), v.tolist()
([1, 5], [[1, 2], [20, 40]])
>>> c2, v2 = combine(c, v, np.array([2, 5]), np.array([[1, 1], [7, 7]]))
>>> c2.tolist(), v2.tolist()
([1, 2, 5], [[1, 1, 3], [20, 7, 47]])
>>> to_dense(c2, v2, 6)[1].tolist()
[0, 20, 7, 0, 0, 47]
"""

from __future__ import annotations

import numpy as np

__all__ = ["aggregate", "combine", "to_dense", "from_dense", "prune"]


def aggregate(cells: np.ndarray, values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Sum ``values[:, j]`` over equal ``cells[j]``: sorted unique cells and their int64 sums."""
    if cells.size == 0:
        return cells.astype(np.int64), np.zeros((values.shape[0], 0), dtype=np.int64)
    if cells.size == 1:
        return cells.astype(np.int64), values.astype(np.int64)
    order = np.argsort(cells, kind="stable")
    c = cells[order]
    start = np.flatnonzero(np.concatenate(([True], c[1:] != c[:-1])))
    v = values[:, order]
    if start.size == c.size:
        return c, v.astype(np.int64, copy=False)
    return c[start], np.add.reduceat(v, start, axis=1).astype(np.int64, copy=False)


def combine(c1: np.ndarray, v1: np.ndarray, c2: np.ndarray, v2: np.ndarray, sign: int = 1
            ) -> tuple[np.ndarray, np.ndarray]:
    """``(c1, v1) + sign * (c2, v2)`` as sorted unique cells (both inputs sorted and unique)."""
    if c1.size == 0:
        return c2.copy(), (v2 if sign > 0 else -v2).copy()
    if c2.size == 0:
        return c1, v1
    if c2.size <= c1.size:
        pos = np.searchsorted(c1, c2)
        if int(pos[-1]) < c1.size and np.array_equal(c1[pos], c2):
            out = v1.copy()  # the common case of a bucket receiving cells it already has
            out[:, pos] += v2 if sign > 0 else -v2
            return c1, out
    return aggregate(np.concatenate([c1, c2]), np.concatenate([v1, v2 if sign > 0 else -v2], axis=1))


def to_dense(cells: np.ndarray, values: np.ndarray, size: int) -> np.ndarray:
    """The dense ``(fields, size)`` int64 array of sparse cell sums."""
    out = np.zeros((values.shape[0], size), dtype=np.int64)
    out[:, cells] = values
    return out


def from_dense(dense: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Sparse cell sums of a dense ``(fields, size)`` array (cells where any field is nonzero)."""
    cells = np.flatnonzero(dense.any(axis=0))
    return cells, dense[:, cells].copy()


def prune(cells: np.ndarray, values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Drop cells whose every field is zero (after a subtraction)."""
    keep = values.any(axis=0)
    if keep.all():
        return cells, values
    return cells[keep], values[:, keep]
