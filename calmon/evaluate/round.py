"""Evaluation: one round of metrics, testers, alert rules and recalibration on a snapshot of windows.

A round is a function of a snapshot (window sums copied under the state lock, ring by ring), of the
previous round's calibrators and of what :class:`Evaluator` kept from earlier rounds (each window's
last evaluation and tester results, :mod:`calmon.evaluate.workitems`).  It touches no shared state;
the runtime's scheduler thread runs it and publishes the :class:`RoundResult`.

A round has a time budget.  Metrics and cheap testers run on every changed window; the expensive
testers are work items submitted to a :class:`~calmon.evaluate.pool.TesterPool` stalest first while
their measured cost fits the budget.  The round waits for the simulations of its cheap testers (sent
to the pool, ahead of everything else, when T-Cal's screens do not decide), not for the expensive
testers: their results are published as they arrive, between rounds (:meth:`Evaluator.settle`) or
by the next round -- except in a round that must be complete (the input is exhausted), which waits
for them too, up to the budget.  An unchanged window keeps its results (each with its
``evaluated_at``).  Only cheap testers left undone, or a round longer than its budget, count as an
overrun.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, wait
from dataclasses import dataclass, field
from typing import Any, TypedDict, TypeVar

from calmon.alerts import AlertEngine, AlertState
from calmon.alerts.rules import CHANGE_WINDOW
from calmon.algorithms.ece import reliability, summary
from calmon.config import ConfigError, EstimationConfig, EvaluationConfig
from calmon.evaluate.estimates import Predictor, window_estimates
from calmon.evaluate.pool import BACKGROUND, URGENT, JobResult, TesterPool
from calmon.evaluate.recalibrate import Recalibrator
from calmon.evaluate.types import CalibratorInfo, Evaluation
from calmon.evaluate.verdict import summarize
from calmon.evaluate.workitems import (
    FILL,
    Candidate,
    CostModel,
    Stamp,
    TestRecord,
    WindowEntry,
    WindowKey,
    horizon,
    order,
    starvation_bound,
)
from calmon.formats.jsonio import clean
from calmon.state.agentstate import WindowSnapshot
from calmon.state.buckets import BucketStats
from calmon.stats.grid import ScoreGrid
from calmon.testers import TESTERS, TestResult, check_params, has_screen, run_tester, screen_tester

log = logging.getLogger("calmon.agent")
_T = TypeVar("_T")

__all__ = ["SUMMARY_KEYS", "Evaluator", "RoundResult", "WorkInfo", "assemble", "change_judgements", "check_testers",
           "evaluate_window", "window_base"]

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


def window_base(model: str, segment: str, window: str, bucket: BucketStats, *,
                estimation: EstimationConfig | None = None, reference: ScoreGrid | None = None,
                predictor: Predictor | None = None, min_events: int = 100) -> dict[str, Any]:
    """The evaluation of one window without its tester results: metrics, reliability diagram, estimates.

    JSON-clean (:func:`~calmon.formats.jsonio.clean`) once here, so that :func:`assemble` cleans only the tester
    results and the verdict; the reliability diagram is built clean.
    """
    stats = bucket.stats
    s = summary(stats)
    base: dict[str, Any] = {"model": model, "segment": segment, "window": window, "n": stats.count,
                            "metrics": clean({k: s[k] for k in SUMMARY_KEYS if k in s}),
                            "reliability": reliability(bucket.rel)}
    if estimation is not None and estimation.enabled:
        base.update(clean(window_estimates(bucket, reference, estimation, predictor, top_label=stats.classes > 2,
                                           min_events=min_events)))
    return base


def assemble(base: Mapping[str, Any], bucket: BucketStats, tests: Mapping[str, dict[str, Any]],
             alpha: float, tolerance: float = 0.0) -> Evaluation:
    """``base`` plus tester results (JSON), the smCE/LDTC estimates as metrics and the verdict (a new document).

    ``base`` comes from :func:`window_base` and is JSON-clean: only the new parts are cleaned, and its
    reliability diagram and estimates are shared, not copied (evaluations are read-only: an unchanged
    window's document is published again as it is).  ``tolerance`` is ``verdict.tolerance.ece``.
    """
    stats = bucket.stats
    metrics = dict(base["metrics"])
    for name in ("smce", "ldtc"):
        r = tests.get(name)
        if r is not None and r.get("statistic") is not None:
            metrics[name] = clean(r.get("estimate", r["statistic"]))
    out: Any = {**base, "metrics": metrics, "tests": clean(dict(tests))}  # an Evaluation
    if stats.count > 0:
        out["summary"] = clean(summarize(stats.fine, tests, alpha=alpha, top_label=stats.classes > 2,
                                         ece_grid=stats.ece, tolerance=tolerance).to_dict())
    return out


def evaluate_window(model: str, segment: str, window: str, bucket: BucketStats, cfg: EvaluationConfig,
                    deadline: float = math.inf, clock: Callable[[], float] = time.monotonic, *,
                    estimation: EstimationConfig | None = None, reference: ScoreGrid | None = None,
                    predictor: Predictor | None = None, tolerance: float = 0.0) -> tuple[Evaluation, bool]:
    """Metrics, reliability diagram and every tester's result of one window, all in the calling thread.

    The agent's rounds use the pieces (:func:`window_base`, :func:`assemble`) through
    :class:`Evaluator`, which schedules the expensive testers; this is the one-shot form.

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
        Label-free estimates (see :mod:`calmon.evaluate.estimates`): settings (``None``: off), the score-drift
        reference grid and the calibrator in service.
    tolerance
        ``verdict.tolerance.ece`` (see :func:`calmon.evaluate.verdict.summarize`).

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
    n = bucket.stats.count
    base = window_base(model, segment, window, bucket, estimation=estimation, reference=reference,
                       predictor=predictor, min_events=cfg.min_events)
    tests: dict[str, dict[str, Any]] = {}
    skipped = False
    data = bucket.stats.calibration_data() if n >= cfg.min_events and cfg.tests else None
    for t in cfg.tests:
        if data is None:
            tests[t.name] = TestResult.insufficient(t.name, n, cfg.min_events).to_dict()
        elif clock() > deadline:
            skipped = True
        else:
            tests[t.name] = _run(t.name, data, cfg, t.params, f"{model}/{segment}/{window}", run_tester).to_dict()
    return assemble(base, bucket, tests, cfg.alpha, tolerance), skipped


def _run(name: str, data: Any, cfg: EvaluationConfig, params: Mapping[str, Any], where: str,
         call: Callable[..., _T]) -> _T | TestResult:
    """``call`` (:func:`run_tester`, or :func:`screen_tester`: ``None`` where a simulation is needed) with the
    round's settings; a tester's failure is a result too."""
    try:
        return call(name, data, alpha=cfg.alpha, mc=cfg.mc, seed=cfg.seed, **params)
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
    #: What the work-item scheduler did (:class:`WorkInfo`).
    work: WorkInfo = field(default_factory=lambda: WorkInfo(round=0, ran=0, queued=0, in_flight=0, simulations=0,
                                                            bound_rounds=None, costs={}, deferred=0))


class WorkInfo(TypedDict):
    """The work-item scheduler after a round (``/api/status`` under ``agent.work``)."""

    round: int
    #: Scheduled tester calls whose results arrived this round.
    ran: int
    #: Candidates left for later rounds.
    queued: int
    in_flight: int
    #: Cheap testers' simulations sent to the pool this round (their screens did not decide).
    simulations: int
    #: Every window gets every scheduled tester at least every this many rounds (``None``: the budget is too small).
    bound_rounds: int | None
    #: Measured seconds per call, per tester.
    costs: dict[str, float]
    #: Changed windows left for later rounds (the refresh stopped at :data:`REFRESH_SHARE` of the budget): they keep
    #: their last evaluation and are refreshed first next round.
    deferred: int


#: Share of the budget the refresh of changed windows (metrics, estimates, cheap testers) may use; the windows
#: still waiting then keep their last evaluation and are refreshed first by the next round, least recently
#: refreshed first (issue #35: at thousands of models a third of the windows change every minute, and refreshing
#: them all took twice the budget -- the round then overran and the expensive testers never got a turn).
REFRESH_SHARE = 0.5
#: Whatever the time (a loaded machine stretches every wall-clock share), a round refreshes at least this fraction's
#: inverse of rounds' worth: ``ceil(changed / REFRESH_ROUNDS)`` windows, so every changed window is refreshed at least
#: every REFRESH_ROUNDS rounds (the first 3000-model round under load 20 refreshed none within its share).
REFRESH_ROUNDS = 10

#: A tester call in the pool: its future, the statistics it runs on, the round that started it, its cost key.
_Job = tuple["Future[JobResult]", Stamp, int, str]
#: Between rounds, seconds to wait for more results once one arrived before republishing them together: at
#: least this, and at least :data:`REPUBLISH_SHARE` times what the last republishing cost (at a thousand
#: models a republishing is a second of the scheduler's thread, which shares the GIL with ingestion).
SETTLE_GATHER = 2.0
REPUBLISH_SHARE = 4.0


def _simulation(name: str, job: _Job) -> bool:
    """The call is a cheap tester's simulation (the round waits for it), not a scheduled tester's."""
    return job[3] != name


def simulation_cost(name: str) -> str:
    """Cost-model key of a cheap tester's simulations (sent to the pool when its screens do not decide)."""
    return f"{name}:simulation"


class Evaluator:
    """Runs rounds: every window's metrics and cheap testers, scheduled expensive testers, alerts, recalibration.

    See :mod:`calmon.evaluate.workitems` for which tester calls a round runs.  Results of scheduled
    testers arrive from ``pool`` (inline when ``None``); a call still running when the round's
    budget is spent is collected by a later round, never waited for past the budget.

    Parameters
    ----------
    cfg
        Evaluation settings.
    alert_engine
        Alert rules with their states (``None``: no alerting).
    recalibrator
        Scheduled refresh (``None``: off).
    clock, monotonic
        Wall clock (alert times, ``evaluated_at``) and a monotonic clock (budget).
    cpu_clock
        CPU time of the calling thread: what an inline cheap tester costs, so that a loaded machine (a
        preempted scheduler) does not make it look slower than ``evaluation.cheap_cost`` and demote it.
    pool
        Where the scheduled testers run (``None``: inline, in the round's thread).
    tolerance
        ``verdict.tolerance.ece``: a significant miscalibration whose ECE interval lies below it is immaterial.
    """

    def __init__(self, cfg: EvaluationConfig, alert_engine: AlertEngine | None = None,
                 recalibrator: Recalibrator | None = None, clock: Callable[[], float] = time.time,
                 monotonic: Callable[[], float] = time.monotonic, estimation: EstimationConfig | None = None,
                 history_window: str | None = None, pool: TesterPool | None = None,
                 cpu_clock: Callable[[], float] = time.thread_time, tolerance: float = 0.0) -> None:
        self.cfg = cfg
        self.tolerance = tolerance
        self.estimation = estimation
        #: The window holding everything (``all``): minus a window, the reference of its score drift.
        self.history_window = history_window
        self.alert_engine = alert_engine
        self.recalibrator = recalibrator
        self.clock = clock
        self.monotonic = monotonic
        self.cpu_clock = cpu_clock
        #: this round's inline cheap calls: tester -> (CPU seconds, calls)
        self._inline: dict[str, tuple[float, int]] = {}
        self.pool = pool if pool is not None else TesterPool("inline")
        self.costs = CostModel()
        self.entries: dict[WindowKey, WindowEntry] = {}
        self.inflight: dict[tuple[WindowKey, str], _Job] = {}
        self.round = 0
        self._done_at: dict[int, float] = {}
        self._stop = threading.Event()
        self._live: list[tuple[WindowSnapshot, WindowEntry]] = []
        self._params = {t.name: t.params for t in cfg.tests}
        self._simulations = 0
        self._deferred = 0
        self._assemble_cost = 0.0  # seconds the last republishing's assembling took

    @property
    def busy(self) -> bool:
        """Scheduled tester calls are still running."""
        return bool(self.inflight)

    def settle(self, until: float, interrupted: Callable[[], bool] = lambda: False,
               republish_cost: float = 0.0) -> list[Evaluation] | None:
        """Between rounds: wait (until ``until``, monotonic) for calls in flight; the last round's evaluations
        with the results that arrived, or ``None`` if none did.  The alert rules judge them in the next round.

        Once a result arrived, more are gathered for ``max(SETTLE_GATHER, REPUBLISH_SHARE x republish_cost)``
        seconds (the caller's cost of publishing the evaluations, plus this method's own assembling)."""
        pending = [job[0] for job in self.inflight.values()]
        while pending and not self._stop.is_set() and not interrupted():
            left = until - self.monotonic()
            if left <= 0:
                break
            done, not_done = wait(pending, timeout=min(left, 0.25), return_when=FIRST_COMPLETED)
            if done:
                # republishing is a pass over every window: gather what else finishes soon into the same one
                gather = max(SETTLE_GATHER, REPUBLISH_SHARE * (republish_cost + self._assemble_cost))
                end = min(until, self.monotonic() + gather)
                while not_done and not interrupted() and (left := end - self.monotonic()) > 0:
                    not_done = wait(not_done, timeout=min(left, 0.25)).not_done
                break
            pending = list(not_done)
        if not self._harvest():
            return None
        t0 = self.monotonic()
        out = [self._assemble(w, e) for w, e in self._live]
        self._assemble_cost = self.monotonic() - t0
        return out

    def stop(self) -> None:
        """Stop waiting for scheduled testers (shutdown): the running round publishes what it has."""
        self._stop.set()

    def run(self, snap: Sequence[WindowSnapshot], calibrators: Mapping[str, CalibratorInfo],
            previous_alerts: Sequence[dict[str, Any]] = (), changes: Mapping[str, Mapping[str, Any]] | None = None,
            watermark: float | None = None, complete: bool = False) -> RoundResult:
        """One round on ``snap``; ``calibrators`` are the ones in service (returned updated).

        ``changes`` is the change monitor's view (model -> events and per-signal detections) and
        ``watermark`` the newest event time, both taken with the snapshot: alert rules of kind
        ``change_detected`` judge them.  With ``complete`` the round also waits (within its budget)
        for the expensive testers it started, as when no later round will come.
        """
        t0 = self.monotonic()
        deadline = t0 + self.cfg.budget
        self.round += 1
        ran = self._harvest()
        # a round that must be complete (no later round comes) refreshes every changed window, as before #35
        refresh_until = math.inf if complete else t0 + REFRESH_SHARE * self.cfg.budget
        live, overrun = self._refresh_all(snap, deadline, refresh_until)
        # scheduled calls in a background pool may fill the period until the next round (workitems.horizon)
        background = self.pool.kind != "inline" and not complete
        queued, bound = self._schedule(live, t0 + horizon(self.cfg.budget, self.cfg.every, background))
        self._wait(t0 + FILL * self.cfg.budget, everything=complete)
        ran += self._harvest()
        # a cheap tester's simulation still running: that window has no fresh result this round
        overrun |= any(_simulation(name, job) for (_, name), job in self.inflight.items())
        self._live = live
        evaluations = [self._assemble(w, e) for w, e in live]
        states: list[AlertState] = []
        alerts = list(previous_alerts)
        alert_doc = None
        if self.alert_engine is not None:
            judged: list[Mapping[str, Any]] = [*evaluations, *change_judgements(changes or {}, watermark)]
            states = self.alert_engine.evaluate(judged, self.clock())
            alerts = [clean(st.to_dict()) for st in states]
            alert_doc = self.alert_engine.to_dict()
        cals = dict(calibrators)
        if self.recalibrator is not None and self.recalibrator.due() and not self._stop.is_set():
            cals = self.recalibrator.run(snap, cals)
        duration = self.monotonic() - t0
        work = WorkInfo(round=self.round, ran=ran, queued=queued, in_flight=len(self.inflight),
                        simulations=self._simulations, bound_rounds=bound, costs=dict(self.costs.seconds),
                        deferred=self._deferred)
        return RoundResult(evaluations, states, cals, duration, overrun or duration > self.cfg.budget,
                           self.clock(), alerts, alert_doc, work)

    # -- the cheap part: every changed window, every round ------------------------------------------
    def _refresh_all(self, snap: Sequence[WindowSnapshot], deadline: float, refresh_until: float = math.inf
                     ) -> tuple[list[tuple[WindowSnapshot, WindowEntry]], bool]:
        """Refresh the changed windows of ``snap`` -- never refreshed first, then least recently -- until
        ``refresh_until``; the others keep their last evaluation (a window never evaluated has none yet)."""
        history = {(w.model, w.segment): w.bucket.pred for w in snap if w.window == self.history_window}
        recal = self.recalibrator
        predictors = {m: recal.predictor(m) for m in {w.model for w in snap}} if recal is not None else {}
        overrun = False
        entries: dict[WindowKey, WindowEntry] = {}
        self._inline = {}
        self._simulations = 0
        self._deferred = 0  # changed windows left for the next round
        changed: list[tuple[int, int, WindowSnapshot, WindowEntry, Any]] = []
        kept: list[tuple[int, WindowSnapshot, WindowEntry]] = []  # published in snapshot order
        for i, w in enumerate(snap):
            key = (w.model, w.segment, w.window)
            e = entries[key] = self.entries.get(key) or WindowEntry()
            pred = predictors.get(w.model)
            if e.unchanged(w.stamp, pred):
                overrun |= self._cheap_testers(w, e, deadline)  # (a result of an earlier stamp: none to run)
                kept.append((i, w, e))
            else:
                changed.append((e.refreshed if e.base is not None else -1, i, w, e, pred))
        changed.sort(key=lambda c: c[:2])  # least recently refreshed first, then in snapshot order
        least = -(-len(changed) // REFRESH_ROUNDS)
        for j, (_, i, w, e, pred) in enumerate(changed):
            if j >= least and self.monotonic() > refresh_until:
                self._deferred += 1
                if e.base is not None:  # its last evaluation, as it was (its testers' stamps are older)
                    kept.append((i, w, e))
                continue
            ref = None
            if (w.model, w.segment) in history and w.window != self.history_window:
                ref = history[(w.model, w.segment)] - w.bucket.pred
            e.base = window_base(w.model, w.segment, w.window, w.bucket, estimation=self.estimation,
                                 reference=ref, predictor=pred, min_events=self.cfg.min_events)
            if w.stamp is None or w.stamp != e.stamp:
                e.changed_round = self.round
            e.stamp, e.predictor = w.stamp, pred
            e.version += 1
            e.refreshed = self.round
            overrun |= self._cheap_testers(w, e, deadline)
            kept.append((i, w, e))
        kept.sort(key=lambda k: k[0])
        live = [(w, e) for _, w, e in kept]
        self.entries = entries  # windows that are gone (an evicted model) are forgotten
        for name, (spent, calls) in self._inline.items():
            # one observation per round, the mean call: a rare slow window (T-Cal when no screen decides) does
            # not demote a tester that is cheap on average
            self.costs.observe(name, spent / calls)
        return live, overrun

    def _cheap(self, name: str) -> bool:
        return name in self.cfg.cheap and self.costs.seconds.get(name, 0.0) <= self.cfg.cheap_cost

    def _cheap_testers(self, w: WindowSnapshot, e: WindowEntry, deadline: float) -> bool:
        """Cheap testers of a changed window, and "insufficient data" for every tester of a small one."""
        n = w.bucket.stats.count
        skipped = False
        data = None
        for t in self.cfg.tests:
            rec = e.tests.get(t.name)
            if rec is not None and rec.stamp is not None and rec.stamp == w.stamp:
                continue
            if n < self.cfg.min_events:
                result = TestResult.insufficient(t.name, n, self.cfg.min_events).to_dict()
                e.record(t.name, TestRecord(result, self.clock(), w.stamp, self.round))
            elif rec is not None and rec.result.get("decision") == "insufficient data":
                del e.tests[t.name]  # enough data now: the tester has no result yet
                e.version += 1
            if n < self.cfg.min_events or not self._cheap(t.name):
                continue
            if self.monotonic() > deadline or self._stop.is_set():  # (stopping: the next run computes them)
                skipped = True
                continue
            key = (w.model, w.segment, w.window)
            if (key, t.name) in self.inflight:
                continue  # its simulation from an earlier round is still running; the next round follows up
            data = data or w.bucket.stats.calibration_data()
            t1 = self.cpu_clock()
            where = "/".join(key)
            res = _run(t.name, data, self.cfg, t.params, where, screen_tester if has_screen(t.name) else run_tester)
            spent, calls = self._inline.get(t.name, (0.0, 0))
            self._inline[t.name] = (spent + self.cpu_clock() - t1, calls + 1)
            if res is None:
                self._submit(key, t.name, data, w.stamp, simulation_cost(t.name))
                self._simulations += 1
            else:
                e.record(t.name, TestRecord(res.to_dict(), self.clock(), w.stamp, self.round))
        return skipped

    def _submit(self, key: WindowKey, name: str, data: Any, stamp: Stamp, cost: str) -> Future[JobResult]:
        """Start one tester call in the pool (its result is recorded by :meth:`_harvest`)."""
        fut = self.pool.submit(name, data, alpha=self.cfg.alpha, mc=self.cfg.mc, seed=self.cfg.seed,
                               params=self._params[name], priority=BACKGROUND if cost == name else URGENT)
        fut.add_done_callback(lambda f: self._done_at.__setitem__(id(f), self.clock()))
        self.inflight[(key, name)] = (fut, stamp, self.round, cost)
        return fut

    # -- the scheduled part: work items in the pool --------------------------------------------------
    def _candidates(self, live: Sequence[tuple[WindowSnapshot, WindowEntry]]
                    ) -> tuple[list[Candidate], dict[str, int]]:
        cands = []
        counts: dict[str, int] = {}
        for w, e in live:
            if w.bucket.stats.count < self.cfg.min_events:
                continue
            key = (w.model, w.segment, w.window)
            for t in self.cfg.tests:
                if self._cheap(t.name):
                    continue
                counts[t.name] = counts.get(t.name, 0) + 1
                rec = e.tests.get(t.name)
                if (key, t.name) in self.inflight or (rec is not None and (
                        (rec.stamp is not None and rec.stamp == w.stamp)
                        or self.round - rec.round < self.cfg.cadence.get(t.name, 1))):
                    continue
                cands.append(Candidate(key, t.name, -1 if rec is None else rec.round, e.changed_round))
        return cands, counts

    def _schedule(self, live: Sequence[tuple[WindowSnapshot, WindowEntry]], deadline: float
                  ) -> tuple[int, int | None]:
        """Submit the stalest candidates that fit the budget; returns (candidates left, starvation bound)."""
        cands, counts = self._candidates(live)
        workers = self.pool.workers
        snaps = {(w.model, w.segment, w.window): w for w, _ in live}
        busy = sum(self.costs.estimate(job[3]) for job in self.inflight.values() if not job[0].done())
        started = 0
        for c in order(cands):
            left = (deadline - self.monotonic()) * workers * FILL - busy
            if self._stop.is_set() or left <= 0:
                break
            cost = self.costs.estimate(c.test)
            if cost > left:
                continue
            w = snaps[c.key]
            if not self._submit(c.key, c.test, w.bucket.stats.calibration_data(), w.stamp, c.test).done():
                busy += cost  # an inline pool has already spent it on the clock
            started += 1
        cadence = max([1, *self.cfg.cadence.values()])
        span = horizon(self.cfg.budget, self.cfg.every, self.pool.kind != "inline")
        bound = starvation_bound(counts, self.costs, span * workers * FILL, cadence)
        return len(cands) - started, bound

    def _wait(self, until: float, everything: bool) -> None:
        """Wait for the cheap testers' simulations in flight (with ``everything``, for every call) until
        ``until`` (monotonic) or :meth:`stop`."""
        pending = [job[0] for (_, name), job in self.inflight.items() if everything or _simulation(name, job)]
        while pending and not self._stop.is_set():
            left = until - self.monotonic()
            if left <= 0:
                return
            pending = list(wait(pending, timeout=min(left, 0.25), return_when=FIRST_COMPLETED).not_done)

    def _harvest(self) -> int:
        """Record the results that arrived; returns how many."""
        got = 0
        for (key, name), (fut, stamp, rnd, cost) in list(self.inflight.items()):
            if not fut.done():
                continue
            del self.inflight[(key, name)]
            done_at = self._done_at.pop(id(fut), None)
            if fut.cancelled():
                continue
            res = fut.result()
            self.costs.observe(cost, res.seconds)
            e = self.entries.get(key)
            if e is not None:
                e.record(name, TestRecord(res.doc, self.clock() if done_at is None else done_at, stamp, rnd))
                got += 1
        return got

    def _assemble(self, w: WindowSnapshot, e: WindowEntry) -> Evaluation:
        """The window's published evaluation, rebuilt only when its base or a result changed."""
        if e.assembled is not None and e.assembled[0] == e.version:
            return e.assembled[1]
        tests = {t.name: e.tests[t.name].as_json() for t in self.cfg.tests if t.name in e.tests}
        assert e.base is not None
        ev = assemble(e.base, w.bucket, tests, self.cfg.alpha, self.tolerance)
        e.assembled = (e.version, ev)
        return ev
