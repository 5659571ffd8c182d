"""Decoding records through a schema mapping: a msgspec struct generated from the mapping, then columns.

:class:`MappedReader` is the mapped counterpart of :func:`calmon.events.parse.parse_records`: it
generates a msgspec ``Struct`` type whose fields are the mapping's paths (nested structs for
``meta.model``, ``rename=`` for the record's key names), decodes whole chunks with one
``msgspec.json.Decoder`` comprehension (the fast path), and re-reads only the records the struct
rejects with the json module to accept what is valid and name the reason of the rest (the same
reason codes as canonical records). :meth:`MappedReader.fields` then turns rows into the columns the
decoder validates (:class:`calmon.events.parse.EventFields`): paths level by level through literal
comprehensions (:data:`_READ`), constants, transport metadata (``$timestamp``, ``$key``,
``$headers.NAME``), raw labels and types mapped to calmon's, ``probs`` objects ordered by
``labels.classes``.

Speed (issue #16: within 25 % of the canonical rate): where the raw labels or types form a closed set,
chunks are first decoded with a twin struct typing them as a ``Literal`` (msgspec then returns the
set's own string objects: nothing allocated, hashes cached), and a chunk it refuses is re-read with
the permissive struct, which the rest of the batch then uses; every struct field is named after a
calmon field, so fixed comprehensions read columns at the speed of the canonical ones.

Examples
--------
>>> from calmon.events.schema import load_mapping
>>> r = MappedReader(load_mapping({"fields": {"id": "rid", "model": "meta.model", "score": "p", "label": "y",
...                                           "ts": "t"}, "ts_unit": "ms", "labels": {"positive": ["yes"]}}))
>>> rows, rejected = r.parse([b'{"rid": "a", "meta": {"model": "m"}, "p": 0.8, "y": "yes", "t": 1700000000000}',
...                           b'{"rid": "b", "meta": null, "p": "high"}'])
>>> r.models(rows, None), [(x.index, x.reason) for x in rejected]
(['m', None], [(1, 'bad_type')])
>>> f = r.fields(rows[:1], [0], None)
>>> f.id, f.label, f.ts, f.ts_div
(['a'], [1], [1700000000000.0], 1000.0)
"""

from __future__ import annotations

import difflib
import logging
import math
from collections.abc import Callable, Sequence
from itertools import repeat
from operator import attrgetter, is_not
from typing import Any, Literal

import msgspec

from calmon.events.checks import KINDS
from calmon.events.parse import (
    _CHUNK,
    _HUGE_INT,
    _ID_INT,
    _INT_RANGE,
    _LABEL_INT,
    EventFields,
    InvalidEvent,
    Rejection,
    _check_probs,
    _load,
)
from calmon.events.schema import FieldSource, Mapping, MappingError, describe
from calmon.formats.records import RecordMeta

__all__ = ["MappedReader", "PROBE_MODES"]

log = logging.getLogger("calmon.events")
#: What the probe does with a mapped path that matched no record: ``warn`` (the agent: log once with counts, go
#: on; records that need the field are rejected one by one) or ``raise`` (offline: a :class:`MappingError`
#: naming the cause, only once the whole input matched nothing).
PROBE_MODES = ("warn", "raise")
#: what each leaf must hold, for messages
_EXPECTED = {"id": "a string or an integer", "model": "a string", "segment": "a string", "score": "a number in [0, 1]",
             "probs": "a list of numbers (or an object with labels.classes)", "probs[]": "a number in [0, 1]",
             "ts": "a number (epoch time) or an RFC 3339 string", "type": "a string",
             "label": "an integer class index or a boolean (strings need labels.positive or labels.classes)"}
_JSON_NAMES = {bool: "a boolean", int: "an integer", float: "a number", str: "a string", list: "a list",
               dict: "an object"}

_TS_DIV = {"auto": 1.0, "s": 1.0, "iso": 1.0, "ms": 1e3, "us": 1e6, "ns": 1e9}
_TS_NAME = {"auto": "seconds", "s": "seconds", "iso": "seconds", "ms": "milliseconds", "us": "microseconds",
            "ns": "nanoseconds"}
