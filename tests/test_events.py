import json
import tracemalloc

import numpy as np
import pytest

from calmon.events.decoder import LABELED, OUTCOME, PREDICTION, REASONS, Decoder, parse_timestamp

GOOD = [
    b'{"type":"labeled","id":"a","model":"m","ts":"2026-01-01T00:00:00Z","score":0.25,"label":1}',
    b'{"type":"prediction","id":"b","model":"m","ts":1767225600.5,"score":0.75}',
    b'{"type":"outcome","id":"b","model":"m","label":0}',
    b'{"id":"c","label":1}',
    b'{"model":"k3","probs":[0.2,0.3,0.5],"label":2,"segment":"eu"}',
]


def test_decodes_columns_and_infers_types():
    out = Decoder().decode(GOOD)
    assert not out.rejected
    m = out.models["m"]
    assert m.kind.tolist() == [LABELED, PREDICTION, OUTCOME]
    assert m.score[:2].tolist() == [0.25, 0.75]
    assert np.isnan(m.score[2]) and m.label.tolist() == [1, -1, 0]
    assert m.ts[0] == 1767225600.0 and np.isnan(m.ts[2])
    assert out.models[""].kind.tolist() == [OUTCOME]
    k3 = out.models["k3"]
    assert k3.classes == 3 and k3.probs.shape == (1, 3) and k3.segment.tolist() == ["eu"]


@pytest.mark.parametrize("record,reason", [
    (b"not json", "not_json"),
    (b"\xff\xfe\x00", "not_json"),
    (b'{"model":"m","score":0.5', "not_json"),
    (b"[1, 2]", "not_object"),
    (b'{"model":"m","label":1}', "missing_field"),
    (b'{"model":"m","score":0.5}', "missing_field"),
    (b'{"model":"m","score":"0.5","label":1}', "bad_type"),
    (b'{"model":"m","score":true,"label":1}', "bad_type"),
    (b'{"model":"m","score":NaN,"label":1}', "non_finite"),
    (b'{"model":"m","score":Infinity,"label":1}', "non_finite"),
    (b'{"model":"m","score":1.5,"label":1}', "out_of_range"),
    (b'{"model":"m","score":0.5,"label":2}', "label_range"),
    (b'{"model":"m","score":0.5,"label":-3}', "label_range"),
    (b'{"model":"m","score":0.5,"label":1,"ts":"last week"}', "bad_timestamp"),
    (b'{"model":"m","score":0.5,"label":1,"ts":1767225600000}', "bad_timestamp"),
    (b'{"model":"m","score":0.5,"label":1,"type":"guess"}', "unknown_type"),
    (b'{"model":"bad model!","score":0.5,"label":1}', "bad_type"),
])
def test_rejections_name_the_reason(record, reason):
    out = Decoder().decode([GOOD[0], record])
    assert [r.reason for r in out.rejected] == [reason]
    assert out.rejected[0].index == 1 and out.rejected[0].detail
    assert len(out.models["m"]) == 1  # the good record is untouched


def test_multiclass_consistency_and_sum():
    dec = Decoder()
    dec.decode([b'{"model":"k","probs":[0.2,0.3,0.5],"label":1}'])
    out = dec.decode([b'{"model":"k","probs":[0.5,0.5],"label":1}', b'{"model":"k","probs":[0.2,0.3,0.6],"label":1}',
                      b'{"model":"k","score":0.3,"label":1}', b'{"model":"k","probs":[0.2,0.3,0.5],"label":3}'])
    assert [r.reason for r in out.rejected] == ["k_mismatch", "probs_sum", "k_mismatch", "label_range"]
    assert Decoder(models={"k": 4}).decode([b'{"model":"k","probs":[0.2,0.3,0.5],"label":1}']).rejected[0].reason \
        == "k_mismatch"


