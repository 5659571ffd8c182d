"""On-demand benchmark of the emitter's cost per call: ``python -m benchmarks.bench_emitter [--events N]``.

The baseline, measured in the same rounds, is ``json.dumps`` of the same event (what a serving
process that logs its predictions already pays). Rounds are interleaved and each figure is the
minimum and median over them, so a busy machine slows every column alike.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from calmon.client.emitter import Emitter
from calmon.client.kafkasink import KafkaSink


def _timed(fn: Callable[[], object], n: int) -> float:
    t = time.perf_counter()
    for _ in range(n):
        fn()
    return (time.perf_counter() - t) / n * 1e6


def main(argv: list[str] | None = None) -> int:
    """Print microseconds per call (min / median over rounds) and the ratio to the baseline."""
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--events", type=int, default=50_000, help="calls per round and variant")
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory() as d:
        to_file = Emitter.to_file(Path(d) / "events.jsonl", max_bytes=None)
        # a queue that never drains: the caller's cost only, no broker needed
        to_queue = Emitter(KafkaSink("127.0.0.1:1", "bench", queue_size=args.events * args.rounds + 1, start=False))
        doc = {"type": "prediction", "id": "0123456789abcdef0123456789abcdef", "model": "fraud", "ts": time.time(),
               "score": 0.3, "segment": "eu"}
        variants: dict[str, Callable[[], object]] = {
            "json.dumps (baseline)": lambda: json.dumps(doc),
            "Emitter.to_file": lambda: to_file.prediction("fraud", score=0.3, segment="eu"),
            "Emitter.to_kafka (queue)": lambda: to_queue.prediction("fraud", score=0.3, segment="eu"),
        }
        times: dict[str, list[float]] = {k: [] for k in variants}
        for _ in range(args.rounds):
            for name, fn in variants.items():
                times[name].append(_timed(fn, args.events))
        to_file.close()
        to_queue.close(timeout=0)
    base = min(times["json.dumps (baseline)"])
    print(f"{'variant':28} {'min us':>8} {'median us':>10} {'vs baseline':>12}")
    for name, ts in times.items():
        print(f"{name:28} {min(ts):8.2f} {statistics.median(ts):10.2f} {min(ts) / base:12.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
