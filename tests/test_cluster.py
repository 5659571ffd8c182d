"""The partitioned agent's pieces without a broker: the delta codec, order-free merging (partitioned deltas equal the
single-process agent's windows), replay determinism of a range, the evaluator's de-duplication, configuration."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import zlib
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from calmon.cluster.deltas import Delta, DeltaError, merge_delta  # noqa: E402
from calmon.cluster.partition import PartitionIngest, stage_config  # noqa: E402
from calmon.cluster.topics import PartitionState, Range  # noqa: E402
from calmon.config import ConfigError, build_config  # noqa: E402
from calmon.state.agentstate import AgentState  # noqa: E402
from calmon.state.buckets import ModelWindows  # noqa: E402
from calmon.state.ingest import Ingestor  # noqa: E402
from connectors.base import Batch  # noqa: E402

TIERS = [{"width": "1m", "count": 10}, {"width": "10m", "count": 6}, {"width": "1h", "count": 2}]


def config(**over):
    doc = {"sources": [{"path": "x.jsonl"}], "models": {"default": {"bins": 128, "reservoir": 16, "segments": ["web"]}},
           "join": {"ttl": "2h"}, "windows": {"names": ["5m", "1h", "all"], "allowed_lateness": "6h", "tiers": TIERS},
           "evaluation": {"tests": []}, "exporter": {"enabled": False}}
    doc.update(over)
    return build_config(doc, env={})


def traffic(n=1500, models=5, seed=0):
    from test_cluster_kafka import make_traffic

    return make_traffic(n, seed=seed, models=models, partitions=3, rate=0.25)  # spans > tier 0 (10 min)


def reference_models(cfg, records):
    """The single-process agent's models: every record through one Ingestor, in batches of 500."""
    st = AgentState(stage_config(cfg))
    ing = Ingestor(st, None, lambda: 1767225600.0)
    vals = [v for _, _, v in records]
    for i in range(0, len(vals), 500):
        ing.ingest(Batch(vals[i:i + 500], {}, "events"))
    return st.models


def partitioned_deltas(cfg, records, partitions=3, size=137):
    """Deltas of every partition, ranges of ``size`` records."""
    out = []
    for p in range(partitions):
        key = f"events/{p}"
        part = PartitionIngest(cfg, key, "events", None)
        mine = [v for q, _, v in records if q == p]
        for start in range(0, len(mine), size):
            chunk = mine[start:start + size]
            end = start + len(chunk)
            rng = Range(key, start, end, 1767225600.0, "w")
            batch = Batch(chunk, {key: end}, "events", [f"{key}@{start + i}" for i in range(len(chunk))])
            out += part.apply(batch, rng).deltas
    return out


def normalized(models, watermark):
    from test_cluster_kafka import normalized as norm

    return norm({n: mw.to_dict() for n, mw in models.items()}, watermark)


def test_delta_codec_round_trip_and_errors():
    cfg = config()
    records, _ = traffic(300, models=2)
    deltas = partitioned_deltas(cfg, records)
    assert deltas
    for d in deltas:
        back = Delta.from_bytes(d.to_bytes())
        assert back.to_bytes() == d.to_bytes()
        assert (back.source, back.start, back.end, back.model) == (d.source, d.start, d.end, d.model)
    good = json.loads(deltas[0].to_bytes(2))
    for bad, why in [(b"nope", "not JSON"), (b'{"format": "x"}', "not a calmon.delta"),
                     (json.dumps({**good, "version": 99}).encode(), "version 99"),
                     (json.dumps({k: v for k, v in good.items() if k != "end"}).encode(), "missing field 'end'"),
                     (json.dumps({**good, "end": good["start"]}).encode(), "empty")]:
        with pytest.raises(DeltaError, match=why):
            Delta.from_bytes(bad)


