"""/metrics: the round part rendered once per round, the series budget, the test ages."""

from __future__ import annotations

import pytest
from prometheus_client.parser import text_string_to_metric_families

from calmon.config import build_config
from calmon.config.schema import ConfigError
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


def everything(m: AgentMetrics) -> bytes:
    """``/metrics`` and the tiers it leaves to ``/metrics?collect[]=...`` (the shipped Prometheus scrapes both)."""
    return m.render() + m.render([t for t in rounds.TIERS if t not in rounds.DEFAULT_COLLECT])


def parse(text: str) -> dict[str, list]:
    fams = {f.name: f.samples for f in text_string_to_metric_families(text)}
    assert text.count("# TYPE calmon_ece ") == 1  # every family once
    return fams


def test_round_part_is_rendered_once_per_round(monkeypatch):
    builds = []
    real = rounds.RoundRenderer.build
    monkeypatch.setattr(rounds.RoundRenderer, "build", lambda self, st: builds.append(1) or real(self, st))
    m = AgentMetrics(lambda: LiveView(ready=True), clock=lambda: 130.0)
    m.prepare(ROUND)
    first, second = m.render(), m.render()
    assert len(builds) == 1 and first == second
    fams = parse(everything(m).decode())
    assert len(fams["calmon_reliability_events"]) == 3 * 2 * 20 and fams["calmon_evaluations"][0].value == 4


def test_test_age_is_live_and_exported_per_window_and_test():
    now = [130.0]
    m = AgentMetrics(LiveView, clock=lambda: now[0])
    m.prepare(ROUND)
    ages = {(s.labels["model"], s.labels["window"], s.labels["test"]): s.value
            for s in parse(everything(m).decode())["calmon_test_age_seconds"]}
    assert ages[("a", "1h", "tcal")] == 30.0 and ages[("c", "24h", "smce")] == 80.0 and len(ages) == 12
    now[0] = 200.0
    assert 'test="tcal",window="1h"} 100.0' in m.render(["details"]).decode()


def test_per_model_cap_drops_the_lowest_tier_and_counts_it():
    m = AgentMetrics(LiveView, SeriesBudget(max_series_per_model=100), clock=lambda: 130.0)
    m.prepare(ROUND)
    m.prepare(ROUND)
    fams = parse(everything(m).decode())
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
    fams = parse(everything(m).decode())
    # core (6 windows x 3 = 18), p-values (12) and rejected (12) fit in 50; the statistics (12) would not: they
    # and every family after them are dropped for a, b and c alike
    assert len(fams["calmon_ece"]) == 6
    assert {s.labels["model"] for s in fams["calmon_test_p_value"]} == {"a", "b", "c"}
    assert len(fams["calmon_test_rejected"]) == 12
    assert not fams.get("calmon_test_age_seconds") and not fams.get("calmon_test_statistic")
    assert {s.labels["reason"]: s.value for s in fams["calmon_metrics_series_over_budget"]}["total_cap"] == 36 + 360


def test_reliability_selection_and_config():
    m = AgentMetrics(LiveView, SeriesBudget(reliability="24h"))
    m.prepare(ROUND)
    fams = parse(everything(m).decode())
    assert {s.labels["window"] for s in fams["calmon_reliability_events"]} == {"24h"}
    m = AgentMetrics(LiveView, SeriesBudget(reliability="none"))
    m.prepare(ROUND)
    assert not parse(everything(m).decode()).get("calmon_reliability_events")
    cfg = build_config({"sources": [{"path": "x"}], "exporter": {"reliability": "none", "max_series": 1000}}, env={})
    assert cfg.exporter.reliability == "none" and cfg.exporter.max_series == 1000


# -- the per-window budget (#35.1) -------------------------------------------------------------------------
def default_budget(cfg) -> SeriesBudget:
    """The budget the agent builds from its configuration (calmon/agent/runtime.py)."""
    ex = cfg.exporter
    return SeriesBudget(ex.reliability_windows(cfg.windows), ex.max_series_per_model, ex.max_series,
                        ex.max_series_per_window, ex.estimates)


def full_evaluation(model: str, segment: str, window: str, testers: list[str]) -> dict:
    """A window with everything a round can give: every metric, tester, estimate, error, drift and a diagram."""
    est = {m: {"value": 0.5, "lo": 0.4, "hi": 0.6} for m in rounds.ESTIMATED}
    return {**evaluation(model, window), "segment": segment, "predictions": 900,
            "metrics": {fld: 0.1 for fld, _ in rounds.WINDOW_GAUGES.values()},
            "tests": {t: {"statistic": 0.1, "p_value": 0.4, "decision": "calibrated", "evaluated_at": 100.0}
                      for t in testers},
            "estimated": est, "estimation_error": {m: 0.01 for m in rounds.ESTIMATED},
            "score_drift": {"psi": 0.01, "p_value": 0.5}}


