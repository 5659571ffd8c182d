"""Benchmark: the cost of one round's snapshot of every window sum (``AgentState.snapshot``) at M binary models.

Builds an agent as ``benchmarks/bench_models.py`` does (M models x 3 rings, the default tiers and windows, replay
traffic of ``--events`` labeled events over 8 days) and times the very first snapshot (it also aggregates the folds
pending from the ingest).  Then, per path, ``--first`` snapshots from scratch (an empty reuse cache, as after a
restart) and ``--rounds`` later ones: before each, one more minute of events of every model ``--minutes`` later
(as between two evaluation rounds; 5: every round enters a new tier-0 bucket, so every stable sum is recomputed --
the expensive rounds).  The paths run interleaved, each from the same kept sums, on the same state (pending folds
are aggregated first, so that none pays them): ``new`` (this tree); with ``--compare`` ``reference``
(:meth:`~calmon.state.windows.Plan.run_reference`, the definition's pairwise merges, swapped in for ``Plan.run`` by
this benchmark, with full bucket copies); with ``--baseline DIR`` ``baseline``: the snapshot code of a tree exported
by ``git archive HEAD calmon | tar -x -C DIR`` (its ``AgentState.snapshot``, window sums (``capture``,
``RingSums``), ``BucketStats.summed`` and ``read_copy``, ``ModelStats.summed`` and ``copy``, ``Reservoir.merged``
and ``sample_copy``; the tree's layout is read from its files).  Every path's
windows are checked equal to ``new``'s.  Prints per path and kind min/median wall seconds, the snapshot thread's
CPU seconds (steadier on a loaded machine), the seconds spent in garbage collection, the ratios, and the load.

    nice -n 5 python -m benchmarks.bench_snapshot --models 100 --events 1e6 --rounds 5 --compare
    mkdir -p /tmp/base && git archive HEAD calmon | tar -x -C /tmp/base
    nice -n 5 python -m benchmarks.bench_snapshot --models 1000 --events 1e6 --rounds 4 --compare --baseline /tmp/base
"""

from __future__ import annotations

import argparse
import gc
import importlib.util
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from benchmarks import bench_models as bm


def _same(a: Any, b: Any) -> bool:
    """Whether two window sums hold the same statistics (every grid, the reservoir rows and counts)."""
    sa, sb = a.stats, b.stats
    return (sa == sb and a.rel == b.rel and a.pred == b.pred
            and (sa.reservoir is None or sa.reservoir.rows.tobytes() == sb.reservoir.rows.tobytes()))


def _flush_all(state: Any) -> None:
    with state.lock:
        for mw in state.models.values():
            for ring in mw.rings.values():
                states = [b for tier in ring.buckets for b in tier.values()]
                for b in states + ([ring.archive] if ring.archive is not None else []):
                    b.stats  # noqa: B018  (the property aggregates pending folds)


