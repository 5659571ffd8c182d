"""The schema probe never stops the agent (issue #31, finding 2): data that has not shown a mapped field yet is a
warning with counts, logged once; records that do not fit are rejected one by one, counted and dead-lettered.

Each test runs ``calmon run`` on a real file source as a user runs it, in small batches (``ingest.batch_size``) so
that the probe decides after its ``probe_records`` (1000) records, as it does on a followed file.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

SCHEMA = {"fields": {"id": "rid", "model": "model_name", "score": "p", "label": "y"}}


def _write(path: Path, records: list[dict[str, Any]], mode: str = "w") -> None:
    with path.open(mode) as f:
        f.writelines(json.dumps(r) + "\n" for r in records)


def _run(tmp_path: Path, events: Path) -> tuple[subprocess.CompletedProcess[str], dict[str, Any]]:
    cfg = tmp_path / "calmon.yaml"
    cfg.write_text(json.dumps({
        "sources": [{"name": "f", "type": "file", "path": str(events), "schema": SCHEMA}],
        "exporter": {"enabled": False}, "ingest": {"exit_when_done": True, "batch_size": 500},
        "state_dir": str(tmp_path / "state")}))
    results = tmp_path / "results.json"
    proc = subprocess.run([sys.executable, "-m", "calmon", "run", "--config", str(cfg), "--results", str(results)],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    return proc, json.loads(results.read_text())["agent"]


def _warnings(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if " WARNING calmon.events: " in line]


def test_predictions_without_the_mapped_label_warn_once_and_the_agent_goes_on(tmp_path: Path) -> None:
    events = tmp_path / "events.jsonl"
    _write(events, [{"rid": f"r{i}", "model_name": "churn", "p": 0.5} for i in range(1200)])  # no label yet: normal
    _write(events, [{"rid": f"r{i}", "y": i % 2} for i in range(1200)], "a")  # the outcomes arrive later
    proc, agent = _run(tmp_path, events)  # before: exit 2 after 1000 predictions, and at every restart
    warned = _warnings(proc.stderr)
    assert len(warned) == 1, proc.stderr  # once, not per batch
    assert "sources.0.schema.fields.label: path 'y' is absent from all 1000 records read" in warned[0]
    assert "a warning, not an error, normal while only predictions arrive" in warned[0]
    assert "sources.0.schema.fields.label: path 'y' matched from record 1500 on" in proc.stderr
    assert agent["rejected"] == {}
    assert {e["type"]: e["count"] for e in agent["events"]} == {"prediction": 1200, "outcome": 1200}
    assert sum(agent["join"]["joined"].values()) == 1200


def test_foreign_records_at_the_head_are_rejected_one_by_one_and_the_rest_is_read(tmp_path: Path) -> None:
    events = tmp_path / "events.jsonl"
    _write(events, [{"foreign": i, "what": "another system"} for i in range(1200)])
    _write(events, [{"rid": f"r{i}", "model_name": "churn", "p": 0.25, "y": i % 2} for i in range(300)], "a")
    proc, agent = _run(tmp_path, events)  # before: exit 2 at this run and at every restart
    assert agent["rejected"] == {"missing_field": 1200}
    assert agent["events"] == [{"model": "churn", "type": "labeled", "count": 300}]
    dead = [json.loads(line) for line in (tmp_path / "state" / "deadletter.jsonl").read_text().splitlines()]
    assert len(dead) == 1200 and {d["reason"] for d in dead} == {"missing_field"}
    assert dead[0]["origin"] == f"{events}:1"
    warned = _warnings(proc.stderr)
    assert len(warned) == 4, proc.stderr  # each mapped path once, with its counts and the keys the records have
    assert all("[1000 records read, 1000 rejected]" in w and "(their keys: foreign, what" in w for w in warned)
