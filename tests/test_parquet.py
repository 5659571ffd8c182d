"""Parquet and Arrow inputs of ``calmon check``: the same events as JSON Lines give the same dataset."""

from __future__ import annotations

import json
import subprocess
import sys
import tracemalloc
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.feather as feather
import pyarrow.parquet as pq
import pytest

from calmon.events.schema import load_mapping
from calmon.formats.parquet import TableFile, batch_records, canonical_plan, mapped_plan
from calmon.offline.accumulator import EventAccumulator, jsonl_chunks, make_decoder
from calmon.offline.inputs import InputError, read_input

N = 3000


def calmon(*args: str) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run([sys.executable, "-m", "calmon", *args], capture_output=True, timeout=120)


@pytest.fixture(scope="module")
def binary() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(11)
    s = rng.uniform(size=N)
    y = (rng.uniform(size=N) < s ** 1.3).astype(np.int64)
    ts = 1763719200.0 + np.arange(N) * 0.5
    return {"s": s, "y": y, "ts": ts, "ids": np.array([f"r{i}" for i in range(N)])}


def jsonl(path: Path, events: list[dict]) -> Path:
    path.write_text("".join(json.dumps(e) + "\n" for e in events))
    return path


def canonical_binary(tmp_path: Path, d: dict[str, np.ndarray]) -> Path:
    events = [{"model": "fraud", "id": str(i), "ts": float(t), "score": float(s), "label": int(y)}
              for i, t, s, y in zip(d["ids"], d["ts"], d["s"], d["y"])]
    return jsonl(tmp_path / "canonical.jsonl", events)


def assert_same(a, b) -> None:
    assert a.n == b.n and a.classes == b.classes and a.kind == b.kind
    np.testing.assert_array_equal(a.z, b.z)
    np.testing.assert_array_equal(a.y, b.y)
    for x, y in ((a.probs, b.probs), (a.labels, b.labels), (a.ts, b.ts)):
        if x is not None and y is not None:
            np.testing.assert_array_equal(x, y)


def test_flat_columns_match_json_lines_in_check(tmp_path: Path, binary: dict[str, np.ndarray]) -> None:
    ref = canonical_binary(tmp_path, binary)
    pq.write_table(pa.table({"id": binary["ids"], "model": ["fraud"] * N, "ts": binary["ts"], "score": binary["s"],
                             "label": binary["y"], "unused": ["x" * 50] * N}), tmp_path / "flat.parquet",
                   row_group_size=700)
    assert_same(read_input(str(tmp_path / "flat.parquet")), read_input(str(ref)))
    docs = [json.loads(calmon("check", str(p), "--json", "--tests", "none").stdout)
            for p in (ref, tmp_path / "flat.parquet")]
    assert docs[0]["metrics"] == docs[1]["metrics"] and docs[1]["n"] == N and docs[1]["model"] == "fraud"


def test_nested_struct_with_mapping_ms_times_and_string_labels(tmp_path: Path, binary: dict[str, np.ndarray]) -> None:
    ref = read_input(str(canonical_binary(tmp_path, binary)))
    meta = [{"model": "fraud", "country": "DE"}] * N
    pq.write_table(pa.table({"prediction_id": binary["ids"], "meta": meta, "p": binary["s"],
                             "y": np.where(binary["y"] == 1, "yes", "no"),
                             "event_time": (binary["ts"] * 1000).astype(np.int64), "payload": ["z" * 100] * N}),
                   tmp_path / "nested.parquet", row_group_size=1000)
    m = load_mapping({"fields": {"id": "prediction_id", "model": "meta.model", "score": "p", "label": "y",
                                 "ts": "event_time", "segment": "meta.country"},
                      "ts_unit": "ms", "labels": {"positive": ["yes"]}})
    table = TableFile(str(tmp_path / "nested.parquet"), "parquet")
    plan = mapped_plan(table.names, m.columns)
    assert "payload" not in plan.read and {"meta", "p", "y"} <= set(plan.read)  # only the needed columns
    row = batch_records(next(table.batches(plan.read, rows=1)), plan)[0]
    assert json.loads(row)["meta"] == {"model": "fraud", "country": "DE"}
    got = read_input(str(tmp_path / "nested.parquet"), mapping=m)
    assert_same(got, ref)
    assert got.model == "fraud"


def test_timestamp_column_is_utc(tmp_path: Path) -> None:
    ts = pa.array([1763719200123, 1763719260000], pa.timestamp("ms"))  # naive: taken as UTC
    pq.write_table(pa.table({"model": ["m", "m"], "ts": ts, "score": [0.2, 0.7], "label": [0, 1]}),
                   tmp_path / "t.parquet")
    ts_read = read_input(str(tmp_path / "t.parquet")).ts
    assert ts_read is not None
    np.testing.assert_allclose(ts_read, np.array([1763719200.123, 1763719260.0]))


@pytest.fixture(scope="module")
def multiclass() -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(5)
    probs = rng.dirichlet([2, 1, 1], size=N)
    labels = np.array([rng.choice(3, p=p) for p in probs])
    return probs, labels


@pytest.mark.parametrize("shape", ["list", "columns"])
def test_multiclass_probs_as_list_or_columns(tmp_path: Path, multiclass, shape: str) -> None:
    probs, labels = multiclass
    ref = read_input(str(jsonl(tmp_path / "mc.jsonl", [{"model": "digits", "probs": p.tolist(), "label": int(y)}
                                                       for p, y in zip(probs, labels)])))
    cols = {"probs": list(probs)} if shape == "list" else {f"p{k}": probs[:, k] for k in range(3)}
    pq.write_table(pa.table({**cols, "label": labels}), tmp_path / "mc.parquet", row_group_size=512)
    got = read_input(str(tmp_path / "mc.parquet"))
    assert got.classes == 3 and got.model is None  # no model column: like a CSV file
    assert_same(got, ref)
    assert read_input(str(tmp_path / "mc.parquet"), model="digits").model == "digits"