_BAD = object()  # a raw label the mapping does not know
_COLUMNS = ("type", "id", "ts", "score", "probs", "label", "segment")
_LEARN_MAX = 64  # distinct raw labels a positive-only mapping learns for its Literal struct


def _closed_values(name: str, mapping: Mapping) -> tuple[str | int, ...] | None:
    """The raw values a ``label`` or ``type`` leaf may take without being refused, when that set is known
    (``labels.classes``, ``positive`` with ``negative``, ``types`` or calmon's type names) and fits a
    ``Literal`` (strings and 64-bit integers, no booleans); else ``None``."""
    if name == "type":
        raw: tuple[Any, ...] | None = tuple(v for _, v in mapping.types) if mapping.types else KINDS
    elif mapping.classes is not None:
        raw = mapping.classes
    else:
        raw = None if mapping.positive is None or mapping.negative is None else mapping.positive + mapping.negative
    if raw is None or not all(map(_literal_value, raw)):
        return None
    return tuple(raw)


def _literal_value(v: Any) -> bool:
    return type(v) is str or (type(v) is int and -(1 << 63) <= v < (1 << 63))  # bool is not an int here


def _leaf_type(name: str, mapping: Mapping, literals: dict[str, tuple[str | int, ...]] | None = None) -> Any:
    """The msgspec type of a mapped leaf (the canonical field's type, widened for raw labels and types).

    ``literals``: the raw values of ``label`` and ``type`` leaves to type as a ``Literal``, which msgspec
    returns as the very objects of that set (no string allocated, its hash cached: the mapping's lookups
    cost a third) and refuses other values (the permissive type then re-reads the chunk).
    """
    values = (literals or {}).get(name)
    if values is not None:
        literal: Any = Literal
        return literal[values] | None
    if name == "label":  # booleans are labels by default (true = 1, false = 0)
        return _LABEL_INT | str | bool | None if (mapping.positive or mapping.classes) else _LABEL_INT | bool | None
    if name == "type":
        return str | int | None if mapping.types else str | None
    return {"id": str | _ID_INT | None, "model": str | None, "segment": str | None, "score": float | None,
            "ts": float | str | None, "probs": list[float] | dict[str, float] | None, "probs[]": float | None}[name]


def _python_types(name: str, mapping: Mapping) -> tuple[type, ...]:
    """The Python types a leaf may hold after ``json.loads`` (bool only for labels)."""
    if name == "label":
        return (int, str, bool) if (mapping.positive or mapping.classes) else (int, bool)
    return {"id": (str, int), "model": (str,), "segment": (str,), "score": (int, float), "probs[]": (int, float),
            "ts": (int, float, str), "type": (str, int) if mapping.types else (str,), "probs": (list, dict)}[name]


# One literal comprehension per calmon name. Every field of a generated struct, at any level, is named after a
# calmon field (a leaf after its own, a nested object after the first field whose path goes through it), so
# these read any level: CPython 3.11+ specialises a literal attribute read of a slot, about 3x quicker than
# ``map(operator.attrgetter(name), rows)`` (1.3 vs 3.5 ms per 65,536 rows).
_READ: dict[str, Callable[[Sequence[Any]], list[Any]]] = {
    "id": lambda xs: [x.id for x in xs], "model": lambda xs: [x.model for x in xs],
    "score": lambda xs: [x.score for x in xs], "probs": lambda xs: [x.probs for x in xs],
    "label": lambda xs: [x.label for x in xs], "ts": lambda xs: [x.ts for x in xs],
    "segment": lambda xs: [x.segment for x in xs], "type": lambda xs: [x.type for x in xs],
}


