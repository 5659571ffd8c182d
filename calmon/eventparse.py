"""Raw records -> typed events, one record at a time when needed: the hostile-input edge of the decoder.

:func:`parse_records` turns a batch of raw records (bytes or str, one JSON object each) into
``_Event`` structs or one :class:`Rejection` per record, and never raises: whatever msgspec or the
json module raise for one record (invalid UTF-8, nesting beyond the recursion limit, numbers out of
range, wrong types) becomes that record's reason code. Clean chunks are decoded by one msgspec list
comprehension; only a chunk holding a bad or oversized record is re-read record by record.

Reason codes decided here: ``too_large`` (longer than ``max_record_bytes``; ``len(record)`` is
checked before anything is parsed), ``bad_encoding`` (JSON, but a string holds invalid UTF-8),
``too_deep`` (nested deeper than the parser's recursion limit), ``not_json``, ``not_object``,
``bad_type``, ``non_finite``, ``label_range`` (an integer label beyond 64 bits) and
``id_too_long`` (an integer id beyond 64 bits).

:class:`OversizedRecord` is how a source hands over a record it did not keep whole (a 200 MB line
of a file): its bytes are a bounded prefix, ``len()`` is the real size and ``sha256`` the digest
of the whole record, so the decoder rejects it as ``too_large`` by length and the dead-letter sink
keeps the prefix, size and hash.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Annotated, Any

import msgspec

__all__ = ["OversizedRecord", "Rejection", "InvalidEvent", "EventFields", "parse_records", "fields_of_events",
           "PREFIX_BYTES"]

#: Bytes of an oversized record kept for its dead letter.
PREFIX_BYTES = 4096
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
    label: _LABEL_INT | None = None
    segment: str | None = None


_struct_decoder = msgspec.json.Decoder(_Event)


@dataclass
class EventFields:
    """The raw fields of some events as columns (one list per field, ``None`` where absent), what the decoder
    validates; built from canonical ``_Event`` structs (:func:`fields_of_events`) or by a schema mapping
    (:class:`calmon.schema_decode.MappedReader`).

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


class OversizedRecord(bytes):
    """A record a source did not keep whole: the bytes are its first bytes, ``len()`` its real size.

    Parameters
    ----------
    prefix
        The first bytes of the record (at most :data:`PREFIX_BYTES` are kept).
    size
        The record's length in bytes.
    sha256
        Hex SHA-256 of the whole record.

    Examples
    --------
    >>> r = OversizedRecord(b"x" * 10_000, 200_000_000, "ab" * 32)
    >>> len(r), len(bytes(r)), r.sha256[:4]
    (200000000, 4096, 'abab')
    """

    size: int
    sha256: str

    def __new__(cls, prefix: bytes, size: int, sha256: str) -> OversizedRecord:
        self = super().__new__(cls, prefix[:PREFIX_BYTES])
        self.size = int(size)
        self.sha256 = sha256
        return self

    def __len__(self) -> int:
        return self.size


def parse_records(records: list[bytes], max_bytes: float = math.inf) -> tuple[list[_Event | None], list[Rejection]]:
    """msgspec-decode every record; ``None`` and a :class:`Rejection` for each rejected one."""
    events: list[_Event | None] = []
    rejected: list[Rejection] = []
    dec = _struct_decoder.decode
    for start in range(0, len(records), _CHUNK):
        chunk = records[start:start + _CHUNK]
        if chunk and max(map(len, chunk)) <= max_bytes:
            try:
                events.extend([dec(rec) for rec in chunk])
                continue
            except (ValueError, TypeError, RecursionError):  # DecodeError and UnicodeDecodeError are ValueErrors
                pass
        for i, rec in enumerate(chunk, start):
            try:
                events.append(_parse_one(rec, max_bytes))
            except InvalidEvent as e:
                events.append(None)
                rejected.append(Rejection(i, e.reason, e.detail))
    return events, rejected


def _parse_one(rec: bytes | str, max_bytes: float) -> _Event:
    if len(rec) > max_bytes:
        raise InvalidEvent("too_large", f"record of {len(rec)} bytes exceeds the limit of {max_bytes:.0f}")
    try:
        return _struct_decoder.decode(rec)
    except (ValueError, TypeError, RecursionError):
        return _slow_decode(rec)


_FIELD_TYPES: dict[str, tuple[type, ...]] = {
    "type": (str,), "id": (str, int), "model": (str,), "ts": (int, float, str), "score": (int, float),
    "label": (int,), "segment": (str,),
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
        if isinstance(v, bool) or not isinstance(v, types):
            raise InvalidEvent("bad_type", f"field {name!r} has type {type(v).__name__}")
        if isinstance(v, float) and not math.isfinite(v):
            raise InvalidEvent("non_finite", f"field {name!r} is {v}")
        lo, hi = _INT_RANGE.get(name, (-(1 << 63), (1 << 63) - 1))
        if isinstance(v, int) and not lo <= v <= hi:
            raise InvalidEvent(_HUGE_INT.get(name, "bad_type"), f"field {name!r} is an integer beyond 64 bits")
    probs = obj.get("probs")
    if probs is not None:
        _check_probs(probs)
    try:
        return msgspec.convert({k: v for k, v in obj.items() if k in _Event.__struct_fields__}, _Event)
    except msgspec.ValidationError as e:
        raise InvalidEvent("bad_type", str(e)[:200]) from None
