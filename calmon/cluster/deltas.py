"""Statistic deltas: what the ingest stage publishes per (input range, model), and how an evaluator merges them.

A delta is the binned statistics that one range ``[start, end)`` of one input partition added to one
model: for each (segment, tier, bucket start) of the model's event-time rings, the
:class:`~calmon.state.buckets.BucketStats` of exactly those events (its *packed* JSON document,
:meth:`~calmon.state.buckets.BucketStats.to_packed`: the arrays in one zlib payload; no pickle), plus
the partition's watermark after the range and the event counts.  On the topic it is a binary frame
(:mod:`calmon.cluster.frames`) of version 4: the small fields as JSON, then one :class:`DeltaTable` -- every
bucket's occupied cells on the fold's combined cell axis (:func:`~calmon.state.buckets.axis`: fine, ECE,
class-wise, reliability and prediction-side grids end to end) with their six int64 sums, its reservoir rows,
and per bucket its segment, tier, start and where its cells and rows end -- as five raw little-endian arrays,
whatever the number of buckets (no part per grid per bucket), zlib-compressed once.  The ingest stage builds the
table of a model's range in one aggregation over (bucket, combined cell) (:func:`~calmon.state.buckets.cell_table`:
a fresh bucket is still its folded events, so nothing is aggregated per bucket).  Version 3 (a binary frame with
each grid of each bucket as parts of one arrays table) is written for a model with level sets, which a table
does not carry, and read; versions 1 and 2 (JSON documents) are still read.  The ingest stage builds the deltas
by applying the range to *fresh* rings at the partition's watermark, so a bucket of tier ``t`` holds events
that were too old for every finer tier at that watermark.

Merging is exact and order-free: the statistics are integer sums (fixed-point grids) merged by
addition, and :func:`merge_delta` places each delta bucket with the ring's own ``add`` at the
bucket's start time, which lands it in the finest tier whose bounds still accept it.  Bounds only
move forward with the watermark, so a bucket placed at a lower watermark lies where rolling would
have put its events anyway: after every ring is advanced to the same watermark, rings built from
deltas in any order equal the single-process agent's (reservoir *samples* aside: those depend on
arrival order, their counts do not).  A decoded binary delta is merged without building a bucket per
delta bucket.  A version-4 table is checked whole (:meth:`DeltaTable.check`, then :func:`check_fits`) and each
target bucket is handed its cells (:meth:`BucketStats.merge_cells`), which wait, with the rows of a bucket that
kept every event, until the bucket is next read -- a bucket that gets a delta from every input partition between
two evaluations sums them once, exact integers in any order; a delta bucket's sample of more events than its
reservoir keeps is absorbed at once (:meth:`Reservoir.absorb <calmon.stats.reservoir.Reservoir.absorb>`).  A
version-3 delta's cells are added from read-only views of the record's payload straight into the ring's buckets
(:meth:`BucketStats.merge_part`), the same integers as merging a decoded bucket.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Annotated, Any, Literal, TypeVar

import msgspec
import numpy as np

from calmon.cluster.changes import Pairs
from calmon.cluster.frames import is_frame, pack_frame, unpack_frame
from calmon.cluster.records import MAX_RECORD, BadRecord
from calmon.state.buckets import BucketPart, BucketStats, CellTable, ModelWindows, axis, cell_table
from calmon.state.checkpoint.schema import SchemaError, convert
from calmon.state.counters import Counters
from calmon.state.windows import ARCHIVE_TIER
from calmon.stats.packed import Packer, Unpacker

__all__ = ["Delta", "DeltaBucket", "DeltaTable", "DeltaError", "extract_deltas", "merge_delta", "check_fits", "FORMAT",
           "VERSION", "READABLE"]

FORMAT = "calmon.delta"
#: Version written: 4 = a binary frame (:mod:`calmon.cluster.frames`) holding one :class:`DeltaTable`: every
#: bucket's cells on the combined cell axis in one set of arrays (no per-grid, per-bucket parts).  Still read: 3
#: (a binary frame with each bucket's grids as parts of one arrays table; also what a model with level sets is
#: written in, which a table does not carry), 2 (JSON, bucket documents packed with :meth:`BucketStats.to_packed`,
#: one zlib stream per bucket) and 1 (JSON, every array of a bucket packed on its own, :meth:`BucketStats.to_dict`)
#: -- deltas already in the topic stay valid across an upgrade.
VERSION = 4
#: Versions :meth:`Delta.from_bytes` reads.
READABLE = (1, 2, 3, 4)
#: Versions that are binary frames.
FRAME_VERSIONS = (3, 4)
#: Versions that are JSON documents (:meth:`Delta.from_dict`).
JSON_VERSIONS = (1, 2)
#: Record kind of a delta frame.
KIND = b"D"
#: Whether a binary payload is zlib-compressed (level 1): about 4x fewer bytes on the topic (version 4: 37.5
#: against 161 bytes per input record) for CPU ``python -m benchmarks.bench_cluster`` cannot tell from its noise;
#: the broker's own ``compression.type`` may do it instead.
COMPRESS = True
#: A time older than every tier's bounds: :meth:`TieredRing.add` puts a bucket given this time in the archive.
_ARCHIVE_TIME = -1e300


class DeltaError(ValueError):
    """A deltas-topic record that is not a valid delta (one line naming the field); ``reason`` is one of
    :data:`calmon.cluster.records.REASONS`."""

    def __init__(self, message: str, reason: str = "schema") -> None:
        super().__init__(message)
        self.reason = reason


_Count = Annotated[int, msgspec.Meta(ge=0)]
#: Names as the decoder admits them (``calmon.events.checks.NAME_RE``: at most 128 characters).
_Name = Annotated[str, msgspec.Meta(pattern=r"^[A-Za-z0-9_.:/\-]{1,128}$")]


class DeltaBucketDoc(msgspec.Struct):
    """One bucket of a delta document (``start`` null in the archive, tier -1)."""

    segment: Annotated[str, msgspec.Meta(max_length=128)]
    tier: Annotated[int, msgspec.Meta(ge=-1)]
    start: float | None
    bucket: dict[str, Any]  #: a ``calmon.bucket`` document, checked by :meth:`BucketStats.from_dict`


class FrameBucketDoc(msgspec.Struct, array_like=True):
    """One bucket of a version-3 header: ``[segment, tier, start, parts]``, ``parts`` the bucket's small fields
    with references into the record's arrays table (:meth:`BucketStats.to_parts`)."""

    segment: Annotated[str, msgspec.Meta(max_length=128)]
    tier: Annotated[int, msgspec.Meta(ge=-1)]
    start: float | None
    parts: dict[str, Any]


