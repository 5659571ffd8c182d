"""End to end: `calmon run` as a subprocess on a JSONL file; /metrics must agree with `calmon check --json`."""

from __future__ import annotations

import json
import math
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import numpy as np
import pytest
from prometheus_client.parser import text_string_to_metric_families

from calmon.cli import COMMANDS
from connectors.simulation import SimulationSpec, Simulator

ROOT = Path(__file__).resolve().parents[1]
N_LABELED, N_PAIRS = 6000, 3000
TESTS = "tcal,smce"
BAD = [b"this is not json", b'{"model": "fraud", "ts": 1767225700, "score": 1.7, "label": 1}',
       b'{"model": "fraud", "ts": 1767225700, "score": 0.3}' b"[", b'{"model": "fraud", "label": 1, "score": 0.2, '
       b'"ts": 1767225700, "segment": 5}', b'["an", "array"]', b'{"ts": 1767225700, "score": 0.2, "label": 0}']
EXPECTED_REASONS = {"not_json": 2, "out_of_range": 1, "bad_type": 1, "not_object": 1, "missing_field": 1}


def calmon(*args: str) -> list[str]:
    if args and args[0] in ("run", "demo") and args[0] not in COMMANDS:  # before the lead registers them
        return [sys.executable, "-m", f"calmon.commands.{args[0]}", *args[1:]]
    return [sys.executable, "-m", "calmon", *args]


def write_events(path: Path) -> None:
    """Labeled events, then delayed prediction/outcome pairs (joined by the agent), with bad lines mixed in."""
    lab = Simulator(SimulationSpec(model="fraud", seed=11, miscalibration="temperature:0.8", rate=20.0,
                                   segments=["web", "app"])).batch(N_LABELED)
    pairs = list(Simulator(SimulationSpec(model="fraud", seed=12, miscalibration="temperature:0.8", rate=20.0,
                                          delay=3.0, start=1_767_225_600.0 + N_LABELED / 20.0)).stream(N_PAIRS))
    # the pairs' ids must not collide with the labeled events' ids
    pairs = [p.replace(b'"id":"fraud-', b'"id":"pair-') for p in pairs]
    lines = lab + pairs
    for i, bad in enumerate(BAD):
        lines.insert(1000 * (i + 1), bad)
    path.write_bytes(b"\n".join(lines) + b"\n")


def scrape(url: str) -> dict[tuple, float]:
    """``/metrics`` and its detail (``collect[]``: estimates, tester details, diagrams), as the shipped scrape jobs."""
    text = ""
    for u in (url, url + "?collect[]=estimates&collect[]=details&collect[]=reliability"):
        with urllib.request.urlopen(u, timeout=10) as r:
            text += r.read().decode()
    out = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def get(sm, name, **labels):
    return sm.get((name, tuple(sorted(labels.items()))))


