"""Kafka connectors on kafka-python: an event source, a dead-letter sink and a calibrator publisher.

Exactly-once scheme
-------------------
The source's position is a dict ``"topic/partition" -> next offset`` covering every record that
:meth:`KafkaSource.read` has returned.  The agent stores it in its checkpoint atomically with the
statistics, then calls :meth:`KafkaSource.commit` so the consumer group's committed offsets (and
hence the lag seen by Kafka tooling) follow the checkpoints.  On start, and whenever partitions are
(re)assigned by the group, the source pauses the new partitions, looks up their committed offsets
and seeks each one to ``max(checkpointed offset, committed offset)`` before fetching (policy
``"max"``; ``"checkpoint"`` uses the checkpoint alone).  Because an offset is only committed after
a checkpoint that contains it, the checkpointed offset is never behind the committed one for a
single agent, so a restart replays exactly the records after the checkpoint: nothing is lost or
counted twice.  With several agents in one group the committed offset of a partition that moved
from another agent wins, so the partition's records are counted by one agent each, except the span
the previous owner consumed but had not yet checkpointed (at-least-once for that span, as in any
Kafka consumer group without transactions).

Faults
------
The consumer is created lazily; while the broker is unreachable at start or mid-stream,
:meth:`KafkaSource.read` returns ``None`` after at most ``timeout`` seconds and retries with a bounded
exponential backoff (never raising for connectivity errors); :attr:`KafkaSource.connected` and
:meth:`KafkaSource.health` report the state for readiness probes and metrics.  An offset that goes
backwards (the broker lost data and the consumer was reset) is counted in ``offset_resets``; an
offset that jumps forward (retention deleted records not yet read) in ``skipped_offsets``.

References
----------
Apache Kafka documentation, "Consumer position", "Offset management" and "Log compaction"
(design sections 4.6 and 4.8), https://kafka.apache.org/documentation/#design .
"""

from __future__ import annotations

import json
import logging
import random
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from kafka.errors import KafkaConfigurationError

from connectors.base import Batch

log = logging.getLogger(__name__)

__all__ = [
    "KafkaCalibratorPublisher",
    "KafkaDeadLetterSink",
    "KafkaSource",
    "position_key",
    "split_position_key",
]

#: Header carrying the reject reason code on dead letters.
REASON_HEADER = "calmon-reason"
SOURCE_HEADER = "calmon-source"
ORIGIN_HEADER = "calmon-origin"

_FORCED_CONSUMER = {"enable_auto_commit", "key_deserializer", "value_deserializer"}
_CONSUMER_DEFAULTS: dict[str, Any] = {
    "reconnect_backoff_ms": 100,
    "reconnect_backoff_max_ms": 5000,
    "request_timeout_ms": 30000,
    "max_poll_records": 65536,
    "fetch_max_bytes": 52428800,
    "max_partition_fetch_bytes": 8388608,
}


def position_key(topic: str, partition: int) -> str:
    """Key of a partition in a position dict.

    Examples
    --------
    >>> position_key("events", 3)
    'events/3'
    """
    return f"{topic}/{int(partition)}"


def split_position_key(key: str) -> tuple[str, int]:
    """Inverse of :func:`position_key`.

    Examples
    --------
    >>> split_position_key("a/b/2")
    ('a/b', 2)
    """
    topic, sep, part = key.rpartition("/")
    if not sep or not topic or not part.isdigit():
        raise ValueError(f"bad Kafka position key {key!r}: expected 'topic/partition'")
    return topic, int(part)


def _validate_position(position: Mapping[str, Any]) -> dict[str, int]:
    if not isinstance(position, Mapping):
        raise ValueError(
            f"Kafka position must be a dict 'topic/partition' -> offset, got {type(position).__name__}"
        )
    out: dict[str, int] = {}
    for key, off in position.items():
        split_position_key(str(key))
        if isinstance(off, bool) or not isinstance(off, int) or off < 0:
            raise ValueError(f"Kafka position {key!r}: offset must be an integer >= 0, got {off!r}")
        out[str(key)] = int(off)
    return out


def _client_keys(kind: str) -> set[str]:
    if kind == "consumer":
        from kafka import KafkaConsumer

        return set(KafkaConsumer.DEFAULT_CONFIG)
    if kind == "producer":
        from kafka import KafkaProducer

        return set(KafkaProducer.DEFAULT_CONFIG)
    from kafka.admin import KafkaAdminClient

    return set(KafkaAdminClient.DEFAULT_CONFIG)


def _check_client(client: Mapping[str, Any] | None, kind: str, forced: Iterable[str] = ()) -> dict[str, Any]:
    """Validate kafka-python pass-through options (security, timeouts, ...)."""
    client = dict(client or {})
    known = _client_keys(kind)
    bad = sorted(k for k in client if k not in known)
    if bad:
        raise ValueError(
            f"unknown kafka-python {kind} option(s) {bad}; see the kafka-python {kind} documentation"
        )
    clash = sorted(k for k in client if k in set(forced))
    if clash:
        raise ValueError(f"kafka-python option(s) {clash} are set by calmon and cannot be overridden")
    return client


def _common(client: Mapping[str, Any], kind: str) -> dict[str, Any]:
    """The subset of ``client`` a producer/admin client understands (security, timeouts, client_id...)."""
    known = _client_keys(kind)
    return {k: v for k, v in client.items() if k in known}


def _listener(source: KafkaSource) -> Any:
    """Rebalance listener (runs on kafka-python's IO thread: it must not call blocking consumer APIs)."""
    from kafka import ConsumerRebalanceListener

    class _Listener(ConsumerRebalanceListener):
        def on_partitions_revoked(self, revoked: Any) -> None:
            source._on_revoked(revoked)

        def on_partitions_assigned(self, assigned: Any) -> None:
            source._on_assigned(assigned)

        def on_partitions_lost(self, lost: Any) -> None:
            source._on_revoked(lost)

    return _Listener()



_OWN_SOURCE_KEYS = frozenset(
    {"name", "group_id", "position_policy", "auto_offset_reset", "backoff_initial", "backoff_max", "origins"}
)