def test_directory_of_parquet_files_and_arrow(tmp_path: Path, binary: dict[str, np.ndarray]) -> None:
    ref = read_input(str(canonical_binary(tmp_path, binary)))
    d = tmp_path / "parts"
    d.mkdir()
    t = pa.table({"id": binary["ids"], "model": ["fraud"] * N, "ts": binary["ts"], "score": binary["s"],
                  "label": binary["y"]})
    for j, lo in enumerate(range(0, N, 1000)):  # sorted names give the row order back
        pq.write_table(t.slice(lo, 1000), d / f"part-{j:05d}.snappy.parquet")
    (d / "_SUCCESS").write_bytes(b"")
    (d / ".part-00000.parquet.crc").write_bytes(b"junk")
    assert_same(read_input(str(d)), ref)
    feather.write_feather(t, tmp_path / "t.feather")
    assert_same(read_input(str(tmp_path / "t.feather")), ref)
    with pytest.raises(InputError, match="directory without supported files"):
        read_input(str(_empty_dir(tmp_path)))


def _empty_dir(tmp_path: Path) -> Path:
    e = tmp_path / "empty"
    e.mkdir()
    (e / "notes.txt").write_text("x")
    return e


def test_confidence_correct_booleans_are_top_label(tmp_path: Path, binary: dict[str, np.ndarray]) -> None:
    pq.write_table(pa.table({"confidence": binary["s"], "correct": binary["y"].astype(bool)}), tmp_path / "c.parquet")
    ds = read_input(str(tmp_path / "c.parquet"))
    assert ds.kind == "top-label" and ds.n == N
    np.testing.assert_array_equal(ds.y, binary["y"])


def test_bad_rows_are_named_by_row_or_skipped(tmp_path: Path, binary: dict[str, np.ndarray]) -> None:
    s = binary["s"].copy()
    s[1234] = 1.5
    pq.write_table(pa.table({"model": ["m"] * N, "score": s, "label": binary["y"]}), tmp_path / "bad.parquet",
                   row_group_size=500)
    with pytest.raises(InputError, match=r"bad.parquet: row 1235: out_of_range"):
        read_input(str(tmp_path / "bad.parquet"))
    ds = read_input(str(tmp_path / "bad.parquet"), skip_invalid=True)
    assert ds.n == N - 1 and ds.skipped == {"out_of_range": 1}


def test_footerless_and_unknown_columns_are_one_line_errors(tmp_path: Path, binary: dict[str, np.ndarray]) -> None:
    pq.write_table(pa.table({"score": binary["s"], "label": binary["y"]}), tmp_path / "ok.parquet")
    data = (tmp_path / "ok.parquet").read_bytes()
    (tmp_path / "cut.parquet").write_bytes(data[: len(data) // 2])
    with pytest.raises(InputError, match="cut.parquet: no Parquet footer"):
        read_input(str(tmp_path / "cut.parquet"))
    pq.write_table(pa.table({"p": binary["s"], "y": binary["y"]}), tmp_path / "odd.parquet")
    with pytest.raises(InputError, match="odd.parquet: columns p, y: no known column.*schema mapping"):
        read_input(str(tmp_path / "odd.parquet"))


def test_chunked_decoding_equals_one_batch(tmp_path: Path) -> None:
    """Chunk boundaries never change the result, even when a multiclass model's outcomes come before its
    first prediction (decoded as binary in an earlier chunk, NaN probabilities after the join)."""
    rng = np.random.default_rng(3)
    events: list[dict] = []
    for i in range(400):
        p = rng.dirichlet([1, 1, 1]).tolist()
        y = int(rng.choice(3, p=p))
        pair = [{"type": "prediction", "id": f"a{i}", "model": "m", "probs": p},
                {"type": "outcome", "id": f"a{i}", "model": "m", "label": min(y, 1) if i < 5 else y}]
        events += pair[::-1] if i < 5 else pair
    data = "".join(json.dumps(e) + "\n" for e in events).encode()
    results = []
    for size in (1, 7, 10_000):
        acc = EventAccumulator(make_decoder())
        acc.add_all(jsonl_chunks("x", [data[i:i + 101] for i in range(0, len(data), 101)], lines=size))
        results.append(acc.dataset("x", None, False))
    for r in results[1:]:
        assert_same(r, results[0])
    assert results[0].classes == 3 and results[0].n == 400


def test_reader_memory_does_not_grow_with_rows(tmp_path: Path) -> None:
    """The Python-side peak of streaming a Parquet file through the decoder (discarding the events) is the
    same for 4x the rows: batches are bounded (reduced version of benchmarks/bench_parquet.py)."""
    rng = np.random.default_rng(0)
    peaks = []
    for n in (50_000, 200_000):
        path = tmp_path / f"m{n}.parquet"
        pq.write_table(pa.table({"model": ["m"] * n, "score": rng.uniform(size=n), "label": rng.integers(0, 2, n)}),
                       path, row_group_size=20_000)
        table = TableFile(str(path), "parquet")
        plan = canonical_plan(table.names)
        dec = make_decoder()
        tracemalloc.start()
        rows = 0
        for batch in table.batches(plan.read, rows=20_000):
            rows += len(dec.decode(batch_records(batch, plan)).models["m"])
        peaks.append(tracemalloc.get_traced_memory()[1])
        tracemalloc.stop()
        assert rows == n
    assert peaks[1] < 1.5 * peaks[0]
