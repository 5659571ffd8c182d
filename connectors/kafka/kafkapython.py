"""The kafka-python adapter of :class:`~connectors.kafka.clients.ConsumerClient`.

kafka-python runs the group's rebalance listener on its IO thread, so the adapter only forwards
assignments there (the source pauses new partitions and positions them on its own thread).  Its
high watermarks come from fetch responses (``ListOffsets`` is not used: some brokers, e.g. Tansu
0.6, answer it with the start of the last batch).
"""

from __future__ import annotations

import contextlib
import functools
import logging
import operator
import time
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, Protocol

from connectors.base import RecordMeta
from connectors.kafka.clients import (
    ConsumerEvents,
    ConsumerSettings,
    Fetched,
    KafkaClientError,
    KafkaConfigError,
    header_tuple,
)
from connectors.kafka.committed import Stats
from connectors.kafka.groupwatch import GroupWatch
from connectors.kafka.positions import TP
from connectors.kafka.settings import check_client, client_keys

log = logging.getLogger(__name__)

#: Consumer options calmon sets itself.
FORCED = frozenset({"enable_auto_commit", "key_deserializer", "value_deserializer", "bootstrap_servers", "group_id"})
DEFAULTS: dict[str, Any] = {
    "reconnect_backoff_ms": 100,
    "reconnect_backoff_max_ms": 5000,
    "request_timeout_ms": 30000,
    "max_poll_records": 65536,
    "fetch_max_bytes": 52428800,
    "max_partition_fetch_bytes": 8388608,
}


@contextlib.contextmanager
def mapped(op: str) -> Iterator[None]:
    """Translate kafka-python's exceptions into :class:`KafkaClientError` (``IllegalStateError`` is fatal)."""
    from kafka.errors import IllegalStateError

    try:
        yield
    except (KafkaClientError, KafkaConfigError):
        raise
    except Exception as exc:  # noqa: BLE001 - kafka-python raises KafkaError, AssertionError, OSError, KeyError...
        raise KafkaClientError(repr(exc), fatal=isinstance(exc, IllegalStateError)) from exc


class ConsumerRecordLike(Protocol):
    """The fields of kafka-python's ``ConsumerRecord`` that the adapter reads."""

    @property
    def offset(self) -> int: ...

    @property
    def value(self) -> bytes | None: ...

    @property
    def timestamp(self) -> int: ...

    @property
    def timestamp_type(self) -> int | None: ...

    @property
    def key(self) -> bytes | None: ...

    @property
    def headers(self) -> list[tuple[str, bytes | None]]: ...


_VALUE = operator.attrgetter("value")
_OFFSET = operator.attrgetter("offset")
_FIRST = operator.itemgetter(0)
_SECOND = operator.itemgetter(1)


def _ktp(tp: TP) -> Any:
    from kafka import TopicPartition

    return TopicPartition(tp.topic, tp.partition)


def _listener(handler: ConsumerEvents) -> Any:
    """A rebalance listener forwarding to ``handler`` (it runs on kafka-python's IO thread)."""
    from kafka import ConsumerRebalanceListener

    def tps(parts: Any) -> list[TP]:
        return [TP(p.topic, p.partition) for p in parts]

    class _Listener(ConsumerRebalanceListener):
        def on_partitions_revoked(self, revoked: Any) -> None:
            handler.on_revoked(tps(revoked))

        def on_partitions_assigned(self, assigned: Any) -> None:
            handler.on_assigned(tps(assigned))

        def on_partitions_lost(self, lost: Any) -> None:
            handler.on_revoked(tps(lost))

    return _Listener()


