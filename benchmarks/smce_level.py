"""Type I error of the smCE null-simulation p-value on calibrated data (and power on miscalibrated data).

Usage::

    python -m benchmarks.smce_level --reps 1000                   # raw resampling, n = 500, mc = 199
    python -m benchmarks.smce_level --reps 1000 --mode grid --n 20000 # per-cell binomial null on the grid
    python -m benchmarks.smce_level --reps 200 --shift 0.03        # power against y ~ Bern(z + 0.03)
    python -m benchmarks.smce_level --mode tester --n 3000 --reps 1000   # the smce tester with its defaults
    python -m benchmarks.smce_level --mode tester --n 3000 --param null_bins=1024 --param null_mc=1000  # as before #35

``--mode tester`` runs :func:`calmon.testers.run_tester` ("smce", evaluation.mc = ``--mc``) on windows as the
agent keeps them (a 1024-cell grid and no complete raw sample), so the level of the shipped defaults (256 null
cells, at most 199 draws, curtailed) is what is measured; ``--param`` sets tester parameters.

Calibrated data: z ~ Beta(a, b) (default Beta(2, 3)), y ~ Bernoulli(z).  Prints the rejection rate at
alpha = 0.01, 0.05, 0.10 with a binomial 95 % interval.  Acceptance for issue 5: the rate at 0.05 lies
in [0.035, 0.065] over 1000 replications.
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from calmon.algorithms.smooth import smce_null_pvalue, smce_null_pvalue_grid
from calmon.stats.grid import ScoreGrid
from calmon.testers import CalibrationData, run_tester


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--reps", type=int, default=1000)
    ap.add_argument("--n", type=int, default=500)
    ap.add_argument("--mc", type=int, default=199)
    ap.add_argument("--mode", choices=("raw", "grid", "tester"), default="raw")
    ap.add_argument("--param", action="append", default=[], help="tester parameter key=value (tester mode)")
    ap.add_argument("--bins", type=int, default=1024, help="null-statistic resolution in grid mode")
    ap.add_argument("--beta", type=float, nargs=2, default=(2.0, 3.0), help="score distribution Beta(a, b)")
    ap.add_argument("--shift", type=float, default=0.0, help="miscalibration: y ~ Bern(clip(z + shift))")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)

    params = {k: float(v) if "." in v else int(v) for k, v in (p.split("=", 1) for p in args.param)}
    rng = np.random.default_rng(args.seed)
    pvals = np.empty(args.reps)
    draws = 0
    t0 = time.perf_counter()
    for r in range(args.reps):
        z = rng.beta(args.beta[0], args.beta[1], size=args.n)
        y = (rng.random(args.n) < np.clip(z + args.shift, 0, 1)).astype(float)
        if args.mode == "raw":
            pvals[r] = smce_null_pvalue(z, y, mc=args.mc, rng=rng)["p_value"]
        elif args.mode == "tester":
            g = ScoreGrid(1024)
            g.update(z, y)
            res = run_tester("smce", CalibrationData(n=args.n, grid=g), mc=args.mc, seed=r, **params).to_dict()
            pvals[r] = res["p_value"]
            draws += res["mc"]
        else:
            g = ScoreGrid(4096)
            g.update(z, y)
            pvals[r] = smce_null_pvalue_grid(g, mc=args.mc, rng=rng, bins=args.bins)["p_value"]
    elapsed = time.perf_counter() - t0
    print(f"mode={args.mode} n={args.n} mc={args.mc} reps={args.reps} shift={args.shift} "
          f"beta={tuple(args.beta)} bins={args.bins if args.mode == 'grid' else '-'} ({elapsed:.0f} s, "
          f"{elapsed / args.reps:.4f} s per test)" + (f" params={params} mean draws {draws / args.reps:.1f}"
                                                     if args.mode == "tester" else ""))
    print(f"{'alpha':>6s} {'rate':>7s} {'95% CI':>17s}")
    for alpha in (0.01, 0.05, 0.10):
        rate = float(np.mean(pvals <= alpha))
        half = 1.96 * np.sqrt(max(rate * (1 - rate), 1e-12) / args.reps)
        print(f"{alpha:6.2f} {rate:7.3f} [{max(0.0, rate - half):.3f}, {min(1.0, rate + half):.3f}]")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
