import numpy as np
import pytest

from calmon.events import LABELED, OUTCOME, PREDICTION, REASONS, Decoder, parse_timestamp

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
