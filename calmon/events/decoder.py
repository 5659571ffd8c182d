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
:mod:`calmon.events.parse` only to name the reason. State-changing decisions (admitting a model or a
segment, fixing a model's classes) are taken in record order, so batch boundaries never matter.

:meth:`Decoder.decode` parses a batch into columns and groups its rows by model (:mod:`calmon.events.rows`);
:meth:`Decoder._validate` runs the three stages of checks of :mod:`calmon.events.checks` (each record on its
own, the payloads that depend on a model's classes, the event times) and takes the decoder's decisions between
them; the accepted rows are cut into one :class:`ModelBatch` per model.

Other record shapes are read through a schema mapping (:mod:`calmon.events.schema`, ``Decoder(mapping=...)``),
and transport metadata (``connectors.base.RecordMeta``, one per record) gives ``ts`` where a record has
none (the Kafka record time, milliseconds) and the mapping's ``$key`` / ``$headers.NAME`` fields.
"""

from __future__ import annotations

import copy
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from calmon.events.checks import (
    KINDS,
    LABELED,
    NAME_RE,
    OUTCOME,
    PREDICTION,
    REASONS,
    Verdicts,
    event_times,
    first_record_ok,
    parse_timestamp,
    payloads,
    well_formed,
)
from calmon.events.mapped import MappedReader
from calmon.events.parse import (
    BatchFacts,
    EventFields,
    InvalidEvent,
    OversizedRecord,
    ParsedColumns,
    Rejection,
    parse_columns,
)
from calmon.events.rows import Columns, ModelBatch, Rows
from calmon.events.schema import Mapping
from calmon.formats.records import RecordMeta

__all__ = ["Decoder", "DecodedBatch", "ModelBatch", "Rejection", "InvalidEvent", "OversizedRecord", "REASONS",
           "KINDS", "PREDICTION", "OUTCOME", "LABELED", "parse_timestamp"]


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
        A schema mapping (:func:`calmon.events.schema.load_mapping`) for records not in calmon's schema;
        ``None`` reads the canonical schema.
    probe
        What a mapped path that matched no record does (:class:`calmon.events.mapped.MappedReader`): ``"warn"``
        (the agent's default: a warning with counts, logged once; data never stops the agent) or ``"raise"``
        (offline reads: :meth:`finish` raises :class:`calmon.events.schema.MappingError` naming the cause when the
        whole input matched nothing).

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
    >>> from calmon.events.schema import load_mapping
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
                 mapping: Mapping | None = None, probe: str = "warn") -> None:
        self.probe = probe
        self.max_classes = int(max_classes)
        self.models: dict[str, int] = {}
        for name, k in (models or {}).items():
            if not NAME_RE.match(name) or not 2 <= int(k) <= self.max_classes:
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
        self.reader = None if mapping is None else MappedReader(mapping, probe)
        #: per model admitted or given its classes in the current batch: [admitted at, classes fixed at, classes]
        #: (record indices; -1: before the batch) -- the bound on the labels of outcomes without a model
        self._changes: dict[str, list[int]] = {}

    def for_mapping(self, mapping: Mapping | None) -> Decoder:
        """A decoder of another record shape that shares this one's state (admitted models and their
        classes, segments) and limits: one per source of the agent, one set of caps and one checkpoint.

        Examples
        --------
        >>> from calmon.events.schema import load_mapping
        >>> base = Decoder()
        >>> other = base.for_mapping(load_mapping({"fields": {"score": "p"}}))
        >>> _ = other.decode([b'{"model": "m", "p": 0.5, "label": 1}'])
        >>> base.models
        {'m': 2}
        """
        twin = copy.copy(self)
        twin.mapping = mapping
        twin.reader = None if mapping is None else MappedReader(mapping, self.probe)
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
    def decode(self, records: list[bytes], origins: Sequence[str] | None = None,
               meta: list[RecordMeta] | None = None) -> DecodedBatch:
        """Decode and validate ``records`` (bytes or str, one JSON object each).

        ``meta`` (one :class:`~connectors.base.RecordMeta` per record, or ``None``) gives ``ts`` to
        records without one and the mapping's ``$key`` / ``$headers`` fields. With a mapping, the records probe it
        (see ``probe``); that never raises here.

        Every check runs once over the whole batch (issue #15: a batch of a thousand models costs
        what a batch of one does, plus one group-by); the checks that depend on a model (its classes,
        its segments) run on the rows of the models they concern.
        """
        now = self.clock()
        reader = self.reader
        self._changes = {}
        out: dict[str, ModelBatch] = {}
        present: Sequence[int]
        f: EventFields | None = None
        one_model: bool | None = None
        if reader is None:
            parsed, rejected = parse_columns(records, self.max_record_bytes)
            present, f, models = _accepted(parsed, rejected, len(records))
            one_model = None if f.facts is None else f.facts.one_model
        else:
            events, rejected = reader.parse(records, self.max_record_bytes)
            names = reader.models(events, meta)  # None: the rows' ``model`` attribute has it
            if names is None:  # a record is None exactly when it was rejected
                present = range(len(events)) if not rejected else [i for i, ev in enumerate(events) if ev is not None]
                evs = events if not rejected else [events[i] for i in present]
                models = [ev.model for ev in evs]  # no None left
            else:
                present = range(len(names)) if None not in names else [i for i, n in enumerate(names) if n is not None]
                evs = events if len(present) == len(events) else [events[i] for i in present]
                models = names if len(present) == len(names) else [names[i] for i in present]
        if present:
            if f is None:
                assert reader is not None
                f = reader.fields(evs, present, meta)
            facts = f.facts
            if facts is not None and facts.model_codes is not None and not rejected:  # numbered by the parser
                rows = Rows.numbered(facts.model_names, facts.model_codes, np.arange(len(records), dtype=np.int64))
            else:
                rows = Rows.of(models, present, one_model)
            out = self._validate(rows, f, now, rejected, meta)
        rejected.sort(key=lambda r: r.index)
        if origins is not None:
            for r in rejected:
                r.origin = origins[r.index]
        if reader is not None:
            reader.after_batch(len(records), len(rejected), origins, records[0] if records else None)
        return DecodedBatch(out, rejected, len(records))

    def _validate(self, g: Rows, f: EventFields, now: float, rejected: list[Rejection],
                  meta: list[RecordMeta] | None) -> dict[str, ModelBatch]:
        """The batch's well-formed records checked in a fixed order, the first failed check of an event naming
        its reason, as if each model's events were checked on their own: the three stages of
        :mod:`calmon.events.checks`, and between them the decisions on the decoder's state, in record order."""
        c, v = well_formed(f, g, self.max_id_bytes, self.max_classes)
        fresh = [k for k, m in enumerate(g.models) if m and (m not in self.names or m not in self.models)]
        unnamed = [k for k in fresh if g.models[k] not in self.names]  # (the others: admitted, classes unknown)
        known = len(self.names)
        trial = None if not fresh else first_record_ok(f, g, c, v, fresh, meta, now, self.future_skew,
                                                       self.past_horizon, self.prob_tolerance)
        first_ok = v.ok if trial is None else trial.ok
        formed = v.ok  # (stage 1's verdicts: a malformed record keeps its reason whatever the cap)
        admitted_at = self._admit(g, v, first_ok)
        classes, known_from = self._classes_of(g, c, first_ok & v.ok)  # (v: beyond the cap now rejected)
        bound = self._orphan_bound(g.index[g.codes == g.orphan]) if g.orphan >= 0 else None
        score, probs = payloads(g, c, v, classes, known_from, bound, self.prob_tolerance)
        ts = event_times(f, g, v, meta, now, self.future_skew, self.past_horizon)
        facts = f.facts
        segment = facts.segment_array if facts is not None and facts.segments else _segments(f.segment)
        if not self._segments_known(g, facts):
            self._check_segments(g, segment, v)
        if trial is not None:
            self._before_first_good(g, v, trial, formed, fresh, unnamed, known, admitted_at)
        rejected.extend(v.rejections(g.index))
        return g.split(v.ok, classes, c, ts, segment, score, probs)

    def _before_first_good(self, g: Rows, v: Verdicts, trial: Verdicts, formed: np.ndarray, fresh: list[int],
                           unnamed: list[int], known: int, admitted_at: list[int]) -> None:
        """The reasons of a new model's records before its first good one (or all, if it has none in the batch):
        ``too_many_models`` where the cap was full at that record (``known`` models before the batch, one more at
        each position of ``admitted_at``), else the reason each has on its own (``trial``). A record's reason
        then depends on the records before it only, never on what follows in its batch."""
        first = g.first(trial.ok)[g.codes]
        pos = np.arange(g.index.size)
        before = np.isin(g.codes, fresh) & ((first < 0) | (pos < first)) & (trial.bad > 0) & formed
        rows = np.flatnonzero(before)
        if not rows.size:
            return
        full = np.zeros(rows.size, bool)
        if unnamed:
            new_model = np.isin(g.codes[rows], unnamed)
            count = known + np.searchsorted(np.sort(np.asarray(admitted_at, dtype=np.int64)), rows, side="left")
            full = new_model & ((not self.discover) | (count >= self.max_models))
        for j, cap in zip(rows.tolist(), full.tolist()):
            if cap:
                v.bad[j] = 0
                v.reject_one(j, "too_many_models", f"model {g.models[g.codes[j]][:40]!r} is not declared"
                             if not self.discover else f"more than {self.max_models} models")
            else:
                v.bad[j] = trial.bad[j]
                v.details[j] = trial.details.get(j, "")

    def _admit(self, g: Rows, v: Verdicts, first_ok: np.ndarray) -> list[int]:
        """Admit new model names in the record order of their first record that would be accepted
        (``first_ok``: :func:`~calmon.events.checks.first_record_ok`), up to the cap. A model none of whose
        records would be is not admitted: its records are rejected by the checks, each with its own reason."""
        new = [k for k, m in enumerate(g.models) if m and m not in self.names]
        admitted_at: list[int] = []  # batch positions of the admissions
        if not new:
            return admitted_at
        first = g.first(first_ok)
        for k in sorted((k for k in new if first[k] >= 0), key=lambda k: first[k]):
            model = g.models[k]
            if not self.discover:
                v.reject(g.codes == k, "too_many_models", f"model {model[:40]!r} is not declared")
            elif len(self.names) >= self.max_models:
                v.reject(g.codes == k, "too_many_models", f"more than {self.max_models} models")
            else:
                self.names.add(model)
                self._changes[model] = [int(g.index[first[k]]), -1, 2]
                admitted_at.append(int(first[k]))
        return admitted_at

    def _classes_of(self, g: Rows, c: Columns, first_ok: np.ndarray) -> tuple[list[int], list[int]]:
        """Per model of the batch: its number of classes (:meth:`_classes`) and the row position from which it is
        known; models seen for the first time get theirs from their first prediction that would be accepted."""
        classes, known_from = [2] * len(g.models), [0] * len(g.models)
        unknown = [k for k, m in enumerate(g.models) if m and m not in self.models]
        firsts = g.first(first_ok & (c.has_score | c.has_probs)) if unknown else None
        for k, m in enumerate(g.models):
            if m:
                classes[k], known_from[k] = self._classes(m, c, k, g, firsts)
        return classes, known_from

    def finish(self) -> None:
        """The input ended: a mapped path that matched none of the records decoded raises
        :class:`calmon.events.schema.MappingError` naming the cause (``probe="raise"``) or is logged once
        (``probe="warn"``); nothing without a mapping."""
        if self.reader is not None:
            self.reader.finish()

    def _classes(self, model: str, c: Columns, k: int, g: Rows, firsts: np.ndarray | None) -> tuple[int, int]:
        """The model's number of classes, fixed by its first valid prediction, and the batch position
        from which it is known (0: known before the batch). Before that position (outcomes that precede
        the model's first prediction in record order) the model counts as binary."""
        known = self.models.get(model)
        if known is not None:
            return known, 0
        first = -1 if firsts is None else int(firsts[k])
        if first < 0:
            return 2, g.index.size
        kk = 2 if c.has_score[first] else len(c.probs[first] or [])
        if kk >= 2:
            self.models[model] = kk
            self._changes.setdefault(model, [-1, -1, 2])[1:] = [int(g.index[first]), kk]
            return kk, first
        return 2, g.index.size

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

    def _segments_known(self, g: Rows, facts: BatchFacts | None) -> bool:
        """Whether the batch's distinct segments (``facts``) show that :meth:`_check_segments` has nothing to do:
        every model of the batch knows every named segment of the batch already (made known to the state as that
        method would), checked per distinct model instead of per record."""
        if facts is None:
            return False
        names = facts.segment_names - {"", None}
        if not names:
            return True  # no named segment
        segments = self.segments
        if facts.one_model and g.orphan < 0 and facts.segments:  # the model has a named segment: it is made known
            return segments.setdefault(g.models[0], set()).issuperset(names)
        if len(names) * len(g.models) > g.index.size:  # more work than the record by record check
            return False
        # a model not in the state yet may have no named segment here: :meth:`_check_segments` decides
        return all(m in segments and segments[m].issuperset(names) for m in g.models if m)

    def _check_segments(self, g: Rows, segment: np.ndarray, v: Verdicts) -> None:
        """Admit new segment names of each model up to ``max_segments``, in record order."""
        named = (segment != "") & (g.codes != g.orphan)
        if not named.any():
            return
        has = g.has(named).tolist()
        known = [self.segments.setdefault(m, set()) if h else set() for m, h in zip(g.models, has)]
        if sum(has) == 1:  # the common case: one model with segments, all of them known already
            if known[has.index(True)].issuperset((segment if named.all() else segment[named]).tolist()):
                return
        rows = np.flatnonzero(named & v.ok)
        codes, segs = g.codes[rows].tolist(), segment[rows].tolist()
        if all(s in known[k] for k, s in set(zip(codes, segs))):  # the common case: every segment known
            return
        for j, k, s in zip(rows.tolist(), codes, segs):
            seen = known[k]
            if s in seen:
                continue
            model = g.models[k]
            if not NAME_RE.match(s):
                v.reject_one(j, "bad_type", f"segment {s[:40]!r} is not [A-Za-z0-9_.:/-]{{1,128}}")
            elif len(seen) >= self.max_segments:
                v.reject_one(j, "too_many_segments", f"model {model[:40]!r} has {self.max_segments} segments")
            else:
                seen.add(s)


def _accepted(parsed: ParsedColumns, rejected: list[Rejection], n: int
              ) -> tuple[Sequence[int], EventFields, list[str | None]]:
    """The record indices, fields and models of the records :func:`parse_columns` did not reject."""
    if not rejected:
        return range(n), parsed.fields, parsed.model
    bad = {r.index for r in rejected}
    present = [i for i in range(n) if i not in bad]
    f = parsed.fields
    t, ids, ts, sc, pr, lab, seg = ([col[i] for i in present]
                                    for col in (f.type, f.id, f.ts, f.score, f.probs, f.label, f.segment))
    return present, EventFields(t, ids, ts, sc, pr, lab, seg), [parsed.model[i] for i in present]


def _segments(col: Sequence[Any]) -> np.ndarray:
    """Segment names as an object array, ``""`` where absent."""
    out = np.empty(len(col), dtype=object)
    out[:] = col if None not in col else ["" if s is None else s for s in col]  # no None: no copy element by element
    return out
