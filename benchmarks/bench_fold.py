"""Benchmark: the binary fold alone (``calmon.state.buckets.fold``) of live-like ingest at M models, against another
tree.

The folds of one ingest of ``benchmarks/bench_models.py``'s live-like traffic are recorded once with this tree
(every fold call of ``Ingestor``: its columns, parts and watermark, in a temporary ``.npz`` file), then replayed
into fresh rings by each tree in turn, in subprocesses, interleaved (baseline, current, baseline, ...; a tree from
before ``fold`` replays with its ``fold_binary``).  Each replay reports its fold time (wall and CPU: the machine may
be shared) and a digest of every resulting ring document and version, so the output also says whether both trees
built the same state.  As under the agent's state lock, automatic garbage collection is off during a fold; the
collection that fell due runs right after it and is counted.

    python -m benchmarks.bench_fold --models 1000 --events 3e5 --rounds 5 --baseline /tmp/base
"""

from __future__ import annotations

import argparse
import gc
import hashlib
import json
import math
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

import numpy as np

from benchmarks._child import last_json, run_module


def tree_fold() -> Callable[..., None]:
    """The binary fold of the tree this process imports, called as ``(parts, ts, segment, score, labels, watermark,
    predictions)``: ``calmon.state.buckets.fold`` (scores by keyword), or an older tree's ``fold_binary``."""
    try:
        from calmon.state.buckets import fold
    except ImportError:  # a tree from before fold (calmon.state.batchfold.fold_binary, the same arguments)
        from calmon.state.batchfold import fold_binary  # type: ignore[import-not-found]

        return cast(Callable[..., None], fold_binary)

    def call(parts: Any, ts: np.ndarray, segment: np.ndarray, score: np.ndarray, labels: np.ndarray | None,
             watermark: float, predictions: bool = False) -> None:
        fold(parts, ts, segment, labels, watermark, score=score, predictions=predictions)
    return call


def record(models: int, events: int, seed: int, path: str) -> None:
    """Ingest the traffic with this tree, recording every fold call into ``path`` (npz) + JSON."""
    if not path.endswith(".npz"):
        raise ValueError("the recording path must end with .npz")
    import calmon.state.ingest as ing
    from benchmarks.bench_models import MemorySource, Traffic, _ingest_all, _open_agent, bench_config

    arrays: dict[str, np.ndarray] = {}
    calls: list[dict[str, Any]] = []
    spec: dict[str, Any] = {}
    real = tree_fold()

    def save(parts: Any, ts: np.ndarray, segment: np.ndarray, score: np.ndarray, labels: np.ndarray | None,
             watermark: float, predictions: bool = False) -> None:
        i = len(calls)
        for mw, _ in parts:
            spec.setdefault(mw.name, {"tiers": mw.tiers, "segments": mw.segments, **mw.params})
        arrays[f"ts{i}"], arrays[f"score{i}"] = ts, score
        arrays[f"seg{i}"] = np.asarray(segment, dtype=str)
        if labels is not None:
            arrays[f"labels{i}"] = labels
        arrays[f"rows{i}"] = np.concatenate([r for _, r in parts]) if parts else np.zeros(0, np.int64)
        calls.append({"names": [mw.name for mw, _ in parts], "sizes": [int(r.size) for _, r in parts],
                      "watermark": watermark, "predictions": predictions, "labels": labels is not None})
        real(parts, ts, segment, score, labels, watermark, predictions)

    def rec(parts: Any, ts: np.ndarray, segment: np.ndarray, labels: np.ndarray | None, watermark: float, *,
            score: np.ndarray | None = None, probs: np.ndarray | None = None, predictions: bool = False) -> None:
        if score is None or probs is not None:
            raise ValueError("the benchmark's traffic is binary: every fold has scores")
        save(parts, ts, segment, score, labels, watermark, predictions)

    if hasattr(ing, "fold"):  # the ingestor calls its module's ``fold``
        ing.fold = rec
    else:  # an older tree: fold_binary, positional scores
        ing.fold_binary = save  # type: ignore[attr-defined]
    records = list(Traffic("live", models, events, seed).records())
    with tempfile.TemporaryDirectory(prefix="calmon-bench-fold-") as tmp:
        src = MemorySource("live", iter(records))
        agent, _ = _open_agent(bench_config(f"{tmp}/s", models), src, timed=False)
        _ingest_all(agent, src, None)
        agent.close()
    np.savez(path, allow_pickle=False, **arrays)
    Path(path + ".json").write_text(json.dumps({"calls": calls, "spec": spec}))


