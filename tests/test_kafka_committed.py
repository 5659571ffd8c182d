"""Client-side ``read_committed`` (issue #33.2, ``connectors/kafka/committed.py``): a transaction's records are held
until its control batch and dropped on ABORT, for brokers whose fetch responses list no aborted transactions
(Tansu 0.6).

Without a broker: crafted logs read through the fetcher's record class in one and in several fetches (a marker in
a later fetch than its records), both flavours (``(offset, value)`` and ``ConsumerRecord``), offset order kept
behind a held transaction, a seek forgetting what is held.  On the broker: kafka-python's own ``read_committed``
returns an aborted transaction's records (the quirk), the source and the state reader do not.
"""

from __future__ import annotations

import struct
import sys
import time
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from kafka_broker import KafkaBroker, require_broker  # noqa: E402
from test_kafka_valuerecords import _batch_at  # noqa: E402

from connectors.kafka.committed import Held, Stats, _classes  # noqa: E402

COMMIT, ABORT = struct.pack(">hh", 0, 1), struct.pack(">hh", 0, 0)


def _reader(values: bool) -> Any:
    """A fetcher record class with its own holds, as :func:`connectors.kafka.committed.install` makes one."""
    return type("R", (_classes(values),), {"holds": {}, "stats": Stats()})


def _read(cls: Any, fetches: list[tuple[int, bytes]], values: bool, take: int = 2) -> tuple[list[Any], int]:
    """Read ``(fetch offset, log bytes)`` responses in turn, as the consumer would: ``(offset, value)`` pairs and
    the position after the last."""
    from kafka import TopicPartition
    from kafka.consumer.fetcher import IsolationLevel
    from kafka.record.memory_records import MemoryRecords

    tp = TopicPartition("t", 0)
    out: list[Any] = []
    position = 0
    for fetch_offset, log in fetches:
        part = cls(fetch_offset, tp, MemoryRecords(log), isolation_level=IsolationLevel.READ_COMMITTED,
                   aborted_transactions=[])  # what Tansu sends
        while part:
            got = part.take(take)
            out += [r if values else (r.offset, r.value) for r in got]
            if not got:
                break
        position = part.next_fetch_offset
    return out, position


@pytest.mark.parametrize("values", [True, False])
def test_an_aborted_transaction_is_dropped_by_its_marker_without_the_brokers_list(values):
    cls = _reader(values)
    first = b"".join([
        _batch_at(0, [b"a0", b"a1"], pid=7),  # committed below
        _batch_at(2, [b"b2", b"b3", b"b4"], pid=8),  # aborted below
        _batch_at(5, [b"p5"]),  # not transactional: waits behind the undecided ones
        _batch_at(6, [COMMIT], pid=7, control=True),
        _batch_at(7, [b"a7"], pid=7),  # a second transaction of producer 7, decided in the next fetch
    ])
    second = b"".join([
        _batch_at(8, [ABORT], pid=8, control=True),
        _batch_at(9, [COMMIT], pid=7, control=True),
        _batch_at(10, [b"p10"]),
    ])
    got, position = _read(cls, [(0, first), (8, second)], values)
    assert got == [(0, b"a0"), (1, b"a1"), (5, b"p5"), (7, b"a7"), (10, b"p10")]
    assert position == 11
    assert (cls.stats.aborted, cls.stats.committed) == (3, 3)
    # the same log in one fetch, taken one record at a time: the same records
    one = _reader(values)
    assert _read(one, [(0, first + second)], values, take=1) == (got, 11)


@pytest.mark.parametrize("values", [True, False])
def test_a_seek_forgets_what_is_held(values):
    """Held records belong to the position they were fetched from: a fetch from elsewhere starts afresh (the
    records are fetched again from there), so nothing before a seek target is delivered."""
    cls = _reader(values)
    first = _batch_at(0, [b"a0", b"a1"], pid=7)
    got, position = _read(cls, [(0, first)], values)
    assert got == [] and position == 2  # held: no marker yet
    later = b"".join([_batch_at(1, [b"a1"], pid=7), _batch_at(2, [COMMIT], pid=7, control=True)])
    # a seek to 1 (not where the previous fetch ended): a0 is forgotten; a1 comes again with its marker
    assert _read(cls, [(1, later)], values)[0] == [(1, b"a1")]


@pytest.mark.parametrize("values", [True, False])
def test_an_aborted_transaction_read_again_after_a_seek_is_dropped_again_and_counted_once(values):
    """A partition read again from an earlier offset (the evaluator's restore repositions what the consumer had
    started fetching) drops the aborted records again, but ``calmon_cluster_aborted_records_total`` counts each
    aborted record once: it failed 1 run in 3 of
    ``test_an_aborted_range_never_reaches_the_evaluator_even_where_the_broker_returns_it`` (6 for 3)."""
    cls = _reader(values)
    log = b"".join([
        _batch_at(0, [b"b0", b"b1", b"b2"], pid=8),  # aborted
        _batch_at(3, [ABORT], pid=8, control=True),
        _batch_at(4, [b"a4"], pid=7),
        _batch_at(5, [COMMIT], pid=7, control=True),
    ])
    assert _read(cls, [(0, log)], values)[0] == [(4, b"a4")]
    assert _read(cls, [(0, log)], values)[0] == [(4, b"a4")]  # a seek back to 0: fetched from there again
    assert cls.stats.aborted == 3
    more = b"".join([_batch_at(6, [b"c6", b"c7"], pid=9), _batch_at(8, [ABORT], pid=9, control=True)])
    assert _read(cls, [(0, log + more)], values)[0] == [(4, b"a4")]  # again, with two new aborted records
    assert cls.stats.aborted == 5