def test_a_bad_binary_delta_is_refused_with_its_reason():
    """Version-3 frames are decoded bounded: every damaged field is a :class:`DeltaError` with a reason of
    ``records.REASONS``, never another exception, and a payload cannot inflate past what its table declares."""
    import struct
    import zlib

    from calmon.cluster.records import REASONS
    cfg = config()
    records, _ = traffic(300, models=2)
    d = max(partitioned_deltas(cfg, records), key=lambda d: len(d.buckets))
    good = d.to_bytes(3)
    h, p = struct.unpack_from("<II", good, 8)
    header = json.loads(good[16:16 + h])

    def frame(header_doc, payload, flags=1, version=3):
        hb = json.dumps(header_doc).encode()
        return struct.pack("<4sBBHII", b"\x00CMD", version, flags, 0, len(hb), len(payload)) + hb + payload

    raw = zlib.decompress(good[16 + h:])
    bomb = zlib.compress(b"\x00" * (64 << 20), 9)  # 64 MB of zeros in ~64 KB
    cases = [(good[:10], "format"), (good[:-1], "format"), (good + b"x", "format"),
             (b"\x00CMX" + good[4:], "format"), (good[:4] + b"\x07" + good[5:], "version"),
             (good[:16] + b"\xff" + good[17:], "not_json"),
             (frame({**header, "model": 7}, raw, 0), "schema"),
             (frame({**header, "arrays": header["arrays"][:-1]}, raw, 0), "format"),
             (frame(header, raw[:-8], 0), "format"), (frame(header, bomb), "format"),
             (frame({**header, "arrays": [["<i8", [1 << 20, 1 << 20]]]}, b""), "too_large"),
             (frame({**header, "end": header["start"]}, raw, 0), "invalid"),
             (frame({**header, "buckets": [[b[0], b[1], b[2], {}] for b in header["buckets"]]}, raw, 0), "schema")]
    for bad, reason in cases:
        with pytest.raises(DeltaError) as info:
            Delta.from_bytes(bad)
        assert info.value.reason == reason and reason in REASONS, (reason, str(info.value))
    assert Delta.from_bytes(frame(header, raw, 0)).to_bytes(3) == good  # uncompressed payloads are read too


def test_version_1_2_and_3_deltas_are_still_read_and_version_4_is_a_table():
    """Deltas already in the topic when the evaluators are upgraded (version 1: every array of a bucket packed on
    its own; version 2: packed bucket documents; version 3: binary, every grid of every bucket a part) merge to the
    same windows as version 4 (one table of cells for all the buckets), which is the smallest."""
    from calmon.cluster.deltas import VERSION
    cfg = config()
    records, _ = traffic(600, models=2)
    deltas = partitioned_deltas(cfg, records)
    assert VERSION == 4
    v1, v2 = [d.to_bytes(1) for d in deltas], [d.to_bytes(2) for d in deltas]
    for one, two in zip(v1, v2):
        doc = json.loads(two)
        assert doc["version"] == 2 and all(b["bucket"]["version"] == 2 and "data" in b["bucket"]
                                           for b in doc["buckets"])
        assert json.loads(one)["version"] == 1
    v3, v4 = [d.to_bytes(3) for d in deltas], [d.to_bytes() for d in deltas]
    assert all(v[:4] == b"\x00CMD" and v[4] == 3 for v in v3)
    assert all(v[:4] == b"\x00CMD" and v[4] == 4 for v in v4)
    assert sum(map(len, v1)) > sum(map(len, v2)) > sum(map(len, v3)) > sum(map(len, v4))
    states = []
    for values in (v1, v2, v3, v4):
        st = AgentState(stage_config(cfg))
        for value in values:
            d = Delta.from_bytes(value)
            merge_delta(st.windows_of(d.model, d.classes), d)
        states.append(st.models)
    wm = max(d.watermark for d in deltas) + 1
    a, b, c, e = (normalized(s, wm) for s in states)
    assert a == b == c == e and len(a) == 2
    assert a == normalized(reference_models(cfg, records), wm)


@pytest.mark.parametrize("seed", [0, 1])
def test_partitioned_deltas_merged_in_any_order_equal_the_single_process_windows(seed):
    cfg = config()
    records, _ = traffic(1500, models=5, seed=seed)
    ref = reference_models(cfg, records)
    deltas = partitioned_deltas(cfg, records)
    np.random.default_rng(seed).shuffle(deltas)  # evaluators see partitions interleaved arbitrarily
    st = AgentState(stage_config(cfg))
    for d in deltas:
        merge_delta(st.windows_of(d.model, d.classes), d)
    wm = max(d.watermark for d in deltas) + 1
    a, b = normalized(ref, wm), normalized(st.models, wm)
    assert sorted(a) == sorted(b) and len(a) == 5
    assert a == b
    # the statistics are not trivially equal: rings rolled into coarser tiers and the windows hold data
    ring = ModelWindows.from_dict(ref["m01"].to_dict()).rings["all"]
    assert ring.window_sum(None).count > 0 and any(ring.buckets[1:])


