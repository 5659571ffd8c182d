"""Per-bucket statistics and the per-model rings of buckets (the windowed statistics of one model).

A bucket holds a :class:`~calmon.stats.model.ModelStats` (fine grid, exact 15-bin ECE grid,
class-wise grid, reservoir, level-set statistics) plus a coarse equal-width grid for the
exported reliability diagram (20 bins by default, so the ``bin`` labels ``"0.00"..."0.95"``
are exact bins, not re-binned fine cells).

Memory is sized by content.  A bucket holds the fine grid (``bins`` cells), the 15-cell ECE grid,
the reliability grid (20 cells), the prediction-side grid (256 cells) and a reservoir of ``r`` rows.
Grids of >= 64 cells store only their occupied cells (56 bytes each) until a quarter of the cells
are occupied, then 48 bytes per cell; the small grids are dense (about 1.7 kB); reservoir rows are
allocated as they fill (16 bytes per row, binary).  So a bucket of ``m`` labeled events costs about
``1.7 kB + 56 (c_fine + c_pred) + 16 min(m, r)`` bytes with ``c <= m`` occupied cells, and at most
``6 * 8 * (bins + 15 + 20 + 256) + 16 r`` (67 kB at ``bins = 1024``, ``r = 256``) once its grids are
full.  Events folded from a prepared batch wait as rows (at most :data:`PENDING_CELLS` cells) until
the bucket is next read.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from typing import Any, Protocol

import numpy as np

from calmon.state.binarybatch import PRED_BINS, BinaryBatch, axis, bincount_one, expand_all
from calmon.state.windows import TieredRing
from calmon.stats import sparse
from calmon.stats.grid import ScoreGrid
from calmon.stats.model import ModelStats, top_label
from calmon.stats.packed import Packer, Unpacker

FORMAT = "calmon.bucket"
#: Version of the packed bucket document (:meth:`BucketStats.to_packed`); unversioned documents are version 1.
PACKED_VERSION = 2
#: How a packed bucket document encoded by :func:`calmon.state.checkpoint.store.encode` begins (key order and
#: separators fixed).
PACKED_PREFIX = b'{"format":"calmon.bucket","version":2,'


class Hold(Protocol):
    """A checkpoint's claim on a bucket's content (see :meth:`BucketStats.freeze`)."""

    def thaw(self, bucket: BucketStats) -> None:
        """Called once, by the thread about to change ``bucket``, before it does."""


#: Pending combined cells after which a bucket aggregates its folded events (bounds their memory).
PENDING_CELLS = 1024
#: From this many pending cells a flush sums them with bincount over the combined axis instead of sorting.
BINCOUNT_CELLS = 512


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

    Events folded from a prepared batch wait as rows until the bucket is read:

    >>> b.fold(BinaryBatch(np.array([0.5]), np.array([1]), (64, 15, 20), False), np.array([0]))
    >>> b.count, float(b.rel.n[10])
    (3, 1.0)
    """

    __slots__ = ("_stats", "_rel", "_pred", "_pending", "_pending_cells", "_hold", "_packed")

    def __init__(self, classes: int = 2, bins: int = 1024, reservoir: int = 256, levelset_lambda: int | None = None,
                 reliability_bins: int = 20, seed: int = 0) -> None:
        self._stats = ModelStats(classes, bins=bins, ece_bins=15, reservoir=reservoir,
                                 levelset_lambda=levelset_lambda, seed=seed)
        self._rel = ScoreGrid(reliability_bins)
        #: Prediction-side statistics: every prediction's score (top-label confidence) as it arrives, labels or not.
        self._pred = ScoreGrid(PRED_BINS)
        #: Folded, not yet aggregated events: (BinaryBatch.pred, keys, sums, reservoir rows or None), in order.
        self._pending: list[tuple[bool, np.ndarray, np.ndarray, np.ndarray | None]] = []
        self._pending_cells = 0
        #: A checkpoint's claim on the current content (see :meth:`freeze`), or None.
        self._hold: Hold | None = None
        #: A restored packed document (its JSON bytes) not decoded yet (see :meth:`load`), or None.
        self._packed: bytes | None = None

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

    def update(self, score: np.ndarray | None = None, probs: np.ndarray | None = None,
               labels: np.ndarray | None = None, predictions: bool = False) -> None:
        """Add labeled events (binary ``score`` or multiclass ``probs``) with class ``labels``.

        ``predictions``: also count them on the prediction-side grid (labeled events; a joined pair's
        prediction was counted there when it arrived).
        """
        self._thaw()
        labels = np.asarray(labels, dtype=np.int64)
        self.stats.update(score=score, probs=probs, labels=labels)
        if probs is None:
            if score is None:
                raise ValueError("BucketStats.update needs score (binary) or probs (multiclass)")
            self._rel.update(score, labels.astype(np.float64))
            if predictions:
                self._pred.update(score, np.zeros(score.size))
        else:
            conf, correct = top_label(probs, labels)
            self._rel.update(conf, correct)
            if predictions:
                self._pred.update(conf, np.zeros(conf.size))

    def fold(self, batch: BinaryBatch, idx: np.ndarray | slice) -> None:
        """Add the events ``idx`` of a prepared binary batch (the same result as :meth:`update` on them).

        The events' cells and sums are kept as rows and aggregated on the next read (or once
        :data:`PENDING_CELLS` are waiting): a fold costs a few array copies whatever the grids.
        """
        self._thaw()
        keys, sums, rows, view = batch._take(idx)
        self._pending_cells += keys.size
        if self._pending_cells >= PENDING_CELLS:  # aggregated now: views of the batch are not kept
            self._pending.append((batch.pred, keys, sums, rows))
            self._flush()
            return
        if view:  # kept until the next read: copies, not views holding on to the whole batch
            keys, sums, rows = keys.copy(), sums.copy(), None if rows is None else rows.copy()
        self._pending.append((batch.pred, keys, sums, rows))

    def _flush(self) -> None:
        """Decode a restored document still packed; aggregate the folded events, in arrival order.

        Every reader and writer of the statistics comes through here first (the properties).
        """
        if self._packed is not None:
            self._unpack()
        if not self._pending:
            return
        pending, self._pending, self._pending_cells = self._pending, [], 0
        st = self._stats
        offsets = axis((st.fine.bins, st.ece.bins, self._rel.bins))
        if len(pending) == 1 and pending[0][1].size >= BINCOUNT_CELLS:
            cells, sums = bincount_one(*pending[0][:3], offsets[-1])
        else:
            cells, sums = expand_all(pending)
            if cells.size >= BINCOUNT_CELLS:  # one bincount per field over the combined axis (exact below 2**53)
                total = np.stack([np.bincount(cells, weights=v, minlength=offsets[-1]) for v in sums])
                cells = np.flatnonzero(total[0])
                sums = total[:, cells].astype(np.int64)
            else:
                cells, sums = sparse.aggregate(cells, sums)
        cuts = np.searchsorted(cells, offsets).tolist()
        for k, grid in enumerate((st.fine, st.ece, self._rel, self._pred)):
            a, b = cuts[k], cuts[k + 1]
            if b > a:
                grid.add_cells(cells[a:b] - offsets[k], sums[:, a:b], aggregated=True)
        rows = [p[3] for p in pending if p[3] is not None]
        if rows and st.reservoir is not None:
            st.reservoir.update(np.concatenate(rows))

    def update_predictions(self, score: np.ndarray | None = None, probs: np.ndarray | None = None) -> None:
        """Add predictions (with or without their outcome) to the prediction-side grid."""
        z = np.max(probs, axis=1) if probs is not None else score
        if z is None:
            raise ValueError("BucketStats.update_predictions needs score (binary) or probs (multiclass)")
        self._thaw()
        self.pred.update(z, np.zeros(z.size))

    def merge(self, other: BucketStats) -> None:
        self._thaw()
        self.stats.merge(other.stats)
        self._rel.merge(other.rel)
        self._pred.merge(other.pred)

    def summed(self, others: Sequence[BucketStats]) -> BucketStats:
        """A new bucket equal to ``self.copy()`` into which ``others`` are merged in turn (:meth:`merge`),
        bit for bit, in one pass per grid (:meth:`ModelStats.summed`); nothing is changed (pending
        folds are aggregated, as any read does)."""
        stats = [o.stats for o in others]  # aggregates pending folds (the property)
        out = BucketStats.__new__(BucketStats)
        out._stats = self.stats.summed(stats)
        out._rel = self._rel.summed([o._rel for o in others])
        out._pred = self._pred.summed([o._pred for o in others])
        out._pending, out._pending_cells, out._hold, out._packed = [], 0, None, None
        return out

    def read_copy(self) -> BucketStats:
        """A copy to merge *from* (:meth:`merge`, :meth:`summed`), not to update: as :meth:`copy`, but its
        reservoir keeps the rows and count only (merging never reads a generator, and copying one is
        about a third of a bucket's copy).  The window sums copy their buckets so under the lock."""
        out = BucketStats.__new__(BucketStats)
        out._stats = self.stats.copy(sample_only=True)  # folds pending events first (the property)
        out._rel = self._rel.copy()
        out._pred = self._pred.copy()
        out._pending, out._pending_cells, out._hold, out._packed = [], 0, None, None
        return out

    def copy(self) -> BucketStats:
        out = BucketStats.__new__(BucketStats)
        out._stats = self.stats.copy()  # folds pending events first (the property)
        out._rel = self._rel.copy()
        out._pred = self._pred.copy()
        out._pending, out._pending_cells, out._hold, out._packed = [], 0, None, None
        return out

    # -- copy-on-write for checkpoints ------------------------------------------------------------
    def freeze(self, hold: Hold) -> None:
        """Let a checkpoint write the current content later, off the lock (call under the state lock).

        The folded events are aggregated now, so that reading the bucket changes nothing any more;
        before the content next changes (:meth:`update`, :meth:`fold`, :meth:`merge`,
        :meth:`update_predictions`), ``hold.thaw(self)`` is called once -- the checkpoint then takes a
        copy of the content it claimed, unless it has written it already.
        """
        if self._pending or self._packed is None:  # a restored bucket still packed is left packed: bytes never change
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
        out = cls.__new__(cls)
        out._pending, out._pending_cells, out._hold, out._packed = [], 0, None, None
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
                out = cls.__new__(cls)
                out._pending, out._pending_cells, out._hold, out._packed = [], 0, None, bytes(doc)
                return out
            try:
                doc = json.loads(doc)
            except ValueError as exc:
                raise ValueError(f"bucket document is not valid JSON ({exc})") from None
            if not isinstance(doc, dict):
                raise ValueError("bucket document is not an object")
        return cls.from_dict(doc)

    def _decode(self, d: dict[str, Any]) -> None:
        unpacker = Unpacker(d)
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
        return BucketStats(**self.params)

    def add(self, ts: np.ndarray, segment: np.ndarray, labels: np.ndarray, score: np.ndarray | None,
            probs: np.ndarray | None, watermark: float, predictions: bool = False) -> None:
        """Add labeled events to segment ``all`` and to their allow-listed segment (``predictions``: see
        :meth:`BucketStats.update`)."""
        if ts.size == 0:
            return
        if self.classes == 2 and score is not None:
            self._add_all(ts, segment, self._folder(BinaryBatch(score, labels, self.sizes(), predictions)),
                          watermark)
            return

        def adder(sel: np.ndarray | None) -> Any:
            def update(bucket: BucketStats, idx: np.ndarray) -> None:
                rows = idx if sel is None else sel[idx]
                bucket.update(None if score is None else score[rows], None if probs is None else probs[rows],
                              labels[rows], predictions)
            return update

        self._add_all(ts, segment, adder, watermark)

    def add_predictions(self, ts: np.ndarray, segment: np.ndarray, score: np.ndarray | None, probs: np.ndarray | None,
                        watermark: float) -> None:
        """Add predictions (labeled or not) to the prediction-side grids of segment ``all`` and their segment."""
        if ts.size == 0:
            return
        if score is not None and probs is None:
            self._add_all(ts, segment, self._folder(BinaryBatch(score, None, self.sizes(), True)), watermark)
            return

        def adder(sel: np.ndarray | None) -> Any:
            def update(bucket: BucketStats, idx: np.ndarray) -> None:
                rows = idx if sel is None else sel[idx]
                bucket.update_predictions(None if score is None else score[rows],
                                          None if probs is None else probs[rows])
            return update

        self._add_all(ts, segment, adder, watermark)

    def sizes(self) -> tuple[int, int, int]:
        """Cells of the fine, ECE and reliability grids of this model's buckets (see :class:`BinaryBatch`)."""
        return int(self.params["bins"]), 15, int(self.params["reliability_bins"])

    @staticmethod
    def _folder(batch: BinaryBatch) -> Any:
        def adder(sel: np.ndarray | None) -> Any:
            def update(bucket: BucketStats, idx: np.ndarray) -> None:
                bucket.fold(batch, idx if sel is None else sel[idx])
            return update
        return adder

    def _add_all(self, ts: np.ndarray, segment: np.ndarray, adder: Any, watermark: float) -> None:
        self.rings["all"].add(ts, adder(None), watermark)
        for seg in self.segments:
            sel = np.flatnonzero(segment == seg)
            if sel.size:
                self.rings[seg].add(ts[sel], adder(sel), watermark)

    def versions(self) -> dict[str, int]:
        """Segment -> :attr:`TieredRing.version` of its ring (one ring per segment, ``"all"`` included).

        A segment whose version did not change since a previous call has the same buckets, watermark and
        window sums; per-bucket versions are in :meth:`TieredRing.entries`.
        """
        return {seg: ring.version for seg, ring in self.rings.items()}

    def nbytes(self) -> int:
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
