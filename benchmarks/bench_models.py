"""Benchmark: M binary models x 3 rings through the agent -- ingest, state, rounds, /metrics, checkpoints, restore.

Issue #15's table for M in 1, 10, 100, 1000, side by side with M = 1 measured in the same run.  Every M runs in
its own subprocess (so its peak RSS is its own) with the default configuration: bins 1024, reservoir 256, the
default tiers and testers (tcal, smce, ldtc), budget 30 s, segments ``web,app`` allow-listed (rings ``all``,
``web``, ``app``).  The traffic is generated in memory, deterministically from ``--seed``:

* **live-like**: ``--events`` predictions over 1 h of event time, each followed by its outcome after an
  exponential delay (mean 60 s), in arrival order;
* **replay**: ``--events`` labeled events over 8 days.

Each child ingests the live-like stream into one agent (rate and state size), then the replay stream into a fresh
agent on which it measures K evaluation rounds, a /metrics render, a checkpoint, a second checkpoint after a small
change, and a restore into a third agent in a fresh process, as after a restart (restore seconds: reading the
manifest and ``Agent.restore``; the peak RSS of that process when the agent is open).
``AgentState.lock`` is wrapped in a timing proxy so the longest hold of the lock inside a round and inside a
checkpoint is measured, whichever code takes it -- in wall time, and in brackets in the holding thread's CPU time
(on a loaded machine the wall time includes the time the holder waited preempted).  A window counts as
evaluated by a tester in a round when its result's ``evaluated_at`` is from that round (a window below
``min_events`` is evaluated too, without a p-value); a window whose statistics did not change since the previous
round (no event of its ring in that minute) keeps its evaluation, and is counted apart as *unchanged*.
M = 1 runs again at the end (interleaved), so the ratios use the median of the M = 1 runs; repeated cells print
``min/median``.  A restore time marked ``(!)`` means the restored buckets' event counts differ from the
checkpointed ones.

    python -m benchmarks.bench_models                              # M = 1, 10, 100, 1000 (1000 takes minutes)
    python -m benchmarks.bench_models --models 1,10,100 --events 3e5 --rounds 3
    python -m benchmarks.bench_models --quick                      # a smoke run (seconds)

Only public entry points are used (``Agent(cfg, sources)``, ``open``, ``ingest``, ``evaluate_round``,
``checkpoint``, ``metrics.render``, ``state.nbytes``), so the script works across internal rewrites.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from benchmarks._child import last_json, run_module

START = 1_767_225_600.0  # 2026-01-01: fixed, so the traffic is the same in every run
LIVE_SPAN, REPLAY_SPAN, LIVE_DELAY = 3600.0, 8 * 86400.0, 60.0
SEGMENTS = ("web", "app")
TESTERS = ("tcal", "smce", "ldtc")
COLUMNS = ("models", "rings", "live ev/s", "live ratio", "replay ev/s", "replay ratio", "state/ring live",
           "state/ring replay", "round s", "round lock max s (cpu)", "/metrics size / render s", "checkpoint s / bytes",
           "2nd checkpoint s / bytes", "checkpoint lock max s (cpu)", "restore s / peak RSS",
           "windows evaluated per round",
           "overruns", "peak RSS", "round CPU s", "windows deferred per round", "load")


# -- traffic -----------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Traffic:
    """A deterministic stream of ``events`` predictions of ``models`` binary models (see the module docstring).

    Examples
    --------
    >>> recs = list(Traffic("live", models=2, events=3, seed=1).records())
    >>> len(recs), sum(b'"type":"outcome"' in r for r in recs)
    (6, 3)
    >>> recs == list(Traffic("live", models=2, events=3, seed=1).records())
    True
    """

    kind: str
    models: int
    events: int
    seed: int
    #: Event time of the first prediction and the span of event time (default: the kind's).
    start: float = START
    span: float | None = None

    def _draws(self) -> tuple[np.ndarray, ...]:
        rng = np.random.default_rng([self.seed, self.models, 0 if self.kind == "live" else 1])
        n = self.events
        span = self.span or (LIVE_SPAN if self.kind == "live" else REPLAY_SPAN)
        ts = self.start + np.sort(rng.random(n)) * span
        model = rng.integers(self.models, size=n)
        seg = rng.integers(len(SEGMENTS), size=n)
        p = rng.beta(2.0, 2.0, n)
        label = (rng.random(n) < p).astype(np.int64)
        score = 1.0 / (1.0 + np.exp(-(np.log(p) - np.log1p(-p)) / 0.9))  # slightly overconfident
        return ts, model, seg, score, label, rng.exponential(LIVE_DELAY, n)

    def records(self) -> Iterator[bytes]:
        """JSON lines in arrival order (live: predictions and outcomes merged by event time)."""
        ts, model, seg, score, label, delay = self._draws()
        names = [f"model-{i:04d}" for i in range(self.models)]
        if self.kind != "live":
            for t, m, s, p, y in zip(ts.tolist(), model.tolist(), seg.tolist(), score.tolist(), label.tolist()):
                yield (f'{{"type":"labeled","model":"{names[m]}","ts":{t:.3f},"segment":"{SEGMENTS[s]}",'
                       f'"score":{p:.6f},"label":{y}}}').encode()
            return
        due = ts + delay
        at = np.concatenate([ts, due])
        order = np.argsort(at, kind="stable")
        n = self.events
        for j in order.tolist():
            i = j % n
            m = names[int(model[i])]
            if j < n:
                yield (f'{{"type":"prediction","id":"{self.seed}-{i}","model":"{m}","ts":{ts[i]:.3f},'
                       f'"segment":"{SEGMENTS[int(seg[i])]}","score":{score[i]:.6f}}}').encode()
            else:
                yield (f'{{"type":"outcome","id":"{self.seed}-{i}","model":"{m}","ts":{due[i]:.3f},'
                       f'"label":{int(label[i])}}}').encode()


class MemorySource:
    """A read-once source over generated records (positions are record counts, so checkpoints hold them).

    Examples
    --------
    >>> src = MemorySource("m", iter([b"a", b"b", b"c"]))
    >>> len(src.read(2).records), src.position(), len(src.read(2).records), src.exhausted
    (2, {'kind': 'bench', 'records': 2}, 1, True)
    """

    def __init__(self, name: str, records: Iterator[bytes] | None = None) -> None:
        self.name = name
        self._it = records if records is not None else iter(())
        self.records = 0
        self._done = False

    @property
    def exhausted(self) -> bool:
        return self._done

    def read(self, max_records: int = 65536, timeout: float = 0.5) -> Any:
        from connectors.base import Batch
        out = [r for _, r in zip(range(max_records), self._it)]
        self._done = len(out) < max_records
        if not out:
            return None
        self.records += len(out)
        return Batch(out, self.position(), self.name)

    def position(self) -> dict[str, Any]:
        return {"kind": "bench", "records": self.records}

    def seek(self, position: Mapping[str, Any]) -> None:
        self.records = int(position["records"])

    def close(self) -> None:
        self._it = iter(())


# -- lock timing -------------------------------------------------------------------------------------------------
class TimedLock:
    """Re-entrant lock proxy recording, per phase, the longest outermost hold (by any thread).

    Examples
    --------
    >>> lock = TimedLock(threading.RLock())
    >>> lock.phase = "round"
    >>> with lock:
    ...     with lock:
    ...         pass
    >>> list(lock.longest)
    ['round']
    """

    def __init__(self, inner: Any) -> None:
        self._inner = inner
        self._local = threading.local()
        self.phase = "other"
        self.longest: dict[str, float] = {}
        #: per phase, the longest hold in CPU time of the holding thread (without the time it waited preempted)
        self.longest_cpu: dict[str, float] = {}

    def acquire(self, blocking: bool = True, timeout: float = -1) -> bool:
        got = bool(self._inner.acquire(blocking, timeout))
        if got:
            depth = getattr(self._local, "depth", 0)
            if depth == 0:
                self._local.since, self._local.phase = time.perf_counter(), self.phase
                self._local.cpu = time.thread_time()
            self._local.depth = depth + 1
        return got

    def release(self) -> None:
        self._local.depth -= 1
        if self._local.depth == 0:
            held, cpu = time.perf_counter() - self._local.since, time.thread_time() - self._local.cpu
            phase = self._local.phase
            self.longest[phase] = max(self.longest.get(phase, 0.0), held)
            self.longest_cpu[phase] = max(self.longest_cpu.get(phase, 0.0), cpu)
        self._inner.release()

    def __enter__(self) -> bool:
        return self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()

    def __getattr__(self, name: str) -> Any:  # e.g. a Condition built on the lock
        return getattr(self._inner, name)


# -- one M, in a child process -----------------------------------------------------------------------------------
def bench_config(state_dir: str, models: int, budget: float = 30.0) -> Any:
    from calmon.config import build_config
    return build_config({
        "state_dir": state_dir, "sources": [{"path": "unused.jsonl"}], "exporter": {"enabled": False},
        "models": {"default": {"bins": 1024, "reservoir": 256, "segments": list(SEGMENTS)}},
        "evaluation": {"every": "1d", "budget": budget, "tests": [{"name": t} for t in TESTERS]},
        "checkpoint": {"every": "1d"}, "limits": {"max_models": max(50, models)},
    }, env={})


def _written() -> int:
    """Bytes this process passed to write() so far (``/proc/self/io`` wchar; 0 where unavailable)."""
    try:
        with open("/proc/self/io") as f:
            return next(int(line.split()[1]) for line in f if line.startswith("wchar:"))
    except (OSError, StopIteration, ValueError):
        return 0


def _peak_rss() -> int:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmHWM:"))


def _state_bytes(agent: Any) -> int:
    nb = agent.state.nbytes()
    return int(sum(nb.values())) if isinstance(nb, Mapping) else int(nb)


def _ingest_all(agent: Any, src: MemorySource, lock: TimedLock | None) -> tuple[int, float]:
    """Ingest every batch of ``src``; returns (records, seconds spent in ``Agent.ingest``)."""
    n, spent = 0, 0.0
    if lock is not None:
        lock.phase = "ingest"
    while (batch := src.read(agent.cfg.ingest.batch_size)) is not None:
        t = time.perf_counter()
        agent.ingest(batch, src)
        spent += time.perf_counter() - t
        n += len(batch.records)
    return n, spent


def _open_agent(cfg: Any, src: MemorySource, timed: bool) -> tuple[Any, TimedLock | None]:
    from calmon.agent.runtime import Agent
    agent = Agent(cfg, sources=[src])
    lock = None
    if timed:
        lock = TimedLock(agent.state.lock)
        agent.state.lock = lock  # type: ignore[assignment]  # a proxy with the RLock's interface
    agent.open()
    return agent, lock


def _more(models: int, events: int, seed: int, minute: int) -> MemorySource:
    """One more minute of labeled events of every model, right after the replay (new data between rounds)."""
    return MemorySource("more", Traffic("replay", models, events, seed, START + REPLAY_SPAN + 60.0 * minute, 60.0)
                        .records())


def _rounds(agent: Any, lock: TimedLock, k: int, traffic: Traffic) -> dict[str, Any]:
    """K rounds, each after a minute of new events of every model (1 % of ``traffic``, at least 1000)."""
    times: list[float] = []
    cpu: list[float] = []  # the round's thread's CPU seconds (the round runs in this thread)
    deferred: list[int] = []  # changed windows the round left for the next one (REFRESH_SHARE of the budget)
    counts: dict[str, list[int]] = {t: [] for t in TESTERS}
    unchanged: list[int] = []
    before = agent.sched_info.get("overruns", 0)
    windows = 0
    last: dict[tuple[str, str, str], Any] = {}
    # per (window, tester): rounds in a row without a fresh result so far, and the longest such run -- strictly,
    # and counting as served a window that kept its result because its statistics did not change
    waiting: dict[tuple[tuple[str, str, str], str, bool], int] = {}
    longest: dict[bool, dict[str, int]] = {strict: dict.fromkeys(TESTERS, 0) for strict in (True, False)}
    for minute in range(k):
        _ingest_all(agent, _more(traffic.models, max(1000, traffic.events // 100), traffic.seed + 1 + minute,
                                 minute), lock)
        lock.phase = "round"
        since = agent.clock()
        t, c = time.perf_counter(), time.thread_time()
        agent.evaluate_round()
        times.append(time.perf_counter() - t)
        cpu.append(time.thread_time() - c)
        lock.phase = "status"  # reading the results is not the round's lock hold
        status = agent.status()
        deferred.append(int((status.get("agent", {}).get("work") or {}).get("deferred", 0)))
        evs = [e for e in status["evaluations"] if e.get("window") != "stream"]
        lock.phase = "round"
        windows = len(evs)
        for name in TESTERS:
            counts[name].append(sum(1 for e in evs if _fresh((e.get("tests") or {}).get(name), since)))
        now = {(e["model"], e["segment"], e["window"]): e for e in evs}
        for key, e in now.items():
            kept = _same_window(last.get(key), e)
            for name in TESTERS:
                result = (e.get("tests") or {}).get(name)
                fresh = _fresh(result, since)
                served = fresh or (kept and _fresh(result, 0.0))
                for strict, ok in ((True, fresh), (False, served)):
                    w = 0 if ok else waiting.get((key, name, strict), 0) + 1
                    waiting[key, name, strict] = w
                    longest[strict][name] = max(longest[strict][name], w)
        unchanged.append(sum(1 for k, e in now.items() if not _fresh((e.get("tests") or {}).get("tcal"), since)
                             and _same_window(last.get(k), e)))
        last = now
    return {"round_s": times, "round_cpu": cpu, "deferred": deferred, "round_lock": lock.longest.get("round", 0.0),
            "round_lock_cpu": lock.longest_cpu.get("round", 0.0), "windows": windows,
            "results": counts, "unchanged": unchanged, "overruns": agent.sched_info.get("overruns", 0) - before,
            "longest_wait": longest[True], "longest_wait_kept": longest[False]}


def _same_window(before: Any, now: Mapping[str, Any]) -> bool:
    """The window's statistics did not change since the previous round (same events, metrics and T-Cal result):
    the round kept its evaluation, a fresh T-Cal would give the same result."""
    return (before is not None and before.get("n") == now.get("n") and before.get("metrics") == now.get("metrics")
            and (before.get("tests") or {}).get("tcal") == (now.get("tests") or {}).get("tcal"))


def _fresh(result: Any, since: float) -> bool:
    """A tester result computed in this round (``evaluated_at`` at or after its start): an evaluation, whatever
    its decision -- a window below ``min_events`` is evaluated ("insufficient data") without a p-value."""
    at = result.get("evaluated_at") if isinstance(result, Mapping) else None
    return isinstance(at, int | float) and at >= since


def _checkpoint(agent: Any, lock: TimedLock) -> tuple[float, int]:
    lock.phase = "checkpoint"
    w, t = _written(), time.perf_counter()
    agent.checkpoint()
    return time.perf_counter() - t, _written() - w


def child(models: int, events: int, seed: int, rounds: int, budget: float = 30.0) -> dict[str, Any]:
    """Every measurement of one M (see the module docstring), as a JSON-able dict."""
    out: dict[str, Any] = {"models": models, "rings": models * (1 + len(SEGMENTS)), "budget": budget}
    with tempfile.TemporaryDirectory(prefix="calmon-bench-models-") as tmp:
        live = MemorySource("live", Traffic("live", models, events, seed).records())
        agent, _ = _open_agent(bench_config(f"{tmp}/live", models, budget), live, timed=False)
        n, spent = _ingest_all(agent, live, None)
        out.update(live_rate=n / spent, live_state=_state_bytes(agent))
        agent.close()
        del agent
        cfg = bench_config(f"{tmp}/replay", models, budget)
        replay = Traffic("replay", models, events, seed)
        src = MemorySource("replay", replay.records())
        agent, lock = _open_agent(cfg, src, timed=True)
        assert lock is not None
        n, spent = _ingest_all(agent, src, lock)
        out.update(replay_rate=n / spent, replay_state=_state_bytes(agent))
        out.update(_rounds(agent, lock, rounds, replay))
        lock.phase = "metrics"
        t = time.perf_counter()
        text = agent.metrics.render()
        out.update(metrics_s=time.perf_counter() - t, metrics_bytes=len(text))
        out["ck1_s"], out["ck1_bytes"] = _checkpoint(agent, lock)
        _ingest_all(agent, _more(min(models, 5), 1000, seed + 1000, rounds), lock)  # a small change
        out["ck2_s"], out["ck2_bytes"] = _checkpoint(agent, lock)
        out["ck_lock"] = lock.longest.get("checkpoint", 0.0)
        out["ck_lock_cpu"] = lock.longest_cpu.get("checkpoint", 0.0)
        before = _content(agent)
        agent.close()
        del agent
        out.update(restore(models, f"{tmp}/replay", budget, before))
    out["peak_rss"] = _peak_rss()
    return out


def _content(agent: Any) -> list[int]:
    """Events per bucket of every ring, in order: equal before a checkpoint and after its restore."""
    with agent.state.lock:
        return [b.count for _, mw in sorted(agent.state.models.items()) for _, ring in sorted(mw.rings.items())
                for _, _, _, b in ring.entries()]


def restore(models: int, state_dir: str, budget: float, before: list[int]) -> dict[str, Any]:
    """Restore the checkpoint in ``state_dir`` in a fresh process: its seconds, peak RSS and whether it is whole."""
    res = run_module("benchmarks.bench_models", "--restore", state_dir, "--child", models, "--budget", budget,
                     check=False)
    if res.returncode:
        raise RuntimeError(f"restore failed (exit {res.returncode}): {res.stderr[-2000:]}")
    got = last_json(res.stdout)
    return {"restore_s": got["restore_s"], "restore_open_s": got["open_s"], "restore_rss": got["peak_rss"],
            "restore_same": got["content"] == before}


def restore_child(models: int, state_dir: str, budget: float) -> dict[str, Any]:
    """``--restore``: open an agent on ``state_dir`` in this fresh process; the restore is the time spent reading
    the manifest (``CheckpointStore.load``) and restoring it (``Agent.restore``: the state, positions, alerts) --
    not the imports and the tester pool's start that ``Agent.open`` also does."""
    from calmon.agent.runtime import Agent
    from calmon.state.checkpoint.store import CheckpointStore
    spent = [0.0]

    def timed(fn: Any) -> Any:
        def run(*a: Any, **k: Any) -> Any:
            t = time.perf_counter()
            try:
                return fn(*a, **k)
            finally:
                spent[0] += time.perf_counter() - t
        return run

    CheckpointStore.load = timed(CheckpointStore.load)  # type: ignore[method-assign]
    Agent.restore = timed(Agent.restore)  # type: ignore[method-assign]
    t = time.perf_counter()
    again, _ = _open_agent(bench_config(state_dir, models, budget), MemorySource("replay"), timed=False)
    out: dict[str, Any] = {"restore_s": spent[0], "open_s": time.perf_counter() - t, "peak_rss": _peak_rss()}
    out["content"] = _content(again)  # reads (decodes) every bucket: after the peak RSS of the restore itself
    again.close()
    return out