class _Node:
    """A level of the generated struct: key -> sub-node or leaf, and the calmon name of its struct field."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.children: dict[str, _Node | str] = {}


#: per path field, its levels: ``(path prefix, struct field name)`` from the root to the leaf
Levels = list[tuple[tuple[str, ...], str]]


def _row_type(mapping: Mapping, literals: dict[str, tuple[str | int, ...]] | None = None
              ) -> tuple[type, Callable[[Any], Any] | None, list[tuple[tuple[str, ...], str]], dict[str, Levels]]:
    """The struct type, the attribute getter of ``probs`` given as one path per class, every
    ``(path, leaf name)``, and the levels of each path field.

    The struct quacks like ``calmon.events.parse._Event`` where the canonical code reads it: ``model``
    is a struct field at the top level or a class attribute (a constant, else ``None``). Nested objects
    are nested structs (msgspec builds them in C); :meth:`MappedReader.fields` reads a column level by
    level with :data:`_READ`, one C-specialised comprehension per level.
    """
    root = _Node("")
    leaves: list[tuple[tuple[str, ...], str]] = []
    for name, src in mapping.fields:
        for path in src.all_paths:
            leaves.append((path, "probs[]" if src.kind == "paths" else name))
    for path, leaf in leaves:
        node = root
        for key in path[:-1]:
            child = node.children.setdefault(key, _Node(leaf.rstrip("[]")))
            assert isinstance(child, _Node)  # the mapping refuses overlapping paths
            node = child
        node.children[path[-1]] = leaf
    attrs: dict[tuple[str, ...], str] = {}
    counter = [0]

    def build(node: _Node, prefix: tuple[str, ...]) -> type:
        fields: list[tuple[str, Any, Any]] = []
        rename: dict[str, str] = {}
        for key, child in node.children.items():
            if isinstance(child, _Node):
                fname = child.name
                sub = build(child, (*prefix, key))
                fields.append((fname, sub, msgspec.field(default_factory=sub)))
            else:
                fname = f"x{len(fields)}" if child == "probs[]" else child  # x...: one of several probs paths
                fields.append((fname, _leaf_type(child, mapping, literals), None))
            rename[fname] = key
            attrs[prefix + (key,)] = fname
        counter[0] += 1
        return msgspec.defstruct(f"MappedRow{counter[0]}", fields, rename=rename,
                                 namespace=None if prefix else top_namespace(set(rename)),
                                 gc=False)  # no reference cycles: untracked, no GC passes over millions of rows

    def top_namespace(taken: set[str]) -> dict[str, Any]:
        namespace: dict[str, Any] = {}
        for name, src in mapping.fields:
            if src.kind == "const":
                text = name in ("model", "segment", "id") and src.value is not None
                namespace[name] = str(src.value) if text else src.value
            elif name not in taken:
                namespace[name] = None
        return namespace

    row = build(root, ())
    levels = {name: [(src.path[:d + 1], attrs[src.path[:d + 1]]) for d in range(len(src.path))]
              for name, src in mapping.fields if src.kind == "path"}
    probs = mapping.source("probs")
    probs_get = None
    if probs.kind == "paths":
        probs_get = attrgetter(*(".".join(attrs[p[:d + 1]] for d in range(len(p))) for p in probs.paths))
    return row, probs_get, leaves, levels


class MappedReader:
    """Raw records -> rows of a generated struct -> :class:`~calmon.events.parse.EventFields`, for one mapping.

    Also probes the mapping against the data where the data can prove it wrong: an explicitly mapped path that
    matched none of the records read. With ``probe="warn"`` (the agent) a path absent from the first
    ``mapping.probe_records`` records is logged once as a warning with counts and the reading goes on (records
    that need the field are rejected one by one, like any bad record); with ``probe="raise"`` (offline reads)
    :meth:`finish` raises :class:`MappingError` if a path matched none of the whole input, naming the cause: the
    first record's actual value where the path was found with the wrong type, or the keys the records do have.
    """

    def __init__(self, mapping: Mapping, probe: str = "warn") -> None:
        if probe not in PROBE_MODES:
            raise ValueError(f"probe must be one of {PROBE_MODES}, got {probe!r}")
        self.probe = probe
        self.mapping = mapping
        self.row_type, self._probs_get, self._leaves, self._levels = _row_type(mapping)
        self._decoder: msgspec.json.Decoder[Any] = msgspec.json.Decoder(self.row_type)
        #: raw values of the label and type leaves typed as Literals (see :func:`_leaf_type`)
        self._literals = {n: v for n in ("label", "type") if self._levels.get(n)
                          and (v := _closed_values(n, mapping)) is not None}
        #: positive-only labels: the other raw values are learned from the batches the Literal struct refused
        self._learning = "label" in self._levels and mapping.positive is not None and mapping.negative is None \
            and all(map(_literal_value, mapping.positive))
        if self._learning:
            self._literals["label"] = tuple(v for v in mapping.positive or () if isinstance(v, (str, int)))
        self._fell_back = False  # a chunk of the current batch needed the permissive struct
        self._chunk_decoders: list[Callable[[bytes], Any]] = []
        self._set_decoders()
        self._types = {leaf: _python_types(leaf, mapping) for _, leaf in self._leaves}
        self._sources = dict(mapping.fields)
        self._consts = {n: getattr(self.row_type, n) for n, src in mapping.fields if src.kind == "const"}
        self._level_rows: Any = None
        self._level_cache: dict[tuple[str, ...], list[Any]] = {}
        self._parse_rejects = 0
        self._labels = _label_table(mapping)
        tm = mapping.type_map
        self._type_map: dict[Any, Any] | None = None if tm is None else {**tm, None: None}
        self.seen = 0
        self.rejected = 0
        self.unmatched = {n for n, s in mapping.fields if s.explicit and s.kind in ("path", "paths")}
        self.probing = mapping.probe_records > 0 and bool(self.unmatched)
        #: per unmatched field, the first record's actual failure (``found a string '0.3' in record 1 (...)``)
        self.failures: dict[str, str] = {}
        self._pending: list[tuple[str, int, str]] = []  # (field, index in the batch, failure): located after it
        self.present: set[str] = set()  # unmatched fields found in records refused for another field
        self.keys: list[str] = []  # top-level keys of the records (of each batch's first), for messages
        self.warned: dict[str, str] = {}  # field -> the warning logged (warn mode)

    # -- rows ----------------------------------------------------------------------------------
    def parse(self, records: Sequence[bytes], max_bytes: float = math.inf) -> tuple[list[Any], list[Rejection]]:
        """A row (or ``None`` and a :class:`Rejection`) per record; never raises for a record."""
        rows: list[Any] = []
        rejected: list[Rejection] = []
        dec = self._decoder.decode
        decoders = self._chunk_decoders
        self._fell_back = False
        for start in range(0, len(records), _CHUNK):
            chunk = records[start:start + _CHUNK]
            if chunk and max(map(len, chunk)) <= max_bytes:
                used = _decode_chunk(decoders, chunk, rows)
                if used > 0:  # the Literal struct refused a value: the rest of this batch skips it
                    decoders, self._fell_back = decoders[used:], True
                if used >= 0:
                    continue
            for i, rec in enumerate(chunk, start):
                try:
                    if len(rec) > max_bytes:  # an OversizedRecord names its reason
                        raise InvalidEvent(getattr(rec, "reason", "too_large"), f"record of {len(rec)} bytes "
                                                                                f"exceeds the limit of {max_bytes:.0f}")
                    try:
                        rows.append(dec(rec))
                    except (ValueError, TypeError, RecursionError):
                        rows.append(self._slow(rec, i))
                except InvalidEvent as e:
                    rows.append(None)
                    rejected.append(Rejection(i, e.reason, e.detail))
        self._parse_rejects = len(rejected)
        return rows, rejected

    def _set_decoders(self) -> None:
        """Chunk decoders, quickest first: the Literal struct (if any literals), then the permissive one."""
        self._chunk_decoders = [self._decoder.decode]
        if self._literals:
            self._chunk_decoders.insert(0, msgspec.json.Decoder(_row_type(self.mapping, self._literals)[0]).decode)

    def _learn_labels(self, col: Sequence[Any], table: _LabelTable) -> None:
        """Add the raw labels of a batch the Literal struct refused to its values (they all mean 0), up to
        :data:`_LEARN_MAX` distinct values; beyond that, or for values a Literal cannot hold, stop."""
        known = self._literals["label"]
        new = set(col).difference(known, (None,))
        if not new:
            return
        if len(known) + len(new) > _LEARN_MAX or not all(map(_literal_value, new)):
            self._learning = False
            del self._literals["label"]
        else:
            self._literals["label"] = known + tuple(sorted(new, key=repr))
            table.update(dict.fromkeys(new, table.fallback))
        self._set_decoders()

    def _slow(self, rec: bytes, index: int = -1) -> Any:
        """Re-read a record the struct refused: accept what is valid, else name the reason (and, while probing,
        note the first failure of each unmatched field: the probe's evidence)."""
        obj = _load(rec)
        if not isinstance(obj, dict):
            raise InvalidEvent("not_object", f"record is a JSON {type(obj).__name__}, not an object")
        found: list[tuple[tuple[str, ...], str, Any]] = []
        for path, leaf in self._leaves:
            try:
                value = _walk(obj, path, leaf)
            except InvalidEvent as e:
                self._note(leaf, index, e.detail)
                raise
            if value is not None:
                found.append((path, leaf, value))
        if self.probing:  # every field found in this record, before one of them refuses it
            self.present.update(leaf.rstrip("[]") for _, leaf, _ in found)
        pruned: dict[str, Any] = {}
        for path, leaf, value in found:
            try:
                self._check_leaf(leaf, path, value)
            except InvalidEvent:
                self._note(leaf, index, f"found {_shown(value)}")
                raise
            node = pruned
            for key in path[:-1]:
                node = node.setdefault(key, {})
            node[path[-1]] = value
        try:
            return msgspec.convert(pruned, self.row_type)
        except msgspec.ValidationError as e:
            raise InvalidEvent("bad_type", str(e)[:200]) from None

    def _note(self, leaf: str, index: int, what: str) -> None:
        """Keep the first failure of an unmatched field (located by :meth:`after_batch`)."""
        name = leaf.rstrip("[]")
        if self.probing and name in self.unmatched and name not in self.failures \
                and all(n != name for n, _, _ in self._pending):
            self._pending.append((name, index, f"{what}; expected {_EXPECTED[leaf]}"))

    def _check_leaf(self, leaf: str, path: tuple[str, ...], v: Any) -> None:
        name = leaf.rstrip("[]")
        where = f"field {name!r} ({describe(path)})"
        types = self._types[leaf]
        if (isinstance(v, bool) and bool not in types) or not isinstance(v, types):
            raise InvalidEvent("bad_type", f"{where} has type {type(v).__name__}")
        if isinstance(v, float) and not math.isfinite(v):
            raise InvalidEvent("non_finite", f"{where} is {v}")
        lo, hi = _INT_RANGE.get(name, (-(1 << 63), (1 << 63) - 1))
        if isinstance(v, int) and not isinstance(v, bool) and not lo <= v <= hi:
            raise InvalidEvent(_HUGE_INT.get(name, "bad_type"), f"{where} is an integer beyond 64 bits")
        if leaf == "probs":
            _check_probs(list(v.values()) if isinstance(v, dict) else v)
        elif leaf == "probs[]" and isinstance(v, (int, float)) and not 0 <= v <= 1:
            raise InvalidEvent("out_of_range", f"{where} must lie in [0, 1]")

    # -- columns -------------------------------------------------------------------------------
    def models(self, rows: list[Any], meta: Sequence[RecordMeta] | None) -> list[str | None] | None:
        """The model name of each row (``""`` where none, ``None`` for rejected records), or ``None`` when
        the rows' ``model`` attribute has it (as for canonical events)."""
        src = self._sources["model"]
        clean = not self._parse_rejects
        if src.kind == "meta":
            vals = _meta_column(src, range(len(rows)), meta)
        elif len(self._levels.get("model", ())) > 1:
            dummy = self.row_type()
            vals = self._nested("model", rows if clean else [dummy if r is None else r for r in rows])
            if self.probing and any(map(is_not, vals, repeat(None))):
                self.unmatched.discard("model")
        else:
            return None
        if clean and None not in vals:
            return vals
        return [None if r is None else v or "" for r, v in zip(rows, vals)]

    def _nested(self, name: str, rows: Sequence[Any]) -> list[Any]:
        """A nested field, one level at a time; levels shared with another field of the same rows
        (``meta`` of ``meta.model`` and ``meta.kind``) are read once."""
        if self._level_rows is not rows:
            self._level_rows, self._level_cache = rows, {}
        col: Any = rows
        for key, attr in self._levels[name]:
            cached = self._level_cache.get(key)
            if cached is None:
                cached = self._level_cache[key] = _READ[attr](col)
            col = cached
        return col

    def fields(self, rows: list[Any], index: Sequence[int], meta: Sequence[RecordMeta] | None) -> EventFields:
        """The columns of some valid rows (``index``: their record indices, for ``meta``)."""
        rejects: list[tuple[int, str, str]] = []
        c = {name: self._column(name, rows, index, meta, rejects) for name in _COLUMNS}
        f = EventFields(c["type"], c["id"], c["ts"], c["score"], c["probs"], c["label"], c["segment"], rejects=rejects)
        if self.probing:
            self._probe(f, rows)
        if self._type_map is not None:
            f.type = list(map(self._type_map.get, f.type, repeat("?")))
        if self._labels is not None:
            if self._learning and self._fell_back:
                self._learn_labels(f.label, self._labels)
            f.label = _map_labels(f.label, self._labels, rejects)
        if f.probs.count(None) != len(f.probs) and dict in set(map(type, f.probs)):
            f.probs = _probs_objects(f.probs, self.mapping.classes, rejects)
        unit = self.mapping.ts_unit
        if self._sources["ts"].kind != "meta":
            f.ts_div, f.ts_iso, f.ts_unit = _TS_DIV[unit], unit == "iso", _TS_NAME[unit]
        return f

    def _column(self, name: str, rows: list[Any], index: Sequence[int], meta: Sequence[RecordMeta] | None,
                rejects: list[tuple[int, str, str]]) -> Sequence[Any]:
        """One field of the rows, by the quickest route (C-level ``map`` wherever possible)."""
        src = self._sources[name]
        if src.kind == "path":
            return self._nested(name, rows)
        if src.kind == "const":
            return [self._consts[name]] * len(rows)
        if src.kind == "meta":
            return _meta_column(src, index, meta)
        if src.kind == "paths":
            return self._class_columns(src, rows, rejects)
        return [None] * len(rows)

    def _probe(self, f: EventFields, rows: list[Any]) -> None:
        """Strike the explicit paths that match in these rows off the list of unmatched ones."""
        for name in list(self.unmatched):
            if name == "model":
                col: Sequence[Any] = [r.model for r in rows] if len(self._levels.get("model", ())) == 1 else ()
            else:
                col = getattr(f, name)
            if any(map(is_not, col, repeat(None))):
                self.unmatched.discard(name)

    def _class_columns(self, src: FieldSource, rows: list[Any], rejects: list[tuple[int, str, str]]) -> list[Any]:
        """``probs`` from one path per class (CSV or Parquet columns)."""
        get = self._probs_get
        assert get is not None
        out: list[Any] = []
        for j, t in enumerate(map(get, rows)):
            if None not in t:
                out.append(list(t))
                continue
            if t.count(None) != len(t):
                rejects.append((j, "missing_field", f"probs: {describe(src.paths[t.index(None)])} is empty"))
            out.append(None)
        return out

    # -- the probe -----------------------------------------------------------------------------
    def after_batch(self, n: int, rejected: int = 0, origins: Sequence[str] | None = None,
                    first: bytes | None = None) -> None:
        """Count ``n`` more records (``rejected`` of them); locate the batch's failures (``origins``: one per
        record, or ``None``); with ``probe="warn"``, once ``probe_records`` are seen, log each mapped path that
        never matched (once). Never raises.

        ``first``: the batch's first record, whose top-level keys name what the records do have.
        """
        for name, i, what in self._pending:
            at = f"record {self.seen + i + 1}"
            if origins is not None and 0 <= i < len(origins):
                at += f" ({origins[i]})"
            self.failures.setdefault(name, what.replace("; expected", f" in {at}; expected", 1))
        self._pending = []
        self.seen += n
        self.rejected += rejected
        self._level_rows, self._level_cache = None, {}  # let the batch's rows go
        if not self.probing:
            return
        if first is not None and len(self.keys) < 50:  # each batch's first record: files of several shapes
            try:
                obj = _load(first)
            except InvalidEvent:
                obj = None
            if isinstance(obj, dict):
                self.keys += [k for k in map(str, obj) if k not in self.keys][:50 - len(self.keys)]
        for name in [n for n in self.warned if n not in self.unmatched]:  # matched since the warning
            log.info("%s.fields.%s: path %s matched from record %d on", self.mapping.where, name,
                     self._paths(name), self.seen)
            del self.warned[name]
        if not self.unmatched:
            self.probing = False
        elif self.probe == "warn" and self.seen >= self.mapping.probe_records:
            self._warn()

    def finish(self) -> None:
        """The input ended: with ``probe="raise"`` raise :class:`MappingError` naming the cause if a mapped path
        matched none of the records (if any were read); with ``probe="warn"`` log it (once)."""
        if not (self.probing and self.seen and self.unmatched):
            return
        if self.probe == "warn":
            self._warn()
            return
        self.probing = False
        ranked = self._ranked()
        also = [text.partition(":")[0] for rank, text in ranked[1:] if rank < 2]  # not the fields refused by others
        raise MappingError(ranked[0][1] + (f" (also wrong: {', '.join(also)})" if also else ""))

    def causes(self) -> list[str]:
        """One line per mapped path that matched no record, the most telling first (see :meth:`_ranked`)."""
        return [text for _, text in self._ranked()]

    def _ranked(self) -> list[tuple[int, str]]:
        """``(rank, line)`` per mapped path that matched no record, the most telling first: a path found with the
        wrong type (0: the first record's actual value), then a path absent from every record (1: with the keys
        the records have), then a path found only in records refused for another field (2: not its fault)."""
        ranked: list[tuple[int, int, str]] = []
        order = [n for n, _ in self.mapping.fields]
        for name in self.unmatched:
            head = f"{self.mapping.where}.fields.{name}: path {self._paths(name)}"
            failure = self.failures.get(name)
            if failure is not None:
                ranked.append((0, order.index(name), f"{head} {failure}"))
            elif name in self.present:
                ranked.append((2, order.index(name), f"{head} was found only in records refused for another "
                                                     "field"))
            else:
                ranked.append((1, order.index(name), f"{head} {self._absent(name)}"))
        return [(rank, text) for rank, _, text in sorted(ranked)]

    def _absent(self, name: str) -> str:
        rejected = f", {self.rejected} of them rejected" if self.rejected else ""
        text = f"is absent from all {self.seen} records read{rejected}"
        if self.keys:
            text += f" (their keys: {', '.join(self.keys[:12])}{', ...' if len(self.keys) > 12 else ''}"
            src = self._sources[name]
            if src.kind == "path" and len(src.path) == 1:
                near = difflib.get_close_matches(src.path[0], self.keys, n=1, cutoff=0.6)
                if near:
                    text += f"; did you mean {near[0]!r}?"
            text += ")"
        return text

    def _paths(self, name: str) -> str:
        return ", ".join(repr(describe(p)) for p in self._sources[name].all_paths)

    def _warn(self) -> None:
        """Log each unmatched path once: a warning with counts, never an exit (the data may simply not have shown
        the field yet: predictions carry no label)."""
        for line in self.causes():
            name = line.partition(".fields.")[2].partition(":")[0]
            if name in self.warned:
                continue
            self.warned[name] = line
            normal = ", normal while only predictions arrive" if name == "label" else ""
            log.warning("%s [%d records read, %d rejected]; a warning, not an error%s: records that need the field "
                        "are rejected one by one with their reason, the others are read", line, self.seen,
                        self.rejected, normal)


def _decode_chunk(decoders: Sequence[Callable[[bytes], Any]], chunk: Sequence[bytes], rows: list[Any]) -> int:
    """Decode a whole chunk into ``rows`` with the first decoder that takes all of it: its position, or -1."""
    for k, dec in enumerate(decoders):
        try:
            rows.extend([dec(rec) for rec in chunk])
            return k
        except (ValueError, TypeError, RecursionError):  # DecodeError and UnicodeDecodeError are ValueErrors
            pass
    return -1


def _shown(v: Any) -> str:
    """A JSON value as a message shows it: its type and a short repr (``a string '0.3'``)."""
    text = repr(v)
    return f"{_JSON_NAMES.get(type(v), type(v).__name__)} {text[:40]}{'...' if len(text) > 40 else ''}"


def _walk(obj: dict[str, Any], path: tuple[str, ...], leaf: str) -> Any:
    """The value at ``path`` (``None`` when a key is missing or null)."""
    cur: Any = obj
    for depth, key in enumerate(path):
        if cur is None:
            return None
        if not isinstance(cur, dict):
            raise InvalidEvent("bad_type", f"field {leaf.rstrip('[]')!r}: {describe(path[:depth])} is a "
                                           f"{type(cur).__name__}, not an object")
        cur = cur.get(key)
    return cur


def _meta_column(src: FieldSource, index: Sequence[int], meta: Sequence[RecordMeta] | None) -> list[Any]:
    """A field from transport metadata (``None`` where a record has none)."""
    if meta is None:
        return [None] * len(index)
    ms = [meta[i] for i in index]
    if src.meta == "timestamp":
        return [None if m is None or m.timestamp_ms is None else m.timestamp_ms / 1000.0 for m in ms]
    if src.meta == "key":
        return [None if m is None or m.key is None else bytes(m.key).decode("utf-8", "replace") for m in ms]
    name = src.meta.partition(":")[2]
    out: list[Any] = []
    for m in ms:
        value = None if m is None else next((v for k, v in m.headers if k == name), None)
        out.append(None if value is None else bytes(value).decode("utf-8", "replace"))
    return out


class _LabelTable(dict[Any, Any]):
    """Raw label -> class index (``None`` -> ``None``); an unknown raw label gives ``fallback``: ``map(t.__getitem__,
    col)`` is the quickest C-level lookup (``dict.get`` with a default costs a third more)."""

    def __init__(self, fallback: Any) -> None:
        super().__init__({None: None})
        self.fallback = fallback

    def __missing__(self, key: Any) -> Any:
        return self.fallback


def _label_table(mapping: Mapping) -> _LabelTable | None:
    """The raw label -> class table (unknown raw values: 0, or :data:`_BAD` where they are refused), or ``None``
    without a label mapping."""
    if mapping.classes is not None:
        table = _LabelTable(_BAD)
        table.update({c: i for i, c in enumerate(mapping.classes)})
    elif mapping.positive is not None:
        table = _LabelTable(0 if mapping.negative is None else _BAD)
        table.update(dict.fromkeys(mapping.negative or (), 0))
        table.update(dict.fromkeys(mapping.positive, 1))
    else:
        return None
    return table


def _map_labels(col: Sequence[Any], table: _LabelTable, rejects: list[tuple[int, str, str]]) -> list[Any]:
    out = list(map(table.__getitem__, col))  # the table maps None to None
    if table.fallback is _BAD and _BAD in out:
        for j, v in enumerate(out):
            if v is _BAD:
                rejects.append((j, "unmapped_label", f"label {col[j]!r} is not in labels.classes/positive/negative"
                                [:200]))
                out[j] = None
    return out


def _probs_objects(col: Sequence[Any], classes: tuple[Any, ...] | None, rejects: list[tuple[int, str, str]]
                   ) -> list[Any]:
    """``probs`` objects as lists in the order of ``labels.classes``."""
    names = None if classes is None else [str(c) for c in classes]
    out: list[Any] = []
    for j, p in enumerate(col):
        if p.__class__ is not dict:
            out.append(p)
        elif names is None:
            rejects.append((j, "bad_type", "probs is an object: the mapping needs labels.classes to order it"))
            out.append(None)
        elif len(p) != len(names) or any(n not in p for n in names):
            rejects.append((j, "k_mismatch", f"probs object keys {sorted(p)[:5]} are not labels.classes"[:200]))
            out.append(None)
        else:
            out.append([p[n] for n in names])
    return out
