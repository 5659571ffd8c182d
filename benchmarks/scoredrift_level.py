"""Level and power of the score-drift chi-square test (calmon.algorithms.scoredrift), by simulation.

Usage: ``OPENBLAS_NUM_THREADS=1 python -m benchmarks.scoredrift_level [--reps 1000]``; prints rejection rates at
alpha 0.05 for equal distributions (level) and for shifted ones (power).
"""

from __future__ import annotations

import argparse

import numpy as np

from calmon.algorithms.scoredrift import score_drift
from calmon.stats.grid import ScoreGrid

SETTINGS = [  # (name, reference sampler, current sampler, n_ref, n_cur)
    ("beta(2,5) vs beta(2,5)", (2, 5), (2, 5), 20_000, 2_000),
    ("beta(2,5) vs beta(2,5)", (2, 5), (2, 5), 2_000, 2_000),
    ("beta(0.5,0.5) vs same", (0.5, 0.5), (0.5, 0.5), 5_000, 500),
    ("uniform vs uniform", (1, 1), (1, 1), 1_000, 200),
    ("beta(2,5) vs beta(2.3,5)", (2, 5), (2.3, 5), 20_000, 2_000),
    ("beta(2,5) vs beta(2,5.5)", (2, 5), (2, 5.5), 20_000, 2_000),
]


def grid(rng: np.random.Generator, ab: tuple[float, float], n: int) -> ScoreGrid:
    g = ScoreGrid(256)
    g.update(np.clip(rng.beta(*ab, n), 0, 1), np.zeros(n))
    return g


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=1000)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    rng = np.random.default_rng(args.seed)
    print(f"{'setting':28s} {'n_ref':>7s} {'n_cur':>6s} {'rejection rate at 0.05':>24s}")
    for name, a, b, n1, n2 in SETTINGS:
        rej = sum(score_drift(grid(rng, a, n1), grid(rng, b, n2)).p_value < 0.05 for _ in range(args.reps))
        print(f"{name:28s} {n1:7d} {n2:6d} {rej / args.reps:24.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
