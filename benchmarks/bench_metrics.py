"""/metrics at scale: render time, size and series of the per-round part and of a scrape, per series budget.

Synthetic published rounds of M models x 3 segments (rings) x 4 windows -- metrics, a 20-bin reliability
diagram, tcal + smce + ldtc results with ``evaluated_at``, the label-free estimates (7 metrics with intervals,
estimation errors, score drift) -- rendered, in one run and interleaved, with:

* ``before``: the exporter defaults before #35 (every diagram, every estimate, no per-window cap, all in one
  ``/metrics``);
* ``default``: the agent's default configuration (``build_config`` of a minimal document, as ``calmon run``);
* ``reliability none``, ``estimates full``: the default with one key changed; ``core + tests only``: both
  diagrams and estimates off (the floor of the metric contract's per-window families);
* ``unbounded``: everything, no cap.

Prints a table: MB (and gzipped, as Prometheus asks for it) and series of a plain ``/metrics`` scrape, series per
(model, segment, window) outside the diagrams, MB and series of the detail (``/metrics?collect[]=estimates&
collect[]=details&collect[]=reliability``, the shipped second scrape job), round part rendering (``prepare``, once
per round) and the plain scrape's time, min/median over the rounds.  The values are full-precision floats (as a
round publishes them), so the bytes are those of a real agent's.

    nice -n 10 python3 -m benchmarks.bench_metrics --models 200 --rounds 3
"""

from __future__ import annotations

import argparse
import gzip
import os
import statistics
import time

from calmon.config import build_config
from calmon.exporter.metrics import AgentMetrics, SeriesBudget
from calmon.exporter.rounds import DEFAULT_COLLECT, ESTIMATED, TIERS
from calmon.exporter.views import LiveView, RoundView

SEGMENTS = ("all", "web", "app")
WINDOWS = ("1h", "24h", "7d", "all")


def evaluation(model: str, segment: str, window: str) -> dict:
    seed = sum(map(ord, model + segment + window))
    f = lambda k: ((seed * 7919 + k * 104729) % 99991) / 99991.0 + 1e-9  # noqa: E731  # full-precision floats
    tests = {t: {"statistic": f(i), "p_value": f(i + 3), "decision": "calibrated", "method": t,
                 "evaluated_at": 1.7e9 + f(i + 6)} for i, t in enumerate(("tcal", "smce", "ldtc"))}
    return {"model": model, "segment": segment, "window": window, "n": 12345,
            "metrics": {"ece": f(10), "ece_l2_debiased": f(11) / 1e3, "smce": f(12), "ldtc": f(13), "brier": f(14),
                        "accuracy": f(15), "mean_confidence": f(16)},
            "reliability": [{"bin": b / 20, "events": 10 + b, "mean_score": f(20 + b), "mean_outcome": f(40 + b)}
                            for b in range(20)], "tests": tests, "predictions": 23456,
            "estimated": {m: {"value": f(60 + i), "lo": f(70 + i), "hi": f(80 + i)} for i, m in enumerate(ESTIMATED)},
            "estimation_error": {m: f(90 + i) for i, m in enumerate(ESTIMATED)},
            "score_drift": {"psi": f(98), "p_value": f(99)}}


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


DETAIL = [t for t in TIERS if t not in DEFAULT_COLLECT]


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
    print(f"{'models':>6} {'budget':>17} {'MB':>6} {'gzip MB':>7} {'series':>8} {'/window':>7} {'detail MB':>9} "
          f"{'series':>8} {'dropped':>8} {'prepare min/med s':>18} {'scrape min/med s':>17}")
    for m in args.models:
        st = round_state(m)
        times: dict[str, list[float]] = {k: [] for k in budgets}
        scrape: dict[str, list[float]] = {k: [] for k in budgets}
        size: dict[str, int] = {}
        zipped: dict[str, int] = {}
        detail: dict[str, tuple[int, int]] = {}
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
                rest = metrics.render(DETAIL)
                if name == "before":  # one /metrics then
                    body, rest = body + rest, b""
                size[name], count[name] = len(body), series(body)
                zipped[name] = len(gzip.compress(body, compresslevel=1))
                detail[name] = (len(rest), series(rest)[0])
                dropped[name] = sum(n for n, _ in metrics.collector.dropped.values())
        windows = m * len(SEGMENTS) * len(WINDOWS)
        for name in budgets:
            total, per_window = count[name][0], count[name][1] / windows
            print(f"{m:6d} {name:>17} {size[name] / 1e6:6.2f} {zipped[name] / 1e6:7.2f} {total:8d} {per_window:7.1f} "
                  f"{detail[name][0] / 1e6:9.2f} {detail[name][1]:8d} {dropped[name]:8d} "
                  f"{min(times[name]):8.3f} {statistics.median(times[name]):8.3f} "
                  f"{min(scrape[name]):8.3f} {statistics.median(scrape[name]):8.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
