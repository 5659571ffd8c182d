"""Decode + bin throughput, JSONL -> statistics, for several JSON decoders side by side.

Run on demand (prints a table):  python -m tests.benchmarks.bench_ingest [--events 1000000]

Every variant does the same work: split the file into lines, decode, validate (finite, in range,
label 0/1) and update a 4096-cell grid, the 15-bin grid and a 2000-row reservoir.  ``calmon``
is the product's own :class:`calmon.events.Decoder` (msgspec typed schema plus full validation
with a reason per rejected record).  Memory: the statistics' bytes after 1e5 ... 1e7 events.
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np

from calmon.events import Decoder
from calmon.simulate import SimulationSpec, Simulator
from calmon.stats.model import ModelStats


def _minimal(decode_line) -> callable:
    def run(lines: list[bytes]) -> ModelStats:
        stats = ModelStats()
        for i in range(0, len(lines), 65536):
            objs = [decode_line(x) for x in lines[i:i + 65536]]
            z = np.array([o["score"] for o in objs], dtype=float)
            y = np.array([o["label"] for o in objs], dtype=np.int64)
            ok = np.isfinite(z) & (z >= 0) & (z <= 1) & ((y == 0) | (y == 1))
            stats.update(score=z[ok], labels=y[ok])
        return stats
    return run


def run_calmon(lines: list[bytes]) -> ModelStats:
    dec = Decoder()
    stats = ModelStats()
    for i in range(0, len(lines), 65536):
        out = dec.decode(lines[i:i + 65536])
        mb = out.models["sim"]
        stats.update(score=mb.score, labels=mb.label)
    return stats


def run_calmon_limits(lines: list[bytes]) -> ModelStats:
    """The agent's decoder: record size, id length and wall-clock limits on (issue #14)."""
    dec = Decoder(max_record_bytes=1 << 20, max_id_bytes=256, future_skew=3600.0, past_horizon=10 * 365 * 86400.0)
    stats = ModelStats()
    for i in range(0, len(lines), 65536):
        out = dec.decode(lines[i:i + 65536])
        mb = out.models["sim"]
        stats.update(score=mb.score, labels=mb.label)
    return stats


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--events", type=int, default=1_000_000)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    blob = b"\n".join(Simulator(SimulationSpec(seed=1)).stream(args.events)) + b"\n"
    variants = {"json (stdlib)": _minimal(json.loads), "calmon (msgspec + validation)": run_calmon,
                "calmon + agent limits": run_calmon_limits}
    try:
        import orjson
        variants["orjson"] = _minimal(orjson.loads)
    except ImportError:
        pass
    import msgspec
    variants["msgspec (untyped)"] = _minimal(msgspec.json.Decoder().decode)
    print(f"{args.events} labeled binary events, {len(blob) / 1e6:.1f} MB JSONL, best of {args.repeat}")
    print(f"{'decoder':32s} {'events/s':>12s} {'ratio vs json':>14s}")
    rates = {}
    for name, fn in variants.items():
        best = float("inf")
        for _ in range(args.repeat):
            t0 = time.perf_counter()
            stats = fn(blob.split(b"\n")[:-1])
            best = min(best, time.perf_counter() - t0)
        assert stats.count == args.events, (name, stats.count)
        rates[name] = args.events / best
    for name, rate in rates.items():
        print(f"{name:32s} {rate:12,.0f} {rate / rates['json (stdlib)']:14.2f}")
    print("\nstatistics memory (bytes) by events ingested:")
    stats = ModelStats()
    sim = Simulator(SimulationSpec(seed=2))
    seen = 0
    for target in (100_000, 1_000_000, 10_000_000):
        while seen < target:
            m = min(1_000_000, target - seen)
            z = sim.rng.random(m)
            stats.update(score=z, labels=(sim.rng.random(m) < z).astype(np.int64))
            seen += m
        print(f"  {target:>10,d} events: {stats.nbytes():,d} bytes, checkpoint JSON "
              f"{len(json.dumps(stats.to_dict())):,d} bytes")


if __name__ == "__main__":
    main()
