"""What T-Cal's approximate accept screen costs in power, per margin (on demand; issue #15).

The accept screen (``tcal_test(accept_margin=m)``) accepts without simulating when the three-moment approximation
puts every level's p-value at or above ``m`` times its level.  Accepting can only lower the rejection rate, so the
screen cannot raise the level; what it can cost is a rejection the Monte Carlo would have made.  This script runs
the test with a wide margin (``--wide``, default 4) on the agent's data shape -- a 1024-cell grid, Beta(2, 2)
probabilities, scores sharpened by a temperature (1.0: calibrated; 0.9, 0.8: overconfident) -- and counts, among
the replications the wide margin leaves to the Monte Carlo, those the narrow margin (``--narrow``, default 2) would
screen (every level's approximate p-value in ``[narrow, wide)`` times its level) and the Monte Carlo rejected:
the rejections the narrow margin loses.

    python -m benchmarks.tcal_screen_power --reps 400
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from calmon.algorithms.tcal import tcal_test
from calmon.stats.grid import ScoreGrid


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--reps", type=int, default=400)
    ap.add_argument("--n", type=int, nargs="+", default=[200, 500, 2000, 10_000])
    ap.add_argument("--temps", type=float, nargs="+", default=[1.0, 0.9, 0.8])
    ap.add_argument("--wide", type=float, default=4.0)
    ap.add_argument("--narrow", type=float, default=2.0)
    ap.add_argument("--mc", type=int, default=1000)
    args = ap.parse_args(argv)
    print(f"{'temp':>5s} {'n':>6s} {'reject':>7s} {'in band':>8s} {'lost':>6s} {'s/rep':>6s}")
    for temp in args.temps:
        for n in args.n:
            rng = np.random.default_rng([n, int(temp * 10)])
            rejected = band = lost = 0
            t0 = time.perf_counter()
            for _ in range(args.reps):
                p = rng.beta(2, 2, n)
                y = (rng.random(n) < p) * 1.0
                z = 1 / (1 + np.exp(-(np.log(p) - np.log1p(-p)) / temp))
                g = ScoreGrid(1024)
                g.update(z, y)
                r = tcal_test(grid=g, method="mc-grid", mc=args.mc, rng=rng, accept_margin=args.wide)
                ratio = min(r["approx_p_values"]) / (0.05 / len(r["bins"]))
                rejected += r["decision"] == "miscalibrated"
                if args.narrow <= ratio < args.wide and r.get("screen") is None:
                    band += 1
                    lost += r["decision"] == "miscalibrated"
            dt = (time.perf_counter() - t0) / args.reps
            print(f"{temp:5.2f} {n:6d} {rejected / args.reps:7.3f} {band / args.reps:8.3f} {lost / args.reps:6.3f} "
                  f"{dt:6.3f}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