_Dims = Annotated[list[Annotated[int, msgspec.Meta(ge=0, le=MAX_RECORD)]], msgspec.Meta(max_length=4)]


class _RangeDoc(msgspec.Struct):
    """The fields every delta record carries, whatever its version: one range of one input partition for one
    model (decoded by key, so the subclasses' field order is free)."""

    source: Annotated[str, msgspec.Meta(max_length=1000)]
    start: int
    end: int
    model: _Name
    classes: Annotated[int, msgspec.Meta(ge=2)]
    watermark: float
    #: the event kinds the ingest stage counts (a forged kind would be a new label value)
    events: dict[Literal["prediction", "outcome", "labeled"], _Count]
    late: _Count


class FrameHeaderDoc(_RangeDoc):
    """The JSON header of a version-3 delta frame: the range's fields, the arrays table and the buckets."""

    arrays: list[tuple[Literal["<i8", "<f8"], _Dims]]
    buckets: list[FrameBucketDoc]
    #: references of the range's labeled pairs (event time, score, outcome; :mod:`calmon.cluster.changes`)
    pairs: tuple[int, int, int] | None = None


_Ref = Annotated[int, msgspec.Meta(ge=0)]


class TableHeaderDoc(_RangeDoc):
    """The JSON header of a version-4 delta frame: the range's fields, the arrays table and the
    :class:`DeltaTable`'s small fields and array references."""

    arrays: list[tuple[Literal["<i8", "<f8"], _Dims]]
    #: the buckets' grids (:data:`~calmon.state.buckets.Layout`); null only when there is no bucket
    layout: tuple[_Ref, _Ref, _Ref, _Ref] | None
    #: the reservoirs' capacity (0: none)
    capacity: _Ref
    segments: Annotated[list[Annotated[str, msgspec.Meta(max_length=128)]], msgspec.Meta(max_length=1 << 16)]
    #: references of the index ``(5, buckets)``, the starts, the cells, their sums and the reservoir rows
    table: tuple[_Ref, _Ref, _Ref, _Ref, _Ref]
    pairs: tuple[int, int, int] | None = None


class DeltaDoc(_RangeDoc):
    """A delta document of version 1 or 2 (:meth:`Delta.to_dict`); keys not listed are allowed."""

    format: str
    version: int
    buckets: list[DeltaBucketDoc]