def per_window(fams: dict[str, list]) -> dict[tuple[str, str, str], dict[str, int]]:
    """(model, segment, window) -> family -> series."""
    out: dict[tuple[str, str, str], dict[str, int]] = {}
    for name, samples in fams.items():
        for s in samples:
            if {"model", "segment", "window"} <= set(s.labels):
                fam = out.setdefault((s.labels["model"], s.labels["segment"], s.labels["window"]), {})
                fam[name] = fam.get(name, 0) + 1
    return out


def test_default_configuration_keeps_at_most_40_series_per_window_and_drops_nothing():
    cfg = build_config({"sources": [{"path": "x"}]}, env={})
    testers = [t.name for t in cfg.evaluation.tests]
    assert len(testers) >= 3  # every default tester, estimates on
    windows = cfg.windows.names
    view = RoundView(evaluations=[full_evaluation(m, s, w, testers) for m in ("a", "b") for s in ("all", "web")
                                  for w in windows],
                     alerts=[{"alert": "CalibrationDrift", "model": "a", "segment": "all", "window": w,
                              "severity": "critical", "state": "firing"} for w in windows])
    m = AgentMetrics(LiveView, default_budget(cfg), clock=lambda: 130.0)
    m.prepare(view)
    fams = parse(everything(m).decode())
    counts = per_window(fams)
    assert len(counts) == 2 * 2 * len(windows)
    longest = "all"
    for (_, _, window), fam in counts.items():
        diagram = sum(n for name, n in fam.items() if name.startswith("calmon_reliability_"))
        assert sum(fam.values()) - diagram <= 40, (window, fam)
        # the diagram: only for the longest window (and in full: 3 x 20 bins)
        assert diagram == (60 if window == longest else 0), (window, diagram)
        # what a dashboard needs is all there: every tester's five series, the headline estimates
        assert fam["calmon_test_p_value"] == fam["calmon_test_age_seconds"] == len(testers)
        assert fam["calmon_estimated_accuracy_lower"] == fam["calmon_estimated_brier"] == 1
        assert "calmon_estimated_brier_lower" not in fam
    dropped = {s.labels["reason"]: s.value for s in fams["calmon_metrics_series_over_budget"]}
    assert dropped == {"window_cap": 0, "model_cap": 0, "total_cap": 0}


def test_window_cap_keeps_tiers_in_order_and_counts_what_it_drops():
    # a window: core 3 (events, ece, brier), tests 2 x 2, estimates 2 (score drift), details 2 x 3
    evs = [{**evaluation(m, w), "score_drift": {"psi": 0.1, "p_value": 0.2}} for m in ("a", "b", "c")
           for w in ("1h", "24h")]
    m = AgentMetrics(LiveView, SeriesBudget(max_series_per_window=5, reliability="none"), clock=lambda: 130.0)
    m.prepare(RoundView(evaluations=evs))
    m.prepare(RoundView(evaluations=evs))
    fams = parse(everything(m).decode())
    assert len(fams["calmon_ece"]) == 6 and len(fams["calmon_window_events"]) == 6
    # the tests do not fit (3 + 4 > 5); the drift (2) would, but a tier never jumps one dropped before it
    assert not fams.get("calmon_test_p_value") and not fams.get("calmon_test_age_seconds")
    assert not fams.get("calmon_score_drift_psi")
    last = {s.labels["reason"]: s.value for s in fams["calmon_metrics_series_over_budget"]}
    total = {s.labels["reason"]: s.value for s in fams["calmon_metrics_series_dropped"]}
    assert last["window_cap"] == 6 * 12 and total["window_cap"] == 2 * 6 * 12
    # room for the tests and the drift: the details are dropped alone
    m = AgentMetrics(LiveView, SeriesBudget(max_series_per_window=10, reliability="none"), clock=lambda: 130.0)
    m.prepare(RoundView(evaluations=evs))
    fams = parse(everything(m).decode())
    assert len(fams["calmon_test_p_value"]) == 12 and len(fams["calmon_score_drift_psi"]) == 6
    assert not fams.get("calmon_test_age_seconds") and not fams.get("calmon_test_statistic")
    assert {s.labels["reason"]: s.value for s in fams["calmon_metrics_series_over_budget"]}["window_cap"] == 6 * 6


