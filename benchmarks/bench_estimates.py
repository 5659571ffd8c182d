"""CPU per call of the agent's label-free estimates (``window_estimates``): this tree against a git revision.

Representative buckets: a ``BucketStats`` with the agent's grids (1024-cell fine grid, 256-cell prediction grid),
``--events`` predictions of which 70 % have their outcome, a 50,000-prediction reference for the score drift, and
the identity or a linear calibrator in service.  The baseline is the three modules (``estimate.py``,
``scoredrift.py``, ``estimates.py``) as of ``--baseline`` (read with ``git show``), run in the same process;
rounds interleave baseline and current, and the figures are min / median over rounds of the mean CPU time of
``--calls`` calls.  Also prints the largest difference of the published numbers (AUC interval excluded: its
width is allowed to change) so a speed-up that changes results shows.

    OPENBLAS_NUM_THREADS=1 nice -n 5 python -m benchmarks.bench_estimates --baseline HEAD --rounds 7
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
import types
from collections.abc import Callable
from typing import Any

import numpy as np

from benchmarks._child import ROOT
from calmon.config import EstimationConfig
from calmon.evaluate import estimates as current
from calmon.state.buckets import PRED_BINS, BucketStats
from calmon.stats.grid import ScoreGrid

FILES = {"estimate": "calmon/algorithms/estimate.py", "scoredrift": "calmon/algorithms/scoredrift.py",
         "estimates": "calmon/evaluate/estimates.py"}


def baseline(rev: str) -> Callable[..., dict[str, Any]]:
    """``window_estimates`` with the three modules as of ``rev``."""
    mods = {}
    for name, path in FILES.items():
        src = subprocess.run(["git", "show", f"{rev}:{path}"], cwd=ROOT, capture_output=True, text=True,
                             check=True).stdout
        mod = types.ModuleType(f"_baseline_{name}")
        sys.modules[mod.__name__] = mod  # dataclasses look their module up
        exec(compile(src, f"{rev}:{path}", "exec"), mod.__dict__)  # noqa: S102 - our own source at a revision
        mods[name] = mod
    e = mods["estimates"].__dict__
    for fn in ("estimate_performance", "expected_metrics", "realised_metrics"):
        e[fn] = getattr(mods["estimate"], fn)
    e["score_drift"] = mods["scoredrift"].score_drift
    return e["window_estimates"]


def bucket(events: int, seed: int) -> BucketStats:
    rng = np.random.default_rng(seed)
    z = rng.beta(2, 5, events)
    y = (rng.uniform(size=events) < z).astype(np.int64)
    b = BucketStats(2, bins=1024, reservoir=256)
    k = int(0.7 * events)
    b.update(score=z[:k], labels=y[:k], predictions=True)
    b.update_predictions(score=z[k:])
    b.stats, b.pred  # noqa: B018 - aggregate now, not inside the timed calls
    return b


def flat(out: dict[str, Any], prefix: str = "") -> dict[str, float]:
    res: dict[str, float] = {}
    for k, v in out.items():
        if isinstance(v, dict):
            res.update(flat(v, f"{prefix}{k}."))
        else:
            res[prefix + k] = float(v)
    return res


def cpu_per_call(fn: Callable[..., object], args: tuple[Any, ...], calls: int) -> float:
    t0 = time.process_time()
    for _ in range(calls):
        fn(*args)
    return (time.process_time() - t0) / calls


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--baseline", default="HEAD")
    ap.add_argument("--events", type=int, nargs="+", default=[100, 1000, 5000, 20000])
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--calls", type=int, default=200)
    args = ap.parse_args(argv)
    old = baseline(args.baseline)
    cfg = EstimationConfig()
    ref = ScoreGrid(PRED_BINS)
    ref.update(np.random.default_rng(99).beta(2, 5, 50_000), np.zeros(50_000))
    calibrators: dict[str, Any] = {"identity": None, "linear": lambda s: 0.9 * s + 0.03}
    print(f"load {os.getloadavg()[0]:.2f} (1 min), baseline {args.baseline}, {args.rounds} interleaved rounds x "
          f"{args.calls} calls; CPU ms per call, min / median")
    print(f"{'events':>7} {'calibrator':>10} {'baseline':>15} {'current':>15} {'speed-up (median)':>18} "
          f"{'max |diff|':>10}")
    for n in args.events:
        b = bucket(n, seed=n)
        for cname, cal in calibrators.items():
            a, c = flat(old(b, ref, cfg, cal)), flat(current.window_estimates(b, ref, cfg, cal))
            if a.keys() != c.keys():
                raise SystemExit(f"published keys differ: {sorted(a.keys() ^ c.keys())}")
            skip = ("estimated.roc_auc.lo", "estimated.roc_auc.hi")
            diff = max(abs(a[k] - c[k]) for k in a if k not in skip and not (np.isnan(a[k]) and np.isnan(c[k])))
            times: dict[str, list[float]] = {"baseline": [], "current": []}
            for _ in range(args.rounds):
                times["baseline"].append(cpu_per_call(old, (b, ref, cfg, cal), args.calls))
                times["current"].append(cpu_per_call(current.window_estimates, (b, ref, cfg, cal), args.calls))
            s = {k: f"{min(v) * 1e3:.3f} / {statistics.median(v) * 1e3:.3f}" for k, v in times.items()}
            ratio = statistics.median(times["baseline"]) / statistics.median(times["current"])
            print(f"{n:>7} {cname:>10} {s['baseline']:>15} {s['current']:>15} {ratio:>17.2f}x {diff:>10.2g}")
    print(f"load {os.getloadavg()[0]:.2f} (1 min) at the end")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
