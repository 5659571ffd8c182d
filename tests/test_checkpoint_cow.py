"""Issue #15, restore time and lock holds: packed bucket documents (exact round trip, damage named), lazy decoding
after a restore, copy-on-write checkpoints (a bucket changed while its checkpoint is written is written as
captured), old stores still restore, snapshots summed from copies equal the ring's own sums, and the state lock
holds off the garbage collector."""

from __future__ import annotations

import gc
import json
from typing import Any

import numpy as np
import pytest

import calmon.state.checkpoint.store as checkpoint_module
from calmon.config import build_config
from calmon.state.agentstate import AgentState, StateLock
from calmon.state.buckets import BucketStats
from calmon.state.checkpoint.incremental import Checkpointer, Slot, resolver
from calmon.state.checkpoint.packs import PackWriter
from calmon.state.checkpoint.schema import STATE_FORMAT, STATE_VERSION
from calmon.state.checkpoint.store import CheckpointStore, encode
from calmon.state.ingest import Ingestor
from connectors.base import Batch

T0 = 1_767_225_600


def _state() -> AgentState:
    cfg = build_config({"sources": [{"path": "x"}], "limits": {"max_models": 50},
                        "models": {"default": {"bins": 64, "reservoir": 8, "segments": ["web"]}}}, env={})
    return AgentState(cfg)


def _records(models: list[str], n: int, t0: float, seed: int, span: float = 3600.0) -> list[bytes]:
    rng = np.random.default_rng(seed)
    return [json.dumps({"model": models[i % len(models)], "ts": t0 + i * span / n, "score": float(z),
                        "label": int(rng.random() < z), "segment": ["web", "app"][i % 2]}).encode()
            for i, z in enumerate(rng.random(n))]


def _ingest(st: AgentState, records: list[bytes]) -> None:
    Ingestor(st, None, lambda: T0 + 1e6).ingest(Batch(records, {}, "s"))


def _doc(st: AgentState) -> Any:
    return json.loads(json.dumps(st.to_doc()))


def _head() -> dict[str, Any]:
    return {"format": STATE_FORMAT, "version": STATE_VERSION, "created": 0.0, "sources": {"s": 1}}


def _restored(store: CheckpointStore) -> AgentState:
    doc = store.load()
    assert doc is not None
    out = _state()
    with store.reader() as reader:
        out.load_doc(doc, resolve=resolver(reader))
    return out


def _buckets(st: AgentState) -> list[BucketStats]:
    return [b for mw in st.models.values() for ring in mw.rings.values() for _, _, _, b in ring.entries()]


# -- packed bucket documents ------------------------------------------------------------------------------------
def _bucket(kind: str, rng: np.random.Generator) -> BucketStats:
    if kind == "multiclass":
        b = BucketStats(4, bins=64, reservoir=16, levelset_lambda=8)
        b.update(probs=rng.dirichlet(np.ones(4), 300), labels=rng.integers(0, 4, 300), predictions=True)
        return b
    b = BucketStats(2, bins=1024, reservoir=64)
    n = {"empty": 0, "sparse": 20, "dense": 5000}[kind]
    if n:
        z = rng.random(n)
        b.update(score=z, labels=(rng.random(n) < z).astype(np.int64), predictions=True)
    return b