@pytest.mark.parametrize("version", [3, 4])
@pytest.mark.parametrize("seed", [0, 1])
def test_binary_deltas_merged_straight_from_their_records_equal_the_single_process_windows(seed, version):
    """The evaluator's path (#33.3): every delta through its binary record, its cells added from the record's
    payload into the ring's buckets (no bucket built per delta bucket; version 4: pending until a read), in any
    order."""
    cfg = config()
    records, _ = traffic(1500, models=5, seed=seed)
    ref = reference_models(cfg, records)
    deltas = [Delta.from_bytes(d.to_bytes(version)) for d in partitioned_deltas(cfg, records)]
    np.random.default_rng(seed).shuffle(deltas)
    st = AgentState(stage_config(cfg))
    for d in deltas:
        merge_delta(st.windows_of(d.model, d.classes), d)
    assert all(b.part is not None and b._bucket is None for d in deltas for b in d.buckets)
    assert all((d.table is not None) == (version == 4) for d in deltas)
    wm = max(d.watermark for d in deltas) + 1
    assert normalized(ref, wm) == normalized(st.models, wm)


def test_reprocessing_a_range_after_a_crash_gives_the_same_deltas_dead_letters_and_state():
    cfg = config()
    records, _ = traffic(800, models=3)
    key = "events/0"
    mine = [v for q, _, v in records if q == 0] + [b"garbage", b'{"model": "m00", "score": 0.5, "label": 1}']
    cut = len(mine) // 2

    def batch(lo, hi):
        return Batch(mine[lo:hi], {key: hi}, "events", [f"{key}@{i}" for i in range(lo, hi)])

    first = PartitionIngest(cfg, key, "events", None)
    s1 = first.apply(batch(0, cut), Range(key, 0, cut, 100.0, "a")).state
    i2 = Range(key, cut, len(mine), 1767229999.0, "a")  # its transaction aborted: the worker died
    run1 = first.apply(batch(cut, len(mine)), i2)
    # a new owner restores the committed state at the start of the range (through its JSON form) and cuts the same range
    restored = PartitionState.from_bytes(s1.to_bytes())
    second = PartitionIngest(cfg, key, "events", restored)
    assert second.next == cut
    run2 = second.apply(batch(cut, len(mine)), i2)
    assert [d.to_bytes() for d in run1.deltas] == [d.to_bytes() for d in run2.deltas]
    assert run1.rejects.records == run2.rejects.records and run1.rejects.records[-1] == b"garbage"
    assert run1.state.to_bytes() == run2.state.to_bytes()
    # the event without ts took its source's event time (#31.1: the partition's newest carried time, restored with
    # the state; neither the wall clock nor the range's ``now``): same bucket in both runs
    newest = max(float(t[1]) for t in (re.search(rb'"ts":([0-9.]+)', v) for v in mine[:-2]) if t is not None)
    lab = [d for d in run1.deltas if d.model == "m00"][0]
    assert any(b.start == np.floor(newest / 60) * 60 and b.tier == 0 for b in lab.buckets)


def evaluator(tmp_path):
    """The deltas input of an evaluator's agent (not opened: no broker needed)."""
    from calmon.cluster.evaluate import DeltasInput, evaluate_agent
    cfg = config(state_dir=str(tmp_path), cluster={"bootstrap_servers": "127.0.0.1:9"})
    ev = evaluate_agent(cfg).input
    assert isinstance(ev, DeltasInput)
    return ev


def test_evaluator_drops_replayed_ranges(tmp_path):
    cfg = config()
    records, _ = traffic(600, models=2)
    deltas = partitioned_deltas(cfg, records)
    ev = evaluator(tmp_path)
    once = [d.to_bytes() for d in deltas]
    origins = [f"calmon-deltas/0@{i}" for i in range(len(once))]
    ev.ingest(Batch(once, {}, "deltas", origins))
    doc_once = {n: mw.to_dict() for n, mw in ev.state.models.items()}
    # every range again (a snapshot restore replaying deltas, an aborted copy a broker let through), and an old
    # range after newer ones
    again = once + once[:3]
    ev.ingest(Batch(again, {}, "deltas", [f"calmon-deltas/0@{i}" for i in range(len(again))]))
    assert ev.dropped_repeats == len(again)
    assert {n: mw.to_dict() for n, mw in ev.state.models.items()} == doc_once
    applied = ev.owned_state()["applied"]
    assert {(s, m) for s, m, _ in applied} == {(d.source, d.model) for d in deltas}
    ev.ingest(Batch([b"garbage"], {}, "deltas", ["calmon-deltas/0@999"]))
    assert ev.bad_deltas == 1
    ev.deltas.close()


