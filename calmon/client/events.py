"""Canonical events built and checked on the serving side, standard library only.

:func:`prediction_event`, :func:`outcome_event` and :func:`labeled_event` return the JSON line of
one event in the schema :class:`calmon.events.decoder.Decoder` reads (README "Events"), or raise
:class:`InvalidEventError` with one of the decoder's reason codes. The checks are the decoder's,
done cheaply on Python scalars, so an event that leaves the emitter is not dead-lettered later;
numpy scalars and arrays are accepted without importing numpy (``tolist()`` / ``float()`` /
``operator.index()``). A value whose own conversion raises (a ``__float__`` that fails) is invalid
(``bad_type``), like one that has none; a ``probs`` longer than the agent's class limit is refused
from its length, before any element is converted.

Examples
--------
>>> prediction_event("fraud", "r-1", score=0.25, ts=1767225600.0)
b'{"type":"prediction","id":"r-1","model":"fraud","ts":1767225600.0,"score":0.25}\\n'
>>> outcome_event("r-1", 1, ts=1767225700.0)
b'{"type":"outcome","id":"r-1","ts":1767225700.0,"label":1}\\n'
>>> try:
...     prediction_event("fraud", "r-2", score=1.5)
... except InvalidEventError as e:
...     print(e.reason)
out_of_range
"""

from __future__ import annotations

import json
import math
import operator
import re
from collections.abc import Sequence
from datetime import datetime
from typing import Any

__all__ = ["MAX_CLASSES", "InvalidEventError", "prediction_event", "outcome_event", "labeled_event", "check_ts"]

_NAME_RE = re.compile(r"[A-Za-z0-9_.:/\-]{1,128}\Z")
_MAX_EPOCH = 1e11  # the decoder rejects larger numbers as probable milliseconds
_MAX_ID_BYTES = 256  # the decoder's default limits.max_id_bytes
#: Classes of a ``probs`` at most: the decoder's default ``limits.max_classes`` (longer ones are rejected as
#: ``too_many_classes``); an agent configured with a larger limit goes with ``max_classes=`` of the emitter.
MAX_CLASSES = 1000
_PROB_TOL = 1e-3  # the decoder's default sum(probs) tolerance
_INT64 = (-(1 << 63), (1 << 63) - 1)
_dumps = json.JSONEncoder(separators=(",", ":"), allow_nan=False).encode


