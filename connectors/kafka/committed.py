"""``read_committed`` on the client side: a transaction's records are held until its commit or abort marker.

A ``read_committed`` consumer relies on the broker for two things (KIP-98): fetches stop at the last stable
offset (no record of an open transaction is returned), and each fetch response lists the aborted transactions
in its range, which the client uses to skip their records.  Tansu 0.6 (the test broker) does the first but
not the second: its fetch responses carry no aborted-transaction list, so kafka-python and confluent-kafka both
return the records of aborted transactions (``docs/cluster.md``, "Brokers that return aborted records").

What a client can still see is the **control batch** the transaction coordinator writes into every partition a
transaction touched when it ends: a batch with the control attribute bit, the transaction's producer id, and
one record whose key is ``version:int16, type:int16`` -- type 1 COMMIT, 0 ABORT.  :class:`Held` uses it the way
the broker's list would be used: the records of a transactional batch (transactional attribute bit) are held
per producer id until that producer's next control batch in the partition, then delivered (COMMIT) or dropped
(ABORT).  Delivery keeps offset order: a record behind a held one (of another producer, or not transactional)
waits for it, so a reader that remembers "everything below offset o was processed" stays right.

Where the broker does send an aborted list (Kafka, Redpanda), kafka-python's own filtering still runs first
and skips aborted batches; the holding then only delays committed records until their marker, which is below
the last stable offset anyway.  Open transactions are never held for long: a ``read_committed`` fetch does not
return them.  The held records of a partition are forgotten when the consumer's position moves anywhere but
where the previous fetch of that partition ended (a seek, a new assignment): they are fetched again from there.

Only kafka-python exposes the batches (``Fetcher.PartitionRecords``); librdkafka (confluent-kafka) skips control
batches inside C, so a client of calmon's internal topics uses kafka-python.  :func:`install` swaps the
fetcher's class on one consumer, as :mod:`connectors.kafka.valuerecords` does.
"""

from __future__ import annotations

import functools
import logging
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

log = logging.getLogger(__name__)

__all__ = ["Held", "Stats", "held", "install", "marker_type", "COMMIT", "ABORT"]

#: Control record types (the key's second int16).
ABORT, COMMIT = 0, 1


def marker_type(key: bytes | None) -> int | None:
    """The type of a control record from its key (``version:int16, type:int16``), None if not a marker.

    Examples
    --------
    >>> marker_type(b"\\x00\\x00\\x00\\x01"), marker_type(b"\\x00\\x00\\x00\\x00"), marker_type(b"\\x00")
    (1, 0, None)
    """
    if key is None or len(key) < 4:
        return None
    t = int.from_bytes(key[2:4], "big", signed=True)
    return t if t in (ABORT, COMMIT) else None


@dataclass
class Stats:
    """What the holding did on one consumer (every partition): records dropped as aborted, and the most records
    held at once."""

    aborted: int = 0
    committed: int = 0
    held_max: int = 0
    #: per partition, the offset after the last aborted record counted: a partition read again after a seek (a
    #: restore, a rebalance) drops its aborted records again but counts them once
    aborted_to: dict[Any, int] = field(default_factory=dict)

    def count_aborted(self, tp: Any, first: int, last: int, n: int) -> None:
        """Count ``n`` aborted records at offsets ``first`` .. ``last`` of ``tp``, less those counted already."""
        done = self.aborted_to.get(tp, first)
        if last < done:
            return
        self.aborted += n if first >= done else min(n, last + 1 - done)
        self.aborted_to[tp] = last + 1


