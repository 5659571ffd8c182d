"""What the exporter renders: the live view and the round view of the agent, read by attribute.

The agent builds both (:mod:`calmon.agent.views`) and hands them over; they are frozen, so a
view taken on one thread can be rendered on another:

* :class:`LiveView` -- counters, join, sources, checkpoint and change detectors, copied under the
  state lock at every scrape (the live part of ``/metrics``, :func:`calmon.exporter.live.render_live`);
* :class:`RoundView` -- one published evaluation round (the round part of ``/metrics``, rendered
  once per round by :class:`calmon.exporter.rounds.RoundPart`).

Both also make up ``/api/status`` (:func:`calmon.agent.views.status_document`).  Their parts are
the JSON-shaped ``TypedDict``\\ s of :mod:`calmon.evaluate.types` (and :class:`JoinCounts`): the
status document serves them as they are.  Every field has a default, the view of an agent that
has seen nothing yet.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypedDict

from calmon import __version__
from calmon.evaluate.types import CalibratorInfo, CheckpointInfo, Evaluation, SchedulerInfo, SourceView

__all__ = ["DelayHistogram", "DelaySummary", "JoinCounts", "LiveView", "RoundView", "StatusWarning"]


class DelaySummary(TypedDict):
    """Observed label delays of one model, seconds (:class:`calmon.state.delays.DelaySketch`: quantiles are
    upper bin edges, never below the true value)."""

    count: int
    p50: float | None
    p90: float | None
    p99: float | None
    max: float | None


class JoinCounts(TypedDict):
    """The join's counters (:class:`calmon.state.join.JoinCounters`): per model, and orphan outcomes in all;
    outcomes that came after their prediction expired (estimated from a sample) and the label delays."""

    joined: dict[str, int]
    expired: dict[str, int]
    duplicates: dict[str, int]
    orphans: int
    late_outcomes: dict[str, int]
    delays: dict[str, DelaySummary]


class DelayHistogram(TypedDict):
    """``calmon_label_delay_seconds`` of one model: cumulative counts per ``le`` bound, sum and count."""

    buckets: list[tuple[float, int]]
    sum: float
    count: int


class StatusWarning(TypedDict):
    """One entry of ``/api/status``'s top-level ``warnings`` (the status page renders them)."""

    code: str
    message: str
    count: int
    setting: str
    suggested: str


def _no_join() -> JoinCounts:
    return {"joined": {}, "expired": {}, "duplicates": {}, "orphans": 0, "late_outcomes": {}, "delays": {}}


def _no_checkpoint() -> CheckpointInfo:
    return {"last_timestamp": None, "duration": None, "count": 0}


@dataclass(frozen=True)
class LiveView:
    """The live part of ``/metrics``: a copy of the agent state's counters, taken at scrape time."""

    version: str = __version__
    ready: bool = False
    #: Event time up to which every source has been read (``None`` before the first event).
    watermark: float | None = None
    #: Accepted events per (model, type).
    events: Mapping[tuple[str, str], int] = field(default_factory=dict)
    #: Rejected records per reason.
    rejected: Mapping[str, int] = field(default_factory=dict)
    #: Labeled events older than the allowed lateness, per model.
    late: Mapping[str, int] = field(default_factory=dict)
    join: JoinCounts = field(default_factory=_no_join)
    #: Predictions waiting for their outcome, per model.
    pending: Mapping[str, int] = field(default_factory=dict)
    sources: Mapping[str, SourceView] = field(default_factory=dict)
    checkpoint: CheckpointInfo = field(default_factory=_no_checkpoint)
    #: Per model: events seen and, per signal, detections and the last change
    #: (:meth:`calmon.state.monitors.ChangeMonitor.view`, JSON).
    changes: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    #: Per model: the label-delay histogram.
    delays: Mapping[str, DelayHistogram] = field(default_factory=dict)
    #: What the agent advises changing (a ``join.ttl`` shorter than the label delays).
    warnings: Sequence[StatusWarning] = ()

    def to_doc(self) -> dict[str, Any]:
        """The view as a plain dict, one key per field, mappings copied (``Agent.metrics_state``)."""
        return {"version": self.version, "ready": self.ready, "watermark": self.watermark, "events": dict(self.events),
                "rejected": dict(self.rejected), "late": dict(self.late), "join": dict(self.join),
                "pending": dict(self.pending), "sources": dict(self.sources), "checkpoint": dict(self.checkpoint),
                "changes": dict(self.changes), "delays": dict(self.delays), "warnings": list(self.warnings)}


@dataclass(frozen=True)
class RoundView:
    """The round part of ``/metrics``: what one published evaluation round exports."""

    scheduler: SchedulerInfo = field(default_factory=lambda: SchedulerInfo())
    #: Bytes of statistics per model, measured after the round.
    state_bytes: Mapping[str, int] = field(default_factory=dict)
    evaluations: Sequence[Evaluation] = ()
    #: The alert engine's alerts (:mod:`calmon.alerts`): ``alert``, ``model``, ``segment``, ``window``,
    #: ``severity``, ``state``, ...
    alerts: Sequence[Mapping[str, Any]] = ()
    #: The calibrators with a published version, the ones ``calmon_calibrator_*`` export.
    calibrators: Sequence[CalibratorInfo] = ()

    def to_doc(self) -> dict[str, Any]:
        """The view as a plain dict, one key per field, mappings copied and sequences as lists."""
        return {"scheduler": dict(self.scheduler), "state_bytes": dict(self.state_bytes),
                "evaluations": list(self.evaluations), "alerts": list(self.alerts),
                "calibrators": [dict(c) for c in self.calibrators]}