@pytest.mark.parametrize("kind", ["empty", "sparse", "dense", "multiclass"])
def test_packed_round_trip_is_exact_and_continues_identically(kind: str) -> None:
    rng = np.random.default_rng(7)
    b = _bucket(kind, rng)
    packed = b.to_packed()
    assert packed["version"] == 2 and "data" in packed
    eager = BucketStats.from_dict(json.loads(encode(packed)))
    lazy = BucketStats.load(encode(packed))
    assert lazy.packed_json() is not None  # kept as bytes until first use
    assert eager.to_dict() == lazy.to_dict() == b.to_dict()
    assert lazy.packed_json() is None  # decoded by the read
    for other in (eager, lazy):  # the generator state travelled too: the same rows are sampled next
        more = np.random.default_rng(3)
        if kind == "multiclass":
            p, y = more.dirichlet(np.ones(4), 500), more.integers(0, 4, 500)
            other.update(probs=p, labels=y)
        else:
            z = more.random(500)
            other.update(score=z, labels=(z > 0.5).astype(np.int64))
    ref = BucketStats.from_dict(b.to_dict())
    more = np.random.default_rng(3)
    if kind == "multiclass":
        ref.update(probs=more.dirichlet(np.ones(4), 500), labels=more.integers(0, 4, 500))
    else:
        z = more.random(500)
        ref.update(score=z, labels=(z > 0.5).astype(np.int64))
    assert eager.to_dict() == lazy.to_dict() == ref.to_dict()


def test_packed_is_smaller_and_unpacked_documents_still_read() -> None:
    b = _bucket("sparse", np.random.default_rng(1))
    assert len(encode(b.to_packed())) < len(encode(b.to_dict()))
    assert BucketStats.load(encode(b.to_dict())).to_dict() == b.to_dict()  # version 1, from bytes: parsed now


@pytest.mark.parametrize("damage,message", [
    (lambda d: d.update(data=d["data"][:-8]), "packed payload is corrupt"),
    (lambda d: d["arrays"].append(["<i8", [3]]), "its arrays need"),
    (lambda d: d["arrays"].__setitem__(0, ["<u2", [1]]), "expected [dtype, shape]"),
    (lambda d: d.update(version=9), "version 9 is not supported"),
])
def test_damaged_packed_document_is_a_clear_error(damage: Any, message: str) -> None:
    d = _bucket("sparse", np.random.default_rng(2)).to_packed()
    damage(d)
    with pytest.raises(ValueError, match=message.replace("[", r"\[")):
        BucketStats.from_dict(d)


# -- restore: lazy, old stores --------------------------------------------------------------------------------
def test_restore_keeps_buckets_packed_until_read_and_rewrites_them_unchanged(tmp_path) -> None:
    st = _state()
    _ingest(st, _records(["a", "b", "c"], 3000, T0, 0))
    store = CheckpointStore(tmp_path / "one")
    ck = Checkpointer(store)
    ck.submit(ck.capture(st, _head()))
    assert ck.wait() is not None
    again = _restored(store)
    assert all(b.packed_json() is not None for b in _buckets(again))  # nothing decoded by the restore
    assert [(s.model, s.segment, s.window, s.bucket.to_dict()) for s in again.snapshot()] == [
        (s.model, s.segment, s.window, s.bucket.to_dict()) for s in st.snapshot()]
    # a restored bucket nobody changed is written back byte for byte (no decode, no re-encode)
    third = _restored(store)
    raw = {id(b): b.packed_json() for b in _buckets(third)}
    other = CheckpointStore(tmp_path / "two")
    ck2 = Checkpointer(other)
    cap = ck2.capture(third, _head())
    written: list[bytes] = []
    orig = PackWriter.append

    def append(self: PackWriter, data: bytes) -> Any:
        written.append(data)
        return orig(self, data)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(PackWriter, "append", append)
        ck2.submit(cap)
        assert ck2.wait() is not None
    assert sorted(written) == sorted(r for r in raw.values() if r is not None)
    assert _doc(_restored(other)) == _doc(st)


