"""The agent runtime: sources -> decode -> join -> event-time windows, with checkpoints and the exporter.

Threads
-------
* the **ingestion loop** (the caller of :meth:`Agent.run`, normally the main thread): reads a
  batch from each source, decodes it in one vectorised pass, joins predictions with outcomes,
  bins labeled events into the windows (under the state lock, milliseconds per batch), writes
  rejected records to the dead-letter sink and, every ``checkpoint.every`` seconds and on
  stop, writes a checkpoint;
* the **scheduler** (:mod:`calmon.agent.scheduler`), evaluating window snapshots;
* the **HTTP exporter** (:mod:`calmon.exporter.http`).

Checkpoints
-----------
A checkpoint is written between two batches, when the state holds exactly the records up to
every source's position: it contains the decoder state, the join buffers, every ring of every
model, all counters, each source's position and the dead-letter sink's position, in one
document saved atomically by :class:`calmon.checkpoint.CheckpointStore`.  On start the agent
loads it, seeks each source to its position and truncates the dead-letter file to its
position: records after the checkpoint are read again and everything derived from them is
rebuilt, so after a crash no event is lost and none is counted twice.

Event time
----------
The watermark is the largest event time seen, in record order.  Events without ``ts`` take
the arrival (wall-clock) time.  Labeled events older than ``watermark - allowed_lateness`` are
dropped and counted (``calmon_events_late_total``); joined events are placed at their
prediction's time.
"""

from __future__ import annotations

import logging
import math
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from calmon import __version__
from calmon.agent.join import Joiner
from calmon.agent.scheduler import Scheduler, check_testers, clean, evaluate_window
from calmon.agent.state import BucketStats, ModelWindows
from calmon.config import Config, ConfigError, format_duration
from calmon.events import KINDS, LABELED, DecodedBatch, Decoder
from calmon.exporter.http import Endpoints, HTTPExporter, tls_context
from calmon.exporter.metrics import AgentMetrics
from connectors.base import Batch

log = logging.getLogger("calmon.agent")

CHECKPOINT_FORMAT = "calmon.agent_state"
CHECKPOINT_VERSION = 1


class StartupError(RuntimeError):
    """The agent cannot start (bad checkpoint, unusable source...): one line, exit code 2."""


# ------------------------------------------------------------------------------------------- builders
def build_source(scfg: Any) -> Any:
    """Construct the connector of a :class:`~calmon.config.SourceConfig`."""
    if scfg.type == "file":
        from connectors.files import FileSource

        return FileSource(scfg.path, format=scfg.format, follow=scfg.follow, name=scfg.name, **scfg.options)
    if scfg.type == "kafka":
        try:
            from connectors.kafka import KafkaSource
        except ImportError as exc:  # pragma: no cover - depends on the installation
            raise StartupError(f"sources.{scfg.name}: Kafka support is not available ({exc})") from None
        return KafkaSource.from_config({**scfg.options, "name": scfg.name})
    if scfg.type == "simulate":
        from calmon.agent.simsource import SimulatedSource

        return SimulatedSource(name=scfg.name, **scfg.options)
    raise StartupError(f"unknown source type {scfg.type!r}")  # pragma: no cover - validated by the config


def build_dead_letter(cfg: Config) -> Any:
    """Construct the dead-letter sink (``None`` for ``type: none``)."""
    dl = cfg.dead_letter
    if dl.type == "none":
        return None
    if dl.type == "file":
        from connectors.deadletter import FileDeadLetterSink

        path = Path(dl.path)
        if not path.is_absolute():
            path = Path(cfg.state_dir) / path
        return FileDeadLetterSink(path, **dl.options)
    from connectors.kafka import KafkaDeadLetterSink

    return KafkaDeadLetterSink.from_config(dl.options)


def _status_html(snapshot: dict[str, Any]) -> str:
    try:
        from calmon.statuspage import render
    except ImportError:
        import html
        import json

        return ("<!doctype html><title>calmon</title><h1>calmon status</h1><pre>"
                + html.escape(json.dumps(snapshot, indent=1)) + "</pre>")
    return render(snapshot)