def test_run_matches_check(tmp_path):
    events = tmp_path / "events.jsonl"
    write_events(events)
    cfg = tmp_path / "calmon.yaml"
    cfg.write_text(f"""
state_dir: {tmp_path / 'state'}
sources: [{{name: replay, path: {events}}}]
models: {{default: {{bins: 4096, reservoir: 20000, segments: [web]}}}}
windows: {{names: [all]}}
evaluation: {{every: 1h, mc: 200, seed: 0, min_events: 10, tests: [{{name: tcal}}, {{name: smce}}]}}
exporter: {{port: 0}}
checkpoint: {{every: 1h}}
""")
    proc = subprocess.Popen(calmon("run", "-c", str(cfg)), stderr=subprocess.PIPE, text=True, cwd=ROOT)
    try:
        line = ""
        while True:  # log lines may come before "serving ..."
            nxt = proc.stderr.readline()
            line += nxt
            if not nxt or "serving" in nxt:
                break
        m = re.search(r"serving (http://\S+)/metrics", line)
        assert m, line + proc.stderr.read() if proc.poll() is not None else line
        url = m.group(1)
        deadline = time.time() + 120
        w = {"model": "fraud", "segment": "all", "window": "all"}
        while True:
            sm = scrape(f"{url}/metrics")
            if get(sm, "calmon_window_events", **w) == N_LABELED + N_PAIRS and all(
                    get(sm, "calmon_test_statistic", test=t, **w) is not None for t in TESTS.split(",")):
                # (every tester: under load T-Cal's simulation may publish after smCE)
                break
            assert time.time() < deadline, ("agent did not evaluate the whole file in time: "
                                            f"{get(sm, 'calmon_window_events', **w)} events, "
                                            f"{get(sm, 'calmon_evaluations_total')} rounds")
            time.sleep(0.3)
        ready = urllib.request.urlopen(f"{url}/readyz", timeout=5).status
        status = json.loads(urllib.request.urlopen(f"{url}/api/status", timeout=5).read())
        load = os.getloadavg()[0] / (os.cpu_count() or 1)
        proc.send_signal(signal.SIGTERM)
        t0 = time.monotonic()
        rc = proc.wait(timeout=120)
        stop_seconds = time.monotonic() - t0
        stopped = proc.stderr.read()
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.stderr.close()
    assert rc == 0 and ready == 200, stopped
    # the stop's own cost is its CPU time (the agent logs it), which a loaded machine does not inflate; the wall
    # time only has to stay well inside a grace period, scaled by the load the machine had (tests/test_sigterm.py)
    m = re.search(r"stopped on SIGTERM in [\d.]+ s \(([\d.]+) s CPU\)", stopped)
    assert m and float(m.group(1)) < 2.0, stopped
    assert stop_seconds < 10 * max(1.0, load), (stop_seconds, load, stopped)

    # `calmon check` (imports the tester modules first, in case the registry does not list them yet)
    check_args = [str(events), "--json", "--skip-invalid", "--tests", TESTS, "--mc", "200", "--seed", "0"]
    code = ("import sys, calmon.algorithms.tcal, calmon.algorithms.smooth; from calmon.cli import main; "
            f"sys.exit(main(['check', *{check_args!r}]))")
    check = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert check.returncode == 0, check.stderr
    doc = json.loads(check.stdout)
    assert doc["n"] == N_LABELED + N_PAIRS
    for metric, key in [("calmon_ece", "ece"), ("calmon_ece_l2_debiased", "ece_l2_debiased"),
                        ("calmon_brier_score", "brier"), ("calmon_accuracy", "accuracy"),
                        ("calmon_mean_confidence", "mean_confidence")]:
        assert get(sm, metric, **w) == pytest.approx(doc["metrics"][key], rel=1e-9, abs=1e-12), metric
    for test in TESTS.split(","):
        t = {**w, "test": test}
        assert get(sm, "calmon_test_statistic", **t) == pytest.approx(doc["tests"][test]["statistic"], rel=1e-9)
        assert get(sm, "calmon_test_rejected", **t) == float(doc["tests"][test]["decision"] == "miscalibrated")
        p_check = doc["tests"][test]["p_value"]
        p_agent = get(sm, "calmon_test_p_value", **t)
        # same data, same seed; Monte Carlo p-values may differ only through the sample's row order
        assert (p_check is None and math.isnan(p_agent)) or abs(p_agent - p_check) <= 0.05
    assert get(sm, "calmon_test_rejected", test="tcal", **w) == 1.0  # temperature 0.8 on 9000 events

    # the reliability diagram against a direct computation from the raw events
    z, y = [], []
    for raw in events.read_bytes().splitlines():
        try:
            d = json.loads(raw)
        except ValueError:
            continue
        if isinstance(d, dict) and d.get("type") == "labeled" and 0 <= d.get("score", -1) <= 1:
            if isinstance(d.get("segment", ""), str) and d.get("model"):
                z.append(d["score"])
                y.append(d["label"])
    preds = {}
    for raw in events.read_bytes().splitlines():
        if raw.startswith(b'{"type":"prediction"'):
            d = json.loads(raw)
            preds[d["id"]] = d["score"]
        elif raw.startswith(b'{"type":"outcome"'):
            d = json.loads(raw)
            z.append(preds[d["id"]])
            y.append(d["label"])
    z, y = np.array(z), np.array(y, float)
    assert z.size == N_LABELED + N_PAIRS
    cell = np.minimum(np.floor(z * 20).astype(int), 19)
    for b in range(20):
        sel = cell == b
        lab = {**w, "bin": f"{b / 20:.2f}"}
        assert get(sm, "calmon_reliability_events", **lab) == sel.sum()
        if sel.any():
            assert get(sm, "calmon_reliability_mean_outcome", **lab) == pytest.approx(y[sel].mean(), abs=1e-7)

    # counters, join, rejects and dead letters
    assert get(sm, "calmon_events_total", model="fraud", type="labeled") == N_LABELED  # bad lines are extra
    assert get(sm, "calmon_events_total", model="fraud", type="prediction") == N_PAIRS
    assert get(sm, "calmon_join_joined_total", model="fraud") == N_PAIRS
    assert get(sm, "calmon_join_pending", model="fraud") is None or get(sm, "calmon_join_pending", model="fraud") == 0
    for reason, count in EXPECTED_REASONS.items():
        assert get(sm, "calmon_events_rejected_total", reason=reason) == count, reason
    dead = [json.loads(x) for x in (tmp_path / "state" / "deadletter.jsonl").read_text().splitlines()]
    assert sorted(d["reason"] for d in dead) == sorted(r for r, c in EXPECTED_REASONS.items() for _ in range(c))
    web = {**w, "segment": "web"}
    assert 0 < get(sm, "calmon_window_events", **web) < N_LABELED
    assert {(e["segment"], e["window"]) for e in status["evaluations"]} == {("all", "all"), ("web", "all")}
    assert os.listdir(tmp_path / "state" / "checkpoints")