# -- parent: run children, print the table -----------------------------------------------------------------------
def run_child(models: int, args: argparse.Namespace) -> dict[str, Any] | None:
    """One M in a fresh process; ``None`` (and the child's stderr on ours) if it failed."""
    t = time.time()
    res = run_module("benchmarks.bench_models", "--child", models, "--events", args.events, "--seed", args.seed,
                     "--rounds", args.rounds, "--budget", args.budget, check=False)
    if res.returncode:
        print(f"M = {models} failed (exit {res.returncode}):\n{res.stderr[-4000:]}", file=sys.stderr, flush=True)
        return None
    row: dict[str, Any] = last_json(res.stdout)
    row["load"] = os.getloadavg()[0]  # the 1-minute load average as the child ended (a shared machine)
    # the raw row too, so that an interrupted run still leaves its figures
    print(f"M = {models}: {time.time() - t:.0f} s, load {os.getloadavg()[0]:.1f}: {json.dumps(row)}", file=sys.stderr,
          flush=True)
    return row


def _mb(b: float) -> str:
    return f"{b / 1e6:.2f} MB" if b >= 1e5 else f"{b / 1e3:.1f} kB"


def _cell(vals: list[float], fmt: str) -> str:
    """One value, or ``min/median`` of repeated ones."""
    if len(vals) == 1:
        return format(vals[0], fmt)
    return f"{format(min(vals), fmt)}/{format(statistics.median(vals), fmt)}"


