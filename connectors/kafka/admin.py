"""Topic-level operations outside any consumer group: create a topic, read a topic to its end.

Both use kafka-python; errors are mapped to :class:`~connectors.kafka.clients.KafkaClientError`.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from typing import Any

from connectors.kafka.kafkapython import mapped
from connectors.kafka.positions import position_key
from connectors.kafka.settings import common_options


def ensure_topic(
    bootstrap: str | list[str],
    topic: str,
    partitions: int,
    config: Mapping[str, str],
    client: Mapping[str, Any],
    replication_factor: int = 1,
) -> bool:
    """Create ``topic`` if missing; True if it was created.

    Raises
    ------
    KafkaClientError
        The broker is unreachable or refused the creation.
    """
    from kafka.admin import KafkaAdminClient, NewTopic
    from kafka.errors import TopicAlreadyExistsError

    with mapped("create topic"):
        admin = KafkaAdminClient(bootstrap_servers=bootstrap, bootstrap_timeout_ms=2000,
                                 **common_options(client, "admin"))
        try:
            if topic in set(admin.list_topics()):
                return False
            try:
                admin.create_topics([NewTopic(topic, partitions, replication_factor, topic_configs=dict(config))])
            except TopicAlreadyExistsError:
                return False
            return True
        finally:
            admin.close()


@dataclass
class TopicScan:
    """Outcome of :func:`scan_topic`: the end offset per ``"topic/partition"`` and whether it was reached."""

    ends: dict[str, int]
    complete: bool


def scan_topic(
    bootstrap: str | list[str],
    topic: str,
    client: Mapping[str, Any],
    visit: Callable[[Any], None],
    *,
    start: Mapping[str, int] | None = None,
    partitions: Collection[int] | None = None,
    timeout: float = 10.0,
    connect_timeout: float = 2.0,
) -> TopicScan:
    """Call ``visit(record)`` for every record of ``topic`` from ``start`` (default: the beginning) to its end.

    ``record`` is kafka-python's ``ConsumerRecord`` (``key``, ``value``, ``headers``, ...).  The scan
    stops when every partition's position reaches the high watermark of the latest fetch, or after
    ``timeout`` seconds (``complete`` is then False).  A topic without partitions scans as complete.
    ``partitions`` limits the scan to those partition numbers (the others are not fetched at all).

    Raises
    ------
    KafkaClientError
        The broker is unreachable.
    """
    from kafka import KafkaConsumer, TopicPartition

    start = start or {}
    with mapped("read topic"):
        consumer = KafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False,
                                 bootstrap_timeout_ms=int(connect_timeout * 1000),
                                 **common_options(client, "consumer"))
    try:
        with mapped("read topic"):
            tps = [TopicPartition(topic, p) for p in sorted(consumer.partitions_for_topic(topic) or ())
                   if partitions is None or p in partitions]
        if not tps:
            return TopicScan({}, True)
        with mapped("read topic"):
            consumer.assign(tps)
            for tp in tps:
                consumer.seek(tp, start.get(position_key(tp.topic, tp.partition), 0))
        deadline = time.monotonic() + timeout
        while True:
            with mapped("read topic"):
                polled = consumer.poll(timeout_ms=200)
            for records in polled.values():
                for r in records:
                    visit(r)
            with mapped("read topic"):
                # high watermarks come with every fetch response, also an empty one
                ends = {tp: consumer.highwater(tp) for tp in tps}
                done = all(ends[tp] is not None and consumer.position(tp, timeout_ms=1000) >= ends[tp] for tp in tps)
            if done:
                return TopicScan({position_key(tp.topic, tp.partition): int(ends[tp]) for tp in tps}, True)
            if time.monotonic() > deadline:
                return TopicScan({}, False)
    finally:
        consumer.close()
