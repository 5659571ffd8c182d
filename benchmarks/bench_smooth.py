"""Benchmark: exact smCE dynamic program vs. HiGHS on the chain LP; grid smCE; LDTC on binned data.

Usage::

    python -m benchmarks.bench_smooth              # HiGHS at 1e4 and 1e5 (the latter takes ~1 min)
    python -m benchmarks.bench_smooth --no-highs-1e5  # skip the slow HiGHS run
    python -m benchmarks.bench_smooth --curtail    # only: the smce tester's null simulation, curtailed vs all draws
    python -m benchmarks.bench_smooth --sizes 1e3 --large 1e4 --repeat 1   # a smoke run (seconds)

Prints one table (CPU seconds of this process -- the machine is shared, so wall time is shown too --
best of ``--repeat`` for the fast rows) and the budgets of
issue 5: DP >= 50x faster than HiGHS at 1e5, DP at 1e6 raw < 5 s, smCE from 4096 cells < 20 ms,
LDTC on 256 bins x 101 grid points < 2 s.
"""

from __future__ import annotations

import argparse
import os
import time
from collections.abc import Callable
from functools import partial
from typing import TypeVar

if __name__ == "__main__":  # one OpenMP thread for the timings (before numpy loads; not when merely imported)
    os.environ.setdefault("OMP_NUM_THREADS", "1")

import numpy as np  # noqa: E402

from calmon.algorithms.ldtc import ldtc_grid, u_grid  # noqa: E402
from calmon.algorithms.smooth import smce, smce_chain_lp, smce_grid  # noqa: E402
from calmon.stats.grid import ScoreGrid  # noqa: E402

T = TypeVar("T")


