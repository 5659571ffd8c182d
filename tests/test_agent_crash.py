"""Crash safety: SIGKILL the agent at random moments while it ingests, restart it, and compare the final state
with an uninterrupted run -- no event lost, none counted twice, dead letters written exactly once.

CI runs a reduced version (3 trials, 1.3e5 predictions) and a reduced many-model one (20 models, 2 trials,
8e4 predictions); the full ones are

    python tests/test_agent_crash.py --trials 10 --events 1000000
    python tests/test_agent_crash.py --models 100 --trials 5 --events 1000000

which print one line per trial and a summary table. ``--models 2`` (the default) is the classic input: model
``fraud`` (labeled events) and model ``risk`` (delayed prediction/outcome pairs). Any other ``--models M``
spreads the traffic over M models ``m000``... (even ones labeled, odd ones delayed pairs joined by id), each
with segments ``web``/``app``/``ios`` of which ``web`` and ``app`` are allow-listed: three rings per model.
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
from pathlib import Path
from typing import IO, Any

import msgspec
import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from connectors.simulation import SimulationSpec, Simulator  # noqa: E402

BAD_EVERY = 997
#: predictions per second of event time over all models (the classic input: 100 + 100)
TOTAL_RATE = 200.0
#: predictions per round of generation over all models (the classic input: 20000 + 20000)
ROUND = 40000
CLASSIC_MODELS = 2
SEGMENTS = ["web", "app", "ios"]
ALLOWED_SEGMENTS = ["web", "app"]


def run_cmd(*args: str) -> list[str]:
    from calmon.cli import COMMANDS
    if "run" in COMMANDS:
        return [sys.executable, "-m", "calmon", "run", *args]
    return [sys.executable, "-m", "calmon.commands.run", *args]


def make_input(path: Path, predictions: int, seed: int = 0) -> None:
    """Half labeled events, half delayed prediction/outcome pairs, two segments, a bad line every ~1000."""
    half = predictions // 2
    lab = Simulator(SimulationSpec(model="fraud", seed=seed, rate=100.0, segments=["web", "app"]))
    pairs = Simulator(SimulationSpec(model="risk", seed=seed + 1, rate=100.0, delay=20.0, segments=["web", "app"]))
    with open(path, "wb") as f:
        done = 0
        k = 0
        while done < half:
            m = min(20000, half - done)
            lines = lab.batch(m) + pairs.batch(m)
            for i in range(0, len(lines), BAD_EVERY):
                lines[i] = b'{"model": "fraud", "score": 2, "label": 1, "k": %d}' % k if k % 2 else b"garbage %d" % k
                k += 1
            f.write(b"\n".join(lines) + b"\n")
            done += m
        f.write(b"\n".join(pairs.flush()) + b"\n")


class _Ts(msgspec.Struct):
    ts: float


_decode_ts = msgspec.json.Decoder(_Ts).decode


def model_names(models: int) -> list[str]:
    """The model names of an input with ``models`` models (see the module docstring)."""
    return ["fraud", "risk"] if models == CLASSIC_MODELS else [f"m{i:03d}" for i in range(models)]


def _bad_lines(lines: list[bytes], names: list[str], k: int) -> int:
    """Replace every ``BAD_EVERY``-th line by garbage or an out-of-range score of a known model; return the next k."""
    for i in range(0, len(lines), BAD_EVERY):
        name = names[(k // 2) % len(names)].encode()
        lines[i] = b'{"model": "%s", "score": 2, "label": 1, "k": %d}' % (name, k) if k % 2 else b"garbage %d" % k
        k += 1
    return k


def _merged(parts: list[list[bytes]]) -> list[bytes]:
    """The models' lines in event-time order (each model's lines already are: a stable sort keeps their order).

    The join's watermark is the running maximum over all models, so the input must be time-ordered overall.
    """
    lines = [line for part in parts for line in part]
    ts = np.fromiter((_decode_ts(line).ts for line in lines), np.float64, len(lines))
    return [lines[i] for i in np.argsort(ts, kind="stable").tolist()]


def make_many_input(path: Path, predictions: int, models: int, seed: int = 0) -> None:
    """``predictions`` spread evenly over ``models`` models: even ones labeled, odd ones delayed pairs.

    Every model draws its segment from ``SEGMENTS``; the total event rate and the round size are those of the
    classic input, so the input spans the same event time whatever the number of models.
    """
    names = model_names(models)
    rate = TOTAL_RATE / models
    sims = [Simulator(SimulationSpec(model=name, seed=seed + 7 * i, rate=rate, delay=20.0 if i % 2 else 0.0,
                                     segments=SEGMENTS)) for i, name in enumerate(names)]
    per_model = -(-predictions // models)
    per_round = max(1, ROUND // models)
    k = done = 0
    with open(path, "wb") as f:
        while done < per_model:
            m = min(per_round, per_model - done)
            lines = _merged([sim.batch(m) for sim in sims])
            k = _bad_lines(lines, names, k)
            f.write(b"\n".join(lines) + b"\n")
            done += m
        tail = _merged([sim.flush() for sim in sims])
        if tail:
            f.write(b"\n".join(tail) + b"\n")


def write_config(directory: Path, events: Path, checkpoint_every: str = "0.2s",
                 models: int = CLASSIC_MODELS) -> Path:
    cfg = directory / "calmon.yaml"
    segments = "[web]" if models == CLASSIC_MODELS else "[" + ", ".join(ALLOWED_SEGMENTS) + "]"
    cfg.write_text(f"""
