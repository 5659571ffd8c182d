"""Raw records -> typed events, one record at a time when needed: the hostile-input edge of the decoder.

:func:`parse_records` turns a batch of raw records (bytes or str, one JSON object each) into
``_Event`` structs or one :class:`Rejection` per record, and never raises: whatever msgspec or the
json module raise for one record (invalid UTF-8, nesting beyond the recursion limit, numbers out of
range, wrong types) becomes that record's reason code. Clean chunks are decoded by one msgspec list
comprehension; only a chunk holding a bad or oversized record is re-read record by record.
:func:`parse_columns` does the same and hands over the fields as columns (what the decoder reads), taken
chunk by chunk with the :class:`BatchFacts` that let its checks take their batch-wide routes.

Reason codes decided here: ``too_large`` (longer than ``max_record_bytes``; ``len(record)`` is
checked before anything is parsed), ``bad_encoding`` (JSON, but a string holds invalid UTF-8),
``too_deep`` (nested deeper than the parser's recursion limit), ``not_json``, ``not_object``,
``bad_type``, ``non_finite``, ``label_range`` (an integer label beyond 64 bits) and
``id_too_long`` (an integer id beyond 64 bits).

:class:`~calmon.formats.records.OversizedRecord` is how a source hands over a record it did not keep whole (a 200 MB
line
of a file): its bytes are a bounded prefix, ``len()`` is the real size and ``sha256`` the digest
of the whole record, so the decoder rejects it as ``too_large`` by length and the dead-letter sink
keeps the prefix, size and hash.
"""

from __future__ import annotations

import json
import math
from collections import defaultdict
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from itertools import count
from typing import Annotated, Any

import msgspec
import numpy as np

from calmon.formats.records import PREFIX_BYTES, OversizedRecord

__all__ = ["OversizedRecord", "Rejection", "InvalidEvent", "EventFields", "BatchFacts", "ParsedColumns",
           "parse_records", "parse_columns", "fields_of_events", "PREFIX_BYTES"]

_CHUNK = 1024
_INT_RANGE = {"id": (-(1 << 63), (1 << 63) - 1), "label": (-(1 << 63), (1 << 63) - 1)}
_ID_INT = Annotated[int, msgspec.Meta(ge=_INT_RANGE["id"][0], le=_INT_RANGE["id"][1])]
_LABEL_INT = Annotated[int, msgspec.Meta(ge=_INT_RANGE["label"][0], le=_INT_RANGE["label"][1])]
# a number field's code when a huge integer makes it unusable
_HUGE_INT = {"label": "label_range", "id": "id_too_long", "ts": "bad_timestamp", "score": "out_of_range"}


class _Event(msgspec.Struct, gc=False):
    # gc=False: a batch's tens of thousands of events are not tracked by the cyclic garbage collector (they
    # hold only strings, numbers and a list of floats, so never a cycle); tracked, they were promoted to the
    # old generation and made full collections -- which traverse the whole state, a per-model cost -- frequent
    type: str | None = None
    id: str | _ID_INT | None = None
    model: str | None = None
    ts: float | str | None = None
    score: float | None = None
    probs: list[float] | None = None
    label: _LABEL_INT | bool | None = None  # a boolean label is 1 (true) or 0 (false), as in scikit-learn
    segment: str | None = None


_struct_decoder = msgspec.json.Decoder(_Event)


@dataclass
class EventFields:
    """The raw fields of some events as columns (one list per field, ``None`` where absent), what the decoder
    validates; built from canonical ``_Event`` structs (:func:`fields_of_events`) or by a schema mapping
    (:class:`calmon.events.mapped.MappedReader`).

    ``ts_div`` divides numeric times into seconds (1000 for milliseconds), ``ts_iso`` rejects numeric times,
    ``ts_unit`` names the unit in messages, and ``rejects`` holds ``(position, reason, detail)`` of events a
    mapping already refused (their values are ``None``).
    """

    type: Sequence[Any]
    id: Sequence[Any]
    ts: Sequence[Any]
    score: Sequence[Any]
    probs: Sequence[Any]
    label: Sequence[Any]
    segment: Sequence[Any]
    ts_div: float = 1.0
    ts_iso: bool = False
    ts_unit: str = "seconds"
    rejects: list[tuple[int, str, str]] = field(default_factory=list)
    facts: BatchFacts | None = None


