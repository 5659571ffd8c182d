"""The command line as a user runs it: subprocesses, exit codes, one-line errors."""

import json
import subprocess
import sys

import numpy as np
import pytest

from tests.conftest import TCAL_DATA


def calmon(*args, stdin=None):
    return subprocess.run([sys.executable, "-m", "calmon", *args], input=stdin, capture_output=True, timeout=120)


def test_check_npz_reports_table_ece(tcal_files):
    r = calmon("check", str(TCAL_DATA / "cifar10_resnet50.npz"), "--json", "--tests", "none")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["n"] == 10000 and doc["classes"] == 2 and doc["kind"] == "top-label"
    assert round(100 * doc["metrics"]["ece"], 2) == 2.23
    assert len(doc["reliability"]) == 15
    text = calmon("check", str(TCAL_DATA / "cifar10_resnet50.npz"), "--tests", "none").stdout.decode()
    assert "ECE (15 bins, l1)   2.23 %" in text


def test_simulate_pipe_check_joins_delayed_outcomes():
    sim = calmon("simulate", "-n", "5000", "--delay", "20", "--miscalibration", "temperature:0.5", "--seed", "3")
    assert sim.returncode == 0
    lines = sim.stdout.splitlines()
    kinds = [json.loads(x)["type"] for x in lines]
    assert kinds.count("prediction") == 5000 and kinds.count("outcome") == 5000
    r = calmon("check", "-", "--json", "--tests", "none", stdin=sim.stdout)
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["n"] == 5000 and doc["join"] == {"joined": 5000, "unjoined_predictions": 0, "orphan_outcomes": 0}
    assert doc["metrics"]["ece"] > 0.05  # temperature 0.5 is overconfident


def test_calibrated_simulation_has_small_ece():
    sim = calmon("simulate", "-n", "50000", "--seed", "4")
    doc = json.loads(calmon("check", "-", "--json", "--tests", "none", stdin=sim.stdout).stdout)
    assert doc["metrics"]["ece"] < 0.02 and abs(doc["metrics"]["ece_l2_debiased"]) < 1e-3


def test_multiclass_jsonl_csv_and_npz_agree(tmp_path):
    sim = calmon("simulate", "-n", "3000", "--classes", "3", "--seed", "5")
    jl = tmp_path / "e.jsonl"
    jl.write_bytes(sim.stdout)
    events = [json.loads(x) for x in sim.stdout.splitlines()]
    probs = np.array([e["probs"] for e in events])
    labels = np.array([e["label"] for e in events])
    np.savez(tmp_path / "e.npz", probs=probs, labels=labels)
    with open(tmp_path / "e.csv", "w") as f:
        f.write("id,p0,p1,p2,label\n")
        for e in events:
            f.write(f"{e['id']},{','.join(repr(p) for p in e['probs'])},{e['label']}\n")
    names = ("e.jsonl", "e.csv", "e.npz")
    docs = [json.loads(calmon("check", str(tmp_path / name), "--json", "--tests", "none").stdout) for name in names]
    for d in docs[1:]:
        assert d["metrics"] == pytest.approx(docs[0]["metrics"])
    assert docs[0]["classes"] == 3 and "classwise_ece" in docs[0]["metrics"]


def test_binary_csv(tmp_path):
    p = tmp_path / "b.csv"
    p.write_text("score,label\n0.9,1\n0.2,0\n0.6,1\n")
    doc = json.loads(calmon("check", str(p), "--json", "--tests", "none").stdout)
    assert doc["n"] == 3 and doc["metrics"]["accuracy"] == 1.0


