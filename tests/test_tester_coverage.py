"""Issue #35.2: every default tester on every window -- identical jobs answered once, and a background pool
given the whole period rather than what is left of the round's budget.

The scheduling tests use a plugin tester and a fake monotonic clock, so "a period that holds k calls" is
exact and independent of the machine.
"""

from __future__ import annotations

import math
import threading
import time

import numpy as np
import pytest

from calmon.config import EvaluationConfig, TesterConfig
from calmon.evaluate.pool import TesterPool
from calmon.evaluate.round import Evaluator
from calmon.evaluate.workitems import CostModel, horizon, starvation_bound
from calmon.state.agentstate import WindowSnapshot
from calmon.state.buckets import BucketStats
from calmon.stats.data import CalibrationData
from calmon.stats.grid import ScoreGrid
from calmon.testers import TESTERS, register_tester, run_tester

CLOCK = [0.0]
CALLS: list[str] = []
LOCK = threading.Lock()
GATE = threading.Event()  # calls wait for it: none finishes while the round still schedules
GATE.set()


@pytest.fixture(autouse=True, scope="module")
def _plugin_tester():
    yield
    if "cov_slow" in TESTERS:
        TESTERS.unregister("cov_slow")


if "cov_slow" not in TESTERS:
    @register_tester("cov_slow")
    def _slow(data, *, alpha, mc, rng):
        GATE.wait(60)
        with LOCK:
            CALLS.append("cov_slow")
        return {"statistic": float(data.n), "p_value": 0.5, "decision": "calibrated", "method": "cov_slow"}


def _grid_window(seed: int, n: int = 3000, reservoir_seed: int = 0, shift: float = 0.0) -> CalibrationData:
    """A window as the agent keeps it past its reservoir: the grid, and a 256-event sample of its own."""
    rng = np.random.default_rng(seed)
    z = rng.random(n)
    y = (rng.random(n) < np.clip(z + shift, 0, 1)).astype(float)
    g = ScoreGrid(1024)
    g.update(z, y)
    pick = np.random.default_rng(reservoir_seed).choice(n, 256, replace=False)
    return CalibrationData(n=n, z=z[pick], y=y[pick], grid=g, raw_is_complete=False)


@pytest.mark.parametrize("name", ["smce", "ldtc"])
def test_identical_windows_are_computed_once_with_the_fresh_result(name: str) -> None:
    pool = TesterPool("thread", workers=2)
    try:
        kw = dict(alpha=0.05, mc=1000, seed=0, params={})
        a = _grid_window(1, reservoir_seed=1)
        b = _grid_window(1, reservoir_seed=2)  # the same grid, another reservoir sample (another window of a ring)
        assert not np.array_equal(a.z, b.z)
        first = pool.submit(name, a, **kw).result(timeout=120)
        second = pool.submit(name, b, **kw).result(timeout=120)
        assert pool.shared == 1 and second.seconds == 0.0
        # the p-value is a function of the data and the seed: the shared result is the one computed afresh
        fresh = run_tester(name, b, alpha=0.05, mc=1000, seed=0).to_dict()
        assert second.doc["p_value"] == first.doc["p_value"] == fresh["p_value"]
        assert second.doc["statistic"] == fresh["statistic"] and second.doc["decision"] == fresh["decision"]
        # never the result of another grid, size or seed
        other_grid = _grid_window(2, reservoir_seed=1)
        bigger = _grid_window(1, n=3001, reservoir_seed=1)
        for data, seed in ((other_grid, 0), (bigger, 0), (a, 1)):
            got = pool.submit(name, data, **{**kw, "seed": seed}).result(timeout=120)
            want = run_tester(name, data, alpha=0.05, mc=1000, seed=seed).to_dict()
            assert got.seconds > 0 and got.doc["p_value"] == want["p_value"]
        assert pool.shared == 1
    finally:
        pool.close()


