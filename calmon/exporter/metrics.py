"""Prometheus metrics of the agent (names fixed by the metrics contract, see docs/agent.md).

The agent keeps its counters in its own (checkpointed) state, so a restart continues every
counter where the checkpoint left it instead of resetting it.  ``/metrics`` has two parts:

* the **round part** (per-window gauges, tester results, estimates, reliability diagrams, alerts,
  calibrators, scheduler counters, state bytes) is rendered once per evaluation round from the
  published round (:meth:`AgentMetrics.prepare`, :mod:`calmon.exporter.rounds`, within a series
  budget) and served as cached bytes: a scrape neither takes the state lock for it nor re-renders it;
* the **live part** (event, join and source counters, lags, checkpoint, change detectors, the
  evaluation-latency histogram, test ages) is read at scrape time through ``state_fn``, a
  :class:`~calmon.exporter.views.LiveView` copied under the state lock in O(models + sources), and written
  straight to text by :func:`calmon.exporter.live.render_live` (the text :class:`AgentCollector` gives
  ``generate_latest``, at a seventh of the cost), with the cyclic collector paused.

Both parts are read from the typed views of :mod:`calmon.exporter.views`, by attribute.  A plain
``/metrics`` serves the live part and the round part's default tiers (headline gauges, tester p-values and
decisions); ``/metrics?collect[]=TIER`` serves the named tiers of the round part alone -- estimates, tester
details, reliability diagrams -- for a second, slower scrape job (see :mod:`calmon.exporter.rounds`).

Label cardinality is bounded upstream: models by ``limits.max_models`` (the decoder rejects
events of further models with reason ``too_many_models``), segments by the per-model
allow-list, windows and testers by the configuration, reliability bins by
``evaluation.reliability_bins``; and per model and in total by the series budget
(:class:`~calmon.exporter.rounds.SeriesBudget`).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence

from prometheus_client import CollectorRegistry, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.exposition import generate_latest
from prometheus_client.utils import floatToGoString

from calmon.exporter.live import render_live
from calmon.exporter.rounds import TIERS, WINDOW_GAUGES, RoundPart, RoundRenderer, SeriesBudget, as_number
from calmon.exporter.views import LiveView, RoundView
from calmon.formats.collection import collection_paused

__all__ = ["WINDOW_GAUGES", "AgentCollector", "AgentMetrics", "SeriesBudget"]

EVALUATION_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)


class AgentCollector:
    """Prometheus collector of the live part, reading the agent state through ``state_fn`` at each scrape.

    Parameters
    ----------
    state_fn
        Returns the live view (called at every scrape).

    Examples
    --------
    >>> from prometheus_client import CollectorRegistry, generate_latest
    >>> reg = CollectorRegistry(auto_describe=False)
    >>> reg.register(AgentCollector(lambda: LiveView(events={("m", "labeled"): 3}, ready=True)))
    >>> text = generate_latest(reg).decode()
    >>> 'calmon_events_total{model="m",type="labeled"} 3.0' in text, "calmon_ready 1.0" in text
    (True, True)
    """

    def __init__(self, state_fn: Callable[[], LiveView]) -> None:
        self.state_fn = state_fn
        #: Series left out by the budget: reason -> in the last round, and summed over rounds.
        self.dropped: dict[str, tuple[int, int]] = {}

    def describe(self) -> list[Metric]:
        return []

    def collect(self) -> Iterator[Metric]:
        st = self.state_fn()
        for part in (_process, _events, _join, _sources, _checkpoint, _changes):
            yield from part(st)
        yield from _series(self.dropped)

# -- metric families, one function per part of the live view ---------------------------------------------
def _process(st: LiveView) -> Iterator[Metric]:
    info = GaugeMetricFamily("calmon_build_info", "Build information", labels=["version"])
    info.add_metric([st.version], 1.0)
    yield info
    ready = GaugeMetricFamily("calmon_ready", "1 when sources are connected and state is loaded")
    ready.add_metric([], 1.0 if st.ready else 0.0)
    yield ready


def _events(st: LiveView) -> Iterator[Metric]:
    ev = CounterMetricFamily("calmon_events", "Accepted events by model and type", labels=["model", "type"])
    for (model, kind), n in sorted(st.events.items()):
        ev.add_metric([model, kind], n)
    yield ev
    rej = CounterMetricFamily("calmon_events_rejected", "Rejected records by reason", labels=["reason"])
    for reason, n in sorted(st.rejected.items()):
        rej.add_metric([reason], n)
    yield rej
    late = CounterMetricFamily("calmon_events_late", "Labeled events older than the allowed lateness (dropped)",
                               labels=["model"])
    for model, n in sorted(st.late.items()):
        late.add_metric([model], n)
    yield late


def _join(st: LiveView) -> Iterator[Metric]:
    join = st.join
    for name, counts, doc in (
            ("calmon_join_joined", join.get("joined", {}), "Predictions joined with their outcome"),
            ("calmon_join_expired", join.get("expired", {}), "Predictions whose outcome never came within the TTL"),
            ("calmon_join_duplicate_ids", join.get("duplicates", {}), "Predictions with an id already pending")):
        fam = CounterMetricFamily(name, doc, labels=["model"])
        for model, n in sorted(counts.items()):
            fam.add_metric([model], n)
        yield fam
    orphan = CounterMetricFamily("calmon_join_orphan_outcomes", "Outcomes whose prediction is unknown or expired")
    orphan.add_metric([], join.get("orphans", 0))
    yield orphan
    pend = GaugeMetricFamily("calmon_join_pending", "Predictions waiting for an outcome", labels=["model"])
    for model, n in sorted(st.pending.items()):
        pend.add_metric([model], n)
    yield pend
    late = CounterMetricFamily("calmon_join_late_outcomes", "Outcomes that arrived after their prediction expired "
                               "(estimated from a sample of the expired predictions)", labels=["model"])
    for model, n in sorted(join.get("late_outcomes", {}).items()):
        late.add_metric([model], n)
    yield late
    # one histogram per model, 13 bounds: labels stay the model alone (cardinality bounded by limits.max_models)
    delay = HistogramMetricFamily("calmon_label_delay_seconds", "Event-time delay from a prediction to its "
                                  "outcome, at the join (and of outcomes after their prediction expired)",
                                  labels=["model"])
    for model, h in sorted(st.delays.items()):
        buckets = [(floatToGoString(le), n) for le, n in h["buckets"]] + [("+Inf", h["count"])]
        delay.add_metric([model], buckets, h["sum"])
    yield delay


def _sources(st: LiveView) -> Iterator[Metric]:
    src_total = CounterMetricFamily("calmon_source_records", "Records read per source", labels=["source"])
    lag_s = GaugeMetricFamily("calmon_source_lag_seconds", "Now minus the event time of the newest record read",
                              labels=["source"])
    lag_r = GaugeMetricFamily("calmon_source_lag_records", "Records not yet read (Kafka consumer lag)",
                              labels=["source"])
    lag_b = GaugeMetricFamily("calmon_source_lag_bytes", "Bytes not yet read (file sources)", labels=["source"])
    for name, s in sorted(st.sources.items()):
        src_total.add_metric([name], s.get("records", 0))
        for fam, v in ((lag_s, s.get("lag_seconds")), (lag_r, s.get("lag_records")), (lag_b, s.get("lag_bytes"))):
            if v is not None:
                fam.add_metric([name], v)
    yield from (src_total, lag_s, lag_r, lag_b)


def _checkpoint(st: LiveView) -> Iterator[Metric]:
    ck = st.checkpoint
    ck_ts = GaugeMetricFamily("calmon_checkpoint_last_timestamp_seconds", "Time of the last checkpoint")
    ck_d = GaugeMetricFamily("calmon_checkpoint_duration_seconds", "Duration of the last checkpoint")
    last = ck.get("last_timestamp")
    if last is not None:
        ck_ts.add_metric([], last)
        duration = ck.get("duration")
        ck_d.add_metric([], 0.0 if duration is None else duration)
    yield from (ck_ts, ck_d)


def _changes(st: LiveView) -> Iterator[Metric]:
    lab = ["model", "signal"]
    total = CounterMetricFamily("calmon_change_detected", "Calibration changes detected (Page-Hinkley on the "
                                "calibration residuals)", labels=lab)
    point = GaugeMetricFamily("calmon_change_point_timestamp_seconds",
                              "Event time where the last detected change most likely started", labels=lab)
    for model, view in sorted(st.changes.items()):
        for signal, sig in sorted(view.get("signals", {}).items()):
            total.add_metric([model, signal], sig.get("detections", 0))
            last = sig.get("last")
            if last is not None:
                point.add_metric([model, signal], as_number(last.get("change_point")))
    yield from (total, point)


def _series(dropped: Mapping[str, tuple[int, int]]) -> Iterator[Metric]:
    last = GaugeMetricFamily("calmon_metrics_series_over_budget", "Per-window series left out of /metrics by the "
                             "series budget in the last round", labels=["reason"])
    total = CounterMetricFamily("calmon_metrics_series_dropped", "Per-window series left out of /metrics by the "
                                "series budget, summed over rounds", labels=["reason"])
    for reason, (n, acc) in sorted(dropped.items()):
        last.add_metric([reason], n)
        total.add_metric([reason], acc)
    yield last
    yield total


class AgentMetrics:
    """The agent's ``/metrics``: the cached round part, the live collector and the evaluation-latency histogram.

    Parameters
    ----------
    state_fn
        The live view (see :class:`AgentCollector`).  Until :meth:`prepare` is first called, the
        round part is that of an empty :class:`~calmon.exporter.views.RoundView`.
    budget
        Series budget of the round part.
    clock
        Wall clock for the test ages.

    Examples
    --------
    >>> m = AgentMetrics(lambda: LiveView(ready=True))
    >>> m.evaluation_duration.observe(0.3)
    >>> text = m.render().decode()
    >>> "calmon_evaluations_total 0.0" in text, "calmon_evaluation_duration_seconds_count 1.0" in text
    (True, True)
    >>> m.prepare(RoundView(scheduler={"evaluations": 3})); "calmon_evaluations_total 3.0" in m.render().decode()
    True
    """

    def __init__(self, state_fn: Callable[[], LiveView], budget: SeriesBudget | None = None,
                 clock: Callable[[], float] = time.time) -> None:
        #: the evaluation-latency histogram's registry (the live part is written by :func:`render_live`)
        self.registry = CollectorRegistry(auto_describe=False)
        self.evaluation_duration = Histogram("calmon_evaluation_duration_seconds", "Duration of one evaluation round",
                                             buckets=EVALUATION_BUCKETS, registry=self.registry)
        #: the live part's families as a ``prometheus_client`` collector (for a registry of one's own) and the
        #: series budget's counters; a scrape writes the same text by :func:`render_live`
        self.collector = AgentCollector(state_fn)
        self.budget = budget or SeriesBudget()
        self.clock = clock
        self._round: RoundPart | None = None
        self._lock = threading.Lock()
        #: keeps the windows whose evaluation the next round publishes again (:class:`RoundRenderer`)
        self._renderer = RoundRenderer(self.budget)
        self._building = threading.Lock()  # the scheduler prepares; a withdrawal (cluster) may too

    def prepare(self, view: RoundView) -> None:
        """Render the round part once (called by the scheduler after it publishes a round), re-rendering only
        the windows whose evaluation changed since the last call."""
        # paused: a collection falling due among the round's allocations would traverse the whole state
        with self._building, collection_paused():
            part = self._renderer.build(view)
        with self._lock:
            old = self.collector.dropped
            self.collector.dropped = {r: (n, old.get(r, (0, 0))[1] + n) for r, n in part.dropped.items()}
            self._round = part

    def render(self, collect: Sequence[str] | None = None) -> bytes:
        """The Prometheus text exposition: every live family and the round's default tiers, or (``collect``, the
        ``collect[]`` of ``/metrics?collect[]=...``) the named tiers of the round alone.

        Raises
        ------
        ValueError
            A name of ``collect`` is not a tier (:data:`calmon.exporter.rounds.TIERS`).
        """
        if collect is not None:
            unknown = sorted(set(collect) - set(TIERS))
            if unknown:
                raise ValueError(f"unknown collect[] {', '.join(unknown)}: one of {', '.join(TIERS)}")
        part = self._round
        if part is None:  # before the first round
            part = RoundPart.build(RoundView(), self.budget)
        if collect is not None:
            return part.render(collect, self.clock())
        # paused: a collection falling due among the scrape's allocations would traverse the agent's whole state
        # (seconds at a thousand models) on the request path; it runs after the scrape, as the round's does
        with collection_paused():
            live = render_live(self.collector.state_fn(), self.collector.dropped).encode()
            return generate_latest(self.registry) + live + part.render(None, self.clock())
