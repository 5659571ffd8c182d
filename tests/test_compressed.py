"""gzip, zstd, bzip2 and xz JSON Lines (and CSV) in ``calmon check`` and in the file source; whole Parquet and
Arrow IPC files in a followed directory; restarts from a checkpoint deliver every record exactly once."""

from __future__ import annotations

import bz2
import gzip
import json
import lzma
import os
import random
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import zstandard

from calmon.offline.inputs import InputError, read_input
from connectors.base import Batch
from connectors.files import FileSource


def lines_of(n: int, tag: str = "e") -> list[bytes]:
    rng = np.random.default_rng(len(tag) + n)
    s = rng.uniform(size=n)
    return [json.dumps({"model": "m", "id": f"{tag}{i}", "score": float(s[i]), "label": int(rng.uniform() < s[i])})
            .encode() for i in range(n)]


def compress(data: bytes, codec: str) -> bytes:
    if codec == "bzip2":
        return bz2.compress(data)
    if codec == "xz":
        return lzma.compress(data)
    return gzip.compress(data) if codec == "gzip" else zstandard.ZstdCompressor().compress(data)


def drain(src: FileSource, n: int = 65536) -> list[Batch]:
    out = []
    while (b := src.read(n, timeout=0.0)) is not None:
        out.append(b)
    return out


# ------------------------------------------------------------------------------ calmon check


@pytest.mark.parametrize("codec,suffix", [("gzip", ".jsonl.gz"), ("zstd", ".jsonl.zst"), ("gzip", ".log"),
                                         ("bzip2", ".jsonl.bz2"), ("xz", ".jsonl.xz"), ("xz", ".log")])
def test_check_reads_compressed_json_lines(tmp_path: Path, codec: str, suffix: str) -> None:
    data = b"\n".join(lines_of(2000)) + b"\n"
    (tmp_path / "plain.jsonl").write_bytes(data)
    half = len(data) // 2
    cut = data.index(b"\n", half) + 1  # two members / frames: a concatenated file is one stream
    (tmp_path / f"c{suffix}").write_bytes(compress(data[:cut], codec) + compress(data[cut:], codec))
    ref, got = read_input(str(tmp_path / "plain.jsonl")), read_input(str(tmp_path / f"c{suffix}"))
    assert got.n == ref.n == 2000
    np.testing.assert_array_equal(got.z, ref.z)
    np.testing.assert_array_equal(got.y, ref.y)


def test_check_command_on_zstd_and_gzip_from_stdin(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    import io
    import sys

    from calmon.cli import main as cli_main
    data = b"\n".join(lines_of(1000)) + b"\n"
    (tmp_path / "plain.jsonl").write_bytes(data)
    (tmp_path / "e.jsonl.zst").write_bytes(compress(data, "zstd"))
    docs = []
    for arg in ("plain.jsonl", "e.jsonl.zst", "-"):
        if arg == "-":
            monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(compress(data, "gzip"))))
        capsys.readouterr()
        assert cli_main(["check", arg if arg == "-" else str(tmp_path / arg), "--json", "--tests", "none"]) == 0
        doc = json.loads(capsys.readouterr().out)
        doc.pop("input")
        docs.append(doc)
    assert docs[0]["n"] == 1000 and docs[1] == docs[0] and docs[2] == docs[0]


def test_check_reads_compressed_csv_and_names_the_line_of_a_bad_record(tmp_path: Path) -> None:
    rows = "score,label\n" + "".join(f"{0.1 * (i % 10):.1f},{i % 2}\n" for i in range(100))
    (tmp_path / "a.csv.gz").write_bytes(gzip.compress(rows.encode()))
    assert read_input(str(tmp_path / "a.csv.gz")).n == 100
    bad = lines_of(50)
    bad[30] = b'{"model": "m", "score": 2, "label": 1}'
    (tmp_path / "b.jsonl.zst").write_bytes(compress(b"\n".join(bad), "zstd"))
    with pytest.raises(InputError, match=r"b.jsonl.zst: line 31: out_of_range"):
        read_input(str(tmp_path / "b.jsonl.zst"))


