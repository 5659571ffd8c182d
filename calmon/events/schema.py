"""Bring your own schema: the mapping from a user's record shape to calmon's event fields (issue #16).

A mapping says where each calmon field (see :mod:`calmon.events.decoder`) lives in a record::

    fields:                       # calmon field: where it is
      id: prediction_id           # a dotted path ...
      model: /meta/model          # ... or a JSON Pointer (RFC 6901), or {const: fraud}
      score: p
      label: y
      ts: event_time
      segment: meta.country
    ts_unit: ms                   # auto | s | ms | us | ns | iso
    labels: {positive: ["yes", 1]}
    types: {prediction: pred, outcome: outcome, labeled: labeled}

* ``fields`` (``id``, ``model``, ``score``, ``probs``, ``label``, ``ts``, ``segment``, ``type``): a path,
  ``{const: value}``, ``null`` (not read), or transport metadata: ``$timestamp`` (the Kafka record's
  time, epoch milliseconds; for ``ts``), ``$key`` and ``$headers.NAME`` (UTF-8). ``probs`` may also be a
  list of paths, one per class (CSV or Parquet columns). A field left out is read from its canonical
  name (``score`` from ``"score"``), so ``--map score=p`` renames one field.
* ``ts_unit``: the unit of numeric times (``auto``: epoch seconds, numbers above 1e11 rejected as
  ambiguous; ``iso``: RFC 3339 strings only). RFC 3339 strings are read in every unit.
* ``labels``: ``positive`` (binary: the raw values meaning 1; any other value means 0 unless
  ``negative`` lists the values meaning 0) or ``classes`` (multiclass: raw values in class-index
  order; they also order the keys of a ``probs`` object). A raw label the mapping does not know is
  rejected as ``unmapped_label``.
* ``types``: the raw value of each event type; ``probe_records``: after how many records the agent warns
  (once, with counts) about an explicitly mapped path that matched none of them (default 1000; 0 disables the
  probe). Offline reads judge the whole input instead: a path that matched no record at all is an error naming
  the cause (:class:`calmon.events.mapped.MappedReader`, docs/schemas.md).

Every mistake is a :class:`MappingError` whose message is one line naming the key, e.g.
``schema.fields.scroe: unknown field (known: id, label, model, probs, score, segment, ts, type)``.

Examples
--------
>>> m = load_mapping({"fields": {"id": "prediction_id", "model": "meta.model", "score": "p", "label": "y"}})
>>> m.source("model").path, sorted(m.columns)
(('meta', 'model'), ['meta', 'p', 'prediction_id', 'probs', 'segment', 'ts', 'type', 'y'])
>>> mapping_from_options(["ts=event_time", "ts_unit=ms"], m).source("ts").path
('event_time',)
>>> try:
...     load_mapping({"fields": {"scroe": "p"}})
... except MappingError as err:
...     print(err)
schema.fields.scroe: unknown field (known: id, label, model, probs, score, segment, ts, type)
"""

from __future__ import annotations

import argparse
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import yaml

__all__ = ["FIELDS", "MAX_PATH_KEYS", "TS_UNITS", "FieldSource", "Mapping", "MappingError", "load_mapping",
           "mapping_from_options", "add_schema_arguments", "mapping_from_arguments"]

FIELDS: tuple[str, ...] = ("id", "model", "score", "probs", "label", "ts", "segment", "type")
TS_UNITS: tuple[str, ...] = ("auto", "s", "ms", "us", "ns", "iso")
_KINDS = ("prediction", "outcome", "labeled")
_TOP_KEYS = ("fields", "ts_unit", "labels", "types", "probe_records")
#: Most keys in a field path: the nesting of a record's fields is shallow, and each key is one level of the
#: reader built for the mapping (thousands would exhaust the stack, not find a field).
MAX_PATH_KEYS = 64
_META_FIELDS = {"$timestamp": ("ts",), "$key": ("id", "model", "segment", "type", "label"),
                "$headers": ("id", "model", "segment", "type", "label")}
Scalar = str | int | float | bool | None


class MappingError(ValueError):
    """A bad mapping; ``str(err)`` is one line ``"<key.path>: <reason>"``."""