def test_cardinality_caps():
    dec = Decoder(max_models=2, max_segments=1)
    recs = [f'{{"model":"m{i}","score":0.5,"label":1,"segment":"s{i % 2}"}}'.encode() for i in range(4)]
    out = dec.decode(recs + [b'{"model":"m0","score":0.5,"label":1,"segment":"s9"}'])
    assert sorted(out.models) == ["m0", "m1"]
    assert out.reason_counts() == {"too_many_models": 2, "too_many_segments": 1}
    assert set(out.reason_counts()) <= set(REASONS)
    state = dec.state()
    dec2 = Decoder(max_models=2)
    dec2.load_state(state)
    assert dec2.models == dec.models


def test_binary_probs_of_length_two_become_scores():
    out = Decoder().decode([b'{"model":"m","probs":[0.3,0.7],"label":1}'])
    assert out.models["m"].score.tolist() == [0.7]


def test_parse_timestamp():
    assert parse_timestamp("2026-01-01T01:00:00+01:00") == 1767225600.0
    assert np.isnan(parse_timestamp(None))


# ------------------------------------------------------------------------------ hostile input (issue #14)

NOW = 1_767_225_600.0  # 2026-01-01T00:00:00Z


def _pred(i: int, model: str = "m", **extra: object) -> bytes:
    return json.dumps({"type": "prediction", "id": f"p{i}", "model": model, "score": 0.5, **extra}).encode()


@pytest.mark.parametrize("record,reason", [
    (b'{"id":"\xff","model":"m","score":0.5,"label":1}', "bad_encoding"),
    (b'{"model":"m","score":0.5,"label":1,"segment":"a\xc3"}', "bad_encoding"),
    (b'{"x":' + b"[" * 1200 + b"]" * 1200 + b',"model":"m","score":0.5,"label":1}', "too_deep"),
    (b"[" * 100_000, "too_deep"),
    (b'{"model":"m","score":0.5,"label":1,"pad":"' + b"a" * 300_000 + b'"}', "too_large"),
    (b'{"model":"m","score":0.5,"label":123456789012345678901234567890}', "label_range"),
    (b'{"id":123456789012345678901234567890,"model":"m","score":0.5}', "id_too_long"),
    (b'{"id":"' + b"i" * 300 + b'","model":"m","score":0.5}', "id_too_long"),
    ('{"id":"' + "\u00e9" * 129 + '","model":"m","score":0.5}', "id_too_long"),  # 258 bytes in 129 characters
    (b'{"model":"m","score":0.5,"label":1,"ts":"9999-12-31T23:59:59Z"}', "future_timestamp"),
    (b'{"model":"m","score":0.5,"label":1,"ts":99999999999}', "future_timestamp"),
    (b'{"model":"m","score":0.5,"label":1,"ts":"1970-01-01T00:00:01Z"}', "past_timestamp"),
    (b'{"model":"m","score":0.5,"label":1,"ts":1e999}', "non_finite"),
    (b'{"model":"m","score":0.5,"label":1,"ts":' + b"9" * 30 + b"}", "bad_timestamp"),
    (b'{"model":"n","probs":[' + b",".join([b"0.0001"] * 1001) + b'],"label":1}', "too_many_classes"),
], ids=lambda x: x if isinstance(x, str) and len(x) < 30 else "")
def test_hostile_records_get_one_reason(record, reason):
    dec = Decoder(max_record_bytes=200_000, future_skew=3600, past_horizon=10 * 365 * 86400, clock=lambda: NOW)
    out = dec.decode([GOOD[0], record, GOOD[1]])
    assert [(r.index, r.reason) for r in out.rejected] == [(1, reason)]
    assert len(out.models["m"]) == 2  # the records around it are untouched


def test_id_length_is_counted_in_utf8_bytes():
    dec = Decoder(max_id_bytes=256)
    ok = [json.dumps({"id": s, "model": "m", "score": 0.5}, ensure_ascii=False).encode()
          for s in ("i" * 256, "\u00e9" * 128, "\U0001f600" * 64)]
    assert not dec.decode(ok).rejected
    assert [r.reason for r in dec.decode([_pred(0).replace(b'"p0"', b'"' + b"i" * 257 + b'"')]).rejected] \
        == ["id_too_long"]


