"""File source: read once, follow (rotation, truncation, partial lines), CSV variants, exact resume."""

from __future__ import annotations

import hashlib
import json
import os
import random
import time
import tracemalloc
from pathlib import Path

import pytest

from calmon.events.decoder import Decoder, OversizedRecord
from connectors.base import Batch, ByteLagReporting, Committable, Source
from connectors.files import CsvConverter, FileSource


def ev(i: int, tag: str = "") -> bytes:
    return b'{"id":"%s%d","model":"m","score":0.5,"label":1}' % (tag.encode(), i)


def write_lines(path: Path, lines: list[bytes], mode: str = "ab") -> None:
    with open(path, mode) as fh:
        fh.write(b"".join(x + b"\n" for x in lines))


def drain(src: FileSource, max_records: int = 65536, timeout: float = 0.0) -> list[Batch]:
    out = []
    while True:
        b = src.read(max_records, timeout=timeout)
        if b is None:
            return out
        out.append(b)


def records(batches: list[Batch]) -> list[bytes]:
    return [r for b in batches for r in b.records]


# ------------------------------------------------------------------------------ read once


def test_protocol_and_read_once_exact(tmp_path: Path) -> None:
    lines = [ev(i) for i in range(1000)]
    p = tmp_path / "a.jsonl"
    write_lines(p, lines, "wb")
    src = FileSource(p, name="s1")
    assert isinstance(src, Source) and isinstance(src, ByteLagReporting) and not isinstance(src, Committable)
    assert src.lag_bytes() == p.stat().st_size
    assert src.name == "s1" and not src.exhausted
    batches = drain(src, max_records=77)
    assert src.exhausted
    assert records(batches) == lines
    assert all(len(b.records) <= 77 for b in batches)
    assert all(b.source == "s1" for b in batches)
    # origins are path:line, 1-based
    origins = [o for b in batches for o in b.origins]
    assert origins[0] == f"{p}:1" and origins[-1] == f"{p}:1000"
    # positions are JSON-serialisable, offsets increase and end at the file size
    offs = [json.loads(json.dumps(b.position))["files"][0]["offset"] for b in batches]
    assert offs == sorted(offs) and offs[-1] == p.stat().st_size
    assert src.position() == batches[-1].position
    src.close()


def test_blank_lines_crlf_bom_and_unterminated_last_line(tmp_path: Path) -> None:
    p = tmp_path / "a.jsonl"
    p.write_bytes(b"\xef\xbb\xbf" + ev(0) + b"\r\n\r\n" + ev(1) + b"\n\n" + ev(2))
    src = FileSource(p)
    b = src.read()
    assert b.records == [ev(0) + b"\r", ev(1), ev(2)]  # '\r' is JSON whitespace: the decoder accepts it
    assert [o.rsplit(":", 1)[1] for o in b.origins] == ["1", "3", "5"]
    dec = Decoder().decode(b.records)
    assert not dec.rejected and len(dec.models["m"]) == 3
    assert src.read() is None and src.exhausted


def test_directory_sorted_and_glob_dedup(tmp_path: Path) -> None:
    for name, tag in [("b.jsonl", "b"), ("a.jsonl", "a"), ("c.ndjson", "c")]:
        write_lines(tmp_path / name, [ev(i, tag) for i in range(3)], "wb")
    (tmp_path / "ignored.txt").write_text("x\n")
    (tmp_path / ".hidden.jsonl").write_text("x\n")
    src = FileSource([tmp_path, str(tmp_path / "*.jsonl")])  # the glob repeats files: each is read once
    got = records(drain(src))
    assert got == [ev(i, t) for t in "abc" for i in range(3)]


def test_missing_file_and_bad_arguments(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="no such file"):
        FileSource(tmp_path / "nope.jsonl")
    with pytest.raises(ValueError, match="format"):
        FileSource(tmp_path, format="xml")
    with pytest.raises(ValueError, match="start"):
        FileSource(tmp_path, start="middle")
    src = FileSource(tmp_path)
    with pytest.raises(ValueError, match="not a file-source position"):
        src.seek({"topic/0": 5})
    with pytest.raises(ValueError, match="max_records"):
        src.read(0)


