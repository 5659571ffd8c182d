"""The ingest stage (``calmon run --role ingest``): event partitions -> statistic deltas, exactly once.

A consumer group over the event topics (keyed by prediction id, so a prediction and its outcome
share a partition).  Per input partition (:class:`~calmon.cluster.partition.PartitionIngest`) the
worker buffers records and, once ``ingest.batch_size`` of them are waiting or the oldest has waited
``cluster.linger``, processes them as one range ``[c, e)``:

1. **claim**: write the intent ``(c, e, now)`` to the intents topic and read it back; the first
   intent of ``(partition, c)`` in the log wins (:class:`~calmon.cluster.intents.IntentLog`).  If
   another worker's intent won, this worker replays *that* range instead (same records, same ``now``);
2. decode, join and bin the range into fresh rings; dead-letter its rejects (a replay first seeks
   the dead-letter sink to the intent's position, so letters already written are skipped);
3. publish one delta per model to the deltas topic (keyed by model) and wait for the acks;
4. write the partition's state (offset ``e``, join buffers, decoder state) to the state topic;
5. commit ``e`` to the consumer group (for lag dashboards only: the state topic is the truth).

A partition's new owner (after a SIGKILL or a rebalance) loads the state with the largest offset
and the first intents after it; a winning intent newer than the state is replayed as one range.
Every range is applied by the evaluators at most once (they drop a ``(partition, model)`` range
ending at or before the last one applied), and at least once (deltas are acknowledged before the
state that moves past them), so every record counts exactly once.  See ``docs/cluster.md``.
"""

from __future__ import annotations

import html
import json
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from calmon.cluster.intents import (
    ClusterError,
    Intent,
    IntentLog,
    PartitionState,
    Producer,
    StateStore,
    ensure_topics,
    new_writer_id,
)
from calmon.cluster.ownership import IngestMetrics
from calmon.cluster.partition import Applied, PartitionIngest
from calmon.cluster.records import BadRecord
from calmon.config import Config
from calmon.exporter.http import Endpoints, HTTPExporter
from connectors.base import Batch, Committable, DeadLetterSink
from connectors.kafka import KafkaSource

log = logging.getLogger("calmon.cluster")

__all__ = ["IngestWorker", "internal_topics", "PROCESS_BUDGET", "START_TIMEOUT", "START_BACKOFF"]

#: Seconds of range processing between two reads of the source (see :meth:`IngestWorker.run`).
PROCESS_BUDGET = 0.5
#: Start-up: the longest time :meth:`IngestWorker.open_retrying` keeps retrying an unreachable broker, and the
#: first and largest wait between two attempts (doubling in between).
START_TIMEOUT = 300.0
START_BACKOFF = (0.5, 10.0)


def internal_topics(cfg: Config) -> dict[str, tuple[int, dict[str, str]]]:
    """The internal topics with their partitions and topic configuration."""
    cl = cfg.cluster
    return {cl.deltas_topic: (cl.partitions, {}),
            cl.state_topic: (cl.partitions, {"cleanup.policy": "compact"}),
            cl.intents_topic: (cl.partitions, {"cleanup.policy": "delete"})}


