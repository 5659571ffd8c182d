"""Propose a schema mapping from sample records: which field looks like an id, a model, a time, a score, a label.

:func:`suggest_mapping` reads JSON objects (a sample per input file, as ``calmon schema suggest`` gathers them) and
proposes, for each of calmon's fields, the path whose values look the part -- and says why:

* ``id``: strings or integers, (nearly) unique within a file, and shared between files (the join key);
* ``model``: strings with few distinct values (a field named like ``model`` first); none: a constant;
* ``ts``: epoch numbers (their magnitude gives ``ts_unit``: s, ms, us, ns) or ISO-8601 strings;
* ``score``: numbers in [0, 1] that are not all 0/1; ``probs``: lists of numbers in [0, 1] summing to 1;
* ``label``: 0/1 integers, booleans (true = 1), or a few distinct strings (``labels.positive``/``classes``);
* ``type``: a string field whose values split the records into predictions (with a score) and outcomes
  (with a label); records of distinct files need none (the type follows the fields present).

Names break ties (``p_churn`` is a score before ``latency``), never make a field that the values refuse.
:meth:`Suggestion.to_yaml` prints a schema file that :func:`calmon.events.schema.load_mapping` reads, with the
evidence as comments; :meth:`Suggestion.map_options` the same as ``--map`` options.

Examples
--------
>>> preds = [{"request_id": f"r{i}", "ts_ms": 1767225600000 + i, "model_name": "churn", "p_churn": i / 10}
...          for i in range(10)]
>>> outs = [{"request_id": f"r{i}", "ts_ms": 1767225700000 + i, "churned": i % 3 == 0} for i in range(10)]
>>> s = suggest_mapping([("preds.jsonl", preds), ("outcomes.jsonl", outs)])
>>> s.mapping().to_dict()["fields"]
{'id': 'request_id', 'model': 'model_name', 'score': 'p_churn', 'label': 'churned', 'ts': 'ts_ms'}
>>> s.ts_unit
'ms'
>>> s.map_options()[:2]
['id=request_id', 'model=model_name']
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

import yaml

from calmon.events.schema import FIELDS, Mapping, describe, load_mapping

__all__ = ["Suggestion", "Proposal", "suggest_mapping", "leaf_paths"]

_MAX_DEPTH = 4  # nested objects walked (a record's fields are shallow)
_MAX_PATHS = 500  # distinct paths kept per sample (a record with thousands of keys is not an event)
#: name hints per field: a name matching one of these breaks ties between fields whose values fit
_HINTS = {
    "id": r"(^|_|\b)(id|uuid|guid|key|request|req|trace|event_id|prediction_id)(_|$|\b)|id$",
    "model": r"model|classifier|predictor|estimator",
    "score": r"(^|_)(p|prob|proba|probability|score|pred|prediction|confidence|likelihood|risk)(_|$)|^p[A-Z_]",
    "probs": r"probs|probas|probabilities|scores|distribution",
    "label": r"label|target|outcome|^y$|(^|_)y(_|$)|truth|actual|class|converted|churn|fraud|clicked|is_|has_|won",
    "ts": r"(^|_)(ts|time|timestamp|at|date|datetime|created|event_time)(_|$)|time|_at$|_ts$",
    "type": r"type|kind|event|record",
}
_POSITIVE = {"yes", "y", "true", "t", "1", "positive", "pos", "1.0", "converted", "churned", "fraud", "spam",
             "clicked", "won", "success", "hit", "default", "bad"}
#: epoch magnitudes: (unit, low, high), low/high in the unit (2001-09-09 .. 2286-11-20 in seconds)
_EPOCHS = (("s", 1e9, 1e10), ("ms", 1e12, 1e13), ("us", 1e15, 1e16), ("ns", 1e18, 1e19))


@dataclass
class Proposal:
    """One calmon field's proposed source: ``spec`` as the schema file writes it and the evidence."""

    spec: Any
    evidence: str
    path: tuple[str, ...] = ()  #: the record keys of a path ``spec``