def test_resume_read_once_every_cut(tmp_path: Path) -> None:
    """Restarting from any batch's position yields exactly the remaining lines (3 files)."""
    all_lines = []
    for k in range(3):
        lines = [ev(i, f"f{k}-") for i in range(50 + 7 * k)]
        write_lines(tmp_path / f"f{k}.jsonl", lines, "wb")
        all_lines += lines
    src = FileSource(tmp_path)
    batches = drain(src, max_records=23)
    assert records(batches) == all_lines
    seen = 0
    for b in batches:
        seen += len(b.records)
        src2 = FileSource(tmp_path)
        src2.seek(json.loads(json.dumps(b.position)))
        assert records(drain(src2, max_records=40)) == all_lines[seen:]
        assert src2.exhausted
        src2.close()


def test_resume_csv_after_header(tmp_path: Path) -> None:
    p = tmp_path / "x.csv"
    p.write_bytes(b"\r\nid,score,label\r\n" + b"".join(b"r%d,0.%d,%d\r\n" % (i, i % 10, i % 2) for i in range(20)))
    src = FileSource(p)
    b = src.read(5)
    assert b.origins[0].endswith(":3")  # a blank line, then the header
    src2 = FileSource(p)
    src2.seek(b.position)
    batches = drain(src2)
    rest = records(batches)
    assert len(rest) == 15
    assert json.loads(rest[0]) == {"id": "r5", "score": 0.5, "label": 1}
    assert batches[0].origins[0].endswith(":8")


# ------------------------------------------------------------------------------ CSV


@pytest.mark.parametrize(
    "header, rows, expected",
    [
        ("score,label", ["0.25,1", "0.75,0"], [{"score": 0.25, "label": 1}, {"score": 0.75, "label": 0}]),
        ("p0,p1,p2,label", ["0.2,0.3,0.5,2"], [{"probs": [0.2, 0.3, 0.5], "label": 2}]),
        ("confidence,correct", ["0.9,1", ".5,0"], [{"score": 0.9, "label": 1}, {"score": 0.5, "label": 0}]),
        (
            "ID, Model ,ts,type,segment,score,label,extra",
            ["a,m,1763719200.5,labeled,eu,0.1,0,zzz", 'b,m,2026-11-21T10:00:00Z,,"us",0.2,1.0,'],
            [
                {"id": "a", "model": "m", "ts": 1763719200.5, "type": "labeled", "segment": "eu", "score": 0.1,
                 "label": 0},
                {"id": "b", "model": "m", "ts": "2026-11-21T10:00:00Z", "segment": "us", "score": 0.2, "label": 1},
            ],
        ),
        ("id,score,label", ["o1,,1", "p1,0.4,"], [{"id": "o1", "label": 1}, {"id": "p1", "score": 0.4}]),
        ("id,score,label", ['"q,1",0.5,1', "é,0.5,1"], [{"id": "q,1", "score": 0.5, "label": 1},
                                                         {"id": "é", "score": 0.5, "label": 1}]),
    ],
)
def test_csv_variants(tmp_path: Path, header: str, rows: list[str], expected: list[dict]) -> None:
    p = tmp_path / "in.csv"
    p.write_text(header + "\r\n" + "\r\n".join(rows) + "\r\n", encoding="utf-8")
    got = [json.loads(r) for r in records(drain(FileSource(p)))]
    assert got == expected
    # the fast path (regex) and the slow path (csv module) agree
    conv = CsvConverter(header.encode())
    for row, exp in zip(rows, expected):
        assert json.loads(conv._slow(row.encode())) == exp