@dataclass
class Held:
    """The undecided records of one partition, in offset order (see the module docstring).

    Each entry is ``[producer id or None, decided, keep, records, producer epoch]``; entries are released from
    the front once decided.

    Examples
    --------
    >>> h = Held()
    >>> _ = h.hold(7, ["a1", "a2"]); h.add(["x"]); _ = h.hold(8, ["b1"])
    >>> h.resolve(8, commit=True)      # b is decided, but a (before it) is not: nothing is released yet
    []
    >>> h.resolve(7, commit=False)     # a aborted: dropped; x and b1 follow
    ['x', 'b1']
    >>> h.stats.aborted, h.pending
    (2, 0)
    """

    #: where the fetch that last completed for this partition ended (None while one is in progress)
    next: int | None = None
    queue: deque[list[Any]] = field(default_factory=deque)
    stats: Stats = field(default_factory=Stats)
    pending: int = 0
    #: the partition, and a record's offset: aborted records are then counted once per offset
    #: (:meth:`Stats.count_aborted`); without them every drop counts
    tp: Any = None
    offset_of: Callable[[Any], int] | None = None

    def _drop(self, records: list[Any]) -> None:
        """Count ``records`` (decided aborted) in :attr:`stats`."""
        if self.offset_of is None or not records:
            self.stats.aborted += len(records)
            return
        self.stats.count_aborted(self.tp, self.offset_of(records[0]), self.offset_of(records[-1]), len(records))

    def hold(self, producer_id: int, records: list[Any], epoch: int = 0) -> list[Any]:
        """Hold a transactional batch's records until ``producer_id`` 's marker.

        A batch of a newer ``epoch`` means the producer id was initialised again (a new owner fenced the old
        one), which aborts whatever the older epoch left open: its held records are dropped here even if the
        broker wrote no marker for them, or accepted a fenced producer's batch after its marker.  Returns the
        records that this makes deliverable.
        """
        stale = [e for e in self.queue if e[0] == producer_id and not e[1] and e[4] < epoch]
        for entry in stale:
            entry[1], entry[2] = True, False
            self._drop(entry[3])
        if records:
            self.queue.append([producer_id, False, False, records, epoch])
            self.pending += len(records)
            self.stats.held_max = max(self.stats.held_max, self.pending)
        return self._release() if stale else []

    def add(self, records: list[Any]) -> None:
        """Records that need no marker (not transactional), behind what is held."""
        if records:
            self.queue.append([None, True, True, records, -1])
            self.pending += len(records)

    def resolve(self, producer_id: int, commit: bool, epoch: int | None = None) -> list[Any]:
        """``producer_id`` 's transaction ended (its marker, of producer ``epoch``): decide its held records; the
        records now deliverable, in order.

        Records of an *older* epoch than the marker's are dropped whatever the marker says: the id was initialised
        again, which aborted the older epoch's transaction, and a COMMIT of the new owner never commits a fenced
        zombie's late batch (a broker that accepts it after the fencing's ABORT marker, as Tansu 0.6 can, puts it
        between the new owner's records and their COMMIT).  Records of a newer epoch wait for their own marker.
        """
        for entry in self.queue:
            if entry[0] == producer_id and not entry[1]:
                if epoch is not None and entry[4] > epoch:
                    continue
                keep = commit and (epoch is None or entry[4] == epoch)
                entry[1], entry[2] = True, keep
                if keep:
                    self.stats.committed += len(entry[3])
                else:
                    self._drop(entry[3])
        return self._release()

    def _release(self) -> list[Any]:
        """Pop the decided entries at the front: the records kept, in order."""
        out: list[Any] = []
        while self.queue and self.queue[0][1]:
            _pid, _decided, keep, records, _epoch = self.queue.popleft()
            self.pending -= len(records)
            if keep:
                out += records
        return out