def format_row(runs: list[dict[str, Any]], base: dict[str, float]) -> list[str]:
    """One Markdown row from the runs of one M; ``base`` holds the median M = 1 rates."""
    r0 = runs[0]
    col = lambda key: [float(r[key]) for r in runs]  # noqa: E731
    results = "; ".join(f"{t} {','.join(str(c) for c in r0['results'][t])} of {r0['windows']}" for t in TESTERS)
    if any(r0.get("unchanged", ())):
        results += f"; unchanged (T-Cal kept) {','.join(str(c) for c in r0['unchanged'])}"
    return [str(r0["models"]), str(r0["rings"]), _cell([v / 1e3 for v in col("live_rate")], ".0f") + "k",
            _cell([v / base["live_rate"] for v in col("live_rate")], ".2f"),
            _cell([v / 1e3 for v in col("replay_rate")], ".0f") + "k",
            _cell([v / base["replay_rate"] for v in col("replay_rate")], ".2f"),
            _mb(statistics.median(col("live_state")) / r0["rings"]),
            _mb(statistics.median(col("replay_state")) / r0["rings"]),
            _cell([max(r["round_s"]) for r in runs], ".2f"),
            f"{_cell(col('round_lock'), '.3f')} ({_cell(col('round_lock_cpu'), '.3f')})",
            f"{_mb(r0['metrics_bytes'])} / {_cell(col('metrics_s'), '.3f')}",
            f"{_cell(col('ck1_s'), '.2f')} / {_mb(r0['ck1_bytes'])}",
            f"{_cell(col('ck2_s'), '.2f')} / {_mb(r0['ck2_bytes'])}",
            f"{_cell(col('ck_lock'), '.3f')} ({_cell(col('ck_lock_cpu'), '.3f')})",
            _cell(col("restore_s"), ".2f") + ("" if all(r["restore_same"] for r in runs) else " (!)")
            + f" / {max(col('restore_rss')) / 2**30:.2f} GB",
            results, str(max(r["overruns"] for r in runs)) + f" of {len(r0['round_s'])}",
            f"{max(col('peak_rss')) / 2**30:.2f} GB",
            _cell([max(r["round_cpu"]) for r in runs if r.get("round_cpu")], ".2f")
            if any(r.get("round_cpu") for r in runs) else "-",
            ",".join(str(d) for d in r0.get("deferred") or ()) or "-",
            "/".join(f"{r['load']:.1f}" for r in runs if "load" in r) or "-"]


