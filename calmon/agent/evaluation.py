"""Evaluation: one round of metrics, testers, alert rules and recalibration on a snapshot of windows.

A round is a function of a snapshot (window sums copied under the state lock) and of the
previous round's calibrators: it touches no shared state and starts no thread, so it is tested
directly.  The runtime's scheduler thread runs it and publishes the :class:`RoundResult`.

A round has a time budget: testers still to run when it is spent are skipped (their previous
results are not reused) and the round counts as an overrun.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from calmon.agent.buckets import BucketStats
from calmon.agent.estimates import Predictor, window_estimates
from calmon.agent.recalibrate import Recalibrator
from calmon.agent.state import WindowSnapshot
from calmon.agent.types import CalibratorInfo, Evaluation
from calmon.alerts import AlertEngine, AlertState
from calmon.alerts.rules import CHANGE_WINDOW
from calmon.algorithms.ece import reliability, summary
from calmon.config import ConfigError, EstimationConfig, EvaluationConfig
from calmon.jsonio import clean
from calmon.stats.grid import ScoreGrid
from calmon.testers import TESTERS, TestResult, check_params, run_tester
from calmon.verdict import summarize

log = logging.getLogger("calmon.agent")

__all__ = ["SUMMARY_KEYS", "Evaluator", "RoundResult", "change_judgements", "check_testers", "evaluate_window"]

#: Keys of ``summary()`` exported as metrics (and shown on the status page).
SUMMARY_KEYS = ("ece", "ece_l2_debiased", "ece_l2_plugin", "l2_bins", "brier", "accuracy", "mean_confidence",
                "base_rate", "classwise_ece")


def check_testers(cfg: EvaluationConfig, path: str = "evaluation.tests") -> None:
    """Fail at start, naming the key, if a configured tester or one of its parameters is unknown."""
    for i, t in enumerate(cfg.tests):
        if t.name not in TESTERS:
            raise ConfigError(f"{path}.{i}.name", f"unknown tester {t.name!r} (known: {', '.join(TESTERS.names())})")
        try:
            check_params(t.name, t.params)
        except ValueError as exc:
            raise ConfigError(f"{path}.{i}.params", str(exc)) from None


def evaluate_window(model: str, segment: str, window: str, bucket: BucketStats, cfg: EvaluationConfig,
                    deadline: float = math.inf, clock: Callable[[], float] = time.monotonic, *,
                    estimation: EstimationConfig | None = None, reference: ScoreGrid | None = None,
                    predictor: Predictor | None = None) -> tuple[Evaluation, bool]:
    """Metrics, reliability diagram and tester results of one window's statistics.

    Parameters
    ----------
    model, segment, window
        Labels of the evaluation.
    bucket
        The window's summed statistics.
    cfg
        Evaluation settings (testers, alpha, mc, seed, min_events).
    deadline
        ``clock()`` value after which remaining testers are skipped.
    estimation, reference, predictor
        Label-free estimates (see :mod:`calmon.agent.estimates`): settings (``None``: off), the score-drift
        reference grid and the calibrator in service.

    Returns
    -------
    tuple
        The evaluation (status-page shape) and whether a tester was skipped for lack of time.

    Examples
    --------
    >>> import numpy as np
    >>> from calmon.config import EvaluationConfig
    >>> b = BucketStats(2, bins=64, reservoir=0)
    >>> b.update(np.array([0.2, 0.8, 0.8, 0.8]), None, np.array([0, 1, 1, 0]))
    >>> ev, skipped = evaluate_window("m", "all", "1h", b, EvaluationConfig(tests=[], min_events=1))
    >>> ev["n"], round(ev["metrics"]["ece"], 3), ev["reliability"][16]["events"]
    (4, 0.15, 3)
    """
    stats = bucket.stats
    n = stats.count
    s = summary(stats)
    metrics = {k: s[k] for k in SUMMARY_KEYS if k in s}
    tests: dict[str, TestResult] = {}
    skipped = False
    data = stats.calibration_data() if n >= cfg.min_events and cfg.tests else None
    for t in cfg.tests:
        if data is None:
            tests[t.name] = TestResult.insufficient(t.name, n, cfg.min_events)
        elif clock() > deadline:
            skipped = True
        else:
            tests[t.name] = _run(t.name, data, cfg, t.params, f"{model}/{segment}/{window}")
    for name in ("smce", "ldtc"):
        r = tests.get(name)
        if r is not None and r.statistic is not None:
            metrics[name] = r.details.get("estimate", r.statistic)
    tests_json = {k: r.to_dict() for k, r in tests.items()}
    ev: Evaluation = {"model": model, "segment": segment, "window": window, "n": n, "metrics": metrics,
                      "reliability": reliability(bucket.rel), "tests": tests_json}
    if n > 0:
        ev["summary"] = summarize(stats.fine, tests_json, alpha=cfg.alpha, top_label=stats.classes > 2,
                                  ece_grid=stats.ece).to_dict()
    if estimation is not None and estimation.enabled:
        ev.update(window_estimates(bucket, reference, estimation, predictor,  # type: ignore[typeddict-item]
                                   top_label=stats.classes > 2, min_events=cfg.min_events))
    return clean(ev), skipped


def _run(name: str, data: Any, cfg: EvaluationConfig, params: Mapping[str, Any], where: str) -> TestResult:
    try:
        return run_tester(name, data, alpha=cfg.alpha, mc=cfg.mc, seed=cfg.seed, **params)
    except Exception as exc:  # noqa: BLE001 - a tester is numerical code on live data; one failure must not stop the round
        log.warning("tester %s failed on %s: %s", name, where, exc)
        return TestResult.failed(name, exc)


def change_judgements(changes: Mapping[str, Mapping[str, Any]], watermark: float | None) -> list[dict[str, Any]]:
    """What ``change_detected`` rules judge: per model its detectors' view, in the pseudo-window ``stream``."""
    return [{"model": model, "segment": "all", "window": CHANGE_WINDOW, "n": view.get("events", 0),
             "watermark": watermark, "changes": view.get("signals", {})} for model, view in sorted(changes.items())]


