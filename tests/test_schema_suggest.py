"""``calmon schema suggest`` (issue #32.3): a working schema file, with its evidence, for records of a foreign shape."""

from __future__ import annotations

import gzip
import json
import random
from pathlib import Path

import pytest
import yaml

from calmon.cli import main as cli_main
from calmon.events.schema import load_mapping


def _churn_files(tmp_path: Path, n: int = 3000) -> tuple[Path, Path]:
    """Predictions and outcomes of a churn model in two files of their own shape, labels booleans, 0.1-20 h late."""
    rng = random.Random(7)
    preds, outs = tmp_path / "preds.jsonl", tmp_path / "outcomes.jsonl"
    t0 = 1_767_225_600_000
    with preds.open("w") as p, outs.open("w") as o:
        rows = []
        for i in range(n):
            score = rng.random()
            p.write(json.dumps({"request_id": f"req-{i:06d}", "ts_ms": t0 + 1000 * i, "model_name": "churn",
                                "p_churn": round(score, 4)}) + "\n")
            rows.append((t0 + 1000 * i + rng.randint(360_000, 72_000_000), i, rng.random() < score))
        for ts, i, churned in sorted(rows):  # outcomes in the order they arrive
            o.write(json.dumps({"request_id": f"req-{i:06d}", "ts_ms": ts, "churned": churned}) + "\n")
    return preds, outs


def test_suggest_then_check_joins_every_outcome(tmp_path, capsys):
    preds, outs = _churn_files(tmp_path)
    out = tmp_path / "suggested.yaml"
    assert cli_main(["schema", "suggest", str(preds), str(outs), "-o", str(out)]) == 0
    text = out.read_text()
    doc = yaml.safe_load(text)
    assert doc["fields"] == {"id": "request_id", "model": "model_name", "score": "p_churn", "label": "churned",
                             "ts": "ts_ms"}
    assert doc["ts_unit"] == "ms"
    assert "# booleans (true = 1)" in text and "join key" in text and "epoch milliseconds" in text  # the evidence
    capsys.readouterr()
    assert cli_main(["check", str(preds), str(outs), "--schema", str(out), "--json"]) == 0
    res = json.loads(capsys.readouterr().out)
    assert res["n"] == 3000
    assert res["join"]["joined"] == 3000 and res["join"]["orphan_outcomes"] == 0


def test_suggest_prints_the_schema_without_o(tmp_path, capsys):
    preds, outs = _churn_files(tmp_path, 200)
    assert cli_main(["schema", "suggest", str(tmp_path / "*.jsonl")]) == 0
    printed = capsys.readouterr().out
    assert load_mapping(yaml.safe_load(printed)).source("label").path == ("churned",)


def test_one_compressed_file_with_an_event_type_and_string_labels(tmp_path, capsys):
    from calmon.events.suggest import suggest_mapping  # here: the file collects before #32
    rng = random.Random(3)
    path = tmp_path / "events.jsonl.gz"
    with gzip.open(path, "wt") as f:
        for i in range(500):
            p = rng.random()
            f.write(json.dumps({"kind": "pred", "uid": i, "meta": {"model": "fraud"}, "prob": p,
                                "time": "2026-01-01T00:00:00Z"}) + "\n")
            f.write(json.dumps({"kind": "label", "uid": i, "meta": {"model": "fraud"},
                                "y": "yes" if rng.random() < p else "no", "time": "2026-01-01T01:00:00Z"}) + "\n")
    s = suggest_mapping([(str(path), [json.loads(line) for line in gzip.open(path, "rt")])])
    assert s.document() == {
        "fields": {"id": "uid", "model": "meta.model", "score": "prob", "label": "y", "ts": "time", "type": "kind"},
        "labels": {"positive": ["yes"], "negative": ["no"]}, "types": {"prediction": "pred", "outcome": "label"}}
    out = tmp_path / "s.yaml"
    assert cli_main(["schema", "suggest", str(path), "-o", str(out)]) == 0
    capsys.readouterr()
    assert cli_main(["check", str(path), "--schema", str(out), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["n"] == 500


def test_parquet_and_csv_inputs(tmp_path, capsys):
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq
    rng = random.Random(5)
    scores = [rng.random() for _ in range(400)]
    d = tmp_path / "tables"
    d.mkdir()
    pq.write_table(pa.table({"rid": [f"r{i}" for i in range(400)], "score_v": scores}), d / "predictions.parquet")
    pq.write_table(pa.table({"rid": [f"r{i}" for i in range(400)], "converted": [rng.random() < s for s in scores]}),
                   d / "outcomes.parquet")
    out = tmp_path / "t.yaml"
    assert cli_main(["schema", "suggest", str(d), "-o", str(out)]) == 0
    doc = yaml.safe_load(out.read_text())
    assert doc["fields"]["score"] == "score_v" and doc["fields"]["label"] == "converted"
    assert set(doc["fields"]["model"]) == {"const"}  # no field names a model: one model, named
    capsys.readouterr()
    assert cli_main(["check", str(d), "--schema", str(out), "--json"]) == 0  # outcomes.parquet sorts first
    assert json.loads(capsys.readouterr().out)["n"] == 400
    csv = tmp_path / "a.csv"
    csv.write_text("rid,p,y\n" + "".join(f"r{i},{s:.3f},{'True' if i % 2 else 'False'}\n"
                                         for i, s in enumerate(scores)))
    assert cli_main(["schema", "suggest", str(csv), "-o", str(out)]) == 0
    assert yaml.safe_load(out.read_text())["fields"]["label"] == "y"


def test_nothing_like_a_score_is_one_line(tmp_path, capsys):
    path = tmp_path / "x.jsonl"
    path.write_text('{"a": "x", "b": 7}\n' * 5)
    assert cli_main(["schema", "suggest", str(path)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("calmon schema: error: no field holds numbers in [0, 1]") and "\n" not in err


def test_any_records_give_a_proposal_or_one_value_error():
    from calmon.events.suggest import suggest_mapping  # here: the file collects before #32
    rng = random.Random(11)
    leaves = [None, True, 0, 1, 0.5, 1e300, -3, "x", "2026-01-01T00:00:00Z", [0.2, 0.8], [1, "a"], {"d": {"e": [1]}},
              [[1]], 1700000000123, "yes", ""]
    for _ in range(1000):
        keys = [rng.choice(["a", "b", "p", "y", "id", "ts", "model", "a.b", "", "0"]) for _ in range(rng.randint(0, 6))]
        records = [{k: rng.choice(leaves) for k in keys} for _ in range(rng.randint(0, 8))] + [rng.choice(leaves)]
        try:
            s = suggest_mapping([("x", records)])
        except ValueError:
            continue
        load_mapping(yaml.safe_load(s.to_yaml()))  # whatever it proposes is a valid schema file


def test_the_sample_size_is_bounded_and_the_action_required(tmp_path, capsys):
    preds, _ = _churn_files(tmp_path, 50)
    assert cli_main(["schema", "suggest", str(preds), "--sample", "0"]) == 2
    assert capsys.readouterr().err.strip() == "calmon schema: error: --sample: must be in [1, 1000000], got 0"
    with pytest.raises(SystemExit) as exc:
        cli_main(["schema"])
    assert exc.value.code == 2


def test_the_default_sample_size_is_the_samplers():
    from calmon.commands.schema import SAMPLE_RECORDS
    from calmon.offline import sample
    assert SAMPLE_RECORDS == sample.SAMPLE_RECORDS
