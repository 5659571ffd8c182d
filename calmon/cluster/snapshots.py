"""Evaluator snapshots: one record per model on a compacted topic, so a new owner restores without a full replay.

A :class:`ModelSnapshot` is everything an evaluator holds about one model: its windows (rings of
*packed* bucket documents, :meth:`~calmon.state.buckets.BucketStats.to_packed`; no pickle), its event
and late counters, its de-duplication entries (the end of the last range applied per input partition)
and the deltas offset ``o_m`` it covers: every delta of that model below ``o_m`` in its deltas
partition is in it.  It is written to the snapshots partition equal to the model's deltas partition.

After a round of model records, a :class:`Manifest` record (key ``"\\x00manifest"``) names every model
the partition held at deltas offset ``M``: a model absent from it has no delta below ``M``.  A new
owner reads the partition, keeps each key's latest record and seeks the deltas partition to
:func:`restore_start` = ``min(M, min o_m)`` (0 without a manifest).  While replaying, :func:`keep_delta`
drops a delta of model ``m`` below ``o_m``; the de-duplication by range end makes the rest exact.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

import msgspec

from calmon.state.buckets import BucketStats, ModelWindows
from calmon.state.checkpoint.schema import ModelDoc, SchemaError, convert

__all__ = ["FORMAT", "VERSION", "MANIFEST_KEY", "MAX_RECORD", "MAX_SNAPSHOT", "Manifest", "ModelSnapshot",
           "SnapshotError",
           "copy_windows", "keep_delta", "restore_start"]

FORMAT = "calmon.snapshot"
VERSION = 1
MANIFEST_KEY = b"\x00manifest"
#: Largest record value read or written (the internal producer's ``max_request_size``); a model snapshot larger
#: than :data:`calmon.cluster.snapshot_store.CHUNK` is written as several chunk records.
MAX_RECORD = 16 << 20
#: Largest model snapshot (reassembled from its chunks): a bound on what a restore holds in memory at once.
MAX_SNAPSHOT = 256 << 20


class SnapshotError(ValueError):
    """A snapshots-topic record that cannot be read, or a snapshot too large to write (one line); ``reason`` is
    one of :data:`calmon.cluster.records.REASONS`."""

    def __init__(self, message: str, reason: str = "schema") -> None:
        super().__init__(message)
        self.reason = reason


class SnapshotDoc(msgspec.Struct):
    """A model snapshot record (keys not listed are allowed); ``windows`` is the document of the model's windows
    a checkpoint holds too (:class:`~calmon.state.checkpoint.schema.ModelDoc`), its rings inline."""

    format: str
    version: int
    model: str
    offset: int
    applied: dict[str, int]
    events: dict[str, int]
    late: int
    watermark: float | None
    windows: ModelDoc
    #: the model's change detector (:meth:`CalibrationChangeDetector.to_dict`), absent before it had one
    changes: dict[str, Any] | None = None


class SnapshotManifestDoc(msgspec.Struct):
    """A snapshot manifest record (:class:`Manifest`)."""

    format: str
    version: int
    offset: int
    models: list[str]


D = TypeVar("D", SnapshotDoc, SnapshotManifestDoc)


def copy_windows(mw: ModelWindows) -> ModelWindows:
    """A copy of ``mw`` with copies of every bucket (take it under the state lock, encode it outside)."""
    out = ModelWindows.__new__(ModelWindows)
    out.name, out.classes, out.tiers, out.segments = mw.name, mw.classes, list(mw.tiers), list(mw.segments)
    out.params = dict(mw.params)
    out.rings = {seg: ring.copy(BucketStats.copy) for seg, ring in mw.rings.items()}
    return out


@dataclass
class ModelSnapshot:
    """One model's evaluator state, covering its deltas below :attr:`offset` (``o_m``).

    Examples
    --------
    >>> import numpy as np
    >>> mw = ModelWindows("m", 2, [(60, 5)], bins=64, reservoir=8)
    >>> mw.add(np.array([5.0]), np.array(["a"], dtype=object), np.array([1]), np.array([0.9]), None, 5.0)
    >>> s = ModelSnapshot("m", 42, mw, {"events/0": 7}, {"labeled": 1}, 0, 5.0)
    >>> r = ModelSnapshot.from_bytes(s.to_bytes())
    >>> r.offset, r.applied, r.windows.rings["all"].window_sum(None).count
    (42, {'events/0': 7}, 1)
    >>> ModelSnapshot.from_bytes(b'{"format": "calmon.snapshot", "version": 9}')
    Traceback (most recent call last):
    ...
    calmon.cluster.snapshots.SnapshotError: snapshot version 9 is not readable (this calmon reads 1)
    """

    model: str
    offset: int
    windows: ModelWindows
    applied: dict[str, int] = field(default_factory=dict)
    events: dict[str, int] = field(default_factory=dict)
    late: int = 0
    watermark: float = -math.inf
    #: the model's change detector state (:meth:`CalibrationChangeDetector.to_dict`), None without one
    changes: dict[str, Any] | None = None

    def to_bytes(self) -> bytes:
        """The snapshot's bytes (one record, or chunks of :mod:`calmon.cluster.snapshot_store`); :class:`SnapshotError`
        if it exceeds :data:`MAX_SNAPSHOT`."""
        mw = self.windows
        doc = {"format": FORMAT, "version": VERSION, "model": self.model, "offset": self.offset,
               "applied": self.applied, "events": self.events, "late": self.late,
               "watermark": self.watermark if math.isfinite(self.watermark) else None, "changes": self.changes,
               "windows": {"name": mw.name, "params": mw.params, "tiers": [list(t) for t in mw.tiers],
                           "segments": mw.segments,
                           "rings": {seg: ring.to_dict(lambda b: b.to_packed()) for seg, ring in mw.rings.items()}}}
        out = json.dumps(doc, separators=(",", ":")).encode()
        if len(out) > MAX_SNAPSHOT:
            raise SnapshotError(f"snapshot of model {self.model!r} is {len(out)} bytes, over the {MAX_SNAPSHOT}-byte "
                                f"snapshot limit (fewer tiers, bins or segments)", "too_large")
        return out

    @classmethod
    def from_bytes(cls, data: bytes) -> ModelSnapshot:
        raw, d = _document(data, SnapshotDoc, "bad snapshot record")
        try:
            mw = ModelWindows.from_dict(raw["windows"])  # (its rings are checked by TieredRing.from_dict)
        except (KeyError, TypeError, ValueError, AttributeError, IndexError, RecursionError) as exc:
            raise SnapshotError(f"bad snapshot record: {type(exc).__name__}: {exc}", "restore") from None
        return cls(d.model, d.offset, mw, d.applied, d.events, d.late,
                   -math.inf if d.watermark is None else d.watermark, d.changes)


@dataclass(frozen=True)
class Manifest:
    """The models of one deltas partition at deltas offset :attr:`offset` (any other model has no delta below)."""

    offset: int
    models: tuple[str, ...]

    def to_bytes(self) -> bytes:
        return json.dumps({"format": FORMAT, "version": VERSION, "manifest": True, "offset": self.offset,
                           "models": list(self.models)}).encode()

    @classmethod
    def from_bytes(cls, data: bytes) -> Manifest:
        _, d = _document(data, SnapshotManifestDoc, "bad snapshot manifest")
        return cls(d.offset, tuple(d.models))


def _document(data: bytes, into: type[D], what: str) -> tuple[dict[str, Any], D]:
    """A record's document as parsed and as checked against ``into`` (:class:`SnapshotError` naming the field)."""
    if len(data) > MAX_SNAPSHOT:
        raise SnapshotError(f"snapshot of {len(data)} bytes, over the {MAX_SNAPSHOT}-byte limit", "too_large")
    try:
        d = json.loads(data)  # (as json.dumps wrote it: NaN and Infinity allowed, which msgspec.json refuses)
    except (ValueError, RecursionError) as exc:
        raise SnapshotError(f"snapshot record is not JSON ({exc})", "not_json") from None
    if not isinstance(d, dict) or d.get("format") != FORMAT:
        raise SnapshotError(f"not a {FORMAT} record", "format")
    if d.get("version") != VERSION or type(d.get("version")) is not int:
        raise SnapshotError(f"snapshot version {str(d.get('version'))[:20]} is not readable (this calmon reads "
                            f"{VERSION})", "version")
    try:
        return d, convert(d, into)
    except SchemaError as exc:
        raise SnapshotError(f"{what}: {exc}") from None


def restore_start(manifest: Manifest | None, snapshots: Iterable[ModelSnapshot]) -> int:
    """Deltas offset to resume a partition from: ``min(M, min o_m)``, or 0 without a manifest.

    >>> restore_start(None, [])
    0
    >>> restore_start(Manifest(100, ("a", "b")), [])
    100
    """
    if manifest is None:
        return 0
    return min([manifest.offset, *(s.offset for s in snapshots)])


def keep_delta(offset: int, model: str, covers: Mapping[str, int]) -> bool:
    """The merge rule: a delta of ``model`` at ``offset`` is applied unless its snapshot covers it (offset < o_m).

    >>> keep_delta(9, "m", {"m": 10}), keep_delta(10, "m", {"m": 10}), keep_delta(0, "n", {"m": 10})
    (False, True, True)
    """
    return offset >= covers.get(model, 0)
