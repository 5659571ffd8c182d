"""The first hour, scripted (issue #32): a team's two files of their own shape to the agent's verdict table.

Predictions ``{"request_id", "ts_ms", "model_name", "p_churn"}`` and outcomes ``{"request_id", "ts_ms", "churned":
true}`` arriving 0.1-20 h later, as a user meets calmon, each step through the installed command line:

1. ``calmon schema suggest preds.jsonl outcomes.jsonl -o schema.yaml`` proposes the mapping;
2. ``calmon check preds.jsonl outcomes.jsonl --schema schema.yaml --json`` joins every outcome: the verdict;
3. ``calmon run --exit-when-done`` with the schema on both files and the default ``join.ttl`` (1 h) loses the late
   labels -- and says so, naming ``join.ttl`` and the value that keeps them;
4. the agent again with that value: its verdict table and ``--results`` document give ``check``'s numbers.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from calmon.config.schema import parse_duration

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from test_schema_suggest import _churn_files  # noqa: E402


def calmon(*argv: str, cwd: Path, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    return subprocess.run([sys.executable, "-m", "calmon", *argv], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=timeout)


def agent_config(work: Path, name: str, ttl: str | None) -> Path:
    cfg = {"state_dir": str(work / name), "exporter": {"port": 0},
           "sources": [{"name": "predictions", "path": "preds.jsonl", "schema": "schema.yaml"},
                       {"name": "outcomes", "path": "outcomes.jsonl", "schema": "schema.yaml"}],
           "windows": {"names": ["all"]}, "evaluation": {"tests": [{"name": "tcal"}]}}
    if ttl is not None:
        cfg["join"] = {"ttl": ttl}
    path = work / f"{name}.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def window_all(doc: dict) -> dict:
    rows = [e for e in doc["evaluations"] if e["model"] == "churn" and e["segment"] == "all" and e["window"] == "all"]
    assert len(rows) == 1, [(e["model"], e["segment"], e["window"]) for e in doc["evaluations"]]
    return rows[0]


@pytest.mark.slow
def test_two_foreign_files_to_the_agents_verdict_in_four_commands(tmp_path):
    preds, outs = _churn_files(tmp_path, 3000)

    step = calmon("schema", "suggest", preds.name, outs.name, "-o", "schema.yaml", cwd=tmp_path)
    assert step.returncode == 0, step.stderr
    assert yaml.safe_load((tmp_path / "schema.yaml").read_text())["fields"]["label"] == "churned"

    step = calmon("check", preds.name, outs.name, "--schema", "schema.yaml", "--tests", "tcal", "--json", cwd=tmp_path)
    assert step.returncode == 0, step.stderr
    check = json.loads(step.stdout)
    assert check["n"] == 3000 and check["join"]["joined"] == 3000

    # The agent with the default join.ttl: late labels lost, and the agent says which setting keeps them.
    step = calmon("run", "-c", str(agent_config(tmp_path, "default", None)), "--exit-when-done",
                  "--results", "default.json", cwd=tmp_path)
    assert step.returncode == 0, step.stderr
    doc = json.loads((tmp_path / "default.json").read_text())
    assert window_all(doc)["n"] < 3000
    warning = next(w for w in doc["warnings"] if w["code"] == "join_expired")
    assert warning["setting"] == "join.ttl" and "join.ttl" in step.stderr
    suggested = warning["suggested"]
    assert parse_duration(suggested) >= 19.5 * 3600, suggested  # the delays reach 20 h

    # Again with the suggested value: every label joined, the verdict table printed, check's numbers.
    step = calmon("run", "-c", str(agent_config(tmp_path, "tuned", suggested)), "--exit-when-done",
                  "--results", "tuned.json", cwd=tmp_path)
    assert step.returncode == 0, step.stderr
    doc = json.loads((tmp_path / "tuned.json").read_text())
    row = window_all(doc)
    assert row["n"] == check["n"] == 3000
    assert row["metrics"]["ece"] == pytest.approx(check["metrics"]["ece"], rel=1e-9, abs=1e-12)
    assert not [w for w in doc.get("warnings", []) if w["code"] == "join_expired"]
    table = step.stdout
    assert "churn" in table and "3000" in table.replace(",", "")
