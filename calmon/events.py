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

Every rejected record gets one reason code from :data:`REASONS` and a detail message.
Decoding uses msgspec with a typed schema (the fastest decoder measured, see README);
records msgspec cannot type are re-read with the standard json module only to name the reason.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, cast

import msgspec
import numpy as np

REASONS: tuple[str, ...] = (
    "not_json", "not_object", "missing_field", "bad_type", "bad_timestamp", "non_finite", "out_of_range",
    "probs_sum", "label_range", "k_mismatch", "unknown_type", "too_many_models", "too_many_segments",
)
KINDS: tuple[str, ...] = ("prediction", "outcome", "labeled")
PREDICTION, OUTCOME, LABELED = 0, 1, 2
_KIND_CODE = {k: i for i, k in enumerate(KINDS)}
_NAME_RE = re.compile(r"[A-Za-z0-9_.:/\-]{1,128}\Z")
_MAX_EPOCH = 1e11
_CHUNK = 1024


class _Event(msgspec.Struct):
    type: str | None = None
    id: str | int | None = None
    model: str | None = None
    ts: float | str | None = None
    score: float | None = None
    probs: list[float] | None = None
    label: int | None = None
    segment: str | None = None


_struct_decoder = msgspec.json.Decoder(_Event)


@dataclass
class Rejection:
    """A record that failed validation: its index in the batch, reason code and detail."""

    index: int
    reason: str
    detail: str
    origin: str | None = None


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


class InvalidEvent(ValueError):
    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail


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
    """Decode raw JSON records into validated per-model columns.

    Parameters
    ----------
    models
        Declared models and their number of classes (2 = binary). Undeclared models are
        discovered from their first event (K fixed from then on) while fewer than
        ``max_models`` are known; a model beyond the cap is rejected (``too_many_models``).
    max_models, max_segments
        Cardinality caps (segments counted per model) protecting the metrics backend.
    prob_tolerance
        Accepted deviation of ``sum(probs)`` from 1.
    discover
        Whether undeclared models are accepted at all.

    Examples
    --------
    >>> dec = Decoder()
    >>> out = dec.decode([b'{"model": "m", "score": 0.9, "label": 1}', b'{"model": "m", "score": 1.5, "label": 0}',
    ...                   b'nope'])
    >>> len(out.models["m"]), [r.reason for r in out.rejected]
    (1, ['out_of_range', 'not_json'])
    """

    def __init__(self, models: dict[str, int] | None = None, max_models: int = 100, max_segments: int = 50,
                 prob_tolerance: float = 1e-3, discover: bool = True) -> None:
        self.models: dict[str, int] = {}
        for name, k in (models or {}).items():
            if not _NAME_RE.match(name) or int(k) < 2:
                raise ValueError(f"model {name!r}: needs a valid name and classes >= 2, got {k!r}")
            self.models[name] = int(k)
        self.declared = set(self.models)
        self.max_models = int(max_models)
        self.max_segments = int(max_segments)
        self.prob_tolerance = float(prob_tolerance)
        self.discover = discover
        self.segments: dict[str, set[str]] = {}

    # -- checkpoint state ------------------------------------------------------------------
    def state(self) -> dict[str, Any]:
        return {"models": dict(self.models), "segments": {m: sorted(s) for m, s in self.segments.items()}}

    def load_state(self, d: dict[str, Any]) -> None:
        self.models.update({str(k): int(v) for k, v in d.get("models", {}).items()})
        for m, segs in d.get("segments", {}).items():
            self.segments.setdefault(m, set()).update(segs)

    # -- decoding --------------------------------------------------------------------------
    def decode(self, records: list[bytes], origins: list[str] | None = None) -> DecodedBatch:
        """Decode and validate ``records`` (bytes or str, one JSON object each)."""
        events, rejected = _parse(records)
        out: dict[str, ModelBatch] = {}
        for model, (idx, evs) in _group_by_model(events).items():
            batch = self._model_batch(model, np.asarray(idx, dtype=np.int64), evs, rejected)
            if batch is not None and len(batch):
                out[model] = batch
        rejected.sort(key=lambda r: r.index)
        if origins is not None:
            for r in rejected:
                r.origin = origins[r.index]
        return DecodedBatch(out, rejected, len(records))

    def _model_batch(self, model: str, index: np.ndarray, evs: list[_Event],
                     rejected: list[Rejection]) -> ModelBatch | None:
        """Validate the events of one model (``""``: outcomes without a model) in a fixed order of checks:
        the first failed check of an event names its reason."""
        v = _Verdicts(len(evs))
        if model and not _NAME_RE.match(model):
            v.reject_all("bad_type", f"model name {model[:40]!r} is not [A-Za-z0-9_.:/-]{{1,128}}")
        c = _columns(evs)
        _check_structure(c, v, has_model=model != "")
        classes = self._classes(model, evs, v) if model else 2
        score = probs = None
        if classes == 2:
            score = _binary_scores(c, v, model, self.prob_tolerance)
        else:
            probs = _class_probs(c, v, model, classes, self.prob_tolerance)
        ts = _timestamps(evs, v)
        segment = np.array(["" if e.segment is None else e.segment for e in evs], dtype=object)
        if model and (segment != "").any():
            self._check_segments(model, segment, v)
        rejected.extend(v.rejections(index))
        ok = v.ok
        if not ok.any():
            return None
        return ModelBatch(model, classes, c.kind[ok], c.ids[ok], ts[ok], segment[ok], c.label[ok],
                          None if score is None else score[ok], None if probs is None else probs[ok], index[ok])

    def _classes(self, model: str, evs: list[_Event], v: _Verdicts) -> int:
        """The model's number of classes; an undeclared model is discovered from its first valid prediction."""
        known = self.models.get(model)
        if known is not None:
            return known
        first = next((e for e, ok in zip(evs, v.ok) if ok and (e.score is not None or e.probs is not None)), None)
        if first is None:
            return 2
        if not self.discover:
            v.reject_all("too_many_models", f"model {model[:40]!r} is not declared")
        elif len(self.models) >= self.max_models:
            v.reject_all("too_many_models", f"more than {self.max_models} models")
        else:
            k = 2 if first.score is not None else len(first.probs or [])
            if k >= 2:
                self.models[model] = k
                return k
        return 2

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


