"""Internal topics are input too (#31.3): a bad state, delta or snapshot record is counted by reason, logged
once and skipped -- never a crash loop -- and the evaluator admits models and segments from deltas as the ingest
stage admits them from events.  Unit tests of every decode path (no broker); the broker scenarios are at the end."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from test_cluster import config, partitioned_deltas, traffic  # noqa: E402

from calmon.cluster.deltas import Delta, DeltaError  # noqa: E402
from calmon.cluster.partition import PartitionIngest  # noqa: E402
from calmon.cluster.records import REASONS, BadRecord, BadRecords  # noqa: E402
from calmon.cluster.snapshots import ModelSnapshot, SnapshotError  # noqa: E402
from calmon.cluster.topics import PartitionState, Range, StateStore  # noqa: E402
from calmon.state.buckets import ModelWindows  # noqa: E402
from connectors.base import Batch  # noqa: E402

KEY = "events/0"


def good_state(offset: int = 138) -> dict:
    """A state document as an ingest worker writes it, after one range of partition 0."""
    cfg = config()
    records, _ = traffic(300, models=2)
    mine = [v for q, _, v in records if q == 0]
    part = PartitionIngest(cfg, KEY, "events", None)
    app = part.apply(Batch(mine, {KEY: len(mine)}, "events", [f"{KEY}@{i}" for i in range(len(mine))]),
                     Range(KEY, 0, offset, 100.0, "a"))
    return json.loads(app.state.to_bytes())


def enc(doc) -> bytes:
    return json.dumps(doc).encode()


def changed(doc: dict, path: str, value) -> dict:
    """A deep copy of ``doc`` with the dotted ``path`` set to ``value`` (``None`` as value deletes it)."""
    out = json.loads(json.dumps(doc))
    node = out
    *head, last = path.split(".")
    for k in head:
        node = node[int(k)] if isinstance(node, list) else node[k]
    if value is None:
        del node[last]
    else:
        node[last] = value
    return out


def record(value, key=KEY.encode(), partition=0, offset=0):
    return SimpleNamespace(key=key, value=value, partition=partition, offset=offset)


class FakeReader:
    """A :class:`~calmon.cluster.topics.TopicReader` over a list of records."""

    def __init__(self, records, fetched=None):
        self.records = records
        self.fetched = fetched or {}  # the ends a fetch reports, where the ends given are floors (Tansu)
        self.asked = []

    def read_all(self, visit, timeout=60.0):
        for r in self.records:
            visit(r)

    def fetched_ends(self, floors, timeout=10.0):
        self.asked.append(dict(floors))
        return {k: max(v, self.fetched.get(k, v)) for k, v in floors.items()}

    def read_until(self, partition, end, visit, timeout=30.0):
        self.read_all(visit)


# -- the dead-letter position in the state ---------------------------------------------------------------------
def test_a_state_keeps_a_file_sinks_dead_letter_position():
    """The dead-letter position moved from the intent to the state (#33.2): a new owner seeks the sink there."""
    doc = good_state()
    pos = {"version": 1, "path": "/var/lib/calmon/deadletter.jsonl", "dev": 65024, "ino": 77, "size": 1234}
    st = PartitionState.from_bytes(enc({**doc, "dead_letter": pos}), KEY.encode())
    assert dict(st.dead_letter) == pos
    assert PartitionState.from_bytes(st.to_bytes(), KEY.encode()) == st
    with pytest.raises(BadRecord) as err:
        PartitionState.from_bytes(enc({**doc, "dead_letter": {"dlq/0": [1]}}), KEY.encode())
    assert err.value.reason == "schema"


def test_states_written_before_the_dead_letter_position_still_read():
    old = {k: v for k, v in good_state().items() if k not in ("dead_letter", "version")}
    st = PartitionState.from_bytes(enc(old), KEY.encode())
    assert st.offset == 138 and dict(st.dead_letter) == {}



# -- states ------------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def state_doc():
    return good_state()


def test_a_good_state_round_trips(state_doc):
    st = PartitionState.from_bytes(enc(state_doc), KEY.encode())
    assert st.offset == 138 and st.source == KEY
    assert PartitionState.from_bytes(st.to_bytes()) == st


@pytest.mark.parametrize("edit, reason", [
    (lambda d: b"garbage", "not_json"),
    (lambda d: b'"just a string"', "format"),  # the old reader: AttributeError ('str' has no 'get')
    (lambda d: enc(d)[: len(enc(d)) // 2], "not_json"),  # truncated
    (lambda d: enc({**d, "format": "calmon.intent"}), "format"),
    (lambda d: enc({**d, "version": 9}), "version"),
    (lambda d: enc({**d, "offset": "138"}), "schema"),
    (lambda d: enc({**d, "offset": -1}), "schema"),
    (lambda d: enc({**d, "join": [1]}), "schema"),  # the old reader: dict([1]) TypeError deep inside
    (lambda d: enc(changed(d, "join.pending", None)), "schema"),
    (lambda d: enc(changed(d, "join.pending.ts", ["x"])), "schema"),
    (lambda d: enc(changed(d, "join.early.ids", ["a", "b"])), "schema"),  # columns of different lengths
    (lambda d: enc(changed(d, "decoder.models", {"m": "2"})), "schema"),
    (lambda d: enc({**d, "source": "events/1"}), "key_mismatch"),
    (lambda d: enc({**d, "pad": "x" * (16 << 20)}), "too_large"),
])
def test_a_bad_state_record_gets_its_reason(state_doc, edit, reason):
    with pytest.raises(BadRecord) as err:
        PartitionState.from_bytes(edit(state_doc), KEY.encode())
    assert err.value.reason == reason
    assert "\n" not in str(err.value)


def test_the_state_store_keeps_the_most_advanced_valid_states(state_doc):
    store = StateStore.__new__(StateStore)
    store.topic, store.bad = "state", BadRecords("ingest", "w")
    at = {o: enc({**state_doc, "offset": o}) for o in (100, 138, 200, 300, 5000)}
    store.reader = FakeReader([record(at[100]), record(at[138]), record(b"[1]"), record(at[200]), record(at[5000]),
                               record(enc({**state_doc, "offset": 10**12})), record(at[300], key=b"events/1"),
                               record(at[138])])
    got = store.candidates([KEY], ends={KEY: 1000})
    assert [s.offset for s in got[KEY]] == [200, 138, 100]
    assert store.bad.counts == {("state", "format"): 1, ("state", "beyond_end"): 2}
    assert store.load([KEY], ends={KEY: 1000})[KEY].offset == 200
    assert store.load([KEY])[KEY].offset == 10**12  # (without ends nothing can be said about the offset)


def test_a_state_past_an_end_offset_that_is_only_a_floor_is_kept_when_a_fetch_shows_the_end(state_doc):
    """Tansu answers ListOffsets with the base offset of the last batch + 1, below the end when that batch holds
    several records, and a new owner has fetched nothing yet: a valid state past that floor was skipped as
    ``beyond_end``, an older one restored, and its committed ranges committed again -- their dead letters twice
    (the CI-load kill test: 203 dead letters for 200).  Now the end a fetch reports decides."""
    store = StateStore.__new__(StateStore)
    store.topic, store.bad = "state", BadRecords("ingest", "w")
    at = {o: enc({**state_doc, "offset": o}) for o in (100, 138, 200, 5000)}
    store.reader = FakeReader([record(at[100]), record(at[138]), record(at[200]), record(at[5000])],
                              fetched={KEY: 1000})
    got = store.candidates([KEY], ends={KEY: 150})
    assert [s.offset for s in got[KEY]] == [200, 138, 100]
    assert store.bad.counts == {("state", "beyond_end"): 1}  # 5000 is past the fetched end too
    assert store.reader.asked == [{KEY: 150}]
    store.reader.asked.clear()
    assert store.load([KEY], ends={KEY: 10_000})[KEY].offset == 5000
    assert store.reader.asked == []  # nothing past the end given: no fetch


def test_a_state_that_does_not_restore_falls_back_to_the_previous_one(state_doc):
    """A state that fits the schema but not the joiner's loader (forged buffers): counted as ``restore``, the
    partition restarts from the previous valid state (its ranges are processed again)."""
    from calmon.cluster.ingest import IngestWorker

    forged = changed(state_doc, "join.pending", {"ids": ["p"], "models": ["m00"], "ts": [1.0], "segments": [""],
                                                 "widths": [1], "payload": {"dtype": "<f8", "shape": [1],
                                                                            "zlib_b64": "AAAA"}})
    newest = PartitionState.from_bytes(enc({**forged, "offset": 500}))
    previous = PartitionState.from_bytes(enc(state_doc))
    worker = IngestWorker(config())
    worker.source = SimpleNamespace(name="events")
    part = worker._restored(KEY, [newest, previous])
    assert part.next == 138 and part.st.joiner.watermark == previous.join["watermark"]
    assert worker.metrics.bad.counts == {("state", "restore"): 1}
    assert worker._restored(KEY, [newest]).next == 0  # none restores: from the beginning
    assert b'topic="state",reason="restore"} 2' in worker.metrics.render()
    too_many = changed(state_doc, "decoder.names", [f"m{i}" for i in range(200)])  # over limits.max_models
    assert worker._restored(KEY, [PartitionState.from_bytes(enc(too_many))]).next == 0


# -- deltas ------------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def deltas():
    records, _ = traffic(600, models=3)
    return partitioned_deltas(config(), records)


@pytest.mark.parametrize("edit, reason", [
    (lambda d: b"\xff", "not_json"),
    (lambda d: b"[" * 100_000, "not_json"),
    # invalid UTF-8 in a bucket's key (found by the fuzz suite): msgspec's UnicodeDecodeError escaped the reader
    (lambda d: enc(d).replace(b'"bins"', b'"bin\xff"', 1), "not_json"),
    (lambda d: None, "format"),
    (lambda d: enc([d]), "format"),
    (lambda d: enc({**d, "version": 3}), "version"),
    (lambda d: enc({**d, "start": "0"}), "schema"),
    (lambda d: enc({**d, "model": "x" * 200}), "schema"),
    (lambda d: enc({**d, "model": 'a"b'}), "schema"),
    (lambda d: enc({**d, "events": {"forged_kind": 1}}), "schema"),
    (lambda d: enc({**d, "events": {"labeled": -5}}), "schema"),
    (lambda d: enc({**d, "classes": 1}), "schema"),
    (lambda d: enc({**d, "end": d["start"]}), "invalid"),
    (lambda d: enc(changed(d, "buckets.0.bucket", {"format": "calmon.bucket"})), "schema"),
    (lambda d: enc(d)[:-20], "not_json"),
    (lambda d: enc({**d, "pad": "x" * (16 << 20)}), "too_large"),
])
def test_a_bad_delta_record_gets_its_reason(deltas, edit, reason):
    doc = deltas[0].to_dict()
    with pytest.raises(DeltaError) as err:
        Delta.from_bytes(edit(doc))
    assert err.value.reason == reason and reason in REASONS
    assert "\n" not in str(err.value)


def evaluator(tmp_path, **over):
    from calmon.cluster.evaluate import DeltasInput, evaluate_agent
    cfg = config(state_dir=str(tmp_path), cluster={"bootstrap_servers": "127.0.0.1:9"}, **over)
    ev = evaluate_agent(cfg).input
    assert isinstance(ev, DeltasInput)
    return ev


def renamed(delta: Delta, model: str) -> bytes:
    return enc({**delta.to_dict(), "model": model})


def test_the_evaluator_enforces_the_model_cap_on_deltas(tmp_path, deltas):
    """Forged deltas for 300 new models with ``limits.max_models: 10``: at most 10 models, the rest counted
    (the old evaluator created all 300)."""
    ev = evaluator(tmp_path, limits={"max_models": 10})
    forged = [renamed(deltas[0], f"forged{i:03d}") for i in range(300)]
    ev.ingest(Batch(forged, {}, "deltas", [f"calmon-deltas/0@{i}" for i in range(300)]))
    assert len(ev.state.models) == 10
    assert ev.bad.counts == {("delta", "too_many_models"): 290} and ev.bad_deltas == 290
    body = b"".join(c.render() for c in ev.agent.collectors)
    assert b'topic="delta",reason="too_many_models"} 290' in body
    assert b"calmon_cluster_bad_deltas_total" in body
    ev.deltas.close()


def test_the_evaluator_admits_only_declared_models_when_discovery_is_off(tmp_path, deltas):
    ev = evaluator(tmp_path, models={"m00": {"bins": 128, "reservoir": 16, "segments": ["web"]},
                                     "default": {"bins": 128, "reservoir": 16, "segments": ["web"]}},
                   accept_unknown_models=False)
    mine = [d for d in deltas if d.model in ("m00", "m01")]
    ev.ingest(Batch([d.to_bytes() for d in mine], {}, "deltas", [f"calmon-deltas/0@{i}" for i in range(len(mine))]))
    assert set(ev.state.models) == {"m00"}
    assert ev.bad.counts == {("delta", "too_many_models"): sum(d.model == "m01" for d in mine)}
    ev.deltas.close()


def test_a_delta_of_an_unknown_segment_is_refused_whole(tmp_path, deltas):
    """A delta with a bucket of a segment the model is not configured with merges nothing (the old evaluator
    merged the buckets before the bad one, then refused it, and kept the model it had created)."""
    ev = evaluator(tmp_path)
    d = next(d for d in deltas if len(d.buckets) > 2)
    doc = d.to_dict()
    doc["buckets"][-1]["segment"] = "forged"
    ev.ingest(Batch([enc(doc)], {}, "deltas", ["calmon-deltas/0@0"]))
    assert ev.state.models == {} and ev.bad.counts == {("delta", "unknown_segment"): 1}
    other = ModelWindows("x", 2, [(60, 2)], bins=64)  # a bucket of other bins than the model's 128
    doc = d.to_dict()
    doc["buckets"][0]["bucket"] = other.factory().to_packed()
    ev.ingest(Batch([enc(doc)], {}, "deltas", ["calmon-deltas/0@1"]))
    assert ev.state.models == {} and ev.bad.counts[("delta", "incompatible")] == 1
    ev.ingest(Batch([enc({**d.to_dict(), "classes": 3})], {}, "deltas", ["calmon-deltas/0@2"]))
    assert ev.state.models == {} and ev.bad.counts[("delta", "incompatible")] == 2
    ev.ingest(Batch([d.to_bytes()], {}, "deltas", ["calmon-deltas/0@3"]))  # the genuine one still merges
    assert set(ev.state.models) == {d.model} and ev.state.models[d.model].rings["all"].window_sum(None).count > 0
    ev.deltas.close()


def test_a_damaged_or_unfit_format_4_delta_is_counted_by_reason_and_merges_nothing(tmp_path, deltas):
    """Format 4 (one table of cells per record) through the evaluator's input: a forged segment name, grids of
    other bins and a damaged table are each counted by reason, create no model and merge nothing; the genuine
    record still merges."""
    from test_delta_table import frame_of, reframe  # (tests/ is on the path, as for test_cluster_kafka)
    ev = evaluator(tmp_path)
    d = next(d for d in deltas if len(d.buckets) > 2)
    good = d.to_bytes(4, compress=False)
    assert good[4] == 4
    header, arrays = frame_of(good)
    index_ref, _starts, cells_ref, _sums, _rows = header["table"]
    layout = header["layout"]
    bad = [(reframe({**header, "segments": ["forged"] * len(header["segments"])}, arrays), "unknown_segment"),
           (reframe({**header, "layout": [4096, *layout[1:]]}, arrays), "incompatible"),
           (reframe(header, [a[::-1].copy() if i == cells_ref else a for i, a in enumerate(arrays)]), "invalid"),
           (reframe(header, [a[:4].copy() if i == index_ref else a for i, a in enumerate(arrays)]), "schema")]
    for i, (value, reason) in enumerate(bad):
        ev.ingest(Batch([value], {}, "deltas", [f"calmon-deltas/0@{i}"]))
        assert ev.state.models == {} and ev.bad.counts[("delta", reason)] == 1, (reason, ev.bad.counts)
    ev.ingest(Batch([good], {}, "deltas", ["calmon-deltas/0@9"]))
    assert set(ev.state.models) == {d.model} and ev.state.models[d.model].rings["all"].window_sum(None).count > 0
    assert ev.bad_deltas == len(bad)
    ev.deltas.close()


# -- snapshots ---------------------------------------------------------------------------------------------------
def test_a_bad_snapshot_record_gets_its_reason():
    good = ModelSnapshot("m", 1, ModelWindows("m", 2, [(60, 2)], bins=64)).to_bytes()
    for data, reason in ((b"\xff", "not_json"), (b"[" * 100_000, "not_json"), (b"[1]", "format"),
                         (good.replace(b'"version":1', b'"version":2'), "version"),
                         (good.replace(b'"offset":1', b'"offset":"1"'), "schema"),
                         (good.replace(b'"tiers":[[60.0,2]]', b'"tiers":[["x",2]]'), "schema"),
                         (good[:-30], "not_json")):
        with pytest.raises(SnapshotError) as err:
            ModelSnapshot.from_bytes(data)
        assert err.value.reason == reason, (data[:60], err.value)


def test_the_evaluator_does_not_install_snapshots_that_do_not_fit(tmp_path):
    """A snapshot of a model beyond the cap, of unconfigured segments or other bins is skipped with its reason
    (the partition is then replayed from offset 0, where each delta is judged as above)."""
    ev = evaluator(tmp_path, limits={"max_models": 2})
    tiers = ev.state.tiers
    fits = ModelSnapshot("a", 5, ModelWindows("a", 2, tiers, ["web"], bins=128, reservoir=16))
    assert ev._unfit_snapshot(ModelSnapshot.from_bytes(fits.to_bytes())) is None
    assert ev.state.models == {}  # judged, not installed
    segs = ModelSnapshot("b", 5, ModelWindows("b", 2, tiers, ["web", "forged"], bins=128, reservoir=16))
    assert ev._unfit_snapshot(segs).reason == "unknown_segment"
    bins = ModelSnapshot("b", 5, ModelWindows("b", 2, tiers, ["web"], bins=64, reservoir=16))
    assert ev._unfit_snapshot(bins).reason == "incompatible"
    ev.state.windows_of("x", 2), ev.state.windows_of("y", 2)
    assert ev._unfit_snapshot(fits).reason == "too_many_models"
    ev.deltas.close()


def test_a_partition_restore_installs_only_the_snapshots_that_fit(tmp_path):
    """Snapshots of 5 models with ``max_models: 3`` and one of a forged segment: 3 installed, the rest counted, and
    without a manifest the deltas partition is replayed from offset 0."""
    from calmon.cluster.snapshot_store import PartitionSnapshot
    from calmon.cluster.snapshots import Manifest

    ev = evaluator(tmp_path, limits={"max_models": 3})
    tiers = ev.state.tiers

    def snap(name, segments=("web",)):
        return ModelSnapshot(name, 40, ModelWindows(name, 2, tiers, list(segments), bins=128, reservoir=16))

    models = {"bad": snap("bad", ["web", "forged"]), **{f"s{i}": snap(f"s{i}") for i in range(5)}}
    got = PartitionSnapshot(Manifest(50, tuple(models)), models)
    ev._store = SimpleNamespace(topic="snaps", read=lambda part, bad=None: got)
    ev._restore_partition("calmon-deltas/1")
    assert sorted(ev.state.models) == ["s0", "s1", "s2"]
    assert ev.bad.counts == {("snapshot", "unknown_segment"): 1, ("snapshot", "too_many_models"): 2}
    assert ev.deltas.position()["calmon-deltas/1"] == 0  # no manifest any more: a replay from the beginning
    ev.deltas.close()


# -- on a real broker --------------------------------------------------------------------------------------------
GENUINE = ("m00", "m01", "m02")


def hostile_config(work: Path, boot: str) -> Path:
    """The CI scenario's configuration (tests/test_cluster_kafka.py) with the genuine models declared and
    ``limits.max_models: 10``."""
    from test_cluster_kafka import evaluator_client_fix, write_config

    cfg = write_config(work, source="kafka", bootstrap=boot, batch_size=500)
    model = "{bins: 256, reservoir: 32, segments: [web]}"
    text = cfg.read_text().replace(f"models: {{default: {model}}}",
                                   f"models: {{default: {model}, " + ", ".join(f"{m}: {model}" for m in GENUINE)
                                   + "}\nlimits: {max_models: 10}")
    assert "max_models" in text
    cfg.write_text(text)
    evaluator_client_fix(cfg)
    return cfg


def forged_deltas(n: int) -> list[tuple[bytes, bytes]]:
    """``n`` deltas of new models, otherwise valid for the scenario's models section (bins 256, segment web)."""
    cfg = config(models={"default": {"bins": 256, "reservoir": 32, "segments": ["web"]}})
    records, _ = traffic(300, models=1)
    d = partitioned_deltas(cfg, records)[0]
    return [(f"forged{i:03d}".encode(), renamed(d, f"forged{i:03d}")) for i in range(n)]


def poison(boot: str, cfg_path: Path, state_doc: dict) -> None:
    """Bad records in every internal topic before any worker starts."""
    from kafka import KafkaProducer
    from test_cluster_kafka import DELTA_PARTITIONS

    from calmon.cluster.ingest import internal_topics
    from calmon.cluster.topics import ensure_topics
    from calmon.config import load_config

    cfg = load_config(cfg_path)
    cl = cfg.cluster
    ensure_topics(boot, {}, {**internal_topics(cfg), cl.snapshots_topic: (DELTA_PARTITIONS, {})})
    forged_payload = changed(state_doc, "join.pending", {
        "ids": ["p"], "models": ["m00"], "ts": [1.0], "segments": [""], "widths": [1],
        "payload": {"dtype": "<f8", "shape": [1], "zlib_b64": "AAAA"}})
    p = KafkaProducer(bootstrap_servers=boot, max_request_size=1 << 24)
    sends = [
        (cl.state_topic, b"events/0", b"[1, 2]"),  # the old workers: ClusterError ... AttributeError, every restore
        (cl.state_topic, b"events/1", enc({**state_doc, "source": "events/1", "offset": 10**9})),  # beyond its end
        (cl.state_topic, b"events/2", enc({**forged_payload, "source": "events/2", "offset": 5})),  # does not restore
        (cl.state_topic, b"events/3", enc(state_doc)),  # keyed by another partition than it names
        *((cl.deltas_topic, k, v) for k, v in forged_deltas(300)),
        (cl.deltas_topic, b"m01", b"\x00garbage"),
    ]
    for topic, key, value in sends:
        p.send(topic, value, key=key)
    for part in range(DELTA_PARTITIONS):
        p.send(cl.snapshots_topic, b"{not json", key=b"m00", partition=part)
    p.flush(timeout=60)
    p.close()


@pytest.mark.integration
def test_bad_internal_records_on_a_real_broker_are_skipped_and_every_event_is_ingested(tmp_path, state_doc):
    """Garbage, forged and unrestorable records in the state, deltas and snapshots topics: the ingest
    workers and the evaluator stay up, every input record is ingested and merged (the events counted equal the
    single-process agent's), the evaluator admits at most ``max_models`` models, and every bad record is counted
    by reason."""
    from kafka_broker import KafkaBroker, require_broker
    from test_cluster_kafka import (
        PARTITIONS,
        TOPIC,
        Worker,
        count_topic,
        file_reference,
        ingest_committed,
        make_traffic,
        produce,
        wait_until,
    )

    require_broker()
    records, _ = make_traffic(1500, models=len(GENUINE))
    ref = file_reference(tmp_path, records)
    want_events = {(m, k): n for m, k, n in ref["state"]["counters"]["events"] if m in GENUINE}
    with KafkaBroker() as broker:
        boot = broker.bootstrap
        broker.create_topic(TOPIC, partitions=PARTITIONS)
        cfg = hostile_config(tmp_path / "cluster", boot)
        poison(boot, cfg, state_doc)
        workers: list[Worker] = []
        try:
            for role, name in (("ingest", "ingest0"), ("ingest", "ingest1"), ("evaluate", "eval0")):
                d = tmp_path / "cluster" / name
                d.mkdir(parents=True)
                own = d / "calmon.yaml"
                own.write_text(cfg.read_text().replace(f"state_dir: {tmp_path / 'cluster' / 'state'}",
                                                       f"state_dir: {d}"))
                workers.append(Worker(own, role, name))
            for w in workers:
                w.wait_serving()
            produce(boot, records)
            want = count_topic(boot, TOPIC)
            assert sum(want.values()) == len(records)
            wait_until(lambda: ingest_committed(boot, "calmon-ingest") == want, 240, "every record ingested", workers,
                       lambda: f"{ingest_committed(boot, 'calmon-ingest')} != {want}")
            deltas_end = count_topic(boot, "calmon-deltas")
            ev = workers[2]

            def merged() -> bool:
                pos = {k: v for k, v in ev.metric("calmon_cluster_position").items()}
                return ev.get("/readyz")[0] == 200 and sorted(pos.values()) == sorted(map(float, deltas_end.values()))

            wait_until(merged, 240, "every delta read", workers, lambda: ev.metric("calmon_cluster_position"))
            bad: dict[str, float] = {}
            for w in workers:
                for labels, v in w.metric("calmon_cluster_bad_records_total").items():
                    key = ",".join(x for x in labels.strip("{}").split(",") if x.startswith(("topic", "reason")))
                    bad[key] = bad.get(key, 0) + v
            for w in workers[:2]:
                assert w.term() == 0, w.log.read_text()[-3000:]
            assert ev.term() == 0, ev.log.read_text()[-3000:]
            dump = json.loads((ev.cfg.parent / "owned-state.json").read_text())
        finally:
            for w in workers:
                if w.alive():
                    w.kill()
    got_events = {(m, k): n for m, k, n in dump["counters"]["events"] if m in GENUINE}
    print(json.dumps({"records": len(records), "models": sorted(dump["models"]), "bad": bad}))
    assert got_events == want_events
    forged = [m for m in dump["models"] if m.startswith("forged")]
    assert set(GENUINE) <= set(dump["models"]) and len(dump["models"]) <= 10, sorted(dump["models"])
    assert bad['topic="delta",reason="too_many_models"'] == 300 - len(forged), bad
    assert bad['topic="delta",reason="not_json"'] == 1, bad
    assert bad['topic="state",reason="format"'] >= 1 and bad['topic="state",reason="beyond_end"'] >= 1, bad
    assert bad['topic="state",reason="restore"'] >= 1 and bad['topic="state",reason="key_mismatch"'] >= 1, bad
    assert bad['topic="snapshot",reason="not_json"'] >= 1, bad