def test_estimates_headline_full_and_none():
    ev = full_evaluation("a", "all", "1h", ["tcal"])

    def names(estimates: str) -> set[str]:
        m = AgentMetrics(LiveView, SeriesBudget(estimates=estimates))
        m.prepare(RoundView(evaluations=[ev]))
        return {n for n, samples in parse(everything(m).decode()).items() if samples}

    headline, full, none = names("headline"), names("full"), names("none")
    point = {f"calmon_estimated_{m}" for m in rounds.ESTIMATED}
    assert point <= headline and point <= full and not point & none
    assert {"calmon_estimated_accuracy_lower", "calmon_estimated_accuracy_upper"} <= headline
    assert "calmon_estimated_roc_auc_upper" not in headline and "calmon_estimated_roc_auc_upper" in full
    m = AgentMetrics(LiveView, SeriesBudget(estimates="headline"))
    m.prepare(RoundView(evaluations=[ev]))
    errors = parse(everything(m).decode())["calmon_estimation_error"]
    assert [s.labels["metric"] for s in errors] == ["accuracy"]


def test_exporter_configuration_defaults_and_errors():
    cfg = build_config({"sources": [{"path": "x"}]}, env={})
    ex = cfg.exporter
    assert (ex.reliability, ex.max_series_per_window, ex.estimates) == ("longest", 40, "headline")
    assert ex.reliability_windows(cfg.windows) == ("all",)  # the window "all", not every window
    cfg = build_config({"sources": [{"path": "x"}], "windows": {"names": ["1h", "7d", "24h"]}}, env={})
    assert cfg.exporter.reliability_windows(cfg.windows) == ("7d",)
    for key, value in (("estimates", "some"), ("max_series_per_window", 0)):
        with pytest.raises(ConfigError, match=f"exporter.{key}"):
            build_config({"sources": [{"path": "x"}], "exporter": {key: value}}, env={})
    with pytest.raises(ValueError, match="estimates"):
        SeriesBudget(estimates="some")


def test_agent_exports_the_longest_windows_diagram_and_serves_every_diagram_in_status(tmp_path):
    """``calmon run`` with the default exporter: /metrics has the bins of the longest window only, /api/status has
    every window's diagram in full, and nothing is over budget."""
    import json

    import numpy as np

    from calmon.agent.runtime import Agent

    rng = np.random.default_rng(0)
    lines = [json.dumps({"model": f"m{i % 2}", "ts": 1767225600 + i, "score": (z := float(rng.uniform())),
                         "label": int(rng.uniform() < z)}) for i in range(2000)]
    (tmp_path / "ev.jsonl").write_text("\n".join(lines) + "\n")
    cfg = build_config({"state_dir": str(tmp_path / "state"), "sources": [{"path": str(tmp_path / "ev.jsonl")}],
                        "exporter": {"enabled": False}, "windows": {"names": ["1h", "24h"]},
                        "evaluation": {"mc": 20, "min_events": 50, "pool": "inline", "tests": [{"name": "tcal"}]},
                        "ingest": {"exit_when_done": True}}, env={})
    agent = Agent(cfg)
    assert agent.run() == 0
    evs = agent.status()["evaluations"]
    assert {e["window"] for e in evs} == {"1h", "24h"}
    assert all(len(e["reliability"]) == cfg.evaluation.reliability_bins for e in evs)
    fams = parse(everything(agent.metrics).decode())
    assert {s.labels["window"] for s in fams["calmon_reliability_events"]} == {"24h"}
    assert len(fams["calmon_reliability_events"]) == 2 * cfg.evaluation.reliability_bins  # 2 models, segment all
    assert {s.labels["window"] for s in fams["calmon_ece"]} == {"1h", "24h"}
    assert all(s.value == 0 for s in fams["calmon_metrics_series_over_budget"])


# -- /metrics and its detail (#35.1, second round: the 4 MB goal) ------------------------------------------
def realistic_evaluation(rng, model: str, segment: str, window: str, testers: list[str]) -> dict:
    """A window as the agent publishes it, with full-precision values (``repr`` of a float: ~19 characters)."""
    f = lambda: float(rng.uniform(0.001, 0.999))  # noqa: E731
    return {"model": model, "segment": segment, "window": window, "n": int(rng.integers(1000, 99999)),
            "predictions": int(rng.integers(1000, 99999)),
            "metrics": {fld: f() for fld, _ in rounds.WINDOW_GAUGES.values()},
            "reliability": [{"bin": b / 20, "events": int(rng.integers(1, 999)), "mean_score": f(),
                             "mean_outcome": f()} for b in range(20)],
            "tests": {t: {"statistic": f(), "p_value": f(), "decision": "calibrated", "evaluated_at": 1.7e9 + f()}
                      for t in testers},
            "estimated": {m: {"value": f(), "lo": f(), "hi": f()} for m in rounds.ESTIMATED},
            "estimation_error": {m: f() for m in rounds.ESTIMATED}, "score_drift": {"psi": f(), "p_value": f()}}


