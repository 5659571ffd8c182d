"""Batch consumption of the Kafka source (issue #33.1): runs of records per partition instead of one object per record.

A poll becomes a :class:`connectors.kafka.clients.Fetched` (the values in one list, one
:class:`connectors.kafka.origins.Run` per run of consecutive records of one partition); positions, gaps and
origins are kept per run.  The tests without a broker drive :class:`KafkaSource` through a scripted client
(batches spanning partitions, a partition revoked between two polls, non-contiguous offsets, collection paused
while a poll becomes a batch, the library picked by the configuration); the ones marked ``integration`` read a
real broker (``tests/kafka_broker.py``) with both clients: batches ending mid-partition, poison records inside
them rejected with their exact origin, and a restart from any batch's position reading exactly the rest.
"""

from __future__ import annotations

import gc
import json
import sys
import time
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import Any, ClassVar

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from kafka_broker import KafkaBroker, require_broker, source_classes  # noqa: E402

from calmon.events.decoder import Decoder  # noqa: E402
from connectors.base import RecordMeta  # noqa: E402
from connectors.kafka import ConfluentKafkaSource, KafkaSource  # noqa: E402
from connectors.kafka import settings as settings_module  # noqa: E402
from connectors.kafka import source as source_module  # noqa: E402
from connectors.kafka.clients import ConsumerEvents, ConsumerSettings, Fetched  # noqa: E402
from connectors.kafka.origins import Run, RunOrigins  # noqa: E402
from connectors.kafka.positions import TP  # noqa: E402
from connectors.kafka.settings import pick_library, split_source_config  # noqa: E402

T0, T1 = TP("t", 0), TP("t", 1)


# ---------------------------------------------------------------------------------------------- a scripted client
class Scripted:
    """A :class:`~connectors.kafka.clients.ConsumerClient` whose polls return the test's :class:`Fetched` in turn."""

    library = "scripted"
    script: ClassVar[list[Fetched]] = []
    assign: ClassVar[list[TP]] = [T0, T1]
    gc_during_poll: ClassVar[list[bool]] = []

    def __init__(self, settings: ConsumerSettings) -> None:
        self.settings = settings
        self.seeks: list[tuple[TP, int]] = []

    @staticmethod
    def check_options(options: Mapping[str, Any] | None) -> dict[str, Any]:
        return dict(options or {})

    @staticmethod
    def check_extra(extra: Mapping[str, Any]) -> dict[str, Any]:
        return dict(extra)

    def config(self) -> dict[str, Any]:
        return {}

    def start(self, handler: ConsumerEvents, timeout: float) -> None:
        handler.on_assigned(list(self.assign))

    def poll(self, max_records: int, timeout: float) -> Fetched:
        Scripted.gc_during_poll.append(gc.isenabled())
        return Scripted.script.pop(0) if Scripted.script else Fetched()

    def committed(self, tps: list[TP], timeout: float) -> dict[TP, int]:
        return {}

    def commit(self, offsets: Mapping[TP, int], timeout: float) -> None:
        pass

    def seek(self, tp: TP, offset: int) -> None:
        self.seeks.append((tp, offset))

    def pause(self, tps: list[TP]) -> None:
        pass

    def resume(self, tps: list[TP]) -> None:
        pass

    def highwater(self, tp: TP) -> int | None:
        return None

    def beginning_offset(self, tp: TP, timeout: float) -> int:
        return 0

    @property
    def connected(self) -> bool:
        return True

    def close(self, timeout: float) -> None:
        pass


class ScriptedSource(KafkaSource):
    ADAPTER = Scripted


def _fetched(*parts: tuple[TP, list[int]], metas: bool = False) -> Fetched:
    """A poll delivering, in this order, the records of each ``(tp, offsets)`` (value ``b"<key>@<offset>"``)."""
    out = Fetched(metas=[] if metas else None)
    for tp, offsets in parts:
        values: list[bytes | None] = [f"{tp.key}@{o}".encode() for o in offsets]
        out.add(tp, values, offsets[0], offsets[-1], lambda offsets=offsets: offsets)
        if out.metas is not None:
            out.metas += [RecordMeta(timestamp_ms=o, key=tp.key.encode()) for o in offsets]
    return out


