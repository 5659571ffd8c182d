"""Checkpoint store: atomic generations, verification, fallback, and survival of SIGKILL during saves."""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest

from calmon.state.checkpoint.store import FORMAT, VERSION, CheckpointError, CheckpointStore
from calmon.stats.grid import ScoreGrid
from calmon.stats.model import ModelStats

REPO = Path(__file__).resolve().parents[1]


def test_round_trip_with_statistics(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    z = rng.random(5000)
    y = (rng.random(5000) < z).astype(float)
    grid = ScoreGrid()
    grid.update(z, y)
    stats = ModelStats(classes=2)
    stats.update(score=z, labels=y.astype(int))
    doc = {"grid": grid.to_dict(), "stats": stats.to_dict(), "n": np.int64(5000), "x": np.float64(0.5),
           "nan": float("nan"), "inf": -math.inf, "positions": {"files": {"version": 1, "files": []}},
           "arr": np.arange(3)}
    store = CheckpointStore(tmp_path / "state")
    path = store.save(doc)
    assert path.name == "checkpoint-000000000001.json"
    got = store.load()
    assert ScoreGrid.from_dict(got["grid"]) == grid
    assert ModelStats.from_dict(got["stats"]) == stats
    assert got["n"] == 5000 and got["x"] == 0.5 and math.isnan(got["nan"]) and got["inf"] == -math.inf
    assert got["arr"] == [0, 1, 2]
    top = json.loads(path.read_text())
    assert top["format"] == FORMAT and top["version"] == VERSION and top["generation"] == 1
    assert set(top) == {"format", "version", "generation", "created", "sha256", "state"}


def test_generations_kept_and_numbering_continues(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path, keep=3)
    for i in range(7):
        store.save({"i": i})
    assert store.generations() == [5, 6, 7]
    assert store.load() == {"i": 6}
    store2 = CheckpointStore(tmp_path, keep=1)  # a restarted agent continues the numbering
    store2.save({"i": 7})
    assert store2.generations() == [8] and store2.load() == {"i": 7}
    assert store.read(8) == {"i": 7}


def test_torn_temp_file_is_ignored_and_cleaned(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path)
    store.save({"ok": 1})
    tmp = tmp_path / "checkpoint-000000000002.json.tmp"
    tmp.write_bytes(b'{"format":"calmon-checkpoint","version":1,"generation":2,"sha')  # crash mid-write
    assert store.load() == {"ok": 1}
    assert tmp.exists()  # load does not modify the directory
    store.save({"ok": 2})
    assert not tmp.exists() and store.load() == {"ok": 2}


def test_damaged_newest_falls_back_and_all_damaged_raises(tmp_path: Path, caplog) -> None:
    store = CheckpointStore(tmp_path)
    store.save({"v": "one" * 100})
    p2 = store.save({"v": "two" * 100})
    data = bytearray(p2.read_bytes())
    data[data.index(b"twotwo") + 1] = ord("X")  # a flipped byte inside the state: still valid JSON
    p2.write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match="checksum"):
        store.read(2)
    assert store.load() == {"v": "one" * 100}
    assert "skipping damaged checkpoint" in caplog.text
    # an edited file is accepted when its checksum is cleared
    top = json.loads(p2.read_text())
    top["sha256"] = None
    p2.write_text(json.dumps(top))
    assert store.load()["v"].startswith("tXo")
    # truncate every generation: no silent fresh start
    for g in store.generations():
        path = store.path_of(g)
        path.write_bytes(path.read_bytes()[:50])
    with pytest.raises(CheckpointError, match="no readable checkpoint"):
        store.load()


def test_rejects_foreign_or_newer_files(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path)
    store.path_of(1).write_text(json.dumps({"format": FORMAT, "version": VERSION + 1, "state": {}}))
    with pytest.raises(CheckpointError, match="version"):
        store.load()
    store.path_of(1).write_text(json.dumps({"hello": 1}))
    with pytest.raises(CheckpointError, match="not a calmon checkpoint"):
        store.load()
    with pytest.raises(ValueError, match="dict"):
        store.save([1, 2])  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="keep"):
        CheckpointStore(tmp_path, keep=0)
    with pytest.raises(TypeError, match="not JSON-serialisable"):
        store.save({"x": object()})


def test_empty_directory_loads_none(tmp_path: Path) -> None:
    assert CheckpointStore(tmp_path / "new").load() is None


_WRITER = textwrap.dedent(
    """
    import sys
    from calmon.state.checkpoint.store import CheckpointStore
    store = CheckpointStore(sys.argv[1], keep=2)
    blob = "x" * 2_000_000
    i = 0
    while True:
        i += 1
        store.save({"i": i, "blob": blob, "check": len(blob) + i})
        print(i, flush=True)
    """
)


