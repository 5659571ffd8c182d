"""File-source positions (:mod:`connectors.filepositions`) as :class:`~connectors.files.FileSource` gives and
restores them: a position is the dict built here from ``os.stat`` and ``hashlib``; a restore gives the files,
offsets and lost entries of the scenarios below.
"""

import hashlib
import logging
import os
from pathlib import Path

import pytest

from connectors.files import FileSource


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
