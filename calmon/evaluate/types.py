"""Typed contracts between the agent's rooms: what a round produces and what the views read.

They are ``TypedDict``s rather than dataclasses because each is also a JSON document with a
fixed shape (``/api/status``, the checkpoint, the alert engine's input): the types document
and check the shape, the values stay plain JSON.
"""

from __future__ import annotations

from typing import Any, TypedDict


class _EvaluationRequired(TypedDict):
    model: str
    segment: str
    window: str
    n: int
    metrics: dict[str, float | None]
    reliability: list[dict[str, Any]]
    #: Tester name -> :meth:`calmon.testers.TestResult.to_dict` (JSON; ``decision`` always present).
    tests: dict[str, dict[str, Any]]


class Evaluation(_EvaluationRequired, total=False):
    """Metrics and tester results of one (model, segment, window); label-free parts when enabled."""

    #: Predictions in the window (labelled or not).
    predictions: int
    #: Metric -> {value, lo, hi}: what the window's metrics will be once its outcomes arrive.
    estimated: dict[str, dict[str, float]]
    #: Metric -> estimate minus realised, on the predictions whose outcomes have arrived.
    estimation_error: dict[str, float]
    #: PSI and chi-square test of the window's scores against everything before it.
    score_drift: dict[str, float | int]
    #: The verdict in plain words (:func:`calmon.evaluate.verdict.summarize`).
    summary: dict[str, Any]


class CalibratorInfo(TypedDict):
    """The calibrator in service for a model, as exported (``calmon_calibrator_*``) and checkpointed."""

    model: str
    method: str
    version: int | None
    before: dict[str, float] | None
    after: dict[str, float] | None
    reason: str | None
    #: When the revision in service was published (epoch seconds; ``None`` when none was).
    published_at: float | None


class SchedulerInfo(TypedDict, total=False):
    evaluations: int
    overruns: int
    last_timestamp: float | None
    last_duration: float


class CheckpointInfo(TypedDict):
    last_timestamp: float | None
    duration: float | None
    count: int


class SourceView(TypedDict):
    records: int
    lag_seconds: float | None
    lag_bytes: int | None
    lag_records: int | None