def test_evaluator_drops_the_models_of_a_revoked_partition(tmp_path):
    cfg = config()
    records, _ = traffic(600, models=4)
    deltas = partitioned_deltas(cfg, records)
    ev = evaluator(tmp_path)
    part = {d.model: zlib.crc32(d.model.encode()) % 2 for d in deltas}
    ev.ingest(Batch([d.to_bytes() for d in deltas], {}, "deltas",
                    [f"calmon-deltas/{part[d.model]}@{i}" for i, d in enumerate(deltas)]))
    ev.owned = {"calmon-deltas/0", "calmon-deltas/1"}
    ev._drop_partition("calmon-deltas/1")
    kept = {m for m, p in part.items() if p == 0}
    assert set(ev.state.models) == kept
    assert {m for m, _ in ev.state.counters.events} == kept
    assert ev.deltas.position()["calmon-deltas/1"] == 0  # read from the beginning if it comes back
    ev.deltas.close()


def test_an_evaluator_is_ready_when_only_a_commit_marker_is_left(tmp_path):
    """#33.2: the deltas of a range end with the transaction's commit marker, which the high watermark counts but no
    consumer position reaches; a partition restored up to its last record is restored (it used to stay not ready
    on an idle deltas partition), and one with a record still to read is not."""
    from types import SimpleNamespace

    ev = evaluator(tmp_path)
    ev.deltas.close()
    health = {"assigned": ["calmon-deltas/0", "calmon-deltas/1"], "lag": {"calmon-deltas/0": 1, "calmon-deltas/1": 2}}
    # (fetched: {} -- a client that does not tell its fetch position, as confluent-kafka)
    ev.deltas = SimpleNamespace(health=lambda: health, position=lambda: {"calmon-deltas/0": 10, "calmon-deltas/1": 10},
                                fetched=lambda: {})
    ev.restored_parts = {"calmon-deltas/0", "calmon-deltas/1"}  # (no snapshot store to read)
    ev._sync_ownership()
    assert set(ev.restoring) == {"calmon-deltas/1"} and not ev.ready()


def test_the_evaluator_is_an_agent_composed_with_a_deltas_input_and_its_collector(tmp_path):
    """No subclass: a plain Agent whose input merges deltas (through Agent.ingest), whose /metrics ends with the
    evaluator's families, whose /readyz waits for the restores, and whose close writes the exit dump."""
    from calmon.agent.runtime import Agent
    from calmon.cluster.evaluate import DUMP_NAME, DeltasInput, EvaluateMetrics, evaluate_agent
    cfg = config(state_dir=str(tmp_path), cluster={"bootstrap_servers": "127.0.0.1:9"})
    agent = evaluate_agent(cfg)
    assert type(agent) is Agent and isinstance(agent.input, DeltasInput)
    assert [type(c) for c in agent.collectors] == [EvaluateMetrics]
    assert not agent.cfg.checkpoint.enabled and agent.cfg.dead_letter.type == "none"
    ev = agent.input
    records, _ = traffic(300, models=2)
    deltas = partitioned_deltas(config(), records)
    agent.ingest(Batch([d.to_bytes() for d in deltas], {}, "deltas",
                       [f"calmon-deltas/0@{i}" for i in range(len(deltas))]))
    assert set(agent.models) == {d.model for d in deltas} and ev.deltas_read == len(deltas)
    text = agent.render_metrics().decode()
    tail = agent.collectors[0].render().decode()
    assert text.endswith(tail) and tail.startswith("# HELP calmon_cluster_owned_partitions")
    assert "calmon_ready 0.0" in text[:-len(tail)]  # the agent's own families first
    assert f'calmon_cluster_deltas_read_total{{stage="evaluate",worker="{ev.worker}"}} {len(deltas)}' in text
    assert f'calmon_cluster_owned_models{{stage="evaluate",worker="{ev.worker}"}} 2' in text
    agent.ready = True  # as after open()
    ev.restoring = {"calmon-deltas/0": (0.0, None)}
    assert not agent.is_ready()
    ev.restoring = {}
    assert agent.is_ready()
    agent.close()
    dump = json.loads((tmp_path / DUMP_NAME).read_text())
    assert dump["worker"] == ev.worker and set(dump["models"]) == set(agent.models)
    ev.deltas.close()
    with pytest.raises(ValueError):
        Agent(cfg, sources=[], input=DeltasInput(cfg))