# ---------------------------------------------------------------------------------------------- in-process
def agent_on(tmp_path, lines: list[bytes], **overrides):
    from calmon.agent.runtime import Agent
    from calmon.config import build_config
    src = tmp_path / "in.jsonl"
    src.write_bytes(b"\n".join(lines) + b"\n")
    doc = {"state_dir": str(tmp_path / "state"), "sources": [{"path": str(src)}], "exporter": {"port": 0},
           "evaluation": {"tests": [], "min_events": 10}, "ingest": {"exit_when_done": True}}
    doc.update(overrides)
    agent = Agent(build_config(doc, env={}))
    agent.open()
    url = agent.http.url
    html = urllib.request.urlopen(f"{url}/", timeout=10).read().decode()
    assert html.lower().startswith("<!doctype html>")
    agent.run()
    return agent


def test_multiclass_window_equals_direct_statistics(tmp_path):
    from calmon.algorithms.ece import summary
    from calmon.offline.inputs import read_input
    from calmon.state.buckets import BucketStats
    lines = Simulator(SimulationSpec(model="digits", classes=4, seed=3, miscalibration="temperature:1.5",
                                     delay=2.0)).stream(3000)
    agent = agent_on(tmp_path, list(lines), windows={"names": ["1h", "all"]})
    ev = {(e["window"]): e for e in agent.status()["evaluations"] if e["segment"] == "all"}
    ds = read_input(str(tmp_path / "in.jsonl"))
    direct = BucketStats(4, bins=1024, reservoir=0)
    direct.update(None, ds.probs, ds.labels)
    want = summary(direct.stats)
    assert ev["all"]["n"] == ds.n == 3000
    for key in ("ece", "brier", "accuracy", "classwise_ece", "mean_confidence"):
        assert ev["all"]["metrics"][key] == pytest.approx(want[key], rel=1e-12)
    assert ev["1h"]["n"] == ev["all"]["n"]  # 3000 predictions at 100/s: the whole stream is within the last hour