def baseline(rows: dict[int, list[dict[str, Any]]]) -> dict[str, float]:
    """Median ingest rates of the M = 1 runs (the denominators of the ratios)."""
    return {k: statistics.median(float(r[k]) for r in rows[1]) for k in ("live_rate", "replay_rate")}


def table(rows: dict[int, list[dict[str, Any]]], base: dict[str, float]) -> str:
    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "---:|" * len(COLUMNS)]
    lines += ["| " + " | ".join(format_row(runs, base)) + " |" for _, runs in sorted(rows.items())]
    return "\n".join(lines)


#: Issue #15's goals: (what, limit, value of one run of one M, True if the value meets the limit).
GOALS: tuple[tuple[str, str, Any], ...] = (
    ("live ingest vs M = 1", ">= 0.50", lambda r, b: r["live_rate"] / b["live_rate"] >= 0.5),
    ("state per ring (live)", "<= 250 kB", lambda r, b: r["live_state"] / r["rings"] <= 250e3),
    ("peak RSS", "<= 3 GB", lambda r, b: r["peak_rss"] <= 3e9),
    ("round lock hold", "<= 0.05 s", lambda r, b: r["round_lock"] <= 0.05),
    ("checkpoint lock hold", "<= 0.1 s", lambda r, b: r["ck_lock"] <= 0.1),
    ("restore", "<= 10 s", lambda r, b: r["restore_s"] <= 10.0),
    ("peak RSS of the restore", "<= 3 GB", lambda r, b: r["restore_rss"] <= 3e9),
    ("/metrics render", "<= 2 s, <= 20 MB", lambda r, b: r["metrics_s"] <= 2.0 and r["metrics_bytes"] <= 20e6),
    ("T-Cal on every window every round (fresh, or kept on an unchanged window)", "all",
     lambda r, b: r["windows"] > 0 and all(
         f + u == r["windows"] for f, u in zip(r["results"]["tcal"], r.get("unchanged") or
                                               [0] * len(r["results"]["tcal"])))),
    ("rounds without overrun", "all", lambda r, b: r["overruns"] == 0),
    # issue #35.3
    ("live ingest vs M = 1 (issue #35, to 3000 models)", ">= 0.40",
     lambda r, b: r["live_rate"] / b["live_rate"] >= 0.4),
    ("round within the budget (wall)", "<= budget", lambda r, b: max(r["round_s"]) <= r.get("budget", 30.0)),
)