def test_a_version_2_store_with_unpacked_buckets_still_restores(tmp_path, monkeypatch) -> None:
    st = _state()
    _ingest(st, _records(["a", "b"], 2000, T0, 3))
    store = CheckpointStore(tmp_path)
    with monkeypatch.context() as mp:  # what the previous release wrote: store version 2, buckets as to_dict
        mp.setattr(checkpoint_module, "VERSION", 2)
        mp.setattr(Slot, "serialise", lambda self: (encode(self.source.to_dict()), self.abandon())[0])
        ck = Checkpointer(store)
        ck.submit(ck.capture(st, _head()))
        assert ck.wait() is not None
    assert json.loads(store.path_of(store.generations()[-1]).read_text())["version"] == 2
    assert b'"zlib_b64"' in next(tmp_path.glob("pack-*.jsonl")).read_bytes()
    again = _restored(store)
    assert _doc(again) == _doc(st)
    ck2 = Checkpointer(store)  # and the next generation (version 3) builds on it incrementally
    loaded = store.load()
    assert loaded is not None
    ck2.adopt(again, loaded)
    _ingest(again, _records(["a"], 10, T0 + 3000, 4, span=60))
    ck2.submit(ck2.capture(again, _head()))
    res = ck2.wait()
    assert res is not None and 0 < res.blobs <= 2
    assert _doc(_restored(store)) == _doc(again)


# -- copy-on-write ------------------------------------------------------------------------------------------------
def test_a_bucket_changed_while_its_checkpoint_is_written_is_written_as_captured(tmp_path) -> None:
    st, ref = _state(), _state()
    first = _records(["a", "b", "c"], 3000, T0, 5)
    _ingest(st, first)
    _ingest(ref, first)
    store = CheckpointStore(tmp_path)
    ck = Checkpointer(store)
    cap = ck.capture(st, _head())
    captured = _doc(st)
    assert all(s.source is not None and s.state is None for s in cap.dirty)  # frozen, not copied
    later = _records(["a", "b"], 500, T0 + 3500, 6, span=7200)  # into captured buckets, and rolling tiers
    _ingest(st, later)
    _ingest(ref, later)
    assert any(s.state is not None for s in cap.dirty)  # the changed ones were copied just before the change
    ck.submit(cap)
    assert ck.wait() is not None
    assert _doc(_restored(store)) == captured  # the checkpoint holds the state at the capture
    assert _doc(st) == _doc(ref)  # and the live state went on as if there had been no checkpoint
    assert all(b._hold is None for b in _buckets(st))


def test_a_failed_write_releases_every_claim(tmp_path, monkeypatch) -> None:
    st = _state()
    _ingest(st, _records(["a", "b"], 2000, T0, 8))
    store = CheckpointStore(tmp_path)
    ck = Checkpointer(store)
    with monkeypatch.context() as mp:
        mp.setattr(PackWriter, "commit", lambda self: (_ for _ in ()).throw(OSError("disk full")))
        ck.submit(ck.capture(st, _head()))
        with pytest.raises(OSError, match="disk full"):
            ck.wait()
    assert all(b._hold is None for b in _buckets(st))
    ck.submit(ck.capture(st, _head()))
    assert ck.wait() is not None
    assert _doc(_restored(store)) == _doc(st)


# -- snapshot and lock --------------------------------------------------------------------------------------------
def test_snapshot_sums_of_ring_copies_equal_the_rings_own_sums() -> None:
    st = _state()
    _ingest(st, _records(["a", "b"], 4000, T0, 9, span=5 * 86400))
    wm = st.joiner.watermark
    for s in st.snapshot():
        direct = st.models[s.model].rings[s.segment].window_sums(st.windows, watermark=wm)[s.window]
        assert s.bucket.to_dict() == direct.to_dict()


def test_state_lock_holds_off_the_collector_and_restores_it() -> None:
    lock = StateLock()
    assert gc.isenabled()
    with lock:
        assert not gc.isenabled()
        with lock:
            assert not gc.isenabled()
        assert not gc.isenabled()
    assert gc.isenabled()
    gc.disable()
    try:
        with lock:
            pass
        assert not gc.isenabled()  # the application's choice is left alone
    finally:
        gc.enable()
    assert lock.acquire(blocking=False)
    lock.release()
    with pytest.raises(RuntimeError):
        lock.release()
