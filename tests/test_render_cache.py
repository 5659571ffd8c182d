"""The round part of /metrics rendered with the per-window cache equals a full render, byte for byte (#35.3)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from test_publish_fast import _evaluation

from calmon.exporter import rounds
from calmon.exporter.metrics import AgentMetrics
from calmon.exporter.rounds import RoundPart, RoundRenderer, SeriesBudget
from calmon.exporter.views import LiveView, RoundView

BUDGETS = [SeriesBudget(), SeriesBudget(reliability="none", estimates="headline", max_series_per_window=20),
           SeriesBudget(reliability="1h, 7d", max_series_per_window=9), SeriesBudget(max_series_per_model=60),
           SeriesBudget(max_series_per_model=200, max_series=500), SeriesBudget(max_series=40)]


def _changed(rng: np.random.Generator, ev: dict[str, Any], pool: list[dict[str, Any]]) -> dict[str, Any]:
    """A new evaluation object for the same window: new figures, tests, estimates or a whole other window's."""
    kind = int(rng.integers(4))
    if kind == 0:
        metrics = {**ev.get("metrics", {}), "ece": float(rng.random())}
        return {**ev, "n": int(rng.integers(0, 10_000)), "metrics": metrics}
    if kind == 1:
        tests = {k: ({**v, "p_value": float(rng.random()), "evaluated_at": 1e9 + float(rng.integers(100))}
                     if isinstance(v, dict) else v) for k, v in ev.get("tests", {}).items()}
        return {**ev, "tests": tests}
    if kind == 2:
        return {**ev, "estimated": {"accuracy": {"value": float(rng.random()), "lo": 0.0, "hi": 1.0}}}
    other = pool[int(rng.integers(len(pool)))]
    return {**other, "model": ev["model"], "segment": ev["segment"], "window": ev["window"]}


def _next_round(rng: np.random.Generator, evs: list[dict[str, Any]], pool: list[dict[str, Any]]) -> list[Any]:
    """The next round's evaluations: most republished as the same objects, some changed, dropped or added."""
    out: list[Any] = []
    for ev in evs:
        u = rng.random()
        if u < 0.1:
            continue  # the window is gone (an evicted model)
        out.append(_changed(rng, ev, pool) if u < 0.4 else ev)
    for _ in range(int(rng.integers(0, 4))):  # new windows, of known models or a new one
        new = dict(pool[int(rng.integers(len(pool)))])
        new["model"] = f"new{int(rng.integers(3))}" if rng.random() < 0.5 else new["model"]
        out.insert(int(rng.integers(len(out) + 1)), new)
    if rng.random() < 0.2:  # the order of the snapshot changed
        rng.shuffle(out)
    return out


def _same(a: RoundPart, b: RoundPart) -> None:
    assert a.fixed == b.fixed
    assert dict(a.tiers) == dict(b.tiers)
    assert a.age_labels == b.age_labels and dict(a.dropped) == dict(b.dropped) and a.series == b.series


@pytest.fixture(scope="module")
def pool() -> list[dict[str, Any]]:
    rng = np.random.default_rng(35)
    return [_evaluation(rng, i) for i in range(16)]


@pytest.mark.parametrize("budget", BUDGETS, ids=range(len(BUDGETS)))
def test_cached_rounds_equal_full_renders(pool: list[dict[str, Any]], budget: SeriesBudget) -> None:
    rng = np.random.default_rng(7)
    renderer = RoundRenderer(budget)
    evs: list[Any] = list(pool)
    for _ in range(12):
        view = RoundView(evaluations=evs, state_bytes={"m0": 1}, scheduler={"evaluations": 1})
        before = {id(e) for e in renderer._windows.values() for e in [e.evaluation]}
        _same(renderer.build(view), RoundPart.build(view, budget))
        # only the windows whose evaluation is a new object were rendered again
        assert renderer.rendered == sum(1 for e in evs if id(e) not in before)
        evs = _next_round(rng, evs, pool)


def test_agent_metrics_render_equals_a_fresh_exporter(pool: list[dict[str, Any]]) -> None:
    rng = np.random.default_rng(3)
    budget = SeriesBudget(reliability="24h", max_series_per_window=30, estimates="headline")
    kept = AgentMetrics(lambda: LiveView(ready=True), budget, clock=lambda: 2e9)
    evs: list[Any] = list(pool)
    for _ in range(5):
        kept.prepare(RoundView(evaluations=evs))
        fresh = AgentMetrics(lambda: LiveView(ready=True), budget, clock=lambda: 2e9)
        fresh.prepare(RoundView(evaluations=evs))
        for collect in (list(rounds.DEFAULT_COLLECT), list(rounds.TIERS)):  # (the live part counts drops over rounds)
            assert kept.render(collect) == fresh.render(collect)
        evs = _next_round(rng, evs, pool)
