"""Decompression bombs and other hostile whole files (issue #31): bounded pieces, bounded memory and work per
read, a bomb rejected with a reason (``decompression_bomb``) and dead-lettered while the other files are read
completely, ``calmon check`` answering a bomb at once with one line, a non-Parquet ``.parquet`` file named.

Bombs are concatenated gzip members / zstd frames of one compressed MiB of zeros (one stream to the reader), so
a GiB bomb costs a few kilobytes and no compression time; work is asserted on bytes decompressed, never on time.
"""

from __future__ import annotations

import bz2
import gzip
import io
import json
import logging
import lzma
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import zstandard

from calmon.events.decoder import Decoder
from calmon.formats import compressed
from calmon.formats.compressed import PIECE, RATIO_WINDOW, DecompressionBomb, Decompressor, iter_decompressed
from calmon.formats.parquet import NotATable, TableFile
from calmon.formats.records import OversizedRecord
from calmon.offline.inputs import InputError, read_input
from connectors.deadletter import FileDeadLetterSink
from connectors.files import FileSource
from connectors.filewhole import READ_BUDGET

MIB = 1 << 20
REPO = Path(__file__).resolve().parents[1]


def bomb(codec: str, mib: int, head: bytes = b"") -> bytes:
    """``head`` then ``mib`` MiB of zeros (no newline) as one gzip or zstd stream of many members or frames."""
    unit = gzip.compress(bytes(MIB), 6) if codec == "gzip" else zstandard.ZstdCompressor(level=3).compress(bytes(MIB))
    first = gzip.compress(head) if codec == "gzip" else zstandard.ZstdCompressor().compress(head)
    return (first if head else b"") + unit * mib


def events(n: int, tag: str) -> list[bytes]:
    return [json.dumps({"model": "m", "id": f"{tag}{i}", "score": 0.25 + 0.5 * (i % 2), "label": i % 2}).encode()
            for i in range(n)]


def drain(src: FileSource, n: int = 65536) -> list:
    out = []
    for _ in range(10_000):
        b = src.read(n, timeout=0.0)
        if b is None:
            if not src.follow or src.exhausted:
                break
            continue
        out.append(b)
    return out


# ------------------------------------------------------------------------------ the decompressor


@pytest.mark.parametrize("codec", ["gzip", "zstd", "bzip2", "xz"])
def test_every_piece_is_bounded_whatever_the_stream(codec: str) -> None:
    """One stream of 40 MiB of zeros (a single zstd frame: zstandard's decompressobj has no max_length) comes
    out in pieces of at most PIECE bytes, all of it, with the expansion cap off."""
    z = bytes(40 * MIB)
    packed = {"gzip": lambda: gzip.compress(z, 1), "zstd": lambda: zstandard.ZstdCompressor(level=1).compress(z),
              "bzip2": lambda: bz2.compress(z, 1), "xz": lambda: lzma.compress(z, preset=0)}[codec]()
    d = Decompressor(codec, max_ratio=None)
    sizes = [len(p) for i in range(0, len(packed), 1 << 18) for p in d.feed(packed[i:i + (1 << 18)])]
    d.finish()
    assert sum(sizes) == len(z) and max(sizes) <= PIECE
    assert d.consumed == len(packed)


def test_zstd_steps_follow_block_headers_and_survive_skippable_frames_and_padding() -> None:
    """zstd is handed whole blocks (63 at a time); frames with a checksum, a skippable frame in between and zero
    padding at the end decode as before, and a truncated frame is still noticed."""
    data = b"".join(events(20_000, "z")) + b"\n"
    skippable = (0x184D2A53).to_bytes(4, "little") + (5).to_bytes(4, "little") + b"hello"
    packed = zstandard.ZstdCompressor(write_checksum=True).compress(data[:1000]) + skippable + \
        zstandard.ZstdCompressor(level=19).compress(data[1000:]) + bytes(16)
    assert b"".join(iter_decompressed(io.BytesIO(packed).read, "zstd", raw_chunk=777)) == data
    with pytest.raises(compressed.CorruptStream, match="zstd stream is truncated"):
        b"".join(iter_decompressed(io.BytesIO(packed[:-40]).read, "zstd"))


@pytest.mark.parametrize("codec", ["gzip", "zstd"])
def test_a_bomb_stops_after_one_window(codec: str) -> None:
    packed = bomb(codec, 1024)  # 1 GiB of zeros
    d = Decompressor(codec)
    out = 0
    with pytest.raises(DecompressionBomb, match=f"{codec} stream expands more than 100 times"):
        for i in range(0, len(packed), 1 << 16):
            for p in d.feed(packed[i:i + (1 << 16)]):
                out += len(p)
    assert RATIO_WINDOW - PIECE <= out <= RATIO_WINDOW and d.produced <= RATIO_WINDOW + PIECE