class IngestWorker:
    """One ingest worker: a member of ``cluster.ingest_group`` over the Kafka sources of ``sources``.

    Parameters
    ----------
    cfg
        Validated configuration (``cluster.bootstrap_servers`` set, every source of type ``kafka``).
    clock
        Wall clock: the ``now`` of new intents (arrival time of events without ``ts``).
    """

    def __init__(self, cfg: Config, clock: Callable[[], float] = time.time) -> None:
        self.cfg = cfg
        self.clock = clock
        self.writer = new_writer_id()
        self.seq = 0
        self.parts: dict[str, PartitionIngest] = {}
        self.metrics = IngestMetrics(self.writer)
        self._stop = threading.Event()
        self.source: KafkaSource | None = None
        self.dead_letter: DeadLetterSink | None = None
        self.producer: Producer | None = None
        self.intents: IntentLog | None = None
        self.states: StateStore | None = None
        self.http: HTTPExporter | None = None
        #: the last start-up error while :meth:`open_retrying` waits for the broker (None once open)
        self.connect_error: str | None = None

    # -- lifecycle -----------------------------------------------------------------------------
    def open(self) -> None:
        """Create the internal topics if missing, connect the producer and the intents reader, build the source."""
        from calmon.agent.build import build_dead_letter
        cl = self.cfg.cluster
        ensure_topics(cl.bootstrap_servers, cl.client, internal_topics(self.cfg))
        self.producer = Producer(cl.bootstrap_servers, cl.client)
        self.intents = IntentLog(cl.bootstrap_servers, cl.intents_topic, cl.client, self.producer, self.metrics.bad)
        self.states = StateStore(cl.bootstrap_servers, cl.state_topic, cl.client, self.producer, self.metrics.bad)
        self.source = build_input(self.cfg)
        self.dead_letter = build_dead_letter(self.cfg)

    def open_retrying(self, timeout: float = START_TIMEOUT, backoff: tuple[float, float] = START_BACKOFF) -> bool:
        """:meth:`open`, retried while the broker cannot be reached (a worker started before its broker, or during
        an outage): each failure is logged with the wait before the next attempt, which doubles from
        ``backoff[0]`` up to ``backoff[1]`` seconds; ``/readyz`` stays false meanwhile.

        Returns True once open, False if :meth:`stop` was called first.

        Raises
        ------
        ClusterError
            The broker was still unreachable after ``timeout`` seconds (one line naming it and the last error).
        """
        deadline = time.monotonic() + timeout
        delay, attempt = backoff[0], 0
        while not self._stop.is_set():
            attempt += 1
            try:
                self.open()
                self.connect_error = None
                return True
            except ClusterError as exc:
                self._close_clients()
                self.connect_error = str(exc)
                left = deadline - time.monotonic()
                if left <= 0:
                    raise ClusterError(f"broker {self.cfg.cluster.bootstrap_servers} still unreachable after "
                                       f"{attempt} attempts in {timeout:.0f} s: {exc}") from None
                wait = min(delay, left)
                log.warning("ingest %s: cannot start (attempt %d): %s; retrying in %.1f s", self.writer, attempt,
                            exc, wait)
                self._stop.wait(wait)
                delay = min(2 * delay, backoff[1])
        return False

    def stop(self) -> None:
        """Finish the current range and return from :meth:`run` (signal-safe)."""
        self._stop.set()

    def close(self) -> None:
        if self.http is not None:
            self.http.stop()
            self.http = None
        self._close_clients()

    def _close_clients(self) -> None:
        """Close and forget the Kafka clients (a failed :meth:`open` may have built some of them)."""
        closers = (self.source, self.dead_letter, self.intents, self.states, self.producer)
        self.source = self.dead_letter = self.intents = self.states = self.producer = None
        for closer in closers:
            if closer is None:
                continue
            try:
                closer.close()
            except (ClusterError, OSError, ValueError) as exc:
                log.warning("closing %s: %s", type(closer).__name__, exc)

    def run(self, max_seconds: float | None = None) -> int:
        """Read, buffer and process ranges until stopped; buffered records not yet claimed are simply re-read
        by the partition's next owner."""
        if self.source is None:
            self.open()
        assert self.source is not None
        deadline = None if max_seconds is None else time.monotonic() + max_seconds
        try:
            while not self._stop.is_set() and (deadline is None or time.monotonic() < deadline):
                batch = self.source.read(self.cfg.ingest.batch_size, self.cfg.ingest.poll_timeout)
                self._sync_assignment()
                if batch is not None and batch.records:
                    self._route(batch)
                # between two reads at most PROCESS_BUDGET seconds of ranges: the consumer must poll well
                # within max_poll_interval_ms or the group evicts it (then another worker takes over)
                start = time.monotonic()
                for key in self._due():
                    if time.monotonic() - start > PROCESS_BUDGET:
                        break
                    self._maybe_process(key)
                self.metrics.update_source(self.source)
        finally:
            self.close()
        return 0

    def ready(self) -> bool:
        return self.source is not None and self.source.connected

    def status(self) -> dict[str, Any]:
        """The worker's JSON status (``/api/status``): owned partitions, their next offsets, counters."""
        m = self.metrics
        return {"stage": "ingest", "worker": self.writer, "connect_error": self.connect_error, "owned": list(m.owned),
                "next": {k: p.next for k, p in list(self.parts.items())}, "lag": dict(m.lag),
                "records": dict(m.records), "ranges": m.ranges, "replays": m.replays, "claims_lost": m.claims_lost,
                "errors": m.errors, "rejected": dict(m.rejected),
                "bad_records": {f"{k}/{r}": n for (k, r), n in sorted(dict(m.bad.counts).items())}}

    def start_http(self) -> HTTPExporter:
        """Serve ``/metrics`` (``calmon_cluster_*``), ``/healthz``, ``/readyz`` and ``/api/status``."""
        from calmon.agent.build import start_exporter
        endpoints = Endpoints(self.metrics.render, lambda: True, self.ready, self.status,
                              lambda doc: "<pre>" + html.escape(json.dumps(doc, indent=2)) + "</pre>")
        self.http = start_exporter(self.cfg.exporter, endpoints)
        return self.http

    # -- ownership -----------------------------------------------------------------------------
    def _sync_assignment(self) -> None:
        """Forget partitions no longer assigned (a later owner restores them from the logs)."""
        assert self.source is not None
        assigned = set(self.source.health()["assigned"])
        for key in [k for k in self.parts if k not in assigned]:
            self._forget(key)
        self.metrics.owned = sorted(assigned)

    def _forget(self, key: str) -> None:
        self.parts.pop(key, None)
        if self.intents is not None:
            self.intents.forget(key)

    def _restore(self, keys: list[str]) -> None:
        """Load the partitions' states and intents; reposition the source at the states' offsets.

        One read of each log for all the partitions of an assignment: a restore must stay well within
        the consumer's ``max_poll_interval_ms``.
        """
        assert self.states is not None and self.intents is not None and self.source is not None
        t0 = time.monotonic()
        states = self.states.candidates(keys, self._ends(keys))
        parts = {key: self._restored(key, states.get(key, [])) for key in keys}
        self.intents.track({key: p.next for key, p in parts.items()})
        position = self.source.position()
        position.update({key: p.next for key, p in parts.items()})
        self.source.seek(position)  # records of these partitions read before the restore are dropped
        self.parts.update(parts)
        self.metrics.restored(time.monotonic() - t0, len(keys))
        log.info("ingest %s: restored %s in %.2f s", self.writer,
                 ", ".join(f"{k}@{p.next}" for k, p in sorted(parts.items())), time.monotonic() - t0)

    def _ends(self, keys: list[str]) -> dict[str, int] | None:
        """The end offsets of input partitions: a state past its partition's end (forged, or the topic was
        recreated) would skip records never read.  The larger of the broker's answer and the high watermark of
        the last fetch (some brokers -- Tansu -- answer the base offset of the last batch + 1, too small)."""
        assert self.states is not None and self.source is not None
        try:
            ends = self.states.reader.end_offsets(keys)
        except ClusterError as exc:
            log.warning("ingest %s: cannot read the end offsets of %s (%s); states not checked against them",
                        self.writer, ", ".join(keys), exc)
            return None
        position, lag = self.source.position(), self.source.lag()
        for key in keys:
            if key in lag and key in position:
                ends[key] = max(ends.get(key, 0), int(position[key]) + int(lag[key]))
        return ends

    def _restored(self, key: str, states: list[PartitionState]) -> PartitionIngest:
        """The partition rebuilt from its most advanced state that restores; a state that fits its schema but
        not the loaders (forged buffers) is counted and the next one tried; with none, the partition starts at
        offset 0 and replays the chain of intents from there (their deltas are dropped as repeats)."""
        assert self.source is not None
        for st in states:
            try:
                return PartitionIngest(self.cfg, key, self.source.name, st)
            except (KeyError, IndexError, TypeError, ValueError, AttributeError, RecursionError) as exc:
                self.metrics.bad.count("state", BadRecord("restore", f"state of {key} at offset {st.offset}: "
                                                                     f"{type(exc).__name__}: {exc}"), key)
        if states:
            log.warning("ingest %s: no state of %s restores; replaying it from offset 0", self.writer, key)
        return PartitionIngest(self.cfg, key, self.source.name, None)

    # -- records -------------------------------------------------------------------------------
    def _route(self, batch: Batch) -> None:
        """Split a batch by partition (origins ``topic/partition@offset``) into the partitions' buffers."""
        if batch.origins is None:
            raise ValueError("the ingest stage needs record origins (kafka source option origins: true)")
        groups: dict[str, list[int]] = {}
        offsets: list[int] = []
        for i, origin in enumerate(batch.origins):
            key, _, off = origin.rpartition("@")
            groups.setdefault(key, []).append(i)
            offsets.append(int(off))
        now = time.monotonic()
        new = sorted(k for k in groups if k not in self.parts)
        if new:
            assert self.source is not None
            assigned = set(self.source.health()["assigned"])
            self._restore(sorted(set(new) | (assigned - set(self.parts))))
        for key, idx in groups.items():
            part = self.parts.get(key)
            if part is None or key in new:
                continue
            meta = None if batch.meta is None else [batch.meta[i] for i in idx]
            part.add([offsets[i] for i in idx], [batch.records[i] for i in idx], [batch.origins[i] for i in idx],
                     meta, now)

    def _due(self) -> list[str]:
        """Partitions with a full range buffered, or whose oldest record waited ``cluster.linger``; oldest first."""
        now, size, linger = time.monotonic(), self.cfg.ingest.batch_size, self.cfg.cluster.linger
        due = [(p.since or now, k) for k, p in self.parts.items() if p.buffered and (
            p.buffered >= size or p.replay is not None or (p.since is not None and now - p.since >= linger))]
        return [k for _, k in sorted(due)]

    def _maybe_process(self, key: str) -> None:
        part = self.parts.get(key)
        if part is None or not part.buffered:
            return
        try:
            self._process(part)
        except ClusterError as exc:
            # the logs decide: forget the partition; its next record restores it (replaying a claimed range)
            log.warning("ingest %s: %s: %s; restoring the partition from the logs", self.writer, key, exc)
            self.metrics.errors += 1
            self._forget(key)

    def _process(self, part: PartitionIngest) -> None:
        """Claim (or follow the winner of) the next ranges of a partition and complete them."""
        assert self.intents is not None
        while part.buffered:
            target = part.replay or self.intents.winner(part.key, part.next)
            replay = target is not None
            if target is None:
                self.seq += 1
                dlq = self.dead_letter.position() if self.dead_letter is not None else {}
                mine = Intent(part.key, part.next, part.end(), self.clock(), self.writer, self.seq, dlq)
                target = self.intents.claim(mine)
                replay = target != mine
                if replay:
                    self.metrics.claims_lost += 1
            if not part.covers(target.end):
                part.replay = target  # the winner read further than we have: wait for its records
                return
            part.replay = None
            self._complete(part, part.apply(part.take(target.end), target), target, replay)

    def _complete(self, part: PartitionIngest, applied: Applied, intent: Intent, replay: bool) -> None:
        """Dead letters, deltas, state, commit -- in this order (see the module docstring)."""
        assert self.producer is not None and self.states is not None and self.intents is not None
        rej = applied.rejects
        if rej.records and self.dead_letter is not None:
            if replay:
                self.dead_letter.seek(intent.dead_letter)
            self.dead_letter.write(rej.records, rej.reasons, rej.source, rej.origins, rej.meta or None)
            self.dead_letter.flush()
        cl = self.cfg.cluster
        items = [(d.model.encode(), d.to_bytes()) for d in applied.deltas]
        if items:
            self.producer.send_all(cl.deltas_topic, items)
        self.states.save(applied.state)
        self.intents.settle(part.key, intent.end)
        src = self.source
        if isinstance(src, Committable):
            src.commit({part.key: intent.end})
        self.metrics.completed(part.key, intent, applied, sum(len(v) for _, v in items), replay)


def build_input(cfg: Config) -> KafkaSource:
    """The ingest stage's consumer: the configured Kafka source, in ``cluster.ingest_group``, positioned by us."""
    from calmon.agent.build import StartupError, build_source
    if len(cfg.sources) != 1 or cfg.sources[0].type != "kafka":
        raise StartupError("sources: the ingest stage reads exactly one source of type kafka "
                           f"(got {[s.type for s in cfg.sources]})")
    src = build_source(cfg.sources[0], 0, cfg.limits.max_record_bytes)
    if not isinstance(src, KafkaSource):
        raise StartupError("sources.0: the ingest stage needs a kafka source")
    src.group_id = cfg.cluster.ingest_group
    src.position_policy = "checkpoint"  # every position comes from the state topic (see IngestWorker._restore)
    src.with_origins = True
    return src
