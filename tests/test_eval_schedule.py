"""Evaluation as a scheduler of work items: fairness, incremental rounds, the snapshot's lock hold.

The expensive tester here is a plugin that advances a fake monotonic clock by one "second" per
call, so "a budget that fits only k calls per round" is exact and independent of the machine.
"""

from __future__ import annotations

import gc
import math
import threading
import time

import numpy as np
import pytest

from calmon.config import EvaluationConfig, TesterConfig, build_config
from calmon.evaluate.round import Evaluator
from calmon.evaluate.workitems import CostModel, starvation_bound
from calmon.state.agentstate import AgentState, WindowSnapshot
from calmon.state.buckets import BucketStats
from calmon.testers import TESTERS, register_tester

CLOCK = [0.0]
CALLS: list[str] = []

@pytest.fixture(autouse=True, scope="module")
def _plugin_testers():
    """The fake testers exist only while this module's tests run (the registry is process-wide)."""
    yield
    for name in ("sched_slow", "sched_fast", "sched_block"):
        if name in TESTERS:
            TESTERS.unregister(name)


if "sched_slow" not in TESTERS:
    @register_tester("sched_slow")
    def _slow(data, *, alpha, mc, rng):  # one fake second per call
        CLOCK[0] += 1.0
        CALLS.append("sched_slow")
        return {"statistic": float(data.n), "p_value": 0.5, "decision": "calibrated", "method": "sched_slow"}

    @register_tester("sched_fast")
    def _fast(data, *, alpha, mc, rng):
        CALLS.append("sched_fast")
        return {"statistic": float(data.n), "p_value": 0.5, "decision": "calibrated", "method": "sched_fast"}


class FixedCosts(CostModel):
    def observe(self, test, seconds):  # the fake clock is the truth here, not the measured microseconds
        pass

    def estimate(self, test):
        return 1.0


def bucket(n: int, seed: int = 0) -> BucketStats:
    rng = np.random.default_rng(seed)
    b = BucketStats(2, bins=64, reservoir=16)
    z = rng.uniform(size=n)
    b.update(z, None, (rng.uniform(size=n) < z).astype(np.int64))
    return b


def evaluator(budget: float, tests=("sched_fast", "sched_slow"), **kw) -> Evaluator:
    cfg = EvaluationConfig(tests=[TesterConfig(t) for t in tests], cheap=["sched_fast"], budget=budget,
                           min_events=5, **kw)
    ev = Evaluator(cfg, monotonic=lambda: CLOCK[0], clock=lambda: 1000.0 + CLOCK[0])
    ev.costs = FixedCosts()
    return ev


def snaps(count: int, rnd: int, changed=None) -> list[WindowSnapshot]:
    """``count`` windows; each one's stamp is the round number (changed every round) unless listed unchanged."""
    return [WindowSnapshot(f"m{i:03d}", "all", "1h", BUCKETS[i % len(BUCKETS)],
                           (rnd if changed is None or i in changed else 0, 0.0)) for i in range(count)]


BUCKETS = [bucket(50, s) for s in range(4)]


def test_fair_every_window_gets_every_tester_within_the_bound():
    CLOCK[0] = 0.0
    windows = 16
    ev = evaluator(budget=5.0)  # FILL = 0.8 of what is left of 5 fake seconds: 4 slow calls, whatever the machine
    seen: dict[str, set[float]] = {}
    for rnd in range(1, 5):
        CALLS.clear()
        res = ev.run(snaps(windows, rnd), {})
        assert CALLS.count("sched_slow") == 4 and CALLS.count("sched_fast") == windows  # cheap: every window
        assert not res.overrun
        for e in res.evaluations:
            r = e["tests"].get("sched_slow")
            if r is not None:
                seen.setdefault(e["model"], set()).add(r["evaluated_at"])
    # 16 windows, 4 per round, round-robin by staleness: after 4 rounds every window has a result, none twice
    assert len(seen) == windows and all(len(v) == 1 for v in seen.values())
    bound = starvation_bound({"sched_slow": windows}, ev.costs, capacity=5.0 * 0.8)
    assert bound is not None and bound >= 4
    # and the order keeps rotating: the next 4 rounds give every window a second, newer result
    first = {m: max(v) for m, v in seen.items()}
    for rnd in range(5, 9):
        res = ev.run(snaps(windows, rnd), {})
    assert all(e["tests"]["sched_slow"]["evaluated_at"] > first[e["model"]] for e in res.evaluations)


def test_incremental_unchanged_window_keeps_its_result_changed_one_is_recomputed():
    CLOCK[0] = 0.0
    ev = evaluator(budget=100.0)
    first = ev.run(snaps(4, 1, changed={1}), {}).evaluations
    assert all("sched_slow" in e["tests"] and "sched_fast" in e["tests"] for e in first)
    CALLS.clear()
    CLOCK[0] += 50.0
    second = ev.run(snaps(4, 2, changed={1}), {}).evaluations  # only window 1's statistics changed
    assert CALLS == ["sched_fast", "sched_slow"]
    for i in (0, 2, 3):
        assert second[i] is first[i]  # not re-assembled, not recomputed
        assert second[i]["tests"]["sched_slow"]["evaluated_at"] == first[i]["tests"]["sched_slow"]["evaluated_at"]
    assert second[1]["tests"]["sched_slow"]["evaluated_at"] > first[1]["tests"]["sched_slow"]["evaluated_at"]


