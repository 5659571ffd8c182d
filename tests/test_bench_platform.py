"""A reduced run of ``python -m benchmarks.bench_platform`` (M = 1 and 2, seconds): it runs the agent with its
exporter, scrapes it and prints every column and goal (no timing asserts)."""

from __future__ import annotations

import time

import pytest


def _cells(line: str) -> list[str]:
    return [c.strip() for c in line.strip().strip("|").split("|")]


def test_paced_source_hands_out_the_backfill_then_live_records_as_they_fall_due() -> None:
    from benchmarks.bench_platform import PacedSource

    now = time.time()
    src = PacedSource("s", iter([b"a", b"b", b"c"]), iter([(now, [b"d"]), (now + 0.3, [b"e", b"f"])]))
    assert src.read(2).records == [b"a", b"b"] and not src.backfilled.is_set()
    assert src.read(2).records == [b"c"]
    assert src.read(10, timeout=0.05).records == [b"d"] and src.backfilled.is_set()  # e, f not due yet
    deadline = time.monotonic() + 30
    got: list[bytes] = []
    while len(got) < 2 and time.monotonic() < deadline:
        batch = src.read(10, timeout=0.5)
        got += batch.records if batch is not None else []
    assert got == [b"e", b"f"] and src.read(10, timeout=0.05) is None and src.exhausted
    assert src.position() == {"kind": "bench", "records": 6}


@pytest.mark.slow
def test_quick_run_prints_every_column_and_goal(capfd: pytest.CaptureFixture[str]) -> None:
    from benchmarks import bench_platform

    assert bench_platform.main(["--quick"]) == 0
    out, _ = capfd.readouterr()
    lines = out.splitlines()
    header = next(ln for ln in lines if ln.startswith("| models |"))
    assert _cells(header)[:6] == ["models", "rings", "ingest ev/s", "ratio", "state/ring", "/metrics MB (gzip)"]
    rows = {_cells(ln)[0]: _cells(ln) for ln in lines if ln.startswith("| 1 |") or ln.startswith("| 2 |")}
    assert set(rows) == {"1", "2"} and rows["1"][3] == "1.00" and rows["2"][1] == "6"
    assert int(rows["2"][7]) > 0 and int(rows["2"][8]) == 2 * 3 * 4  # series scraped; windows with data
    for goal, _, _ in bench_platform.GOALS:
        assert any(ln.startswith(f"| {goal} |") for ln in lines), goal
