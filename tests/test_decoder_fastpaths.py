"""The decoder's batch-wide fast paths (issue #15) give what the per-event route gives, bit for bit.

Every fast path of :mod:`calmon.events.decoder` / :mod:`calmon.events.checks` / :mod:`calmon.events.parse` is gated by
an exact test (one event type, string ids, no absent score, one model, every segment known...). The reference
here is the per-event code those paths replace, kept verbatim: the decoder is run once as it is and once
with the reference helpers patched in, on batches built to hit both routes, and every output is compared
(accepted columns and their dtypes, rejections with their details, the decoder's state). The lazy file
origins are compared with the eagerly formatted list the file source used to build.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import calmon.events.checks as eventchecks
import calmon.events.decoder as events
from calmon.events.checks import _KIND_CODE, columns_of
from calmon.events.decoder import Decoder
from calmon.events.parse import _ABSENT, EventFields, ParsedColumns, fields_of_events, parse_columns, parse_records
from calmon.events.rows import Columns, Rows
from connectors.files import FileSource
from connectors.lineorigins import LineOrigins

NOW = 1_767_225_600.0


# -- the per-event reference (the code the fast paths replaced) ---------------------------------------------
def _columns_ref(f: EventFields) -> Columns:
    scores, probs = f.score, f.probs
    label_f = np.array(f.label, dtype=np.float64)
    has_label = ~np.isnan(label_f)
    with np.errstate(invalid="ignore"):
        label = np.where(has_label, label_f, -1).astype(np.int64)
    kind = np.array([-1 if t is None else _KIND_CODE.get(t, -2) for t in f.type], dtype=np.int8)
    ids = np.array(["" if i is None else i if i.__class__ is str else str(i) for i in f.id], dtype=object)
    return Columns(kind, ids, label, label_f, np.array([x is not None for x in scores], dtype=bool),
                   np.array([x is not None for x in probs], dtype=bool), has_label, scores, probs)


def _segments_ref(col: Sequence[Any]) -> np.ndarray:
    return np.array(["" if s is None else s for s in col], dtype=object)


def _str_mask_ref(col: Sequence[Any]) -> np.ndarray:
    return np.fromiter((t.__class__ is str for t in col), bool, len(col))


def _rows_of_ref(cls: type[Rows], names: list[str | None], present: Sequence[int], one: bool | None = None) -> Rows:
    pos: dict[str, int] = {}
    code = {key: pos.setdefault(key or "", len(pos)) for key in dict.fromkeys(names)}
    n = len(names)
    codes = np.fromiter(map(code.__getitem__, names), np.int64, n)
    return cls(list(pos), codes, np.asarray(list(present), dtype=np.int64), pos.get("", -1))


def _check_segments_ref(self: Decoder, g: Rows, segment: np.ndarray, v: eventchecks.Verdicts) -> None:
    named = (segment != "") & (g.codes != g.orphan)
    if not named.any():
        return
    known = [self.segments.setdefault(m, set()) if h else set() for m, h in zip(g.models, g.has(named).tolist())]
    rows = np.flatnonzero(named & v.ok)
    for j, k, s in zip(rows.tolist(), g.codes[rows].tolist(), segment[rows].tolist()):
        seen = known[k]
        if s in seen:
            continue
        model = g.models[k]
        if not eventchecks.NAME_RE.match(s):
            v.reject_one(j, "bad_type", f"segment {s[:40]!r} is not [A-Za-z0-9_.:/-]{{1,128}}")
        elif len(seen) >= self.max_segments:
            v.reject_one(j, "too_many_segments", f"model {model[:40]!r} has {self.max_segments} segments")
        else:
            seen.add(s)


def _split_ref(self: Rows, ok: np.ndarray, classes: list[int], c: Columns, ts: np.ndarray, segment: np.ndarray,
               score: np.ndarray, probs: dict[int, tuple[np.ndarray, np.ndarray]]) -> dict[str, events.ModelBatch]:
    okpos = np.flatnonzero(ok)
    out: dict[str, events.ModelBatch] = {}
    last = [] if self.orphan < 0 else [self.orphan]
    for k in [k for k in range(len(self.models)) if k != self.orphan] + last:
        rows = okpos[self.codes[okpos] == k]
        if not rows.size:
            continue
        m = self.models[k]
        sc, pr = (None, probs[k][1][np.searchsorted(probs[k][0], rows)]) if k in probs else (score[rows], None)
        out[m] = events.ModelBatch(m, classes[k], c.kind[rows], c.ids[rows], ts[rows], segment[rows],
                                   c.label[rows], sc, pr, self.index[rows])
    return out


def _decode_ref(dec: Decoder, records: list[bytes], origins: list[str] | None = None) -> events.DecodedBatch:
    """``dec.decode`` by the per-event route: events struct by struct, then the reference helpers."""
    mp = pytest.MonkeyPatch()
    try:
        def parse_ref(recs: list[bytes], max_bytes: float) -> Any:
            evs, rejected = parse_records(recs, max_bytes)
            full = [_ABSENT if e is None else e for e in evs]
            f = fields_of_events(full)
            return ParsedColumns(f, [e.model for e in full]), rejected
        mp.setattr(events, "parse_columns", parse_ref)
        mp.setattr(eventchecks, "columns_of", _columns_ref)
        mp.setattr(events, "_segments", _segments_ref)
        mp.setattr(eventchecks, "_str_mask", _str_mask_ref)
        mp.setattr(Rows, "of", classmethod(_rows_of_ref))
        mp.setattr(Rows, "split", _split_ref)
        mp.setattr(Decoder, "_check_segments", _check_segments_ref)
        return dec.decode(records, origins)
    finally:
        mp.undo()


def _same(a: events.DecodedBatch, b: events.DecodedBatch) -> None:
    assert a.total == b.total
    assert [(r.index, r.reason, r.detail, r.origin) for r in a.rejected] == \
        [(r.index, r.reason, r.detail, r.origin) for r in b.rejected]
    assert list(a.models) == list(b.models)
    for name, ma in a.models.items():
        mb = b.models[name]
        assert (ma.model, ma.classes) == (mb.model, mb.classes)
        for col in ("kind", "ids", "ts", "segment", "label", "score", "probs", "index"):
            x, y = getattr(ma, col), getattr(mb, col)
            if x is None or y is None:
                assert x is None and y is None, col
                continue
            assert x.dtype == y.dtype and x.shape == y.shape, col
            assert np.array_equal(x, y, equal_nan=x.dtype.kind == "f"), col
            if x.dtype == object:
                assert [type(e) for e in x.tolist()] == [type(e) for e in y.tolist()], col


def _pair() -> tuple[Decoder, Decoder]:
    def make() -> Decoder:
        return Decoder(max_models=3, max_segments=2, max_classes=5, max_record_bytes=400, max_id_bytes=16,
                       future_skew=3600, past_horizon=86400 * 365, clock=lambda: NOW)
    return make(), make()


# -- the column helpers -----------------------------------------------------------------------------------
_type = st.sampled_from([None, "prediction", "outcome", "labeled", "guess"])
_id = st.sampled_from([None, "a", "b", "", "x" * 20]) | st.integers(-5, 5)
_score = st.none() | st.floats(0, 1)
_probs = st.none() | st.lists(st.floats(0, 1), max_size=3)
_label = st.none() | st.integers(0, 3)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(_type, _id, _score, _probs, _label), max_size=12), st.booleans())
def test_columns_of_is_the_per_event_route(rows: list[tuple[Any, ...]], homogeneous: bool) -> None:
    if homogeneous and rows:  # the fast paths' case: one type, string ids, every score, no probs
        rows = [(rows[0][0] or "labeled", f"i{j}", s if s is not None else 0.5, None, lab)
                for j, (_, _, s, _, lab) in enumerate(rows)]
    cols = [list(c) for c in zip(*rows)] if rows else [[] for _ in range(5)]
    f = EventFields(cols[0], cols[1], [None] * len(rows), cols[2], cols[3], cols[4], [None] * len(rows))
    got, want = columns_of(f), _columns_ref(f)
    for name in ("kind", "ids", "label", "label_f", "has_score", "has_probs", "has_label"):
        x, y = getattr(got, name), getattr(want, name)
        assert x.dtype == y.dtype and x.shape == y.shape and np.array_equal(x, y, equal_nan=x.dtype.kind == "f"), name
    assert [type(i) for i in got.ids.tolist()] == [type(i) for i in want.ids.tolist()]


def test_helpers_on_edge_columns() -> None:
    for col in ([], ["web"], ["web", None, "app"], [None, None], ["", "web"]):
        assert np.array_equal(events._segments(col), _segments_ref(col)) and events._segments(col).dtype == object
    for ts in ([], [1.0, 2], [1.0, "2026-01-01T00:00:00Z"], [None]):
        assert np.array_equal(eventchecks._str_mask(ts), _str_mask_ref(ts))
    cases: list[list[str | None]] = [["m"], ["m", "m"], [None, None], ["m", None, "n", "m"], ["", None], [None, "m"]]
    for names in cases:
        a, b = Rows.of(names, range(len(names))), _rows_of_ref(Rows, names, range(len(names)))
        assert (a.models, a.codes.tolist(), a.index.tolist(), a.orphan) == \
            (b.models, b.codes.tolist(), b.index.tolist(), b.orphan)


# -- whole batches, against the per-event route -----------------------------------------------------------
def _record(rng: random.Random, j: int, mixed: bool) -> bytes:
    model = rng.choice(["m0", "m1", "m2", "m3"]) if mixed else "m0"
    ev: dict[str, Any] = {"type": "labeled", "id": f"r{j}", "model": model, "ts": NOW - rng.random() * 1e4,
                          "score": round(rng.random(), 6), "label": rng.randint(0, 1),
                          "segment": rng.choice(["web", "app"])}
    if mixed:
        roll = rng.random()
        if roll < 0.1:
            ev["segment"] = rng.choice(["ios", "tv", "bad seg", None])
        elif roll < 0.2:
            ev.pop("type")
        elif roll < 0.3:
            ev["type"] = rng.choice(["prediction", "outcome", "guess"])
        elif roll < 0.35:
            ev["id"] = rng.choice([None, 7, "y" * 20])
        elif roll < 0.4:
            ev.pop("score")
            ev["probs"] = rng.choice([[0.3, 0.7], [0.2, 0.3, 0.5], [0.5, 0.6]])
        elif roll < 0.45:
            ev["ts"] = rng.choice(["2026-01-01T00:00:00Z", "soon", NOW + 1e6])
        elif roll < 0.5:
            ev.pop("model")
            ev["type"] = "outcome"
        elif roll < 0.55:
            return rng.choice([b"nope", b"[1]", b'{"model": "m0", "score": "x"}', b"\xff" * 3, b"{" * 500])
    return f"{ev}".replace("'", '"').replace("None", "null").encode()


@pytest.mark.parametrize("mixed", [False, True])
@pytest.mark.parametrize("seed", range(6))
def test_decode_is_the_per_event_route(seed: int, mixed: bool) -> None:
    rng = random.Random(seed)
    fast, ref = _pair()
    for _ in range(4):  # several batches: state (models, classes, segments) carries over
        recs = [_record(rng, j, mixed) for j in range(rng.choice([1, 7, 300, 2500]))]
        origins = [f"f:{j + 1}" for j in range(len(recs))]
        _same(fast.decode(recs, origins), _decode_ref(ref, recs, origins))
        assert fast.state() == ref.state()
    assert mixed or not fast.segments["m0"] - {"web", "app"}


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.sampled_from([
    b'{"type":"labeled","id":"a","model":"m","ts":1767225000.5,"score":0.25,"segment":"web","label":1}',
    b'{"type":"labeled","id":"b","model":"m","ts":1767225001,"score":0.75,"segment":"app","label":0}',
    b'{"type":"labeled","id":"c","model":"m","score":0.5,"label":0}',
    b'{"type":"prediction","id":"d","model":"m","score":0.5,"segment":"ios"}',
    b'{"id":"e","label":1}', b'{"type":"labeled","id":"f","model":"m","score":1.5,"label":0}',
    b'{"model":"n","probs":[0.2,0.3,0.5],"label":2}', b'{"model":"m","id":3,"score":0.1,"ts":"2026-01-01T00:00:00Z"}',
    b'{"model":"m","score":0.1,"segment":null,"label":1}', b"garbage",
]), max_size=40))
def test_decode_small_batches(recs: list[bytes]) -> None:
    fast, ref = _pair()
    _same(fast.decode(recs), _decode_ref(ref, recs))
    assert fast.state() == ref.state()


def test_parse_columns_is_parse_records() -> None:
    recs = [b'{"model":"m","score":0.5}', b"bad", b'{"model":"m","probs":[0.5,0.5],"id":4}', b"x" * 600] * 700
    parsed, rejected = parse_columns(recs, 500)
    evs, rejected_ref = parse_records(recs, 500)
    assert [(r.index, r.reason, r.detail) for r in rejected] == [(r.index, r.reason, r.detail) for r in rejected_ref]
    ref = fields_of_events([_ABSENT if e is None else e for e in evs])
    for name in ("type", "id", "ts", "score", "probs", "label", "segment"):
        assert getattr(parsed.fields, name) == getattr(ref, name), name
    assert parsed.model == [None if e is None else e.model for e in evs]


@pytest.mark.parametrize("seed", range(8))
def test_batch_facts_are_the_columns(seed: int) -> None:
    """The facts gathered chunk by chunk are those of the whole columns (batches over several chunks)."""
    rng = random.Random(seed)
    pick = rng.random() < 0.5  # rare deviations, late in the batch or nowhere
    recs = []
    for j in range(rng.choice([1, 1024, 1025, 3000])):
        ev: dict[str, Any] = {"type": "labeled", "id": f"r{j}", "model": "m", "ts": 1.5, "score": 0.5, "segment": "s"}
        if pick and rng.random() < 0.002:
            key = rng.choice(["type", "id", "model", "ts", "score", "segment"])
            ev[key] = rng.choice([None, 7, "x" * 30, "2026-01-01T00:00:00Z", "outcome", "n"])
        recs.append(f"{ev}".replace("'", '"').replace("None", "null").encode())
    parsed, rejected = parse_columns(recs)
    f, facts = parsed.fields, parsed.fields.facts
    assert facts is not None
    strs = all(type(i) is str for i in f.id)
    assert facts.ids_str == strs and (not strs or facts.id_chars == max(map(len, f.id)))
    assert facts.one_type == (type(f.type[0]) is str and all(t == f.type[0] for t in f.type))
    assert facts.scores == all(x is not None for x in f.score)
    assert facts.segments == all(x is not None for x in f.segment)
    assert facts.ts_str == any(type(t) is str for t in f.ts)
    assert facts.one_model == all(m == parsed.model[0] for m in parsed.model)


# -- lazy origins -----------------------------------------------------------------------------------------
def test_line_origins_is_a_list_of_strings() -> None:
    o = LineOrigins()
    want: list[str] = []
    for path, lines in (("a", range(1, 5)), ("b", [3, 9]), ("c", range(7, 7)), ("d", range(2, 3))):
        o.add(path, lines)
        want += [f"{path}:{n}" for n in lines]
    assert len(o) == len(want) and list(o) == want and o == want and bool(o)
    assert [o[i] for i in range(-len(want), len(want))] == want + want
    assert o[1:5] == want[1:5] and o[::-2] == want[::-2]
    for bad in (len(want), -len(want) - 1):
        with pytest.raises(IndexError):
            o[bad]
    assert not LineOrigins() and list(LineOrigins()) == [] and o != want[:-1]


def test_file_origins_are_the_eager_ones(tmp_path: Any) -> None:
    """The file source's origins equal the path:line list it used to format, blank lines, CSV headers and
    overlong lines included."""
    lines = []
    rng = random.Random(3)
    for j in range(5000):
        roll = rng.random()
        lines.append("" if roll < 0.05 else "\r" if roll < 0.07 else "z" * 300 if roll < 0.08
                     else f'{{"model":"m","id":"{j}","score":0.5}}')
    (tmp_path / "a.jsonl").write_text("\n".join(lines) + "\n")
    (tmp_path / "b.csv").write_text("model,score\n" + "\n".join(f"m,0.{j % 10}" for j in range(300)) + "\n\nm,0.5\n")
    src = FileSource(tmp_path, max_line_bytes=200)
    got: list[str] = []
    while (b := src.read(max_records=777)) is not None:
        assert isinstance(b.origins, LineOrigins) and len(b.origins) == len(b.records)
        got += [b.origins[i] for i in range(len(b.records))]
    want = [f"{tmp_path / 'a.jsonl'}:{n}" for n, line in enumerate(lines, 1) if line not in ("", "\r")]
    want += [f"{tmp_path / 'b.csv'}:{n}" for n in range(2, 302)] + [f"{tmp_path / 'b.csv'}:303"]
    assert got == want