class DeltaBucket:
    """The statistics one range added to one bucket of one segment's ring (``tier`` -1: the archive).

    Built by the ingest stage with its :class:`BucketStats`; decoded from a binary record as a
    :class:`~calmon.state.buckets.BucketPart` (read-only views of the record's payload), which
    :func:`merge_delta` adds straight into the ring's buckets -- :attr:`bucket` is then built on first use only.
    """

    __slots__ = ("segment", "tier", "start", "_bucket", "part")

    def __init__(self, segment: str, tier: int, start: float, bucket: BucketStats | None = None,
                 part: BucketPart | None = None) -> None:
        if (bucket is None) == (part is None):
            raise ValueError("a delta bucket needs its statistics or their part, and not both")
        self.segment, self.tier, self.start = segment, tier, start
        self._bucket, self.part = bucket, part

    @property
    def bucket(self) -> BucketStats:
        """The bucket's statistics (built from :attr:`part` on first use)."""
        if self._bucket is None:
            assert self.part is not None
            self._bucket = BucketStats.from_part(self.part)
        return self._bucket

    def shape(self) -> tuple[int, int, int]:
        """(classes, fine-grid bins, reliability bins)."""
        if self.part is not None:
            return self.part.shape()
        b = self.bucket
        return b.stats.classes, b.stats.fine.bins, b.rel.bins

    def to_dict(self) -> dict[str, Any]:
        return {"segment": self.segment, "tier": self.tier,
                "start": None if self.tier == ARCHIVE_TIER else self.start, "bucket": self.bucket.to_packed()}


#: Rows of :attr:`DeltaTable.index`.
_SEG, _TIER, _CELL_END, _ROW_END, _SEEN = range(5)


@dataclass(frozen=True)
class DeltaTable:
    """A delta's buckets as one set of arrays (format 4): per bucket its segment (an index into
    :attr:`segments`), tier and start, and its statistics as a :class:`~calmon.state.buckets.CellTable` (sorted
    cells on the combined cell axis of :attr:`layout` with their sums, reservoir rows and events seen).

    Built by the ingest stage from the range's fresh rings with one aggregation per model
    (:func:`~calmon.state.buckets.cell_table`); decoded from a record as views of its payload, checked whole
    (:meth:`check`) before anything is merged; merged bucket by bucket as pending cells
    (:meth:`BucketStats.merge_cells`), summed at the target bucket's next read.
    """

    segments: list[str]
    layout: tuple[int, int, int, int] | None
    capacity: int
    #: ``(5, buckets)`` int64: segment index, tier, end of its cells, end of its rows, events seen
    index: np.ndarray
    #: bucket start times (the archive's is not read)
    starts: np.ndarray
    cells: CellTable

    @classmethod
    def of(cls, buckets: list[DeltaBucket]) -> DeltaTable:
        """The table of extracted buckets (their statistics read, not changed)."""
        segments = list(dict.fromkeys(b.segment for b in buckets))
        if not buckets:
            empty = np.zeros(0, dtype=np.int64)
            return cls(segments, None, 0, np.zeros((5, 0), dtype=np.int64), np.zeros(0),
                       CellTable(empty, empty, np.zeros((6, 0), dtype=np.int64), empty, np.zeros((0, 2)), empty))
        states = [b.bucket for b in buckets]
        layout = states[0].layout()
        capacity, width, _ = states[0].sampling()
        cells = cell_table(states, layout, capacity, width)
        number = {s: k for k, s in enumerate(segments)}
        index = np.empty((5, len(buckets)), dtype=np.int64)
        index[_SEG] = [number[b.segment] for b in buckets]
        index[_TIER] = [b.tier for b in buckets]
        index[_CELL_END], index[_ROW_END], index[_SEEN] = cells.cell_end, cells.row_end, cells.seen
        starts = np.array([0.0 if b.tier == ARCHIVE_TIER else b.start for b in buckets])
        return cls(segments, layout, capacity, index, starts, cells)

    def __len__(self) -> int:
        return int(self.index.shape[1])

    def check(self, classes: int) -> None:
        """Raise ``ValueError`` naming the first inconsistency (the record is refused whole): indices inside
        their arrays, each bucket's cells sorted, unique and on the axis of :attr:`layout`, counts positive,
        its rows a sample of its events as a reservoir of :attr:`capacity` keeps it, finite rows and starts."""
        n = len(self)
        t = self.cells
        if not n:
            if t.cells.size or t.rows.size:
                raise ValueError("cells or rows without a bucket")
            return
        if self.layout is None or self.layout[2] != classes or min(self.layout) < 1:
            raise ValueError(f"layout {self.layout} does not fit a model of {classes} classes")
        seg, tier, cell_end, row_end, seen = self.index
        if int(seg.min()) < 0 or int(seg.max()) >= len(self.segments):
            raise ValueError("a bucket's segment is not in the segments list")
        if int(tier.min()) < ARCHIVE_TIER:
            raise ValueError(f"a bucket's tier is below {ARCHIVE_TIER}")
        if not np.isfinite(self.starts[tier != ARCHIVE_TIER]).all():
            raise ValueError("a bucket outside the archive has no finite start")
        for name, end, total in (("cells", cell_end, t.cells.size), ("rows", row_end, t.rows.shape[0])):
            if int(end[0]) < 0 or (n > 1 and int(np.diff(end).min()) < 0) or int(end[-1]) != total:
                raise ValueError(f"bucket ends of the {name} must rise from 0 to {total}")
        length = axis(self.layout)[-1]
        if t.cells.size:
            if int(t.cells.min()) < 0 or int(t.cells.max()) >= length:
                raise ValueError(f"a cell is outside the combined axis of {length} cells")
            down = np.flatnonzero(t.cells[1:] <= t.cells[:-1]) + 1  # allowed only where a bucket starts
            if down.size:
                starts = np.zeros(t.cells.size + 1, dtype=bool)
                starts[cell_end] = True
                if not starts[down].all():
                    raise ValueError("a bucket's cells are not sorted and unique")
            if int(t.sums[0].min()) < 1:
                raise ValueError("a cell's count is not positive")
        kept = np.diff(row_end, prepend=0)
        if not np.array_equal(kept, np.minimum(seen, self.capacity)):
            raise ValueError(f"a bucket's rows are not the sample a reservoir of {self.capacity} keeps of its events")
        if not np.isfinite(t.rows).all():
            raise ValueError("a reservoir row is not finite")


