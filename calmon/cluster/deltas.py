"""Statistic deltas: what the ingest stage publishes per (input range, model), and how an evaluator merges them.

A delta is the binned statistics that one range ``[start, end)`` of one input partition added to one
model: for each (segment, tier, bucket start) of the model's event-time rings, the
:class:`~calmon.state.buckets.BucketStats` of exactly those events (its *packed* JSON document,
:meth:`~calmon.state.buckets.BucketStats.to_packed`: the arrays in one zlib payload; no pickle), plus
the partition's watermark after the range and the event counts.  The ingest stage builds it by
applying the range to *fresh* rings at the partition's watermark, so a bucket of tier ``t`` holds events
that were too old for every finer tier at that watermark.

Merging is exact and order-free: the statistics are integer sums (fixed-point grids) merged by
addition, and :func:`merge_delta` places each delta bucket with the ring's own ``add`` at the
bucket's start time, which lands it in the finest tier whose bounds still accept it.  Bounds only
move forward with the watermark, so a bucket placed at a lower watermark lies where rolling would
have put its events anyway: after every ring is advanced to the same watermark, rings built from
deltas in any order equal the single-process agent's (reservoir *samples* aside: those depend on
arrival order, their counts do not).
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Annotated, Any, Literal

import msgspec
import numpy as np

from calmon.cluster.records import MAX_RECORD
from calmon.state.buckets import BucketStats, ModelWindows
from calmon.state.checkpoint.schema import SchemaError, convert
from calmon.state.counters import Counters
from calmon.state.windows import ARCHIVE_TIER

__all__ = ["Delta", "DeltaBucket", "DeltaError", "extract_deltas", "merge_delta", "check_fits", "FORMAT", "VERSION",
           "READABLE"]

FORMAT = "calmon.delta"
#: Version written: 2 = bucket documents packed (:meth:`BucketStats.to_packed`), one zlib stream per bucket
#: instead of one per array (about 4x cheaper to write and read).  Version 1 (every array packed on its own,
#: :meth:`BucketStats.to_dict`) has the same layout and is still read: deltas already in the topic stay valid.
VERSION = 2
#: Versions :meth:`Delta.from_dict` reads.
READABLE = (1, 2)
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


class DeltaDoc(msgspec.Struct):
    """A delta document (:meth:`Delta.to_dict`); keys not listed are allowed."""

    format: str
    version: int
    source: Annotated[str, msgspec.Meta(max_length=1000)]
    start: int
    end: int
    model: _Name
    classes: Annotated[int, msgspec.Meta(ge=2)]
    watermark: float
    buckets: list[DeltaBucketDoc]
    #: the event kinds the ingest stage counts (a forged kind would be a new label value)
    events: dict[Literal["prediction", "outcome", "labeled"], _Count]
    late: _Count


@dataclass(frozen=True)
class DeltaBucket:
    """The statistics one range added to one bucket of one segment's ring (``tier`` -1: the archive)."""

    segment: str
    tier: int
    start: float
    bucket: BucketStats

    def to_dict(self) -> dict[str, Any]:
        return {"segment": self.segment, "tier": self.tier,
                "start": None if self.tier == ARCHIVE_TIER else self.start, "bucket": self.bucket.to_packed()}


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
    >>> (e.source, e.start, e.end, e.model, [(b.tier, b.start, b.bucket.count) for b in e.buckets])
    ('events/0', 0, 2, 'm', [(0, 0.0, 1), (0, 60.0, 1)])
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

    def to_dict(self) -> dict[str, Any]:
        return {"format": FORMAT, "version": VERSION, "source": self.source, "start": self.start, "end": self.end,
                "model": self.model, "classes": self.classes, "watermark": self.watermark,
                "buckets": [b.to_dict() for b in self.buckets], "events": dict(self.events), "late": self.late}

    def to_bytes(self) -> bytes:
        """Compact JSON (the record value on the deltas topic)."""
        return json.dumps(self.to_dict(), separators=(",", ":"), allow_nan=False).encode()

    @classmethod
    def from_bytes(cls, data: bytes) -> Delta:
        """Parse and check a record value; :class:`DeltaError` names what is wrong."""
        if data is None:
            raise DeltaError("no value (a tombstone)", "format")
        if len(data) > MAX_RECORD:
            raise DeltaError(f"{len(data)} bytes, over the {MAX_RECORD}-byte limit", "too_large")
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
        out = cls(doc.source, doc.start, doc.end, doc.model, doc.classes, doc.watermark, buckets,
                  {str(k): n for k, n in doc.events.items()}, doc.late)
        if not 0 <= out.start < out.end:
            raise DeltaError(f"range [{out.start}, {out.end}) is empty or negative", "invalid")
        if not math.isfinite(out.watermark):
            raise DeltaError("watermark must be finite", "invalid")
        for b in buckets:
            if b.tier != ARCHIVE_TIER and not math.isfinite(b.start):
                raise DeltaError(f"a bucket of tier {b.tier} starts at {b.start}", "invalid")
        return out


def _readable(version: Any) -> None:
    if type(version) is not int or version not in READABLE:
        raise DeltaError(f"version {version!r:.20} is not supported (this calmon reads versions "
                         f"{', '.join(map(str, READABLE))}): upgrade the evaluators before the ingest workers",
                         "version")


def _bucket(d: DeltaBucketDoc) -> DeltaBucket:
    if d.tier == ARCHIVE_TIER:
        start = math.inf
    elif d.start is None:
        raise ValueError(f"a bucket of tier {d.tier} needs a start")
    else:
        start = d.start
    return DeltaBucket(d.segment, d.tier, start, BucketStats.from_dict(d.bucket))


def extract_deltas(source: str, start: int, end: int, watermark: float, models: Mapping[str, ModelWindows],
                   counters: Counters) -> list[Delta]:
    """One :class:`Delta` per model of ``models`` (fresh rings holding one range) or of ``counters``.

    Models with neither buckets nor counted events give no delta.
    """
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
                         counters.late.get(name, 0)))
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
    if delta.classes != windows.classes:
        raise DeltaError(f"model {delta.model!r} has {windows.classes} classes here, the delta {delta.classes}",
                         "incompatible")
    for b in delta.buckets:
        if b.segment not in windows.rings:
            raise DeltaError(f"segment {b.segment!r} of model {delta.model!r} is not configured here "
                             f"(segments {sorted(windows.rings)}): run both stages with the same models section",
                             "unknown_segment")
        got = b.bucket.stats
        shape = (got.classes, got.fine.bins, b.bucket.rel.bins)
        want = (windows.classes, p["bins"], p["reliability_bins"])
        if shape != want:
            raise DeltaError(f"a bucket of model {delta.model!r} has (classes, bins, reliability bins) {shape}, "
                             f"the model {want}: run both stages with the same models section", "incompatible")


def merge_delta(windows: ModelWindows, delta: Delta) -> None:
    """Add a delta's buckets to a model's rings (exact; see the module docstring for why order does not matter).

    Raises
    ------
    DeltaError
        The delta does not fit the model (:func:`check_fits`); nothing was merged.
    """
    check_fits(windows, delta)
    for b in delta.buckets:
        at = _ARCHIVE_TIME if b.tier == ARCHIVE_TIER else b.start
        windows.rings[b.segment].add(np.array([at]), _merger(b.bucket), watermark=delta.watermark)


def _merger(bucket: BucketStats) -> Callable[[BucketStats, np.ndarray], None]:
    def merge(state: BucketStats, _idx: np.ndarray) -> None:
        state.merge(bucket)
    return merge