class _GcTimer:
    """Seconds spent in garbage collection and full collections, from ``gc.callbacks``."""

    def __init__(self) -> None:
        self.seconds, self.full, self._t = 0.0, 0, 0.0
        gc.callbacks.append(self._cb)

    def _cb(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._t = time.perf_counter()
        else:
            self.seconds += time.perf_counter() - self._t
            self.full += info["generation"] == 2

    def read(self) -> tuple[float, int]:
        return self.seconds, self.full


def _load_baseline(root: Path) -> dict[tuple[type, str], Any]:
    """The methods the snapshot runs, as the tree ``root`` (``git archive HEAD calmon | tar -x -C root``) has them.

    Its modules are loaded under other names; the classes they define are then replaced by the installed ones
    (so that their objects mix), and the methods are returned per (installed class, name) to be swapped in.
    """
    from calmon.state.agentstate import AgentState
    from calmon.state.buckets import BucketStats
    from calmon.stats.model import ModelStats
    from calmon.stats.reservoir import Reservoir
    #: role -> the module's path in the trees of successive layouts (the first that exists is loaded)
    layouts = {"reservoir": ("stats/reservoir",), "model": ("stats/model",),
               "buckets": ("state/buckets", "agent/buckets"),
               "sums": ("state/windows", "state/windowsums", "agent/windowsums"),
               "state": ("state/agentstate", "agent/state")}
    mods: dict[str, Any] = {}
    for role, paths in layouts.items():
        rel = next((r for r in paths if (root / "calmon" / f"{r}.py").exists()), None)
        if rel is None:
            raise SystemExit(f"--baseline {root}: none of calmon/{{{','.join(paths)}}}.py")
        name = "baseline_" + rel.replace("/", "_")
        spec = importlib.util.spec_from_file_location(name, root / "calmon" / f"{rel}.py")
        assert spec is not None and spec.loader is not None
        mod = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = mod  # dataclasses look their module up
        spec.loader.exec_module(mod)
        mods[role] = mod
    out: dict[tuple[type, str], Any] = {}
    for role, cls, names in (("reservoir", Reservoir, ("merged", "sample_copy")),
                             ("model", ModelStats, ("summed", "copy")),
                             ("buckets", BucketStats, ("summed", "read_copy")),
                             ("state", AgentState, ("snapshot",))):
        mod = mods[role]
        for name in names:
            out[(cls, name)] = getattr(mod, cls.__name__).__dict__[name]
        setattr(mod, cls.__name__, cls)  # the baseline's methods build installed objects
    mods["state"].capture = mods["sums"].capture
    mods["state"].RingSums = mods["sums"].RingSums
    return out


@contextmanager
def _path(path: str, baseline: dict[tuple[type, str], Any] | None) -> Iterator[None]:
    """Run the snapshot by ``path``: "new" (this tree), "reference" (its pairwise path) or "baseline"."""
    from calmon.state.buckets import BucketStats
    from calmon.state.windows import Plan
    saved = {(cls, name): cls.__dict__[name] for cls, name in (baseline or {})}
    read_copy, run = BucketStats.read_copy, Plan.run
    try:
        if path == "reference":  # the definition's merges and the bucket copies as before, generator included
            Plan.run = Plan.run_reference  # type: ignore[method-assign]
            BucketStats.read_copy = BucketStats.copy  # type: ignore[method-assign]
        elif path == "baseline":
            assert baseline is not None
            for (cls, name), fn in baseline.items():
                setattr(cls, name, fn)
        yield
    finally:
        Plan.run = run  # type: ignore[method-assign]
        BucketStats.read_copy = read_copy  # type: ignore[method-assign]
        for (cls, name), fn in saved.items():
            setattr(cls, name, fn)


def _timed(state: Any, path: str, baseline: Any, gct: _GcTimer, times: dict[str, list[tuple[float, float, float]]],
           kind: str) -> Any:
    """One snapshot by ``path``; appends (wall s, this thread's CPU s, gc s) to ``times[path]``."""
    with _path(path, baseline):
        g0 = gct.read()[0]
        t, c = time.perf_counter(), time.thread_time()
        got = state.snapshot()
        times[f"{kind} {path}"].append((time.perf_counter() - t, time.thread_time() - c, gct.read()[0] - g0))
    return got


def _report(times: dict[str, list[tuple[float, float, float]]]) -> None:
    for key, ts in times.items():
        if ts:
            wall, cpu, gcs = ([x[i] for x in ts] for i in range(3))
            print(f"{key}: wall min {min(wall):.3f} / median {statistics.median(wall):.3f} s, thread CPU min "
                  f"{min(cpu):.3f} / median {statistics.median(cpu):.3f} s, in gc median "
                  f"{statistics.median(gcs):.3f} s over {len(ts)} snapshots")
    for kind in ("first", "later"):
        for other in ("baseline", "reference"):
            a, b = times.get(f"{kind} {other}"), times.get(f"{kind} new")
            if a and b:
                print(f"{kind}: ratio {other}/new (median) wall "
                      f"{statistics.median(x[0] for x in a) / statistics.median(x[0] for x in b):.2f}, thread CPU "
                      f"{statistics.median(x[1] for x in a) / statistics.median(x[1] for x in b):.2f}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", type=int, default=100)
    ap.add_argument("--events", type=float, default=1e6)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--first", type=int, default=2, help="from-scratch snapshots per path (empty reuse cache)")
    ap.add_argument("--minutes", type=int, default=5,
                    help="event-time minutes between rounds (5: every round enters a new 5-minute tier-0 bucket)")
    ap.add_argument("--compare", action="store_true", help="interleave the reference path and check equality")
    ap.add_argument("--baseline", type=Path, default=None,
                    help="a tree exported by `git archive HEAD calmon | tar -x -C DIR`: interleave its snapshot too")
    args = ap.parse_args(argv)
    baseline = None if args.baseline is None else _load_baseline(args.baseline.resolve())
    paths = ["new"] + (["reference"] if args.compare else []) + (["baseline"] if baseline else [])
    m, ev = args.models, int(args.events)
    state_dir = tempfile.mkdtemp(prefix="calmon-bench-snapshot-")
    cfg = bm.bench_config(state_dir, m, 30.0)
    src = bm.MemorySource("replay", bm.Traffic("replay", m, ev, 0).records())
    agent, _ = bm._open_agent(cfg, src, timed=False)
    t = time.perf_counter()
    bm._ingest_all(agent, src, None)
    print(f"ingested {ev} events of {m} models in {time.perf_counter() - t:.1f} s", flush=True)
    state = agent.state
    gct = _GcTimer()
    times: dict[str, list[tuple[float, float, float]]] = {f"{k} {p}": [] for k in ("first", "later") for p in paths}
    t, c = time.perf_counter(), time.thread_time()
    state.snapshot()  # the very first: aggregates the folds pending from the ingest, then sums from scratch
    print(f"first snapshot after the ingest (new, folds pending): wall {time.perf_counter() - t:.3f} s, "
          f"thread CPU {time.thread_time() - c:.3f} s", flush=True)
    for rep in range(args.first):  # from scratch (as after a restart), every path, interleaved
        got: dict[str, Any] = {}
        for path in paths[rep % len(paths):] + paths[:rep % len(paths)]:
            state._snap_cache = {}
            got[path] = _timed(state, path, baseline, gct, times, "first")
        _check(f"first {rep}", got, times, "first")
    for minute in range(args.rounds):
        bm._ingest_all(agent, bm._more(m, max(1000, ev // 100), 1 + minute, args.minutes * minute), None)
        _flush_all(state)  # no path should pay the aggregation of the folds pending from the ingest
        order = paths[minute % len(paths):] + paths[:minute % len(paths)]
        cache = dict(state._snap_cache)  # every path starts from the same kept sums
        got = {}
        for path in order:
            state._snap_cache = dict(cache)
            got[path] = _timed(state, path, baseline, gct, times, "later")
        _check(f"round {minute}", got, times, "later")
    _report(times)
    print("full collections in the run:", gct.full, "; load:", os.getloadavg())
    agent.close()
    shutil.rmtree(state_dir, ignore_errors=True)
    return 0


def _check(label: str, got: dict[str, Any], times: dict[str, list[tuple[float, float, float]]], kind: str) -> None:
    new = got["new"]
    parts = [f"{p} {times[f'{kind} {p}'][-1][0]:.3f} s" for p in got]
    for p, snap in got.items():
        if p != "new":
            bad = sum(not _same(a.bucket, b.bucket) for a, b in zip(new, snap)) + abs(len(new) - len(snap))
            parts.append(f"{p} windows differing: {bad} of {len(new)}")
    print(f"{label}: " + ", ".join(parts), flush=True)


if __name__ == "__main__":
    raise SystemExit(main())
