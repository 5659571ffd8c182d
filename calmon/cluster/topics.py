"""The ingest stage's internal topics: per-partition states, the producers and the readers.

* the **state topic** holds :class:`PartitionState` records (offset, join buffers, decoder state, dead-letter
  position), keyed by the input partition and written in the same Kafka transaction as the range's deltas
  and consumed offsets (:mod:`calmon.cluster.transactions`), so a committed state and its deltas are visible
  together or not at all; the one with the largest offset is the most advanced (compaction may keep any);
* :class:`TopicReader` reads an internal topic with ``isolation_level=read_committed`` up to its end as of the
  read: what a still open transaction wrote is not returned (the broker stops at it), what an aborted one wrote
  is dropped by its ABORT marker (:mod:`connectors.kafka.committed`: also on brokers that list no aborted
  transactions);
* :class:`Range` is one range ``[start, end)`` of an input partition as applied (no longer written anywhere).
"""

from __future__ import annotations

import json
import logging
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from typing import Annotated, Any

import msgspec

from calmon.cluster.records import BadRecord, BadRecords, decode_doc, decode_json
from calmon.state.checkpoint.schema import DecoderDoc, JoinDoc
from connectors.kafka.admin import ensure_topic
from connectors.kafka.clients import KafkaClientError
from connectors.kafka.committed import held as committed_held
from connectors.kafka.committed import install as install_committed
from connectors.kafka.kafkapython import mapped
from connectors.kafka.settings import common_options

log = logging.getLogger("calmon.cluster")

__all__ = ["Range", "PartitionState", "StateStore", "Producer", "TopicReader", "ClusterError", "ensure_topics",
           "new_writer_id", "READ_COMMITTED"]

STATE_FORMAT = "calmon.ingest_state"
#: Version of the state document written, and the versions read (records written before it carry no ``version``
#: key, which reads as 1; version 2 adds the dead-letter position).
VERSION = 2
READABLE = (1, 2)
#: Consumer option of every reader of an internal topic: records of aborted or open transactions are not read.
READ_COMMITTED = {"isolation_level": "read_committed"}

_Offset = Annotated[int, msgspec.Meta(ge=0)]
_Key = Annotated[str, msgspec.Meta(min_length=1, max_length=1000)]


class PartitionStateDoc(msgspec.Struct):
    """A state record (:meth:`PartitionState.to_bytes`): the join buffers and decoder state are the documents a
    checkpoint holds (:mod:`calmon.state.checkpoint.schema`), checked to the same depth."""

    format: str
    source: _Key
    offset: _Offset
    join: JoinDoc
    decoder: DecoderDoc
    writer: Annotated[str, msgspec.Meta(max_length=200)] = ""
    #: the dead-letter sink's position after the range (a new owner skips letters already written after it)
    dead_letter: dict[str, int | str] = msgspec.field(default_factory=dict)
    version: int = 1


class ClusterError(RuntimeError):
    """An internal topic could not be written or read (the range is retried from the logs)."""


def new_writer_id() -> str:
    """A process-unique worker id (labels its metrics and the states it writes)."""
    return uuid.uuid4().hex[:16]


@dataclass(frozen=True)
class Range:
    """One range ``[start, end)`` of an input partition, as applied.

    Examples
    --------
    >>> Range("events/3", 100, 250, 1767225600.0, "w1").end
    250
    """

    source: str
    start: int
    end: int
    #: the arrival time given to events of the range without ``ts``
    now: float
    writer: str


