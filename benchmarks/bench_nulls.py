"""CPU seconds per window of each default tester, and the windows one round's budget covers (issue #35.2).

Windows as the agent keeps them (``BucketStats(2)``: 1024-cell grid, reservoir 256) from the traffic of
:mod:`benchmarks.bench_models` -- ``p ~ Beta(2, 2)``, ``y ~ Bernoulli(p)``, the score ``p`` made slightly
overconfident (logit / 0.9) -- at several sizes, plus calibrated windows (score = ``p``).  Every default tester
(:data:`calmon.config.EvaluationConfig` ``tests``: tcal, smce, ldtc) runs on every window through
:func:`calmon.testers.run_tester` with the default ``evaluation.mc`` (1000) and ``alpha`` (0.05); the CPU time of
the calling process is measured (``time.process_time``, so a loaded machine inflates it less than wall time).

Then it derives what a round can cover: with ``W`` windows and two tester workers that have ``--budget``
CPU-seconds each between rounds, the rounds one full pass of tester ``t`` takes is ``W * cpu(t) / (2 budget)``
-- the quantity issue #35's goals are about (every window at least every 10 rounds at 1000 models = 12,000
windows; >= 90 % of the 2,400 windows of 200 models within 3 rounds).

    python -m benchmarks.bench_nulls                          # sizes 300, 3000, 30000; 4 windows each
    python -m benchmarks.bench_nulls --sizes 3000 --windows 2 # quick
    PYTHONPATH=/path/to/old/checkout python -m benchmarks.bench_nulls   # the same figures for another version
    python -m benchmarks.bench_nulls --pvalues 12   # LDTC null p-values on 12 fixed grids (JSON; compare versions)
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import numpy as np

from calmon.algorithms.ldtc import ldtc_null_pvalue
from calmon.state.buckets import BucketStats
from calmon.stats.data import CalibrationData
from calmon.stats.grid import ScoreGrid
from calmon.testers import run_tester

TESTERS = ("tcal", "smce", "ldtc")


def window(n: int, seed: int, temperature: float) -> CalibrationData:
    """A window of ``n`` labeled events as the agent keeps them (temperature 1: calibrated)."""
    rng = np.random.default_rng([seed, n])
    p = rng.beta(2.0, 2.0, n)
    y = (rng.random(n) < p).astype(np.int64)
    z = 1.0 / (1.0 + np.exp(-(np.log(p) - np.log1p(-p)) / temperature))
    b = BucketStats(2)
    b.update(z, None, y)
    return b.stats.calibration_data()


def ldtc_pvalues(count: int) -> list[list[float]]:
    """``ldtc_null_pvalue`` (99 draws, curtailed) on ``count`` fixed grids: calibrated and miscalibrated, n 500-20000.

    The same list from two versions means the same statistic, the same draws and the same stopping.
    """
    out = []
    for s in range(count):
        rng = np.random.default_rng(s)
        n = (500, 3000, 20000)[s % 3]
        z = rng.random(n)
        g = ScoreGrid(1024)
        g.update(z, (rng.random(n) < z ** (1.0, 1.15, 1.3)[s % 3]).astype(float))
        r = ldtc_null_pvalue(g, mc=99, rng=np.random.default_rng(s))
        out.append([round(r["statistic"], 10), r["p_value"], r["mc_draws"]])
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="300,3000,30000", help="events per window")
    ap.add_argument("--windows", type=int, default=4, help="windows per size and kind")
    ap.add_argument("--mc", type=int, default=1000, help="evaluation.mc (default 1000)")
    ap.add_argument("--budget", type=float, default=30.0, help="CPU-s per worker per round (evaluation.budget)")
    ap.add_argument("--pvalues", type=int, default=0,
                    help="print (statistic, p-value, draws) of the LDTC null on this many fixed grids and stop")
    args = ap.parse_args(argv)
    if args.pvalues:
        print(json.dumps(ldtc_pvalues(args.pvalues)))
        return 0
    sizes = [int(float(s)) for s in args.sizes.split(",")]
    print("CPU seconds per window (median over windows), rejection share at alpha 0.05")
    print("| kind | n | " + " | ".join(f"{t} s | {t} rej" for t in TESTERS) + " |")
    print("|---|---|" + "---|---|" * len(TESTERS))
    per: dict[str, list[float]] = {t: [] for t in TESTERS}
    for kind, temp in (("overconfident (bench traffic)", 0.9), ("calibrated", 1.0)):
        for n in sizes:
            cells = []
            for t in TESTERS:
                secs, rej = [], 0
                for w in range(args.windows):
                    data = window(n, w, temp)
                    t0 = time.process_time()
                    res = run_tester(t, data, mc=args.mc, seed=w)
                    secs.append(time.process_time() - t0)
                    rej += res.decision == "miscalibrated"
                per[t].extend(secs)
                cells.append(f"{statistics.median(secs):.4f} | {rej}/{args.windows}")
            print(f"| {kind} | {n} | " + " | ".join(cells) + " |", flush=True)
    print()
    print(f"rounds for one pass over all windows (two workers, {args.budget:g} CPU-s each per round, mean cost):")
    print("| tester | mean CPU s / window | 2,400 windows (200 models) | 12,000 windows (1000 models) |")
    print("|---|---|---|---|")
    for t in TESTERS:
        mean = statistics.fmean(per[t])
        print(f"| {t} | {mean:.4f} | {2400 * mean / (2 * args.budget):.2f} | {12000 * mean / (2 * args.budget):.2f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
