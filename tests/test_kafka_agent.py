"""End to end over Kafka: `calmon run` consuming a topic of a real broker (Tansu) must count every valid event
exactly once -- the same state as the agent on the same events read from a file -- dead-letter every malformed
record exactly once with its reason, survive SIGKILLs at random moments and a broker outage.

Input: binary predictions with outcomes delayed (exponential, mean 20 s) and out of order, plus labeled
events, 1% malformed records of several kinds, on one partition (one total order, so that every run sees
the events in the same order and the final states must be identical bit for bit).

CI runs a reduced version (env CALMON_KAFKA_E2E_EVENTS, CALMON_KAFKA_E2E_TRIALS, CALMON_KAFKA_OUTAGE);
the full one is

    python tests/test_kafka_agent.py --events 1000000 --trials 5 --outage 30

which prints one line per run and a summary table.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

from cluster_compare import strip_samples  # noqa: E402  -- reservoirs reduced to their counts
from kafka_broker import KafkaBroker, require_broker  # noqa: E402
from test_agent_crash import compare  # noqa: E402  -- first difference between two JSON trees

TOPIC = "events"
# Tansu completes group joins only after the rebalance timeout (= max_poll_interval_ms); the agent's batches
# must be processed well within it, hence batch_size 4096 below.
FAST = {"max_poll_interval_ms": 3000, "session_timeout_ms": 3000, "heartbeat_interval_ms": 300}
BAD_KINDS = [
    b"garbage %d",
    b'{"type": "prediction", "id": "bad-%d", "model": "fraud", "score": 1.5}',
    b'["not", "an", "object", %d]',
    b'{"type": "outcome", "id": "bad-%d", "model": "fraud"}',
    b'{"type": "labeled", "model": "fraud", "score": "high", "label": 1, "n": %d}',
]


def calmon_cmd(*args: str) -> list[str]:
    try:
        from calmon.cli import COMMANDS
        if "run" in COMMANDS:
            return [sys.executable, "-m", "calmon", *args]
    except ImportError:
        pass
    return [sys.executable, "-m", "calmon.commands.run", *args[1:]]


def make_lines(predictions: int, seed: int = 0, bad_rate: float = 0.01) -> tuple[list[bytes], int]:
    """Half labeled events, half delayed prediction/outcome pairs, ``bad_rate`` malformed records.

    Returns the records and the number of malformed ones (one reason code per kind, in turn).
    """
    from connectors.simulation import SimulationSpec, Simulator
    half = predictions // 2
    lab = Simulator(SimulationSpec(model="fraud", seed=seed, rate=100.0, segments=["web", "app"]))
    pairs = Simulator(
        SimulationSpec(model="risk", seed=seed + 1, rate=100.0, delay=20.0, segments=["web", "app"])
    )
    lines: list[bytes] = []
    done = 0
    while done < half:
        m = min(20000, half - done)
        lines += lab.batch(m) + pairs.batch(m)
        done += m
    lines += pairs.flush()
    rng = np.random.default_rng(seed)
    n_bad = int(round(bad_rate * len(lines)))
    where = np.sort(rng.choice(len(lines) + n_bad, size=n_bad, replace=False))
    out: list[bytes] = []
    src = iter(lines)
    bad_at = set(where.tolist())
    k = 0
    for i in range(len(lines) + n_bad):
        if i in bad_at:
            out.append(BAD_KINDS[k % len(BAD_KINDS)] % k)
            k += 1
        else:
            out.append(next(src))
    return out, n_bad


def produce(bootstrap: str, lines: list[bytes]) -> None:
    from kafka import KafkaProducer

    p = KafkaProducer(bootstrap_servers=bootstrap, linger_ms=20, batch_size=1 << 20, max_request_size=1 << 24)
    for line in lines:
        p.send(TOPIC, line, partition=0)
    p.flush(timeout=600)
    p.close()


def write_config(
    directory: Path,
    *,
    source: str,
    bootstrap: str = "",
    group: str = "",
    events: Path | None = None,
    dlq: str = "",
) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    if source == "file":
        src = f"[{{name: events, path: {events}}}]"
        dead = "{type: file, path: deadletter.jsonl}"
    else:
        opts = {
            "bootstrap_servers": bootstrap,
            "topic": TOPIC,
            "group_id": group,
            "client": FAST,
            "backoff_initial": 0.2,
            "backoff_max": 2.0,
        }
        src = f"[{{name: events, type: kafka, options: {json.dumps(opts)}}}]"
        dead = f"{{type: kafka, options: {json.dumps({'bootstrap_servers': bootstrap, 'topic': dlq})}}}"
    cfg = directory / "calmon.yaml"
    cfg.write_text(f"""
