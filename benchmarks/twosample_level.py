"""Level and power of the reference-vs-current test (calmon.algorithms.twosample), on demand.

Level: both samples calibrated the same way (calibrated, and both over-confident with temperature 0.7),
with *different* score distributions (reference Beta(2, 2) scores, current Beta(2, 5)): the rejection
rate at alpha = 0.05 over ``--reps`` replications must lie in [0.035, 0.065] (1000 replications).
Power: reference calibrated, current with temperature T or logit shift b.

    python3 -m benchmarks.twosample_level --reps 1000
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from calmon.algorithms.twosample import calibration_change_test
from calmon.stats.grid import ScoreGrid


def sample(rng: np.random.Generator, n: int, a: float, b: float, temperature: float = 1.0,
           shift: float = 0.0) -> ScoreGrid:
    p = rng.beta(a, b, n)
    y = rng.random(n) < p
    logit = (np.log(p) - np.log1p(-p)) / temperature + shift
    g = ScoreGrid(1024)
    g.update(1 / (1 + np.exp(-logit)), y)
    return g


def rate(reps: int, n: int, perms: int, cur: dict[str, float], ref_t: float = 1.0, seed: int = 0) -> float:
    rng = np.random.default_rng(seed)
    rejections = 0
    for _ in range(reps):
        ref = sample(rng, n, 2, 2, temperature=ref_t)
        now = sample(rng, n, 2, 5, **cur)
        rejections += calibration_change_test(ref, now, permutations=perms, rng=rng).p_value < 0.05
    return rejections / reps


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=1000)
    ap.add_argument("--n", type=int, default=2000, help="events per sample")
    ap.add_argument("--permutations", type=int, default=199)
    args = ap.parse_args(argv)
    start = time.perf_counter()
    for label, cur, ref_t in (("level, both calibrated", {}, 1.0),
                              ("level, both temperature 0.7", {"temperature": 0.7}, 0.7)):
        r = rate(args.reps, args.n, args.permutations, cur, ref_t)
        ok = "ok" if 0.035 <= r <= 0.065 else "OUT OF [0.035, 0.065]"
        print(f"{label:32s} n={args.n}: rejection rate {r:.3f} ({ok})  [{time.perf_counter() - start:.0f} s]")
    power_reps = max(args.reps // 5, 50)
    for label, cur in (("power, temperature 0.8", {"temperature": 0.8}),
                       ("power, temperature 0.6", {"temperature": 0.6}),
                       ("power, shift +0.3", {"shift": 0.3})):
        for n in (args.n, 5 * args.n):
            r = rate(power_reps, n, args.permutations, cur, seed=1)
            print(f"{label:32s} n={n}: power {r:.3f} ({power_reps} reps)  [{time.perf_counter() - start:.0f} s]")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