def goals(rows: dict[int, list[dict[str, Any]]], base: dict[str, float]) -> str:
    """Which goal each M meets (every run of that M must), and the memory ceiling extrapolated from peak RSS."""
    ms = sorted(rows)
    lines = ["| goal | limit | " + " | ".join(f"M = {m}" for m in ms) + " |", "|---|---|" + "---|" * len(ms)]
    for what, limit, ok in GOALS:
        marks = ["yes" if all(ok(r, base) for r in rows[m]) else "**no**" for m in ms]
        lines.append(f"| {what} | {limit} | " + " | ".join(marks) + " |")
    big, one = max(ms), min(ms)
    if big > one:
        rss = {m: max(r["peak_rss"] for r in rows[m]) for m in (one, big)}
        per_model = (rss[big] - rss[one]) / (big - one)
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        if per_model < 1e4:
            lines.append(f"\nmemory ceiling: peak RSS did not grow measurably from M = {one} to {big}")
            return "\n".join(lines)
        lines.append(f"\nmemory ceiling: {per_model / 1e6:.2f} MB of peak RSS per model (M = {one} to {big}): about "
                     f"{(total - rss[one]) / per_model:,.0f} models in this machine's {total / 2**30:.1f} GiB")
    return "\n".join(lines)


# -- rows kept and the docs' table ----------------------------------------------------------------------------------
PAGE = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "docs", "performance.md")
BEGIN, END = "<!-- BEGIN benchmarks.bench_models -->", "<!-- END benchmarks.bench_models -->"


