"""The agent runtime: wires the rooms together and owns the threads.

Data flow (see ``docs/architecture.md``)::

    Input: sources --read--> Ingestor (decode, dead-letter, join, bin) --> AgentState  (ingestion thread)
    AgentState --snapshot--> Evaluator (metrics, testers, alerts, recalibration) --> Published  (scheduler)
    AgentState + Published --> /metrics, /api/status, /  (HTTP threads)

Threads
-------
* the **ingestion loop** (the caller of :meth:`Agent.run`, normally the main thread): polls the
  agent's input (:mod:`calmon.agent.inputs`; by default a batch from each source, ingested), and
  every ``checkpoint.every`` seconds and on stop writes a checkpoint;
* the **scheduler** (:mod:`calmon.agent.scheduler`), running :meth:`Agent.evaluate_round`;
* the **HTTP exporter** (:mod:`calmon.exporter.http`), one thread per connection.
The locking rule is in :mod:`calmon.state.agentstate`; evaluation results are published as one
immutable object (:mod:`calmon.agent.views`).

Checkpoints
-----------
A checkpoint is captured between two batches, when the state holds exactly the records up to
every source's position: the decoder state, the join buffers, every ring of every model, all
counters, each source's position and the dead-letter sink's position.  Under the lock only what
changed since the last generation is copied; a writer thread serialises it and commits the
generation (:mod:`calmon.state.checkpoint.incremental`, :class:`calmon.state.checkpoint.store.CheckpointStore`), and
source offsets are committed after that, on the ingestion thread.  On start the agent loads the
newest generation, seeks each source to its position and truncates the dead-letter file to its
position: records after the checkpoint are read again and everything derived from them is
rebuilt, so after a crash no event is lost and none is counted twice.

Stopping
--------
SIGTERM or SIGINT (:meth:`Agent.on_signal`) ends the ingestion loop after its batch; the agent then
abandons the tester calls in flight (their worker processes are killed: one simulation may take
minutes, a supervisor's grace period is seconds, and the next run recomputes every result), writes
the final checkpoint, closes, and logs one line with what it saved, e.g. ``stopped on SIGTERM in
0.8 s (0.3 s CPU): checkpoint generation 42 written (1,234 models, 3.1 MB); 3 tester calls abandoned``.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import os
import threading
import time
from collections.abc import Callable, Collection, Sequence
from pathlib import Path
from typing import Any

from calmon import __version__
from calmon.agent.build import (
    StartupError,
    build_alert_engine,
    build_alertmanager,
    build_dead_letter,
    build_publishers,
    start_exporter,
)
from calmon.agent.inputs import BacklogReporting, Input, MetricsCollector, SourcesInput
from calmon.agent.scheduler import Scheduler
from calmon.agent.views import (
    Published,
    live_state,
    metrics_state,
    model_bytes,
    round_state,
    status_document,
    status_views,
)
from calmon.calibration import check_methods
from calmon.config import Config, ConfigError
from calmon.evaluate.pool import TesterPool
from calmon.evaluate.recalibrate import Recalibrator
from calmon.evaluate.round import Evaluator, RoundResult, check_testers
from calmon.evaluate.types import CalibratorInfo, CheckpointInfo, Evaluation, SchedulerInfo
from calmon.exporter.http import Endpoints, HTTPExporter
from calmon.exporter.metrics import AgentMetrics, SeriesBudget
from calmon.exporter.status.page import render as render_status
from calmon.exporter.status.pages import StatusPages
from calmon.exporter.views import LiveView
from calmon.state.agentstate import AgentState, StateError
from calmon.state.checkpoint.incremental import Checkpointer, resolver
from calmon.state.checkpoint.schema import STATE_FORMAT, STATE_READABLE, STATE_VERSION
from calmon.state.checkpoint.store import CheckpointStore
from connectors.base import Batch, Committable, Connectable, DeadLetterSink, Source

log = logging.getLogger("calmon.agent")

__all__ = ["Agent", "Input", "MetricsCollector", "SourcesInput", "StartupError"]


class Agent:
    """The long-running calibration monitor.

    Parameters
    ----------
    cfg
        Validated configuration.
    sources
        Connectors to use instead of building them from ``cfg.sources`` (tests, the demo).
    clock
        Wall clock (epoch seconds) for arrival times, lags and timestamps.
    input
        What the agent ingests (:mod:`calmon.agent.inputs`); default :class:`SourcesInput` of ``sources``.
        The cluster evaluator passes one merging deltas (:func:`calmon.cluster.evaluate.evaluate_agent`).
    collectors
        Extra ``/metrics`` families, appended after the agent's own.

    Examples
    --------
    >>> import tempfile, pathlib
    >>> from calmon.config import build_config
    >>> d = pathlib.Path(tempfile.mkdtemp())
    >>> _ = (d / "ev.jsonl").write_text("".join(
    ...     f'{{"model": "m", "ts": {1767225600 + i}, "score": 0.5, "label": {i % 2}}}\\n' for i in range(10)))
    >>> cfg = build_config({"state_dir": str(d / "state"), "sources": [{"path": str(d / "ev.jsonl")}],
    ...                     "exporter": {"enabled": False}, "evaluation": {"tests": []},
    ...                     "ingest": {"exit_when_done": True}}, env={})
    >>> agent = Agent(cfg)
    >>> agent.run()
    0
    >>> ev = [e for e in agent.status()["evaluations"] if e["window"] == "all"][0]
    >>> ev["n"], ev["metrics"]["ece"], ev["metrics"]["accuracy"]
    (10, 0.0, 0.5)
    """

    def __init__(self, cfg: Config, sources: Sequence[Source] | None = None,
                 clock: Callable[[], float] = time.time, input: Input | None = None,
                 collectors: Sequence[MetricsCollector] = ()) -> None:
        if input is not None and sources is not None:
            raise ValueError("Agent: give sources or an input, not both")
        check_testers(cfg.evaluation)
        if cfg.recalibration.enabled:
            try:
                check_methods(cfg.recalibration.methods)
            except ValueError as exc:
                raise ConfigError("recalibration.methods", str(exc)) from None
        self.cfg = cfg
        self.clock = clock
        self.state = AgentState(cfg)
        self.alert_engine = build_alert_engine(cfg.alerts)
        self.alertmanager = build_alertmanager(cfg.alerts)
        self.published = Published()
        self.checkpoint_info: CheckpointInfo = {"last_timestamp": None, "duration": None, "count": 0}
        self._checkpoint_retry_at = 0.0  # a checkpoint deferred for unacknowledged dead letters: not before
        self._deferred_since: float | None = None
        self._deferred_logged = -math.inf
        ex = cfg.exporter
        budget = SeriesBudget(ex.reliability_windows(cfg.windows), ex.max_series_per_model, ex.max_series,
                              ex.max_series_per_window, ex.estimates)
        self.metrics = AgentMetrics(self.live_state, budget, clock=clock)
        self.ready = False
        self.done = False
        self._stop = threading.Event()
        #: (signal name, monotonic time, process CPU time) of the first stop signal
        self._signalled: tuple[str, float, float] | None = None
        self._abandoned = 0  # tester calls abandoned on a stop
        self._last_checkpoint: Any = None  # the last committed generation (checkpoint.incremental.Result)
        #: A round and the republishing between rounds use the evaluator one at a time; a round asked for
        #: from another thread than the scheduler's (a benchmark, a test) interrupts the republishing.
        self._evaluating = threading.Lock()
        self._round_asked = threading.Event()
        self._prepare_cost = 0.0  # seconds the last republishing's /metrics preparation took
        self.collectors = list(collectors)
        self.dead_letter: DeadLetterSink | None = None
        self.store: CheckpointStore | None = None
        self.checkpointer: Checkpointer | None = None
        self.http: HTTPExporter | None = None
        self.pages: StatusPages | None = None  # the cached status pages, with the exporter
        self.scheduler: Scheduler | None = None
        self._caught_up = False  # the ingestion has read its backlog once (the first round then comes at once)
        self.evaluator: Evaluator | None = None
        self.pool: TesterPool | None = None
        self._ingest_thread: threading.Thread | None = None
        self.started_at = self.clock()
        #: Callables ``fn(evaluations)`` run after each evaluation round (the demo prints from one).
        self.round_hooks: list[Callable[[list[Evaluation]], None]] = []
        self.input: Input = input if input is not None else SourcesInput(sources)
        self.input.attach(self)

    # -- read-only views of the state (for scripts and tests) ------------------------------------
    @property
    def calibrators(self) -> dict[str, CalibratorInfo]:
        return dict(self.published.calibrators)

    @property
    def models(self) -> dict[str, Any]:
        return self.state.models

    @property
    def sources(self) -> list[Source]:
        """The input's connectors (empty until :meth:`open`)."""
        return self.input.sources

    @property
    def stopping(self) -> bool:
        """A stop was asked for (:meth:`stop`)."""
        return self._stop.is_set()

    # -- lifecycle -----------------------------------------------------------------------------
    def open(self) -> None:
        """Build sources and sinks, load the checkpoint, seek, start the exporter and the scheduler."""
        os.makedirs(self.cfg.state_dir, exist_ok=True)
        self.input.open()
        self.dead_letter = build_dead_letter(self.cfg)
        recal = None
        if self.cfg.recalibration.enabled:
            recal = Recalibrator(self.cfg.recalibration, build_publishers(self.cfg))
        history = next((name for name, length in self.state.windows.items() if length is None), None)
        ev = self.cfg.evaluation
        self.pool = TesterPool(ev.pool, ev.workers)
        self.evaluator = Evaluator(ev, self.alert_engine, recal, clock=self.clock, estimation=self.cfg.estimation,
                                   history_window=history, pool=self.pool, tolerance=self.cfg.verdict.tolerance.ece)
        if self.cfg.checkpoint.enabled:
            self.store = CheckpointStore(Path(self.cfg.state_dir) / "checkpoints", keep=self.cfg.checkpoint.keep)
            self.checkpointer = Checkpointer(self.store)
            doc = self.store.load()
            if doc is not None:
                self.restore(doc)
            else:
                # an initial checkpoint at the start positions: a crash before the first periodic
                # checkpoint must also roll the dead-letter file back (else its records would repeat)
                self.checkpoint()
        for src in self.sources:
            self.state.source(src.name)
        if self.cfg.exporter.enabled:
            self.http = self._start_http()
        self.scheduler = Scheduler(self.evaluate_round, self.cfg.evaluation.every, self._settle).start()
        self.ready = True

    def _start_http(self) -> HTTPExporter:
        # / is rendered once per published round (and at most every evaluation period), like /metrics
        self.pages = StatusPages(self.status, lambda: self.published, max_age=max(1.0, self.cfg.evaluation.every))
        endpoints = Endpoints(self.render_metrics, self.healthy, self.is_ready, self.status, render_status,
                              pages=self.pages.serve, metrics_collect=self.metrics.render)
        return start_exporter(self.cfg.exporter, endpoints)

    def render_metrics(self) -> bytes:
        """The ``/metrics`` body: the agent's families, then its collectors'."""
        return self.metrics.render() + b"".join(c.render() for c in self.collectors)

    def is_ready(self) -> bool:
        """State loaded, every source connected (sources without a connection always are), the input ready."""
        return (self.ready and all(s.connected for s in self.sources if isinstance(s, Connectable))
                and self.input.ready())

    def healthy(self) -> bool:
        ing = self._ingest_thread is None or self._ingest_thread.is_alive() or self.done
        return ing and (self.scheduler is None or self.scheduler.alive())

    def stop(self) -> None:
        """Ask the ingestion loop to finish its batch, checkpoint and return (signal-safe)."""
        self._stop.set()

    def on_signal(self, name: str) -> None:
        """:meth:`stop` on a signal (``"SIGTERM"``): the stop is timed from here and logged (signal-safe)."""
        if self._signalled is None:
            self._signalled = (name, time.monotonic(), time.process_time())
        self._stop.set()

    def _abandon_testers(self) -> None:
        """On a stop: no round waits for a tester any more, and the calls in flight are killed, not waited for."""
        if self.evaluator is not None:
            self.evaluator.stop()
        if self.pool is not None:
            self._abandoned = self.pool.close(wait=False, abandon=True)
            self.pool = None

    def _log_stop(self) -> None:
        """The one line saying how long the stop took and what it saved."""
        assert self._signalled is not None
        name, t0, cpu0 = self._signalled
        res = self._last_checkpoint
        if res is not None:
            saved = (f"checkpoint generation {res.generation} written ({len(self.state.models):,} models, "
                     f"{_size(res.bytes)})")
        elif self.cfg.checkpoint.enabled:
            saved = "no checkpoint written (see the error above); the previous generation stays the state"
        else:
            saved = "checkpoints are off (checkpoint.enabled: false): nothing saved"
        calls = self._abandoned
        log.info("stopped on %s in %.1f s (%.1f s CPU): %s; %d tester call%s abandoned", name,
                 time.monotonic() - t0, time.process_time() - cpu0, saved, calls, "" if calls == 1 else "s")

    def close(self) -> None:
        try:
            self.input.close()  # first: the state, exporter and sources are still whole
        finally:
            self._close()

    def _close(self) -> None:
        try:
            self._checkpoint_done(wait=True)  # a checkpoint in flight is finished and its offsets committed
        except (OSError, ValueError, TypeError):
            log.exception("checkpoint failed")
        if self.evaluator is not None:
            self.evaluator.stop()  # a round waiting for scheduled testers publishes what it has
        if self.scheduler is not None:
            self.scheduler.stop()
        if self.pool is not None:
            self.pool.close(wait=True)  # calls in flight finish (a worker killed mid-call would be an error)
            self.pool = None
            if self.scheduler is None or not self.scheduler.alive():  # (a round still running publishes its own)
                self._settle(time.monotonic(), lambda: True)  # ... and their results are in the last status
        if self.http is not None:
            self.http.stop()
            self.http = None
        for src in self.sources:
            try:
                src.close()
            except Exception:  # noqa: BLE001 - best effort on shutdown: one connector must not keep the rest open
                log.exception("closing source %s", src.name)
        if self.dead_letter is not None:
            self.dead_letter.close()

    def run(self, max_seconds: float | None = None) -> int:
        """Open, ingest until stopped (or every source is exhausted with ``exit_when_done``), close.

        Parameters
        ----------
        max_seconds
            Stop after this long (the demo's ``--duration``).

        Returns
        -------
        int
            Exit status 0.
        """
        if not self.ready:
            self.open()
        self._ingest_thread = threading.current_thread()
        deadline = math.inf if max_seconds is None else time.monotonic() + max_seconds
        last_ck = time.monotonic()
        try:
            while not self._stop.is_set() and time.monotonic() < deadline:
                got = self.poll_once()
                if not self._caught_up and self._input_caught_up(got):
                    self._caught_up = True
                    if self.scheduler is not None:
                        self.scheduler.caught_up()  # the first round now, on the whole backlog
                self._checkpoint_done()
                if (self.cfg.checkpoint.enabled and time.monotonic() - last_ck >= self.cfg.checkpoint.every
                        and time.monotonic() >= self._checkpoint_retry_at and self.checkpoint(wait=False)):
                    last_ck = time.monotonic()
                if not got and all(s.exhausted for s in self.sources):
                    if not self.done:
                        self.finish_input()
                    if self.cfg.ingest.exit_when_done:
                        break
                    self._stop.wait(self.cfg.ingest.poll_timeout)
            if self._stop.is_set():
                self._abandon_testers()  # first: they hold the CPU, and a call may take minutes
            if self.cfg.checkpoint.enabled:
                self.checkpoint()
        finally:
            self.close()
        if self._signalled is not None:
            self._log_stop()
        return 0

    def _input_caught_up(self, got: bool) -> bool:
        """The backlog is read: the input says so, or (an input that cannot tell) a poll read nothing."""
        return self.input.caught_up() if isinstance(self.input, BacklogReporting) else not got

    def finish_input(self) -> None:
        """Every read-once source is exhausted: expire the join, evaluate now and wait for the round."""
        for dec in {id(d): d for d in self.state.decoders.values()}.values():
            dec.finish()  # a mapped path that matched none of a short input: one line (calmon run exits 2)
        with self.state.lock:
            self.state.joiner.sweep()
            self.state.advise_join(self.clock(), final=True)  # a replay's one join.ttl warning, with all its numbers
        self.done = True
        if self.scheduler is not None:
            before = self.scheduler.rounds
            self.scheduler.trigger()
            self.scheduler.wait_round(before, timeout=max(60.0, 2 * self.cfg.evaluation.budget), cancel=self._stop)
        log.info("all sources exhausted")

    # -- ingestion -----------------------------------------------------------------------------
    def poll_once(self) -> bool:
        """Poll the input once (by default at most one batch per source); True if anything was read."""
        return self.input.poll()

    def ingest(self, batch: Batch, src: Source | None = None) -> None:
        """Ingest one batch through the input (by default: decode, join and bin it)."""
        self.input.ingest(batch, src)

    # -- checkpoints ---------------------------------------------------------------------------
    def _checkpoint_head(self) -> dict[str, Any]:
        """The checkpoint's documents besides the state: format, positions, alert states, calibrators."""
        pub = self.published
        return {
            "format": STATE_FORMAT, "version": STATE_VERSION, "calmon_version": __version__,
            "created": self.clock(),
            "sources": {src.name: src.position() for src in self.sources},
            "dead_letter": None if self.dead_letter is None else self.dead_letter.position(),
            "alerts": None if pub.alert_doc is None else dict(pub.alert_doc),
            "calibrators": dict(pub.calibrators),
        }

    def state_doc(self) -> dict[str, Any]:
        """Everything a restart needs, every bucket inline (call between batches, on the ingestion thread)."""
        return {**self._checkpoint_head(), **self.state.to_doc()}

    def checkpoint(self, wait: bool = True) -> bool:
        """Capture the state with the source and dead-letter positions; write it on the writer thread.

        Ingestion is blocked only while what changed since the last generation is copied (see
        :mod:`calmon.state.checkpoint.incremental`).  At most one checkpoint is in flight: with ``wait``
        this one waits for the previous one and then for itself (durable and offsets committed on
        return); without, it is skipped (returns False) while the previous one is being written.
        """
        ck = self.checkpointer
        if self.store is None or ck is None:
            return False
        self._checkpoint_done(wait=wait)
        if ck.busy:
            return False
        if self.dead_letter is not None:
            self.dead_letter.flush()
            if not self._dead_letters_settled():
                return False
        ck.submit(ck.capture(self.state, self._checkpoint_head()))
        if wait:
            self._checkpoint_done(wait=True)
        return True

    def _dead_letters_settled(self) -> bool:
        """True if every dead letter is durable in its sink; else defer the checkpoint (and say so, at most
        once a minute).

        A checkpoint covers the source records read so far; if the dead letters of some of them were
        still unacknowledged (a broker outage), a crash after the checkpoint would lose those letters.
        Deferring keeps them before the checkpoint: a restart replays their records and writes them.
        """
        assert self.dead_letter is not None
        pending = self.dead_letter.unacknowledged()
        if not pending:
            self._deferred_since = None
            return True
        now = time.monotonic()
        self._checkpoint_retry_at = now + 1.0
        if self._deferred_since is None:
            self._deferred_since = now
        if now - self._deferred_logged >= 60.0:
            self._deferred_logged = now
            log.warning("checkpoint deferred for %.0f s: %d dead letters not yet acknowledged by the dead-letter "
                        "sink", now - self._deferred_since, pending)
        return False

    def _checkpoint_done(self, wait: bool = False) -> None:
        """Commit source offsets of a committed generation (on the ingestion thread) and record it.

        Raises the writer's exception when the generation could not be written (as a failed save
        always did: the previous generation stays the state on disk).
        """
        ck = self.checkpointer
        if ck is None or not ck.busy:
            return
        res = ck.wait() if wait else ck.poll()
        if res is None:
            return
        for src in self.sources:
            pos = res.positions.get(src.name)
            if pos is not None and isinstance(src, Committable) and not src.commit(pos):
                log.warning("offset commit failed for %s (the checkpoint stays the source of truth)", src.name)
        log.debug("checkpoint %s: %d buckets, %d bytes, lock %.3f s, %.2f s", res.path, res.blobs, res.bytes,
                  res.lock_seconds, res.seconds)
        self._last_checkpoint = res
        self.checkpoint_info = {"last_timestamp": self.clock(), "duration": res.seconds,
                                "count": self.checkpoint_info["count"] + 1}

    def restore(self, doc: dict[str, Any]) -> None:
        """Load a checkpoint document and seek sources and the dead-letter sink to its positions.

        The document is checked against the checkpoint schema first
        (:mod:`calmon.state.checkpoint.schema`); a hand-edited or otherwise malformed one gives a
        :class:`StartupError` naming the file and the field.
        """
        where = self.store.loaded_path if self.store is not None and self.store.loaded_path else self.cfg.state_dir
        if doc.get("format") != STATE_FORMAT or doc.get("version") not in STATE_READABLE:
            raise StartupError(f"{where}: checkpoint is not a {STATE_FORMAT} document of version "
                               f"{' or '.join(map(str, STATE_READABLE))}")
        try:
            if self.store is None:
                self.state.load_doc(doc)
            else:
                with self.store.reader() as reader:
                    self.state.load_doc(doc, resolve=resolver(reader))
        except StateError as exc:
            raise StartupError(f"checkpoint {where}: {exc}") from None
        if self.checkpointer is not None:
            self.checkpointer.adopt(self.state, doc)
        alert_doc = doc.get("alerts") if self.alert_engine is not None else None
        if alert_doc and self.alert_engine is not None:
            try:
                self.alert_engine.load_state(alert_doc)
            except (KeyError, TypeError, ValueError) as exc:
                raise StartupError(f"checkpoint {where}: field alerts: {exc}") from None
        self.published = Published(calibrators=dict(doc.get("calibrators") or {}), alert_doc=alert_doc or None)
        by_name = {s.name: s for s in self.sources}
        for name, pos in doc["sources"].items():
            if name in by_name:
                by_name[name].seek(pos)
            else:
                log.warning("checkpoint has a position for source %r, which is not configured", name)
        if self.dead_letter is not None and doc.get("dead_letter") is not None:
            self.dead_letter.seek(doc["dead_letter"])
        log.info("resumed from checkpoint of %s", time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(doc["created"])))

    # -- evaluation ----------------------------------------------------------------------------
    def evaluate_round(self) -> None:
        """One scheduler round: snapshot, evaluate, publish, push alerts, run hooks."""
        if self.evaluator is None:
            return
        self._round_asked.set()
        with self._evaluating:
            self._round_asked.clear()
            self._evaluate_round(self.evaluator)

    def _evaluate_round(self, evaluator: Evaluator) -> None:
        pub = self.published
        snap = self.state.snapshot()
        changes, watermark = self.state.change_view()
        # once the input is exhausted no later round comes: this one waits for the expensive testers too
        res = evaluator.run(snap, pub.calibrators, pub.alerts, changes, watermark, complete=self.done)
        self.metrics.evaluation_duration.observe(res.duration)
        self._publish(res)
        if self.alertmanager is not None and res.alert_states:
            if not self.alertmanager.push(res.alert_states, self.clock()):
                log.warning("alertmanager push failed: %s", self.alertmanager.last_error)
        for hook in self.round_hooks:
            try:
                hook(res.evaluations)
            except Exception:  # noqa: BLE001 - a hook is user code (the demo's console); it must not stop the scheduler
                log.exception("round hook failed")

    def _settle(self, until: float, interrupted: Callable[[], bool]) -> bool:
        """Between rounds (scheduler thread): publish tester results that arrive; True while some are running."""
        if self.evaluator is None or not self.evaluator.busy or self._round_asked.is_set():
            return False  # (a round asked for elsewhere: it collects the results, no more settling this period)
        with self._evaluating:
            evaluations = self.evaluator.settle(until, lambda: interrupted() or self._round_asked.is_set(),
                                                self._prepare_cost)
            if evaluations is not None:
                self.published = dataclasses.replace(self.published, evaluations=tuple(evaluations))
                t0 = time.monotonic()
                self.metrics.prepare(round_state(self.published))
                self._prepare_cost = time.monotonic() - t0
            return self.evaluator.busy

    def withdraw(self, models: Collection[str]) -> None:
        """Take the published evaluations of ``models`` off ``/metrics`` and the status at once.

        For an input whose models moved to another agent (the cluster evaluator's revoked
        partitions); it has dropped them from the state, so the next round does not see them either.
        """
        pub = self.published
        self.published = dataclasses.replace(
            pub, evaluations=tuple(e for e in pub.evaluations if e["model"] not in models))
        self.metrics.prepare(round_state(self.published))

    def _publish(self, res: RoundResult) -> None:
        old = self.published.scheduler
        sched: SchedulerInfo = {"evaluations": old.get("evaluations", 0) + 1,
                                "overruns": old.get("overruns", 0) + int(res.overrun),
                                "last_timestamp": res.finished_at, "last_duration": res.duration}
        self.published = Published(tuple(res.evaluations), tuple(res.alerts), res.calibrators, sched,
                                   res.alert_doc if res.alert_doc is not None else self.published.alert_doc,
                                   work=res.work, nbytes=model_bytes(self.state))
        self.metrics.prepare(round_state(self.published))  # /metrics renders the round's part once, here

    # -- views ---------------------------------------------------------------------------------
    def metrics_state(self) -> dict[str, Any]:
        """Consistent copy of everything the Prometheus collector exports."""
        return metrics_state(self.state, self.published, self.checkpoint_info, self.is_ready(), self.clock())

    def live_state(self) -> LiveView:
        """The live part of ``/metrics`` (counters under the lock; the round part is cached)."""
        return live_state(self.state, self.checkpoint_info, self.is_ready(), self.clock())

    @property
    def sched_info(self) -> dict[str, Any]:
        return dict(self.published.scheduler)

    def status(self) -> dict[str, Any]:
        """The status snapshot served at ``/api/status`` and rendered at ``/``."""
        pub = self.published
        live, rnd = status_views(self.state, pub, self.checkpoint_info, self.is_ready(), self.clock())
        now = self.clock()
        doc = status_document(live, rnd, pub, windows=list(self.state.windows), tiers=self.state.tiers,
                              started_at=self.started_at, now=now)
        sched = doc["agent"]["scheduler"]
        sched["every"] = self.cfg.evaluation.every
        if self.scheduler is not None:
            sched["next_at"] = now + max(0.0, self.scheduler.next_at - time.monotonic())
        doc["agent"]["tests"] = [t.name for t in self.cfg.evaluation.tests]
        return doc


def _size(n: int) -> str:
    """``3.1 MB``, ``980 kB``, ``512 B`` (decimal units, as ``ls -h --si``)."""
    for unit, size in (("MB", 1e6), ("kB", 1e3)):
        if n >= size:
            return f"{n / size:.1f} {unit}"
    return f"{n} B"
