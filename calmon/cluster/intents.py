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
import math
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from typing import Annotated, Any

import msgspec

from calmon.cluster.records import BadRecord, BadRecords, decode_doc, decode_json
from calmon.state.checkpoint.schema import DecoderDoc, JoinDoc
from connectors.kafka.admin import ensure_topic
from connectors.kafka.clients import KafkaClientError
from connectors.kafka.kafkapython import mapped
from connectors.kafka.settings import common_options

log = logging.getLogger("calmon.cluster")

__all__ = ["Intent", "PartitionState", "IntentLog", "StateStore", "Producer", "ClusterError", "new_writer_id"]

INTENT_FORMAT = "calmon.intent"
STATE_FORMAT = "calmon.ingest_state"
#: Version of both documents written, and the versions read (records written before it carry no ``version``
#: key, which reads as 1).
VERSION = 1
READABLE = (1,)
#: Largest intent record read (an intent is a few hundred bytes; its dead-letter position one entry per partition).
MAX_INTENT = 1 << 20

_Offset = Annotated[int, msgspec.Meta(ge=0)]
_Key = Annotated[str, msgspec.Meta(min_length=1, max_length=1000)]


class IntentDoc(msgspec.Struct):
    """An intent record (:meth:`Intent.to_bytes`); keys not listed are allowed."""

    format: str
    source: _Key
    start: _Offset
    end: _Offset
    now: float
    writer: Annotated[str, msgspec.Meta(max_length=200)]
    seq: int
    dead_letter: dict[str, int | str] = {}  #: a Kafka sink's offsets, or a file sink's path, inode and size
    version: int = 1


class PartitionStateDoc(msgspec.Struct):
    """A state record (:meth:`PartitionState.to_bytes`): the join buffers and decoder state are the documents a
    checkpoint holds (:mod:`calmon.state.checkpoint.schema`), checked to the same depth."""

    format: str
    source: _Key
    offset: _Offset
    join: JoinDoc
    decoder: DecoderDoc
    writer: Annotated[str, msgspec.Meta(max_length=200)] = ""
    version: int = 1


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
    dead_letter: Mapping[str, int | str] = field(default_factory=dict)

    def to_bytes(self) -> bytes:
        doc = {"format": INTENT_FORMAT, "version": VERSION, **asdict(self), "dead_letter": dict(self.dead_letter)}
        return json.dumps(doc, separators=(",", ":")).encode()

    @classmethod
    def from_bytes(cls, data: bytes | None, key: bytes | None = None) -> Intent:
        """Decode and check a record value (and its ``key``, when given).

        Raises
        ------
        BadRecord
            With its reason (:data:`calmon.cluster.records.REASONS`).
        """
        d = decode_doc(decode_json(data, "intent", MAX_INTENT), IntentDoc, "intent", INTENT_FORMAT, READABLE)
        if d.end <= d.start:
            raise BadRecord("invalid", f"intent range [{d.start}, {d.end}) is empty")
        if not math.isfinite(d.now):
            raise BadRecord("invalid", f"intent time {d.now} is not finite")
        _same_key(key, d.source, "intent")
        return cls(d.source, d.start, d.end, d.now, d.writer, d.seq, d.dead_letter)


@dataclass(frozen=True)
class PartitionState:
    """An input partition's ingest state after the records before ``offset``: join buffers and decoder state."""

    source: str
    offset: int
    join: dict[str, Any]
    decoder: dict[str, Any]
    writer: str = ""

    def to_bytes(self) -> bytes:
        return json.dumps({"format": STATE_FORMAT, "version": VERSION, **asdict(self)}, separators=(",", ":")).encode()

    @classmethod
    def from_bytes(cls, data: bytes | None, key: bytes | None = None) -> PartitionState:
        """Decode and check a record value (and its ``key``, when given); the join and decoder documents are
        kept as parsed (their loaders take them) once they fit their schema.

        Raises
        ------
        BadRecord
            With its reason (:data:`calmon.cluster.records.REASONS`).
        """
        raw = decode_json(data, "state")
        d = decode_doc(raw, PartitionStateDoc, "state", STATE_FORMAT, READABLE)
        _same_key(key, d.source, "state")
        return cls(d.source, d.offset, raw["join"], raw["decoder"], d.writer)