@pytest.fixture
def scripted():
    Scripted.script, Scripted.assign, Scripted.gc_during_poll = [], [T0, T1], []
    src = ScriptedSource("h:1", "t", None, metadata=True)
    yield src
    src.close()


def _spelt(batch: Any) -> list[str]:
    """What each record of a scripted batch says it is (its value), to compare with its origin."""
    return [r.decode() for r in batch.records]


# ---------------------------------------------------------------------------------------------- without a broker
def test_a_batch_spanning_partitions_keeps_delivery_order_positions_and_origins(scripted):
    # one poll: t/0 0..2, t/1 0..1, then t/0 again 3..4 (two fetch responses of t/0 in one poll)
    Scripted.script = [_fetched((T0, [0, 1, 2]), (T1, [0, 1]), (T0, [3, 4]), metas=True)]
    b = scripted.read(100, 1.0)
    assert b is not None
    assert _spelt(b) == ["t/0@0", "t/0@1", "t/0@2", "t/1@0", "t/1@1", "t/0@3", "t/0@4"]
    assert isinstance(b.origins, RunOrigins)  # one entry per run, not a string per record
    assert [b.origins[i] for i in range(len(b.records))] == _spelt(b) and b.origins[-1] == "t/0@4"
    assert list(b.origins) == _spelt(b)  # iterated: spelt out, the same
    assert b.position == {"t/0": 5, "t/1": 2} == scripted.position()
    assert [m.timestamp_ms for m in b.meta] == [0, 1, 2, 0, 1, 3, 4]
    assert scripted.stats.records == 7 and scripted.stats.skipped_offsets == 0


def test_a_partition_revoked_between_polls_loses_nothing_and_counts_nothing_twice(scripted):
    Scripted.script = [_fetched((T0, [0, 1]), (T1, [0, 1])),
                       _fetched((T1, [2, 3]), (T0, [2, 3]), metas=True),  # fetched before the revoke below
                       _fetched((T1, [2, 3]))]  # after the partition came back at its position
    assert _spelt(scripted.read(100, 1.0)) == ["t/0@0", "t/0@1", "t/1@0", "t/1@1"]
    scripted.on_revoked([T1])
    b = scripted.read(100, 1.0)
    assert _spelt(b) == ["t/0@2", "t/0@3"]  # t/1's run dropped: it belongs to its new owner now
    assert [b.origins[i] for i in range(2)] == ["t/0@2", "t/0@3"] and [m.timestamp_ms for m in b.meta] == [2, 3]
    assert b.position == {"t/0": 4, "t/1": 2}  # t/1 keeps the position of the records counted here
    scripted.on_assigned([T1])  # back: positioned at 2 before any record of it is taken
    b = scripted.read(100, 1.0)
    assert _spelt(b) == ["t/1@2", "t/1@3"] and b.position == {"t/0": 4, "t/1": 4}
    assert (T1, 2) in scripted._consumer.seeks


def test_offsets_that_jump_are_kept_per_record_and_counted(scripted):
    # compaction or transaction markers: offsets 0, 1, 5, 6 in one run; then the partition jumps to 10
    Scripted.script = [_fetched((T0, [0, 1, 5, 6])), _fetched((T0, [10]))]
    b = scripted.read(100, 1.0)
    assert [b.origins[i] for i in range(4)] == ["t/0@0", "t/0@1", "t/0@5", "t/0@6"] and b.position == {"t/0": 7}
    b = scripted.read(100, 1.0)
    assert b.origins[0] == "t/0@10" and b.position == {"t/0": 11} and scripted.stats.skipped_offsets == 3


def test_a_poll_becomes_a_batch_with_collection_paused(scripted):
    # the client's per-record objects die by reference counting, not in collections that promote them to the
    # old generation of the agent's state (fails without calmon.formats.collection.collection_paused in the source)
    Scripted.script = [_fetched((T0, [0, 1]))]
    assert scripted.read(100, 1.0) is not None
    assert Scripted.gc_during_poll and not any(Scripted.gc_during_poll) and gc.isenabled()
    gc.disable()
    try:  # an application that manages collection itself is left alone
        Scripted.script = [_fetched((T0, [2]))]
        scripted.read(100, 1.0)
        assert not gc.isenabled()
    finally:
        gc.enable()


