"""The schema probe never stops the agent (issue #31, finding 2): data that has not shown a mapped field yet is a
warning with counts, logged once; records that do not fit are rejected one by one, counted and dead-lettered.

Each test runs ``calmon run`` on a real file source as a user runs it, in small batches (``ingest.batch_size``) so
that the probe decides after its ``probe_records`` (1000) records, as it does on a followed file.
"""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable
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


# -- restarts: the probe must never turn data into a crash loop ---------------------------------------------------
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _status(port: int) -> dict[str, Any] | None:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/status", timeout=5) as resp:
            return dict(json.loads(resp.read()))
    except (OSError, ValueError):
        return None


def _follow_until(tmp_path: Path, events: Path, done: Callable[[dict[str, Any]], bool]) -> tuple[str, dict[str, Any]]:
    """``calmon run`` following ``events`` (``follow: true``, no exit when done): wait, polling /api/status, until
    ``done(agent document)`` holds while the agent still runs; then stop it (SIGTERM) and return its log and that
    document."""
    port = _free_port()
    cfg = tmp_path / "follow.yaml"
    cfg.write_text(json.dumps({
        "sources": [{"name": "f", "type": "file", "path": str(events), "schema": SCHEMA, "follow": True}],
        "exporter": {"port": port}, "ingest": {"batch_size": 500}, "evaluation": {"every": "1s", "tests": []},
        "state_dir": str(tmp_path / "state")}))
    proc = subprocess.Popen([sys.executable, "-m", "calmon", "run", "--config", str(cfg)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        deadline, agent = time.monotonic() + 180.0, {}
        while time.monotonic() < deadline and proc.poll() is None:
            agent = (_status(port) or {}).get("agent", {})
            if agent and done(agent):
                break
            time.sleep(0.2)
        assert proc.poll() is None, f"the agent exited ({proc.returncode}): {proc.stderr.read() if proc.stderr else ''}"
        assert done(agent), agent
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    return err, agent


def _counts(agent: dict[str, Any]) -> dict[str, int]:
    return {e["type"]: e["count"] for e in agent.get("events", [])}


def test_a_followed_source_of_predictions_without_labels_stays_up_across_restarts(tmp_path: Path) -> None:
    """Finding 2 as reported: a followed source mapping ``label: y`` that has carried only predictions (1,200, then
    more) keeps running, and so does every restart; when the outcomes come, every one joins."""
    events = tmp_path / "events.jsonl"
    _write(events, [{"rid": f"r{i}", "model_name": "churn", "p": 0.5} for i in range(1200)])
    err, _ = _follow_until(tmp_path, events, lambda a: _counts(a) == {"prediction": 1200})  # before #31.2: exit 2
    assert len(_warnings(err)) == 1, err
    _write(events, [{"rid": f"r{i}", "model_name": "churn", "p": 0.5} for i in range(1200, 1500)], "a")
    # a restart: before, exit 2 again (and at every restart) until a labeled record arrived
    _follow_until(tmp_path, events, lambda a: _counts(a) == {"prediction": 1500})
    _write(events, [{"rid": f"r{i}", "y": i % 2} for i in range(1500)], "a")
    _, agent = _follow_until(tmp_path, events, lambda a: a["join"]["joined"] == {"churn": 1500})
    assert agent["rejected"] == {}
    assert _counts(agent) == {"prediction": 1500, "outcome": 1500}


def test_foreign_records_at_the_head_never_crash_loop_the_agent(tmp_path: Path) -> None:
    """1,200 foreign records at the head of a followed mapped source, then valid ones: the agent and two restarts
    (each after more valid records were appended) stay up, read every record once and reject only the foreign
    ones."""
    events = tmp_path / "events.jsonl"
    _write(events, [{"foreign": i, "what": "another system"} for i in range(1200)])
    _write(events, [{"rid": f"r{i}", "model_name": "churn", "p": 0.25, "y": i % 2} for i in range(300)], "a")
    for restart, total in enumerate((300, 400, 500)):
        if restart:
            _write(events, [{"rid": f"s{restart}-{i}", "model_name": "churn", "p": 0.25, "y": i % 2}
                            for i in range(100)], "a")
        # before #31.2: exit 2 at the first run, and so at every restart (no checkpoint moved past the head)
        _, agent = _follow_until(tmp_path, events, lambda a, n=total: _counts(a) == {"labeled": n})
        assert agent["rejected"] == {"missing_field": 1200}, restart
