"""A damaged newest checkpoint generation -- a truncated or lost pack, a flipped byte in a blob -- is skipped with a
warning naming the file and the reason, and the agent starts from the previous generation: its state and source
positions are that generation's, so re-reading what the skipped generation covered counts nothing twice (#31.8)."""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from calmon.agent.runtime import Agent
from calmon.config import load_config
from calmon.state.checkpoint.packs import pack_path
from calmon.state.checkpoint.store import CheckpointError, CheckpointStore

T0 = 1_767_225_600


def lines(n: int, start: int, seed: int) -> str:
    rng = np.random.default_rng(seed)
    out = []
    for i in range(start, start + n):
        z = float(rng.random())
        out.append(json.dumps({"model": f"m{i % 3}", "ts": T0 + i, "score": z, "label": int(rng.random() < z),
                               "segment": ["web", "app"][i % 2]}))
    return "\n".join(out) + "\n"


def write_config(d: Path, events: Path) -> Path:
    """``events``: the directory of the input files (a file once done is not re-read: a new file is new input)."""
    cfg = d / "calmon.yaml"
    cfg.write_text(f"state_dir: {d / 'state'}\nsources: [{{name: replay, path: '{events}/*.jsonl'}}]\n"
                   "models: {default: {bins: 128, reservoir: 16, segments: [web]}}\n"
                   "exporter: {enabled: false}\nevaluation: {tests: []}\n"
                   "checkpoint: {keep: 5}\ningest: {exit_when_done: true}\n")
    return cfg


def opened(cfg: Path) -> tuple[Any, dict[str, Any], Path | None]:
    """The state document, source positions and loaded manifest of an agent just opened on ``cfg``."""
    agent = Agent(load_config(cfg))
    agent.open()
    try:
        doc = json.loads(json.dumps(agent.state.to_doc()))
        positions = json.loads(json.dumps({s.name: s.position() for s in agent.sources}))
        return doc, positions, agent.store.loaded_path if agent.store else None
    finally:
        agent.close()


def final(cfg: Path) -> Any:
    """The newest generation's state, as plain JSON, without what legitimately differs between runs."""
    store = CheckpointStore(Path(load_config(cfg).state_dir) / "checkpoints")
    doc = store.inline(store.load())
    doc.pop("created")
    doc.pop("dead_letter")  # (its file is the copy's own: another path and inode)
    doc["counters"].pop("batches")
    return doc


@pytest.fixture(scope="module")
def history(tmp_path_factory) -> Path:
    """Two runs over a growing file: generations 1 (start), 2 (first half, pack 2), 3 (second half, pack 3)."""
    d = tmp_path_factory.mktemp("history")
    events = d / "events"
    events.mkdir()
    (events / "a.jsonl").write_text(lines(400, 0, seed=1))
    cfg = write_config(d, events)
    assert Agent(load_config(cfg)).run() == 0
    (events / "b.jsonl").write_text(lines(400, 400, seed=2))
    assert Agent(load_config(cfg)).run() == 0
    store = CheckpointStore(d / "state" / "checkpoints")
    assert store.generations()[-2:] == [2, 3] and 3 in store.pack_generations()
    return d


def copy_of(history: Path, into: Path) -> Path:
    """A copy of the history's state directory with its own configuration (same input file)."""
    shutil.copytree(history / "state", into / "state")
    return write_config(into, history / "events")


