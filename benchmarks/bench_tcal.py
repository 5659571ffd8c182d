"""Benchmark: the authors' adaptive T-Cal procedure against adaptive T-Cal from binned statistics.

Authors' procedure (re-implemented from the algorithm of their published code, ``adaptive_T_Cal``):
B = floor(2 log2(n / sqrt(ln n))) levels; at each level 2^b, ``--trials`` (3000) full-bootstrap resamples
of the raw data (resample Z with replacement, Y ~ Ber(Z)), each re-binned and its DPE computed; reject when
the observed DPE exceeds the empirical 1 - alpha/B quantile; stop at the first rejecting level.

Ours: adaptive T-Cal from the 4096-cell grid of binned statistics (``tcal_test(grid=..., method="mc-grid")``),
Y-only Monte Carlo on the grid with R = max(3000, 20 L / alpha) = 4800 draws for L = 12 levels (more draws
than the authors' 3000, and exact rank p-values), run three ways:

* ``default``: Cantelli screen (exact, no simulation) then curtailed Monte Carlo -- what the agent runs;
* ``no-screen``: curtailed Monte Carlo only (decision identical to the full R-draw test);
* ``full``: all R draws.

Also: cost from binned statistics at n = 1e4 and n = 1e7 events (the grid is built once, streaming).

Usage::

    python -m benchmarks.bench_tcal              # everything (the authors' procedure takes minutes)
    python -m benchmarks.bench_tcal --skip-nine  # calibrated sample and scaling only
    python -m benchmarks.bench_tcal --tables     # Tables 1-3 row 'None': ECE and decisions (fast)
    python -m benchmarks.bench_tcal --skip-nine --authors-seconds 60 --ref-draws 0 --scaling 1e4 --repeat 1  # smoke
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any

import numpy as np

from calmon.algorithms.tcal import simulate_null, tcal_test
from calmon.stats.grid import ScoreGrid

DATA = Path(__file__).resolve().parents[1] / ".." / "shared" / "data" / "tcal"


def authors_dpe(scores: np.ndarray, labels: np.ndarray, num_bins: int) -> float:
    """The DPE exactly as the authors' ``ece(..., p=2, debias=True)`` (z = 1 gets its own extra bin)."""
    idx = np.floor(num_bins * scores).astype(int)
    counts = np.bincount(idx)
    counts[counts == 0] += 1
    d = np.bincount(idx, weights=scores) - np.bincount(idx, weights=labels)
    err = ((d**2 - np.bincount(idx, weights=(scores - labels) ** 2)) / counts).sum()
    return float(err / scores.size)


def authors_adaptive_tcal(scores: np.ndarray, labels: np.ndarray, alpha: float = 0.05, trials: int = 3000,
                          rng: np.random.Generator | None = None) -> tuple[bool, int]:
    """Adaptive T-Cal as in the authors' code: full bootstrap per level, quantile threshold, strict >."""
    rng = rng or np.random.default_rng(0)
    n = scores.size
    B = int(np.floor(2 * np.log2(n / np.sqrt(np.log(n)))))
    for b in range(1, B + 1):
        m = 2**b
        mc = np.empty(trials)
        for t in range(trials):
            zs = rng.choice(scores, size=n, replace=True)
            ys = rng.binomial(1, zs, n)
            mc[t] = authors_dpe(zs, ys, m)
        if authors_dpe(scores, labels, m) > np.quantile(mc, 1 - alpha / B):
            return True, b
    return False, B


def ours(grid: ScoreGrid, mode: str, seed: int, mc: int = 3000) -> tuple[dict[str, Any], float]:
    modes: dict[str, dict[str, Any]] = {"default": {}, "no-screen": {"screen": False},
                                        "full": {"screen": False, "curtail": False}, "moment3": {"method": "moment3"}}
    kw = dict(modes[mode])
    kw.setdefault("method", "mc-grid")
    t0 = time.perf_counter()
    r = tcal_test(grid=grid, mc=mc, rng=seed, **kw)
    return r, time.perf_counter() - t0


