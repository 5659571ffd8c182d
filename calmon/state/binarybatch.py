"""A binary model's events prepared once for folding into many buckets (:class:`BinaryBatch`).

Every grid's cell and fixed-point sums of every event are computed once per batch on one combined cell axis
(:func:`axis`); a bucket takes a range of them (:meth:`BinaryBatch.take`) and aggregates what it was given when it
is next read (:func:`expand_all`, :func:`bincount_one`), with the same integers as
:meth:`calmon.state.buckets.BucketStats.update`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

from calmon.stats.grid import cell_index, event_sums

if TYPE_CHECKING:  # buckets imports this module
    from calmon.state.buckets import BucketStats
__all__ = ["PRED_BINS", "BinaryBatch", "axis", "bincount_one", "expand_all"]

#: Cells of the prediction-side grid (label-free estimates and score drift need no finer resolution).
PRED_BINS = 256


class BinaryBatch:
    """A binary model's labeled events (or predictions) prepared once for folding into many buckets.

    Every grid's cell and fixed-point sums of every event are computed once per batch, on one
    combined cell axis (fine grid, then the ECE grid, the reliability grid and the prediction-side
    grid, see :func:`axis`); folding the events ``idx`` into a bucket (:meth:`BucketStats.fold`)
    copies their rows, and the bucket aggregates what it was given in one pass when it is next read
    -- no per-event Python, and the same integers as :meth:`BucketStats.update`
    (:func:`~calmon.stats.grid.event_sums`).

    Parameters
    ----------
    z, labels
        Scores and labels (``labels=None``: predictions only, for the prediction-side grid).
    sizes
        Cells of the fine, ECE and reliability grids.
    predictions
        Also count labeled events on the prediction-side grid.
    """

    __slots__ = ("keys", "sums", "rows", "pred")

    def __init__(self, z: np.ndarray, labels: np.ndarray | None, sizes: tuple[int, int, int],
                 predictions: bool) -> None:
        z = np.asarray(z, dtype=np.float64)
        offsets = axis(sizes)
        labeled = labels is not None
        #: whether the last row of ``keys`` is the prediction-side grid of labeled events (no outcome terms)
        self.pred = labeled and predictions
        grids = ([0, 1, 2] if labeled else []) + ([3] if not labeled or predictions else [])
        self.keys = np.empty((len(grids), z.size), dtype=np.int64)  # combined cells, one row per grid
        for row, g in enumerate(grids):
            self.keys[row] = cell_index(z, PRED_BINS if g == 3 else sizes[g])
            self.keys[row] += offsets[g]
        y = np.zeros(z.size) if labels is None else np.asarray(labels).astype(np.float64)
        self.sums = event_sums(z, y)  # (6, n): the same for every grid but the labeled prediction side
        self.rows: np.ndarray | None = np.column_stack([z, y]) if labeled else None

    def take(self, idx: np.ndarray | slice) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
        """Keys, sums and reservoir rows of the events ``idx`` (increasing indices, or a ``slice`` with step 1;
        the arrays themselves for the whole batch, copied slices for a contiguous range -- cheaper than a
        gather)."""
        keys, sums, rows, view = self._take(idx)
        if view:
            return keys.copy(), sums.copy(), None if rows is None else rows.copy()
        return keys, sums, rows

    def _take(self, idx: np.ndarray | slice) -> tuple[np.ndarray, np.ndarray, np.ndarray | None, bool]:
        """:meth:`take`, with a contiguous range as views of the batch's arrays (the last item: whether they
        are), for a fold that aggregates them at once and keeps nothing."""
        n = self.sums.shape[1]
        if isinstance(idx, slice):  # folds from fold_binary: a range of a batch sorted by bucket
            a, b, _ = idx.indices(n)
            size = max(b - a, 0)
        else:
            size = idx.size
            a, b = (int(idx[0]), int(idx[-1]) + 1) if size else (0, 0)
        if size == n:  # idx is sorted: all events, in order
            return self.keys, self.sums, self.rows, False
        if b - a == size:  # increasing and contiguous
            return self.keys[:, a:b], self.sums[:, a:b], None if self.rows is None else self.rows[a:b], True
        if isinstance(idx, slice):
            raise ValueError(f"take: a slice of step 1 expected, got {idx!r}")
        return self.keys[:, idx], self.sums[:, idx], None if self.rows is None else self.rows[idx], False

    def subset(self, idx: np.ndarray) -> BinaryBatch:
        """The events ``idx`` (any order) as a batch of their own."""
        out = BinaryBatch.__new__(BinaryBatch)
        # take(): what fancy indexing gives, in about two thirds of its time on these 2-D arrays
        out.keys, out.sums, out.pred = self.keys.take(idx, axis=1), self.sums.take(idx, axis=1), self.pred
        out.rows = None if self.rows is None else self.rows.take(idx, axis=0)
        return out

    def fold_into(self, bucket: BucketStats, idx: np.ndarray | slice) -> None:
        """``bucket.fold(self, idx)``: the update a :class:`~calmon.state.windows.TieredRing` calls per bucket."""
        bucket.fold(self, idx)

    @staticmethod
    def expand(keys: np.ndarray, sums: np.ndarray, pred: bool) -> tuple[np.ndarray, np.ndarray]:
        """Combined cells and their per-event sums, every grid of ``keys`` in turn (``pred``: see :attr:`pred`)."""
        g = keys.shape[0]
        vals = np.tile(sums, g)
        if pred:
            vals[[2, 4], (g - 1) * sums.shape[1]:] = 0
        return keys.ravel(), vals


def expand_all(pending: Sequence[tuple[bool, np.ndarray, np.ndarray, np.ndarray | None]]
                ) -> tuple[np.ndarray, np.ndarray]:
    """:meth:`BinaryBatch.expand` of every pending fold, concatenated: the same arrays, with one
    concatenation per array rather than a tile per fold (a bucket's folds are often a handful of events)."""
    tiles: list[np.ndarray] = []
    for pred, keys, sums, _ in pending:
        g = keys.shape[0]
        if pred:  # the labeled prediction-side row (the last) has no outcome terms
            tiles.extend([sums] * (g - 1))
            tiles.append(sums * _NO_OUTCOME)
        else:
            tiles.extend([sums] * g)
    if len(pending) == 1:
        return pending[0][1].ravel(), np.concatenate(tiles, axis=1)
    return np.concatenate([keys.ravel() for _, keys, _, _ in pending]), np.concatenate(tiles, axis=1)


def bincount_one(pred: bool, keys: np.ndarray, sums: np.ndarray, length: int) -> tuple[np.ndarray, np.ndarray]:
    """The cells and summed int64 fields of one fold's events (the :meth:`BinaryBatch.expand` of ``keys`` and
    ``sums``) by bincount over the combined axis of ``length`` cells: the count (field 0, one per event)
    unweighted, each other field weighted by its float64 values written once per grid into one buffer (no
    int64 tile converted field by field); float sums of integers below ``2**53`` are exact."""
    g, n = keys.shape
    cells = keys.ravel()
    count = np.bincount(cells, minlength=length)
    occupied = np.flatnonzero(count)
    out = np.empty((sums.shape[0], occupied.size), dtype=np.int64)
    out[0] = count[occupied]
    w = np.empty((g, n))
    for i in range(1, sums.shape[0]):
        w[:] = sums[i]
        if pred and i in (2, 4):  # the labeled prediction-side row (the last) has no outcome terms
            w[g - 1] = 0
        out[i] = np.bincount(cells, weights=w.ravel(), minlength=length)[occupied]
    return occupied, out


#: Multiplies the sums of an event to those of its prediction alone (rows 2 and 4 hold outcome terms).
_NO_OUTCOME = np.array([[1], [1], [0], [1], [0], [1]], dtype=np.int64)


def axis(sizes: tuple[int, int, int]) -> list[int]:
    """First combined cell of the fine, ECE, reliability and prediction-side grids, and the end."""
    f, e, r = sizes
    return [0, f, f + e, f + e + r, f + e + r + PRED_BINS]