def test_null_values_and_the_origins_list():
    f = Fetched.of_partition(T0, [b"a", None, b"c"], [7, 8, 9])
    assert f.values == [b"a", b"", b"c"] and f.runs == [Run(T0, 0, 3, 7)]
    o = RunOrigins([Run(T0, 0, 2, 7), Run(T1, 2, 3, 0, [4])])
    assert len(o) == 3 and o[-3] == "t/0@7" and o[2] == "t/1@4"
    with pytest.raises(IndexError):
        o[3]
    copied: list[str] = []
    copied += o  # what the cluster's partition buffers do with a batch's origins
    assert copied == ["t/0@7", "t/0@8", "t/1@4"] == o and json.dumps(o) == json.dumps(copied)
    assert not RunOrigins([]) and list(RunOrigins([])) == []


def test_the_library_follows_the_configuration():
    base = {"bootstrap_servers": "h:1", "topic": "t"}
    assert pick_library(split_source_config(base), confluent=True) == "confluent"
    assert pick_library(split_source_config(base), confluent=False) == "kafka-python"
    assert pick_library(split_source_config({**base, "client": {"max_poll_interval_ms": 1}}), True) == "kafka-python"
    assert pick_library(split_source_config({**base, "library": "kafka-python"}), True) == "kafka-python"
    with pytest.raises(ValueError, match=r"^library: options \['fetch.wait.max.ms'\].*\['ssl_cafile'\]"):
        pick_library(split_source_config({**base, "fetch.wait.max.ms": 5, "ssl_cafile": "x"}), True)


def test_confluent_kafka_is_the_default_when_installed(monkeypatch):
    pytest.importorskip("confluent_kafka")
    # before #33 a source without 'library' was always kafka-python's
    assert type(KafkaSource.from_config({"bootstrap_servers": "h:1", "topic": "t"})) is ConfluentKafkaSource
    assert type(KafkaSource.from_config({"bootstrap_servers": "h:1", "topic": "t", "ssl_cafile": "ca.pem"})) \
        is KafkaSource
    monkeypatch.setattr(source_module, "confluent_installed", lambda: False)
    monkeypatch.setattr(settings_module, "confluent_installed", lambda: False)
    assert type(KafkaSource.from_config({"bootstrap_servers": "h:1", "topic": "t"})) is KafkaSource  # the fallback
    with pytest.raises(ValueError, match=r"^library: confluent-kafka is not installed"):
        KafkaSource.from_config({"bootstrap_servers": "h:1", "topic": "t", "library": "confluent"})


def _confluent_over(messages: list[Any]) -> tuple[Any, list[str]]:
    """A ``ConfluentConsumer`` whose consume returns ``messages``, and the list its error events go to."""
    from connectors.kafka.confluent import ConfluentConsumer

    errors: list[str] = []

    class Consumer:
        def consume(self, num_messages: int, timeout: float) -> list[Any]:
            return messages

        def assignment(self) -> list[Any]:
            return []

    class Events:
        def on_error(self, message: str, counted: bool) -> None:
            errors.append(message)

    c = ConfluentConsumer(ConsumerSettings("h:1", ["a", "b"], None, "s"))
    c._consumer, c._handler = Consumer(), Events()  # type: ignore[assignment]
    return c, errors


