"""The checks of a batch's events that do not depend on the decoder's state, in their fixed order.

:meth:`Decoder._validate <calmon.events.decoder.Decoder._validate>` runs three stages of checks from here, and
between them takes the decisions that change the decoder's state (admitting models and segments, fixing a
model's classes) in record order:

1. :func:`well_formed`: each record on its own -- what the parser or the mapping refused, model names, event
   types and required fields (:func:`check_structure`), ids (:func:`check_ids`), the number of classes; the
   decoder then admits new models and fixes the classes of models seen for the first time;
2. :func:`payloads`: what depends on a model's classes -- binary scores, multiclass probabilities, labels of
   outcomes without a model below the bound the decoder gives;
3. :func:`event_times`: event times, the transport's time where a record has none, the wall-clock window; the
   decoder then admits new segments.

Every check works on whole columns (numpy masks) and records the first failed check of each event in
:class:`Verdicts`, which names its reason from :data:`REASONS`: an event's reason is that of the first check it
fails, as if each model's events were checked on their own.  See :mod:`calmon.events.decoder` for the schema.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime
from functools import partial
from typing import Any, TypeVar

import numpy as np

from calmon.events.parse import EventFields, InvalidEvent, Rejection
from calmon.events.rows import Columns, Rows
from calmon.formats.records import RecordMeta

__all__ = ["REASONS", "KINDS", "PREDICTION", "OUTCOME", "LABELED", "NAME_RE", "Verdicts", "well_formed",
           "payloads", "event_times", "columns_of", "check_ids", "check_structure", "binary_scores", "class_probs",
           "timestamps", "orphan_labels", "parse_timestamp"]

REASONS: tuple[str, ...] = (
    "not_json", "not_object", "missing_field", "bad_type", "bad_timestamp", "non_finite", "out_of_range",
    "probs_sum", "label_range", "k_mismatch", "unknown_type", "too_many_models", "too_many_segments",
    "bad_encoding", "too_deep", "too_large", "id_too_long", "too_many_classes", "future_timestamp", "past_timestamp",
    "unmapped_label", "decompression_bomb",
)
KINDS: tuple[str, ...] = ("prediction", "outcome", "labeled")
PREDICTION, OUTCOME, LABELED = 0, 1, 2
_KIND_CODE = {k: i for i, k in enumerate(KINDS)}
_MAX_EPOCH = 1e11
#: Model and segment names.
NAME_RE = re.compile(r"[A-Za-z0-9_.:/\-]{1,128}\Z")



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



class Verdicts:
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

    def reject_one(self, j: int, reason: str, detail: str) -> None:
        if self.bad[j] == 0:
            self.bad[j] = REASONS.index(reason) + 1
            self.details[j] = detail

    def rejections(self, index: np.ndarray) -> list[Rejection]:
        return [Rejection(int(index[j]), REASONS[self.bad[j] - 1], self.details.get(j, ""))
                for j in np.flatnonzero(self.bad).tolist()]


# -- the three stages ----------------------------------------------------------------------------------------------
def well_formed(f: EventFields, g: Rows, max_id_bytes: int, max_classes: int) -> tuple[Columns, Verdicts]:
    """Stage 1, each record on its own: the columns the checks read and the verdicts so far.

    In order: the rejections of the parser or the mapping (``f.rejects``), model names, event types and
    required fields, ids longer than ``max_id_bytes``, ``probs`` longer than ``max_classes`` (whatever the
    model's classes, so the reason never depends on batch boundaries)."""
    v = Verdicts(g.index.size)
    for j, reason, detail in f.rejects:
        v.reject_one(j, reason, detail)
    for k, m in enumerate(g.models):
        if m and not NAME_RE.match(m):
            v.reject(g.codes == k, "bad_type", f"model name {m[:40]!r} is not [A-Za-z0-9_.:/-]{{1,128}}")
    c = columns_of(f)
    facts = f.facts
    check_structure(c, v, has_model=g.codes != g.orphan)
    check_ids(c.ids, v, max_id_bytes, facts.id_chars if facts is not None and facts.ids_str else None)
    if c.has_probs.any():
        lens = np.array([0 if p is None else len(p) for p in c.probs], dtype=np.int64)
        v.reject(lens > max_classes, "too_many_classes", f"more than {max_classes} classes")
    return c, v


def payloads(g: Rows, c: Columns, v: Verdicts, classes: Sequence[int], known_from: Sequence[int],
             orphan_bound: np.ndarray | None, tol: float
             ) -> tuple[np.ndarray, dict[int, tuple[np.ndarray, np.ndarray]]]:
    """Stage 2, what depends on a model's classes: the binary scores of every binary model's events at once, the
    class probabilities per multiclass model, the labels of outcomes without a model last.

    Parameters
    ----------
    classes, known_from
        Per model (code): its number of classes, and the row position from which it is known (outcomes before
        a model's first prediction count as binary).
    orphan_bound
        Per outcome without a model, in row order: the bound on its label (``None``: there are none).
    tol
        Accepted deviation of ``sum(probs)`` from 1.

    Returns
    -------
    The scores (NaN where none) and, per multiclass model, its rows and ``(rows, classes)`` probabilities.
    """
    score = np.full(g.index.size, np.nan)
    probs: dict[int, tuple[np.ndarray, np.ndarray]] = {}
    multi = [k for k, m in enumerate(g.models) if m and classes[k] > 2]
    is_binary = np.array([m != "" and classes[k] == 2 for k, m in enumerate(g.models)])
    binary = np.flatnonzero(is_binary[g.codes])
    if binary.size:
        names: str | dict[int, str] = g.models[0]
        if len(g.models) > 1:  # the model of each row a message may name (one with probs), not of every row
            named = np.flatnonzero(c.has_probs[binary])
            names = dict(zip(named.tolist(), np.array(g.models, dtype=object)[g.codes[binary[named]]].tolist()))
        score[binary] = _on_rows(binary, c, v, partial(binary_scores, model=names, tol=tol))
    for k, rows in zip(multi, g.rows_of(multi)):
        at = int(np.searchsorted(rows, known_from[k]))  # the position within the model's rows
        check = partial(class_probs, model=g.models[k], classes=classes[k], tol=tol, known_from=at)
        probs[k] = (rows, _on_rows(rows, c, v, check))
    if orphan_bound is not None:
        _on_rows(np.flatnonzero(g.codes == g.orphan), c, v, partial(orphan_labels, bound=orphan_bound))
    return score, probs


def first_record_ok(f: EventFields, g: Rows, c: Columns, v: Verdicts, codes: Sequence[int],
                    meta: Sequence[RecordMeta | None] | None, now: float, future_skew: float, past_horizon: float,
                    tol: float) -> Verdicts:
    """The verdicts of the rows of the models ``codes`` as their model's first record (``.ok``: accepted, every
    check of the three stages passes, with the classes the record itself implies (a ``score``, a pair of
    ``probs`` or none: binary; ``probs`` of K > 2 entries: K classes).

    A model is admitted, and its classes are fixed, only by such a record (issue #31: a rejected record -- a score
    of 3.5, probabilities summing to 1.8 -- must neither take a slot under ``limits.max_models`` nor fix a model's
    classes). The checks run on a copy of the verdicts ``v``, which is left as it is; their outcome does not depend
    on batch boundaries, as it depends on the record alone. Other models' rows are marked rejected, without detail.
    """
    trial = Verdicts(v.n)
    trial.bad, trial.details = v.bad.copy(), dict(v.details)
    mine = np.isin(g.codes, np.asarray(codes, dtype=g.codes.dtype)) & trial.ok
    trial.bad[~mine & (trial.bad == 0)] = 1  # (other models' rows: not candidates; no detail needed)
    lens = np.array([len(p) if p else 0 for p in c.probs], dtype=np.int64) if c.has_probs.any() else None
    multi = np.zeros(v.n, bool) if lens is None else (lens > 2) & trial.ok
    binary = np.flatnonzero(trial.ok & ~multi)
    if binary.size:
        _on_rows(binary, c, trial, partial(binary_scores, model="", tol=tol))
    if lens is not None:
        for k in np.unique(lens[multi]).tolist():
            rows = np.flatnonzero(multi & (lens == k))
            _on_rows(rows, c, trial, partial(class_probs, model="", classes=int(k), tol=tol))
    event_times(f, g, trial, meta, now, future_skew, past_horizon)
    return trial


def event_times(f: EventFields, g: Rows, v: Verdicts, meta: Sequence[RecordMeta | None] | None, now: float,
                future_skew: float, past_horizon: float) -> np.ndarray:
    """Stage 3: event times in epoch seconds (NaN where missing), the transport's time (``meta``, a Kafka
    record's create or append time) where a record has none, rejected beyond ``future_skew`` or ``past_horizon``
    of the wall clock ``now`` (``math.inf``: no limit).

    The events of the models that sent a string time are read one by one (:func:`timestamps`), so each
    model's events get the same messages as if they were decoded alone."""
    facts = f.facts
    no_str = facts is not None and not facts.ts_str
    ts = timestamps(f, v, slow=g.any_of(np.zeros(len(f.ts), bool) if no_str else _str_mask(f.ts)))
    if meta is not None:
        meta_ts = np.array([math.nan if m is None or m.timestamp_ms is None else m.timestamp_ms / 1000.0
                            for m in meta])
        ts = np.where(np.isnan(ts), meta_ts[g.index], ts)
    if math.isinf(future_skew) and math.isinf(past_horizon):
        return ts
    with np.errstate(invalid="ignore"):
        v.reject(ts > now + future_skew, "future_timestamp",
                 f"ts is more than {future_skew:g} s ahead of the wall clock")
        v.reject(ts < now - past_horizon, "past_timestamp",
                 f"ts is more than {past_horizon:g} s behind the wall clock")
    return ts


_T = TypeVar("_T")


def _on_rows(rows: np.ndarray, c: Columns, v: Verdicts, check: Callable[[Columns, Verdicts], _T]) -> _T:
    """Run a check on some rows only (their verdicts are written back); on all rows without copying."""
    if rows.size == v.n:
        return check(c, v)
    pick = rows.tolist()
    sub = Columns(c.kind[rows], c.ids[rows], c.label[rows], c.label_f[rows], c.has_score[rows], c.has_probs[rows],
                  c.has_label[rows], [c.scores[j] for j in pick], [c.probs[j] for j in pick])
    sv = Verdicts(rows.size)
    sv.bad = v.bad[rows]
    out = check(sub, sv)
    v.bad[rows] = sv.bad
    v.details.update((pick[j], d) for j, d in sv.details.items())
    return out


def _str_mask(col: Sequence[Any]) -> np.ndarray:
    """Where a column holds strings."""
    if str not in set(map(type, col)):  # the common case: no string, no mask built element by element
        return np.zeros(len(col), bool)
    return np.fromiter((t.__class__ is str for t in col), bool, len(col))


# -- the checks ----------------------------------------------------------------------------------------------------
def columns_of(f: EventFields) -> Columns:
    """The columns the checks read. Each has a C-speed route for the common batch (one event type, string
    ids, every score present, no probs) gated by an exact test, and the per-event route otherwise; the
    fields hold JSON values (``None``, numbers, strings, lists), so the ``None``/string comparisons are exact."""
    scores = f.score
    probs = f.probs
    n = len(scores)
    label_f = np.array(f.label, dtype=np.float64)  # None -> NaN
    has_label = ~np.isnan(label_f)
    with np.errstate(invalid="ignore"):
        label = np.where(has_label, label_f, -1).astype(np.int64)
    facts = f.facts
    all_scores = facts.scores if facts is not None else None not in scores
    has_score = np.ones(n, bool) if all_scores else np.array([x is not None for x in scores], dtype=bool)
    has_probs = (np.zeros(n, bool) if probs.count(None) == n
                 else np.array([x is not None for x in probs], dtype=bool))
    ids = facts.id_array if facts is not None and facts.ids_str else _ids(f.id)
    return Columns(_kinds(f.type, None if facts is None else facts.one_type), ids, label, label_f, has_score,
                   has_probs, has_label, scores, probs)


def _kinds(types: Sequence[Any], one: bool | None = None) -> np.ndarray:
    """Event type codes: -1 where omitted, -2 where unknown (``one``: whether every type is the first, a string,
    if known)."""
    n = len(types)
    t0 = types[0] if n else None
    if n and (one if one is not None else t0.__class__ is str and types.count(t0) == n):  # one type for the batch
        return np.full(n, _KIND_CODE.get(str(t0), -2), dtype=np.int8)  # t0 is a str here
    return np.array([-1 if t is None else _KIND_CODE.get(t, -2) for t in types], dtype=np.int8)


def _ids(ids: Sequence[Any]) -> np.ndarray:
    """Ids as strings (``""`` where absent, integers in decimal)."""
    out = np.empty(len(ids), dtype=object)
    if set(map(type, ids)) <= {str}:  # only strings: taken as they are
        out[:] = ids
    else:
        out[:] = ["" if i is None else i if i.__class__ is str else str(i) for i in ids]
    return out



def check_ids(ids: np.ndarray, v: Verdicts, max_bytes: int, chars: int | None = None) -> None:
    """Reject ids longer than ``max_bytes`` in UTF-8 (characters first: a character is at most 4 bytes;
    ``chars``: the longest id's characters, if known)."""
    if not ids.size or (chars if chars is not None else max(map(len, ids))) * 4 <= max_bytes:  # every id short
        return
    lens = np.fromiter(map(len, ids), dtype=np.int64, count=ids.size)
    for j in np.flatnonzero(lens * 4 > max_bytes).tolist():
        s = ids[j]
        if lens[j] > max_bytes or len(s.encode("utf-8", "surrogatepass")) > max_bytes:
            v.reject_one(j, "id_too_long", f"id of {lens[j]} characters exceeds {max_bytes} bytes")


def check_structure(c: Columns, v: Verdicts, has_model: bool | np.ndarray) -> None:
    """Event types (inferred where omitted, written into ``c.kind``), required fields and label sign.

    ``has_model``: whether the events name their model (one flag for all, or one per event)."""
    has_pred = c.has_score | c.has_probs
    inferred = np.where(c.has_label, np.where(has_pred, LABELED, OUTCOME), PREDICTION)
    v.reject(c.kind == -2, "unknown_type", "type must be prediction, outcome or labeled")
    c.kind = np.where(c.kind < 0, inferred, c.kind).astype(np.int8)
    if has_model is not True:
        v.reject(~np.asarray(has_model, dtype=bool) & (c.kind != OUTCOME), "missing_field",
                 "model is required for predictions and labeled events")
    needs_pred = c.kind != OUTCOME
    v.reject(needs_pred & ~has_pred, "missing_field", "score or probs is required")
    v.reject(needs_pred & c.has_score & c.has_probs, "bad_type", "give score or probs, not both")
    v.reject((c.kind != PREDICTION) & ~c.has_label, "missing_field", "label is required")
    v.reject((c.kind != LABELED) & (c.ids == ""), "missing_field", "id is required to join predictions and outcomes")
    v.reject(c.has_label & ((c.label < 0) | (c.label_f != c.label)), "label_range",
             "label must be a non-negative class index")


def binary_scores(c: Columns, v: Verdicts, model: str | Sequence[str] | Mapping[int, str], tol: float) -> np.ndarray:
    """P(y = 1) of binary models' events (from ``score`` or a ``probs`` pair), validated; ``model``: the
    model's name, or one per event (the events of several binary models checked at once: at least those with
    ``probs``, by position)."""
    score = np.array(c.scores, dtype=np.float64)  # None -> NaN
    for j in np.flatnonzero(c.has_probs).tolist():
        p = c.probs[j] or []
        if len(p) != 2:
            name = model if isinstance(model, str) else model[j]
            v.reject_one(j, "k_mismatch", f"model {name[:40]!r} is binary; probs has {len(p)} entries")
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


def class_probs(c: Columns, v: Verdicts, model: str, classes: int, tol: float, known_from: int = 0) -> np.ndarray:
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


def timestamps(f: EventFields, v: Verdicts, slow: np.ndarray | None = None) -> np.ndarray:
    """Event times in epoch seconds (NaN where missing); RFC 3339 strings are parsed one by one.

    Numbers are in ``f.ts_unit`` (divided by ``f.ts_div``; refused with ``f.ts_iso``). ``slow``: the
    events read one by one (default: all of them if any time is a string), the others as one array
    -- the decoder passes the events of the models that sent a string time, so each model's events
    get the same messages as if they were decoded alone."""
    ts_col = f.ts
    if slow is not None and not slow.all():
        ts = _numeric_times(f, v, np.flatnonzero(~slow))
        for j in np.flatnonzero(slow).tolist():
            ts[j] = _one_time(ts_col[j], f, v, j)
        return ts
    if slow is None and str not in set(map(type, ts_col)):
        return _numeric_times(f, v, None)
    ts = np.full(len(ts_col), np.nan)
    for j, t in enumerate(ts_col):
        ts[j] = _one_time(t, f, v, j)
    return ts


def _numeric_times(f: EventFields, v: Verdicts, rows: np.ndarray | None) -> np.ndarray:
    """Numeric times of the events ``rows`` (``None``: all), checked as one array; NaN elsewhere."""
    if rows is None or rows.size == v.n:
        ts = np.array(f.ts, dtype=np.float64)  # None -> NaN
        at: np.ndarray | slice = slice(None)
    else:
        ts = np.full(v.n, np.nan)
        ts[rows] = np.array([f.ts[j] for j in rows.tolist()], dtype=np.float64)
        at = rows
    mask = np.zeros(v.n, bool)
    mask[at] = True
    if f.ts_iso:
        v.reject(mask & ~np.isnan(ts), "bad_timestamp", "ts must be an RFC 3339 string (ts_unit: iso)")
    elif f.ts_div != 1.0:
        ts = ts / f.ts_div
    with np.errstate(invalid="ignore"):
        v.reject(mask & ((ts < 0) | (ts > _MAX_EPOCH)), "bad_timestamp", f"ts is not epoch {f.ts_unit}"
                 + (" (milliseconds are not accepted)" if f.ts_unit == "seconds" else ""))
    return ts


def _one_time(t: object, f: EventFields, v: Verdicts, j: int) -> float:
    """Event ``j``'s time read on its own (NaN if absent or the event is already rejected)."""
    if t is None or v.bad[j] != 0:
        return math.nan
    try:
        if t.__class__ is not str and f.ts_iso:
            raise InvalidEvent("bad_timestamp", "ts must be an RFC 3339 string (ts_unit: iso)")
        return parse_timestamp(t if isinstance(t, str) else float(t) / f.ts_div)  # type: ignore[arg-type]  # a number
    except InvalidEvent as err:
        v.reject_one(j, err.reason, err.detail)
        return math.nan


def orphan_labels(c: Columns, v: Verdicts, bound: np.ndarray) -> np.ndarray:
    """Labels of outcomes without a model against ``bound`` (:meth:`Decoder._orphan_bound
    <calmon.events.decoder.Decoder._orphan_bound>`); their (absent) scores."""
    v.reject(c.has_label & (c.label >= bound), "label_range",
             "label of an outcome without a model must be below the classes of every admitted model "
             "(give the outcome its model)")
    return np.full(v.n, np.nan)


def _mask(n: int, pos: np.ndarray) -> np.ndarray:
    m = np.zeros(n, bool)
    m[pos] = True
    return m