@dataclass(frozen=True)
class PartitionState:
    """An input partition's ingest state after the records before ``offset``: join buffers and decoder state."""

    source: str
    offset: int
    join: dict[str, Any]
    decoder: dict[str, Any]
    writer: str = ""
    #: the dead-letter sink's position after the range (see :meth:`connectors.base.DeadLetterSink.seek`)
    dead_letter: Mapping[str, int | str] = field(default_factory=dict)

    def to_bytes(self) -> bytes:
        doc = {"format": STATE_FORMAT, "version": VERSION, **asdict(self), "dead_letter": dict(self.dead_letter)}
        return json.dumps(doc, separators=(",", ":")).encode()

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
        return cls(d.source, d.offset, raw["join"], raw["decoder"], d.writer, d.dead_letter)


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
    """A ``read_committed`` consumer assigned to every partition of one topic, outside any group, kept open
    between reads."""

    def __init__(self, bootstrap: str, topic: str, client: Mapping[str, Any]) -> None:
        from kafka import KafkaConsumer, TopicPartition

        self.topic = topic
        self._bootstrap, self._client = bootstrap, dict(client)
        with _cluster_errors(f"read {topic}"):
            self.consumer = KafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False,
                                          bootstrap_timeout_ms=5000, max_partition_fetch_bytes=16 << 20,
                                          **common_options(client, "consumer"), **READ_COMMITTED)
            # aborted transactions dropped by their markers, on brokers that list none (connectors/kafka/committed.py)
            self.committed = install_committed(self.consumer, values=False)
            parts = sorted(self.consumer.partitions_for_topic(topic) or ())
            self.tps = {p: TopicPartition(topic, p) for p in parts}
            self.consumer.assign(list(self.tps.values()))

    def read_all(self, visit: Callable[[Any], None], timeout: float = 60.0) -> None:
        """``visit`` every committed record from the beginning of every partition to its end as of the read.

        The end of a partition is its end offset as of the read (the broker's answer, raised by the high watermark
        of the first fetch after the seek -- never one a fetch before the seek reported): a ``read_committed``
        consumer stops at the first open transaction, so it reaches that end once the transactions open then have
        finished (a range's transaction takes seconds; a fenced one is aborted by the fencing); the read also goes on
        until no record is held for a transaction marker beyond that end (``connectors.kafka.committed``).
        Waiting for the high watermark of every later fetch instead would never end while other workers keep
        committing.
        """
        deadline = time.monotonic() + timeout
        tps = list(self.tps.values())
        with _cluster_errors(f"read {self.topic}"):
            self.consumer.seek_to_beginning(*tps)
            # the end as of now: the high watermark the consumer holds is the one of its last fetch -- of the previous
            # read, minutes old after a long pause (a zombie's restore ended at that old end and took no state, so
            # it replayed its partitions from 0) -- so forget it, and ask the broker for the end offsets (a floor:
            # Tansu answers the base offset of the last batch + 1); a fetch after the seek may raise the target
            for tp in tps:
                _forget_highwater(self.consumer, tp)
            target = {tp: int(off) for tp, off in self.consumer.end_offsets(tps).items() if off is not None}
            seen: set[Any] = set()
            while True:
                for records in self.consumer.poll(timeout_ms=100).values():
                    for r in records:
                        visit(r)
                for tp in tps:
                    hw = self.consumer.highwater(tp)
                    if tp not in seen and hw is not None:  # the first fetch after the seek
                        seen.add(tp)
                        target[tp] = max(target.get(tp, 0), int(hw))
                # past the end, and nothing held for a marker not yet read: a committed record behind an undecided
                # transaction of another producer is held too (delivery in offset order), and must be visited
                if len(seen) == len(tps) and all(self.consumer.position(tp) >= target[tp] for tp in tps) \
                        and not committed_held(self.consumer):
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
        tps = _topic_partitions(keys)
        if not tps:
            return {}
        with _cluster_errors("read end offsets"):
            ends = self.consumer.end_offsets(list(tps))
        return {tps[tp]: int(off) for tp, off in ends.items() if off is not None}

    def fetched_ends(self, floors: Mapping[str, int], timeout: float = 10.0) -> dict[str, int]:
        """The end of partitions ``"topic/partition"`` as a fetch reports it (its high watermark), each fetched from
        one record before ``floors[key]``: the exact end where :meth:`end_offsets` answers a floor (Tansu 0.6
        answers the base offset of the last batch + 1).  A short-lived consumer, outside any group."""
        from kafka import KafkaConsumer

        tps = _topic_partitions(floors)
        if not tps:
            return {}
        deadline = time.monotonic() + timeout
        with _cluster_errors("read end offsets by a fetch"):
            consumer = KafkaConsumer(bootstrap_servers=self._bootstrap, enable_auto_commit=False,
                                     bootstrap_timeout_ms=5000, **common_options(self._client, "consumer"))
            try:
                consumer.assign(list(tps))
                for tp, key in tps.items():
                    consumer.seek(tp, max(0, int(floors[key]) - 1))  # a record exists there: the fetch answers
                out: dict[str, int] = {}
                while len(out) < len(tps):
                    consumer.poll(timeout_ms=100, max_records=1)
                    for tp, key in tps.items():
                        hw = consumer.highwater(tp)
                        if hw is not None:
                            out[key] = max(int(hw), int(floors[key]))
                    if time.monotonic() > deadline:
                        raise ClusterError(f"no fetch answered for {sorted(set(tps.values()) - set(out))} "
                                           f"within {timeout} s")
            finally:
                consumer.close()
        return out

    def close(self) -> None:
        with _cluster_errors(f"close {self.topic} reader"):
            self.consumer.close()


