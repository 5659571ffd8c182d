"""The ingest stage's write-ahead log: intents (first writer wins) and per-partition states, on Kafka topics.

Two topics, both keyed by the input partition (``"topic/partition"``):

* the **intents topic** holds :class:`Intent` records ``(source, start, end, now, writer, seq)``: "I am
  about to publish the deltas of the records ``[start, end)`` of ``source``".  Among the intents with
  the same ``(source, start)``, the **first in the log wins** -- the log order of one Kafka partition is
  the arbiter, so two workers that both believe they own a partition (a rebalance with a stalled
  worker, a zombie) agree on which of them goes on, without a coordinator of our own.  A worker
  publishes only the range of the winning intent (its own, or the winner's, replayed).  Retention
  must keep intents longer than a range takes to process (delete policy; compaction would keep the
  *last* intent per key, not the first).
* the **state topic** holds :class:`PartitionState` records (offset, join buffers, decoder state)
  written after a range's deltas are acknowledged; every state is at a point of the chain of winning
  ranges, so the one with the largest offset is the most advanced (compaction may keep any of them).
"""

from __future__ import annotations

import json
import logging
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from typing import Any

from connectors.kafka.admin import ensure_topic
from connectors.kafka.clients import KafkaClientError
from connectors.kafka.kafkapython import mapped
from connectors.kafka.settings import common_options

log = logging.getLogger("calmon.cluster")

__all__ = ["Intent", "PartitionState", "IntentLog", "StateStore", "Producer", "ClusterError", "new_writer_id"]

INTENT_FORMAT = "calmon.intent"
STATE_FORMAT = "calmon.ingest_state"


class ClusterError(RuntimeError):
    """An internal topic could not be written or read (the range is retried from the logs)."""


def new_writer_id() -> str:
    """A process-unique writer id (intents of two workers never compare equal)."""
    return uuid.uuid4().hex[:16]


@dataclass(frozen=True)
class Intent:
    """The write-ahead record of one range of one input partition.

    Examples
    --------
    >>> i = Intent("events/3", 100, 250, 1767225600.0, "w1", 7, {"dlq/0": 12})
    >>> Intent.from_bytes(i.to_bytes()) == i
    True
    """

    source: str
    start: int
    end: int
    #: the arrival time given to events of the range without ``ts`` (a replay must use the same one)
    now: float
    writer: str
    seq: int
    #: the dead-letter sink's position when the intent was written (a replay skips what was written after it)
    dead_letter: Mapping[str, int] = field(default_factory=dict)

    def to_bytes(self) -> bytes:
        return json.dumps({"format": INTENT_FORMAT, **asdict(self), "dead_letter": dict(self.dead_letter)},
                          separators=(",", ":")).encode()

    @classmethod
    def from_bytes(cls, data: bytes) -> Intent:
        d = json.loads(data)
        if d.get("format") != INTENT_FORMAT:
            raise ValueError(f"not a {INTENT_FORMAT} record")
        return cls(str(d["source"]), int(d["start"]), int(d["end"]), float(d["now"]), str(d["writer"]),
                   int(d["seq"]), {str(k): int(v) for k, v in d["dead_letter"].items()})


@dataclass(frozen=True)
class PartitionState:
    """An input partition's ingest state after the records before ``offset``: join buffers and decoder state."""

    source: str
    offset: int
    join: dict[str, Any]
    decoder: dict[str, Any]
    writer: str = ""

    def to_bytes(self) -> bytes:
        return json.dumps({"format": STATE_FORMAT, **asdict(self)}, separators=(",", ":")).encode()

    @classmethod
    def from_bytes(cls, data: bytes) -> PartitionState:
        d = json.loads(data)
        if d.get("format") != STATE_FORMAT:
            raise ValueError(f"not a {STATE_FORMAT} record")
        return cls(str(d["source"]), int(d["offset"]), dict(d["join"]), dict(d["decoder"]), str(d.get("writer", "")))


@contextmanager
def _cluster_errors(op: str) -> Iterator[None]:
    try:
        with mapped(op):
            yield
    except KafkaClientError as exc:
        raise ClusterError(f"{op}: {exc}") from None


