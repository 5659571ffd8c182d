"""Cost of the verdict (calmon.evaluate.verdict.summarize) on a 1024-cell grid, on demand.

Target: under 1 ms per call (the agent calls it for every window every round).  Prints min/median
over interleaved rounds of summarize and of a baseline in the same run (the debiased l2-ECE of the
same grid, which the agent computes anyway), and their ratio.

    python3 -m benchmarks.bench_verdict --rounds 30
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

from calmon.algorithms.ece import l2_ece_squared
from calmon.evaluate.verdict import summarize
from calmon.stats.grid import ScoreGrid

TESTS = {"tcal": {"p_value": 0.001, "decision": "miscalibrated", "method": "mc-grid"},
         "smce": {"p_value": 0.002, "decision": "miscalibrated", "method": "smce"}}


def timed(fn, calls: int) -> float:
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - start) / calls


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=30)
    ap.add_argument("--calls", type=int, default=200)
    args = ap.parse_args(argv)
    rng = np.random.default_rng(0)
    z = rng.beta(2, 2, 100_000)
    y = rng.random(z.size) < z ** 1.3
    grid, ece = ScoreGrid(1024), ScoreGrid(15)
    grid.update(z, y)
    ece.update(z, y)
    verdict, base = [], []
    for _ in range(args.rounds):  # interleaved: both see the same machine load
        verdict.append(timed(lambda: summarize(grid, TESTS, alpha=0.05, ece_grid=ece), args.calls))
        base.append(timed(lambda: l2_ece_squared(grid, 16), args.calls))
    for name, xs in (("summarize", verdict), ("baseline l2_ece_squared", base)):
        print(f"{name:24s} min {1e3 * min(xs):.3f} ms  median {1e3 * statistics.median(xs):.3f} ms")
    print(f"ratio (median) {statistics.median(verdict) / statistics.median(base):.1f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