def test_csv_malformed_rows_reach_the_decoder(tmp_path: Path) -> None:
    p = tmp_path / "bad.csv"
    good = ["0.1,0", "0.9,1"]
    bad = {"0.5": "not_object", "0.5,1,7": "not_json", "abc,1": "bad_type", "nan,1": "non_finite",
           "inf,0": "non_finite", "1.5,1": "out_of_range", "0.5,3": "label_range", "0.5,x": "bad_type"}
    lines = ["score,label"] + good[:1] + list(bad) + good[1:]
    p.write_bytes(("\n".join(lines) + "\n").encode() + b"\xff\xfe,1\n")
    batch = FileSource(p).read()
    assert len(batch.records) == len(lines) - 1 + 1
    dec = Decoder().decode([r.replace(b"{", b'{"model":"m",', 1) if r.startswith(b"{") else r
                            for r in batch.records], batch.origins)
    reasons = {batch.origins[r.index].rsplit(":", 1)[1]: r.reason for r in dec.rejected}
    expected = {str(i + 3): reason for i, reason in enumerate(bad.values())}
    expected[str(len(lines) + 1)] = "not_json"  # invalid UTF-8 row: raw bytes
    assert reasons == expected
    assert len(dec.models["m"]) == 2


def test_csv_bad_header_passes_rows_through(tmp_path: Path) -> None:
    p = tmp_path / "nohdr.csv"
    p.write_text("0.3,1\n0.4,0\n")
    got = records(drain(FileSource(p)))
    assert got == [b"0.3,1", b"0.4,0"]  # the decoder rejects both as not_json
    assert {r.reason for r in Decoder().decode(got).rejected} == {"not_json"}
    for hdr in ["score,score,label", "p0,p2,label", "score,p0,p1,label", "foo,bar"]:
        assert CsvConverter(hdr.encode()).error is not None


def test_auto_format_sniffing(tmp_path: Path) -> None:
    (tmp_path / "a.log").write_bytes(ev(1) + b"\n")
    (tmp_path / "b.log").write_text("score,label\n0.5,1\n")
    got = records(drain(FileSource(tmp_path, pattern="*.log")))
    assert got == [ev(1), b'{"score":0.5,"label":1}']


# ------------------------------------------------------------------------------ follow


def test_follow_partial_line_held_back(tmp_path: Path) -> None:
    p = tmp_path / "a.jsonl"
    p.write_bytes(ev(0) + b"\n" + ev(1)[:10])
    src = FileSource(p, follow=True, poll_interval=0.01)
    assert src.read(timeout=0.05).records == [ev(0)]
    assert src.read(timeout=0.05) is None  # the partial line waits for its newline
    pos = src.position()
    with open(p, "ab") as fh:
        fh.write(ev(1)[10:] + b"\n")
    assert src.read(timeout=0.5).records == [ev(1)]
    assert not src.exhausted
    # resume from the position taken while the line was partial
    src2 = FileSource(p, follow=True)
    src2.seek(pos)
    assert records(drain(src2, timeout=0.05)) == [ev(1)]


def test_follow_waits_for_missing_file_and_new_files_in_directory(tmp_path: Path) -> None:
    p = tmp_path / "later.jsonl"
    src = FileSource(p, follow=True, poll_interval=0.01)
    assert src.read(timeout=0.05) is None
    write_lines(p, [ev(1)])
    assert src.read(timeout=1.0).records == [ev(1)]
    d = tmp_path / "dir"
    d.mkdir()
    srcd = FileSource(d, follow=True, poll_interval=0.01)
    assert srcd.read(timeout=0.02) is None
    write_lines(d / "2.jsonl", [ev(2)])
    assert srcd.read(timeout=1.0).records == [ev(2)]
    write_lines(d / "1.jsonl", [ev(1)])
    write_lines(d / "2.jsonl", [ev(3)])
    assert sorted(records(drain(srcd, timeout=0.05))) == [ev(1), ev(3)]


def test_follow_start_end(tmp_path: Path) -> None:
    p = tmp_path / "a.jsonl"
    write_lines(p, [ev(0), ev(1)])
    with open(p, "ab") as fh:
        fh.write(ev(2)[:5])  # a partial line at the end belongs to the future
    src = FileSource(p, follow=True, start="end", poll_interval=0.01)
    assert src.read(timeout=0.05) is None
    with open(p, "ab") as fh:
        fh.write(ev(2)[5:] + b"\n")
    b = src.read(timeout=0.5)
    assert b.records == [ev(2)] and b.origins[0].endswith(":3")


