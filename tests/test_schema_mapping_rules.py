"""Schema mappings (issue #16): one-line errors, reason codes, metadata, multiclass shapes, model-less outcomes."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import numpy as np
import pytest

from calmon.cli import main as cli_main
from calmon.config import ConfigError, build_config
from calmon.events.decoder import REASONS, Decoder
from calmon.events.schema import MappingError, load_mapping, mapping_from_options
from calmon.state.join import Joiner
from connectors.base import RecordMeta


# ------------------------------------------------------------------------------------------- bad mappings
@pytest.mark.parametrize("doc, message", [
    ({"fields": {"scroe": "p"}}, "schema.fields.scroe: unknown field"),
    ({"field": {"score": "p"}}, "schema.field: unknown key"),
    ({"fields": {"score": "p", "probs": "p"}}, "schema.fields.probs: conflicts with fields.score (the same path"),
    ({"fields": {"model": "meta", "segment": "meta.country"}}, "schema.fields.segment: conflicts with fields.model"),
    ({"fields": {"model": {"const": "m", "path": "x"}}}, "schema.fields.model: give const or path, not both"),
    ({"fields": {"model": {"cnst": "m"}}}, "schema.fields.model.cnst: unknown key"),
    ({"fields": {"probs": {"const": 1}}}, "schema.fields.probs.const: must be a scalar"),
    ({"fields": {"score": "a..b"}}, "schema.fields.score: 'a..b' has an empty key"),
    ({"fields": {"ts": "$key"}}, "schema.fields.ts: $key cannot be the ts field"),
    ({"fields": {"id": "$header.x"}}, "schema.fields.id: unknown metadata"),
    ({"fields": {"score": 3}}, "schema.fields.score: must be a path"),
    ({"ts_unit": "minutes"}, "schema.ts_unit: must be one of"),
    ({"labels": {"positive": ["yes"], "classes": ["a", "b"]}}, "schema.labels: give positive (binary) or classes"),
    ({"labels": {"negative": ["no"]}}, "schema.labels.negative: needs positive"),
    ({"labels": {"positive": ["y"], "negative": ["y"]}}, "schema.labels.negative: shares values with positive"),
    ({"labels": {"classes": ["a"]}}, "schema.labels.classes: must be a list of at least 2 values"),
    ({"types": {"predicton": "p"}}, "schema.types.predicton: unknown event type"),
    ({"types": {"prediction": "x", "outcome": "x"}}, "schema.types: two event types share a raw value"),
    ({"fields": {"probs": ["a", "b", "c"]}, "labels": {"classes": ["x", "y"]}},
     "schema.fields.probs: 3 paths but labels.classes has 2"),
    ({"probe_records": -1}, "schema.probe_records: must be a non-negative integer"),
])
def test_bad_mappings_are_one_line_errors_naming_the_key(doc, message):
    with pytest.raises(MappingError) as err:
        load_mapping(doc)
    assert str(err.value).startswith(message)
    assert "\n" not in str(err.value)


def test_mapping_files_and_map_options(tmp_path):
    f = tmp_path / "schema.yaml"
    f.write_text("fields:\n  score: p\n  label: y\nts_unit: ms\nlabels: {positive: ['yes']}\n")
    m = mapping_from_options(["label=outcome.y", "types.outcome=out", "model={const: fraud}"], load_mapping(f))
    assert m.source("score").path == ("p",) and m.source("label").path == ("outcome", "y")
    assert m.ts_unit == "ms" and m.positive == ("yes",) and m.type_map == {"out": "outcome"}
    assert m.source("model").kind == "const" and m.source("model").value == "fraud"
    assert m.columns == {"p", "outcome", "id", "probs", "segment", "ts", "type"}
    assert mapping_from_options(["probs=[c0, c1, c2]"]).source("probs").paths == (("c0",), ("c1",), ("c2",))
    with pytest.raises(MappingError, match="unknown key 'scroe'"):
        mapping_from_options(["scroe=p"])
    (tmp_path / "bad.yaml").write_text("fields: [1, 2\n")
    with pytest.raises(MappingError, match="not YAML/JSON"):
        load_mapping(tmp_path / "bad.yaml")


def test_cli_bad_schema_exits_2_with_one_line(tmp_path, capsys):
    data = tmp_path / "e.jsonl"
    data.write_text('{"model": "m", "p": 0.5, "y": 1}\n' * 1000)
    assert cli_main(["check", str(data), "--map", "scroe=p"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("calmon check: error: --map 'scroe=p': unknown key") and "\n" not in err
    assert cli_main(["check", str(data), "--map", "score=prob"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == ("calmon check: error: schema.fields.score: path 'prob' is absent from all 1000 records read, "
                   "1000 of them rejected (their keys: model, p, y)")


def test_agent_config_rejects_a_bad_source_schema():
    with pytest.raises(ConfigError) as err:
        build_config({"sources": [{"path": "x.jsonl", "schema": {"fields": {"x": "p"}}}]}, env={})
    assert str(err.value).startswith("sources.0.schema.fields.x: unknown field")
    cfg = build_config({"sources": [{"path": "x.jsonl", "schema": {"fields": {"score": "p"}}}]}, env={})
    assert cfg.sources[0].mapping().source("score").path == ("p",)


# ----------------------------------------------------------------------------------------- bad records
def test_bad_mapped_records_get_one_reason_code_each():
    m = load_mapping({"fields": {"id": "rid", "model": "meta.model", "score": "p", "label": "y", "ts": "t"},
                      "ts_unit": "ms", "labels": {"positive": ["yes"], "negative": ["no"]}, "probe_records": 0})
    recs = [b'{"rid": "a", "meta": {"model": "m"}, "p": 0.5, "y": "yes", "t": 1767225600000}',  # fine
            b'{"rid": "b", "meta": {"model": "m"}, "p": 0.5, "y": "maybe"}',  # unmapped_label
            b'{"rid": "c", "meta": "m", "p": 0.5, "y": "no"}',  # bad_type: meta is not an object
            b'{"rid": "d", "meta": {"model": "m"}, "p": "high", "y": "no"}',  # bad_type
            b'{"rid": "e", "meta": {"model": "m"}, "p": NaN, "y": "no"}',  # non_finite
            b'{"rid": "f", "meta": {"model": "m"}, "p": 1.5, "y": "no"}',  # out_of_range
            b'[1, 2]', b'nope', b'{"rid": "g", "meta": {"model": "m"}, "p": 0.5, "y": "no", "t": "x"}',
            b'{"rid": "h", "meta": {"model": "m"}, "p": 0.5, "y": "no", "t": 1e30}',
            b'{"rid": "i", "meta": {"model": "m"}, "p": 0.5}',  # a prediction: fine
            b'{"rid": "j", "meta": null, "p": 0.5, "y": "no"}']  # no model: missing_field
    out = Decoder(mapping=m).decode(recs)
    got = [(r.index, r.reason) for r in out.rejected]
    assert got == [(1, "unmapped_label"), (2, "bad_type"), (3, "bad_type"), (4, "non_finite"), (5, "out_of_range"),
                   (6, "not_object"), (7, "not_json"), (8, "bad_timestamp"), (9, "bad_timestamp"),
                   (11, "missing_field")]
    assert all(r.reason in REASONS for r in out.rejected)
    mb = out.models["m"]
    assert mb.ids.tolist() == ["a", "i"] and mb.ts[0] == 1767225600.0 and mb.label[0] == 1


def test_a_path_that_never_matches_warns_once_in_the_agent_and_never_raises(caplog):
    m = load_mapping({"fields": {"score": "p", "label": "y", "segment": "country"}, "probe_records": 5})
    dec = Decoder(mapping=m)  # the agent's decoder: probe="warn"
    with caplog.at_level(logging.WARNING, logger="calmon.events"):
        dec.decode([b'{"model": "m", "p": 0.5, "y": 1}'] * 3)  # 3 < 5: not yet decided
        assert not caplog.records
        out = dec.decode([b'{"model": "m", "p": 0.5, "y": 1}'] * 3)
        dec.decode([b'{"model": "m", "p": 0.5, "y": 1}'] * 3)
        dec.finish()
    assert len(out.models["m"]) == 3  # the batch is applied
    assert [r.getMessage().split(" (their")[0] for r in caplog.records] == [
        "schema.fields.segment: path 'country' is absent from all 6 records read"]  # once, with counts
    assert "[6 records read, 0 rejected]; a warning, not an error" in caplog.records[0].getMessage()


def test_offline_a_path_that_never_matches_the_whole_input_is_one_line_naming_the_cause():
    m = load_mapping({"fields": {"score": "p", "label": "y", "segment": "country"}, "probe_records": 5})
    dec = Decoder(mapping=m, probe="raise")
    dec.decode([b'{"model": "m", "p": 0.5, "y": 1}'] * 6)  # beyond probe_records: the input may show it later
    dec.decode([b'{"model": "m", "p": 0.5, "y": 1, "cuontry": "fr"}'] * 2)
    with pytest.raises(MappingError, match=r"^schema.fields.segment: path 'country' is absent from all 8 records "
                                           r"read \(their keys: model, p, y, cuontry; did you mean 'cuontry'\?\)$"):
        dec.finish()
    dec = Decoder(mapping=m, probe="raise")
    dec.decode([b'{"model": "m", "p": 0.5, "y": 1}'] * 6)
    dec.decode([b'{"model": "m", "p": 0.5, "y": 1, "country": "fr"}'])  # matched late: no error
    dec.finish()


# ---------------------------------------------------------------------------------------- transport metadata
def test_record_metadata_gives_ts_id_and_model():
    m = load_mapping({"fields": {"id": "$key", "model": "$headers.model", "score": "p", "label": "y"}})
    meta = [RecordMeta(1767225600123, b"k1", (("model", b"fraud"), ("model", b"other"))),
            RecordMeta(None, b"k2", (("model", b"fraud"),))]
    out = Decoder(mapping=m).decode([b'{"p": 0.5}', b'{"y": 1, "ts": 1767225700}'], meta=meta)
    mb = out.models["fraud"]
    assert mb.ids.tolist() == ["k1", "k2"] and mb.ts.tolist() == [1767225600.123, 1767225700.0]
    # canonical records without ts take the record's timestamp too; a payload ts wins
    out = Decoder().decode([b'{"model": "m", "id": "a", "score": 0.5}', b'{"model": "m", "id": "b", "score": 0.5, '
                            b'"ts": 5}'], meta=[RecordMeta(1767225600500), RecordMeta(1767225600500)])
    assert out.models["m"].ts.tolist() == [1767225600.5, 5.0]


def test_meta_ids_join_across_predictions_and_outcomes():
    m = load_mapping({"fields": {"id": "$key", "ts": "$timestamp", "score": "p", "label": "y"}})
    dec, j = Decoder(mapping=m), Joiner(ttl=60)
    b = dec.decode([b'{"model": "m", "p": 0.8}', b'{"y": 1}'],
                   meta=[RecordMeta(1767225600000, b"r1"), RecordMeta(1767225601000, b"r1")])
    out = j.process(b.models)
    assert out["m"].label.tolist() == [1] and out["m"].ts.tolist() == [1767225600.0]


# ---------------------------------------------------------------------------------------------- multiclass
def test_probs_objects_and_class_names():
    m = load_mapping({"fields": {"model": {"const": "digits"}, "probs": "scores", "label": "y"},
                      "labels": {"classes": ["cat", "dog", "bird"]}})
    out = Decoder(mapping=m).decode([
        b'{"scores": {"dog": 0.7, "cat": 0.1, "bird": 0.2}, "y": "bird"}',
        b'{"scores": [0.2, 0.3, 0.5], "y": "cat"}',
        b'{"scores": {"dog": 0.7, "cat": 0.3}, "y": "dog"}',  # k_mismatch: a class is missing
        b'{"scores": [0.2, 0.3, 0.5], "y": "fish"}'])  # unmapped_label
    mb = out.models["digits"]
    assert mb.probs is not None
    assert mb.probs.tolist() == [[0.1, 0.7, 0.2], [0.2, 0.3, 0.5]] and mb.label.tolist() == [2, 0]
    assert [(r.index, r.reason) for r in out.rejected] == [(2, "k_mismatch"), (3, "unmapped_label")]


def test_probs_from_one_column_per_class_in_csv(tmp_path, capsys):
    rng = np.random.default_rng(1)
    p = rng.dirichlet([1, 1, 1], size=200).round(6)
    p[:, 2] = (1 - p[:, 0] - p[:, 1]).round(6)
    y = np.array([rng.choice(3, p=row / row.sum()) for row in p])
    (tmp_path / "a.csv").write_text("c0,c1,c2,truth\n" + "".join(f"{a},{b},{c},{k}\n" for (a, b, c), k in zip(p, y)))
    (tmp_path / "b.csv").write_text("p0,p1,p2,label\n" + "".join(f"{a},{b},{c},{k}\n" for (a, b, c), k in zip(p, y)))
    assert cli_main(["check", str(tmp_path / "a.csv"), "--json", "--tests", "none", "--map", "probs=[c0,c1,c2]",
                     "--map", "label=truth", "--map", "model={const: digits}"]) == 0
    mapped = json.loads(capsys.readouterr().out)
    assert cli_main(["check", str(tmp_path / "b.csv"), "--json", "--tests", "none"]) == 0
    plain = json.loads(capsys.readouterr().out)
    assert mapped["classes"] == 3 and mapped["n"] == 200 and mapped["metrics"] == plain["metrics"]


# ------------------------------------------------------------------------ outcomes without a model (bug fix)
def test_a_multiclass_outcome_without_model_joins_its_prediction():
    dec, j = Decoder(), Joiner(ttl=60)
    out = dec.decode([b'{"id": "a", "model": "digits", "ts": 1, "probs": [0.2, 0.3, 0.5]}',
                      b'{"id": "a", "ts": 2, "label": 2}'])
    assert out.rejected == []
    joined = j.process(out.models)["digits"]
    assert joined.probs is not None
    assert joined.label.tolist() == [2] and joined.probs.tolist() == [[0.2, 0.3, 0.5]]
    # the same across batch boundaries
    dec, j = Decoder(), Joiner(ttl=60)
    j.process(dec.decode([b'{"id": "a", "model": "digits", "ts": 1, "probs": [0.2, 0.3, 0.5]}']).models)
    out = dec.decode([b'{"id": "a", "ts": 2, "label": 2}'])
    assert out.rejected == [] and j.process(out.models)["digits"].label.tolist() == [2]


def test_a_model_less_label_must_fit_every_admitted_model():
    # a binary model is admitted: label 2 could join it, so it is refused (as before)
    dec = Decoder()
    out = dec.decode([b'{"id": "a", "model": "digits", "ts": 1, "probs": [0.2, 0.3, 0.5]}',
                      b'{"id": "b", "model": "fraud", "ts": 1, "score": 0.5}',
                      b'{"id": "a", "ts": 2, "label": 2}', b'{"id": "b", "ts": 2, "label": 1}'])
    assert [(r.index, r.reason) for r in out.rejected] == [(2, "label_range")]
    # record order decides, not the batch: before the multiclass model's first prediction, label 2 is refused
    for split in (1, 2, 3):
        recs = [b'{"id": "x", "ts": 1, "label": 2}', b'{"id": "a", "model": "digits", "ts": 1, '
                b'"probs": [0.2, 0.3, 0.5]}', b'{"id": "a", "ts": 2, "label": 2}']
        dec = Decoder()
        got = dec.decode(recs[:split]).rejected + dec.decode(recs[split:]).rejected
        assert [r.reason for r in got] == ["label_range"] and len(got) == 1


def test_check_reads_multiclass_outcomes_without_model(tmp_path, capsys):
    lines = []
    rng = np.random.default_rng(3)
    for i in range(120):
        p = rng.dirichlet([2, 2, 2]).round(4)
        p[2] = round(1 - p[0] - p[1], 4)
        lines.append(json.dumps({"id": f"r{i}", "model": "digits", "ts": i, "probs": p.tolist()}))
        lines.append(json.dumps({"id": f"r{i}", "ts": i + 0.5, "label": int(rng.choice(3, p=p / p.sum()))}))
    f = tmp_path / "mc.jsonl"
    f.write_text("\n".join(lines) + "\n")
    assert cli_main(["check", str(f), "--json", "--tests", "none"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["n"] == 120 and doc["classes"] == 3 and doc["join"]["orphan_outcomes"] == 0


def test_per_source_decoders_share_models_and_caps():
    cfg = build_config({"sources": [{"name": "a", "path": "a.jsonl"},
                                    {"name": "b", "path": "b.jsonl", "schema": {"fields": {"score": "p"}}}],
                        "limits": {"max_models": 1}}, env={})
    from calmon.state.agentstate import AgentState
    st = AgentState(cfg)
    assert st.decoder_for("a") is st.decoder and st.decoder_for("b") is not st.decoder
    st.decoder_for("b").decode([b'{"model": "m1", "p": 0.5, "label": 1}'])
    out = st.decoder_for("a").decode([b'{"model": "m2", "score": 0.5, "label": 1}'])
    assert [r.reason for r in out.rejected] == ["too_many_models"] and st.decoder.state()["names"] == ["m1"]


def test_readme_schema_example_file(tmp_path: Path, capsys):
    """The issue's example record reads with the issue's mapping."""
    rec = {"prediction_id": "a1", "meta": {"model": "fraud", "country": "FR"}, "p": 0.8, "y": "yes",
           "event_time": 1763719200123}
    f = tmp_path / "e.jsonl"
    f.write_text(json.dumps(rec) + "\n" + json.dumps({**rec, "prediction_id": "a2", "p": 0.3, "y": "no"}) + "\n")
    schema = tmp_path / "s.yaml"
    schema.write_text("fields:\n  id: prediction_id\n  model: meta.model\n  score: p\n  label: y\n  ts: event_time\n"
                      "  segment: meta.country\nts_unit: ms\nlabels: {positive: [\"yes\", \"fraud\", 1]}\n")
    assert cli_main(["check", str(f), "--schema", str(schema), "--json", "--tests", "none"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["n"] == 2 and doc["model"] == "fraud"


def test_hostile_records_through_a_mapping_get_reason_codes():
    m = load_mapping({"fields": {"id": "rid", "model": "meta.model", "score": "p", "label": "y"},
                      "labels": {"positive": ["yes"]}, "probe_records": 0})
    deep = b'{"rid": "a", "meta": ' + b'{"x": ' * 5000 + b'1' + b'}' * 5000 + b', "p": 0.5}'
    recs = [deep, b'{"rid": "\xff\xfe", "meta": {"model": "m"}, "p": 0.5}',
            b'{"rid": 123456789012345678901234567890, "meta": {"model": "m"}, "p": 0.5}',
            b'{"rid": "b", "meta": {"model": "m"}, "p": 0.5, "y": 99999999999999999999999}',
            b'{"rid": "c", "meta": {"model": "bad name!"}, "p": 0.5}', b'\xef\xbb\xbf{"rid": "d", "meta": '
            b'{"model": "m"}, "p": 0.5}', b'{"rid": "e", "meta": {"model": "m"}, "p": 0.5, "y": true}']
    out = Decoder(mapping=m, max_record_bytes=1 << 20).decode(recs)
    assert [(r.index, r.reason) for r in out.rejected] == [
        (0, "too_deep"), (1, "bad_encoding"), (2, "id_too_long"), (3, "label_range"), (4, "bad_type")]
    assert out.models["m"].ids.tolist() == ["d", "e"] and out.models["m"].label.tolist() == [-1, 0]


@pytest.mark.parametrize("field, value", [("score", "x"), ("score", 1.5), ("label", "churn"), ("label", 0.5),
                                          ("model", 3), ("id", 1.5), ("ts", True), ("type", 7)])
def test_a_constant_no_record_could_carry_is_refused_when_loaded(field, value):
    """Found by the fuzz suite (#31): ``label: {const: churn}`` reached the checks as a string and crashed every
    batch (``ValueError: could not convert string to float``); now one line naming the key, before anything is read."""
    with pytest.raises(MappingError, match=rf"^schema\.fields\.{field}\.const: must be "):
        load_mapping({"fields": {field: {"const": value}}})
