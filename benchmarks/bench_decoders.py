"""Decode + bin throughput, JSONL -> statistics, for several JSON decoders side by side.

Run on demand (prints a table):  python -m benchmarks.bench_decoders [--events 1000000] [--repeat 5]

Every variant does the same work: split the file into lines, decode, validate (finite, in range,
label 0/1) and update a 4096-cell grid, the 15-bin grid and a 2000-row reservoir.  ``calmon``
is the product's own :class:`calmon.events.decoder.Decoder` (msgspec typed schema plus full validation
with a reason per rejected record).  The ``mapped`` rows decode the same events written in another shape
through a schema mapping (issue #16): flat renamed keys, and nested keys with epoch-millisecond times and
string labels (``"yes"``/``"no"`` both listed, or only ``positive: ["yes"]``, whose other raw values the
reader learns); they are compared with the canonical schema in the same run.  Rounds are interleaved
(every variant once per round), and the table shows the best and the median round in wall time and the
best in CPU time (process time, robust when other processes share the cores).  Memory: the
statistics' bytes after 1e5 ... 1e7 events.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from calmon.events.decoder import Decoder
from calmon.events.schema import Mapping, load_mapping
from calmon.stats.model import ModelStats
from connectors.simulation import SimulationSpec, Simulator


def _minimal(decode_line: Callable[[bytes], Any]) -> Callable[[list[bytes]], ModelStats]:
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


def decode_and_bin(dec: Decoder, lines: list[bytes]) -> ModelStats:
    """Decode ``lines`` in batches of 65,536 with ``dec`` and bin model ``sim``'s events."""
    stats = ModelStats()
    for i in range(0, len(lines), 65536):
        out = dec.decode(lines[i:i + 65536])
        mb = out.models["sim"]
        stats.update(score=mb.score, labels=mb.label)
    return stats


def run_calmon(lines: list[bytes]) -> ModelStats:
    return decode_and_bin(Decoder(), lines)


def run_calmon_limits(lines: list[bytes]) -> ModelStats:
    """The agent's decoder: record size, id length and wall-clock limits on (issue #14)."""
    dec = Decoder(max_record_bytes=1 << 20, max_id_bytes=256, future_skew=3600.0, past_horizon=10 * 365 * 86400.0)
    return decode_and_bin(dec, lines)


FLAT = load_mapping({"fields": {"type": "kind", "id": "prediction_id", "model": "model_name", "ts": "event_time",
                                 "score": "p", "label": "y"}})
NESTED = load_mapping({"fields": {"type": "kind", "id": "prediction_id", "model": "meta.model", "ts": "event_time",
                                   "score": "out.p", "label": "y"},
                       "ts_unit": "ms", "labels": {"positive": ["yes"], "negative": ["no"]}})
NESTED_POSITIVE = load_mapping({**NESTED.to_dict(), "labels": {"positive": ["yes"]}})


def flat_shape(line: bytes) -> bytes:
    e = json.loads(line)
    return json.dumps({"kind": e["type"], "prediction_id": e["id"], "model_name": e["model"], "event_time": e["ts"],
                       "p": e["score"], "y": e["label"]}, separators=(",", ":")).encode()


def nested_shape(line: bytes) -> bytes:
    e = json.loads(line)
    return json.dumps({"kind": e["type"], "prediction_id": e["id"], "meta": {"model": e["model"]},
                       "event_time": round(e["ts"] * 1000), "out": {"p": e["score"]},
                       "y": "yes" if e["label"] else "no"}, separators=(",", ":")).encode()


def run_mapped(mapping: Mapping) -> Callable[[list[bytes]], ModelStats]:
    def run(lines: list[bytes]) -> ModelStats:
        return decode_and_bin(Decoder(mapping=mapping), lines)
    return run


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--events", type=int, default=1_000_000)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--only", default="", help="run only the decoders whose name contains this (e.g. calmon)")
    ap.add_argument("--no-memory", action="store_true", help="skip the statistics memory table")
    args = ap.parse_args(argv)
    canonical = list(Simulator(SimulationSpec(seed=1)).stream(args.events))
    inputs = {"canonical": canonical, "flat": [flat_shape(x) for x in canonical],
              "nested": [nested_shape(x) for x in canonical]}
    variants = {"json (stdlib)": _minimal(json.loads), "calmon (msgspec + validation)": run_calmon,
                "calmon + agent limits": run_calmon_limits, "calmon mapped, flat": run_mapped(FLAT),
                "calmon mapped, nested+ms+labels": run_mapped(NESTED),
                "calmon mapped, nested, positive only": run_mapped(NESTED_POSITIVE)}
    shape = {"calmon mapped, flat": "flat", "calmon mapped, nested+ms+labels": "nested",
             "calmon mapped, nested, positive only": "nested"}
    variants = {k: v for k, v in variants.items() if args.only in k or k == "json (stdlib)"}
    if not args.only:
        try:
            import orjson
            variants["orjson"] = _minimal(orjson.loads)
        except ImportError:
            pass
        import msgspec
        variants["msgspec (untyped)"] = _minimal(msgspec.json.Decoder().decode)
    blobs = {k: b"\n".join(v) + b"\n" for k, v in inputs.items()}
    print(f"{args.events} labeled binary events, {len(blobs['canonical']) / 1e6:.1f} MB JSONL, {args.repeat} "
          "interleaved rounds")
    times: dict[str, list[float]] = {name: [] for name in variants}
    cpu: dict[str, list[float]] = {name: [] for name in variants}
    for _ in range(args.repeat):
        for name, fn in variants.items():
            lines = blobs[shape.get(name, "canonical")].split(b"\n")[:-1]
            t0, c0 = time.perf_counter(), time.process_time()
            stats = fn(lines)
            times[name].append(time.perf_counter() - t0)
            cpu[name].append(time.process_time() - c0)  # CPU time: robust on a shared, loaded machine
            assert stats.count == args.events, (name, stats.count)
    base = "calmon (msgspec + validation)"
    print(f"{'decoder':38s} {'events/s best':>14s} {'median':>10s} {'CPU best':>10s} {'vs json':>8s} "
          f"{'vs calmon (CPU best / median)':>30s}")
    for name, ts in times.items():
        best, med, cbest = args.events / min(ts), args.events / statistics.median(ts), args.events / min(cpu[name])
        ratio = f"{min(cpu[base]) / min(cpu[name]):.2f} / {statistics.median(times[base]) / statistics.median(ts):.2f}"
        print(f"{name:38s} {best:14,.0f} {med:10,.0f} {cbest:10,.0f} {min(times['json (stdlib)']) / min(ts):8.2f} "
              f"{ratio:>30s}")
    if args.no_memory:
        return 0
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
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
