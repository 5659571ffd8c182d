"""The modules split out of ``calmon/algorithms/tcal/atoms.py`` and ``connectors/files.py``.

``Simulator`` (:mod:`calmon.algorithms.tcal.simulator`) and the file-source positions
(:mod:`connectors.filepositions`) stay importable where they were, and give what an independent
computation gives: the simulator ``Atoms.stats(*Atoms.draw(r, rng))`` (scipy's ``M @ X`` and a formed
``g = k (1 - 2p)``), bit for bit, on both of its paths; a position the dict built here from ``os.stat``
and ``hashlib``; a restore the files, offsets and lost entries of the scenarios below.
"""

import hashlib
import logging
import os
from pathlib import Path

import numpy as np
import pytest

import calmon.algorithms.tcal.simulator as simulator_mod
from calmon.algorithms.tcal.atoms import Atoms
from calmon.stats.grid import ScoreGrid
from connectors import filepositions
from connectors.files import FileSource


def test_reexports() -> None:
    import calmon.algorithms.tcal as tcal
    import calmon.algorithms.tcal.atoms as atoms_mod
    import connectors.files as files_mod

    assert atoms_mod.Simulator is simulator_mod.Simulator
    assert "Simulator" in atoms_mod.__all__
    assert tcal.simulate_null is atoms_mod.simulate_null
    assert files_mod.POSITION_VERSION == filepositions.POSITION_VERSION == 2
    assert "POSITION_VERSION" in files_mod.__all__


def _atoms(kind: str) -> Atoms:
    rng = np.random.default_rng(5)
    if kind == "raw":
        z = np.round(rng.beta(2, 3, size=700), 2)  # ties: atoms of several events next to singletons
        a = Atoms.from_raw(z, (rng.random(700) < z).astype(float))
        for m in (2, 16, 128, 1024):
            a.add_level(m)
        return a
    g = ScoreGrid(256)
    z = rng.uniform(size=900)
    g.update(z, (rng.random(900) < z).astype(float))
    a = Atoms.from_grid(g)
    for m in (4, 32, 256):
        a.add_level(m)
    return a


