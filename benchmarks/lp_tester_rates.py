"""Level and power of the ``lp`` tester (``H0: Err_p(f) <= eps``), by simulation with known truth (issue #34).

The tester (:func:`calmon.algorithms.lp_errors.lp_test`) bounds every observed cell's mean by an
empirical-Bernstein interval, Bonferroni over the cells; the paper (Bairaktari & Nguyen, seeds 000/001) has
no test. World as in ``benchmarks/lp_groundtruth.py``: ``q ~ Dirichlet(alpha 1_K)``, ``y ~ q``, model
``f = softmax((log q + b) / T)``. The true ``Err_p(f)`` is computed from ``q`` on a fresh ``--eval-n`` sample;
each row tests at ``eps = ratio x Err_p(f)``:

* calibrated model (``T = 1``, ``b = 0``, ``Err = 0``): level in the interior of the null;
* ``ratio = 1``: the boundary of the null (the hardest case for the level);
* ``ratio = 0.9``, ``0.8``, ``0.5``: power (``Err_p = 1.11, 1.25, 2 eps``).

The truth and the test use one resolution ``--lam`` (``lp_tester(lam=...)``), so that eps can sit exactly at
the boundary.

Each cell is the share of ``--reps`` replications decided ``miscalibrated`` / ``calibrated`` /
``insufficient data`` at ``alpha = 0.05``.

Usage::

    OPENBLAS_NUM_THREADS=1 python -m benchmarks.lp_tester_rates --reps 200
"""

from __future__ import annotations

import argparse
import math
import time

import numpy as np

from benchmarks.lp_groundtruth import world
from calmon.algorithms.lp_errors import lp_error_raw, lp_test
from calmon.stats.levelset import LevelSetStats

#: (name, K, Dirichlet alpha, bias, temperature, p)
MODELS = [
    ("calibrated K=3", 3, 20.0, 0.0, 1.0, math.inf),
    ("distorted K=3", 3, 20.0, 2.0, 2.0, math.inf),
    ("distorted K=3, p=2", 3, 20.0, 2.0, 2.0, 2.0),
    ("distorted K=10", 10, 20.0, 4.5, 2.0, math.inf),
]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=200)
    ap.add_argument("--ns", default="1000,3000,10000")
    ap.add_argument("--eval-n", type=int, default=1_000_000)
    ap.add_argument("--alpha", type=float, default=0.05)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--lam", type=int, default=10, help="level-set resolution of the truth and the test")
    args = ap.parse_args(argv)
    ns = [int(float(x)) for x in args.ns.split(",")]
    rng = np.random.default_rng(args.seed)
    start = time.perf_counter()
    print("| model | p | true Err_p | eps | n | miscalibrated | calibrated | insufficient data |")
    print("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    for name, k, conc, bias, temp, p in MODELS:
        q, _, f = world(args.eval_n, k, conc, bias, rng, temperature=temp)
        calibrated = temp == 1.0 and bias == 0.0
        # one resolution for the truth and the test (``lp_tester(lam=...)``), so that eps can sit at the boundary
        lam = args.lam
        true_err = float(lp_error_raw(f, q, lam, p)["err_p"])
        for ratio in ([None] if calibrated else [1.0, 0.9, 0.8, 0.5]):
            eps = 0.05 if ratio is None else ratio * true_err
            for n in ns:
                counts = {"miscalibrated": 0, "calibrated": 0, "insufficient data": 0}
                for _ in range(args.reps):
                    _, y, ff = world(n, k, conc, bias, rng, temperature=temp)
                    s = LevelSetStats(k, lam, pools=1)
                    s.update(ff, y)
                    counts[lp_test(s, eps=eps, p=p, alpha=args.alpha)["decision"]] += 1
                cells = " | ".join(f"{counts[d] / args.reps:.3f}" for d in counts)
                pname = "inf" if math.isinf(p) else f"{p:g}"
                print(f"| {name} | {pname} | {true_err:.4f} | {eps:.4f} | {n} | {cells} |"
                      f"  [{time.perf_counter() - start:.0f} s]", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