@dataclass
class Delta:
    """What the records ``[start, end)`` of input partition ``source`` added to model ``model``.

    Examples
    --------
    >>> import numpy as np
    >>> mw = ModelWindows("m", 2, [(60, 5), (600, 3)], bins=64, reservoir=8)
    >>> mw.add(np.array([5.0, 70.0]), np.array(["a", "a"], dtype=object), np.array([1, 0]),
    ...        np.array([0.9, 0.3]), None, 70.0)
    >>> d = extract_deltas("events/0", 0, 2, 70.0, {"m": mw}, Counters())[0]
    >>> e = Delta.from_bytes(d.to_bytes())
    >>> (e.source, e.start, e.end, e.model, len(e.table), e.table.starts.tolist(), e.table.cells.seen.tolist())
    ('events/0', 0, 2, 'm', 2, [0.0, 60.0], [1, 1])
    >>> target = ModelWindows("m", 2, [(60, 5), (600, 3)], bins=64, reservoir=8)
    >>> merge_delta(target, e); target.rings["all"].window_sum(None).count
    2
    """

    source: str
    start: int
    end: int
    model: str
    classes: int
    watermark: float
    buckets: list[DeltaBucket]
    #: events accepted per kind (``prediction``, ``outcome``, ``labeled``) and labeled events dropped as late
    events: dict[str, int] = field(default_factory=dict)
    late: int = 0
    #: the range's labeled pairs of this model in record order, for the change detectors (versions 3 and 4)
    pairs: Pairs | None = None
    #: the buckets as one table (a decoded version-4 record; :attr:`buckets` is then empty)
    table: DeltaTable | None = None

    def to_dict(self) -> dict[str, Any]:
        """The version-2 document (a delta decoded from a version-4 record has no bucket objects to write)."""
        if self.table is not None:
            raise ValueError("a decoded version-4 delta is written as version 4 only")
        return {"format": FORMAT, "version": JSON_VERSIONS[-1], "source": self.source, "start": self.start,
                "end": self.end, "model": self.model, "classes": self.classes, "watermark": self.watermark,
                "buckets": [b.to_dict() for b in self.buckets], "events": dict(self.events), "late": self.late}

    def to_bytes(self, version: int = VERSION, compress: bool | None = None) -> bytes:
        """The record value on the deltas topic: a binary frame (version 4, the table; version 3 for a model with
        level sets or when asked; see the module docstring; its payload zlib-compressed if ``compress``, default
        :data:`COMPRESS`), or a JSON document of version 2 or 1 as older ingest workers wrote them (tests and
        benchmarks of the upgrade)."""
        compress = COMPRESS if compress is None else compress
        if version == 4 and (self.table is not None or not self._levelsets()):
            return self._table_frame(compress)
        if self.table is not None:
            raise ValueError(f"a decoded version-4 delta is written as version 4 only, not {version}")
        if version in FRAME_VERSIONS:  # (4: a model with level sets, which a table does not carry)
            return self._frame(compress)
        doc = self.to_dict()
        if version == 1:
            doc["version"] = 1
            for b, db in zip(doc["buckets"], self.buckets):
                b["bucket"] = db.bucket.to_dict()
        elif version != 2:
            raise ValueError(f"delta version {version} cannot be written (1, 2, 3 or 4)")
        return json.dumps(doc, separators=(",", ":"), allow_nan=False).encode()

    def _levelsets(self) -> bool:
        return bool(self.buckets) and self.buckets[0].bucket.sampling()[2]

    def _range_header(self, packer: Packer) -> dict[str, Any]:
        pairs = None if self.pairs is None else [packer.put(self.pairs.ts, "<f8"), packer.put(self.pairs.p, "<f8"),
                                                  packer.put(self.pairs.y, "<f8")]
        return {"source": self.source, "start": self.start, "end": self.end, "model": self.model,
                "classes": self.classes, "watermark": self.watermark, "events": self.events, "late": self.late,
                "pairs": pairs}

    def _table_frame(self, compress: bool) -> bytes:
        t = self.table if self.table is not None else DeltaTable.of(self.buckets)
        packer = Packer()
        refs = [packer.put(t.index, "<i8"), packer.put(t.starts, "<f8"), packer.put(t.cells.cells, "<i8"),
                packer.put(t.cells.sums, "<i8"), packer.put(t.cells.rows, "<f8")]
        header = self._range_header(packer)
        table, payload = packer.raw()
        header.update(arrays=table, layout=t.layout, capacity=t.capacity, segments=t.segments, table=refs)
        return pack_frame(KIND, 4, msgspec.json.encode(header), payload, compress)

    def _frame(self, compress: bool) -> bytes:
        packer = Packer()
        buckets = [(b.segment, b.tier, None if b.tier == ARCHIVE_TIER else b.start, b.bucket.to_parts(packer))
                   for b in self.buckets]
        header = self._range_header(packer)
        table, payload = packer.raw()
        header.update(arrays=table, buckets=buckets)
        return pack_frame(KIND, 3, msgspec.json.encode(header), payload, compress)

    @classmethod
    def _from_frame(cls, data: bytes) -> Delta:
        if len(data) > 4 and data[4] == 4:
            return cls._from_table_frame(data)
        docs: list[FrameHeaderDoc] = []
        try:
            frame = unpack_frame(data, KIND, FRAME_VERSIONS, _header_reader(FrameHeaderDoc, docs), "delta record")
            doc = docs[0]
            unpacker = Unpacker.of(doc.arrays, frame.payload)  # its (dtype, dims) pairs as they are
        except BadRecord as exc:
            raise DeltaError(str(exc), exc.reason) from None
        except ValueError as exc:
            raise DeltaError(f"delta arrays: {exc}", "format") from None
        try:
            buckets = [DeltaBucket(b.segment, b.tier, _start(b.tier, b.start),
                                   part=BucketStats.read_part(b.parts, unpacker)) for b in doc.buckets]
        except (KeyError, TypeError, ValueError, AttributeError, IndexError, RecursionError) as exc:
            raise DeltaError(f"malformed bucket: {type(exc).__name__}: {exc}") from None
        return cls._checked(cls(doc.source, doc.start, doc.end, doc.model, doc.classes, doc.watermark, buckets,
                                {str(k): n for k, n in doc.events.items()}, doc.late,
                                cls._pairs(doc.pairs, unpacker)))

    @classmethod
    def _from_table_frame(cls, data: bytes) -> Delta:
        docs: list[TableHeaderDoc] = []
        try:
            frame = unpack_frame(data, KIND, FRAME_VERSIONS, _header_reader(TableHeaderDoc, docs), "delta record")
            doc = docs[0]
            unpacker = Unpacker.of(doc.arrays, frame.payload)
        except BadRecord as exc:
            raise DeltaError(str(exc), exc.reason) from None
        except ValueError as exc:
            raise DeltaError(f"delta arrays: {exc}", "format") from None
        width = 2 if doc.classes == 2 else doc.classes + 1
        try:
            index_ref, starts_ref, cells_ref, sums_ref, rows_ref = doc.table
            index = unpacker.get(index_ref, "<i8")
            n = index.shape[1] if index.ndim == 2 and index.shape[0] == 5 else -1
            if n < 0:
                raise ValueError(f"the index has shape {list(index.shape)}, expected [5, buckets]")
            cells = unpacker.get(cells_ref, "<i8")
            if cells.ndim != 1:
                raise ValueError(f"the cells have shape {list(cells.shape)}, expected [cells]")
            rows = unpacker.get(rows_ref, "<f8")
            if rows.ndim != 2 or rows.shape[1] != width:
                raise ValueError(f"the rows have shape {list(rows.shape)}, expected [rows, {width}]")
            table = DeltaTable(list(doc.segments), doc.layout, doc.capacity, index,
                               unpacker.get(starts_ref, "<f8", (n,)),
                               CellTable(index[_CELL_END], cells, unpacker.get(sums_ref, "<i8", (6, cells.size)),
                                         index[_ROW_END], rows, index[_SEEN]))
        except ValueError as exc:
            raise DeltaError(f"malformed table: {exc}") from None
        try:
            table.check(doc.classes)
        except ValueError as exc:
            raise DeltaError(f"table: {exc}", "invalid") from None
        return cls._checked(cls(doc.source, doc.start, doc.end, doc.model, doc.classes, doc.watermark, [],
                                {str(k): n for k, n in doc.events.items()}, doc.late,
                                cls._pairs(doc.pairs, unpacker), table))

    @staticmethod
    def _pairs(refs: tuple[int, int, int] | None, unpacker: Unpacker) -> Pairs | None:
        if refs is None:
            return None
        try:
            pairs = Pairs(*(unpacker.get(ref, "<f8", writable=True) for ref in refs))
        except ValueError as exc:
            raise DeltaError(f"malformed pairs: {exc}") from None
        try:
            pairs.check()
        except ValueError as exc:
            raise DeltaError(f"pairs: {exc}", "invalid") from None
        return pairs

    @classmethod
    def from_bytes(cls, data: bytes) -> Delta:
        """Parse and check a record value; :class:`DeltaError` names what is wrong."""
        if data is None:
            raise DeltaError("no value (a tombstone)", "format")
        if len(data) > MAX_RECORD:
            raise DeltaError(f"{len(data)} bytes, over the {MAX_RECORD}-byte limit", "too_large")
        if is_frame(data):
            return cls._from_frame(data)
        try:
            doc = msgspec.json.decode(data, type=DeltaDoc)  # one pass: parsed and checked
        except msgspec.ValidationError:
            doc = None  # parsed again below, to name the problem
        except (msgspec.DecodeError, UnicodeDecodeError, TypeError, RecursionError) as exc:
            raise DeltaError(f"not JSON: {exc}", "not_json") from None  # (invalid UTF-8 in a key: UnicodeDecodeError)
        if doc is None:
            try:
                parsed = json.loads(data)
            except (ValueError, RecursionError) as exc:
                raise DeltaError(f"not JSON: {exc}", "not_json") from None
            return cls.from_dict(parsed)
        return cls._from_doc(doc)

    @classmethod
    def from_dict(cls, doc: Any) -> Delta:
        """Check a parsed record value (:class:`DeltaDoc`); :class:`DeltaError` names what is wrong."""
        if not isinstance(doc, dict) or doc.get("format") != FORMAT:
            raise DeltaError(f"not a {FORMAT} document", "format")
        _readable(doc.get("version"))
        try:
            return cls._from_doc(convert(doc, DeltaDoc))
        except SchemaError as exc:
            if exc.why == "missing":
                raise DeltaError(f"missing field {exc.field!r}") from None
            raise DeltaError(f"malformed {exc}") from None

    @classmethod
    def _from_doc(cls, doc: DeltaDoc) -> Delta:
        if doc.format != FORMAT:
            raise DeltaError(f"not a {FORMAT} document", "format")
        _readable(doc.version)
        try:
            buckets = [_bucket(b) for b in doc.buckets]
        except (KeyError, TypeError, ValueError, AttributeError, IndexError, RecursionError) as exc:
            raise DeltaError(f"malformed field: {exc}") from None
        return cls._checked(cls(doc.source, doc.start, doc.end, doc.model, doc.classes, doc.watermark, buckets,
                                {str(k): n for k, n in doc.events.items()}, doc.late))

    @staticmethod
    def _checked(out: Delta) -> Delta:
        """``out`` if its fields make sense (``invalid`` otherwise)."""
        if not 0 <= out.start < out.end:
            raise DeltaError(f"range [{out.start}, {out.end}) is empty or negative", "invalid")
        if not math.isfinite(out.watermark):
            raise DeltaError("watermark must be finite", "invalid")
        for b in out.buckets:
            if b.tier != ARCHIVE_TIER and not math.isfinite(b.start):
                raise DeltaError(f"a bucket of tier {b.tier} starts at {b.start}", "invalid")
        return out