@dataclass
class Suggestion:
    """A proposed mapping (:func:`suggest_mapping`) and the evidence for each field."""

    fields: dict[str, Proposal]
    ts_unit: str = "auto"
    labels: dict[str, list[Any]] = field(default_factory=dict)
    types: dict[str, Any] = field(default_factory=dict)
    inputs: list[tuple[str, int]] = field(default_factory=list)  # (input, records sampled)
    notes: list[str] = field(default_factory=list)  # what the sample could not decide

    def document(self) -> dict[str, Any]:
        """The schema document (what :func:`calmon.events.schema.load_mapping` reads)."""
        doc: dict[str, Any] = {"fields": {n: self.fields[n].spec for n in FIELDS if n in self.fields}}
        if self.ts_unit != "auto":
            doc["ts_unit"] = self.ts_unit
        if self.labels:
            doc["labels"] = dict(self.labels)
        if self.types:
            doc["types"] = dict(self.types)
        return doc

    def mapping(self) -> Mapping:
        """The proposal as a validated :class:`~calmon.events.schema.Mapping`."""
        return load_mapping(self.document())

    def map_options(self) -> list[str]:
        """The proposal as ``--map`` options (``id=request_id``, ``ts_unit=ms``, ...)."""
        out = []
        for name in FIELDS:
            if name in self.fields:
                spec = self.fields[name].spec
                out.append(f"{name}={{const: {spec['const']}}}" if isinstance(spec, dict) else f"{name}={spec}")
        if self.ts_unit != "auto":
            out.append(f"ts_unit={self.ts_unit}")
        for key, values in self.labels.items():
            out.append(f"labels.{key}=[{', '.join(map(str, values))}]")
        for kind, raw in self.types.items():
            out.append(f"types.{kind}={raw}")
        return out

    def to_yaml(self, command: str = "calmon check") -> str:
        """A schema file with the evidence as comments; ``command`` is shown in its header."""
        sampled = ", ".join(f"{name}: {n}" for name, n in self.inputs[:6]) + (", ..." if len(self.inputs) > 6 else "")
        total = sum(n for _, n in self.inputs)
        lines = [f"# Schema mapping proposed by `calmon schema suggest` from {total} sampled records ({sampled}).",
                 "# Each field shows its evidence; check them, then use it with "
                 f"`{command} FILES --schema THIS_FILE` (see docs/schemas.md).",
                 "fields:"]
        width = max((len(f"  {n}: {_scalar(p.spec)}") for n, p in self.fields.items()), default=0)
        for name in FIELDS:
            if name in self.fields:
                p = self.fields[name]
                text = f"  {name}: {_scalar(p.spec)}"
                lines.append(f"{text.ljust(width)}  # {p.evidence}")
        if self.ts_unit != "auto":
            lines.append(f"ts_unit: {self.ts_unit}")
        if self.labels:
            lines.append("labels:")
            lines += [f"  {k}: [{', '.join(_scalar(v) for v in vs)}]" for k, vs in self.labels.items()]
        if self.types:
            lines.append("types:")
            lines += [f"  {k}: {_scalar(v)}" for k, v in self.types.items()]
        lines += [f"# note: {n}" for n in self.notes]
        text = "\n".join(lines) + "\n"
        if load_mapping(yaml.safe_load(text)) != self.mapping():  # what it prints must be what it means
            raise ValueError("the proposed schema does not read back as itself (a field name YAML cannot hold?)")
        return text


def _scalar(v: Any) -> str:
    """A YAML scalar that reads back as ``v`` (quoted only where plain text would not)."""
    if isinstance(v, dict):
        return "{" + ", ".join(f"{k}: {_scalar(x)}" for k, x in v.items()) + "}"
    if isinstance(v, str) and re.fullmatch(r"[A-Za-z_$/][A-Za-z0-9_.$/~-]*", v):
        try:
            if yaml.safe_load(v) == v:
                return v
        except yaml.YAMLError:
            pass
    if isinstance(v, bool):
        return "true" if v else "false"
    return yaml.safe_dump(v, default_style='"' if isinstance(v, str) else None).strip().removesuffix("...").strip()


def leaf_paths(obj: dict[str, Any], prefix: tuple[str, ...] = (), depth: int = 0) -> Iterator[tuple[tuple[str, ...],
                                                                                                    Any]]:
    """``(path, value)`` of every leaf of a record (lists are leaves: ``probs``), objects walked a few levels."""
    for k, v in obj.items():
        path = (*prefix, str(k))
        if isinstance(v, dict) and depth < _MAX_DEPTH:
            yield from leaf_paths(v, path, depth + 1)
        else:
            yield path, v