def test_ordinary_json_lines_are_far_below_the_cap() -> None:
    """Events stay below the default cap over every window (the check is no false alarm on what calmon reads),
    even at the strongest levels and with windows of 1 MiB instead of 64 (where a bzip2 block's output, which
    comes out whole, weighs 64 times more)."""
    rng = np.random.default_rng(1)
    lines = [json.dumps({"model": "fraud-v3", "id": f"req-{i:09d}", "ts": 1767225600 + i // 10,
                         "score": round(float(s), 4), "label": int(rng.uniform() < s), "segment": "us"}).encode()
             for i, s in enumerate(rng.uniform(size=50_000))]
    data = b"\n".join(lines) + b"\n"
    for packed, codec in ((gzip.compress(data, 9), "gzip"), (zstandard.ZstdCompressor(level=19).compress(data), "zstd"),
                          (lzma.compress(data, preset=9), "xz"), (bz2.compress(data, 9), "bzip2")):
        d = Decompressor(codec, window=MIB)
        assert b"".join(d.feed(packed)) == data and d.produced > 4 * MIB


# ------------------------------------------------------------------------------ the file source


def _drop_dir(tmp_path: Path) -> tuple[Path, list[bytes]]:
    """A directory with good files around two bombs (three good lines before the gzip one's zeros)."""
    d = tmp_path / "drop"
    d.mkdir()
    a, pre, c = events(1000, "a"), events(3, "pre"), events(700, "c")
    (d / "a.jsonl").write_bytes(b"\n".join(a) + b"\n")
    (d / "b.jsonl.gz").write_bytes(bomb("gzip", 1024, b"\n".join(pre) + b"\n"))  # 1 GiB after three lines
    (d / "c.jsonl.gz").write_bytes(gzip.compress(b"\n".join(c) + b"\n"))
    (d / "d.jsonl.zst").write_bytes(bomb("zstd", 10240))  # 10 GiB
    return d, a + pre + c


@pytest.mark.parametrize("follow", [False, True])
def test_bombs_are_rejected_with_a_reason_and_the_other_files_are_read_completely(tmp_path: Path,
                                                                                 follow: bool) -> None:
    d, good = _drop_dir(tmp_path)
    src = FileSource([str(d / "*.gz"), str(d / "*.zst"), str(d)], name="drop", follow=follow, settle=0.0,
                     poll_interval=0.01)
    batches = drain_until_done(src, len(good) + 2) if follow else drain(src)
    recs = [r for b in batches for r in b.records]
    origins = [o for b in batches for o in b.origins]
    assert sorted(r for r in recs if not isinstance(r, OversizedRecord)) == sorted(good)
    bombs = {Path(o).name: r for o, r in zip(origins, recs) if isinstance(r, OversizedRecord)}
    assert sorted(bombs) == ["b.jsonl.gz:4", "d.jsonl.zst:1"]
    for r in bombs.values():
        assert r.reason == "decompression_bomb" and bytes(r) == bytes(4096)  # its prefix: the zeros
        assert len(r) <= RATIO_WINDOW + 2 * PIECE  # bytes decompressed before it was stopped, of 1 and 10 GiB
    assert src.rejected_files == {"decompression_bomb": 2}
    assert len(src.errors) == 2 and all("decompression bomb, not read further" in e for e in src.errors)
    assert all(e["done"] for e in src.position()["files"] if e.get("whole"))
    # the decoder counts them by reason and the dead-letter sink keeps their prefix, size and hash
    out = Decoder(max_record_bytes=MIB).decode(recs)
    assert out.reason_counts() == {"decompression_bomb": 2} and out.accepted == len(good)
    sink = FileDeadLetterSink(tmp_path / "dead.jsonl", fsync=False)
    sink.write([recs[r.index] for r in out.rejected], [r.reason for r in out.rejected], "drop",
               [origins[r.index] for r in out.rejected])
    sink.close()
    dead = [json.loads(x) for x in (tmp_path / "dead.jsonl").read_text().splitlines()]
    assert sorted((x["reason"], Path(x["origin"]).name, x["truncated"]) for x in dead) == [
        ("decompression_bomb", "b.jsonl.gz:4", True), ("decompression_bomb", "d.jsonl.zst:1", True)]
    # a restart from that position reads nothing again: no second dead letter
    again = FileSource([str(d / "*.gz"), str(d / "*.zst"), str(d)], name="drop", follow=follow, settle=0.0,
                       poll_interval=0.01)
    again.seek(json.loads(json.dumps(batches[-1].position)))
    assert again.read(timeout=0.05) is None and again.rejected_files == {}
    src.close()
    again.close()


