"""Property tests of the decoder against hostile input (issue #14).

Whatever the bytes -- arbitrary bytes, arbitrary JSON values, event-like objects with wrong types,
NaN/Infinity tokens, huge numbers, invalid UTF-8, deep nesting, oversized records -- every record
becomes an event or exactly one rejection with a code of ``REASONS``, never an exception; and a
stream decodes the same whatever its batch boundaries (same events, same rejections, same state).
"""

from __future__ import annotations

import json
import math

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from calmon.events.decoder import OUTCOME, REASONS, Decoder

NOW = 1_767_225_600.0
SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _decoder() -> Decoder:
    return Decoder(max_models=3, max_segments=2, max_classes=5, max_record_bytes=3000, max_id_bytes=16,
                   future_skew=3600, past_horizon=86400 * 365, clock=lambda: NOW)


_numbers = st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.integers(min_value=-(10 ** 30),
                                                                                 max_value=10 ** 30),
                     st.sampled_from([0, 1, 0.5, 2, -1, 1e11, 1e300, NOW, NOW + 1e6, NOW - 1e9]))
_anything = st.recursive(st.none() | st.booleans() | _numbers | st.text(max_size=8),
                         lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=4), inner,
                                                                                      max_size=4), max_leaves=12)
_event = st.fixed_dictionaries({}, optional={
    "type": st.sampled_from(["prediction", "outcome", "labeled", "guess"]) | _anything,
    "id": st.sampled_from(["a", "b", "c", "x" * 17, "\u00e9" * 9]) | st.integers(-(10 ** 25), 10 ** 25) | _anything,
    "model": st.sampled_from(["m0", "m1", "m2", "m3", "m4", "bad name!", ""]) | _anything,
    "ts": st.sampled_from(["2026-01-01T00:00:00Z", "9999-12-31T23:59:59Z", "0001-01-01T00:00:00+01:00", "soon",
                           "2026-01-01T00:00:00"]) | _numbers,
    "score": _numbers | _anything,
    "probs": st.lists(st.sampled_from([0.0, 0.2, 0.25, 0.5, 1.0, math.nan, -0.1]) | _numbers, max_size=7),
    "label": st.integers(-3, 6) | _numbers | _anything,
    "segment": st.sampled_from(["eu", "us", "ap", "bad seg"]) | _anything,
})


@st.composite
def _plausible(draw: st.DrawFn) -> dict[str, object]:
    """A well-formed event most of the time: caps, class inference and time limits get exercised."""
    kind = draw(st.sampled_from(["prediction", "outcome", "labeled"]))
    ev: dict[str, object] = {"model": draw(st.sampled_from(["m0", "m1", "m2", "m3", "m4"])),
                             "id": draw(st.sampled_from(["a", "b", "c", "d", 7, "x" * 17]))}
    if draw(st.booleans()):
        ev["type"] = kind
    if kind != "outcome":
        ev.update(draw(st.sampled_from([{"score": 0.3}, {"score": 1.0}, {"probs": [0.5, 0.5]},
                                        {"probs": [0.25] * 4}, {"probs": [0.125] * 8}])))
    if kind != "prediction":
        ev["label"] = draw(st.integers(0, 3))
    if draw(st.booleans()):
        ev["ts"] = draw(st.sampled_from([NOW - 10, NOW, NOW + 5, NOW + 1e5, NOW - 1e9, "2026-01-01T00:00:00Z"]))
    if draw(st.booleans()):
        ev["segment"] = draw(st.sampled_from(["eu", "us", "ap", "sa"]))
    return ev