def _readable(version: Any) -> None:
    if type(version) is not int or version not in JSON_VERSIONS:
        raise DeltaError(f"version {version!r:.20} is not supported (this calmon reads versions "
                         f"{', '.join(map(str, READABLE))}): upgrade the evaluators before the ingest workers",
                         "version")


def _bucket(d: DeltaBucketDoc) -> DeltaBucket:
    return DeltaBucket(d.segment, d.tier, _start(d.tier, d.start), BucketStats.from_dict(d.bucket))


def _start(tier: int, start: float | None) -> float:
    """A bucket's start time (the archive's is infinite; every other tier needs one)."""
    if tier == ARCHIVE_TIER:
        return math.inf
    if start is None:
        raise ValueError(f"a bucket of tier {tier} needs a start")
    return start


def extract_deltas(source: str, start: int, end: int, watermark: float, models: Mapping[str, ModelWindows],
                   counters: Counters, pairs: Mapping[str, Pairs] | None = None) -> list[Delta]:
    """One :class:`Delta` per model of ``models`` (fresh rings holding one range) or of ``counters``, with the
    model's labeled pairs of the range (``pairs``, for the change detectors) if any.

    Models with neither buckets nor counted events give no delta.
    """
    pairs = pairs or {}
    events: dict[str, dict[str, int]] = {}
    for (model, kind), n in counters.events.items():
        if model:
            events.setdefault(model, {})[kind] = n
    out = []
    for name in sorted(set(models) | set(events) | set(counters.late)):
        mw = models.get(name)
        buckets = [] if mw is None else [DeltaBucket(seg, tier, key, state) for seg, ring in mw.rings.items()
                                         for tier, key, _version, state in ring.entries()]
        classes = mw.classes if mw is not None else 2
        out.append(Delta(source, start, end, name, classes, watermark, buckets, events.get(name, {}),
                         counters.late.get(name, 0), pairs.get(name)))
    return out


