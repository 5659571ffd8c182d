"""The confluent-kafka (librdkafka) adapter of :class:`~connectors.kafka.clients.ConsumerClient`.

Optional (``pip install confluent-kafka``).  librdkafka calls the assignment callback inside
``consume()`` on the reading thread, so the adapter lets the source position new partitions right
there and starts them with ``assign()`` at those offsets (``seek()`` right after an assignment fails
with an "erroneous state" error).  ``client`` options are librdkafka properties with dotted names.
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Callable, Mapping
from typing import Any, cast

import numpy as np

from connectors.base import RecordMeta
from connectors.kafka.clients import (
    ConsumerEvents,
    ConsumerSettings,
    Fetched,
    KafkaClientError,
    KafkaConfigError,
    header_tuple,
)
from connectors.kafka.origins import Run
from connectors.kafka.positions import TP
from connectors.kafka.settings import check_librdkafka

log = logging.getLogger(__name__)

#: librdkafka properties calmon sets itself.
FORCED = frozenset({"bootstrap.servers", "group.id", "enable.auto.commit", "enable.auto.offset.store"})

#: librdkafka defaults calmon changes (a source's ``client`` options win). ``queued.min.messages``: librdkafka
#: refetches a partition once its prefetched queue falls below this; its default (100,000) is under two batches of
#: ``ingest.batch_size`` (65,536), so a consume of a batch often left the queue waiting on a fetch. Four batches
#: keep it ahead (raw consume 1.5x on a quiet machine, docs/kafka.md); memory stays bounded by librdkafka's
#: ``queued.max.messages.kbytes`` (64 MB), unchanged. ``fetch.queue.backoff.ms``: once a partition's queue holds
#: that many, librdkafka waits this long before it looks again (its default, 1 s, left the queue of a reader that
#: drains it in a fraction of that empty; with both settings a bare consume ran 2.5-3.1x librdkafka's defaults,
#: docs/kafka.md, "librdkafka's fetch queue backoff").
DEFAULTS: dict[str, Any] = {"queued.min.messages": 4 * 65536, "fetch.queue.backoff.ms": 20}


def _errors() -> tuple[type[BaseException], ...]:
    """What confluent-kafka raises for broker/client trouble (RuntimeError: the consumer is closed)."""
    from confluent_kafka import KafkaException

    return (KafkaException, RuntimeError)


def _ctp(tp: TP, offset: int | None = None) -> Any:
    from confluent_kafka import OFFSET_INVALID, TopicPartition

    return TopicPartition(tp.topic, tp.partition, OFFSET_INVALID if offset is None else offset)


def _runs(msgs: list[Any], topics: bool) -> list[tuple[int, int]]:
    """``(start, stop)`` of each run of consecutive messages of one partition (``topics``: of several topics).

    librdkafka delivers a fetch response's records of a partition together, so a poll has a few runs.
    """
    from confluent_kafka import Message

    n = len(msgs)
    key = np.fromiter(map(Message.partition, msgs), np.int64, n)
    if topics:
        codes: dict[str, int] = {}
        topic = cast("Callable[[Any], str]", Message.topic)
        key += np.fromiter(map(codes.setdefault, map(topic, msgs), itertools.count()), np.int64, n) << 32
    cuts = (np.flatnonzero(key[1:] != key[:-1]) + 1).tolist()
    return list(zip([0, *cuts], [*cuts, n]))


def _offsets(msgs: list[Any]) -> list[int]:
    """Every message's offset (a run whose offsets are not contiguous)."""
    return [int(m.offset()) for m in msgs]


def message_meta(msg: Any) -> RecordMeta:
    """Timestamp, key and headers of a ``confluent_kafka.Message``.

    ``timestamp()`` is ``(type, ms)``; type 0 (``TIMESTAMP_NOT_AVAILABLE``) means none.
    """
    tt, ts = msg.timestamp()
    h = msg.headers()
    return RecordMeta(ts if tt and ts >= 0 else None, msg.key(), header_tuple(h) if h else ())


