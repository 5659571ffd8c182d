"""Errors that name the cause (issue #32.3): booleans are labels, a probe reports the first record's actual failure
per field and blames the field that is wrong, every file of a directory is probed, and the first error on records of
another shape proposes a mapping."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from calmon.cli import main as cli_main
from calmon.events.decoder import Decoder
from calmon.events.schema import load_mapping


def _check(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = cli_main(["check", *argv])
    out, err = capsys.readouterr()
    return code, out, err.strip()


def _write(path: Path, records: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


# ------------------------------------------------------------------------------------------ booleans are labels
@pytest.mark.parametrize("mapping", [None, {"fields": {"label": "converted"}}])
def test_boolean_labels_are_one_and_zero_everywhere(mapping):
    key = "label" if mapping is None else "converted"
    recs = [json.dumps({"model": "m", "score": 0.8, key: True}).encode(),
            json.dumps({"model": "m", "score": 0.3, key: False}).encode()]
    out = Decoder(mapping=None if mapping is None else load_mapping(mapping)).decode(recs)
    assert not out.rejected and out.models["m"].label.tolist() == [1, 0]


def test_boolean_labels_in_csv_and_parquet(tmp_path, capsys):
    csv = tmp_path / "a.csv"
    csv.write_text("score,label\n0.8,true\n0.3,False\n0.6,TRUE\n")
    code, out, err = _check(capsys, str(csv), "--json")
    assert code == 0, err
    assert json.loads(out)["n"] == 3
    mapped = tmp_path / "b.csv"
    mapped.write_text("p,converted\n0.8,true\n0.3,false\n")
    code, out, err = _check(capsys, str(mapped), "--map", "score=p", "--map", "label=converted",
                            "--map", "model={const: m}", "--json")
    assert code == 0, err
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq
    pq.write_table(pa.table({"p": [0.8, 0.3], "converted": [True, False]}), tmp_path / "c.parquet")
    code, out, err = _check(capsys, str(tmp_path / "c.parquet"), "--map", "score=p", "--map", "label=converted",
                            "--map", "model={const: m}", "--json")
    assert code == 0, err


def test_outcomes_with_boolean_labels_join(tmp_path, capsys):
    # the finding: `label: converted` on {"converted": true} said "matched none of the first 38074 records"
    preds = _write(tmp_path / "p.jsonl", [{"rid": f"r{i}", "model": "m", "score": 0.5} for i in range(1200)])
    outs = _write(tmp_path / "o.jsonl", [{"rid": f"r{i}", "converted": i % 2 == 0} for i in range(1200)])
    code, out, err = _check(capsys, str(preds), str(outs), "--map", "id=rid", "--map", "label=converted", "--json")
    assert code == 0, err
    assert json.loads(out)["join"]["joined"] == 1200


# ------------------------------------------------------------------------------------ the probe names the cause
def test_a_wrong_type_is_reported_with_the_first_records_value_and_where(tmp_path, capsys):
    path = _write(tmp_path / "a.jsonl", [{"rid": f"r{i}", "model": "m", "p": "0.3", "label": 1} for i in range(5)])
    code, _, err = _check(capsys, str(path), "--map", "id=rid", "--map", "score=p")
    assert code == 2
    assert err == ("calmon check: error: schema.fields.score: path 'p' found a string '0.3' in record 1 "
                   f"(line 1 of {path}); expected a number in [0, 1]")


def test_the_field_that_is_wrong_is_blamed_not_the_first_one(tmp_path, capsys):
    # id is right, score is a string: every record is refused, but because of score (it blamed id before)
    path = _write(tmp_path / "a.jsonl", [{"request_id": f"r{i}", "model": "m", "p_churn": str(i / 10), "y": 1}
                                         for i in range(5)])
    code, _, err = _check(capsys, str(path), "--map", "id=request_id", "--map", "score=p_churn", "--map", "label=y",
                          "--map", "ts=time")
    assert code == 2
    assert err.startswith("calmon check: error: schema.fields.score: path 'p_churn' found a string '0.0' in record 1")
    assert err.endswith("(also wrong: schema.fields.ts)") and "fields.id" not in err


def test_an_absent_path_names_the_keys_the_records_have(tmp_path, capsys):
    path = _write(tmp_path / "a.jsonl", [{"rid": f"r{i}", "model": "m", "prob": 0.5, "label": 1} for i in range(5)])
    code, _, err = _check(capsys, str(path), "--map", "score=porb")
    assert code == 2
    assert err == ("calmon check: error: schema.fields.score: path 'porb' is absent from all 5 records read, 5 of "
                   "them rejected (their keys: rid, model, prob, label; did you mean 'prob'?)")


def test_every_file_of_a_directory_is_probed(tmp_path, capsys):
    # outcomes.jsonl sorts first and holds more than probe_records records, none with a score
    d = tmp_path / "data"
    d.mkdir()
    _write(d / "outcomes.jsonl", [{"rid": f"r{i}", "y": i % 2} for i in range(1500)])
    _write(d / "predictions.jsonl", [{"rid": f"r{i}", "model": "m", "p": 0.5} for i in range(1500)])
    code, out, err = _check(capsys, str(d), "--map", "id=rid", "--map", "score=p", "--map", "label=y", "--json")
    assert code == 0, err
    assert json.loads(out)["join"]["joined"] == 1500


def test_every_file_of_a_parquet_directory_is_probed(tmp_path, capsys):
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq
    d = tmp_path / "tables"
    d.mkdir()
    ids = [f"r{i}" for i in range(1500)]
    pq.write_table(pa.table({"rid": ids, "converted": [i % 3 == 0 for i in range(1500)]}), d / "outcomes.parquet")
    pq.write_table(pa.table({"rid": ids, "p": [0.4] * 1500}), d / "predictions.parquet")
    code, out, err = _check(capsys, str(d), "--map", "id=rid", "--map", "score=p", "--map", "label=converted",
                            "--map", "model={const: m}", "--json")
    assert code == 0, err
    assert json.loads(out)["join"]["joined"] == 1500


# ------------------------------------------------------------------------- records of another shape: a proposal
def test_the_first_unmapped_error_proposes_a_mapping(tmp_path, capsys):
    preds = _write(tmp_path / "p.jsonl", [{"request_id": f"q{i}", "ts_ms": 1767225600000 + i, "model_name": "churn",
                                           "p_churn": (i % 10) / 10} for i in range(300)])
    outs = _write(tmp_path / "o.jsonl", [{"request_id": f"q{i}", "ts_ms": 1767229200000 + i, "churned": i % 2 == 1}
                                         for i in range(300)])
    code, _, err = _check(capsys, str(preds), str(outs))
    assert code == 2 and "\n" not in err
    assert err.startswith(f"calmon check: error: {preds}: line 1: missing_field: model is required")
    options = "--map id=request_id --map model=model_name --map score=p_churn --map label=churned --map ts=ts_ms " \
              "--map ts_unit=ms"
    assert options in err and f"calmon schema suggest {preds} {outs}" in err
    code, out, err = _check(capsys, str(preds), str(outs), *options.split(), "--json")  # the proposal works
    assert code == 0, err
    assert json.loads(out)["join"]["joined"] == 300
