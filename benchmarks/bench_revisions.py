"""Agent ingest throughput of this checkout against another git revision, interleaved rounds, one table.

Each round runs, for both trees and both stream kinds (labeled events; delayed prediction/outcome pairs), a fresh
subprocess that feeds the same simulated events through ``Agent.ingest`` in batches of 65536 and reports events/s;
the table gives every round and the new/old ratio (min, median).  The other revision is checked out in a temporary
``git worktree`` and removed afterwards; a directory instead of a revision is used as it is (a tree holding another
version's ``calmon`` and ``connectors``, as ``--baseline DIR`` of the other benchmarks).

    python -m benchmarks.bench_revisions c7e5be9 --events 3e5 --rounds 3
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from benchmarks._child import ROOT

CHILD = """
import json, sys, time
from calmon.agent.runtime import Agent
from calmon.config import build_config
from connectors.simulation import SimulationSpec, Simulator
from connectors.base import Batch
kind, n = sys.argv[1], int(float(sys.argv[2]))
spec = SimulationSpec(model="m", seed=1, rate=200.0, delay=30.0 if kind == "pairs" else 0.0,
                      start=time.time() - 4000)
recs = list(Simulator(spec).stream(n))
cfg = build_config({"sources": [{"path": "x"}], "state_dir": sys.argv[3], "exporter": {"enabled": False},
                    "checkpoint": {"enabled": False}, "evaluation": {"tests": []}}, env={})
agent = Agent(cfg)
t0 = time.perf_counter()
for s in range(0, len(recs), 65536):
    agent.ingest(Batch(recs[s:s + 65536], {}, "bench"))
print(json.dumps({"events_per_s": len(recs) / (time.perf_counter() - t0)}))
"""


def run(tree: Path, kind: str, events: float, state: str) -> float:
    env = {**os.environ, "PYTHONPATH": str(tree)}
    out = subprocess.run([sys.executable, "-c", CHILD, kind, str(events), state], env=env, cwd=tree,
                         capture_output=True, text=True, check=True, timeout=1800)
    return float(json.loads(out.stdout.strip().splitlines()[-1])["events_per_s"])


@contextmanager
def checkout(revision: str, tmp: str) -> Iterator[Path]:
    """The tree of ``revision``: a directory as it is, else a temporary ``git worktree`` removed afterwards."""
    if Path(revision).is_dir():
        yield Path(revision).resolve()
        return
    old = Path(tmp) / "old"
    subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "-q", "--detach", str(old), revision], check=True)
    try:
        yield old
    finally:
        subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(old)], check=False)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("revision", help="the git revision to compare against (e.g. the previous landing), or a "
                                     "directory holding another tree's calmon and connectors")
    ap.add_argument("--events", type=float, default=3e5)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--kinds", default="labeled,pairs", help="stream kinds: labeled, pairs (default both)")
    args = ap.parse_args(argv)
    rows: dict[str, dict[str, list[float]]] = {k: {"old": [], "new": []} for k in args.kinds.split(",")}
    with tempfile.TemporaryDirectory() as tmp, checkout(args.revision, tmp) as old:
        for r in range(args.rounds):
            for tree, name in ((old, "old"), (ROOT, "new")):
                for kind in rows:
                    rows[kind][name].append(run(tree, kind, args.events, str(Path(tmp) / f"s{r}{name}{kind}")))
    print(f"{'stream':8s} {'old events/s':>30s} {'new events/s':>30s} {'ratio min':>10s} {'median':>8s}  load "
          f"{os.getloadavg()[0]:.1f}")
    for kind, v in rows.items():
        ratios = [n / o for n, o in zip(v["new"], v["old"])]
        fmt = lambda xs: " ".join(f"{x / 1e3:.0f}k" for x in xs)  # noqa: E731
        print(f"{kind:8s} {fmt(v['old']):>30s} {fmt(v['new']):>30s} {min(ratios):10.2f} "
              f"{statistics.median(ratios):8.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