def test_rejected_times_never_reach_the_join():
    """A prediction from year 5138 is rejected at the decoder, so the watermark stays where it was."""
    from calmon.config import build_config
    from calmon.state.agentstate import AgentState
    from calmon.state.ingest import Ingestor
    from connectors.base import Batch
    st = AgentState(build_config({"sources": [{"path": "x"}]}, env={}))
    st.decoder.clock = lambda: NOW
    ing = Ingestor(st, None, lambda: NOW)
    ing.ingest(Batch([_pred(0, ts=NOW - 60)], None, "s"))
    ing.ingest(Batch([_pred(1, ts=99999999999), _pred(2, ts="9999-12-31T23:59:59Z"), _pred(3, ts=NOW - 30)],
                     None, "s"))
    assert st.watermark == NOW - 30
    assert st.counters.to_dict()["rejected"] == {"future_timestamp": 2}


def test_inferred_classes_obey_max_classes_without_allocating():
    recs = [json.dumps({"model": "wide", "probs": [1e-5] * 100_000, "label": 0}).encode() for _ in range(10)]
    dec = Decoder(max_classes=1000)
    tracemalloc.start()
    try:
        out = dec.decode(recs)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert out.reason_counts() == {"too_many_classes": 10} and "wide" not in dec.models
    assert peak < 200 << 20, peak  # the state once grew to 2.8 GB here
    assert dec.decode([b'{"model":"wide","probs":[0.5,0.5],"label":1}']).models["wide"].classes == 2
    with pytest.raises(ValueError, match="classes"):
        Decoder(models={"x": 1001}, max_classes=1000)


def test_outcomes_of_new_models_count_against_the_model_cap():
    dec = Decoder(max_models=3)
    outs = [b'{"type":"outcome","id":"a","model":"o%d","label":1}' % i for i in range(1000)]
    out = dec.decode(outs)
    assert sorted(out.models) == ["o0", "o1", "o2"] and out.reason_counts() == {"too_many_models": 997}
    # a prediction of an admitted model fixes its classes later; a new one is beyond the cap
    out = dec.decode([_pred(1, "o1"), _pred(2, "new")])
    assert list(out.models) == ["o1"] and dec.models == {"o1": 2}
    undeclared = Decoder(models={"m": 2}, discover=False).decode([b'{"type":"outcome","id":"a","model":"x","label":1}'])
    assert [r.reason for r in undeclared.rejected] == ["too_many_models"]


def _mixed_models(n: int, seed: int = 3) -> list[bytes]:
    """Predictions, outcomes and invalid records of many models, first appearances interleaved."""
    rng = np.random.default_rng(seed)
    recs = []
    for i in range(n):
        m = f"m{int(rng.integers(0, 40))}"
        k = rng.integers(4)
        if k == 0:
            recs.append(b'{"type":"outcome","id":"x%d","model":"%s","label":1}' % (i, m.encode()))
        elif k == 1:
            recs.append(b'{"model":"%s","score":1.5,"label":1}' % m.encode())  # out of range: admits nothing
        elif k == 2:
            recs.append(b'{"model":"%s","label":1}' % m.encode())  # malformed: admits nothing
        else:
            recs.append(_pred(i, m, segment=f"s{int(rng.integers(0, 9))}"))
    return recs


@pytest.mark.parametrize("batch", [1, 7, 100, 2001])
def test_cap_decisions_do_not_depend_on_the_batch_size(batch):
    recs = _mixed_models(2001)
    ref = Decoder(max_models=12, max_segments=4)
    ref_out = ref.decode(recs)
    dec = Decoder(max_models=12, max_segments=4)
    reasons: list[tuple[int, str]] = []
    accepted = 0
    for start in range(0, len(recs), batch):
        out = dec.decode(recs[start:start + batch])
        reasons += [(start + r.index, r.reason) for r in out.rejected]
        accepted += out.accepted
    assert reasons == [(r.index, r.reason) for r in ref_out.rejected]
    assert accepted == ref_out.accepted and dec.state() == ref.state()
    assert ref_out.reason_counts()["too_many_models"] > 100


