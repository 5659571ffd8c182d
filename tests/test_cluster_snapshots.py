"""Evaluator snapshots (issue #17): the record codec, the merge rule, and the snapshots topic on a real broker.

The end-to-end check (an evaluator SIGKILLed after a snapshot, its successor restoring from it plus the tail
of the deltas and matching the single-process agent) runs inside ``tests/test_cluster_kafka.py``, whose
workers snapshot every second.
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import numpy as np
import pytest

from calmon.cluster.snapshots import (
    MAX_RECORD,
    Manifest,
    ModelSnapshot,
    SnapshotError,
    copy_windows,
    keep_delta,
    restore_start,
)
from calmon.state.buckets import ModelWindows

sys.path.insert(0, str(Path(__file__).parent))
from kafka_broker import KafkaBroker, require_broker  # noqa: E402


def windows(seed: int = 0, n: int = 500) -> ModelWindows:
    rng = np.random.default_rng(seed)
    mw = ModelWindows("m", 2, [(60, 5), (600, 3)], segments=["web"], bins=64, reservoir=8)
    ts = np.sort(rng.uniform(0, 3000, n))
    seg = rng.choice(np.array(["web", "app"], dtype=object), n)
    p = rng.uniform(0, 1, n)
    mw.add(ts, seg, (rng.uniform(0, 1, n) < p).astype(int), p, None, float(ts[-1]))
    return mw


def sums(mw: ModelWindows) -> dict[str, str]:
    out = {}
    for seg, ring in mw.rings.items():
        for w in (None, 300.0, 1200.0):
            out[f"{seg}/{w}"] = json.dumps(ring.window_sum(w).to_dict(), sort_keys=True)
    return out


def test_snapshot_round_trip_is_exact_and_copies_are_independent():
    mw = windows()
    snap = ModelSnapshot("m", 123, copy_windows(mw), {"events/0": 40, "events/3": 7}, {"labeled": 500}, 3, 2999.0)
    mw.add(np.array([2999.0]), np.array(["web"], dtype=object), np.array([1]), np.array([0.5]), None, 2999.0)
    back = ModelSnapshot.from_bytes(snap.to_bytes())
    assert (back.model, back.offset, back.applied, back.events, back.late, back.watermark) == \
        ("m", 123, {"events/0": 40, "events/3": 7}, {"labeled": 500}, 3, 2999.0)
    assert sums(back.windows) == sums(windows())  # the copy did not see the later event
    assert sums(back.windows) != sums(mw)
    empty = ModelSnapshot.from_bytes(ModelSnapshot("e", 0, ModelWindows("e", 2, [(60, 2)])).to_bytes())
    assert empty.watermark == -math.inf and empty.applied == {}


def test_bad_records_are_refused_with_one_line():
    good = ModelSnapshot("m", 1, windows(n=10)).to_bytes()
    for data, want in ((good.replace(b'"version":1', b'"version":7'), "version 7 is not readable"),
                       (b"\xff", "not JSON"), (b'{"format": "calmon.delta"}', "not a calmon.snapshot"),
                       (good.replace(b'"offset":1', b'"offset":"x"'), "bad snapshot record")):
        with pytest.raises(SnapshotError, match=want) as err:
            ModelSnapshot.from_bytes(data)
        assert "\n" not in str(err.value)
    with pytest.raises(SnapshotError, match="bad snapshot manifest"):
        Manifest.from_bytes(b'{"format": "calmon.snapshot", "version": 1}')


def test_oversized_snapshot_is_refused(monkeypatch):
    import calmon.cluster.snapshots as mod

    monkeypatch.setattr(mod, "MAX_SNAPSHOT", 100)
    with pytest.raises(SnapshotError, match="over the 100-byte snapshot limit"):
        ModelSnapshot("m", 1, windows(n=10)).to_bytes()
    assert MAX_RECORD >= 1 << 20


def test_merge_rule_and_restore_start():
    covers = {"a": 50, "b": 80}
    assert not keep_delta(49, "a", covers) and keep_delta(50, "a", covers) and keep_delta(51, "a", covers)
    assert not keep_delta(79, "b", covers) and keep_delta(0, "new", covers)
    snaps = [ModelSnapshot("a", 50, ModelWindows("a", 2, [(60, 2)])),
             ModelSnapshot("b", 80, ModelWindows("b", 2, [(60, 2)]))]
    assert restore_start(Manifest(90, ("a", "b")), snaps) == 50
    assert restore_start(Manifest(40, ("a", "b")), snaps) == 40  # a model absent from it starts after 40
    assert restore_start(None, snaps) == 0  # no manifest: models without a record may have any delta


@pytest.mark.integration
def test_snapshot_store_keeps_the_latest_record_per_model_and_partition():
    require_broker()
    from calmon.cluster.snapshot_store import SnapshotStore
    from calmon.cluster.topics import Producer, ensure_topics
    with KafkaBroker() as broker:
        boot = broker.bootstrap
        ensure_topics(boot, {}, {"snaps": (2, {"cleanup.policy": "compact"})})
        store = SnapshotStore(boot, "snaps", {}, Producer(boot, {}))
        mw = windows(n=50)
        store.write(1, [ModelSnapshot("a", 10, mw), ModelSnapshot("b", 10, mw)], Manifest(10, ("a", "b")))
        store.write(1, [ModelSnapshot("a", 30, mw)], Manifest(30, ("a", "b")))
        store.write(0, [ModelSnapshot("c", 5, mw)], Manifest(5, ("c",)))
        got = store.read(1)
        assert got is not None and got.bad == 0
        assert {m: s.offset for m, s in got.models.items()} == {"a": 30, "b": 10}
        assert got.manifest == Manifest(30, ("a", "b"))
        assert restore_start(got.manifest, got.models.values()) == 10
        assert sums(got.models["a"].windows) == sums(mw)
        assert store.read(1).models.keys() == {"a", "b"}  # type: ignore[union-attr]
        store.producer.close()


def test_snapshot_settings_are_validated():
    from calmon.config.schema import ClusterConfig, Duration
    ClusterConfig(snapshot_every=Duration(0)).validate("cluster")
    ClusterConfig(snapshot_every=Duration(60)).validate("cluster")
    with pytest.raises(ValueError, match="snapshot_every"):
        ClusterConfig(snapshot_every=Duration(0.5)).validate("cluster")
    with pytest.raises(ValueError, match="must differ"):
        ClusterConfig(snapshots_topic="calmon-deltas").validate("cluster")


def big_windows(n: int) -> ModelWindows:
    """One bucket whose reservoir keeps all ``n`` scored events: a snapshot of about 12 bytes per event."""
    rng = np.random.default_rng(1)
    mw = ModelWindows("big", 2, [(3600, 1)], bins=64, reservoir=n)
    ts = np.sort(rng.uniform(0, 3000, n))
    p = rng.uniform(0, 1, n)
    mw.add(ts, np.full(n, "a", dtype=object), (rng.uniform(0, 1, n) < p).astype(int), p, None, float(ts[-1]))
    return mw


@pytest.mark.integration
def test_a_snapshot_over_16_mb_round_trips_in_chunks_on_the_broker():
    """A model snapshot bigger than one record (16 MB, the internal producer's limit) is written as chunks plus a
    head and read back whole; a second write replaces it and tombstones the first generation's chunks."""
    require_broker()
    from calmon.cluster.snapshot_store import CHUNK, SnapshotStore, chunk_key
    from calmon.cluster.topics import Producer, ensure_topics
    mw = big_windows(1_500_000)
    data = ModelSnapshot("big", 7, mw).to_bytes()
    assert len(data) > MAX_RECORD  # one record could not carry it
    with KafkaBroker() as broker:
        boot = broker.bootstrap
        ensure_topics(boot, {}, {"snaps": (2, {"cleanup.policy": "compact"})})
        store = SnapshotStore(boot, "snaps", {}, Producer(boot, {}))
        store.write(1, [ModelSnapshot("big", 7, mw), ModelSnapshot("small", 7, windows(n=50))],
                    Manifest(7, ("big", "small")))
        first = store.generations["big"]
        assert first[1] == -(-len(data) // CHUNK)
        store.write(1, [ModelSnapshot("big", 9, mw)], Manifest(9, ("big", "small")))
        reader = SnapshotStore(boot, "snaps", {}, Producer(boot, {}))
        got = reader.read(1, timeout=120)
        assert got is not None and got.bad == 0 and got.manifest == Manifest(9, ("big", "small"))
        assert {m: s.offset for m, s in got.models.items()} == {"big": 9, "small": 7}
        assert sums(got.models["big"].windows) == sums(mw)
        assert reader.generations["big"] == store.generations["big"] != first
        # the first generation's chunks were tombstoned: their latest records have no value
        latest: dict[bytes, bytes | None] = {}
        from connectors.kafka.admin import scan_topic
        scan_topic(boot, "snaps", {}, lambda r: latest.__setitem__(r.key, r.value), timeout=120, partitions=[1])
        assert all(latest[chunk_key("big", first[0], i)] is None for i in range(first[1]))
        store.producer.close()
        reader.producer.close()


@pytest.mark.integration
def test_a_restore_reads_only_its_partition_and_a_missing_chunk_means_replay(monkeypatch):
    """A new owner of deltas partition 1 reads the records of snapshots partition 1, not the whole topic; a
    chunked snapshot with a chunk gone is counted as bad and drops the manifest (the partition is replayed)."""
    require_broker()
    import calmon.cluster.snapshot_store as mod
    from calmon.cluster.records import BadRecords
    from calmon.cluster.snapshot_store import SnapshotStore, chunk_key
    from calmon.cluster.topics import Producer, ensure_topics
    small, mw = windows(n=20), big_windows(20_000)
    monkeypatch.setattr(mod, "CHUNK", len(ModelSnapshot("b", 3, small).to_bytes()) + 100)  # b is one record, a not
    with KafkaBroker() as broker:
        boot = broker.bootstrap
        ensure_topics(boot, {}, {"snaps": (3, {"cleanup.policy": "compact"})})
        store = SnapshotStore(boot, "snaps", {}, Producer(boot, {}))
        for p in (0, 2):  # other partitions' snapshots: many records a restore of partition 1 must not read
            for i in range(5):
                store.write(p, [ModelSnapshot(f"x{p}{i}", 1, small)], Manifest(1, (f"x{p}{i}",)))
        store.write(1, [ModelSnapshot("a", 3, mw), ModelSnapshot("b", 3, small)], Manifest(3, ("a", "b")))
        gen, chunks = store.generations["a"]
        assert chunks > 2 and "b" not in store.generations
        reader = SnapshotStore(boot, "snaps", {}, Producer(boot, {}))
        got = reader.read(1)
        assert got is not None and got.bad == 0 and set(got.models) == {"a", "b"}
        assert sums(got.models["a"].windows) == sums(mw)
        assert reader.records_read == chunks + 3  # a's chunks, a's head, b, the manifest: partition 1 only
        store.producer.producer.send("snaps", key=chunk_key("a", gen, 1), value=None, partition=1).get(timeout=30)
        bad = BadRecords("evaluate", "t")
        got = reader.read(1, bad=bad)
        assert got is not None and got.bad == 1 and got.manifest is None and set(got.models) == {"b"}
        assert bad.counts == {("snapshot", "format"): 1}
        store.producer.close()
        reader.producer.close()


def test_snapshots_are_written_off_the_poll_thread_and_off_the_state_lock(tmp_path):
    """The evaluator's snapshot thread copies each changed model under a short hold of the state lock and
    writes outside it: while a write is stuck on the broker, the poll thread keeps merging deltas, and the
    record written is the model as of its copy with the offset processed by then."""
    import threading
    import time

    from test_cluster import config, partitioned_deltas, traffic

    from calmon.cluster.evaluate import DeltasInput, evaluate_agent
    from connectors.base import Batch

    cfg = config(state_dir=str(tmp_path), cluster={"bootstrap_servers": "127.0.0.1:9", "snapshot_every": "1s"})
    ev = evaluate_agent(cfg).input
    assert isinstance(ev, DeltasInput)
    deltas = [d for d in partitioned_deltas(cfg, traffic(600, models=1)[0]) if d.model == "m00"]
    assert len(deltas) >= 2
    half = len(deltas) // 2

    class StuckStore:
        def __init__(self) -> None:
            self.entered, self.release = threading.Event(), threading.Event()
            self.calls: list[tuple[str, bool, list[ModelSnapshot], Manifest]] = []

        def write(self, partition, snaps, manifest):
            free = ev.state.lock.acquire(blocking=False)
            if free:
                ev.state.lock.release()
            self.calls.append((threading.current_thread().name, free, snaps, manifest))
            self.entered.set()
            assert self.release.wait(60)
            return 1

        def forget(self, models):
            pass

    store = StuckStore()
    ev._store = store  # type: ignore[assignment]
    ev.owned = {"calmon-deltas/0"}
    first = [d.to_bytes() for d in deltas[:half]]
    ev.ingest(Batch(first, {}, "deltas", [f"calmon-deltas/0@{i}" for i in range(half)]))
    expected = sums(ev.state.models["m00"])
    ev.open()  # starts the snapshot thread
    try:
        assert store.entered.wait(60), "no snapshot written within 60 s"
        rest = [d.to_bytes() for d in deltas[half:]]
        merger = threading.Thread(target=ev.ingest, args=(Batch(rest, {}, "deltas", [
            f"calmon-deltas/0@{half + i}" for i in range(len(rest))]),))
        t0 = time.monotonic()
        merger.start()
        merger.join(60)
        assert not merger.is_alive(), "merging waited for the snapshot write"
        assert time.monotonic() - t0 < 60
    finally:
        store.release.set()
        ev.close()
    thread, lock_free, snaps, manifest = store.calls[0]
    assert thread != threading.current_thread().name and lock_free
    assert [s.model for s in snaps] == ["m00"] and snaps[0].offset == half and manifest == Manifest(half, ("m00",))
    assert sums(snaps[0].windows) == expected  # the copy, not the model merged further meanwhile
    assert sums(ev.state.models["m00"]) != expected
    ev.deltas.close()