def _same_key(key: bytes | None, source: str, what: str) -> None:
    """A record keyed by another partition than the one it names would restore the wrong partition."""
    if key is not None and key != source.encode():
        raise BadRecord("key_mismatch", f"{what} record of {source[:80]!r} under key {key[:80]!r}")


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

    def end_offsets(self, keys: list[str]) -> dict[str, int]:
        """The end offsets of partitions ``"topic/partition"`` of any topic, asked with this reader's consumer."""
        from kafka import TopicPartition

        tps = {}
        for key in keys:
            topic, _, part = key.rpartition("/")
            if topic and part.isdigit():
                tps[TopicPartition(topic, int(part))] = key
        if not tps:
            return {}
        with _cluster_errors("read end offsets"):
            ends = self.consumer.end_offsets(list(tps))
        return {tps[tp]: int(off) for tp, off in ends.items() if off is not None}

    def close(self) -> None:
        with _cluster_errors(f"close {self.topic} reader"):
            self.consumer.close()


class IntentLog:
    """Claims on the intents topic and the first intent per ``(source, start)`` of the tracked sources.

    A record that is not a valid intent of its key is skipped (counted in ``bad``): it wins nothing.

    Parameters
    ----------
    bootstrap, topic, client
        Where the intents topic is.
    producer
        The shared producer.
    bad
        The worker's count of skipped internal records.
    """

    def __init__(self, bootstrap: str, topic: str, client: Mapping[str, Any], producer: Producer,
                 bad: BadRecords | None = None) -> None:
        self.topic, self.producer = topic, producer
        self.bad = bad if bad is not None else BadRecords("ingest", "")
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
            floor = floors.get(_key(record))
            if floor is None:
                return
            intent = self._intent(record)
            if intent is not None and intent.start >= floor:
                self.first[intent.source].setdefault(intent.start, intent)

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
        known = self.first.get(_key(record))
        if known is None:
            return
        intent = self._intent(record)
        if intent is not None:
            known.setdefault(intent.start, intent)

    def _intent(self, record: Any) -> Intent | None:
        """The intent of a record of a tracked key, or None (counted) when it is not one."""
        try:
            return Intent.from_bytes(record.value, record.key)
        except BadRecord as exc:
            self.bad.count("intent", exc, f"{self.topic}/{record.partition}@{record.offset}")
            return None

    def close(self) -> None:
        self.reader.close()


def _key(record: Any) -> str:
    """A record's key as text ("" when absent or not UTF-8: no partition has that key)."""
    try:
        return "" if record.key is None else bytes(record.key).decode()
    except UnicodeDecodeError:
        return ""


class StateStore:
    """The per-partition states on the state topic.

    A record that is not a valid state of its key, or that lies beyond its input partition's end, is
    skipped (counted in ``bad``); a restore falls back to the next most advanced state
    (:meth:`candidates`), which is exact while the intents since it are kept (its ranges are replayed
    and the evaluators drop their repeated deltas).
    """

    #: States kept per partition while reading, most advanced first (the fallbacks of :meth:`candidates`).
    KEEP = 3

    def __init__(self, bootstrap: str, topic: str, client: Mapping[str, Any], producer: Producer,
                 bad: BadRecords | None = None) -> None:
        self.topic, self.producer = topic, producer
        self.bad = bad if bad is not None else BadRecords("ingest", "")
        self.reader = TopicReader(bootstrap, topic, client)

    def candidates(self, sources: list[str], ends: Mapping[str, int] | None = None
                   ) -> dict[str, list[PartitionState]]:
        """Up to :attr:`KEEP` valid states of each of ``sources`` with distinct offsets, largest offset first
        (one read of the topic); with ``ends`` (input partition -> end offset), states past the end are skipped."""
        wanted = set(sources)
        best: dict[str, list[PartitionState]] = {}

        def visit(record: Any) -> None:
            key = _key(record)
            if key not in wanted:
                return
            where = f"{self.topic}/{record.partition}@{record.offset}"
            try:
                st = PartitionState.from_bytes(record.value, record.key)
                end = None if ends is None else ends.get(key)
                if end is not None and st.offset > end:
                    raise BadRecord("beyond_end", f"state of {key} at offset {st.offset}, past the partition's "
                                                  f"end {end}")
            except BadRecord as exc:
                self.bad.count("state", exc, where)
                return
            kept = [s for s in best.get(key, []) if s.offset != st.offset] + [st]
            best[key] = sorted(kept, key=lambda s: -s.offset)[:self.KEEP]

        self.reader.read_all(visit)
        return best

    def load(self, sources: list[str], ends: Mapping[str, int] | None = None) -> dict[str, PartitionState]:
        """The most advanced valid state (largest offset) of each of ``sources`` that has one."""
        return {k: v[0] for k, v in self.candidates(sources, ends).items() if v}

    def save(self, state: PartitionState) -> None:
        self.producer.send_all(self.topic, [(state.source.encode(), state.to_bytes())])

    def close(self) -> None:
        self.reader.close()
