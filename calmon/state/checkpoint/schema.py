"""The checkpoint format in one place: the names and versions of its files and documents, and their schema.

A checkpoint directory holds (see :mod:`calmon.state.checkpoint.store` and :mod:`calmon.state.checkpoint.packs`):

* manifests ``checkpoint-<generation>.json``: :data:`FORMAT` version :data:`VERSION` (versions 1 and 2 are
  still read), head fields :class:`ManifestDoc`, whose ``state`` is the agent's document below;
* packs ``pack-<generation>.jsonl``: :data:`PACK_FORMAT` version :data:`PACK_VERSION`, one blob a line,
  referred to by :class:`BlobRef` values inside the state (read back as :class:`BlobRefDoc`);
* the agent's state document, :data:`STATE_FORMAT` version :data:`STATE_VERSION` (:data:`STATE_READABLE`):
  :class:`StateDoc` (its models' windows, :class:`ModelDoc`, are also the windows of a cluster snapshot,
  :mod:`calmon.cluster.snapshots`).

The bucket blobs are ``calmon.bucket`` documents, owned by :mod:`calmon.state.buckets` (``PACKED_VERSION``,
``PACKED_PREFIX``) and :mod:`calmon.stats.packed`; the rings holding them by :mod:`calmon.state.windows`.

Validation
----------
A checkpoint may be edited by hand (``"sha256": null`` makes the store accept an edited file), so the agent
checks the document's structure before it touches it: a missing key or a value of the wrong type gives one
:class:`SchemaError` naming the field (``field join.pending.ts.3: must be a number, got 'x'``), never a
``KeyError`` traceback.  The schema is a set of :class:`msgspec.Struct` types checked by :func:`convert`
(:func:`msgspec.convert`: strict types, an ``int`` is no ``bool``, a ``float`` field takes an ``int``); keys
not listed are allowed, for forward compatibility.  Parts owned by other rooms (the rings of a model,
calibrator documents, alert states) are checked only at their top level here; their own ``from_dict``
reports deeper damage, which the state loader names by model.
"""

from __future__ import annotations

import re
import types
from typing import Annotated, Any, TypedDict, TypeVar, Union, get_args, get_origin

import msgspec

__all__ = ["FORMAT", "VERSION", "PACK_FORMAT", "PACK_VERSION", "STATE_FORMAT", "STATE_VERSION", "STATE_READABLE",
           "SchemaError", "BlobRef", "BlobRefDoc", "ManifestDoc", "ModelDoc", "StateDoc", "convert",
           "validate_checkpoint"]

#: The manifest file of a generation.  Version 3: bucket blobs may be packed ``calmon.bucket`` version-2
#: documents; 2: buckets as blob references into packs; 1: no packs, every bucket inline.
FORMAT = "calmon-checkpoint"
VERSION = 3
#: The pack file of a generation (its first line).
PACK_FORMAT = "calmon-checkpoint-pack"
PACK_VERSION = 1
#: The agent's state document (a manifest's ``state``).  Version 2: buckets as blob references (incremental);
#: 1: every bucket inline.
STATE_FORMAT = "calmon.agent_state"
STATE_VERSION = 2
STATE_READABLE = (1, 2)

T = TypeVar("T")
_Count = dict[str, int]


class SchemaError(ValueError):
    """A document does not fit its schema; ``field`` is the dotted path of the first bad value."""

    def __init__(self, field: str, why: str) -> None:
        super().__init__(f"field {field or '(top)'}: {why}")
        self.field = field
        self.why = why


# -- the manifest and the pack -----------------------------------------------------------------------------------
class ManifestDoc(msgspec.Struct):
    """A manifest's fields (``generation`` and ``created`` are not read: the file name holds the generation)."""

    format: str
    version: int
    packs: list[int] | None = None  #: the generations of the packs ``state`` refers to
    sha256: str | None = None  #: of the bytes of ``state`` as written (null: an edited file, not checked)
    state: dict[str, Any] | None = None  #: absent when only the head was read


class BlobRef(TypedDict):
    """A blob reference as the writer makes it (a JSON object inside the state; read back as :class:`BlobRefDoc`)."""

    pack: int
    at: int
    len: int
    crc: int | None


