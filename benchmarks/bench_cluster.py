"""On-demand benchmark of the partitioned agent (issues #17, #33): per-stage CPU efficiency, delta traffic, scaling.

One command prints a table (and the JSON of every figure):

1. **compute** (no broker, interleaved rounds, min and median): records per CPU-second of

   * the single-process agent's ingestion (decode, join, bin: :class:`calmon.state.ingest.Ingestor`) *including*
     folding every bucket's pending events (the single process does it before its first evaluation; the ingest
     stage does it when it encodes its deltas, so leaving it out would flatter the single process; the evaluate
     stage, for the cells of format-4 deltas waiting in its buckets, is charged the same read),
   * the ingest stage's work per range (the same, into fresh rings, plus building and encoding one delta
     per model: :meth:`calmon.cluster.partition.PartitionIngest.apply`, :meth:`Delta.to_bytes`),
   * the evaluate stage's work (decoding and merging those deltas, :func:`merge_delta`, then reading every
     bucket once), per *input* record,
   * the two stages together (``n / (ingest + evaluate CPU seconds)``, the goal of #33.3: >= 0.6 of single);

   each stage with the delta format 2 (JSON, packed buckets), 3 (binary frames, a part per grid per bucket, zlib
   level 1), 3 without zlib (``v3raw``), 4 (one table of cells per record, zlib level 1: what the ingest stage
   writes) and 4 without zlib (``v4raw``), and the delta bytes per input record at the given range size
   (``--range``, 20,000 by default).
2. **scaling** (``--workers 1,2,4``): that many processes, each running the ingest stage's compute on its share
   of ``--partitions`` (12) partitions at once; records per second per worker against one worker's, and records
   per CPU-second per worker against one worker's with each worker's CPU / wall.  No broker: it measures whether
   the stage's own work scales across processes on this machine.  Records per second cannot scale beyond its
   cores (``os.cpu_count()`` is printed); records per CPU-second show what each worker costs when it has a core
   of its own, the figure ``docs/cluster.md`` extrapolates to a cluster.
3. **cluster** (``--cluster``, needs the Tansu broker): the end-to-end scenario of
   ``tests/test_cluster_kafka.py`` (3 ingest + 2 evaluators, one of each SIGKILLed) at ``--events``,
   reporting identical-or-not and the CPU seconds of every worker (from ``/proc``) and of the single-process
   reference run (a file source), so records per CPU-second per stage include the Kafka clients, process start-up
   and idle polling (small runs are dominated by those).

The traffic and the scenario are the test suite's (``make_traffic``, ``cluster_run``, ... of
``tests/test_cluster_kafka.py``, whose helpers import each other by module name): the measurement runs in a child
with ``tests/`` on its ``PYTHONPATH``.

    python -m benchmarks.bench_cluster                      # compute + scaling, 140,000 predictions, 3 rounds
    python -m benchmarks.bench_cluster --events 200000 --cluster
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import struct
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
    _read_all(st)  # fold the pending events, as the first evaluation does
    return time.process_time() - t0


def ingest_stage(cfg, records, partitions, size, version=3, compress=None):
    from calmon.cluster.partition import PartitionIngest
    from calmon.cluster.topics import Range
    from connectors.base import Batch
    encoded: list[bytes] = []
    by_partition: dict[int, list[bytes]] = {}
    for q, _, v in records:  # the harness's split of the traffic, not the stage's work: outside the timing
        by_partition.setdefault(q, []).append(v)
    t0 = time.process_time()
    for p in range(partitions):
        key = f"events/{p}"
        part = PartitionIngest(cfg, key, "events", None)
        mine = by_partition.get(p, [])
        if not mine:
            continue
        for start in range(0, len(mine), size):
            chunk = mine[start:start + size]
            rng = Range(key, start, start + len(chunk), 1767225600.0, "w")
            applied = part.apply(Batch(chunk, {}, "events", [f"{key}@{start + i}" for i in range(len(chunk))]), rng)
            encoded += [d.to_bytes(version, compress) for d in applied.deltas]
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
    _read_all(st)  # cells merged but pending are summed at a bucket's next read: counted here, as for single
    return time.process_time() - t0


def _read_all(st) -> None:
    """Read every bucket once (aggregating what waits in it), as the first evaluation does."""
    for mw in st.models.values():
        for ring in mw.rings.values():
            for _tier, _key, _version, bucket in ring.entries():
                _ = bucket.stats


#: The delta formats measured in the same run: 2 (JSON, packed buckets), 3 (binary frames, parts per bucket, zlib
#: level 1), 4 (one table of cells per record, zlib level 1: what the ingest stage writes), each binary one also
#: without zlib (the CPU and bytes of compressing, #33.3).
FORMATS: dict[str, tuple[int, bool | None]] = {"v2": (2, None), "v3": (3, True), "v3raw": (3, False), "v4": (4, True),
                                              "v4raw": (4, False)}


def compute(args) -> dict:
    from test_cluster_kafka import make_traffic  # type: ignore[import-not-found, unused-ignore]  # tests/ on PYTHONPATH

    cfg = config()
    records, _ = make_traffic(args.events, seed=args.seed, partitions=args.partitions)
    values = [v for _, _, v in records]
    rows: dict[str, list[float]] = {"single": []}
    for f in FORMATS:
        rows[f"ingest_{f}"], rows[f"evaluate_{f}"], rows[f"together_{f}"] = [], [], []
    encoded: dict[str, list[bytes]] = {}
    load = [os.getloadavg()[0]]
    for _ in range(args.rounds):  # interleaved: each round runs every stage once
        rows["single"].append(single(cfg, values, args.range))
        for f, (version, compress) in FORMATS.items():
            t, encoded[f] = ingest_stage(cfg, records, args.partitions, args.range, version, compress)
            e = evaluate_stage(cfg, encoded[f])
            rows[f"ingest_{f}"].append(t)
            rows[f"evaluate_{f}"].append(e)
            rows[f"together_{f}"].append(t + e)
        load.append(os.getloadavg()[0])
    n = len(records)
    out: dict = {"records": n, "partitions": args.partitions, "range": args.range, "rounds": args.rounds,
                 "delta_records": len(encoded["v3"]), "load": [min(load), max(load)]}
    for f in FORMATS:
        out[f"delta_bytes_per_record_{f}"] = sum(map(len, encoded[f])) / n
    for k, ts in rows.items():
        out[f"{k}_records_per_cpu_s_best"] = n / min(ts)
        out[f"{k}_records_per_cpu_s_median"] = n / statistics.median(ts)
        if k != "single":
            out[f"{k}_vs_single_best"] = min(rows["single"]) / min(ts)
            out[f"{k}_vs_single_median"] = statistics.median(rows["single"]) / statistics.median(ts)
    return out


def _write_records(path: Path, records: list[tuple[int, bytes | None, bytes]]) -> None:
    """The traffic for the scaling workers: ``<partition u32><length u32><value>`` per record (no pickle)."""
    with path.open("wb") as f:
        for p, _key, value in records:
            f.write(struct.pack("<II", p, len(value)) + value)


def _read_records(path: Path) -> list[tuple[int, None, bytes]]:
    data, out, at = path.read_bytes(), [], 0
    while at < len(data):
        p, n = struct.unpack_from("<II", data, at)
        out.append((p, None, data[at + 8:at + 8 + n]))
        at += 8 + n
    return out


def _worker(args: tuple[str, int, int, int, int]) -> tuple[int, float, float]:
    """One scaling worker: the ingest stage's compute over partitions ``p % workers == index`` of the traffic;
    (records, wall seconds, CPU seconds)."""
    path, partitions, size, workers, index = args
    cfg = config()
    mine = [r for r in _read_records(Path(path)) if r[0] % workers == index]
    ingest_stage(cfg, mine[:200], partitions, size)  # warm: imports and first-call costs are not the stage's
    t0, c0 = time.perf_counter(), time.process_time()
    ingest_stage(cfg, mine, partitions, size)
    return len(mine), time.perf_counter() - t0, time.process_time() - c0


def scaling(args) -> dict:
    """Records per second per worker with 1, 2, 4, ... ingest processes at once (interleaved rounds)."""
    import multiprocessing
    import tempfile

    from test_cluster_kafka import make_traffic  # type: ignore[import-not-found, unused-ignore]

    records, _ = make_traffic(args.events, seed=args.seed, partitions=args.partitions)
    path = Path(tempfile.mkdtemp(prefix="calmon-bench-cluster-")) / "records.bin"
    _write_records(path, records)
    counts = [int(w) for w in args.workers.split(",") if w]
    per_worker: dict[int, list[float]] = {w: [] for w in counts}
    per_cpu: dict[int, list[float]] = {w: [] for w in counts}  # records per CPU-second per worker
    busy: dict[int, list[float]] = {w: [] for w in counts}  # CPU / wall of a worker: 1 = never waited for a core
    load = [os.getloadavg()[0]]
    ctx = multiprocessing.get_context("spawn")  # fresh interpreters: no state shared with this process
    try:
        for _ in range(args.rounds):
            for w in counts:
                with ctx.Pool(w) as pool:
                    done = pool.map(_worker, [(str(path), args.partitions, args.range, w, i) for i in range(w)])
                per_worker[w].append(statistics.mean(n / wall for n, wall, _cpu in done))
                per_cpu[w].append(statistics.mean(n / cpu for n, _wall, cpu in done))
                busy[w].append(statistics.mean(cpu / wall for _n, wall, cpu in done))
            load.append(os.getloadavg()[0])
    finally:
        path.unlink()
        path.parent.rmdir()
    one, one_cpu = per_worker[counts[0]], per_cpu[counts[0]]
    out: dict = {"cpus": os.cpu_count(), "scaling_load": [min(load), max(load)]}
    for w in counts:
        out[f"workers_{w}_records_per_cpu_s_per_worker_best"] = max(per_cpu[w])
        out[f"workers_{w}_records_per_cpu_s_per_worker_median"] = statistics.median(per_cpu[w])
        out[f"workers_{w}_cpu_vs_one_best"] = max(per_cpu[w]) / max(one_cpu)
        out[f"workers_{w}_cpu_vs_one_median"] = statistics.median(per_cpu[w]) / statistics.median(one_cpu)
        out[f"workers_{w}_cpu_per_wall_median"] = statistics.median(busy[w])
        out[f"workers_{w}_records_per_s_per_worker_best"] = max(per_worker[w])
        out[f"workers_{w}_records_per_s_per_worker_median"] = statistics.median(per_worker[w])
        out[f"workers_{w}_vs_one_best"] = max(per_worker[w]) / max(one)
        out[f"workers_{w}_vs_one_median"] = statistics.median(per_worker[w]) / statistics.median(one)
    return out


def broker_scaling(args) -> dict:
    """1, 2, 4, ... ``calmon run --role ingest`` workers on a ``--partitions``-partition topic of a real broker:
    records per CPU-second per worker (the worker's whole process: the Kafka clients, one transaction per range
    and partition, the group) against one worker's, interleaved rounds.

    The workers start on the empty topic. Once the group has formed (every partition owned, every worker owning
    some), the traffic is produced at once (confluent-kafka's producer when installed: much faster than the
    workers read, so ranges stay full), and each worker's CPU is counted from then until the group has
    committed every partition's end: the steady state of a running cluster. The same CPU counted from the
    moment each worker served (the group's formation and the restores in it) is printed beside it. Records per
    second per worker are printed too, and mean nothing beyond this machine's cores.
    """
    import collections
    import tempfile

    from kafka import KafkaConsumer, TopicPartition
    from kafka_broker import KafkaBroker  # type: ignore[import-not-found, unused-ignore]
    from test_cluster_kafka import (  # type: ignore[import-not-found, unused-ignore]
        TOPIC,
        Worker,
        make_traffic,
        wait_until,
        write_config,
    )

    records, _ = make_traffic(args.events, seed=args.seed, partitions=args.partitions)
    want = {p: n for p, n in sorted(collections.Counter(r[0] for r in records).items())}
    want.update({p: 0 for p in range(args.partitions) if p not in want})
    counts = [int(w) for w in args.broker_workers.split(",") if w]
    per_cpu: dict[int, list[float]] = {w: [] for w in counts}
    per_cpu_all: dict[int, list[float]] = {w: [] for w in counts}
    per_wall: dict[int, list[float]] = {w: [] for w in counts}
    broker_cpu: dict[int, list[float]] = {w: [] for w in counts}
    load = [os.getloadavg()[0]]

    def committed(boot: str) -> dict[int, int | None]:
        c = KafkaConsumer(bootstrap_servers=boot, group_id="calmon-ingest", enable_auto_commit=False)
        try:
            return {p: c.committed(TopicPartition(TOPIC, p), timeout_ms=3000) for p in range(args.partitions)}
        finally:
            c.close(autocommit=False)

    def proc_cpu(pid: int) -> float:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def formed(workers: list[Worker]) -> bool:
        owned = [sum(wk.metric("calmon_cluster_owned_partitions").values()) for wk in workers]
        return sum(owned) == args.partitions and min(owned) > 0

    for _ in range(args.rounds):
        for w in counts:
            with tempfile.TemporaryDirectory(prefix="calmon-bench-scale-") as tmp, KafkaBroker() as broker:
                boot = broker.bootstrap
                broker.create_topic(TOPIC, partitions=args.partitions)
                cfg = write_config(Path(tmp) / "cluster", source="kafka", bootstrap=boot, batch_size=args.range)
                workers = []
                try:
                    for i in range(w):  # all started before any serves: one group formation, not w
                        d = Path(tmp) / f"ingest{i}"
                        d.mkdir()
                        own = d / "calmon.yaml"
                        own.write_text(cfg.read_text().replace(f"state_dir: {Path(tmp) / 'cluster' / 'state'}",
                                                               f"state_dir: {d}"))
                        workers.append(Worker(own, "ingest", f"ingest{i}"))
                    serving = []
                    for wk in workers:
                        wk.wait_serving()
                        serving.append(wk.cpu())
                    wait_until(lambda workers=workers: formed(workers), 600, "the group to form", workers)
                    cpu0 = [wk.cpu() for wk in workers]
                    b0, t0 = proc_cpu(broker.proc.pid), time.perf_counter()  # type: ignore[union-attr]
                    _produce_fast(boot, TOPIC, records)
                    wait_until(lambda boot=boot: committed(boot) == want, 1800, "ingest to commit the end", workers)
                    wall = time.perf_counter() - t0
                    cpu1 = [wk.cpu() for wk in workers]
                    pid = broker.proc.pid  # type: ignore[union-attr]
                    broker_cpu[w].append((proc_cpu(pid) - b0) / len(records) * 1e6)
                    for wk in workers:
                        rc = wk.term()
                        assert rc == 0, (wk.name, rc, wk.log.read_text()[-3000:])
                finally:
                    for wk in workers:
                        if wk.alive():
                            wk.kill()
            # records / CPU-s of all workers = per worker, the partitions being shared evenly
            per_cpu[w].append(len(records) / sum(b - a for a, b in zip(cpu0, cpu1)))
            per_cpu_all[w].append(len(records) / sum(b - a for a, b in zip(serving, cpu1)))
            per_wall[w].append(len(records) / w / wall)
            load.append(os.getloadavg()[0])
    one_cpu, one_all, one_wall = per_cpu[counts[0]], per_cpu_all[counts[0]], per_wall[counts[0]]
    out: dict = {"broker_scaling_records": len(records), "broker_scaling_load": [min(load), max(load)]}
    for w in counts:
        p = f"broker_workers_{w}_"
        out[p + "records_per_cpu_s_per_worker_best"] = max(per_cpu[w])
        out[p + "records_per_cpu_s_per_worker_median"] = statistics.median(per_cpu[w])
        out[p + "cpu_vs_one_best"] = max(per_cpu[w]) / max(one_cpu)
        out[p + "cpu_vs_one_median"] = statistics.median(per_cpu[w]) / statistics.median(one_cpu)
        out[p + "from_serving_cpu_vs_one_median"] = statistics.median(per_cpu_all[w]) / statistics.median(one_all)
        out[p + "records_per_s_per_worker_median"] = statistics.median(per_wall[w])
        out[p + "vs_one_median"] = statistics.median(per_wall[w]) / statistics.median(one_wall)
        out[p + "broker_us_per_record_median"] = statistics.median(broker_cpu[w])
    return out


def _produce_fast(bootstrap: str, topic: str, records: list[tuple[int, bytes | None, bytes]]) -> None:
    """``records`` to ``topic`` with confluent-kafka's producer (several times faster than the workers read), or
    kafka-python's where it is not installed."""
    try:
        from confluent_kafka import Producer
    except ImportError:
        from test_cluster_kafka import produce  # type: ignore[import-not-found, unused-ignore]

        produce(bootstrap, records)
        return
    p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 20, "batch.size": 1 << 20,
                  "queue.buffering.max.messages": 1_000_000, "message.max.bytes": 1 << 24})
    for part, key, value in records:
        while True:
            try:
                p.produce(topic, value, key, partition=part)
                break
            except BufferError:  # the local queue is full: let it drain
                p.poll(0.05)
    if p.flush(600):
        raise RuntimeError("records left unsent after 600 s")


