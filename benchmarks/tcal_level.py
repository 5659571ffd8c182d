"""Type I error of T-Cal on calibrated synthetic data (on demand; CI runs a reduced version in tests/test_tcal.py).

Scores Z ~ U[0, 1], Beta(2, 5), or a skewed mixture (70% 1 - Beta(1, 20), 30% uniform, like top-label
confidence); outcomes Y ~ Ber(Z).  For each n and each critical value -- (a) Y-only Monte Carlo on the raw
sample, (b) Monte Carlo on the fine 4096-cell grid -- the script reports the rejection rate at alpha of

* ``single``: T-Cal at one scale, the dyadic number of bins nearest to Theorem 3's m* (s = 1), R draws;
* ``minp``: adaptive T-Cal, levels 2..2^12, max-type (min-p) combination over the joint null;
* ``bonf``: adaptive T-Cal with Bonferroni (Algorithm 2), R >= 20 L / alpha, curtailed;
* ``cantelli``: adaptive T-Cal with the exact Cantelli bound (no simulation);
* ``screened``: ``bonf`` with the default screens, as the agent runs it (the Cantelli reject screen and the
  approximate accept screen first; Monte Carlo only where neither decides).

Usage::

    python -m benchmarks.tcal_level --reps 1000              # the full table (slow)
    python -m benchmarks.tcal_level --reps 200 --n 1000 10000   # reduced
    python -m benchmarks.tcal_level --tests screened --methods mc-grid --mc 1000   # the agent's configuration
"""

from __future__ import annotations

import argparse
import math
import time
from typing import Any

import numpy as np

from calmon.algorithms.tcal import tcal_test, theorem3_bins
from calmon.stats.grid import ScoreGrid


def sample(kind: str, n: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    if kind == "uniform":
        z = rng.uniform(size=n)
    elif kind == "beta25":
        z = rng.beta(2, 5, size=n)
    elif kind == "mixture":
        z = np.where(rng.uniform(size=n) < 0.7, 1 - rng.beta(1, 20, size=n), rng.uniform(size=n))
    else:
        raise ValueError(kind)
    return z, (rng.uniform(size=n) < z).astype(float)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--reps", type=int, default=1000)
    ap.add_argument("--n", type=int, nargs="+", default=[1000, 10_000, 100_000])
    ap.add_argument("--dists", nargs="+", default=["uniform", "beta25", "mixture"])
    ap.add_argument("--tests", nargs="+", default=["single", "minp", "bonf", "cantelli"])
    ap.add_argument("--methods", nargs="+", default=["mc-raw", "mc-grid"])
    ap.add_argument("--alpha", type=float, default=0.05)
    ap.add_argument("--mc", type=int, default=199, help="draws for single and minp (alpha (R+1) integer)")
    ap.add_argument("--seed", type=int, default=2026)
    args = ap.parse_args(argv)

    print(f"alpha = {args.alpha}, reps = {args.reps}; 95% band for an exact test: "
          f"{args.alpha:.3f} +- {1.96 * math.sqrt(args.alpha * (1 - args.alpha) / args.reps):.3f}")
    print(f"{'dist':8s} {'n':>7s} {'method':8s} {'test':9s} {'reps':>5s} {'reject':>7s} {'se':>6s} {'s/rep':>7s}")
    for dist in args.dists:
        for n in args.n:
            m_single = 2 ** max(1, round(math.log2(theorem3_bins(n, 1.0))))
            for method in args.methods:
                for test in args.tests:
                    if test == "cantelli" and method == "mc-grid":
                        continue
                    rng = np.random.default_rng([args.seed, n, args.dists.index(dist), args.methods.index(method),
                                                 args.tests.index(test)])
                    rej, t0 = 0, time.perf_counter()
                    for _ in range(args.reps):
                        z, y = sample(dist, n, rng)
                        src: dict[str, Any]
                        if method == "mc-grid":
                            g = ScoreGrid()
                            g.update(z, y)
                            src = {"grid": g}
                        else:
                            src = {"z": z, "y": y}
                        kw: dict[str, Any] = dict(alpha=args.alpha, rng=rng, screen=False)
                        if test == "single":
                            r = tcal_test(**src, method=method, bins=[m_single], mc=args.mc, min_resolution=False,
                                          **kw)
                        elif test == "minp":
                            r = tcal_test(**src, method=method, combine="minp", mc=args.mc, min_resolution=False,
                                          max_level=12, **kw)
                        elif test == "bonf":
                            r = tcal_test(**src, method=method, mc=args.mc, max_level=12, **kw)
                        elif test == "screened":
                            r = tcal_test(**src, method=method, mc=args.mc, max_level=12, **{**kw, "screen": True})
                        else:
                            r = tcal_test(**src, method="cantelli", max_level=12, **kw)
                        rej += r["decision"] == "miscalibrated"
                    dt = (time.perf_counter() - t0) / args.reps
                    rate = rej / args.reps
                    se = math.sqrt(max(rate * (1 - rate), 1e-12) / args.reps)
                    label = f"{test}" + (f"@{m_single}" if test == "single" else "")
                    print(f"{dist:8s} {n:7d} {method:8s} {label:9s} {args.reps:5d} {rate:7.3f} {se:6.3f} {dt:7.3f}",
                          flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