def test_cluster_config_is_validated_with_key_paths():
    assert config(cluster={"bootstrap_servers": "k:9092"}).cluster.deltas_topic == "calmon-deltas"
    for bad, key in [({"partitions": 0}, "cluster.partitions"), ({"deltas_topic": "a b"}, "cluster.deltas_topic"),
                     ({"state_topic": "calmon-deltas"}, "cluster"), ({"evaluate_group": "calmon-ingest"},
                                                                      "cluster.evaluate_group"),
                     ({"linger": "2m"}, "cluster.linger"), ({"nope": 1}, "cluster.nope")]:
        with pytest.raises(ConfigError) as exc:
            config(cluster=bad)
        assert str(exc.value).startswith(key), (bad, str(exc.value))


def test_run_role_needs_bootstrap_servers(tmp_path):
    cfg = tmp_path / "c.yaml"
    cfg.write_text(f"state_dir: {tmp_path}\nsources: [{{path: {tmp_path / 'x.jsonl'}}}]\n")
    for role in ("ingest", "evaluate"):
        p = subprocess.run([sys.executable, "-m", "calmon", "run", "-c", str(cfg), "--role", role],
                           capture_output=True, text=True, cwd=ROOT, timeout=60)
        assert p.returncode == 2
        assert f"cluster.bootstrap_servers: required by --role {role}" in p.stderr


