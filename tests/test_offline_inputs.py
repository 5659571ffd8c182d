"""Several inputs for check / fit / apply / report: files, directories, globs, mixed formats, joined by id (#32.2)."""

from __future__ import annotations

import json
import random
from pathlib import Path

import numpy as np
import pytest

from calmon.cli import main as cli_main


def _events(d: Path, n: int = 3000, seed: int = 1) -> tuple[Path, Path, list[dict]]:
    """Predictions in one file, their outcomes (90 %, shuffled, one orphan) in another, as a team keeps them."""
    r = random.Random(seed)
    preds, outs = [], []
    for i in range(n):
        z = r.random()
        preds.append({"type": "prediction", "id": f"u{i}", "model": "churn", "ts": 1.7e9 + i, "score": z})
        if i % 10:
            outs.append({"type": "outcome", "id": f"u{i}", "ts": 1.7e9 + i + 7200, "label": int(r.random() < z)})
    r.shuffle(outs)
    outs.append({"type": "outcome", "id": "nobody", "label": 1})
    (d / "p").mkdir(exist_ok=True)
    pp, op = d / "p" / "predictions.jsonl", d / "p" / "outcomes.jsonl"
    pp.write_text("".join(json.dumps(x) + "\n" for x in preds))
    op.write_text("".join(json.dumps(x) + "\n" for x in outs))
    return pp, op, preds


def _same(a, b) -> None:  # noqa: ANN001
    assert a.n == b.n and a.joined == b.joined
    order_a, order_b = np.argsort(a.ids), np.argsort(b.ids)
    np.testing.assert_array_equal(a.ids[order_a], b.ids[order_b])
    np.testing.assert_array_equal(a.z[order_a], b.z[order_b])
    np.testing.assert_array_equal(a.y[order_a], b.y[order_b])


def test_two_files_join_like_one_concatenated_file(tmp_path: Path) -> None:
    from calmon.offline.inputs import read_input, read_inputs  # here: the file collects before #32
    pp, op, preds = _events(tmp_path)
    both = read_inputs([str(pp), str(op)])
    assert (both.n, both.joined, both.unjoined_predictions, both.orphan_outcomes) == (2700, 2700, 300, 1)
    cat = tmp_path / "cat.jsonl"
    cat.write_bytes(pp.read_bytes() + op.read_bytes())
    _same(both, read_input(str(cat)))
    # outcomes first: the join does not depend on the order of the inputs
    _same(read_inputs([str(op), str(pp)]), both)
    # every joined row carries its prediction's score
    score = {p["id"]: p["score"] for p in preds}
    assert all(score[i] == z for i, z in zip(both.ids, both.z))


def test_directory_glob_and_mixed_formats(tmp_path: Path) -> None:
    from calmon.offline.inputs import read_input, read_inputs  # here: the file collects before #32
    pq = pytest.importorskip("pyarrow.parquet")
    import pyarrow as pa

    pp, op, preds = _events(tmp_path)
    ref = read_inputs([str(pp), str(op)])
    _same(read_input(str(pp.parent)), ref)  # the directory
    _same(read_input(str(tmp_path / "p" / "*.jsonl")), ref)  # a glob
    _same(read_input(str(tmp_path / "**" / "*.jsonl")), ref)  # a recursive glob
    # predictions as Parquet, outcomes as gzip JSON Lines, in one directory with a hidden file that is skipped
    mixed = tmp_path / "mixed"
    mixed.mkdir()
    pq.write_table(pa.table({"type": ["prediction"] * len(preds), "id": [p["id"] for p in preds],
                             "model": ["churn"] * len(preds), "ts": [p["ts"] for p in preds],
                             "score": [p["score"] for p in preds]}), mixed / "predictions.parquet")
    import gzip
    (mixed / "outcomes.jsonl.gz").write_bytes(gzip.compress(op.read_bytes()))
    (mixed / ".hidden.jsonl").write_text("not json at all\n")
    _same(read_input(str(mixed)), ref)


def test_rows_of_csv_files_are_appended(tmp_path: Path) -> None:
    from calmon.offline.inputs import InputError, read_inputs  # here: the file collects before #32
    a, b = tmp_path / "a.csv", tmp_path / "b.csv"
    a.write_text("score,label\n0.2,0\n0.9,1\n")
    b.write_text("score,label\n0.4,1\n")
    ds = read_inputs([str(a), str(b)])
    assert ds.z.tolist() == [0.2, 0.9, 0.4] and ds.y.tolist() == [0, 1, 1] and ds.joined == 0
    c = tmp_path / "c.csv"
    c.write_text("p0,p1,p2,label\n0.2,0.3,0.5,2\n")
    with pytest.raises(InputError, match="inputs of different kinds"):
        read_inputs([str(a), str(c)])


def test_errors_name_the_input(tmp_path: Path) -> None:
    from calmon.offline.inputs import InputError, expand_inputs, read_input  # here: the file collects before #32
    with pytest.raises(InputError, match="no file matches this pattern"):
        expand_inputs([str(tmp_path / "nothing-*.jsonl")])
    with pytest.raises(InputError, match="no such file"):
        expand_inputs([str(tmp_path / "missing.jsonl")])
    (tmp_path / "empty").mkdir()
    with pytest.raises(InputError, match="directory without supported files"):
        expand_inputs([str(tmp_path / "empty")])
    fake = tmp_path / "fake.parquet"
    fake.write_text('{"score": 0.5, "label": 1}\n')
    with pytest.raises(InputError, match="not a Parquet or Arrow file"):
        read_input(str(fake))


@pytest.mark.parametrize("command", ["check", "fit", "report"])
def test_commands_take_several_inputs(tmp_path: Path, command: str, capsys: pytest.CaptureFixture[str]) -> None:
    pp, op, _ = _events(tmp_path)
    out = tmp_path / "out"
    args = {"check": ["check", str(pp), str(op), "--tests", "none", "--json"],
            "fit": ["fit", str(pp), str(op), "--method", "platt", "-o", str(out)],
            "report": ["report", str(pp), str(op), "--tests", "none", "-o", str(out) + ".html"]}[command]
    assert cli_main(args) == 0
    if command == "check":
        doc = json.loads(capsys.readouterr().out)
        assert doc["n"] == 2700 and doc["join"] == {"joined": 2700, "unjoined_predictions": 300, "orphan_outcomes": 1}
    if command == "fit":
        cal = tmp_path / "out"
        assert json.loads(cal.read_text())["training"]["n"] == 2700
        applied = tmp_path / "applied.csv"
        assert cli_main(["apply", str(cal), str(pp), str(op), "-o", str(applied)]) == 0
        assert len(applied.read_text().splitlines()) == 1 + 2700
