"""#32.6: SIGTERM stops `calmon run` within 5 s with slow tester calls in flight: the calls are abandoned (their
worker processes killed; the next run recomputes them), the final checkpoint is written and restorable, one log
line says what was saved, and no worker outlives the agent."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import numpy as np
import yaml

ROOT = Path(__file__).resolve().parents[1]
N = 20_000
MODELS = ("churn", "fraud")
#: Seconds from SIGTERM to exit on a quiet machine (the issue's bound; deploy/ grace periods allow 30 s).
BOUND = 5.0


def _children(pid: int) -> set[int]:
    """Direct children of ``pid`` (Linux ``/proc``)."""
    out: set[int] = set()
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            out |= {int(c) for c in (task / "children").read_text().split()}
        except OSError:
            pass
    return out


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def _scrape(url: str) -> str:
    with urllib.request.urlopen(url, timeout=10) as r:
        return r.read().decode()


def _cpu_of(pid: int) -> float:
    """CPU seconds (user + system) ``pid`` has used."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def test_sigterm_abandons_tester_calls_and_checkpoints(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    z = rng.random(N)
    y = rng.random(N) < z
    events = tmp_path / "events.jsonl"
    events.write_text("".join(json.dumps({"model": MODELS[i % 2], "id": f"e{i}", "ts": 1_767_225_600 + i,
                                          "score": float(s), "label": int(v)}) + "\n"
                              for i, (s, v) in enumerate(zip(z, y))))
    cfg = tmp_path / "calmon.yaml"
    # 100,000 null draws on 1024 cells without curtailing (the tester's default caps them at 199 on 256 cells): one
    # smCE call simulates for minutes -- far longer than any grace period
    cfg.write_text(f"""
state_dir: {tmp_path / 'state'}
sources: [{{name: replay, path: {events}}}]
models: {{default: {{bins: 4096, reservoir: 20000}}}}
windows: {{names: [all]}}
evaluation: {{every: 1s, budget: 10s, mc: 100000, min_events: 10, pool: process, workers: 2,
             tests: [{{name: tcal}}, {{name: smce, params: {{curtail: false, null_mc: 100000, null_bins: 1024}}}}]}}
exporter: {{port: 0}}
checkpoint: {{every: 1h}}
""")
    proc = subprocess.Popen([sys.executable, "-m", "calmon", "run", "-c", str(cfg)], stderr=subprocess.PIPE,
                            text=True, cwd=ROOT)
    log: list[str] = []
    try:
        while True:
            line = proc.stderr.readline()
            log.append(line)
            if not line or "serving" in line:
                break
        m = re.search(r"serving (http://\S+)/metrics", "".join(log))
        assert m, "".join(log) + (proc.stderr.read() if proc.poll() is not None else "")
        url = m.group(1)
        deadline = time.monotonic() + 120
        workers: set[int] = set()
        while True:  # every event ingested, and a worker busy with a tester call (spawned: about 0.5 s CPU)
            text = _scrape(f"{url}/metrics")
            got = re.findall(r'^calmon_window_events[{][^}]*window="all"[^}]*[}] (\S+)$', text, re.M)
            if sum(float(g) for g in got) == N:
                workers = {c for c in _children(proc.pid) if _cpu_of(c) > 1.0}
                if workers:
                    break
            assert time.monotonic() < deadline, text[-2000:]
            time.sleep(0.3)
        load = os.getloadavg()[0] / (os.cpu_count() or 1)
        proc.send_signal(signal.SIGTERM)
        t0 = time.monotonic()
        rc = proc.wait(timeout=120)
        stop_seconds = time.monotonic() - t0
        rest = proc.stderr.read()
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.stderr.close()
    log_text = "".join(log) + rest
    assert rc == 0, log_text
    # the calls in flight take minutes: any stop that waited for them fails by far; a loaded machine slows the
    # shutdown path itself (its CPU time is measured below), so the wall bound grows with the load only
    assert stop_seconds < BOUND * max(1.0, load), (stop_seconds, load, log_text)
    # ... and the shutdown path itself is cheap: CPU the agent spent from the signal to its exit
    m = re.search(r"stopped on SIGTERM in ([\d.]+) s \(([\d.]+) s CPU\): checkpoint generation (\d+) written "
                  r"\((\d[\d,]*) models?, [\d.]+ [kM]?B\); (\d+) tester calls? abandoned", log_text)
    assert m, log_text
    print(f"{m.group(0)} | wall {stop_seconds:.1f} s at load {load:.1f} per core")  # for the record (-s)
    assert float(m.group(2)) < 2.0, m.group(0)
    assert int(m.group(5)) >= 1, m.group(0)
    assert int(m.group(4).replace(",", "")) == len(MODELS)
    assert log_text.count("stopped on SIGTERM") == 1 and "Traceback" not in log_text
    # no worker outlives the agent (they ignore SIGTERM; the agent killed them)
    until = time.monotonic() + 10
    while any(_alive(w) for w in workers) and time.monotonic() < until:
        time.sleep(0.1)
    assert not any(_alive(w) for w in workers), workers
    # the final checkpoint is there and restorable: a second run resumes from it and reads nothing again
    assert int(m.group(3)) >= 1
    again = tmp_path / "again.yaml"
    again.write_text(cfg.read_text().replace("mc: 100000", "mc: 99").replace("pool: process", "pool: inline"))
    results = tmp_path / "results.json"
    done = subprocess.run([sys.executable, "-m", "calmon", "run", "-c", str(again), "--exit-when-done",
                           "--results", str(results)], capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "resumed from checkpoint" in done.stderr, done.stderr
    status = json.loads(results.read_text())
    counts = {e["model"]: e["n"] for e in status["evaluations"] if e["window"] == "all"}
    assert counts == {name: N // len(MODELS) for name in MODELS}, counts


#: The grace period every deploy asset gives the single agent (docs/deploy.md, "Stopping"): several times the stop
#: bound, for a large final checkpoint on a slow disk, and the same everywhere.
GRACE = 30


def _find(node: object, key: str) -> list[object]:
    if isinstance(node, dict):
        return [v for k, v in node.items() if k == key] + [x for v in node.values() for x in _find(v, key)]
    if isinstance(node, list):
        return [x for v in node for x in _find(v, key)]
    return []


def test_deploy_grace_periods_match_the_stop_bound() -> None:
    deploy = ROOT / "deploy"
    compose = yaml.safe_load((deploy / "compose.yaml").read_text())
    assert compose["services"]["calmon"]["stop_grace_period"] == f"{GRACE}s"
    k8s = [doc for doc in yaml.safe_load_all((deploy / "kubernetes" / "calmon.yaml").read_text()) if doc]
    assert _find(k8s, "terminationGracePeriodSeconds") == [GRACE]
    unit = (deploy / "systemd" / "calmon.service").read_text()
    assert re.findall(r"^TimeoutStopSec=(\d+)$", unit, re.M) == [str(GRACE)]
    assert GRACE >= 5 * BOUND
    assert f"{GRACE} s" in (ROOT / "docs" / "deploy.md").read_text()
