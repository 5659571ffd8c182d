"""The evaluate stage (``calmon run --role evaluate``): statistic deltas -> windows -> evaluation, per owned model.

A consumer group over the deltas topic, which is keyed by model, so each model belongs to the
evaluator owning its partition.  The evaluator is the ordinary agent (:class:`~calmon.agent.runtime.Agent`:
windows, scheduler, testers, alerts, recalibration, ``/metrics``, status page) whose ingestion merges
deltas instead of decoding events:

* a delta of ``(input partition, model)`` whose range ends at or before the last one applied for that
  pair is dropped (a replayed range); the table of last ends is part of the state;
* the state of a partition is rebuilt by replaying the deltas partition from its beginning (the
  deltas topic's retention must exceed the longest window; snapshots to a compacted topic would
  shorten restores and are not implemented), so the agent's own checkpoints are off;
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
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from calmon.agent.runtime import Agent
from calmon.agent.views import round_state
from calmon.cluster.deltas import Delta, DeltaError, merge_delta
from calmon.cluster.intents import new_writer_id
from calmon.cluster.ownership import render_ownership
from calmon.config import Config
from calmon.jsonio import write_json_atomic
from connectors.base import Batch, Source
from connectors.kafka import KafkaSource

log = logging.getLogger("calmon.cluster")

__all__ = ["EvaluateAgent", "evaluate_config", "DUMP_NAME"]

DUMP_NAME = "owned-state.json"
#: Deltas per read: a delta costs milliseconds to decode and merge (several bucket documents), and the consumer
#: must poll again well within ``max_poll_interval_ms`` or the group evicts it (a replay reads thousands).
DELTA_BATCH = 100
#: Seconds one read's deltas should take to merge (the batch size adapts to the measured cost per delta).
READ_BUDGET = 0.5


def evaluate_config(cfg: Config) -> Config:
    """The agent configuration of an evaluator: no checkpoints (replay restores), no dead letters, no change
    detectors (deltas carry no event order), at most :data:`DELTA_BATCH` deltas per read."""
    return dataclasses.replace(
        cfg, checkpoint=dataclasses.replace(cfg.checkpoint, enabled=False),
        dead_letter=dataclasses.replace(cfg.dead_letter, type="none"),
        changes=dataclasses.replace(cfg.changes, enabled=False),
        ingest=dataclasses.replace(cfg.ingest, batch_size=min(cfg.ingest.batch_size, DELTA_BATCH)))


class EvaluateAgent(Agent):
    """An agent fed by the deltas topic (see the module docstring).

    Parameters
    ----------
    cfg
        Validated configuration (``cluster.bootstrap_servers`` set).
    clock
        Wall clock.
    """

    def __init__(self, cfg: Config, clock: Callable[[], float] = time.time) -> None:
        cl = cfg.cluster
        source = KafkaSource(cl.bootstrap_servers, [cl.deltas_topic], group_id=cl.evaluate_group, name="deltas",
                             client=dict(cl.client), position_policy="checkpoint", auto_offset_reset="earliest")
        super().__init__(evaluate_config(cfg), sources=[source], clock=clock)
        self.deltas = source
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
        self.bad_deltas = 0
        self._per_delta = 0.01  #: seconds per delta (moving average), sizes the reads

    # -- ingestion: deltas instead of events -------------------------------------------------------
    def poll_once(self) -> bool:
        """Read and merge one batch of deltas, sized to take about :data:`READ_BUDGET` seconds."""
        if not self._stop.is_set():  # once stopping, what we own is frozen for the exit dump
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
        with self.state.lock:
            for value, origin in zip(batch.records, origins):
                self._apply(value, origin.rpartition("@")[0])
            c = self.state.counters
            c.batches += 1
            c.add_records(batch.source, len(batch.records))

    def _apply(self, value: bytes, partition: str) -> None:
        try:
            delta = Delta.from_bytes(value)
        except DeltaError as exc:
            self.bad_deltas += 1
            log.warning("evaluate %s: skipping a bad delta on %s: %s", self.worker, partition, exc)
            return
        key = (delta.source, delta.model)
        if delta.end <= self.applied.get(key, -1):
            self.dropped_repeats += 1
            return
        st = self.state
        try:
            merge_delta(st.windows_of(delta.model, delta.classes), delta)
        except (DeltaError, ValueError) as exc:
            self.bad_deltas += 1
            log.warning("evaluate %s: cannot merge a delta of %s: %s", self.worker, delta.model, exc)
            return
        self.applied[key] = delta.end
        self.partition_of[delta.model] = partition
        for kind, n in delta.events.items():
            st.counters.add_events(delta.model, kind, n)
        if delta.late:
            st.counters.add_late(delta.model, delta.late)
        st.joiner.watermark = max(st.joiner.watermark, delta.watermark)  # the snapshot's end of the windows

    # -- ownership ---------------------------------------------------------------------------------
    def _sync_ownership(self) -> None:
        health = self.deltas.health()
        assigned = set(health["assigned"])
        for key in sorted(self.owned - assigned):
            self._drop_partition(key)
        now = time.monotonic()
        for key in sorted(assigned - self.owned):
            self.restoring[key] = (now, None)
        self.owned = assigned
        position = self.deltas.position()
        for key, (since, target) in list(self.restoring.items()):
            if key not in assigned:
                del self.restoring[key]
                continue
            if target is None and key in health["lag"]:
                target = position.get(key, 0) + int(health["lag"][key])
                self.restoring[key] = (since, target)
            if target is not None and position.get(key, 0) >= target:
                del self.restoring[key]
                self.restore_seconds = now - since
                log.info("evaluate %s: %s restored in %.2f s", self.worker, key, self.restore_seconds)

    def _drop_partition(self, key: str) -> None:
        """Forget the models of a revoked partition; read it from the beginning if it comes back."""
        with self.state.lock:
            gone = {m for m, p in self.partition_of.items() if p == key}
            for m in gone:
                self.state.models.pop(m, None)
                del self.partition_of[m]
            c = self.state.counters
            c.events = {k: v for k, v in c.events.items() if k[0] not in gone}
            c.late = {k: v for k, v in c.late.items() if k not in gone}
            self.applied = {k: v for k, v in self.applied.items() if k[1] not in gone}
        position = self.deltas.position()
        position[key] = 0
        self.deltas.seek(position)
        pub = self.published
        self.published = dataclasses.replace(
            pub, evaluations=tuple(e for e in pub.evaluations if e["model"] not in gone))
        self.metrics.prepare(round_state(self.published))
        log.info("evaluate %s: %s revoked, %d models dropped", self.worker, key, len(gone))

    def is_ready(self) -> bool:
        """Connected and every owned partition read up to its end as of its assignment."""
        return super().is_ready() and not self.restoring

    # -- views ---------------------------------------------------------------------------------
    def render_metrics(self) -> bytes:
        """The agent's ``/metrics`` plus the ownership lines of this evaluator."""
        lines = render_ownership("evaluate", self.worker, sorted(self.owned), self.deltas.lag(),
                                 len(self.state.models), self.restore_seconds, self.deltas.position())
        base = f'stage="evaluate",worker="{self.worker}"'
        lines += ["# HELP calmon_cluster_repeats_dropped_total Delta ranges dropped as already applied.",
                  "# TYPE calmon_cluster_repeats_dropped_total counter",
                  f"calmon_cluster_repeats_dropped_total{{{base}}} {self.dropped_repeats}",
                  "# HELP calmon_cluster_bad_deltas_total Delta records that could not be read or merged.",
                  "# TYPE calmon_cluster_bad_deltas_total counter",
                  f"calmon_cluster_bad_deltas_total{{{base}}} {self.bad_deltas}"]
        return self.metrics.render() + ("\n".join(lines) + "\n").encode()

    def owned_state(self) -> dict[str, Any]:
        """What this evaluator owns: models (ring documents), counters, de-duplication table, watermark."""
        with self.state.lock:
            wm = self.state.joiner.watermark
            return {"worker": self.worker, "owned": sorted(self.owned),
                    "watermark": wm if math.isfinite(wm) else None,
                    "applied": [[s, m, e] for (s, m), e in sorted(self.applied.items())],
                    "models": {name: mw.to_dict() for name, mw in sorted(self.state.models.items())},
                    "counters": self.state.counters.to_dict()}

    def close(self) -> None:
        try:
            if self.ready:
                write_json_atomic(Path(self.cfg.state_dir) / DUMP_NAME, self.owned_state(), indent=None)
        except OSError as exc:
            log.warning("evaluate %s: cannot write %s: %s", self.worker, DUMP_NAME, exc)
        finally:
            super().close()