@dataclass(frozen=True)
class FieldSource:
    """Where one calmon field comes from.

    ``kind`` is ``path`` (``path``: keys from the record's root), ``paths`` (``paths``: one path per
    class, ``probs`` only), ``const`` (``value``), ``meta`` (``meta``: ``timestamp``, ``key`` or
    ``header:NAME``) or ``none`` (not read). ``explicit`` is false for the canonical defaults.
    """

    kind: Literal["path", "paths", "const", "meta", "none"]
    path: tuple[str, ...] = ()
    paths: tuple[tuple[str, ...], ...] = ()
    value: Scalar = None
    meta: str = ""
    explicit: bool = True
    spec: Any = None  #: the value as written (for to_dict and messages)

    @property
    def all_paths(self) -> tuple[tuple[str, ...], ...]:
        return (self.path,) if self.kind == "path" else self.paths


@dataclass(frozen=True)
class Mapping:
    """A validated, immutable schema mapping (build it with :func:`load_mapping`).

    Attributes
    ----------
    fields
        ``(calmon field, FieldSource)`` for each of :data:`FIELDS`, in that order.
    ts_unit
        One of :data:`TS_UNITS`.
    positive, negative, classes
        The label mapping (see the module docstring); ``None`` where not given.
    types
        ``(calmon type, raw value)`` pairs.
    probe_records
        Records after which the agent warns about an explicit path that matched none of them (0: no probe).
    where
        Key prefix of error messages (``schema``, ``sources[0].schema``).
    """

    fields: tuple[tuple[str, FieldSource], ...]
    ts_unit: str = "auto"
    positive: tuple[Scalar, ...] | None = None
    negative: tuple[Scalar, ...] | None = None
    classes: tuple[Scalar, ...] | None = None
    types: tuple[tuple[str, Scalar], ...] = ()
    probe_records: int = 1000
    where: str = field(default="schema", compare=False)

    def source(self, name: str) -> FieldSource:
        """The source of calmon field ``name``."""
        return dict(self.fields)[name]

    @property
    def columns(self) -> frozenset[str] | None:
        """Top-level record keys the mapping reads (for column pruning), or ``None`` for all."""
        return frozenset(p[0] for _, s in self.fields for p in s.all_paths if p)

    @property
    def type_map(self) -> dict[Scalar, str] | None:
        """Raw type value -> calmon type (``None`` without ``types``)."""
        return {raw: kind for kind, raw in self.types} if self.types else None

    def to_dict(self) -> dict[str, Any]:
        """The mapping as a document :func:`load_mapping` reads back (explicit fields only)."""
        doc: dict[str, Any] = {"fields": {n: s.spec for n, s in self.fields if s.explicit}, "ts_unit": self.ts_unit,
                               "probe_records": self.probe_records}
        labels = {k: list(v) for k, v in (("positive", self.positive), ("negative", self.negative),
                                          ("classes", self.classes)) if v is not None}
        if labels:
            doc["labels"] = labels
        if self.types:
            doc["types"] = dict(self.types)
        return doc


def load_mapping(source: str | os.PathLike[str] | dict[str, Any], where: str = "schema") -> Mapping:
    """A :class:`Mapping` from a YAML or JSON file, or from a dict (``where``: key prefix of errors).

    Raises
    ------
    MappingError
        One line naming the key.
    """
    if isinstance(source, dict):
        doc: Any = source
    else:
        try:
            text = Path(source).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise MappingError(f"{where}: cannot read {os.fspath(source)!r}: {exc}") from None
        try:
            doc = yaml.safe_load(text)
        except RecursionError:  # the parser recurses per level: a hostile file is nested thousands deep
            raise MappingError(f"{where}: {os.fspath(source)}: nested too deeply to be a schema mapping") from None
        except yaml.YAMLError as exc:
            mark = getattr(exc, "problem_mark", None)  # a MarkedYAMLError's position
            line = mark.line + 1 if mark is not None else "?"
            raise MappingError(f"{where}: {os.fspath(source)}: not YAML/JSON (line {line})") from None
    if not isinstance(doc, dict):
        raise MappingError(f"{where}: must be a mapping with a 'fields' key, got {type(doc).__name__}")
    return _build(doc, where)


