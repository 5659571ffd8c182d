"""calmon.client: events emitted by serving code are what calmon reads, over rotating files and Kafka."""

from __future__ import annotations

import contextlib
import io
import json
import os
import sys
import threading
import time
import uuid
from collections import Counter
from datetime import datetime, timezone
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from kafka_broker import KafkaBroker, free_port, require_broker  # noqa: E402

from calmon import cli  # noqa: E402
from calmon.client import Emitter, InvalidEventError, KafkaSink, RotatingFileSink  # noqa: E402
from calmon.events.decoder import Decoder  # noqa: E402
from connectors.files import FileSource  # noqa: E402

T0 = 1767225600.0


def _check(path: Path) -> dict:
    """``calmon check --json`` in-process (the CLI's own entry point, without a new interpreter)."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert cli.main(["check", str(path), "--json", "--mc", "300"]) == 0
    doc = json.loads(out.getvalue())
    doc.pop("input")
    return doc


def _stream(n: int, k: int, seed: int):
    """Predictions with outcomes that arrive late and out of order (binary k=2 uses score)."""
    rng = np.random.default_rng(seed)
    if k == 2:
        p = rng.beta(2, 2, n)
        preds = [np.float64(min(1.0, x ** 0.8)) for x in p]  # miscalibrated on purpose
        labels = (rng.random(n) < p).astype(np.int64)
    else:
        logits = rng.normal(0, 1.5, (n, k))
        probs = np.exp(logits) / np.exp(logits).sum(1, keepdims=True)
        preds = list(probs)
        labels = np.array([rng.choice(k, p=row) for row in probs], dtype=np.int64)
    order = np.argsort(np.arange(n) + rng.exponential(20, n))  # outcomes of index order[j] arrive j-th
    return preds, labels, order


@pytest.mark.parametrize("k", [2, 3])
def test_emitted_events_give_the_statistics_of_hand_written_ones(tmp_path, k):
    preds, labels, order = _stream(2000, k, seed=k)
    em = Emitter.to_file(tmp_path / "emitted.jsonl", max_bytes=50_000, stamp=False)
    hand = []
    ids = []
    for i, pred in enumerate(preds):
        seg = "eu" if i % 3 else "us"
        if k == 2:
            ids.append(em.prediction("m", score=pred, segment=seg, ts=T0 + i))
            hand.append({"type": "prediction", "id": ids[-1], "model": "m", "ts": T0 + i, "score": float(pred),
                         "segment": seg})
        else:
            ids.append(em.prediction("m", probs=pred, segment=seg, ts=T0 + i))  # a numpy row
            hand.append({"type": "prediction", "id": ids[-1], "model": "m", "ts": T0 + i,
                         "probs": [float(x) for x in pred], "segment": seg})
    # multiclass outcomes name their model: the decoder checks a model-less outcome's label as binary
    model = None if k == 2 else "m"
    for j in order:
        assert em.outcome(ids[j], labels[j], ts=T0 + j + 30, model=model)  # numpy int64 label
        hand.append({"type": "outcome", "id": ids[j], **({"model": model} if model else {}), "ts": T0 + j + 30,
                     "label": int(labels[j])})
    assert em.close()
    assert em.counters() == {"sent": 4000, "dropped_full": 0, "dropped_invalid": 0, "errors": 0, "pending": 0}
    assert len(set(ids)) == 2000 and all(len(i) == 32 for i in ids)
    files = sorted(tmp_path.glob("emitted*.jsonl"))
    assert len(files) > 2  # rotated several times
    joined = tmp_path / "all.jsonl"
    joined.write_bytes(b"".join(f.read_bytes() for f in files))
    (tmp_path / "hand.jsonl").write_text("".join(json.dumps(e) + "\n" for e in hand))
    assert _check(joined) == _check(tmp_path / "hand.jsonl")
    # and the decoder sees the same columns
    emitted_lines = joined.read_bytes().splitlines()
    a = Decoder().decode(emitted_lines)
    b = Decoder().decode([json.dumps(e).encode() for e in hand])
    assert not a.rejected and not b.rejected
    ma, mb = a.models["m"], b.models["m"]
    assert Counter(zip(ma.ids, ma.kind, ma.label, ma.ts)) == Counter(zip(mb.ids, mb.kind, mb.label, mb.ts))
    col = "score" if k == 2 else "probs"
    assert np.array_equal(np.sort(getattr(ma, col), axis=0), np.sort(getattr(mb, col), axis=0), equal_nan=True)


def test_labeled_events_and_numpy_values(tmp_path):
    em = Emitter.to_file(tmp_path / "e.jsonl", clock=lambda: T0, strict=True)
    em.labeled("m", np.float64(1.0), score=np.float32(0.25))
    em.labeled("k3", np.int32(2), probs=np.array([0.2, 0.3, 0.5], dtype=np.float32), segment="a")
    em.prediction("m", score=np.array(0.5), id=np.int64(7), ts=datetime(2026, 1, 1, tzinfo=timezone.utc))
    em.outcome(7, True, ts="2026-01-01T00:01:00Z", model="m")
    em.close()
    lines = (tmp_path / "e.jsonl").read_bytes().splitlines()
    docs = [json.loads(x) for x in lines]
    assert docs[0]["label"] == 1 and docs[0]["score"] == 0.25 and docs[0]["ts"] == T0
    assert docs[1]["probs"] == pytest.approx([0.2, 0.3, 0.5]) and docs[1]["type"] == "labeled"
    assert docs[2]["id"] == 7 and docs[2]["ts"] == T0 and docs[3]["label"] == 1
    dec = Decoder().decode(lines)
    assert not dec.rejected and dec.accepted == 4


# (emitter call, reason) -- each also checked against the decoder on the equivalent raw record
BAD = [
    (lambda em: em.prediction("m", score=1.5), "out_of_range", {"score": 1.5}),
    (lambda em: em.prediction("m", score=-0.1), "out_of_range", {"score": -0.1}),
    (lambda em: em.prediction("m", score=np.nan), "non_finite", None),
    (lambda em: em.prediction("m", score="0.5"), "bad_type", {"score": "0.5"}),
    (lambda em: em.prediction("m"), "missing_field", {}),
    (lambda em: em.prediction("m", score=0.5, probs=[0.5, 0.5]), "bad_type", {"score": 0.5, "probs": [0.5, 0.5]}),
    (lambda em: em.prediction("m", probs=[0.2, 0.2, 0.2]), "probs_sum", {"probs": [0.2, 0.2, 0.2]}),
    (lambda em: em.prediction("m", probs=np.array([0.5, np.inf])), "non_finite", None),
    (lambda em: em.prediction("bad model!", score=0.5), "bad_type", {"model": "bad model!", "score": 0.5}),
    (lambda em: em.prediction("m", score=0.5, segment="x" * 200), "bad_type", {"score": 0.5, "segment": "x" * 200}),
    (lambda em: em.prediction("m", score=0.5, id="i" * 300), "id_too_long", {"score": 0.5, "id": "i" * 300}),
    (lambda em: em.prediction("m", score=0.5, ts=1767225600123), "bad_timestamp", {"score": 0.5,
                                                                                    "ts": 1767225600123}),
    (lambda em: em.prediction("m", score=0.5, ts="yesterday"), "bad_timestamp", {"score": 0.5, "ts": "yesterday"}),
    (lambda em: em.prediction("m", score=0.5, ts="2026-01-01T00:00:00"), "bad_timestamp",
     {"score": 0.5, "ts": "2026-01-01T00:00:00"}),
    (lambda em: em.outcome("r1", -1), "label_range", {"type": "outcome", "label": -1}),
    (lambda em: em.outcome("r1", 0.5), "bad_type", None),
    (lambda em: em.outcome("r1", None), "bad_type", None),
    (lambda em: em.outcome("", 1), "missing_field", {"type": "outcome", "id": "", "label": 1}),
]


def test_invalid_values_are_counted_and_dropped_never_raised(tmp_path):
    em = Emitter.to_file(tmp_path / "e.jsonl")
    for call, _, _ in BAD:
        call(em)  # must not raise
    assert em.prediction("m", score=0.5)
    em.close()
    c = em.counters()
    assert c["dropped_invalid"] == len(BAD) and c["sent"] == 1
    assert em.invalid_reasons() == dict(Counter(reason for _, reason, _ in BAD))
    assert len((tmp_path / "e.jsonl").read_bytes().splitlines()) == 1


@pytest.mark.parametrize("case", range(len(BAD)))
def test_strict_raises_the_reason_the_decoder_would_give(tmp_path, case):
    call, reason, raw = BAD[case]
    em = Emitter.to_file(tmp_path / "e.jsonl", strict=True)
    with pytest.raises(InvalidEventError) as info:
        call(em)
    assert info.value.reason == reason
    if raw is not None:  # the same value sent by hand is rejected by calmon with the same code
        record = {"type": "prediction", "id": "r1", "model": "m", **raw}
        dec = Decoder().decode([json.dumps(record).encode()])
        assert [r.reason for r in dec.rejected] == [reason]
    em.close()


def test_rotation_while_a_follower_reads_loses_and_repeats_nothing(tmp_path):
    n = 20_000
    sink = RotatingFileSink(tmp_path / "events.jsonl", max_bytes=20_000)
    em = Emitter(sink, stamp=False)
    src = FileSource(tmp_path, follow=True, poll_interval=0.01, rotate_grace=5.0)
    got: list[bytes] = []
    done = threading.Event()

    def write() -> None:
        for i in range(n):
            em.prediction("m", score=(i % 101) / 100, id=f"e{i}")
            if i % 2000 == 0:
                time.sleep(0.01)  # let the follower interleave with the rotations
        done.set()

    t = threading.Thread(target=write)
    t.start()
    deadline = time.monotonic() + 120
    while (len(got) < n or not done.is_set()) and time.monotonic() < deadline:
        b = src.read(timeout=0.05)
        if b is not None:
            got.extend(b.records)
    t.join()
    src.close()
    em.close()
    assert sink.rotations > 20
    ids = [json.loads(r)["id"] for r in got]
    assert len(ids) == n and set(ids) == {f"e{i}" for i in range(n)}  # nothing lost, nothing twice
    # a fresh read-once pass over the directory (an agent that was down) finds the same events
    again = FileSource(tmp_path, follow=False)
    records: list[bytes] = []
    while (b := again.read()) is not None:
        records.extend(b.records)
    assert sorted(records) == sorted(got)
    assert [json.loads(r)["id"] for r in records] == [f"e{i}" for i in range(n)]  # rotated names sort in time


def test_concurrent_request_threads_write_whole_lines(tmp_path):
    em = Emitter.to_file(tmp_path / "events.jsonl", max_bytes=10_000)
    threads = [threading.Thread(target=lambda t=t: [em.prediction("m", score=0.5, id=f"t{t}-{i}")
                                                   for i in range(1500)]) for t in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    em.close()
    lines = b"".join(p.read_bytes() for p in tmp_path.iterdir()).splitlines()
    assert sorted(json.loads(x)["id"] for x in lines) == sorted(f"t{t}-{i}" for t in range(4) for i in range(1500))
    assert em.counters()["sent"] == 6000


def test_time_based_rotation_and_reopening(tmp_path):
    now = [0.0]
    sink = RotatingFileSink(tmp_path / "e.jsonl", max_bytes=None, max_age=60, clock=lambda: now[0])
    em = Emitter(sink)
    em.prediction("m", score=0.1)
    now[0] = 59
    em.prediction("m", score=0.2)
    assert sink.rotations == 0
    now[0] = 60
    em.prediction("m", score=0.3)
    assert sink.rotations == 1
    now[0] = 1000
    sink.rotate()
    sink.rotate()  # the active file is empty: no second rotation
    assert sink.rotations == 2
    em.close()
    assert em.prediction("m", score=0.4)  # after close: counted as an error, never raised
    assert em.counters()["errors"] == 1 and em.counters()["sent"] == 3
    names = sorted(p.name for p in tmp_path.iterdir())
    assert len(names) == 3 and names[-1] == "e.jsonl" and (tmp_path / "e.jsonl").stat().st_size == 0
    with pytest.raises(ValueError, match="max_bytes"):
        RotatingFileSink(tmp_path / "x.jsonl", max_bytes=0)
    with pytest.raises(ValueError, match="directory"):
        RotatingFileSink(tmp_path)


def test_rotations_in_the_same_microsecond_keep_time_order(tmp_path, monkeypatch):
    import calmon.client.filesink as filesink

    class Frozen(datetime):
        @classmethod
        def now(cls, tz=None):
            return datetime(2026, 11, 23, 2, 15, tzinfo=timezone.utc)

    monkeypatch.setattr(filesink, "datetime", Frozen)
    sink = RotatingFileSink(tmp_path / "e.jsonl", max_bytes=None)
    for i in range(3):
        sink.write("k", b'{"n":%d}\n' % i)
        sink.rotate()
    sink.write("k", b'{"n":3}\n')
    sink.close()
    names = sorted(p.name for p in tmp_path.iterdir())
    assert [json.loads((tmp_path / name).read_text())["n"] for name in names] == [0, 1, 2, 3]
    assert names[0] == "e-20261123T021500.000000Z.jsonl" and names[-1] == "e.jsonl"


def test_write_errors_are_counted(tmp_path):
    sink = RotatingFileSink(tmp_path / "e.jsonl")
    em = Emitter(sink)
    assert sink._fd is not None
    os.close(sink._fd)  # the descriptor goes bad under the sink (as on a lost disk)
    assert em.prediction("m", score=0.5)
    assert em.counters()["errors"] == 1
    sink._fd = None  # the sink reopens the file on the next write
    em.prediction("m", score=0.5)
    assert em.counters()["sent"] == 1


def test_prometheus_counters(tmp_path):
    from prometheus_client import CollectorRegistry, generate_latest

    reg = CollectorRegistry()
    em = Emitter.to_file(tmp_path / "e.jsonl", registry=reg, name="fraud-api")
    em.prediction("m", score=0.5)
    em.prediction("m", score=2.0)
    text = generate_latest(reg).decode()
    assert 'calmon_client_events_total{emitter="fraud-api",result="sent"} 1.0' in text
    assert 'calmon_client_events_total{emitter="fraud-api",result="dropped_invalid"} 1.0' in text
    assert 'calmon_client_pending{emitter="fraud-api"} 0.0' in text
    em.close()


def test_kafka_queue_policies_without_a_broker():
    newest = KafkaSink("127.0.0.1:1", "t", queue_size=3, policy="drop_newest", start=False)
    oldest = KafkaSink("127.0.0.1:1", "t", queue_size=3, policy="drop_oldest", start=False)
    for i in range(5):
        newest.write(str(i), b"%d\n" % i)
        oldest.write(str(i), b"%d\n" % i)
    assert [v for _, v in newest._queue] == [b"0", b"1", b"2"]
    assert [v for _, v in oldest._queue] == [b"2", b"3", b"4"]
    assert newest.counters()["dropped_full"] == oldest.counters()["dropped_full"] == 2
    assert newest.close(timeout=0) is False and newest.counters()["errors"] == 3
    with pytest.raises(ValueError, match="policy"):
        KafkaSink("127.0.0.1:1", "t", policy="block")
    with pytest.raises(ValueError, match="sasl_mechansim"):
        KafkaSink("127.0.0.1:1", "t", producer_config={"sasl_mechansim": "PLAIN"}, start=False)
    assert KafkaSink("127.0.0.1:1", "t", producer_config={"acks": 1}, start=False).config["acks"] == 1


@pytest.mark.parametrize("policy", ["drop_newest", "drop_oldest"])
def test_kafka_unreachable_broker_drops_and_counts_instead_of_blocking(policy):
    # nothing listens on this port: every connection attempt fails; the caller must never wait for it
    n, size = 5000, 100
    em = Emitter.to_kafka(f"127.0.0.1:{free_port()}", "events", queue_size=size, policy=policy)
    t0 = time.monotonic()
    for i in range(n):
        em.prediction("m", score=0.5, id=f"e{i}")
    emitting = time.monotonic() - t0
    c = em.counters()
    assert c["sent"] == 0 and c["pending"] <= size + 500 and c["dropped_full"] >= n - size - 500
    t1 = time.monotonic()
    assert em.close(timeout=0.5) is False
    closing = time.monotonic() - t1
    c = em.counters()
    assert c["sent"] + c["dropped_full"] + c["errors"] == n and c["pending"] == 0
    # one blocked send would take max_block_ms (1 s) and 5000 of them over an hour: these bounds only
    # separate "never waits for the broker" from "waits for it", not fast from slow
    assert emitting < 30 and closing < 10


@pytest.fixture(scope="module")
def broker():
    require_broker()
    with KafkaBroker() as b:
        yield b


@pytest.mark.integration
def test_kafka_sink_delivers_everything_keyed_by_id(broker):
    from kafka import KafkaConsumer

    topic = f"client-{uuid.uuid4().hex[:8]}"
    broker.create_topic(topic, partitions=3)
    n = 3000
    em = Emitter.to_kafka(broker.bootstrap, topic, batch_size=256, stamp=False)
    ids = [em.prediction("m", score=(i % 11) / 10, ts=T0 + i) for i in range(n)]
    for i in reversed(range(n)):
        em.outcome(ids[i], i % 2)
    assert em.flush(timeout=60)
    assert em.close(timeout=10)
    assert em.counters() == {"sent": 2 * n, "dropped_full": 0, "dropped_invalid": 0, "errors": 0, "pending": 0}
    consumer = KafkaConsumer(topic, bootstrap_servers=broker.bootstrap, auto_offset_reset="earliest",
                             enable_auto_commit=False, consumer_timeout_ms=5000)
    records: list = []
    deadline = time.monotonic() + 60
    while len(records) < 2 * n and time.monotonic() < deadline:
        for r in consumer:
            records.append(r)
    consumer.close()
    assert len(records) == 2 * n
    partition_of: dict[str, set[int]] = {}
    values = []
    for r in records:
        doc = json.loads(r.value)
        assert r.key.decode() == doc["id"]  # keyed by the prediction id
        partition_of.setdefault(doc["id"], set()).add(r.partition)
        values.append(r.value)
    assert set(partition_of) == set(ids)
    assert all(len(p) == 1 for p in partition_of.values())  # prediction and outcome co-partitioned
    assert len({p for s in partition_of.values() for (p,) in [tuple(s)]}) == 3
    dec = Decoder().decode(values)
    assert not dec.rejected and dec.accepted == 2 * n


def _in_child(fn) -> dict:
    """Run ``fn()`` in a forked child; return the JSON it reports through a pipe."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: report and leave without running pytest's exit handlers
        try:
            os.write(w, json.dumps(fn()).encode())
        finally:
            os._exit(0)
    os.close(w)
    with os.fdopen(r, "rb") as f:
        data = f.read()
    os.waitpid(pid, 0)
    return json.loads(data)


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork()")
def test_forked_workers_get_their_own_file_and_queue(tmp_path):
    em = Emitter.to_file(tmp_path / "events-{pid}.jsonl")
    em.prediction("m", score=0.1, id="parent-1")

    def child() -> dict:
        em.prediction("m", score=0.2, id="child-1")
        em.close()
        return {"pid": os.getpid(), **em.counters()}

    c = _in_child(child)
    em.prediction("m", score=0.3, id="parent-2")
    em.close()
    assert c["sent"] == 1 and em.counters()["sent"] == 2
    mine = (tmp_path / f"events-{os.getpid()}.jsonl").read_text().splitlines()
    theirs = (tmp_path / f"events-{c['pid']}.jsonl").read_text().splitlines()
    assert [json.loads(x)["id"] for x in mine] == ["parent-1", "parent-2"]
    assert [json.loads(x)["id"] for x in theirs] == ["child-1"]

    sink = KafkaSink(f"127.0.0.1:{free_port()}", "t", queue_size=10)
    for i in range(5):
        sink.write(str(i), b"{}")

    def kafka_child() -> dict:
        before = sink.counters()
        sink.write("c", b"{}")
        return {"before": before, "after": sink.counters(), "thread": sink._thread.is_alive()}

    k = _in_child(kafka_child)
    assert k["before"]["pending"] == 0 and k["after"]["pending"] == 1 and k["thread"]  # the parent's 5 stay its own
    assert sink.counters()["pending"] == 5
    sink.close(timeout=0)