def check_fits(windows: ModelWindows, delta: Delta) -> None:
    """Check that every bucket of ``delta`` fits the model's rings -- a configured segment, the model's
    classes, bins and grids -- before any is merged (a delta is merged whole or not at all).

    Raises
    ------
    DeltaError
        ``unknown_segment`` (the stages run with different ``models``, or a forged segment) or ``incompatible``.
    """
    p = windows.params
    blank = windows.factory()
    if delta.classes != windows.classes:
        raise DeltaError(f"model {delta.model!r} has {windows.classes} classes here, the delta {delta.classes}",
                         "incompatible")
    if delta.table is not None:
        _check_table(windows, delta)
    for b in delta.buckets:
        if b.segment not in windows.rings:
            raise DeltaError(f"segment {b.segment!r} of model {delta.model!r} is not configured here "
                             f"(segments {sorted(windows.rings)}): run both stages with the same models section",
                             "unknown_segment")
        shape = b.shape()
        want = (windows.classes, p["bins"], p["reliability_bins"])
        if shape != want:
            raise DeltaError(f"a bucket of model {delta.model!r} has (classes, bins, reliability bins) {shape}, "
                             f"the model {want}: run both stages with the same models section", "incompatible")
        if b.part is not None:  # every grid and the reservoir's width, so that the direct merge cannot stop halfway
            try:
                blank.check_part(b.part)
            except ValueError as exc:
                raise DeltaError(f"a bucket of model {delta.model!r}: {exc}", "incompatible") from None