def _split_source_config(
    cfg: Mapping[str, Any], own: frozenset[str] | set[str]
) -> tuple[Any, list[str], dict[str, Any], dict[str, Any], dict[str, Any]]:
    """Split a source's config into bootstrap servers, topics, calmon's options, ``client`` and the rest."""
    cfg = dict(cfg)
    cfg.pop("type", None)
    cfg.pop("library", None)
    if "bootstrap_servers" not in cfg:
        raise ValueError("kafka source config needs 'bootstrap_servers'")
    bootstrap = cfg.pop("bootstrap_servers")
    topics: list[str] = []
    for k in ("topics", "topic", "prediction_topic", "outcome_topic"):
        if k in cfg:
            t = cfg.pop(k)
            topics += [t] if isinstance(t, str) else list(t)
    if not topics:
        raise ValueError("kafka source config needs 'topics', 'topic' or 'prediction_topic'/'outcome_topic'")
    kwargs = {k: cfg.pop(k) for k in list(cfg) if k in own}
    client = dict(cfg.pop("client", None) or {})
    return bootstrap, list(dict.fromkeys(topics)), kwargs, client, cfg


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
        Extra kafka-python consumer options passed through unchanged, e.g. ``security_protocol``,
        ``ssl_cafile``, ``sasl_mechanism``, ``sasl_plain_username``, ``max_poll_interval_ms``.
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
    on_revoke
        Optional callback ``fn(keys: list[str])`` told which partitions were revoked; it runs on the
        consumer's IO thread and must only set flags (e.g. "checkpoint soon").

    Examples
    --------
    >>> src = KafkaSource("127.0.0.1:9", ["events"], client={"max_poll_interval_ms": 3000})
    >>> src.seek({"events/0": 42}); src.position()
    {'events/0': 42}
    >>> src.connected, src.exhausted
    (False, False)
    >>> src.close()
    """

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
        on_revoke: Callable[[list[str]], None] | None = None,
    ) -> None:
        if isinstance(topics, str):
            topics = [topics]
        topics = list(topics)
        if not topics or not all(isinstance(t, str) and t for t in topics):
            raise ValueError(f"topics must be a non-empty list of topic names, got {topics!r}")
        if not bootstrap_servers:
            raise ValueError("bootstrap_servers must name at least one 'host:port'")
        if position_policy not in ("max", "checkpoint"):
            raise ValueError(f"position_policy must be 'max' or 'checkpoint', got {position_policy!r}")
        if auto_offset_reset not in ("earliest", "latest"):
            raise ValueError(f"auto_offset_reset must be 'earliest' or 'latest', got {auto_offset_reset!r}")
        if not (0 < backoff_initial <= backoff_max):
            raise ValueError("need 0 < backoff_initial <= backoff_max")
        self.name = name
        self.topics = topics
        self.group_id = group_id
        self.bootstrap_servers = bootstrap_servers
        self.client = _check_client(client, "consumer", _FORCED_CONSUMER | {"bootstrap_servers", "group_id"})
        self.position_policy = position_policy
        self.auto_offset_reset = auto_offset_reset
        self.backoff_initial = float(backoff_initial)
        self.backoff_max = float(backoff_max)
        self.with_origins = origins
        self.on_revoke = on_revoke

        self._lock = threading.RLock()
        self._consumer: Any = None
        self._pos: dict[str, int] = {}
        self._assigned: set[Any] = set()
        self._pending: set[Any] = set()
        self._failures = 0
        self._next_attempt = 0.0
        self._closed = False
        self._last_truncation_check = 0.0
        self._truncation_suspects: set[Any] = set()
        self.stats: dict[str, Any] = {
            "connects": 0,
            "connect_failures": 0,
            "errors": 0,
            "rebalances": 0,
            "offset_resets": 0,
            "skipped_offsets": 0,
            "commits": 0,
            "commit_failures": 0,
            "records": 0,
            "last_error": None,
        }

    # ------------------------------------------------------------------ configuration
    @classmethod
    def from_config(cls, cfg: Mapping[str, Any]) -> KafkaSource:
        """Build from a config mapping (the ``source`` section of the agent's YAML).

        Keys: ``bootstrap_servers`` (required); ``topics`` (list) or ``topic``, or
        ``prediction_topic`` and ``outcome_topic``; ``group_id``, ``name``, ``position_policy``,
        ``auto_offset_reset``, ``backoff_initial``, ``backoff_max``; ``client`` (dict of
        kafka-python options); any kafka-python consumer option (e.g. ``security_protocol``,
        ``sasl_mechanism``, ``ssl_cafile``) may also appear at top level and is passed through.

        Examples
        --------
        >>> s = KafkaSource.from_config({"bootstrap_servers": "h:9092", "prediction_topic": "p",
        ...     "outcome_topic": "o", "security_protocol": "SASL_SSL", "sasl_mechanism": "PLAIN"})
        >>> s.topics, s.client["security_protocol"]
        (['p', 'o'], 'SASL_SSL')
        """
        cfg = dict(cfg)
        cfg.pop("type", None)
        library = cfg.pop("library", "kafka-python")
        if library == "confluent" and cls is KafkaSource:
            return ConfluentKafkaSource.from_config(cfg)
        if library not in ("kafka-python", "confluent"):
            raise ValueError(f"library must be 'kafka-python' or 'confluent', got {library!r}")
        bootstrap, topics, kwargs, client, rest = _split_source_config(cfg, _OWN_SOURCE_KEYS)
        known = _client_keys("consumer")
        bad = sorted(k for k in rest if k not in known)
        if bad:
            raise ValueError(f"unknown kafka source option(s) {bad}")
        client.update(rest)
        return cls(bootstrap, topics, client=client, **kwargs)

    # ------------------------------------------------------------------ Source protocol
    @property
    def exhausted(self) -> bool:
        """Always False: a Kafka topic never ends."""
        return False

    def position(self) -> dict[str, int]:
        """Next offset per ``"topic/partition"`` after the last record returned by :meth:`read`."""
        with self._lock:
            return dict(self._pos)

    def seek(self, position: Mapping[str, Any]) -> None:
        """Continue right after ``position`` (a checkpointed :meth:`position`).

        Partitions already assigned are paused and repositioned before the next fetch.
        """
        pos = _validate_position(position)
        with self._lock:
            self._pos = pos
            if self._consumer is not None and self._assigned:
                self._mark_pending(list(self._assigned))

    def _connected_for_read(self, max_records: int, timeout: float, start: float) -> bool:
        """Check ``read``'s arguments and (re)connect when the backoff allows; False = nothing to read now.

        Bad configuration raises ``ValueError``; any other connect failure is counted and retried later.
        """
        if max_records <= 0:
            raise ValueError("max_records must be positive")
        if self._closed:
            raise ValueError("KafkaSource is closed")
        if self._consumer is not None:
            return True
        wait = self._next_attempt - start
        if wait > 0:
            time.sleep(min(wait, timeout))
            return False
        try:
            self._connect(timeout)
        except (TypeError, ValueError, KafkaConfigurationError) as exc:
            raise ValueError(f"kafka source {self.name}: bad configuration: {exc}") from exc
        except Exception as exc:  # noqa: BLE001 - any other connect failure is retried
            self._fail(exc, connecting=True)
            return False
        return True

    def read(self, max_records: int = 65536, timeout: float = 0.5) -> Batch | None:
        """Next batch of at most ``max_records`` raw records, or None after ``timeout`` seconds.

        Never raises for broker or network failures: they are counted, logged, reflected in
        :attr:`connected`, and retried with a bounded exponential backoff.
        """
        start = time.monotonic()
        if not self._connected_for_read(max_records, timeout, start):
            return None
        try:
            while True:
                self._position_pending(max(0.0, timeout - (time.monotonic() - start)))
                remaining = max(0.0, timeout - (time.monotonic() - start))
                if not self._assigned or self._pending:
                    remaining = min(remaining, 0.1)  # an assignment may arrive inside poll(): come back soon
                polled = self._consumer.poll(timeout_ms=int(remaining * 1000), max_records=int(max_records))
                # a rebalance inside poll() leaves new partitions paused: position them and poll again
                if polled or not self._pending or time.monotonic() - start >= timeout:
                    break
        except Exception as exc:  # noqa: BLE001 - never crash the agent on a broker problem
            self._fail(exc)
            return None
        self._failures = 0
        if not polled:
            self._check_truncation()
            return None
        return self._batch(polled)

    def close(self) -> None:
        """Close the consumer (leaves the group without committing; the agent commits after checkpoints)."""
        self._closed = True
        with self._lock:
            consumer, self._consumer = self._consumer, None
        if consumer is not None:
            try:
                consumer.close(autocommit=False, timeout_ms=2000)
            except Exception as exc:  # noqa: BLE001
                log.warning("kafka source %s: close failed: %s", self.name, exc)

    # ------------------------------------------------------------------ commits, lag, health
    def commit(self, position: Mapping[str, Any] | None = None, timeout: float = 5.0) -> bool:
        """Commit ``position`` (default: :meth:`position`) to the consumer group; True on success.

        Call it after the checkpoint containing ``position`` is durable.  Only partitions currently
        assigned are committed; failures are counted and logged, never raised.
        """
        if self.group_id is None or self._consumer is None:
            return False
        from kafka import OffsetAndMetadata, TopicPartition

        pos = _validate_position(position if position is not None else self.position())
        with self._lock:
            assigned = {position_key(tp.topic, tp.partition) for tp in self._assigned}
        offsets = {
            TopicPartition(*split_position_key(k)): OffsetAndMetadata(off, "", -1)
            for k, off in pos.items()
            if k in assigned
        }
        if not offsets:
            return False
        try:
            self._consumer.commit(offsets=offsets, timeout_ms=int(timeout * 1000))
        except Exception as exc:  # noqa: BLE001
            self.stats["commit_failures"] += 1
            self.stats["last_error"] = f"commit: {exc!r}"
            log.warning(
                "kafka source %s: offset commit failed (will retry after the next checkpoint): %s",
                self.name,
                exc,
            )
            return False
        self.stats["commits"] += 1
        return True

    def lag(self) -> dict[str, int]:
        """Records behind the high watermark per assigned ``"topic/partition"`` (no network call).

        The high watermark comes from the latest fetch response (``ListOffsets`` is not used: some
        brokers, e.g. Tansu 0.6, answer it with the start of the last batch).  Partitions whose
        watermark is not known yet are omitted.
        """
        consumer = self._consumer
        if consumer is None:
            return {}
        out: dict[str, int] = {}
        with self._lock:
            assigned = list(self._assigned)
            pos = dict(self._pos)
        for tp in assigned:
            try:
                hw = consumer.highwater(tp)
            except Exception:  # noqa: BLE001, S112 - revoked meanwhile
                continue
            key = position_key(tp.topic, tp.partition)
            if hw is None or key not in pos:
                continue
            out[key] = max(0, int(hw) - pos[key])
        return out

    @property
    def connected(self) -> bool:
        """True while a consumer exists, the last poll succeeded and a broker connection is open."""
        consumer = self._consumer
        if consumer is None or self._failures > 0:
            return False
        try:
            return bool(consumer._manager.least_used_connections())
        except Exception:  # noqa: BLE001 - internals of another kafka-python version
            return True

    def health(self) -> dict[str, Any]:
        """Snapshot for readiness and metrics: connection, assignment, lag, counters."""
        lag = self.lag()
        with self._lock:
            assigned = sorted(position_key(tp.topic, tp.partition) for tp in self._assigned)
            pending = len(self._pending)
        return {
            "source": self.name,
            "connected": self.connected,
            "assigned": assigned,
            "pending": pending,
            "lag": lag,
            "lag_total": int(sum(lag.values())),
            "consecutive_failures": self._failures,
            **self.stats,
        }

    # ------------------------------------------------------------------ internals
    def _consumer_config(self) -> dict[str, Any]:
        cfg = dict(_CONSUMER_DEFAULTS)
        cfg.update(self.client)
        cfg.update(
            bootstrap_servers=self.bootstrap_servers,
            group_id=self.group_id,
            enable_auto_commit=False,
            auto_offset_reset=self.auto_offset_reset,
            client_id=cfg.get("client_id", f"calmon-{self.name}"),
        )
        cfg.setdefault("bootstrap_timeout_ms", 2000)
        return cfg

    def _connect(self, timeout: float) -> None:
        from kafka import KafkaConsumer, TopicPartition

        cfg = self._consumer_config()
        cfg["bootstrap_timeout_ms"] = int(min(cfg["bootstrap_timeout_ms"], max(timeout, 0.2) * 1000))
        consumer = KafkaConsumer(**cfg)
        try:
            if self.group_id is None:
                tps = []
                for topic in self.topics:
                    parts = consumer.partitions_for_topic(topic)
                    if not parts:
                        raise RuntimeError(f"topic {topic!r} has no partitions (does it exist?)")
                    tps += [TopicPartition(topic, p) for p in sorted(parts)]
                with self._lock:
                    self._consumer = consumer
                consumer.assign(tps)
                self._on_assigned(tps)
            else:
                with self._lock:
                    self._consumer = consumer
                consumer.subscribe(topics=self.topics, listener=_listener(self))
        except Exception:
            with self._lock:
                self._consumer = None
            try:
                consumer.close(autocommit=False, timeout_ms=500)
            except Exception:  # noqa: BLE001, S110
                pass
            raise
        self.stats["connects"] += 1
        log.info("kafka source %s: consumer started for %s (group %s)", self.name, self.topics, self.group_id)

    def _fail(self, exc: BaseException, connecting: bool = False) -> None:
        self._failures += 1
        self.stats["connect_failures" if connecting else "errors"] += 1
        self.stats["last_error"] = repr(exc)
        delay = min(self.backoff_max, self.backoff_initial * 2 ** min(self._failures - 1, 30))
        delay *= 0.8 + 0.4 * random.random()
        self._next_attempt = time.monotonic() + delay
        log.warning(
            "kafka source %s: %s failed (%s); retrying in %.1f s",
            self.name,
            "connect" if connecting else "poll",
            exc,
            delay,
        )
        if not connecting:
            from kafka.errors import IllegalStateError

            if isinstance(exc, IllegalStateError) or self._failures >= 5:
                # recreate the consumer after repeated failures; positions stay with the source
                with self._lock:
                    consumer, self._consumer = self._consumer, None
                    self._assigned.clear()
                    self._pending.clear()
                if consumer is not None:
                    try:
                        consumer.close(autocommit=False, timeout_ms=500)
                    except Exception:  # noqa: BLE001, S110
                        pass
            time.sleep(min(delay, 1.0))

    def _mark_pending(self, tps: list[Any]) -> None:
        """Pause ``tps`` until :meth:`_position_pending` has sought them (lock held by caller)."""
        if not tps:
            return
        self._pending.update(tps)
        try:
            self._consumer.pause(*tps)
        except Exception as exc:  # noqa: BLE001
            log.debug("pause failed: %s", exc)

    def _on_assigned(self, assigned: Any) -> None:
        tps = list(assigned)
        with self._lock:
            self._assigned.update(tps)
            self.stats["rebalances"] += 1
            self._mark_pending(tps)
        log.info(
            "kafka source %s: assigned %s",
            self.name,
            sorted(position_key(tp.topic, tp.partition) for tp in tps),
        )

    def _on_revoked(self, revoked: Any) -> None:
        tps = list(revoked)
        with self._lock:
            self._assigned.difference_update(tps)
            self._pending.difference_update(tps)
        keys = sorted(position_key(tp.topic, tp.partition) for tp in tps)
        if keys:
            log.info("kafka source %s: revoked %s", self.name, keys)
        if self.on_revoke is not None and keys:
            try:
                self.on_revoke(keys)
            except Exception as exc:  # noqa: BLE001
                log.warning("kafka source %s: on_revoke callback failed: %s", self.name, exc)

    def _position_pending(self, timeout: float) -> None:
        """Seek newly assigned partitions to max(checkpointed, committed) and resume them."""
        with self._lock:
            pending = [tp for tp in self._pending if tp in self._assigned]
            self._pending.intersection_update(self._assigned)
        if not pending:
            return
        consumer = self._consumer
        deadline = time.monotonic() + max(timeout, 1.0)
        done = []
        for tp in sorted(pending):
            key = position_key(tp.topic, tp.partition)
            with self._lock:
                own = self._pos.get(key)
            committed = None
            if self.group_id is not None and (self.position_policy == "max" or own is None):
                left = int(max(0.1, deadline - time.monotonic()) * 1000)
                try:
                    committed = consumer.committed(tp, timeout_ms=left)
                except Exception as exc:  # noqa: BLE001 - retried at the next read
                    log.warning(
                        "kafka source %s: committed offset of %s unavailable: %s", self.name, key, exc
                    )
                    break
            candidates = [o for o in (own, committed) if o is not None]
            with self._lock:
                if tp not in self._assigned:
                    continue
                if candidates:
                    target = max(candidates)
                    consumer.seek(tp, target)
                    self._pos[key] = target
                    log.info(
                        "kafka source %s: %s starts at offset %d (checkpoint %s, committed %s)",
                        self.name,
                        key,
                        target,
                        own,
                        committed,
                    )
                else:
                    log.info(
                        "kafka source %s: %s has no checkpointed or committed offset; starting %s",
                        self.name,
                        key,
                        self.auto_offset_reset,
                    )
                done.append(tp)
        with self._lock:
            self._pending.difference_update(done)
            live = [tp for tp in done if tp in self._assigned]
        if live:
            consumer.resume(*live)

    def _check_truncation(self) -> None:
        """Reset partitions whose position lies beyond the high watermark (the log was truncated/recreated).

        Kafka answers such fetches with OFFSET_OUT_OF_RANGE and kafka-python resets the position
        itself; some brokers (e.g. Tansu after a restart of in-memory storage) return empty fetches
        instead, which would stall the partition forever.  Two observations one second apart are
        required before the position is reset (``auto_offset_reset``) and counted in ``offset_resets``.
        """
        now = time.monotonic()
        if now - self._last_truncation_check < 1.0:
            return
        self._last_truncation_check = now
        consumer = self._consumer
        with self._lock:
            tps = [tp for tp in self._assigned if tp not in self._pending]
            pos = dict(self._pos)
        suspects = set()
        for tp in tps:
            key = position_key(tp.topic, tp.partition)
            try:
                hw = consumer.highwater(tp)
            except Exception:  # noqa: BLE001, S112 - revoked meanwhile
                continue
            if hw is not None and key in pos and pos[key] > hw:
                suspects.add(tp)
        confirmed = suspects & self._truncation_suspects
        self._truncation_suspects = suspects - confirmed
        for tp in sorted(confirmed):
            key = position_key(tp.topic, tp.partition)
            try:
                if self.auto_offset_reset == "earliest":
                    target = int(consumer.beginning_offsets([tp], timeout_ms=5000)[tp])
                else:
                    target = int(consumer.highwater(tp))
            except Exception as exc:  # noqa: BLE001 - retried at the next check
                log.warning("kafka source %s: cannot reset truncated %s: %s", self.name, key, exc)
                continue
            with self._lock:
                if tp not in self._assigned:
                    continue
                consumer.seek(tp, target)
                log.warning(
                    "kafka source %s: %s position %d is beyond the end of the log (%s): the broker lost "
                    "data; resetting to offset %d",
                    self.name,
                    key,
                    pos[key],
                    consumer.highwater(tp),
                    target,
                )
                self._pos[key] = target
                self.stats["offset_resets"] += 1

    def _batch(self, polled: Mapping[Any, list[Any]]) -> Batch | None:
        records: list[bytes] = []
        origins: list[str] | None = [] if self.with_origins else None
        with self._lock:
            for tp in sorted(polled):
                rs = polled[tp]
                if not rs:
                    continue
                if tp in self._pending or tp not in self._assigned:
                    continue  # fetched before a revoke/seek: will be read again from the right offset
                key = position_key(tp.topic, tp.partition)
                first = rs[0].offset
                expected = self._pos.get(key)
                if expected is not None and first != expected:
                    if first < expected:
                        self.stats["offset_resets"] += 1
                        log.warning(
                            "kafka source %s: %s went back from offset %d to %d (broker lost data or "
                            "offsets were reset); records are consumed again",
                            self.name,
                            key,
                            expected,
                            first,
                        )
                    else:
                        self.stats["skipped_offsets"] += first - expected
                        log.info(
                            "kafka source %s: %s skipped offsets %d..%d (deleted, compacted or "
                            "control records)",
                            self.name,
                            key,
                            expected,
                            first - 1,
                        )
                records.extend([r.value if r.value is not None else b"" for r in rs])
                if origins is not None:
                    origins.extend([f"{key}@{r.offset}" for r in rs])
                self._pos[key] = rs[-1].offset + 1
            position = dict(self._pos)
        if not records:
            return None
        self.stats["records"] += len(records)
        return Batch(records=records, position=position, source=self.name, origins=origins)


class KafkaDeadLetterSink:
    """Write rejected records to a Kafka topic, the reason code in header ``calmon-reason``.

    Each dead letter keeps the raw record as value and carries headers ``calmon-reason``,
    ``calmon-source`` and ``calmon-origin`` (e.g. ``"events/0@1234"``).  The position (end offset of
    the dead-letter topic per partition after a flush) is checkpointed with the agent's state; after
    :meth:`seek` the sink reads the dead letters written after that position and skips re-writing
    records with the same origin, so a restart that replays source records does not duplicate
    dead letters (exactly once, given unique origins).

    Parameters
    ----------
    bootstrap_servers
        ``"host:port"`` or a list.
    topic
        Dead-letter topic (created with ``partitions`` partitions if missing).
    client
        kafka-python producer options passed through (security, ``acks``, ...).
    buffer_limit
        Dead letters kept in memory while the broker is unreachable; the oldest beyond it are
        dropped and counted in ``stats["dropped"]``.

    Examples
    --------
    >>> sink = KafkaDeadLetterSink("127.0.0.1:9", "dead")
    >>> sink.position()
    {}
    >>> sink.close()
    """

    def __init__(
        self,
        bootstrap_servers: str | list[str],
        topic: str = "calmon-dead-letters",
        *,
        client: Mapping[str, Any] | None = None,
        partitions: int = 1,
        buffer_limit: int = 100_000,
        flush_timeout: float = 5.0,
    ) -> None:
        if not topic:
            raise ValueError("dead-letter topic must be a non-empty string")
        if partitions < 1:
            raise ValueError("partitions must be >= 1")
        self.bootstrap_servers = bootstrap_servers
        self.topic = topic
        self.client = _check_client(
            client, "producer", {"bootstrap_servers", "key_serializer", "value_serializer"}
        )
        self.partitions = int(partitions)
        self.buffer_limit = int(buffer_limit)
        self.flush_timeout = float(flush_timeout)
        self._producer: Any = None
        self._buffer: list[tuple[bytes, list[tuple[str, bytes]], str | None]] = []
        self._inflight: list[tuple[Any, tuple[bytes, list[tuple[str, bytes]], str | None]]] = []
        self._end: dict[str, int] = {}
        self._skip: set[str] = set()
        self._pending_seek: dict[str, int] | None = None
        self._scan_failures = 0
        self._flush_blocked_until = 0.0
        self._next_attempt = 0.0
        self.stats: dict[str, Any] = {
            "written": 0,
            "skipped_replayed": 0,
            "dropped": 0,
            "failures": 0,
            "last_error": None,
        }

    @classmethod
    def from_config(cls, cfg: Mapping[str, Any]) -> KafkaDeadLetterSink:
        """Build from ``{"bootstrap_servers", "topic", "partitions", "client", <producer options>}``."""
        cfg = dict(cfg)
        cfg.pop("type", None)
        if "bootstrap_servers" not in cfg:
            raise ValueError("kafka dead-letter config needs 'bootstrap_servers'")
        kw = {k: cfg.pop(k) for k in ("topic", "partitions", "buffer_limit", "flush_timeout") if k in cfg}
        client = dict(cfg.pop("client", None) or {})
        bootstrap = cfg.pop("bootstrap_servers")
        client.update(_check_client(cfg, "producer"))
        return cls(bootstrap, client=client, **kw)

    def _ensure_producer(self) -> bool:
        if self._producer is not None:
            return True
        if time.monotonic() < self._next_attempt:
            return False
        from kafka import KafkaProducer

        cfg = {
            "linger_ms": 20,
            "max_block_ms": 2000,
            "bootstrap_timeout_ms": 2000,
            "acks": "all",
            "reconnect_backoff_max_ms": 5000,
        }
        cfg.update(self.client)
        try:
            _ensure_topic(self.bootstrap_servers, self.topic, self.partitions, {}, self.client)
            self._producer = KafkaProducer(bootstrap_servers=self.bootstrap_servers, **cfg)
        except Exception as exc:  # noqa: BLE001
            self.stats["failures"] += 1
            self.stats["last_error"] = repr(exc)
            self._next_attempt = time.monotonic() + 2.0
            log.warning("dead-letter sink %s: producer unavailable (%s); buffering", self.topic, exc)
            return False
        return True

    def write(
        self, records: list[bytes], reasons: list[str], source: str, origins: list[str] | None = None
    ) -> None:
        """Queue rejected ``records`` with their reason codes (sent asynchronously; see :meth:`flush`)."""
        if len(records) != len(reasons) or (origins is not None and len(origins) != len(records)):
            raise ValueError("records, reasons (and origins) must have the same length")
        src = source.encode()
        for i, rec in enumerate(records):
            origin = origins[i] if origins is not None else None
            if origin is not None and origin in self._skip:
                self._skip.discard(origin)
                self.stats["skipped_replayed"] += 1
                continue
            headers = [(REASON_HEADER, str(reasons[i]).encode()), (SOURCE_HEADER, src)]
            if origin is not None:
                headers.append((ORIGIN_HEADER, origin.encode()))
            self._buffer.append((bytes(rec), headers, origin))
        if len(self._buffer) > self.buffer_limit:
            drop = len(self._buffer) - self.buffer_limit
            self.stats["dropped"] += drop
            del self._buffer[:drop]
        self._send()

    def _send(self) -> None:
        if not self._buffer or time.monotonic() < self._next_attempt or not self._ensure_producer():
            return
        if self._pending_seek is not None and not self._scan_replayed():
            self._scan_failures += 1
            if self._scan_failures < 3:
                self._next_attempt = time.monotonic() + 2.0
                return
            log.warning(
                "dead-letter sink %s: cannot read the dead letters written after the checkpoint (%s); "
                "dead letters of replayed records may be duplicated",
                self.topic,
                self.stats["last_error"],
            )
            self._pending_seek = None
        buf, self._buffer = self._buffer, []
        for i, item in enumerate(buf):
            value, headers, origin = item
            if origin is not None and origin in self._skip:
                self._skip.discard(origin)
                self.stats["skipped_replayed"] += 1
                continue
            try:
                fut = self._producer.send(self.topic, value=value, headers=headers)
            except Exception as exc:  # noqa: BLE001 - broker down: keep the rest for later
                self.stats["failures"] += 1
                self.stats["last_error"] = repr(exc)
                self._buffer = buf[i:] + self._buffer
                return
            self._inflight.append((fut, item))

    def flush(self) -> None:
        """Send queued dead letters and wait for their acknowledgement (failed ones stay queued)."""
        self._send()
        if self._producer is None or time.monotonic() < self._flush_blocked_until:
            return  # the broker did not acknowledge the last flush: do not block the agent again so soon
        try:
            self._producer.flush(timeout=self.flush_timeout)
        except Exception as exc:  # noqa: BLE001
            self.stats["last_error"] = repr(exc)
        inflight, self._inflight = self._inflight, []
        retry = []
        for fut, item in inflight:
            if fut.is_done and fut.succeeded():
                md = fut.value
                key = position_key(md.topic, md.partition)
                self._end[key] = max(self._end.get(key, 0), int(md.offset) + 1)
                self.stats["written"] += 1
            elif fut.is_done:
                self.stats["failures"] += 1
                self.stats["last_error"] = repr(fut.exception)
                retry.append(item)
            else:
                self._inflight.append((fut, item))
        self._buffer = retry + self._buffer
        if self._inflight:
            self._flush_blocked_until = time.monotonic() + 5.0

    def position(self) -> dict[str, int]:
        """End offset per dead-letter partition after flushing (checkpoint it with the state)."""
        if self._buffer or self._inflight:
            self.flush()
        out = dict(self._pending_seek or {})
        for k, v in self._end.items():
            out[k] = max(out.get(k, 0), v)
        return out

    def seek(self, position: Mapping[str, Any]) -> None:
        """Restore a checkpointed position: dead letters already written after it are not written again."""
        pos = _validate_position(position)
        self._pending_seek = pos
        self._end = dict(pos)
        self._skip.clear()
        self._scan_failures = 0

    def _scan_replayed(self, timeout: float = 10.0) -> bool:
        """Collect the origins of dead letters written after the sought position."""
        from kafka import KafkaConsumer, TopicPartition

        pos = self._pending_seek or {}
        cfg = _common(self.client, "consumer")
        try:
            consumer = KafkaConsumer(
                bootstrap_servers=self.bootstrap_servers,
                enable_auto_commit=False,
                bootstrap_timeout_ms=2000,
                **cfg,
            )
        except Exception as exc:  # noqa: BLE001
            self.stats["last_error"] = repr(exc)
            return False
        try:
            parts = consumer.partitions_for_topic(self.topic) or set()
            tps = [TopicPartition(self.topic, p) for p in sorted(parts)]
            if not tps:
                self._pending_seek = None
                return True
            consumer.assign(tps)
            for tp in tps:
                consumer.seek(tp, pos.get(position_key(tp.topic, tp.partition), 0))
            deadline = time.monotonic() + timeout
            found: set[str] = set()
            while True:
                for _tp, rs in consumer.poll(timeout_ms=200).items():
                    for r in rs:
                        origin = dict(r.headers or []).get(ORIGIN_HEADER)
                        if origin is not None:
                            found.add(origin.decode())
                # high watermarks come with every fetch response, also an empty one
                ends = {tp: consumer.highwater(tp) for tp in tps}
                if all(
                    ends[tp] is not None and consumer.position(tp, timeout_ms=1000) >= ends[tp] for tp in tps
                ):
                    break
                if time.monotonic() > deadline:
                    return False
            self._skip |= found
            for tp in tps:
                key = position_key(tp.topic, tp.partition)
                self._end[key] = max(self._end.get(key, 0), int(ends[tp]))
            self._pending_seek = None
            return True
        except Exception as exc:  # noqa: BLE001
            self.stats["last_error"] = repr(exc)
            return False
        finally:
            consumer.close()

    def close(self) -> None:
        """Flush and close the producer."""
        try:
            self.flush()
        finally:
            if self._producer is not None:
                try:
                    self._producer.close(timeout=2)
                except Exception:  # noqa: BLE001, S110
                    pass
                self._producer = None


def _ensure_topic(
    bootstrap: str | list[str],
    topic: str,
    partitions: int,
    config: Mapping[str, str],
    client: Mapping[str, Any],
) -> bool:
    """Create ``topic`` if missing; True if it was created."""
    from kafka.admin import KafkaAdminClient, NewTopic
    from kafka.errors import TopicAlreadyExistsError

    admin = KafkaAdminClient(
        bootstrap_servers=bootstrap, bootstrap_timeout_ms=2000, **_common(client, "admin")
    )
    try:
        if topic in set(admin.list_topics()):
            return False
        try:
            admin.create_topics([NewTopic(topic, partitions, 1, topic_configs=dict(config))])
        except TopicAlreadyExistsError:
            return False
        return True
    finally:
        admin.close()


class KafkaCalibratorPublisher:
    """Publish refreshed calibrators to a compacted topic keyed by model name.

    The topic is created with ``cleanup.policy=compact`` if missing, so the latest calibrator of
    every model survives retention; :meth:`latest` reads the topic and returns the last value per
    key (correct whether or not the broker has compacted yet).  ``None`` publishes a tombstone.

    Parameters
    ----------
    bootstrap_servers
        ``"host:port"`` or a list.
    topic
        Compacted topic name.
    client
        kafka-python producer options passed through (security, ...).

    Examples
    --------
    >>> pub = KafkaCalibratorPublisher("127.0.0.1:9", "calibrators")
    >>> pub.encode({"method": "platt", "a": 1.0, "b": 0.0})
    b'{"a":1.0,"b":0.0,"method":"platt"}'
    """

    def __init__(
        self,
        bootstrap_servers: str | list[str],
        topic: str = "calmon-calibrators",
        *,
        client: Mapping[str, Any] | None = None,
        partitions: int = 1,
    ) -> None:
        if not topic:
            raise ValueError("calibrator topic must be a non-empty string")
        self.bootstrap_servers = bootstrap_servers
        self.topic = topic
        self.partitions = int(partitions)
        self.client = _check_client(
            client, "producer", {"bootstrap_servers", "key_serializer", "value_serializer"}
        )
        self._producer: Any = None
        self._topic_ready = False

    @staticmethod
    def encode(calibrator: Mapping[str, Any] | bytes | None) -> bytes | None:
        """JSON bytes of a calibrator (sorted keys, compact), bytes unchanged, None for a tombstone."""
        if calibrator is None or isinstance(calibrator, bytes):
            return calibrator
        if not isinstance(calibrator, Mapping):
            raise ValueError(f"calibrator must be a dict, bytes or None, got {type(calibrator).__name__}")
        return json.dumps(calibrator, sort_keys=True, separators=(",", ":"), allow_nan=False).encode()

    def ensure_topic(self) -> bool:
        """Create the topic with ``cleanup.policy=compact`` if it does not exist; True if created."""
        created = _ensure_topic(
            self.bootstrap_servers, self.topic, self.partitions, {"cleanup.policy": "compact"}, self.client
        )
        self._topic_ready = True
        return created

    def publish(
        self, model: str, calibrator: Mapping[str, Any] | bytes | None, timeout: float = 10.0
    ) -> None:
        """Publish (and wait for the acknowledgement of) the calibrator of ``model``.

        Raises
        ------
        kafka.errors.KafkaError
            If the broker does not acknowledge within ``timeout``; the caller retries at the next refresh.
        """
        if not isinstance(model, str) or not model:
            raise ValueError("model must be a non-empty string")
        value = self.encode(calibrator)
        if not self._topic_ready:
            self.ensure_topic()
        if self._producer is None:
            from kafka import KafkaProducer

            cfg = {
                "acks": "all",
                "max_block_ms": int(timeout * 1000),
                "bootstrap_timeout_ms": int(timeout * 1000),
            }
            cfg.update(self.client)
            self._producer = KafkaProducer(bootstrap_servers=self.bootstrap_servers, **cfg)
        headers = [("content-type", b"application/json"), ("calmon-model", model.encode())]
        self._producer.send(self.topic, key=model.encode(), value=value, headers=headers).get(timeout=timeout)

    def latest(self, timeout: float = 10.0) -> dict[str, dict[str, Any]]:
        """Read the topic from the beginning; the last calibrator per model (tombstones delete)."""
        from kafka import KafkaConsumer, TopicPartition

        consumer = KafkaConsumer(
            bootstrap_servers=self.bootstrap_servers,
            enable_auto_commit=False,
            bootstrap_timeout_ms=int(timeout * 1000),
            **_common(self.client, "consumer"),
        )
        out: dict[str, dict[str, Any]] = {}
        try:
            tps = [
                TopicPartition(self.topic, p) for p in sorted(consumer.partitions_for_topic(self.topic) or ())
            ]
            if not tps:
                return out
            consumer.assign(tps)
            consumer.seek_to_beginning(*tps)
            deadline = time.monotonic() + timeout
            while time.monotonic() < deadline:
                for _tp, rs in consumer.poll(timeout_ms=300).items():
                    for r in rs:
                        model = r.key.decode() if r.key is not None else ""
                        if r.value is None:
                            out.pop(model, None)
                        else:
                            out[model] = json.loads(r.value)
                done = True
                for tp in tps:
                    hw = consumer.highwater(tp)
                    done &= hw is not None and consumer.position(tp) >= hw
                if done:
                    break
            return out
        finally:
            consumer.close()

    def close(self) -> None:
        """Flush and close the producer."""
        if self._producer is not None:
            try:
                self._producer.flush(timeout=5)
                self._producer.close(timeout=2)
            finally:
                self._producer = None


class ConfluentKafkaSource(KafkaSource):
    """:class:`KafkaSource` on confluent-kafka (librdkafka): same positions, seeking, commits and health.

    Optional (``pip install confluent-kafka``); about twice the consume rate of kafka-python (see
    ``scripts/bench_kafka.py``).  ``client`` takes librdkafka properties (dotted names, e.g.
    ``security.protocol``, ``sasl.mechanism``, ``ssl.ca.location``); partitions are positioned in the
    assignment callback (it runs in the thread calling :meth:`read`, so it may look up committed offsets).

    Examples
    --------
    >>> src = ConfluentKafkaSource("127.0.0.1:9", "events", client={"session.timeout.ms": 6000})
    >>> src.seek({"events/1": 7}); src.position()
    {'events/1': 7}
    """

    _FORCED = {"bootstrap.servers", "group.id", "enable.auto.commit", "enable.auto.offset.store"}

    def __init__(
        self,
        bootstrap_servers: str | list[str],
        topics: str | list[str],
        group_id: str | None = "calmon",
        *,
        client: Mapping[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        client = dict(client or {})
        clash = sorted(k for k in client if k in self._FORCED)
        if clash:
            raise ValueError(f"librdkafka option(s) {clash} are set by calmon and cannot be overridden")
        bad = sorted(k for k in client if not isinstance(k, str) or "_" in k)
        if bad:
            raise ValueError(f"librdkafka options use dotted names (e.g. 'security.protocol'), got {bad}")
        super().__init__(bootstrap_servers, topics, group_id, **kwargs)
        self.client = client
        self._cf_connected = False

    @classmethod
    def from_config(cls, cfg: Mapping[str, Any]) -> ConfluentKafkaSource:
        """Like :meth:`KafkaSource.from_config`; options other than calmon's go to librdkafka as they are."""
        bootstrap, topics, kwargs, client, rest = _split_source_config(cfg, _OWN_SOURCE_KEYS | {"on_revoke"})
        client.update(rest)  # librdkafka's own option names, passed through as they are
        return cls(bootstrap, topics, client=client, **kwargs)

    def _consumer_config(self) -> dict[str, Any]:
        servers = self.bootstrap_servers
        cfg: dict[str, Any] = {
            "reconnect.backoff.max.ms": 5000,
            "client.id": f"calmon-{self.name}",
            "error_cb": self._on_error,
        }
        cfg.update(self.client)
        cfg.update(
            {
                "bootstrap.servers": servers if isinstance(servers, str) else ",".join(servers),
                "group.id": self.group_id or f"calmon-{self.name}-nogroup",
                "enable.auto.commit": False,
                "enable.auto.offset.store": False,
                "auto.offset.reset": self.auto_offset_reset,
            }
        )
        return cfg

    def _on_error(self, err: Any) -> None:
        from confluent_kafka import KafkaError

        self.stats["last_error"] = str(err)
        if err.code() in (KafkaError._ALL_BROKERS_DOWN, KafkaError._TRANSPORT):
            self._cf_connected = False

    def _connect(self, timeout: float) -> None:
        from confluent_kafka import Consumer
        from confluent_kafka import TopicPartition as CTP

        consumer = Consumer(self._consumer_config())
        with self._lock:
            self._consumer = consumer
        if self.group_id is None:
            md = consumer.list_topics(timeout=max(timeout, 1.0))
            tps = []
            for topic in self.topics:
                t = md.topics.get(topic)
                if t is None or t.error is not None or not t.partitions:
                    consumer.close()
                    with self._lock:
                        self._consumer = None
                    raise RuntimeError(f"topic {topic!r} has no partitions (does it exist?)")
                tps += [CTP(topic, p) for p in sorted(t.partitions)]
            self._cf_assign(consumer, tps)
        else:
            consumer.subscribe(
                self.topics, on_assign=self._cf_assign, on_revoke=self._cf_revoke, on_lost=self._cf_revoke
            )
        self.stats["connects"] += 1
        log.info(
            "kafka source %s: confluent consumer started for %s (group %s)",
            self.name,
            self.topics,
            self.group_id,
        )

    def _cf_assign(self, consumer: Any, partitions: list[Any]) -> None:
        """Assignment callback (runs inside consume()): position at max(checkpointed, committed)."""
        committed: dict[tuple[str, int], int] = {}
        if self.group_id is not None and partitions:
            try:
                for tp in consumer.committed(partitions, timeout=10):
                    if tp.offset >= 0:
                        committed[(tp.topic, tp.partition)] = tp.offset
            except Exception as exc:  # noqa: BLE001
                log.warning("kafka source %s: committed offsets unavailable: %s", self.name, exc)
        with self._lock:
            for tp in partitions:
                key = position_key(tp.topic, tp.partition)
                own = self._pos.get(key)
                com = committed.get((tp.topic, tp.partition))
                if self.position_policy == "checkpoint" and own is not None:
                    com = None
                candidates = [o for o in (own, com) if o is not None]
                if candidates:
                    tp.offset = max(candidates)
                    self._pos[key] = tp.offset
            self._assigned = {(tp.topic, tp.partition) for tp in partitions} | (
                self._assigned if self.group_id is None else set()
            )
            self.stats["rebalances"] += 1
        consumer.assign(partitions)
        log.info(
            "kafka source %s: assigned %s",
            self.name,
            sorted(position_key(tp.topic, tp.partition) for tp in partitions),
        )

    def _cf_revoke(self, consumer: Any, partitions: list[Any]) -> None:
        self._on_revoked([_TP(tp.topic, tp.partition) for tp in partitions])
        try:
            consumer.unassign()
        except Exception:  # noqa: BLE001, S110
            pass

    def _on_revoked(self, revoked: Any) -> None:
        with self._lock:
            self._assigned.difference_update((tp.topic, tp.partition) for tp in revoked)
        keys = sorted(position_key(tp.topic, tp.partition) for tp in revoked)
        if keys:
            log.info("kafka source %s: revoked %s", self.name, keys)
        if self.on_revoke is not None and keys:
            try:
                self.on_revoke(keys)
            except Exception as exc:  # noqa: BLE001
                log.warning("kafka source %s: on_revoke callback failed: %s", self.name, exc)

    def read(self, max_records: int = 65536, timeout: float = 0.5) -> Batch | None:
        """Next batch of at most ``max_records`` raw records, or None after ``timeout`` seconds."""
        start = time.monotonic()
        if not self._connected_for_read(max_records, timeout, start):
            return None
        from confluent_kafka import KafkaError

        try:
            msgs = self._consumer.consume(
                num_messages=int(max_records), timeout=max(0.0, timeout - (time.monotonic() - start))
            )
        except Exception as exc:  # noqa: BLE001
            self._fail(exc)
            return None
        self._failures = 0
        good = []
        for m in msgs:
            err = m.error()
            if err is None:
                good.append(m)
            elif err.code() != KafkaError._PARTITION_EOF:
                self.stats["errors"] += 1
                self.stats["last_error"] = str(err)
        if not good:
            return None
        self._cf_connected = True
        by_tp: dict[Any, list[Any]] = {}
        for m in good:
            by_tp.setdefault(_TP(m.topic(), m.partition()), []).append(_Rec(m.offset(), m.value()))
        return self._batch(by_tp)

    def commit(self, position: Mapping[str, Any] | None = None, timeout: float = 5.0) -> bool:
        """Commit ``position`` (default: :meth:`position`) for the assigned partitions; True on success."""
        if self.group_id is None or self._consumer is None:
            return False
        from confluent_kafka import TopicPartition as CTP

        pos = _validate_position(position if position is not None else self.position())
        with self._lock:
            assigned = {position_key(t, p) for t, p in self._assigned}
        offsets = [CTP(*split_position_key(k), off) for k, off in pos.items() if k in assigned]
        if not offsets:
            return False
        try:
            self._consumer.commit(offsets=offsets, asynchronous=False)
        except Exception as exc:  # noqa: BLE001
            self.stats["commit_failures"] += 1
            self.stats["last_error"] = f"commit: {exc!r}"
            log.warning("kafka source %s: offset commit failed: %s", self.name, exc)
            return False
        self.stats["commits"] += 1
        return True

    def lag(self) -> dict[str, int]:
        """Records behind the cached high watermark per assigned partition (no network call)."""
        consumer = self._consumer
        if consumer is None:
            return {}
        from confluent_kafka import TopicPartition as CTP

        with self._lock:
            assigned = list(self._assigned)
            pos = dict(self._pos)
        out: dict[str, int] = {}
        for t, p in assigned:
            key = position_key(t, p)
            try:
                _lo, hi = consumer.get_watermark_offsets(CTP(t, p), cached=True)
            except Exception:  # noqa: BLE001, S112
                continue
            if hi is not None and hi >= 0 and key in pos:
                out[key] = max(0, int(hi) - pos[key])
        return out

    @property
    def connected(self) -> bool:
        """True after records arrived and no broker-down error was reported since."""
        return self._consumer is not None and self._failures == 0 and self._cf_connected

    def health(self) -> dict[str, Any]:
        lag = self.lag()
        with self._lock:
            assigned = sorted(position_key(t, p) for t, p in self._assigned)
        return {
            "source": self.name,
            "connected": self.connected,
            "assigned": assigned,
            "pending": 0,
            "lag": lag,
            "lag_total": int(sum(lag.values())),
            "consecutive_failures": self._failures,
            **self.stats,
        }

    def close(self) -> None:
        self._closed = True
        with self._lock:
            consumer, self._consumer = self._consumer, None
        if consumer is not None:
            try:
                consumer.close()
            except Exception as exc:  # noqa: BLE001
                log.warning("kafka source %s: close failed: %s", self.name, exc)


class _TP(tuple):
    """(topic, partition) with the attribute names of kafka-python's TopicPartition."""

    __slots__ = ()

    def __new__(cls, topic: str, partition: int) -> _TP:
        return tuple.__new__(cls, (topic, partition))

    topic = property(lambda self: self[0])
    partition = property(lambda self: self[1])


class _Rec:
    __slots__ = ("offset", "value")

    def __init__(self, offset: int, value: bytes | None) -> None:
        self.offset = offset
        self.value = value