def test_cadence_and_small_windows():
    CLOCK[0] = 0.0
    ev = evaluator(budget=100.0, cadence={"sched_slow": 3})
    ev.run(snaps(2, 1), {})
    CALLS.clear()
    ev.run(snaps(2, 2), {})
    ev.run(snaps(2, 3), {})
    assert CALLS.count("sched_slow") == 0 and CALLS.count("sched_fast") == 4  # cadence: not before round 4
    ev.run(snaps(2, 4), {})
    assert CALLS.count("sched_slow") == 2
    small = [WindowSnapshot("tiny", "all", "1h", bucket(3), (1, 0.0))]
    e = ev.run(small, {}).evaluations[0]
    assert {r["decision"] for r in e["tests"].values()} == {"insufficient data"}


def test_cadence_is_validated():
    with pytest.raises(Exception, match="cadence.nope"):
        build_config({"sources": [{"path": "x"}], "evaluation": {"cadence": {"nope": 2}}}, env={})
    with pytest.raises(Exception, match="evaluation.pool"):
        build_config({"sources": [{"path": "x"}], "evaluation": {"pool": "gpu"}}, env={})


# -- the snapshot: per-ring lock, skip unchanged rings ---------------------------------------------------------
class TimedLock:
    """Wraps the state's RLock and records the CPU time of each outermost hold (the holder's thread time:
    on a loaded machine a preempted holder's wall time says nothing about the work done under the lock);
    automatic garbage collection waits for the release, as with the agent's ``StateLock``."""

    def __init__(self) -> None:
        self.lock = threading.RLock()
        self.depth = 0
        self.holds: list[float] = []
        self.t0 = 0.0
        self.gc = True

    def __enter__(self):
        self.lock.acquire()
        self.depth += 1
        if self.depth == 1:
            self.gc = gc.isenabled()
            gc.disable()
            self.t0 = time.thread_time()
        return self

    def __exit__(self, *exc):
        self.depth -= 1
        if self.depth == 0:
            self.holds.append(time.thread_time() - self.t0)
            if self.gc:
                gc.enable()
        self.lock.release()

    acquire = lambda self, *a, **k: self.lock.acquire(*a, **k)  # noqa: E731
    release = lambda self: self.lock.release()  # noqa: E731


def state_with(models: int) -> AgentState:
    cfg = build_config({"sources": [{"path": "x.jsonl"}],
                        "models": {"default": {"bins": 256, "reservoir": 64, "segments": ["web", "app"]}}}, env={})
    st = AgentState(cfg)
    rng = np.random.default_rng(0)
    for i in range(models):
        mw = st.windows_of(f"m{i:04d}", 2)
        ts = 1.767e9 + rng.uniform(0, 7200, size=200)
        seg = np.array(["web", "app"] * 100, dtype=object)
        z = rng.uniform(size=200)
        mw.add(ts, seg, (rng.uniform(size=200) < z).astype(np.int64), z, None, float(ts.max()))
    st.joiner.watermark = 1.767e9 + 7200
    return st


def max_hold(st: AgentState) -> float:
    lock = TimedLock()
    st.lock = lock  # type: ignore[assignment]
    st._snap_cache.clear()
    st.snapshot()
    return max(lock.holds)


def test_snapshot_holds_the_lock_per_ring_not_per_state():
    small, large = state_with(10), state_with(200)
    hold_small = min(max_hold(small) for _ in range(3))
    hold_large = min(max_hold(large) for _ in range(3))
    # one ring's sums at a time: the longest hold does not grow with the number of models (20x here)
    assert hold_large < 4 * hold_small + 0.005, (hold_small, hold_large)


def test_snapshot_reuses_unchanged_rings():
    st = state_with(3)
    a = st.snapshot()
    b = st.snapshot()
    assert all(x.bucket is y.bucket and x.stamp == y.stamp for x, y in zip(a, b))
    mw = st.models["m0001"]
    mw.add(np.array([1.767e9 + 7100.0]), np.array(["web"], dtype=object), np.array([1]), np.array([0.9]), None,
           1.767e9 + 7200)
    c = st.snapshot()
    changed = {(x.model, x.segment) for x, y in zip(b, c) if x.bucket is not y.bucket}
    assert changed == {("m0001", "web"), ("m0001", "all")}
    assert all(math.isfinite(s.stamp[1]) for s in c if s.stamp is not None)


RELEASE = threading.Event()

if "sched_block" not in TESTERS:
    @register_tester("sched_block")
    def _block(data, *, alpha, mc, rng):  # runs until the test releases it
        RELEASE.wait(30)
        return {"statistic": 1.0, "p_value": 0.5, "decision": "calibrated", "method": "sched_block"}


