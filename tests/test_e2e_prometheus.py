"""End to end: the agent (``calmon run``) on a live event stream with an injected calibration drift,
a real Prometheus scraping it with the shipped scrape configuration and rules, and a real
Alertmanager with the shipped configuration.

Checks (issue 9, "done when"):
- every query of every dashboard panel returns data through Prometheus' HTTP API;
- the calibration alert (``CalmonCalibrationAlert``) fires within three evaluation periods of the
  drift's start (plus one scrape and one rule evaluation), reaches Alertmanager, and resolves after
  the drift ends.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.parse
from pathlib import Path

import numpy as np
import pytest
import yaml
from _deploy_helpers import (
    ARTIFACTS,
    CONTRACT,
    DEPLOY,
    REPO,
    free_port,
    http,
    start_alertmanager,
    start_prometheus,
    stop,
    wait_ready,
)

pytestmark = pytest.mark.integration

EVERY = 3.0  # agent evaluation period (s)
SCRAPE = 1.0  # Prometheus scrape and rule evaluation interval (s)
WINDOW = "12s"  # the window the alert rule watches
RATE = 400  # events per second
CONSECUTIVE, CLEAR_AFTER = 2, 2
MODEL = "fraud"
#: Queries that cannot have data in this setup, with the reason.
NO_DATA_EXPECTED = {
    "calmon_source_lag_records": "Kafka consumer lag; this test reads a file (lag in bytes instead)",
}


class EventWriter(threading.Thread):
    """Appends JSONL events stamped with the wall clock to a file the agent follows.

    Calibrated phase: y ~ Bernoulli(z). Drift phase: y ~ Bernoulli(1 - z) (the model's scores
    become anti-calibrated). Besides labeled events it writes prediction/outcome pairs (joined),
    predictions without outcome (expire), duplicate ids, orphan outcomes and malformed lines.
    """

    def __init__(self, path: Path, seed: int = 0) -> None:
        super().__init__(daemon=True)
        self.path = path
        self.rng = np.random.default_rng(seed)
        self.drift = False
        self.stopped = threading.Event()
        self.written = 0
        self.seq = 0

    def batch(self, n: int) -> list[str]:
        now = time.time()
        z = self.rng.uniform(0.05, 0.95, n)
        p = 1.0 - z if self.drift else z
        y = (self.rng.random(n) < p).astype(int)
        seg = np.where(self.rng.random(n) < 0.3, "eu", "us")
        lines = []
        for i in range(n):
            self.seq += 1
            ts = round(now - 0.001 * (n - i), 3)
            kind = self.seq % 20
            if kind == 0:  # a joined pair
                eid = f"p{self.seq}"
                lines.append(json.dumps({"type": "prediction", "id": eid, "model": MODEL, "ts": ts,
                                         "score": round(float(z[i]), 6), "segment": str(seg[i])}))
                lines.append(json.dumps({"type": "outcome", "id": eid, "model": MODEL, "ts": ts,
                                         "label": int(y[i])}))
            elif kind == 1:  # a prediction whose outcome never comes (expires after join.ttl)
                lines.append(json.dumps({"type": "prediction", "id": f"lost{self.seq}", "model": MODEL,
                                         "ts": ts, "score": round(float(z[i]), 6)}))
            elif kind == 2 and self.seq % 200 == 2:  # a duplicate id, an orphan outcome, a malformed line
                lines.append(json.dumps({"type": "prediction", "id": "dup", "model": MODEL, "ts": ts,
                                         "score": 0.5}))
                lines.append(json.dumps({"type": "outcome", "id": f"orphan{self.seq}", "model": MODEL,
                                         "ts": ts, "label": 1}))
                lines.append("{not json")
            else:
                lines.append(json.dumps({"model": MODEL, "ts": ts, "score": round(float(z[i]), 6),
                                         "label": int(y[i]), "segment": str(seg[i])}))
        return lines

    def run(self) -> None:
        step = 0.1
        with open(self.path, "a", encoding="utf-8") as f:
            while not self.stopped.is_set():
                t0 = time.monotonic()
                lines = self.batch(int(RATE * step))
                f.write("\n".join(lines) + "\n")
                f.flush()
                self.written += len(lines)
                self.stopped.wait(max(0.0, step - (time.monotonic() - t0)))


def agent_config(tmp: Path, port: int, events: Path) -> Path:
    cfg = {
        "state_dir": str(tmp / "state"),
        "sources": [{"name": "events", "type": "file", "path": str(events), "follow": True}],
        "dead_letter": {"type": "file", "path": str(tmp / "deadletter.jsonl")},
        "models": {"default": {"bins": 1024, "reservoir": 512}},
        "join": {"ttl": "5s"},
        "windows": {"names": [WINDOW, "60s"], "allowed_lateness": "30s",
                    "tiers": [{"width": "1s", "count": 90}]},
        "evaluation": {"every": f"{EVERY}s", "budget": f"{EVERY}s", "alpha": 0.01, "mc": 200, "seed": 1,
                       "min_events": 200, "reliability_bins": 20,
                       # cheap LDTC resolution: the round stays well inside the period on a loaded machine
                       "tests": [{"name": "tcal"}, {"name": "smce"},
                                 {"name": "ldtc", "params": {"bins": 64, "max_bins": 64, "grid_points": 41,
                                                             "max_grid": 41}}]},
        "exporter": {"address": "127.0.0.1", "port": port},
        "checkpoint": {"every": "2s"},
        "ingest": {"poll_timeout": "100ms"},
        "alerts": {"enabled": True, "rules": [
            {"name": "CalibrationDrift", "kind": "test_rejected", "test": "tcal", "consecutive": CONSECUTIVE,
             "clear_after": CLEAR_AFTER, "min_events": 500, "windows": [WINDOW], "segments": ["all"],
             "severity": "critical"}]},
        "recalibration": {"enabled": True, "every": f"{EVERY}s", "window": "60s", "methods": ["platt"],
                          "options": {"min_train": 200, "min_holdout": 50}},
    }
    path = tmp / "calmon.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def prometheus_config(agent_port: int, am_port: int) -> str:
    """The shipped prometheus.yml with test intervals, loopback targets and the shipped rules."""
    cfg = yaml.safe_load((DEPLOY / "prometheus" / "prometheus.yml").read_text())
    cfg["global"]["scrape_interval"] = f"{SCRAPE:g}s"
    cfg["global"]["evaluation_interval"] = f"{SCRAPE:g}s"
    cfg["rule_files"] = [str(DEPLOY / "prometheus" / "rules" / "calmon-alerts.yml")]
    cfg["alerting"]["alertmanagers"][0]["static_configs"][0]["targets"] = [f"127.0.0.1:{am_port}"]
    jobs = [j for j in cfg["scrape_configs"] if j["job_name"] in ("calmon", "calmon-detail")]
    assert len(jobs) == 2, "the shipped configuration scrapes /metrics and its detail (collect[])"
    for job in jobs:
        job["scrape_interval"] = f"{SCRAPE:g}s"
        job["scrape_timeout"] = f"{SCRAPE:g}s"
        job["static_configs"][0]["targets"] = [f"127.0.0.1:{agent_port}"]
    cfg["scrape_configs"] = jobs
    return yaml.safe_dump(cfg)


def agent_command(cfg: Path) -> list[str]:
    """``calmon run -c CFG`` (through ``python -m calmon``; the run module's own entry point as fallback)."""
    probe = subprocess.run([sys.executable, "-m", "calmon", "run", "--help"], capture_output=True, timeout=60,
                           cwd=REPO)
    if probe.returncode == 0:
        return [sys.executable, "-m", "calmon", "run", "-c", str(cfg)]
    return [sys.executable, "-m", "calmon.commands.run", "-c", str(cfg)]


def prom_query(url: str, expr: str) -> list[dict]:
    status, body = http("GET", f"{url}/api/v1/query?{urllib.parse.urlencode({'query': expr})}")
    assert status == 200 and body["status"] == "success", (expr, body)
    return body["data"]["result"]


def calibration_alerts(url: str) -> list[dict]:
    status, body = http("GET", f"{url}/api/v1/alerts")
    assert status == 200, body
    return [a for a in body["data"]["alerts"] if a["labels"].get("alertname") == "CalmonCalibrationAlert"
            and a["labels"].get("model") == MODEL and a["labels"].get("window") == WINDOW
            and a["labels"].get("segment") == "all"]


def agent_status(port: int) -> dict:
    status, body = http("GET", f"http://127.0.0.1:{port}/api/status")
    assert status == 200, body
    return body


def tcal_result(port: int) -> dict | None:
    for ev in agent_status(port).get("evaluations", []):
        if ev["model"] == MODEL and ev["segment"] == "all" and ev["window"] == WINDOW:
            r = ev.get("tests", {}).get("tcal") or {}
            return {"n": ev["n"], "decision": r.get("decision"), "p": r.get("p_value")}
    return None


def tcal_decision(port: int) -> str | None:
    r = tcal_result(port)
    return None if r is None else r["decision"]


def dashboard_queries() -> list[tuple[str, str]]:
    dash = json.loads((DEPLOY / "grafana" / "dashboards" / "calmon.json").read_text())

    def walk(panels):
        for p in panels:
            yield p
            yield from walk(p.get("panels", []))

    subs = {"$__rate_interval": "15s", "$__interval": "5s", "$__range": "1m", "$model": MODEL,
            "$segment": "all", "$window": WINDOW,
            "$diagram_window": "60s"}  # the longest window: the one exporter.reliability exports by default
    out = []
    for p in walk(dash["panels"]):
        for t in p.get("targets", []):
            expr = t["expr"]
            for k in sorted(subs, key=len, reverse=True):
                expr = expr.replace(k, subs[k])
            out.append((f"{p['title']} [{t['refId']}]", expr))
    return out


class AgentMonitor(threading.Thread):
    """Polls the agent's /api/status: (wall time, completed rounds, state of the CalibrationDrift alert)."""

    def __init__(self, port: int) -> None:
        super().__init__(daemon=True)
        self.port = port
        self.samples: list[dict] = []
        self.stopped = threading.Event()

    def run(self) -> None:
        while not self.stopped.is_set():
            try:
                st = agent_status(self.port)
            except (AssertionError, OSError, ValueError):
                st = None
            if st is not None:
                alert = next((a for a in st.get("alerts", []) if a.get("alert") == "CalibrationDrift"
                              and a.get("model") == MODEL and a.get("segment") == "all"
                              and a.get("window") == WINDOW), None)
                sched = st["agent"]["scheduler"]
                self.samples.append({"t": time.time(), "rounds": sched["evaluations"], "alert": alert,
                                     "round_end": sched.get("last_timestamp"),
                                     "round_duration": sched.get("last_duration")})
            self.stopped.wait(0.2)

    def rounds(self) -> int:
        wait_for(lambda: self.samples, 10, "agent status")
        return self.samples[-1]["rounds"]

    def rounds_started_after(self, t0: float, upto: int) -> int:
        """Rounds up to number ``upto`` whose snapshot was taken after wall time ``t0``."""
        starts = {s["rounds"]: s["round_end"] - s["round_duration"] for s in list(self.samples)
                  if s["round_end"] is not None and s["round_duration"] is not None}
        missing = [r for r in range(min(starts), upto + 1) if r not in starts]
        assert not missing, f"rounds not observed: {missing}"
        return sum(1 for r, start in starts.items() if r <= upto and start >= t0)

    def first_firing(self) -> dict | None:
        return next((s for s in list(self.samples) if s["alert"] and s["alert"]["state"] == "firing"), None)

    def first_state_after(self, state: str, rounds: int) -> dict | None:
        return next((s for s in list(self.samples) if s["rounds"] >= rounds and s["alert"]
                     and s["alert"]["state"] == state), None)


def _parse_ts(s: str) -> float:
    from datetime import datetime

    head, _, frac = s.rstrip("Z").partition(".")
    t = datetime.fromisoformat(head + "+00:00").timestamp()
    return t + (float("0." + frac.split("+")[0]) if frac else 0.0)


def wait_for(cond, timeout: float, what: str, step: float = 0.25):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = cond()
        if value:
            return value
        time.sleep(step)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")


def test_drift_alert_fires_and_resolves_through_prometheus_and_alertmanager(tmp_path):
    events = tmp_path / "events.jsonl"
    events.touch()
    writer = EventWriter(events, seed=9)
    am = prom = agent = None
    agent_log = open(tmp_path / "agent.log", "wb")  # noqa: SIM115
    try:
        am_cfg = (DEPLOY / "alertmanager" / "alertmanager.yml").read_text()
        am, am_url = start_alertmanager(tmp_path / "am", am_cfg)
        port = free_port()
        writer.start()
        env = {**os.environ, "PYTHONPATH": str(REPO)}
        agent = subprocess.Popen(agent_command(agent_config(tmp_path, port, events)), stdout=agent_log,
                                 stderr=subprocess.STDOUT, env=env, cwd=tmp_path)
        agent.log_path = str(tmp_path / "agent.log")  # type: ignore[attr-defined]
        wait_ready(f"http://127.0.0.1:{port}/readyz", agent, timeout=60)
        am_port = int(am_url.rsplit(":", 1)[1])
        prom, prom_url = start_prometheus(tmp_path / "prom", prometheus_config(port, am_port))

        # calibrated phase: the window fills, T-Cal accepts, nothing fires
        wait_for(lambda: tcal_decision(port) == "calibrated", 40,
                 "a calibrated T-Cal decision on a full window")
        wait_for(lambda: prom_query(prom_url, 'calmon_alert_active{alert="CalibrationDrift"}'), 15,
                 "the alert series in Prometheus")
        time.sleep(2 * EVERY)
        assert not calibration_alerts(prom_url), "calibration alert before any drift"

        # drift
        monitor = AgentMonitor(port)
        monitor.start()
        time.sleep(0.5)
        rounds_at_drift = monitor.rounds()
        t_drift = time.time()
        writer.drift = True
        firing = wait_for(lambda: [a for a in calibration_alerts(prom_url) if a["state"] == "firing"],
                          60, "CalmonCalibrationAlert firing")
        latency = time.time() - t_drift
        fired = monitor.first_firing()
        assert fired is not None, "Prometheus fires but the agent's alert state never was 'firing'"
        rounds = monitor.rounds_started_after(t_drift, fired["rounds"])
        assert fired["rounds"] - rounds_at_drift - rounds <= 1  # at most the round running at the drift
        prom_delay = _parse_ts(firing[0]["activeAt"]) - fired["alert"]["started_at"]
        print(f"\ncalibration alert: agent firing at the {rounds}. evaluation round started after the drift "
              f"(period {EVERY:g} s); Prometheus active {prom_delay:.1f} s later (scrape/rule interval "
              f"{SCRAPE:g} s); {latency:.1f} s from drift to firing in Prometheus")
        assert rounds <= 3, f"fired after {rounds} rounds (> 3 evaluation periods)"
        assert rounds >= CONSECUTIVE, "fired before the rule's consecutive rejections"
        assert -0.5 <= prom_delay <= 2 * SCRAPE + 1.5, prom_delay
        labels = firing[0]["labels"]
        assert labels["severity"] == "critical" and labels["alert"] == "CalibrationDrift"

        def in_alertmanager():
            _, alerts = http("GET", f"{am_url}/api/v2/alerts?filter=alertname%3D%22CalmonCalibrationAlert%22")
            return [a for a in alerts
                    if a["labels"].get("model") == MODEL and a["labels"].get("window") == WINDOW]

        (am_alert,) = wait_for(in_alertmanager, 10, "the alert in Alertmanager")
        assert [r["name"] for r in am_alert["receivers"]] == ["ml-calibration"]
        assert am_alert["status"]["state"] == "active"

        # the alert links the agent's status page, and the link works (from the scraped instance label)
        link = am_alert["annotations"]["status_page"]
        assert link == f"http://127.0.0.1:{port}/" and firing[0]["annotations"]["status_page"] == link
        # the status page at "/" shows the firing alert and an overview row per evaluated window; the model's
        # page (linked from its rows) a reliability diagram per window
        status, page = http("GET", link)
        assert status == 200 and page.startswith("<!DOCTYPE html>"), str(page)[:200]
        evaluations = agent_status(port)["evaluations"]
        assert page.count('<tr class="row ') == len(evaluations) >= 2
        assert 'data-alert="CalibrationDrift" data-state="firing"' in page
        assert page.count('<tr class="row miscalibrated"') >= 1 and 'id="freshness"' in page
        model = evaluations[0]["model"]
        status, detail = http("GET", f"{link}model/{urllib.parse.quote(model, safe='')}")
        assert status == 200 and detail.count('class="reliability-svg"') == sum(
            1 for e in evaluations if e["model"] == model)
        ARTIFACTS.mkdir(exist_ok=True)
        (ARTIFACTS / "status_page_agent.html").write_text(page, encoding="utf-8")

        # every dashboard query returns data (while the alert fires and calibrators exist)
        wait_for(lambda: prom_query(prom_url, "calmon_calibrator_version"), 6 * EVERY,
                 "a published calibrator")

        # the agent exports the whole metric contract (but the Kafka-only consumer lag); the scheduled testers
        # (smCE, LDTC) publish a few rounds after T-Cal on a loaded machine: wait for them, do not race them
        def missing() -> set[str]:  # /metrics and its detail, as the shipped scrape jobs read them
            _, text = http("GET", f"http://127.0.0.1:{port}/metrics")
            _, detail = http("GET", f"http://127.0.0.1:{port}/metrics?collect[]=estimates&collect[]=details"
                                    "&collect[]=reliability")
            text += detail
            exported = {line.split("{")[0].split(" ")[0] for line in text.splitlines() if line and line[0] != "#"}
            return CONTRACT - exported - set(NO_DATA_EXPECTED)

        wait_for(lambda: not missing(), 40 * EVERY, "the whole metric contract in /metrics")
        assert not missing(), sorted(missing())

        missing = []
        for where, expr in dashboard_queries():
            if expr in NO_DATA_EXPECTED:
                continue
            if not prom_query(prom_url, expr):
                missing.append(f"{where}: {expr}")
        assert not missing, "dashboard queries without data:\n" + "\n".join(missing)

        # the drift ends: the window refills with calibrated data, the alert resolves
        rounds_at_end = monitor.rounds()
        t_end = time.time()
        writer.drift = False
        wait_for(lambda: not calibration_alerts(prom_url), 90, "CalmonCalibrationAlert to resolve", step=0.5)
        resolved = monitor.first_state_after("resolved", rounds_at_end)
        assert resolved is not None, "the agent's alert state never was 'resolved'"
        print(f"resolved {time.time() - t_end:.1f} s ({resolved['rounds'] - rounds_at_end} rounds) after the "
              f"drift ended (window {WINDOW}, clear_after {CLEAR_AFTER})")
        wait_for(lambda: not in_alertmanager(), 15, "the alert to resolve in Alertmanager")
        monitor.stopped.set()
        assert agent.poll() is None, "the agent died"
    finally:
        writer.stopped.set()
        if agent is not None and agent.poll() is None:
            agent.send_signal(signal.SIGTERM)
            try:
                agent.wait(timeout=20)
            except subprocess.TimeoutExpired:
                agent.kill()
                agent.wait(timeout=5)
        agent_log.close()
        stop(prom)
        stop(am)
        for t in threading.enumerate():
            if isinstance(t, AgentMonitor):
                t.stopped.set()
        if agent is not None and agent.returncode not in (0, None):
            print((tmp_path / "agent.log").read_text()[-3000:])