def mapping_from_options(items: Sequence[str], base: Mapping | None = None) -> Mapping:
    """``--map`` options on top of ``base``: ``FIELD=PATH`` (a path, ``$key``...), ``FIELD={const: x}``,
    ``probs=[p0,p1,p2]``, and ``ts_unit=ms``, ``labels.positive=[yes]``, ``labels.classes=[a,b,c]``,
    ``types.outcome=out``, ``probe_records=0``. Values are strings, or integers where they are written as
    integers (no YAML booleans: ``yes`` stays the string ``"yes"``).

    Examples
    --------
    >>> m = mapping_from_options(["score=p", "label=y", "labels.positive=[yes]", "model={const: fraud}"])
    >>> m.source("score").path, m.positive, m.source("model").value
    (('p',), ('yes',), 'fraud')
    """
    where = base.where if base is not None else "schema"
    doc = base.to_dict() if base is not None else {"fields": {}}
    for item in items:
        key, sep, raw = item.partition("=")
        key = key.strip()
        if not sep or not key:
            raise MappingError(f"--map {item!r}: expected FIELD=PATH")
        value = _option_value(raw.strip(), item)
        if key in FIELDS:
            doc.setdefault("fields", {})[key] = value if isinstance(value, (list, dict)) else raw.strip() or None
        elif key in ("ts_unit", "probe_records"):
            doc[key] = value
        elif key.partition(".")[0] in ("labels", "types") and key.count(".") == 1:
            section, _, sub = key.partition(".")
            doc.setdefault(section, {})[sub] = value
        else:
            raise MappingError(f"--map {item!r}: unknown key {key!r} (fields: {', '.join(FIELDS)}; ts_unit, "
                               "labels.positive, labels.negative, labels.classes, types.KIND, probe_records)")
    return _build(doc, where)


def _option_scalar(text: str) -> Scalar:
    text = text.strip()
    if len(text) >= 2 and text[0] == text[-1] and text[0] in "'\"":
        return text[1:-1]
    return int(text) if re.fullmatch(r"-?[0-9]+", text) else text


def _option_value(text: str, item: str) -> Any:
    """A ``--map`` value: ``[a, b]`` (list), ``{const: x}`` / ``{path: p}``, or a scalar."""
    if text[:1] == "[" and text[-1:] == "]":
        inner = text[1:-1].strip()
        return [_option_scalar(t) for t in inner.split(",")] if inner else []
    if text[:1] == "{" and text[-1:] == "}":
        key, sep, val = text[1:-1].partition(":")
        if not sep or key.strip() not in ("const", "path"):
            raise MappingError(f"--map {item!r}: expected {{const: VALUE}} or {{path: PATH}}")
        return {key.strip(): _option_scalar(val)}
    return _option_scalar(text) if text else None


def add_schema_arguments(parser: argparse.ArgumentParser) -> None:
    """``--schema FILE`` and ``--map FIELD=PATH`` of ``calmon check|fit|apply|report``."""
    parser.add_argument("--schema", default=None, metavar="FILE",
                        help="schema mapping (YAML/JSON) from your record shape to calmon's fields, see README "
                             "'Bring your own schema'")
    parser.add_argument("--map", action="append", default=[], metavar="FIELD=PATH",
                        help="map one field, e.g. score=p, label=y, ts=event_time, ts_unit=ms, "
                             "labels.positive=[yes], model={const: fraud} (repeatable; overrides --schema)")


def mapping_from_arguments(args: argparse.Namespace) -> Mapping | None:
    """The mapping of ``--schema`` and ``--map`` (``None`` when neither is given)."""
    base = load_mapping(args.schema) if getattr(args, "schema", None) else None
    items = getattr(args, "map", None) or []
    return mapping_from_options(items, base) if items else base


# ----------------------------------------------------------------------------------------------- building
def _build(doc: dict[str, Any], where: str) -> Mapping:
    for key in doc:
        if key not in _TOP_KEYS:
            raise MappingError(f"{where}.{key}: unknown key (known: {', '.join(_TOP_KEYS)})")
    fields_doc = doc.get("fields") or {}
    if not isinstance(fields_doc, dict):
        raise MappingError(f"{where}.fields: must be a mapping of calmon field -> path")
    explicit: dict[str, FieldSource] = {}
    for name, spec in fields_doc.items():
        if name not in FIELDS:
            raise MappingError(f"{where}.fields.{name}: unknown field (known: {', '.join(sorted(FIELDS))})")
        explicit[name] = _field_source(name, spec, f"{where}.fields.{name}")
    ts_unit = doc.get("ts_unit", "auto")
    if ts_unit not in TS_UNITS:
        raise MappingError(f"{where}.ts_unit: must be one of {', '.join(TS_UNITS)}, got {ts_unit!r}")
    positive, negative, classes = _labels(doc.get("labels"), f"{where}.labels")
    types = _types(doc.get("types"), f"{where}.types")
    probe = doc.get("probe_records", 1000)
    if isinstance(probe, bool) or not isinstance(probe, int) or probe < 0:
        raise MappingError(f"{where}.probe_records: must be a non-negative integer, got {probe!r}")
    sources = _with_defaults(explicit, where)
    probs = sources["probs"]
    if probs.kind == "paths" and classes is not None and len(probs.paths) != len(classes):
        raise MappingError(f"{where}.fields.probs: {len(probs.paths)} paths but labels.classes has {len(classes)}")
    return Mapping(tuple((n, sources[n]) for n in FIELDS), str(ts_unit), positive, negative, classes, types, probe,
                   where)