def test_default_metrics_at_200_models_x_3_rings_fit_4_mb_and_the_detail_is_collected_apart():
    """Issue #35's goal: /metrics <= 4 MB at 200 models x 3 rings x the default windows and testers, full-precision
    values (it was 10.3 MB with short values before: every tier and the longest window's diagrams in one payload).
    Nothing is lost: the tiers /metrics leaves out are served by /metrics?collect[]=..., each family in one place."""
    import numpy as np

    cfg = build_config({"sources": [{"path": "x"}]}, env={})
    testers = [t.name for t in cfg.evaluation.tests]
    rng = np.random.default_rng(0)
    evs = [realistic_evaluation(rng, f"model-{i:04d}", s, w, testers) for i in range(200)
           for s in ("all", "web", "app") for w in cfg.windows.names]
    live = LiveView(ready=True, events={(f"model-{i:04d}", k): 12345 for i in range(200)
                                        for k in ("prediction", "outcome")},
                    join={"joined": {f"model-{i:04d}": 1234 for i in range(200)}},
                    pending={f"model-{i:04d}": 12 for i in range(200)},
                    delays={f"model-{i:04d}": {"buckets": [(2.0 ** k, 5 * k) for k in range(13)], "count": 70,
                                               "sum": 1234.5} for i in range(200)})
    m = AgentMetrics(lambda: live, default_budget(cfg), clock=lambda: 1.7e9 + 60)
    m.prepare(RoundView(evaluations=evs, state_bytes={f"model-{i:04d}": 1 for i in range(200)}))
    plain = m.render()
    assert len(plain) <= 4e6, f"/metrics is {len(plain) / 1e6:.2f} MB"
    fams = parse(plain.decode())
    windows = 200 * 3 * len(cfg.windows.names)
    # what the dashboard's time series and the alert rules read is in the plain scrape, for every window
    for name in ("calmon_ece", "calmon_smce", "calmon_window_events", "calmon_ece_l2_debiased"):
        assert len(fams[name]) == windows, name
    assert len(fams["calmon_test_p_value"]) == len(fams["calmon_test_rejected"]) == windows * len(testers)
    assert not fams.get("calmon_reliability_events") and not fams.get("calmon_test_statistic")
    detail = m.render(["estimates", "details", "reliability"])
    dfams = {f.name: f.samples for f in text_string_to_metric_families(detail.decode())}
    assert len(dfams["calmon_test_statistic"]) == len(dfams["calmon_test_age_seconds"]) == windows * len(testers)
    assert len(dfams["calmon_reliability_events"]) == 200 * 3 * 20  # the longest window's diagrams
    assert len(dfams["calmon_estimated_accuracy"]) == windows
    assert not {n for n, s in fams.items() if s} & {n for n, s in dfams.items() if s}  # each family in one place
    assert b"calmon_ready" not in detail  # the live part is the plain scrape's


def test_collect_and_gzip_over_http():
    """``/metrics?collect[]=TIER`` serves the named tiers, an unknown one is a 400 naming the valid ones, and a
    scraper sending ``Accept-Encoding: gzip`` (Prometheus does) gets the same body gzipped."""
    import gzip
    import urllib.error
    import urllib.request

    from calmon.exporter.http import Endpoints, HTTPExporter

    m = AgentMetrics(lambda: LiveView(ready=True), clock=lambda: 130.0)
    m.prepare(ROUND)
    srv = HTTPExporter(Endpoints(m.render, lambda: True, lambda: True, lambda: {}, lambda s: "",
                                 metrics_collect=m.render), port=0).start()
    try:
        def get(path: str, **headers: str) -> tuple[int, dict, bytes]:
            req = urllib.request.Request(srv.url + path, headers=headers)
            try:
                with urllib.request.urlopen(req, timeout=30) as r:
                    return r.status, dict(r.headers), r.read()
            except urllib.error.HTTPError as e:
                return e.code, dict(e.headers), e.read()

        code, _, plain = get("/metrics")
        assert code == 200 and b"calmon_ready 1.0" in plain and b"calmon_reliability_events{" not in plain
        code, _, rel = get("/metrics?collect[]=reliability")
        assert code == 200 and rel.count(b"calmon_reliability_events{") == 3 * 2 * 20 and b"calmon_ready" not in rel
        code, _, two = get("/metrics?collect[]=details&collect[]=reliability")
        assert b"calmon_test_statistic{" in two and b"calmon_reliability_events{" in two
        code, _, err = get("/metrics?collect[]=bogus")
        assert code == 400 and b"bogus" in err and b"reliability" in err
        code, headers, body = get("/metrics", **{"Accept-Encoding": "gzip"})
        assert code == 200 and headers.get("Content-Encoding") == "gzip"
        assert gzip.decompress(body) == plain and len(body) < len(plain)
        code, headers, _ = get("/metrics", **{"Accept-Encoding": "gzip;q=0"})
        assert "Content-Encoding" not in headers
    finally:
        srv.stop()
