"""The ingest stage (``calmon run --role ingest``): event partitions -> statistic deltas, exactly once.

A consumer group over the event topics (keyed by prediction id, so a prediction and its outcome
share a partition).  Per input partition (:class:`~calmon.cluster.partition.PartitionIngest`) the
worker buffers records and, once ``ingest.batch_size`` of them are waiting or the oldest has waited
``cluster.linger``, processes them as one range ``[c, e)`` (a full range is cut at exactly
``ingest.batch_size`` records, so every owner cuts the same ranges from the same state):

1. decode, join and bin the range into fresh rings;
2. in **one Kafka transaction** (:class:`~calmon.cluster.transactions.PartitionProducer`): one delta per
   model to the deltas topic (keyed by model), the range's dead letters when the dead-letter sink is a Kafka
   topic, the partition's state (offset ``e``, join buffers, decoder state) to the state topic, and the
   consumed offset ``e`` to the consumer group; commit;
3. with any other dead-letter sink (a file), write the range's dead letters once the commit succeeded: a
   fenced or failed range writes none.

A partition's new owner (after a SIGKILL or a rebalance) first opens the partition's transactional id --
which aborts the previous owner's open transaction and fences it -- then loads the committed state with
the largest offset (``read_committed``) and seeks the consumer there.  The evaluators read the deltas
``read_committed``, so every committed range counts once and an aborted one not at all.  See
``docs/cluster.md``.
"""

from __future__ import annotations

import dataclasses
import html
import json
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from calmon.cluster.ownership import IngestMetrics
from calmon.cluster.partition import Applied, PartitionIngest
from calmon.cluster.records import BadRecord
from calmon.cluster.topics import ClusterError, PartitionState, Range, StateStore, ensure_topics, new_writer_id
from calmon.cluster.transactions import Fenced, Item, PartitionProducer
from calmon.config import Config
from calmon.exporter.http import Endpoints, HTTPExporter
from connectors.base import Batch, DeadLetterSink
from connectors.kafka import KafkaSource
from connectors.kafka.deadletter import KafkaDeadLetterSink

log = logging.getLogger("calmon.cluster")

__all__ = ["IngestWorker", "internal_topics", "PROCESS_BUDGET", "START_TIMEOUT", "START_BACKOFF"]

#: Seconds of range processing between two reads of the source (see :meth:`IngestWorker.run`).
PROCESS_BUDGET = 0.5
#: Seconds before a failed restore (or a partition forgotten after a failed range) is tried again.
RESTORE_RETRY = 2.0
#: Start-up: the longest time :meth:`IngestWorker.open_retrying` keeps retrying an unreachable broker, and the
#: first and largest wait between two attempts (doubling in between).
START_TIMEOUT = 300.0
START_BACKOFF = (0.5, 10.0)


def internal_topics(cfg: Config) -> dict[str, tuple[int, dict[str, str]]]:
    """The internal topics with their partitions and topic configuration."""
    cl = cfg.cluster
    return {cl.deltas_topic: (cl.partitions, {}),
            cl.state_topic: (cl.partitions, {"cleanup.policy": "compact"})}


