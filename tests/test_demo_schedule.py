"""The demo on two cores: no overrun, and every window gets every tester (scheduled in the process pool).

Robust on a loaded machine: the demo's own period and budget (15 s, 12 s), and the test stops as soon as every
window has every tester's result (or after 150 s, failing); a slow machine only takes more rounds.
"""

from __future__ import annotations

import threading

from calmon.agent.runtime import Agent
from calmon.commands.demo import demo_config


def test_demo_no_overrun_and_every_tester_result_present(tmp_path):
    cfg = demo_config(0, "127.0.0.1", str(tmp_path), drift_after=600.0)
    cfg.recalibration.enabled = False
    cfg.exporter.enabled = False
    agent = Agent(cfg)
    names = {t.name for t in cfg.evaluation.tests}
    complete = threading.Event()

    def hook(evaluations):
        big = [e for e in evaluations if e["n"] >= cfg.evaluation.min_events]
        if big and all(set(e["tests"]) == names for e in evaluations):
            complete.set()
            agent.stop()

    agent.round_hooks.append(hook)
    assert agent.run(max_seconds=150) == 0
    sched = agent.published.scheduler
    assert complete.is_set(), agent.published.work
    assert sched["overruns"] == 0, sched
    for e in agent.published.evaluations:
        assert all("evaluated_at" in r for r in e["tests"].values())