def test_a_call_running_past_the_budget_is_collected_between_rounds():
    from calmon.evaluate.pool import TesterPool
    pool = TesterPool("thread", 1)
    try:
        cfg = EvaluationConfig(tests=[TesterConfig("sched_block")], cheap=[], budget=0.5, min_events=5)
        ev = Evaluator(cfg, pool=pool)
        ev.costs = FixedCosts()
        ev.costs.estimate = lambda test: 0.1  # fits the budget, but the call runs until released
        RELEASE.clear()
        res = ev.run(snaps(1, 1), {})
        assert "sched_block" not in res.evaluations[0]["tests"] and ev.busy  # not waited for past the budget
        assert ev.settle(time.monotonic() + 0.2) is None  # nothing arrived yet
        RELEASE.set()
        evs = ev.settle(time.monotonic() + 30)
        assert evs is not None and evs[0]["tests"]["sched_block"]["decision"] == "calibrated" and not ev.busy
    finally:
        RELEASE.set()
        pool.close()


def test_one_slow_window_does_not_demote_a_cheap_tester():
    # the cheap cost is the round's mean call in CPU time: 1 slow call among 20 keeps the tester cheap
    CLOCK[0] = 0.0
    cfg = EvaluationConfig(tests=[TesterConfig("sched_fast")], cheap=["sched_fast"], budget=100.0, min_events=5,
                           cheap_cost=0.1)
    cpu = iter([0.0, 1.0] + [1.0 + i * 0.001 for i in range(2, 41)])
    ev = Evaluator(cfg, monotonic=lambda: CLOCK[0], clock=lambda: 1000.0 + CLOCK[0], cpu_clock=lambda: next(cpu))
    CALLS.clear()
    ev.run(snaps(20, 1), {})  # the first call takes 1 s of CPU, the other 19 a millisecond each
    assert CALLS.count("sched_fast") == 20
    assert 0.05 < ev.costs.seconds["sched_fast"] < 0.06 and ev._cheap("sched_fast")


def test_a_cheap_tester_measured_slow_becomes_a_work_item():
    CLOCK[0] = 0.0
    cfg = EvaluationConfig(tests=[TesterConfig("sched_slow")], cheap=["sched_slow"], budget=5.0, min_events=5)
    ev = Evaluator(cfg, monotonic=lambda: CLOCK[0], clock=lambda: 1000.0 + CLOCK[0], cpu_clock=lambda: CLOCK[0])
    ev.run(snaps(1, 1), {})  # run inline as cheap: measured at one (fake) CPU second
    assert ev.costs.seconds["sched_slow"] == 1.0 and not ev._cheap("sched_slow")
    CALLS.clear()
    res = ev.run(snaps(8, 2), {})  # now scheduled: only what fits 80 % of the budget runs
    assert 0 < CALLS.count("sched_slow") < 8 and res.work["queued"] > 0 and not res.overrun


def test_refresh_spread_over_rounds_least_recently_refreshed_first(monkeypatch):
    """Issue #35: changed windows whose refresh (metrics, estimates, cheap testers) would take more than
    REFRESH_SHARE of the budget are spread over rounds, least recently refreshed first -- the round stays within
    its budget and every window is refreshed within ceil(windows / per round) rounds; a round that must be
    complete refreshes them all."""
    import calmon.evaluate.round as round_mod

    base = round_mod.window_base

    def slow_base(*a, **k):  # one fake second per window's metrics
        CLOCK[0] += 1.0
        return base(*a, **k)

    monkeypatch.setattr(round_mod, "window_base", slow_base)
    CLOCK[0] = 0.0
    windows, budget = 20, 10.0
    ev = evaluator(budget=budget, tests=("sched_fast",))
    per_round = int(budget * round_mod.REFRESH_SHARE) + 1  # checked before each window
    refreshed: dict[str, list[int]] = {}
    for rnd in range(1, 9):
        t0 = CLOCK[0]
        res = ev.run(snaps(windows, rnd), {})
        assert CLOCK[0] - t0 <= budget and not res.overrun
        assert res.work["deferred"] == windows - min(per_round, windows)
        models = [e["model"] for e in res.evaluations]
        assert models == sorted(models)  # published in snapshot order, deferred windows with their last one
        for k, e in ev.entries.items():
            if e.refreshed == ev.round:
                refreshed.setdefault(k[0], []).append(rnd)
    # every window refreshed, and never two rounds apart more than the rotation allows
    assert len(refreshed) == windows
    every = -(-windows // per_round)
    for rounds in refreshed.values():
        assert rounds[0] <= every and all(b - a <= every for a, b in zip(rounds, rounds[1:]))
    res = ev.run(snaps(windows, 99), {}, complete=True)
    assert res.work["deferred"] == 0 and all(e.refreshed == ev.round for e in ev.entries.values())
    # a machine so loaded that the share is gone before the first window: still a tenth of them a round
    CLOCK[0] += 1.0
    ev.cfg.budget = 1e-9
    res = ev.run(snaps(windows, 100), {})
    assert res.work["deferred"] == windows - -(-windows // round_mod.REFRESH_ROUNDS)
