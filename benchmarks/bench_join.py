"""Join throughput with millions of pending predictions whose outcomes never come (issue #14).

Usage::

    python -m benchmarks.bench_join [--pending 2000000] [--batch 65536] [--rounds 5]
    git show <old commit>:calmon/state/join.py > /tmp/join_old.py
    python -m benchmarks.bench_join --module /tmp/join_old.py   # the same table for another join

Two joiners with the same entry cap (``--pending``) in the same process: one holds ``--pending``
predictions (every new prediction evicts the oldest), the other is empty (no eviction). Each
round feeds both, interleaved, a fresh batch of ``--batch`` predictions with new ids (decoded
outside the timed section) and times ``Joiner.process``; the table gives records/s from the
minimum and the median time over the rounds and the ratio pending / empty. Before the ordered
buffers, eviction walked the deleted slots at the front of a plain dict and the ratio fell to
about 0.03; it should now be near 1. It also times ``pending_count()`` (what a ``/metrics``
scrape reads under the state lock) on the full joiner.
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import sys
import time
from types import ModuleType
from typing import Any

from calmon.events.decoder import Decoder


def load_join(path: str | None) -> ModuleType:
    if path is None:
        import calmon.state.join as mod

        return mod
    spec = importlib.util.spec_from_file_location("join_under_test", path)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # dataclasses look their module up while the class is built
    spec.loader.exec_module(mod)
    return mod


def batch(dec: Decoder, prefix: str, n: int, t0: float) -> dict[str, Any]:
    recs = [b'{"type":"prediction","id":"%s%d","model":"m","ts":%.1f,"score":0.5}' % (prefix.encode(), i, t0 + i)
            for i in range(n)]
    return dec.decode(recs).models


def make_joiner(mod: ModuleType, cap: int) -> Any:
    try:
        return mod.Joiner(ttl=1e12, max_pending=cap, max_bytes=1 << 40)
    except TypeError:  # a join without a byte bound
        return mod.Joiner(ttl=1e12, max_pending=cap)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--pending", type=int, default=2_000_000)
    ap.add_argument("--batch", type=int, default=65536)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--module", default=None, help="path of another join.py to measure (default: calmon's)")
    args = ap.parse_args(argv)
    mod = load_join(args.module)
    dec = Decoder()
    full, empty = make_joiner(mod, args.pending), make_joiner(mod, args.pending)
    t0 = 1.7e9
    t = time.perf_counter()
    for start in range(0, args.pending, args.batch):
        n = min(args.batch, args.pending - start)
        full.process(batch(dec, f"fill{start}_", n, t0))
    print(f"filled {len(full.pending)} pending predictions in {time.perf_counter() - t:.1f} s", flush=True)
    times: dict[str, list[float]] = {"pending": [], "empty": []}
    for r in range(args.rounds):
        for name, j in (("pending", full), ("empty", empty)) if r % 2 == 0 else (("empty", empty), ("pending", full)):
            models = batch(dec, f"r{r}{name}_", args.batch, t0 + args.pending + r * args.batch)
            t = time.perf_counter()
            j.process(models)
            times[name].append(time.perf_counter() - t)
    t = time.perf_counter()
    for _ in range(100):
        full.pending_count()
    scrape = (time.perf_counter() - t) / 100
    print("\n| joiner | records/s (best) | records/s (median) |\n|---|---|---|")
    for name, ts in times.items():
        print(f"| {name} ({len(full.pending) if name == 'pending' else 0:,} held) | "
              f"{args.batch / min(ts):,.0f} | {args.batch / statistics.median(ts):,.0f} |")
    ratio = statistics.median(times["empty"]) / statistics.median(times["pending"])
    print(f"\nratio pending / empty (median): {ratio:.2f};  pending_count() on the full joiner: {scrape * 1e3:.3f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