@dataclass
class _Column:
    """The values of one path over the samples: per input, the values present (``None`` left out)."""

    path: tuple[str, ...]
    values: dict[int, list[Any]] = field(default_factory=dict)  # input index -> values
    records: Counter[int] = field(default_factory=Counter)  # input index -> records with the path present

    def all(self) -> list[Any]:
        return [v for vs in self.values.values() for v in vs]

    @property
    def scalar(self) -> bool:
        """Every value is a JSON scalar (what an id, model, time, score, label or type is)."""
        return all(isinstance(v, (str, int, float)) for vs in self.values.values() for v in vs)

    @property
    def name(self) -> str:
        return describe(self.path)

    def hint(self, what: str) -> bool:
        return re.search(_HINTS[what], self.path[-1], re.IGNORECASE) is not None


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _iso(v: Any) -> bool:
    if not isinstance(v, str) or not 8 <= len(v) <= 40 or not v[:4].isdigit():
        return False
    try:
        datetime.fromisoformat(v.replace("z", "Z").replace("Z", "+00:00"))
    except ValueError:
        return False
    return True


def _epoch_unit(values: list[Any]) -> str | None:
    """The unit in which all ``values`` (numbers) are plausible epoch times, or ``None``."""
    for unit, lo, hi in _EPOCHS:
        if all(lo <= v < hi for v in values):
            return unit
    return None


def _show(values: Sequence[Any], n: int = 3) -> str:
    seen: list[Any] = []
    for v in values:
        if v not in seen:
            seen.append(v)
        if len(seen) == n:
            break
    return ", ".join(f"{v:.3g}" if isinstance(v, float) else repr(v)[:24] for v in seen)


def suggest_mapping(samples: Sequence[tuple[str, Sequence[Any]]]) -> Suggestion:
    """A :class:`Suggestion` from ``(input name, records)`` samples (records that are not objects are ignored).

    Raises
    ------
    ValueError
        One line when the samples hold no object, or nothing that looks like a score or probabilities.
    """
    columns: dict[tuple[str, ...], _Column] = {}
    counts: list[int] = []
    for k, (_, records) in enumerate(samples):
        n = 0
        for rec in records:
            if not isinstance(rec, dict):
                continue
            n += 1
            for path, v in leaf_paths(rec):
                col = columns.get(path)
                if col is None:
                    if len(columns) >= _MAX_PATHS:
                        continue
                    col = columns[path] = _Column(path)
                col.records[k] += 1
                if v is not None:
                    col.values.setdefault(k, []).append(v)
        counts.append(n)
    if not sum(counts):
        raise ValueError("no JSON object, CSV row or table row in the sample: nothing to map")
    s = Suggestion({}, inputs=[(name, n) for (name, _), n in zip(samples, counts)])
    taken: set[tuple[str, ...]] = set()

    def best(cands: list[tuple[float, _Column, str]], what: str) -> _Column | None:
        cands = [c for c in cands if _free(c[1].path, taken)]
        if not cands:
            return None
        score, col, evidence = max(cands, key=lambda c: (c[0] + (1.0 if c[1].hint(what) else 0.0), -len(c[1].name)))
        taken.add(col.path)
        s.fields[what] = Proposal(describe(col.path), evidence, col.path)
        return col

    cols = [c for c in columns.values() if c.values]
    # probabilities first: they are the least ambiguous
    probs = [(1.0, c, f"lists of {len(c.all()[0])} numbers in [0, 1] summing to 1, e.g. {c.all()[0]}"[:120])
             for c in cols if all(isinstance(v, list) and len(v) >= 2 and all(map(_is_number, v))
                                  and all(0 <= x <= 1 for x in v) and abs(sum(v) - 1) <= 1e-3 for v in c.all())]
    best(probs, "probs")
    scores = []
    for c in cols:
        vals = c.all()
        if all(map(_is_number, vals)) and all(0 <= v <= 1 for v in vals) and any(v not in (0, 1) for v in vals):
            frac = sum(c.records.values()) / sum(counts)
            scores.append((frac, c, f"numbers in [0, 1] in {sum(c.records.values())} records, e.g. {_show(vals)}"))
    if "probs" not in s.fields:
        best(scores, "score")
    if "score" not in s.fields and "probs" not in s.fields:
        raise ValueError("no field holds numbers in [0, 1] or probability lists: nothing looks like a score "
                         f"(fields seen: {', '.join(c.name for c in cols[:12])})")
    cols = [c for c in cols if c.scalar]  # lists and deep objects are probs or nothing
    _suggest_time(s, cols, counts, taken)
    _suggest_label(s, cols, taken, best)
    _suggest_id(s, cols, counts, taken, best)
    _suggest_model(s, cols, taken, best)
    _suggest_type(s, cols, samples, taken)
    return s


