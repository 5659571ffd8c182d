"""Benchmark: ``Decoder.decode`` alone on live-like traffic at M models, against another tree (issue #15).

The records are ``benchmarks/bench_models.py``'s live traffic (predictions and outcomes of M binary models,
segments, string ids), cut into batches of 65,536 as the agent reads them, and decoded by a fresh decoder
with automatic garbage collection paused (as the agent's ingestor does). Each (tree, M) runs in its own
subprocess (``PYTHONPATH`` starting with the tree), in interleaved rounds; the table gives min / median seconds and
the extra time of M models over one model, which is the per-model cost of decoding::

    git archive HEAD calmon connectors | tar -x -C /tmp/base
    python -m benchmarks.bench_decode --models 1,1000 --events 1e6 --rounds 3 --baseline /tmp/base
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import time

from benchmarks._child import last_json, run_module

BATCH = 65_536


def child(models: int, events: int) -> None:
    """Decode the traffic with the packages this process imports; print the seconds as one JSON line."""
    from benchmarks.bench_models import Traffic
    from calmon.events.decoder import Decoder
    records = list(Traffic("live", models, events, 7).records())
    batches = [records[i:i + BATCH] for i in range(0, len(records), BATCH)]
    dec = Decoder(max_models=max(50, models))
    gc.disable()
    start = time.perf_counter()
    for batch in batches:
        dec.decode(batch)
    print(json.dumps({"seconds": time.perf_counter() - start, "records": len(records)}))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", default="1,1000", help="comma-separated M (default 1,1000)")
    ap.add_argument("--events", type=float, default=1e6, help="predictions (each with its outcome)")
    ap.add_argument("--rounds", type=int, default=3, help="interleaved rounds")
    ap.add_argument("--baseline", default=None, help="a tree with another version's calmon and connectors")
    ap.add_argument("--child", nargs=2, type=int, default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        child(*args.child)
        return 0
    trees: list[tuple[str, str | None]] = [("current", None)] + ([("baseline", args.baseline)] if args.baseline
                                                                 else [])
    ms = [int(m) for m in args.models.split(",")]
    times: dict[tuple[str, int], list[float]] = {(t, m): [] for t, _ in trees for m in ms}
    load0 = os.getloadavg()[0]
    for _ in range(args.rounds):
        for m in ms:
            for name, code in trees:
                out = run_module("benchmarks.bench_decode", "--child", m, int(args.events), code=code,
                                 env={"OPENBLAS_NUM_THREADS": "1"})
                times[name, m].append(last_json(out.stdout)["seconds"])
    print(f"decode only, {args.events:g} predictions + outcomes, {args.rounds} interleaved rounds, "
          f"load {load0:.1f} -> {os.getloadavg()[0]:.1f}; min / median seconds")
    print("| tree | models | decode s | over M = 1 (medians) |\n|---|---|---|---|")
    for name, _ in trees:
        one = statistics.median(times[name, ms[0]])
        for m in ms:
            t = times[name, m]
            print(f"| {name} | {m} | {min(t):.2f} / {statistics.median(t):.2f} | "
                  f"{statistics.median(t) - one:+.2f} s |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