def test_poison_records_cost_exactly_themselves_in_the_agent(tmp_path):
    """Invalid UTF-8, deep nesting and an oversized record: each dead-lettered with its reason, the batch goes on."""
    from calmon.config import build_config
    from calmon.state.agentstate import AgentState
    from calmon.state.ingest import Ingestor
    from connectors.base import Batch
    from connectors.deadletter import FileDeadLetterSink
    cfg = build_config({"sources": [{"path": "x"}], "limits": {"max_record_bytes": 8192}}, env={})
    st = AgentState(cfg)
    sink = FileDeadLetterSink(tmp_path / "dead.jsonl")
    ing = Ingestor(st, sink, lambda: NOW)
    poison = [b'{"model":"m","id":"\xff","score":0.5,"label":1}', b'{"x":' + b"[" * 3000 + b"]" * 3000 + b"}",
              b'{"model":"m","score":0.5,"label":1,"pad":"' + b"p" * 9000 + b'"}']
    good = [b'{"model":"m","score":0.%d,"label":%d}' % (i, i % 2) for i in range(1, 7)]
    ing.ingest(Batch(good[:2] + poison[:1] + good[2:4] + poison[1:] + good[4:], None, "s"))
    sink.close()
    c = st.counters.to_dict()
    assert c["rejected"] == {"bad_encoding": 1, "too_deep": 1, "too_large": 1}
    dead = [json.loads(x) for x in (tmp_path / "dead.jsonl").read_text().splitlines()]
    assert [d["reason"] for d in dead] == ["bad_encoding", "too_deep", "too_large"]
    assert sum(s.bucket.count for s in st.snapshot() if s.segment == "all" and s.window == "1h") == 6


def test_a_rejected_record_neither_takes_a_model_slot_nor_fixes_classes():
    """Found by the fuzz suite (#31): a well-formed record that is then rejected (a score of 1.5, probabilities
    summing to 1.8, a time in the future) admitted its model under ``limits.max_models`` and fixed its classes, so
    one bad record could lock out a real model or make every later good record of it a ``k_mismatch``."""
    bad = [b'{"model":"x%d","score":1.5,"label":1}' % i for i in range(3)]
    dec = Decoder(max_models=2)
    out = dec.decode([*bad, _pred(1, "a"), _pred(2, "b")])
    assert sorted(out.models) == ["a", "b"] and out.reason_counts() == {"out_of_range": 3}
    dec = Decoder(future_skew=3600)
    out = dec.decode([b'{"type":"prediction","id":"1","model":"y","probs":[0.5,0.6,0.7]}',
                      b'{"type":"prediction","id":"2","model":"y","probs":[0.5,0.5]}'])
    assert [r.reason for r in out.rejected] == ["probs_sum"] and dec.models == {"y": 2}
    future = b'{"type":"prediction","id":"3","model":"z","probs":[0.2,0.3,0.5],"ts":9999999999}'
    out = dec.decode([future, _pred(4, "z")])
    assert [r.reason for r in out.rejected] == ["future_timestamp"] and dec.models["z"] == 2


@pytest.mark.parametrize("batch", [1, 2, 5])
def test_admission_by_the_first_good_record_does_not_depend_on_batches(batch):
    recs = [b'{"model":"x","score":1.5,"label":1}', b'{"model":"y","label":1}', _pred(1, "x"),
            b'{"model":"z","score":2,"label":1}', _pred(2, "w"), _pred(3, "z"), b'{"model":"v","score":9,"label":1}']
    ref = Decoder(max_models=2)
    want = [(r.index, r.reason) for r in ref.decode(recs).rejected]
    dec = Decoder(max_models=2)
    got = [(s + r.index, r.reason) for s in range(0, len(recs), batch) for r in dec.decode(recs[s:s + batch]).rejected]
    assert got == want and dec.state() == ref.state()
    assert want == [(0, "out_of_range"), (1, "missing_field"), (3, "out_of_range"), (5, "too_many_models"),
                    (6, "too_many_models")]
