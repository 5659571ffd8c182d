"""Benchmark: replay a JSONL file of labeled events through the running agent and print a table.

For each size the script writes a file of labeled events spread over the same 2 days of event
time (so the ring holds the same buckets at every size and memory can be compared), then runs the
agent in a fresh subprocess with the exporter serving /metrics (scraped every second by a thread)
and the scheduler evaluating every 5 s (metrics only, or with --tests), and reports the ingestion
rate, the statistics' memory (sum of the time buckets) and the process's peak RSS.  It also times
the decoder alone on the same records, since decoding is the largest share of the per-event cost.

    python -m benchmarks.bench_agent                   # 1e5 and 1e6 events
    python -m benchmarks.bench_agent --sizes 1e5,1e6,1e7  # the full table (generating 1e7 takes minutes)

With ``--baseline DIR`` (a tree holding another version's ``calmon`` and ``connectors`` packages, e.g.
``git archive HEAD calmon connectors | tar -x -C /tmp/base``) each size is run ``--rounds`` times for
both trees, interleaved (baseline, current, baseline, ...), each in a child whose ``PYTHONPATH`` starts with its
tree, and a second table gives both rates (min and median over the rounds) and their ratio, with the load average
before and after:

    python -m benchmarks.bench_agent --sizes 1e5,1e6 --baseline /tmp/base --rounds 5
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

from benchmarks._child import last_json, run_module

SPAN = 2 * 86400.0


def generate(path: Path, n: int, seed: int = 0) -> None:
    from connectors.simulation import SimulationSpec, Simulator
    sim = Simulator(SimulationSpec(model="bench", seed=seed, rate=n / SPAN, segments=["web", "app", "ios"],
                                   miscalibration="temperature:0.9"))
    with open(path, "wb") as f:
        done = 0
        while done < n:
            m = min(100_000, n - done)
            f.write(b"\n".join(sim.batch(m)) + b"\n")
            done += m


def child(path: str, tests: str, bins: int) -> None:
    """Run the agent on ``path`` in this process and print one JSON line of measurements."""
    from calmon.agent.runtime import Agent
    from calmon.config import build_config
    state = tempfile.mkdtemp(prefix="calmon-bench-")  # removed once measured
    cfg = build_config({
        "state_dir": state, "sources": [{"name": "replay", "path": path}],
        "models": {"default": {"bins": bins, "reservoir": 256, "segments": ["web", "app"]}},
        "evaluation": {"every": "5s", "tests": [{"name": t} for t in tests.split(",") if t]},
        "exporter": {"port": 0}, "checkpoint": {"every": "30s"}, "ingest": {"exit_when_done": True},
    }, env={})
    agent = Agent(cfg)
    agent.open()
    stop = threading.Event()
    scrapes = [0]
    assert agent.http is not None  # the exporter is configured above
    url = f"{agent.http.url}/metrics"

    def scraper() -> None:
        while not stop.wait(1.0):
            urllib.request.urlopen(url, timeout=10).read()
            scrapes[0] += 1

    threading.Thread(target=scraper, daemon=True).start()
    t0, c0 = time.perf_counter(), time.thread_time()
    n = 0
    while agent.poll_once():
        pass
    ingest = time.perf_counter() - t0
    cpu = time.thread_time() - c0  # the ingesting thread's CPU time: less sensitive to a busy machine
    n = sum(agent.state.counters.events.values())
    state_bytes = sum(mw.nbytes() for mw in agent.models.values())
    buckets = sum(r.bucket_count() for mw in agent.models.values() for r in mw.rings.values())
    t1 = time.perf_counter()
    agent.checkpoint()
    ck = time.perf_counter() - t1
    stop.set()
    agent.close()
    shutil.rmtree(state, ignore_errors=True)
    import calmon

    print(json.dumps({"code": calmon.__file__, "events": n, "ingest_seconds": ingest, "rate": n / ingest,
                      "cpu_rate": n / cpu, "state_bytes": state_bytes,
                      "buckets": buckets, "checkpoint_seconds": ck, "scrapes": scrapes[0],
                      "evaluations": agent.sched_info["evaluations"],
                      "maxrss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))


def decode_rate(path: Path, m: int = 65536) -> float:
    from calmon.events.decoder import Decoder
    with open(path, "rb") as f:  # the first m records (fewer in a smaller file)
        lines = [line.rstrip(b"\n") for line, _ in zip(f, range(m))]
    dec = Decoder()
    best = 0.0
    for _ in range(5):
        t = time.thread_time()  # CPU time: less sensitive to a busy machine
        dec.decode(lines)
        best = max(best, len(lines) / (time.thread_time() - t))
    return best


def run_child(path: Path, args: argparse.Namespace, code: str | None = None, decode: bool = False
              ) -> dict[str, Any]:
    """One measurement in a fresh process (``code``: the tree whose packages it imports; default this one)."""
    out = run_module("benchmarks.bench_agent", "--child", path, "--tests", args.tests, "--bins", args.bins,
                     *(["--decode"] if decode else []), code=code)
    r: dict[str, Any] = last_json(out.stdout)
    return r


def compare(paths: dict[int, Path], args: argparse.Namespace) -> None:
    """Interleaved rounds of the baseline tree and this one: rates (min, median) and their ratio."""
    load0 = os.getloadavg()
    rates: dict[tuple[int, str, str], list[float]] = {}
    for rnd in range(args.rounds):
        for size, path in paths.items():
            for name, code in (("base", args.baseline), ("new", args.new)):
                r = run_child(path, args, code)
                rates.setdefault((size, name, "agent"), []).append(r["rate"])
                rates.setdefault((size, name, "cpu"), []).append(r["cpu_rate"])
                rates.setdefault((size, name, "decode"), []).append(
                    run_child(path, args, code, decode=True)["decode_rate"])
        print(f"round {rnd + 1}/{args.rounds} done (load {os.getloadavg()[0]:.1f})", file=sys.stderr, flush=True)
    load1 = os.getloadavg()
    print(f"\nbaseline {args.baseline} vs {args.new or 'this tree'}, {args.rounds} interleaved rounds; "
          "load average (1, 5, 15 min) "
          f"{load0[0]:.1f} {load0[1]:.1f} {load0[2]:.1f} before, {load1[0]:.1f} {load1[1]:.1f} {load1[2]:.1f} after, "
          f"{os.cpu_count()} CPUs\n")
    print("| events | what | baseline min | baseline median | new min | new median | ratio of medians | "
          "ratio of bests |")
    print("|---:|---|---:|---:|---:|---:|---:|---:|")
    for size in paths:
        for what, label in (("agent", "agent events/s"), ("cpu", "agent events per CPU second of ingestion"),
                            ("decode", "decoder alone events/s")):
            b, n = rates[(size, "base", what)], rates[(size, "new", what)]
            print(f"| {size:,} | {label} | "
                  f"{min(b):,.0f} | {statistics.median(b):,.0f} | {min(n):,.0f} | {statistics.median(n):,.0f} | "
                  f"{statistics.median(n) / statistics.median(b):.2f} | {max(n) / max(b):.2f} |")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sizes", default="1e5,1e6", help="comma-separated event counts (default 1e5,1e6)")
    ap.add_argument("--tests", default="", help="testers evaluated every 5 s during the replay (e.g. tcal)")
    ap.add_argument("--bins", type=int, default=1024)
    ap.add_argument("--baseline", default=None, help="a tree with another version's calmon and connectors")
    ap.add_argument("--rounds", type=int, default=5, help="interleaved rounds with --baseline (default 5)")
    ap.add_argument("--new", default=None, help="with --baseline: the tree compared with it (default this one)")
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--decode", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--workdir", default=None, help="keep the generated event files here (default: a temporary "
                                                     "directory, removed at the end)")
    args = ap.parse_args(argv)
    if args.child:
        if args.decode:
            print(json.dumps({"decode_rate": decode_rate(Path(args.child))}))
        else:
            child(args.child, args.tests, args.bins)
        return 0
    if args.workdir:
        Path(args.workdir).mkdir(parents=True, exist_ok=True)
        return replay(Path(args.workdir), args)
    with tempfile.TemporaryDirectory(prefix="calmon-bench-") as work:
        return replay(Path(work), args)


def replay(work: Path, args: argparse.Namespace) -> int:
    """Generate the event files in ``work`` (unless there) and print the table(s)."""
    paths: dict[int, Path] = {}
    for size in [int(float(s)) for s in args.sizes.split(",")]:
        paths[size] = path = work / f"labeled-{size}.jsonl"
        if not path.exists():
            t = time.time()
            generate(path, size)
            print(f"generated {size} events in {time.time() - t:.0f} s", file=sys.stderr, flush=True)
    if args.baseline:
        compare(paths, args)
        return 0
    rows = []
    for path in paths.values():
        r = run_child(path, args)
        r["decode_rate"] = decode_rate(path)
        rows.append(r)
    load = os.getloadavg()[0]
    print(f"\nagent replay benchmark (labeled events, bins={args.bins}, segments all+2, exporter scraped every 1 s, "
          f"evaluation every 5 s{', tests ' + args.tests if args.tests else ''}; load average {load:.1f} on "
          f"{os.cpu_count()} CPUs)\n")
    print("| events | ingest s | events/s | decoder alone events/s | state MB | buckets | checkpoint s | peak RSS MB |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r['events']:,} | {r['ingest_seconds']:.2f} | {r['rate']:,.0f} | {r['decode_rate']:,.0f} | "
              f"{r['state_bytes'] / 1e6:.2f} | {r['buckets']} | {r['checkpoint_seconds']:.2f} | {r['maxrss_mb']:.0f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
