"""Change detection on the calibration stream: false alarms, detection delay vs windowed T-Cal, cost per event.

Prints three tables (the README's figures come from ``--events 20000000 --trials 20``):

1. false alarms per 1e6 events of :class:`calmon.algorithms.changepoint.CalibrationChangeDetector` on calibrated streams
   (several score distributions, with and without label delay -- a delay permutes the order in which pairs complete);
2. detection delay in events and in event-time seconds after a drift (temperature 0.7 and 0.85, a bias shift, an
   over-confidence confined to scores above 0.8), side by side with the windowed T-Cal test on the 5-minute and the
   1-hour window evaluated every ``--every`` seconds;
3. the detector's cost per event as a ratio to the agent's decode + join + bin cost per event, same run, interleaved.

Usage: ``OPENBLAS_NUM_THREADS=1 python -m benchmarks.changepoint_eval [--events N] [--trials T] [--rate R]``
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from collections.abc import Sequence

import numpy as np

from calmon.algorithms.changepoint import SIGNALS, CalibrationChangeDetector
from calmon.stats.data import CalibrationData
from calmon.stats.grid import ScoreGrid
from calmon.testers import run_tester

DISTRIBUTIONS = {
    "uniform(0.05, 0.95)": lambda rng, n: rng.uniform(0.05, 0.95, n),
    "beta(0.5, 0.5)": lambda rng, n: np.clip(rng.beta(0.5, 0.5, n), 1e-4, 1 - 1e-4),
    "beta(2, 8)": lambda rng, n: rng.beta(2, 8, n),
}


def logit(q: np.ndarray) -> np.ndarray:
    return np.log(q) - np.log1p(-q)


def sigmoid(x: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-x))


DRIFTS = {
    "temperature 0.7": lambda q: sigmoid(logit(q) / 0.7),
    "temperature 0.85": lambda q: sigmoid(logit(q) / 0.85),
    "bias +0.3 logit": lambda q: sigmoid(logit(q) + 0.3),
    "over-confident above 0.8": lambda q: np.where(q > 0.8, sigmoid(logit(q) / 0.7), q),
}


def stream(rng: np.random.Generator, n: int, dist: str, delay: float, rate: float) -> tuple[np.ndarray, ...]:
    q = DISTRIBUTIONS[dist](rng, n)
    y = (rng.uniform(size=n) < q).astype(np.float64)
    ts = np.arange(n) / rate
    if delay > 0:  # pairs complete when their outcome arrives
        order = np.argsort(ts + rng.exponential(delay, n), kind="stable")
        q, y, ts = q[order], y[order], ts[order]
    return q, y, ts


def false_alarms(events: int, trials: int, rate: float, seed: int) -> list[dict[str, object]]:
    rows = []
    for dist in DISTRIBUTIONS:
        for delay in (0.0, 60.0):
            rng = np.random.default_rng(seed)
            alarms = {s: 0 for s in SIGNALS}
            for _ in range(trials):
                det = CalibrationChangeDetector()
                for start in range(0, events, 1_000_000):
                    q, y, ts = stream(rng, min(1_000_000, events - start), dist, delay, rate)
                    for c in det.update(q, y, ts + start / rate):
                        alarms[c.signal] += 1
            total = events * trials / 1e6
            rows.append({"scores": dist, "delay_s": delay, "events": events * trials,
                         **{s: alarms[s] / total for s in SIGNALS}, "all": sum(alarms.values()) / total})
    return rows


def tcal_rejects(q: np.ndarray, y: np.ndarray) -> bool:
    g = ScoreGrid(1024)
    g.update(q, y)
    res = run_tester("tcal", CalibrationData(n=int(q.size), grid=g), alpha=0.05, mc=500, seed=0)
    return res.decision == "miscalibrated"


def windowed_delay(q: np.ndarray, y: np.ndarray, ts: np.ndarray, t_drift: float, window: float, every: float,
                   horizon: float) -> float | None:
    """Seconds from the drift to the first round whose window test rejects (rounds every ``every`` seconds)."""
    t = (np.floor(t_drift / every) + 1) * every
    while t <= t_drift + horizon:
        sel = (ts > t - window) & (ts <= t)
        if sel.sum() >= 100 and tcal_rejects(q[sel], y[sel]):
            return float(t - t_drift)
        t += every
    return None


def delays(trials: int, rate: float, every: float, seed: int) -> list[dict[str, object]]:
    rows: list[dict[str, object]] = []
    pre, post = int(3600 * rate), int(3600 * rate)  # one hour calibrated, one hour drifted
    for name, drift in DRIFTS.items():
        rng = np.random.default_rng(seed)
        det_ev, det_s, w5, w60 = [], [], [], []
        for _ in range(trials):
            q = rng.uniform(0.05, 0.95, pre + post)
            y = (rng.uniform(size=q.size) < q).astype(np.float64)
            p = q.copy()
            p[pre:] = drift(q[pre:])
            ts = np.arange(q.size) / rate
            t_drift = pre / rate
            det = CalibrationChangeDetector()
            found = [c for c in det.update(p, y, ts) if c.detected_at >= t_drift]
            first = min(found, key=lambda c: c.detected_at) if found else None
            det_ev.append(None if first is None else first.events - pre)
            det_s.append(None if first is None else first.detected_at - t_drift)
            w5.append(windowed_delay(p, y, ts, t_drift, 300.0, every, 3600.0))
            w60.append(windowed_delay(p, y, ts, t_drift, 3600.0, every, 3600.0))
        rows.append({"drift": name, "detector_events": _med(det_ev), "detector_s": _med(det_s),
                     "tcal_5m_s": _med(w5), "tcal_1h_s": _med(w60),
                     "missed": f"{sum(d is None for d in det_s)}/{sum(d is None for d in w5)}/"
                               f"{sum(d is None for d in w60)} of {trials}"})
    return rows


def _med(xs: Sequence[float | None]) -> float | None:
    got = [x for x in xs if x is not None]
    return statistics.median(got) if got else None


def cost(events: int, rounds: int, seed: int) -> dict[str, object]:
    """Detector seconds per event against the agent's ingest seconds per event (same data, interleaved rounds)."""
    from calmon.config import build_config
    from calmon.state.agentstate import AgentState
    from calmon.state.ingest import Ingestor
    from connectors.base import Batch
    rng = np.random.default_rng(seed)
    q = rng.uniform(0.05, 0.95, events)
    y = (rng.uniform(size=events) < q).astype(np.int64)
    recs = [json.dumps({"model": "m", "ts": 1_767_225_600 + i / 100, "score": float(q[i]), "label": int(y[i])},
                       separators=(",", ":")).encode() for i in range(events)]
    batch = 65536
    t_det, t_ing = [], []
    for _ in range(rounds):
        st = AgentState(build_config({"sources": [{"path": "x"}], "limits": {"future_skew": "3650d"}}, env={}))
        ing = Ingestor(st, None, time.time)
        t0 = time.perf_counter()
        for s in range(0, events, batch):
            ing.ingest(Batch(recs[s:s + batch], {}, "bench"))
        t_ing.append((time.perf_counter() - t0) / events)
        det = CalibrationChangeDetector()
        ts = np.arange(events, dtype=np.float64)
        t0 = time.perf_counter()
        for s in range(0, events, batch):
            det.update(q[s:s + batch], y[s:s + batch], ts[s:s + batch])
        t_det.append((time.perf_counter() - t0) / events)
    ratios = sorted(d / i for d, i in zip(t_det, t_ing))
    return {"ingest_ns_per_event_min": min(t_ing) * 1e9, "detector_ns_per_event_min": min(t_det) * 1e9,
            "ratio_min": ratios[0], "ratio_median": statistics.median(ratios), "load": os.getloadavg()[0]}


