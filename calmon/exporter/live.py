"""The live part of ``/metrics`` written straight to text: the bytes ``prometheus_client`` writes, at a tenth of
the cost.

The live part (event, join and source counters, label delays, checkpoint, change detectors, the series budget's
counters) is the one part of ``/metrics`` read at scrape time, so its cost is paid by every scrape while the
agent's other threads hold the GIL.  :class:`calmon.exporter.metrics.AgentCollector` builds it as
``prometheus_client`` metric families -- a ``Sample`` and a label dict per series, then ``generate_latest``
formats each -- which took ~110 ms at 200 models (~6,000 series, half of them the label-delay histograms' buckets)
and, with the scheduler and the ingestion thread busy, several times that.  :func:`render_live` writes the
same text (family order, label order, number formatting and escaping of ``generate_latest``; the test suite checks
the two byte for byte) with one formatted line per series, and :class:`AgentCollector` stays as the
``prometheus_client`` collector of the same families, for a registry of a user's own.

Examples
--------
>>> text = render_live(LiveView(events={("m", "labeled"): 3}, ready=True), {})
>>> 'calmon_events_total{model="m",type="labeled"} 3.0' in text, "calmon_ready 1.0" in text
(True, True)
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from prometheus_client.utils import floatToGoString

from calmon.exporter.rounds import _esc, _fmt, as_number
from calmon.exporter.views import LiveView

__all__ = ["render_live"]


def _num(v: object) -> str:
    """``_fmt`` with the counters' case inlined: an int below 1e6 is written ``repr(float(v))``, i.e. ``f"{v}.0"``."""
    if type(v) is int and -1_000_000 < v < 1_000_000:
        return f"{v}.0"
    return _fmt(v)


def _head(name: str, doc: str, kind: str) -> str:
    return f"# HELP {name} {doc}\n# TYPE {name} {kind}\n"


def _by_model(name: str, doc: str, kind: str, values: Mapping[str, float]) -> str:
    """One family with the label ``model``, one series per model (sorted, as the collector adds them)."""
    out = [_head(name, doc, kind)]
    out += [f'{name}{{model="{_esc(m)}"}} {_num(v)}\n' for m, v in sorted(values.items())]
    return "".join(out)


def _plain(name: str, doc: str, kind: str, value: float | None) -> str:
    return _head(name, doc, kind) + ("" if value is None else f"{name} {_num(value)}\n")


def _events(st: LiveView) -> Iterable[str]:
    yield _head("calmon_events_total", "Accepted events by model and type", "counter")
    yield "".join(f'calmon_events_total{{model="{_esc(m)}",type="{_esc(k)}"}} {_num(n)}\n'
                  for (m, k), n in sorted(st.events.items()))
    yield _head("calmon_events_rejected_total", "Rejected records by reason", "counter")
    yield "".join(f'calmon_events_rejected_total{{reason="{_esc(r)}"}} {_num(n)}\n'
                  for r, n in sorted(st.rejected.items()))
    yield _by_model("calmon_events_late_total", "Labeled events older than the allowed lateness (dropped)", "counter",
                    st.late)


def _join(st: LiveView) -> Iterable[str]:
    join = st.join
    yield _by_model("calmon_join_joined_total", "Predictions joined with their outcome", "counter",
                    join.get("joined", {}))
    yield _by_model("calmon_join_expired_total", "Predictions whose outcome never came within the TTL", "counter",
                    join.get("expired", {}))
    yield _by_model("calmon_join_duplicate_ids_total", "Predictions with an id already pending", "counter",
                    join.get("duplicates", {}))
    yield _plain("calmon_join_orphan_outcomes_total", "Outcomes whose prediction is unknown or expired", "counter",
                 join.get("orphans", 0))
    yield _by_model("calmon_join_pending", "Predictions waiting for an outcome", "gauge", st.pending)
    yield _by_model("calmon_join_late_outcomes_total", "Outcomes that arrived after their prediction expired "
                    "(estimated from a sample of the expired predictions)", "counter", join.get("late_outcomes", {}))
    name = "calmon_label_delay_seconds"
    yield _head(name, "Event-time delay from a prediction to its outcome, at the join (and of outcomes after "
                "their prediction expired)", "histogram")
    out = []
    les: dict[float, str] = {}  # every model has the same bounds: format each once
    for model, h in sorted(st.delays.items()):
        m = _esc(model)
        for le, n in h["buckets"]:
            bound = les.get(le)
            if bound is None:
                bound = les[le] = floatToGoString(le)
            out.append(f'{name}_bucket{{le="{bound}",model="{m}"}} {_num(n)}\n')
        out.append(f'{name}_bucket{{le="+Inf",model="{m}"}} {_num(h["count"])}\n')
        out.append(f'{name}_count{{model="{m}"}} {_num(h["count"])}\n')
        out.append(f'{name}_sum{{model="{m}"}} {_num(h["sum"])}\n')
    yield "".join(out)


