"""The partitioned agent end to end on a real broker (Tansu): 3 ingest workers + 2 evaluators as subprocesses
(`calmon run --role ingest|evaluate`), one of each SIGKILLed mid-stream and replaced, another ingest worker removed
(SIGTERM) later; at the end the union of the evaluators' per-model statistics must equal the single-process agent's
on the same records, every malformed record must be dead-lettered exactly once, and no per-model series may appear
on two evaluators' /metrics.

Traffic: 24 models, delayed outcomes (exponential, mean 20 s) keyed by prediction id and labeled events, ~1 %
malformed records, on a topic of 6 partitions.  The join TTL and the allowed lateness are longer than any delay or
skew between partitions, so no decision depends on how partitions interleave (the condition under which a
partitioned and a single-process run can be compared bit for bit; see docs/cluster.md).

CI runs a reduced version (env CALMON_CLUSTER_EVENTS, default 12000 predictions); the on-demand one is
`python tests/test_cluster_kafka.py --events 200000 --trials 3` (or benchmarks/bench_cluster.py for throughput).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
import zlib
from pathlib import Path
from typing import Any

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

# the comparisons live in cluster_compare; re-exported for tests/test_cluster.py and benchmarks/bench_cluster.py
from cluster_compare import MODELS, check, check_reference, identical, normalized  # noqa: E402,F401
from kafka_broker import KafkaBroker, require_broker  # noqa: E402

TOPIC = "events"
PARTITIONS = 6
DELTA_PARTITIONS = 4
# Group timeouts for Tansu 0.6 on a loaded machine (docs/cluster.md, "Group rebalances on Tansu"): its coordinator
# holds a follower's JoinGroup 3 s (PAUSE_MS) while kafka-python sends no heartbeats during a rejoin, so a session
# timeout of 3 s evicted followers by their own rejoin -- a new member, a new generation, the leader's SyncGroup
# refused, again (the rebalance loop).  10 s leaves room for the pause and a stalled process; 20 s between polls
# keeps loaded workers from leaving the group (it does not lengthen joins on Tansu: measured).
FAST = {"max_poll_interval_ms": 20000, "session_timeout_ms": 10000, "heartbeat_interval_ms": 1000}
BAD_KINDS = [
    b"garbage %d",
    b'{"type": "prediction", "id": "bad-%d", "model": "m00", "score": 1.5}',
    b'["not", "an", "object", %d]',
    b'{"type": "outcome", "id": "bad-%d", "model": "m01"}',
    b'{"type": "labeled", "model": "m02", "score": "high", "label": 1, "n": %d}',
]


# -- traffic -------------------------------------------------------------------------------------
def make_traffic(predictions: int, seed: int = 0, models: int = MODELS, partitions: int = PARTITIONS,
                 bad_rate: float = 0.01, rate: float = 1.0) -> tuple[list[tuple[int, bytes | None, bytes]], int]:
    """``(partition, key, value)`` records in one global order, and the number of malformed ones.

    Two thirds of the models emit predictions with outcomes delayed 20 s on average (keyed by the
    prediction id, so a pair shares a partition), the others labeled events (no key, spread round robin).
    """
    from connectors.simulation import SimulationSpec, Simulator
    per = max(1, predictions // models)
    timed: list[tuple[float, int, bytes]] = []
    for m in range(models):
        delay = 20.0 if m % 3 else 0.0
        sim = Simulator(SimulationSpec(model=f"m{m:02d}", seed=seed + m, rate=rate, delay=delay,
                                       segments=["web", "app"]))
        lines = sim.batch(per) + sim.flush()
        for i, line in enumerate(lines):
            timed.append((json.loads(line)["ts"], m * 10_000_000 + i, line))
    timed.sort()
    rng = np.random.default_rng(seed)
    n_bad = int(round(bad_rate * len(timed)))
    bad_at = set(rng.choice(len(timed) + n_bad, size=n_bad, replace=False).tolist())
    out: list[tuple[int, bytes | None, bytes]] = []
    good = iter(timed)
    k = 0
    for i in range(len(timed) + n_bad):
        if i in bad_at:
            out.append((i % partitions, None, BAD_KINDS[k % len(BAD_KINDS)] % k))
            k += 1
            continue
        line = next(good)[2]
        ident = json.loads(line).get("id")
        if ident is None:
            out.append((i % partitions, None, line))
        else:
            out.append((zlib.crc32(ident.encode()) % partitions, ident.encode(), line))
    return out, n_bad


def produce(bootstrap: str, records: list[tuple[int, bytes | None, bytes]]) -> None:
    from kafka import KafkaProducer

    p = KafkaProducer(bootstrap_servers=bootstrap, linger_ms=20, batch_size=1 << 20, max_request_size=1 << 24)
    for part, key, value in records:
        p.send(TOPIC, value, key=key, partition=part)
    p.flush(timeout=600)
    p.close()


# -- configuration -------------------------------------------------------------------------------
def write_config(directory: Path, *, source: str, bootstrap: str = "", events: Path | None = None,
                 batch_size: int = 2000) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    if source == "file":
        src = f"[{{name: events, path: {events}}}]"
        dead = "{type: file, path: deadletter.jsonl}"
        cluster = ""
    else:
        opts = {"bootstrap_servers": bootstrap, "topic": TOPIC, "group_id": "unused", "client": FAST,
                "backoff_initial": 0.2, "backoff_max": 2.0}
        src = f"[{{name: events, type: kafka, options: {json.dumps(opts)}}}]"
        dead = f"{{type: kafka, options: {json.dumps({'bootstrap_servers': bootstrap, 'topic': 'dlq'})}}}"
        cl = {"bootstrap_servers": bootstrap, "partitions": DELTA_PARTITIONS, "client": {}, "linger": 0.3,
              "snapshot_every": os.environ.get("CALMON_SNAPSHOT_EVERY", "1s")}
        cluster = f"cluster: {json.dumps(cl)}"
    cfg = directory / "calmon.yaml"
    cfg.write_text(f"""
