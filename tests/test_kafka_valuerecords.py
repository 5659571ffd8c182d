"""kafka-python's record batches read as ``(offset, value)`` pairs (issue #33.1, ``connectors/kafka/valuerecords.py``).

Without a broker: :func:`batch_values` against kafka-python's own record iterator on batches of every shape (null
and empty values and keys, headers, one- to three-byte varints, compressed bodies) and on malformed batches.  On the
broker (``tests/kafka_broker.py``), with both clients where the behaviour is shared: compressed topics read in
batches that end inside a record batch (every record once, exact positions, no ``ConsumerRecord`` built on the
kafka-python path), and transactions under ``read_committed`` (aborted records hidden, control records skipped,
the position past the last marker).
"""

from __future__ import annotations

import random
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from kafka_broker import KafkaBroker, require_broker  # noqa: E402

from connectors.kafka import KafkaSource  # noqa: E402
from connectors.kafka.valuerecords import HEADER_SIZE, batch_values, supported  # noqa: E402


def _build(records: list[tuple[bytes | None, bytes | None, list[tuple[str, bytes | None]]]], ts_step: int = 1,
           codec: int = 0) -> bytes:
    from kafka.record.default_records import DefaultRecordBatchBuilder

    b = DefaultRecordBatchBuilder(magic=2, compression_type=codec, is_transactional=False, producer_id=-1,
                                  producer_epoch=-1, base_sequence=-1, batch_size=1 << 26)
    for i, (key, value, headers) in enumerate(records):
        assert b.append(i, timestamp=1_700_000_000_000 + i * ts_step, key=key, value=value, headers=headers)
    return bytes(b.build())


def _random_records(rng: random.Random, n: int) -> list[tuple[bytes | None, bytes | None, list[Any]]]:
    sizes = [0, 1, 5, 63, 64, 100, 8191, 8192, 20000]  # around the varint size steps (zigzag: 64, 8192)
    out = []
    for _ in range(n):
        key = None if rng.random() < 0.3 else rng.randbytes(rng.choice(sizes[:6]))
        value = None if rng.random() < 0.1 else rng.randbytes(rng.choice(sizes))
        headers = [(f"h{j}", None if rng.random() < 0.2 else rng.randbytes(rng.choice(sizes[:5])))
                   for j in range(rng.choice([0, 0, 1, 3]))]
        out.append((key, value, headers))
    return out


@pytest.mark.parametrize("seed", range(6))
def test_batch_values_equal_kafka_pythons_own_iterator(seed):
    from kafka.record.default_records import DefaultRecordBatch

    rng = random.Random(seed)
    n = rng.choice([1, 2, 63, 64, 65, 300, 9000])  # offset deltas of one to three bytes
    records = _random_records(rng, n) if n < 9000 else [(b"k", b"v" * (i % 70), []) for i in range(n)]
    buf = _build(records, ts_step=rng.choice([0, 1, 1000, 10**9]))
    expected = [r.value for r in DefaultRecordBatch(buf)]
    assert expected == [v for _k, v, _h in records]
    assert batch_values(buf, HEADER_SIZE, n) == expected


def test_batch_values_refuse_a_malformed_batch():
    buf = _build([(b"k", b"value-%d" % i, [("model", b"m")]) for i in range(50)])
    assert len(batch_values(buf, HEADER_SIZE, 50)) == 50
    with pytest.raises((ValueError, IndexError)):
        batch_values(buf[:-7], HEADER_SIZE, 50)  # the last record cut short
    with pytest.raises(ValueError, match="unconsumed"):
        batch_values(buf + b"\x00\x00", HEADER_SIZE, 50)  # bytes after the last record
    with pytest.raises(ValueError):
        batch_values(buf, HEADER_SIZE, 49)  # fewer records than the body holds
    bad = bytearray(buf)
    bad[HEADER_SIZE] = 0x7E  # the first record's length: 63 bytes instead of its own, mid-record
    with pytest.raises((ValueError, IndexError)):
        batch_values(bytes(bad), HEADER_SIZE, 50)


def _batch_at(base: int, values: list[bytes], pid: int = -1, control: bool = False) -> bytes:
    """A v2 batch at offset ``base``; transactional when ``pid`` >= 0; a control batch when ``control``."""
    import struct

    from kafka.record.default_records import DefaultRecordBatchBuilder
    from kafka.record.util import calc_crc32c

    b = DefaultRecordBatchBuilder(magic=2, compression_type=0, is_transactional=pid >= 0, producer_id=pid,
                                  producer_epoch=0 if pid >= 0 else -1, base_sequence=0 if pid >= 0 else -1,
                                  batch_size=1 << 20)
    for i, v in enumerate(values):
        key = v if control else b"k"
        b.append(i, timestamp=1_700_000_000_000, key=key, value=b"\x00\x00\x00\x00\x00\x00" if control else v,
                 headers=[])
    buf = bytearray(b.build())
    struct.pack_into(">q", buf, 0, base)
    if control:  # only brokers write control batches: set the bit and the batch CRC (over attributes onwards)
        attrs = struct.unpack_from(">h", buf, 21)[0] | 0x20
        struct.pack_into(">h", buf, 21, attrs)
        struct.pack_into(">I", buf, 17, calc_crc32c(memoryview(buf)[21:]))
    return bytes(buf)