def test_sigkill_during_saves_leaves_a_valid_checkpoint(tmp_path: Path) -> None:
    """Kill a process that saves 2 MB checkpoints in a loop at random moments (10 trials): the store
    always loads a complete generation, at least as new as the last one the writer reported."""
    rng = np.random.default_rng(1)
    env = dict(os.environ, PYTHONPATH=str(REPO))
    for trial in range(10):
        d = tmp_path / f"t{trial}"
        proc = subprocess.Popen([sys.executable, "-c", _WRITER, str(d)], stdout=subprocess.PIPE, env=env,
                                text=True)
        first = proc.stdout.readline()  # at least one save completed
        assert first.strip() == "1"
        time.sleep(float(rng.uniform(0.0, 0.3)))
        proc.send_signal(signal.SIGKILL)
        out = proc.communicate()[0].split()
        last_reported = int(out[-1]) if out else 1
        doc = CheckpointStore(d).load()
        assert doc is not None
        assert doc["check"] == len(doc["blob"]) + doc["i"]
        assert doc["i"] >= last_reported


def test_save_leaves_no_temporary_file(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path)
    (tmp_path / ".checkpoint-000000000001.json.x1y2.tmp").write_bytes(b"{")  # a crashed atomic write
    store.save({"a": 1})
    store.save({"a": 2})
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint-000000000001.json",
                                                          "checkpoint-000000000002.json"]


# -- hand-edited checkpoints (issue #14): one line naming the file and the field -----------------------------------
def _agent_with_checkpoints(tmp_path: Path) -> Path:
    """Run an agent to the end of a small stream (two checkpoint generations at least); return its config."""
    from calmon.agent.runtime import Agent
    from calmon.config import load_config
    lines = [json.dumps({"model": "m", "ts": 1_767_225_600 + i, "score": 0.5, "label": i % 2}) for i in range(50)]
    lines += [json.dumps({"type": "prediction", "id": f"p{i}", "model": "m", "ts": 1_767_225_700 + i, "score": 0.4})
              for i in range(5)]
    (tmp_path / "ev.jsonl").write_text("\n".join(lines) + "\n")
    cfg = tmp_path / "calmon.yaml"
    cfg.write_text(f"state_dir: {tmp_path / 'state'}\nsources: [{{path: {tmp_path / 'ev.jsonl'}}}]\n"
                   "exporter: {enabled: false}\nevaluation: {tests: []}\ningest: {exit_when_done: true}\n")
    assert Agent(load_config(cfg)).run() == 0
    return cfg


def _edit_newest(cfg: Path, edit) -> Path:
    ck = sorted((cfg.parent / "state" / "checkpoints").glob("checkpoint-*.json"))[-1]
    doc = json.loads(ck.read_text())
    doc["sha256"] = None  # the documented way to make the store accept an edited file
    edit(doc["state"])
    ck.write_text(json.dumps(doc))
    return ck


def _del(*keys):
    def edit(state):
        node = state
        for k in keys[:-1]:
            node = node[k]
        del node[keys[-1]]
    return edit


def _set(value, *keys):
    def edit(state):
        node = state
        for k in keys[:-1]:
            node = node[k]
        node[keys[-1]] = value
    return edit


@pytest.mark.parametrize("edit,field", [
    (_del("join", "pending"), "join.pending"),
    (_set("soon", "join", "ttl"), "join.ttl"),
    (_set(["a", 1], "join", "pending", "ts"), "join.pending"),
    (_set("x", "counters", "events"), "counters.events"),
    (_del("models", "m", "rings"), "models.m.rings"),
    (_set({"all": {"nonsense": 1}}, "models", "m", "rings"), "models.m"),
    (_del("sources"), "sources"),
    (_set({"version": 1, "states": [{"bogus": 1}]}, "alerts"), "alerts"),
    (_set(None, "decoder"), "decoder"),
])
def test_hand_edited_checkpoint_gives_one_line_naming_file_and_field(tmp_path, capsys, edit, field):
    from calmon.commands import run as run_cmd
    cfg = _agent_with_checkpoints(tmp_path)
    if field == "alerts":  # alert states are only read when rules are configured
        cfg.write_text(cfg.read_text() + "alerts: {rules: [{name: Drift, kind: test_rejected, test: tcal}]}\n")
    ck = _edit_newest(cfg, edit)
    capsys.readouterr()
    assert run_cmd.main(["-c", str(cfg)]) == 2
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err, err
    assert str(ck) in lines[0] and f"field {field}" in lines[0], lines[0]


def test_damaged_newest_generation_still_falls_back_at_agent_level(tmp_path, capsys):
    from calmon.agent.runtime import Agent
    from calmon.config import load_config
    cfg = _agent_with_checkpoints(tmp_path)
    cks = sorted((tmp_path / "state" / "checkpoints").glob("checkpoint-*.json"))
    assert len(cks) >= 2
    cks[-1].write_bytes(cks[-1].read_bytes()[:-40] + b"garbage")  # torn / damaged: checksum fails
    agent = Agent(load_config(cfg))
    agent.open()
    try:
        assert agent.store is not None and agent.store.loaded_path == cks[-2]
        previous = json.loads(cks[-2].read_text())["state"]
        assert agent.state.counters.to_dict() == previous["counters"]
    finally:
        agent.close()
