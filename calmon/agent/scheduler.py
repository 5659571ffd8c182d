"""The evaluation scheduler: metrics and testers for every (model, segment, window), off the ingestion path.

Every ``evaluation.every`` seconds a background thread asks the runtime for a *snapshot*: the
window sums of every ring, computed under the state lock (a few bucket merges, milliseconds)
and then owned by the scheduler.  All the expensive work -- summary metrics, reliability
diagram, testers with Monte Carlo calibration, alert rules, recalibration refresh -- runs on
that snapshot without the lock, so ingestion never waits for a tester.

A round has a time budget: testers still to run when it is spent are skipped (their previous
results are not reused) and the round counts as an overrun.  Rounds are timed into the
``calmon_evaluation_duration_seconds`` histogram.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable
from typing import Any

from calmon.agent.state import BucketStats
from calmon.algorithms.ece import reliability, summary
from calmon.config import ConfigError, EvaluationConfig
from calmon.testers import REGISTRY, load_builtin, run_tester

log = logging.getLogger("calmon.agent")

#: Keys of ``summary()`` exported as metrics (and shown on the status page).
SUMMARY_KEYS = ("ece", "ece_l2_debiased", "ece_l2_plugin", "l2_bins", "brier", "accuracy", "mean_confidence",
                "base_rate", "classwise_ece")


#: Modules registering testers, imported when present (in addition to ``calmon.testers.BUILTIN_MODULES``).
TESTER_MODULES = ("calmon.algorithms.tcal", "calmon.algorithms.smooth", "calmon.algorithms.ldtc",
                  "calmon.algorithms.multiclass_lp")


def check_testers(cfg: EvaluationConfig, path: str = "evaluation.tests") -> None:
    """Import the tester modules and fail with the key path if a configured tester is unknown."""
    import importlib

    load_builtin()
    for mod in TESTER_MODULES:
        try:
            importlib.import_module(mod)
        except ImportError:
            pass
    for i, t in enumerate(cfg.tests):
        if t.name not in REGISTRY:
            raise ConfigError(f"{path}.{i}.name", f"unknown tester {t.name!r} (known: {', '.join(sorted(REGISTRY))})")


def clean(x: Any) -> Any:
    """JSON-safe copy: non-finite floats become ``None``."""
    if isinstance(x, float) and not math.isfinite(x):
        return None
    if isinstance(x, dict):
        return {k: clean(v) for k, v in x.items()}
    if isinstance(x, list | tuple):
        return [clean(v) for v in x]
    return x


def insufficient(name: str, n: int, minimum: int) -> dict[str, Any]:
    return {"statistic": None, "p_value": None, "decision": "insufficient data", "method": name,
            "reason": f"{n} events < evaluation.min_events = {minimum}"}


def evaluate_window(model: str, segment: str, window: str, bucket: BucketStats, cfg: EvaluationConfig,
                    deadline: float = math.inf, clock: Callable[[], float] = time.monotonic) -> tuple[dict, bool]:
    """Metrics, reliability diagram and tester results of one window's statistics.

    Parameters
    ----------
    model, segment, window
        Labels of the evaluation.
    bucket
        The window's summed statistics.
    cfg
        Evaluation settings (testers, alpha, mc, seed, min_events).
    deadline
        ``clock()`` value after which remaining testers are skipped.

    Returns
    -------
    tuple
        The evaluation dict (status-page shape: ``model, segment, window, n, metrics,
        reliability, tests``) and whether a tester was skipped for lack of time.

    Examples
    --------
    >>> import numpy as np
    >>> from calmon.config import EvaluationConfig
    >>> b = BucketStats(2, bins=64, reservoir=0)
    >>> b.update(np.array([0.2, 0.8, 0.8, 0.8]), None, np.array([0, 1, 1, 0]))
    >>> ev, skipped = evaluate_window("m", "all", "1h", b, EvaluationConfig(tests=[], min_events=1))
    >>> ev["n"], round(ev["metrics"]["ece"], 3), ev["reliability"][16]["events"]
    (4, 0.15, 3)
    """
    stats = bucket.stats
    n = stats.count
    s = summary(stats)
    metrics = {k: s[k] for k in SUMMARY_KEYS if k in s}
    tests: dict[str, Any] = {}
    skipped = False
    data = stats.calibration_data() if n >= cfg.min_events and cfg.tests else None
    for t in cfg.tests:
        if data is None:
            tests[t.name] = insufficient(t.name, n, cfg.min_events)
            continue
        if clock() > deadline:
            skipped = True
            continue
        try:
            tests[t.name] = run_tester(t.name, data, alpha=cfg.alpha, mc=cfg.mc, seed=cfg.seed, **t.params)
        except Exception as exc:  # noqa: BLE001 - one failing tester must not stop the round
            log.warning("tester %s failed on %s/%s/%s: %s", t.name, model, segment, window, exc)
            tests[t.name] = {"error": f"{type(exc).__name__}: {exc}"}
    for name in ("smce", "ldtc"):
        r = tests.get(name)
        if isinstance(r, dict) and r.get("statistic") is not None:
            metrics[name] = r.get("estimate", r["statistic"])
    ev = {"model": model, "segment": segment, "window": window, "n": n, "metrics": metrics,
          "reliability": reliability(bucket.rel), "tests": tests}
    return clean(ev), skipped


class Scheduler:
    """Background thread running evaluation rounds.

    Parameters
    ----------
    round_fn
        Runs one round (``round_fn() -> None``); the runtime's ``evaluate_round``.
    every
        Seconds between the starts of rounds (the first round comes one period after the start,
        or at once when :meth:`trigger` is called).

    Examples
    --------
    >>> calls = []
    >>> s = Scheduler(lambda: calls.append(1), every=3600).start()
    >>> s.trigger(); s.wait_round(0, timeout=10)
    True
    >>> s.stop(); len(calls)
    1
    """

    def __init__(self, round_fn: Callable[[], None], every: float) -> None:
        self.round_fn = round_fn
        self.every = float(every)
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._done = threading.Condition()
        self.rounds = 0
        self.thread = threading.Thread(target=self._loop, name="calmon-scheduler", daemon=True)

    def start(self) -> Scheduler:
        self.thread.start()
        return self

    def trigger(self) -> None:
        """Run a round now (e.g. when a read-once source is exhausted)."""
        self._wake.set()

    def wait_round(self, after: int, timeout: float, cancel: threading.Event | None = None) -> bool:
        """Wait until more than ``after`` rounds have completed (or ``cancel`` is set, or ``timeout``)."""
        deadline = time.monotonic() + timeout
        with self._done:
            while self.rounds <= after:
                left = deadline - time.monotonic()
                if left <= 0 or (cancel is not None and cancel.is_set()) or not self.thread.is_alive():
                    return False
                self._done.wait(min(left, 0.2))
            return True

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()

    def alive(self) -> bool:
        return self.thread.is_alive()

    def _loop(self) -> None:
        next_at = time.monotonic() + self.every  # the first round after one period (or when triggered)
        while not self._stop.is_set():
            self._wake.wait(max(0.0, next_at - time.monotonic()))
            if self._stop.is_set():
                return
            self._wake.clear()
            next_at = time.monotonic() + self.every
            try:
                self.round_fn()
            except Exception:  # noqa: BLE001 - keep scheduling; the error is logged
                log.exception("evaluation round failed")
            with self._done:
                self.rounds += 1
                self._done.notify_all()
