"""Benchmark: CPU per ``screen_tester("tcal", ...)`` call (the evaluation round's T-Cal screens), this tree
against a baseline copy.

Windows as the agent builds them: ``BucketStats(2, bins=1024, reservoir=256)`` fed ``n`` events with scores
``beta(2, 2)`` pushed through a temperature in 0.8..1.2 and labels from the untempered probability, for
``n`` in 100, 300, 1000, 3000, 10000 (``--windows`` windows each).  Rounds alternate baseline and current
(each a fresh process timing ``--reps`` passes over the windows after a warm-up pass, ``time.process_time``),
and every result -- the ``TestResult.to_dict()`` of the screen, or ``None`` when the Monte Carlo is needed --
must be equal, float for float (compared as JSON text, which keeps every bit of a float).

Usage::

    git archive HEAD calmon | tar -x -C /tmp/h1_base    # the code before the change
    OPENBLAS_NUM_THREADS=1 nice -n 5 python -m benchmarks.bench_tcal_screen --baseline /tmp/h1_base --rounds 7
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import statistics
import time
from typing import Any

import numpy as np

from benchmarks._child import run_module

SIZES = (100, 300, 1000, 3000, 10000)
#: The round's call (``cfg.mc``, ``cfg.seed``: neither matters to the screens, which draw nothing).
CALL: dict[str, Any] = {"alpha": 0.05, "mc": 200, "seed": 0}


def windows(n: int, count: int) -> list[Any]:
    """``count`` binary windows of ``n`` events (1024-cell grid, reservoir of 256)."""
    from calmon.state.buckets import BucketStats
    out = []
    for i in range(count):
        rng = np.random.default_rng(1000 * n + i)
        p = rng.beta(2, 2, n)
        temp = 0.8 + 0.4 * i / max(1, count - 1)
        z = 1 / (1 + np.exp(-(np.log(p) - np.log1p(-p)) / temp))
        b = BucketStats(2, bins=1024, reservoir=256)
        b.update(z, None, (rng.uniform(size=n) < p).astype(np.int64))
        out.append(b.stats.calibration_data())
    return out


def worker(reps: int, count: int) -> None:
    """Time the screens on every size's windows in this process; print CPU seconds per call and a digest."""
    from calmon.testers import screen_tester
    out = {}
    for n in SIZES:
        data = windows(n, count)
        res = [screen_tester("tcal", d, **CALL) for d in data]  # warm-up, and the results
        t0 = time.process_time()
        for _ in range(reps):
            for d in data:
                screen_tester("tcal", d, **CALL)
        cpu = (time.process_time() - t0) / (reps * len(data))
        text = json.dumps([None if r is None else r.to_dict() for r in res], sort_keys=True)
        out[str(n)] = {"cpu": cpu, "open": sum(r is None for r in res),
                       "digest": hashlib.sha256(text.encode()).hexdigest()[:16]}
    print(json.dumps(out))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--baseline", required=False, help="directory holding a baseline 'calmon' package")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--windows", type=int, default=40, help="windows per size")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.worker:
        worker(a.reps, a.windows)
        return 0
    trees: dict[str, str | None] = {"current": None} | ({"baseline": a.baseline} if a.baseline else {})
    runs: dict[str, list[dict]] = {t: [] for t in trees}
    load0 = os.getloadavg()
    for i in range(a.rounds):
        for name in (list(trees) if i % 2 else list(trees)[::-1]):  # interleaved, alternating order
            res = run_module("benchmarks.bench_tcal_screen", "--worker", "--reps", a.reps, "--windows", a.windows,
                             code=trees[name], env={"OPENBLAS_NUM_THREADS": "1"})
            runs[name].append(json.loads(res.stdout))
    print(f"load: {load0} -> {os.getloadavg()}  rounds {a.rounds} x {a.reps} passes over {a.windows} windows; "
          "CPU ms per call, min / median")
    print(f"{'n':>6}{'open':>6}" + "".join(f"{t:>18}" for t in trees)
          + ("   ratio(min)  ratio(median)" if a.baseline else ""))
    for w in runs["current"][0]:
        cells, mins, meds = [], [], []
        for t in trees:
            c = [r[w]["cpu"] * 1e3 for r in runs[t]]
            cells.append(f"{min(c):8.3f} /{statistics.median(c):7.3f}")
            mins.append(min(c))
            meds.append(statistics.median(c))
        same = all(r[w]["digest"] == runs["current"][0][w]["digest"] for t in trees for r in runs[t])
        ratio = (f"   {mins[1] / mins[0]:9.2f}x  {meds[1] / meds[0]:12.2f}x{'' if same else '  RESULTS DIFFER'}"
                 if a.baseline else "")
        print(f"{w:>6}{runs['current'][0][w]['open']:>6}" + "".join(f"{c:>18}" for c in cells) + ratio)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