def test_read_committed_batches_read_as_kafka_python_reads_them():
    """Aborted transactions, commit and abort markers, a fetch from the middle of a batch: the same records and
    the same next fetch offset as kafka-python's own ``PartitionRecords``."""
    import collections
    import struct

    from kafka import TopicPartition
    from kafka.consumer.fetcher import Fetcher, IsolationLevel
    from kafka.record.memory_records import MemoryRecords

    from connectors.kafka.valuerecords import value_records_class

    commit, abort = struct.pack(">hh", 0, 1), struct.pack(">hh", 0, 0)
    log = b"".join([
        _batch_at(0, [b"a0", b"a1", b"a2"], pid=7),  # committed
        _batch_at(3, [commit], pid=7, control=True),
        _batch_at(4, [b"b4", b"b5", b"b6"], pid=7),  # aborted
        _batch_at(7, [abort], pid=7, control=True),
        _batch_at(8, [b"c8", b"c9"]),  # not transactional
        _batch_at(10, [b"d10", b"d11"], pid=9),  # committed later (no marker in this fetch)
    ])
    aborted = [collections.namedtuple("Aborted", "producer_id first_offset")(7, 4)]
    tp = TopicPartition("t", 0)
    for isolation, fetch_offset in [(IsolationLevel.READ_COMMITTED, 0), (IsolationLevel.READ_UNCOMMITTED, 0),
                                    (IsolationLevel.READ_COMMITTED, 1), (IsolationLevel.READ_UNCOMMITTED, 9)]:
        def read(cls: Any, take: int) -> tuple[list[tuple[int, bytes | None]], int]:
            part = cls(fetch_offset, tp, MemoryRecords(log), isolation_level=isolation,
                       aborted_transactions=list(aborted))
            out = []
            while part:
                got = part.take(take)
                if not got:
                    break
                out += [(r.offset, r.value) if hasattr(r, "offset") else r for r in got]
            if part:  # past the end: the position moves past trailing batches, the records drain
                part.take(take)
            return out, part.next_fetch_offset

        theirs = read(Fetcher.PartitionRecords, 1000)
        assert theirs[0], "the fixture reads something"
        for take in (1, 2, 1000):
            assert read(value_records_class(), take) == theirs, (isolation, fetch_offset, take)
    # kafka-python's own reading, spelt out once: aborted records and markers gone, the position past the last batch
    part = value_records_class()(0, tp, MemoryRecords(log), isolation_level=IsolationLevel.READ_COMMITTED,
                                 aborted_transactions=list(aborted))
    assert [v for _o, v in part.take(100)] == [b"a0", b"a1", b"a2", b"c8", b"c9", b"d10", b"d11"]


def test_the_installed_kafka_python_is_supported():
    # kafka-python 3 is what calmon is tested with; an older one keeps the ordinary (slower) path
    assert supported()


# ---------------------------------------------------------------------------------------------- with a broker
@pytest.fixture(scope="module")
def broker():
    require_broker()
    with KafkaBroker() as b:
        yield b



def _drain(src: KafkaSource, want: int, max_records: int, seconds: float = 60) -> list[Any]:
    batches, got = [], 0
    deadline = time.monotonic() + seconds
    while got < want and time.monotonic() < deadline:
        b = src.read(max_records=max_records, timeout=0.5)
        if b is not None:
            batches.append(b)
            got += len(b.records)
    return batches


@pytest.mark.integration
@pytest.mark.parametrize("codec", ["gzip", None])
def test_kafka_python_reads_values_without_a_consumer_record_each(broker, codec, monkeypatch):
    """Every record once, in offset order per partition, batches ending inside record batches, exact positions;
    kafka-python's ``ConsumerRecord`` is never built (it is, with ``metadata``)."""
    from kafka import KafkaProducer
    from kafka.consumer import fetcher

    topic = f"values-{codec}-{uuid.uuid4().hex[:6]}"
    broker.create_topic(topic, partitions=2)
    p = KafkaProducer(bootstrap_servers=broker.bootstrap, linger_ms=20, batch_size=1 << 16, compression_type=codec)
    sent: dict[str, bytes | None] = {}
    futures = []
    for i in range(5000):
        v = None if i % 997 == 0 else b"x" * (i % 300)  # null values, empty values, two-byte lengths
        futures.append((v, p.send(topic, v, key=b"k%d" % i, headers=[("model", b"m")], partition=i % 2)))
    p.flush(timeout=60)
    for v, fut in futures:
        md = fut.get(timeout=30)
        sent[f"{topic}/{md.partition}@{md.offset}"] = v
    p.close()

    built = []
    real = fetcher.ConsumerRecord
    monkeypatch.setattr(fetcher, "ConsumerRecord", lambda *a: built.append(1) or real(*a))
    src = KafkaSource(broker.bootstrap, topic, None)
    try:
        batches = _drain(src, 5000, max_records=333)  # 333: takes end inside the producer's record batches
        raw = getattr(src._consumer, "raw_values", False)
    finally:
        src.close()
    assert len(built) == 0, f"{len(built)} ConsumerRecords built"
    assert raw
    seen: dict[str, bytes | None] = {}
    position: dict[str, int] = {}
    for b in batches:
        assert len(b.records) <= 333
        for i, r in enumerate(b.records):
            key, off = b.origins[i].rsplit("@", 1)
            assert int(off) == position.get(key, 0)
            position[key] = int(off) + 1
            seen[b.origins[i]] = r
        assert b.position == position
    assert seen == {o: (b"" if v is None else v) for o, v in sent.items()}

    with_meta = KafkaSource(broker.bootstrap, topic, None, metadata=True)  # kafka-python's own records
    try:
        meta_batches = _drain(with_meta, 5000, max_records=65536)
    finally:
        with_meta.close()
    assert built  # the metadata path does build them
    assert {b.origins[i]: r for b in meta_batches for i, r in enumerate(b.records)} == seen
    assert meta_batches[-1].position == position