def _suggest_time(s: Suggestion, cols: list[_Column], counts: list[int], taken: set[tuple[str, ...]]) -> None:
    cands: list[tuple[float, _Column, str, str]] = []
    for c in cols:
        vals = c.all()
        frac = sum(c.records.values()) / sum(counts)
        if all(map(_is_number, vals)):
            unit = _epoch_unit(vals)
            if unit is not None:
                names = {"s": "seconds", "ms": "milliseconds", "us": "microseconds", "ns": "nanoseconds"}
                div = {"s": 1, "ms": 1e3, "us": 1e6, "ns": 1e9}[unit]
                span = " .. ".join(datetime.fromtimestamp(v / div, timezone.utc).strftime("%Y-%m-%d %H:%M:%SZ")
                                   for v in (min(vals), max(vals)))
                cands.append((frac, c, unit, f"epoch {names[unit]}, {span}"))
        elif all(map(_iso, vals)):
            offset = all(re.search(r"(Z|z|[+-]\d\d:?\d\d)$", v) for v in vals)
            cands.append((frac, c, "auto", f"ISO-8601 times, e.g. {vals[0]!r}" + (
                "" if offset else " -- without a UTC offset, which calmon rejects: add one at the source")))
    cands = [c for c in cands if _free(c[1].path, taken)]
    if not cands:
        s.notes.append("no field looks like a time: events take their arrival time (map ts to replay history)")
        return
    _, col, unit, evidence = max(cands, key=lambda c: (c[0] + (1.0 if c[1].hint("ts") else 0.0), -len(c[1].name)))
    taken.add(col.path)
    s.fields["ts"] = Proposal(describe(col.path), evidence, col.path)
    if unit != "s":
        s.ts_unit = unit


def _suggest_label(s: Suggestion, cols: list[_Column], taken: set[tuple[str, ...]], best: Any) -> None:
    cands: list[tuple[float, _Column, str, list[Any] | None]] = []
    for c in cols:
        vals = c.all()
        counted = Counter(vals)
        if all(isinstance(v, bool) for v in vals):
            cands.append((1.0, c, f"booleans (true = 1): {counted[True]} true, {counted[False]} false", None))
        elif all(_is_number(v) and v in (0, 1) for v in vals):
            cands.append((0.9, c, f"0/1 values: {counted[1]} ones, {counted[0]} zeros", None))
        elif all(isinstance(v, str) for v in vals) and 2 <= len(counted) <= 20 and len(counted) < len(vals) / 2:
            cands.append((0.5, c, f"{len(counted)} distinct strings: {_show(list(counted))}", sorted(counted)))
        elif all(isinstance(v, int) and not isinstance(v, bool) and 0 <= v < 1000 for v in vals) and \
                len(counted) >= 2 and len(counted) < len(vals) / 2 and c.hint("label"):
            cands.append((0.6, c, f"class indices 0 .. {max(vals)}", None))
    # a label field without a hint must not steal a type or model field: strings need the hint
    cands = [c for c in cands if c[3] is None or c[1].hint("label")]
    col = best([c[:3] for c in cands], "label")
    if col is None:
        s.notes.append("no field looks like a label (0/1, booleans or a few class names): outcomes cannot be read")
        return
    classes = next(c[3] for c in cands if c[1] is col)
    if classes is not None:
        pos = [v for v in classes if v.lower() in _POSITIVE]
        if len(classes) == 2 and len(pos) == 1:
            s.labels = {"positive": pos, "negative": [v for v in classes if v not in pos]}
        else:
            s.labels = {"classes": classes}