@pytest.mark.parametrize("codec", ["gzip", "zstd", "bzip2", "xz"])
def test_truncated_or_corrupt_stream_is_one_line_error(tmp_path: Path, codec: str) -> None:
    packed = compress(b"\n".join(lines_of(3000)), codec)
    (tmp_path / "cut.gz").write_bytes(packed[:-40])
    with pytest.raises(InputError, match=f"cut.gz: {codec} stream is truncated"):
        read_input(str(tmp_path / "cut.gz"))
    (tmp_path / "bad.gz").write_bytes(packed[:200] + b"\x00garbage" * 100 + packed[200:])
    with pytest.raises(InputError, match=f"bad.gz: {codec} stream is (corrupt|truncated)"):
        read_input(str(tmp_path / "bad.gz"))


# ------------------------------------------------------------------------------ file source


def _tree(tmp_path: Path) -> tuple[Path, list[bytes], list[str]]:
    """A directory with gzip and zstd JSON Lines, a gzip CSV and a Parquet file, and all their records."""
    d = tmp_path / "in"
    d.mkdir()
    a, b = lines_of(1500, "a"), lines_of(900, "b")
    (d / "a.jsonl.gz").write_bytes(compress(b"\n".join(a) + b"\n", "gzip"))
    (d / "b.jsonl.zst").write_bytes(compress(b"\n\n".join(b), "zstd"))  # blank lines, no final newline
    (d / "c.csv.gz").write_bytes(gzip.compress(b"id,model,score,label\n" + b"".join(
        b"c%d,m,0.5,%d\n" % (i, i % 2) for i in range(700))))
    pq.write_table(pa.table({"id": [f"p{i}" for i in range(1100)], "model": ["m"] * 1100, "score": [0.25] * 1100,
                             "label": [1] * 1100}), d / "d.parquet", row_group_size=300)
    ids = [f"a{i}" for i in range(1500)] + [f"b{i}" for i in range(900)] + [f"c{i}" for i in range(700)] + \
          [f"p{i}" for i in range(1100)]
    return d, a + b, ids


def _specs(d: Path) -> list[str]:
    return [str(d / "*.gz"), str(d / "*.zst"), str(d)]


def _ids(records: list[bytes]) -> list[str]:
    return [json.loads(r)["id"] for r in records]


@pytest.mark.parametrize("follow", [False, True])
def test_source_reads_compressed_and_parquet_files(tmp_path: Path, follow: bool) -> None:
    d, jl, ids = _tree(tmp_path)
    src = FileSource(_specs(d), follow=follow, settle=0.0)
    batches = drain(src, 1000)
    recs = [r for b in batches for r in b.records]
    assert _ids(recs) == ids
    assert recs[:2400] == jl  # JSON Lines pass through as they are
    origins = [o for b in batches for o in b.origins or []]
    assert origins[0].endswith("a.jsonl.gz:1") and origins[1500].endswith("b.jsonl.zst:1")
    assert origins[1501].endswith("b.jsonl.zst:3") and origins[-1].endswith("d.parquet:1100")
    assert src.errors == []
    if follow:  # finished whole files stay in the position, marked done, and are not read again
        assert all(e["done"] for e in src.position()["files"])
        assert drain(src) == []
    src.close()


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_restart_from_checkpoint_is_exactly_once(tmp_path: Path, seed: int) -> None:
    """Random batch sizes; after each batch the reader may "crash" (dropping what it read since its last
    checkpoint) and a new source resumes from the checkpoint: decompressed offsets and row indices."""
    rng = random.Random(seed)
    d, _, ids = _tree(tmp_path)
    committed: list[str] = []
    pos = None
    follow = bool(seed % 2)
    for _round in range(200):
        src = FileSource(_specs(d), follow=follow, settle=0.0)
        if pos is not None:
            src.seek(json.loads(json.dumps(pos)))
        uncommitted: list[str] = []
        while True:
            b = src.read(rng.randint(1, 700), timeout=0.0)
            if b is None:
                break
            uncommitted += _ids(b.records)
            if rng.random() < 0.5:
                committed += uncommitted
                uncommitted, pos = [], b.position
            if rng.random() < 0.2:
                break  # crash
        else:
            pass
        src.close()
        if b is None and not uncommitted:
            break
    assert committed == ids


