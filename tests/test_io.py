"""Offline inputs of `calmon check`, `fit` and `apply`: CSV read as the agent reads it, JSONL joined by its Joiner."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from calmon.events.decoder import Decoder
from calmon.formats.csvrows import CsvLayout, parse_header, read_rows
from calmon.offline.inputs import InputError, read_input
from connectors.files import FileSource


def write(tmp_path: Path, name: str, text: str) -> str:
    p = tmp_path / name
    p.write_bytes(text.encode("utf-8"))
    return str(p)


def test_layout_of_headers() -> None:
    lay = parse_header(b"\xef\xbb\xbfID, Score ,LABEL,ts,extra")
    assert (lay.column("id"), lay.column("score"), lay.column("label"), lay.column("ts")) == (0, 1, 2, 3)
    assert lay.error is None and not lay.top_label and lay.probs == ()
    assert CsvLayout.from_names(["p1", "p0", "label"]).probs == (1, 0)
    for bad in ("score,score,label", "p0,p2,label", "score,p0,p1,label", "foo,bar", "score,confidence,label"):
        assert parse_header(bad).error is not None, bad
    assert parse_header(b"\xff,score").error == "header is not UTF-8"


def test_rows_keep_their_physical_line_numbers() -> None:
    rows = list(read_rows('score,label\n\n0.5,1\n"a\nb",0\n0.1,0\n'))
    assert [n for n, _ in rows] == [1, 3, 5, 6] and rows[2][1] == ["a\nb", "0"]


def test_csv_header_is_read_as_the_agent_reads_it(tmp_path: Path) -> None:
    path = write(tmp_path, "a.csv", "\ufeffId,Confidence,Correct\nx,0.9,1\ny,0.4,0\n")
    ds = read_input(path)
    assert ds.kind == "top-label" and ds.ids.tolist() == ["x", "y"] and ds.y.tolist() == [1.0, 0.0]
    with pytest.raises(InputError, match="line 1: conflicting columns"):
        read_input(write(tmp_path, "b.csv", "score,confidence,label\n0.5,0.5,1\n"))
    with pytest.raises(InputError, match="line 4: field 'score'"):
        read_input(write(tmp_path, "c.csv", "score,label\n0.5,1\n\nx,0\n"))
    with pytest.raises(InputError, match="line 3: probs"):
        read_input(write(tmp_path, "d.csv", "p0,p1,p2,label\n0.2,0.3,0.5,1\n0.5,0.5,0.5,1\n"))


def test_csv_check_and_agent_see_the_same_events(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    probs = rng.dirichlet(np.ones(3), size=200)
    labels = rng.integers(0, 3, size=200)
    body = "".join(f"e{i},{','.join(repr(float(p)) for p in probs[i])},{labels[i]}\n" for i in range(200))
    path = write(tmp_path, "m.csv", "id,p0,p1,p2,label\n" + body)
    ds = read_input(path)
    batch = FileSource(path).read()
    assert batch is not None
    records = [r.replace(b"{", b'{"model":"m",', 1) for r in batch.records]
    mb = Decoder().decode(records).models["m"]
    np.testing.assert_array_equal(ds.probs, mb.probs)
    np.testing.assert_array_equal(ds.labels, mb.label)
    assert ds.ids.tolist() == mb.ids.tolist()


def test_jsonl_join_in_either_order_with_and_without_model(tmp_path: Path) -> None:
    lines = [
        '{"type": "labeled", "model": "m", "id": "l", "score": 0.3, "label": 0}',
        '{"id": "a", "model": "m", "score": 0.6, "ts": 10}',
        '{"id": "b", "label": 0}',  # the outcome before its prediction, without a model
        '{"id": "b", "model": "m", "score": 0.1}',
        '{"id": "c", "model": "m", "score": 0.2}',  # never labeled
        '{"id": "z", "label": 1}',  # no prediction
        '{"id": "a", "model": "m", "label": 1, "ts": 20}',
        '{"id": "q", "model": "other", "score": 0.9}',
    ]
    ds = read_input(write(tmp_path, "e.jsonl", "\n".join(lines) + "\n"), model="m")
    # labeled events first, then the joined predictions in the order of the predictions
    assert ds.ids.tolist() == ["l", "a", "b"] and ds.z.tolist() == [0.3, 0.6, 0.1] and ds.y.tolist() == [0, 1, 0]
    assert ds.unjoined_predictions == 1 and ds.orphan_outcomes == 1 and ds.model == "m"
    with pytest.raises(InputError, match="choose one with --model"):
        read_input(write(tmp_path, "f.jsonl", "\n".join(lines) + "\n"))


def test_jsonl_without_labeled_events(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="no labeled events .predictions without outcomes: 1"):
        read_input(write(tmp_path, "h.jsonl", '{"id": "a", "model": "m", "score": 0.5}\n'))


# ------------------------------------------------------------------------------ hostile input (issue #14)


def _poisoned(tmp_path: Path, poison: bytes) -> str:
    good = [b'{"model":"m","id":"r%d","score":0.%d,"label":%d}' % (i, i, i % 2) for i in range(1, 9)]
    p = tmp_path / "poison.jsonl"
    p.write_bytes(b"\n".join(good[:4] + [poison] + good[4:]) + b"\n")
    return str(p)


@pytest.mark.parametrize("poison,reason", [
    (b'{"model":"m","id":"\xff","score":0.5,"label":1}', "bad_encoding"),
    (b'{"model":"m","x":' + b"[" * 5000 + b"]" * 5000 + b',"score":0.5,"label":1}', "too_deep"),
    (b"[" * 100_000, "too_deep"),
], ids=["bad_encoding", "too_deep_field", "too_deep_top"])
def test_poison_records_in_check(tmp_path: Path, poison: bytes, reason: str) -> None:
    path = _poisoned(tmp_path, poison)
    with pytest.raises(InputError) as err:
        read_input(path)
    assert str(err.value).startswith(f"{path}: line 5: {reason}: ") and "\n" not in str(err.value)
    ds = read_input(path, skip_invalid=True)
    assert ds.n == 8 and ds.skipped == {reason: 1}


def test_check_keeps_historical_and_future_times(tmp_path: Path) -> None:
    """Offline files are historical: no wall-clock limits (times do not change the result of check)."""
    p = tmp_path / "old.jsonl"
    p.write_bytes(b'{"model":"m","ts":"1990-01-01T00:00:00Z","score":0.2,"label":0}\n'
                  b'{"model":"m","ts":"9999-12-31T23:59:59Z","score":0.7,"label":1}\n')
    assert read_input(str(p)).n == 2


@pytest.mark.parametrize("arrays,message", [
    ({"score": np.full((3, 3), 0.5), "label": np.ones((3, 3))}, "array 'score' must be 1-D (n,), got shape (3, 3)"),
    ({"confidence": np.full(3, 0.5), "correct": np.ones((3, 1))}, "array 'correct' must be 1-D"),
    ({"score": np.array(["a", "b"]), "label": np.ones(2)}, "array 'score' must hold numbers"),
    ({"probs": np.full((2, 3, 1), 0.5), "labels": np.zeros(2)}, "probs must be (n, K >= 2)"),
    ({"probs": np.full((2, 2), 0.5), "labels": np.zeros((2, 2))}, "labels (n,)"),
], ids=["score_3x3", "correct_2d", "strings", "probs_3d", "labels_2d"])
def test_npz_shapes_are_checked(tmp_path: Path, arrays: dict, message: str) -> None:
    p = tmp_path / "bad.npz"
    np.savez(p, **arrays)
    with pytest.raises(InputError) as err:
        read_input(str(p))
    assert message in str(err.value) and "\n" not in str(err.value)


def test_check_command_on_a_deep_record(tmp_path: Path) -> None:
    """`calmon check` as a user runs it: exit 2 with one line, or skip the record with --skip-invalid."""
    import subprocess
    import sys

    path = _poisoned(tmp_path, b'{"model":"m","x":' + b"[" * 5000 + b"]" * 5000 + b"}")
    run = [sys.executable, "-m", "calmon", "check", path, "--tests", "none", "--json"]
    r = subprocess.run(run, capture_output=True, timeout=120)
    assert r.returncode == 2 and b"too_deep" in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
    r = subprocess.run([*run, "--skip-invalid"], capture_output=True, timeout=120)
    assert r.returncode == 0, r.stderr
