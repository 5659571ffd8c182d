"""Incremental checkpoints (issue #15): only dirty buckets written, copies under the lock only, GC keeps `keep`
generations restorable, SIGKILL during a blob or manifest write is exactly-once, damaged blobs named in one line."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import threading
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from calmon.config import build_config
from calmon.state.agentstate import AgentState
from calmon.state.buckets import BucketStats
from calmon.state.checkpoint.incremental import Checkpointer, resolver
from calmon.state.checkpoint.packs import PackWriter
from calmon.state.checkpoint.schema import STATE_FORMAT, STATE_VERSION
from calmon.state.checkpoint.store import CheckpointStore
from calmon.state.ingest import Ingestor
from calmon.state.windows import TieredRing
from connectors.base import Batch

ROOT = Path(__file__).resolve().parents[1]
T0 = 1_767_225_600


def _state(models: int = 50) -> AgentState:
    cfg = build_config({"sources": [{"path": "x"}], "limits": {"max_models": max(50, models)},
                        "models": {"default": {"bins": 64, "reservoir": 8, "segments": ["web"]}}}, env={})
    return AgentState(cfg)


def _records(models: list[str], n: int, t0: float, seed: int, span: float = 3600.0) -> list[bytes]:
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        z = float(rng.random())
        out.append(json.dumps({"model": models[i % len(models)], "ts": t0 + i * span / n, "score": z,
                               "label": int(rng.random() < z), "segment": ["web", "app"][i % 2]}).encode())
    return out


def _ingest(st: AgentState, records: list[bytes]) -> None:
    Ingestor(st, None, lambda: T0 + 1e6).ingest(Batch(records, {}, "s"))


def _write(ck: Checkpointer, st: AgentState):
    ck.submit(ck.capture(st, {"format": STATE_FORMAT, "version": STATE_VERSION, "created": 0.0, "sources": {"s": 1}}))
    return ck.wait()


def _versions(st: AgentState) -> dict:
    return {(m, seg, t, k): v for m, mw in st.models.items() for seg, r in mw.rings.items()
            for t, k, v, _ in r.entries()}


def _restored(st: AgentState, store: CheckpointStore, generation: int | None = None) -> AgentState:
    doc = store.load() if generation is None else store.read(generation)
    assert doc is not None
    out = _state()
    with store.reader() as reader:
        out.load_doc(doc, resolve=resolver(reader))
    return out


def _doc(st: AgentState) -> Any:
    return json.loads(json.dumps(st.to_doc()))  # plain JSON values (ints and floats compare equal)


def _same(a: AgentState, b: AgentState) -> bool:
    return bool(_doc(a) == _doc(b))


def test_only_dirty_buckets_are_written_and_restore_is_identical(tmp_path, monkeypatch):
    names = [f"m{i:02d}" for i in range(50)]
    st = _state()
    _ingest(st, _records(names, 5000, T0, 0))
    store = CheckpointStore(tmp_path)
    ck = Checkpointer(store)
    appended: list[int] = []
    orig = PackWriter.append

    def append(self: PackWriter, data: bytes) -> Any:
        appended.append(len(data))
        return orig(self, data)

    monkeypatch.setattr(PackWriter, "append", append)
    first = _write(ck, st)
    assert first.blobs == len(appended) == len(_versions(st)) > 100
    before = _versions(st)
    _ingest(st, _records(["m07"], 20, T0 + 3000, 1, span=60))  # a change in one model of 50, in existing buckets
    after = _versions(st)
    changed = {k for k, v in after.items() if before.get(k) != v}
    assert changed and {k[0] for k in changed} == {"m07"}
    appended.clear()
    second = _write(ck, st)
    assert second.blobs == len(appended) == len(changed)  # exactly the dirty buckets, nothing else
    assert second.bytes < first.bytes / 5
    assert _same(_restored(st, store), st)
    appended.clear()
    assert _write(ck, st).blobs == 0 and not appended  # nothing changed: no blob


def test_restart_adopts_the_loaded_generation(tmp_path):
    """After a restore the first checkpoint is incremental too (versions paired with the loaded references)."""
    names = [f"m{i:02d}" for i in range(5)]
    st = _state()
    _ingest(st, _records(names, 2000, T0, 0))
    store = CheckpointStore(tmp_path)
    _write(Checkpointer(store), st)
    again = _restored(st, store)
    ck2 = Checkpointer(store)
    loaded = store.load()
    assert loaded is not None
    ck2.adopt(again, loaded)
    assert _write(ck2, again).blobs == 0
    before = _versions(again)
    _ingest(again, _records(["m01"], 10, T0 + 3000, 2, span=60))
    changed = {k for k, v in _versions(again).items() if before.get(k) != v}
    res = _write(ck2, again)
    assert 0 < res.blobs == len(changed) <= 2  # the touched bucket of rings "all" and "web"
    assert _same(_restored(again, store), again)


def test_gc_keeps_keep_generations_restorable(tmp_path):
    names = [f"m{i:02d}" for i in range(6)]
    st = _state()
    store = CheckpointStore(tmp_path, keep=2)
    ck = Checkpointer(store)
    expected: dict[int, Any] = {}
    for step in range(8):  # each generation moves the watermark: buckets roll, packs fill with dead blobs
        _ingest(st, _records(names[step % 3:], 600, T0 + step * 1800, step))
        res = _write(ck, st)
        expected[res.generation] = _doc(st)
    kept = store.generations()
    assert len(kept) == 2 and kept[-1] == max(expected)
    for g in kept:  # every kept generation restores to the state it was taken of
        assert _doc(_restored(st, store, g)) == expected[g]
    referenced = set()
    for g in kept:
        top = json.loads(store.path_of(g).read_text())
        referenced |= set(top.get("packs", []))
    assert set(store.pack_generations()) == referenced  # nothing else is left behind
    assert not [p for p in os.listdir(tmp_path) if p.endswith(".tmp")]


def test_sparse_packs_are_compacted(tmp_path):
    """A pack whose live blobs fall below half its size has them rewritten, then it is removed."""
    names = [f"m{i:02d}" for i in range(8)]
    st = _state()
    _ingest(st, _records(names, 4000, T0, 0))
    store = CheckpointStore(tmp_path, keep=1)
    ck = Checkpointer(store)
    first = _write(ck, st).generation
    for step in range(1, 6):  # rewrite most buckets of the first pack: it becomes sparse
        _ingest(st, _records(names[:7], 2000, T0 + 60 * step, step))
        _write(ck, st)
    assert first not in store.pack_generations()
    assert _same(_restored(st, store), st)


class _Probe:
    """A lock proxy that records which calls happen while it is held."""

    def __init__(self, inner: Any) -> None:
        self.inner, self.held, self.calls = inner, 0, {"copy": 0, "to_dict": 0, "entries": 0, "freeze": 0}

    def __enter__(self) -> bool:
        self.inner.acquire()
        self.held += 1
        return True

    def __exit__(self, *exc: object) -> None:
        self.held -= 1
        self.inner.release()

    def count(self, name: str) -> bool:
        if self.held and threading.current_thread() is threading.main_thread():
            self.calls[name] += 1
        return False


def _lock_work(models: int, monkeypatch) -> dict[str, int]:
    names = [f"m{i:03d}" for i in range(models)]
    st = _state(models)
    _ingest(st, _records(names, 30 * models, T0, 0))
    ck = Checkpointer(CheckpointStore(Path(os.environ["CKPT_TMP"]) / f"m{models}"))
    _write(ck, st)
    _ingest(st, _records(["m001"], 20, T0 + 3000, 1, span=60))
    probe = _Probe(st.lock)
    st.lock = probe  # type: ignore[assignment]  # the proxy has the lock's context-manager protocol
    with monkeypatch.context() as mp:
        for cls, name in ((BucketStats, "copy"), (BucketStats, "to_dict"), (TieredRing, "entries"),
                          (BucketStats, "freeze")):
            orig = getattr(cls, name)
            mp.setattr(cls, name, lambda self, *a, _o=orig, _n=name, **k: probe.count(_n) or _o(self, *a, **k))
        _write(ck, st)
    return probe.calls


def test_lock_hold_does_not_grow_with_the_number_of_models(tmp_path, monkeypatch):
    """Under the lock: claims on the changed buckets only (copy-on-write: no copy, no serialisation) -- the same
    work at 10 and 200 models."""
    monkeypatch.setenv("CKPT_TMP", str(tmp_path))
    small, large = _lock_work(10, monkeypatch), _lock_work(200, monkeypatch)
    assert small == large
    assert small["to_dict"] == 0 and small["copy"] == 0 and 0 < small["freeze"] <= 2 and small["entries"] <= 2


# -- SIGKILL during a blob write and during the manifest write: exactly once -----------------------------------
_KILLER = textwrap.dedent(
    """
    import os, signal, sys
    import calmon.state.checkpoint.store as C
    import calmon.state.checkpoint.packs as P
    mode, n, cfg = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    calls = [0]
    if mode == "blob":
        orig = P.PackWriter.append
        def append(self, data):
            calls[0] += 1
            if calls[0] == n:  # half of the blob reaches the temporary pack, then the process dies
                self._file.write(data[: len(data) // 2])
                self._file.flush()
                os.kill(os.getpid(), signal.SIGKILL)
            return orig(self, data)
        P.PackWriter.append = append
    else:
        orig_w = C.write_bytes_atomic
        def write(path, data, **kw):
            calls[0] += 1
            if calls[0] == n:  # half of the manifest reaches its temporary file, then the process dies
                (path.parent / ("." + path.name + ".killed.tmp")).write_bytes(data[: len(data) // 2])
                os.kill(os.getpid(), signal.SIGKILL)
            return orig_w(path, data, **kw)
        C.write_bytes_atomic = write
    from calmon.commands import run
    sys.exit(run.main(["-c", cfg]))
    """
)


@pytest.mark.slow
@pytest.mark.parametrize("mode,nth", [("blob", 10), ("manifest", 3)])
def test_sigkill_during_blob_or_manifest_write_is_exactly_once(tmp_path, mode, nth):
    sys.path.insert(0, str(ROOT / "tests"))
    from test_agent_crash import compare, final_state, make_input, run_to_end, write_config

    events = tmp_path / "events.jsonl"
    make_input(events, 60000)
    ref = tmp_path / "reference"
    ref.mkdir()
    run_to_end(write_config(ref, events, checkpoint_every="0.05s"))
    reference, ref_dead = final_state(ref)
    d = tmp_path / mode
    d.mkdir()
    cfg = write_config(d, events, checkpoint_every="0.05s")
    proc = subprocess.run([sys.executable, "-c", _KILLER, mode, str(nth), str(cfg)], cwd=ROOT, capture_output=True,
                          text=True, env=dict(os.environ, PYTHONPATH=str(ROOT)), timeout=600)
    assert proc.returncode == -9, proc.stderr[-2000:]  # it really died inside the write
    ckdir = d / "state" / "checkpoints"
    assert [p for p in os.listdir(ckdir) if p.endswith(".tmp")]  # the torn file is there, unreferenced
    store = CheckpointStore(ckdir)
    doc = store.load()  # the previous generation, complete
    assert doc is not None and store.inline(doc)["models"] is not None
    run_to_end(cfg)  # restarts from the previous manifest's positions, to the end
    state, dead = final_state(d)
    assert compare(reference, state) is None and dead == ref_dead


# -- damaged or edited blobs and references: one line naming the file and the field ----------------------------
# (when an older generation verifies, the agent falls back to it instead: tests/test_checkpoint_fallback.py;
# these tests keep only the newest generation, so that none verifies)
def _only_newest(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path / "state" / "checkpoints")
    for g in store.generations()[:-1]:
        store.path_of(g).unlink()


def _agent_dir(tmp_path: Path) -> Path:
    from calmon.agent.runtime import Agent
    from calmon.config import load_config
    lines = [json.dumps({"model": "m", "ts": T0 + i, "score": 0.5, "label": i % 2}) for i in range(50)]
    (tmp_path / "ev.jsonl").write_text("\n".join(lines) + "\n")
    cfg = tmp_path / "calmon.yaml"
    cfg.write_text(f"state_dir: {tmp_path / 'state'}\nsources: [{{path: {tmp_path / 'ev.jsonl'}}}]\n"
                   "exporter: {enabled: false}\nevaluation: {tests: []}\ningest: {exit_when_done: true}\n")
    assert Agent(load_config(cfg)).run() == 0
    return cfg


def _run_fails(cfg: Path, capsys) -> str:
    from calmon.commands import run as run_cmd
    capsys.readouterr()
    assert run_cmd.main(["-c", str(cfg)]) == 2
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


def test_damaged_blob_gives_one_line_naming_pack_and_field(tmp_path, capsys):
    cfg = _agent_dir(tmp_path)
    ckdir = tmp_path / "state" / "checkpoints"
    store = CheckpointStore(ckdir)
    pack = store.directory / f"pack-{store.pack_generations()[-1]:012d}.jsonl"
    data = bytearray(pack.read_bytes())
    i = data.index(b'"data":"') + 10  # inside a bucket's packed payload
    data[i] = ord("A") if data[i] != ord("A") else ord("B")  # a flipped byte inside a blob
    pack.write_bytes(bytes(data))
    _only_newest(tmp_path)
    line = _run_fails(cfg, capsys)
    assert str(pack) in line and "field models.m.rings.all" in line and "checksum" in line, line


def test_edited_blob_reference_gives_one_line_naming_field(tmp_path, capsys):
    cfg = _agent_dir(tmp_path)
    ck = sorted((tmp_path / "state" / "checkpoints").glob("checkpoint-*.json"))[-1]
    top = json.loads(ck.read_text())
    top["sha256"] = None
    ring = top["state"]["models"]["m"]["rings"]["all"]
    ring["buckets"][0][0][1]["len"] = "many"
    ck.write_text(json.dumps(top))
    _only_newest(tmp_path)
    line = _run_fails(cfg, capsys)
    assert str(ck) in line and "field models.m.rings.all.buckets.0.0.1" in line, line


def test_missing_pack_gives_one_line(tmp_path, capsys):
    cfg = _agent_dir(tmp_path)
    store = CheckpointStore(tmp_path / "state" / "checkpoints")
    pack = store.directory / f"pack-{store.pack_generations()[-1]:012d}.jsonl"
    pack.unlink()
    _only_newest(tmp_path)
    line = _run_fails(cfg, capsys)
    assert str(pack) in line and "field models.m.rings" in line, line


def test_version_1_checkpoint_is_read(tmp_path):
    """A checkpoint of the previous format (every bucket inline) restores; the next generation writes it all."""
    from calmon.agent.runtime import Agent
    from calmon.config import load_config
    cfg = _agent_dir(tmp_path)
    agent = Agent(load_config(cfg))
    agent.open()
    full = agent.state_doc()
    agent.close()
    ckdir = tmp_path / "state" / "checkpoints"
    for p in ckdir.iterdir():
        p.unlink()
    old = dict(full, version=1)
    body = json.dumps(old, separators=(",", ":")).encode()
    import hashlib

    head = {"format": "calmon-checkpoint", "version": 1, "generation": 1, "created": "x",
            "sha256": hashlib.sha256(body).hexdigest()}
    (ckdir / "checkpoint-000000000001.json").write_bytes(json.dumps(head, separators=(",", ":"))[:-1].encode()
                                                         + b',"state":' + body + b"}\n")
    again = Agent(load_config(cfg))
    again.open()
    try:
        assert _doc(again.state) == json.loads(json.dumps(
            {k: full[k] for k in ("decoder", "join", "models", "counters", "changes")}))
        assert again.checkpointer is not None and not again.checkpointer.known  # nothing adopted from v1
        assert again.checkpoint()
        assert again.checkpointer.known  # the new generation has every bucket as a blob
    finally:
        again.close()
