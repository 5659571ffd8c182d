"""Prometheus metrics of the agent (names fixed by the metrics contract, see docs/agent.md).

The agent keeps its counters in its own (checkpointed) state, so a restart continues every
counter where the checkpoint left it instead of resetting it.  A custom collector reads a
consistent copy of that state and the latest evaluation snapshot at scrape time; only the
evaluation-latency histogram is a live prometheus-client object.  Everything lives in a
private :class:`prometheus_client.CollectorRegistry` (no process/platform collectors mixed in
unless asked).

Label cardinality is bounded upstream: models by ``limits.max_models`` (the decoder rejects
events of further models with reason ``too_many_models``), segments by the per-model
allow-list, windows and testers by the configuration, reliability bins by
``evaluation.reliability_bins``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from prometheus_client import CollectorRegistry, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.exposition import generate_latest

from calmon import __version__

#: Evaluation metrics exported per (model, segment, window): metric name -> key in ``evaluation["metrics"]``.
WINDOW_GAUGES: dict[str, tuple[str, str]] = {
    "calmon_ece": ("ece", "15-bin equal-width l1-ECE (Guo et al. 2017)"),
    "calmon_ece_l2_debiased": ("ece_l2_debiased",
                               "Debiased squared l2-ECE at the adaptive dyadic scale (T-Cal eq. 6)"),
    "calmon_smce": ("smce", "Smooth calibration error (Blasiok et al. 2023)"),
    "calmon_ldtc": ("ldtc", "Lower distance to calibration (Blasiok et al. 2023)"),
    "calmon_brier_score": ("brier", "Brier score"),
    "calmon_accuracy": ("accuracy", "Accuracy (binary: 0.5 threshold; multiclass: top-1)"),
    "calmon_mean_confidence": ("mean_confidence", "Mean score (binary) or mean top-label confidence"),
}
EVALUATION_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)


def _num(v: Any) -> float:
    if v is None:
        return math.nan
    try:
        return float(v)
    except (TypeError, ValueError):
        return math.nan


class AgentCollector:
    """Prometheus collector reading the agent state through ``state_fn`` at each scrape.

    Parameters
    ----------
    state_fn
        Returns a dict with the keys documented in :meth:`collect` (missing keys are skipped).

    Examples
    --------
    >>> from prometheus_client import CollectorRegistry, generate_latest
    >>> reg = CollectorRegistry(auto_describe=False)
    >>> reg.register(AgentCollector(lambda: {"events": {("m", "labeled"): 3}, "ready": True}))
    >>> text = generate_latest(reg).decode()
    >>> 'calmon_events_total{model="m",type="labeled"} 3.0' in text, "calmon_ready 1.0" in text
    (True, True)
    """

    def __init__(self, state_fn: Callable[[], Mapping[str, Any]]) -> None:
        self.state_fn = state_fn

    def describe(self) -> list[Metric]:
        return []

    def collect(self) -> Iterator[Metric]:
        st = self.state_fn()
        for part in (_process, _events, _join, _sources, _scheduler, _checkpoint):
            yield from part(st)
        yield from self._evaluations(st.get("evaluations", []))
        yield from _estimates(st.get("evaluations", []))
        yield from _alerts(st)
        yield from _calibrators(st)
        yield from _changes(st)

    @staticmethod
    def _evaluations(evaluations: list[dict[str, Any]]) -> Iterator[Metric]:
        lab = ["model", "segment", "window"]
        events = GaugeMetricFamily("calmon_window_events", "Labeled events in the window", labels=lab)
        gauges = {name: GaugeMetricFamily(name, doc, labels=lab) for name, (_, doc) in WINDOW_GAUGES.items()}
        rel = {k: GaugeMetricFamily(f"calmon_reliability_{k}", f"Reliability diagram: {k.replace('_', ' ')} per bin",
                                    labels=lab + ["bin"]) for k in ("mean_score", "mean_outcome", "events")}
        tl = lab + ["test"]
        t_stat = GaugeMetricFamily("calmon_test_statistic", "Tester statistic", labels=tl)
        t_p = GaugeMetricFamily("calmon_test_p_value", "Tester p-value (NaN when it has none)", labels=tl)
        t_rej = GaugeMetricFamily("calmon_test_rejected", "1 = miscalibrated", labels=tl)
        t_ins = GaugeMetricFamily("calmon_test_insufficient_data", "1 = the tester had too little data", labels=tl)
        for e in evaluations:
            key = [e["model"], e["segment"], e["window"]]
            events.add_metric(key, e.get("n", 0))
            metrics = e.get("metrics", {})
            for name, (field, _) in WINDOW_GAUGES.items():
                if field in metrics and metrics[field] is not None:
                    gauges[name].add_metric(key, _num(metrics[field]))
            for point in e.get("reliability", []):
                b = [f"{point['bin']:.2f}"]
                rel["events"].add_metric(key + b, point.get("events", 0))
                if point.get("events"):
                    rel["mean_score"].add_metric(key + b, _num(point.get("mean_score")))
                    rel["mean_outcome"].add_metric(key + b, _num(point.get("mean_outcome")))
            for test, r in sorted(e.get("tests", {}).items()):
                if not isinstance(r, dict) or "decision" not in r:
                    continue
                k = key + [test]
                t_stat.add_metric(k, _num(r.get("statistic")))
                t_p.add_metric(k, _num(r.get("p_value")))
                t_rej.add_metric(k, 1.0 if r.get("decision") == "miscalibrated" else 0.0)
                t_ins.add_metric(k, 1.0 if r.get("decision") == "insufficient data" else 0.0)
        yield events
        yield from gauges.values()
        yield from rel.values()
        yield from (t_stat, t_p, t_rej, t_ins)


# -- metric families, one function per part of the state -------------------------------------------------
State = Mapping[str, Any]


def _process(st: State) -> Iterator[Metric]:
    info = GaugeMetricFamily("calmon_build_info", "Build information", labels=["version"])
    info.add_metric([st.get("version", __version__)], 1.0)
    yield info
    ready = GaugeMetricFamily("calmon_ready", "1 when sources are connected and state is loaded")
    ready.add_metric([], 1.0 if st.get("ready") else 0.0)
    yield ready
    mem = GaugeMetricFamily("calmon_state_bytes", "Bytes held by the windowed statistics", labels=["model"])
    for model, n in sorted(st.get("state_bytes", {}).items()):
        mem.add_metric([model], n)
    yield mem


def _events(st: State) -> Iterator[Metric]:
    ev = CounterMetricFamily("calmon_events", "Accepted events by model and type", labels=["model", "type"])
    for (model, kind), n in sorted(st.get("events", {}).items()):
        ev.add_metric([model, kind], n)
    yield ev
    rej = CounterMetricFamily("calmon_events_rejected", "Rejected records by reason", labels=["reason"])
    for reason, n in sorted(st.get("rejected", {}).items()):
        rej.add_metric([reason], n)
    yield rej
    late = CounterMetricFamily("calmon_events_late", "Labeled events older than the allowed lateness (dropped)",
                               labels=["model"])
    for model, n in sorted(st.get("late", {}).items()):
        late.add_metric([model], n)
    yield late


def _join(st: State) -> Iterator[Metric]:
    join = st.get("join", {})
    for name, key, doc in (("calmon_join_joined", "joined", "Predictions joined with their outcome"),
                           ("calmon_join_expired", "expired", "Predictions whose outcome never came within the TTL"),
                           ("calmon_join_duplicate_ids", "duplicates", "Predictions with an id already pending")):
        fam = CounterMetricFamily(name, doc, labels=["model"])
        for model, n in sorted(join.get(key, {}).items()):
            fam.add_metric([model], n)
        yield fam
    orphan = CounterMetricFamily("calmon_join_orphan_outcomes", "Outcomes whose prediction is unknown or expired")
    orphan.add_metric([], join.get("orphans", 0))
    yield orphan
    pend = GaugeMetricFamily("calmon_join_pending", "Predictions waiting for an outcome", labels=["model"])
    for model, n in sorted(st.get("pending", {}).items()):
        pend.add_metric([model], n)
    yield pend


def _sources(st: State) -> Iterator[Metric]:
    src_total = CounterMetricFamily("calmon_source_records", "Records read per source", labels=["source"])
    lag = {"lag_seconds": GaugeMetricFamily("calmon_source_lag_seconds",
                                            "Now minus the event time of the newest record read", labels=["source"]),
           "lag_records": GaugeMetricFamily("calmon_source_lag_records", "Records not yet read (Kafka consumer lag)",
                                            labels=["source"]),
           "lag_bytes": GaugeMetricFamily("calmon_source_lag_bytes", "Bytes not yet read (file sources)",
                                          labels=["source"])}
    for name, s in sorted(st.get("sources", {}).items()):
        src_total.add_metric([name], s.get("records", 0))
        for key, fam in lag.items():
            if s.get(key) is not None:
                fam.add_metric([name], s[key])
    yield src_total
    yield from lag.values()


def _scheduler(st: State) -> Iterator[Metric]:
    sched = st.get("scheduler", {})
    total = CounterMetricFamily("calmon_evaluations", "Evaluation rounds completed")
    total.add_metric([], sched.get("evaluations", 0))
    over = CounterMetricFamily("calmon_evaluation_overruns", "Rounds that exceeded the time budget")
    over.add_metric([], sched.get("overruns", 0))
    last = GaugeMetricFamily("calmon_last_evaluation_timestamp_seconds", "End of the last evaluation round")
    if sched.get("last_timestamp") is not None:
        last.add_metric([], sched["last_timestamp"])
    yield from (total, over, last)


def _checkpoint(st: State) -> Iterator[Metric]:
    ck = st.get("checkpoint", {})
    ck_ts = GaugeMetricFamily("calmon_checkpoint_last_timestamp_seconds", "Time of the last checkpoint")
    ck_d = GaugeMetricFamily("calmon_checkpoint_duration_seconds", "Duration of the last checkpoint")
    if ck.get("last_timestamp") is not None:
        ck_ts.add_metric([], ck["last_timestamp"])
        ck_d.add_metric([], ck.get("duration", 0.0))
    yield from (ck_ts, ck_d)


def _alerts(st: State) -> Iterator[Metric]:
    alert = GaugeMetricFamily("calmon_alert_active", "1 while the alert is firing",
                              labels=["alert", "model", "segment", "window", "severity"])
    for a in st.get("alerts", []):
        alert.add_metric([a.get("alert", ""), a.get("model", ""), a.get("segment", ""), a.get("window", ""),
                          a.get("severity", "")], 1.0 if a.get("state") == "firing" else 0.0)
    yield alert


def _calibrators(st: State) -> Iterator[Metric]:
    cal_v = GaugeMetricFamily("calmon_calibrator_version", "Version of the published calibrator",
                              labels=["model", "method"])
    cal_e = GaugeMetricFamily("calmon_calibrator_error", "Calibration error before/after the calibrator",
                              labels=["model", "method", "stage", "metric"])
    for c in st.get("calibrators", []):
        cal_v.add_metric([c["model"], c["method"]], _num(c.get("version")))
        for stage in ("before", "after"):
            for metric, v in sorted((c.get(stage) or {}).items()):
                cal_e.add_metric([c["model"], c["method"], stage, metric], _num(v))
    yield from (cal_v, cal_e)


#: Label-free estimates exported per window: ``calmon_estimated_<metric>`` (+ ``_lower``/``_upper``).
ESTIMATED = ("accuracy", "precision", "recall", "base_rate", "brier", "log_loss", "roc_auc")


def _estimates(evaluations: list[dict[str, Any]]) -> Iterator[Metric]:
    lab = ["model", "segment", "window"]
    preds = GaugeMetricFamily("calmon_window_predictions", "Predictions in the window, with or without outcome",
                              labels=lab)
    est = {(m, b): GaugeMetricFamily(f"calmon_estimated_{m}{suffix}", f"Label-free estimate of {m.replace('_', ' ')}"
                                     f"{doc} (CBPE from the window's scores and the calibrator in service)", labels=lab)
           for m in ESTIMATED for b, suffix, doc in (("value", "", ""), ("lo", "_lower", ", interval lower bound"),
                                                     ("hi", "_upper", ", interval upper bound"))}
    err = GaugeMetricFamily("calmon_estimation_error", "Estimate minus realised metric on the predictions whose "
                            "outcomes have arrived", labels=lab + ["metric"])
    psi = GaugeMetricFamily("calmon_score_drift_psi", "Population stability index of the window's scores against "
                            "everything before it", labels=lab)
    p = GaugeMetricFamily("calmon_score_drift_p_value", "Chi-square test of an unchanged score distribution",
                          labels=lab)
    for e in evaluations:
        key = [e["model"], e["segment"], e["window"]]
        if "predictions" in e:
            preds.add_metric(key, e["predictions"])
        for m, bounds in (e.get("estimated") or {}).items():
            for b, v in bounds.items():
                if (m, b) in est:
                    est[(m, b)].add_metric(key, _num(v))
        for m, v in sorted((e.get("estimation_error") or {}).items()):
            err.add_metric(key + [m], _num(v))
        drift = e.get("score_drift")
        if drift:
            psi.add_metric(key, _num(drift.get("psi")))
            p.add_metric(key, _num(drift.get("p_value")))
    yield preds
    yield from est.values()
    yield from (err, psi, p)


def _changes(st: State) -> Iterator[Metric]:
    lab = ["model", "signal"]
    total = CounterMetricFamily("calmon_change_detected", "Calibration changes detected (Page-Hinkley on the "
                                "calibration residuals)", labels=lab)
    point = GaugeMetricFamily("calmon_change_point_timestamp_seconds",
                              "Event time where the last detected change most likely started", labels=lab)
    for model, view in sorted(st.get("changes", {}).items()):
        for signal, sig in sorted(view.get("signals", {}).items()):
            total.add_metric([model, signal], sig.get("detections", 0))
            last = sig.get("last")
            if last is not None:
                point.add_metric([model, signal], _num(last.get("change_point")))
    yield from (total, point)


class AgentMetrics:
    """The agent's private registry: the state collector plus the evaluation-latency histogram.

    Parameters
    ----------
    state_fn
        See :class:`AgentCollector`.

    Examples
    --------
    >>> m = AgentMetrics(lambda: {"scheduler": {"evaluations": 2}})
    >>> m.evaluation_duration.observe(0.3)
    >>> text = m.render().decode()
    >>> "calmon_evaluations_total 2.0" in text, "calmon_evaluation_duration_seconds_count 1.0" in text
    (True, True)
    """

    def __init__(self, state_fn: Callable[[], Mapping[str, Any]]) -> None:
        self.registry = CollectorRegistry(auto_describe=False)
        self.evaluation_duration = Histogram("calmon_evaluation_duration_seconds", "Duration of one evaluation round",
                                             buckets=EVALUATION_BUCKETS, registry=self.registry)
        self.collector = AgentCollector(state_fn)
        self.registry.register(self.collector)

    def render(self) -> bytes:
        """The Prometheus text exposition of every metric."""
        return generate_latest(self.registry)
