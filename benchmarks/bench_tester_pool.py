"""Expensive testers on two cores: sequential vs a thread pool vs a process pool (calmon.evaluate.pool).

Builds ``--windows`` binary windows (default bins, reservoir 256) of ``--events`` events each and runs
smce and ldtc on every window, in interleaved rounds; prints min/median wall time per mode and the
speed-up over sequential in the same run.  The process pool's start-up is warmed before timing.

    nice -n 10 python3 -m benchmarks.bench_tester_pool --windows 8 --rounds 3
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import numpy as np

from calmon.evaluate.pool import TesterPool
from calmon.state.buckets import BucketStats
from calmon.stats.data import CalibrationData


def windows(count: int, events: int, seed: int = 0) -> list[CalibrationData]:
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(count):
        b = BucketStats(2)
        z = rng.uniform(size=events)
        y = (rng.uniform(size=events) < z).astype(np.int64)
        b.update(z, None, y)
        out.append(b.stats.calibration_data())
    return out


def run(pool: TesterPool, data: list[CalibrationData], mc: int, testers: tuple[str, ...] = ("smce", "ldtc")) -> float:
    t0 = time.perf_counter()
    futs = [pool.submit(name, d, alpha=0.05, mc=mc, seed=0, params={}) for d in data for name in testers]
    for f in futs:
        f.result()
    return time.perf_counter() - t0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--windows", type=int, default=8)
    ap.add_argument("--events", type=int, default=50_000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--mc", type=int, default=1000)
    ap.add_argument("--testers", default="smce,ldtc", help="comma-separated testers run on every window")
    args = ap.parse_args(argv)
    testers = tuple(args.testers.split(","))
    data = windows(args.windows, args.events)
    pools = {"sequential": TesterPool("inline"), "thread": TesterPool("thread", 2), "process": TesterPool("process", 2)}
    run(pools["process"], data[:2], args.mc, testers)  # spawn + import in the workers
    times: dict[str, list[float]] = {k: [] for k in pools}
    for _ in range(args.rounds):
        for name, pool in pools.items():
            times[name].append(run(pool, data, args.mc, testers))
    base = statistics.median(times["sequential"])
    print(f"{args.windows} windows x ({', '.join(testers)}), {args.events} events, mc={args.mc}, "
          f"load {os.getloadavg()[0]:.2f}")
    for name, ts in times.items():
        med = statistics.median(ts)
        print(f"{name:>10}: min {min(ts):6.2f} s  median {med:6.2f} s  speed-up {base / med:4.2f}x "
              f"({len(data) * len(testers) / med:5.1f} tests/s)")
    for pool in pools.values():
        pool.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