def _define(base: Any, values: bool) -> Any:
    """A subclass of ``base`` (``Fetcher.PartitionRecords`` or ``ValueRecords``) whose record loop holds
    transactional records; ``values`` says whether ``base`` yields ``(offset, value)`` tuples."""
    from kafka import errors
    from kafka.consumer.fetcher import ConsumerRecord, IsolationLevel

    def _offset_of(record: Any) -> int:
        return int(record[0] if values else record.offset)

    class CommittedRecords(base):
        """``PartitionRecords`` filtering aborted transactions by their markers (see the module docstring)."""

        #: per consumer (set by :func:`install` on a subclass): partition -> its :class:`Held`
        holds: dict[Any, Held] = {}
        next_fetch_offset: int  # set by kafka-python's __init__
        stats = Stats()

        def __init__(self, fetch_offset: int, tp: Any, records: Any, *args: Any, **kwargs: Any) -> None:
            held = self.holds.get(tp)
            if held is None or held.next != fetch_offset:  # a seek or a new assignment: start afresh
                held = self.holds[tp] = Held(stats=self.stats, tp=tp, offset_of=_offset_of)
            held.next = None
            self._held = held
            super().__init__(fetch_offset, tp, records, *args, **kwargs)

        def _maybe_skip_record(self, record: Any) -> bool:
            return False  # records before the fetch offset are cut per batch in _unpack_records

        def take(self, n: int | None = None) -> list[Any]:
            records: list[Any] = super().take(n)
            if records:
                last = records[-1][0] if values else records[-1].offset
                self.next_fetch_offset = max(self.next_fetch_offset, last + 1)
            return records

        def _records(self, batch: Any, kd: Any, vd: Any) -> Iterable[Any]:
            if values:
                return self._batch(batch) if batch.magic == 2 else self._legacy(batch)
            return self._consumer_records(batch, kd, vd)

        def _consumer_records(self, batch: Any, kd: Any, vd: Any) -> Iterator[Any]:
            tp = self.topic_partition
            for r in batch:  # as kafka-python's own loop (Fetcher.PartitionRecords._unpack_records, 3.0)
                if self.check_crcs and not r.validate_crc():
                    raise errors.CorruptRecordError(
                        f"Record for partition {tp} at offset {r.offset} failed crc check")
                headers = r.headers
                hsize = sum(len(k.encode()) + (len(v) if v is not None else 0) for k, v in headers) if headers else -1
                self.records_read += 1
                self.bytes_read += r.size_in_bytes
                yield ConsumerRecord(tp.topic, tp.partition, self.leader_epoch, r.offset, r.timestamp,
                                     r.timestamp_type, self._deserialize(kd, tp.topic, headers, r.key),
                                     self._deserialize(vd, tp.topic, headers, r.value), headers, r.checksum,
                                     -1 if r.key is None else len(r.key), -1 if r.value is None else len(r.value),
                                     hsize)

        def _from(self, records: Iterable[Any]) -> list[Any]:
            """The records at or after the fetch offset (a fetch may start inside a batch)."""
            start = self.fetch_offset
            return [r for r in records if (r[0] if values else r.offset) >= start]

        def _unpack_records(self, tp: Any, records: Any, kd: Any, vd: Any) -> Iterator[Any]:
            held = self._held
            committed_only = self.isolation_level == IsolationLevel.READ_COMMITTED
            try:
                batch = records.next_batch()
                last_batch = None
                while batch is not None:
                    last_batch = batch
                    if self.check_crcs and not batch.validate_crc():
                        raise errors.CorruptRecordError(
                            f"Record batch for partition {tp} at offset {batch.base_offset} failed crc check")
                    if batch.magic == 2:
                        self.leader_epoch = batch.leader_epoch
                        if committed_only and batch.has_producer_id():
                            self._consume_aborted_transactions_up_to(batch.last_offset)
                            pid = batch.producer_id
                            if batch.is_control_batch:
                                kind = next((marker_type(r.key) for r in batch), None)
                                if kind == ABORT:
                                    self.aborted_producer_ids.discard(pid)
                                if kind is not None:
                                    yield from held.resolve(pid, kind == COMMIT, batch.producer_epoch)
                                if not held.queue:
                                    self.next_fetch_offset = batch.next_offset
                                batch = records.next_batch()
                                continue
                            if self._is_batch_aborted(batch):  # the broker's list (Kafka) says so
                                held.stats.count_aborted(tp, batch.base_offset, batch.last_offset,
                                                         batch.records_count)
                                if not held.queue:
                                    self.next_fetch_offset = batch.next_offset
                                batch = records.next_batch()
                                continue
                            if batch.is_transactional:
                                yield from held.hold(pid, self._from(self._records(batch, kd, vd)),
                                                     batch.producer_epoch)
                                batch = records.next_batch()
                                continue
                        if batch.is_control_batch:
                            if not held.queue:
                                self.next_fetch_offset = batch.next_offset
                            batch = records.next_batch()
                            continue
                    if held.queue:
                        held.add(self._from(self._records(batch, kd, vd)))
                    else:
                        yield from self._from(self._records(batch, kd, vd))
                    batch = records.next_batch()
                if last_batch is not None and last_batch.magic == 2:
                    # everything of this response is delivered, held or dropped: fetch on after it
                    self.next_fetch_offset = max(self.next_fetch_offset, last_batch.next_offset)
                held.next = self.next_fetch_offset
                self.drain()
            except StopIteration:
                log.exception("StopIteration raised unpacking messageset")
                raise RuntimeError("StopIteration raised unpacking messageset") from None

    return CommittedRecords


@functools.cache
def _classes(values: bool) -> Any:
    from kafka.consumer.fetcher import Fetcher

    from connectors.kafka.valuerecords import value_records_class

    return _define(value_records_class() if values else Fetcher.PartitionRecords, values)


def held(consumer: Any) -> int:
    """Records ``consumer`` holds undecided (waiting for their transaction's marker), all partitions together."""
    holds = getattr(getattr(getattr(consumer, "_fetcher", None), "PartitionRecords", None), "holds", None)
    return sum(h.pending for h in holds.values()) if isinstance(holds, dict) else 0


def supported() -> bool:
    """True when the installed kafka-python has the fetcher internals this module relies on."""
    from connectors.kafka.valuerecords import supported as values_supported

    return values_supported()


def install(consumer: Any, values: bool, stats: Stats | None = None) -> Stats | None:
    """Make ``consumer`` (a fresh ``kafka.KafkaConsumer`` with ``isolation_level='read_committed'``) hold
    transactional records until their marker; with ``values``, ``poll`` returns ``(offset, value)`` tuples
    (:mod:`connectors.kafka.valuerecords`).

    Returns
    -------
    Stats or None
        The consumer's counters (``stats`` when given: a source keeps one across reconnects); None (nothing
        changed) when the kafka-python version is not supported.
    """
    fetcher = getattr(consumer, "_fetcher", None)
    if fetcher is None or not supported():
        return None
    stats = Stats() if stats is None else stats
    # a subclass per consumer: its holds and counters are this consumer's
    fetcher.PartitionRecords = type("CommittedRecords", (_classes(values),), {"holds": {}, "stats": stats})
    return stats
