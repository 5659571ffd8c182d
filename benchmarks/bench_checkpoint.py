"""Benchmark: incremental checkpoints at M models x 3 rings -- lock hold, write, restore, against a full document.

For each M the script ingests live-like traffic (``--events`` labeled events over 1 h of event time, segments
``web``/``app`` allow-listed, default bins 1024 and reservoir 256) into an :class:`~calmon.state.agentstate.AgentState`,
then measures, interleaved over ``--rounds`` rounds (``min/median`` printed):

* **full**: the previous format's cost -- ``AgentState.to_doc()`` + JSON encoding, all under the lock;
* per generation: the longest single hold of the lock (the capture releases it every 20 ms), the ingestion
  thread's stall (the whole capture: copy-on-write claims on the changed buckets), and capture to commit;
* **first**: the first incremental generation (every bucket is new): lock hold, capture-to-commit, bytes;
* **one model**: a generation after 20 events of one model (the rest unchanged);
* **30 s live**: a generation after 30 s of event time of every model (each ring's current bucket changes);
* **restore**: loading the newest generation into a fresh state (``load_doc`` with the pack reader);
* **join copy**: the join buffers' copy under the lock with ``--pending`` predictions waiting.

    python -m benchmarks.bench_checkpoint --models 10,100,1000 --events 2e6 --pending 2e6
    python -m benchmarks.bench_checkpoint --quick

Run it under ``nice`` on a shared machine; the load average is printed with the table.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from calmon.config import build_config
from calmon.state.agentstate import AgentState
from calmon.state.checkpoint.incremental import Checkpointer, resolver
from calmon.state.checkpoint.store import CheckpointStore, encode
from calmon.state.ingest import Ingestor
from connectors.base import Batch

T0 = 1_767_225_600.0
HEAD = {"format": "calmon.agent_state", "version": 2, "created": 0.0, "sources": {"bench": 0}}


def _state(models: int, pending: int = 1_000_000) -> AgentState:
    return AgentState(build_config({
        "sources": [{"path": "unused"}], "limits": {"max_models": max(50, models), "max_join_bytes": 4 << 30},
        "join": {"max_pending": max(1, pending), "ttl": "1d"},
        "models": {"default": {"bins": 1024, "reservoir": 256, "segments": ["web", "app"]}}}, env={}))


def _records(models: int, n: int, t0: float, span: float, seed: int, only: int | None = None) -> list[bytes]:
    rng = np.random.default_rng(seed)
    z = rng.random(n)
    y = (rng.random(n) < z).astype(int)
    ts = t0 + np.sort(rng.random(n)) * span
    m = rng.integers(0, models, n) if only is None else np.full(n, only)
    seg = np.array(["web", "app", "other"])[rng.integers(0, 3, n)]
    return [b'{"model":"m%04d","ts":%.3f,"score":%.6f,"label":%d,"segment":"%s"}' % (m[i], ts[i], z[i], y[i],
                                                                                   seg[i].encode())
            for i in range(n)]


def _ingest(st: AgentState, records: list[bytes], batch: int = 65536) -> None:
    ing = Ingestor(st, None, lambda: T0 + 1e7)
    for i in range(0, len(records), batch):
        ing.ingest(Batch(records[i:i + batch], {}, "bench"))


def _generation(ck: Checkpointer, st: AgentState) -> dict[str, float]:
    t = time.perf_counter()
    ck.submit(ck.capture(st, dict(HEAD)))
    res = ck.wait()
    assert res is not None
    return {"lock": res.lock_seconds, "capture": res.capture_seconds, "total": time.perf_counter() - t,
            "bytes": res.bytes, "blobs": res.blobs}


def _full(st: AgentState) -> dict[str, float]:
    t = time.perf_counter()
    with st.lock:
        body = encode({**HEAD, **st.to_doc()})
    took = time.perf_counter() - t
    return {"lock": took, "capture": took, "total": took, "bytes": len(body), "blobs": 0}


def _restore(directory: Path, models: int) -> float:
    t = time.perf_counter()
    store = CheckpointStore(directory)
    doc = store.load()
    assert doc is not None
    st = _state(models)
    with store.reader() as reader:
        st.load_doc(doc, resolve=resolver(reader))
    return time.perf_counter() - t


def _join_copy(pending: int) -> dict[str, float]:
    """A generation of a state holding ``pending`` predictions (the join buffers dominate it)."""
    st = _state(1, pending)
    recs = [b'{"type":"prediction","id":"p%09d","model":"m0000","ts":%.1f,"score":0.5}' % (i, T0 + i * 1e-3)
            for i in range(pending)]
    _ingest(st, recs)
    with tempfile.TemporaryDirectory(prefix="calmon-bench-ck-") as tmp:
        gen = _generation(Checkpointer(CheckpointStore(tmp)), st)
    return {"pending": len(st.joiner.pending), **gen}


def bench(models: int, events: int, rounds: int) -> dict[str, Any]:
    """Every measurement of one M (``rounds`` fresh states, interleaved phases)."""
    out: dict[str, Any] = {k: [] for k in ("full", "first", "one model", "30 s live")}
    out["restore"] = []
    base = _records(models, events, T0, 3600.0, 0)
    for r in range(rounds):
        st = _state(models)
        _ingest(st, base)
        with tempfile.TemporaryDirectory(prefix="calmon-bench-ck-") as tmp:
            ck = Checkpointer(CheckpointStore(tmp))
            out["full"].append(_full(st))
            out["first"].append(_generation(ck, st))
            _ingest(st, _records(models, 20, T0 + 3000.0, 60.0, r + 1, only=1))
            out["one model"].append(_generation(ck, st))
            _ingest(st, _records(models, max(1000, events // 120), T0 + 3600.0, 30.0, r + 2))
            out["30 s live"].append(_generation(ck, st))
            out["restore"].append(_restore(Path(tmp), models))
        out["buckets"] = sum(r.bucket_count() for mw in st.models.values() for r in mw.rings.values())
    return out


def _cell(vals: list[float], fmt: str) -> str:
    if len(vals) == 1:
        return format(vals[0], fmt)
    return f"{format(min(vals), fmt)}/{format(statistics.median(vals), fmt)}"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", default="10,100,1000")
    ap.add_argument("--events", type=float, default=2e6)
    ap.add_argument("--pending", type=float, default=2e6)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--quick", action="store_true", help="10 models, 2e4 events, 1e4 pending, 1 round")
    a = ap.parse_args(argv)
    if a.quick:
        a.models, a.events, a.pending, a.rounds = "10", 2e4, 1e4, 1
    print(f"load {os.getloadavg()[0]:.1f}, {a.rounds} rounds (min/median)", flush=True)
    print("| models | buckets | phase | longest lock hold s | ingestion stall s | capture to commit s | written "
          "| blobs |")
    print("|---:|---:|---|---:|---:|---:|---:|---:|")
    for m in (int(x) for x in a.models.split(",")):
        res = bench(m, int(a.events), a.rounds)
        for phase in ("full", "first", "one model", "30 s live"):
            rows: list[dict[str, float]] = res[phase]
            written = statistics.median(r["bytes"] for r in rows) / 1e6
            print(f"| {m} | {res['buckets']} | {phase} | {_cell([r['lock'] for r in rows], '.3f')} | "
                  f"{_cell([r['capture'] for r in rows], '.3f')} | {_cell([r['total'] for r in rows], '.2f')} | "
                  f"{written:.1f} MB"
                  f" | {int(statistics.median(r['blobs'] for r in rows))} |", flush=True)
        restore: list[float] = res["restore"]
        print(f"| {m} | {res['buckets']} | restore | | | {_cell(restore, '.2f')} | | |", flush=True)
    if a.pending:
        j = _join_copy(int(a.pending))
        print(f"\njoin buffers: {j['pending']} pending, longest lock hold {j['lock']:.3f} s, ingestion stall "
              f"{j['capture']:.3f} s, capture to commit {j['total']:.2f} s ({j['bytes'] / 1e6:.0f} MB)")
    print(json.dumps({"peak_rss_mb": _peak_rss() / 1e6}))
    return 0


def _peak_rss() -> int:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmHWM:"))


if __name__ == "__main__":
    sys.exit(main())