def load_rows(paths: list[str]) -> dict[int, list[dict[str, Any]]]:
    """Rows of earlier runs: a ``--save`` file (JSON: M -> runs), or a run's stderr (its ``M = ...: {...}`` lines,
    which an interrupted run leaves too)."""
    rows: dict[int, list[dict[str, Any]]] = {}
    for path in paths:
        with open(path) as f:
            text = f.read()
        if text.lstrip().startswith("{"):
            for m, runs in json.loads(text).items():
                rows.setdefault(int(m), []).extend(runs)
            continue
        for line in text.splitlines():
            if line.startswith("M = ") and ": {" in line:
                head, body = line.split(": {", 1)
                row = json.loads("{" + body)
                if "load" not in row and ", load " in head:
                    row["load"] = float(head.rsplit(", load ", 1)[1])
                rows.setdefault(int(row["models"]), []).append(row)
    return rows


def write_docs(block: str, page: str | None = None) -> None:
    """Replace the text between the bench's markers of the performance page (default :data:`PAGE`) by ``block``."""
    page = page or PAGE
    with open(page) as f:
        text = f.read()
    if BEGIN not in text or END not in text:
        raise SystemExit(f"{page}: markers {BEGIN} / {END} not found")
    head, rest = text.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    with open(page, "w") as f:
        f.write(head + BEGIN + "\n" + block.strip() + "\n" + END + tail)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="1,10,100,1000", help="comma-separated model counts M")
    ap.add_argument("--events", type=lambda s: int(float(s)), default=1_000_000,
                    help="predictions per traffic kind (live-like: plus as many outcomes)")
    ap.add_argument("--rounds", type=int, default=3, help="evaluation rounds K per M")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--budget", type=float, default=30.0, help="evaluation.budget in seconds (default 30)")
    ap.add_argument("--quick", action="store_true", help="M = 1, 2 with 2e4 events and 1 round (a smoke run)")
    ap.add_argument("--save", default=None, help="write the rows (JSON: M -> runs) to this file")
    ap.add_argument("--rows", default="", help="comma-separated --save files or stderr logs of earlier runs: their "
                    "rows join this run's (--models '' runs nothing: a table of those rows alone)")
    ap.add_argument("--docs", action="store_true", help="write the table into docs/performance.md (between its "
                    "benchmarks.bench_models markers)")
    ap.add_argument("--child", type=int, default=None, help=argparse.SUPPRESS)
    ap.add_argument("--restore", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.quick:
        args.models, args.events, args.rounds, args.budget = "1,2", 20_000, 1, 2.0
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.child is not None and args.restore is not None:
        print(json.dumps(restore_child(args.child, args.restore, args.budget)))
        return 0
    if args.child is not None:
        print(json.dumps(child(args.child, args.events, args.seed, args.rounds, args.budget)))
        return 0
    ms = [int(m) for m in args.models.split(",") if m.strip()]
    rows: dict[int, list[dict[str, Any]]] = load_rows([p for p in args.rows.split(",") if p])
    order = (([] if 1 in ms else [1]) + ms + [1]) if ms else []  # M = 1 again at the end: the baseline is interleaved
    if 1 in rows and 1 not in ms:  # the baseline of the rows given (--rows): not measured again
        order = ms
    loads = [os.getloadavg()[0]]
    loads += [r["load"] for runs in rows.values() for r in runs if "load" in r]
    failed = []
    for m in order:
        row = run_child(m, args)
        if row is None:
            failed.append(m)
        else:
            rows.setdefault(m, []).append(row)
        loads.append(os.getloadavg()[0])
    if 1 not in rows:
        print("M = 1 failed: no baseline for the ratios", file=sys.stderr)
        return 1
    if args.save:
        with open(args.save, "w") as f:
            json.dump(rows, f)
    header = (f"bench_models: {args.events:,} predictions per traffic kind (live-like 1 h with outcomes delayed "
              f"~{LIVE_DELAY:.0f} s, replay 8 days labeled), {args.rounds} rounds, budget {args.budget:g} s, "
              f"seed {args.seed}; load average {min(loads):.1f}-{max(loads):.1f} on {os.cpu_count()} CPUs; "
              f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}")
    base = baseline(rows)
    block = f"{header}\n\n{table(rows, base)}\n\n{goals(rows, base)}\n"
    print("\n" + block)
    if args.docs:
        write_docs(f"Measured by `python -m benchmarks.bench_models {' '.join(sys.argv[1:] if argv is None else argv)}`"
                   f" ({header}).\n\n{table(rows, base)}\n\n{goals(rows, base)}\n")
    if failed:
        print(f"\nfailed (see stderr): M = {', '.join(map(str, failed))}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