@st.composite
def _record(draw: st.DrawFn) -> bytes:
    kind = draw(st.integers(0, 14))
    if kind >= 8:
        return json.dumps(draw(_plausible())).encode()
    if kind == 0:
        return draw(st.binary(max_size=64))
    if kind == 1:
        return json.dumps(draw(_anything)).encode()
    if kind == 2:  # nested beyond any recursion limit, inside a field or at the top
        depth = draw(st.integers(500, 5000))
        inner = b"[" * depth + b"]" * depth
        return draw(st.sampled_from([inner, b'{"model":"m0","x":' + inner + b',"score":0.5}']))
    raw = json.dumps(draw(_event), allow_nan=True, ensure_ascii=draw(st.booleans())).encode()
    if kind == 3 and len(raw) > 2:  # invalid UTF-8 somewhere
        at = draw(st.integers(1, len(raw) - 1))
        raw = raw[:at] + draw(st.sampled_from([b"\xff", b"\xc3", b"\xed\xa0\x80", b"\x80\x80"])) + raw[at:]
    if kind == 4:
        raw = raw[:-1] + b',"pad":"' + b"p" * 4000 + b'"}' if raw.endswith(b"}") else raw
    return raw


def _outcome(dec: Decoder, records: list[bytes]) -> tuple[dict[int, tuple], dict[int, str]]:
    out = dec.decode(records)
    events: dict[int, tuple] = {}
    for name, mb in out.models.items():
        for j, i in enumerate(mb.index.tolist()):
            value = _f(mb.score[j]) if mb.score is not None else tuple(mb.probs[j].tolist())
            if mb.kind[j] == OUTCOME:  # an outcome has no prediction, and a batch of outcomes may precede K
                classes, value = None, None
            else:
                classes = mb.classes
            events[i] = (name, classes, int(mb.kind[j]), mb.ids[j], _f(mb.ts[j]), int(mb.label[j]), value,
                         mb.segment[j])
    rejected = {r.index: r.reason for r in out.rejected}
    assert len(rejected) == len(out.rejected), "a record was rejected twice"
    assert not set(events) & set(rejected), "a record was both accepted and rejected"
    assert set(events) | set(rejected) == set(range(len(records))), "a record was lost"
    assert set(rejected.values()) <= set(REASONS)
    assert out.accepted == len(events) and out.total == len(records)
    for mb in out.models.values():  # what reaches the join is finite and in range
        assert np.all(np.isnan(mb.ts) | ((mb.ts <= NOW + 3600) & (mb.ts >= NOW - 86400 * 365)))
        assert mb.score is None or np.all(np.isnan(mb.score) | ((mb.score >= 0) & (mb.score <= 1)))
        if mb.probs is not None:
            rows = mb.probs[mb.kind != OUTCOME]
            assert mb.classes <= 5 and np.all((rows >= 0) & (rows <= 1))
    return events, rejected


def _f(x: float) -> float | str:
    return "nan" if isinstance(x, float) and math.isnan(x) else x


@SETTINGS
@given(st.lists(_record(), min_size=1, max_size=40))
def test_every_record_is_an_event_or_exactly_one_reason(records: list[bytes]) -> None:
    _outcome(_decoder(), records)


@SETTINGS
@given(st.lists(_record(), min_size=1, max_size=60), st.lists(st.integers(1, 20), min_size=1, max_size=60))
def test_batches_decode_the_same_whatever_the_split(records: list[bytes], sizes: list[int]) -> None:
    ref = _decoder()
    ref_events, ref_rejected = _outcome(ref, records)
    dec = _decoder()
    events: dict[int, tuple] = {}
    rejected: dict[int, str] = {}
    start, k = 0, 0
    while start < len(records):
        size = sizes[k % len(sizes)]
        ev, rej = _outcome(dec, records[start:start + size])
        events.update({start + i: e for i, e in ev.items()})
        rejected.update({start + i: r for i, r in rej.items()})
        start, k = start + size, k + 1
    assert rejected == ref_rejected
    assert events == ref_events
    assert dec.state() == ref.state()


def test_str_records_and_lone_surrogates() -> None:
    out = _decoder().decode(['{"id":"\ud800","model":"m0","score":0.5}', '{"id":"a","model":"m0","score":0.5}'])
    assert [r.reason for r in out.rejected] == ["bad_encoding"] and len(out.models["m0"]) == 1