@pytest.mark.parametrize("cut", ["empty", "header", "half", "last_blob_byte"])
def test_a_truncated_newest_pack_falls_back_to_the_previous_generation(history, tmp_path, cut, caplog):
    ref = tmp_path / "ref"
    ref.mkdir()
    ref_cfg = copy_of(history, ref)
    (ref / "state" / "checkpoints" / "checkpoint-000000000003.json").unlink()  # generation 2, as it was
    want_doc, want_pos, _ = opened(ref_cfg)

    bad = tmp_path / "bad"
    bad.mkdir()
    cfg = copy_of(history, bad)
    pack = pack_path(bad / "state" / "checkpoints", 3)
    data = pack.read_bytes()
    # (the last byte of a pack is the newline after its last blob: cutting it damages nothing)
    keep = {"empty": 0, "header": data.index(b"\n") + 1, "half": len(data) // 2, "last_blob_byte": len(data) - 2}[cut]
    pack.write_bytes(data[:keep])
    with caplog.at_level(logging.WARNING):
        doc, pos, loaded = opened(cfg)
    warned = [r.getMessage() for r in caplog.records if "skipping damaged checkpoint" in r.getMessage()]
    assert len(warned) == 1 and str(pack) in warned[0] and "file too short" in warned[0], warned
    assert "checkpoint-000000000003.json" in warned[0] and "previous generation" in warned[0]
    assert loaded is not None and loaded.name == "checkpoint-000000000002.json"
    assert doc == want_doc and pos == want_pos  # generation 2's state and its positions, not a mix

    # the rest of the input from generation 2's positions: the same final state as the undamaged history
    assert Agent(load_config(cfg)).run() == 0
    assert final(cfg) == final(write_config(history, history / "events"))


def test_a_lost_or_flipped_newest_pack_falls_back_too(history, tmp_path, caplog):
    for damage in ("lost", "flipped"):
        d = tmp_path / damage
        d.mkdir()
        cfg = copy_of(history, d)
        pack = pack_path(d / "state" / "checkpoints", 3)
        if damage == "lost":
            pack.unlink()
        else:
            data = bytearray(pack.read_bytes())
            i = data.index(b'"data":"') + 10
            data[i] = ord("A") if data[i] != ord("A") else ord("B")
            pack.write_bytes(bytes(data))
        caplog.clear()
        with caplog.at_level(logging.WARNING):
            _, _, loaded = opened(cfg)
        assert loaded is not None and loaded.name == "checkpoint-000000000002.json"
        warned = " ".join(r.getMessage() for r in caplog.records)
        assert str(pack) in warned and ("checksum mismatch" if damage == "flipped" else "No such file") in warned


def test_when_no_generation_verifies_the_error_names_each(history, tmp_path):
    cfg = copy_of(history, tmp_path)
    ck = tmp_path / "state" / "checkpoints"
    store = CheckpointStore(ck)
    for g in store.generations()[:-1]:
        store.path_of(g).unlink()
    pack = pack_path(ck, 3)
    pack.write_bytes(pack.read_bytes()[:100])
    with pytest.raises(CheckpointError, match=r"no readable checkpoint .*checkpoint-000000000003.json.*file too short"):
        store.load()
    assert store.load(verify=False) is not None  # (the manifest itself is intact)
    assert cfg.exists()


def measure(models: int, repeat: int = 3) -> dict[str, Any]:
    """CPU seconds (best of ``repeat``: wall time is meaningless on a loaded machine) of verifying every blob of
    a generation and of restoring it, for ``models`` models with 200 events each over 6 h."""
    import resource
    import sys
    import tempfile

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from test_checkpoint_incremental import _ingest, _records, _state, _write

    from calmon.state.checkpoint.incremental import Checkpointer, resolver
    from calmon.state.checkpoint.store import _refs

    def cpu() -> float:
        r = resource.getrusage(resource.RUSAGE_SELF)
        return r.ru_utime + r.ru_stime

    st = _state(models)
    _ingest(st, _records([f"m{i:03d}" for i in range(models)], 200 * models, T0, 0, span=6 * 3600.0))
    store = CheckpointStore(tempfile.mkdtemp())
    _write(Checkpointer(store), st)
    gen = store.generations()[-1]
    verify, restore = [], []
    for _ in range(repeat):
        doc = store.read(gen)
        c0 = cpu()
        store.verify(gen, doc)
        c1 = cpu()
        with store.reader() as reader:
            _state(models).load_doc(doc, resolve=resolver(reader))
        verify.append(c1 - c0)
        restore.append(cpu() - c1)
    return {"models": models, "blobs": sum(1 for _ in _refs(store.read(gen))),
            "bytes": sum(f.stat().st_size for f in store.directory.iterdir()),
            "verify_cpu_s": round(min(verify), 3), "restore_cpu_s": round(min(restore), 3)}


if __name__ == "__main__":  # python tests/test_checkpoint_fallback.py [MODELS ...]: the cost of verifying
    import sys

    for n in [int(a) for a in sys.argv[1:]] or [200]:
        print(json.dumps(measure(n)), flush=True)