def test_the_removed_intents_topic_key_fails_at_start_with_one_line_saying_why(tmp_path):
    """#33.2: a configuration of an earlier release naming ``cluster.intents_topic`` is refused (exit 2, one line
    naming the key and why), not silently ignored and not a generic "unknown key"."""
    with pytest.raises(ConfigError) as exc:
        config(cluster={"bootstrap_servers": "k:9092", "intents_topic": "calmon-ingest-intents"})
    assert str(exc.value).startswith("cluster.intents_topic: removed: the ingest stage now uses Kafka transactions")
    cfg = tmp_path / "c.yaml"
    cfg.write_text(f"state_dir: {tmp_path}\nsources: [{{path: {tmp_path / 'x.jsonl'}}}]\n"
                   "cluster: {bootstrap_servers: 'k:9092', intents_topic: calmon-ingest-intents}\n")
    p = subprocess.run([sys.executable, "-m", "calmon", "run", "-c", str(cfg), "--role", "ingest"],
                       capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert p.returncode == 2 and "Traceback" not in p.stderr
    assert len(p.stderr.strip().splitlines()) == 1 and "cluster.intents_topic: removed" in p.stderr, p.stderr


def test_kubernetes_manifests_of_the_stages_are_consistent(tmp_path):
    """One Deployment per stage with --role, selectors matching their pods, probes, a PodMonitor finding every
    worker, and a ConfigMap that validates for both roles."""
    import yaml

    from calmon.config import load_config
    d = ROOT / "deploy" / "kubernetes" / "cluster"
    docs = [x for x in yaml.safe_load_all((d / "calmon-cluster.yaml").read_text()) if x]
    deps = {x["metadata"]["name"]: x for x in docs if x["kind"] == "Deployment"}
    assert set(deps) == {"calmon-ingest", "calmon-evaluate"}
    (mon,) = [x for x in docs if x["kind"] == "PodMonitor"]
    for name, dep in deps.items():
        pod = dep["spec"]["template"]
        assert dep["spec"]["selector"]["matchLabels"].items() <= pod["metadata"]["labels"].items()
        assert mon["spec"]["selector"]["matchLabels"].items() <= pod["metadata"]["labels"].items()
        (c,) = pod["spec"]["containers"]
        assert c["args"][-2:] == ["--role", name.split("-")[1]]
        assert {c["readinessProbe"]["httpGet"]["path"], c["livenessProbe"]["httpGet"]["path"]} == {"/readyz",
                                                                                                  "/healthz"}
    (cm,) = [x for x in docs if x["kind"] == "ConfigMap"]
    path = tmp_path / "calmon.yaml"
    path.write_text(cm["data"]["calmon.yaml"])
    cfg = load_config(path, env={})
    assert cfg.cluster.bootstrap_servers and cfg.sources[0].type == "kafka" and cfg.dead_letter.type == "kafka"
    assert cfg.exporter.port == 9464
    scrape = yaml.safe_load((d / "prometheus-scrape.yaml").read_text())
    assert scrape[0]["job_name"] == "calmon" and scrape[0]["kubernetes_sd_configs"] == [{"role": "pod"}]


def test_ingest_worker_retries_an_unreachable_broker_then_gives_up_or_stops(caplog, tmp_path):
    """A worker started while its broker is down backs off and retries (logged), is not ready meanwhile, gives up
    after the bound with one line naming the broker, and returns at once when stopped."""
    import threading
    import time

    from kafka_broker import free_port

    from calmon.cluster.ingest import IngestWorker
    from calmon.cluster.topics import ClusterError
    boot = f"127.0.0.1:{free_port()}"  # nothing listens there
    src = {"name": "events", "type": "kafka", "options": {"bootstrap_servers": boot, "topic": "events"}}
    # (state_dir: the dead-letter file is opened before the broker is contacted; not in the working directory)
    cfg = config(sources=[src], cluster={"bootstrap_servers": boot}, state_dir=str(tmp_path))
    worker = IngestWorker(cfg)
    t0 = time.monotonic()
    with caplog.at_level("WARNING", logger="calmon.cluster"), pytest.raises(ClusterError) as err:
        worker.open_retrying(timeout=8.0, backoff=(0.1, 0.2))  # an attempt takes ~2 s (over 3 s on a loaded machine)
    assert f"broker {boot} still unreachable after" in str(err.value) and "\n" not in str(err.value)
    assert time.monotonic() - t0 < 30
    retries = [r.getMessage() for r in caplog.records if "cannot start (attempt" in r.getMessage()]
    assert retries and "retrying in" in retries[0]
    assert not worker.ready() and worker.connect_error and worker.source is None and not worker.txns
    stopper = IngestWorker(cfg)
    threading.Timer(0.3, stopper.stop).start()
    assert stopper.open_retrying(timeout=120.0, backoff=(0.1, 0.2)) is False
    assert time.monotonic() - t0 < 60


def test_a_ranges_kafka_dead_letters_are_in_its_transaction_and_file_ones_follow_the_commit(tmp_path):
    """#33.2: with a Kafka dead-letter sink the range's letters are sent by the range's transactional producer in
    its transaction (with their headers), the sink itself writes nothing; with a file sink they are written once
    the commit returned, and not at all when it raises (a fenced zombie); no dead-letter position is kept in the
    state (nothing is sought on a restore)."""
    from types import SimpleNamespace

    from calmon.cluster.ingest import IngestWorker
    from calmon.cluster.transactions import Fenced, Item
    from connectors.deadletter import FileDeadLetterSink
    from connectors.kafka.deadletter import KafkaDeadLetterSink

    key = "events/0"
    records, _ = traffic(200, models=2)
    mine = [v for q, _, v in records if q == 0] + [b"garbage"]
    for sink in (FileDeadLetterSink(tmp_path / "dead.jsonl"), KafkaDeadLetterSink("127.0.0.1:9", topic="dlq")):
        for fenced in (True, False):
            commits: list[tuple] = []

            def commit(rec: dict, off: int, last: dict, fenced: bool = fenced) -> None:
                if fenced:
                    raise Fenced("fenced")
                commits.append((rec, off, last))

            worker = IngestWorker(config())
            worker.dead_letter = sink
            worker.txns = {key: SimpleNamespace(commit_range=commit)}
            part = PartitionIngest(config(), key, "events", None)
            rng = Range(key, 0, len(mine), 1767225600.0, "w")
            batch = Batch(mine, {key: len(mine)}, "events", [f"{key}@{i}" for i in range(len(mine))])
            applied = part.apply(batch, rng)
            if fenced:
                with pytest.raises(Fenced):
                    worker._complete(part, applied, rng)
                assert sink.unacknowledged() == 0
                if isinstance(sink, FileDeadLetterSink):
                    assert (tmp_path / "dead.jsonl").read_text() == ""  # a fenced range writes no letter
                continue
            worker._complete(part, applied, rng)
            [(rec, off, last)] = commits
            state = PartitionState.from_bytes(last["calmon-ingest-state"][0][1])
            assert off == state.offset == len(mine) and dict(state.dead_letter) == {}
            assert len(rec["calmon-deltas"]) == 2
            want = applied.rejects.origins
            assert want[-1] == f"{key}@{len(mine) - 1}"
            if isinstance(sink, KafkaDeadLetterSink):
                letters = rec["dlq"]
                assert all(isinstance(x, Item) for x in letters) and letters[-1].value == b"garbage"
                assert [dict(x.headers)["calmon-origin"].decode() for x in letters] == want
                assert sink.unacknowledged() == 0 and sink._producer is None and sink.stats.written == len(want)
            else:
                assert set(rec) == {"calmon-deltas"}
                lines = (tmp_path / "dead.jsonl").read_text().splitlines()
                assert [json.loads(x)["origin"] for x in lines] == want
        sink.close()


def test_an_ingest_dead_letter_topic_on_other_brokers_fails_at_start_with_one_line(tmp_path):
    """#33.2: the ingest stage writes a range's dead letters in the range's transaction, which cannot span two
    clusters: a Kafka dead-letter sink on brokers not among ``cluster.bootstrap_servers`` exits 2 at start with one
    line naming the key, before any broker is contacted (none runs here)."""
    cfg = tmp_path / "calmon.yaml"
    cfg.write_text("sources: [{name: events, type: kafka, options: {bootstrap_servers: '127.0.0.1:9', topic: e}}]\n"
                   "dead_letter: {type: kafka, options: {bootstrap_servers: 'elsewhere:9092', topic: dlq}}\n"
                   "exporter: {enabled: false}\n"
                   "cluster: {bootstrap_servers: '127.0.0.1:9,127.0.0.1:10'}\n")
    p = subprocess.run([sys.executable, "-m", "calmon", "run", "-c", str(cfg), "--role", "ingest"],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 2 and "Traceback" not in p.stderr, p.stderr
    assert len(p.stderr.strip().splitlines()) == 1, p.stderr
    assert "dead_letter.options.bootstrap_servers: must name a broker of cluster.bootstrap_servers" in p.stderr
    from calmon.cluster.ingest import check_dead_letter_servers
    from connectors.kafka.deadletter import KafkaDeadLetterSink
    ok = config(cluster={"bootstrap_servers": "127.0.0.1:9,127.0.0.1:10"})
    check_dead_letter_servers(ok, KafkaDeadLetterSink(["127.0.0.1:10"], topic="dlq"))  # one shared broker is enough


def test_an_ingest_restore_that_fails_is_retried_and_does_not_end_the_worker(monkeypatch):
    """#33.2: ``init_transactions`` can time out on a loaded broker (seen on Tansu in the kill test: the worker
    died with a traceback).  The restore is logged, counted and retried; the partition is restored on the retry,
    without new records arriving for it."""
    import calmon.cluster.ingest as ingest_mod
    from calmon.cluster.ingest import IngestWorker
    from calmon.cluster.topics import ClusterError

    cfg = config(cluster={"bootstrap_servers": "127.0.0.1:9"})
    w = IngestWorker(cfg)
    seeks: list[dict[str, int]] = []

    class Source:
        name = "events"

        def health(self):
            return {"assigned": ["events/0"]}

        def position(self):
            return {"events/0": 5}

        def lag(self):
            return {}

        def seek(self, position):
            seeks.append(dict(position))

    class States:
        class reader:  # noqa: N801 - the attribute the worker reads
            @staticmethod
            def end_offsets(keys):
                return {}

        @staticmethod
        def candidates(keys, ends):
            return {}

    calls = []

    class Producer:
        def __init__(self, *args):
            calls.append(args[-1])
            if len(calls) == 1:
                raise ClusterError("init transactions of calmon-ingest.events.0: KafkaTimeoutError")

        def close(self):
            pass

    monkeypatch.setattr(ingest_mod, "PartitionProducer", Producer)
    w.source, w.states = Source(), States()  # type: ignore[assignment]
    w._sync_assignment()
    w._route(Batch([b"{}"], {"events/0": 1}, "events", ["events/0@0"]))  # the restore fails: no exception
    assert "events/0" not in w.parts and w.metrics.errors == 1 and seeks == []
    w._retry_restores()  # not before RESTORE_RETRY
    assert calls == ["events/0"]
    w._next_retry = 0.0
    w._retry_restores()
    assert calls == ["events/0", "events/0"] and w.parts["events/0"].next == 0 and seeks == [{"events/0": 0}]
