"""The agent's label-free estimates, score drift and change detection, end to end on a file."""

from __future__ import annotations

import json

from calmon.exporter.status.page import render, render_model
from connectors.simulation import SimulationSpec, Simulator


def run_agent(tmp_path, lines, **overrides):
    from calmon.agent.runtime import Agent
    from calmon.config import build_config
    src = tmp_path / "in.jsonl"
    src.write_bytes(b"\n".join(lines) + b"\n")
    doc = {"state_dir": str(tmp_path / "state"), "sources": [{"path": str(src)}], "exporter": {"port": 0},
           "evaluation": {"tests": [], "min_events": 100}, "ingest": {"exit_when_done": True},
           "windows": {"names": ["1h", "all"]}, "limits": {"future_skew": "3650d"}}
    doc.update(overrides)
    agent = Agent(build_config(doc, env={}))
    agent.open()
    url = agent.http.url
    agent.run()
    return agent, url


def test_estimates_and_score_drift_in_status_and_metrics(tmp_path):
    lines = list(Simulator(SimulationSpec(model="m", seed=4, delay=30.0, rate=4.0)).stream(20_000))
    agent, _ = run_agent(tmp_path, lines)
    st = agent.status()
    ev = {e["window"]: e for e in st["evaluations"] if e["segment"] == "all"}
    preds = sum(1 for ln in lines if json.loads(ln).get("type", "prediction") != "outcome")
    assert ev["all"]["predictions"] == preds
    est = ev["all"]["estimated"]
    assert est["accuracy"]["lo"] <= ev["all"]["metrics"]["accuracy"] <= est["accuracy"]["hi"]
    assert abs(ev["all"]["estimation_error"]["accuracy"]) < 0.02  # calibrated simulation
    assert "score_drift" in ev["1h"] and ev["1h"]["score_drift"]["n_current"] == ev["1h"]["predictions"]
    text = agent.metrics.render(["estimates"]).decode()  # /metrics?collect[]=estimates
    assert 'calmon_estimated_accuracy{model="m",segment="all",window="all"}' in text
    assert 'calmon_estimated_accuracy_lower{model="m",segment="all",window="all"}' in text
    assert "calmon_score_drift_p_value{" in text and "calmon_window_predictions{" in text
    page = render_model(st, "m") or ""  # the model's status page shows estimated beside realised
    assert 'data-metric="accuracy"' in page and "outcomes in for" in page and "before the labels" in page


def test_change_detection_fires_alert_and_exports(tmp_path):
    spec = SimulationSpec(model="m", seed=5, delay=0.0, rate=50.0, drift="temperature:0.5", drift_at=60_000)
    lines = list(Simulator(spec).stream(90_000))
    rules = [{"name": "CalibrationChanged", "kind": "change_detected", "within": "1h", "severity": "warning"}]
    agent, _ = run_agent(tmp_path, lines, alerts={"rules": rules})
    st = agent.metrics_state()
    sig = st["changes"]["m"]["signals"]
    detected = {s: v for s, v in sig.items() if v["detections"]}
    assert detected, sig
    t_drift = spec.start + 60_000 / spec.rate
    for v in detected.values():
        assert t_drift - 600 <= v["last"]["change_point"] <= t_drift + 600  # located near the drift (+-30k events)
    assert any(a["alert"] == "CalibrationChanged" and a["state"] == "firing" and a["window"] == "stream"
               for a in st["alerts"])
    text = agent.metrics.render().decode()
    assert 'calmon_change_detected_total{model="m",signal=' in text
    assert "calmon_change_point_timestamp_seconds{" in text
    page = render(agent.status())
    assert "Calibration changes" in page and f'data-signal="{next(iter(detected))}"' in page


def test_calibrated_stream_detects_nothing_and_restart_replays_identically(tmp_path):
    lines = list(Simulator(SimulationSpec(model="m", seed=6, delay=20.0, rate=50.0)).stream(60_000))
    agent, _ = run_agent(tmp_path, lines)
    first = agent.state.changes.to_dict()
    assert all(v["detections"] == 0 for v in agent.metrics_state()["changes"]["m"]["signals"].values())
    # the same records at another batch size give the same detector state (record order, fixed point)
    (tmp_path / "b").mkdir()
    agent2, _ = run_agent(tmp_path / "b", lines, ingest={"exit_when_done": True, "batch_size": 777})
    assert json.dumps(agent2.state.changes.to_dict(), sort_keys=True) == json.dumps(first, sort_keys=True)


def test_report_time_view_and_estimates(tmp_path):
    """`calmon report` on a file with a drift: the time view locates the change; estimated beside realised."""
    from calmon.cli import main
    spec = SimulationSpec(model="m", seed=7, delay=0.0, rate=50.0, drift="temperature:0.5", drift_at=40_000)
    src = tmp_path / "in.jsonl"
    src.write_bytes(b"\n".join(Simulator(spec).stream(60_000)) + b"\n")
    out = tmp_path / "r.html"
    assert main(["report", str(src), "-o", str(out), "--tests", "none"]) == 0
    page = out.read_text()
    data = json.loads(page.split("id='report-data'>", 1)[1].split("</script>", 1)[0])
    tv = data["time_view"]
    assert tv["by_time"] and tv["changes"]
    t_drift = spec.start + 40_000 / spec.rate
    assert min(abs(c["change_point"] - t_drift) for c in tv["changes"]) < 600
    assert "id='estimates'" in page and "id='time-view'" in page