@pytest.mark.parametrize("name,content,needle", [
    ("bin.jsonl", bytes(range(256)) * 4, "not_json"),
    ("trunc.jsonl", b'{"model":"m","score":0.5,"label":1}\n{"model":"m","sco', "line 2"),
    ("nan.jsonl", b'{"model":"m","score":NaN,"label":1}\n', "non_finite"),
    ("k.jsonl", b'{"model":"m","probs":[0.2,0.8],"label":1}\n{"model":"m","probs":[0.2,0.3,0.5],"label":1}\n',
     "k_mismatch"),
    ("empty.jsonl", b"", "empty"),
    ("bad.csv", b"score,label\n0.5,1\nabc,0\n", "line 3"),
    ("range.csv", b"score,label\n1.5,1\n", "line 2"),
    ("bad.npz", b"PK\x03\x04garbage", "NPZ"),
    ("blob.bin", bytes(range(256)) * 4, "binary"),
], ids=lambda v: v if isinstance(v, str) and len(v) < 20 else "")
def test_garbage_gives_exit_2_and_one_line(tmp_path, name, content, needle):
    p = tmp_path / name
    p.write_bytes(content)
    r = calmon("check", str(p))
    err = r.stderr.decode()
    assert r.returncode == 2
    assert err.count("\n") == 1 and "Traceback" not in err
    assert needle in err and name in err


def test_skip_invalid_counts_reasons(tmp_path):
    p = tmp_path / "mixed.jsonl"
    p.write_bytes(b'{"model":"m","score":0.5,"label":1}\nnope\n{"model":"m","score":2,"label":1}\n')
    doc = json.loads(calmon("check", str(p), "--json", "--skip-invalid", "--tests", "none").stdout)
    assert doc["n"] == 1 and doc["skipped"] == {"not_json": 1, "out_of_range": 1}


def test_bad_usage_exit_2():
    assert calmon("check").returncode == 2
    assert calmon("simulate", "--miscalibration", "wobble").returncode == 2


def test_check_runs_tcal_and_smce_by_default_and_prints_the_verdict_first(tmp_path):
    sim = calmon("simulate", "-n", "4000", "--miscalibration", "temperature:0.6", "--seed", "8")
    r = calmon("check", "-", "--json", "--mc", "199", stdin=sim.stdout)
    assert r.returncode == 0, r.stderr
    assert r.stderr == b""  # no progress bar without a terminal
    doc = json.loads(r.stdout)
    assert set(doc["tests"]) == {"tcal", "smce"}
    s = doc["summary"]
    assert s["calibrated"] is False and s["direction"] == "over-confident"
    assert s["ece_ci"][0] <= s["ece"] <= s["ece_ci"][1] and s["regions"] and s["recommendation"]
    text = calmon("check", "-", "--mc", "199", stdin=sim.stdout).stdout.decode().splitlines()
    assert text[1].startswith("  verdict: Miscalibrated") and "over-confident" in text[1]
    bare = json.loads(calmon("check", "-", "--json", "--tests", "none", stdin=sim.stdout).stdout)
    assert "tests" not in bare and bare["summary"]["calibrated"] is None
    assert set(bare) - {"summary"} == set(doc) - {"summary", "tests"}  # every other key unchanged


def test_check_reference_detects_a_calibration_change(tmp_path):
    for name, mis, seed in (("ref", "none", "1"), ("same", "none", "2"), ("drift", "temperature:0.6", "3")):
        sim = calmon("simulate", "-n", "5000", "--miscalibration", mis, "--seed", seed)
        (tmp_path / f"{name}.jsonl").write_bytes(sim.stdout)
    ref = str(tmp_path / "ref.jsonl")
    docs = {name: json.loads(calmon("check", str(tmp_path / f"{name}.jsonl"), "--json", "--tests", "none",
                                    "--reference", ref, "--permutations", "199").stdout)
            for name in ("same", "drift")}
    assert docs["drift"]["reference"]["decision"] == "changed" and docs["drift"]["reference"]["p_value"] < 0.01
    assert docs["same"]["reference"]["decision"] == "unchanged"
    assert docs["drift"]["reference"]["input"] == ref
    text = calmon("check", str(tmp_path / "drift.jsonl"), "--tests", "none", "--reference", ref).stdout.decode()
    assert "vs reference" in text and "calibration changed" in text
    multi = calmon("simulate", "-n", "500", "--classes", "3", "--seed", "1")
    (tmp_path / "multi.jsonl").write_bytes(multi.stdout)
    r = calmon("check", str(tmp_path / "drift.jsonl"), "--tests", "none", "--reference", str(tmp_path / "multi.jsonl"))
    assert r.returncode == 2 and b"cannot be compared" in r.stderr
