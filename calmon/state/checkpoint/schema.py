"""The schema of the agent's checkpoint document, checked before any of it is used.

A checkpoint may be edited by hand (``"sha256": null`` makes the store accept an edited file,
see :mod:`calmon.state.checkpoint.store`), so the agent validates the document's structure before it
touches it: a missing key or a value of the wrong type gives one :class:`SchemaError` naming
the field (``join.pending.ts.3: must be a number, got 'x'``), never a ``KeyError`` traceback.

The schema is declarative: a spec is a type name (``"str"``, ``"int"``, ``"num"``, ``"bool"``,
``"any"``, ``"obj"`` for any mapping), a :class:`Opt` (nullable), a :class:`ListOf`, a
:class:`MapOf` (string keys) or a ``dict`` of field -> spec (a field whose name ends in ``?``
may be absent; keys not listed are allowed, for forward compatibility). Parts owned by other
rooms (the rings of a model, calibrator documents) are checked only at their top level here;
their own ``from_dict`` reports deeper damage, which the state loader names by model.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Union

__all__ = ["SchemaError", "CHECKPOINT_SCHEMA", "validate", "validate_checkpoint"]


class SchemaError(ValueError):
    """A document does not fit its schema; ``field`` is the dotted path of the first bad value."""

    def __init__(self, field: str, why: str) -> None:
        super().__init__(f"field {field or '(top)'}: {why}")
        self.field = field
        self.why = why


@dataclass(frozen=True)
class Opt:
    """``spec`` or null."""

    spec: Spec


@dataclass(frozen=True)
class ListOf:
    """A list whose items all fit ``spec``."""

    spec: Spec


@dataclass(frozen=True)
class MapOf:
    """A mapping with string keys whose values all fit ``spec``."""

    spec: Spec


Spec = Union[str, Opt, ListOf, MapOf, dict[str, Any]]  # noqa: UP007 - a runtime alias, evaluated at import

_COUNTS = MapOf("int")
CHECKPOINT_SCHEMA: dict[str, Any] = {
    "format": "str", "version": "int", "created": "num",
    "decoder": {"models?": _COUNTS, "segments?": MapOf(ListOf("str")), "names?": ListOf("str")},
    "join": {
        "version?": "int", "ttl": "num", "max_pending": "int", "watermark": Opt("num"), "next_sweep?": Opt("num"),
        "pending": {"ids": ListOf("str"), "models": ListOf("str"), "ts": ListOf("num"),
                    "segments": ListOf("str"), "widths": ListOf("int"), "payload": "any"},
        "early": {"ids": ListOf("str"), "models": ListOf("str"), "ts": ListOf("num"), "labels": ListOf("int")},
        "classes": _COUNTS,
        "counters": {"joined": _COUNTS, "expired": _COUNTS, "duplicates": _COUNTS, "orphans": "int"},
    },
    "models": MapOf({"name": "str", "params": {"classes": "int", "bins": "int", "reservoir": "int"},
                     "tiers": ListOf(ListOf("num")), "segments": ListOf("str"), "rings": MapOf("obj")}),
    "counters": {"events": ListOf(ListOf("any")), "rejected": _COUNTS, "late": _COUNTS, "records": _COUNTS,
                 "batches": "int"},
    "sources": MapOf("any"),
    "dead_letter?": "any",
    "alerts?": Opt("obj"),
    "calibrators?": Opt(MapOf("obj")),
}

_SCALARS = {
    "str": (lambda v: isinstance(v, str), "a string"),
    "int": (lambda v: isinstance(v, int) and not isinstance(v, bool), "an integer"),
    "num": (lambda v: isinstance(v, int | float) and not isinstance(v, bool), "a number"),
    "bool": (lambda v: isinstance(v, bool), "true or false"),
    "obj": (lambda v: isinstance(v, Mapping), "an object"),
    "any": (lambda v: True, "anything"),
}


def _short(v: Any) -> str:
    text = repr(v)
    return text if len(text) <= 60 else text[:57] + "..."


def validate(doc: Any, spec: Spec, path: str = "") -> None:
    """Raise :class:`SchemaError` naming the first field of ``doc`` that does not fit ``spec``.

    Examples
    --------
    >>> validate({"a": [1, 2.5]}, {"a": ListOf("num"), "b?": "str"})
    >>> try:
    ...     validate({"a": [1, "x"]}, {"a": ListOf("num")})
    ... except SchemaError as exc:
    ...     print(exc)
    field a.1: must be a number, got 'x'
    """
    if isinstance(spec, Opt):
        if doc is not None:
            validate(doc, spec.spec, path)
        return
    if isinstance(spec, str):
        ok, what = _SCALARS[spec]
        if not ok(doc):
            raise SchemaError(path, f"must be {what}, got {_short(doc)}")
        return
    sep = "." if path else ""
    if isinstance(spec, ListOf):
        if not isinstance(doc, list):
            raise SchemaError(path, f"must be a list, got {_short(doc)}")
        for i, v in enumerate(doc):
            validate(v, spec.spec, f"{path}{sep}{i}")
        return
    if not isinstance(doc, Mapping):
        raise SchemaError(path, f"must be an object, got {_short(doc)}")
    if isinstance(spec, MapOf):
        for k, v in doc.items():
            validate(v, spec.spec, f"{path}{sep}{k}")
        return
    for key, sub in spec.items():
        name = key.rstrip("?")
        if name not in doc:
            if key.endswith("?"):
                continue
            raise SchemaError(f"{path}{sep}{name}", "missing")
        validate(doc[name], sub, f"{path}{sep}{name}")


def validate_checkpoint(doc: Any) -> None:
    """Check the agent's checkpoint document: :data:`CHECKPOINT_SCHEMA` plus the join buffers' shapes."""
    validate(doc, CHECKPOINT_SCHEMA)
    for part in ("pending", "early"):
        cols = doc["join"][part]
        lengths = {k: len(v) for k, v in cols.items() if isinstance(v, list)}
        if len(set(lengths.values())) > 1:
            raise SchemaError(f"join.{part}", f"columns of different lengths {lengths}")
    for i, row in enumerate(doc["counters"]["events"]):
        if len(row) != 3 or not isinstance(row[2], int):
            raise SchemaError(f"counters.events.{i}", f"must be [model, kind, count], got {_short(row)}")