# ------------------------------------------------------------------------------------------- agent
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

    Examples
    --------
    >>> import tempfile, pathlib
    >>> from calmon.config import build_config
    >>> d = pathlib.Path(tempfile.mkdtemp())
    >>> _ = (d / "ev.jsonl").write_text("".join(
    ...     f'{{"model": "m", "ts": {1000 + i}, "score": 0.5, "label": {i % 2}}}\\n' for i in range(10)))
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

    def __init__(self, cfg: Config, sources: list[Any] | None = None, clock: Callable[[], float] = time.time) -> None:
        check_testers(cfg.evaluation)
        if cfg.alerts.enabled and cfg.alerts.rules:
            from calmon.alerts import validate_rules

            try:
                validate_rules(cfg.alerts.rules, "alerts.rules")
            except ValueError as exc:
                where, _, why = str(exc).partition(": ")
                raise ConfigError(where if why else "alerts.rules", why or str(exc)) from None
        self.cfg = cfg
        self.clock = clock
        self.lock = threading.RLock()
        self._stop = threading.Event()
        self.windows = cfg.windows.window_seconds()
        self.tiers = [(t.width, t.count) for t in cfg.windows.tiers]
        declared = {n: m.classes for n, m in cfg.models.items() if n != "default" and m.classes}
        self.decoder = Decoder(models=declared, max_models=cfg.limits.max_models,
                               max_segments=cfg.limits.max_segments, discover=cfg.accept_unknown_models)
        self.joiner = Joiner(cfg.join.ttl, cfg.join.max_pending)
        self.models: dict[str, ModelWindows] = {}
        self.counters: dict[str, Any] = {"events": {}, "rejected": {}, "late": {}, "records": {}, "batches": 0}
        self.source_info: dict[str, dict[str, Any]] = {}
        self.sched_info: dict[str, Any] = {"evaluations": 0, "overruns": 0, "last_timestamp": None}
        self.checkpoint_info: dict[str, Any] = {"last_timestamp": None, "duration": None, "count": 0}
        self.evaluations: list[dict[str, Any]] = []
        self.alerts: list[dict[str, Any]] = []
        self.calibrators: dict[str, dict[str, Any]] = {}
        self.last_refresh = 0.0
        self.ready = False
        self.done = False
        self._sources_override = sources
        self.sources: list[Any] = []
        self.dead_letter: Any = None
        self.store: Any = None
        self.http: HTTPExporter | None = None
        self.scheduler: Scheduler | None = None
        self.metrics = AgentMetrics(self.metrics_state)
        self.alert_engine: Any = None
        if cfg.alerts.enabled and cfg.alerts.rules:
            from calmon.alerts import AlertEngine

            self.alert_engine = AlertEngine(cfg.alerts.rules)
        self._ingest_thread: threading.Thread | None = None
        self.started_at = self.clock()
        #: Callables ``fn(evaluations)`` run after each evaluation round (the demo prints from one).
        self.round_hooks: list[Callable[[list[dict[str, Any]]], None]] = []

    # -- lifecycle -----------------------------------------------------------------------------
    def open(self) -> None:
        """Build sources and sinks, load the checkpoint, seek, start the exporter and the scheduler."""
        os.makedirs(self.cfg.state_dir, exist_ok=True)
        try:
            self.sources = self._sources_override or [build_source(s) for s in self.cfg.sources]
        except (ValueError, OSError) as exc:
            raise StartupError(f"sources: {exc}") from None
        self.dead_letter = build_dead_letter(self.cfg)
        if self.cfg.checkpoint.enabled:
            from calmon.checkpoint import CheckpointStore

            self.store = CheckpointStore(Path(self.cfg.state_dir) / "checkpoints")
            doc = self.store.load()
            if doc is not None:
                self.restore(doc)
            else:
                # an initial checkpoint at the start positions: a crash before the first periodic
                # checkpoint must also roll the dead-letter file back (else its records would repeat)
                self.checkpoint()
        for src in self.sources:
            self.source_info.setdefault(src.name, {})
        if self.cfg.exporter.enabled:
            self.http = self._start_http()
        self.scheduler = Scheduler(self.evaluate_round, self.cfg.evaluation.every).start()
        self.ready = True

    def _start_http(self) -> HTTPExporter:
        ex = self.cfg.exporter
        tls = tls_context(ex.tls.cert_file, ex.tls.key_file, ex.tls.client_ca_file) if ex.tls.cert_file else None
        auth = (ex.basic_auth.username, ex.basic_auth.resolved_password()) if ex.basic_auth.username else None
        endpoints = Endpoints(self.metrics.render, self.healthy, self.is_ready, self.status, _status_html)
        try:
            return HTTPExporter(endpoints, ex.address, ex.port, tls=tls, basic_auth=auth).start()
        except OSError as exc:
            raise StartupError(f"exporter: cannot listen on {ex.address}:{ex.port}: {exc.strerror or exc}") from None

    def is_ready(self) -> bool:
        """State loaded and every source connected (sources without a ``connected`` flag always are)."""
        return self.ready and all(getattr(s, "connected", True) for s in self.sources)

    def healthy(self) -> bool:
        ing = self._ingest_thread is None or self._ingest_thread.is_alive() or self.done
        return ing and (self.scheduler is None or self.scheduler.alive())

    def stop(self) -> None:
        """Ask the ingestion loop to finish its batch, checkpoint and return (signal-safe)."""
        self._stop.set()

    def close(self) -> None:
        if self.scheduler is not None:
            self.scheduler.stop()
        if self.http is not None:
            self.http.stop()
            self.http = None
        for src in self.sources:
            try:
                src.close()
            except Exception:  # noqa: BLE001 - best effort on shutdown
                log.exception("closing source %s", getattr(src, "name", "?"))
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
                if self.cfg.checkpoint.enabled and time.monotonic() - last_ck >= self.cfg.checkpoint.every:
                    self.checkpoint()
                    last_ck = time.monotonic()
                if not got and all(s.exhausted for s in self.sources):
                    if not self.done:
                        self.finish_input()
                    if self.cfg.ingest.exit_when_done:
                        break
                    self._stop.wait(self.cfg.ingest.poll_timeout)
            if self.cfg.checkpoint.enabled:
                self.checkpoint()
        finally:
            self.close()
        return 0

    def finish_input(self) -> None:
        """Every read-once source is exhausted: expire the join, evaluate now and wait for the round."""
        with self.lock:
            self.joiner.sweep()
        self.done = True
        if self.scheduler is not None:
            before = self.scheduler.rounds
            self.scheduler.trigger()
            self.scheduler.wait_round(before, timeout=max(60.0, 2 * self.cfg.evaluation.budget), cancel=self._stop)
        log.info("all sources exhausted")

    # -- ingestion -----------------------------------------------------------------------------
    def poll_once(self) -> bool:
        """Read and ingest at most one batch per source; True if anything was read."""
        got = False
        timeout = self.cfg.ingest.poll_timeout / max(1, len(self.sources))
        for src in self.sources:
            if src.exhausted:
                continue
            batch = src.read(self.cfg.ingest.batch_size, timeout)
            if batch is not None and batch.records:
                self.ingest(batch, src)
                got = True
        return got

    def ingest(self, batch: Batch, src: Any = None) -> None:
        """Decode, join and bin one batch; count it; dead-letter its rejects."""
        now = self.clock()
        decoded = self.decoder.decode(batch.records, batch.origins)
        if decoded.rejected and self.dead_letter is not None:
            self.dead_letter.write([batch.records[r.index] for r in decoded.rejected],
                                   [r.reason for r in decoded.rejected], batch.source,
                                   [r.origin or "" for r in decoded.rejected] if batch.origins else None)
        with self.lock:
            self._apply(decoded, now)
            c = self.counters
            c["batches"] += 1
            for r in decoded.rejected:
                c["rejected"][r.reason] = c["rejected"].get(r.reason, 0) + 1
            c["records"][batch.source] = c["records"].get(batch.source, 0) + len(batch.records)
            info = self.source_info.setdefault(batch.source, {})
            newest = max((float(np.nanmax(mb.ts)) for mb in decoded.models.values() if mb.ts.size), default=None)
            if newest is not None:
                info["newest_event"] = max(newest, info.get("newest_event", -math.inf))
            if src is not None and hasattr(src, "lag_bytes"):
                info["lag_bytes"] = src.lag_bytes()
            if src is not None and hasattr(src, "lag"):
                try:
                    info["lag_records"] = int(sum(src.lag().values()))
                except Exception as exc:  # noqa: BLE001 - lag is best effort
                    log.debug("lag of %s unavailable: %s", batch.source, exc)

    def _fill_time(self, decoded: DecodedBatch, now: float) -> np.ndarray | None:
        """Fill missing event times with ``now``; return the watermark at each event (record order)."""
        mbs = list(decoded.models.values())
        if not mbs:
            return None
        for mb in mbs:
            if np.isnan(mb.ts).any():
                mb.ts = np.where(np.isnan(mb.ts), now, mb.ts)
        idx = np.concatenate([mb.index for mb in mbs])
        ts = np.concatenate([mb.ts for mb in mbs])
        order = np.argsort(idx, kind="stable")
        wm_sorted = np.maximum.accumulate(np.concatenate([[self.joiner.watermark], ts[order]]))[1:]
        wm = np.empty_like(wm_sorted)
        wm[order] = wm_sorted
        return wm

    def _apply(self, decoded: DecodedBatch, now: float) -> None:
        wm_all = self._fill_time(decoded, now)
        if wm_all is None:
            return
        joined = self.joiner.process(decoded.models)  # advances the watermark in record order
        watermark = self.joiner.watermark
        lateness = self.cfg.windows.allowed_lateness
        offsets = np.cumsum([0] + [len(mb) for mb in decoded.models.values()])
        c = self.counters
        for (name, mb), off in zip(decoded.models.items(), offsets[:-1]):
            kinds = np.bincount(mb.kind, minlength=3)
            label = name or ""
            for k, cnt in enumerate(kinds.tolist()):
                if cnt:
                    key = (label, KINDS[k])
                    c["events"][key] = c["events"].get(key, 0) + cnt
            if not name:
                continue
            lab = mb.kind == LABELED
            if not lab.any():
                continue
            wm = wm_all[off:off + len(mb)]
            late = lab & (mb.ts < wm - lateness)
            if late.any():
                c["late"][name] = c["late"].get(name, 0) + int(late.sum())
                lab &= ~late
            sel = np.flatnonzero(lab)
            if sel.size:
                self._windows_of(name, mb.classes).add(
                    mb.ts[sel], mb.segment[sel], mb.label[sel], None if mb.score is None else mb.score[sel],
                    None if mb.probs is None else mb.probs[sel], watermark)
        for name, jb in joined.items():
            self._windows_of(name, jb.classes).add(jb.ts, jb.segment, jb.label, jb.score, jb.probs, watermark)

    def _windows_of(self, name: str, classes: int) -> ModelWindows:
        mw = self.models.get(name)
        if mw is None:
            m = self.cfg.model(name)
            mw = self.models[name] = ModelWindows(
                name, classes, self.tiers, m.segments, bins=m.bins, reservoir=m.reservoir,
                levelset_lambda=m.levelset_lambda, reliability_bins=self.cfg.evaluation.reliability_bins)
        return mw

    # -- checkpoints ---------------------------------------------------------------------------
    def state_doc(self) -> dict[str, Any]:
        """Everything a restart needs (call between batches)."""
        with self.lock:
            return {
                "format": CHECKPOINT_FORMAT, "version": CHECKPOINT_VERSION, "calmon_version": __version__,
                "created": self.clock(),
                "decoder": self.decoder.state(),
                "join": self.joiner.to_dict(),
                "models": {name: mw.to_dict() for name, mw in self.models.items()},
                "counters": {"events": [[m, k, n] for (m, k), n in self.counters["events"].items()],
                             "rejected": dict(self.counters["rejected"]), "late": dict(self.counters["late"]),
                             "records": dict(self.counters["records"]), "batches": self.counters["batches"]},
                "sources": {src.name: src.position() for src in self.sources},
                "dead_letter": None if self.dead_letter is None else self.dead_letter.position(),
                "alerts": None if self.alert_engine is None else self.alert_engine.to_dict(),
                "calibrators": self.calibrators,
            }

    def checkpoint(self) -> None:
        """Write the state, source positions and dead-letter position together, atomically."""
        if self.store is None:
            return
        t0 = time.monotonic()
        if self.dead_letter is not None:
            self.dead_letter.flush()
        doc = self.state_doc()
        self.store.save(doc)
        for src in self.sources:
            commit = getattr(src, "commit", None)
            if callable(commit):
                try:
                    commit(doc["sources"][src.name])
                except Exception:  # noqa: BLE001 - the checkpoint is the source of truth
                    log.warning("offset commit failed for %s", src.name)
        self.checkpoint_info.update(last_timestamp=self.clock(), duration=time.monotonic() - t0,
                                    count=self.checkpoint_info["count"] + 1)

    def restore(self, doc: dict[str, Any]) -> None:
        """Load a checkpoint document and seek sources and the dead-letter sink to its positions."""
        if doc.get("format") != CHECKPOINT_FORMAT or doc.get("version") != CHECKPOINT_VERSION:
            raise StartupError(f"{self.cfg.state_dir}: checkpoint is not a {CHECKPOINT_FORMAT} "
                               f"v{CHECKPOINT_VERSION} document")
        tiers = [(float(w), int(c)) for w, c in self.tiers]
        for name, md in doc["models"].items():
            if [(float(w), int(c)) for w, c in md["tiers"]] != tiers:
                raise StartupError(f"windows.tiers: the checkpoint in {self.cfg.state_dir} was written with tiers "
                                   f"{md['tiers']}; restore them or start with an empty state directory")
            self.models[name] = ModelWindows.from_dict(md)
        self.decoder.load_state(doc["decoder"])
        self.joiner = Joiner.from_dict(doc["join"])
        self.joiner.ttl = self.cfg.join.ttl
        self.joiner.max_pending = self.cfg.join.max_pending
        c = doc["counters"]
        self.counters = {"events": {(m, k): n for m, k, n in c["events"]}, "rejected": dict(c["rejected"]),
                         "late": dict(c["late"]), "records": dict(c["records"]), "batches": c["batches"]}
        self.calibrators = doc.get("calibrators") or {}
        if self.alert_engine is not None and doc.get("alerts"):
            self.alert_engine.load_state(doc["alerts"])
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
    def snapshot(self) -> list[tuple[str, str, str, BucketStats]]:
        """Window sums of every (model, segment, window), taken under the lock."""
        out = []
        with self.lock:
            wm = self.joiner.watermark
            for name in sorted(self.models):
                mw = self.models[name]
                for seg, ring in mw.rings.items():
                    sums = ring.window_sums(self.windows, watermark=wm)
                    out.extend((name, seg, w, sums[w]) for w in self.windows)
        return out

    def evaluate_round(self) -> None:
        """One scheduler round: snapshot, metrics and testers, alerts, recalibration, exported state."""
        t0 = time.monotonic()
        cfg = self.cfg.evaluation
        deadline = t0 + cfg.budget
        snap = self.snapshot()
        evaluations = []
        overrun = False
        for model, seg, window, bucket in snap:
            ev, skipped = evaluate_window(model, seg, window, bucket, cfg, deadline)
            overrun |= skipped
            evaluations.append(ev)
        alerts = self.alerts
        if self.alert_engine is not None:
            states = self.alert_engine.evaluate(evaluations, self.clock())
            alerts = [clean(st.to_dict()) for st in states]
        rc = self.cfg.recalibration
        if rc.enabled and (self.last_refresh == 0.0 or time.monotonic() - self.last_refresh >= rc.every):
            if self._recalibrate(snap):  # the period starts with the first refit on real data
                self.last_refresh = time.monotonic()
        duration = time.monotonic() - t0
        overrun |= duration > cfg.budget
        self.metrics.evaluation_duration.observe(duration)
        with self.lock:
            self.evaluations = evaluations
            self.alerts = alerts
            self.sched_info["evaluations"] += 1
            self.sched_info["overruns"] += int(overrun)
            self.sched_info["last_timestamp"] = self.clock()
            self.sched_info["last_duration"] = duration
        for hook in self.round_hooks:
            try:
                hook(evaluations)
            except Exception:  # noqa: BLE001 - a hook must not stop the scheduler
                log.exception("round hook failed")

    def _recalibrate(self, snap: list[tuple[str, str, str, BucketStats]]) -> bool:
        """Refit calibrators on the configured window of every model; True if any model had data."""
        try:
            from calmon.calibration.refresh import DirectoryStore, refresh
        except ImportError:
            log.warning("recalibration is enabled but calmon.calibration.refresh is not available")
            return False
        ran = False
        rc = self.cfg.recalibration
        store = DirectoryStore(rc.options.get("store_dir", str(Path(self.cfg.state_dir) / "calibrators")))
        for model, seg, window, bucket in snap:
            if seg != "all" or window != rc.window:
                continue
            data = bucket.stats.calibration_data()
            if data.z is None or len(data.z) < 10:
                continue
            ran = True
            m = len(data.z)
            cut = np.arange(m) % 5 == 4  # every fifth reservoir row is held out (reservoir order is random)
            from calmon.testers import CalibrationData

            train = CalibrationData(n=int((~cut).sum()), z=data.z[~cut], y=data.y[~cut],
                                    probs=None if data.probs is None else data.probs[~cut],
                                    labels=None if data.labels is None else data.labels[~cut])
            hold = CalibrationData(n=int(cut.sum()), z=data.z[cut], y=data.y[cut],
                                   probs=None if data.probs is None else data.probs[cut],
                                   labels=None if data.labels is None else data.labels[cut])
            try:
                res = refresh(train, hold, rc.methods, model=model, publishers=[store], window={"name": window},
                              min_train=int(rc.options.get("min_train", 200)),
                              min_holdout=int(rc.options.get("min_holdout", 50)))
            except Exception as exc:  # noqa: BLE001 - a failed refit must not stop evaluation
                log.warning("recalibration of %s failed: %s", model, exc)
                continue
            if res.get("published") or model not in self.calibrators:
                with self.lock:
                    self.calibrators[model] = {"model": model, "method": res.get("method") or "none",
                                               "version": res.get("revision"), "before": res.get("before"),
                                               "after": res.get("after"), "reason": res.get("reason")}
        return ran

    # -- views -------------------------------------------------------------------------------
    def metrics_state(self) -> dict[str, Any]:
        """Consistent copy of everything the Prometheus collector exports."""
        now = self.clock()
        with self.lock:
            sources = {}
            for name, info in self.source_info.items():
                newest = info.get("newest_event")
                sources[name] = {"records": self.counters["records"].get(name, 0),
                                 "lag_seconds": None if newest is None else max(0.0, now - newest),
                                 "lag_bytes": info.get("lag_bytes"), "lag_records": info.get("lag_records")}
            jc = self.joiner.counters
            return {
                "version": __version__, "ready": self.is_ready(),
                "events": dict(self.counters["events"]), "rejected": dict(self.counters["rejected"]),
                "late": dict(self.counters["late"]),
                "join": {"joined": dict(jc.joined), "expired": dict(jc.expired), "duplicates": dict(jc.duplicates),
                         "orphans": jc.orphans},
                "pending": self.joiner.pending_count(),
                "sources": sources, "scheduler": dict(self.sched_info), "checkpoint": dict(self.checkpoint_info),
                "state_bytes": {name: mw.nbytes() for name, mw in self.models.items()},
                "evaluations": self.evaluations, "alerts": list(self.alerts),
                "calibrators": [c for c in self.calibrators.values() if c.get("version") is not None],
            }

    def status(self) -> dict[str, Any]:
        """The status snapshot served at ``/api/status`` and rendered at ``/``."""
        st = self.metrics_state()
        return clean({
            "generated_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(self.clock())),
            "version": __version__,
            "evaluations": st["evaluations"], "alerts": st["alerts"], "calibrators": dict(self.calibrators),
            "agent": {
                "ready": st["ready"], "uptime_seconds": self.clock() - self.started_at,
                "watermark": None if self.joiner.watermark == -math.inf else self.joiner.watermark,
                "windows": list(self.windows), "tiers": [f"{c} x {format_duration(w)}" for w, c in self.tiers],
                "events": [{"model": m, "type": k, "count": n} for (m, k), n in sorted(st["events"].items())],
                "rejected": st["rejected"], "late": st["late"], "join": st["join"], "pending": st["pending"],
                "sources": st["sources"], "scheduler": st["scheduler"], "checkpoint": st["checkpoint"],
                "state_bytes": st["state_bytes"],
            },
        })
