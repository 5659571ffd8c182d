"""Power of T-Cal against the oscillating alternative of eq. (10) (the paper's Figure 3 comparison).

Z ~ U[0, 1], Y ~ Ber(g_m(Z)) with g_m(z) = z + rho m^-s sum_j (-1)^j zeta(2 m z - m/2 - j),
zeta(x) = exp(-1 / (x (1 - x))) on (0, 1): m bumps of alternating sign on [1/4, 3/4],
l2-ECE = rho ||zeta||_2 m^-s.  Reported: type II error (1 - rejection rate) at alpha of

* ``tcal-bonf``: adaptive T-Cal (Algorithm 2, Bonferroni), Y-only Monte Carlo on the raw sample;
* ``tcal-minp``: adaptive T-Cal with the max-type (min-p) combination over the joint null;
* ``tcal-grid``: adaptive T-Cal from the 4096-cell grid (what the agent runs on a window);
* ``plugin15-l2`` / ``plugin15-l1``: a fixed 15-bin plug-in test (l2: T^b, l1: the usual ECE), critical value
  by Y-only Monte Carlo -- the comparison of Figure 3.

Usage::

    python -m benchmarks.tcal_power --reps 200
    python -m benchmarks.tcal_power --reps 100 --m 64 --n 2000 5000 10000
"""

from __future__ import annotations

import argparse
import math
import time

import numpy as np
from scipy import integrate

from calmon.algorithms.tcal import tcal_test
from calmon.stats.grid import ScoreGrid, cell_index


def zeta(x: np.ndarray) -> np.ndarray:
    out = np.zeros_like(x)
    inside = (x > 0) & (x < 1)
    xi = x[inside]
    out[inside] = np.exp(-1.0 / (xi * (1.0 - xi)))
    return out


def g_m(z: np.ndarray, m: int, s: float, rho: float) -> np.ndarray:
    """Eq. (10): only the bump containing each z is non-zero, with sign (-1)^j."""
    x = 2 * m * z - m / 2
    j = np.floor(x)
    inside = (j >= 0) & (j < m)
    bump = np.where(inside, (-1.0) ** j * zeta(x - j), 0.0)
    return z + rho * m ** (-s) * bump


def l2_ece(m: int, s: float, rho: float) -> float:
    zeta_l2 = math.sqrt(integrate.quad(lambda x: math.exp(-2.0 / (x * (1 - x))), 0, 1)[0] / 2.0)
    # ||zeta(2 m z - ...)||_{L2(U[1/4,3/4])}: each bump has width 1/(2m), m of them: integral = int zeta^2 / 2
    return rho * zeta_l2 * m ** (-s)


def plugin_test(z: np.ndarray, y: np.ndarray, bins: int, p: int, alpha: float, mc: int,
                rng: np.random.Generator) -> bool:
    """Fixed-bin plug-in l_p test (p = 1: usual ECE; p = 2: T^b) with a Y-only Monte Carlo rank p-value."""
    idx = cell_index(z, bins)
    N = np.bincount(idx, minlength=bins)

    def stat(yy: np.ndarray) -> np.ndarray:  # yy: (r, n)
        S = np.stack([np.bincount(idx, w - z, minlength=bins) for w in yy])
        with np.errstate(invalid="ignore", divide="ignore"):
            v = np.where(N > 0, np.abs(S) ** p / np.maximum(N, 1) ** (p - 1), 0.0)
        return v.sum(axis=1) / z.size

    t = stat(y[None, :])[0]
    draws = np.concatenate([stat((rng.uniform(size=(min(200, mc - lo), z.size)) < z).astype(float))
                            for lo in range(0, mc, 200)])
    return (1 + np.sum(draws >= t - 1e-15)) / (mc + 1) <= alpha


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--reps", type=int, default=200)
    ap.add_argument("--n", type=int, nargs="+", default=[2000, 5000, 10_000])
    ap.add_argument("--m", type=int, nargs="+", default=[64])
    ap.add_argument("--s", type=float, default=0.6)
    ap.add_argument("--rho", type=float, default=100.0)
    ap.add_argument("--alpha", type=float, default=0.05)
    ap.add_argument("--mc", type=int, default=999)
    ap.add_argument("--tests", nargs="+", default=["tcal-bonf", "tcal-minp", "tcal-grid", "plugin15-l2",
                                                    "plugin15-l1"])
    ap.add_argument("--seed", type=int, default=7)
    args = ap.parse_args(argv)
    print(f"alpha = {args.alpha}, s = {args.s}, rho = {args.rho}, reps = {args.reps}, mc = {args.mc}")
    print(f"{'m':>4s} {'l2-ECE':>7s} {'n':>6s} {'test':12s} {'typeII':>7s} {'se':>6s} {'s/rep':>6s}")
    for m in args.m:
        g_max = np.max(np.abs(g_m(np.linspace(0, 1, 200_001), m, args.s, args.rho) - np.linspace(0, 1, 200_001)))
        if np.any(g_m(np.linspace(0.25, 0.75, 10_001), m, args.s, args.rho) > 1) or g_max > 0.25:
            print(f"m = {m}: g_m leaves [0, 1]; skipped")
            continue
        ece = l2_ece(m, args.s, args.rho)
        for n in args.n:
            for ti, test in enumerate(args.tests):
                rng = np.random.default_rng([args.seed, m, n, ti])
                rej, t0 = 0, time.perf_counter()
                for _ in range(args.reps):
                    z = rng.uniform(size=n)
                    y = (rng.uniform(size=n) < g_m(z, m, args.s, args.rho)).astype(float)
                    if test == "tcal-bonf":
                        r = tcal_test(z, y, alpha=args.alpha, mc=args.mc, rng=rng, min_resolution=False)
                    elif test == "tcal-minp":
                        r = tcal_test(z, y, alpha=args.alpha, mc=args.mc, rng=rng, combine="minp", max_level=12)
                    elif test == "tcal-grid":
                        gr = ScoreGrid()
                        gr.update(z, y)
                        r = tcal_test(grid=gr, method="mc-grid", alpha=args.alpha, mc=args.mc, rng=rng,
                                      min_resolution=False)
                    else:
                        p = 2 if test.endswith("l2") else 1
                        rej += plugin_test(z, y, 15, p, args.alpha, args.mc, rng)
                        continue
                    rej += r["decision"] == "miscalibrated"
                    del r
                dt = (time.perf_counter() - t0) / args.reps
                t2 = 1 - rej / args.reps
                se = math.sqrt(max(t2 * (1 - t2), 1e-12) / args.reps)
                print(f"{m:4d} {ece:7.4f} {n:6d} {test:12s} {t2:7.3f} {se:6.3f} {dt:6.2f}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