def broker_table(res: dict) -> str:
    """The broker scaling rows (:func:`broker_scaling`) as a Markdown table."""
    lines = [f"ingest workers on a real broker (Tansu), {res['broker_scaling_records']} records, load "
             f"{res['broker_scaling_load'][0]:.1f}-{res['broker_scaling_load'][1]:.1f}", "",
             "| workers | records/CPU-s per worker best | median | vs one worker best | median "
             "| vs one, from serving, median | records/s per worker median | vs one median | broker us/record |",
             "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    lines += _worker_rows(res, "broker_workers_", [
        ("records_per_cpu_s_per_worker_best", ",.0f"), ("records_per_cpu_s_per_worker_median", ",.0f"),
        ("cpu_vs_one_best", ".2f"), ("cpu_vs_one_median", ".2f"), ("from_serving_cpu_vs_one_median", ".2f"),
        ("records_per_s_per_worker_median", ",.0f"),
        ("vs_one_median", ".2f"), ("broker_us_per_record_median", ".2f")])
    return "\n".join(lines)


def _worker_rows(res: dict, prefix: str, cells: list[tuple[str, str]]) -> list[str]:
    """A Markdown row per worker count of the keys ``<prefix><count>_<key>``: the count, then each ``(key, format
    spec)`` of ``cells`` (the first key tells which counts were measured)."""
    return [f"| {w} | " + " | ".join(format(res[f"{prefix}{w}_{key}"], spec) for key, spec in cells) + " |"
            for w in worker_counts(res, prefix, cells[0][0])]


