"""The Kafka event source: positions, seeking, pending partitions, commits, lag, health and backoff.

Written once over :class:`~connectors.kafka.clients.ConsumerClient`; :class:`KafkaSource` uses
kafka-python, :class:`ConfluentKafkaSource` confluent-kafka.  See :mod:`connectors.kafka` for the
exactly-once scheme and the fault model.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from typing import Any, ClassVar

from calmon.formats.collection import collection_paused
from connectors.base import Batch
from connectors.kafka.backoff import Backoff
from connectors.kafka.clients import (
    ClientFactory,
    ConsumerClient,
    ConsumerSettings,
    Fetched,
    KafkaClientError,
    KafkaConfigError,
)
from connectors.kafka.committed import Stats
from connectors.kafka.confluent import ConfluentConsumer
from connectors.kafka.groupwatch import GroupWatch
from connectors.kafka.kafkapython import KafkaPythonConsumer
from connectors.kafka.partitions import PartitionBook, Taken
from connectors.kafka.positions import TP, key_tp, validate_position
from connectors.kafka.reader import ReaderProcessConsumer
from connectors.kafka.settings import (
    READERS,
    check_source_options,
    confluent_installed,
    pick_library,
    split_source_config,
)

log = logging.getLogger("connectors.kafka")


@dataclass
class SourceCounters:
    """Counters of a source (part of :meth:`KafkaSource.health`)."""

    connects: int = 0
    connect_failures: int = 0
    errors: int = 0
    rebalances: int = 0
    offset_resets: int = 0
    skipped_offsets: int = 0
    commits: int = 0
    commit_failures: int = 0
    records: int = 0
    last_error: str | None = None


class KafkaSource:
    """Consume JSON event records from Kafka topics as a :class:`connectors.base.Source`.

    Parameters
    ----------
    bootstrap_servers
        ``"host:port"`` or a list of them.
    topics
        One topic with mixed events, or several (e.g. separate prediction and outcome topics).
    group_id
        Consumer group (offsets committed there; partitions shared between agents of the group).
        ``None`` assigns every partition of ``topics`` to this consumer (no group, no commits).
    name
        Source name (metrics, dead letters).
    client
        Extra consumer options passed through unchanged: kafka-python's (e.g. ``security_protocol``,
        ``ssl_cafile``, ``sasl_mechanism``, ``max_poll_interval_ms``), or librdkafka's dotted names for
        :class:`ConfluentKafkaSource`.
    position_policy
        ``"max"`` (default): on assignment seek to the later of the checkpointed and the committed
        offset; ``"checkpoint"``: the checkpointed offset wins whenever there is one.
    auto_offset_reset
        Where a partition with neither a checkpointed nor a committed offset starts
        (``"earliest"`` or ``"latest"``).
    backoff_initial, backoff_max
        Bounds (seconds) of the exponential backoff between connection attempts after failures.
    origins
        Attach ``"topic/partition@offset"`` origins to batches (for dead letters).
    metadata
        Attach each record's timestamp, key and headers to batches (:attr:`connectors.base.Batch.meta`,
        read by schema mappings through ``$timestamp``, ``$key``, ``$headers.NAME``).  Off by default:
        with it the source reads at about 0.37 (confluent-kafka) of its rate without, mostly garbage-collector
        work on one object per record, and at about a quarter on kafka-python, which then builds its own
        ``ConsumerRecord`` per record instead of cutting values from the batch (:mod:`connectors.kafka.valuerecords`;
        ``benchmarks/bench_kafka.py``).
    on_revoke
        Optional callback ``fn(keys: list[str])`` told which partitions were revoked; it may run on the
        consumer's IO thread and must only set flags (e.g. "checkpoint soon").
    reader
        Where the client library runs: ``"process"``, a reader process one batch ahead of the agent
        (:mod:`connectors.kafka.reader`; confluent-kafka only), ``"inline"``, on the agent's thread, or ``"auto"``
        (default): a reader process for confluent-kafka on a machine with two cores or more, else inline.

    Examples
    --------
    >>> src = KafkaSource("127.0.0.1:9", ["events"], client={"max_poll_interval_ms": 3000})
    >>> src.seek({"events/0": 42}); src.position()
    {'events/0': 42}
    >>> src.connected, src.exhausted
    (False, False)
    >>> src.close()
    """

    #: The client library adapter (see :mod:`connectors.kafka.clients`).
    ADAPTER: ClassVar[ClientFactory] = KafkaPythonConsumer

    def __init__(
        self,
        bootstrap_servers: str | list[str],
        topics: str | list[str],
        group_id: str | None = "calmon",
        *,
        name: str = "kafka",
        client: Mapping[str, Any] | None = None,
        position_policy: str = "max",
        auto_offset_reset: str = "earliest",
        backoff_initial: float = 0.5,
        backoff_max: float = 30.0,
        origins: bool = True,
        metadata: bool = False,
        on_revoke: Callable[[list[str]], None] | None = None,
        reader: str = "auto",
    ) -> None:
        self.client = self.ADAPTER.check_options(client)
        if reader not in READERS:
            raise ValueError(f"reader must be one of {', '.join(READERS)}, got {reader!r}")
        if reader == "process" and self.ADAPTER.library != "confluent":
            raise ValueError("reader: process needs library: confluent (kafka-python's client runs inline)")
        self.reader = reader
        self.topics = check_source_options(
            topics, bootstrap_servers, position_policy, auto_offset_reset, (backoff_initial, backoff_max)
        )
        self.name = name
        self.group_id = group_id
        self.bootstrap_servers = bootstrap_servers
        self.position_policy = position_policy
        self.auto_offset_reset = auto_offset_reset
        self.with_origins = origins
        if not isinstance(metadata, bool):
            raise ValueError(f"metadata must be true or false, got {metadata!r}")
        self.metadata = metadata
        self.on_revoke = on_revoke
        self.stats = SourceCounters()
        #: records of aborted transactions dropped by their markers (``read_committed``, kafka-python:
        #: :mod:`connectors.kafka.committed`)
        self.txn_stats = Stats()
        #: the consumer group's formation and its repairs (kafka-python: :mod:`connectors.kafka.groupwatch`)
        self.group_watch = GroupWatch(10.0)
        self._book = PartitionBook()  # shared with the client's rebalance callbacks
        self._consumer: ConsumerClient | None = None
        self._backoff = Backoff(float(backoff_initial), float(backoff_max))
        self._closed = False
        self._last_truncation_check = 0.0

    # ------------------------------------------------------------------ configuration
    @classmethod
    def from_config(cls, cfg: Mapping[str, Any]) -> KafkaSource:
        """Build from a config mapping (the ``options`` of a ``type: kafka`` source in the agent's YAML).

        Keys: ``bootstrap_servers`` (required); ``topics`` (list) or ``topic``, or
        ``prediction_topic`` and ``outcome_topic``; ``library`` (``kafka-python`` or ``confluent``; unset:
        confluent-kafka when it is installed and the client options are not kafka-python's, see
        :func:`~connectors.kafka.settings.pick_library`);
        ``group_id``, ``name``, ``position_policy``, ``auto_offset_reset``, ``backoff_initial``,
        ``backoff_max``, ``origins``, ``metadata``; ``client`` (dict of client options); any other key is a client
        option too (kafka-python's are checked by name, e.g. ``security_protocol``, ``ssl_cafile``).

        Examples
        --------
        >>> s = KafkaSource.from_config({"bootstrap_servers": "h:9092", "prediction_topic": "p",
        ...     "outcome_topic": "o", "security_protocol": "SASL_SSL", "sasl_mechanism": "PLAIN"})
        >>> s.topics, s.client["security_protocol"], s.ADAPTER.library
        (['p', 'o'], 'SASL_SSL', 'kafka-python')
        """
        split = split_source_config(cfg)
        target = cls
        if cls is KafkaSource and pick_library(split) == "confluent":
            target = ConfluentKafkaSource
        if target.ADAPTER.library == "confluent" and not confluent_installed():
            raise ValueError("library: confluent-kafka is not installed (pip install confluent-kafka, "
                             "or set library: kafka-python)")
        client = split.client
        client.update(target.ADAPTER.check_extra(split.rest))
        return target(split.bootstrap_servers, split.topics, client=client, **split.own)

    def consumer_config(self) -> dict[str, Any]:
        """The client configuration the consumer is created with (calmon's defaults and forced options)."""
        return self.ADAPTER(self._settings()).config()

    def _settings(self) -> ConsumerSettings:
        return ConsumerSettings(
            self.bootstrap_servers, self.topics, self.group_id, self.name, self.client, self.auto_offset_reset,
            self.metadata,
        )

    # ------------------------------------------------------------------ Source protocol
    @property
    def exhausted(self) -> bool:
        """Always False: a Kafka topic never ends."""
        return False

    def position(self) -> dict[str, int]:
        """Next offset per ``"topic/partition"`` after the last record returned by :meth:`read`."""
        return self._book.position()

    def seek(self, position: Mapping[str, Any]) -> None:
        """Continue right after ``position`` (a checkpointed :meth:`position`).

        Partitions already assigned are paused and repositioned before the next fetch.
        """
        with self._book.lock:
            self._pause(self._book.restore(validate_position(position)))

    def read(self, max_records: int = 65536, timeout: float = 0.5) -> Batch | None:
        """Next batch of at most ``max_records`` raw records, or None after ``timeout`` seconds.

        Never raises for broker or network failures: they are counted, logged, reflected in
        :attr:`connected`, and retried with a bounded exponential backoff.  Bad configuration
        raises ``ValueError``.
        """
        start = time.monotonic()
        consumer = self._ready(max_records, timeout, start)
        if consumer is None:
            return None
        try:
            with collection_paused():
                polled = self._poll(consumer, max_records, timeout, start)
                batch = self._batch(polled) if polled else None
        except KafkaClientError as exc:
            self._fail(exc)
            return None
        self._backoff.succeed()
        if not polled:
            self._check_truncation(consumer)
        return batch

    def close(self) -> None:
        """Close the consumer (leaves the group without committing; the agent commits after checkpoints)."""
        self._closed = True
        self._drop_consumer(2.0)

    # ------------------------------------------------------------------ commits, lag, health
    def commit(self, position: Mapping[str, Any] | None = None, timeout: float = 5.0) -> bool:
        """Commit ``position`` (default: :meth:`position`) to the consumer group; True on success.

        Call it after the checkpoint containing ``position`` is durable.  Only partitions currently
        assigned are committed; failures are counted and logged, never raised.
        """
        consumer = self._consumer
        if self.group_id is None or consumer is None:
            return False
        pos = validate_position(position if position is not None else self.position())
        assigned = set(self._book.assigned_keys())
        offsets = {key_tp(k): off for k, off in pos.items() if k in assigned}
        if not offsets:
            return False
        try:
            consumer.commit(offsets, timeout)
        except KafkaClientError as exc:
            self.stats.commit_failures += 1
            self.stats.last_error = f"commit: {exc}"
            log.warning("kafka source %s: offset commit failed (retried after the next checkpoint): %s",
                        self.name, exc)
            return False
        self.stats.commits += 1
        return True

    def fetched(self) -> dict[str, int]:
        """``"topic/partition"`` -> the client's fetch position, past control records and records of aborted
        transactions (which :meth:`position` does not count, being one past the last record returned); empty when
        the client library does not tell (confluent-kafka) or records are held for a transaction marker."""
        consumer = self._consumer
        fetched = getattr(consumer, "fetched", None)
        return {} if fetched is None else {tp.key: off for tp, off in fetched().items()}

    def lag(self) -> dict[str, int]:
        """Records behind the high watermark per assigned ``"topic/partition"`` (no network call).

        The high watermark comes from the latest fetch response; partitions whose watermark is not
        known yet are omitted.
        """
        consumer = self._consumer
        return {} if consumer is None else self._book.lag(consumer.highwater)

    @property
    def connected(self) -> bool:
        """True while a consumer exists, the last poll succeeded and the client reports a connection."""
        consumer = self._consumer
        return consumer is not None and self._backoff.failures == 0 and consumer.connected

    def health(self) -> dict[str, Any]:
        """Snapshot for readiness and metrics: connection, assignment, lag, counters."""
        lag = self.lag()
        return {
            "source": self.name,
            "connected": self.connected,
            "assigned": self._book.assigned_keys(),
            "pending": len(self._book.pending),
            "lag": lag,
            "lag_total": int(sum(lag.values())),
            "consecutive_failures": self._backoff.failures,
            "group_repairs": self.group_watch.repairs,
            **asdict(self.stats),
        }

    # ------------------------------------------------------------------ client events (ConsumerEvents)
    def on_assigned(self, tps: list[TP]) -> None:
        """Partitions assigned: pause them until :meth:`position_pending` has positioned them."""
        with self._book.lock:
            self._book.assign(tps)
            self._pause(tps)
        self.stats.rebalances += 1
        log.info("kafka source %s: assigned %s", self.name, sorted(tp.key for tp in tps))

    def on_revoked(self, tps: list[TP]) -> None:
        """Partitions revoked: forget their assignment (their positions stay: they are checkpointed state)."""
        self._book.revoke(tps)
        keys = sorted(tp.key for tp in tps)
        if not keys:
            return
        log.info("kafka source %s: revoked %s", self.name, keys)
        if self.on_revoke is not None:
            try:
                self.on_revoke(keys)
            except Exception as exc:  # noqa: BLE001 - a user callback must not break the consumer's thread
                log.warning("kafka source %s: on_revoke callback failed: %s", self.name, exc)

    def on_error(self, message: str, counted: bool) -> None:
        """An error the client reported outside a failing call."""
        if counted:
            self.stats.errors += 1
        self.stats.last_error = message

    def position_pending(self, timeout: float) -> None:
        """Seek newly assigned partitions to max(checkpointed, committed) and resume them."""
        consumer = self._consumer
        pending = self._book.pending_now()
        if not pending or consumer is None:
            return
        committed = self._committed(consumer, pending, timeout)
        if committed is None:
            return  # retried at the next read
        with self._book.lock:  # a revoke on the IO thread waits until the seeks are done
            done = [tp for tp in pending if tp in self._book.assigned]
            for tp in done:
                self._start_at(consumer, tp, committed.get(tp))
            live = self._book.positioned(done)
        if live:
            consumer.resume(live)

    # ------------------------------------------------------------------ internals
    def _ready(self, max_records: int, timeout: float, start: float) -> ConsumerClient | None:
        """Check ``read``'s arguments and (re)connect when the backoff allows; None = nothing to read now."""
        if max_records <= 0:
            raise ValueError("max_records must be positive")
        if self._closed:
            raise ValueError("KafkaSource is closed")
        if self._consumer is not None:
            return self._consumer
        wait = self._backoff.wait(start)
        if wait > 0:
            time.sleep(min(wait, timeout))
            return None
        consumer = self._client_class()(self._settings())
        if isinstance(consumer, KafkaPythonConsumer):  # one count of aborted records and repairs across reconnects
            consumer.txn_stats = self.txn_stats
            consumer.group_watch = self.group_watch
        self._consumer = consumer  # before start(): assignment callbacks pause through it
        try:
            consumer.start(self, timeout)
        except KafkaConfigError as exc:
            self._consumer = None
            raise ValueError(f"kafka source {self.name}: bad configuration: {exc}") from exc
        except KafkaClientError as exc:
            self._consumer = None
            self._fail(exc, connecting=True)
            return None
        self.stats.connects += 1
        log.info("kafka source %s: %s consumer started for %s (group %s)",
                 self.name, self.ADAPTER.library, self.topics, self.group_id)
        return consumer

    def _client_class(self) -> ClientFactory:
        """The adapter, or the reader process running it (``reader``)."""
        if self.reader == "process" or (self.reader == "auto" and self.ADAPTER.library == "confluent"
                                        and _cores() >= 2):
            return ReaderProcessConsumer
        return self.ADAPTER

    def _poll(self, consumer: ConsumerClient, max_records: int, timeout: float, start: float) -> Fetched:
        while True:
            self.position_pending(max(0.0, timeout - (time.monotonic() - start)))
            remaining = max(0.0, timeout - (time.monotonic() - start))
            if not self._book.assigned or self._book.pending:
                remaining = min(remaining, 0.1)  # an assignment may arrive inside poll(): come back soon
            polled = consumer.poll(max_records, remaining)
            # a rebalance inside poll() leaves new partitions paused: position them and poll again
            if polled or not self._book.pending or time.monotonic() - start >= timeout:
                return polled

    def _fail(self, exc: KafkaClientError, connecting: bool = False) -> None:
        delay = self._backoff.fail(time.monotonic())
        if connecting:
            self.stats.connect_failures += 1
        else:
            self.stats.errors += 1
        self.stats.last_error = str(exc)
        log.warning("kafka source %s: %s failed (%s); retrying in %.1f s",
                    self.name, "connect" if connecting else "poll", exc, delay)
        if connecting:
            return
        if exc.fatal or self._backoff.failures >= 5:
            self._drop_consumer(0.5)  # recreated at the next read; positions stay with the source
        time.sleep(min(delay, 1.0))

    def _drop_consumer(self, timeout: float) -> None:
        with self._book.lock:
            consumer, self._consumer = self._consumer, None
            self._book.clear()
        if consumer is not None:
            consumer.close(timeout)

    def _pause(self, tps: list[TP]) -> None:
        """Pause ``tps`` until :meth:`position_pending` has positioned them."""
        if not tps or self._consumer is None:
            return
        try:
            self._consumer.pause(tps)
        except KafkaClientError as exc:
            log.debug("kafka source %s: pause failed: %s", self.name, exc)

    def _committed(self, consumer: ConsumerClient, tps: list[TP], timeout: float) -> dict[TP, int] | None:
        """The group's committed offsets where the policy needs them; None if they are unavailable."""
        need = [] if self.group_id is None else self._book.needs_committed(tps, self.position_policy)
        if not need:
            return {}
        try:
            return consumer.committed(need, max(timeout, 1.0))
        except KafkaClientError as exc:
            log.warning("kafka source %s: committed offsets of %s unavailable: %s",
                        self.name, [tp.key for tp in need], exc)
            return None

    def _start_at(self, consumer: ConsumerClient, tp: TP, committed: int | None) -> None:
        """Seek ``tp`` to where the policy starts it (book lock held by the caller)."""
        target, own = self._book.start_offset(tp, committed, self.position_policy)
        if target is None:
            log.info("kafka source %s: %s has no checkpointed or committed offset; starting %s",
                     self.name, tp.key, self.auto_offset_reset)
            return
        consumer.seek(tp, target)
        log.info("kafka source %s: %s starts at offset %d (checkpoint %s, committed %s)",
                 self.name, tp.key, target, own, committed)

    def _check_truncation(self, consumer: ConsumerClient) -> None:
        """Reset partitions whose position lies beyond the high watermark (the log was truncated/recreated).

        Kafka answers such fetches with OFFSET_OUT_OF_RANGE and the clients reset the position
        themselves; some brokers (e.g. Tansu after a restart of in-memory storage) return empty fetches
        instead, which would stall the partition forever.  Two observations one second apart are
        required before the position is reset (``auto_offset_reset``) and counted in ``offset_resets``.
        """
        now = time.monotonic()
        if now - self._last_truncation_check < 1.0:
            return
        self._last_truncation_check = now
        for tp, old in self._book.truncated(consumer.highwater):
            try:
                if self.auto_offset_reset == "earliest":
                    target = consumer.beginning_offset(tp, 5.0)
                else:
                    target = consumer.highwater(tp) or 0
                if not self._book.reset(tp, target, consumer.seek):
                    continue
            except KafkaClientError as exc:
                log.warning("kafka source %s: cannot reset truncated %s: %s", self.name, tp.key, exc)
                continue
            self.stats.offset_resets += 1
            log.warning("kafka source %s: %s position %d is beyond the end of the log (%s): the broker lost "
                        "data; resetting to offset %d", self.name, tp.key, old, consumer.highwater(tp), target)

    def _batch(self, polled: Fetched) -> Batch | None:
        taken = self._book.take(polled, self.with_origins)
        self._count_gaps(taken)
        if not taken.records:
            return None
        self.stats.records += len(taken.records)
        return Batch(records=taken.records, position=taken.position, source=self.name, origins=taken.origins,
                     meta=taken.meta)

    def _count_gaps(self, taken: Taken) -> None:
        """Count partitions going back (reset) or jumping forward (deleted or compacted records)."""
        for gap in taken.gaps:
            if gap.first < gap.expected:
                self.stats.offset_resets += 1
                log.warning("kafka source %s: %s went back from offset %d to %d (broker lost data or offsets "
                            "were reset); records are consumed again", self.name, gap.key, gap.expected, gap.first)
            else:
                self.stats.skipped_offsets += gap.first - gap.expected
                log.info("kafka source %s: %s skipped offsets %d..%d (deleted, compacted or control records)",
                         self.name, gap.key, gap.expected, gap.first - 1)


def _cores() -> int:
    """Cores this process may run on."""
    affinity = getattr(os, "sched_getaffinity", None)
    return len(affinity(0)) if affinity is not None else os.cpu_count() or 1


class ConfluentKafkaSource(KafkaSource):
    """:class:`KafkaSource` on confluent-kafka (librdkafka): same positions, seeking, commits and health.

    Optional (``pip install confluent-kafka``, the ``kafka-fast`` extra) and the default of
    :meth:`KafkaSource.from_config` when installed: a poll is one ``consume()`` whose values are read with one C
    call per message, several times the agent's rate on kafka-python (``python -m benchmarks.bench_kafka``).
    ``client`` takes librdkafka properties (dotted names, e.g. ``security.protocol``, ``sasl.mechanism``,
    ``ssl.ca.location``).

    Examples
    --------
    >>> src = ConfluentKafkaSource("127.0.0.1:9", "events", client={"session.timeout.ms": 6000})
    >>> src.seek({"events/1": 7}); src.position()
    {'events/1': 7}
    """

    ADAPTER: ClassVar[ClientFactory] = ConfluentConsumer