class IngestWorker:
    """One ingest worker: a member of ``cluster.ingest_group`` over the Kafka sources of ``sources``.

    Parameters
    ----------
    cfg
        Validated configuration (``cluster.bootstrap_servers`` set, every source of type ``kafka``).
    clock
        Wall clock: the ``now`` of a range (arrival time of its events without ``ts``).
    """

    def __init__(self, cfg: Config, clock: Callable[[], float] = time.time) -> None:
        self.cfg = cfg
        self.clock = clock
        self.writer = new_writer_id()
        self.parts: dict[str, PartitionIngest] = {}
        self.metrics = IngestMetrics(self.writer)
        self._stop = threading.Event()
        self.source: KafkaSource | None = None
        self.dead_letter: DeadLetterSink | None = None
        #: input partition -> its transactional producer (opened when the partition is restored)
        self.txns: dict[str, PartitionProducer] = {}
        #: input partitions this worker was fenced from: not restored again until the group assignment changes
        #: (taking the id back would fence the rightful owner, which would take it back: a ping-pong)
        self.fenced: set[str] = set()
        self._assigned: set[str] = set()
        #: input partitions to restore again (a restore or a range failed): their records already read would
        #: otherwise wait for new ones to arrive; retried every :data:`RESTORE_RETRY` seconds
        self._retry: set[str] = set()
        self._next_retry = 0.0
        self.states: StateStore | None = None
        self.http: HTTPExporter | None = None
        #: the last start-up error while :meth:`open_retrying` waits for the broker (None once open)
        self.connect_error: str | None = None

    # -- lifecycle -----------------------------------------------------------------------------
    def open(self) -> None:
        """Build the dead-letter sink, create the internal topics (and a Kafka dead-letter topic) if missing, connect
        the state reader, build the source."""
        from calmon.agent.build import build_dead_letter
        cl = self.cfg.cluster
        self.dead_letter = build_dead_letter(self.cfg)
        topics = internal_topics(self.cfg)
        if isinstance(self.dead_letter, KafkaDeadLetterSink):
            check_dead_letter_servers(self.cfg, self.dead_letter)  # a configuration error: before any broker contact
            topics[self.dead_letter.topic] = (self.dead_letter.partitions, {})
        ensure_topics(cl.bootstrap_servers, cl.client, topics)
        self.states = StateStore(cl.bootstrap_servers, cl.state_topic, cl.client, self.metrics.bad)
        self.source = build_input(self.cfg)

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
        closers = (self.source, self.dead_letter, self.states, *self.txns.values())
        self.source = self.dead_letter = self.states = None
        self.txns = {}
        for closer in closers:
            if closer is None:
                continue
            try:
                closer.close()
            except (ClusterError, OSError, ValueError) as exc:
                log.warning("closing %s: %s", type(closer).__name__, exc)

    def run(self, max_seconds: float | None = None) -> int:
        """Read, buffer and process ranges until stopped; buffered records not yet committed are simply re-read
        by the partition's next owner."""
        if self.source is None:
            self.open()
        assert self.source is not None
        deadline = None if max_seconds is None else time.monotonic() + max_seconds
        try:
            while not self._stop.is_set() and (deadline is None or time.monotonic() < deadline):
                batch = self.source.read(self.cfg.ingest.batch_size, self.cfg.ingest.poll_timeout)
                self._sync_assignment()
                self._retry_restores()
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
                "records": dict(m.records), "ranges": m.ranges, "fenced": m.fenced, "errors": m.errors,
                "rejected": dict(m.rejected),
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
        if assigned != self._assigned:  # a rebalance: what the group gives us now is ours
            self._assigned = assigned
            self.fenced.clear()
        for key in [k for k in self.parts if k not in assigned]:
            self._forget(key)
        self.metrics.owned = sorted(assigned)

    def _forget(self, key: str) -> None:
        self.parts.pop(key, None)
        txn = self.txns.pop(key, None)
        if txn is not None:
            txn.close()

    def _try_restore(self, keys: list[str]) -> None:
        """:meth:`_restore`, a failure logged and retried later (a broker slow to initialise a transactional id
        under load must not end the worker)."""
        try:
            self._restore(keys)
        except ClusterError as exc:
            log.warning("ingest %s: restoring %s failed: %s; retrying in %.0f s", self.writer, ", ".join(keys), exc,
                        RESTORE_RETRY)
            self.metrics.errors += 1
            for key in keys:
                if key not in self.parts:
                    self._forget(key)
            self._retry.update(keys)
            self._next_retry = time.monotonic() + RESTORE_RETRY

    def _retry_restores(self) -> None:
        """Restore again the partitions whose restore or range failed, if they are still ours."""
        if not self._retry or time.monotonic() < self._next_retry:
            return
        keys = sorted((self._retry & self._assigned) - set(self.parts) - self.fenced)
        self._retry.clear()
        if keys:
            self._try_restore(keys)

    def _restore(self, keys: list[str]) -> None:
        """Fence the partitions' previous owners, load their committed states, reposition the source there.

        The transactional ids are opened first: that aborts a previous owner's open transaction, so the
        ``read_committed`` read of the state topic that follows sees every state committed before it.  One
        read of the state topic for all the partitions of an assignment: a restore must stay well within
        the consumer's ``max_poll_interval_ms``.
        """
        assert self.states is not None and self.source is not None
        t0 = time.monotonic()
        cl = self.cfg.cluster
        for key in keys:
            old = self.txns.pop(key, None)
            if old is not None:
                old.close()
            self.txns[key] = PartitionProducer(cl.bootstrap_servers, cl.client, cl.ingest_group, key)
        states = self.states.candidates(keys, self._ends(keys))
        parts = {key: self._restored(key, states.get(key, [])) for key in keys}
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
        offset 0 (the evaluators drop the deltas of ranges they applied already)."""
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
        if [k for k in new if k not in self.fenced]:
            assert self.source is not None
            assigned = set(self.source.health()["assigned"])
            self._try_restore(sorted((set(new) | (assigned - set(self.parts))) - self.fenced))
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
            p.buffered >= size or (p.since is not None and now - p.since >= linger))]
        return [k for _, k in sorted(due)]

    def _maybe_process(self, key: str) -> None:
        part = self.parts.get(key)
        if part is None or not part.buffered:
            return
        try:
            self._process(part)
        except Fenced as exc:
            # a newer owner opened the partition's transactional id: it is theirs (the group revokes it from us)
            log.warning("ingest %s: %s: %s; dropping the partition", self.writer, key, exc)
            self.metrics.fenced += 1
            self._forget(key)
            self.fenced.add(key)
        except ClusterError as exc:
            # the logs decide: forget the partition; its next record restores it (from the last committed state)
            log.warning("ingest %s: %s: %s; restoring the partition from the state topic", self.writer, key, exc)
            self.metrics.errors += 1
            self._forget(key)
            self._retry.add(key)
            self._next_retry = time.monotonic() + RESTORE_RETRY

    def _process(self, part: PartitionIngest) -> None:
        """Process the buffered records of a partition as ranges of at most ``ingest.batch_size`` records."""
        size = self.cfg.ingest.batch_size
        while part.buffered and part.key in self.parts:
            end = part.cut(size)
            rng = Range(part.key, part.next, end, self.clock(), self.writer)
            self._complete(part, part.apply(part.take(end), rng), rng)

    def _complete(self, part: PartitionIngest, applied: Applied, rng: Range) -> None:
        """One transaction of deltas, dead letters (Kafka sink), state and consumed offset; then the dead letters of
        any other sink (see the module docstring and docs/cluster.md, "Transaction boundaries")."""
        txn = self.txns.get(part.key)
        if txn is None:
            raise ClusterError(f"no transactional producer for {part.key}")
        rej, sink, cl = applied.rejects, self.dead_letter, self.cfg.cluster
        deltas = [(d.model.encode(), d.to_bytes()) for d in applied.deltas]
        records: dict[str, list[tuple[bytes, bytes] | Item]] = {cl.deltas_topic: list(deltas)}
        letters = []
        if isinstance(sink, KafkaDeadLetterSink) and rej.records:
            # in the range's transaction: a fenced zombie's or an aborted range's letters are aborted with it
            letters = sink.letters(rej.records, rej.reasons, rej.source, rej.origins, rej.meta or None)
            records.setdefault(sink.topic, []).extend(Item(d.key, d.value, d.headers) for d in letters)
        # no dead-letter position in the state: nothing is sought on a restore (Kafka letters commit with their
        # range, file letters are written only after it)
        state = dataclasses.replace(applied.state, dead_letter={})
        txn.commit_range(records, rng.end, last={cl.state_topic: [(part.key.encode(), state.to_bytes())]})
        if isinstance(sink, KafkaDeadLetterSink):
            sink.stats.written += len(letters)
        elif sink is not None and rej.records:
            # a file (per machine, outside any transaction): written once the range is committed, never for a
            # fenced or failed one; lost only if the process dies between the commit and this write
            sink.write(rej.records, rej.reasons, rej.source, rej.origins, rej.meta or None)
            sink.flush()
        self.metrics.completed(part.key, rng, applied, sum(len(v) for _, v in deltas))


def check_dead_letter_servers(cfg: Config, sink: KafkaDeadLetterSink) -> None:
    """A Kafka dead-letter topic of the ingest stage must be on the cluster's brokers: its letters are written in the
    ranges' transactions, which cannot span two clusters.

    Raises
    ------
    StartupError
        One line naming ``dead_letter.options.bootstrap_servers``.
    """
    from calmon.agent.build import StartupError

    def servers(value: str | list[str]) -> set[str]:
        items = value.split(",") if isinstance(value, str) else value
        return {str(x).strip() for x in items if str(x).strip()}

    cl = cfg.cluster
    if not servers(sink.bootstrap_servers) & servers(cl.bootstrap_servers):
        raise StartupError(f"dead_letter.options.bootstrap_servers: must name a broker of cluster.bootstrap_servers "
                           f"({cl.bootstrap_servers}) for --role ingest, where dead letters are written in the Kafka "
                           f"transaction of their range; got {sink.bootstrap_servers}")


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
