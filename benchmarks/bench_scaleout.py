"""The table of issue #33 in one command: the agent on Kafka, the two-stage split and its workers, against the goals.

Runs two benchmarks, each in its own child, prints their full output, then one summary table:

* :mod:`benchmarks.bench_kafka` (the agent from a file, from memory, from Kafka with each client; interleaved
  rounds on a Tansu broker): the agent on Kafka over the same agent fed from memory, per client;
* :mod:`benchmarks.bench_cluster` (no broker: the single process, the ingest and evaluate stages and the two
  together in records per CPU-second; 1/2/4 ingest processes; with ``--broker-workers``, 1/2/4 ingest workers
  on a real broker): the split's efficiency and the workers' scaling.

The summary has one row per goal with its min (or best) and median over the rounds, whether the median meets it,
and the load. Records per second per worker cannot scale past this machine's cores (printed), so the scaling
goal is judged on records per CPU-second per worker -- what a worker does with a core of its own -- and the
wall-clock figure is shown beside it (``docs/cluster.md``, "Capacity", extrapolates to a cluster)::

    python -m benchmarks.bench_scaleout                     # ~25 min on 2 cores
    python -m benchmarks.bench_scaleout --n 200000 --events 30000 --rounds 1   # a quick look
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from typing import Any

from benchmarks._child import last_json, run_module
from benchmarks.bench_cluster import worker_counts
from calmon.cluster.deltas import VERSION

#: (row, goal): the issue's goals, as ratios.
GOALS = {
    "agent on Kafka, confluent-kafka / from memory": 0.6,
    "agent on Kafka, kafka-python / from memory": 0.35,
    "two stages together / single process (records per CPU-s)": 0.6,
}
#: Records per CPU-second per worker of the most workers measured, over one worker's (build item 3: 1 to 4).
SCALING_GOAL = 0.8


def cluster_json(out: str) -> dict[str, Any]:
    """The JSON document :mod:`benchmarks.bench_cluster` prints before its tables."""
    at = out.index("\n{") + 1 if not out.startswith("{") else 0
    doc, _ = json.JSONDecoder().raw_decode(out[at:])
    return dict(doc)


def rows(kafka: dict[str, Any] | None, cluster: dict[str, Any]) -> list[tuple[str, float | None, float | None, str]]:
    """``(row, min or best, median, note)`` for each goal that was measured."""
    out: list[tuple[str, float | None, float | None, str]] = []
    if kafka is not None:
        for run, label in (("confluent-agent", "confluent-kafka"), ("agent", "kafka-python")):
            r = kafka["ratios"].get(run)
            if r:
                out.append((f"agent on Kafka, {label} / from memory", min(r), statistics.median(r),
                            f"{kafka['records']:,} records, {kafka['partitions']} partitions, min"))
    written = f"together_v{VERSION}"  # the format the ingest stage writes
    if f"{written}_vs_single_best" in cluster:
        out.append(("two stages together / single process (records per CPU-s)", cluster[f"{written}_vs_single_best"],
                    cluster[f"{written}_vs_single_median"], f"{cluster['records']:,} records, ranges of "
                    f"{cluster['range']:,}, delta format {VERSION}, best"))
    for prefix, what in (("workers_", "ingest processes"), ("broker_workers_", "ingest workers on a broker")):
        counts = worker_counts(cluster, prefix, "cpu_vs_one_best")
        if len(counts) > 1:
            w = max(counts)
            p = f"{prefix}{w}_"
            where = f"on {os.cpu_count()} CPUs, no broker" if prefix == "workers_" else "Tansu"
            out.append((f"{w} {what}, records per CPU-s per worker / one worker's", cluster[p + "cpu_vs_one_best"],
                        cluster[p + "cpu_vs_one_median"],
                        f"best; records/s per worker {cluster[p + 'vs_one_median']:.2f} of one's ({where})"))
    return out


def summary(measured: list[tuple[str, float | None, float | None, str]], load: tuple[float, float]) -> str:
    """The goals table as Markdown."""
    lines = [f"issue #33 goals, load {load[0]:.1f}-{load[1]:.1f} (median meets the goal?)", "",
             "| row | goal | min / best | median | met | note |", "| --- | ---: | ---: | ---: | --- | --- |"]
    for row, low, med, note in measured:
        goal = GOALS.get(row, SCALING_GOAL)
        met = "yes" if med is not None and med >= goal else "**no**"
        lines.append(f"| {row} | >= {goal} | {low:.2f} | {med:.2f} | {met} | {note} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--n", type=int, default=1_000_000, help="Kafka records of the agent table (bench_kafka --n)")
    ap.add_argument("--partitions", type=int, default=3, help="partitions of the agent table's topic")
    ap.add_argument("--events", type=int, default=140_000, help="predictions of the split (bench_cluster --events)")
    ap.add_argument("--rounds", type=int, default=3, help="interleaved rounds of each benchmark")
    ap.add_argument("--workers", default="1,2,4", help="ingest processes without a broker")
    ap.add_argument("--broker-workers", default="1,2,4", help="ingest workers on a broker ('' = none)")
    ap.add_argument("--no-kafka", action="store_true", help="skip the agent table (bench_kafka)")
    args = ap.parse_args(argv)
    load = [os.getloadavg()[0]]
    kafka = None
    if not args.no_kafka:
        res = run_module("benchmarks.bench_kafka", "--n", args.n, "--partitions", args.partitions, "--repeat",
                         args.rounds, "--json")
        print(res.stdout, flush=True)
        kafka = last_json(res.stdout)
        load.append(os.getloadavg()[0])
    res = run_module("benchmarks.bench_cluster", "--events", args.events, "--rounds", args.rounds, "--workers",
                     args.workers, "--broker-workers", args.broker_workers)
    print(res.stdout, flush=True)
    cluster = cluster_json(res.stdout)
    load.append(os.getloadavg()[0])
    print(summary(rows(kafka, cluster), (min(load), max(load))))
    return 0


if __name__ == "__main__":
    sys.exit(main())
