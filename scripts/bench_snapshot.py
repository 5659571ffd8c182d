"""Benchmark: the cost of one round's snapshot of every window sum (``AgentState.snapshot``) at M binary models.

Builds an agent as ``scripts/bench_models.py`` does (M models x 3 rings, the default tiers and windows, replay
traffic of ``--events`` labeled events over 8 days), then ``--rounds`` times: ingests one more minute of events of
every model ``--minutes`` later (as between two evaluation rounds; 5: every round enters a new tier-0 bucket, so
every stable sum is recomputed -- the expensive rounds) and times ``state.snapshot()`` alone.  With
``--compare`` every round snapshots twice, interleaved: once by the reference path (``windowsums.REFERENCE``:
:meth:`~calmon.agent.windowsums.Plan.run_reference`'s pairwise merges and full bucket copies, as before) and
once by the default path, and checks that both give the same statistics (pending folds are aggregated before,
so that neither pays them).  Prints min/median seconds per path and the load.

    nice -n 5 python scripts/bench_snapshot.py --models 100 --events 1e6 --rounds 5 --compare
    nice -n 5 python scripts/bench_snapshot.py --models 1000 --events 1e6 --rounds 3 --compare
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
for p in (ROOT, ROOT / "scripts"):
    if str(p) not in sys.path:
        sys.path.append(str(p))


def _same(a: Any, b: Any) -> bool:
    """Whether two window sums hold the same statistics (every grid, the reservoir rows and counts)."""
    sa, sb = a.stats, b.stats
    return (sa == sb and a.rel == b.rel and a.pred == b.pred
            and (sa.reservoir is None or sa.reservoir.rows.tobytes() == sb.reservoir.rows.tobytes()))


def _flush_all(state: Any) -> None:
    with state.lock:
        for mw in state.models.values():
            for ring in mw.rings.values():
                states = [b for tier in ring.buckets for b in tier.values()]
                for b in states + ([ring.archive] if ring.archive is not None else []):
                    b.stats  # noqa: B018  (the property aggregates pending folds)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", type=int, default=100)
    ap.add_argument("--events", type=float, default=1e6)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--minutes", type=int, default=5,
                    help="event-time minutes between rounds (5: every round enters a new 5-minute tier-0 bucket)")
    ap.add_argument("--compare", action="store_true", help="interleave the reference path and check equality")
    args = ap.parse_args(argv)
    import bench_models as bm

    from calmon.agent import windowsums
    from calmon.agent.buckets import BucketStats

    read_copy = BucketStats.read_copy

    m, ev = args.models, int(args.events)
    cfg = bm.bench_config(tempfile.mkdtemp(), m, 30.0)
    src = bm.MemorySource("replay", bm.Traffic("replay", m, ev, 0).records())
    agent, _ = bm._open_agent(cfg, src, timed=False)
    t = time.perf_counter()
    bm._ingest_all(agent, src, None)
    print(f"ingested {ev} events of {m} models in {time.perf_counter() - t:.1f} s", flush=True)
    state = agent.state
    state.snapshot()  # the first snapshot sums every window from scratch (as after a restart)
    times: dict[str, list[float]] = {"new": [], "reference": []}
    for minute in range(args.rounds):
        bm._ingest_all(agent, bm._more(m, max(1000, ev // 100), 1 + minute, args.minutes * minute), None)
        if args.compare:  # neither path should pay the aggregation of the folds pending from the ingest
            _flush_all(state)
        paths = ["reference", "new"] if args.compare and minute % 2 == 0 else ["new", "reference"]
        got: dict[str, Any] = {}
        for path in paths if args.compare else ["new"]:
            cache = dict(state._snap_cache)  # both paths start from the same kept sums
            windowsums.REFERENCE = path == "reference"
            if path == "reference":  # the bucket copies as before, generator included
                BucketStats.read_copy = BucketStats.copy  # type: ignore[method-assign]
            try:
                t = time.perf_counter()
                got[path] = state.snapshot()
                times[path].append(time.perf_counter() - t)
            finally:
                windowsums.REFERENCE = False
                BucketStats.read_copy = read_copy  # type: ignore[method-assign]
            if path == paths[0] and args.compare:
                state._snap_cache = cache
        if args.compare:
            bad = sum(not _same(a.bucket, b.bucket) for a, b in zip(got["new"], got["reference"]))
            print(f"round {minute}: " + ", ".join(f"{p} {times[p][-1]:.3f} s" for p in paths)
                  + f", windows differing: {bad} of {len(got['new'])}", flush=True)
        else:
            print(f"round {minute}: new {times['new'][-1]:.3f} s", flush=True)
    for path, ts in times.items():
        if ts:
            print(f"{path}: min {min(ts):.3f} s, median {statistics.median(ts):.3f} s over {len(ts)} snapshots")
    if args.compare:
        ratio = statistics.median(times["reference"]) / statistics.median(times["new"])
        print(f"ratio reference/new (median): {ratio:.2f}")
    print("load:", os.getloadavg())
    agent.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