@pytest.mark.parametrize("kind", ["raw", "grid"])
@pytest.mark.parametrize("fold", [True, False])
def test_simulator_equals_stats_of_draws(monkeypatch: pytest.MonkeyPatch, kind: str, fold: bool) -> None:
    """Both paths of the kernel: the weights folded into the matrix, or ``g`` formed (FMA kernels)."""
    if fold and not simulator_mod._FOLD:
        pytest.skip("the CSR kernel fuses multiply-adds here: the folded path is never taken")
    monkeypatch.setattr(simulator_mod, "_FOLD", fold)
    atoms = _atoms(kind)
    sim = atoms.simulator(64)
    from_draws = [st.data[: st.indptr[st.rows // 2]] for st in sim.steps if st.source < 0]
    assert from_draws, "no level summed straight from the draws"
    # folded: the k block's entries are ones and the g block's the weights; unfolded: ones in both
    assert all(np.all(d == 1.0) for d in from_draws)
    g_blocks = [st.data[st.indptr[st.rows // 2]:] for st in sim.steps if st.source < 0]
    assert all(np.all(d == 1.0) for d in g_blocks) != fold
    for r, seed in ((64, 1), (17, 2)):
        T = sim(r, np.random.default_rng(seed))
        ref = atoms.stats(*atoms.draw(r, np.random.default_rng(seed)))
        assert np.array_equal(T, ref)
    sim.release()


def _entry(p: Path, offset: int, line: int, done: bool) -> dict:
    st = os.stat(p)
    data = p.read_bytes()
    n = min(1024, offset)
    return {"path": str(p), "dev": st.st_dev, "ino": st.st_ino, "offset": offset, "line": line,
            "fp": hashlib.sha1(data[offset - n:offset]).hexdigest(), "fp_len": n, "done": done}


def test_position_is_the_documented_dict(tmp_path: Path) -> None:
    a, b = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    a.write_bytes(b'{"score": 0.1, "label": 0}\n' * 3)
    b.write_bytes(b'{"score": 0.5, "label": 1}\n' * 40 + b'{"score": 0.5')
    src = FileSource(tmp_path, follow=True, name="pos")
    got = 0
    while got < 43:
        batch = src.read(max_records=10, timeout=0.5)
        assert batch is not None
        got += len(batch.records)
    pos = src.position()
    src.close()
    assert pos == {"version": 2, "kind": "files", "source": "pos",
                   "files": [_entry(a, 81, 4, False), _entry(b, 40 * 27, 41, False)]}


def _checkpoint(tmp_path: Path, rec: bytes) -> tuple[dict, dict, dict]:
    """Three files read to their end; then a appended to and rotated by rename, b removed, and an entry
    added whose file does not exist."""
    for name in ("a", "b", "c"):
        (tmp_path / f"{name}.jsonl").write_bytes(rec * 5)
    src = FileSource(tmp_path, name="s")
    while src.read(max_records=100) is not None:
        pass
    checkpoint = src.position()
    src.close()
    entries = {Path(e["path"]).name: e for e in checkpoint["files"]}
    assert all(e["done"] for e in entries.values())
    with (tmp_path / "a.jsonl").open("ab") as fh:
        fh.write(rec * 2)
    (tmp_path / "a.jsonl").rename(tmp_path / "a.jsonl.1")
    (tmp_path / "b.jsonl").unlink()
    gone = dict(entries["c.jsonl"], path=str(tmp_path / "gone.jsonl"), ino=entries["c.jsonl"]["ino"] + 10**9,
                done=False)
    checkpoint["files"].append(gone)
    return checkpoint, entries["b.jsonl"], gone


def test_seek_following_restores_rotated_and_lists_lost(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    rec = b'{"score": 0.3, "label": 1}\n'
    checkpoint, b_entry, gone = _checkpoint(tmp_path, rec)
    src = FileSource(tmp_path, name="s", follow=True)
    with caplog.at_level(logging.WARNING, logger="connectors.files"):
        src.seek(checkpoint)
    assert src.lost == [b_entry, gone]  # following, even a finished file that vanished is reported
    assert [r.name for r in caplog.records if "may be lost" in r.getMessage()] == ["connectors.files"] * 2
    records = []
    while (batch := src.read(max_records=100, timeout=0.3)) is not None:
        records += batch.records
    assert records == [rec[:-1]] * 2  # a's two new lines, under its new name; c not read again
    by_name = {Path(e["path"]).name: e for e in src.position()["files"]}
    assert by_name["c.jsonl"]["offset"] == 5 * len(rec) and not by_name["c.jsonl"]["done"]
    assert by_name["c.jsonl"]["line"] == 6 and by_name["a.jsonl.1"]["line"] == 8
    assert by_name["a.jsonl.1"]["offset"] == 7 * len(rec)
    assert "b.jsonl" not in by_name
    src.close()


def test_seek_read_once_keeps_done_files_done(tmp_path: Path) -> None:
    rec = b'{"score": 0.3, "label": 1}\n'
    checkpoint, _, gone = _checkpoint(tmp_path, rec)
    src = FileSource(tmp_path, name="s")
    src.seek(checkpoint)
    assert src.lost == [gone]  # b finished and removed: nothing left to read, not lost
    assert src.read(max_records=100) is None and src.exhausted  # done files are not read again
    by_name = {Path(e["path"]).name: e for e in src.position()["files"]}
    assert by_name["a.jsonl.1"]["done"] and by_name["a.jsonl.1"]["offset"] == 5 * len(rec)
    assert by_name["c.jsonl"]["done"] and by_name["c.jsonl"]["line"] == 6
    src.close()


@pytest.mark.parametrize("position, why", [
    ({"kind": "kafka", "files": []}, "not a file-source position"),
    ({"version": 3, "kind": "files", "files": []}, "newer than supported"),
    ({"version": 2, "kind": "files", "files": [{"path": "x"}]}, "bad position entry"),
])
def test_seek_rejects_bad_positions(tmp_path: Path, position: dict, why: str) -> None:
    (tmp_path / "a.jsonl").write_bytes(b"{}\n")
    src = FileSource(tmp_path, name="bad")
    with pytest.raises(ValueError, match=why):
        src.seek(position)