state_dir: {directory / 'state'}
sources: [{{name: replay, path: {events}}}]
dead_letter: {{type: file, path: deadletter.jsonl, options: {{buffer_bytes: 0}}}}
models: {{default: {{bins: 1024, reservoir: 64, segments: {segments}}}}}
limits: {{max_models: {max(50, models)}}}
join: {{ttl: 30s, max_pending: 5000}}
windows: {{names: [5m, 1h, all], allowed_lateness: 10m,
          tiers: [{{width: 1m, count: 10}}, {{width: 10m, count: 6}}, {{width: 1h, count: 2}}]}}
evaluation: {{every: 1h, tests: []}}
exporter: {{port: 0}}
checkpoint: {{every: {checkpoint_every}}}
ingest: {{batch_size: 16384, exit_when_done: true}}
""")
    return cfg


def final_state(directory: Path) -> tuple[dict[str, Any], bytes]:
    """The last checkpoint's state, without what legitimately differs (times, batch counts, reservoir rows).

    Reservoir *rows* of coarse buckets depend on when buckets were rolled together (their merge
    draws a random subsample); their sizes (``seen``) and every grid must be identical.
    """
    from calmon.state.checkpoint.store import CheckpointStore
    ck = sorted((directory / "state" / "checkpoints").glob("checkpoint-*.json"))[-1]
    # buckets are blob references into pack files (incremental checkpoints): compare their contents
    state = CheckpointStore(ck.parent).inline(json.loads(ck.read_text())["state"])
    for key in ("created",):
        state.pop(key)
    state["counters"].pop("batches")

    def strip(node: Any) -> Any:
        if isinstance(node, dict):
            if node.get("format") == "calmon.reservoir":
                return {"seen": node["seen"]}
            if "ino" in node and "size" in node and "files" not in node:  # the dead-letter position
                return {"size": node["size"]}
            return {k: strip(v) for k, v in node.items()}
        if isinstance(node, list):
            return [strip(v) for v in node]
        return node

    dead = (directory / "state" / "deadletter.jsonl").read_bytes()
    return strip(state), dead


def _stderr(proc: subprocess.Popen[str]) -> IO[str]:
    assert proc.stderr is not None, "started with stderr=PIPE"
    return proc.stderr


def wait_serving(proc: subprocess.Popen[str]) -> str:
    """Read stderr lines (log lines such as "resumed from checkpoint" come first) until "serving" or EOF."""
    seen = ""
    while True:
        line = _stderr(proc).readline()
        seen += line
        if not line or "serving" in line:
            return seen


def run_to_end(cfg: Path, timeout: float = 600.0) -> float:
    """Run uninterrupted; return the seconds from "serving" (state loaded) to the exit."""
    proc = subprocess.Popen(run_cmd("-c", str(cfg)), stderr=subprocess.PIPE, text=True, cwd=ROOT)
    line = wait_serving(proc)
    t0 = time.time()
    rest = proc.communicate(timeout=timeout)[1]
    assert proc.returncode == 0, line + rest[-2000:]
    return time.time() - t0


def crash_trial(cfg: Path, rng: np.random.Generator, max_kill_delay: float, max_kills: int = 12,
                first_kill_delay: float | None = None) -> int:
    """Start the agent, SIGKILL it at a random moment after it is serving, until it finishes; return #kills.

    The first kill comes after ``first_kill_delay`` seconds when given (e.g. before the first periodic
    checkpoint), later ones after a uniform delay in ``[0, max_kill_delay]``.
    """
    kills = 0
    while True:
        proc = subprocess.Popen(run_cmd("-c", str(cfg)), stderr=subprocess.PIPE, text=True, cwd=ROOT)
        try:
            line = wait_serving(proc)  # "serving ..." once the checkpoint is loaded and sources seeked
            if kills >= max_kills or not re.search(r"serving", line):
                rest = proc.communicate(timeout=600)[1]
                assert proc.returncode == 0, line + rest[-2000:]
                return kills
            try:
                delay = rng.uniform(0.0, max_kill_delay)
                if kills == 0 and first_kill_delay is not None:
                    delay = first_kill_delay
                proc.wait(timeout=float(delay))
            except subprocess.TimeoutExpired:
                os.kill(proc.pid, signal.SIGKILL)
                proc.wait()
                kills += 1
                continue
            rest = _stderr(proc).read()
            assert proc.returncode == 0, rest[-2000:]
            return kills
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            _stderr(proc).close()


def sigterm_trial(cfg: Path, delay: float) -> float:
    """SIGTERM the agent ``delay`` s after it is serving; return how long it took to exit (must exit 0)."""
    proc = subprocess.Popen(run_cmd("-c", str(cfg)), stderr=subprocess.PIPE, text=True, cwd=ROOT)
    try:
        wait_serving(proc)
        time.sleep(delay)
        t0 = time.time()
        proc.send_signal(signal.SIGTERM)
        rest = proc.communicate(timeout=60)[1]
        took = time.time() - t0
        assert proc.returncode == 0, rest[-2000:]
        return took
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def compare(a: Any, b: Any, path: str = "") -> str | None:
    """First difference between two JSON trees (for a readable failure)."""
    if type(a) is not type(b):
        return f"{path}: {type(a).__name__} != {type(b).__name__}"
    if isinstance(a, dict):
        for k in sorted(set(a) | set(b)):
            if k not in a or k not in b:
                return f"{path}.{k}: missing on one side"
            d = compare(a[k], b[k], f"{path}.{k}")
            if d:
                return d
        return None
    if isinstance(a, list):
        if len(a) != len(b):
            return f"{path}: lengths {len(a)} != {len(b)}"
        for i, (x, y) in enumerate(zip(a, b)):
            d = compare(x, y, f"{path}[{i}]")
            if d:
                return d
        return None
    return None if a == b else f"{path}: {a!r:.80} != {b!r:.80}"


def run_trials(work: Path, trials: int, predictions: int, seed: int = 0, verbose: bool = False,
               kill_fraction: float = 0.6, max_kills: int = 12, models: int = CLASSIC_MODELS) -> list[dict]:
    events = work / "events.jsonl"
    if models == CLASSIC_MODELS:
        make_input(events, predictions, seed)
    else:
        make_many_input(events, predictions, models, seed)
    ref_dir = work / "reference"
    ref_dir.mkdir()
    ref_seconds = run_to_end(write_config(ref_dir, events, models=models))
    if verbose:
        print(f"reference: {ref_seconds:.1f} s from serving to exit", flush=True)
    reference, ref_dead = final_state(ref_dir)
    rng = np.random.default_rng(seed)
    results = []
    for trial in range(trials):
        d = work / f"trial{trial}"
        d.mkdir()
        t0 = time.time()
        # every third trial checkpoints every 2 s and is first killed 0.3-1 s after start, i.e. after some
        # batches but before the first periodic checkpoint; the others checkpoint every 0.2 s and are first
        # killed at a uniform moment of the first 30 % of the ingestion; later kills within kill_fraction
        early = trial % 3 == 0
        first = float(rng.uniform(0.3, 1.0)) if early else float(rng.uniform(0.0, 0.3 * ref_seconds))
        cfg = write_config(d, events, checkpoint_every="2s" if early else "0.2s", models=models)
        kills = crash_trial(cfg, rng, max_kill_delay=max(0.3, kill_fraction * ref_seconds), first_kill_delay=first,
                            max_kills=max_kills)
        state, dead = final_state(d)
        diff = compare(reference, state)
        results.append({"trial": trial, "kills": kills, "seconds": time.time() - t0, "identical": diff is None,
                        "difference": diff, "dead_letters_identical": dead == ref_dead})
        if verbose:
            r = results[-1]
            print(f"trial {trial}: {kills} SIGKILLs, {r['seconds']:.1f} s, state identical: {r['identical']}, "
                  f"dead letters identical: {r['dead_letters_identical']}" + (f" ({diff})" if diff else ""),
                  flush=True)
    return results


@pytest.mark.slow
def test_sigkill_restarts_give_identical_state(tmp_path):
    trials = int(os.environ.get("CALMON_CRASH_TRIALS", "2"))
    predictions = int(os.environ.get("CALMON_CRASH_EVENTS", "100000"))
    results = run_trials(tmp_path, trials, predictions, max_kills=int(os.environ.get("CALMON_CRASH_KILLS", "4")))
    assert sum(r["kills"] for r in results) >= trials  # the agent really was killed (at least once per trial)
    for r in results:
        assert r["identical"], r["difference"]
        assert r["dead_letters_identical"]
    # sanity of the reference itself: every valid event counted once
    reference, ref_dead = final_state(tmp_path / "reference")
    # SIGTERM while ingesting: a clean exit within seconds, then the restart finishes identically
    d = tmp_path / "sigterm"
    d.mkdir()
    cfg = write_config(d, tmp_path / "events.jsonl")
    took = sigterm_trial(cfg, delay=0.5)
    assert took < 30.0  # a hang detector, not a speed claim: a loaded CI machine slows the final checkpoint
    assert (d / "state" / "checkpoints").is_dir()
    run_to_end(cfg)
    state, dead = final_state(d)
    assert compare(reference, state) is None and dead == ref_dead
    events = {(m, k): n for m, k, n in reference["counters"]["events"]}
    assert events[("fraud", "labeled")] + events.get(("risk", "labeled"), 0) > 0.99 * predictions / 2
    assert sum(reference["counters"]["rejected"].values()) > 0


@pytest.mark.slow
def test_sigkill_restarts_many_models_give_identical_state(tmp_path):
    """The same with the traffic spread over 20 models of three rings each (60 rings, 10 join buffers)."""
    models = int(os.environ.get("CALMON_CRASH_MODELS", "20"))
    trials = int(os.environ.get("CALMON_CRASH_MODEL_TRIALS", "2"))
    predictions = int(os.environ.get("CALMON_CRASH_MODEL_EVENTS", "80000"))
    results = run_trials(tmp_path, trials, predictions, max_kills=3, models=models)
    assert sum(r["kills"] for r in results) >= trials
    for r in results:
        assert r["identical"], r["difference"]
        assert r["dead_letters_identical"]
    # the reference itself: every model with its three rings, every event counted once, each dead letter once
    reference, ref_dead = final_state(tmp_path / "reference")
    names = model_names(models)
    assert sorted(reference["models"]) == names
    assert all(sorted(m["rings"]) == sorted(["all", *ALLOWED_SEGMENTS]) for m in reference["models"].values())
    events = {(m, k): n for m, k, n in reference["counters"]["events"]}
    per_model = predictions / models
    for i, name in enumerate(names):
        assert 0.99 * per_model < events[(name, "prediction" if i % 2 else "labeled")] <= per_model
    joined = reference["join"]["counters"]["joined"]
    assert sorted(joined) == names[1::2] and all(n > 0.5 * per_model for n in joined.values())
    assert ref_dead.count(b"\n") == sum(reference["counters"]["rejected"].values()) > 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--trials", type=int, default=10)
    ap.add_argument("--events", type=int, default=1_000_000, help="predictions in the input (plus outcomes)")
    ap.add_argument("--models", type=int, default=CLASSIC_MODELS,
                    help="models the traffic is spread over (2: the classic fraud/risk input; see the docstring)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--workdir", default=None)
    ap.add_argument("--max-kills", type=int, default=12, help="SIGKILLs per trial at most (then it runs to the end)")
    ap.add_argument("--kill-fraction", type=float, default=0.6,
                    help="later kills come uniformly within this fraction of the reference ingestion time")
    args = ap.parse_args()
    import tempfile

    work = Path(args.workdir or tempfile.mkdtemp(prefix="calmon-crash-"))
    work.mkdir(parents=True, exist_ok=True)
    if args.models < 1:
        ap.error("--models must be >= 1")
    results = run_trials(work, args.trials, args.events, args.seed, verbose=True, kill_fraction=args.kill_fraction,
                         max_kills=args.max_kills, models=args.models)
    print(f"\n| models | trials | predictions | SIGKILLs | identical state | identical dead letters |\n"
          f"|---|---|---|---|---|---|\n"
          f"| {args.models} | {len(results)} | {args.events} | {sum(r['kills'] for r in results)} | "
          f"{sum(r['identical'] for r in results)}/{len(results)} | "
          f"{sum(r['dead_letters_identical'] for r in results)}/{len(results)} |")
    return 0 if all(r["identical"] and r["dead_letters_identical"] for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