def _sources(st: LiveView) -> Iterable[str]:
    fams = (("calmon_source_records_total", "Records read per source", "counter", "records"),
            ("calmon_source_lag_seconds", "Now minus the event time of the newest record read", "gauge",
             "lag_seconds"),
            ("calmon_source_lag_records", "Records not yet read (Kafka consumer lag)", "gauge", "lag_records"),
            ("calmon_source_lag_bytes", "Bytes not yet read (file sources)", "gauge", "lag_bytes"))
    for name, doc, kind, key in fams:
        yield _head(name, doc, kind)
        for src, s in sorted(st.sources.items()):
            v = s.get(key, 0) if key == "records" else s.get(key)
            if v is not None:
                yield f'{name}{{source="{_esc(src)}"}} {_num(v)}\n'


def _checkpoint(st: LiveView) -> Iterable[str]:
    last = st.checkpoint.get("last_timestamp")
    duration = st.checkpoint.get("duration")
    yield _plain("calmon_checkpoint_last_timestamp_seconds", "Time of the last checkpoint", "gauge", last)
    yield _plain("calmon_checkpoint_duration_seconds", "Duration of the last checkpoint", "gauge",
                 None if last is None else (0.0 if duration is None else duration))


def _changes(st: LiveView) -> Iterable[str]:
    total, point = [], []
    for model, view in sorted(st.changes.items()):
        for signal, sig in sorted(view.get("signals", {}).items()):
            labels = f'model="{_esc(model)}",signal="{_esc(signal)}"'
            total.append(f"calmon_change_detected_total{{{labels}}} {_num(sig.get('detections', 0))}\n")
            last = sig.get("last")
            if last is not None:
                point.append(f"calmon_change_point_timestamp_seconds{{{labels}}} "
                             f"{_num(as_number(last.get('change_point')))}\n")
    yield _head("calmon_change_detected_total", "Calibration changes detected (Page-Hinkley on the calibration "
                "residuals)", "counter")
    yield "".join(total)
    yield _head("calmon_change_point_timestamp_seconds", "Event time where the last detected change most likely "
                "started", "gauge")
    yield "".join(point)


def _series(dropped: Mapping[str, tuple[int, int]]) -> Iterable[str]:
    yield _head("calmon_metrics_series_over_budget", "Per-window series left out of /metrics by the series budget "
                "in the last round", "gauge")
    yield "".join(f'calmon_metrics_series_over_budget{{reason="{_esc(r)}"}} {_num(n)}\n'
                  for r, (n, _) in sorted(dropped.items()))
    yield _head("calmon_metrics_series_dropped_total", "Per-window series left out of /metrics by the series budget, "
                "summed over rounds", "counter")
    yield "".join(f'calmon_metrics_series_dropped_total{{reason="{_esc(r)}"}} {_num(acc)}\n'
                  for r, (_, acc) in sorted(dropped.items()))


def render_live(st: LiveView, dropped: Mapping[str, tuple[int, int]]) -> str:
    """The live part of ``/metrics`` as Prometheus text: what ``generate_latest`` writes for
    :class:`calmon.exporter.metrics.AgentCollector` (``dropped``: its series-budget counters, reason -> (last
    round, summed over rounds))."""
    out = [_head("calmon_build_info", "Build information", "gauge"),
           f'calmon_build_info{{version="{_esc(st.version)}"}} 1.0\n',
           _plain("calmon_ready", "1 when sources are connected and state is loaded", "gauge",
                  1.0 if st.ready else 0.0)]
    for part in (_events, _join, _sources, _checkpoint, _changes):
        out += part(st)
    out += _series(dropped)
    return "".join(out)