def table(rows: list[dict[str, object]]) -> str:
    keys = list(rows[0])
    fmt = [(f"{v:.3g}" if isinstance(v, float) else str(v)) for r in rows for v in r.values()]
    width = [max(len(k), *(len(fmt[i * len(keys) + j]) for i in range(len(rows)))) for j, k in enumerate(keys)]
    out = ["  ".join(k.ljust(w) for k, w in zip(keys, width))]
    for i in range(len(rows)):
        out.append("  ".join(fmt[i * len(keys) + j].ljust(w) for j, w in enumerate(width)))
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--events", type=int, default=2_000_000, help="events per calibrated stream and trial")
    ap.add_argument("--trials", type=int, default=5)
    ap.add_argument("--rate", type=float, default=100.0, help="events per second of event time")
    ap.add_argument("--every", type=float, default=30.0, help="seconds between windowed T-Cal rounds")
    ap.add_argument("--cost-events", type=int, default=200_000)
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args(argv)
    print(f"# false alarms per 1e6 events ({args.trials} x {args.events:.0e} events per row)")
    print(table(false_alarms(args.events, args.trials, args.rate, args.seed)))
    print(f"\n# median detection delay after the drift ({args.trials} trials, {args.rate:g} events/s, "
          f"T-Cal rounds every {args.every:g} s; missed = detector/5m/1h within one hour)")
    print(table(delays(args.trials, args.rate, args.every, args.seed)))
    print("\n# cost per event (min over 3 interleaved rounds; ratio = detector / agent ingest)")
    print(table([cost(args.cost_events, 3, args.seed)]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
