"""/metrics: the round part rendered once per round, the series budget, the test ages."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

from calmon.config import build_config
from calmon.exporter import rounds
from calmon.exporter.metrics import AgentMetrics, SeriesBudget
from calmon.exporter.views import LiveView, RoundView


def evaluation(model: str, window: str, at: float = 100.0) -> dict:
    return {"model": model, "segment": "all", "window": window, "n": 500,
            "metrics": {"ece": 0.02, "brier": 0.2},
            "reliability": [{"bin": b / 20, "events": 3, "mean_score": b / 20, "mean_outcome": b / 20}
                            for b in range(20)],
            "tests": {"tcal": {"statistic": 0.1, "p_value": 0.4, "decision": "calibrated", "evaluated_at": at},
                      "smce": {"statistic": 0.1, "p_value": 0.3, "decision": "calibrated", "evaluated_at": at - 50}}}


ROUND = RoundView(scheduler={"evaluations": 4}, evaluations=[evaluation(m, w) for m in ("a", "b", "c")
                                                             for w in ("1h", "24h")])


def parse(text: str) -> dict[str, list]:
    fams = {f.name: f.samples for f in text_string_to_metric_families(text)}
    assert text.count("# TYPE calmon_ece ") == 1  # every family once
    return fams


def test_round_part_is_rendered_once_per_round(monkeypatch):
    builds = []
    real = rounds.RoundPart.build
    monkeypatch.setattr(rounds.RoundPart, "build", classmethod(lambda cls, st, b: builds.append(1) or real(st, b)))
    m = AgentMetrics(lambda: LiveView(ready=True), clock=lambda: 130.0)
    m.prepare(ROUND)
    first, second = m.render(), m.render()
    assert len(builds) == 1 and first == second
    fams = parse(first.decode())
    assert len(fams["calmon_reliability_events"]) == 3 * 2 * 20 and fams["calmon_evaluations"][0].value == 4


def test_test_age_is_live_and_exported_per_window_and_test():
    now = [130.0]
    m = AgentMetrics(LiveView, clock=lambda: now[0])
    m.prepare(ROUND)
    ages = {(s.labels["model"], s.labels["window"], s.labels["test"]): s.value
            for s in parse(m.render().decode())["calmon_test_age_seconds"]}
    assert ages[("a", "1h", "tcal")] == 30.0 and ages[("c", "24h", "smce")] == 80.0 and len(ages) == 12
    now[0] = 200.0
    assert "calmon_test_age_seconds{" in m.render().decode() and 'test="tcal",window="1h"} 100.0' in m.render().decode()


def test_per_model_cap_drops_the_lowest_tier_and_counts_it():
    m = AgentMetrics(LiveView, SeriesBudget(max_series_per_model=100), clock=lambda: 130.0)
    m.prepare(ROUND)
    m.prepare(ROUND)
    fams = parse(m.render().decode())
    assert "calmon_reliability_events" not in fams or not fams["calmon_reliability_events"]
    assert len(fams["calmon_test_p_value"]) == 12 and len(fams["calmon_ece"]) == 6
    dropped = {s.labels["reason"]: s.value for s in fams["calmon_metrics_series_over_budget"]}
    per_round = 3 * 2 * 60
    assert dropped["model_cap"] == per_round
    total = {s.labels["reason"]: s.value for s in fams["calmon_metrics_series_dropped"]}
    assert total["model_cap"] == 2 * per_round


def test_total_cap_drops_families_for_every_model_alike():
    m = AgentMetrics(LiveView, SeriesBudget(max_series=50), clock=lambda: 130.0)
    m.prepare(ROUND)
    fams = parse(m.render().decode())
    # core (6 windows x 3 = 18), p-values (12) and ages (12) fit in 50; rejected (12) would not: it and every
    # family after it are dropped for a, b and c alike
    assert len(fams["calmon_ece"]) == 6
    assert {s.labels["model"] for s in fams["calmon_test_p_value"]} == {"a", "b", "c"}
    assert len(fams["calmon_test_age_seconds"]) == 12
    assert not fams.get("calmon_test_rejected") and not fams.get("calmon_test_statistic")
    assert {s.labels["reason"]: s.value for s in fams["calmon_metrics_series_over_budget"]}["total_cap"] == 36 + 360


def test_reliability_selection_and_config():
    m = AgentMetrics(LiveView, SeriesBudget(reliability="24h"))
    m.prepare(ROUND)
    fams = parse(m.render().decode())
    assert {s.labels["window"] for s in fams["calmon_reliability_events"]} == {"24h"}
    m = AgentMetrics(LiveView, SeriesBudget(reliability="none"))
    m.prepare(ROUND)
    assert not parse(m.render().decode()).get("calmon_reliability_events")
    cfg = build_config({"sources": [{"path": "x"}], "exporter": {"reliability": "none", "max_series": 1000}}, env={})
    assert cfg.exporter.reliability == "none" and cfg.exporter.max_series == 1000