class Producer:
    """One idempotence-friendly producer for the internal topics: acks from all replicas, one request in flight
    (so a retried send cannot overtake the next one: deltas of one range reach their partition in order)."""

    def __init__(self, bootstrap: str, client: Mapping[str, Any]) -> None:
        from kafka import KafkaProducer

        cfg = {"acks": "all", "linger_ms": 5, "max_in_flight_requests_per_connection": 1, "retries": 5,
               "max_request_size": 16 << 20, "bootstrap_timeout_ms": 5000, "max_block_ms": 10000}
        cfg.update(common_options(client, "producer"))
        with _cluster_errors("connect producer"):
            self.producer = KafkaProducer(bootstrap_servers=bootstrap, **cfg)

    def send_all(self, topic: str, items: list[tuple[bytes, bytes]], timeout: float = 30.0) -> list[tuple[int, int]]:
        """Send ``(key, value)`` records and wait for every acknowledgement; ``(partition, offset)`` of each."""
        with _cluster_errors(f"write {topic}"):
            futures = [self.producer.send(topic, key=k, value=v) for k, v in items]
            self.producer.flush(timeout=timeout)
            out = []
            for fut in futures:
                md = fut.get(timeout=timeout)
                out.append((int(md.partition), int(md.offset)))
        return out

    def close(self) -> None:
        with _cluster_errors("close producer"):
            self.producer.close(timeout=2)


def ensure_topics(bootstrap: str, client: Mapping[str, Any], topics: Mapping[str, tuple[int, dict[str, str]]]
                  ) -> None:
    """Create the internal topics that are missing (``name -> (partitions, topic config)``)."""
    for name, (partitions, config) in topics.items():
        with _cluster_errors(f"create topic {name}"):
            ensure_topic(bootstrap, name, partitions, config, client)


class TopicReader:
    """A consumer assigned to every partition of one topic, outside any group, kept open between reads."""

    def __init__(self, bootstrap: str, topic: str, client: Mapping[str, Any]) -> None:
        from kafka import KafkaConsumer, TopicPartition

        self.topic = topic
        with _cluster_errors(f"read {topic}"):
            self.consumer = KafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False,
                                          bootstrap_timeout_ms=5000, max_partition_fetch_bytes=16 << 20,
                                          **common_options(client, "consumer"))
            parts = sorted(self.consumer.partitions_for_topic(topic) or ())
            self.tps = {p: TopicPartition(topic, p) for p in parts}
            self.consumer.assign(list(self.tps.values()))

    def read_all(self, visit: Callable[[Any], None], timeout: float = 60.0) -> None:
        """``visit`` every record from the beginning of every partition to its end (as of the last fetch)."""
        deadline = time.monotonic() + timeout
        tps = list(self.tps.values())
        with _cluster_errors(f"read {self.topic}"):
            self.consumer.seek_to_beginning(*tps)
            while True:
                for records in self.consumer.poll(timeout_ms=100).values():
                    for r in records:
                        visit(r)
                hw = {tp: self.consumer.highwater(tp) for tp in tps}
                if all(hw[tp] is not None and self.consumer.position(tp) >= hw[tp] for tp in tps):
                    return
                if time.monotonic() > deadline:
                    raise ClusterError(f"read {self.topic}: not read to its end within {timeout} s")

    def read_until(self, partition: int, end: int, visit: Callable[[Any], None], timeout: float = 30.0) -> None:
        """``visit`` the records of every partition polled until ``partition`` reaches offset ``end``."""
        tp = self.tps.get(partition)
        if tp is None:
            raise ClusterError(f"{self.topic} has no partition {partition} (repartitioned while running?)")
        deadline = time.monotonic() + timeout
        with _cluster_errors(f"read {self.topic}"):
            while self.consumer.position(tp) < end:
                if time.monotonic() > deadline:
                    raise ClusterError(f"read {self.topic}: partition {partition} did not reach {end} in {timeout} s")
                for records in self.consumer.poll(timeout_ms=100).values():
                    for r in records:
                        visit(r)

    def close(self) -> None:
        with _cluster_errors(f"close {self.topic} reader"):
            self.consumer.close()


