"""Event model: decode and validate batches of raw JSON records into per-model columns.

Three event types share one JSON schema (one object per line in files, per message in Kafka)::

    {"type": "prediction", "id": "r-17", "model": "fraud", "ts": "2026-11-21T10:00:00Z", "score": 0.83}
    {"type": "outcome",    "id": "r-17", "model": "fraud", "ts": 1763719200.5, "label": 1}
    {"type": "labeled",    "id": "r-18", "model": "digits", "probs": [0.1, 0.7, 0.2], "label": 1}

* ``type`` may be omitted: with a label and a score/probs it is ``labeled``, with only a label an
  ``outcome``, with only a score/probs a ``prediction``.
* ``ts``: RFC 3339 string or epoch seconds (numbers above 1e11 are rejected as probable
  milliseconds); optional (NaN), in which case the agent uses the arrival time.
* ``score`` is P(y = 1) of a binary model; ``probs`` are the K class probabilities of a
  multiclass model (a binary model may send ``probs`` of length 2; ``score = probs[1]``).
* ``label`` is the class index (0/1 for binary models). An outcome without ``model`` is joined to
  its prediction's model by id; its label must be below the smallest number of classes of the
  models admitted before it (2 while any of them is binary or awaits its first prediction), so
  that it is valid for whichever model it joins.
* ``segment``: optional string (e.g. a country); model and segment names are at most 128
  characters of ``[A-Za-z0-9_.:/-]``.

Every rejected record gets one reason code from :data:`REASONS` and a detail message, and no
record makes :meth:`Decoder.decode` raise (hostile input, issue #14: invalid UTF-8, deep nesting,
oversized records, huge numbers, absurd times, id floods). Decoding uses msgspec with a typed schema
(the fastest decoder measured, see README); records msgspec cannot type are re-read one by one by
:mod:`calmon.eventparse` only to name the reason. State-changing decisions (admitting a model or a
segment, fixing a model's classes) are taken in record order, so batch boundaries never matter.

Other record shapes are read through a schema mapping (:mod:`calmon.schema`, ``Decoder(mapping=...)``),
and transport metadata (``connectors.base.RecordMeta``, one per record) gives ``ts`` where a record has
none (the Kafka record time, milliseconds) and the mapping's ``$key`` / ``$headers.NAME`` fields.
"""

from __future__ import annotations

import copy
import math
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from calmon.eventchecks import (
    KINDS,
    LABELED,
    OUTCOME,
    PREDICTION,
    REASONS,
    Columns,
    Verdicts,
    binary_scores,
    check_ids,
    check_structure,
    class_probs,
    columns_of,
    orphan_labels,
    parse_timestamp,
    timestamps,
)
from calmon.eventparse import (
    EventFields,
    InvalidEvent,
    OversizedRecord,
    Rejection,
    fields_of_events,
    parse_records,
)
from calmon.schema import Mapping
from calmon.schema_decode import MappedReader
from connectors.base import RecordMeta

_NAME_RE = re.compile(r"[A-Za-z0-9_.:/\-]{1,128}\Z")

__all__ = ["Decoder", "DecodedBatch", "ModelBatch", "Rejection", "InvalidEvent", "OversizedRecord", "REASONS",
           "KINDS", "PREDICTION", "OUTCOME", "LABELED", "parse_timestamp"]


@dataclass
class ModelBatch:
    """Accepted events of one model, as columns (see the module docstring for the fields)."""

    model: str
    classes: int
    kind: np.ndarray
    ids: np.ndarray
    ts: np.ndarray
    segment: np.ndarray
    label: np.ndarray
    score: np.ndarray | None = None
    probs: np.ndarray | None = None
    index: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))

    def __len__(self) -> int:
        return int(self.kind.size)

    def select(self, mask: np.ndarray) -> ModelBatch:
        """The events where ``mask`` is true."""
        return ModelBatch(self.model, self.classes, self.kind[mask], self.ids[mask], self.ts[mask],
                          self.segment[mask], self.label[mask],
                          None if self.score is None else self.score[mask],
                          None if self.probs is None else self.probs[mask], self.index[mask])