@pytest.mark.integration
def test_calmon_run_follows_the_rotating_files(tmp_path):
    """A real agent follows the directory while the emitter rotates: every event counted once."""
    import re
    import signal
    import subprocess
    import urllib.request

    from prometheus_client.parser import text_string_to_metric_families

    logs = tmp_path / "logs"
    em = Emitter.to_file(logs / "events.jsonl", max_bytes=40_000)
    cfg = tmp_path / "calmon.yaml"
    cfg.write_text(f"""
state_dir: {tmp_path / 'state'}
sources: [{{name: app, path: {logs}, follow: true}}]
windows: {{names: [all]}}
evaluation: {{every: 1h, tests: []}}
exporter: {{port: 0}}
""")
    proc = subprocess.Popen([sys.executable, "-m", "calmon", "run", "-c", str(cfg)], stderr=subprocess.PIPE,
                            text=True, cwd=Path(__file__).resolve().parents[1])
    assert proc.stderr is not None
    try:
        text = ""
        while "serving" not in text and proc.poll() is None:
            text += proc.stderr.readline()
        m = re.search(r"serving (http://\S+)/metrics", text)
        assert m, text
        rng = np.random.default_rng(0)
        n = 0
        for _ in range(6):  # bursts while the agent follows
            for p in rng.random(1000):
                em.labeled("m", int(rng.random() < p), score=p)
                n += 1
            time.sleep(0.2)
        em.close()
        assert em.counters()["sent"] == n and em.sink.rotations > 5  # type: ignore[attr-defined]
        def counts() -> tuple[float | None, float | None]:
            with urllib.request.urlopen(f"{m.group(1)}/metrics", timeout=10) as r:
                samples = {(s.name, tuple(sorted(s.labels.items()))): s.value
                           for f in text_string_to_metric_families(r.read().decode()) for s in f.samples}
            return (samples.get(("calmon_events_total", (("model", "m"), ("type", "labeled")))),
                    samples.get(("calmon_source_records_total", (("source", "app"),))))

        deadline = time.monotonic() + 120
        while (counts()[0] or 0) < n and time.monotonic() < deadline:
            time.sleep(0.3)
        time.sleep(1.0)  # a repeated record would arrive after the last one
        assert counts() == (n, n)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.stderr.close()