@dataclass
class BatchFacts:
    """What the decoder's checks need to know of whole columns, gathered by :func:`parse_columns` chunk by chunk
    while the chunk's values are in the CPU cache (each later pass over a batch's values missed it value by
    value). Every fact is exact: the checks take their batch-wide route only on it."""

    ids_str: bool = True  # every id is a string
    id_chars: int = 0  # the longest id, in characters (with ids_str)
    one_type: bool = True  # every type equals the first record's, a string
    scores: bool = True  # every record has a score
    segments: bool = True  # every record has a segment
    ts_str: bool = False  # some time is a string
    one_model: bool = True  # every model equals the first record's
    segment_names: set[Any] = field(default_factory=set)  # the distinct segments
    #: the ids and segments as object arrays, filled chunk by chunk (valid with ids_str, with segments)
    id_array: np.ndarray = field(default_factory=lambda: np.empty(0, dtype=object))
    segment_array: np.ndarray = field(default_factory=lambda: np.empty(0, dtype=object))
    #: once a second model is seen: each record's model numbered in order of first appearance (rejected records
    #: count as ``None``), and the distinct models in that order
    model_codes: np.ndarray | None = None
    model_names: list[Any] = field(default_factory=list)

    def add(self, t: list[Any], i: list[Any], ts: list[Any], sc: list[Any], seg: list[Any], mod: list[Any],
            first_type: Any, first_model: Any) -> None:
        """Take in one chunk's columns."""
        n = len(t)
        if self.ids_str:
            try:  # an id is a str, an int or None (the struct's types): len() fails exactly on the others
                self.id_chars = max(self.id_chars, max(map(len, i), default=0))
            except TypeError:
                self.ids_str, self.id_chars = False, 0
        self.one_type = self.one_type and first_type.__class__ is str and t.count(first_type) == n
        self.scores = self.scores and None not in sc
        names = set(seg)  # a few distinct segments: one pass over the chunk for both facts
        self.segments = self.segments and None not in names
        self.segment_names.update(names)
        self.ts_str = self.ts_str or str in set(map(type, ts))
        self.one_model = self.one_model and mod.count(first_model) == n


def fields_of_events(evs: list[_Event]) -> EventFields:
    """The columns of canonical events."""
    return EventFields([e.type for e in evs], [e.id for e in evs], [e.ts for e in evs], [e.score for e in evs],
                       [e.probs for e in evs], [e.label for e in evs], [e.segment for e in evs])


@dataclass
class Rejection:
    """A record that failed validation: its index in the batch, reason code and detail."""

    index: int
    reason: str
    detail: str
    origin: str | None = None


class InvalidEvent(ValueError):
    """One record's rejection, raised inside the decoder and turned into a :class:`Rejection`."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail


def _decoded_chunks(records: list[bytes], max_bytes: float, absent: Any, rejected: list[Rejection]
                    ) -> Iterator[tuple[int, list[Any]]]:
    """Each chunk of records decoded: the whole chunk at once when it can be, else record by record, with
    ``absent`` in a rejected record's place and its :class:`Rejection` appended to ``rejected``."""
    dec = _struct_decoder.decode
    fit = not records or max(map(len, records)) <= max_bytes  # every record within the limit: no check per chunk
    for start in range(0, len(records), _CHUNK):
        chunk = records[start:start + _CHUNK]
        if chunk and (fit or max(map(len, chunk)) <= max_bytes):
            try:
                yield start, list(map(dec, chunk))  # the whole chunk or nothing
                continue
            except (ValueError, TypeError, RecursionError):  # DecodeError and UnicodeDecodeError are ValueErrors
                pass
        evs: list[Any] = []
        for i, rec in enumerate(chunk, start):
            try:
                evs.append(_parse_one(rec, max_bytes))
            except InvalidEvent as e:
                evs.append(absent)
                rejected.append(Rejection(i, e.reason, e.detail))
        yield start, evs


def parse_records(records: list[bytes], max_bytes: float = math.inf) -> tuple[list[_Event | None], list[Rejection]]:
    """msgspec-decode every record; ``None`` and a :class:`Rejection` for each rejected one."""
    events: list[_Event | None] = []
    rejected: list[Rejection] = []
    for _, evs in _decoded_chunks(records, max_bytes, None, rejected):
        events.extend(evs)
    return events, rejected


#: An event with every field absent: a rejected record's place in the columns of :func:`parse_columns`.
_ABSENT = _Event()


@dataclass
class ParsedColumns:
    """The canonical fields of a batch's records as columns, ``None`` where absent or the record was rejected."""

    fields: EventFields
    model: list[str | None]


