"""The tester pool runs urgent jobs (a round's T-Cal simulations) before the scheduled testers waiting in it, and
a round waits for its simulations, not for the scheduled testers (unless it must be complete)."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from calmon.evaluate.pool import BACKGROUND, URGENT, TesterPool
from calmon.state.buckets import BucketStats
from calmon.testers import TESTERS, register_tester

ORDER: list[str] = []
GATE = threading.Event()
STARTED = threading.Event()
LATE = threading.Event()


@pytest.fixture(autouse=True, scope="module")
def _plugin_testers():
    yield
    for name in ("prio_gate", "prio_mark"):
        if name in TESTERS:
            TESTERS.unregister(name)


if "prio_gate" not in TESTERS:
    @register_tester("prio_gate")
    def _gate(data, *, alpha, mc, rng):  # holds its worker until the test opens the gate
        STARTED.set()
        GATE.wait(60)
        if data.n == 201:  # the late one of two windows
            LATE.wait(60)
        ORDER.append(f"gate{data.n}")
        return {"statistic": 0.0, "p_value": 0.5, "decision": "calibrated", "method": "prio_gate"}

    @register_tester("prio_mark")
    def _mark(data, *, alpha, mc, rng):
        ORDER.append(f"mark{data.n}")
        return {"statistic": 0.0, "p_value": 0.5, "decision": "calibrated", "method": "prio_mark"}


def data(n: int):
    rng = np.random.default_rng(n)
    b = BucketStats(2, bins=64, reservoir=16)
    z = rng.uniform(size=n)
    b.update(z, None, (rng.uniform(size=n) < z).astype(np.int64))
    return b.stats.calibration_data()


def test_urgent_jobs_overtake_the_waiting_background_ones_and_close_cancels_the_rest():
    ORDER.clear()
    GATE.clear()
    pool = TesterPool("thread", 1)
    try:
        kw = {"alpha": 0.05, "mc": 10, "seed": 0, "params": {}}
        first = pool.submit("prio_gate", data(1), **kw)  # occupies the one worker
        background = [pool.submit("prio_mark", data(10 + i), **kw, priority=BACKGROUND) for i in range(3)]
        urgent = [pool.submit("prio_mark", data(20 + i), **kw, priority=URGENT) for i in range(2)]
        assert not any(f.done() for f in [*background, *urgent])  # waiting in the pool's queue, not the executor's
        GATE.set()
        for f in [first, *background, *urgent]:
            assert f.result(60).doc["decision"] == "calibrated"
        # the executor held one job ready behind the running one; then urgent first, each kind in order
        assert ORDER == ["gate1", "mark10", "mark20", "mark21", "mark11", "mark12"]
        GATE.clear()
        ORDER.clear()
        STARTED.clear()
        blocked = pool.submit("prio_gate", data(2), **kw)
        waiting = pool.submit("prio_mark", data(30), **kw)
        assert STARTED.wait(60)  # the gated call is running, the other one waits
        closer = threading.Thread(target=pool.close)
        closer.start()
        deadline = time.monotonic() + 60
        while not waiting.done() and time.monotonic() < deadline:
            time.sleep(0.01)
        assert waiting.cancelled()  # never started: cancelled at close, as an executor's own queue would be
        GATE.set()
        closer.join(60)
        assert blocked.result(60).doc["decision"] == "calibrated" and ORDER == ["gate2"]  # the running one finished
    finally:
        GATE.set()
        pool.close()


def test_a_round_waits_for_its_simulations_not_for_scheduled_testers():
    from test_eval_pool import _needs_simulation

    from calmon.config import EvaluationConfig, TesterConfig
    from calmon.evaluate.round import Evaluator
    from calmon.state.agentstate import WindowSnapshot
    open_ = _needs_simulation(range(12))[:2]
    assert open_, "no window left undecided by T-Cal's screens"
    snap = [WindowSnapshot(f"m{i}", "all", "1h", b, (1, 0.0)) for i, b in enumerate(open_)]
    cfg = EvaluationConfig(tests=[TesterConfig("tcal"), TesterConfig("prio_gate")], cheap=["tcal"], mc=200,
                           budget=120.0, min_events=10)
    GATE.clear()
    pool = TesterPool("thread", 2)
    try:
        ev = Evaluator(cfg, pool=pool)
        t0 = time.monotonic()
        res = ev.run(snap, {})
        assert time.monotonic() - t0 < 0.8 * cfg.budget  # it did not wait for the gated scheduled tester
        assert not res.overrun and res.work["simulations"] == len(open_)
        assert all("tcal" in e["tests"] and "prio_gate" not in e["tests"] for e in res.evaluations)
        assert res.work["in_flight"] == len(open_) and ev.busy  # the gated calls: collected later
        GATE.set()
        evs = ev.settle(time.monotonic() + 60)
        assert evs is not None and all("prio_gate" in e["tests"] for e in evs)
        GATE.clear()
        ORDER.clear()
        threading.Timer(0.5, GATE.set).start()
        snap2 = [WindowSnapshot(w.model, w.segment, w.window, w.bucket, (2, 0.0)) for w in snap]
        res = ev.run(snap2, {}, complete=True)  # no later round: it waits for the scheduled testers too
        assert res.work["in_flight"] == 0 and all(
            e["tests"]["prio_gate"]["evaluated_at"] >= e["tests"]["tcal"]["evaluated_at"] for e in res.evaluations)
        assert sorted(ORDER) == ["gate500", "gate500"]
    finally:
        GATE.set()
        pool.close()


def test_republishing_gathers_longer_when_it_costs_more():
    from calmon.config import EvaluationConfig, TesterConfig
    from calmon.evaluate.round import SETTLE_GATHER, Evaluator
    from calmon.state.agentstate import WindowSnapshot
    snap = [WindowSnapshot(f"m{i}", "all", "1h", b, (1, 0.0))
            for i, b in enumerate(BucketStats(2, bins=64, reservoir=16) for _ in range(2))]
    for i, w in enumerate(snap):
        z = np.linspace(0.01, 0.99, 200 + i)
        w.bucket.update(z, None, (z > 0.5).astype(np.int64))
    cfg = EvaluationConfig(tests=[TesterConfig("prio_gate")], cheap=[], budget=120.0, min_events=10)
    GATE.clear()
    pool = TesterPool("thread", 2)
    try:
        ev = Evaluator(cfg, pool=pool)
        ev.run(snap, {})
        assert ev.busy and len(ev.inflight) == 2
        first = ev.inflight[(("m0", "all", "1h"), "prio_gate")][0]
        first.add_done_callback(lambda f: threading.Timer(3 * SETTLE_GATHER, LATE.set).start())
        LATE.clear()
        GATE.set()  # the window of 200 events answers now, the one of 201 some seconds later
        got = ev.settle(time.monotonic() + 120, republish_cost=10.0)  # gathers for 40 s, not SETTLE_GATHER
        assert got is not None and all("prio_gate" in e["tests"] for e in got) and not ev.busy
    finally:
        GATE.set()
        LATE.set()
        pool.close()


def test_a_killed_worker_process_gives_an_error_result_and_new_workers_take_the_next_jobs():
    import os
    import signal

    from calmon.evaluate.pool import decode_data, encode_data
    big = decode_data(encode_data(data(20_000)))
    pool = TesterPool("process", 1)
    try:
        kw = {"alpha": 0.05, "seed": 0, "params": {}}
        assert pool.submit("tcal", data(300), mc=50, **kw).result(120).doc["decision"] != "error"  # the worker is up
        (worker,) = pool._queue.executor._processes.values()  # type: ignore[union-attr]
        running = pool.submit("smce", big, mc=100_000, **kw)  # long enough to be killed mid-call
        os.kill(worker.pid, signal.SIGKILL)
        assert running.result(120).doc["decision"] == "error"  # the window gets an error result, retried later
        after = pool.submit("tcal", data(300), mc=50, **kw).result(120)  # the pool started new workers
        assert after.doc["decision"] in ("calibrated", "miscalibrated")
    finally:
        pool.close()


def test_results_of_calls_the_last_round_did_not_wait_for_are_in_the_final_status(tmp_path):
    import json

    from calmon.agent.runtime import Agent
    from calmon.config import build_config
    rng = np.random.default_rng(0)
    lines = [json.dumps({"model": "m", "ts": 1767225600 + i, "score": float(z), "label": int(rng.uniform() < z)})
             for i, z in enumerate(rng.uniform(size=400))]
    (tmp_path / "ev.jsonl").write_text("\n".join(lines) + "\n")
    cfg = build_config({"state_dir": str(tmp_path / "state"), "sources": [{"path": str(tmp_path / "ev.jsonl")}],
                        "exporter": {"enabled": False}, "windows": {"names": ["all"]},
                        "evaluation": {"min_events": 50, "budget": "2s", "pool": "thread", "cheap": [],
                                       "tests": [{"name": "prio_gate"}]},
                        "ingest": {"exit_when_done": True}}, env={})
    agent = Agent(cfg)
    seen: list[set[str]] = []

    def release_once_the_scheduler_stopped():  # i.e. in Agent.close, before it closes the pool
        deadline = time.monotonic() + 60
        while agent.scheduler is not None and agent.scheduler.alive() and time.monotonic() < deadline:
            time.sleep(0.01)
        GATE.set()

    def hook(evaluations):  # after the last round: its budget ran out before the gated call answered
        seen.append(set(evaluations[0]["tests"]))
        threading.Thread(target=release_once_the_scheduler_stopped, daemon=True).start()

    agent.round_hooks.append(hook)
    GATE.clear()
    try:
        assert agent.run() == 0
    finally:
        GATE.set()
    assert seen and "prio_gate" not in seen[-1]
    (e,) = agent.status()["evaluations"]
    assert e["tests"]["prio_gate"]["decision"] == "calibrated"  # finished while the agent closed, and published
