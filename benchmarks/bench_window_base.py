"""CPU per window of ``window_base`` (metrics, reliability diagram, label-free estimates) and of the verdict
``assemble`` asks for (``summarize(...).to_dict()``): this tree against a baseline tree.

Windows as the agent evaluates them at 1,000 binary models: ``BucketStats(2, bins=1024, reservoir=256)`` with
5 to 5,000 predictions (log-uniform), Beta scores, labels drawn from the score with a temperature, 0-100 % of them
labelled; the score-drift reference is the ``all`` window's prediction grid minus the window's (as
``Evaluator._refresh_all`` builds it, outside the timed call); the calibrator in service is none for two windows
in three, else a monotone map.  Each tree runs in its own worker process, whose ``PYTHONPATH`` starts with the tree
(``--baseline DIR`` holds an exported ``calmon`` package: ``git archive HEAD calmon | tar -x -C DIR``); the
driver interleaves the workers' rounds, and the figures are min / median over rounds of the mean CPU time per window
(``time.process_time`` in the worker).  The workers also hash the documents (``json.dumps``, floats through
``repr``): the hashes must agree.

    OPENBLAS_NUM_THREADS=1 nice -n 5 python -m benchmarks.bench_window_base --baseline /tmp/h4_base --rounds 9

``--profile`` runs cProfile on this tree's calls instead (no baseline).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import statistics
import subprocess
import sys
import time
from typing import Any

from benchmarks._child import NEUTRAL, child_env, current, module_cmd


def windows(count: int, seed: int) -> list[tuple[Any, Any, Any]]:
    """``count`` (bucket, reference, predictor) triples."""
    import numpy as np

    from calmon.state.buckets import BucketStats
    rng = np.random.default_rng(seed)
    out = []
    for i in range(count):
        n = int(np.exp(rng.uniform(np.log(5), np.log(5000))))
        a, b = rng.uniform(0.5, 5.0, 2)
        z = rng.beta(a, b, n)
        temp = rng.uniform(0.6, 1.6)
        logit = np.log(np.clip(z, 1e-9, 1 - 1e-9) / np.clip(1 - z, 1e-9, 1))
        y = (rng.uniform(size=n) < 1 / (1 + np.exp(-logit / temp))).astype(np.int64)
        k = int(n * rng.choice([0.0, 0.3, 0.7, 1.0]))
        w = BucketStats(2, bins=1024, reservoir=256)
        if k:
            w.update(score=z[:k], labels=y[:k], predictions=True)
        if k < n:
            w.update_predictions(score=z[k:])
        hist = BucketStats(2, bins=1024, reservoir=0)
        extra = int(rng.integers(0, 50_000)) if i % 7 else 0
        hist.update_predictions(score=np.concatenate([z, rng.beta(a, b, extra)]))
        ref = hist.pred - w.pred
        slope = rng.uniform(0.7, 1.0)
        pred = None if i % 3 else (lambda s, m=slope: np.clip(m * s + (1 - m) / 2, 0, 1))
        w.stats, w.rel, w.pred  # noqa: B018 - aggregate now, not inside the timed calls
        out.append((w, ref, pred))
    return out


def worker(path: str, count: int, seed: int) -> None:
    """Serve rounds on stdin ("run CALLS" -> CPU seconds per window; "hash" -> documents' sha256), with the
    ``calmon`` of tree ``path`` (first on this process's ``PYTHONPATH``)."""
    from calmon.config import EstimationConfig
    from calmon.evaluate.round import window_base
    from calmon.evaluate.verdict import summarize
    assert os.path.dirname(os.path.abspath(sys.modules["calmon"].__file__ or "")).startswith(path)
    ws = windows(count, seed)
    cfg = EstimationConfig()

    tests: list[dict[str, dict[str, Any]]] = [
        {"tcal": {"decision": "calibrated", "p_value": 0.41, "statistic": 0.001, "method": "tcal"},
         "smce": {"decision": "miscalibrated", "p_value": 0.003, "statistic": 0.02, "estimate": 0.018}},
        {"tcal": {"decision": "miscalibrated", "p_value": 1e-9, "statistic": 0.05, "method": "tcal"}},
        {"tcal": {"decision": "insufficient data", "p_value": None}}]

    def base() -> list[dict[str, Any]]:
        return [window_base("m", "all", "1h", b, estimation=cfg, reference=r, predictor=p, min_events=100)
                for b, r, p in ws]

    def verdicts() -> list[dict[str, Any]]:  # what assemble asks of calmon.evaluate.verdict for each window
        return [summarize(b.stats.fine, tests[i % 3], alpha=0.05, top_label=False, ece_grid=b.stats.ece).to_dict()
                for i, (b, _, _) in enumerate(ws) if b.stats.count > 0]

    def call() -> list[dict[str, Any]]:
        return base() + verdicts()

    for line in sys.stdin:
        cmd = line.split()
        if cmd[0] in ("hash", "dump"):
            text = json.dumps(call())
            if cmd[0] == "dump":  # the documents, one a line, for finding a difference
                with open(cmd[1], "w") as f:
                    f.write("\n".join(json.dumps(d) for d in json.loads(text)))
            print(hashlib.sha256(text.encode()).hexdigest(), flush=True)
        elif cmd[0] == "run":  # CPU seconds per window: window_base, then the verdict
            reps = int(cmd[1])
            spent = []
            for fn in (base, verdicts):
                t0 = time.process_time()
                for _ in range(reps):
                    fn()
                spent.append((time.process_time() - t0) / (reps * len(ws)))
            print(*spent, flush=True)


class Worker:
    def __init__(self, path: str, count: int, seed: int) -> None:
        self.p = subprocess.Popen(module_cmd("benchmarks.bench_window_base", "--worker", path, "--windows", count,
                                             "--seed", seed), stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                                  env=child_env(path, OPENBLAS_NUM_THREADS="1"), cwd=NEUTRAL)

    def ask(self, cmd: str) -> str:
        assert self.p.stdin is not None and self.p.stdout is not None
        self.p.stdin.write(cmd + "\n")
        self.p.stdin.flush()
        return self.p.stdout.readline().strip()

    def close(self) -> None:
        assert self.p.stdin is not None
        self.p.stdin.close()
        self.p.wait()


def profile(count: int, seed: int) -> None:
    import cProfile
    import pstats

    from calmon.config import EstimationConfig
    from calmon.evaluate.round import window_base
    ws = windows(count, seed)
    cfg = EstimationConfig()
    pr = cProfile.Profile()
    pr.enable()
    for _ in range(5):
        for b, r, p in ws:
            window_base("m", "all", "1h", b, estimation=cfg, reference=r, predictor=p, min_events=100)
    pr.disable()
    pstats.Stats(pr).sort_stats(os.environ.get("SORT", "tottime")).print_stats(int(os.environ.get("TOP", "30")))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--baseline", help="directory holding the baseline's calmon package")
    ap.add_argument("--windows", type=int, default=300)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--reps", type=int, default=3, help="passes over the windows per round")
    ap.add_argument("--profile", action="store_true")
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        worker(args.worker, args.windows, args.seed)
        return 0
    if args.profile:
        profile(args.windows, args.seed)
        return 0
    if not args.baseline:
        raise SystemExit("--baseline DIR is required (or --profile)")
    trees = {"baseline": os.path.abspath(args.baseline), "current": str(current())}
    workers = {k: Worker(p, args.windows, args.seed) for k, p in trees.items()}
    try:
        hashes = {k: w.ask("hash") for k, w in workers.items()}
        same = len(set(hashes.values())) == 1
        print(f"load {os.getloadavg()[0]:.2f} (1 min); {args.windows} windows x {args.reps} passes, {args.rounds} "
              f"interleaved rounds; documents identical: {same}")
        parts = ("window_base", "verdict")
        times: dict[tuple[str, str], list[float]] = {(k, p): [] for k in workers for p in parts}
        for r in range(args.rounds):
            order = list(workers) if r % 2 == 0 else list(workers)[::-1]
            for k in order:
                for p, t in zip(parts, workers[k].ask(f"run {args.reps}").split()):
                    times[(k, p)].append(float(t))
        for p in parts:
            for k in workers:
                v = times[(k, p)]
                print(f"{p:>11} {k:>9}: {min(v) * 1e3:.4f} / {statistics.median(v) * 1e3:.4f} ms per window "
                      f"(min / median)")
            b, c = times[("baseline", p)], times[("current", p)]
            print(f"{p:>11} speed-up: {min(b) / min(c):.2f}x (min), "
                  f"{statistics.median(b) / statistics.median(c):.2f}x (median)")
        print(f"load {os.getloadavg()[0]:.2f} (1 min) at the end")
        if not same:
            for k, w in workers.items():
                w.ask(f"dump /tmp/bench_window_base.{k}.jsonl")
            raise SystemExit(f"documents differ: {hashes}; see /tmp/bench_window_base.*.jsonl")
    finally:
        for w in workers.values():
            w.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