state_dir: {directory / "state"}
sources: {src}
dead_letter: {dead}
models: {{default: {{bins: 1024, reservoir: 64, segments: [web]}}}}
join: {{ttl: 30s, max_pending: 5000}}
windows: {{names: [5m, 1h, all], allowed_lateness: 10m,
          tiers: [{{width: 1m, count: 10}}, {{width: 10m, count: 6}}, {{width: 1h, count: 2}}]}}
evaluation: {{every: 1h, tests: []}}
exporter: {{port: 0}}
checkpoint: {{every: 0.2s}}
ingest: {{batch_size: 4096, exit_when_done: {"true" if source == "file" else "false"}}}
""")
    return cfg


def final_state(directory: Path) -> dict[str, Any]:
    """The last checkpoint's state without what legitimately differs (times, batch counts, reservoir rows)."""
    from calmon.state.checkpoint.store import CheckpointStore
    ck = sorted((directory / "state" / "checkpoints").glob("checkpoint-*.json"))[-1]
    # buckets are blob references into pack files (incremental checkpoints): compare their contents
    state = CheckpointStore(ck.parent).inline(json.loads(ck.read_text())["state"])
    state.pop("created", None)
    state["counters"].pop("batches", None)

    return strip_samples(state)


def committed(bootstrap: str, group: str) -> int | None:
    from kafka import KafkaConsumer, TopicPartition
    from kafka.errors import KafkaError

    try:
        c = KafkaConsumer(
            bootstrap_servers=bootstrap, group_id=group, enable_auto_commit=False, bootstrap_timeout_ms=2000
        )
    except (KafkaError, OSError):  # broker unreachable right now
        return None
    try:
        return c.committed(TopicPartition(TOPIC, 0), timeout_ms=3000)
    except (KafkaError, OSError):
        return None
    finally:
        c.close(autocommit=False)


def dead_letters(bootstrap: str, topic: str) -> list[tuple[bytes, str, str]]:
    """Every dead letter of ``topic`` in offset order, read up to the high watermark of the latest fetch.

    An idle-poll cut-off is not enough on a loaded machine: a fresh consumer's first polls can come back
    empty while it connects, and the read would end early with some or all letters missing.
    """
    from connectors.kafka.admin import scan_topic
    out: list[tuple[bytes, str, str]] = []

    def visit(r: Any) -> None:
        h = {k: v.decode() for k, v in r.headers}
        out.append((r.value, h["calmon-reason"], h.get("calmon-origin", "")))

    scan = scan_topic(bootstrap, topic, {}, visit, timeout=120.0, connect_timeout=10.0)
    assert scan.complete, f"dead-letter topic {topic} not read to its end within 120 s"
    return out