def drain_until_done(src: FileSource, n: int) -> list:
    out: list = []
    for _ in range(2000):
        b = src.read(65536, timeout=0.01)
        if b is not None:
            out.append(b)
        if sum(len(x.records) for x in out) >= n and all(e["done"] for e in src.position()["files"]
                                                         if e.get("whole")):
            break
    return out


def test_an_endless_run_of_blank_lines_never_holds_up_the_agent(tmp_path: Path) -> None:
    """Without the expansion cap, 256 MiB of blank lines (no record) next to another file: a followed source's
    read returns after one read budget of it (the agent's loop goes on), each read moving it on by at most
    that, and the other file's records all arrive."""
    d = tmp_path / "d"
    d.mkdir()
    unit = zstandard.ZstdCompressor().compress(b"\n" * MIB)
    (d / "a.jsonl.zst").write_bytes(unit * 256)
    (d / "b.jsonl").write_bytes(b"\n".join(events(50, "b")) + b"\n")
    src = FileSource([str(d / "*.zst"), str(d)], follow=True, settle=0.0, poll_interval=0.01,
                     max_expansion_ratio=None)

    def blank_offset() -> int:
        return next((e["offset"] for e in src.position()["files"] if e["path"].endswith(".zst")), 0)

    got: list[bytes] = []
    moves = []
    while (len(got) < 50 or blank_offset() < 256 * MIB) and len(moves) < 1000:
        before = blank_offset()
        b = src.read(timeout=0.0)
        moves.append(blank_offset() - before)
        got += b.records if b is not None else []
    assert got == events(50, "b") and blank_offset() == 256 * MIB
    assert len(moves) >= 256 * MIB // (READ_BUDGET + 2 * PIECE) and max(moves) <= READ_BUDGET + 2 * PIECE
    src.close()


_CHILD = textwrap.dedent("""
    import json, sys
    from connectors.files import FileSource

    def hwm():
        return next(int(x.split()[1]) for x in open("/proc/self/status") if x.startswith("VmHWM")) * 1024

    src = FileSource(sys.argv[1], max_expansion_ratio=None)
    base = hwm()
    sizes = []
    for b in iter(lambda: src.read(65536, timeout=0.0), None):
        sizes += map(len, b.records)
    print(json.dumps({"base": base, "peak": hwm(), "sizes": sizes}))
""")


@pytest.mark.parametrize("codec,shape", [("gzip", "line"), ("zstd", "line"), ("zstd", "lines")])
def test_memory_stays_bounded_whatever_the_file_holds(tmp_path: Path, codec: str, shape: str) -> None:
    """A child process reads, with the expansion cap off (nothing stops it but the line limit), either a line of
    768 MiB of zeros and one event (the line is read past as one too_large record), or 1 GiB of lines just
    under the 1 MiB line limit (each held whole): the peak RSS grows by less than 160 MiB (the reader holds at
    most 70 MiB; the batch the caller holds and the allocator's slack come on top; measured: 4 and 124 MiB)."""
    path = tmp_path / f"big.jsonl.{'gz' if codec == 'gzip' else 'zst'}"
    pack = gzip.compress if codec == "gzip" else zstandard.ZstdCompressor().compress
    if shape == "line":
        path.write_bytes(bomb(codec, 768) + pack(b"\n" + events(1, "x")[0] + b"\n"))
        want = [768 * MIB, len(events(1, "x")[0])]
    else:
        path.write_bytes(pack((bytes(MIB - 2) + b"\n") * 64) * 16)
        want = [MIB - 2] * 1024
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    res = subprocess.run([sys.executable, "-c", _CHILD, str(path)], capture_output=True, text=True, env=env,
                         timeout=900, check=True)
    doc = json.loads(res.stdout)
    assert doc["sizes"] == want
    assert doc["peak"] - doc["base"] < 160 * MIB, (doc["peak"] - doc["base"]) / MIB


def test_expansion_cap_is_a_source_option_checked_at_start(tmp_path: Path) -> None:
    from calmon.agent.build import StartupError, build_source
    from calmon.config import SourceConfig

    (tmp_path / "a.jsonl").write_text("{}\n")
    for bad in (0.5, "100", True, float("nan")):
        with pytest.raises(ValueError, match="max_expansion_ratio must be a number >= 1"):
            FileSource(str(tmp_path / "a.jsonl"), max_expansion_ratio=bad)  # type: ignore[arg-type]
    scfg = SourceConfig(name="f", type="file", path=str(tmp_path / "a.jsonl"), options={"max_expansion_ratio": 0})
    with pytest.raises(StartupError, match="sources.0: max_expansion_ratio must be"):
        build_source(scfg, 0)
    scfg = SourceConfig(name="f", type="file", path=str(tmp_path / "a.jsonl"),
                        options={"max_expansion_ratio": 2000})
    src = build_source(scfg, 0)
    assert isinstance(src, FileSource) and src.max_expansion_ratio == 2000.0