def test_confluent_adapter_cuts_a_consume_into_runs_without_a_record_object():
    ck = pytest.importorskip("confluent_kafka")

    def msg(topic: str, part: int, off: int, value: bytes | None = b"v") -> Any:
        return ck.Message(topic=topic, partition=part, offset=off, value=value)

    got = [msg("a", 0, 5), msg("a", 0, 6), msg("b", 0, 0, None), msg("b", 0, 1), msg("a", 1, 9),
           ck.Message(topic="a", partition=1, offset=10, error=ck.KafkaError(ck.KafkaError._PARTITION_EOF)),
           msg("a", 1, 12), msg("a", 0, 7)]

    c, errors = _confluent_over(got)
    f = c.poll(100, 0.1)
    assert f.values == [b"v", b"v", b"", b"v", b"v", b"v", b"v"] and f.metas is None
    assert [(r.tp.key, r.start, r.stop, r.first, r.last) for r in f.runs] == [
        ("a/0", 0, 2, 5, 6), ("b/0", 2, 4, 0, 1), ("a/1", 4, 6, 9, 12), ("a/0", 6, 7, 7, 7)]
    assert f.runs[2].offsets == [9, 12] and f.runs[0].offsets is None  # offsets kept only where they jump
    assert errors == []  # end of partition is not an error
    assert str(RunOrigins(f.runs)) == str(["a/0@5", "a/0@6", "b/0@0", "b/0@1", "a/1@9", "a/1@12", "a/0@7"])


def test_confluent_adapter_per_batch_passes_equal_a_record_by_record_reading():
    """The adapter's few C-level passes over a consume give what reading record by record gives: the same values
    (nulls as b""), runs, offsets, origins and next positions; error events are reported and dropped, end of
    partition silently. 20,000 messages of two topics, interleaved in runs, with offset gaps and nulls."""
    ck = pytest.importorskip("confluent_kafka")
    import random

    from connectors.kafka.partitions import PartitionBook

    rng = random.Random(33)
    nxt: dict[tuple[str, int], int] = {}
    got: list[Any] = []
    while len(got) < 20000:
        topic, part = rng.choice(["a", "b"]), rng.randrange(3)
        for _ in range(rng.randrange(1, 400)):
            off = nxt.get((topic, part), 0) + (rng.randrange(2, 5) if rng.random() < 0.01 else 1)  # gaps
            nxt[(topic, part)] = off
            if rng.random() < 0.001:
                code = ck.KafkaError._PARTITION_EOF if rng.random() < 0.5 else ck.KafkaError._TRANSPORT
                got.append(ck.Message(topic=topic, partition=part, offset=off, error=ck.KafkaError(code)))
            else:
                value = None if rng.random() < 0.01 else f"{topic}{part}@{off}".encode()
                got.append(ck.Message(topic=topic, partition=part, offset=off, value=value))
    records = [m for m in got if m.error() is None]
    transport = sum(1 for m in got if m.error() is not None and m.error().code() == ck.KafkaError._TRANSPORT)

    c, errors = _confluent_over(got)
    f = c.poll(len(got), 0.1)
    assert len(errors) == transport > 0
    assert f.values == [b"" if m.value() is None else m.value() for m in records]
    assert list(RunOrigins(f.runs)) == [f"{m.topic()}/{m.partition()}@{m.offset()}" for m in records]
    # a run is one partition's consecutive messages, and offsets are listed only where they jump
    assert [(r.start, r.stop) for r in f.runs] == [
        (i, j) for i, j in _groups([(m.topic(), m.partition()) for m in records])]
    for r in f.runs:
        offs = [m.offset() for m in records[r.start:r.stop]]
        assert r.first == offs[0] and r.last == offs[-1]
        assert (r.offsets is None) == (offs == list(range(offs[0], offs[-1] + 1)))
    # the book's positions after the batch: each partition's last offset + 1, as per-record tracking gives
    book = PartitionBook()
    tps = sorted({r.tp for r in f.runs})
    book.assign(tps)
    book.positioned(tps)
    expected: dict[str, int] = {}
    for m in records:
        expected[f"{m.topic()}/{m.partition()}"] = m.offset() + 1
    assert book.take(f, origins=False).position == expected


def _groups(keys: list[Any]) -> list[tuple[int, int]]:
    """``(start, stop)`` of each run of equal consecutive keys."""
    out, start = [], 0
    for i in range(1, len(keys) + 1):
        if i == len(keys) or keys[i] != keys[start]:
            out.append((start, i))
            start = i
    return out