class AgentProc:
    """`calmon run` as a subprocess, stderr to a file; ``url`` once it serves."""

    def __init__(self, cfg: Path) -> None:
        self.cfg = cfg
        self.log = cfg.parent / f"agent-{time.monotonic_ns()}.log"
        self._f = open(self.log, "w")  # noqa: SIM115
        self.proc = subprocess.Popen(
            calmon_cmd("run", "-c", str(cfg), "--log-level", "WARNING"),
            stderr=self._f,
            stdout=subprocess.DEVNULL,
            cwd=ROOT,
        )
        self.url: str | None = None

    def wait_serving(self, timeout: float = 60.0) -> str:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for line in self.log.read_text().splitlines():
                if "serving" in line:
                    self.url = line.split("serving", 1)[1].strip().removesuffix("/metrics")
                    return self.url
            if self.proc.poll() is not None:
                raise AssertionError(f"agent exited {self.proc.returncode}: {self.log.read_text()[-2000:]}")
            time.sleep(0.05)
        raise AssertionError(f"agent not serving after {timeout} s: {self.log.read_text()[-2000:]}")

    def kill(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()
        self._f.close()

    def term(self, timeout: float = 15.0) -> float:
        """SIGTERM; return the seconds until exit (asserting exit code 0)."""
        t0 = time.monotonic()
        self.proc.send_signal(signal.SIGTERM)
        rc = self.proc.wait(timeout=timeout)
        self._f.close()
        assert rc == 0, self.log.read_text()[-2000:]
        return time.monotonic() - t0


def checkpointed(directory: Path) -> int:
    """Offset of the topic's partition in the agent's latest checkpoint (0 before the first one)."""
    for ck in sorted((directory / "state" / "checkpoints").glob("checkpoint-*.json"), reverse=True):
        try:
            return int(json.loads(ck.read_text())["state"]["sources"]["events"].get(f"{TOPIC}/0", 0))
        except (OSError, ValueError, KeyError):
            continue  # pruned or being replaced meanwhile
    return 0


def wait_consumed(directory: Path, n: int, proc: AgentProc, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if checkpointed(directory) == n:
            return
        assert proc.proc.poll() is None, f"agent died: {proc.log.read_text()[-2000:]}"
        time.sleep(0.2)
    raise AssertionError(f"the agent did not checkpoint offset {n} within {timeout} s")


def kafka_run(
    work: Path,
    name: str,
    bootstrap: str,
    n: int,
    *,
    rng: np.random.Generator | None = None,
    max_kill_delay: float = 0.0,
    kills_wanted: int = 0,
    outage: tuple[KafkaBroker, float] | None = None,
    timeout: float = 600.0,
) -> dict[str, Any]:
    """Run the agent on the topic until everything is checkpointed, with SIGKILLs or a broker outage."""
    d = work / name
    cfg = write_config(d, source="kafka", bootstrap=bootstrap, group=f"g-{name}", dlq=f"dlq-{name}")
    kills, mid, t0 = 0, 0, time.monotonic()
    info: dict[str, Any] = {"name": name}
    while True:
        agent = AgentProc(cfg)
        try:
            url = agent.wait_serving()
            t_serving = time.monotonic()
            if kills < kills_wanted:
                # each restart resumes mid-stream: later kills come sooner, so that most hit the stream
                time.sleep(float(rng.uniform(0.0, max_kill_delay / 2**kills)))
                mid_stream = checkpointed(d) != n
                agent.kill()
                kills += 1
                mid += mid_stream
                continue
            if outage is not None:
                info.update(outage_check(agent, url, *outage))
            wait_consumed(d, n, agent, timeout)
            info["ingest_seconds"] = time.monotonic() - t_serving
            info["term_seconds"] = agent.term()
            info["committed"] = committed(bootstrap, f"g-{name}")  # offsets follow the checkpoints to Kafka
            break
        finally:
            if agent.proc.poll() is None:  # a failure above: never leave an agent behind
                agent.kill()
    info.update(
        kills=kills,
        kills_mid_stream=mid,
        seconds=time.monotonic() - t0,
        state=final_state(d),
        dead=dead_letters(bootstrap, f"dlq-{name}"),
    )
    return info


def outage_check(agent: AgentProc, url: str, broker: KafkaBroker, seconds: float) -> dict[str, Any]:
    """Cut the broker off for ``seconds`` while scraping /metrics every 0.25 s (and /readyz)."""
    deadline = time.monotonic() + 60
    while checkpointed(agent.cfg.parent) == 0 and time.monotonic() < deadline:  # cut mid-stream
        time.sleep(0.05)
    results: list[int] = []
    ready: list[int] = []
    stop = threading.Event()

    def scrape() -> None:
        while not stop.is_set():
            for path, sink in (("/metrics", results), ("/readyz", ready)):
                try:
                    with urllib.request.urlopen(url + path, timeout=2) as r:
                        sink.append(r.status)
                except urllib.error.HTTPError as e:
                    sink.append(e.code)
                except (OSError, http.client.HTTPException):  # refused, reset or cut mid-response
                    sink.append(0)
            time.sleep(0.25)

    t = threading.Thread(target=scrape)
    t.start()
    at = checkpointed(agent.cfg.parent)
    broker.cut()
    time.sleep(seconds)
    alive_during = agent.proc.poll() is None
    ready_during = list(ready)
    broker.heal()
    t_heal = time.monotonic()
    n_ready = len(ready)
    ready_again = None
    while time.monotonic() - t_heal < 30 and ready_again is None:
        if 200 in ready[n_ready:]:
            ready_again = time.monotonic() - t_heal
        time.sleep(0.1)
    stop.set()
    t.join()
    return {
        "ready_again_seconds": ready_again,
        "outage_at_offset": at,
        "outage_seconds": seconds,
        "scrapes": len(results),
        "scrapes_ok": sum(s == 200 for s in results),
        "alive_during_outage": alive_during,
        "ready_codes_during_outage": sorted(set(ready_during)),
    }


def file_reference(work: Path, lines: list[bytes]) -> dict[str, Any]:
    d = work / "file-reference"
    d.mkdir(parents=True)
    events = d / "events.jsonl"
    events.write_bytes(b"\n".join(lines) + b"\n")
    cfg = write_config(d, source="file", events=events)
    p = subprocess.run(
        calmon_cmd("run", "-c", str(cfg), "--log-level", "WARNING"),
        capture_output=True,
        text=True,
        timeout=900,
        cwd=ROOT,
    )
    assert p.returncode == 0, p.stderr[-2000:]
    dead = [json.loads(x) for x in (d / "state" / "deadletter.jsonl").read_text().splitlines()]
    return {"state": final_state(d), "dead": [(x["record"].encode(), x["reason"]) for x in dead]}


def comparable(state: dict[str, Any]) -> dict[str, Any]:
    """What must agree between a file run and a Kafka run (positions differ; a file run ends with a sweep)."""
    return {
        "models": state["models"],
        "events": state["counters"]["events"],
        "rejected": state["counters"]["rejected"],
        "decoder": state["decoder"],
    }


def run_all(
    work: Path, predictions: int, trials: int, outage: float, seed: int = 0, verbose: bool = False
) -> dict[str, Any]:
    lines, n_bad = make_lines(predictions, seed)
    n = len(lines)
    out: dict[str, Any] = {"records": n, "malformed": n_bad, "runs": []}

    def report(r: dict[str, Any]) -> None:
        out["runs"].append({k: v for k, v in r.items() if k not in ("state", "dead")})
        if verbose:
            print(json.dumps(out["runs"][-1]), flush=True)

    with KafkaBroker(proxy=True) as broker:
        broker.create_topic(TOPIC, partitions=1)
        t0 = time.monotonic()
        produce(broker.bootstrap, lines)
        out["produce_seconds"] = time.monotonic() - t0
        fref = file_reference(work, lines)
        ref = kafka_run(work, "reference", broker.bootstrap, n)
        ref["identical_to_file_run"] = compare(comparable(fref["state"]), comparable(ref["state"]))
        ref["dead_letters"] = len(ref["dead"])
        ref["dead_letters_match_file_run"] = sorted((v, r) for v, r, _ in ref["dead"]) == sorted(fref["dead"])
        report(ref)
        out["reference"] = ref
        rng = np.random.default_rng(seed)
        for trial in range(trials):
            r = kafka_run(
                work,
                f"trial{trial}",
                broker.bootstrap,
                n,
                rng=rng,
                max_kill_delay=max(0.5, 1.2 * ref["ingest_seconds"]),
                kills_wanted=3,
            )
            r["difference"] = compare(ref["state"]["models"], r["state"]["models"]) or compare(
                {k: v for k, v in ref["state"].items() if k != "dead_letter"},
                {k: v for k, v in r["state"].items() if k != "dead_letter"},
            )
            r["dead_letters_identical"] = [x[:2] for x in r["dead"]] == [x[:2] for x in ref["dead"]]
            r["dead_letters_diff"] = letters_diff(ref["dead"], r["dead"])
            report(r)
        if outage > 0:
            r = kafka_run(work, "outage", broker.bootstrap, n, outage=(broker, outage))
            r["difference"] = compare(
                {k: v for k, v in ref["state"].items() if k != "dead_letter"},
                {k: v for k, v in r["state"].items() if k != "dead_letter"},
            )
            r["dead_letters_identical"] = [x[:2] for x in r["dead"]] == [x[:2] for x in ref["dead"]]
            r["dead_letters_diff"] = letters_diff(ref["dead"], r["dead"])
            report(r)
    return out


def letters_diff(ref: list[tuple[bytes, str, str]], run: list[tuple[bytes, str, str]]) -> dict[str, Any] | None:
    """How a run's dead letters differ from the reference's (None: identical, in the same order)."""
    a, b = [x[:2] for x in ref], [x[:2] for x in run]
    if a == b:
        return None
    from collections import Counter
    ca, cb = Counter(a), Counter(b)
    first = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
    return {"reference": len(a), "run": len(b), "duplicated": sum((cb - ca).values()),
            "missing": sum((ca - cb).values()), "first_difference": first,
            "origins_there": [x[2] for x in run[max(0, first - 2):first + 3]]}


@pytest.mark.integration
@pytest.mark.slow
def test_agent_over_kafka_exactly_once_sigkill_and_outage(tmp_path):
    require_broker()
    predictions = int(os.environ.get("CALMON_KAFKA_E2E_EVENTS", "20000"))
    trials = int(os.environ.get("CALMON_KAFKA_E2E_TRIALS", "2"))
    outage = float(os.environ.get("CALMON_KAFKA_OUTAGE", "6"))
    out = run_all(tmp_path, predictions, trials, outage)
    ref = out["reference"]
    assert ref["identical_to_file_run"] is None, ref["identical_to_file_run"]
    assert ref["dead_letters"] == out["malformed"] and ref["dead_letters_match_file_run"]
    rejected = ref["state"]["counters"]["rejected"]
    assert sum(rejected.values()) == out["malformed"] and len(rejected) == len(BAD_KINDS)
    assert ref["term_seconds"] < 10  # SIGTERM: checkpoint, then exit within a few seconds
    assert ref["committed"] == out["records"]  # the last checkpoint's offsets were committed to the group
    runs = out["runs"][1:]
    trial_runs = [r for r in runs if r["name"].startswith("trial")]
    assert sum(r["kills"] for r in trial_runs) == 3 * trials
    assert sum(r["kills_mid_stream"] for r in trial_runs) >= 1  # at least one SIGKILL hit the stream
    for r in runs:
        assert r["difference"] is None, (r["name"], r["difference"])
        assert r["dead_letters_identical"], (r["name"], r["dead_letters_diff"])
    if outage > 0:
        o = runs[-1]
        assert o["alive_during_outage"] and o["scrapes"] >= outage * 2
        assert o["scrapes_ok"] == o["scrapes"], o  # /metrics answered throughout the outage
        assert 503 in o["ready_codes_during_outage"], o  # readiness reported the broker outage
        assert o["ready_again_seconds"] is not None, o  # ... and recovered after it


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument(
        "--events", type=int, default=1_000_000, help="predictions (plus outcomes, ~1%% malformed)"
    )
    ap.add_argument("--trials", type=int, default=5)
    ap.add_argument("--outage", type=float, default=30.0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--workdir", default=None)
    args = ap.parse_args()
    import tempfile

    work = Path(args.workdir or tempfile.mkdtemp(prefix="calmon-kafka-e2e-"))
    out = run_all(work, args.events, args.trials, args.outage, args.seed, verbose=True)
    ref = out["reference"]
    runs = out["runs"][1:]
    print(
        f"\nrecords {out['records']} ({out['malformed']} malformed), "
        f"produced in {out['produce_seconds']:.1f} s; reference run {ref['seconds']:.1f} s, "
        f"identical to the file run: {ref['identical_to_file_run'] is None}, "
        f"dead letters {ref['dead_letters']} (match file run: {ref['dead_letters_match_file_run']})"
    )
    print(
        "| run | SIGKILLs (mid-stream) | seconds | identical state | identical dead letters | outage |\n"
        "|---|---|---|---|---|---|"
    )
    for r in runs:
        again = r.get("ready_again_seconds")
        again = "never" if again is None else f"{again:.1f} s"
        o = (
            f"{r['outage_seconds']:.0f} s: /metrics {r['scrapes_ok']}/{r['scrapes']} ok, /readyz codes "
            f"{r['ready_codes_during_outage']}, ready again {again} after heal"
            if "outage_seconds" in r
            else ""
        )
        print(
            f"| {r['name']} | {r['kills']} ({r['kills_mid_stream']}) | {r['seconds']:.1f} | "
            f"{r['difference'] is None} | {r['dead_letters_identical']} | {o} |"
        )
    ok = ref["identical_to_file_run"] is None and all(
        r["difference"] is None and r["dead_letters_identical"] for r in runs
    )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