def _parse(records: list[bytes]) -> tuple[list[_Event | None], list[Rejection]]:
    """msgspec-decode every record (a clean chunk in one comprehension); ``None`` for a rejected record."""
    events: list[_Event | None] = []
    rejected: list[Rejection] = []
    dec = _struct_decoder.decode
    for start in range(0, len(records), _CHUNK):
        chunk = records[start:start + _CHUNK]
        try:
            events.extend([dec(rec) for rec in chunk])
            continue
        except (msgspec.DecodeError, TypeError):
            pass
        for i, rec in enumerate(chunk, start):
            try:
                events.append(dec(rec))
            except (msgspec.DecodeError, TypeError):
                try:
                    events.append(_slow_decode(rec))
                except InvalidEvent as e:
                    events.append(None)
                    rejected.append(Rejection(i, e.reason, e.detail))
    return events, rejected


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


def _class_probs(c: _Columns, v: _Verdicts, model: str, classes: int, tol: float) -> np.ndarray:
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


_FIELD_TYPES: dict[str, tuple[type, ...]] = {
    "type": (str,), "id": (str, int), "model": (str,), "ts": (int, float, str), "score": (int, float),
    "label": (int,), "segment": (str,),
}


def _slow_decode(rec: bytes | str) -> _Event:
    """Re-read a record msgspec rejected, to accept what is valid and name the reason otherwise."""
    try:
        obj = json.loads(rec)
    except (ValueError, UnicodeDecodeError, TypeError, RecursionError):
        raise InvalidEvent("not_json", "record is not valid JSON") from None
    if not isinstance(obj, dict):
        raise InvalidEvent("not_object", f"record is a JSON {type(obj).__name__}, not an object")
    for name, types in _FIELD_TYPES.items():
        v = obj.get(name)
        if v is None:
            continue
        if isinstance(v, bool) or not isinstance(v, types):
            raise InvalidEvent("bad_type", f"field {name!r} has type {type(v).__name__}")
        if isinstance(v, float) and not math.isfinite(v):
            raise InvalidEvent("non_finite", f"field {name!r} is {v}")
    probs = obj.get("probs")
    if probs is not None:
        if not isinstance(probs, list) or not all(isinstance(p, (int, float)) and not isinstance(p, bool)
                                                  for p in probs):
            raise InvalidEvent("bad_type", "field 'probs' must be a list of numbers")
        if not all(math.isfinite(p) for p in probs):
            raise InvalidEvent("non_finite", "probs contains NaN or infinity")
    try:
        return msgspec.convert({k: v for k, v in obj.items() if k in _Event.__struct_fields__}, _Event)
    except msgspec.ValidationError as e:
        raise InvalidEvent("bad_type", str(e)) from None