class KafkaPythonConsumer:
    """:class:`~connectors.kafka.clients.ConsumerClient` on ``kafka.KafkaConsumer``.

    Examples
    --------
    >>> c = KafkaPythonConsumer(ConsumerSettings("h:1", ["t"], "g", "src", {"max_poll_interval_ms": 5000}))
    >>> cfg = c.config()
    >>> cfg["group_id"], cfg["enable_auto_commit"], cfg["client_id"], cfg["max_poll_interval_ms"]
    ('g', False, 'calmon-src', 5000)
    >>> c.connected
    False
    """

    library = "kafka-python"

    def __init__(self, settings: ConsumerSettings) -> None:
        self.settings = settings
        self._consumer: Any = None
        #: ``poll`` returns ``(offset, value)`` tuples (:mod:`connectors.kafka.valuerecords`), not ConsumerRecords.
        self.raw_values = False
        #: with ``isolation_level: read_committed``: what the client-side filtering of aborted transactions did
        #: (:mod:`connectors.kafka.committed`)
        self.txn_stats = Stats()
        #: the group's formation as this member sees it, and its repairs (:mod:`connectors.kafka.groupwatch`)
        self.group_watch = GroupWatch(10.0)

    @staticmethod
    def check_options(options: Mapping[str, Any] | None) -> dict[str, Any]:
        """Validate pass-through consumer options."""
        return check_client(options, "consumer", FORCED)

    @staticmethod
    def check_extra(extra: Mapping[str, Any]) -> dict[str, Any]:
        """Validate options found at the top level of a source's config (they join ``client``)."""
        known = client_keys("consumer")
        bad = sorted(k for k in extra if k not in known)
        if bad:
            raise ValueError(f"unknown kafka source option(s) {bad}")
        return dict(extra)

    def config(self) -> dict[str, Any]:
        s = self.settings
        cfg = dict(DEFAULTS)
        cfg.update(s.options)
        cfg.update(
            bootstrap_servers=s.bootstrap_servers,
            group_id=s.group_id,
            enable_auto_commit=False,
            auto_offset_reset=s.auto_offset_reset,
            client_id=cfg.get("client_id", f"calmon-{s.name}"),
        )
        cfg.setdefault("bootstrap_timeout_ms", 2000)
        return cfg

    def start(self, handler: ConsumerEvents, timeout: float) -> None:
        from kafka import KafkaConsumer
        from kafka.errors import KafkaConfigurationError

        cfg = self.config()
        cfg["bootstrap_timeout_ms"] = int(min(cfg["bootstrap_timeout_ms"], max(timeout, 0.2) * 1000))
        with mapped("connect"):
            try:
                self._consumer = KafkaConsumer(**cfg)
            except (TypeError, ValueError, KafkaConfigurationError) as exc:
                raise KafkaConfigError(str(exc)) from exc
        if cfg.get("isolation_level") == "read_committed":  # aborted transactions dropped by their markers
            from connectors.kafka.committed import install as install_committed

            done = install_committed(self._consumer, values=not self.settings.metadata, stats=self.txn_stats)
            self.raw_values = done is not None and not self.settings.metadata
        elif not self.settings.metadata:  # metadata needs kafka-python's ConsumerRecords (key, timestamp, headers)
            from connectors.kafka.valuerecords import install

            self.raw_values = install(self._consumer)
        try:
            with mapped("subscribe"):
                self._subscribe(handler)
        except KafkaClientError:
            self.close(0.5)
            raise
        if self.settings.group_id is not None:
            self.group_watch.session_timeout = float(self._consumer.config["session_timeout_ms"]) / 1000
            self._watch_group()

    def _watch_group(self) -> None:
        """Report the coordinator's JoinGroup and SyncGroup outcomes to :attr:`group_watch` (it runs them on its IO
        thread; on a kafka-python without these internals nothing is watched and nothing repaired)."""
        from kafka.errors import RebalanceInProgressError

        coordinator: Any = getattr(self._consumer, "_coordinator", None)
        watch = self.group_watch
        join = getattr(coordinator, "_process_join_group_response", None)
        sync = getattr(coordinator, "_process_sync_group_response", None)
        if join is None or sync is None:
            log.debug("kafka consumer %s: no group watch (kafka-python internals differ)", self.settings.name)
            return

        def joined(response: Any, send_time: float) -> Any:
            out = join(response, send_time)  # raises unless the member joined
            watch.joined(str(response.member_id), str(response.leader), int(response.generation_id))
            return out

        def synced(response: Any, send_time: float) -> Any:
            try:
                out = sync(response, send_time)
            except RebalanceInProgressError:
                watch.refused()
                raise
            watch.stable()
            return out

        coordinator._process_join_group_response = joined
        coordinator._process_sync_group_response = synced

    def _repair_group(self) -> None:
        """One repair when :attr:`group_watch` says the group has not formed for too long
        (:mod:`connectors.kafka.groupwatch`): logged once per repair, counted, never raised."""
        leader = self.group_watch.due()
        if leader is None:
            return
        w = self.group_watch
        log.warning("kafka consumer %s: group %s has not formed for %.0f s (%d SyncGroups refused, generation %d, "
                    "leader %s named by the broker but not forming it); expiring that leader with one JoinGroup "
                    "under its id (a broker that keeps a leader which left a forming group: Tansu 0.6)",
                    self.settings.name, self.settings.group_id, w.bound, w.refusals, w.generation, leader)
        w.repaired(leader)
        try:
            self.expire_leader(leader, 5.0)
        except KafkaClientError as exc:
            log.warning("kafka consumer %s: the repair of group %s failed (tried again in %.0f s): %s",
                        self.settings.name, self.settings.group_id, w.bound, exc)

    def expire_leader(self, leader: str, timeout: float) -> int:
        """Send one bare JoinGroup with ``leader`` as the member id and return its error code.

        The broker registers the id as a member again if it had dropped it; no heartbeat and no SyncGroup
        follow, so it expires one session timeout later -- and a coordinator that clears the leadership of an
        expired leader (Tansu does) lets the next member that joins form the group.  Nothing is assigned to the
        id meanwhile: the group cannot form around it.
        """
        from kafka.protocol.consumer.group import JoinGroupRequest

        coordinator = self._consumer._coordinator
        if coordinator.coordinator_id is None:
            raise KafkaClientError("group coordinator unknown")
        request = JoinGroupRequest(
            group_id=coordinator.group_id, session_timeout_ms=coordinator.config["session_timeout_ms"],
            rebalance_timeout_ms=coordinator.config["max_poll_interval_ms"], member_id=leader,
            group_instance_id=None, protocol_type=coordinator.protocol_type(),
            protocols=coordinator.group_protocols(), max_version=7)

        async def send() -> Any:
            future = coordinator._manager.send(request, node_id=coordinator.coordinator_id)
            return await coordinator._manager.wait_for(future, int(timeout * 1000))

        with mapped("expire leader"):
            response = coordinator._net.run(send)
        return int(response.error_code)

    def _subscribe(self, handler: ConsumerEvents) -> None:
        s = self.settings
        if s.group_id is not None:
            self._consumer.subscribe(topics=s.topics, listener=_listener(handler))
            return
        tps: list[TP] = []
        for topic in s.topics:
            parts = self._consumer.partitions_for_topic(topic)
            if not parts:
                raise KafkaClientError(f"topic {topic!r} has no partitions (does it exist?)")
            tps += [TP(topic, p) for p in sorted(parts)]
        self._consumer.assign([_ktp(tp) for tp in tps])
        handler.on_assigned(tps)

    def poll(self, max_records: int, timeout: float) -> Fetched:
        """One ``KafkaConsumer.poll``: its records reduced to their values, one run per partition.

        Without metadata the fetcher yields ``(offset, value)`` tuples (:mod:`connectors.kafka.valuerecords`);
        with it, kafka-python's ``ConsumerRecord`` s, of which the adapter keeps the value and the metadata.
        """
        with mapped("poll"):
            polled = self._consumer.poll(timeout_ms=int(timeout * 1000), max_records=int(max_records))
        if not polled and self.settings.group_id is not None:
            self._repair_group()  # (a member that receives records is in a formed group)
        out = Fetched(metas=[] if self.settings.metadata else None)
        if self.raw_values:
            for ktp, pairs in polled.items():
                if pairs:
                    out.add(TP(ktp.topic, ktp.partition), list(map(_SECOND, pairs)), pairs[0][0], pairs[-1][0],
                            functools.partial(list, map(_FIRST, pairs)))
            return out
        for ktp, rs in polled.items():
            if not rs:
                continue
            out.add(TP(ktp.topic, ktp.partition), list(map(_VALUE, rs)), rs[0].offset, rs[-1].offset,
                    functools.partial(list, map(_OFFSET, rs)))
            if out.metas is not None:
                out.metas += self.metas(rs)
        return out

    @staticmethod
    def metas(records: Sequence[ConsumerRecordLike]) -> list[RecordMeta]:
        """Timestamp, key and headers of kafka-python ``ConsumerRecord`` s.

        The timestamp is the create or log-append time (``timestamp_type`` 0 or 1); none for
        v0 messages (type ``None``) and for a timestamp of -1 (the producer set none).

        Examples
        --------
        >>> from kafka.consumer.fetcher import ConsumerRecord
        >>> r = ConsumerRecord("t", 0, None, 5, 1700000000123, 0, b"a1", b"{}", [("model", b"m")], None, 2, 2, 8)
        >>> a, b = KafkaPythonConsumer.metas([r, r._replace(timestamp=-1, key=None, headers=[])])
        >>> a
        RecordMeta(timestamp_ms=1700000000123, key=b'a1', headers=(('model', b'm'),))
        >>> b
        RecordMeta(timestamp_ms=None, key=None, headers=())
        """
        out = []
        for r in records:
            ts, tt, h = r.timestamp, r.timestamp_type, r.headers
            ts_ms = ts if (tt == 0 or tt == 1) and ts >= 0 else None
            out.append(RecordMeta(ts_ms, r.key, header_tuple(h) if h else ()))
        return out

    def committed(self, tps: list[TP], timeout: float) -> dict[TP, int]:
        deadline = time.monotonic() + timeout
        out: dict[TP, int] = {}
        for tp in tps:
            left = int(max(0.1, deadline - time.monotonic()) * 1000)
            with mapped("committed"):
                off = self._consumer.committed(_ktp(tp), timeout_ms=left)
            if off is not None:
                out[tp] = int(off)
        return out

    def commit(self, offsets: Mapping[TP, int], timeout: float) -> None:
        from kafka import OffsetAndMetadata

        with mapped("commit"):
            self._consumer.commit(
                offsets={_ktp(tp): OffsetAndMetadata(off, "", -1) for tp, off in offsets.items()},
                timeout_ms=int(timeout * 1000),
            )

    def seek(self, tp: TP, offset: int) -> None:
        with mapped("seek"):
            self._consumer.seek(_ktp(tp), offset)

    def pause(self, tps: list[TP]) -> None:
        with mapped("pause"):
            self._consumer.pause(*[_ktp(tp) for tp in tps])

    def resume(self, tps: list[TP]) -> None:
        with mapped("resume"):
            self._consumer.resume(*[_ktp(tp) for tp in tps])

    def highwater(self, tp: TP) -> int | None:
        from kafka.errors import IllegalStateError

        try:
            hw = self._consumer.highwater(_ktp(tp))
        except IllegalStateError:  # revoked meanwhile
            return None
        return None if hw is None else int(hw)

    def fetched(self) -> dict[TP, int]:
        """The fetch position of each assigned partition (past transaction markers and dropped aborted records,
        unlike the position of the last record returned); empty while records are held for a marker
        (:mod:`connectors.kafka.committed`).  No network call."""
        from connectors.kafka.committed import held

        consumer = self._consumer
        if consumer is None or held(consumer):
            return {}
        out: dict[TP, int] = {}
        try:
            for ktp, state in list(consumer._subscription.assignment.items()):
                if state.position is not None:
                    out[TP(ktp.topic, ktp.partition)] = int(state.position.offset)
        except AttributeError:  # internals of another kafka-python version
            return {}
        return out

    def beginning_offset(self, tp: TP, timeout: float) -> int:
        with mapped("beginning_offsets"):
            return int(self._consumer.beginning_offsets([_ktp(tp)], timeout_ms=int(timeout * 1000))[_ktp(tp)])

    @property
    def connected(self) -> bool:
        consumer = self._consumer
        if consumer is None:
            return False
        try:
            return bool(consumer._manager.least_used_connections())
        except AttributeError:  # internals of another kafka-python version
            return True

    def close(self, timeout: float) -> None:
        consumer, self._consumer = self._consumer, None
        if consumer is None:
            return
        try:
            with mapped("close"):
                consumer.close(autocommit=False, timeout_ms=int(timeout * 1000))
        except KafkaClientError as exc:
            log.warning("kafka consumer %s: close failed: %s", self.settings.name, exc)
