"""``calmon fit`` and ``calmon apply`` end to end on CSV, NPZ and JSONL files."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any, cast

import numpy as np
import pytest
from scipy import special

from calmon.calibration import load
from calmon.commands import apply as apply_cmd
from calmon.commands import fit as fit_cmd
from calmon.offline.inputs import read_input


def run(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="calmon")
    sub = parser.add_subparsers(dest="command")
    fit_cmd.register(sub)
    apply_cmd.register(sub)
    args = parser.parse_args(argv)
    return args.func(args)


@pytest.fixture()
def binary_csv(tmp_path: Path) -> Path:
    rng = np.random.default_rng(0)
    z = rng.uniform(0.02, 0.98, 4000)
    y = (rng.uniform(size=z.size) < z**2).astype(int)
    path = tmp_path / "in.csv"
    lines = ["id,score,label"] + [f"e{i},{float(z[i])!r},{y[i]}" for i in range(z.size)]
    path.write_text("\n".join(lines) + "\n")
    return path


def test_fit_then_apply_csv(tmp_path: Path, binary_csv: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out_cal = tmp_path / "cal.json"
    assert run(["fit", str(binary_csv), "--method", "platt", "--holdout", "0.3", "-o", str(out_cal)]) == 0
    assert "held-out ECE" in capsys.readouterr().out
    doc = json.loads(out_cal.read_text())
    assert doc["method"] == "platt" and doc["evaluation"]["holdout_n"] > 900
    assert doc["evaluation"]["after"]["nll"] < doc["evaluation"]["before"]["nll"]
    out = tmp_path / "out.csv"
    assert run(["apply", str(out_cal), str(binary_csv), "-o", str(out)]) == 0
    ds_in, ds_out = read_input(str(binary_csv)), read_input(str(out))
    np.testing.assert_allclose(ds_out.z, load(out_cal).predict(ds_in.z), rtol=1e-15)
    np.testing.assert_array_equal(ds_out.y, ds_in.y)
    assert ds_out.ids is not None
    assert list(ds_out.ids[:2]) == ["e0", "e1"]
    # JSONL output is readable as labeled events
    outj = tmp_path / "out.jsonl"
    assert run(["apply", str(out_cal), str(binary_csv), "-o", str(outj)]) == 0
    first = json.loads(outj.read_text().splitlines()[0])
    assert first["type"] == "labeled" and first["id"] == "e0" and first["score"] == pytest.approx(ds_out.z[0])


@pytest.mark.parametrize("method", ["isotonic", "histogram", "angular"])
def test_fit_methods_to_stdout(binary_csv: Path, method: str, capsys: pytest.CaptureFixture[str]) -> None:
    extra = ["--link-scale", "2", "--link-intercept", "0.5", "--option", "nodes=20"] if method == "angular" else []
    assert run(["fit", str(binary_csv), "-m", method, *extra]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["method"] == method and doc["evaluation"]["in_sample"] is True


def test_top_label_npz_and_multiclass(tmp_path: Path) -> None:
    rng = np.random.default_rng(1)
    logits = 2 * rng.normal(size=(3000, 4))
    labels = np.array([rng.choice(4, p=p) for p in special.softmax(logits, axis=1)])
    probs = special.softmax(2.5 * logits, axis=1)
    mc = tmp_path / "mc.npz"
    np.savez(mc, probs=probs, labels=labels)
    cal = tmp_path / "t.json"
    assert run(["fit", str(mc), "--method", "temperature", "-o", str(cal)]) == 0
    assert cast(Any, load(cal)).temperature == pytest.approx(2.5, rel=0.15)
    out = tmp_path / "mc_out.npz"
    assert run(["apply", str(cal), str(mc), "-o", str(out)]) == 0
    with np.load(out, allow_pickle=False) as f:
        np.testing.assert_allclose(f["probs"], load(cal).predict(probs))
        np.testing.assert_array_equal(f["labels"], labels)
    # a binary method on multiclass data calibrates the top-label confidence
    top = tmp_path / "top.npz"
    np.savez(top, confidence=probs.max(1), correct=(probs.argmax(1) == labels).astype(np.int8))
    pc = tmp_path / "p.json"
    assert run(["fit", str(top), "--method", "platt", "--link", "probit", "-o", str(pc)]) == 0
    outc = tmp_path / "top_out.csv"
    assert run(["apply", str(pc), str(top), "-o", str(outc)]) == 0
    assert outc.read_text().splitlines()[0] == "confidence,correct,raw_confidence"
    assert read_input(str(outc)).kind == "top-label"


def test_usage_errors(tmp_path: Path, binary_csv: Path) -> None:
    with pytest.raises(ValueError, match="unknown calibration method"):
        run(["fit", str(binary_csv), "--method", "nope"])
    with pytest.raises(ValueError, match="needs multiclass"):
        run(["fit", str(binary_csv), "--method", "lp"])
    with pytest.raises(ValueError, match="bad option"):
        run(["fit", str(binary_csv), "--method", "isotonic", "--link", "probit"])
    with pytest.raises(ValueError, match="declared data link"):
        run(["fit", str(binary_csv), "--method", "angular"])
    with pytest.raises(ValueError, match="KEY=VALUE"):
        run(["fit", str(binary_csv), "--method", "platt", "--option", "oops"])
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"format": "calmon.calibrator", "version": 1, "method": "pickle", "params": {}}))
    with pytest.raises(ValueError, match="unknown calibration method 'pickle'"):
        run(["apply", str(bad), str(binary_csv)])