def timed(grid: ScoreGrid, mode: str, seed: int, repeat: int) -> tuple[dict[str, Any], list[float]]:
    """:func:`ours` ``repeat`` times (at least once), seeds ``seed, seed + 1, ...``: the last result, every time."""
    runs = [ours(grid, mode, seed + k) for k in range(max(1, repeat))]
    return runs[-1][0], [dt for _, dt in runs]


def build_grid(z: np.ndarray, y: np.ndarray) -> tuple[ScoreGrid, float]:
    t0 = time.perf_counter()
    g = ScoreGrid()
    for lo in range(0, z.size, 1 << 20):
        g.update(z[lo:lo + (1 << 20)], y[lo:lo + (1 << 20)])
    return g, time.perf_counter() - t0


def accuracy(g: ScoreGrid, ref_draws: int, chunk: int, seed: int, alpha: float = 0.05) -> None:
    """Critical values at alpha / L: a long Monte Carlo reference vs 3000-draw estimates vs moment3."""
    bins = [2**b for b in range(1, 13)]
    a_b = alpha / len(bins)
    t0 = time.perf_counter()
    T = simulate_null(grid=g, bins=bins, draws=ref_draws, rng=seed + 99)
    dt = time.perf_counter() - t0
    ref = np.quantile(T, 1 - a_b, axis=0)
    chunks = [np.quantile(T[i:i + chunk], 1 - a_b, axis=0) for i in range(0, ref_draws - chunk + 1, chunk)]
    sd3000 = np.std(chunks, axis=0, ddof=1) if len(chunks) > 1 else np.full(len(bins), np.nan)
    m3 = tcal_test(grid=g, method="moment3", alpha=alpha)
    c3 = np.array(m3["critical_values"], dtype=float)
    print(f"\n== accuracy of the critical values at alpha/L = {a_b:.4f} (reference: {ref_draws} grid draws, "
          f"{dt:.1f} s) ==")
    print(f"{'bins':>5s} {'reference':>11s} {'sd(3000 draws)':>15s} {'moment3':>11s} {'|err|/sd3000':>13s}")
    for m, r0, s0, c in zip(bins, ref, sd3000, c3):
        print(f"{m:5d} {r0:11.3e} {s0:15.3e} {c:11.3e} {abs(c - r0) / s0:13.2f}")
    print("(sd(3000 draws): spread of the 3000-draw empirical quantile over disjoint chunks of the reference)")


def data_files(models: str = "") -> list[Path]:
    """The T-Cal data files (``../shared/data/tcal``), or those whose stem is in the comma list ``models``."""
    return [p for p in sorted(DATA.glob("*.npz")) if not models or p.stem in models.split(",")]


def tables(seed: int, models: str = "") -> None:
    """Tables 1-3, row 'None': 15-bin l1-ECE and the tester's decision from the file and from a window."""
    from calmon.testers import CalibrationData, run_tester
    print("== Tables 1-3, row 'None' (tester 'tcal', alpha = 0.05): file = complete raw data; window = grid + "
          "2000-event reservoir ==")
    print(f"{'model':28s} {'n':>6s} {'ECE15 %':>7s} | {'file':>4s} {'method':8s} {'adj p':>9s} {'ms':>6s} | "
          f"{'window':>6s} {'method':8s} {'adj p':>9s} {'ms':>6s} | {'grid MC, no screen':>18s}")
    for path in data_files(models):
        d = np.load(path)
        z, y = d["confidence"].astype(float), d["correct"].astype(float)
        idx = np.minimum((z * 15).astype(int), 14)
        ece = np.abs(np.bincount(idx, z - y, minlength=15)).sum() / z.size * 100
        g, _ = build_grid(z, y)
        s = np.random.default_rng(seed).choice(z.size, 2000, replace=False)
        t0 = time.perf_counter()
        a = run_tester("tcal", CalibrationData(n=z.size, z=z, y=y, grid=g, raw_is_complete=True), seed=seed).to_dict()
        ta = time.perf_counter() - t0
        t0 = time.perf_counter()
        b = run_tester("tcal", CalibrationData(n=z.size, z=z[s], y=y[s], grid=g), seed=seed).to_dict()
        tb = time.perf_counter() - t0
        c = run_tester("tcal", CalibrationData(n=z.size, grid=g), seed=seed, screen=False).to_dict()
        print(f"{path.stem:28s} {z.size:6d} {ece:7.2f} | {fmt_decision(a['decision'] == 'miscalibrated'):>4s} "
              f"{a['method']:8s} {a['p_value']:9.2e} {ta * 1e3:6.1f} | "
              f"{fmt_decision(b['decision'] == 'miscalibrated'):>6s} {b['method']:8s} {b['p_value']:9.2e} "
              f"{tb * 1e3:6.1f} | {fmt_decision(c['decision'] == 'miscalibrated'):>3s} p={c['p_value']:.2e} "
              f"({c['mc_draws']} draws)", flush=True)