def test_confluent_prefetches_four_batches_unless_the_user_says_otherwise():
    from connectors.kafka.confluent import ConfluentConsumer

    plain = ConfluentConsumer(ConsumerSettings("h:1", ["a"], None, "s")).config()
    assert plain["queued.min.messages"] == 4 * 65536 and plain["fetch.queue.backoff.ms"] == 20
    mine = ConfluentConsumer(ConsumerSettings("h:1", ["a"], None, "s", options={"queued.min.messages": 1000,
                                                                               "fetch.queue.backoff.ms": 500}))
    assert mine.config()["queued.min.messages"] == 1000 and mine.config()["fetch.queue.backoff.ms"] == 500


# ---------------------------------------------------------------------------------------------- with a broker
@pytest.fixture(scope="module")
def broker():
    require_broker()
    with KafkaBroker() as b:
        yield b



CLIENT = {KafkaSource: {}, ConfluentKafkaSource: {}}
POISON = {401, 1234, 2999}  # record numbers sent as garbage; 2999 is the last record of its partition


@pytest.mark.integration
@pytest.mark.parametrize("cls", source_classes(), ids=lambda c: c.ADAPTER.library)
def test_batches_end_mid_partition_poison_records_keep_their_origin_and_restarts_resume_exactly(broker, cls):
    from kafka import KafkaProducer

    topic = f"batches-{cls.ADAPTER.library}-{uuid.uuid4().hex[:6]}"
    broker.create_topic(topic, partitions=3)
    sent: dict[str, bytes] = {}  # origin -> value, as the broker numbers them
    p = KafkaProducer(bootstrap_servers=broker.bootstrap, linger_ms=5)
    futures = []
    for i in range(3000):
        v = b"\xff not json" if i in POISON else json.dumps({"id": f"e{i}", "model": "m", "score": 0.5}).encode()
        futures.append((v, p.send(topic, v, partition=i % 3)))
    p.flush(timeout=60)
    for v, fut in futures:
        md = fut.get(timeout=30)
        sent[f"{topic}/{md.partition}@{md.offset}"] = v
    p.close()
    poison_origins = {o for o, v in sent.items() if v.startswith(b"\xff")}

    def drain(src: KafkaSource, want: int) -> list[Any]:
        batches, got = [], 0
        deadline = time.monotonic() + 60
        while got < want and time.monotonic() < deadline:
            b = src.read(max_records=700, timeout=0.5)  # 700: batches end in the middle of partitions
            if b is not None:
                batches.append(b)
                got += len(b.records)
        return batches

    src = cls(broker.bootstrap, topic, None, client=CLIENT[cls])
    try:
        batches = drain(src, 3000)
    finally:
        src.close()
    seen: dict[str, bytes] = {}
    position: dict[str, int] = {}
    dec = Decoder()
    rejected: set[str] = set()
    for b in batches:
        origins = [b.origins[i] for i in range(len(b.records))]
        assert len(b.origins) == len(b.records) and list(b.origins) == origins
        for o, r in zip(origins, b.records):
            key, off = o.rsplit("@", 1)
            assert int(off) == position.get(key, 0), "offsets of a partition follow each other across batches"
            position[key] = int(off) + 1
            seen[o] = r
        assert b.position == position  # the exact next offset per partition, after every batch
        out = dec.decode(b.records, b.origins, b.meta)
        assert {r.reason for r in out.rejected} <= {"not_json"}
        rejected |= {r.origin for r in out.rejected}
    assert seen == sent  # every record once, with its own origin
    assert rejected == poison_origins
    assert position == {f"{topic}/{k}": 1000 for k in range(3)}

    # a restart from the position after any batch reads exactly the records after it
    cut = batches[len(batches) // 2].position
    src = cls(broker.bootstrap, topic, None, client=CLIENT[cls])
    try:
        src.seek(cut)
        rest = drain(src, 3000 - sum(cut.get(f"{topic}/{k}", 0) for k in range(3)))
    finally:
        src.close()
    after = {b.origins[i]: r for b in rest for i, r in enumerate(b.records)}
    assert set(after) == {o for o in sent if int(o.rsplit("@", 1)[1]) >= cut.get(o.rsplit("@", 1)[0], 0)}
    assert rest[-1].position == position
