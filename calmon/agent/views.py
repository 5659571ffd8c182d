"""The agent's views: the published evaluation results, the exporter's typed views and the status document.

Evaluation results are *published*, not shared: the scheduler builds a new immutable
:class:`Published` after each round and replaces the runtime's reference to it in one
assignment.  A reader takes the reference once and sees one consistent round, without a lock
and without racing the scheduler (the status page used to read calibrators while they were
being written).

The exporter reads the agent through two frozen views (:mod:`calmon.exporter.views`): the
:class:`~calmon.exporter.views.RoundView` of a published round (:func:`round_state`) and the
:class:`~calmon.exporter.views.LiveView` of the counters, copied under the state lock
(:func:`live_state`); ``/api/status`` is built from both (:func:`status_document`).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from calmon import __version__
from calmon.config import format_duration
from calmon.evaluate.types import CalibratorInfo, CheckpointInfo, Evaluation, SchedulerInfo, SourceView
from calmon.exporter.views import DelayHistogram, DelaySummary, JoinCounts, LiveView, RoundView, StatusWarning
from calmon.formats.jsonio import clean
from calmon.state.agentstate import AgentState
from calmon.state.delays import join_advice

__all__ = ["Published", "live_state", "metrics_state", "model_bytes", "round_state", "status_document",
           "status_views"]


@dataclass(frozen=True)
class Published:
    """One round's results as every reader sees them (replaced whole, never mutated)."""

    evaluations: tuple[Evaluation, ...] = ()
    alerts: tuple[dict[str, Any], ...] = ()
    calibrators: Mapping[str, CalibratorInfo] = field(default_factory=dict)
    scheduler: SchedulerInfo = field(default_factory=lambda: SchedulerInfo(evaluations=0, overruns=0,
                                                                           last_timestamp=None))
    #: The alert engine's state after this round (``None`` before the first round or without rules).
    alert_doc: Mapping[str, Any] | None = None
    #: The work-item scheduler after this round (:class:`calmon.evaluate.round.WorkInfo`).
    work: Mapping[str, Any] = field(default_factory=dict)
    #: Bytes of statistics per model, measured after this round (:func:`model_bytes`).
    nbytes: Mapping[str, int] = field(default_factory=dict)


def model_bytes(state: AgentState) -> dict[str, int]:
    """Bytes of statistics per model, taking the state lock one model at a time (never for all of them)."""
    with state.lock:
        models = list(state.models.items())
    out = {}
    for name, mw in models:
        with state.lock:
            out[name] = mw.nbytes()
    return out


def round_state(pub: Published) -> RoundView:
    """The round part of ``/metrics`` (:meth:`calmon.exporter.metrics.AgentMetrics.prepare`): the published round."""
    return RoundView(scheduler=pub.scheduler, state_bytes=pub.nbytes, evaluations=pub.evaluations, alerts=pub.alerts,
                     calibrators=tuple(v for v in pub.calibrators.values() if v.get("version") is not None))


def live_state(state: AgentState, checkpoint: CheckpointInfo, ready: bool, now: float) -> LiveView:
    """The live part of ``/metrics``: counters, join, sources, change detectors (a copy under the lock, O(models))."""
    with state.lock:
        c = state.counters.copy()
        sources: dict[str, SourceView] = {
            name: {"records": c.records.get(name, 0), "lag_seconds": info.lag_seconds(now),
                   "lag_bytes": info.lag_bytes, "lag_records": info.lag_records}
            for name, info in state.sources.items()}
        jc = state.joiner.counters
        expired, late = dict(jc.expired), dict(state.joiner.delays.late)
        table = state.joiner.delays.table()  # one matrix copy; read after the lock is released
        join: JoinCounts = {"joined": dict(jc.joined), "expired": expired, "duplicates": dict(jc.duplicates),
                            "orphans": jc.orphans, "late_outcomes": late, "delays": {}}
        pending = state.joiner.pending_count()
        watermark = state.watermark
        changes = state.changes.view()
        ttl = state.joiner.ttl
    join["delays"] = {m: DelaySummary(**q) for m, q in sorted(table.summaries().items())}
    delays = {m: DelayHistogram(**h) for m, h in sorted(table.histograms().items())}
    advice = join_advice(ttl, expired, late, [table.merged()]) if late or any(expired.values()) else None
    warnings: list[StatusWarning] = [StatusWarning(**advice)] if advice is not None else []
    return LiveView(ready=ready, version=__version__, watermark=watermark, events=c.events, rejected=c.rejected,
                    late=c.late, join=join, pending=pending, sources=sources, checkpoint=checkpoint.copy(),
                    changes=changes, delays=delays, warnings=warnings)


def status_views(state: AgentState, pub: Published, checkpoint: CheckpointInfo, ready: bool,
                 now: float) -> tuple[LiveView, RoundView]:
    """The live and the round view for ``/api/status`` (state bytes measured now before the first round)."""
    live, rnd = live_state(state, checkpoint, ready, now), round_state(pub)
    if not pub.nbytes:  # before the first round
        rnd = dataclasses.replace(rnd, state_bytes=model_bytes(state))
    return live, rnd


def metrics_state(state: AgentState, pub: Published, checkpoint: CheckpointInfo, ready: bool,
                  now: float) -> dict[str, Any]:
    """Both views and the work-item scheduler as one plain dict (:meth:`calmon.agent.runtime.Agent.metrics_state`)."""
    live, rnd = status_views(state, pub, checkpoint, ready, now)
    return {**live.to_doc(), **rnd.to_doc(), "work": dict(pub.work)}


def status_document(live: LiveView, rnd: RoundView, pub: Published, *, windows: list[str],
                    tiers: list[tuple[float, int]], started_at: float, now: float) -> dict[str, Any]:
    """The document served at ``/api/status`` and rendered at ``/``, built from :func:`status_views`."""
    return clean({
        "generated_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(now)),
        "version": __version__,
        "evaluations": list(rnd.evaluations), "alerts": list(rnd.alerts), "calibrators": dict(pub.calibrators),
        "warnings": [dict(w) for w in live.warnings],
        "agent": {
            "ready": live.ready, "uptime_seconds": now - started_at, "watermark": live.watermark,
            "windows": windows, "tiers": [f"{c} x {format_duration(w)}" for w, c in tiers],
            "events": [{"model": m, "type": k, "count": n} for (m, k), n in sorted(live.events.items())],
            "rejected": dict(live.rejected), "late": dict(live.late), "join": live.join, "pending": dict(live.pending),
            "sources": dict(live.sources), "scheduler": rnd.scheduler, "checkpoint": live.checkpoint,
            "state_bytes": dict(rnd.state_bytes), "changes": dict(live.changes), "work": dict(pub.work),
        },
    })
