"""A reduced run of ``python -m benchmarks.bench_models`` (M = 2, few events): it runs and prints every column (no
timing asserts)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[1]


def _module() -> ModuleType:
    from benchmarks import bench_models

    return bench_models


def _cells(line: str) -> list[str]:
    return [c.strip() for c in line.strip().strip("|").split("|")]


def test_traffic_is_deterministic_and_live_outcomes_follow_predictions() -> None:
    bench = _module()
    a = list(bench.Traffic("live", 3, 200, seed=5).records())
    assert a == list(bench.Traffic("live", 3, 200, seed=5).records())
    assert a != list(bench.Traffic("live", 3, 200, seed=6).records())
    assert len(a) == 400 and sum(b'"type":"outcome"' in r for r in a) == 200
    seen: set[bytes] = set()
    for r in a:  # every outcome comes after its prediction (arrival order)
        rid = r.split(b'"id":"')[1].split(b'"')[0]
        if b'"type":"prediction"' in r:
            seen.add(rid)
        else:
            assert rid in seen
    replay = list(bench.Traffic("replay", 4, 300, seed=5).records())
    assert len(replay) == 300 and {r.split(b'"model":"')[1][:10] for r in replay} == {
        f"model-000{i}".encode() for i in range(4)}


def test_timed_lock_measures_the_outermost_hold_per_phase() -> None:
    import threading

    bench = _module()
    lock = bench.TimedLock(threading.RLock())
    lock.phase = "round"
    with lock:
        with lock:  # re-entrant: one hold
            pass
    lock.phase = "checkpoint"
    assert lock.acquire()
    lock.release()
    assert set(lock.longest) == {"round", "checkpoint"} and all(v >= 0 for v in lock.longest.values())


def test_reduced_run_prints_every_column() -> None:
    bench = _module()
    out = subprocess.run([sys.executable, "-m", "benchmarks.bench_models", "--models", "2", "--events", "2000",
                          "--rounds", "1", "--budget", "1"], capture_output=True, text=True, cwd=ROOT, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    lines = [ln for ln in out.stdout.splitlines() if ln.startswith("|")]
    header = _cells(lines[0])
    assert header == list(bench.COLUMNS)
    rows = [_cells(ln) for ln in lines[2:] if ln.startswith("| ") and _cells(ln)[0].isdigit()]
    assert [r[0] for r in rows] == ["1", "2"]
    for r in rows:
        assert len(r) == len(header) and all(r)
    m1, m2 = rows
    assert m1[1] == "3" and m2[1] == "6"  # three rings per model
    assert "/" in m1[2]  # M = 1 ran twice (interleaved): min/median
    assert all(name in m2[header.index("windows evaluated per round")] for name in ("tcal", "smce", "ldtc"))
    goal_rows = [_cells(ln)[0] for ln in lines if ln.startswith("| ") and not _cells(ln)[0].isdigit()]
    assert len([g for g in goal_rows if g in {w for w, _, _ in bench.GOALS}]) == len(bench.GOALS)
    assert "load average" in out.stdout and "memory ceiling" in out.stdout


def test_rows_of_earlier_runs_make_the_docs_table(tmp_path: Path) -> None:
    """``--rows`` reads a run's stderr (its ``M = ...: {...}`` lines) and ``--docs`` writes the table between the
    page's markers, and only there; without an M = 1 row there is no baseline."""
    bench = _module()
    row = {"models": 1, "rings": 3, "budget": 30.0, "live_rate": 1e4, "live_state": 3e5, "replay_rate": 2e4,
           "replay_state": 6e5, "round_s": [0.5, 0.4], "round_cpu": [0.3, 0.2], "deferred": [0, 0],
           "round_lock": 0.01, "round_lock_cpu": 0.01, "windows": 12, "results": {t: [12, 12] for t in bench.TESTERS},
           "unchanged": [0, 0], "overruns": 0, "metrics_s": 0.01, "metrics_bytes": 5e4, "ck1_s": 0.1, "ck1_bytes": 1e6,
           "ck2_s": 0.05, "ck2_bytes": 1e5, "ck_lock": 0.01, "ck_lock_cpu": 0.01, "restore_s": 0.1,
           "restore_open_s": 0.2, "restore_rss": 2e8, "restore_same": True, "peak_rss": 3e8}
    big = {**row, "models": 3000, "rings": 9000, "live_rate": 5e3, "round_s": [40.0, 29.0], "deferred": [9, 3]}
    log = tmp_path / "err.txt"
    log.write_text("".join(f"M = {r['models']}: 9 s, load 3.5: {__import__('json').dumps(r)}\n" for r in (row, big)))
    page = tmp_path / "performance.md"
    page.write_text(f"# P\n\nabove\n\n{bench.BEGIN}\nold\n{bench.END}\n\nbelow\n")
    monkey = bench.PAGE
    try:
        bench.PAGE = str(page)
        assert bench.main(["--models", "", "--rows", str(log), "--docs"]) == 0
    finally:
        bench.PAGE = monkey
    text = page.read_text()
    assert text.startswith("# P\n\nabove\n\n") and text.endswith("\n\nbelow\n") and "\nold\n" not in text
    table = text.split(bench.BEGIN)[1].split(bench.END)[0]
    assert "| 3000 | 9000 | 5k | 0.50 |" in table and "| 9,3 | 3.5 |" in table
    assert "| round within the budget (wall) | <= budget | yes | **no** |" in table