def _forget_highwater(consumer: Any, tp: Any) -> None:
    """Forget the high watermark kafka-python keeps from the last fetch of ``tp`` (``highwater`` is that value, never
    reset by a seek), so that the next one seen comes from a fetch after the seek."""
    state = getattr(getattr(consumer, "_subscription", None), "assignment", {}).get(tp)
    if state is not None and hasattr(state, "highwater"):
        state.highwater = None


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
    (:meth:`candidates`): its ranges are processed again and the evaluators drop the deltas of ranges
    ending at or before the last one they applied (exact when the ranges are cut at the same offsets,
    as full ranges are: see ``docs/cluster.md``).  States are written by
    :class:`~calmon.cluster.transactions.PartitionProducer`, in the range's transaction.
    """

    #: States kept per partition while reading, most advanced first (the fallbacks of :meth:`candidates`).
    KEEP = 3

    def __init__(self, bootstrap: str, topic: str, client: Mapping[str, Any], bad: BadRecords | None = None
                 ) -> None:
        self.topic = topic
        self.bad = bad if bad is not None else BadRecords("ingest", "")
        self.reader = TopicReader(bootstrap, topic, client)

    def candidates(self, sources: list[str], ends: Mapping[str, int] | None = None
                   ) -> dict[str, list[PartitionState]]:
        """Up to :attr:`KEEP` valid states of each of ``sources`` with distinct offsets, largest offset first
        (one read of the topic); with ``ends`` (input partition -> end offset), states past the end are skipped.

        ``ends`` may be floors (Tansu answers ListOffsets with the base offset of the last batch + 1, and a new
        owner has fetched nothing yet): a state past its floor is checked against the end a fetch reports
        (:meth:`TopicReader.fetched_ends`) before it is skipped -- skipping a valid state would restore an older
        one and commit its ranges a second time (their dead letters twice; the evaluators drop the deltas)."""
        wanted = set(sources)
        best: dict[str, list[PartitionState]] = {}
        beyond: list[tuple[str, str, PartitionState]] = []

        def keep(key: str, st: PartitionState) -> None:
            kept = [s for s in best.get(key, []) if s.offset != st.offset] + [st]
            best[key] = sorted(kept, key=lambda s: -s.offset)[:self.KEEP]

        def visit(record: Any) -> None:
            key = _key(record)
            if key not in wanted:
                return
            where = f"{self.topic}/{record.partition}@{record.offset}"
            try:
                st = PartitionState.from_bytes(record.value, record.key)
            except BadRecord as exc:
                self.bad.count("state", exc, where)
                return
            end = None if ends is None else ends.get(key)
            if end is not None and st.offset > end:
                beyond.append((key, where, st))  # decided after the read, against the fetched end
                return
            keep(key, st)

        self.reader.read_all(visit)
        if beyond and ends is not None:
            floors = {key: ends[key] for key, _, _ in beyond}
            fetched = self.reader.fetched_ends(floors)
            for key, where, st in beyond:
                end = fetched.get(key, floors[key])
                if st.offset > end:
                    self.bad.count("state", BadRecord("beyond_end", f"state of {key} at offset {st.offset}, past "
                                                                    f"the partition's end {end}"), where)
                else:
                    keep(key, st)
        return best

    def load(self, sources: list[str], ends: Mapping[str, int] | None = None) -> dict[str, PartitionState]:
        """The most advanced valid state (largest offset) of each of ``sources`` that has one."""
        return {k: v[0] for k, v in self.candidates(sources, ends).items() if v}

    def close(self) -> None:
        self.reader.close()


def _topic_partitions(keys: Iterable[str]) -> dict[Any, str]:
    """``TopicPartition -> key`` of the well-formed ``"topic/partition"`` keys (others are skipped)."""
    from kafka import TopicPartition

    tps = {}
    for key in keys:
        topic, _, part = key.rpartition("/")
        if topic and part.isdigit():
            tps[TopicPartition(topic, int(part))] = key
    return tps