def test_follow_rotation_by_rename(tmp_path: Path) -> None:
    p = tmp_path / "app.jsonl"
    write_lines(p, [ev(i, "old") for i in range(5)])
    src = FileSource(p, follow=True, poll_interval=0.01, rotate_grace=0.5)
    assert records(drain(src, timeout=0.02)) == [ev(i, "old") for i in range(5)]
    with open(p, "ab") as w:  # the writer keeps its handle across the rename
        w.write(ev(5, "old") + b"\n")
        os.rename(p, tmp_path / "app.jsonl.1")
        write_lines(p, [ev(i, "new") for i in range(3)], "wb")
        w.write(ev(6, "old") + b"\n" + ev(7, "old")[:7])  # late writes to the renamed file
        w.flush()
        got = records(drain(src, timeout=0.05))
        w.write(ev(7, "old")[7:] + b"\n")
    time.sleep(0.6)
    got += records(drain(src, timeout=0.3))
    want = [ev(i, "old") for i in range(5, 8)] + [ev(i, "new") for i in range(3)]
    assert sorted(got) == sorted(want) and len(got) == len(want)
    assert len(src.position()["files"]) == 1  # the drained rotated file was dropped


def test_follow_rotation_unterminated_tail_of_rotated_file(tmp_path: Path) -> None:
    p = tmp_path / "app.jsonl"
    p.write_bytes(ev(0) + b"\n" + ev(1))  # writer died without the final newline
    src = FileSource(p, follow=True, poll_interval=0.01, rotate_grace=0.05)
    assert src.read(timeout=0.02).records == [ev(0)]
    os.rename(p, tmp_path / "app.jsonl.1")
    time.sleep(0.1)
    assert records(drain(src, timeout=0.1)) == [ev(1)]  # delivered once the rotated file is final


def test_follow_truncation(tmp_path: Path) -> None:
    p = tmp_path / "app.jsonl"
    write_lines(p, [ev(i, "a") for i in range(10)])
    src = FileSource(p, follow=True, poll_interval=0.01)
    assert len(records(drain(src, timeout=0.02))) == 10
    with open(p, "r+b") as fh:  # copytruncate
        fh.truncate(0)
    write_lines(p, [ev(i, "b") for i in range(3)])
    assert records(drain(src, timeout=0.05)) == [ev(i, "b") for i in range(3)]
    assert src.position()["files"][0]["offset"] == p.stat().st_size


def test_resume_after_rotation_finds_renamed_file(tmp_path: Path) -> None:
    p = tmp_path / "app.jsonl"
    write_lines(p, [ev(i, "old") for i in range(10)])
    src = FileSource(p, follow=True, poll_interval=0.01)
    b = src.read(4, timeout=0.05)
    pos = json.loads(json.dumps(b.position))
    src.close()  # crash; meanwhile the file is rotated
    os.rename(p, tmp_path / "app.jsonl.1")
    write_lines(p, [ev(i, "new") for i in range(2)])
    src2 = FileSource(p, follow=True, poll_interval=0.01, rotate_grace=0.0)
    src2.seek(pos)
    assert not src2.lost
    got = records(drain(src2, timeout=0.05))
    assert got == [ev(i, "old") for i in range(4, 10)] + [ev(i, "new") for i in range(2)]


def test_seek_rejects_reused_inode_by_fingerprint(tmp_path: Path) -> None:
    p = tmp_path / "a.jsonl"
    write_lines(p, [ev(i) for i in range(5)])
    src = FileSource(p)
    pos = src.read(3).position
    pos["files"][0]["fp"] = "0" * 40  # as if the inode now held another file
    src2 = FileSource(p)
    src2.seek(pos)
    assert len(src2.lost) == 1
    assert records(drain(src2)) == [ev(i) for i in range(5)]  # unknown file: read from its start


def test_seek_truncated_since_checkpoint_restarts_at_zero(tmp_path: Path) -> None:
    p = tmp_path / "a.jsonl"
    write_lines(p, [ev(i) for i in range(5)])
    src = FileSource(p, follow=True)
    pos = src.read(5, timeout=0.05).position
    with open(p, "r+b") as fh:
        fh.truncate(0)
        fh.write(ev(9) + b"\n")
    src2 = FileSource(p, follow=True)
    src2.seek(pos)
    assert records(drain(src2, timeout=0.02)) == [ev(9)]


