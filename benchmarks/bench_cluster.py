"""On-demand benchmark of the partitioned agent (issue #17): per-stage CPU efficiency and delta traffic.

Two measurements:

1. **compute** (no broker, interleaved rounds, min and median): records per CPU-second of

   * the single-process agent's ingestion (decode, join, bin: :class:`calmon.state.ingest.Ingestor`),
   * the ingest stage's work per range (the same, into fresh rings, plus building and encoding one delta
     per model: :meth:`calmon.cluster.partition.PartitionIngest.apply`, :meth:`Delta.to_bytes`),
   * the evaluate stage's work (decoding and merging those deltas, :func:`merge_delta`), per *input* record;

   each stage with the delta format 1 (every array of a bucket packed on its own, the baseline) and 2 (packed
   buckets, :meth:`BucketStats.to_packed`), and the delta bytes (and delta records) per input record at the
   given range size.
2. **cluster** (``--cluster``, needs the Tansu broker): the end-to-end scenario of
   ``tests/test_cluster_kafka.py`` (3 ingest + 2 evaluators, one of each SIGKILLed) at ``--events``,
   reporting identical-or-not and the CPU seconds of every worker (from ``/proc``) and of the single-process
   reference run (a file source), so records per CPU-second per stage include the Kafka clients, process start-up
   and idle polling (small runs are dominated by those).

The traffic and the scenario are the test suite's (``make_traffic``, ``cluster_run``, ... of
``tests/test_cluster_kafka.py``, whose helpers import each other by module name): the measurement runs in a child
with ``tests/`` on its ``PYTHONPATH``.

    python -m benchmarks.bench_cluster --events 200000 --range 5000 --rounds 3
    python -m benchmarks.bench_cluster --events 200000 --cluster
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

from benchmarks._child import NEUTRAL, child_env, module_cmd


def config():
    from calmon.config import build_config
    return build_config({
        "sources": [{"path": "x.jsonl"}], "models": {"default": {"bins": 1024, "reservoir": 64, "segments": ["web"]}},
        "join": {"ttl": "2h", "max_pending": 1000000},
        "windows": {"names": ["5m", "1h", "all"], "allowed_lateness": "6h",
                    "tiers": [{"width": "1m", "count": 10}, {"width": "10m", "count": 6}, {"width": "1h", "count": 2}]},
        "evaluation": {"tests": []}, "exporter": {"enabled": False}}, env={})


def single(cfg, values, batch):
    from calmon.cluster.partition import stage_config
    from calmon.state.agentstate import AgentState
    from calmon.state.ingest import Ingestor
    from connectors.base import Batch
    st = AgentState(stage_config(cfg))
    ing = Ingestor(st, None, lambda: 1767225600.0)
    t0 = time.process_time()
    for i in range(0, len(values), batch):
        ing.ingest(Batch(values[i:i + batch], {}, "events"))
    return time.process_time() - t0


def v1_bytes(delta) -> bytes:
    """A delta in the version-1 format (every array of a bucket packed on its own): the baseline codec."""
    doc = delta.to_dict()
    doc["version"] = 1
    for b, db in zip(doc["buckets"], delta.buckets):
        b["bucket"] = db.bucket.to_dict()
    return json.dumps(doc, separators=(",", ":"), allow_nan=False).encode()


def ingest_stage(cfg, records, partitions, size, codec="v2"):
    from calmon.cluster.partition import PartitionIngest
    from calmon.cluster.topics import Range
    from connectors.base import Batch
    encoded: list[bytes] = []
    t0 = time.process_time()
    for p in range(partitions):
        key = f"events/{p}"
        part = PartitionIngest(cfg, key, "events", None)
        mine = [v for q, _, v in records if q == p]
        for start in range(0, len(mine), size):
            chunk = mine[start:start + size]
            rng = Range(key, start, start + len(chunk), 1767225600.0, "w")
            applied = part.apply(Batch(chunk, {}, "events", [f"{key}@{start + i}" for i in range(len(chunk))]), rng)
            encoded += [d.to_bytes() if codec == "v2" else v1_bytes(d) for d in applied.deltas]
            applied.state.to_bytes()
    return time.process_time() - t0, encoded


def evaluate_stage(cfg, encoded):
    from calmon.cluster.deltas import Delta, merge_delta
    from calmon.cluster.partition import stage_config
    from calmon.state.agentstate import AgentState
    st = AgentState(stage_config(cfg))
    t0 = time.process_time()
    for value in encoded:
        d = Delta.from_bytes(value)
        merge_delta(st.windows_of(d.model, d.classes), d)
    return time.process_time() - t0


def compute(args) -> dict:
    from test_cluster_kafka import make_traffic  # type: ignore[import-not-found, unused-ignore]  # tests/ on PYTHONPATH

    cfg = config()
    records, _ = make_traffic(args.events, seed=args.seed, partitions=args.partitions)
    values = [v for _, _, v in records]
    codecs = ("v1", "v2")  # delta format 1 (the baseline) and 2 (packed buckets), same run
    rows: dict[str, list[float]] = {"single": []}
    for c in codecs:
        rows[f"ingest_{c}"], rows[f"evaluate_{c}"] = [], []
    encoded: dict[str, list[bytes]] = {}
    for _ in range(args.rounds):  # interleaved: each round runs every stage once
        rows["single"].append(single(cfg, values, args.range))
        for c in codecs:
            t, encoded[c] = ingest_stage(cfg, records, args.partitions, args.range, c)
            rows[f"ingest_{c}"].append(t)
            rows[f"evaluate_{c}"].append(evaluate_stage(cfg, encoded[c]))
    n = len(records)
    out: dict = {"records": n, "partitions": args.partitions, "range": args.range, "rounds": args.rounds,
                 "delta_records": len(encoded["v2"])}
    for c in codecs:
        out[f"delta_bytes_per_record_{c}"] = sum(map(len, encoded[c])) / n
    for k, ts in rows.items():
        out[f"{k}_records_per_cpu_s_best"] = n / min(ts)
        out[f"{k}_records_per_cpu_s_median"] = n / statistics.median(ts)
        if k != "single":
            out[f"{k}_vs_single"] = min(rows["single"]) / min(ts)
            out[f"{k}_ms_per_delta_median"] = 1000 * statistics.median(ts) / len(encoded["v2"])
    return out


def cluster(args) -> dict:
    import tempfile

    import numpy as np
    from kafka_broker import KafkaBroker  # type: ignore[import-not-found, unused-ignore]
    from test_cluster_kafka import (  # type: ignore[import-not-found, unused-ignore]
        PARTITIONS,
        TOPIC,
        check,
        cluster_run,
        file_reference,
        make_traffic,
    )

    records, n_bad = make_traffic(args.events, seed=args.seed)
    work = Path(tempfile.mkdtemp(prefix="calmon-bench-cluster-"))
    import resource

    t0 = time.monotonic()
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    ref = file_reference(work, records)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    ref_seconds = time.monotonic() - t0
    ref_cpu = (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)
    with KafkaBroker() as broker:
        broker.create_topic(TOPIC, partitions=PARTITIONS)
        run = cluster_run(work / "run", broker, records, np.random.default_rng(args.seed), timeout=3600)
    res = check(ref, run, records, n_bad)
    res.update(records=len(records), kills=run["kills"], seconds=round(run["seconds"], 1),
               reference_seconds=round(ref_seconds, 1), reference_cpu_seconds=round(ref_cpu, 2),
               single_records_per_cpu_s=len(records) / ref_cpu, cpu=run["cpu"], delta_records=run["delta_records"])
    for stage in ("ingest", "evaluate"):
        cpu = sum(v for k, v in run["cpu"].items() if k.startswith(stage[:4]))
        res[f"{stage}_records_per_cpu_s"] = len(records) / cpu if cpu else None
    return res


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--events", type=int, default=100_000, help="predictions (plus outcomes, ~1%% malformed)")
    ap.add_argument("--partitions", type=int, default=6)
    ap.add_argument("--range", type=int, default=5000, help="records per range (ingest.batch_size)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--cluster", action="store_true", help="run the broker scenario instead")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:  # the tests' helpers are importable here (tests/ on PYTHONPATH)
        print(json.dumps(cluster(args) if args.cluster else compute(args), indent=2), flush=True)
        return 0
    given = sys.argv[1:] if argv is None else argv
    return subprocess.run(module_cmd("benchmarks.bench_cluster", "--child", *given), env=child_env(tests=True),
                          cwd=NEUTRAL, check=False).returncode


if __name__ == "__main__":
    sys.exit(main())