def test_complete_raw_samples_and_failures_are_not_shared() -> None:
    pool = TesterPool("thread", workers=1)
    try:
        kw = dict(alpha=0.05, mc=99, seed=0, params={})
        rng = np.random.default_rng(3)
        z = rng.random(200)
        y = (rng.random(200) < z).astype(float)
        g = ScoreGrid(1024)
        g.update(z, y)
        a = CalibrationData(n=200, z=z, y=y, grid=g, raw_is_complete=True)  # smce reads these raw events
        b = CalibrationData(n=200, z=z, y=1.0 - y, grid=g, raw_is_complete=True)
        ra, rb = (pool.submit("smce", d, **kw).result(timeout=60) for d in (a, b))
        assert pool.shared == 0 and ra.doc["statistic"] != rb.doc["statistic"]
        bad = CalibrationData(n=200)  # neither a grid nor raw events: the tester fails
        for _ in range(2):
            assert pool.submit("smce", bad, **kw).result(timeout=60).doc["decision"] == "error"
        assert pool.shared == 0  # a failure is retried, not served again
    finally:
        pool.close()


class FixedCosts(CostModel):
    def observe(self, test, seconds):  # the fake clock is the truth here
        pass

    def estimate(self, test):
        return 1.0


def _bucket(seed: int) -> BucketStats:
    rng = np.random.default_rng(seed)
    b = BucketStats(2, bins=64, reservoir=16)
    z = rng.uniform(size=50)
    b.update(z, None, (rng.uniform(size=50) < z).astype(np.int64))
    return b


BUCKETS = [_bucket(s) for s in range(4)]


def _snaps(count: int, rnd: int) -> list[WindowSnapshot]:
    return [WindowSnapshot(f"m{i:03d}", "all", "1h", BUCKETS[i % 4], (rnd, 0.0)) for i in range(count)]


def _evaluator(pool: TesterPool, budget: float = 5.0, every: float = 20.0) -> Evaluator:
    cfg = EvaluationConfig(tests=[TesterConfig("cov_slow")], cheap=[], budget=budget, every=every, min_events=5)
    ev = Evaluator(cfg, monotonic=lambda: CLOCK[0], clock=lambda: 1000.0 + CLOCK[0], pool=pool)
    ev.costs = FixedCosts()
    return ev


def _drain(ev: Evaluator) -> None:
    deadline = time.monotonic() + 60  # generous: the calls are instant, the machine may be loaded
    while not all(job[0].done() for job in ev.inflight.values()):
        assert time.monotonic() < deadline, "tester calls did not finish"
        time.sleep(0.01)


def test_a_background_pool_gets_the_period_and_every_window_within_the_bound() -> None:
    """Budget 5 s, every 20 s, one worker, 1 s a call: 16 calls a round (80 % of the period), not 4 (of the
    budget); 40 windows changing every round each get the tester at least every ceil(40 / 15) = 3 rounds."""
    assert horizon(5.0, 20.0, background=True) == 20.0 and horizon(5.0, 20.0, background=False) == 5.0
    pool = TesterPool("thread", workers=1)
    ev = _evaluator(pool)
    windows = 40
    last: dict[str, int] = {}
    try:
        for rnd in range(1, 10):
            CLOCK[0] = 20.0 * rnd
            CALLS.clear()
            GATE.clear()
            res = ev.run(_snaps(windows, rnd), {})
            GATE.set()
            assert not res.overrun
            _drain(ev)
            assert len(CALLS) == 16  # every window changes every round: always more candidates than room
            for e in res.evaluations:
                r = e["tests"].get("cov_slow")
                if r is not None:
                    last[e["model"]] = int(r["evaluated_at"])
            bound = starvation_bound({"cov_slow": windows}, ev.costs, 20.0 * 0.8)
            assert bound == math.ceil(windows / 15)
            if rnd > bound:  # every window has a result no older than the bound
                assert len(last) == windows
                assert all(1000.0 + 20.0 * (rnd - bound) <= t for t in last.values())
    finally:
        GATE.set()
        ev.stop()
        pool.close(wait=False)


def test_a_windows_testers_are_taken_together() -> None:
    """A pass cut short leaves whole windows done: the order puts a window's testers next to each other."""
    from calmon.evaluate.workitems import Candidate, order
    cands = [Candidate((f"m{i:02d}", "all", w), t, -1, 0) for i in range(20) for w in ("1h", "24h")
             for t in ("ldtc", "smce")]
    got = order(cands)
    pairs = [(a.key, b.key) for a, b in zip(got[::2], got[1::2])]
    assert all(a == b for a, b in pairs) and [c.test for c in got[:2]] == ["ldtc", "smce"]