def test_lateness_caps_alerts_and_recalibration(tmp_path):
    base = 1_767_225_600
    lines = [json.dumps({"model": "a", "ts": base + i, "score": 0.9, "label": int(i % 2 == 0)}).encode()
             for i in range(4000)]
    lines.append(json.dumps({"model": "a", "ts": base - 7200, "score": 0.5, "label": 1}).encode())  # late
    lines.append(json.dumps({"model": "b", "ts": base, "score": 0.5, "label": 1}).encode())  # beyond max_models
    rules = [{"name": "Overconfident", "kind": "threshold", "metric": "ece", "op": ">", "threshold": 0.1,
              "min_events": 100, "severity": "critical"}]
    agent = agent_on(tmp_path, lines, limits={"max_models": 1}, windows={"allowed_lateness": "1h"},
                     join={"ttl": "1h"}, alerts={"rules": rules},
                     recalibration={"enabled": True, "window": "all", "methods": ["platt"], "every": "1s"})
    st = agent.metrics_state()
    assert st["late"] == {"a": 1}
    assert st["rejected"] == {"too_many_models": 1}
    ev = [e for e in st["evaluations"] if e["window"] == "all"][0]
    assert ev["n"] == 4000 and ev["metrics"]["ece"] == pytest.approx(0.4, abs=1e-7)
    firing = [a for a in st["alerts"] if a["state"] == "firing"]
    assert {(a["alert"], a["window"]) for a in firing} == {("Overconfident", w) for w in ("1h", "24h", "7d", "all")}
    text = agent.metrics.render().decode()
    assert 'calmon_alert_active{alert="Overconfident",model="a",segment="all",severity="critical",window="all"} 1.0' \
        in text
    # scores 0.9 with half positives: Platt recalibration is published and lowers the error
    cal = agent.calibrators["a"]
    assert cal["version"] == 1 and cal["after"]["nll"] < cal["before"]["nll"]
    assert 'calmon_calibrator_version{method="platt",model="a"} 1.0' in text


def test_demo_smoke():
    """`calmon demo --port 0` starts on an embedded stream, prints where to look, serves, and stops on SIGINT.

    The demo runs until the check passed and is then interrupted (Ctrl-C): no assumption about how
    much a loaded CPU gets done in a fixed duration.
    """
    log = tempfile.TemporaryFile("w+")
    proc = subprocess.Popen(calmon("demo", "--port", "0", "--duration", "600", "--drift-after", "5"),
                            stdout=subprocess.PIPE, stderr=log, text=True, cwd=ROOT)
    try:
        head = []
        while not head or "Ctrl-C" not in head[-1]:
            head.append(proc.stdout.readline())
            assert head[-1], "".join(head)
        url = re.search(r"status page\s+(http://\S+)/", "".join(head)).group(1)
        assert urllib.request.urlopen(f"{url}/readyz", timeout=30).status == 200
        deadline = time.monotonic() + 300  # generous: only a broken demo takes this long
        w = {"model": "fraud-demo", "segment": "all", "window": "5m"}
        n = None
        while time.monotonic() < deadline:
            sm = scrape(f"{url}/metrics")
            n = get(sm, "calmon_window_events", **w)
            if n and get(sm, "calmon_test_p_value", test="tcal", **w) is not None:
                break
            time.sleep(0.5)
        assert n and n > 10000  # the replayed history is in the window
        proc.send_signal(signal.SIGINT)
        out = proc.stdout.read()
        proc.wait(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.stdout.close()
    log.seek(0)
    assert proc.returncode == 0, log.read()
    text = "".join(head) + out
    for path in ("/metrics", "/api/status", "/healthz"):
        assert f"{url}{path}" in text
    assert "5m: n=" in text and "calmon demo: stopped." in text