def agreement(reps: int, seed: int) -> None:
    """Screened (default) vs pure Monte Carlo decisions on samples near the detection boundary."""
    rng = np.random.default_rng(seed)
    same = screened = 0
    rej = [0, 0]
    t_s = t_f = 0.0
    for i in range(reps):
        n = [2000, 10_000, 50_000][i % 3]
        eps = [0.0, 0.01, 0.02, 0.03][(i // 3) % 4] * (10_000 / n) ** 0.5
        z = rng.uniform(size=n)
        y = (rng.uniform(size=n) < np.clip(z + eps * np.sin(8 * np.pi * z), 0, 1)).astype(float)
        g, _ = build_grid(z, y)
        t0 = time.perf_counter()
        a = tcal_test(grid=g, method="mc-grid", rng=i)
        t1 = time.perf_counter()
        b = tcal_test(grid=g, method="mc-grid", rng=i, screen=False)
        t2 = time.perf_counter()
        t_s, t_f = t_s + t1 - t0, t_f + t2 - t1
        same += a["decision"] == b["decision"]
        screened += a["screen"] is not None
        rej[0] += a["decision"] == "miscalibrated"
        rej[1] += b["decision"] == "miscalibrated"
    print(f"== screened vs pure Monte Carlo on {reps} samples near the boundary ==")
    print(f"same decision: {same}/{reps}; screened: {screened}/{reps}; rejections screened/pure: {rej[0]}/{rej[1]}; "
          f"mean time {t_s / reps * 1e3:.1f} ms vs {t_f / reps * 1e3:.1f} ms")


def fmt_decision(rejected: bool) -> str:
    return "R" if rejected else "A"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--trials", type=int, default=3000, help="authors' bootstrap resamples per level")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--skip-nine", action="store_true")
    ap.add_argument("--authors-seconds", type=float, default=None,
                    help="skip the authors' run on the calibrated sample; use this time for the speed-ups")
    ap.add_argument("--agreement", type=int, default=0, help="only: screened vs pure MC decisions on N samples")
    ap.add_argument("--tables", action="store_true", help="only the Tables 1-3 'None' rows (fast)")
    ap.add_argument("--skip-calibrated", action="store_true")
    ap.add_argument("--repeat", type=int, default=5, help="timing repetitions for our method (median)")
    ap.add_argument("--ref-draws", type=int, default=30_000, help="reference Monte Carlo for the accuracy table")
    ap.add_argument("--models", default="", help="with --tables or the nine: comma-separated file stems only")
    ap.add_argument("--scaling", default="1e4,1e7", help="event counts of the cost table (default 1e4,1e7)")
    args = ap.parse_args(argv)

    rng = np.random.default_rng(args.seed)
    if args.tables:
        tables(args.seed, args.models)
        return 0
    if args.agreement:
        agreement(args.agreement, args.seed)
        return 0
    if not args.skip_calibrated:
        print("== calibrated sample, n = 10,000, Z ~ U[0, 1], Y ~ Ber(Z) ==")
        z = rng.uniform(size=10_000)
        y = (rng.uniform(size=z.size) < z).astype(float)
        if args.authors_seconds is None:
            t0 = time.perf_counter()
            rej, b = authors_adaptive_tcal(z, y, trials=args.trials, rng=rng)
            t_auth = time.perf_counter() - t0
            print(f"authors' procedure: decision {fmt_decision(rej)} (levels run: {b}), {t_auth:.1f} s")
        else:
            t_auth = args.authors_seconds
            print(f"authors' procedure: not run; speed-ups relative to --authors-seconds {t_auth:.0f}")
        g, t_build = build_grid(z, y)
        for mode in ("default", "no-screen", "full", "moment3"):
            r, times = timed(g, mode, args.seed, args.repeat)
            t = float(np.median(times))
            print(f"ours ({mode:9s}): decision {fmt_decision(r['decision'] == 'miscalibrated')}, "
                  f"adjusted p {r['p_value']:.3f}, draws {r['mc_draws']}/{r['mc_requested']}, "
                  f"median {t * 1e3:.1f} ms (range {min(times) * 1e3:.1f}-{max(times) * 1e3:.1f}), "
                  f"speed-up x{t_auth / t:.0f}")
        print(f"(grid built once from the events: {t_build * 1e3:.1f} ms)")
        if args.ref_draws:
            accuracy(g, args.ref_draws, args.trials, args.seed)

        sizes = [int(float(x)) for x in args.scaling.split(",")]
        print(f"\n== cost from binned statistics: n = {' vs '.join(f'{n:.0e}' for n in sizes)} events (calibrated, "
              "Z ~ U[0, 1]) ==")
        for n in sizes:
            zz = rng.uniform(size=n)
            yy = (rng.uniform(size=n) < zz).astype(float)
            gg, tb = build_grid(zz, yy)
            del zz, yy
            for mode in ("default", "full", "moment3"):
                r, times = timed(gg, mode, args.seed, args.repeat)
                print(f"n = {n:>10,d} {mode:8s}: test {np.median(times) * 1e3:7.1f} ms "
                      f"(draws {r['mc_draws']}/{r['mc_requested']}, non-empty cells {int((gg.n > 0).sum())}); "
                      f"grid build {tb:.2f} s (streaming, once)")

    if not args.skip_nine:
        print("\n== the nine models of Tables 1-3 (row 'None'), alpha = 0.05 ==")
        print(f"{'model':30s} {'n':>6s} | {'authors':>7s} {'time':>7s} | {'ours':>4s} {'time':>8s} {'x':>7s} | "
              f"{'no-screen':>9s} {'time':>8s} {'x':>6s}")
        for path in data_files(args.models):
            d = np.load(path)
            z, y = d["confidence"].astype(float), d["correct"].astype(float)
            t0 = time.perf_counter()
            rej, _ = authors_adaptive_tcal(z, y, trials=args.trials, rng=rng)
            t_auth = time.perf_counter() - t0
            g, _ = build_grid(z, y)
            res = {}
            for mode in ("default", "no-screen"):
                r, times = timed(g, mode, args.seed, args.repeat if mode == "default" else 1)
                res[mode] = (r, float(np.median(times)))
            (r1, t1), (r2, t2) = res["default"], res["no-screen"]
            print(f"{path.stem:30s} {z.size:6d} | {fmt_decision(rej):>7s} {t_auth:6.1f}s | "
                  f"{fmt_decision(r1['decision'] == 'miscalibrated'):>4s} {t1 * 1e3:6.1f}ms {t_auth / t1:7.0f} | "
                  f"{fmt_decision(r2['decision'] == 'miscalibrated'):>9s} {t2 * 1e3:6.0f}ms {t_auth / t2:6.0f}",
                  flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