def worker_counts(res: dict, prefix: str, key: str) -> list[int]:
    """The worker counts measured under ``prefix`` (``workers_``, ``broker_workers_``): those with a
    ``<prefix><count>_<key>`` figure, ascending."""
    return sorted(int(k[len(prefix):].split("_")[0]) for k in res if k.startswith(prefix) and k.endswith("_" + key))


def table(res: dict) -> str:
    """The figures as a Markdown table (ratios against the single process, min over rounds = best)."""
    lines = [f"records {res['records']}, {res['partitions']} partitions, ranges of {res['range']} records, "
             f"{res['rounds']} interleaved rounds, load {res['load'][0]:.1f}-{res['load'][1]:.1f}",
             "", "| row | records/CPU-s best | median | vs single best | median | delta bytes/record |",
             "| --- | ---: | ---: | ---: | ---: | ---: |"]
    for k in ["single", *(f"{s}_{f}" for f in FORMATS for s in ("ingest", "evaluate", "together"))]:
        ratio = ("", "") if k == "single" else (f"{res[f'{k}_vs_single_best']:.2f}",
                                                f"{res[f'{k}_vs_single_median']:.2f}")
        fmt = k.partition("_")[2]
        size = f"{res[f'delta_bytes_per_record_{fmt}']:.1f}" if k.startswith("ingest") else ""
        lines.append(f"| {k} | {res[f'{k}_records_per_cpu_s_best']:,.0f} | {res[f'{k}_records_per_cpu_s_median']:,.0f}"
                     f" | {ratio[0]} | {ratio[1]} | {size} |")
    if "cpus" in res:
        lines += ["", f"scaling: ingest-stage processes at once on {res['cpus']} CPUs (no broker), load "
                      f"{res['scaling_load'][0]:.1f}-{res['scaling_load'][1]:.1f}",
                  "", "| workers | records/s per worker best | median | vs one worker best | median "
                      "| records/CPU-s per worker best | median | vs one worker best | median | CPU/wall |",
                  "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
        lines += _worker_rows(res, "workers_", [
            ("records_per_s_per_worker_best", ",.0f"), ("records_per_s_per_worker_median", ",.0f"),
            ("vs_one_best", ".2f"), ("vs_one_median", ".2f"), ("records_per_cpu_s_per_worker_best", ",.0f"),
            ("records_per_cpu_s_per_worker_median", ",.0f"), ("cpu_vs_one_best", ".2f"), ("cpu_vs_one_median", ".2f"),
            ("cpu_per_wall_median", ".2f")])
    return "\n".join(lines)


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
    ap.add_argument("--events", type=int, default=140_000, help="predictions (plus outcomes, ~1%% malformed)")
    ap.add_argument("--partitions", type=int, default=12)
    ap.add_argument("--range", type=int, default=20_000, help="records per range (ingest.batch_size)")
    ap.add_argument("--workers", default="1,2,4", help="ingest processes at once for the scaling rows ('' = none)")
    ap.add_argument("--broker-workers", default="",
                    help="ingest workers on a real broker for the broker scaling rows, e.g. 1,2,4 (needs Tansu)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--only-broker", action="store_true", help="only the broker scaling rows (--broker-workers)")
    ap.add_argument("--cluster", action="store_true", help="run the broker scenario instead")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:  # the tests' helpers are importable here (tests/ on PYTHONPATH)
        if args.cluster:
            print(json.dumps(cluster(args), indent=2), flush=True)
            return 0
        if args.broker_workers and args.only_broker:
            res = broker_scaling(args)
            print(json.dumps(res, indent=2), flush=True)
            print(broker_table(res), flush=True)
            return 0
        res = compute(args)
        if args.workers:
            res.update(scaling(args))
        if args.broker_workers:
            res.update(broker_scaling(args))
        print(json.dumps(res, indent=2), flush=True)
        print(table(res), flush=True)
        if args.broker_workers:
            print(broker_table(res), flush=True)
        return 0
    given = sys.argv[1:] if argv is None else argv
    return subprocess.run(module_cmd("benchmarks.bench_cluster", "--child", *given), env=child_env(tests=True),
                          cwd=NEUTRAL, check=False).returncode


if __name__ == "__main__":
    sys.exit(main())