class IntentLog:
    """Claims on the intents topic and the first intent per ``(source, start)`` of the tracked sources.

    Parameters
    ----------
    bootstrap, topic, client
        Where the intents topic is.
    producer
        The shared producer.
    """

    def __init__(self, bootstrap: str, topic: str, client: Mapping[str, Any], producer: Producer) -> None:
        self.topic, self.producer = topic, producer
        self.reader = TopicReader(bootstrap, topic, client)
        #: source -> start -> the first intent in the log with that start (tracked sources only)
        self.first: dict[str, dict[int, Intent]] = {}

    def track(self, floors: Mapping[str, int]) -> None:
        """Start tracking sources: learn their first intents with ``start >= floor`` (one read of the whole topic).

        Re-reading what tracked sources already know changes nothing: the first intent stays the first.
        """
        for source in floors:
            self.first[source] = {}

        def visit(record: Any) -> None:
            if record.key is None:
                return
            source = record.key.decode()
            floor = floors.get(source)
            if floor is None:
                return
            intent = _intent(record.value)
            if intent is not None and intent.start >= floor:
                self.first[source].setdefault(intent.start, intent)

        self.reader.read_all(visit)

    def forget(self, source: str) -> None:
        self.first.pop(source, None)

    def settle(self, source: str, offset: int) -> None:
        """Forget the intents of ``source`` before ``offset`` (the chain has passed them)."""
        known = self.first.get(source)
        if known:
            for start in [s for s in known if s < offset]:
                del known[start]

    def winner(self, source: str, start: int) -> Intent | None:
        """The first intent of ``(source, start)`` read so far (``None``: none yet)."""
        return self.first.get(source, {}).get(start)

    def claim(self, intent: Intent) -> Intent:
        """Write ``intent``, read the log up to it and return the winner of its ``(source, start)``."""
        [(partition, offset)] = self.producer.send_all(self.topic, [(intent.source.encode(), intent.to_bytes())])
        self.reader.read_until(partition, offset + 1, self._visit)
        won = self.winner(intent.source, intent.start)
        if won is None:  # cannot happen once our own record was read: the log lost it
            raise ClusterError(f"intent {intent.source}@{intent.start} not found at offset {offset} of {self.topic}")
        return won

    def _visit(self, record: Any) -> None:
        if record.key is None:
            return
        known = self.first.get(record.key.decode())
        if known is None:
            return
        intent = _intent(record.value)
        if intent is not None:
            known.setdefault(intent.start, intent)

    def close(self) -> None:
        self.reader.close()


def _intent(value: bytes | None) -> Intent | None:
    if value is None:
        return None
    try:
        return Intent.from_bytes(value)
    except (ValueError, KeyError, TypeError) as exc:
        log.warning("ignoring a malformed intent record: %s", exc)
        return None


class StateStore:
    """The per-partition states on the state topic."""

    def __init__(self, bootstrap: str, topic: str, client: Mapping[str, Any], producer: Producer) -> None:
        self.topic, self.producer = topic, producer
        self.reader = TopicReader(bootstrap, topic, client)

    def load(self, sources: list[str]) -> dict[str, PartitionState]:
        """The most advanced state (largest offset) of each of ``sources`` that has one (one read of the topic)."""
        wanted = set(sources)
        best: dict[str, PartitionState] = {}

        def visit(record: Any) -> None:
            if record.key is None or record.value is None or record.key.decode() not in wanted:
                return
            try:
                st = PartitionState.from_bytes(record.value)
            except (ValueError, KeyError, TypeError) as exc:
                log.warning("ignoring a malformed state record: %s", exc)
                return
            if st.source not in best or st.offset > best[st.source].offset:
                best[st.source] = st

        self.reader.read_all(visit)
        return best

    def save(self, state: PartitionState) -> None:
        self.producer.send_all(self.topic, [(state.source.encode(), state.to_bytes())])

    def close(self) -> None:
        self.reader.close()