@dataclass
class DecodedBatch:
    models: dict[str, ModelBatch]
    rejected: list[Rejection]
    total: int

    @property
    def accepted(self) -> int:
        return self.total - len(self.rejected)

    def reason_counts(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for r in self.rejected:
            out[r.reason] = out.get(r.reason, 0) + 1
        return out


class Decoder:
    """Decode raw JSON records into validated per-model columns; never raises for a record.

    Every record becomes an event or exactly one :class:`Rejection` (reason codes in
    :data:`REASONS`), and every decision that changes the decoder's state (admitting a model, fixing
    its classes, admitting a segment) is taken in record order, so a stream decodes the same
    whatever its batch boundaries.

    Parameters
    ----------
    models
        Declared models and their number of classes (2 = binary). Undeclared models are admitted at
        their first well-formed record (any event type: outcomes count too) while fewer than
        ``max_models`` are known; beyond the cap their records are rejected (``too_many_models``).
        An admitted model's classes are fixed by its first prediction (K from then on).
    max_models, max_segments
        Cardinality caps (segments counted per model) protecting the metrics backend.
    prob_tolerance
        Accepted deviation of ``sum(probs)`` from 1.
    discover
        Whether undeclared models are accepted at all.
    max_classes
        Largest number of classes a model may get from its first event (``too_many_classes``).
    max_record_bytes
        Longer records are rejected unread (``too_large``).
    max_id_bytes
        Longest id in UTF-8 bytes (``id_too_long``).
    future_skew, past_horizon
        Event times after ``clock() + future_skew`` (``future_timestamp``) or before
        ``clock() - past_horizon`` (``past_timestamp``) are rejected; ``math.inf`` (the default)
        disables the check. The agent passes its ``limits``.
    clock
        Wall clock in epoch seconds, read once per :meth:`decode`.
    mapping
        A schema mapping (:func:`calmon.schema.load_mapping`) for records not in calmon's schema;
        ``None`` reads the canonical schema.

    Examples
    --------
    >>> dec = Decoder()
    >>> out = dec.decode([b'{"model": "m", "score": 0.9, "label": 1}', b'{"model": "m", "score": 1.5, "label": 0}',
    ...                   b'nope'])
    >>> len(out.models["m"]), [r.reason for r in out.rejected]
    (1, ['out_of_range', 'not_json'])
    >>> dec = Decoder(future_skew=60, clock=lambda: 1767225600.0)
    >>> out = dec.decode([b'{"model": "m", "id": "a", "score": 0.5, "ts": "9999-12-31T23:59:59Z"}'])
    >>> [r.reason for r in out.rejected]
    ['future_timestamp']
    >>> from calmon.schema import load_mapping
    >>> dec = Decoder(mapping=load_mapping({"fields": {"model": {"const": "m"}, "score": "p", "label": "y"},
    ...                                     "labels": {"positive": ["yes"]}}))
    >>> out = dec.decode([b'{"p": 0.25, "y": "yes"}', b'{"p": 0.5, "y": "no"}'])
    >>> out.models["m"].score.tolist(), out.models["m"].label.tolist()
    ([0.25, 0.5], [1, 0])
    """

    def __init__(self, models: dict[str, int] | None = None, max_models: int = 100, max_segments: int = 50,
                 prob_tolerance: float = 1e-3, discover: bool = True, *, max_classes: int = 1000,
                 max_record_bytes: float = math.inf, max_id_bytes: int = 256, future_skew: float = math.inf,
                 past_horizon: float = math.inf, clock: Callable[[], float] = time.time,
                 mapping: Mapping | None = None) -> None:
        self.max_classes = int(max_classes)
        self.models: dict[str, int] = {}
        for name, k in (models or {}).items():
            if not _NAME_RE.match(name) or not 2 <= int(k) <= self.max_classes:
                raise ValueError(f"model {name!r}: needs a valid name and 2 <= classes <= {self.max_classes}, "
                                 f"got {k!r}")
            self.models[name] = int(k)
        self.declared = set(self.models)
        self.names: set[str] = set(self.models)  # admitted model names (a model may await its classes)
        self.max_models = int(max_models)
        self.max_segments = int(max_segments)
        self.prob_tolerance = float(prob_tolerance)
        self.discover = discover
        self.max_record_bytes = max_record_bytes
        self.max_id_bytes = int(max_id_bytes)
        self.future_skew = float(future_skew)
        self.past_horizon = float(past_horizon)
        self.clock = clock
        self.segments: dict[str, set[str]] = {}
        self.mapping = mapping
        self.reader = None if mapping is None else MappedReader(mapping)
        #: per model admitted or given its classes in the current batch: [admitted at, classes fixed at, classes]
        #: (record indices; -1: before the batch) -- the bound on the labels of outcomes without a model
        self._changes: dict[str, list[int]] = {}

    def for_mapping(self, mapping: Mapping | None) -> Decoder:
        """A decoder of another record shape that shares this one's state (admitted models and their
        classes, segments) and limits: one per source of the agent, one set of caps and one checkpoint.

        Examples
        --------
        >>> from calmon.schema import load_mapping
        >>> base = Decoder()
        >>> other = base.for_mapping(load_mapping({"fields": {"score": "p"}}))
        >>> _ = other.decode([b'{"model": "m", "p": 0.5, "label": 1}'])
        >>> base.models
        {'m': 2}
        """
        twin = copy.copy(self)
        twin.mapping = mapping
        twin.reader = None if mapping is None else MappedReader(mapping)
        twin._changes = {}
        return twin

    # -- checkpoint state ------------------------------------------------------------------
    def state(self) -> dict[str, Any]:
        return {"models": dict(self.models), "segments": {m: sorted(s) for m, s in self.segments.items()},
                "names": sorted(self.names)}

    def load_state(self, d: dict[str, Any]) -> None:
        self.models.update({str(k): int(v) for k, v in d.get("models", {}).items()})
        for m, segs in d.get("segments", {}).items():
            self.segments.setdefault(m, set()).update(segs)
        self.names.update(self.models, (str(n) for n in d.get("names", ())))

    # -- decoding --------------------------------------------------------------------------
    def decode(self, records: list[bytes], origins: list[str] | None = None,
               meta: list[RecordMeta] | None = None) -> DecodedBatch:
        """Decode and validate ``records`` (bytes or str, one JSON object each).

        ``meta`` (one :class:`~connectors.base.RecordMeta` per record, or ``None``) gives ``ts`` to
        records without one and the mapping's ``$key`` / ``$headers`` fields. With a mapping, the first
        ``probe_records`` records must show every mapped path at least once, else
        :class:`calmon.schema.MappingError` is raised (a configuration error, not a record's).
        """
        now = self.clock()
        reader = self.reader
        if reader is None:
            events, rejected = parse_records(records, self.max_record_bytes)
            by_model = _group_by_model(events)
        else:
            events, rejected = reader.parse(records, self.max_record_bytes)
            by_model = _group_by_model(events, reader.models(events, meta))
        self._changes = {}
        groups = [self._checked_form(model, np.asarray(idx, dtype=np.int64), self._fields(evs, idx, meta))
                  for model, (idx, evs) in by_model.items()]
        self._admit(groups)
        meta_ts = None if meta is None else np.array(
            [math.nan if m is None or m.timestamp_ms is None else m.timestamp_ms / 1000.0 for m in meta])
        out: dict[str, ModelBatch] = {}
        for g in sorted(groups, key=lambda g: g.model == ""):  # outcomes without a model last: see _orphan_bound
            batch = self._model_batch(g, now, rejected, meta_ts)
            if batch is not None and len(batch):
                out[g.model] = batch
        rejected.sort(key=lambda r: r.index)
        if origins is not None:
            for r in rejected:
                r.origin = origins[r.index]
        if reader is not None:
            reader.after_batch(len(records), len(rejected))
        return DecodedBatch(out, rejected, len(records))

    def finish(self) -> None:
        """The input ended (offline reads): raise :class:`calmon.schema.MappingError` if a mapped path
        matched none of the records decoded (fewer than ``probe_records``); nothing without a mapping."""
        if self.reader is not None:
            self.reader.finish()

    def _fields(self, evs: list[Any], idx: list[int], meta: list[RecordMeta] | None) -> EventFields:
        return fields_of_events(evs) if self.reader is None else self.reader.fields(evs, idx, meta)

    def _checked_form(self, model: str, index: np.ndarray, f: EventFields) -> _Group:
        """The checks that need no decoder state: model name, event structure, id length, class count."""
        v = Verdicts(len(f.id))
        for j, reason, detail in f.rejects:
            v.reject_one(j, reason, detail)
        if model and not _NAME_RE.match(model):
            v.reject_all("bad_type", f"model name {model[:40]!r} is not [A-Za-z0-9_.:/-]{{1,128}}")
        c = columns_of(f)
        check_structure(c, v, has_model=model != "")
        check_ids(c.ids, v, self.max_id_bytes)
        if c.has_probs.any():  # whatever the model's classes, so the reason never depends on batch boundaries
            lens = np.array([0 if p is None else len(p) for p in c.probs], dtype=np.int64)
            v.reject(lens > self.max_classes, "too_many_classes", f"more than {self.max_classes} classes")
        return _Group(model, index, f, c, v)

    def _admit(self, groups: list[_Group]) -> None:
        """Admit new model names in the record order of their first well-formed record, up to the cap."""
        first = {}
        for g in groups:
            if g.model and g.model not in self.names:
                ok = np.flatnonzero(g.v.ok)
                if ok.size:
                    first[g.model] = (int(g.index[ok[0]]), g)
        for _, g in sorted(first.values(), key=lambda t: t[0]):
            if not self.discover:
                g.v.reject_all("too_many_models", f"model {g.model[:40]!r} is not declared")
            elif len(self.names) >= self.max_models:
                g.v.reject_all("too_many_models", f"more than {self.max_models} models")
            else:
                self.names.add(g.model)
                self._changes[g.model] = [int(g.index[np.flatnonzero(g.v.ok)[0]]), -1, 2]

    def _model_batch(self, g: _Group, now: float, rejected: list[Rejection],
                     meta_ts: np.ndarray | None = None) -> ModelBatch | None:
        """Validate the events of one model (``""``: outcomes without a model) in a fixed order of checks:
        the first failed check of an event names its reason."""
        model, c, v, f = g.model, g.columns, g.v, g.fields
        classes, known_from = self._classes(model, c, v, g.index) if model else (2, 0)
        score = probs = None
        if not model:
            score = orphan_labels(c, v, self._orphan_bound(g.index))
        elif classes == 2:
            score = binary_scores(c, v, model, self.prob_tolerance)
        else:
            probs = class_probs(c, v, model, classes, self.prob_tolerance, known_from)
        ts = timestamps(f, v)
        if meta_ts is not None:  # no ts in the record: the transport's (a Kafka record's create/append time)
            ts = np.where(np.isnan(ts), meta_ts[g.index], ts)
        self._check_time(ts, v, now)
        segment = np.array(["" if s is None else s for s in f.segment], dtype=object)
        if model and (segment != "").any():
            self._check_segments(model, segment, v)
        rejected.extend(v.rejections(g.index))
        ok = v.ok
        if not ok.any():
            return None
        return ModelBatch(model, classes, c.kind[ok], c.ids[ok], ts[ok], segment[ok], c.label[ok],
                          None if score is None else score[ok], None if probs is None else probs[ok], g.index[ok])

    def _classes(self, model: str, c: Columns, v: Verdicts, index: np.ndarray) -> tuple[int, int]:
        """The model's number of classes, fixed by its first valid prediction, and the position from which
        it is known in this batch (0: known before it). Before that position (outcomes that precede the
        model's first prediction in record order) the model counts as binary."""
        known = self.models.get(model)
        if known is not None:
            return known, 0
        ok = np.flatnonzero(v.ok & (c.has_score | c.has_probs))
        if not ok.size:
            return 2, v.n
        first = int(ok[0])
        k = 2 if c.has_score[first] else len(c.probs[first] or [])
        if k >= 2:
            self.models[model] = k
            self._changes.setdefault(model, [-1, -1, 2])[1:] = [int(index[first]), k]
            return k, first
        return 2, v.n

    def _orphan_bound(self, index: np.ndarray) -> np.ndarray:
        """Per outcome without a model (at record ``index``): the smallest number of classes of the models
        admitted before it (a model counts as binary until its first prediction), 2 when there is none.

        A label below it is valid for whichever model the outcome joins by id, so the joiner never
        sees a label beyond its prediction's classes (issue #16: multiclass outcomes need no model).
        """
        changed = self._changes
        before = [self.models.get(n, 2) for n in self.names if n not in changed]
        bound = np.full(index.size, float(min(before, default=math.inf)))
        for admitted, fixed, k in changed.values():
            now_k = np.where((fixed >= 0) & (index > fixed), k, 2)
            bound = np.where(index > admitted, np.minimum(bound, now_k), bound)
        return np.where(np.isinf(bound), 2, bound)

    def _check_time(self, ts: np.ndarray, v: Verdicts, now: float) -> None:
        """Reject event times beyond the future skew or the past horizon of the wall clock."""
        if math.isinf(self.future_skew) and math.isinf(self.past_horizon):
            return
        with np.errstate(invalid="ignore"):
            v.reject(ts > now + self.future_skew, "future_timestamp",
                     f"ts is more than {self.future_skew:g} s ahead of the wall clock")
            v.reject(ts < now - self.past_horizon, "past_timestamp",
                     f"ts is more than {self.past_horizon:g} s behind the wall clock")

    def _check_segments(self, model: str, segment: np.ndarray, v: Verdicts) -> None:
        """Admit new segment names of a model up to ``max_segments``."""
        known = self.segments.setdefault(model, set())
        for j in np.flatnonzero((segment != "") & v.ok).tolist():
            s = segment[j]
            if s in known:
                continue
            if not _NAME_RE.match(s):
                v.reject_one(j, "bad_type", f"segment {s[:40]!r} is not [A-Za-z0-9_.:/-]{{1,128}}")
            elif len(known) >= self.max_segments:
                v.reject_one(j, "too_many_segments", f"model {model[:40]!r} has {self.max_segments} segments")
            else:
                known.add(s)


def _group_by_model(events: list[Any], names: list[str | None] | None = None
                    ) -> dict[str, tuple[list[int], list[Any]]]:
    """Record indices and events (or mapped rows) per model name (``""`` for events without one);
    ``names`` gives the model of each record (``None``: rejected), else it is read from ``_Event.model``."""
    if names is None:
        names = [None if ev is None else ("" if ev.model is None else ev.model) for ev in events]
    distinct = set(names)
    if len(distinct) == 1 and None not in distinct:  # the common case: one model, nothing rejected
        return {str(names[0]): (list(range(len(events))), events)}
    groups: dict[str, tuple[list[int], list[Any]]] = {}
    for i, (ev, name) in enumerate(zip(events, names)):
        if name is not None:
            idx, evs = groups.setdefault(name, ([], []))
            idx.append(i)
            evs.append(ev)
    return groups


@dataclass
class _Group:
    """One model's events of a batch with their columns and verdicts."""

    model: str
    index: np.ndarray
    fields: EventFields
    columns: Columns
    v: Verdicts
