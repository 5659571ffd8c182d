"""/metrics at scale: render time and size of the per-round part and of a scrape, per series budget.

Synthetic published rounds of M models x 3 segments x 4 windows (metrics, a 20-bin reliability diagram,
tcal + smce + ldtc results with ``evaluated_at``), rendered with the default budget, with
``exporter.reliability: none`` and with the default budget at 1000 models; min/median over interleaved rounds.

    nice -n 10 python3 -m benchmarks.bench_metrics --models 1 100 1000 --rounds 3
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

from calmon.exporter.metrics import AgentMetrics, SeriesBudget
from calmon.exporter.views import LiveView, RoundView


def evaluation(model: str, segment: str, window: str) -> dict:
    tests = {t: {"statistic": 0.01, "p_value": 0.3, "decision": "calibrated", "method": t, "evaluated_at": 1.7e9}
             for t in ("tcal", "smce", "ldtc")}
    return {"model": model, "segment": segment, "window": window, "n": 12345,
            "metrics": {"ece": 0.01, "ece_l2_debiased": 1e-4, "smce": 0.01, "ldtc": 0.01, "brier": 0.2,
                        "accuracy": 0.8, "mean_confidence": 0.6},
            "reliability": [{"bin": b / 20, "events": 10, "mean_score": b / 20, "mean_outcome": b / 20}
                            for b in range(20)], "tests": tests}


def round_state(models: int) -> RoundView:
    evs = [evaluation(f"model-{i:04d}", s, w) for i in range(models) for s in ("all", "web", "app")
           for w in ("1h", "24h", "7d", "all")]
    return RoundView(scheduler={"evaluations": 1}, evaluations=evs,
                     state_bytes={f"model-{i:04d}": 1 for i in range(models)})


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--models", type=int, nargs="+", default=[1, 100, 1000])
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args(argv)
    budgets = {"default": SeriesBudget(), "reliability none": SeriesBudget(reliability="none"),
               "unbounded": SeriesBudget(max_series_per_model=10**9, max_series=10**9)}
    print(f"load {os.getloadavg()[0]:.2f}")
    for m in args.models:
        st = round_state(m)
        times: dict[str, list[float]] = {k: [] for k in budgets}
        scrape: dict[str, list[float]] = {k: [] for k in budgets}
        size: dict[str, int] = {}
        for _ in range(args.rounds):
            for name, budget in budgets.items():
                metrics = AgentMetrics(lambda: LiveView(ready=True), budget)
                t0 = time.perf_counter()
                metrics.prepare(st)
                t1 = time.perf_counter()
                body = metrics.render()
                scrape[name].append(time.perf_counter() - t1)
                times[name].append(t1 - t0)
                size[name] = len(body)
        for name in budgets:
            print(f"{m:5d} models  {name:>17}: prepare (once per round) min {min(times[name]):6.3f} s median "
                  f"{statistics.median(times[name]):6.3f} s; scrape min {min(scrape[name]):6.3f} s median "
                  f"{statistics.median(scrape[name]):6.3f} s; {size[name] / 1e6:6.2f} MB")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
