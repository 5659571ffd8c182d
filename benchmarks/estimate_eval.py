"""Label-free estimates on simulated delayed-outcome streams: coverage, covariate shift, calibration drift.

Prints the README's tables (``--windows 1000``):

1. coverage of the 95 % intervals of every estimated metric over calibrated windows (the realised metric of a
   window is random given its scores; the interval must contain it 95 % of the time);
2. a covariate shift (the score distribution moves, calibration intact) and a calibration drift (scores become
   over-confident, temperature 0.6): estimated vs realised accuracy before and after, the estimation error, and
   the delay in minutes from the drift to (a) the score-drift test (chi-square, p < 0.001, against the first
   hour), (b) the estimate leaving the first hour's interval, (c) the first T-Cal rejection on the outcomes that
   have arrived (exponential delay, ``--delay`` minutes on average).

Usage: ``OPENBLAS_NUM_THREADS=1 python -m benchmarks.estimate_eval [--windows N] [--rate R] [--delay MIN]``
"""

from __future__ import annotations

import argparse

import numpy as np

from calmon.algorithms.estimate import METRICS, estimate_performance, realised_metrics
from calmon.algorithms.scoredrift import score_drift
from calmon.stats.data import CalibrationData
from calmon.stats.grid import ScoreGrid
from calmon.testers import run_tester

BINS = 1024


def grid(z: np.ndarray, y: np.ndarray | None = None) -> ScoreGrid:
    g = ScoreGrid(BINS)
    g.update(z, np.zeros(z.size) if y is None else y)
    return g


def coverage(windows: int, n: int, seed: int) -> list[dict[str, object]]:
    rng = np.random.default_rng(seed)
    rows = []
    for name, draw in (("beta(2, 3)", lambda: rng.beta(2, 3, n)), ("beta(0.5, 0.5)", lambda: rng.beta(0.5, 0.5, n)),
                       ("beta(1, 8)", lambda: rng.beta(1, 8, n))):
        hits = dict.fromkeys(METRICS, 0)
        for _ in range(windows):
            z = np.clip(draw(), 1e-4, 1 - 1e-4)
            y = (rng.uniform(size=n) < z).astype(float)
            est, real = estimate_performance(grid(z)), realised_metrics(grid(z, y))
            for m in METRICS:
                hits[m] += est[m].lo <= real[m] <= est[m].hi
        rows.append({"scores": name, "n": n, **{m: hits[m] / windows for m in METRICS}})
    return rows


def sigmoid(x: np.ndarray) -> np.ndarray:
    return 1 / (1 + np.exp(-x))


def scenario(kind: str, rate: float, delay_min: float, seed: int) -> dict[str, object]:
    """12 h of predictions; the change at 6 h. Evaluation every 5 minutes on the last hour."""
    rng = np.random.default_rng(seed)
    hours, t_change = 12, 6 * 3600.0
    ts = np.sort(rng.uniform(0, hours * 3600, int(rate * hours * 3600)))
    after = ts >= t_change
    q = rng.beta(2, 3, ts.size)  # the true P(y = 1)
    if kind == "covariate shift":
        q[after] = rng.uniform(0, 1, after.sum())  # more confident predictions, still calibrated
    z = q.copy()
    if kind == "calibration drift":
        z[after] = sigmoid(np.log(q[after] / (1 - q[after])) / 0.6)  # over-confident scores
    y = (rng.uniform(size=ts.size) < q).astype(float)
    arrive = ts + rng.exponential(delay_min * 60, ts.size)
    ref = (ts < 3600)
    ref_grid, ref_est = grid(z[ref]), estimate_performance(grid(z[ref]))["accuracy"]
    out: dict[str, object] = {"scenario": kind}
    first: dict[str, float | None] = {"score_drift": None, "estimate": None, "tcal": None}
    false_tcal = 0
    for t in np.arange(3600, hours * 3600 + 1, 300.0):
        win = (ts > t - 3600) & (ts <= t)
        est = estimate_performance(grid(z[win]))["accuracy"]
        drift = score_drift(ref_grid, grid(z[win]))
        lab = win & (arrive <= t)
        g = grid(z[lab], y[lab])
        tc = run_tester("tcal", CalibrationData(n=int(lab.sum()), grid=g), alpha=0.05, mc=500, seed=0)
        after_change = t - 3600 >= t_change  # the whole window is after the change
        if t > t_change:
            mins = (t - t_change) / 60
            if first["score_drift"] is None and drift.p_value < 1e-3:
                first["score_drift"] = mins
            if first["estimate"] is None and not ref_est.lo <= est.value <= ref_est.hi:
                first["estimate"] = mins
            if first["tcal"] is None and tc.decision == "miscalibrated":
                first["tcal"] = mins
        else:
            false_tcal += tc.decision == "miscalibrated"
        if t == t_change or (after_change and "acc_after" not in out):
            real = realised_metrics(grid(z[win], y[win]))["accuracy"]
            key = "after" if after_change else "before"
            out[f"est_acc_{key}"], out[f"real_acc_{key}"] = est.value, real
            out[f"error_{key}"] = est.value - real
            out[f"acc_{key}"] = True
    out.pop("acc_before", None)
    out.pop("acc_after", None)
    out.update({f"min_to_{k}": v for k, v in first.items()})
    out["tcal_false_rejections_before"] = false_tcal
    return out


def table(rows: list[dict[str, object]]) -> str:
    keys = list(rows[0])
    cells = [[f"{r.get(k):.3g}" if isinstance(r.get(k), float) else str(r.get(k)) for k in keys] for r in rows]
    width = [max(len(k), *(len(c[j]) for c in cells)) for j, k in enumerate(keys)]
    return "\n".join(["  ".join(k.ljust(w) for k, w in zip(keys, width))]
                     + ["  ".join(c[j].ljust(w) for j, w in enumerate(width)) for c in cells])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--windows", type=int, default=300)
    ap.add_argument("--n", type=int, default=2000, help="predictions per coverage window")
    ap.add_argument("--rate", type=float, default=5.0, help="predictions per second in the scenarios")
    ap.add_argument("--delay", type=float, default=30.0, help="mean outcome delay, minutes")
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args(argv)
    print(f"# coverage of 95 % intervals ({args.windows} calibrated windows of {args.n} predictions each)")
    print(table(coverage(args.windows, args.n, args.seed)))
    print(f"\n# 12 h streams, change at 6 h, {args.rate:g} predictions/s, outcomes {args.delay:g} min late on average;"
          " 1 h windows every 5 min; accuracy at threshold 0.5")
    print(table([scenario(k, args.rate, args.delay, args.seed) for k in ("covariate shift", "calibration drift")]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
