"""The tester pool: JSON jobs (no pickle of data) give the same results as a call in-process; an agent whose
expensive testers run in worker processes publishes every tester's result with its age."""

from __future__ import annotations

import json

import numpy as np
from prometheus_client.parser import text_string_to_metric_families

from calmon.agent.runtime import Agent
from calmon.config import build_config
from calmon.evaluate.pool import TesterPool, decode_data, encode_data, run_job
from calmon.state.buckets import BucketStats
from calmon.testers import run_tester


def window(classes: int, n: int = 3000, seed: int = 1) -> BucketStats:
    rng = np.random.default_rng(seed)
    b = BucketStats(classes, bins=256, reservoir=128, levelset_lambda=4 if classes > 2 else None)
    if classes == 2:
        z = rng.uniform(size=n)
        b.update(z, None, (rng.uniform(size=n) < z).astype(np.int64))
    else:
        p = rng.dirichlet(np.ones(classes), size=n)
        b.update(None, p, np.array([rng.choice(classes, p=row) for row in p]))
    return b


def test_json_job_gives_the_in_process_result():
    for classes, testers in ((2, ("tcal", "smce", "ldtc")), (3, ("tcal", "lp"))):
        data = window(classes).stats.calibration_data()
        back = decode_data(encode_data(data))
        assert back.n == data.n and back.raw_is_complete == data.raw_is_complete
        for name in testers:
            direct = run_tester(name, data, mc=50, seed=3).to_dict()
            job = json.dumps({"name": name, "alpha": 0.05, "mc": 50, "seed": 3, "params": {},
                              "data": encode_data(data)})
            assert json.loads(run_job(job))["result"] == json.loads(json.dumps(direct)), name


def test_thread_pool_and_unknown_tester_error():
    pool = TesterPool("thread", 2)
    try:
        data = window(2).stats.calibration_data()
        res = pool.submit("smce", data, alpha=0.05, mc=20, seed=0, params={}).result(60)
        assert res.doc["method"] == "smce" and res.seconds > 0
        bad = pool.submit("nope", data, alpha=0.05, mc=20, seed=0, params={}).result(60)
        assert bad.doc["decision"] == "error"
    finally:
        pool.close()


def test_agent_with_a_process_pool_publishes_every_result_with_its_age(tmp_path):
    rng = np.random.default_rng(0)
    lines = []
    for i in range(3000):
        z = float(rng.uniform())
        lines.append(json.dumps({"model": f"m{i % 3}", "ts": 1767225600 + i, "score": z,
                                 "label": int(rng.uniform() < z)}))
    (tmp_path / "ev.jsonl").write_text("\n".join(lines) + "\n")
    cfg = build_config({"state_dir": str(tmp_path / "state"), "sources": [{"path": str(tmp_path / "ev.jsonl")}],
                        "exporter": {"enabled": False, "reliability": "none"}, "windows": {"names": ["1h", "all"]},
                        "evaluation": {"mc": 50, "min_events": 50, "budget": "60s", "pool": "process",
                                       "tests": [{"name": "tcal"}, {"name": "smce"}, {"name": "ldtc"}]},
                        "ingest": {"exit_when_done": True}}, env={})
    agent = Agent(cfg)
    assert agent.run() == 0
    evs = agent.status()["evaluations"]
    assert len(evs) == 3 * 2
    for e in evs:
        assert set(e["tests"]) == {"tcal", "smce", "ldtc"}, e["tests"]
        assert all(isinstance(r["evaluated_at"], float) for r in e["tests"].values())
    assert agent.status()["agent"]["work"]["bound_rounds"] is not None
    text = agent.metrics.render().decode() + agent.metrics.render(["details", "reliability"]).decode()
    fams = {f.name: f.samples for f in text_string_to_metric_families(text)}
    ages = {(s.labels["model"], s.labels["window"], s.labels["test"]) for s in fams["calmon_test_age_seconds"]}
    assert len(ages) == 3 * 2 * 3 and all(s.value >= 0 for s in fams["calmon_test_age_seconds"])
    assert not fams.get("calmon_reliability_events")


def _needs_simulation(seeds: range) -> list[BucketStats]:
    """Windows on which T-Cal's screens do not decide (its Monte Carlo runs), and one they decide."""
    from calmon.testers import screen_tester
    out = []
    for seed in seeds:
        rng = np.random.default_rng(seed)
        p = rng.beta(2, 2, 500)
        z = 1 / (1 + np.exp(-(np.log(p) - np.log1p(-p)) / 0.9))  # slightly overconfident: near the boundary
        b = BucketStats(2, bins=1024, reservoir=64)
        b.update(z, None, (rng.uniform(size=500) < p).astype(np.int64))
        if screen_tester("tcal", b.stats.calibration_data(), mc=200, seed=0) is None:
            out.append(b)
    return out


def test_tcal_simulations_go_to_the_pool_and_give_the_inline_result():
    from calmon.config import EvaluationConfig, TesterConfig
    from calmon.evaluate.round import Evaluator, simulation_cost
    from calmon.state.agentstate import WindowSnapshot
    from calmon.testers import screen_tester
    open_ = _needs_simulation(range(12))[:3]
    assert open_, "no window left undecided by the screens"
    decided = window(2)
    assert screen_tester("tcal", decided.stats.calibration_data(), mc=200, seed=0) is not None
    buckets = [*open_, decided]
    snap = [WindowSnapshot(f"m{i}", "all", "1h", b, (1, 0.0)) for i, b in enumerate(buckets)]
    pool = TesterPool("thread", 2)
    try:
        ev = Evaluator(EvaluationConfig(tests=[TesterConfig("tcal")], mc=200, budget=120.0, min_events=10), pool=pool)
        res = ev.run(snap, {})
    finally:
        pool.close()
    assert not res.overrun and res.work["in_flight"] == 0 and res.work["ran"] == res.work["simulations"] == len(open_)
    assert simulation_cost("tcal") in res.work["costs"]  # the simulations' cost is kept apart from the screens'
    for e, b in zip(res.evaluations, buckets):
        got = {k: v for k, v in e["tests"]["tcal"].items() if k != "evaluated_at"}
        want = json.loads(json.dumps(run_tester("tcal", b.stats.calibration_data(), mc=200, seed=0).to_dict()))
        assert got == want  # bit for bit the inline call, whether screened or simulated in the pool
    assert sum(e["tests"]["tcal"].get("mc_draws", 0) > 0 for e in res.evaluations) == len(open_)