class ConfluentConsumer:
    """:class:`~connectors.kafka.clients.ConsumerClient` on ``confluent_kafka.Consumer``.

    Examples
    --------
    >>> c = ConfluentConsumer(ConsumerSettings("a:1", ["t"], None, "s", {"session.timeout.ms": 6000}))
    >>> cfg = c.config()
    >>> cfg["group.id"], cfg["enable.auto.commit"], cfg["session.timeout.ms"]
    ('calmon-s-nogroup', False, 6000)
    """

    library = "confluent"

    def __init__(self, settings: ConsumerSettings) -> None:
        self.settings = settings
        self._consumer: Any = None
        self._handler: ConsumerEvents | None = None
        self._connected = False
        # inside the assignment callback: where each new partition starts, and which were resumed
        self._starts: dict[TP, int] | None = None
        self._resumed: set[TP] = set()
        # high watermarks read on the polling thread after each consume: librdkafka's consumer is not safe for
        # concurrent calls (get_watermark_offsets from a health check while another thread is inside consume()
        # deadlocked both), and lag is read from other threads (metrics, health)
        self._highwater: dict[TP, int] = {}

    @staticmethod
    def check_options(options: Mapping[str, Any] | None) -> dict[str, Any]:
        """Validate librdkafka pass-through properties."""
        return check_librdkafka(options, FORCED)

    @staticmethod
    def check_extra(extra: Mapping[str, Any]) -> dict[str, Any]:
        """Top-level options of a source's config go to librdkafka as they are."""
        return dict(extra)

    def config(self) -> dict[str, Any]:
        s = self.settings
        servers = s.bootstrap_servers
        cfg: dict[str, Any] = {
            "reconnect.backoff.max.ms": 5000,
            "client.id": f"calmon-{s.name}",
            "error_cb": self._on_error,
            **DEFAULTS,
        }
        cfg.update(s.options)
        cfg.update(
            {
                "bootstrap.servers": servers if isinstance(servers, str) else ",".join(servers),
                "group.id": s.group_id or f"calmon-{s.name}-nogroup",
                "enable.auto.commit": False,
                "enable.auto.offset.store": False,
                "auto.offset.reset": s.auto_offset_reset,
            }
        )
        return cfg

    def _on_error(self, err: Any) -> None:
        from confluent_kafka import KafkaError

        if self._handler is not None:
            self._handler.on_error(str(err), counted=False)
        if err.code() in (KafkaError._ALL_BROKERS_DOWN, KafkaError._TRANSPORT):
            self._connected = False

    def start(self, handler: ConsumerEvents, timeout: float) -> None:
        from confluent_kafka import Consumer, KafkaException

        self._handler = handler
        try:
            self._consumer = Consumer(self.config())
        except (KafkaException, TypeError, ValueError) as exc:
            raise KafkaConfigError(str(exc)) from exc
        try:
            self._subscribe(timeout)
        except _errors() as exc:
            self.close(0.5)
            raise KafkaClientError(repr(exc)) from exc
        except KafkaClientError:
            self.close(0.5)
            raise

    def _subscribe(self, timeout: float) -> None:
        s = self.settings
        if s.group_id is not None:
            self._consumer.subscribe(s.topics, on_assign=self._assign, on_revoke=self._revoke, on_lost=self._revoke)
            return
        md = self._consumer.list_topics(timeout=max(timeout, 1.0))
        parts = []
        for topic in s.topics:
            t = md.topics.get(topic)
            if t is None or t.error is not None or not t.partitions:
                raise KafkaClientError(f"topic {topic!r} has no partitions (does it exist?)")
            parts += [_ctp(TP(topic, p)) for p in sorted(t.partitions)]
        self._assign(self._consumer, parts)

    def _assign(self, consumer: Any, partitions: list[Any]) -> None:
        """Assignment callback: let the source position the partitions, then start them there."""
        tps = [TP(p.topic, p.partition) for p in partitions]
        handler = self._handler
        self._starts, self._resumed = {}, set()
        try:
            if handler is not None:
                handler.on_assigned(tps)
                handler.position_pending(10.0)
            starts = self._starts
        finally:
            self._starts = None
        consumer.assign([_ctp(tp, starts.get(tp)) for tp in tps])
        waiting = [_ctp(tp) for tp in tps if tp not in self._resumed]
        if waiting:  # not positioned yet (committed offsets unavailable): held until the source seeks them
            consumer.pause(waiting)

    def _revoke(self, consumer: Any, partitions: list[Any]) -> None:
        if self._handler is not None:
            self._handler.on_revoked([TP(p.topic, p.partition) for p in partitions])
        try:
            consumer.unassign()
        except _errors() as exc:
            log.debug("kafka source %s: unassign failed: %s", self.settings.name, exc)

    def poll(self, max_records: int, timeout: float) -> Fetched:
        """One ``consume(num_messages=max_records)`` turned into a :class:`Fetched` by a few C-level passes.

        Per record, only C work: one pass for errors (``any``: an error is a truthy ``KafkaError``, a record's is
        None), one for the values, one for the partitions (numpy cuts them into runs); the values list becomes the
        batch as it is (nulls replaced only if the one scan finds one). Offsets are read at each run's two ends, all
        of them only where a run is not contiguous.
        """
        from confluent_kafka import Message

        try:
            msgs = self._consumer.consume(num_messages=int(max_records), timeout=timeout)
        except _errors() as exc:
            raise KafkaClientError(repr(exc)) from exc
        self._refresh_highwater()
        if msgs and any(map(Message.error, msgs)):  # rare: error events (not records) between the records
            msgs = self._drop_errors(msgs)
        if not msgs:
            return Fetched(metas=[] if self.settings.metadata else None)
        raw: list[bytes | None] = list(map(Message.value, msgs))
        # null values (tombstones) are empty records to the decoder; one scan of the batch finds them
        values = cast("list[bytes]", raw) if None not in raw else [b"" if v is None else v for v in raw]
        runs = []
        for start, stop in _runs(msgs, len(self.settings.topics) > 1):
            head, tail = msgs[start], msgs[stop - 1]
            first, last = head.offset(), tail.offset()
            runs.append(Run(TP(head.topic(), head.partition()), start, stop, first,
                            None if last - first == stop - start - 1 else _offsets(msgs[start:stop])))
        self._connected = True
        return Fetched(values, runs, [message_meta(m) for m in msgs] if self.settings.metadata else None)

    def _drop_errors(self, msgs: list[Any]) -> list[Any]:
        """Report the error events of a consume (end of partition is not an error) and keep its records."""
        from confluent_kafka import KafkaError

        kept = []
        for m in msgs:
            err = m.error()
            if err is None:
                kept.append(m)
            elif err.code() != KafkaError._PARTITION_EOF and self._handler is not None:
                self._handler.on_error(str(err), counted=True)
        return kept

    def committed(self, tps: list[TP], timeout: float) -> dict[TP, int]:
        try:
            got = self._consumer.committed([_ctp(tp) for tp in tps], timeout=max(timeout, 0.1))
        except _errors() as exc:
            raise KafkaClientError(repr(exc)) from exc
        return {TP(p.topic, p.partition): int(p.offset) for p in got if p.offset >= 0}

    def commit(self, offsets: Mapping[TP, int], timeout: float) -> None:
        try:
            self._consumer.commit(offsets=[_ctp(tp, off) for tp, off in offsets.items()], asynchronous=False)
        except _errors() as exc:
            raise KafkaClientError(repr(exc)) from exc

    def seek(self, tp: TP, offset: int) -> None:
        if self._starts is not None:
            self._starts[tp] = offset
            return
        try:
            self._consumer.seek(_ctp(tp, offset))
        except _errors() as exc:
            raise KafkaClientError(repr(exc)) from exc

    def pause(self, tps: list[TP]) -> None:
        if self._starts is not None:
            return  # partitions are assigned at the end of the callback
        try:
            self._consumer.pause([_ctp(tp) for tp in tps])
        except _errors() as exc:
            raise KafkaClientError(repr(exc)) from exc

    def resume(self, tps: list[TP]) -> None:
        if self._starts is not None:
            self._resumed.update(tps)
            return
        try:
            self._consumer.resume([_ctp(tp) for tp in tps])
        except _errors() as exc:
            raise KafkaClientError(repr(exc)) from exc

    def highwater(self, tp: TP) -> int | None:
        """As of the latest poll (safe from any thread: no call into librdkafka)."""
        return self._highwater.get(tp)

    def _refresh_highwater(self) -> None:
        """Read the assigned partitions' cached high watermarks (no network call), on the polling thread."""
        consumer = self._consumer
        try:
            parts = consumer.assignment()
        except _errors():
            return
        out: dict[TP, int] = {}
        for p in parts:
            try:
                _lo, hi = consumer.get_watermark_offsets(p, cached=True)
            except _errors():
                continue
            if hi is not None and hi >= 0:
                out[TP(p.topic, p.partition)] = int(hi)
        self._highwater = out

    def beginning_offset(self, tp: TP, timeout: float) -> int:
        try:
            lo, _hi = self._consumer.get_watermark_offsets(_ctp(tp), timeout=timeout, cached=False)
        except _errors() as exc:
            raise KafkaClientError(repr(exc)) from exc
        return int(lo)

    @property
    def connected(self) -> bool:
        """True after records arrived and no broker-down error was reported since."""
        return self._consumer is not None and self._connected

    def close(self, timeout: float) -> None:
        consumer, self._consumer = self._consumer, None
        if consumer is None:
            return
        try:
            consumer.close()
        except _errors() as exc:
            log.warning("kafka source %s: close failed: %s", self.settings.name, exc)