def parse_columns(records: list[bytes], max_bytes: float = math.inf) -> tuple[ParsedColumns, list[Rejection]]:
    """:func:`parse_records` and :func:`fields_of_events` in one pass: each chunk's fields are taken while its
    events are still in the CPU cache (a batch of events is several megabytes; reading each field of all of
    them in turn missed the cache field by field), and the events are let go chunk by chunk."""
    cols: list[list[Any]] = [[], [], [], [], [], [], [], []]
    ty, ids, ts, sc, pr, lab, seg, mod = cols
    rejected: list[Rejection] = []
    n = len(records)
    facts = BatchFacts(id_array=np.empty(n, dtype=object), segment_array=np.empty(n, dtype=object))
    first_type: Any = None
    first_model: Any = None
    numbered: defaultdict[Any, int] | None = None
    codes = np.zeros(0, dtype=np.int64)
    for start, evs in _decoded_chunks(records, max_bytes, _ABSENT, rejected):
        t_c, i_c, ts_c, sc_c, seg_c, m_c = ([e.type for e in evs], [e.id for e in evs], [e.ts for e in evs],
                                            [e.score for e in evs], [e.segment for e in evs], [e.model for e in evs])
        if not start:
            first_type, first_model = t_c[0], m_c[0]
        facts.add(t_c, i_c, ts_c, sc_c, seg_c, m_c, first_type, first_model)
        if not facts.one_model:  # many models: numbered while the chunk's names are in the cache
            if numbered is None:  # every record before this chunk has the first model
                numbered = defaultdict(count(1).__next__, {first_model: 0})
                codes = facts.model_codes = np.zeros(n, dtype=np.int64)
            codes[start:start + len(evs)] = np.fromiter(map(numbered.__getitem__, m_c), np.int64, len(m_c))
        facts.id_array[start:start + len(evs)] = i_c  # while the chunk's values are in the cache
        facts.segment_array[start:start + len(evs)] = seg_c
        ty += t_c
        ids += i_c
        ts += ts_c
        sc += sc_c
        pr += [e.probs for e in evs]
        lab += [e.label for e in evs]
        seg += seg_c
        mod += m_c
    if numbered is not None:
        facts.model_names = list(numbered)
    return ParsedColumns(EventFields(ty, ids, ts, sc, pr, lab, seg, facts=facts), mod), rejected


def _parse_one(rec: bytes | str, max_bytes: float) -> _Event:
    if len(rec) > max_bytes:  # an OversizedRecord names its reason (``decompression_bomb``: the rest of a file)
        raise InvalidEvent(getattr(rec, "reason", "too_large"),
                           f"record of {len(rec)} bytes exceeds the limit of {max_bytes:.0f}")
    try:
        return _struct_decoder.decode(rec)
    except (ValueError, TypeError, RecursionError):
        return _slow_decode(rec)


_FIELD_TYPES: dict[str, tuple[type, ...]] = {
    "type": (str,), "id": (str, int), "model": (str,), "ts": (int, float, str), "score": (int, float),
    "label": (int, bool), "segment": (str,),
}


def _load(rec: bytes | str) -> object:
    """The JSON value of a record msgspec refused, or the reason it has none."""
    if isinstance(rec, (bytes, bytearray, memoryview)):
        text = bytes(rec).decode("utf-8", "surrogateescape").removeprefix("\ufeff")
    elif isinstance(rec, str):
        text = rec
    else:
        raise InvalidEvent("not_json", f"record is a {type(rec).__name__}, not bytes")
    try:
        obj = json.loads(text)
    except RecursionError:
        raise InvalidEvent("too_deep", "record is nested deeper than the parser's recursion limit") from None
    except ValueError:
        raise InvalidEvent("not_json", "record is not valid JSON") from None
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise InvalidEvent("bad_encoding", "record is JSON but holds invalid UTF-8") from None
    return obj


def _check_probs(probs: object) -> None:
    if not isinstance(probs, list) or not all(isinstance(p, (int, float)) and not isinstance(p, bool)
                                              for p in probs):
        raise InvalidEvent("bad_type", "field 'probs' must be a list of numbers")
    if not all(math.isfinite(p) for p in probs if isinstance(p, float)):
        raise InvalidEvent("non_finite", "probs contains NaN or infinity")
    if any(p < 0 or p > 1 for p in probs):  # also what makes huge integers safe to convert
        raise InvalidEvent("out_of_range", "probs must lie in [0, 1]")


def _slow_decode(rec: bytes | str) -> _Event:
    """Re-read a record msgspec rejected, to accept what is valid and name the reason otherwise."""
    obj = _load(rec)
    if not isinstance(obj, dict):
        raise InvalidEvent("not_object", f"record is a JSON {type(obj).__name__}, not an object")
    for name, types in _FIELD_TYPES.items():
        v = obj.get(name)
        if v is None:
            continue
        if (isinstance(v, bool) and bool not in types) or not isinstance(v, types):
            raise InvalidEvent("bad_type", f"field {name!r} has type {type(v).__name__}")
        if isinstance(v, float) and not math.isfinite(v):
            raise InvalidEvent("non_finite", f"field {name!r} is {v}")
        lo, hi = _INT_RANGE.get(name, (-(1 << 63), (1 << 63) - 1))
        if isinstance(v, int) and not isinstance(v, bool) and not lo <= v <= hi:
            raise InvalidEvent(_HUGE_INT.get(name, "bad_type"), f"field {name!r} is an integer beyond 64 bits")
    probs = obj.get("probs")
    if probs is not None:
        _check_probs(probs)
    try:
        return msgspec.convert({k: v for k, v in obj.items() if k in _Event.__struct_fields__}, _Event)
    except msgspec.ValidationError as e:
        raise InvalidEvent("bad_type", str(e)[:200]) from None
