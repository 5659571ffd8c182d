"""Agent ingest throughput of this checkout against another git revision, interleaved rounds, one table.

Each round runs, for both trees and both stream kinds (labeled events; delayed prediction/outcome pairs), a fresh
subprocess that feeds the same simulated events through ``Agent.ingest`` in batches of 65536 and reports events/s;
the table gives every round and the new/old ratio (min, median).  The other revision is checked out in a temporary
``git worktree`` and removed afterwards.

    python scripts/bench_revisions.py c7e5be9 --events 3e5 --rounds 3
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("revision", help="the git revision to compare against (e.g. the previous landing)")
    ap.add_argument("--events", type=float, default=3e5)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        old = Path(tmp) / "old"
        subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "-q", "--detach", str(old), args.revision],
                       check=True)
        try:
            rows = {k: {"old": [], "new": []} for k in ("labeled", "pairs")}
            for r in range(args.rounds):
                for tree, name in ((old, "old"), (ROOT, "new")):
                    for kind in rows:
                        rows[kind][name].append(run(tree, kind, args.events, str(Path(tmp) / f"s{r}{name}{kind}")))
        finally:
            subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(old)], check=False)
    print(f"{'stream':8s} {'old events/s':>30s} {'new events/s':>30s} {'ratio min':>10s} {'median':>8s}  load "
          f"{os.getloadavg()[0]:.1f}")
    for kind, v in rows.items():
        ratios = [n / o for n, o in zip(v["new"], v["old"])]
        fmt = lambda xs: " ".join(f"{x / 1e3:.0f}k" for x in xs)  # noqa: E731
        print(f"{kind:8s} {fmt(v['old']):>30s} {fmt(v['new']):>30s} {min(ratios):10.2f} "
              f"{statistics.median(ratios):8.2f}")


if __name__ == "__main__":
    main()
