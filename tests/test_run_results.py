"""``calmon run --exit-when-done`` prints the verdict table and ``--results`` keeps the status document (#32.5)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from connectors.simulation import SimulationSpec, Simulator


def test_exit_when_done_prints_the_table_and_writes_results(tmp_path: Path) -> None:
    sim = Simulator(SimulationSpec(model="churn", seed=3, rate=50.0, miscalibration="temperature:0.6"))
    events = tmp_path / "events.jsonl"
    events.write_bytes(b"\n".join(sim.batch(4000)) + b"\n")
    cfg = tmp_path / "calmon.yaml"
    cfg.write_text(f"state_dir: {tmp_path / 'state'}\nsources: [{{name: f, path: {events}}}]\n"
                   "exporter: {enabled: false}\nevaluation: {tests: [tcal], min_events: 100}\n")
    results = tmp_path / "out" / "results.json"
    results.parent.mkdir()
    out = subprocess.run([sys.executable, "-m", "calmon", "run", "-c", str(cfg), "--exit-when-done",
                          "--results", str(results)], capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr
    doc = json.loads(results.read_text())
    evals = doc["evaluations"]
    assert evals and {e["model"] for e in evals} == {"churn"}
    lines = out.stdout.strip().splitlines()
    assert lines[0].split() == ["model", "segment", "window", "n", "ECE", "tests", "verdict"]
    assert len(lines) == 1 + len(evals)
    for e, line in zip(evals, lines[1:]):
        cells = line.split()
        assert cells[:4] == [e["model"], e["segment"], e["window"], f"{e['n']:,}"]
        assert f"{100 * e['metrics']['ece']:.2f}%" in line
        assert "miscalibrated (over-confident)" in line  # temperature 0.6: scores too sharp
        assert f"tcal {e['tests']['tcal']['decision']}" in line


def test_results_to_an_unwritable_place_is_one_line(tmp_path: Path) -> None:
    events = tmp_path / "events.jsonl"
    events.write_text('{"type": "labeled", "id": "a", "model": "m", "score": 0.5, "label": 1}\n')
    cfg = tmp_path / "calmon.yaml"
    cfg.write_text(f"state_dir: {tmp_path / 'state'}\nsources: [{{name: f, path: {events}}}]\n"
                   "exporter: {enabled: false}\nevaluation: {tests: []}\n")
    (tmp_path / "a-file").write_text("not a directory")
    out = subprocess.run([sys.executable, "-m", "calmon", "run", "-c", str(cfg), "--exit-when-done",
                          "--results", str(tmp_path / "a-file" / "r.json")],
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 2
    assert out.stderr.strip().splitlines()[-1].startswith("calmon run: cannot write --results")