def _suggest_id(s: Suggestion, cols: list[_Column], counts: list[int], taken: set[tuple[str, ...]],
                best: Any) -> None:
    cands = []
    for c in cols:
        vals = c.all()
        if len(vals) < 2 or not all(isinstance(v, str) or (isinstance(v, int) and not isinstance(v, bool))
                                    for v in vals):
            continue
        # an id names one prediction: unique, or seen a few times (its prediction and its outcome in one file)
        most = max(Counter(vs).most_common(1)[0][1] for vs in c.values.values())
        distinct = min(len(set(vs)) / len(vs) for vs in c.values.values())
        if most > 3 or distinct < 0.3:
            continue
        everywhere: Counter[Any] = Counter()
        for vs in c.values.values():
            everywhere.update(set(vs))
        shared = sum(1 for n in everywhere.values() if n > 1) + sum(
            1 for vs in c.values.values() for n in Counter(vs).values() if n > 1)
        n = sum(c.records.values())
        why = f"unique in each input ({n} records)" if most == 1 else f"at most {most} records per value ({n} records)"
        if shared:
            why += f"; {shared} values in more than one record (predictions and outcomes: the join key)"
        cands.append((distinct + len(c.values) + (2.0 if shared else 0.0), c, why))
    if best(cands, "id") is None:
        s.notes.append("no field looks like an id (unique strings or integers): predictions and outcomes cannot be "
                       "joined, only labeled records are read")


def _suggest_model(s: Suggestion, cols: list[_Column], taken: set[tuple[str, ...]], best: Any) -> None:
    cands = []
    for c in cols:
        vals = c.all()
        if not all(isinstance(v, str) for v in vals):
            continue
        distinct = set(vals)
        if len(distinct) <= 50 and (len(distinct) == 1 or len(distinct) < len(vals) / 10) and \
                all(re.fullmatch(r"[A-Za-z0-9_.:/-]{1,128}", v) for v in distinct):
            plural = "s" if len(distinct) > 1 else ""
            cands.append((0.5, c, f"{len(distinct)} distinct name{plural}: {_show(sorted(distinct))}"))
    cands = [c for c in cands if c[1].hint("model")]  # a country is not a model: only a field named like one
    if best(cands, "model") is None:
        name = "default"
        score = s.fields.get("score") or s.fields.get("probs")
        if score is not None:  # p_churn -> churn
            name = re.sub(r"^(p|prob|proba|score|pred)_", "", str(score.spec).split(".")[-1]) or name
            name = name if re.fullmatch(r"[A-Za-z0-9_.:-]{1,64}", name) else "default"
        s.fields["model"] = Proposal({"const": name}, "no field names a model: one model, named here")


def _suggest_type(s: Suggestion, cols: list[_Column], samples: Sequence[tuple[str, Sequence[Any]]],
                  taken: set[tuple[str, ...]]) -> None:
    """A string field with 2-3 values, one carried by records with a score, another by records with a label."""
    score = s.fields.get("score") or s.fields.get("probs")
    label = s.fields.get("label")
    if score is None or label is None:
        return
    spath, lpath = score.path, label.path
    for c in cols:
        if not _free(c.path, taken) or not all(isinstance(v, str) for v in c.all()) or not 2 <= len(set(c.all())) <= 3:
            continue
        has: dict[str, list[int]] = {}  # value -> [records, with score, with label]
        for _, records in samples:
            for rec in records:
                if not isinstance(rec, dict):
                    continue
                v = _get(rec, c.path)
                if isinstance(v, str):
                    h = has.setdefault(v, [0, 0, 0])
                    h[0] += 1
                    h[1] += _get(rec, spath) is not None
                    h[2] += _get(rec, lpath) is not None
        kinds: dict[str, str] = {}
        for v, (n, sc, lab) in has.items():
            kind = ("labeled" if sc == n and lab == n else "prediction" if sc == n and not lab
                    else "outcome" if lab == n and not sc else None)
            if kind is None or kind in kinds:
                break
            kinds[kind] = v
        else:
            if "prediction" in kinds and "outcome" in kinds:
                taken.add(c.path)
                s.fields["type"] = Proposal(describe(c.path), "splits the records: "
                                            + ", ".join(f"{v!r} = {k}" for k, v in kinds.items()), c.path)
                s.types = dict(kinds)
                return


def _free(path: tuple[str, ...], taken: set[tuple[str, ...]]) -> bool:
    """Whether ``path`` neither is nor overlaps a path already proposed (a mapping refuses overlapping paths)."""
    return not any(path[:len(t)] == t or t[:len(path)] == path for t in taken)


def _get(rec: dict[str, Any], path: tuple[str, ...]) -> Any:
    cur: Any = rec
    for key in path:
        if not isinstance(cur, dict):
            return None
        cur = cur.get(key)
    return cur