# ------------------------------------------------------------------------------ calmon check


@pytest.mark.parametrize("codec,suffix", [("gzip", ".jsonl.gz"), ("zstd", ".jsonl.zst"), ("gzip", ".log")])
def test_check_answers_a_bomb_at_once_with_one_line(tmp_path: Path, codec: str, suffix: str,
                                                    capsys: pytest.CaptureFixture[str],
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """``calmon check`` of a 4 GiB bomb: exit 2, one line naming the file, the line and the reason, after
    decompressing at most one ratio window per pass (the first bytes are read once more to tell JSON Lines from
    CSV): bounded work, asserted on bytes, not time."""
    from calmon.cli import main as cli_main

    made: list[Decompressor] = []
    init = Decompressor.__init__

    def spy(self: Decompressor, *args: object, **kw: object) -> None:
        init(self, *args, **kw)  # type: ignore[arg-type]
        made.append(self)

    monkeypatch.setattr(Decompressor, "__init__", spy)
    path = tmp_path / f"bomb{suffix}"
    path.write_bytes(bomb(codec, 4096, b"\n".join(events(3, "e")) + b"\n"))
    capsys.readouterr()
    assert cli_main(["check", str(path), "--tests", "none"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "decompression bomb, not read further" in err[0] and path.name in err[0]
    if suffix != ".log":  # (read as CSV: decompressed whole until the cap stops it)
        assert "line 4: decompression_bomb" in err[0]
    assert 1 <= len(made) <= 2 and sum(d.produced for d in made) <= 2 * (RATIO_WINDOW + 2 * PIECE)


def test_check_reads_past_a_too_long_compressed_line_without_holding_it(tmp_path: Path) -> None:
    """A 20 MiB line (random hex, far below the cap) in compressed JSON Lines is too_large for ``check``, as in the
    agent: an error naming its line, or skipped and counted with --skip-invalid."""
    lines = events(100, "e")
    lines[40] = os.urandom(10 * MIB).hex().encode()
    (tmp_path / "long.jsonl.gz").write_bytes(gzip.compress(b"\n".join(lines) + b"\n", 1))
    with pytest.raises(InputError, match=r"long.jsonl.gz: line 41: too_large"):
        read_input(str(tmp_path / "long.jsonl.gz"))
    ds = read_input(str(tmp_path / "long.jsonl.gz"), skip_invalid=True)
    assert ds.n == 99 and ds.skipped == {"too_large": 1}


def test_check_of_a_bomb_from_standard_input(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
                                             ) -> None:
    from calmon.cli import main as cli_main

    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(bomb("zstd", 2048, events(1, "e")[0] + b"\n"))))
    capsys.readouterr()
    assert cli_main(["check", "-", "--tests", "none"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "<stdin>: line 2: decompression_bomb: zstd stream expands" in err[0]


# ------------------------------------------------------------------------------ a .parquet file that is not one


def test_a_file_named_parquet_that_is_not_one_is_named_once_not_skipped(tmp_path: Path,
                                                                        caplog: pytest.LogCaptureFixture) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    d = tmp_path / "drop"
    d.mkdir()
    (d / "a.jsonl").write_bytes(b"\n".join(events(20, "a")) + b"\n")
    (d / "fake.parquet").write_bytes(b"\n".join(events(5, "f")) + b"\n")
    with pytest.raises(NotATable, match=r"not a Parquet file: it begins with b'\{\"model\"'"):
        TableFile(str(d / "fake.parquet"), "parquet")
    caplog.set_level(logging.INFO, logger="connectors.files")
    src = FileSource(d, follow=True, settle=0.0, poll_interval=0.01)
    got = [r for _ in range(30) if (b := src.read(timeout=0.01)) is not None for r in b.records]
    assert got == events(20, "a")
    named = [r for r in caplog.records if "fake.parquet" in r.getMessage()]
    assert len(named) == 1 and named[0].levelno == logging.ERROR and "not a Parquet file" in named[0].getMessage()
    assert src.rejected_files == {"not_parquet": 1} and len(src.errors) == 1
    src.close()
    # calmon check of the directory: an error naming the file, not a silent skip
    pq.write_table(pa.table({"model": ["m"] * 10, "score": [0.5] * 10, "label": [1] * 10}), d / "real.parquet")
    with pytest.raises(InputError, match=r"fake.parquet: not a Parquet or Arrow file"):
        read_input(str(d))
    (d / "fake.parquet").unlink()
    assert read_input(str(d)).n == 30  # the directory's JSON Lines and Parquet files, read as one input
