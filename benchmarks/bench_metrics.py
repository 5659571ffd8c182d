"""/metrics at scale: render time, size and series of the per-round part and of a scrape, per series budget.

Synthetic published rounds of M models x 3 segments (rings) x 4 windows -- metrics, a 20-bin reliability
diagram, tcal + smce + ldtc results with ``evaluated_at``, the label-free estimates (7 metrics with intervals,
estimation errors, score drift) -- rendered, in one run and interleaved, with:

* ``before``: the exporter defaults before #35 (every diagram, every estimate, no per-window cap);
* ``default``: the agent's default configuration (``build_config`` of a minimal document, as ``calmon run``);
* ``reliability none``, ``estimates full``: the default with one key changed; ``core + tests only``: both
  diagrams and estimates off (the floor of the metric contract's per-window families);
* ``unbounded``: everything, no cap.

Prints a table: MB and series of a scrape, series per (model, segment, window) outside the diagrams, round part
rendering (``prepare``, once per round) and scrape time, min/median over the rounds.

    nice -n 10 python3 -m benchmarks.bench_metrics --models 200 --rounds 3
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

from calmon.config import build_config
from calmon.exporter.metrics import AgentMetrics, SeriesBudget
from calmon.exporter.rounds import ESTIMATED
from calmon.exporter.views import LiveView, RoundView

SEGMENTS = ("all", "web", "app")
WINDOWS = ("1h", "24h", "7d", "all")


def evaluation(model: str, segment: str, window: str) -> dict:
    tests = {t: {"statistic": 0.01, "p_value": 0.3, "decision": "calibrated", "method": t, "evaluated_at": 1.7e9}
             for t in ("tcal", "smce", "ldtc")}
    return {"model": model, "segment": segment, "window": window, "n": 12345,
            "metrics": {"ece": 0.01, "ece_l2_debiased": 1e-4, "smce": 0.01, "ldtc": 0.01, "brier": 0.2,
                        "accuracy": 0.8, "mean_confidence": 0.6},
            "reliability": [{"bin": b / 20, "events": 10, "mean_score": b / 20, "mean_outcome": b / 20}
                            for b in range(20)], "tests": tests, "predictions": 23456,
            "estimated": {m: {"value": 0.5, "lo": 0.45, "hi": 0.55} for m in ESTIMATED},
            "estimation_error": {m: 0.01 for m in ESTIMATED}, "score_drift": {"psi": 0.02, "p_value": 0.4}}


def round_state(models: int) -> RoundView:
    evs = [evaluation(f"model-{i:04d}", s, w) for i in range(models) for s in SEGMENTS for w in WINDOWS]
    return RoundView(scheduler={"evaluations": 1}, evaluations=evs,
                     state_bytes={f"model-{i:04d}": 1 for i in range(models)})


def default_budget(**exporter: object) -> SeriesBudget:
    """The budget ``calmon run`` builds from the default configuration (calmon/agent/runtime.py), ``exporter`` keys
    changed."""
    cfg = build_config({"sources": [{"path": "x"}], "windows": {"names": list(WINDOWS)}, "exporter": exporter},
                       env={})
    ex = cfg.exporter
    return SeriesBudget(ex.reliability_windows(cfg.windows), ex.max_series_per_model, ex.max_series,
                        ex.max_series_per_window, ex.estimates)


def series(body: bytes) -> tuple[int, int]:
    """Series of a scrape, and those of them per window outside the reliability diagrams."""
    lines = [line for line in body.split(b"\n") if line and not line.startswith(b"#")]
    return len(lines), sum(1 for line in lines if b'window="' in line and not line.startswith(b"calmon_reliability_"))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--models", type=int, nargs="+", default=[200])
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args(argv)
    budgets = {"before": SeriesBudget(reliability="all", max_series_per_model=5000, max_series=200_000),
               "default": default_budget(), "reliability none": default_budget(reliability="none"),
               "estimates full": default_budget(estimates="full"),
               "core + tests only": default_budget(reliability="none", estimates="none"),
               "unbounded": SeriesBudget(max_series_per_model=10**9, max_series=10**9)}
    print(f"load {os.getloadavg()[0]:.2f}; {len(SEGMENTS)} segments x {len(WINDOWS)} windows per model")
    print(f"{'models':>6} {'budget':>17} {'MB':>6} {'series':>8} {'/window':>7} {'dropped':>8} "
          f"{'prepare min/med s':>18} {'scrape min/med s':>17}")
    for m in args.models:
        st = round_state(m)
        times: dict[str, list[float]] = {k: [] for k in budgets}
        scrape: dict[str, list[float]] = {k: [] for k in budgets}
        size: dict[str, int] = {}
        count: dict[str, tuple[int, int]] = {}
        dropped: dict[str, int] = {}
        for _ in range(args.rounds):
            for name, budget in budgets.items():
                metrics = AgentMetrics(lambda: LiveView(ready=True), budget)
                t0 = time.perf_counter()
                metrics.prepare(st)
                t1 = time.perf_counter()
                body = metrics.render()
                scrape[name].append(time.perf_counter() - t1)
                times[name].append(t1 - t0)
                size[name], count[name] = len(body), series(body)
                dropped[name] = sum(n for n, _ in metrics.collector.dropped.values())
        windows = m * len(SEGMENTS) * len(WINDOWS)
        for name in budgets:
            total, per_window = count[name][0], count[name][1] / windows
            print(f"{m:6d} {name:>17} {size[name] / 1e6:6.2f} {total:8d} {per_window:7.1f} {dropped[name]:8d} "
                  f"{min(times[name]):8.3f} {statistics.median(times[name]):8.3f} "
                  f"{min(scrape[name]):8.3f} {statistics.median(scrape[name]):8.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