def test_held_keeps_offset_order_and_counts():
    h = Held()
    assert h.hold(1, ["x1"]) == []
    h.add(["n"])
    assert h.resolve(2, commit=True) == [] and h.pending == 2  # a marker of a producer with nothing held
    assert h.resolve(1, commit=True) == ["x1", "n"] and h.pending == 0
    assert h.stats.held_max == 1


@pytest.fixture()
def broker():
    require_broker()
    with KafkaBroker() as b:
        yield b


@pytest.mark.integration
def test_on_tansu_the_source_and_the_state_reader_drop_aborted_transactions(broker):
    """Tansu returns an aborted transaction's records to kafka-python's ``read_committed`` (the quirk this module
    exists for); the kafka source with ``isolation_level: read_committed`` (both record flavours, fetches small
    enough to end between a transaction's records and its marker) and the internal topics' reader do not."""
    from kafka import KafkaConsumer, KafkaProducer, TopicPartition

    from calmon.cluster.topics import TopicReader
    from connectors.kafka import KafkaSource

    boot = broker.bootstrap
    broker.create_topic("tx", 1)
    p = KafkaProducer(bootstrap_servers=boot, transactional_id="tx-a")
    p.init_transactions()
    plain = KafkaProducer(bootstrap_servers=boot)
    want = []
    for i in range(6):
        p.begin_transaction()
        for j in range(3):
            p.send("tx", key=b"k", value=b"%s%d.%d" % (b"keep" if i % 2 else b"drop", i, j))
        p.flush()
        if i % 2:
            p.commit_transaction()
            want += [b"keep%d.%d" % (i, j) for j in range(3)]
        else:
            p.abort_transaction()
        plain.send("tx", value=b"plain%d" % i)
        plain.flush()
        want.append(b"plain%d" % i)
    p.close()
    plain.close()

    raw = KafkaConsumer(bootstrap_servers=boot, isolation_level="read_committed", enable_auto_commit=False)
    raw.assign([TopicPartition("tx", 0)])
    raw.seek_to_beginning()
    theirs: list[bytes] = []
    deadline = time.monotonic() + 20
    while len(theirs) < len(want) + 9 and time.monotonic() < deadline:
        theirs += [r.value for rs in raw.poll(timeout_ms=200).values() for r in rs]
    raw.close()
    assert b"drop0.0" in theirs  # the broker's quirk, still there: otherwise this test shows nothing

    small = {"isolation_level": "read_committed", "max_partition_fetch_bytes": 150, "fetch_max_bytes": 150}
    for metadata in (False, True):
        src = KafkaSource(boot, "tx", None, client=small, metadata=metadata)
        got: list[bytes] = []
        deadline = time.monotonic() + 30
        try:
            while len(got) < len(want) and time.monotonic() < deadline:
                b = src.read(max_records=2, timeout=0.3)
                if b is not None:
                    got += list(b.records)
            assert got == want, metadata
            assert src.txn_stats.aborted == 9 and src.txn_stats.committed == 9
        finally:
            src.close()

    reader = TopicReader(boot, "tx", {})
    seen: list[bytes] = []
    try:
        reader.read_all(lambda r: seen.append(r.value))
    finally:
        reader.close()
    assert seen == want


@pytest.mark.parametrize("values", [True, False])
def test_a_newer_epoch_of_the_producer_aborts_what_the_older_one_left_held(values):
    """A fenced producer's batch that reached the log after its ABORT marker (or with no marker at all) is dropped
    once the same producer id writes with a newer epoch, so the new owner's COMMIT does not deliver it."""
    import struct as st

    from kafka.record.util import calc_crc32c

    def with_epoch(raw: bytes, epoch: int) -> bytes:
        buf = bytearray(raw)
        st.pack_into(">h", buf, 51, epoch)  # producerEpoch, then the batch CRC (over attributes onwards)
        st.pack_into(">I", buf, 17, calc_crc32c(memoryview(buf)[21:]))
        return bytes(buf)

    cls = _reader(values)
    log = b"".join([
        _batch_at(0, [b"z0"], pid=7),  # the old owner's range, aborted by the fencing
        _batch_at(1, [ABORT], pid=7, control=True),
        _batch_at(2, [b"z2"], pid=7),  # a late batch of the fenced producer: no marker of its own
        with_epoch(_batch_at(3, [b"n3"], pid=7), 1),  # the new owner (same id, epoch 1)
        with_epoch(_batch_at(4, [COMMIT], pid=7, control=True), 1),
    ])
    assert _read(cls, [(0, log)], values)[0] == [(3, b"n3")]
    assert cls.stats.aborted == 2