def test_overlong_line_is_skipped_as_one_record_not_buffered(tmp_path: Path) -> None:
    """A line beyond max_line_bytes becomes one OversizedRecord (prefix, real size, SHA-256) that the
    decoder rejects as too_large; the lines around it are untouched (issue #14, 200 MB line)."""
    p = tmp_path / "a.jsonl"
    p.write_bytes(b"x" * 2500)
    src = FileSource(p, follow=True, max_line_bytes=1000, chunk_bytes=512)
    assert records(drain(src, timeout=0.02)) == []  # unterminated: read past, nothing held but a digest
    assert src.read(10, timeout=0.0) is None and src.position()["files"][0]["offset"] == 0
    write_lines(p, [b"", ev(1)])
    got = drain(src, timeout=0.02)
    recs = records(got)
    assert len(recs) == 2 and recs[1] == ev(1)
    big = recs[0]
    assert isinstance(big, OversizedRecord) and len(big) == 2500 and bytes(big) == b"x" * 2500
    assert big.sha256 == hashlib.sha256(b"x" * 2500).hexdigest()
    assert got[0].origins[0].endswith("a.jsonl:1") and got[-1].origins[-1].endswith("a.jsonl:2")
    out = Decoder(max_record_bytes=1000).decode(recs)
    assert [r.reason for r in out.rejected] == ["too_large"] and len(out.models["m"]) == 1
    # a complete line that is too long is skipped the same way, and a restart continues after it
    write_lines(p, [b"y" * 3000, ev(2)])
    b = src.read(1, timeout=0.02)
    assert b is not None and len(b.records[0]) == 3000 and bytes(b.records[0]) == b"y" * 3000
    src2 = FileSource(p, follow=True, max_line_bytes=1000, chunk_bytes=512)
    src2.seek(b.position)
    assert records(drain(src2, timeout=0.02)) == [ev(2)]


def test_huge_line_costs_bounded_memory(tmp_path: Path) -> None:
    """A 40 MB line without newline is read past in chunks: Python allocations stay a few MB."""
    p = tmp_path / "a.jsonl"
    with open(p, "wb") as fh:
        for _ in range(40):
            fh.write(b"z" * (1 << 20))
        fh.write(b"\n" + ev(7) + b"\n")
    src = FileSource(p, max_line_bytes=1 << 20, chunk_bytes=1 << 20)
    tracemalloc.start()
    try:
        recs = records(drain(src))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert [len(r) for r in recs] == [40 << 20, len(ev(7))]
    assert peak < 12 << 20, peak


def test_copytruncate_then_restart_counts_each_line_once(tmp_path: Path) -> None:
    p = tmp_path / "a.jsonl"
    write_lines(p, [ev(i, "old") for i in range(70)])
    src = FileSource(p, follow=True, poll_interval=0.01)
    assert len(records(drain(src, timeout=0.02))) == 70
    with open(p, "r+b") as fh:  # copytruncate: the copy goes elsewhere, the file starts empty
        fh.truncate(0)
    assert records(drain(src, timeout=0.02)) == []
    write_lines(p, [ev(i, "new") for i in range(3)])
    got = drain(src, timeout=0.02)
    assert records(got) == [ev(i, "new") for i in range(3)]
    pos = json.loads(json.dumps(got[-1].position))
    src.close()
    write_lines(p, [ev(i, "new") for i in range(3, 5)])
    src2 = FileSource(p, follow=True, poll_interval=0.01)
    src2.seek(pos)
    assert not src2.lost
    assert records(drain(src2, timeout=0.02)) == [ev(3, "new"), ev(4, "new")]


