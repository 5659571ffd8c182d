"""The evaluate stage (``calmon run --role evaluate``): statistic deltas -> windows -> evaluation, per owned model.

A consumer group over the deltas topic, which is keyed by model, so each model belongs to the
evaluator owning its partition.  The evaluator is the ordinary agent (:class:`~calmon.agent.runtime.Agent`:
windows, scheduler, testers, alerts, recalibration, ``/metrics``, status page) built by
:func:`evaluate_agent` with a :class:`DeltasInput`, which merges deltas instead of decoding events,
and an :class:`EvaluateMetrics` collector of its ``calmon_cluster_*`` families:

* deltas are read ``read_committed``: a range's deltas are visible once its transaction committed (with its
  state and consumed offset, see :mod:`calmon.cluster.transactions`), never if it aborted -- decided by the
  transaction markers on the client (:mod:`connectors.kafka.committed`), so also on a broker that returns
  aborted records (Tansu 0.6); ``calmon_cluster_aborted_records_total`` counts what was dropped;
* a delta of ``(input partition, model)`` whose range ends at or before the last one applied for that
  pair is dropped: after a snapshot restore the deltas partition is replayed from before what the snapshot
  covers, which no transaction spans, and an ingest worker that falls back to an older state processes committed
  ranges again; the table of last ends is part of the state;
* every ``cluster.snapshot_every`` the changed models are written to the compacted snapshots topic
  (:mod:`calmon.cluster.snapshots`); a partition's new owner restores them and replays only the deltas
  from ``min(o_m)`` on (from the beginning without snapshots), so the agent's own checkpoints are off;
* when a partition is revoked its models, their counters and their de-duplication entries are
  dropped at once, so ``/metrics`` of all evaluators together show each series once;
* ``/readyz`` is false until every owned partition has been read up to its end as of its assignment.

On a clean stop (SIGTERM) the evaluator writes what it owns to ``<state_dir>/owned-state.json``
(models, counters, the de-duplication table) for inspection; it is never read back.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from calmon.agent.inputs import Host
from calmon.agent.runtime import Agent
from calmon.cluster.changes import feed as feed_changes
from calmon.cluster.changes import restore_detector
from calmon.cluster.deltas import Delta, DeltaError, merge_delta
from calmon.cluster.ownership import GROUP_REPAIRS_HELP, render_ownership
from calmon.cluster.records import BadRecord, BadRecords
from calmon.cluster.snapshot_store import SnapshotStore
from calmon.cluster.snapshot_writer import SnapshotWriter
from calmon.cluster.snapshots import Manifest, ModelSnapshot, copy_windows, keep_delta, restore_start
from calmon.cluster.topics import ClusterError, Producer, ensure_topics, new_writer_id
from calmon.config import Config
from calmon.formats.jsonio import write_json_atomic
from calmon.state.agentstate import AgentState
from calmon.state.buckets import ModelWindows
from calmon.state.monitors import ChangeMonitor
from connectors.base import Batch, Source
from connectors.kafka import KafkaSource

log = logging.getLogger("calmon.cluster")

__all__ = ["DeltasInput", "EvaluateMetrics", "evaluate_agent", "evaluate_config", "DUMP_NAME"]

DUMP_NAME = "owned-state.json"
#: Deltas per read: a delta costs milliseconds to decode and merge (several bucket documents), and the consumer
#: must poll again well within ``max_poll_interval_ms`` or the group evicts it (a replay reads thousands).
DELTA_BATCH = 100
#: Seconds one read's deltas should take to merge (the batch size adapts to the measured cost per delta).
READ_BUDGET = 0.5


def read_committed(source: type[KafkaSource], client: Mapping[str, Any]) -> dict[str, Any]:
    """``client`` with the isolation level ``read_committed`` in the spelling of ``source``'s client library.

    Examples
    --------
    >>> read_committed(KafkaSource, {"client_id": "x"})
    {'client_id': 'x', 'isolation_level': 'read_committed'}
    """
    key = "isolation.level" if source.ADAPTER.library == "confluent" else "isolation_level"
    return {**dict(client), key: "read_committed"}


def evaluate_config(cfg: Config) -> Config:
    """The agent configuration of an evaluator: no checkpoints (replay restores), no dead letters, at most
    :data:`DELTA_BATCH` deltas per read; its change detectors are fed the pairs the deltas carry
    (:mod:`calmon.cluster.changes`)."""
    return dataclasses.replace(
        cfg, checkpoint=dataclasses.replace(cfg.checkpoint, enabled=False),
        dead_letter=dataclasses.replace(cfg.dead_letter, type="none"),
        ingest=dataclasses.replace(cfg.ingest, batch_size=min(cfg.ingest.batch_size, DELTA_BATCH)))


def evaluate_agent(cfg: Config, clock: Callable[[], float] = time.time) -> Agent:
    """The evaluator: an agent on :func:`evaluate_config` fed by a :class:`DeltasInput`, exporting its
    :class:`EvaluateMetrics` (see the module docstring).

    Parameters
    ----------
    cfg
        Validated configuration (``cluster.bootstrap_servers`` set).
    clock
        Wall clock.

    Returns
    -------
    Agent
        Not opened; its :attr:`~calmon.agent.runtime.Agent.input` is the :class:`DeltasInput`.
    """
    deltas = DeltasInput(cfg)
    return Agent(evaluate_config(cfg), clock=clock, input=deltas, collectors=[EvaluateMetrics(deltas)])


class DeltasInput:
    """An agent's input (:class:`~calmon.agent.inputs.Input`) from the deltas topic: the partitions this
    evaluator owns, their deltas merged into the agent's windows (see the module docstring).

    Parameters
    ----------
    cfg
        Validated configuration (``cluster.bootstrap_servers`` set); the consumer of the deltas topic is
        built from its ``cluster`` section, the rest is read from the agent's configuration once attached.
    """

    def __init__(self, cfg: Config) -> None:
        cl = cfg.cluster
        # read_committed: the deltas of an aborted range (its worker died or was fenced) are never merged
        self.deltas = KafkaSource(cl.bootstrap_servers, [cl.deltas_topic], group_id=cl.evaluate_group,
                                  name="deltas", client=read_committed(KafkaSource, cl.client),
                                  position_policy="checkpoint", auto_offset_reset="earliest")
        self.sources: list[Source] = []
        self._agent: Host | None = None
        self.worker = new_writer_id()
        #: (input partition, model) -> end of the last range applied
        self.applied: dict[tuple[str, str], int] = {}
        #: model -> the deltas partition it came from
        self.partition_of: dict[str, str] = {}
        self.owned: set[str] = set()
        #: deltas partition -> offset to reach before it counts as restored (its end when it was assigned)
        self.restoring: dict[str, tuple[float, int | None]] = {}
        self.restore_seconds: float | None = None
        self.dropped_repeats = 0
        #: delta and snapshot records skipped, by reason (``calmon_cluster_bad_records_total``)
        self.bad = BadRecords("evaluate", self.worker)
        self._per_delta = 0.01  #: seconds per delta (moving average), sizes the reads
        #: model -> deltas offset its restored snapshot covers (``o_m``); models changed since the last snapshot
        self.covers: dict[str, int] = {}
        #: model -> largest watermark of its deltas (a snapshot restores its own, not its writer's global one)
        self.watermarks: dict[str, float] = {}
        self.dirty: set[str] = set()
        self.restored_parts: set[str] = set()
        self.snapshots_written = self.snapshot_bytes = self.snapshot_models_restored = self.deltas_read = 0
        self._store: SnapshotStore | None = None
        self._store_lock = threading.Lock()
        self._last_snapshot = time.monotonic()
        #: deltas partition -> one past the last offset processed (merged, dropped or refused), under the state
        #: lock: a snapshot's offsets come from it, not from the consumer's position (which runs ahead of merging)
        self.merged_to: dict[str, int] = {}
        #: input partitions seen (the de-duplication table's sources: a model's entries without a full scan)
        self.sources_seen: set[str] = set()
        self.snapshot_writer: SnapshotWriter | None = None

    # -- the Input protocol ------------------------------------------------------------------------
    @property
    def agent(self) -> Host:
        if self._agent is None:
            raise RuntimeError("DeltasInput is not attached to an agent")
        return self._agent

    @property
    def state(self) -> AgentState:
        """The windows and counters the deltas are merged into (the agent's)."""
        return self.agent.state

    @property
    def cfg(self) -> Config:
        """The agent's configuration (:func:`evaluate_config`)."""
        return self.agent.cfg

    def attach(self, agent: Host) -> None:
        if self._agent is not None and self._agent is not agent:
            raise ValueError("an input feeds one agent")
        self._agent = agent

    def open(self) -> None:
        self.sources = [self.deltas]
        every = self.cfg.cluster.snapshot_every
        if every > 0 and self.snapshot_writer is None:  # snapshots off the poll thread (snapshot_writer.py)
            self.snapshot_writer = SnapshotWriter(min(every, 1.0), self._maybe_snapshot)
            self.snapshot_writer.start()

    def poll(self) -> bool:
        """Read and merge one batch of deltas, sized to take about :data:`READ_BUDGET` seconds."""
        if not self.agent.stopping:  # once stopping, what we own is frozen for the exit dump
            self._sync_ownership()
        size = max(1, min(self.cfg.ingest.batch_size, int(READ_BUDGET / max(self._per_delta, 1e-6))))
        batch = self.deltas.read(size, self.cfg.ingest.poll_timeout)
        if batch is None or not batch.records:
            return False
        t0 = time.monotonic()
        self.ingest(batch, self.deltas)
        self._per_delta = 0.7 * self._per_delta + 0.3 * (time.monotonic() - t0) / len(batch.records)
        return True

    def ingest(self, batch: Batch, src: Source | None = None) -> None:
        """Merge a batch of delta records (dropping repeats) into the windows, under the state lock."""
        origins = batch.origins or [""] * len(batch.records)
        for key in {o.rpartition("@")[0] for o in origins} - self.restored_parts:
            self._restore_partition(key)  # assigned inside this read: restore before applying its deltas
        self.deltas_read += len(batch.records)
        with self.state.lock:
            for value, origin in zip(batch.records, origins):
                key, _, offset = origin.rpartition("@")
                at = int(offset) if offset.isdigit() else -1
                self._apply(value, key, at)
                if at >= 0:
                    self.merged_to[key] = max(self.merged_to.get(key, 0), at + 1)
            c = self.state.counters
            c.batches += 1
            c.add_records(batch.source, len(batch.records))

    def ready(self) -> bool:
        """Every owned partition read up to its end as of its assignment."""
        return not self.restoring

    def close(self) -> None:
        """Stop the snapshot thread; write what this evaluator owns to ``<state_dir>/`` :data:`DUMP_NAME` (if the
        agent had opened)."""
        if self.snapshot_writer is not None:
            self.snapshot_writer.stop()
        try:
            if self.agent.ready:
                write_json_atomic(Path(self.cfg.state_dir) / DUMP_NAME, self.owned_state(), indent=None)
        except OSError as exc:
            log.warning("evaluate %s: cannot write %s: %s", self.worker, DUMP_NAME, exc)

    @property
    def aborted_records(self) -> int:
        """Delta records of aborted transactions dropped by their markers (``calmon_cluster_aborted_records_total``)."""
        return self.deltas.txn_stats.aborted

    @property
    def bad_deltas(self) -> int:
        """Delta records skipped (``calmon_cluster_bad_deltas_total``: every reason)."""
        return self.bad.total("delta")

    # -- merging ---------------------------------------------------------------------------------
    def _apply(self, value: bytes, partition: str, offset: int = -1) -> None:
        where = f"{partition}@{offset}"
        try:
            delta = Delta.from_bytes(value)
        except DeltaError as exc:
            self.bad.count("delta", BadRecord(exc.reason, str(exc)), where)
            return
        key = (delta.source, delta.model)
        self.sources_seen.add(delta.source)
        if delta.end <= self.applied.get(key, -1) or not keep_delta(offset, delta.model, self.covers):
            self.dropped_repeats += 1
            return
        st = self.state
        try:
            merge_delta(self._admit(delta.model, delta.classes), delta)
        except DeltaError as exc:
            self._discard_empty(delta.model)
            self.bad.count("delta", BadRecord(exc.reason, str(exc)), where)
            return
        except ValueError as exc:  # (cannot happen after check_fits; a merge that still fails is a bad record)
            self.bad.count("delta", BadRecord("incompatible", f"model {delta.model!r}: {exc}"), where)
            return
        self.applied[key] = delta.end
        self.partition_of[delta.model] = partition
        self.dirty.add(delta.model)
        self.watermarks[delta.model] = max(self.watermarks.get(delta.model, -math.inf), delta.watermark)
        if delta.pairs is not None:
            feed_changes(st.changes, delta.model, delta.pairs)
        for kind, n in delta.events.items():
            st.counters.add_events(delta.model, kind, n)
        if delta.late:
            st.counters.add_late(delta.model, delta.late)
        st.joiner.watermark = max(st.joiner.watermark, delta.watermark)  # the snapshot's end of the windows

    def _admit(self, model: str, classes: int) -> ModelWindows:
        """The windows of ``model``, created if it is new and admitted as the ingest stage admits a model's
        events (call under the state lock): declared under ``models``, or -- with ``accept_unknown_models`` --
        while fewer than ``limits.max_models`` models are known (declared ones included), with the classes
        declared for it and at most ``limits.max_classes``.

        Raises
        ------
        DeltaError
            ``too_many_models`` or ``incompatible``.
        """
        st, cfg = self.state, self.cfg
        mw = st.models.get(model)
        if mw is not None:
            return mw
        declared = {n: m.classes for n, m in cfg.models.items() if n != "default"}
        if model not in declared:
            if not cfg.accept_unknown_models:
                raise DeltaError(f"model {model!r} is not declared (accept_unknown_models is off)", "too_many_models")
            if len(set(st.models) | set(declared)) >= cfg.limits.max_models:
                raise DeltaError(f"model {model!r} would be one more than limits.max_models "
                                 f"{cfg.limits.max_models}", "too_many_models")
        want = declared.get(model)
        if (want and classes != want) or classes > cfg.limits.max_classes:
            raise DeltaError(f"model {model!r} with {classes} classes (declared {want or 'no'} classes, "
                             f"limits.max_classes {cfg.limits.max_classes})", "incompatible")
        return st.windows_of(model, classes)

    def _discard_empty(self, model: str) -> None:
        """Forget a model created for a delta that did not fit (it holds nothing; it must not take a slot)."""
        if model not in self.partition_of and model in self.state.models:
            del self.state.models[model]

    # -- ownership ---------------------------------------------------------------------------------
    def _sync_ownership(self) -> None:
        health = self.deltas.health()
        assigned = set(health["assigned"])
        for key in sorted(self.owned - assigned):
            self._drop_partition(key)
        now = time.monotonic()
        fresh = sorted(assigned - self.owned)
        for key in fresh:
            self.restoring[key] = (now, None)
            if key not in self.restored_parts:
                self._restore_partition(key)
        if fresh:  # the restores moved positions: the restore targets come from the lags after them
            health = self.deltas.health()
        self.owned = assigned
        position = self.deltas.position()
        fetched = self.deltas.fetched() if self.restoring else {}
        for key, (since, target) in list(self.restoring.items()):
            if key not in assigned:
                del self.restoring[key]
                continue
            if target is None and key in health["lag"]:
                target = position.get(key, 0) + int(health["lag"][key])
                self.restoring[key] = (since, target)
            # the target comes from the high watermark, which counts the commit marker after a transaction's last
            # record; the source's position (one past the last record read) stops before it
            # (or the client fetched to the target: what follows the last record returned can be markers and
            # records of aborted transactions, dropped by connectors/kafka/committed.py)
            at = position.get(key, 0)
            if target is not None and (at >= target or (at == target - 1 and int(health["lag"].get(key, 2)) <= 1)
                                       or fetched.get(key, -1) >= target):
                del self.restoring[key]
                self.restore_seconds = now - since
                log.info("evaluate %s: %s restored in %.2f s", self.worker, key, self.restore_seconds)

    def _drop_partition(self, key: str) -> None:
        """Forget the models of a revoked partition; read it from the beginning if it comes back."""
        with self.state.lock:
            gone = {m for m, p in self.partition_of.items() if p == key}
            for m in gone:
                self.state.models.pop(m, None)
                self.state.changes.detectors.pop(m, None)
                del self.partition_of[m]
                self.covers.pop(m, None)
                self.watermarks.pop(m, None)
            self.dirty -= gone
            self.restored_parts.discard(key)
            self.merged_to.pop(key, None)
            c = self.state.counters
            c.events = {k: v for k, v in c.events.items() if k[0] not in gone}
            c.late = {k: v for k, v in c.late.items() if k not in gone}
            self.applied = {k: v for k, v in self.applied.items() if k[1] not in gone}
        position = self.deltas.position()
        position[key] = 0
        self.deltas.seek(position)
        if self._store is not None:
            self._store.forget(gone)
        self.agent.withdraw(gone)
        log.info("evaluate %s: %s revoked, %d models dropped", self.worker, key, len(gone))

    # -- snapshots ---------------------------------------------------------------------------------
    def _snapshot_store(self) -> SnapshotStore | None:
        cl = self.cfg.cluster
        if cl.snapshot_every <= 0:
            return None
        with self._store_lock:  # (the poll thread restores, the snapshot thread writes)
            return self._open_store()

    def _open_store(self) -> SnapshotStore | None:
        cl = self.cfg.cluster
        if self._store is None:
            try:
                ensure_topics(cl.bootstrap_servers, cl.client,
                              {cl.snapshots_topic: (cl.partitions, {"cleanup.policy": "compact"})})
                self._store = SnapshotStore(cl.bootstrap_servers, cl.snapshots_topic, cl.client,
                                            Producer(cl.bootstrap_servers, cl.client))
            except ClusterError as exc:
                log.warning("evaluate %s: snapshots unavailable (%s); replaying deltas", self.worker, exc)
        return self._store

    def _restore_partition(self, key: str) -> None:
        """Install the snapshots of deltas partition ``key`` and seek it to :func:`restore_start`."""
        self.restored_parts.add(key)
        store = self._snapshot_store()
        part = key.rpartition("/")[2]
        if store is None or not part.isdigit():
            return
        try:
            snap = store.read(int(part), bad=self.bad)
        except Exception as exc:  # noqa: BLE001 - kafka client errors are not enumerable; replay instead
            log.warning("evaluate %s: cannot read snapshots of %s (%s); replaying", self.worker, key, exc)
            snap = None
        if snap is None:
            return
        st = self.state
        with st.lock:
            for m in list(snap.models):
                why = self._unfit_snapshot(snap.models[m])
                if why is not None:  # skipped: the partition is replayed from 0, where its deltas are judged
                    self.bad.count("snapshot", why, f"{store.topic}/{part} model {m[:80]!r}")
                    del snap.models[m]
                    snap.manifest = None
                else:  # installed at once: it counts against the cap for the next one
                    st.models[m] = snap.models[m].windows
            for m, s in snap.models.items():
                st.models[m] = s.windows
                restore_detector(st.changes, m, s.changes)
                self.partition_of[m], self.covers[m] = key, s.offset
                for src, end in s.applied.items():
                    self.applied[(src, m)] = max(end, self.applied.get((src, m), -1))
                for kind, n in s.events.items():
                    st.counters.events[(m, kind)] = n
                if s.late:
                    st.counters.late[m] = s.late
                self.watermarks[m] = s.watermark
                st.joiner.watermark = max(st.joiner.watermark, s.watermark)
        self.snapshot_models_restored += len(snap.models)
        position = self.deltas.position()
        position[key] = restore_start(snap.manifest, snap.models.values())
        with st.lock:
            self.merged_to[key] = position[key]
        self.deltas.seek(position)
        log.info("evaluate %s: %s restored %d model snapshots, replaying from offset %d", self.worker, key,
                 len(snap.models), position[key])

    def _unfit_snapshot(self, snap: ModelSnapshot) -> BadRecord | None:
        """Why a restored model snapshot cannot be installed (the model's admission, segments and grids, as
        for a delta), or None (call under the state lock)."""
        mw = snap.windows
        fresh = self.state.models.get(snap.model)
        if fresh is None:
            try:
                fresh = self._admit(snap.model, mw.classes)
            except DeltaError as exc:
                return BadRecord(exc.reason, str(exc))
            del self.state.models[snap.model]  # (created by _admit to compare with: the snapshot's is installed)
        if sorted(mw.rings) != sorted(fresh.rings):
            return BadRecord("unknown_segment", f"model {snap.model!r} has segments {sorted(mw.rings)[:10]}, "
                                                f"configured {sorted(fresh.rings)}")
        if mw.params != fresh.params or _tiers(mw) != _tiers(fresh):
            return BadRecord("incompatible", f"model {snap.model!r} has parameters {mw.params} and tiers "
                                             f"{mw.tiers[:5]}, configured {fresh.params} and {fresh.tiers[:5]}")
        try:  # its change detector, restored into a scratch monitor first
            restore_detector(ChangeMonitor(self.cfg.changes), snap.model, snap.changes)
        except (KeyError, TypeError, ValueError, AttributeError, IndexError) as exc:
            return BadRecord("restore", f"change detector of model {snap.model!r}: {type(exc).__name__}: {exc}")
        return None

    def _take_snapshots(self) -> dict[str, tuple[list[ModelSnapshot], Manifest]]:
        """Copies of the changed owned models per deltas partition.

        The state lock is held briefly: once to take the dirty set, each partition's membership and its
        offset ``M`` (all at one instant, which the manifest's promise needs), then once per model to copy its
        windows with its counters and de-duplication entries and its ``o_m`` (the partition's processed offset
        at that instant, >= ``M``) -- so merging goes on between two copies, and a model's record is consistent
        with itself.
        """
        st = self.state
        with st.lock:
            owned = set(self.owned)
            dirty = sorted(self.dirty)
            self.dirty.clear()
            members: dict[str, list[str]] = {}
            for m, part in self.partition_of.items():
                members.setdefault(part, []).append(m)
            marks = {key: self.merged_to.get(key, 0) for key in members}
        out: dict[str, tuple[list[ModelSnapshot], Manifest]] = {}
        for m in dirty:
            with st.lock:
                key = self.partition_of.get(m, "")
                if key not in owned or key not in marks or m not in st.models:
                    continue
                applied = {src: self.applied[(src, m)] for src in self.sources_seen if (src, m) in self.applied}
                events = {kind: n for kind in ("prediction", "outcome", "labeled")
                          if (n := st.counters.events.get((m, kind), 0))}
                det = st.changes.detectors.get(m)
                snap = ModelSnapshot(m, max(self.merged_to.get(key, 0), self.covers.get(m, 0)),
                                     copy_windows(st.models[m]), applied, events, st.counters.late.get(m, 0),
                                     self.watermarks.get(m, -math.inf), None if det is None else det.to_dict())
            out.setdefault(key, ([], Manifest(marks[key], tuple(sorted(members[key])))))[0].append(snap)
        return out

    def _maybe_snapshot(self, force: bool = False) -> None:
        """Every ``cluster.snapshot_every``: write the changed models of the owned, restored partitions."""
        every = self.cfg.cluster.snapshot_every
        now = time.monotonic()
        if every <= 0 or self.restoring or not self.dirty or (not force and now - self._last_snapshot < every):
            return
        store = self._snapshot_store()
        if store is None:
            return
        self._last_snapshot = now
        for key, (snaps, manifest) in self._take_snapshots().items():
            try:
                self.snapshot_bytes += store.write(int(key.rpartition("/")[2]), snaps, manifest)
                self.snapshots_written += len(snaps)
            except Exception as exc:  # noqa: BLE001 - kafka client errors are not enumerable; retried next round
                log.warning("evaluate %s: snapshot of %s failed: %s", self.worker, key, exc)
                with self.state.lock:
                    self.dirty.update(s.model for s in snaps)

    # -- the exit dump -----------------------------------------------------------------------------
    def owned_state(self) -> dict[str, Any]:
        """What this evaluator owns: models (ring documents), counters, de-duplication table, watermark."""
        with self.state.lock:
            wm = self.state.joiner.watermark
            return {"worker": self.worker, "owned": sorted(self.owned),
                    "watermark": wm if math.isfinite(wm) else None,
                    "applied": [[s, m, e] for (s, m), e in sorted(self.applied.items())],
                    "models": {name: mw.to_dict() for name, mw in sorted(self.state.models.items())},
                    "counters": self.state.counters.to_dict()}


def _tiers(mw: ModelWindows) -> list[tuple[float, int]]:
    return [(float(w), int(c)) for w, c in mw.tiers]


class EvaluateMetrics:
    """The ``calmon_cluster_*`` families of an evaluator (a collector of its agent's ``/metrics``).

    Parameters
    ----------
    deltas
        The evaluator's input, whose ownership, lags and counters are rendered.
    """

    def __init__(self, deltas: DeltasInput) -> None:
        self.deltas = deltas

    def render(self) -> bytes:
        """Ownership (:func:`~calmon.cluster.ownership.render_ownership`), then the evaluator's counters."""
        d = self.deltas
        lines = render_ownership("evaluate", d.worker, sorted(d.owned), d.deltas.lag(),
                                 len(d.state.models), d.restore_seconds, d.deltas.position())
        base = f'stage="evaluate",worker="{d.worker}"'
        lines += ["# HELP calmon_cluster_repeats_dropped_total Delta ranges dropped as already applied.",
                  "# TYPE calmon_cluster_repeats_dropped_total counter",
                  f"calmon_cluster_repeats_dropped_total{{{base}}} {d.dropped_repeats}",
                  "# HELP calmon_cluster_bad_deltas_total Delta records that could not be read or merged.",
                  "# TYPE calmon_cluster_bad_deltas_total counter",
                  f"calmon_cluster_bad_deltas_total{{{base}}} {d.bad_deltas}", *d.bad.render()]
        for name, text, v in (
                ("deltas_read_total", "Delta records read (replays included).", d.deltas_read),
                ("aborted_records_total", "Delta records of aborted transactions dropped by their ABORT marker.",
                 d.aborted_records),
                ("snapshots_total", "Model snapshots written to the snapshots topic.", d.snapshots_written),
                ("snapshot_bytes_total", "Bytes of snapshot records written.", d.snapshot_bytes),
                ("snapshot_models_restored_total", "Models restored from snapshots.", d.snapshot_models_restored),
                ("group_repairs_total", GROUP_REPAIRS_HELP, d.deltas.group_watch.repairs)):
            lines += [f"# HELP calmon_cluster_{name} {text}", f"# TYPE calmon_cluster_{name} counter",
                      f"calmon_cluster_{name}{{{base}}} {v}"]
        return ("\n".join(lines) + "\n").encode()
