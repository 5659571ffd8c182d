"""Level and power of the LDTC null-simulation p-value (issue #20).

Calibrated data ``z ~ U[0, 1]``, ``y ~ Bernoulli(z)``; alternatives ``y ~ Bernoulli(z**a)``.  Each cell is the
rejection rate of ``p_value <= alpha`` over ``--reps`` replications (the statistics as the agent keeps them:
a 4096-cell grid), with the ldtc tester's defaults (16 cells, 17 u-points, ``--mc`` replicates, curtailed).

Usage::

    OPENBLAS_NUM_THREADS=1 python -m benchmarks.ldtc_level                 # 1000 replications
    OPENBLAS_NUM_THREADS=1 python -m benchmarks.ldtc_level --reps 200 --powers 1.0,1.2,1.5
    # chunks: run --seed 1, --seed 2, ... (independent streams) and add the "[r/m]" counts
    OPENBLAS_NUM_THREADS=1 python -m benchmarks.ldtc_level --tester --mc 1000   # the ldtc tester, its defaults

``--tester`` runs :func:`calmon.testers.run_tester` ("ldtc", evaluation.mc = ``--mc``) on a 1024-cell grid as
the agent keeps it: the p-value rule with the shipped defaults, and the CPU seconds of the whole tester (the
LP estimate included).
"""

from __future__ import annotations

import argparse
import math
import time

import numpy as np

from calmon.algorithms.ldtc import ldtc_null_pvalue
from calmon.stats.grid import ScoreGrid
from calmon.testers import CalibrationData, run_tester


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ns", default="1000,10000")
    ap.add_argument("--powers", default="1.0", help="exponents a of y ~ Ber(z**a); 1.0 is the null")
    ap.add_argument("--reps", type=int, default=1000)
    ap.add_argument("--mc", type=int, default=99)
    ap.add_argument("--alpha", type=float, default=0.05)
    ap.add_argument("--seed", type=int, default=0, help="distinct seeds give independent chunks to combine")
    ap.add_argument("--tester", action="store_true", help="through the ldtc tester (1024-cell grid), its defaults")
    ap.add_argument("--every", type=int, default=50, help="print partial counts every this many replications")
    args = ap.parse_args(argv)
    print(f"rejection rate of the LDTC p-value at alpha {args.alpha}, mc = {args.mc}, seed = {args.seed}")
    print("| y ~ Ber(z^a), a | n | rejection rate +- se [rejections/replications] | mean LP solves | CPU s per test |")
    print("|---|---|---|---|---|")
    for a in (float(x) for x in args.powers.split(",")):
        for n in (int(x) for x in args.ns.split(",")):
            rng = np.random.default_rng([args.seed, n, int(100 * a)])
            hits = draws = 0
            t0 = time.process_time()
            for rep in range(1, args.reps + 1):
                z = rng.random(n)
                g = ScoreGrid(1024 if args.tester else 4096)
                g.update(z, (rng.random(n) < z**a).astype(float))
                if args.tester:
                    out = run_tester("ldtc", CalibrationData(n=n, grid=g), alpha=args.alpha, mc=args.mc,
                                     seed=rep).to_dict()
                    hits += out["p_value"] <= args.alpha
                    draws += out["mc"]
                else:
                    res = ldtc_null_pvalue(g, mc=args.mc, rng=rng, alpha=args.alpha)
                    hits += res["p_value"] <= args.alpha
                    draws += res["mc_draws"]
                if args.every and rep % args.every == 0 and rep < args.reps:  # a run cut short still reports
                    print(f"partial a={a:g} n={n} seed={args.seed}: {hits}/{rep} rejections", flush=True)
            secs = (time.process_time() - t0) / args.reps
            rate = hits / args.reps
            se = math.sqrt(rate * (1.0 - rate) / args.reps)
            cell = f"{rate:.3f} +- {se:.3f} [{hits}/{args.reps}]"
            print(f"| {a:g} | {n} | {cell} | {draws / args.reps:.1f} | {secs:.3f} |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