def _number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


#: What a constant may be, per field: the event field's own type (a constant is not mapped through ``labels`` or
#: ``types``), so a constant no record could carry is refused when the mapping is loaded, not at every record.
_CONST_OK: dict[str, Any] = {
    "id": lambda v: isinstance(v, str) or (isinstance(v, int) and not isinstance(v, bool)),
    "model": lambda v: isinstance(v, str),
    "segment": lambda v: isinstance(v, str),
    "type": lambda v: isinstance(v, str),
    "score": lambda v: _number(v) and 0 <= v <= 1,
    "label": lambda v: isinstance(v, bool) or (isinstance(v, int) and v >= 0),
    "ts": lambda v: isinstance(v, str) or _number(v),
    "probs": lambda v: False,
}
_CONST_WHAT = {"id": "a string or an integer", "model": "a string", "segment": "a string", "type": "a string",
               "score": "a number in [0, 1]", "label": "a class index (0, 1, ...) or a boolean",
               "ts": "a number (epoch time) or an RFC 3339 string", "probs": "a list"}


def _field_source(name: str, spec: Any, where: str) -> FieldSource:
    if spec is None:
        return FieldSource("none", spec=None)
    if isinstance(spec, dict):
        unknown = set(spec) - {"const", "path"}
        if unknown:
            raise MappingError(f"{where}.{sorted(map(str, unknown))[0]}: unknown key (known: const, path)")
        if "const" in spec and "path" in spec:
            raise MappingError(f"{where}: give const or path, not both")
        if "path" in spec:
            return _field_source(name, spec["path"], where)
        value = spec.get("const")
        if name == "probs" or isinstance(value, (dict, list)):
            raise MappingError(f"{where}.const: must be a scalar (and probs cannot be constant)")
        if not _CONST_OK[name](value):
            raise MappingError(f"{where}.const: must be {_CONST_WHAT[name]}, got {str(value)[:40]!r}")
        return FieldSource("const", value=value, spec={"const": value})
    if isinstance(spec, list):
        if name != "probs":
            raise MappingError(f"{where}: a list of paths is only for probs (one path per class)")
        if len(spec) < 2:
            raise MappingError(f"{where}: needs at least 2 paths (one per class), got {len(spec)}")
        paths = tuple(_path(p, f"{where}.{i}") for i, p in enumerate(spec))
        return FieldSource("paths", paths=paths, spec=list(spec))
    if not isinstance(spec, str):
        raise MappingError(f"{where}: must be a path, a list of paths (probs), {{const: value}} or null, "
                           f"got {type(spec).__name__}")
    if spec.startswith("$"):
        head, _, rest = spec.partition(".")
        if head not in _META_FIELDS or (head == "$headers") != bool(rest):
            raise MappingError(f"{where}: unknown metadata {spec!r} (known: $timestamp, $key, $headers.NAME)")
        if name not in _META_FIELDS[head]:
            raise MappingError(f"{where}: {head} cannot be the {name} field (only {', '.join(_META_FIELDS[head])})")
        return FieldSource("meta", meta=f"header:{rest}" if rest else head[1:], spec=spec)
    return FieldSource("path", path=_path(spec, where), spec=spec)