@pytest.mark.parametrize("restart", [False, True])
def test_truncation_then_growth_past_the_old_size_loses_nothing(tmp_path: Path, restart: bool) -> None:
    """Truncated and rewritten beyond the old size before the next poll (or while the agent is down):
    the bytes before the position changed, so the file is read again from its start."""
    p = tmp_path / "a.jsonl"
    write_lines(p, [ev(i, "old") for i in range(5)])
    src = FileSource(p, follow=True, poll_interval=0.01)
    pos = drain(src, timeout=0.02)[-1].position
    new = [ev(i, "renewed") for i in range(70)]
    with open(p, "r+b") as fh:
        fh.truncate(0)
        fh.write(b"".join(x + b"\n" for x in new))
    if restart:
        src.close()
        src = FileSource(p, follow=True, poll_interval=0.01)
        src.seek(json.loads(json.dumps(pos)))
    assert records(drain(src, timeout=0.02)) == new


# ------------------------------------------------------------------------------ crash / resume


@pytest.mark.parametrize("seed", [7, 8, 9])
def test_crash_resume_exactly_once_with_rotation(tmp_path: Path, seed: int) -> None:
    """A writer appends (with partial lines) and rotates by rename; a reader checkpoints after random
    batches and "crashes" (drops all uncommitted reads) at random moments, sometimes staying down
    across several rotations. With the rotated names in the spec (``app.jsonl`` + ``app.jsonl.*``),
    every line committed across the restarts is each written line exactly once."""
    rng = random.Random(seed)
    d = tmp_path / "logs"
    d.mkdir()
    live = d / "app.jsonl"
    spec = [live, str(d / "app.jsonl.*")] if seed % 2 else str(d / "app.jsonl*")
    (d / "app.jsonl.0.gz").write_bytes(b"\x1f\x8b compressed, never read")
    written: list[bytes] = []
    committed: list[bytes] = []
    pos = None
    src = None
    pending: bytes = b""
    serial = 0
    rotations = 0
    down = 0
    for _step in range(600):
        action = rng.random()
        if action < 0.55:  # append some lines, sometimes leaving a partial line
            n = rng.randint(1, 30)
            chunk = pending
            for _ in range(n):
                line = ev(serial, "s")
                serial += 1
                written.append(line)
                chunk += line + b"\n"
            cut = rng.randint(len(chunk) - 10, len(chunk)) if rng.random() < 0.3 else len(chunk)
            with open(live, "ab") as fh:
                fh.write(chunk[:cut])
            pending = chunk[cut:]  # the partial line is completed by the next append
        elif action < 0.60 and not pending and live.exists():  # rotate by rename
            rotations += 1
            os.rename(live, d / f"app.jsonl.{rotations}")
        if src is None:
            src = FileSource(spec, follow=True, poll_interval=0.001, rotate_grace=0.0)
            if pos is not None:
                src.seek(pos)
                assert not src.lost
        b = src.read(rng.randint(1, 50), timeout=0.0)
        if b is not None:
            if rng.random() < 0.7:  # commit: the checkpoint holds these records and the position
                committed.extend(b.records)
                pos = json.loads(json.dumps(b.position))
            else:  # crash before the checkpoint: these records are re-read after the restart
                src.close()
                src = None
        if rng.random() < 0.05 and src is not None:  # crash, and stay down for a few steps
            src.close()
            src = None
            down = rng.randint(0, 10)
        if src is None and down > 0:
            down -= 1
            continue
    with open(live, "ab") as fh:
        fh.write(pending)
    if src is None:
        src = FileSource(spec, follow=True, poll_interval=0.001, rotate_grace=0.0)
        if pos is not None:
            src.seek(pos)
    for _ in range(20):
        committed.extend(records(drain(src, timeout=0.01)))
    assert rotations > 5
    assert len(committed) == len(written)
    assert sorted(committed) == sorted(written)


# ------------------------------------------------------------------------------ throughput