state_dir: {directory / "state"}
sources: {src}
dead_letter: {dead}
models: {{default: {{bins: 256, reservoir: 32, segments: [web]}}}}
join: {{ttl: 2h, max_pending: 1000000}}
windows: {{names: [5m, 1h, all], allowed_lateness: 6h,
          tiers: [{{width: 1m, count: 10}}, {{width: 10m, count: 6}}, {{width: 1h, count: 2}}]}}
evaluation: {{every: 2s, tests: []}}
exporter: {{port: 0}}
checkpoint: {{every: 0.5s}}
ingest: {{batch_size: {batch_size}, poll_timeout: 0.1s, exit_when_done: {"true" if source == "file" else "false"}}}
{cluster}
""")
    return cfg


def evaluator_client_fix(cfg: Path) -> None:
    """Evaluators read the deltas topic with the same short group timeouts (Tansu joins after the timeout)."""
    text = cfg.read_text().replace('"client": {}', f'"client": {json.dumps(FAST)}')
    cfg.write_text(text)


# -- processes -----------------------------------------------------------------------------------
class Worker:
    """`calmon run --role ROLE` as a subprocess, stderr to a file; ``url`` once it serves."""

    def __init__(self, cfg: Path, role: str, name: str) -> None:
        self.cfg, self.role, self.name = cfg, role, name
        self.log = cfg.parent / f"{name}.log"
        self._f = open(self.log, "w")  # noqa: SIM115
        self.proc = subprocess.Popen([sys.executable, "-m", "calmon", "run", "-c", str(cfg), "--role", role,
                                      "--log-level", "INFO"], stderr=self._f, stdout=subprocess.DEVNULL, cwd=ROOT)
        self.url: str | None = None

    def wait_serving(self, timeout: float = 60.0) -> str:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for line in self.log.read_text().splitlines():
                if "calmon run: serving" in line:
                    self.url = line.split("serving", 1)[1].strip().removesuffix("/metrics")
                    return self.url
            if self.proc.poll() is not None:
                raise AssertionError(f"{self.name} exited {self.proc.returncode}: {self.log.read_text()[-3000:]}")
            time.sleep(0.05)
        raise AssertionError(f"{self.name} not serving after {timeout} s: {self.log.read_text()[-3000:]}")

    def get(self, path: str) -> tuple[int, str]:
        assert self.url is not None
        try:
            with urllib.request.urlopen(self.url + path, timeout=5) as r:
                return r.status, r.read().decode()
        except urllib.error.HTTPError as e:
            return e.code, ""

    def metric(self, name: str) -> dict[str, float]:
        """``{labels: value}`` of one metric family on /metrics."""
        code, text = self.get("/metrics")
        assert code == 200, (self.name, code)
        out = {}
        for line in text.splitlines():
            m = re.match(rf"^{name}(\{{[^}}]*\}})? (\S+)$", line)
            if m:
                out[m.group(1) or ""] = float(m.group(2))
        return out

    def alive(self) -> bool:
        return self.proc.poll() is None

    def cpu(self) -> float:
        """CPU seconds (user + system) used so far (Linux ``/proc``; 0 elsewhere)."""
        try:
            fields = Path(f"/proc/{self.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            return 0.0
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def kill(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()
        self._f.close()

    def term(self, timeout: float = 30.0, signal_it: bool = True) -> int:
        """SIGTERM (unless already sent) and wait for the exit code."""
        if signal_it:
            self.proc.send_signal(signal.SIGTERM)
        rc = self.proc.wait(timeout=timeout)
        self._f.close()
        return rc


def ends(bootstrap: str, topic: str) -> dict[int, int]:
    from kafka import KafkaConsumer, TopicPartition

    c = KafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False)
    try:
        tps = [TopicPartition(topic, p) for p in sorted(c.partitions_for_topic(topic) or ())]
        c.assign(tps)
        c.seek_to_end(*tps)
        return {tp.partition: c.position(tp) for tp in tps}
    finally:
        c.close()


def count_topic(bootstrap: str, topic: str) -> dict[int, int]:
    """One past the last record per partition, by reading (Tansu's ListOffsets(latest) undercounts batches; a
    transaction's commit marker after the last record is not counted: a consumer's position stops before it)."""
    from kafka import KafkaConsumer, TopicPartition

    c = KafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False)
    try:
        tps = [TopicPartition(topic, p) for p in sorted(c.partitions_for_topic(topic) or ())]
        c.assign(tps)
        c.seek_to_beginning(*tps)
        last = {tp.partition: 0 for tp in tps}
        idle = 0
        while idle < 4:
            got = c.poll(timeout_ms=300)
            idle = 0 if got else idle + 1
            for tp, rs in got.items():
                last[tp.partition] = max(last[tp.partition], rs[-1].offset + 1)
        return last
    finally:
        c.close()


def ingest_committed(bootstrap: str, group: str) -> dict[int, int | None]:
    from kafka import KafkaConsumer, TopicPartition

    c = KafkaConsumer(bootstrap_servers=bootstrap, group_id=group, enable_auto_commit=False)
    try:
        return {p: c.committed(TopicPartition(TOPIC, p), timeout_ms=3000) for p in range(PARTITIONS)}
    finally:
        c.close(autocommit=False)


def dead_letters(bootstrap: str, topic: str) -> list[tuple[bytes, str, str]]:
    """The dead letters as a reader wanting exactly-once reads them: ``read_committed`` (the ingest stage writes them
    in its ranges' transactions; a fenced zombie's are aborted), aborted ones dropped by their markers on Tansu."""
    from calmon.cluster.topics import TopicReader

    out = []

    def visit(r: Any) -> None:
        h = {k: v.decode() for k, v in r.headers}
        out.append((r.value, h["calmon-reason"], h.get("calmon-origin", "")))

    reader = TopicReader(bootstrap, topic, {})
    try:
        reader.read_all(visit)
    finally:
        reader.close()
    return out


def wait_until(cond: Any, timeout: float, what: str, workers: list[Worker], diag: Any = None) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return
        for w in workers:
            assert w.alive(), f"{w.name} died: {w.log.read_text()[-3000:]}"
        time.sleep(0.25)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}" + (f": {diag()}" if diag else ""))


# -- the scenario ----------------------------------------------------------------------------------
def file_reference(work: Path, records: list[tuple[int, bytes | None, bytes]]) -> dict[str, Any]:
    from test_kafka_agent import final_state

    d = work / "reference"
    d.mkdir(parents=True)
    events = d / "events.jsonl"
    events.write_bytes(b"\n".join(v for _, _, v in records) + b"\n")
    cfg = write_config(d, source="file", events=events)
    p = subprocess.run([sys.executable, "-m", "calmon", "run", "-c", str(cfg), "--log-level", "WARNING"],
                       capture_output=True, text=True, timeout=900, cwd=ROOT)
    assert p.returncode == 0, p.stderr[-2000:]
    dead = [json.loads(x) for x in (d / "state" / "deadletter.jsonl").read_text().splitlines()]
    return {"state": final_state(d), "dead": sorted((x["record"].encode(), x["reason"]) for x in dead)}


def cluster_run(work: Path, broker: KafkaBroker, records: list[tuple[int, bytes | None, bytes]],
                rng: np.random.Generator, timeout: float | None = None, chunks: int = 24) -> dict[str, Any]:
    """3 ingest workers + 2 evaluators while the records are produced in chunks; SIGKILL one of each mid-stream
    (at random points of the production), add a replacement of each, remove (SIGTERM) another ingest worker,
    pause (SIGSTOP) a third one until the group has moved its partitions and resume it (SIGCONT: a zombie),
    wait until everything is applied."""
    boot = broker.bootstrap
    timeout = timeout or float(os.environ.get("CALMON_CLUSTER_TIMEOUT", "300"))
    cfg = write_config(work / "cluster", source="kafka", bootstrap=boot)
    evaluator_client_fix(cfg)
    info: dict[str, Any] = {"kills": [], "cpu": {}}
    workers: list[Worker] = []

    def start(role: str, name: str) -> Worker:
        d = work / "cluster" / name
        d.mkdir(parents=True, exist_ok=True)
        own = d / "calmon.yaml"
        own.write_text(cfg.read_text().replace(f"state_dir: {work / 'cluster' / 'state'}", f"state_dir: {d}"))
        w = Worker(own, role, name)
        workers.append(w)
        w.wait_serving()
        return w

    try:
        t0 = time.monotonic()
        ingest = [start("ingest", f"ingest{i}") for i in range(3)]
        evals = [start("evaluate", f"eval{i}") for i in range(2)]
        cuts = np.linspace(0, len(records), chunks + 1).astype(int)
        kill_ingest, kill_eval = sorted(rng.choice(np.arange(chunks // 4, 3 * chunks // 4), 2, replace=False))
        remove_ingest = kill_eval + 2
        pause_ingest = min(kill_ingest + 1, chunks - 1)
        for c in range(chunks):
            if not pause_ingest < c < pause_ingest + 3:  # (those chunks were produced while the zombie slept)
                produce(boot, records[cuts[c]:cuts[c + 1]])
            if c == kill_ingest:
                info["kills"].append(("ingest0", sum(ingest[0].metric("calmon_cluster_ranges_total").values())))
                info["cpu"]["ingest0"] = ingest[0].cpu()
                ingest[0].kill()
                ingest.append(start("ingest", "ingest3"))
            if c == kill_eval:
                info["kills"].append(("eval0", sum(evals[0].metric("calmon_cluster_owned_models").values())))
                info["cpu"]["eval0"] = evals[0].cpu()
                evals[0].kill()
                evals.append(start("evaluate", "eval2"))
            if c == pause_ingest:
                info["zombie"] = zombie(ingest[2], [w for w in ingest if w is not ingest[2] and w.alive()], boot,
                                        records[cuts[c + 1]:cuts[min(c + 3, chunks)]], timeout)
            if c == remove_ingest:  # scale down: a clean stop hands its partitions over
                info["cpu"]["ingest1"] = ingest[1].cpu()
                rc = ingest[1].term()
                assert rc == 0, ("ingest1", rc, ingest[1].log.read_text()[-3000:])
                info["removed"] = "ingest1"
            time.sleep(0.3)
        live_ingest = [w for w in ingest if w.alive()]
        live_evals = [w for w in evals if w.alive()]
        want = count_topic(boot, TOPIC)
        wait_until(lambda: ingest_committed(boot, "calmon-ingest") == want, timeout, "ingest to commit the end",
                   live_ingest + live_evals, lambda: f"{ingest_committed(boot, 'calmon-ingest')} != {want}")
        delta_ends = count_topic(boot, "calmon-deltas")

        def evaluators_done() -> bool:
            pos: dict[str, float] = {}
            for w in live_evals:
                if w.get("/readyz")[0] != 200:
                    return False
                for labels, v in w.metric("calmon_cluster_position").items():
                    pos[re.search(r'partition="([^"]+)"', labels).group(1)] = v  # type: ignore[union-attr]
            return pos == {f"calmon-deltas/{p}": float(e) for p, e in delta_ends.items()}

        def diag() -> str:
            return json.dumps({"ends": delta_ends, "evaluators": [
                {"name": w.name, "ready": w.get("/readyz")[0], "position": w.metric("calmon_cluster_position"),
                 "lag": w.metric("calmon_cluster_lag_records")} for w in live_evals]})

        wait_until(evaluators_done, timeout, "evaluators to read every delta", live_ingest + live_evals, diag)
        info["seconds"] = time.monotonic() - t0
        info["series"] = [series_of(w) for w in live_evals]
        info["ingest_metrics"] = [w.get("/metrics")[1] for w in live_ingest]
        info["zombie"]["fenced"] = sum(ingest[2].metric("calmon_cluster_fenced_total").values())
        info["states_in_order"] = states_in_order(boot)
        info["restore_seconds"] = {w.name: round(v, 3) for w in live_ingest + live_evals
                                   for v in w.metric("calmon_cluster_restore_seconds").values()}
        info["cpu"].update({w.name: w.cpu() for w in live_ingest + live_evals})
        info["snapshots"] = [snapshot_reads(w, delta_ends) for w in live_evals]
        for w in live_ingest:
            rc = w.term()
            assert rc == 0, (w.name, rc, w.log.read_text()[-3000:])
        for w in live_evals:  # together: one leaving the group must not revoke the other's models before its dump
            w.proc.send_signal(signal.SIGTERM)
        for w in live_evals:
            rc = w.term(signal_it=False)
            assert rc == 0, (w.name, rc, w.log.read_text()[-3000:])
        dumps = [json.loads((w.cfg.parent / "owned-state.json").read_text()) for w in live_evals]
        info["dumps"] = dumps
        info["dead"] = dead_letters(boot, "dlq")
        info["delta_records"] = sum(delta_ends.values())
        return info
    finally:
        for w in workers:
            if w.alive():
                w.kill()


def zombie(w: Worker, others: list[Worker], boot: str, during: list[tuple[int, bytes | None, bytes]],
           timeout: float) -> dict[str, Any]:
    """Once ``w`` owns input partitions (the group may still be settling after a kill), SIGSTOP it, produce
    ``during``, wait until ``others`` own every input partition, SIGCONT ``w``."""
    def owned() -> float:
        return sum(w.metric("calmon_cluster_owned_partitions").values())

    wait_until(lambda: owned() > 0, timeout, "the worker to pause to own partitions", [w, *others])
    before = owned()
    w.proc.send_signal(signal.SIGSTOP)
    t0 = time.monotonic()
    try:
        produce(boot, during)

        def moved() -> bool:
            return sum(sum(o.metric("calmon_cluster_owned_partitions").values()) for o in others) == PARTITIONS

        wait_until(moved, timeout, "the paused worker's partitions to move", others)
    finally:
        w.proc.send_signal(signal.SIGCONT)
    return {"owned_before": before, "paused_seconds": round(time.monotonic() - t0, 1)}


def states_in_order(boot: str) -> bool:
    """Whether the committed states of every input partition, read ``read_committed`` in log order, have strictly
    increasing offsets: a write of a fenced owner (a zombie's stale chain) or two owners of one partition would
    show as a state at or below one already committed."""
    from calmon.cluster.topics import PartitionState, TopicReader

    seen: dict[str, list[int]] = {}

    def visit(r: Any) -> None:
        st = PartitionState.from_bytes(r.value, r.key)
        seen.setdefault(st.source, []).append(st.offset)

    reader = TopicReader(boot, "calmon-ingest-state", {})
    try:
        reader.read_all(visit)
    finally:
        reader.close()
    return bool(seen) and all(all(a < b for a, b in zip(v, v[1:])) for v in seen.values())


def snapshot_reads(w: Worker, delta_ends: dict[int, int]) -> dict[str, Any]:
    """An evaluator's snapshot counters, its delta reads, and what a full replay of its partitions would read."""
    out: dict[str, Any] = {"name": w.name}
    for k in ("snapshots_total", "snapshot_models_restored_total", "deltas_read_total"):
        out[k] = int(sum(w.metric(f"calmon_cluster_{k}").values()))
    parts = [int(re.search(r'partition="[^"]*/(\d+)"', lab).group(1))  # type: ignore[union-attr]
             for lab in w.metric("calmon_cluster_position")]
    out["full_replay"] = sum(delta_ends.get(p, 0) for p in parts)
    return out


def keep_broker_log(broker: KafkaBroker, where: Path) -> None:
    """Copy the broker's log into ``where`` (the broker deletes its own on close)."""
    try:
        (where / "broker.log").write_bytes(broker.log_path.read_bytes())
    except OSError:
        pass


def series_of(w: Worker) -> set[str]:
    """Per-model series on /metrics (worker label removed)."""
    code, text = w.get("/metrics")
    assert code == 200
    return {line.rsplit(" ", 1)[0] for line in text.splitlines() if 'model="' in line and not line.startswith("#")}


@pytest.mark.integration
@pytest.mark.slow
def test_cluster_exactly_once_with_kills(tmp_path):
    require_broker()
    predictions = int(os.environ.get("CALMON_CLUSTER_EVENTS", "12000"))
    records, n_bad = make_traffic(predictions)
    ref = file_reference(tmp_path, records)
    checked = check_reference(tmp_path, records)
    with KafkaBroker() as broker:
        broker.create_topic(TOPIC, partitions=PARTITIONS)
        try:
            run = cluster_run(tmp_path, broker, records, np.random.default_rng(0))
        finally:  # the broker's log (its group coordinator's decisions) next to the workers' logs
            keep_broker_log(broker, tmp_path)
    res = check(ref, run, records, n_bad, checked)
    print(json.dumps({**res, "records": len(records), "kills": run["kills"], "seconds": round(run["seconds"], 1),
                      "snapshots": run["snapshots"], "zombie": run["zombie"]}))
    assert res["models"] == MODELS, res
    # snapshots were written, and an evaluator that took over partitions restored from them, reading fewer
    # delta records than a replay of its partitions from the beginning would
    snaps = run["snapshots"]
    assert sum(e["snapshots_total"] for e in snaps) > 0, snaps
    assert any(e["snapshot_models_restored_total"] > 0 and e["deltas_read_total"] < e["full_replay"]
               for e in snaps), snaps
    assert res["disjoint"], res
    assert res["difference"] is None, res["difference"]
    assert res["events_difference"] is None, res["events_difference"]
    assert res["check_difference"] is None, res["check_difference"]
    assert res["dead_letters"] == n_bad and res["dead_unique_origins"] and res["dead_match"], res
    assert res["duplicated_series"] == 0, res
    # the zombie (#33.2): paused until its partitions moved, resumed; the final state above is still exact, and no
    # state it wrote after the move was committed (each partition's committed states advance strictly)
    assert run["zombie"]["owned_before"] > 0, run["zombie"]
    assert run["states_in_order"], run["zombie"]


def main() -> int:
    """The on-demand run: one JSON line per trial (records, kills, identical, restore times), then a summary."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--events", type=int, default=200_000, help="predictions (plus outcomes and ~1%% malformed)")
    ap.add_argument("--trials", type=int, default=1)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--timeout", type=float, default=3600.0, help="longest wait for the workers to catch up")
    ap.add_argument("--snapshot-every", default="1s", help="evaluator snapshots (cluster.snapshot_every; 0 = off)")
    args = ap.parse_args()
    os.environ["CALMON_SNAPSHOT_EVERY"] = args.snapshot_every
    import tempfile

    t0 = time.monotonic()
    records, n_bad = make_traffic(args.events, args.seed)
    work = Path(tempfile.mkdtemp(prefix="calmon-cluster-"))
    ref = file_reference(work, records)
    checked = check_reference(work, records)
    print(json.dumps({"records": len(records), "malformed": n_bad, "work": str(work),
                      "reference_seconds": round(time.monotonic() - t0, 1)}), flush=True)
    rows = []
    for trial in range(args.trials):
        with KafkaBroker() as broker:
            broker.create_topic(TOPIC, partitions=PARTITIONS)
            run = cluster_run(work / f"trial{trial}", broker, records, np.random.default_rng(args.seed + trial),
                              timeout=args.timeout)
        res = check(ref, run, records, n_bad, checked)
        res.update(trial=trial, identical=identical(res) and run["states_in_order"], records=len(records),
                   kills=run["kills"], zombie=run["zombie"],
                   removed=run.get("removed"), seconds=round(run["seconds"], 1), delta_records=run["delta_records"],
                   restore_seconds=run["restore_seconds"], snapshots=run["snapshots"],
                   cpu_seconds={k: round(v, 1) for k, v in run["cpu"].items()})
        rows.append(res)
        print(json.dumps(res), flush=True)
    print(json.dumps({"summary": {
        "trials": len(rows), "identical": sum(r["identical"] for r in rows), "records": len(records),
        "kills": sum(len(r["kills"]) for r in rows), "seconds": [r["seconds"] for r in rows],
        "restore_seconds_max": max((max(r["restore_seconds"].values(), default=0.0) for r in rows), default=None),
        "fenced": sum(r["fenced"] for r in rows), "errors": sum(r["errors"] for r in rows)}}),
        flush=True)
    return 0 if all(r["identical"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())


@pytest.mark.integration
def test_ingest_worker_started_before_its_broker_waits_for_it(tmp_path):
    """`calmon run --role ingest` with the broker down: serves /healthz, /readyz false, logs its retries; once the
    broker is up it connects, becomes ready and processes ranges (it used to exit 2)."""
    require_broker()
    from kafka_broker import free_port

    port = free_port()
    boot = f"127.0.0.1:{port}"
    cfg = write_config(tmp_path, source="kafka", bootstrap=boot)
    w = Worker(cfg, "ingest", "ingest-early")
    try:
        w.wait_serving()
        wait_until(lambda: "cannot start (attempt 2)" in w.log.read_text(), 60, "a logged retry", [w])
        assert w.get("/healthz")[0] == 200 and w.get("/readyz")[0] == 503
        records, _ = make_traffic(300, models=3)
        with KafkaBroker(port=port) as broker:
            broker.create_topic(TOPIC, partitions=PARTITIONS)
            produce(boot, records)
            wait_until(lambda: w.get("/readyz")[0] == 200, 120, "ready", [w])
            wait_until(lambda: sum(w.metric("calmon_cluster_records_total").values()) == len(records), 120,
                       "every record ingested", [w], lambda: w.metric("calmon_cluster_records_total"))
            assert w.term() == 0
    finally:
        if w.alive():
            w.kill()


@pytest.mark.integration
def test_a_new_owner_fences_the_old_one_and_restores_read_only_committed_states():
    """Two producers of one input partition's transactional id (#33.2): the second ``init_transactions`` fences
    the first (its next range fails with ``Fenced`` and writes nothing); a range commits its state and the consumed
    offset together; the restore reads committed states only, waits for a transaction still open, and takes the
    largest offset."""
    require_broker()
    import threading

    from calmon.cluster.topics import PartitionState, StateStore, ensure_topics
    from calmon.cluster.transactions import Fenced, PartitionProducer
    from calmon.events.decoder import Decoder
    from calmon.state.join import Joiner
    with KafkaBroker() as broker:
        boot = broker.bootstrap
        ensure_topics(boot, {}, {"deltas": (2, {}), "states": (2, {}), "events": (2, {})})
        join, decoder = Joiner(3600.0, 1000).to_dict(), Decoder().state()  # (a state's documents must be valid)

        def rng(p: PartitionProducer, key: str, off: int) -> None:
            p.commit_range({"deltas": [(b"m", b"d%d" % off)],
                            "states": [(key.encode(), PartitionState(key, off, join, decoder, "w").to_bytes())]}, off)

        old = PartitionProducer(boot, {}, "grp", "events/0")
        rng(old, "events/0", 100)
        rng(old, "events/0", 180)
        new = PartitionProducer(boot, {}, "grp", "events/0")  # the partition moved: the old owner is fenced
        with pytest.raises(Fenced):
            rng(old, "events/0", 250)
        rng(new, "events/0", 200)
        other = PartitionProducer(boot, {}, "grp", "events/1")
        kp = other.producer
        kp.begin_transaction()  # a range of another partition still open while the restore reads
        kp.send("states", key=b"events/1", value=PartitionState("events/1", 7, join, decoder, "w").to_bytes())
        kp.flush()
        states = StateStore(boot, "states", {})
        threading.Timer(1.0, kp.commit_transaction).start()
        t0 = time.monotonic()
        got = states.load(["events/0", "events/1", "events/2"])
        assert time.monotonic() - t0 >= 0.8  # it waited for the open transaction instead of skipping it
        assert {k: v.offset for k, v in got.items()} == {"events/0": 200, "events/1": 7}
        from kafka import KafkaConsumer, TopicPartition
        c = KafkaConsumer(bootstrap_servers=boot, group_id="grp", enable_auto_commit=False)
        assert [c.committed(TopicPartition("events", p), timeout_ms=3000) for p in (0, 1)] == [200, None]
        c.close(autocommit=False)
        for p in (old, new, other):
            p.close()
        states.close()


@pytest.mark.integration
def test_an_aborted_range_never_reaches_the_evaluator_even_where_the_broker_returns_it(tmp_path):
    """#33.2: Tansu 0.6 returns the records of aborted transactions to ``read_committed`` readers (no aborted list
    in its fetch responses).  The evaluator's delta reader holds a transaction's records until its control batch
    and drops them on ABORT (``connectors/kafka/committed.py``), so the range-end rule no longer carries the
    exactness: here a leaked range ``[0, 40)`` cut by ``cluster.linger`` is aborted, then the new owner commits a
    differently cut range ``[0, 100)`` of the same records -- the end 100 is past 40, so the range-end rule alone
    would merge both and count the first 40 records twice (the double count docs/cluster.md used to name)."""
    require_broker()
    from calmon.cluster.partition import PartitionIngest
    from calmon.cluster.topics import Range, ensure_topics
    from calmon.cluster.transactions import PartitionProducer
    from calmon.config import load_config
    from connectors.base import Batch

    records, _ = make_traffic(400, models=3, partitions=1, bad_rate=0.0)
    values = [v for _, _, v in records][:100]
    with KafkaBroker() as broker:
        boot = broker.bootstrap
        cfg = write_config(tmp_path / "eval", source="kafka", bootstrap=boot)
        evaluator_client_fix(cfg)
        conf = load_config(cfg)
        cl = conf.cluster
        ensure_topics(boot, {}, {cl.deltas_topic: (DELTA_PARTITIONS, {}), cl.state_topic: (1, {}),
                                 TOPIC: (1, {})})

        def deltas(end: int) -> list[Any]:
            part = PartitionIngest(conf, f"{TOPIC}/0", "events", None)
            batch = Batch(values[:end], {f"{TOPIC}/0": end}, "events", [f"{TOPIC}/0@{i}" for i in range(end)])
            return part.apply(batch, Range(f"{TOPIC}/0", 0, end, 1767225600.0, "w")).deltas

        leaked, replacement = deltas(40), deltas(100)
        txn = PartitionProducer(boot, {}, cl.ingest_group, f"{TOPIC}/0")
        kp = txn.producer
        kp.begin_transaction()  # the leaked range: written, acknowledged, then aborted (as a fencing would)
        for d in leaked:
            kp.send(cl.deltas_topic, key=d.model.encode(), value=d.to_bytes())
        kp.flush()
        kp.abort_transaction()
        txn.commit_range({cl.deltas_topic: [(d.model.encode(), d.to_bytes()) for d in replacement]}, 100)
        txn.close()
        want_ends = count_topic(boot, cl.deltas_topic)
        w = Worker(cfg, "evaluate", "eval")
        try:
            w.wait_serving()

            def read_all() -> bool:
                pos = {re.search(r'partition="[^"]*/(\d+)"', k).group(1): v  # type: ignore[union-attr]
                       for k, v in w.metric("calmon_cluster_position").items()}
                return w.get("/readyz")[0] == 200 and all(
                    pos.get(str(p), 0) >= e - 1 for p, e in want_ends.items() if e)

            wait_until(read_all, 120, "the evaluator to read every delta", [w],
                       lambda: (want_ends, w.metric("calmon_cluster_position")))
            wait_until(lambda: sum(w.metric("calmon_cluster_deltas_read_total").values()) >= len(replacement),
                       60, "the committed deltas merged", [w])
            aborted = sum(w.metric("calmon_cluster_aborted_records_total").values())
            assert w.term() == 0
        finally:
            if w.alive():
                w.kill()
    dump = json.loads((tmp_path / "eval" / "state" / "owned-state.json").read_text())
    got = {(m, k): n for m, k, n in dump["counters"]["events"]}
    want: dict[tuple[str, str], int] = {}
    for d in replacement:
        for k, n in d.events.items():
            want[(d.model, k)] = want.get((d.model, k), 0) + n
    assert got == want  # the committed range once, nothing of the aborted one
    assert sorted(e for _s, _m, e in dump["applied"]) == [100] * len(replacement)
    assert aborted == len(leaked)  # read from the broker and dropped by its ABORT marker


@pytest.mark.integration
def test_a_zombies_dead_letters_are_aborted_with_its_range(tmp_path):
    """#33.2: a zombie that resumes mid-range after its partition moved used to write the range's dead letters
    (outside the transaction) before its commit was fenced: 210 letters for 200 malformed records in the kill
    test.  With a Kafka sink the letters are now in the range's transaction, so the zombie's are aborted with it
    and a ``read_committed`` reader sees each letter once (the new owner's); with a file sink they are written
    only after the commit, so the zombie writes none."""
    require_broker()
    from calmon.agent.build import build_dead_letter
    from calmon.cluster.ingest import IngestWorker
    from calmon.cluster.partition import PartitionIngest
    from calmon.cluster.topics import Range, TopicReader, ensure_topics
    from calmon.cluster.transactions import Fenced, PartitionProducer
    from calmon.config import load_config
    from connectors.base import Batch
    from connectors.deadletter import FileDeadLetterSink

    records, _ = make_traffic(300, models=3, partitions=1, bad_rate=0.0)
    values = [v for _, _, v in records][:100] + [b"garbage %d" % i for i in range(10)]
    with KafkaBroker() as broker:
        boot = broker.bootstrap
        conf = load_config(write_config(tmp_path / "w", source="kafka", bootstrap=boot))
        cl = conf.cluster
        ensure_topics(boot, {}, {cl.deltas_topic: (2, {}), cl.state_topic: (2, {}), TOPIC: (2, {}), "dlq": (2, {})})

        def applied(key: str) -> tuple[PartitionIngest, Any, Range]:
            part = PartitionIngest(conf, key, "events", None)
            rng = Range(key, 0, len(values), 1767225600.0, "w")
            batch = Batch(values, {key: len(values)}, "events", [f"{key}@{i}" for i in range(len(values))])
            return part, part.apply(batch, rng), rng

        def worker(key: str, sink: Any) -> IngestWorker:
            w = IngestWorker(conf)
            w.dead_letter = sink
            w.txns[key] = PartitionProducer(boot, {}, cl.ingest_group, key)  # the second one fences the first
            return w

        files = {}
        for key, kind in ((f"{TOPIC}/0", "kafka"), (f"{TOPIC}/1", "file")):
            sinks = [build_dead_letter(conf) if kind == "kafka"
                     else FileDeadLetterSink(files.setdefault(n, tmp_path / n))
                     for n in ("zombie.jsonl", "owner.jsonl")]
            zombie = worker(key, sinks[0])
            owner = worker(key, sinks[1])  # the partition moved while the zombie was paused
            owner._complete(*applied(key))
            with pytest.raises(Fenced):  # the zombie resumes mid-range: it applied the range, then writes it
                zombie._complete(*applied(key))
            for w in (zombie, owner):
                w.close()

        origins: list[str] = []
        reader = TopicReader(boot, "dlq", {})
        reader.read_all(lambda r: origins.append(dict(r.headers)["calmon-origin"].decode()))
        reader.close()
    want = [f"{TOPIC}/0@{i}" for i in range(100, 110)]
    assert sorted(origins) == want  # read_committed: the owner's letters once, none of the zombie's
    assert [json.loads(x)["origin"] for x in files["owner.jsonl"].read_text().splitlines()] == [
        f"{TOPIC}/1@{i}" for i in range(100, 110)]
    assert files["zombie.jsonl"].read_text() == ""


@pytest.mark.integration
def test_the_end_of_an_input_partition_is_the_fetched_one_where_list_offsets_answers_a_floor():
    """Tansu 0.6 answers ListOffsets with the base offset of the last batch + 1: 1 for 50 records in one batch.  A
    restore checks states against the end a fetch reports (``TopicReader.fetched_ends``), so a valid state past the
    floor is not skipped as ``beyond_end`` (which restored an older state and committed its ranges twice)."""
    require_broker()
    from kafka import KafkaProducer

    from calmon.cluster.topics import TopicReader

    with KafkaBroker() as broker:
        broker.create_topic("in", partitions=1)
        broker.create_topic("st", partitions=1)
        p = KafkaProducer(bootstrap_servers=broker.bootstrap, linger_ms=200, batch_size=1 << 20)
        for i in range(50):
            p.send("in", b"x%d" % i, partition=0)
        p.flush()
        p.close()
        reader = TopicReader(broker.bootstrap, "st", {})
        try:
            floor = reader.end_offsets(["in/0"])
            assert floor["in/0"] <= 50
            assert reader.fetched_ends(floor) == {"in/0": 50}
        finally:
            reader.close()


def test_a_second_read_of_the_state_topic_reads_to_its_end_of_now_not_of_the_last_read():
    """#33.2: kafka-python keeps the high watermark of a partition's last fetch across seeks; the state restore took
    it as the end of the topic when the first poll after its seek returned before a fetch (a worker resumed from a
    long pause), so it stopped at the end of its *previous* read and missed every later state: a zombie restored
    three partitions at offset 0 and replayed them (a 1e5-event SIGKILL trial, counts and dead letters doubled)."""
    require_broker()
    from kafka import KafkaProducer

    from calmon.cluster.topics import TopicReader, ensure_topics
    with KafkaBroker() as broker:
        boot = broker.bootstrap
        ensure_topics(boot, {}, {"st": (1, {})})
        kp = KafkaProducer(bootstrap_servers=boot)
        for i in range(3):
            kp.send("st", key=b"old", value=b"%d" % i)
        kp.flush()
        reader = TopicReader(boot, "st", {})
        first: list[bytes] = []
        reader.read_all(lambda r: first.append(r.value))
        assert len(first) == 3
        for i in range(700):  # more than one poll returns (max_poll_records 500), the wanted record last
            kp.send("st", key=b"other", value=b"%d" % i)
        kp.send("st", key=b"wanted", value=b"x")
        kp.flush()
        kp.close()
        poll, calls = reader.consumer.poll, []

        def slow_first_poll(*a: Any, **k: Any) -> Any:  # the first poll after the seek returns before any fetch
            calls.append(1)
            return {} if len(calls) == 1 else poll(*a, **k)

        reader.consumer.poll = slow_first_poll
        keys: list[bytes] = []
        reader.read_all(lambda r: keys.append(r.key))
        reader.close()
    assert len(keys) == 704 and keys[-1] == b"wanted"
