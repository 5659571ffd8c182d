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
* ``label`` is the class index (0/1 for binary models).
* ``segment``: optional string (e.g. a country); model and segment names are at most 128
  characters of ``[A-Za-z0-9_.:/-]``.

Every rejected record gets one reason code from :data:`REASONS` and a detail message, and no
record makes :meth:`Decoder.decode` raise (hostile input, issue #14: invalid UTF-8, deep nesting,
oversized records, huge numbers, absurd times, id floods). Decoding uses msgspec with a typed schema
(the fastest decoder measured, see README); records msgspec cannot type are re-read one by one by
:mod:`calmon.eventparse` only to name the reason. State-changing decisions (admitting a model or a
segment, fixing a model's classes) are taken in record order, so batch boundaries never matter.
"""

from __future__ import annotations

import math
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, cast

import numpy as np

from calmon.eventparse import InvalidEvent, OversizedRecord, Rejection, _Event, parse_records

__all__ = ["Decoder", "DecodedBatch", "ModelBatch", "Rejection", "InvalidEvent", "OversizedRecord", "REASONS",
           "KINDS", "PREDICTION", "OUTCOME", "LABELED", "parse_timestamp"]

REASONS: tuple[str, ...] = (
    "not_json", "not_object", "missing_field", "bad_type", "bad_timestamp", "non_finite", "out_of_range",
    "probs_sum", "label_range", "k_mismatch", "unknown_type", "too_many_models", "too_many_segments",
    "bad_encoding", "too_deep", "too_large", "id_too_long", "too_many_classes", "future_timestamp", "past_timestamp",
)
KINDS: tuple[str, ...] = ("prediction", "outcome", "labeled")
PREDICTION, OUTCOME, LABELED = 0, 1, 2
_KIND_CODE = {k: i for i, k in enumerate(KINDS)}
_NAME_RE = re.compile(r"[A-Za-z0-9_.:/\-]{1,128}\Z")
_MAX_EPOCH = 1e11


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


def parse_timestamp(ts: float | str | None) -> float:
    """Epoch seconds from an RFC 3339 string or a number; NaN for ``None``.

    >>> parse_timestamp("2026-01-01T00:00:00Z")
    1767225600.0
    >>> parse_timestamp(1767225600)
    1767225600.0
    """
    if ts is None:
        return math.nan
    if isinstance(ts, str):
        try:
            dt = datetime.fromisoformat(ts.replace("z", "Z").replace("Z", "+00:00"))
        except ValueError:
            raise InvalidEvent("bad_timestamp", f"ts {ts[:40]!r} is not RFC 3339") from None
        if dt.tzinfo is None:
            raise InvalidEvent("bad_timestamp", f"ts {ts[:40]!r} has no UTC offset")
        return dt.timestamp()
    value = float(ts)
    if not math.isfinite(value) or value < 0 or value > _MAX_EPOCH:
        raise InvalidEvent("bad_timestamp", f"ts {value!r} is not epoch seconds (milliseconds are not accepted)")
    return value


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
    """

    def __init__(self, models: dict[str, int] | None = None, max_models: int = 100, max_segments: int = 50,
                 prob_tolerance: float = 1e-3, discover: bool = True, *, max_classes: int = 1000,
                 max_record_bytes: float = math.inf, max_id_bytes: int = 256, future_skew: float = math.inf,
                 past_horizon: float = math.inf, clock: Callable[[], float] = time.time) -> None:
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
    def decode(self, records: list[bytes], origins: list[str] | None = None) -> DecodedBatch:
        """Decode and validate ``records`` (bytes or str, one JSON object each)."""
        now = self.clock()
        events, rejected = parse_records(records, self.max_record_bytes)
        groups = [self._checked_form(model, np.asarray(idx, dtype=np.int64), evs)
                  for model, (idx, evs) in _group_by_model(events).items()]
        self._admit(groups)
        out: dict[str, ModelBatch] = {}
        for g in groups:
            batch = self._model_batch(g, now, rejected)
            if batch is not None and len(batch):
                out[g.model] = batch
        rejected.sort(key=lambda r: r.index)
        if origins is not None:
            for r in rejected:
                r.origin = origins[r.index]
        return DecodedBatch(out, rejected, len(records))

    def _checked_form(self, model: str, index: np.ndarray, evs: list[_Event]) -> _Group:
        """The checks that need no decoder state: model name, event structure, id length, class count."""
        v = _Verdicts(len(evs))
        if model and not _NAME_RE.match(model):
            v.reject_all("bad_type", f"model name {model[:40]!r} is not [A-Za-z0-9_.:/-]{{1,128}}")
        c = _columns(evs)
        _check_structure(c, v, has_model=model != "")
        _check_ids(c.ids, v, self.max_id_bytes)
        if c.has_probs.any():  # whatever the model's classes, so the reason never depends on batch boundaries
            lens = np.array([0 if p is None else len(p) for p in c.probs], dtype=np.int64)
            v.reject(lens > self.max_classes, "too_many_classes", f"more than {self.max_classes} classes")
        return _Group(model, index, evs, c, v)

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

    def _model_batch(self, g: _Group, now: float, rejected: list[Rejection]) -> ModelBatch | None:
        """Validate the events of one model (``""``: outcomes without a model) in a fixed order of checks:
        the first failed check of an event names its reason."""
        model, c, v, evs = g.model, g.columns, g.v, g.evs
        classes, known_from = self._classes(model, c, v) if model else (2, 0)
        score = probs = None
        if classes == 2:
            score = _binary_scores(c, v, model, self.prob_tolerance)
        else:
            probs = _class_probs(c, v, model, classes, self.prob_tolerance, known_from)
        ts = _timestamps(evs, v)
        self._check_time(ts, v, now)
        segment = np.array(["" if e.segment is None else e.segment for e in evs], dtype=object)
        if model and (segment != "").any():
            self._check_segments(model, segment, v)
        rejected.extend(v.rejections(g.index))
        ok = v.ok
        if not ok.any():
            return None
        return ModelBatch(model, classes, c.kind[ok], c.ids[ok], ts[ok], segment[ok], c.label[ok],
                          None if score is None else score[ok], None if probs is None else probs[ok], g.index[ok])

    def _classes(self, model: str, c: _Columns, v: _Verdicts) -> tuple[int, int]:
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
            return k, first
        return 2, v.n

    def _check_time(self, ts: np.ndarray, v: _Verdicts, now: float) -> None:
        """Reject event times beyond the future skew or the past horizon of the wall clock."""
        if math.isinf(self.future_skew) and math.isinf(self.past_horizon):
            return
        with np.errstate(invalid="ignore"):
            v.reject(ts > now + self.future_skew, "future_timestamp",
                     f"ts is more than {self.future_skew:g} s ahead of the wall clock")
            v.reject(ts < now - self.past_horizon, "past_timestamp",
                     f"ts is more than {self.past_horizon:g} s behind the wall clock")

    def _check_segments(self, model: str, segment: np.ndarray, v: _Verdicts) -> None:
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


def _group_by_model(events: list[_Event | None]) -> dict[str, tuple[list[int], list[_Event]]]:
    """Record indices and events per model name (``""`` for events without one)."""
    names = [None if ev is None else ("" if ev.model is None else ev.model) for ev in events]
    distinct = set(names)
    if len(distinct) == 1 and None not in distinct:  # the common case: one model, nothing rejected
        return {str(names[0]): (list(range(len(events))), cast("list[_Event]", events))}
    groups: dict[str, tuple[list[int], list[_Event]]] = {}
    for i, ev in enumerate(events):
        if ev is not None:
            idx, evs = groups.setdefault("" if ev.model is None else ev.model, ([], []))
            idx.append(i)
            evs.append(ev)
    return groups


class _Verdicts:
    """Per-event verdicts of one model's events: the first rejection of an event is the one reported."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.bad = np.zeros(n, dtype=np.int16)  # 0 = fine, else 1 + position in REASONS
        self.details: dict[int, str] = {}

    @property
    def ok(self) -> np.ndarray:
        return self.bad == 0

    def reject(self, mask: np.ndarray, reason: str, detail: str) -> None:
        new = mask & (self.bad == 0)
        if new.any():
            self.bad[new] = REASONS.index(reason) + 1
            for j in np.flatnonzero(new).tolist():
                self.details[j] = detail

    def reject_all(self, reason: str, detail: str) -> None:
        self.reject(np.ones(self.n, bool), reason, detail)

    def reject_one(self, j: int, reason: str, detail: str) -> None:
        if self.bad[j] == 0:
            self.bad[j] = REASONS.index(reason) + 1
            self.details[j] = detail

    def rejections(self, index: np.ndarray) -> list[Rejection]:
        return [Rejection(int(index[j]), REASONS[self.bad[j] - 1], self.details.get(j, ""))
                for j in np.flatnonzero(self.bad).tolist()]


@dataclass
class _Columns:
    """The fields of one model's events as columns (``label_f``: float labels, NaN where missing)."""

    kind: np.ndarray
    ids: np.ndarray
    label: np.ndarray
    label_f: np.ndarray
    has_score: np.ndarray
    has_probs: np.ndarray
    has_label: np.ndarray
    scores: list[float | None]
    probs: list[list[float] | None]


def _columns(evs: list[_Event]) -> _Columns:
    scores = [e.score for e in evs]
    probs = [e.probs for e in evs]
    label_f = np.array([e.label for e in evs], dtype=np.float64)  # None -> NaN
    has_label = ~np.isnan(label_f)
    with np.errstate(invalid="ignore"):
        label = np.where(has_label, label_f, -1).astype(np.int64)
    kind = np.array([-1 if e.type is None else _KIND_CODE.get(e.type, -2) for e in evs], dtype=np.int8)
    ids = np.array(["" if i is None else i if i.__class__ is str else str(i) for i in (e.id for e in evs)],
                   dtype=object)
    return _Columns(kind, ids, label, label_f, np.array([x is not None for x in scores], dtype=bool),
                    np.array([x is not None for x in probs], dtype=bool), has_label, scores, probs)


@dataclass
class _Group:
    """One model's events of a batch with their columns and verdicts."""

    model: str
    index: np.ndarray
    evs: list[_Event]
    columns: _Columns
    v: _Verdicts


def _check_ids(ids: np.ndarray, v: _Verdicts, max_bytes: int) -> None:
    """Reject ids longer than ``max_bytes`` in UTF-8 (characters first: a character is at most 4 bytes)."""
    chars = np.fromiter(map(len, ids), dtype=np.int64, count=ids.size)
    for j in np.flatnonzero(chars * 4 > max_bytes).tolist():
        s = ids[j]
        if chars[j] > max_bytes or len(s.encode("utf-8", "surrogatepass")) > max_bytes:
            v.reject_one(j, "id_too_long", f"id of {chars[j]} characters exceeds {max_bytes} bytes")


def _check_structure(c: _Columns, v: _Verdicts, has_model: bool) -> None:
    """Event types (inferred where omitted, written into ``c.kind``), required fields and label sign."""
    has_pred = c.has_score | c.has_probs
    inferred = np.where(c.has_label, np.where(has_pred, LABELED, OUTCOME), PREDICTION)
    v.reject(c.kind == -2, "unknown_type", "type must be prediction, outcome or labeled")
    c.kind = np.where(c.kind < 0, inferred, c.kind).astype(np.int8)
    if not has_model:
        v.reject(c.kind != OUTCOME, "missing_field", "model is required for predictions and labeled events")
    needs_pred = c.kind != OUTCOME
    v.reject(needs_pred & ~has_pred, "missing_field", "score or probs is required")
    v.reject(needs_pred & c.has_score & c.has_probs, "bad_type", "give score or probs, not both")
    v.reject((c.kind != PREDICTION) & ~c.has_label, "missing_field", "label is required")
    v.reject((c.kind != LABELED) & (c.ids == ""), "missing_field", "id is required to join predictions and outcomes")
    v.reject(c.has_label & ((c.label < 0) | (c.label_f != c.label)), "label_range",
             "label must be a non-negative class index")


def _binary_scores(c: _Columns, v: _Verdicts, model: str, tol: float) -> np.ndarray:
    """P(y = 1) of a binary model's events (from ``score`` or a ``probs`` pair), validated."""
    score = np.array(c.scores, dtype=np.float64)  # None -> NaN
    for j in np.flatnonzero(c.has_probs).tolist():
        p = c.probs[j] or []
        if len(p) != 2:
            v.reject_one(j, "k_mismatch", f"model {model[:40]!r} is binary; probs has {len(p)} entries")
        elif not all(math.isfinite(x) for x in p):
            v.reject_one(j, "non_finite", "probs contains NaN or infinity")
        elif min(p) < 0 or max(p) > 1:
            v.reject_one(j, "out_of_range", "probs must lie in [0, 1]")
        elif abs(sum(p) - 1.0) > tol:
            v.reject_one(j, "probs_sum", f"probs sum to {sum(p):.6g}, not 1")
        else:
            score[j] = p[1]
    finite = np.isfinite(score)
    v.reject(c.has_score & ~finite, "non_finite", "score is NaN or infinite")
    v.reject(c.has_score & finite & ((score < 0) | (score > 1)), "out_of_range", "score must lie in [0, 1]")
    v.reject(c.has_label & (c.label > 1), "label_range", "binary label must be 0 or 1")
    return score


def _class_probs(c: _Columns, v: _Verdicts, model: str, classes: int, tol: float, known_from: int = 0) -> np.ndarray:
    """The ``(n, classes)`` probability rows of a multiclass model's events, validated."""
    n = v.n
    probs = np.full((n, classes), np.nan)
    v.reject(c.has_score, "k_mismatch", f"model {model[:40]!r} has {classes} classes; send probs, not score")
    for j in np.flatnonzero(c.has_probs).tolist():
        p = c.probs[j] or []
        if len(p) != classes:
            v.reject_one(j, "k_mismatch", f"model {model[:40]!r} has {classes} classes; probs has {len(p)}")
        else:
            probs[j] = p
    rows = c.has_probs & v.ok
    if rows.any():
        sub = probs[rows]
        pos = np.flatnonzero(rows)
        v.reject(_mask(n, pos[~np.isfinite(sub).all(axis=1)]), "non_finite", "probs contains NaN or infinity")
        v.reject(_mask(n, pos[~((sub >= 0) & (sub <= 1)).all(axis=1)]), "out_of_range", "probs must lie in [0, 1]")
        v.reject(_mask(n, pos[np.abs(sub.sum(axis=1) - 1.0) > tol]), "probs_sum", "probs do not sum to 1")
    before = np.arange(n) < known_from  # outcomes before the model's first prediction: as if binary
    v.reject(c.has_label & before & (c.label > 1), "label_range", "label must be 0 or 1 before the model's "
             "first prediction fixes its classes")
    v.reject(c.has_label & (c.label >= classes), "label_range", f"label must be < {classes}")
    return probs


def _timestamps(evs: list[_Event], v: _Verdicts) -> np.ndarray:
    """Event times in epoch seconds (NaN where missing); RFC 3339 strings are parsed one by one."""
    ts_col = [e.ts for e in evs]
    if not any(t.__class__ is str for t in ts_col):
        ts = np.array(ts_col, dtype=np.float64)  # None -> NaN
        with np.errstate(invalid="ignore"):
            v.reject((ts < 0) | (ts > _MAX_EPOCH), "bad_timestamp",
                     "ts is not epoch seconds (milliseconds are not accepted)")
        return ts
    ts = np.full(len(evs), np.nan)
    for j, t in enumerate(ts_col):
        if t is not None and v.bad[j] == 0:
            try:
                ts[j] = parse_timestamp(t)
            except InvalidEvent as err:
                v.reject_one(j, err.reason, err.detail)
    return ts


def _mask(n: int, pos: np.ndarray) -> np.ndarray:
    m = np.zeros(n, bool)
    m[pos] = True
    return m
