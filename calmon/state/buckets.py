"""The windowed statistics of the models: buckets, the one computation of their cells, the per-model rings of
buckets, and the one way into them (:func:`fold`).

A bucket holds a :class:`~calmon.stats.model.ModelStats` (fine grid, exact 15-bin ECE grid,
class-wise grid, reservoir, level-set statistics) plus a coarse equal-width grid for the
exported reliability diagram (20 bins by default, so the ``bin`` labels ``"0.00"..."0.95"``
are exact bins, not re-binned fine cells) and the prediction-side grid.

One way into a ring
-------------------
Events of every kind -- labeled events, predictions, joined pairs, of binary and multiclass models alike --
reach the rings through :func:`fold`, which places the events of many models at once (issue #15: per-batch,
not per-model costs; :class:`~calmon.state.ingest.Ingestor` calls it a few times a batch whatever the number of
models, :meth:`ModelWindows.add` once for one model).  It prepares the events once as :class:`EventCells`
(every grid's cell of every event and its fixed-point sums, on one combined cell axis, :func:`axis`: the one
computation of a bucket's cells), places the events of every ring with one vectorised
:func:`~calmon.state.windows.bucket_cells`, and splits them by (ring, bucket) with one sort; what is left per
ring is rolling it to the watermark and one :meth:`BucketStats.fold` per bucket touched (a few array copies).
A bucket aggregates what it was given when it is next read.  :meth:`BucketStats.update` and
:meth:`~BucketStats.update_predictions` are the fold of the events they are given.

Memory is sized by content.  A bucket holds the fine grid (``bins`` cells), the 15-cell ECE grid,
the reliability grid (20 cells), the prediction-side grid (256 cells) and a reservoir of ``r`` rows.
Grids of >= 64 cells store only their occupied cells (56 bytes each) until a quarter of the cells
are occupied, then 48 bytes per cell; the small grids are dense (about 1.7 kB); reservoir rows are
allocated as they fill (16 bytes per row, binary).  So a bucket of ``m`` labeled events costs about
``1.7 kB + 56 (c_fine + c_pred) + 16 min(m, r)`` bytes with ``c <= m`` occupied cells, and at most
``6 * 8 * (bins + 15 + 20 + 256) + 16 r`` (67 kB at ``bins = 1024``, ``r = 256``) once its grids are
full.  Folded events wait as rows (at most :data:`PENDING_CELLS` cells) until the bucket is next read.  A new
bucket holds nothing else until its first read (:meth:`BucketStats.blank`: at thousands of models most minute
buckets get two or three events and are never read before they roll into a coarser tier, where
:meth:`BucketStats.absorb` hands their rows to the coarser bucket instead of materialising them).

Merges of buckets are applied at once (:meth:`BucketStats.merge`).  The cells of a delta bucket of the partitioned
agent (:class:`CellTable`, built for all the buckets of a range at once by :func:`cell_table`) wait like folds:
:meth:`BucketStats.merge_cells` keeps them as a :data:`CELLS` entry -- cells already aggregated, with explicit
counts, summed as integers with the other pending entries at the next read -- so an evaluator's bucket that gets a
delta from every input partition between two reads aggregates once.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Sequence
from itertools import repeat
from typing import Any, NamedTuple, Protocol

import numpy as np

from calmon.state.windows import TieredRing, bucket_cells
from calmon.stats import sparse
from calmon.stats.grid import GridPart, ScoreGrid, cell_index, event_sums
from calmon.stats.model import ModelPart, ModelStats, merge_rng, top_label
from calmon.stats.packed import Packer, Unpacker
from calmon.stats.reservoir import Reservoir

FORMAT = "calmon.bucket"
#: Version of the packed bucket document (:meth:`BucketStats.to_packed`); unversioned documents are version 1.
PACKED_VERSION = 2
#: How a packed bucket document encoded by :func:`calmon.state.checkpoint.store.encode` begins (key order and
#: separators fixed).
PACKED_PREFIX = b'{"format":"calmon.bucket","version":2,'

#: Cells of the prediction-side grid (label-free estimates and score drift need no finer resolution).
PRED_BINS = 256
#: Cells of the exact ECE grid (15 as in Guo et al. and the T-Cal tables; also the class-wise grid's per class).
ECE_BINS = 15
#: Pending combined cells after which a bucket aggregates its folded events (bounds their memory).
PENDING_CELLS = 1024
#: From this many pending cells a flush sums them with bincount over the combined axis instead of sorting.
BINCOUNT_CELLS = 512

#: A bucket's grids: cells of the fine grid, of the ECE grid (and of the class-wise grid per class), the
#: number of classes and the cells of the reliability grid (:meth:`BucketStats.layout`).
Layout = tuple[int, int, int, int]


def axis(layout: Layout) -> list[int]:
    """First combined cell of the fine, ECE, class-wise (none for a binary model), reliability and
    prediction-side grids of ``layout``, and the end."""
    fine, ece, classes, rel = layout
    classwise = ece * classes if classes > 2 else 0
    return [0, fine, fine + ece, fine + ece + classwise, fine + ece + classwise + rel,
            fine + ece + classwise + rel + PRED_BINS]


class Hold(Protocol):
    """A checkpoint's claim on a bucket's content (see :meth:`BucketStats.freeze`)."""

    def thaw(self, bucket: BucketStats) -> None:
        """Called once, by the thread about to change ``bucket``, before it does."""


class EventCells:
    """Events prepared once for folding into many buckets of one :data:`Layout`: the one computation of a
    bucket's cells.

    Every grid's cell of every event and its fixed-point sums (:func:`~calmon.stats.grid.event_sums`, the
    integers :meth:`ScoreGrid.update <calmon.stats.grid.ScoreGrid.update>` adds) are computed once, on one
    combined cell axis (:func:`axis`); folding the events ``idx`` into a bucket (:meth:`BucketStats.fold`) copies
    their columns, and the bucket aggregates what it was given in one pass when it is next read -- no per-event
    Python, whatever the number of buckets.

    Parameters
    ----------
    layout
        The buckets' grids (:meth:`BucketStats.layout`).
    labels
        Class labels of labeled events; ``None``: predictions, for the prediction-side grid only.
    score, probs
        Binary scores (P(y = 1)) or class probabilities ``(n, K)`` (a multiclass model's labeled events; its
        predictions count with their top-label confidence).
    predictions
        Also count labeled events on the prediction-side grid (without their outcome).

    Attributes
    ----------
    keys
        ``(g, n)`` combined cells, one row per grid an event lands in.
    sums
        ``(6, n)`` sums shared by every row of ``keys`` (a binary model's events, predictions), or
        ``(g, 6, n)`` one set per row (a multiclass model's labeled events: its class-wise rows have their own).
    rows
        Reservoir rows (score or probabilities, then the label) of labeled events; ``None`` for predictions.
    pred
        Whether the last row of ``keys`` is the prediction-side grid of labeled events, whose shared
        ``sums`` then count without outcome terms there.

    Examples
    --------
    >>> cells = EventCells((64, 15, 2, 20), np.array([1, 0]), score=np.array([0.5, 0.97]))
    >>> cells.keys.tolist(), cells.sums[0].tolist()  # fine, ECE and reliability cells; one event each
    ([[32, 62], [71, 78], [89, 98]], [1, 1])
    """

    __slots__ = ("keys", "sums", "rows", "pred")

    def __init__(self, layout: Layout, labels: np.ndarray | None, score: np.ndarray | None = None,
                 probs: np.ndarray | None = None, predictions: bool = False) -> None:
        offsets = axis(layout)
        fine, ece, classes, rel = layout
        self.pred = False
        self.rows: np.ndarray | None = None
        if labels is None:  # predictions: the prediction-side grid only, with no outcome
            z = np.asarray(score if probs is None else np.max(probs, axis=1), dtype=np.float64)
            self.keys = _keys([(z, PRED_BINS, offsets[4])], z.size)
            self.sums = event_sums(z, np.zeros(z.size))
        elif classes == 2:
            if score is None:
                raise ValueError("binary model: score is required")
            z = np.asarray(score, dtype=np.float64)
            y = np.asarray(labels).astype(np.float64)
            grids = [(z, fine, offsets[0]), (z, ece, offsets[1]), (z, rel, offsets[3])]
            self.keys = _keys(grids + ([(z, PRED_BINS, offsets[4])] if predictions else []), z.size)
            self.sums = event_sums(z, y)  # the same for every grid but the labeled prediction side
            self.rows = np.column_stack([z, y])
            self.pred = predictions
        else:
            self._multiclass(layout, labels, probs, predictions)

    def _multiclass(self, layout: Layout, labels: np.ndarray, probs: np.ndarray | None, predictions: bool) -> None:
        """A multiclass model's labeled events: the top-label confidence and correctness on the fine, ECE,
        reliability and prediction-side grids, each class's probability and outcome on the class-wise grid."""
        if probs is None:
            raise ValueError("multiclass model: probs is required")
        fine, ece, classes, rel = layout
        p = np.asarray(probs, dtype=np.float64)
        if p.ndim != 2 or p.shape[1] != classes:
            raise ValueError(f"expected probabilities of shape (n, {classes}), got {p.shape}")
        labels = np.asarray(labels, dtype=np.int64)
        offsets = axis(layout)
        conf, correct = top_label(p, labels)
        onehot = np.zeros_like(p)
        onehot[np.arange(labels.size), labels] = 1.0
        top = event_sums(conf, correct)
        grids = [(conf, fine, offsets[0]), (conf, ece, offsets[1])]
        grids += [(p[:, k], ece, offsets[2] + k * ece) for k in range(classes)]
        grids += [(conf, rel, offsets[3])] + ([(conf, PRED_BINS, offsets[4])] if predictions else [])
        self.keys = _keys(grids, labels.size)
        self.sums = np.empty((len(grids), *top.shape), dtype=np.int64)
        self.sums[[0, 1, 2 + classes]] = top
        for k in range(classes):
            self.sums[2 + k] = event_sums(p[:, k], onehot[:, k])
        if predictions:
            self.sums[-1] = top * _NO_OUTCOME
        self.rows = np.column_stack([p, labels])

    def __len__(self) -> int:
        return int(self.keys.shape[1])

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
        n = self.keys.shape[1]
        if isinstance(idx, slice):  # folds from fold(): a range of a batch sorted by bucket
            a, b, _ = idx.indices(n)
            size = max(b - a, 0)
        else:
            size = idx.size
            a, b = (int(idx[0]), int(idx[-1]) + 1) if size else (0, 0)
        if size == n:  # idx is sorted: all events, in order
            return self.keys, self.sums, self.rows, False
        if b - a == size:  # increasing and contiguous
            return self.keys[:, a:b], self.sums[..., a:b], None if self.rows is None else self.rows[a:b], True
        if isinstance(idx, slice):
            raise ValueError(f"take: a slice of step 1 expected, got {idx!r}")
        return self.keys[:, idx], self.sums[..., idx], None if self.rows is None else self.rows[idx], False

    def subset(self, idx: np.ndarray) -> EventCells:
        """The events ``idx`` (any order) as a batch of their own."""
        out = EventCells.__new__(EventCells)
        # take(): what fancy indexing gives, in about two thirds of its time on these 2-D arrays
        out.keys, out.sums, out.pred = self.keys.take(idx, axis=1), self.sums.take(idx, axis=-1), self.pred
        out.rows = None if self.rows is None else self.rows.take(idx, axis=0)
        return out

    def fold_into(self, bucket: BucketStats, idx: np.ndarray | slice) -> None:
        """``bucket.fold(self, idx)``: the update a :class:`~calmon.state.windows.TieredRing` calls per bucket."""
        bucket.fold(self, idx)

    def fold_range(self, bucket: BucketStats, idx: slice) -> None:
        """:meth:`fold_into` of a range ``slice(a, b)`` of a batch sorted by bucket (:func:`fold`'s case: a
        bucket for every two or three events at thousands of models), without :meth:`_take`'s generality:
        the same pending rows, copied (the batch is not kept), or aggregated at once past
        :data:`PENDING_CELLS`."""
        a, b = idx.start, idx.stop
        if b <= a:
            return
        if bucket._hold is not None:
            bucket._thaw()
        keys, rows = self.keys[:, a:b], self.rows
        bucket._pending_cells += keys.size
        if bucket._pending_cells >= PENDING_CELLS:  # aggregated now: views of the batch are not kept
            bucket._pending.append((self.pred, keys, self.sums[..., a:b], None if rows is None else rows[a:b]))
            bucket._flush()
            return
        bucket._pending.append((self.pred, keys.copy(), self.sums[..., a:b].copy(),
                                None if rows is None else rows[a:b].copy()))


def _keys(grids: list[tuple[np.ndarray, int, int]], n: int) -> np.ndarray:
    """Combined cells ``(len(grids), n)``: row ``i`` the cells of the values ``z`` on a grid of ``bins`` cells
    starting at combined cell ``offset``, for ``grids[i] = (z, bins, offset)``."""
    keys = np.empty((len(grids), n), dtype=np.int64)
    for row, (z, bins, offset) in enumerate(grids):
        keys[row] = cell_index(z, bins)
        keys[row] += offset
    return keys


#: A pending entry's kind: :attr:`EventCells.pred` of a fold (``False``/``True``), or :data:`CELLS`.
#: ``CELLS``: a delta bucket's cells merged by :meth:`BucketStats.merge_cells`, already aggregated: keys
#: ``(1, n)`` sorted unique combined cells, sums ``(6, n)`` with explicit counts (not one event per column), rows
#: the bucket's labeled events (every one of them) or None (a sample, absorbed into the reservoir already).
CELLS = 2

#: A fold (or merged cells) waiting in a bucket: (kind, keys, sums, reservoir rows or None); kind is
#: :attr:`EventCells.pred` of a fold or :data:`CELLS`.
Pending = tuple[int, np.ndarray, np.ndarray, np.ndarray | None]


def expand_all(pending: Sequence[Pending]) -> tuple[np.ndarray, np.ndarray]:
    """The combined cells of every pending fold and their per-event sums ``(6, cells)``, concatenated: one
    concatenation per array rather than a tile per fold (a bucket's folds are often a handful of events)."""
    tiles: list[np.ndarray] = []
    for pred, keys, sums, _ in pending:
        g = keys.shape[0]
        if pred == CELLS:  # aggregated cells of a merged delta bucket: one column per cell already
            tiles.append(sums)
        elif sums.ndim == 3:  # one set of sums per row of keys, in the order of keys.ravel()
            tiles.append(sums.transpose(1, 0, 2).reshape(sums.shape[1], -1))
        elif pred:  # the labeled prediction-side row (the last) has no outcome terms
            tiles.extend([sums] * (g - 1))
            tiles.append(sums * _NO_OUTCOME)
        else:
            tiles.extend([sums] * g)
    if len(pending) == 1:
        return pending[0][1].ravel(), np.concatenate(tiles, axis=1)
    return np.concatenate([keys.ravel() for _, keys, _, _ in pending]), np.concatenate(tiles, axis=1)


def bincount_one(pred: int, keys: np.ndarray, sums: np.ndarray, length: int) -> tuple[np.ndarray, np.ndarray]:
    """The cells and summed int64 fields of one fold's events (those of :func:`expand_all`) by bincount over
    the combined axis of ``length`` cells: the count (field 0, one per event) unweighted, each other field
    weighted by its float64 values written once per grid into one buffer (no int64 tile converted field by
    field); float sums of integers below ``2**53`` are exact."""
    g, n = keys.shape
    cells = keys.ravel()
    count = np.bincount(cells, minlength=length)
    occupied = np.flatnonzero(count)
    fields = sums.shape[-2]
    out = np.empty((fields, occupied.size), dtype=np.int64)
    out[0] = count[occupied]
    w = np.empty((g, n))
    for i in range(1, fields):
        w[:] = sums[..., i, :]
        if pred and i in (2, 4):  # the labeled prediction-side row (the last) has no outcome terms
            w[g - 1] = 0
        out[i] = np.bincount(cells, weights=w.ravel(), minlength=length)[occupied]
    return occupied, out


#: Multiplies the sums of an event to those of its prediction alone (rows 2 and 4 hold outcome terms).
_NO_OUTCOME = np.array([[1], [1], [0], [1], [0], [1]], dtype=np.int64)


class BucketPart(NamedTuple):
    """A bucket as :meth:`BucketStats.read_part` reads it from a packed payload: read-only views, checked."""

    stats: ModelPart
    rel: GridPart
    pred: GridPart

    def shape(self) -> tuple[int, int, int]:
        """(classes, fine-grid bins, reliability bins), as :func:`calmon.cluster.deltas.check_fits` compares."""
        return self.stats.classes, self.stats.fine.bins, self.rel.bins

    def events(self) -> int:
        """Events of the bucket (its fine grid's count)."""
        fine = self.stats.fine
        return int((fine.dense if fine.dense is not None else fine.vals)[0].sum())


class BucketStats:
    """The statistics of one time bucket (or the sum of several): model statistics + reliability grid.

    Parameters
    ----------
    classes, bins, reservoir, levelset_lambda
        As for :class:`~calmon.stats.model.ModelStats`.
    reliability_bins
        Bins of the exported reliability diagram.

    Examples
    --------
    >>> import numpy as np
    >>> b = BucketStats(2, bins=64, reservoir=10)
    >>> b.update(score=np.array([0.1, 0.97]), labels=np.array([0, 1]))
    >>> b.count, b.rel.n[[2, 19]].tolist()
    (2, [1.0, 1.0])

    Events are folded as :class:`EventCells` (:meth:`update` folds those of the events it is given); they wait
    as rows until the bucket is read:

    >>> b.fold(EventCells(b.layout(), np.array([1]), score=np.array([0.5])), np.array([0]))
    >>> b.count, float(b.rel.n[10])
    (3, 1.0)
    """

    __slots__ = ("_stats", "_rel", "_pred", "_pending", "_pending_cells", "_hold", "_packed", "_proto")

    def __init__(self, classes: int = 2, bins: int = 1024, reservoir: int = 256, levelset_lambda: int | None = None,
                 reliability_bins: int = 20, seed: int = 0) -> None:
        self._stats = ModelStats(classes, bins=bins, ece_bins=ECE_BINS, reservoir=reservoir,
                                 levelset_lambda=levelset_lambda, seed=seed)
        self._rel = ScoreGrid(reliability_bins)
        #: Prediction-side statistics: every prediction's score (top-label confidence) as it arrives, labels or not.
        self._pred = ScoreGrid(PRED_BINS)
        #: Folded, not yet aggregated events, in order.
        self._pending: list[Pending] = []
        self._pending_cells = 0
        #: Merged, not yet summed buckets, in order (after the pending folds, which came before them).
        #: A checkpoint's claim on the current content (see :meth:`freeze`), or None.
        self._hold: Hold | None = None
        #: A restored packed document (its JSON bytes) not decoded yet (see :meth:`load`), or None.
        self._packed: bytes | None = None
        #: The pristine bucket this one is still an unmaterialised copy of (see :meth:`blank`), or None.
        self._proto: BucketStats | None = None

    @property
    def stats(self) -> ModelStats:
        """The model statistics (fine and ECE grids, reservoir, level sets)."""
        self._flush()
        return self._stats

    @property
    def rel(self) -> ScoreGrid:
        """The reliability-diagram grid."""
        self._flush()
        return self._rel

    @property
    def pred(self) -> ScoreGrid:
        """The prediction-side grid."""
        self._flush()
        return self._pred

    @property
    def count(self) -> int:
        return self.stats.count

    def layout(self) -> Layout:
        """The grids of this bucket, as :class:`EventCells` lays them out (a bucket not materialised yet stays so:
        its pristine bucket's)."""
        src = self if self._proto is None else self._proto
        st = src.stats
        return st.fine.bins, st.ece.bins, st.classes, src._rel.bins

    def sampling(self) -> tuple[int, int, bool]:
        """(reservoir capacity (0: none), reservoir row width, whether it keeps level sets), as :func:`cell_table`
        and the delta formats read them (a bucket not materialised yet stays so)."""
        src = self if self._proto is None else self._proto
        st = src.stats
        res = st.reservoir
        width = 2 if st.classes == 2 else st.classes + 1
        return (0 if res is None else res.capacity), width, st.levelset is not None

    def update(self, score: np.ndarray | None = None, probs: np.ndarray | None = None,
               labels: np.ndarray | None = None, predictions: bool = False) -> None:
        """Add labeled events (binary ``score`` or multiclass ``probs``) with class ``labels``: the fold of
        their :class:`EventCells`.

        ``predictions``: also count them on the prediction-side grid (labeled events; a joined pair's
        prediction was counted there when it arrived).
        """
        if score is None and probs is None:
            raise ValueError("BucketStats.update needs score (binary) or probs (multiclass)")
        labels = np.asarray(labels, dtype=np.int64)
        self.fold(EventCells(self.layout(), labels, score, probs, predictions), slice(None))

    def fold(self, cells: EventCells, idx: np.ndarray | slice) -> None:
        """Add the events ``idx`` of prepared :class:`EventCells`.

        The events' cells and sums are kept as rows and aggregated on the next read (or once
        :data:`PENDING_CELLS` are waiting): a fold costs a few array copies whatever the grids.
        """
        self._thaw()
        keys, sums, rows, view = cells._take(idx)
        if not keys.size:
            return
        self._pending_cells += keys.size
        if self._pending_cells >= PENDING_CELLS:  # aggregated now: views of the batch are not kept
            self._pending.append((cells.pred, keys, sums, rows))
            self._flush()
            return
        if view:  # kept until the next read: copies, not views holding on to the whole batch
            keys, sums, rows = keys.copy(), sums.copy(), None if rows is None else rows.copy()
        self._pending.append((cells.pred, keys, sums, rows))

    def _flush(self) -> None:
        """Decode a restored document still packed; aggregate the folded events, in arrival order.

        Every reader and writer of the statistics comes through here first (the properties).
        """
        if self._packed is not None:
            self._unpack()
        if self._proto is not None:
            self._materialise()
        if not self._pending:
            return
        pending, self._pending, self._pending_cells = self._pending, [], 0
        st = self._stats
        offsets = axis((st.fine.bins, st.ece.bins, st.classes, self._rel.bins))
        merged = any(p[0] == CELLS for p in pending)
        if len(pending) == 1 and pending[0][1].size >= BINCOUNT_CELLS and not merged:
            cells, sums = bincount_one(*pending[0][:3], offsets[-1])
        else:
            cells, sums = expand_all(pending)
            # one bincount per field over the combined axis (exact below 2**53: a batch's events; merged cells
            # may hold any sums, so they are summed as integers)
            if cells.size >= BINCOUNT_CELLS and not merged:
                total = np.stack([np.bincount(cells, weights=v, minlength=offsets[-1]) for v in sums])
                cells = np.flatnonzero(total[0])
                sums = total[:, cells].astype(np.int64)
            else:
                cells, sums = sparse.aggregate(cells, sums)
        cuts = np.searchsorted(cells, offsets).tolist()
        for k, grid in enumerate((st.fine, st.ece, st.classwise, self._rel, self._pred)):
            a, b = cuts[k], cuts[k + 1]
            if b > a and grid is not None:  # (a binary model has no class-wise cells)
                grid.add_cells(cells[a:b] - offsets[k], sums[:, a:b], aggregated=True)
        rows = [p[3] for p in pending if p[3] is not None]
        if rows and st.reservoir is not None:
            st.reservoir.update(np.concatenate(rows))
        if st.levelset is not None:  # fold by fold: a level set's bins are allocated batch by batch
            for r in rows:
                st.levelset.update(r[:, :-1], r[:, -1].astype(np.int64))

    def update_predictions(self, score: np.ndarray | None = None, probs: np.ndarray | None = None) -> None:
        """Add predictions (with or without their outcome) to the prediction-side grid: the fold of their
        :class:`EventCells`."""
        if score is None and probs is None:
            raise ValueError("BucketStats.update_predictions needs score (binary) or probs (multiclass)")
        self.fold(EventCells(self.layout(), None, score, probs), slice(None))

    def merge(self, other: BucketStats) -> None:
        """Add ``other``'s statistics (its pending folds aggregated first, as any read does)."""
        self._thaw()
        self.stats.merge(other.stats)
        self._rel.merge(other.rel)
        self._pred.merge(other.pred)

    @staticmethod
    def read_part(d: dict[str, Any], unpacker: Unpacker) -> BucketPart:
        """The bucket :meth:`to_parts` wrote, checked as :meth:`from_parts` checks it, as read-only views of the
        payload (``ValueError``, ``KeyError`` or ``TypeError`` when damaged): what :meth:`merge_part` adds,
        without building a bucket (a delta record of the partitioned agent holds hundreds)."""
        return BucketPart(ModelStats.read_part(d["stats"], unpacker), ScoreGrid.read_part(d["rel"], unpacker),
                          ScoreGrid.read_part(d["pred"], unpacker))

    @classmethod
    def from_part(cls, part: BucketPart) -> BucketStats:
        """The bucket of a :meth:`read_part` (arrays copied): equal to :meth:`from_parts` of the same parts."""
        out = cls._shell()
        out._stats = ModelStats.from_part(part.stats)
        out._rel, out._pred = ScoreGrid.from_part(part.rel), ScoreGrid.from_part(part.pred)
        return out

    def check_part(self, part: BucketPart) -> None:
        """Raise ``ValueError`` unless :meth:`merge_part` can add ``part`` whole (its classes and grid shapes)."""
        self.stats.check_part(part.stats)
        for grid, got in ((self._rel, part.rel), (self._pred, part.pred)):
            if (got.bins, got.channels) != (grid.bins, grid.channels):
                raise ValueError(f"cannot combine grids of shapes {grid.shape} and bins {got.bins}, channels "
                                 f"{got.channels}")

    def merge_part(self, part: BucketPart) -> None:
        """:meth:`merge` of the bucket of a :meth:`read_part`, straight from its views into this bucket's grids:
        the grids end with the same integers and storage as ``merge(BucketStats.from_part(part))``; the
        reservoir is a uniform sample of the union (:meth:`ModelStats.merge_part`).  Check with
        :meth:`check_part` first."""
        self._thaw()
        self.stats.merge_part(part.stats)
        self._rel.merge_part(part.rel)
        self._pred.merge_part(part.pred)

    def merge_cells(self, cells: np.ndarray, sums: np.ndarray, rows: np.ndarray, seen: int, capacity: int) -> None:
        """Add one bucket of a delta table (:class:`CellTable`): its aggregated cells and its reservoir sample,
        the same statistics as :meth:`merge` of that bucket.

        The cells wait as a :data:`CELLS` entry until the bucket is next read, summed with whatever else
        arrived meanwhile in one pass (an evaluator's bucket gets a delta from every input partition between
        two reads).  ``rows`` are every labeled event of the delta bucket when ``len(rows) == seen`` (then they
        wait too, and the next read offers them to the reservoir as a fold's rows are: a uniform sample of the
        union), else a uniform sample of ``seen`` events by a reservoir of ``capacity`` rows, merged now
        (:meth:`Reservoir.absorb <calmon.stats.reservoir.Reservoir.absorb>`, or :meth:`Reservoir.merged
        <calmon.stats.reservoir.Reservoir.merged>` if this bucket's capacity differs).

        Parameters
        ----------
        cells
            Sorted unique combined cells (:func:`axis` of :meth:`layout`).  The arrays may be read-only views of
            a record's payload: they are kept as they are until the read, which only reads them.
        sums
            Their int64 sums ``(6, len(cells))``, counts included.
        rows, seen, capacity
            The delta bucket's reservoir rows, the labeled events they sample and its reservoir's capacity.
        """
        self._thaw()
        if not cells.size and not seen:
            return
        kept: np.ndarray | None = rows  # views are kept: a read copies what it sums, and is due within a round
        if rows.shape[0] < seen:  # a sample: absorbed now (order does not matter for a uniform sample)
            if self._packed is not None:
                self._unpack()
            if self._proto is not None:
                self._materialise()
            st = self._stats
            res = st.reservoir
            if res is not None and res.capacity == capacity:
                res.absorb(rows, seen)
            elif res is not None:  # (stages configured with other reservoirs) the general merge, as merge_part's
                sample = Reservoir.of_rows(capacity, res.width, rows.copy())
                sample.seen = seen
                st.reservoir = res.merged(sample, np.random.default_rng(st.count))
            kept = None
        self._pending.append((CELLS, cells.reshape(1, -1), sums, kept))
        self._pending_cells += cells.size
        if self._pending_cells >= PENDING_CELLS:
            self._flush()

    def axis_cells(self) -> tuple[np.ndarray, np.ndarray]:
        """Every grid's stored cells on the combined axis (:func:`axis`), ascending, and their int64 sums
        ``(6, cells)``: the content :meth:`merge_cells` adds (pending folds aggregated first)."""
        st = self.stats
        offsets = axis(self.layout())
        parts = [(c + offsets[k], v) for k, grid in enumerate((st.fine, st.ece, st.classwise, self._rel, self._pred))
                 if grid is not None for c, v in (grid.cell_sums(),)]
        return np.concatenate([c for c, _ in parts]), np.concatenate([v for _, v in parts], axis=1)

    def absorb(self, child: BucketStats) -> None:
        """:meth:`merge` of a bucket rolling into this coarser one (:meth:`TieredRing.advance
        <calmon.state.windows.TieredRing.advance>`), with the same result, bit for bit.

        A child never read since :meth:`blank` (at thousands of models, most minute buckets: two or three
        events each) is not materialised: its folded events join this bucket's pending ones, summed with
        them on the next read (one flush for many children, grid sums being exact integers in any order),
        and only its reservoir is merged now, from its rows -- the sample it would hold (a fresh reservoir
        below its capacity keeps every row it is offered, in order, drawing nothing) -- with the seed
        :meth:`merge` uses (the count after the merge), after this bucket's own pending rows are sampled (as
        a flush would: a sample does not depend on how its rows are split into updates).  Any other child
        (read, restored, with level sets, or holding more rows than its reservoir keeps) is merged by
        :meth:`merge`.
        """
        proto = child._proto
        if (proto is None or child._packed is not None or proto._stats.levelset is not None
                or _has_cells(child._pending) or _has_cells(self._pending)):
            self.merge(child)  # (merged cells count their events in their sums, not their columns)
            return
        pending = child._pending
        rows = [p[3] for p in pending if p[3] is not None]
        res = proto._stats.reservoir
        seen = sum(r.shape[0] for r in rows)
        if res is not None and seen > res.capacity:
            self.merge(child)
            return
        self._thaw()
        if self._packed is not None:  # a restored bucket: decoded now (its pending folds stay pending)
            self._unpack()
        if self._proto is not None:  # materialised now: its reservoir is merged into below
            self._materialise()
        st = self._stats
        width = 2 if st.classes == 2 else st.classes + 1
        empty = np.zeros((0, width))  # labeled, sampled already: counted on the grids only
        own = [p[3] for p in self._pending if p[3] is not None and p[3].size]
        if own and st.reservoir is not None:
            # sampled now, in order; their cells stay pending, summed with the children's on the next read
            st.reservoir.update(np.concatenate(own))
            self._pending = [(pr, k, v, None if r is None else empty) for pr, k, v, r in self._pending]
        if st.reservoir is not None and res is not None:
            # the count after the merge: what merge() seeds the reservoirs' merge with (ModelStats.merge)
            count = st.fine.count + sum(p[1].shape[1] for p in self._pending if p[3] is not None) + seen
            sample = Reservoir.of_rows(res.capacity, res.width,
                                       np.concatenate(rows) if rows else np.zeros((0, res.width)))
            st.reservoir = st.reservoir.merged(sample, merge_rng(count))
        for pred, keys, sums, r in pending:
            self._pending.append((pred, keys, sums, None if r is None else empty))
            self._pending_cells += keys.size
        if self._pending_cells >= PENDING_CELLS:
            self._flush()

    def summed(self, others: Sequence[BucketStats]) -> BucketStats:
        """A new bucket equal to ``self.copy()`` into which ``others`` are merged in turn (:meth:`merge`),
        bit for bit, in one pass per grid (:meth:`ModelStats.summed`); nothing is changed (pending
        folds are aggregated, as any read does)."""
        stats = [o.stats for o in others]  # aggregates pending folds (the property)
        out = BucketStats._shell()
        out._stats = self.stats.summed(stats)
        out._rel = self._rel.summed([o._rel for o in others])
        out._pred = self._pred.summed([o._pred for o in others])
        return out

    def read_copy(self) -> BucketStats:
        """A copy to merge *from* (:meth:`merge`, :meth:`summed`), not to update: as :meth:`copy`, but its
        reservoir keeps the rows and count only (merging never reads a generator, and copying one is
        about a third of a bucket's copy).  The window sums copy their buckets so under the lock."""
        out = BucketStats._shell()
        out._stats = self.stats.copy(sample_only=True)  # folds pending events first (the property)
        out._rel = self._rel.copy()
        out._pred = self._pred.copy()
        return out

    def blank(self) -> BucketStats:
        """A new empty bucket of this one's parameters, as the constructor makes it, *not materialised*: it
        holds nothing but its folded events until its first read, which copies this untouched bucket's grids,
        reservoir and level sets (:meth:`_materialise`).  At thousands of models a ring creates a bucket for
        every two or three events, most never read before they roll into a coarser tier: a bucket that is
        only its pending rows costs neither the copy (~8 us) nor a dozen objects for the garbage collector to
        traverse.  Call it on a bucket never updated (:meth:`ModelWindows.factory` keeps one): the copy taken
        on the first read is then the one taken here before, bit for bit (the same pristine state, the same
        reservoir seed)."""
        out = BucketStats._shell()
        out._proto = self if self._proto is None else self._proto
        return out

    def _materialise(self) -> None:
        """Give a bucket made by :meth:`blank` its own copy of the pristine statistics (on its first read)."""
        proto, self._proto = self._proto, None
        assert proto is not None
        self._stats = proto._stats.copy()
        self._rel = proto._rel.copy()
        self._pred = proto._pred.copy()

    def copy(self) -> BucketStats:
        out = BucketStats._shell()
        out._stats = self.stats.copy()  # folds pending events first (the property)
        out._rel = self._rel.copy()
        out._pred = self._pred.copy()
        return out

    # -- copy-on-write for checkpoints ------------------------------------------------------------
    def freeze(self, hold: Hold) -> None:
        """Let a checkpoint write the current content later, off the lock (call under the state lock).

        The folded events are aggregated now, so that reading the bucket changes nothing any more;
        before the content next changes (:meth:`update`, :meth:`fold`, :meth:`merge`,
        :meth:`update_predictions`), ``hold.thaw(self)`` is called once -- the checkpoint then takes a
        copy of the content it claimed, unless it has written it already.
        """
        if self._pending or self._packed is None:  # a packed restored bucket stays packed
            self._flush()
        self._hold = hold

    def release(self, hold: Hold) -> None:
        """Drop ``hold``'s claim (it wrote the content); a newer claim is left alone."""
        if self._hold is hold:
            self._hold = None

    def _thaw(self) -> None:
        hold, self._hold = self._hold, None
        if hold is not None:
            hold.thaw(self)

    def nbytes(self) -> int:
        """Bytes of the statistics' arrays (grids as stored, reservoir rows, level sets, pending folds)."""
        pend = sum(k.nbytes + v.nbytes + (0 if r is None else r.nbytes) for _, k, v, r in self._pending)
        if self._packed is not None:  # not decoded yet: its document's bytes
            return len(self._packed) + pend
        if self._proto is not None:  # not materialised: its folded events only
            return pend
        return self._stats.nbytes() + self._rel.nbytes() + self._pred.nbytes() + pend

    def to_dict(self) -> dict[str, Any]:
        """The bucket's document, every array packed on its own (see :meth:`to_packed` for the compact form)."""
        return {"format": FORMAT, "stats": self.stats.to_dict(), "rel": self._rel.to_dict(),
                "pred": self._pred.to_dict()}

    def to_packed(self) -> dict[str, Any]:
        """The bucket's document in the packed form (version :data:`PACKED_VERSION`): the same content as
        :meth:`to_dict`, every array in one compressed payload (:mod:`calmon.stats.packed`), so that
        writing and reading it cost one zlib stream instead of about seventeen.  :meth:`from_dict`
        reads both forms."""
        raw = self.packed_json()
        if raw is not None:
            doc: dict[str, Any] = json.loads(raw)  # restored and untouched since: its document as read
            return doc
        packer = Packer()
        parts = {"stats": self.stats.to_parts(packer), "rel": self._rel.to_parts(packer),
                 "pred": self._pred.to_parts(packer)}
        return {"format": FORMAT, "version": PACKED_VERSION, **parts, **packer.finish()}

    def to_parts(self, packer: Packer) -> dict[str, Any]:
        """The bucket's small fields, its arrays put into ``packer`` (several buckets may share one packer: a
        binary delta record holds one table for all its buckets); read back by :meth:`from_parts`."""
        return {"stats": self.stats.to_parts(packer), "rel": self._rel.to_parts(packer),
                "pred": self._pred.to_parts(packer)}

    @classmethod
    def _shell(cls) -> BucketStats:
        """An instance whose transient fields (folds and merges waiting, the packed form) are empty: the one
        way to make a bucket without ``__init__`` (the readers fill ``_stats``, ``_rel`` and ``_pred``)."""
        out = cls.__new__(cls)
        out._pending, out._pending_cells, out._hold, out._packed, out._proto = [], 0, None, None, None
        return out

    @classmethod
    def from_parts(cls, d: dict[str, Any], unpacker: Unpacker) -> BucketStats:
        """Rebuild from :meth:`to_parts` output (``ValueError``, ``KeyError`` or ``TypeError`` when damaged)."""
        out = cls._shell()
        out._decode_parts(d, unpacker)
        return out

    def packed_json(self) -> bytes | None:
        """The packed document's JSON bytes as :meth:`load` kept them, while the bucket was neither read nor
        changed since (else None); a checkpoint writes them as they are."""
        raw = self._packed  # read once: another thread may decode the bucket meanwhile (never change it)
        return raw if raw is not None and not self._pending else None

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> BucketStats:
        """Rebuild from :meth:`to_dict` or :meth:`to_packed` output."""
        if d.get("format") != FORMAT:
            raise ValueError("not a calmon bucket document")
        out = cls._shell()
        version = d.get("version", 1)
        if version == PACKED_VERSION:
            out._decode(d)
        elif version == 1:
            out._stats = ModelStats.from_dict(d["stats"])
            out._rel = ScoreGrid.from_dict(d["rel"])
            # buckets checkpointed before prediction-side statistics existed start with an empty grid
            out._pred = ScoreGrid.from_dict(d["pred"]) if "pred" in d else ScoreGrid(PRED_BINS)
        else:
            raise ValueError(f"calmon bucket document version {version!r} is not supported "
                             f"(1 or {PACKED_VERSION})")
        return out

    @classmethod
    def load(cls, doc: dict[str, Any] | bytes) -> BucketStats:
        """:meth:`from_dict` of a document, or of its JSON bytes as a checkpoint's pack holds them.

        A packed document as :meth:`to_packed` and the checkpoint writer produce it (recognised by its
        first bytes; its CRC was checked when it was read) is kept as bytes and decoded on first use
        (:meth:`_flush`): a restore then costs no decoding, and no garbage-collected objects, for
        the buckets nobody reads yet.  Any other document is decoded (and checked) now.
        """
        if isinstance(doc, bytes | bytearray):
            if doc.startswith(PACKED_PREFIX):
                out = cls._shell()
                out._packed = bytes(doc)
                return out
            try:
                doc = json.loads(doc)
            except ValueError as exc:
                raise ValueError(f"bucket document is not valid JSON ({exc})") from None
            if not isinstance(doc, dict):
                raise ValueError("bucket document is not an object")
        return cls.from_dict(doc)

    def _decode(self, d: dict[str, Any]) -> None:
        self._decode_parts(d, Unpacker(d))

    def _decode_parts(self, d: dict[str, Any], unpacker: Unpacker) -> None:
        stats = ModelStats.from_parts(d["stats"], unpacker)
        rel, pred = ScoreGrid.from_parts(d["rel"], unpacker), ScoreGrid.from_parts(d["pred"], unpacker)
        self._stats, self._rel, self._pred, self._packed = stats, rel, pred, None

    def _unpack(self) -> None:
        """Decode the packed bytes kept by :meth:`load` (under the state lock, like any read)."""
        assert self._packed is not None
        d = json.loads(self._packed)
        if not isinstance(d, dict) or d.get("format") != FORMAT or d.get("version") != PACKED_VERSION:
            raise ValueError("not a packed calmon bucket document")
        self._decode(d)


def _has_cells(pending: Sequence[Pending]) -> bool:
    """Whether merged cells (:data:`CELLS`) wait among ``pending``."""
    return any(p[0] == CELLS for p in pending)


class CellTable(NamedTuple):
    """The statistics of many buckets of one :data:`Layout` as one set of arrays: each bucket's sorted unique
    cells on the combined axis (:func:`axis`) with their int64 sums, and its reservoir rows -- what a delta
    record of format 4 carries (:mod:`calmon.cluster.deltas`), built by :func:`cell_table` without a Python
    call per bucket's grid, merged by :meth:`BucketStats.merge_cells`.

    Bucket ``i`` holds ``cells[cell_end[i - 1]:cell_end[i]]`` (``cell_end[-1]`` read as 0) with
    ``sums[:, ...]`` of the same columns, and the rows ``rows[row_end[i - 1]:row_end[i]]`` sampling its
    ``seen[i]`` labeled events (all of them when the two counts are equal).
    """

    cell_end: np.ndarray
    cells: np.ndarray
    sums: np.ndarray
    row_end: np.ndarray
    rows: np.ndarray
    seen: np.ndarray

    def bucket(self, i: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, int]:
        """Bucket ``i``'s cells, sums, rows and events seen (views)."""
        a, b = (int(self.cell_end[i - 1]) if i else 0), int(self.cell_end[i])
        r, q = (int(self.row_end[i - 1]) if i else 0), int(self.row_end[i])
        return self.cells[a:b], self.sums[:, a:b], self.rows[r:q], int(self.seen[i])


def cell_table(buckets: Sequence[BucketStats], layout: Layout, capacity: int, width: int) -> CellTable:
    """The :class:`CellTable` of ``buckets`` (all of ``layout``, reservoirs of ``capacity`` rows of ``width``;
    capacity 0: no reservoir), without changing what they hold.

    A bucket that is only its folded events (:meth:`BucketStats.blank`, never read: a fresh ring's buckets, one
    range's) is not aggregated on its own: the folds of every such bucket are gathered by kind and summed at
    once, by one sort over (bucket, combined cell) -- the aggregation its first read would do, for all of them
    in one pass.  Its rows are the table's rows while they fit its reservoir (a fresh reservoir below its
    capacity keeps every row it is offered), else a uniform sample of ``capacity`` of them (from one generator per
    table, seeded by its content: the same range gives the same delta); a bucket read or merged into already
    is read (its grids' cells and its reservoir's sample).  Level sets are not carried (a model with level sets is
    written in another format).
    """
    n_axis = axis(layout)[-1]
    groups: dict[tuple[int, int, int], list[tuple[int, np.ndarray, np.ndarray]]] = {}
    keys_out: list[np.ndarray] = []
    vals_out: list[np.ndarray] = []
    rows_out: list[np.ndarray] = []
    row_end = np.zeros(len(buckets), dtype=np.int64)
    seen = np.zeros(len(buckets), dtype=np.int64)
    kept = 0
    draw: np.random.Generator | None = None
    for i, b in enumerate(buckets):
        pending = b._pending
        rows = [p[3] for p in pending if p[3] is not None]
        n_rows = sum(r.shape[0] for r in rows)
        proto = b._proto
        if proto is None or b._packed is not None or _has_cells(pending):
            cells, sums = b.axis_cells()  # read: its grids and its reservoir's sample
            keys_out.append(cells + i * n_axis)
            vals_out.append(sums)
            res = b._stats.reservoir
            if res is not None and capacity:
                rows_out.append(res.rows)
                kept += res.rows.shape[0]
                seen[i] = res.seen
        else:
            for kind, keys, sums, _ in pending:
                groups.setdefault((kind, keys.shape[0], sums.ndim), []).append((i, keys, sums))
            if capacity and n_rows > capacity:  # a uniform sample, from one generator per table (not per bucket)
                # seeded by the content: a range processed again gives the same delta, another range other draws
                draw = draw or np.random.default_rng((n_axis, len(buckets), i, n_rows))
                pick = np.sort(draw.choice(n_rows, capacity, replace=False))
                rows_out.append(np.concatenate(rows).take(pick, axis=0))
                kept += capacity
                seen[i] = n_rows
            elif capacity:
                rows_out += rows
                kept += n_rows
                seen[i] = n_rows
        row_end[i] = kept
    for (kind, g, ndim), items in groups.items():
        sizes = [k.shape[1] for _, k, _ in items]
        bid = np.repeat(np.array([i for i, _, _ in items], dtype=np.int64) * n_axis, sizes)
        keys = np.concatenate([k for _, k, _ in items], axis=1)
        keys += bid  # (g, events): every row of an event in its bucket's span of the axis
        sums = np.concatenate([v for _, _, v in items], axis=-1)
        if ndim == 3:  # one set of sums per row of keys, in the order of keys.ravel()
            vals = sums.transpose(1, 0, 2).reshape(sums.shape[1], -1)
        else:
            vals = np.tile(sums, g)
            if kind == 1:  # (True) the labeled prediction-side row (the last) has no outcome terms
                vals[:, (g - 1) * keys.shape[1]:] *= _NO_OUTCOME
        keys_out.append(keys.ravel())
        vals_out.append(vals)
    if keys_out:
        cells, sums = sparse.aggregate(np.concatenate(keys_out), np.concatenate(vals_out, axis=1))
    else:
        cells, sums = np.zeros(0, dtype=np.int64), np.zeros((6, 0), dtype=np.int64)
    cell_end = np.searchsorted(cells, np.arange(1, len(buckets) + 1, dtype=np.int64) * n_axis)
    cells = cells - np.repeat(np.arange(len(buckets), dtype=np.int64) * n_axis, np.diff(cell_end, prepend=0))
    rows_all = np.concatenate(rows_out) if rows_out else np.zeros((0, width))
    return CellTable(cell_end.astype(np.int64), cells, sums, row_end, rows_all.reshape(-1, width), seen)


class ModelWindows:
    """Rings of buckets of one model: segment ``"all"`` plus each allow-listed segment.

    Parameters
    ----------
    name, classes
        Model name and number of classes.
    tiers
        ``[(width, count), ...]`` of the rings.
    segments
        Allow-listed segment values.
    bins, reservoir, levelset_lambda, reliability_bins
        Bucket parameters (see :class:`BucketStats`).

    Examples
    --------
    >>> import numpy as np
    >>> mw = ModelWindows("m", 2, [(60, 5), (600, 3)], segments=["web"], bins=64, reservoir=8)
    >>> seg = np.array(["web", "app", "web"], dtype=object)
    >>> mw.add(np.array([0.0, 10.0, 700.0]), seg, np.array([1, 0, 1]), np.array([0.9, 0.2, 0.7]), None, 700.0)
    >>> mw.rings["all"].window_sum(None).count, mw.rings["web"].window_sum(None).count
    (3, 2)
    >>> mw.rings["all"].window_sum(300).count
    1
    """

    #: The pristine bucket :meth:`factory` copies (made on first use; also for instances built without __init__).
    _blank: BucketStats | None = None
    #: The rings' (identity, version) at the last :meth:`nbytes` and its result.
    _nbytes: tuple[tuple[tuple[int, int], ...], int] | None = None

    def __init__(self, name: str, classes: int, tiers: Iterable[tuple[float, int]], segments: Iterable[str] = (),
                 bins: int = 1024, reservoir: int = 256, levelset_lambda: int | None = None,
                 reliability_bins: int = 20) -> None:
        self.name = name
        self.classes = int(classes)
        self.tiers = [(float(w), int(c)) for w, c in tiers]
        self.segments = list(segments)
        self.params: dict[str, Any] = {"classes": self.classes, "bins": bins, "reservoir": reservoir,
                                       "levelset_lambda": levelset_lambda, "reliability_bins": reliability_bins}
        self.rings: dict[str, TieredRing[BucketStats]] = {
            seg: TieredRing(self.tiers, self.factory) for seg in ["all", *self.segments]}

    def factory(self) -> BucketStats:
        """A new empty bucket: this model's pristine one, copied on its first read (:meth:`BucketStats.blank`)."""
        if self._blank is None:  # never handed out, so never updated
            self._blank = BucketStats(**self.params)
        return self._blank.blank()

    def add(self, ts: np.ndarray, segment: np.ndarray, labels: np.ndarray, score: np.ndarray | None,
            probs: np.ndarray | None, watermark: float, predictions: bool = False) -> None:
        """Add labeled events to segment ``all`` and to their allow-listed segment (``predictions``: see
        :meth:`BucketStats.update`): the :func:`fold` of this model's events."""
        fold([(self, np.arange(ts.size))], ts, segment, labels, watermark, score=score, probs=probs,
             predictions=predictions)

    def add_predictions(self, ts: np.ndarray, segment: np.ndarray, score: np.ndarray | None, probs: np.ndarray | None,
                        watermark: float) -> None:
        """Add predictions (labeled or not) to the prediction-side grids of segment ``all`` and their segment."""
        fold([(self, np.arange(ts.size))], ts, segment, None, watermark, score=score, probs=probs)

    def layout(self) -> Layout:
        """The grids of this model's buckets (:meth:`BucketStats.layout`), for :class:`EventCells`."""
        p = self.params
        return int(p["bins"]), ECE_BINS, self.classes, int(p["reliability_bins"])

    def versions(self) -> dict[str, int]:
        """Segment -> :attr:`TieredRing.version` of its ring (one ring per segment, ``"all"`` included).

        A segment whose version did not change since a previous call has the same buckets, watermark and
        window sums; per-bucket versions are in :meth:`TieredRing.entries`.
        """
        return {seg: ring.version for seg, ring in self.rings.items()}

    def nbytes(self) -> int:
        """Bytes of the rings' statistics, measured again only when a ring changed since the last call (each round
        publishes every model's: at thousands of models, most did not change)."""
        key = tuple((id(ring), ring.version) for ring in self.rings.values())
        if self._nbytes is not None and self._nbytes[0] == key:
            return self._nbytes[1]
        total = self._measure()
        self._nbytes = (key, total)
        return total

    def _measure(self) -> int:
        total = 0
        for ring in self.rings.values():
            for tier in ring.buckets:
                total += sum(b.nbytes() for b in tier.values())
            if ring.archive is not None:
                total += ring.archive.nbytes()
        return total

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "params": self.params, "tiers": [list(t) for t in self.tiers],
                "segments": self.segments,
                "rings": {seg: ring.to_dict(lambda b: b.to_dict()) for seg, ring in self.rings.items()}}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ModelWindows:
        p = d["params"]
        out = cls(d["name"], p["classes"], d["tiers"], d["segments"], p["bins"], p["reservoir"],
                  p["levelset_lambda"], p["reliability_bins"])
        out.rings = {seg: TieredRing.from_dict(r, out.factory, BucketStats.load) for seg, r in d["rings"].items()}
        return out


def fold(parts: Sequence[tuple[ModelWindows, np.ndarray]], ts: np.ndarray, segment: np.ndarray,
         labels: np.ndarray | None, watermark: float, *, score: np.ndarray | None = None,
         probs: np.ndarray | None = None, predictions: bool = False) -> None:
    """Add events to the rings of their models: part ``(windows, rows)`` adds the events ``rows`` (increasing)
    of the batch columns to segment ``all`` of ``windows`` and to their allow-listed segment.

    Parameters
    ----------
    parts
        ``(windows, rows)`` per model.
    ts, segment
        Event time and segment of each event of the batch.
    labels
        Class labels of labeled events; ``None``: predictions (to the prediction-side grids only).
    watermark
        The rings' watermark after these events (the ingestor's: the largest event time seen); each ring is
        rolled to it, or to its newest event if that is later.
    score, probs
        Binary scores, or class probabilities ``(n, K)`` (see :class:`EventCells`).
    predictions
        Also count labeled events on the prediction-side grids.

    Examples
    --------
    >>> mw = ModelWindows("m", 2, [(60, 5), (600, 3)], segments=["web"], bins=64, reservoir=8)
    >>> other = ModelWindows("n", 2, [(60, 5), (600, 3)], bins=64, reservoir=8)
    >>> seg = np.array(["web", "app", "web", ""], dtype=object)
    >>> fold([(mw, np.array([0, 1, 2])), (other, np.array([3]))], np.array([0.0, 10.0, 700.0, 5.0]), seg,
    ...      np.array([1, 0, 1, 1]), 700.0, score=np.array([0.9, 0.2, 0.7, 0.5]))
    >>> mw.rings["all"].window_sum(None).count, mw.rings["web"].window_sum(None).count, other.rings["all"].layout()
    (3, 2, [[], [0.0]])
    """
    if not parts or not ts.size:
        return
    behind = float(ts.max()) > watermark  # not the ingestor's case: each ring rolls to its own newest event
    by_layout: dict[Layout, list[tuple[ModelWindows, np.ndarray]]] = {}
    for mw, rows in parts:
        if rows.size:
            by_layout.setdefault(mw.layout(), []).append((mw, rows))
    for layout, group in by_layout.items():
        _place(group, segment, ts, watermark, EventCells(layout, labels, score, probs, predictions), behind)


#: Allow-lists up to this many segments are matched by comparing the segment column with each name.
_COMPARED = 3


def _entries(group: Sequence[tuple[ModelWindows, np.ndarray]], segment: np.ndarray
             ) -> tuple[np.ndarray, np.ndarray, int]:
    """Every (ring, event) pair of the parts: a ring *slot* ``part * width + j`` (``j = 0``: segment ``all``,
    ``j = 1 + k``: the part's k-th allow-listed segment) and the event, found per distinct allow-list (not per
    model), on the events of that list's models only: by comparing their segments with each name of a short
    list, by one dictionary lookup per event for a longer one."""
    rows = [r for _, r in group]
    ev = np.concatenate(rows)
    part = np.repeat(np.arange(len(group)), [r.size for r in rows])
    width = 1 + max(len(mw.segments) for mw, _ in group)
    lists: dict[tuple[str, ...], list[int]] = {}
    for p, (mw, _) in enumerate(group):
        if mw.segments:
            lists.setdefault(tuple(mw.segments), []).append(p)
    seg_of = np.full(ev.size, -1, dtype=np.int64)
    bounds = np.cumsum([0, *(r.size for r in rows)]).tolist()  # part p's events: ev[bounds[p]:bounds[p + 1]]
    for segs, ps in lists.items():
        # only the events of this list's models: a thousand distinct allow-lists cost one pass over the batch
        at: slice | np.ndarray = slice(None) if len(ps) == len(group) else np.concatenate(
            [np.arange(bounds[p], bounds[p + 1]) for p in ps])
        sub = segment[ev[at]]
        if len(segs) <= _COMPARED:  # a comparison per segment over the column beats a lookup per event
            k = np.full(sub.size, -1, dtype=np.int64)
            for j, name in enumerate(segs):
                k[sub == name] = j  # a name listed twice: its last position, as the dict below
        else:
            lut = {s: k for k, s in enumerate(segs)}
            k = np.fromiter(map(lut.get, sub.tolist(), repeat(-1)), np.int64, sub.size)
        seg_of[at] = k
    has = np.flatnonzero(seg_of >= 0)  # positions, gathered twice (cheaper than two boolean selections)
    first = part * width
    slots = np.concatenate([first, first[has] + 1 + seg_of[has]])
    return slots, np.concatenate([ev, ev[has]]), width


def _place(group: Sequence[tuple[ModelWindows, np.ndarray]], segment: np.ndarray, ts: np.ndarray,
           watermark: float, cells: EventCells, behind: bool) -> None:
    """Roll every ring that gets events to ``watermark``, place all their events with one
    :func:`bucket_cells` and sort them by (ring, bucket) once, then land each ring's buckets with one
    :meth:`TieredRing.add` (a bucket's events are a contiguous slice of the sorted batch: no gather per bucket).

    ``behind``: the watermark is behind an event; the rings are then added to one by one, as are rings at
    other tiers than the first or ahead of ``watermark`` (each keeps its own geometry and watermark)."""
    slots, ev, width = _entries(group, segment)
    by_slot = _stable_argsort(slots)
    ss = slots[by_slot]
    heads = [0, *(np.flatnonzero(ss[1:] != ss[:-1]) + 1).tolist()]
    rings: list[TieredRing[BucketStats]] = []
    for s in ss[heads].tolist():
        mw = group[s // width][0]
        rings.append(mw.rings["all" if s % width == 0 else mw.segments[s % width - 1]])
    first = rings[0]
    tiers = first.tiers
    if behind or any(r.watermark > watermark or (r.tiers is not tiers and r.tiers != tiers) for r in rings):
        for ring, a, b in zip(rings, heads, [*heads[1:], ss.size]):
            rows = ev[by_slot[a:b]]
            ring.add(ts[rows], _through(cells.fold_into, rows), watermark)  # rolls to max(watermark, its events)
        return
    rid = np.repeat(np.arange(len(rings)), np.diff([*heads, ss.size]))  # dense ring index, in sorted order
    ev = ev[by_slot]
    bounds = first.bounds(watermark)  # the same for every ring here: same tiers, none ahead of ``watermark``
    tier, key, code = bucket_cells(tiers, ts[ev], bounds)
    order = _by_ring_then_code(rid, code, [*heads, ss.size])  # each (ring, bucket) keeps its events in batch order
    sr, sc = rid[order], code[order]
    cut = (np.flatnonzero((sr[1:] != sr[:-1]) | (sc[1:] != sc[:-1])) + 1).tolist()
    starts, ends = [0, *cut], [*cut, order.size]
    sorted_cells = cells.subset(ev[order])  # one gather for the whole batch
    heads_at = order[starts]
    groups: list[list[tuple[int, float, slice]]] = [[] for _ in rings]
    for r, t, k, a, b in zip(sr[starts].tolist(), tier[heads_at].tolist(), key[heads_at].tolist(), starts, ends):
        groups[r].append((t, k, slice(a, b)))  # a bucket's events: a contiguous range of the sorted batch
    update = sorted_cells.fold_range
    for ring, g in zip(rings, groups):
        ring.add(None, update, watermark, groups=g, bounds=bounds)  # rolls the ring to ``watermark`` first


#: Rings up to which the events are sorted by bucket ring by ring rather than by one lexsort of the batch.
_RING_SORTS = 32


def _stable_argsort(a: np.ndarray) -> np.ndarray:
    """``np.argsort(a, kind="stable")``; small non-negative integers as int16, which numpy radix-sorts."""
    if a.size and 0 <= int(a.min()) and int(a.max()) < 1 << 15:
        return np.argsort(a.astype(np.int16), kind="stable")
    return np.argsort(a, kind="stable")


def _by_ring_then_code(rid: np.ndarray, code: np.ndarray, bounds: list[int]) -> np.ndarray:
    """``np.lexsort((code, rid))`` for ``rid`` sorted (ring ``r`` holds the entries ``bounds[r]:bounds[r + 1]``):
    a stable sort of each ring's codes, which arrive nearly sorted (events in time order), for a few rings."""
    if len(bounds) - 1 > _RING_SORTS:
        return np.lexsort((code, rid))
    return np.concatenate([a + np.argsort(code[a:b], kind="stable") for a, b in zip(bounds, bounds[1:])])


def _through(fold: Callable[[BucketStats, np.ndarray], None], rows: np.ndarray
             ) -> Callable[[BucketStats, np.ndarray], None]:
    """``fold`` of the events ``rows[idx]`` (``idx``: into the ring's own events)."""
    def update(state: BucketStats, idx: np.ndarray) -> None:
        fold(state, rows[idx])
    return update