def _path(spec: Any, where: str) -> tuple[str, ...]:
    """Keys of a dotted path or a JSON Pointer (``~1`` is ``/``, ``~0`` is ``~``)."""
    if not isinstance(spec, str) or not spec:
        raise MappingError(f"{where}: a path must be a non-empty string, got {spec!r}")
    if spec.startswith("/"):
        parts = tuple(p.replace("~1", "/").replace("~0", "~") for p in spec[1:].split("/"))
    else:
        parts = tuple(spec.split("."))
        if any(p == "" for p in parts):
            raise MappingError(f"{where}: {spec!r} has an empty key (use a JSON Pointer such as /a.b for dotted keys)")
    if len(parts) > MAX_PATH_KEYS:
        raise MappingError(f"{where}: a path has at most {MAX_PATH_KEYS} keys, got {len(parts)}")
    return parts


def _with_defaults(explicit: dict[str, FieldSource], where: str) -> dict[str, FieldSource]:
    """Explicit sources plus canonical defaults for the others; overlapping explicit paths are an error."""
    used: list[tuple[tuple[str, ...], str]] = []
    for name, src in explicit.items():
        for p in src.all_paths:
            for q, other in used:
                if p[:len(q)] == q or q[:len(p)] == p:
                    what = "the same path" if p == q else "overlapping paths"
                    raise MappingError(f"{where}.fields.{name}: conflicts with fields.{other} ({what} "
                                       f"{'.'.join(p)!r} and {'.'.join(q)!r})")
            used.append((p, name))
    out: dict[str, FieldSource] = {}
    for name in FIELDS:
        if name in explicit:
            out[name] = explicit[name]
        elif any(p[:1] == (name,) for p, _ in used):  # its canonical key is read for another field
            out[name] = FieldSource("none", explicit=False)
        else:
            out[name] = FieldSource("path", path=(name,), explicit=False, spec=name)
    return out


def _scalars(value: Any, where: str, min_len: int = 1) -> tuple[Scalar, ...]:
    if not isinstance(value, list) or len(value) < min_len:
        raise MappingError(f"{where}: must be a list of at least {min_len} values, got {value!r}"[:200])
    for v in value:
        if not isinstance(v, (str, int)):  # bool is an int
            raise MappingError(f"{where}: values must be strings, integers or booleans, got {v!r}"[:200])
    if len({(type(v), v) for v in value}) != len(value):
        raise MappingError(f"{where}: has duplicate values")
    return tuple(value)


def _labels(doc: Any, where: str) -> tuple[tuple[Scalar, ...] | None, tuple[Scalar, ...] | None,
                                            tuple[Scalar, ...] | None]:
    if doc is None:
        return None, None, None
    if not isinstance(doc, dict):
        raise MappingError(f"{where}: must be {{positive: [...]}} or {{classes: [...]}}")
    for key in doc:
        if key not in ("positive", "negative", "classes"):
            raise MappingError(f"{where}.{key}: unknown key (known: classes, negative, positive)")
    if "classes" in doc and ("positive" in doc or "negative" in doc):
        raise MappingError(f"{where}: give positive (binary) or classes (multiclass), not both")
    if "negative" in doc and "positive" not in doc:
        raise MappingError(f"{where}.negative: needs positive")
    pos = _scalars(doc["positive"], f"{where}.positive") if "positive" in doc else None
    neg = _scalars(doc["negative"], f"{where}.negative") if "negative" in doc else None
    if pos is not None and neg is not None and set(pos) & set(neg):
        raise MappingError(f"{where}.negative: shares values with positive")
    classes = _scalars(doc["classes"], f"{where}.classes", 2) if "classes" in doc else None
    return pos, neg, classes


def _types(doc: Any, where: str) -> tuple[tuple[str, Scalar], ...]:
    if doc is None:
        return ()
    if not isinstance(doc, dict):
        raise MappingError(f"{where}: must map prediction/outcome/labeled to raw values")
    for key, raw in doc.items():
        if key not in _KINDS:
            raise MappingError(f"{where}.{key}: unknown event type (known: {', '.join(_KINDS)})")
        if isinstance(raw, bool) or not isinstance(raw, (str, int)):
            raise MappingError(f"{where}.{key}: must be a string or an integer, got {raw!r}"[:200])
    if len(set(doc.values())) != len(doc):
        raise MappingError(f"{where}: two event types share a raw value")
    return tuple((str(k), v) for k, v in doc.items())


def describe(path: tuple[str, ...]) -> str:
    """A path as a user wrote it (dotted when possible)."""
    return ".".join(path) if all(p and "." not in p and "/" not in p for p in path) else "/" + "/".join(
        p.replace("~", "~0").replace("/", "~1") for p in path)