@dataclass
class RoundResult:
    """What one round produced; published as a whole by the runtime."""

    evaluations: list[Evaluation]
    alert_states: list[AlertState]
    calibrators: dict[str, CalibratorInfo]
    duration: float
    overrun: bool
    finished_at: float
    alerts: list[dict[str, Any]] = field(default_factory=list)
    #: The alert engine's state after the round (checkpointed by the ingestion thread).
    alert_doc: dict[str, Any] | None = None


class Evaluator:
    """Runs rounds: every window's evaluation, then the alert rules, then (when due) recalibration.

    Parameters
    ----------
    cfg
        Evaluation settings.
    alert_engine
        Alert rules with their states (``None``: no alerting).
    recalibrator
        Scheduled refresh (``None``: off).
    clock, monotonic
        Wall clock (alert times) and a monotonic clock (budget).
    """

    def __init__(self, cfg: EvaluationConfig, alert_engine: AlertEngine | None = None,
                 recalibrator: Recalibrator | None = None, clock: Callable[[], float] = time.time,
                 monotonic: Callable[[], float] = time.monotonic, estimation: EstimationConfig | None = None,
                 history_window: str | None = None) -> None:
        self.cfg = cfg
        self.estimation = estimation
        #: The window holding everything (``all``): minus a window, the reference of its score drift.
        self.history_window = history_window
        self.alert_engine = alert_engine
        self.recalibrator = recalibrator
        self.clock = clock
        self.monotonic = monotonic

    def run(self, snap: Sequence[WindowSnapshot], calibrators: Mapping[str, CalibratorInfo],
            previous_alerts: Sequence[dict[str, Any]] = (), changes: Mapping[str, Mapping[str, Any]] | None = None,
            watermark: float | None = None) -> RoundResult:
        """One round on ``snap``; ``calibrators`` are the ones in service (returned updated).

        ``changes`` is the change monitor's view (model -> events and per-signal detections) and
        ``watermark`` the newest event time, both taken with the snapshot: alert rules of kind
        ``change_detected`` judge them.
        """
        t0 = self.monotonic()
        deadline = t0 + self.cfg.budget
        evaluations = []
        overrun = False
        history = {(w.model, w.segment): w.bucket.pred for w in snap if w.window == self.history_window}
        recal = self.recalibrator
        predictors = {m: recal.predictor(m) for m in {w.model for w in snap}} if recal is not None else {}
        for w in snap:
            ref = None
            if (w.model, w.segment) in history and w.window != self.history_window:
                ref = history[(w.model, w.segment)] - w.bucket.pred
            ev, skipped = evaluate_window(w.model, w.segment, w.window, w.bucket, self.cfg, deadline, self.monotonic,
                                          estimation=self.estimation, reference=ref, predictor=predictors.get(w.model))
            overrun |= skipped
            evaluations.append(ev)
        states: list[AlertState] = []
        alerts = list(previous_alerts)
        alert_doc = None
        if self.alert_engine is not None:
            judged: list[Mapping[str, Any]] = [*evaluations, *change_judgements(changes or {}, watermark)]
            states = self.alert_engine.evaluate(judged, self.clock())
            alerts = [clean(st.to_dict()) for st in states]
            alert_doc = self.alert_engine.to_dict()
        cals = dict(calibrators)
        if self.recalibrator is not None and self.recalibrator.due():
            cals = self.recalibrator.run(snap, cals)
        duration = self.monotonic() - t0
        return RoundResult(evaluations, states, cals, duration, overrun or duration > self.cfg.budget,
                           self.clock(), alerts, alert_doc)
