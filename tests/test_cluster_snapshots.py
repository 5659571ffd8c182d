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

    monkeypatch.setattr(mod, "MAX_RECORD", 100)
    with pytest.raises(SnapshotError, match="over the 100-byte record limit"):
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
