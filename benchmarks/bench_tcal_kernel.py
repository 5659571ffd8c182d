"""Benchmark: CPU per T-Cal call on windows whose Monte Carlo runs, this tree against a baseline copy.

Windows: ``n`` events with scores ``beta(2, 2)`` made over-confident (temperature 0.9), on a 1024-cell
grid (``mc-grid``) or raw (``mc-raw``); for each the first seed whose screens (``accept_margin=4``) leave
the (curtailed) Monte Carlo to run.
Rounds alternate baseline and current (each a fresh process, timing ``--reps`` calls per window after a
warm-up call), and the results (p-values, draws, decisions) must be equal.

Usage::

    git archive <base-commit> calmon | tar -x -C /tmp/tcal_base    # the code before the change
    python -m benchmarks.bench_tcal_kernel --baseline /tmp/tcal_base --rounds 5
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from typing import Any

import numpy as np

from benchmarks._child import run_module

#: The agent's call (screens pinned: the windows are those whose Monte Carlo runs, in both trees).
CALL: dict[str, Any] = {"alpha": 0.05, "mc": 1000, "screen": True, "accept_margin": 4.0}
WINDOWS = [("grid", 100), ("grid", 500), ("grid", 2000), ("grid", 5000), ("raw", 500), ("raw", 2000)]


def window(kind: str, n: int, seed: int) -> dict[str, Any]:
    """Keyword arguments of ``tcal_test`` for one window."""
    from calmon.stats.grid import ScoreGrid
    rng = np.random.default_rng(seed)
    p = rng.beta(2, 2, n)
    y = (rng.random(n) < p) * 1.0
    z = 1 / (1 + np.exp(-(np.log(p) - np.log1p(-p)) / 0.9))
    if kind == "raw":
        return {"z": z, "y": y, "method": "mc-raw"}
    g = ScoreGrid(1024)
    g.update(z, y)
    return {"grid": g, "method": "mc-grid"}


def worker(reps: int, windows: list[tuple[str, int]]) -> None:
    """Time every window in this process; print per-call CPU seconds and a digest of the results."""
    from calmon.algorithms.tcal import tcal_test
    out = {}
    for kind, n in windows:
        for seed in range(200):  # the first window the screens leave to the Monte Carlo (also a warm-up)
            kw = window(kind, n, seed)
            if tcal_test(**kw, **CALL, rng=seed)["mc_draws"]:
                break
        t0 = time.process_time()
        for _ in range(reps):
            res = tcal_test(**kw, **CALL, rng=seed)
        cpu = (time.process_time() - t0) / reps
        digest = [res["mc_draws"], res["decision"], seed, [repr(x) for x in np.ravel(res["p_values"])]]
        out[f"{kind} n={n}"] = {"cpu": cpu, "digest": digest}
    print(json.dumps(out))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--baseline", required=False, help="directory holding a baseline 'calmon' package")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--windows", default=",".join(f"{k}:{n}" for k, n in WINDOWS),
                    help="comma list of KIND:N, KIND grid or raw (default: %(default)s)")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.worker:
        worker(a.reps, [(k, int(n)) for k, n in (w.split(":") for w in a.windows.split(","))])
        return 0
    trees: dict[str, str | None] = {"current": None} | ({"baseline": a.baseline} if a.baseline else {})
    runs: dict[str, list[dict]] = {t: [] for t in trees}
    for i in range(a.rounds):
        for name in (list(trees) if i % 2 else list(trees)[::-1]):  # interleaved, alternating order
            res = run_module("benchmarks.bench_tcal_kernel", "--worker", "--reps", a.reps, "--windows", a.windows,
                             code=trees[name])
            runs[name].append(json.loads(res.stdout))
    print(f"load: {os.getloadavg()}  rounds {a.rounds} x {a.reps} calls; CPU ms per call, min / median")
    print(f"{'window':<14}{'draws':>6}" + "".join(f"{t:>18}" for t in trees) + ("   ratio(min)" if a.baseline else ""))
    for w in runs["current"][0]:
        cells, mins = [], []
        for t in trees:
            c = [r[w]["cpu"] * 1e3 for r in runs[t]]
            cells.append(f"{min(c):8.1f} /{statistics.median(c):7.1f}")
            mins.append(min(c))
        same = all(r[w]["digest"] == runs["current"][0][w]["digest"] for t in trees for r in runs[t])
        ratio = f"   {mins[1] / mins[0]:.2f}x{'' if same else '  RESULTS DIFFER'}" if a.baseline else ""
        print(f"{w:<14}{runs['current'][0][w]['digest'][0]:>6}" + "".join(f"{c:>18}" for c in cells) + ratio)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