def replay(path: str, profile: Any = None, repeat: int = 1) -> dict[str, Any]:
    """Replay the recorded folds into fresh rings with this tree, ``repeat`` times: the least fold seconds
    (wall, CPU) and a digest of the state."""
    from calmon.state.buckets import ModelWindows
    fold_call = tree_fold()
    meta = json.loads(Path(path + ".json").read_text())
    data = np.load(path, allow_pickle=False)
    best = {"fold": math.inf, "cpu": math.inf}
    for _ in range(repeat):
        windows = {name: ModelWindows(name, p["classes"], p["tiers"], p["segments"], p["bins"], p["reservoir"],
                                      p["levelset_lambda"], p["reliability_bins"])
                   for name, p in meta["spec"].items()}
        prepared = []
        for i, call in enumerate(meta["calls"]):
            rows = data[f"rows{i}"]
            cuts = np.cumsum([0, *call["sizes"]]).tolist()
            parts = [(windows[n], rows[a:b]) for n, a, b in zip(call["names"], cuts, cuts[1:])]
            prepared.append((parts, data[f"ts{i}"], data[f"seg{i}"].astype(object), data[f"score{i}"],
                             data[f"labels{i}"] if call["labels"] else None, call["watermark"], call["predictions"]))
        gc.collect()
        spent = cpu = 0.0
        for args in prepared:
            t, c = time.perf_counter(), time.process_time()
            if profile is not None:
                profile.enable()
            gc.disable()  # as under the agent's state lock (StateLock): collection deferred to the release
            fold_call(*args)
            gc.enable()
            _trigger: list[list[int]] = [[]]  # allocates: a collection that fell due runs now (counted)
            if profile is not None:
                profile.disable()
            spent += time.perf_counter() - t
            cpu += time.process_time() - c
        best = {"fold": min(best["fold"], spent), "cpu": min(best["cpu"], cpu)}
    if profile is not None:
        return best
    digest = hashlib.sha256()
    for name in sorted(windows):
        for seg, ring in windows[name].rings.items():
            digest.update(json.dumps([name, seg, ring.version, ring.watermark, ring.archive_version,
                                      [sorted(v.items()) for v in ring.bucket_versions],
                                      ring.to_dict(lambda b: b.to_dict())], sort_keys=True).encode())
    return {**best, "digest": digest.hexdigest()[:16]}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", type=int, default=1000)
    ap.add_argument("--events", type=lambda s: int(float(s)), default=300_000)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--repeat", type=int, default=2, help="replays per round and tree, the fastest kept (default 2)")
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--baseline", type=Path, default=None, help="a tree with another version's packages")
    ap.add_argument("--profile", action="store_true", help="profile one replay of this tree instead")
    ap.add_argument("--record", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--replay", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.record:
        record(args.models, args.events, args.seed, args.record)
        return 0
    if args.replay:
        print(json.dumps(replay(args.replay, repeat=args.repeat)))
        return 0
    if args.profile:
        import cProfile
        import pstats

        prof = cProfile.Profile()
        with tempfile.TemporaryDirectory(prefix="calmon-bench-fold-") as tmp:
            record(args.models, args.events, args.seed, f"{tmp}/folds.npz")
            print(replay(f"{tmp}/folds.npz", prof))
        pstats.Stats(prof).sort_stats("tottime").print_stats(30)
        return 0
    trees: list[tuple[str, Path | None]] = [("baseline", args.baseline)] if args.baseline else []
    trees.append(("current", None))

    def child(code: Path | None, *extra: str) -> str:
        """This module in a fresh process importing the packages of ``code`` (default this checkout)."""
        return run_module("benchmarks.bench_fold", *extra, code=code, env={"OPENBLAS_NUM_THREADS": "1"}).stdout

    with tempfile.TemporaryDirectory(prefix="calmon-bench-fold-") as tmp:
        path = f"{tmp}/folds.npz"
        child(None, "--record", path, "--models", str(args.models), "--events", str(args.events),
              "--seed", str(args.seed))
        load0 = os.getloadavg()[0]
        res: dict[str, list[dict[str, Any]]] = {}
        for _ in range(args.rounds):
            for name, code in trees:
                out = child(code, "--replay", path, "--repeat", str(args.repeat))
                res.setdefault(name, []).append(last_json(out))
        load1 = os.getloadavg()[0]
    print(f"fold replay, M={args.models}, {args.events:.0e} predictions + outcomes, {args.rounds} "
          f"interleaved rounds, load {load0:.1f} -> {load1:.1f}")
    for key in ("fold", "cpu"):
        base = statistics.median(r[key] for r in res[trees[0][0]])
        for name, runs in res.items():
            vals = [r[key] for r in runs]
            print(f"{name:9s} {key:4s} s min {min(vals):.3f} median {statistics.median(vals):.3f} "
                  f"(median / {trees[0][0]} {statistics.median(vals) / base:.2f})")
    for name, runs in res.items():
        print(f"{name:9s} state digests {sorted({r['digest'] for r in runs})}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