@pytest.mark.parametrize("values", [True, False])
def test_a_new_owners_commit_does_not_deliver_a_zombies_batch_written_after_its_own(values):
    """The order the newer-epoch rule above does not see: the new owner's batch (epoch 1) is *before* the fenced
    producer's late batch (epoch 0), both before the new owner's COMMIT (epoch 1).  The marker decides only its own
    epoch: the late batch is dropped (it was delivered as committed before: a zombie's range would count twice,
    with its dead letters; Tansu writes the fencing's ABORT with the old epoch, the new owner's COMMIT with the new).
    """
    import struct as st

    from kafka.record.util import calc_crc32c

    def with_epoch(raw: bytes, epoch: int) -> bytes:
        buf = bytearray(raw)
        st.pack_into(">h", buf, 51, epoch)
        st.pack_into(">I", buf, 17, calc_crc32c(memoryview(buf)[21:]))
        return bytes(buf)

    cls = _reader(values)
    log = b"".join([
        _batch_at(0, [b"z0"], pid=7),  # the zombie's range, aborted by the fencing (Tansu: the marker of epoch 0)
        _batch_at(1, [ABORT], pid=7, control=True),
        with_epoch(_batch_at(2, [b"n2"], pid=7), 1),  # the new owner's range
        _batch_at(3, [b"z3"], pid=7),  # the zombie resumed: its batch in flight is accepted after the fencing
        with_epoch(_batch_at(4, [COMMIT], pid=7, control=True), 1),
    ])
    assert _read(cls, [(0, log)], values)[0] == [(2, b"n2")]
    assert cls.stats.aborted == 2
    h = Held()  # and a marker never decides records of a newer epoch than its own
    h.hold(7, ["new"], epoch=2)
    assert h.resolve(7, commit=False, epoch=1) == [] and h.pending == 1
    assert h.resolve(7, commit=True, epoch=2) == ["new"]


@pytest.mark.integration
def test_the_fetch_position_passes_an_aborted_tail_the_record_position_does_not(broker):
    """A partition ending in an aborted transaction: the source's position stays one past the last record returned
    (lag 3: the COMMIT marker, the aborted record, its ABORT marker), ``fetched()`` reaches the end -- what the
    evaluator's readiness uses (in kill-test run 5 both evaluators stayed at /readyz 503 with lag 2)."""
    from kafka import KafkaProducer

    from connectors.kafka import KafkaSource

    boot = broker.bootstrap
    broker.create_topic("tail", 1)
    p = KafkaProducer(bootstrap_servers=boot, transactional_id="tail-x")
    p.init_transactions()
    p.begin_transaction()
    p.send("tail", b"c")
    p.commit_transaction()
    p.begin_transaction()
    p.send("tail", b"a")
    p.flush()
    p.abort_transaction()
    p.close()
    src = KafkaSource(boot, "tail", None, client={"isolation_level": "read_committed"})
    got: list[bytes] = []
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and src.fetched().get("tail/0") != 4:
            b = src.read(max_records=10, timeout=0.3)
            if b is not None:
                got += list(b.records)
        assert got == [b"c"]
        assert src.position() == {"tail/0": 1} and src.lag() == {"tail/0": 3} and src.fetched() == {"tail/0": 4}
    finally:
        src.close()


@pytest.mark.integration
def test_on_tansu_an_open_transaction_blocks_read_committed_until_the_next_owner_opens_its_id(broker):
    """docs/cluster.md, "Requirements": Tansu 0.6 never times a transaction out, so a dead owner's open
    transaction holds a ``read_committed`` reader back until the partition's next owner calls
    ``init_transactions`` under the same transactional id (which aborts it)."""
    from kafka import KafkaConsumer, KafkaProducer, TopicPartition

    topic = "open-txn"
    broker.create_topic(topic, partitions=1)
    dead = KafkaProducer(bootstrap_servers=broker.bootstrap, transactional_id="calmon-ingest.open-txn/0",
                         transaction_timeout_ms=1000)
    dead.init_transactions()
    dead.begin_transaction()
    dead.send(topic, b"open").get(timeout=10)
    plain = KafkaProducer(bootstrap_servers=broker.bootstrap)
    plain.send(topic, b"after").get(timeout=10)
    plain.close()
    reader = KafkaConsumer(bootstrap_servers=broker.bootstrap, isolation_level="read_committed",
                           enable_auto_commit=False)
    tp = TopicPartition(topic, 0)
    reader.assign([tp])
    reader.seek(tp, 0)

    def read_for(seconds: float) -> list[bytes]:
        got: list[bytes] = []
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline and b"after" not in got:
            got += [r.value for rs in reader.poll(timeout_ms=200).values() for r in rs]
        return got

    try:
        assert read_for(6.0) == []  # six times the transaction's timeout: still held back
        heir = KafkaProducer(bootstrap_servers=broker.bootstrap, transactional_id="calmon-ingest.open-txn/0")
        heir.init_transactions()  # aborts the open transaction
        assert b"after" in read_for(60.0)
        heir.close()
    finally:
        reader.close()
        dead.close(timeout=1)