def _data(n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    z = rng.random(n)
    y = (rng.random(n) < np.clip(z + 0.01, 0, 1)).astype(float)
    return z, y


def _best(fn: Callable[[], T], repeat: int) -> tuple[float, float, T]:
    """Best CPU time and best wall time over ``repeat`` (at least one) calls, and the result."""
    cpu, wall = float("inf"), float("inf")
    for _ in range(max(1, repeat)):
        t, w = time.process_time(), time.perf_counter()
        out = fn()
        cpu, wall = min(cpu, time.process_time() - t), min(wall, time.perf_counter() - w)
    return cpu, wall, out


def _chain_lp(z: np.ndarray, y: np.ndarray) -> float:
    """smCE by HiGHS on the chain LP (objective rescaled to max|c| = 1)."""
    return float(smce_chain_lp(z, y - z, z.size)[0])


def _naive_chain_lp(z: np.ndarray, y: np.ndarray) -> float:
    """The chain LP as usually written (objective c = (y - z)/n, not rescaled) -- the naive HiGHS baseline."""
    from scipy import sparse
    from scipy.optimize import linprog

    order = np.argsort(z)
    v, c = z[order], (y[order] - z[order]) / z.size
    m = v.size
    diff = sparse.diags([-np.ones(m - 1), np.ones(m - 1)], [0, 1], shape=(m - 1, m), format="csr")
    d = np.diff(v)
    a_ub = sparse.vstack([diff, -diff]).tocsr()
    res = linprog(-c, A_ub=a_ub, b_ub=np.r_[d, d], bounds=(-1, 1), method="highs")
    return float(-res.fun)


def bench_curtail(repeat: int) -> None:
    """CPU seconds of the smce tester on a 1024-cell window, curtailed vs all 999 draws, interleaved rounds."""
    from calmon.stats.data import CalibrationData
    from calmon.testers.smce import smce_tester
    print(f"{'window':28s} {'all draws min/med s':>20s} {'curtailed min/med s':>20s} {'draws':>6s} {'p':>6s}")
    rng = np.random.default_rng(0)
    for shift in (0.0, 0.03):
        for n in (5000, 100_000):
            z = rng.random(n)
            y = (rng.random(n) < np.clip(z + shift, 0, 1)).astype(float)
            g = ScoreGrid(1024)
            g.update(z, y)
            data = CalibrationData(n=n, grid=g)
            spent: dict[bool, list[float]] = {False: [], True: []}
            for r in range(repeat):
                for curtail in (False, True):
                    t0 = time.process_time()
                    res = smce_tester(data, alpha=0.05, mc=999, rng=np.random.default_rng(r), curtail=curtail)
                    spent[curtail].append(time.process_time() - t0)
            cells = [f"{min(spent[c]):.3f}/{float(np.median(spent[c])):.3f}" for c in (False, True)]
            print(f"{'shift ' + str(shift) + ', n = ' + str(n):28s} {cells[0]:>20s} {cells[1]:>20s} "
                  f"{res['mc']:6d} {res['p_value']:6.3f}")
    print(f"load average: {os.getloadavg()[0]:.1f}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--no-highs-1e5", action="store_true", help="skip HiGHS at n = 1e5 (~1 min)")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--naive", action="store_true", help="also time the unscaled chain LP at n = 1e4 and 1e5")
    ap.add_argument("--curtail", action="store_true", help="only the smce null simulation: curtailed vs all draws")
    ap.add_argument("--sizes", default="1e4,1e5", help="n of the DP vs HiGHS rows (default 1e4,1e5)")
    ap.add_argument("--large", type=float, default=1e6, help="n of the DP, grid and LDTC rows (default 1e6)")
    args = ap.parse_args(argv)
    if args.curtail:
        bench_curtail(args.repeat)
        return 0

    rows: list[tuple[str, str, float, float, float, str]] = []
    ratios: dict[int, float] = {}
    for n in (int(float(x)) for x in args.sizes.split(",")):
        z, y = _data(n, n)
        c_dp, w_dp, v_dp = _best(partial(smce, z, y), args.repeat)
        if args.naive:
            c_nv, w_nv, v_nv = _best(partial(_naive_chain_lp, z, y), 1)
            rows.append((f"smCE raw n={n}", "HiGHS naive LP", c_nv, w_nv, v_nv,
                         f"|DP-LP|={abs(v_dp - v_nv):.1e}, DP speed-up {c_nv / c_dp:.0f}x"))
        if n == 100_000 and args.no_highs_1e5:
            rows.append((f"smCE raw n={n}", "DP", c_dp, w_dp, v_dp, ""))
            continue
        c_lp, w_lp, v_lp = _best(partial(_chain_lp, z, y), 1)
        ratios[n] = c_lp / c_dp
        rows.append((f"smCE raw n={n}", "HiGHS chain LP", c_lp, w_lp, v_lp,
                     "objective rescaled to max|c| = 1"))
        rows.append((f"smCE raw n={n}", "DP", c_dp, w_dp, v_dp,
                     f"|DP-LP|={abs(v_dp - v_lp):.1e}, speed-up {c_lp / c_dp:.0f}x"))
    large = int(args.large)
    z, y = _data(large, 7)
    c_dp, w_dp, v_dp = _best(lambda: smce(z, y), args.repeat)
    rows.append((f"smCE raw n={large:.0e}", "DP", c_dp, w_dp, v_dp, "budget 5 s at 1e6"))
    g = ScoreGrid(4096)
    g.update(z, y)
    c_g, w_g, res = _best(lambda: smce_grid(g), max(args.repeat, 10))
    rows.append((f"smCE 4096-cell stats (n={large:.0e})", "DP", c_g, w_g, res["value"],
                 f"|grid-raw|={abs(res['value'] - v_dp):.1e} <= bound {res['error_bound']:.1e}; "
                 "budget 0.02 s"))
    c_l, w_l, lres = _best(lambda: ldtc_grid(g, bins=256, u=u_grid(101)), args.repeat)
    rows.append((f"LDTC 256 bins x 101 u (n={large:.0e})", "HiGHS LP", c_l, w_l, lres["value"],
                 f"bounds [{lres['bounds'][0]:.4f}, {lres['bounds'][1]:.4f}]; budget 2 s"))

    print(f"{'case':32s} {'solver':15s} {'cpu s':>8s} {'wall s':>8s} {'value':>11s}  note")
    for case, solver, c, w, v, note in rows:
        print(f"{case:32s} {solver:15s} {c:8.4f} {w:8.4f} {v:11.8f}  {note}")
    for n, r in ratios.items():
        target = "  (target >= 50x)" if n == 100_000 else ""
        print(f"CPU-time speed-up DP vs HiGHS at n={n}: {r:.0f}x{target}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
