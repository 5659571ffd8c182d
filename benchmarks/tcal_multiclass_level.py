"""Level, power and speed of multiclass T-Cal: canonical, top-label and class-wise views (issue #20).

Calibrated data: ``z ~ Dirichlet(1_K)``, ``y ~ Categorical(z)``.  Alternatives (labels still drawn from
the true ``z``; the model reports ``q``):

* ``temp0.8``: over-confident, ``q = softmax(log z / 0.8)``;
* ``bias0``: class 0 over-predicted, ``q = (1 - d) z + d e_0`` with ``d = 0.05``.

Views: ``canonical`` (the default test: min-p over levels, screened), ``canonical-mc`` (the exact min-p
Monte Carlo test, no screens), ``canonical-bonf`` (Bonferroni over levels, Algorithm 2 as printed),
``top_label``, ``classwise``.  Each cell is the rejection rate at alpha = 0.05 over ``--reps`` replications
(and the mean seconds per test).  The level of an exact test lies within [0.035, 0.065] with probability
~0.98 at 1000 replications.

Usage::

    OPENBLAS_NUM_THREADS=1 python -m benchmarks.tcal_multiclass_level                  # level, 1000 reps
    OPENBLAS_NUM_THREADS=1 python -m benchmarks.tcal_multiclass_level --ns 1000 --reps 200 --alternatives temp0.8,bias0
    # chunks: run --seed 1, --seed 2, ... (independent streams) and add the "[r/m]" counts
"""

from __future__ import annotations

import argparse
import math
import time
from collections.abc import Callable

import numpy as np

from calmon.algorithms.tcal import tcal_test
from calmon.algorithms.tcal.multiclass import canonical_tcal_test
from calmon.algorithms.tcal.views import classwise_tcal_test, top_label_arrays

VIEWS = ("canonical", "top_label", "classwise", "canonical-mc", "canonical-bonf")


def sharpen(z: np.ndarray, temperature: float = 0.8) -> np.ndarray:
    q = z ** (1.0 / temperature)
    return q / q.sum(axis=1, keepdims=True)


def bias0(z: np.ndarray, d: float = 0.05) -> np.ndarray:
    q = (1.0 - d) * z
    q[:, 0] += d
    return q


SCENARIOS: dict[str, Callable[[np.ndarray], np.ndarray]] = {
    "null": lambda z: z, "temp0.8": sharpen, "bias0": bias0,
}


def run_view(view: str, q: np.ndarray, y: np.ndarray, mc: int, rng: np.random.Generator) -> bool:
    if view == "canonical":
        return canonical_tcal_test(q, y, mc=mc, rng=rng)["decision"] == "miscalibrated"
    if view == "canonical-mc":  # the exact min-p Monte Carlo test itself, no screens
        return canonical_tcal_test(q, y, mc=mc, rng=rng, screen=False)["decision"] == "miscalibrated"
    if view == "canonical-bonf":  # Algorithm 2 as printed: Bonferroni over levels (screened)
        return canonical_tcal_test(q, y, mc=mc, rng=rng, combine="bonferroni")["decision"] == "miscalibrated"
    if view == "classwise":
        return classwise_tcal_test(q, y, mc=mc, rng=rng)["decision"] == "miscalibrated"
    zt, ct = top_label_arrays(q, y)
    return tcal_test(zt, ct, mc=mc, rng=rng, method="mc-raw")["decision"] == "miscalibrated"


def cell(k: int, n: int, scenario: str, reps: int, views: list[str], mc: int, seed: int,
         every: int = 0) -> dict[str, tuple[int, int, float]]:
    """``{view: (rejections, replications run, mean seconds)}``; prints a partial line every ``every`` reps."""
    rng = np.random.default_rng([seed, k, n])
    hits = dict.fromkeys(views, 0)
    secs = dict.fromkeys(views, 0.0)
    for rep in range(1, reps + 1):
        z = rng.dirichlet(np.ones(k), size=n)
        y = np.minimum((rng.random((n, 1)) > z.cumsum(axis=1)).sum(axis=1), k - 1)
        q = SCENARIOS[scenario](z)
        for v in views:
            t0 = time.perf_counter()
            hits[v] += run_view(v, q, y, mc, rng)
            secs[v] += time.perf_counter() - t0
        if every and rep % every == 0 and rep < reps:  # a run cut short still reports "r of m"
            part = ", ".join(f"{v} {hits[v]}/{rep} ({secs[v] / rep:.2f} s)" for v in views)
            print(f"partial {scenario} K={k} n={n} seed={seed}: {part}", flush=True)
    return {v: (hits[v], reps, secs[v] / max(reps, 1)) for v in views}


def _fmt(hits: int, reps: int, secs: float) -> str:
    rate = hits / reps
    return f"{rate:.3f} +- {math.sqrt(rate * (1 - rate) / reps):.3f} [{hits}/{reps}] ({secs:.2f} s)"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ks", default="3,10")
    ap.add_argument("--ns", default="1000,10000")
    ap.add_argument("--reps", type=int, default=1000)
    ap.add_argument("--mc", type=int, default=2000)
    ap.add_argument("--views", default=",".join(VIEWS[:3]), help="comma list of: " + ", ".join(VIEWS))
    ap.add_argument("--alternatives", default="null", help="comma list of: " + ", ".join(SCENARIOS))
    ap.add_argument("--seed", type=int, default=0, help="distinct seeds give independent chunks to combine")
    ap.add_argument("--every", type=int, default=25, help="print partial counts every this many replications")
    args = ap.parse_args(argv)
    views = [v for v in args.views.split(",") if v]
    if any(v not in VIEWS for v in views):
        ap.error(f"views must be among {VIEWS}")
    print(f"rejection rate +- standard error [rejections/replications] (mean s per test) at alpha 0.05, "
          f"mc = {args.mc}, seed = {args.seed}")
    print("| scenario | K | n | " + " | ".join(views) + " |")
    print("|---|---|---|" + "---|" * len(views))
    for scenario in args.alternatives.split(","):
        for k in (int(x) for x in args.ks.split(",")):
            for n in (int(x) for x in args.ns.split(",")):
                res = cell(k, n, scenario, args.reps, views, args.mc, args.seed, args.every)
                cells = " | ".join(_fmt(*res[v]) for v in views)
                print(f"| {scenario} | {k} | {n} | {cells} |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