def _check_table(windows: ModelWindows, delta: Delta) -> None:
    """:func:`check_fits` of a version-4 table: its segments, grids, reservoir and no level sets."""
    t = delta.table
    assert t is not None
    if not len(t):
        return
    p = windows.params
    for s in t.segments:
        if s not in windows.rings:
            raise DeltaError(f"segment {s!r} of model {delta.model!r} is not configured here "
                             f"(segments {sorted(windows.rings)}): run both stages with the same models section",
                             "unknown_segment")
    if t.layout != windows.layout():
        raise DeltaError(f"the buckets of model {delta.model!r} have grids (bins, ECE bins, classes, reliability "
                         f"bins) {t.layout}, the model {windows.layout()} (bins {p['bins']}): run both stages with "
                         f"the same models section", "incompatible")
    if windows.factory().sampling()[2]:
        raise DeltaError(f"model {delta.model!r} keeps level sets, which a version-4 delta does not carry",
                         "incompatible")


def merge_delta(windows: ModelWindows, delta: Delta) -> None:
    """Add a delta's buckets to a model's rings (exact; see the module docstring for why order does not matter).

    The buckets of one segment are placed at once, at the delta's watermark (one vectorised placement per
    ring, :meth:`~calmon.state.windows.TieredRing.add`); a decoded binary delta's buckets are added straight
    from their views (:meth:`BucketStats.merge_part`: no bucket built per delta bucket).

    Raises
    ------
    DeltaError
        The delta does not fit the model (:func:`check_fits`); nothing was merged.
    """
    check_fits(windows, delta)
    if delta.table is not None:
        _merge_table(windows, delta.table, delta.watermark)
        return
    by_segment: dict[str, list[DeltaBucket]] = {}
    for b in delta.buckets:
        by_segment.setdefault(b.segment, []).append(b)
    for segment, buckets in by_segment.items():
        at = np.array([_ARCHIVE_TIME if b.tier == ARCHIVE_TIER else b.start for b in buckets])
        windows.rings[segment].add(at, _merger(buckets), watermark=delta.watermark)