class InvalidEventError(ValueError):
    """An event the decoder would reject; ``reason`` is its reason code (``calmon.events.decoder.REASONS``)."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail


def _name(value: object, field: str) -> str:
    if not isinstance(value, str):
        raise InvalidEventError("bad_type", f"{field} must be a string, got {type(value).__name__}")
    if not _NAME_RE.match(value):
        raise InvalidEventError("bad_type", f"{field} {value[:40]!r} is not [A-Za-z0-9_.:/-]{{1,128}}")
    return value


def _id(value: object) -> str | int:
    if isinstance(value, str):
        if not value:
            raise InvalidEventError("missing_field", "id is empty")
        if len(value) * 4 > _MAX_ID_BYTES and len(value.encode()) > _MAX_ID_BYTES:
            raise InvalidEventError("id_too_long", f"id of {len(value)} characters exceeds {_MAX_ID_BYTES} bytes")
        return value
    if isinstance(value, bool):
        raise InvalidEventError("bad_type", "id must be a string or an integer, got bool")
    try:
        i = operator.index(value)  # type: ignore[arg-type]  # int and numpy integers; others are bad_type
    except TypeError:
        raise InvalidEventError("bad_type", f"id must be a string or an integer, got {type(value).__name__}") from None
    except Exception as exc:  # noqa: BLE001 - the value's own __index__ may raise anything
        raise _raised("id", value, exc) from None
    if not _INT64[0] <= i <= _INT64[1]:
        raise InvalidEventError("id_too_long", "an integer id must fit in 64 bits")
    return i


def _raised(field: str, value: object, exc: Exception) -> InvalidEventError:
    """``bad_type`` for a value whose own conversion hook raised ``exc`` (only type names: its text may raise too)."""
    return InvalidEventError("bad_type", f"{field}: converting a {type(value).__name__} raised {type(exc).__name__}")


def _float(value: object, field: str) -> float:
    if isinstance(value, str | bytes | bool) or value is None:
        raise InvalidEventError("bad_type", f"{field} must be a number, got {type(value).__name__}")
    try:
        x = float(value)  # type: ignore[arg-type]  # numbers and numpy scalars; anything else is bad_type
    except (TypeError, ValueError):
        raise InvalidEventError("bad_type", f"{field} must be a number, got {type(value).__name__}") from None
    except Exception as exc:  # noqa: BLE001 - the value's own __float__ may raise anything
        raise _raised(field, value, exc) from None
    if not math.isfinite(x):
        raise InvalidEventError("non_finite", f"{field} is {x}")
    return x


def _score(value: object) -> float:
    x = _float(value, "score")
    if not 0.0 <= x <= 1.0:
        raise InvalidEventError("out_of_range", f"score {x!r} is outside [0, 1]")
    return x


def _probs(value: object, max_classes: int = MAX_CLASSES) -> list[float]:
    try:
        n = len(value)  # type: ignore[arg-type]  # checked before anything is converted
    except Exception:  # noqa: BLE001 - no length (bad_type below), or a __len__ that raises
        n = 0
    if n > max_classes:
        raise InvalidEventError("too_many_classes", f"probs has {n} classes, more than the limit of {max_classes}")
    try:
        tolist = getattr(value, "tolist", None)
        seq = tolist() if callable(tolist) else value  # numpy arrays become (nested) lists
    except Exception as exc:  # noqa: BLE001 - the value's own tolist may raise anything
        raise _raised("probs", value, exc) from None
    if isinstance(seq, str | bytes) or not isinstance(seq, Sequence):
        raise InvalidEventError("bad_type", f"probs must be a sequence of numbers, got {type(value).__name__}")
    try:
        out = [_float(p, "probs") for p in seq]
    except InvalidEventError:
        raise
    except Exception as exc:  # noqa: BLE001 - a sequence's own __getitem__/__iter__ may raise anything
        raise _raised("probs", value, exc) from None
    if len(out) > max_classes:  # a sequence whose len() did not tell
        raise InvalidEventError("too_many_classes", f"probs has {len(out)} classes, more than the limit of "
                                f"{max_classes}")
    if len(out) < 2:
        raise InvalidEventError("bad_type", f"probs needs at least 2 classes, got {len(out)}")
    if min(out) < 0.0 or max(out) > 1.0:
        raise InvalidEventError("out_of_range", "probs must lie in [0, 1]")
    if abs(math.fsum(out) - 1.0) > _PROB_TOL:
        raise InvalidEventError("probs_sum", f"probs sum to {math.fsum(out):.6g}, not 1")
    return out


def _label(value: object) -> int:
    if isinstance(value, str | bytes) or value is None:
        raise InvalidEventError("bad_type", f"label must be a class index, got {type(value).__name__}")
    try:
        i = operator.index(value)  # type: ignore[arg-type]  # int, bool and numpy integers
    except TypeError:
        x = _float(value, "label")  # an integral float (numpy label arrays are often float)
        if x != int(x):
            raise InvalidEventError("bad_type", f"label {x!r} is not an integer") from None
        i = int(x)
    except Exception as exc:  # noqa: BLE001 - the value's own __index__ may raise anything
        raise _raised("label", value, exc) from None
    if not 0 <= i <= _INT64[1]:
        raise InvalidEventError("label_range", f"label {i} is not a class index >= 0")
    return i


def check_ts(value: object) -> float | str:
    """Epoch seconds (number, aware ``datetime``) or an RFC 3339 string with offset, checked.

    >>> check_ts("2026-01-01T00:00:00Z"), check_ts(1767225600)
    ('2026-01-01T00:00:00Z', 1767225600.0)
    """
    if isinstance(value, datetime):
        if value.tzinfo is None:
            raise InvalidEventError("bad_timestamp", "ts datetime has no timezone")
        return value.timestamp()
    if isinstance(value, str):
        try:
            dt = datetime.fromisoformat(value.replace("z", "Z").replace("Z", "+00:00"))
        except ValueError:
            raise InvalidEventError("bad_timestamp", f"ts {value[:40]!r} is not RFC 3339") from None
        if dt.tzinfo is None:
            raise InvalidEventError("bad_timestamp", f"ts {value[:40]!r} has no UTC offset")
        return value
    x = _float(value, "ts")
    if not 0.0 <= x <= _MAX_EPOCH:
        raise InvalidEventError("bad_timestamp", f"ts {x!r} is not epoch seconds (milliseconds are not accepted)")
    return x


def _scores(score: object, probs: object, max_classes: int) -> tuple[str, Any]:
    if score is not None and probs is not None:
        raise InvalidEventError("bad_type", "give score or probs, not both")
    if score is not None:
        return "score", _score(score)
    if probs is not None:
        return "probs", _probs(probs, max_classes)
    raise InvalidEventError("missing_field", "score or probs is required")


def _line(doc: dict[str, Any]) -> bytes:
    return (_dumps(doc) + "\n").encode()


def prediction_event(model: object, id: object, score: object = None, probs: object = None,  # noqa: A002
                     segment: object = None, ts: object = None, *, max_classes: int = MAX_CLASSES) -> bytes:
    """The JSON line of a prediction (``ts=None`` leaves the time to the agent's arrival clock;
    ``max_classes``: the agent's ``limits.max_classes``)."""
    doc: dict[str, Any] = {"type": "prediction", "id": _id(id), "model": _name(model, "model")}
    if ts is not None:
        doc["ts"] = check_ts(ts)
    key, value = _scores(score, probs, max_classes)
    doc[key] = value
    if segment is not None:
        doc["segment"] = _name(segment, "segment")
    return _line(doc)


def outcome_event(id: object, label: object, ts: object = None, model: object = None) -> bytes:  # noqa: A002
    """The JSON line of an outcome (the label of an earlier prediction with the same id)."""
    doc: dict[str, Any] = {"type": "outcome", "id": _id(id)}
    if model is not None:
        doc["model"] = _name(model, "model")
    if ts is not None:
        doc["ts"] = check_ts(ts)
    doc["label"] = _label(label)
    return _line(doc)


def labeled_event(model: object, label: object, id: object, score: object = None,  # noqa: A002
                  probs: object = None, segment: object = None, ts: object = None, *,
                  max_classes: int = MAX_CLASSES) -> bytes:
    """The JSON line of a prediction that already carries its label."""
    doc: dict[str, Any] = {"type": "labeled", "id": _id(id), "model": _name(model, "model")}
    if ts is not None:
        doc["ts"] = check_ts(ts)
    key, value = _scores(score, probs, max_classes)
    doc[key] = value
    doc["label"] = _label(label)
    if segment is not None:
        doc["segment"] = _name(segment, "segment")
    return _line(doc)