class BlobRefDoc(msgspec.Struct):
    """Where a blob lives: pack generation, byte offset, length, CRC-32 (null or absent: not checked)."""

    pack: int
    at: Annotated[int, msgspec.Meta(ge=0)]
    len: Annotated[int, msgspec.Meta(ge=0)]
    crc: int | None = None


# -- the agent's state document ----------------------------------------------------------------------------------
class DecoderDoc(msgspec.Struct):
    models: _Count = {}
    segments: dict[str, list[str]] = {}
    names: list[str] = []


def _same_lengths(cols: dict[str, Any]) -> None:
    lengths = {k: len(v) for k, v in cols.items() if isinstance(v, list)}
    if len(set(lengths.values())) > 1:
        raise ValueError(f"columns of different lengths {lengths}")


class PendingDoc(msgspec.Struct):
    """Predictions waiting for their label, as columns (``payload``: the scores, see ``Joiner.to_dict``)."""

    ids: list[str]
    models: list[str]
    ts: list[float]
    segments: list[str]
    widths: list[int]
    payload: Any

    def __post_init__(self) -> None:
        _same_lengths({"ids": self.ids, "models": self.models, "ts": self.ts, "segments": self.segments,
                       "widths": self.widths, "payload": self.payload})


class EarlyDoc(msgspec.Struct):
    """Labels that arrived before their prediction, as columns."""

    ids: list[str]
    models: list[str]
    ts: list[float]
    labels: list[int]

    def __post_init__(self) -> None:
        _same_lengths({"ids": self.ids, "models": self.models, "ts": self.ts, "labels": self.labels})


class JoinCountersDoc(msgspec.Struct):
    joined: _Count
    expired: _Count
    duplicates: _Count
    orphans: int


class JoinDoc(msgspec.Struct):
    ttl: float
    max_pending: int
    watermark: float | None
    pending: PendingDoc
    early: EarlyDoc
    classes: _Count
    counters: JoinCountersDoc
    version: int = 1
    next_sweep: float | None = None
    #: Added with #31.1/#32.4 (absent from older checkpoints, which still restore): per-source event times,
    #: early outcomes without a time, label delays (``Joiner.to_dict``; checked by ``LabelDelays.from_dict``).
    sources: dict[str, float] = {}
    untimed: list[str] = []
    delays: dict[str, Any] | None = None


class ParamsDoc(msgspec.Struct):
    classes: int
    bins: int
    reservoir: int


class ModelDoc(msgspec.Struct):
    """One model's windows (``ModelWindows.to_dict``); each ring is checked by ``TieredRing.from_dict``."""

    name: str
    params: ParamsDoc
    tiers: list[list[float]]
    segments: list[str]
    rings: dict[str, dict[str, Any]]


class CountersDoc(msgspec.Struct):
    events: list[tuple[Any, Any, int]]  #: [model, kind, count] rows
    rejected: _Count
    late: _Count
    records: _Count
    batches: int


class StateDoc(msgspec.Struct):
    """The agent's checkpoint document: the runtime's head (format, positions, alerts, calibrators) and the
    state's parts (``AgentState.to_doc``; ``changes`` is checked by the change monitor's own loader)."""

    format: str
    version: int
    created: float
    decoder: DecoderDoc
    join: JoinDoc
    models: dict[str, ModelDoc]
    counters: CountersDoc
    sources: dict[str, Any]
    dead_letter: Any = None
    alerts: dict[str, Any] | None = None
    calibrators: dict[str, dict[str, Any]] | None = None


def validate_checkpoint(doc: Any) -> StateDoc:
    """Check the agent's checkpoint document against :class:`StateDoc`; :class:`SchemaError` names the field."""
    return convert(doc, StateDoc)