def _merger(buckets: list[DeltaBucket]) -> Callable[[BucketStats, np.ndarray], None]:
    def merge(state: BucketStats, idx: np.ndarray) -> None:
        for i in idx.tolist():
            b = buckets[i]
            if b.part is not None:
                state.merge_part(b.part)
            else:
                state.merge(b.bucket)
    return merge


def _merge_table(windows: ModelWindows, table: DeltaTable, watermark: float) -> None:
    """Place a table's buckets segment by segment (one :meth:`TieredRing.add` each) and hand each target bucket
    its cells (:meth:`BucketStats.merge_cells`: pending until its next read)."""
    seg, tier = table.index[_SEG], table.index[_TIER]
    at = np.where(tier == ARCHIVE_TIER, _ARCHIVE_TIME, table.starts)
    t = table.cells
    cell_end, row_end, seen = t.cell_end.tolist(), t.row_end.tolist(), t.seen.tolist()
    cells, sums, rows, capacity = t.cells, t.sums, t.rows, table.capacity

    for k, name in enumerate(table.segments):
        mine = np.flatnonzero(seg == k) if len(table.segments) > 1 else np.arange(len(table))
        if not mine.size:
            continue
        order = mine.tolist()

        def merge(state: BucketStats, idx: np.ndarray, order: list[int] = order) -> None:
            for j in idx.tolist():
                i = order[j]
                a, r = (cell_end[i - 1], row_end[i - 1]) if i else (0, 0)
                b = cell_end[i]
                state.merge_cells(cells[a:b], sums[:, a:b], rows[r:row_end[i]], seen[i], capacity)

        windows.rings[name].add(at[mine], merge, watermark=watermark)


_Header = TypeVar("_Header", FrameHeaderDoc, TableHeaderDoc)


def _header_reader(doc_type: type[_Header], docs: list[_Header]) -> Callable[[bytes], int]:
    """The ``expected`` callback of :func:`unpack_frame` for a delta: the header decoded as ``doc_type`` (appended
    to ``docs``) and the payload bytes its ``arrays`` table declares; a header that is not JSON or not the schema
    is a :class:`BadRecord` with its reason."""
    def expected(header: bytes) -> int:
        try:
            doc = msgspec.json.decode(header, type=doc_type)
        except msgspec.ValidationError as exc:
            raise BadRecord("schema", f"delta header: {exc}") from None
        except (msgspec.DecodeError, UnicodeDecodeError, RecursionError) as exc:
            raise BadRecord("not_json", f"delta header is not JSON: {exc}") from None
        docs.append(doc)
        words = 0
        for _, dims in doc.arrays:  # (a loop: hundreds of arrays a record)
            words += math.prod(dims)
        return 8 * words

    return expected
