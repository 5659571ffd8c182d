"""Coverage of the verdict's ECE interval (calmon.evaluate.verdict, ``ece_ci``) by simulation, on demand.

For calibrated and temperature-miscalibrated binary data (connectors.simulation's Beta(2, 2) scores) the
population 15-bin ECE is computed by numerical integration, and the share of replications whose interval
contains it is printed (nominal 0.95; the interval is conservative, so at least that).  Also prints
the direction accuracy on the same replications.

    python3 -m benchmarks.verdict_coverage --reps 1000
"""

from __future__ import annotations

import argparse
import time

import numpy as np
from scipy.stats import beta

from calmon.evaluate.verdict import summarize
from calmon.stats.grid import ScoreGrid
from connectors.simulation import SimulationSpec, Simulator

REJECT = {"tcal": {"p_value": 0.0, "decision": "miscalibrated"}}
EXPECTED = {"none": None, "temperature:0.7": "over-confident", "temperature:1.5": "under-confident",
            "bias:0.3": "biased up"}


def truth(kind: str, points: int = 2_000_000) -> float:
    """Population 15-bin ECE: sum_b |E[(p - z) 1_b]| over ``points`` Beta(2, 2) quantiles."""
    p = beta(2, 2).ppf((np.arange(points) + 0.5) / points)
    logit = np.log(p) - np.log1p(-p)
    name, _, arg = kind.partition(":")
    if name == "temperature":
        logit = logit / float(arg)
    elif name == "bias":
        logit = logit + float(arg)
    z = 1 / (1 + np.exp(-logit))
    idx = np.minimum((z * 15).astype(int), 14)
    return float(np.abs(np.bincount(idx, weights=p - z, minlength=15)).sum() / z.size)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=1000)
    ap.add_argument("--n", type=int, nargs="+", default=[1000, 10000])
    ap.add_argument("--kinds", nargs="+", default=list(EXPECTED), choices=list(EXPECTED), help="data kinds")
    ap.add_argument("--truth-points", type=int, default=2_000_000,
                    help="quantiles of the numerical integration of the population ECE")
    args = ap.parse_args(argv)
    print(f"{'data':18s} {'n':>6s} {'true ECE':>9s} {'coverage':>9s} {'mean width':>10s} {'direction ok':>12s}")
    for kind in args.kinds:
        expected = EXPECTED[kind]
        t = truth(kind, args.truth_points)
        for n in args.n:
            hits, width, right = 0, 0.0, 0
            start = time.perf_counter()
            for rep in range(args.reps):
                sim = Simulator(SimulationSpec(seed=rep, miscalibration=kind))
                z, y = sim._draw(n, sim.before)
                fine, ece = ScoreGrid(1024), ScoreGrid(15)
                fine.update(z, y)
                ece.update(z, y)
                s = summarize(fine, REJECT, alpha=0.05, ece_grid=ece)
                assert s.ece_ci is not None
                hits += s.ece_ci[0] <= t <= s.ece_ci[1]
                width += s.ece_ci[1] - s.ece_ci[0]
                right += s.direction == (expected or s.direction)
            print(f"{kind:18s} {n:6d} {t:9.4f} {hits / args.reps:9.3f} {width / args.reps:10.4f} "
                  f"{right / args.reps:12.3f}   ({time.perf_counter() - start:.0f} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