def test_truncated_gzip_in_a_followed_directory(tmp_path: Path) -> None:
    """Its lines before the damage are read, the error is listed once (no crash loop), and the file is read
    on from where it stopped once its writer completes it."""
    d = tmp_path / "in"
    d.mkdir()
    lines = lines_of(4000)
    packed = gzip.compress(b"\n".join(lines) + b"\n")
    path = d / "x.jsonl.gz"
    path.write_bytes(packed[: len(packed) * 2 // 3])
    src = FileSource(str(d / "*.jsonl.gz"), follow=True, settle=0.0, poll_interval=0.01)
    first = [r for b in drain(src) for r in b.records]
    assert 0 < len(first) < 4000 and first == lines[: len(first)]
    assert len(src.errors) == 1 and "truncated" in src.errors[0]
    for _ in range(5):
        assert src.read(timeout=0.02) is None
    assert len(src.errors) == 1
    with open(path, "ab") as fh:  # the same inode, completed
        fh.write(packed[len(packed) * 2 // 3:])
    os.utime(path, ns=(0, 10**9))  # a changed size and time: retried
    rest = [r for b in drain_until(src, 4000 - len(first)) for r in b.records]
    assert first + rest == lines
    assert all(e["done"] for e in src.position()["files"])
    src.close()


def drain_until(src: FileSource, n: int, rounds: int = 500) -> list[Batch]:
    out: list[Batch] = []
    for _ in range(rounds):
        b = src.read(timeout=0.02)
        if b is not None:
            out.append(b)
        if sum(len(x.records) for x in out) >= n:
            break
    return out


def _read_once_complete(path: Path, data: bytes, cut: int, rows: int) -> list[bytes]:
    """Drop ``data`` into the watched directory of ``path`` without its last ``cut`` bytes (a table being
    written: no footer yet): nothing is read and nothing is an error; once complete, every row is read."""
    path.write_bytes(data[:-cut])
    src = FileSource(path.parent, follow=True, settle=0.0, poll_interval=0.01)
    for _ in range(5):
        assert src.read(timeout=0.02) is None
    assert src.errors == []  # incomplete, not an error
    with open(path, "ab") as fh:
        fh.write(data[-cut:])
    os.utime(path, ns=(0, 10**9))
    got = [r for b in drain_until(src, rows) for r in b.records]
    assert len(got) == rows and src.errors == []
    src.close()
    return got


def test_footerless_parquet_waits_until_complete(tmp_path: Path) -> None:
    d = tmp_path / "drop"
    d.mkdir()
    pq.write_table(pa.table({"model": ["m"] * 500, "score": [0.5] * 500, "label": [1] * 500}), tmp_path / "f.parquet",
                   row_group_size=100)
    data = (tmp_path / "f.parquet").read_bytes()
    got = _read_once_complete(d / "part-1.parquet", data, cut=50, rows=500)
    assert json.loads(got[0]) == {"model": "m", "score": 0.5, "label": 1}


def test_growing_compressed_file_is_read_once_settled(tmp_path: Path) -> None:
    path = tmp_path / "g.jsonl.gz"
    lines = lines_of(300)
    packed = gzip.compress(b"\n".join(lines) + b"\n")
    path.write_bytes(packed[:100])
    src = FileSource(str(path), follow=True, settle=3600.0, poll_interval=0.01)
    assert src.read(timeout=0.02) is None and src.errors == []  # still changing: not read
    with open(path, "ab") as fh:
        fh.write(packed[100:])
    src.settle = 0.0  # (instead of waiting an hour)
    assert [r for b in drain_until(src, 300) for r in b.records] == lines
    src.close()


def test_schema_columns_keep_the_users_names(tmp_path: Path) -> None:
    (tmp_path / "u.csv").write_text("prediction_id,p,y\na1,0.25,yes\n")
    pq.write_table(pa.table({"prediction_id": ["a2"], "meta": [{"model": "fraud"}], "p": [0.5], "junk": ["x"]}),
                   tmp_path / "u.parquet")
    src = FileSource([str(tmp_path / "u.csv"), str(tmp_path / "u.parquet")],
                     schema_columns=["prediction_id", "meta", "p"])
    recs = [json.loads(r) for b in drain(src) for r in b.records]
    assert recs == [{"prediction_id": "a1", "p": 0.25, "y": "yes"}, {"prediction_id": "a2", "meta": {"model": "fraud"},
                                                                     "p": 0.5}]


def _arrow_file(path: Path, table: pa.Table) -> bytes:
    with pa.OSFile(str(path), "wb") as fh, pa.ipc.new_file(fh, table.schema) as w:
        w.write_table(table, max_chunksize=100)
    return path.read_bytes()


def test_arrow_feather_bzip2_and_xz_files_dropped_in_a_watched_directory(tmp_path: Path) -> None:
    """Arrow IPC files (``.arrow``, Feather v2) are matched like Parquet; a file named by a pattern is
    recognised by its first bytes (``ARROW1``); bzip2 and xz JSON Lines are read when a glob names them."""
    d = tmp_path / "drop"
    d.mkdir()
    table = pa.table({"id": [f"r{i}" for i in range(300)], "model": ["m"] * 300, "score": [0.25] * 300,
                      "label": [1] * 300})
    src = FileSource([str(d), str(d / "*.bz2"), str(d / "*.xz")], follow=True, settle=0.0, poll_interval=0.01)
    assert src.read(timeout=0.02) is None
    _arrow_file(d / "a.arrow", table.slice(0, 100))
    import pyarrow.feather as feather
    feather.write_feather(table.slice(100, 100), str(d / "b.feather"))
    (d / "c.jsonl.bz2").write_bytes(compress(b"\n".join(lines_of(50, "c")) + b"\n", "bzip2"))
    (d / "d.jsonl.xz").write_bytes(compress(b"\n".join(lines_of(60, "d")), "xz"))
    got = [r for b in drain_until(src, 310) for r in b.records]
    assert _ids(got) == [f"r{i}" for i in range(200)] + [f"c{i}" for i in range(50)] + [f"d{i}" for i in range(60)]
    assert src.errors == [] and all(e["done"] for e in src.position()["files"])
    src.close()
    _arrow_file(d / "e.bin", table.slice(200, 100))  # no table suffix: by content, when a pattern names it
    src = FileSource(d, pattern="*.bin")
    assert _ids([r for b in drain(src) for r in b.records]) == [f"r{i}" for i in range(200, 300)]
    src.close()


def test_footerless_arrow_file_waits_until_complete(tmp_path: Path) -> None:
    d = tmp_path / "drop"
    d.mkdir()
    data = _arrow_file(tmp_path / "f.arrow", pa.table({"model": ["m"] * 400, "score": [0.5] * 400,
                                                       "label": [0] * 400}))
    got = _read_once_complete(d / "part-1.arrow", data, cut=40, rows=400)  # batches but no footer at first
    assert json.loads(got[0]) == {"model": "m", "score": 0.5, "label": 0}
    (tmp_path / "cut.arrow").write_bytes(data[:-40])
    with pytest.raises(InputError, match="cut.arrow: .*no Arrow IPC footer"):
        read_input(str(tmp_path / "cut.arrow"))


@pytest.mark.parametrize("codec", ["bzip2", "xz"])
def test_bzip2_and_xz_restart_from_the_decompressed_offset(tmp_path: Path, codec: str) -> None:
    """Two streams in one file; a checkpoint mid-file resumes exactly after its last line."""
    lines = lines_of(3000)
    data = b"\n".join(lines) + b"\n"
    cut = data.index(b"\n", len(data) // 3) + 1
    path = tmp_path / f"e.jsonl.{'bz2' if codec == 'bzip2' else 'xz'}"
    path.write_bytes(compress(data[:cut], codec) + compress(data[cut:], codec))
    src = FileSource(str(path), follow=True, settle=0.0, poll_interval=0.01)
    first = None
    for _ in range(200):
        if (first := src.read(700, timeout=0.02)) is not None:
            break
    assert first is not None and len(first.records) == 700 and first.position["files"][0]["whole"] == codec
    src.close()
    src = FileSource(str(path), follow=True, settle=0.0, poll_interval=0.01)
    src.seek(json.loads(json.dumps(first.position)))
    rest = [r for b in drain_until(src, 3000 - len(first.records)) for r in b.records]
    assert first.records + rest == lines and src.errors == []
    src.close()
