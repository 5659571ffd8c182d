"""Benchmark: live-like ingest at M models, split into stages, optionally against another tree (issue #15).

Ingestion alone -- no rounds, no checkpoints -- of ``benchmarks/bench_models.py``'s live-like traffic (M binary
models x segments ``web``/``app`` allow-listed, predictions with their outcomes ~60 s later, ``--events``
predictions over 1 h of event time) through ``Agent.ingest``, each run in a fresh subprocess. Wall time is split
into stages by timers around the ingestor's methods: ``decode`` (``Decoder.decode``), ``join``
(``Joiner.process``), ``fold`` (the binary folds, ``calmon.state.buckets.fold``), ``changes`` (the change detectors) and
``other`` (the rest of ``Ingestor.ingest``: the per-model loop of ``_apply``, counters, the lock), each in wall
time and, in a second table, in the ingesting thread's CPU time.  The live
ratio is issue #15's goal: events/s at M models over events/s at one model (>= 0.5 at 1000; issue #35: >= 0.4 at
3000), in wall time, and in CPU time of the child (records per CPU-second: on a shared machine the fairer one).

    python -m benchmarks.bench_ingest                                # M = 1, 1000; 3 interleaved rounds
    python -m benchmarks.bench_ingest --models 1,100,1000 --events 5e5 --rounds 5

With ``--baseline DIR`` (another version's packages: ``git archive HEAD calmon connectors | tar -x -C DIR``) each
round runs the baseline tree and this one in turn (baseline, current, baseline, ...), each in a child whose
``PYTHONPATH`` starts with its tree, and the table gives both, min/median over the rounds, with the load average
before and after.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

from benchmarks._child import last_json, run_module

STAGES = ("decode", "join", "fold", "changes", "other")


def child(models: int, events: int, seed: int) -> dict[str, Any]:
    """Ingest the live-like traffic of ``models`` in this process; one JSON-able dict of timings."""
    import calmon.events.decoder as ev
    import calmon.state.ingest as ing
    import calmon.state.join as jn
    from benchmarks.bench_models import MemorySource, Traffic, _ingest_all, _open_agent, bench_config

    spent: defaultdict[str, float] = defaultdict(float)
    cpu_spent: defaultdict[str, float] = defaultdict(float)  # the ingesting thread's CPU time (thread_time)

    def timed(obj: Any, name: str, label: str) -> None:
        fn = getattr(obj, name)

        def wrapper(*a: Any, **k: Any) -> Any:
            t, c = time.perf_counter(), time.thread_time()
            try:
                return fn(*a, **k)
            finally:
                spent[label] += time.perf_counter() - t
                cpu_spent[label] += time.thread_time() - c

        setattr(obj, name, wrapper)

    for obj, name, label in ((ev.Decoder, "decode", "decode"), (jn.Joiner, "process", "join"),
                             (ing.Ingestor, "_changes", "changes"), (ing.Ingestor, "ingest", "total")):
        timed(obj, name, label)
    for module in (ing, sys.modules.get("calmon.state.batchapply")):  # wherever the fold is called from
        for name in ("fold", "fold_binary"):  # fold_binary: a tree from before calmon.state.buckets.fold
            if module is not None and hasattr(module, name):
                timed(module, name, "fold")
    records = list(Traffic("live", models, events, seed).records())
    with tempfile.TemporaryDirectory(prefix="calmon-bench-ingest-") as tmp:
        src = MemorySource("live", iter(records))
        agent, _ = _open_agent(bench_config(f"{tmp}/s", models), src, timed=False)
        cpu = time.process_time()
        n, wall = _ingest_all(agent, src, None)
        cpu = time.process_time() - cpu
        agent.close()
    out = {k: spent[k] for k in ("decode", "join", "fold", "changes")}
    out["other"] = spent["total"] - sum(out.values())
    stage_cpu = {f"{k}_cpu": cpu_spent[k] for k in ("decode", "join", "fold", "changes")}
    stage_cpu["other_cpu"] = cpu_spent["total"] - sum(stage_cpu.values())
    return {"models": models, "records": n, "wall": wall, "cpu": cpu, "rate": n / wall, **out, **stage_cpu}


def run(code: Path | None, models: int, args: argparse.Namespace) -> dict[str, Any]:
    """One M in a fresh process importing the packages of ``code`` (default this checkout)."""
    res = run_module("benchmarks.bench_ingest", "--child", models, "--events", args.events, "--seed", args.seed,
                     code=code, env={"OPENBLAS_NUM_THREADS": "1"})
    return dict(last_json(res.stdout))


def _mm(vals: list[float], fmt: str) -> str:
    return f"{min(vals):{fmt}} / {statistics.median(vals):{fmt}}"


def table(rows: dict[tuple[str, int], list[dict[str, Any]]], trees: list[str]) -> str:
    """Min / median per (tree, M): rate, ratio to the same tree's M = 1 median in wall time and in CPU time
    (records per CPU-second of the child: the machine may be shared), and each stage's seconds."""
    head = ["tree", "models", "ev/s", "live ratio (medians)", "CPU ratio (medians)", "wall s", "CPU s",
            *(f"{s} s" for s in STAGES)]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for tree in trees:
        one = [r["rate"] for r in rows.get((tree, 1), [])]
        one_cpu = [r["records"] / r["cpu"] for r in rows.get((tree, 1), [])]
        for (t, m), runs in sorted(rows.items(), key=lambda kv: kv[0][1]):
            if t != tree:
                continue
            rates = [r["rate"] for r in runs]
            ratio = f"{statistics.median(rates) / statistics.median(one):.2f}" if one else "-"
            cpu = [r["records"] / r["cpu"] for r in runs]
            cpu_ratio = f"{statistics.median(cpu) / statistics.median(one_cpu):.2f}" if one_cpu else "-"
            cells = [tree, str(m), _mm([x / 1e3 for x in rates], ".0f") + "k", ratio, cpu_ratio,
                     _mm([r["wall"] for r in runs], ".2f"), _mm([r["cpu"] for r in runs], ".2f"),
                     *(_mm([r[s] for r in runs], ".2f") for s in STAGES)]
            lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def cpu_table(rows: dict[tuple[str, int], list[dict[str, Any]]], trees: list[str]) -> str:
    """Min / median per (tree, M) of each stage's CPU seconds (the ingesting thread's: on a shared machine the wall
    time of a stage includes waiting for a core)."""
    head = ["tree", "models", *(f"{s} CPU s" for s in STAGES)]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for tree in trees:
        for (t, m), runs in sorted(rows.items(), key=lambda kv: kv[0][1]):
            if t == tree and all(f"{s}_cpu" in r for r in runs for s in STAGES):
                cells = [tree, str(m), *(_mm([r[f"{s}_cpu"] for r in runs], ".2f") for s in STAGES)]
                lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default="1,1000", help="comma-separated M (default 1,1000)")
    ap.add_argument("--events", type=lambda s: int(float(s)), default=1_000_000,
                    help="predictions (each with its outcome; default 1e6)")
    ap.add_argument("--rounds", type=int, default=3, help="interleaved rounds (default 3)")
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--baseline", type=Path, default=None, help="a tree with another version's packages")
    ap.add_argument("--child", type=int, default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child is not None:
        print(json.dumps(child(args.child, args.events, args.seed)))
        return 0
    trees: list[tuple[str, Path | None]] = [("baseline", args.baseline)] if args.baseline else []
    trees.append(("current", None))
    rows: dict[tuple[str, int], list[dict[str, Any]]] = {}
    load0 = os.getloadavg()[0]
    for _ in range(args.rounds):
        for m in [int(x) for x in args.models.split(",")]:
            for name, code in trees:
                rows.setdefault((name, m), []).append(run(code, m, args))
    load1 = os.getloadavg()[0]
    print(f"live-like ingest, {args.events:.0e} predictions + outcomes, {args.rounds} interleaved rounds, "
          f"load {load0:.1f} -> {load1:.1f}; cells are min / median")
    print(table(rows, [t for t, _ in trees]))
    print()
    print(cpu_table(rows, [t for t, _ in trees]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