def test_reading_is_chunked_not_per_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Reading and splitting cost per chunk, not per line: 300,000 lines come in a handful of ``os.read`` calls
    and full batches. (Its speed is measured by ``python -m benchmarks.bench_agent``, not asserted here.)"""
    n = 300_000
    p = tmp_path / "big.jsonl"
    line = ev(123456789)
    p.write_bytes((line + b"\n") * n)
    reads = 0
    real_read = os.read

    def counting_read(fd: int, size: int) -> bytes:
        nonlocal reads
        reads += 1
        return real_read(fd, size)

    monkeypatch.setattr(os, "read", counting_read)
    batches = drain(FileSource(p, origins=False))
    assert sum(len(b.records) for b in batches) == n
    assert len(batches) <= n // 65536 + 2  # full batches of max_records
    assert reads <= (n * (len(line) + 1)) // (1 << 20) + 2 * len(batches) + 4, reads


_WORKER = r'''
import sys
import time
from connectors.deadletter import FileDeadLetterSink
from connectors.files import FileSource
from calmon.state.checkpoint.store import CheckpointStore
inp, state = sys.argv[1], sys.argv[2]
store = CheckpointStore(state, keep=2)
sink = FileDeadLetterSink(state + "/dead.jsonl", buffer_bytes=4096)
src = FileSource(inp, name="in")
doc = store.load()
count, total = 0, 0
if doc is not None:
    count, total = doc["count"], doc["total"]
    src.seek(doc["pos"])
    sink.seek(doc["dl"])
else:
    # a fresh start checkpoints its baseline before writing anything: a run killed before its first
    # periodic checkpoint leaves dead letters behind, which the next run must truncate, not append to
    store.save({"count": 0, "total": 0, "pos": src.position(), "dl": sink.position()})
print("ready", flush=True)
k = 0
while (b := src.read(997)) is not None:
    bad = [i for i, r in enumerate(b.records) if not r.startswith(b'{"i":')]
    sink.write([b.records[i] for i in bad], ["not_json"] * len(bad), b.source, [b.origins[i] for i in bad])
    good = [r for r in b.records if r.startswith(b'{"i":')]
    count += len(good)
    total += sum(int(r[5:-1]) for r in good)
    k += 1
    time.sleep(0.02)  # a pass takes > 2.4 s: more than 5 kills of at most 0.4 s each
    if k % 7 == 0:
        store.save({"count": count, "total": total, "pos": b.position, "dl": sink.position()})
store.save({"count": count, "total": total, "pos": src.position(), "dl": sink.position()})
print("done", flush=True)
'''


def test_sigkill_resume_with_checkpoint_and_dead_letters(tmp_path: Path) -> None:
    """A process reads a file, counts its valid lines, dead-letters the bad ones and checkpoints
    (statistics + source position + dead-letter size) every few batches; it is SIGKILLed at random
    moments and restarted until it finishes (10 kills). The final counts and the dead-letter file are
    exactly those of one uninterrupted pass."""
    import signal
    import subprocess
    import sys

    n = 120_000
    lines = [b"bad line %d" % i if i % 101 == 0 else b'{"i":%d}' % i for i in range(n)]
    inp = tmp_path / "in.jsonl"
    inp.write_bytes(b"\n".join(lines) + b"\n")
    state = tmp_path / "state"
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[1]))
    rng = random.Random(5)
    kills = 0
    midway = 0  # kills that found a checkpoint strictly between start and end
    from calmon.state.checkpoint.store import CheckpointStore
    for _ in range(100):
        proc = subprocess.Popen([sys.executable, "-c", _WORKER, str(inp), str(state)], stdout=subprocess.PIPE,
                                env=env)
        if kills < 10:
            # time the kill from the end of the worker's start-up (imports, checkpoint load, seeks), which
            # takes anywhere from 0.1 s to over 1 s depending on the machine's load
            assert proc.stdout is not None
            proc.stdout.readline()
            time.sleep(rng.uniform(0.1, 0.4))
            if proc.poll() is None:
                proc.send_signal(signal.SIGKILL)
                kills += 1
        out = proc.communicate(timeout=60)[0]
        if b"done" in out:
            break
        mid = CheckpointStore(state).load()
        midway += mid is not None and 0 < mid["count"] < n - n // 101 - 1
    assert kills >= 5 and midway >= 3, (kills, midway)
    doc = CheckpointStore(state).load()
    good = [i for i in range(n) if i % 101]
    assert doc["count"] == len(good) and doc["total"] == sum(good)
    dead = [json.loads(x) for x in (state / "dead.jsonl").read_text().splitlines()]
    assert [d["origin"] for d in dead] == [f"{inp}:{i + 1}" for i in range(0, n, 101)]
    assert [d["record"] for d in dead] == [f"bad line {i}" for i in range(0, n, 101)]