# -- validation with errors named by field -----------------------------------------------------------------------
def convert(doc: Any, into: type[T]) -> T:
    """``doc`` (JSON values) checked and converted into type ``into``, an error named by its field.

    Raises
    ------
    SchemaError
        The first value that does not fit, by its dotted path (``models.m.tiers.0``: msgspec's own path
        does not name mapping keys, so the key is found by checking the mapping's values one by one).

    Examples
    --------
    >>> class Doc(msgspec.Struct):
    ...     a: list[float]
    ...     b: dict[str, int] = {}
    >>> convert({"a": [1, 2.5]}, Doc)
    Doc(a=[1.0, 2.5], b={})
    >>> for bad in ({"a": [1, "x"]}, {"a": [], "b": {"k": 1, "j": None}}, {"b": {}}):
    ...     try:
    ...         convert(bad, Doc)
    ...     except SchemaError as exc:
    ...         print(exc)
    field a.1: must be a number, got 'x'
    field b.j: must be an integer, got None
    field a: missing
    """
    try:
        return msgspec.convert(doc, into)
    except msgspec.ValidationError as exc:
        try:
            error = _locate(doc, into, str(exc), "")
        except (LookupError, TypeError, ValueError, AttributeError):  # a path the walk cannot follow: msgspec's words
            why, _, at = str(exc).partition(" - at `$")
            error = SchemaError(at.rstrip("`").lstrip("."), why)
        raise error from None


_AT = re.compile(r"^(?P<why>.*?)(?: - at `(?P<key>key` in `)?\$(?P<path>[^`]*)`)?$", re.S)
_STEP = re.compile(r"\.([^.\[]+)|\[(\d+)\]|\[(\.\.\.)\]")
_MISSING = re.compile(r"^Object missing required field `(.+)`$")
_EXPECTED = re.compile(r"^Expected `([^`]+)`(?: of length (\d+))?( [<>]=? \S+)?(?:, got .*)?$")
_WHAT = {"int": "an integer", "float": "a number", "str": "a string", "bool": "true or false",
         "object": "an object", "array": "a list", "null": "null"}


def _locate(doc: Any, tp: Any, message: str, prefix: str) -> SchemaError:
    """The :class:`SchemaError` of msgspec's ``message`` about ``doc`` (of type ``tp``), its path made dotted."""
    m = _AT.match(message)
    assert m is not None  # the pattern matches any text
    why, node, path = m.group("why"), doc, [prefix] if prefix else []
    for name, index, _keys in _STEP.findall(m.group("path") or ""):
        tp = _unwrap(tp)
        if name:
            tp = {f.encode_name: f.type for f in msgspec.structs.fields(tp)}[name]
            node = node[name]
            path.append(name)
        elif index:
            args = get_args(tp)
            fixed = get_origin(tp) is tuple and args[-1] is not Ellipsis
            tp = args[min(int(index), len(args) - 1)] if fixed else args[0]
            node = node[int(index)]
            path.append(index)
        else:  # a mapping's value: msgspec does not say which, so check them in turn
            value_type = get_args(tp)[1]
            for key, value in node.items():
                try:
                    msgspec.convert(value, value_type)
                except msgspec.ValidationError as exc:
                    return _locate(value, value_type, str(exc), ".".join([*path, str(key)]))
            break  # (not reached: one of them failed)
    else:
        missing = _MISSING.match(why)
        if m.group("key"):
            why = "keys must be strings"
        elif missing:
            return SchemaError(".".join([*path, missing.group(1)]), "missing")
        expected = _EXPECTED.match(why)
        if expected:
            what = " or ".join(_WHAT.get(t, t) for t in expected.group(1).split(" | "))
            if expected.group(2):
                what = f"{what} of {expected.group(2)} items"
            what += expected.group(3) or ""
            text = repr(node)
            why = f"must be {what}, got {text if len(text) <= 60 else text[:57] + '...'}"
        elif why[:1].isupper() and not why[1:2].isupper():
            why = why[0].lower() + why[1:]
    return SchemaError(".".join(path), why)


def _unwrap(tp: Any) -> Any:
    """``X`` of ``X | None`` (the value being walked into is not null)."""
    if get_origin(tp) in (Union, types.UnionType):
        args = [a for a in get_args(tp) if a is not type(None)]
        if len(args) == 1:
            return _unwrap(args[0])
    if get_origin(tp) is Annotated:
        return get_args(tp)[0]
    return tp
