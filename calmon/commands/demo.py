"""``calmon demo [--port PORT] [--duration SECONDS]``: the agent on a simulated stream with an injected drift.

No Kafka, no files: a simulated binary model ``fraud-demo`` (200 predictions per second, outcomes
arriving a few seconds later, two segments) is replayed with ten minutes of well-calibrated
history, then runs live; one minute after the start its scores become over-confident
(``temperature:0.5``).  The testers on the 5-minute window catch the drift within about a
minute, the ``CalibrationDrift`` alert fires after two rejecting rounds, and the scheduled
recalibration publishes a refreshed calibrator with its held-out before/after.  The console prints
every evaluation round, says each of these events in plain words, and gives the URLs of the status
page, the Prometheus metrics and the JSON snapshot.  The configuration is :data:`DEMO_CONFIG` (the same as
``config/demo.yaml``, which ``calmon run -c config/demo.yaml`` also runs).
"""

from __future__ import annotations

import argparse
import copy
import logging
import sys
import tempfile
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from calmon.commands import SUMMARIES

if TYPE_CHECKING:
    from calmon.evaluate.types import Evaluation
#: The demo's configuration (kept identical to config/demo.yaml by tests/test_config.py).
DEMO_CONFIG: dict[str, Any] = {
    "state_dir": "./calmon-demo-state",
    "sources": [{
        "name": "simulated",
        "type": "simulate",
        "options": {"model": "fraud-demo", "rate": 200.0, "history": 600.0, "delay": 5.0, "seed": 7,
                    "segments": ["web", "mobile"], "miscalibration": "none", "drift": "temperature:0.5",
                    "drift_after": 60.0},
    }],
    "dead_letter": {"type": "none"},
    "models": {"fraud-demo": {"classes": 2, "bins": 1024, "reservoir": 2000, "segments": ["mobile"]}},
    "join": {"ttl": "2m", "max_pending": 100000},
    "windows": {"names": ["5m", "30m"], "allowed_lateness": "10m",
                "tiers": [{"width": "1m", "count": 30}, {"width": "1h", "count": 24}]},
    "evaluation": {"every": "15s", "budget": "12s", "alpha": 0.01, "mc": 500, "min_events": 500,
                   "tests": [{"name": "tcal"}, {"name": "smce"}]},
    "exporter": {"address": "127.0.0.1", "port": 9464},
    "checkpoint": {"enabled": False},
    "alerts": {"rules": [{"name": "CalibrationDrift", "kind": "test_rejected", "test": "tcal", "consecutive": 2,
                          "clear_after": 3, "severity": "warning", "windows": ["5m"]}]},
    # The whole loop: refit on the 5-minute window's reservoir every minute, publish only what beats
    # the calibrator in service on held-out rows (so a refreshed calibrator follows the drift).
    "recalibration": {"enabled": True, "every": "60s", "window": "5m", "methods": ["temperature", "platt"],
                      "options": {"min_train": 200, "min_holdout": 50}},
}


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("demo", help=SUMMARIES["demo"],
                       description="Run the agent on an embedded simulated stream (no Kafka needed); a "
                                   "calibration drift starts after one minute and the testers catch it.")
    p.add_argument("--port", type=int, default=9464, help="HTTP port of /metrics and the status page "
                                                          "(default 9464; 0 picks a free port)")
    p.add_argument("--address", default="127.0.0.1", help="listening address (default 127.0.0.1)")
    p.add_argument("--duration", type=float, default=None, help="stop after this many seconds (default: until Ctrl-C)")
    p.add_argument("--drift-after", type=float, default=60.0, help="seconds until the drift starts (default 60)")
    p.add_argument("--quiet", action="store_true", help="do not print the evaluation rounds")
    p.set_defaults(func=run)


def _fmt_p(p: Any) -> str:
    return "  n/a " if p is None else f"{p:6.4f}"


def _pct(v: Any) -> str:
    return "n/a" if not isinstance(v, (int, float)) else f"{100 * v:.2f} %"


def _num(v: Any) -> str:
    return "n/a" if not isinstance(v, (int, float)) else f"{v:.4f}"


class _Console:
    """The demo's narrator: one line per round, plus plain sentences when something happens.

    Sentences: the drift has started, the first rejection after it, an alert firing or resolving,
    a calibrator published (with its held-out ECE before/after).
    """

    def __init__(self, t0: float, drift_time: float | None, out: Any, published: Callable[[], Any] | None,
                 url: str) -> None:
        self.t0, self.drift_time, self.out, self.published, self.url = t0, drift_time, out, published, url
        self.drift_said = self.detected = False
        self.alerts: dict[tuple[str, ...], str] = {}
        self.versions: dict[str, Any] = {}

    def say(self, text: str) -> None:
        print(f"==> {time.strftime('%H:%M:%S')} {text}", file=self.out, flush=True)

    def __call__(self, evaluations: list[Evaluation]) -> None:
        now = time.time()
        since = None if self.drift_time is None else now - self.drift_time
        drifted = since is not None and since >= 0
        if since is not None and drifted and not self.drift_said:
            self.drift_said = True
            self.say(f"the drift has started ({since:.0f} s ago): the model's scores are now "
                     "over-confident (too close to 0 and 1); watch the testers catch it")
        parts, first = [], None
        for ev in evaluations:
            if ev["segment"] != "all":
                continue
            tc = ev["tests"].get("tcal", {})
            bad = tc.get("decision") == "miscalibrated"
            if bad and ev["window"] == "5m":
                first = tc
            parts.append(f"{ev['window']}: n={ev['n']:>6} ECE={100 * (ev['metrics'].get('ece') or 0):5.2f}% "
                         f"tcal p={_fmt_p(tc.get('p_value'))} {'REJECTS' if bad else 'ok' if tc else 'no result'}")
        phase = "" if since is None else (f" | drift +{since:.0f} s" if drifted else " | calibrated phase")
        print(f"[{now - self.t0:5.0f} s since start{phase}] " + " | ".join(parts), file=self.out, flush=True)
        if first is not None and since is not None and drifted and not self.detected:
            self.detected = True
            self.say(f"calibration drift detected {since:.0f} s after it started: T-Cal "
                     f"rejects calibration on the 5m window (p = {_fmt_p(first.get('p_value')).strip()} < "
                     f"alpha = {first.get('alpha', 0.01)}); the CalibrationDrift alert fires after 2 such rounds")
        if self.published is not None:
            self._news(self.published())

    def _news(self, pub: Any) -> None:
        for a in getattr(pub, "alerts", ()) or ():
            key = (str(a.get("alert")), str(a.get("model")), str(a.get("segment")), str(a.get("window")))
            state, old = str(a.get("state")), self.alerts.get(key)
            self.alerts[key] = state
            if state != old and state in ("firing", "resolved") and key[2] == "all":
                self.say(f"ALERT {key[0]} is {state.upper()} for {key[1]} (segment {key[2]}, window {key[3]}); "
                         f"see the status page {self.url}/" if state == "firing" else
                         f"alert {key[0]} resolved for {key[1]} (segment {key[2]}, window {key[3]})")
        for model, c in (getattr(pub, "calibrators", {}) or {}).items():
            version, old = c.get("version"), self.versions.get(model)
            self.versions[model] = version
            if version is not None and version != old:
                before, after = c.get("before") or {}, c.get("after") or {}
                n = before.get("n")
                self.say(f"recalibration: published {c.get('method')} calibrator v{version} for {model} (it beats "
                         f"the one in service on {n if n is not None else 'the'} held-out rows): log-loss "
                         f"{_num(before.get('nll'))} -> {_num(after.get('nll'))}, ECE {_pct(before.get('ece'))} "
                         f"raw -> {_pct(after.get('ece'))} recalibrated")


def console_hook(t0: float, drift_time: float | None, out: Any = sys.stdout,
                 published: Callable[[], Any] | None = None, url: str = "") -> Callable[[list[Evaluation]], None]:
    """A round hook printing one line per window of segment ``all`` and the demo's events in words.

    ``published`` returns the agent's latest :class:`calmon.agent.views.Published` (alerts and
    calibrators); without it only the evaluation lines and the detection are printed.
    """
    return _Console(t0, drift_time, out, published, url)


def demo_config(port: int, address: str, state_dir: str, drift_after: float) -> Any:
    """The validated demo configuration for a port and state directory."""
    from calmon.config import build_config
    doc = copy.deepcopy(DEMO_CONFIG)
    doc["state_dir"] = state_dir
    doc["exporter"].update(port=port, address=address)
    doc["sources"][0]["options"]["drift_after"] = drift_after
    return build_config(doc, env={})


def run(args: argparse.Namespace) -> int:
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr, format="%(levelname)s %(name)s: %(message)s")
    from calmon.agent.runtime import Agent, StartupError
    from calmon.commands.run import install_signal_handlers
    from calmon.config import ConfigError
    state_dir = tempfile.mkdtemp(prefix="calmon-demo-")
    try:
        cfg = demo_config(args.port, args.address, state_dir, args.drift_after)
        agent = Agent(cfg)
        agent.open()
    except (ConfigError, StartupError, OSError) as exc:
        print(f"calmon demo: cannot start: {exc} (try --port 0 for a free port)", file=sys.stderr)
        return 2
    src = agent.sources[0]
    url = agent.http.url if agent.http is not None else "(exporter disabled)"
    t0 = time.time()
    drift_time = getattr(src, "drift_time", None)
    print(f"""calmon demo: monitoring the simulated model 'fraud-demo' (200 predictions/s, outcomes ~5 s later).
  A calibration drift (over-confident scores, temperature 0.5) starts in {args.drift_after:.0f} s, at \
{time.strftime('%H:%M:%S', time.localtime(drift_time or t0))}.
  Where to look:
    status page          {url}/
    Prometheus metrics   {url}/metrics      (e.g. calmon_test_p_value, calmon_ece, calmon_alert_active)
    JSON snapshot        {url}/api/status
    health / readiness   {url}/healthz  {url}/readyz
  Grafana: point a Prometheus at {url}/metrics and import deploy/grafana (see README).
  Evaluation every {cfg.evaluation.every:.0f} s of windows {', '.join(cfg.windows.names)}.  Recalibration: every \
{cfg.recalibration.every:.0f} s a calibrator ({', '.join(cfg.recalibration.methods)}) is refit on the \
{cfg.recalibration.window} window and published when it beats the one in service on held-out rows.
  The lines below: one per evaluation round; "==>" lines say what happened.  Ctrl-C stops.""",
          flush=True)
    if not args.quiet:
        agent.round_hooks.append(console_hook(t0, drift_time, published=lambda: agent.published, url=url))
    install_signal_handlers(agent)
    code = agent.run(max_seconds=args.duration)
    print("calmon demo: stopped.", flush=True)
    return code


def main(argv: list[str] | None = None) -> int:
    """Standalone entry point (``python -m calmon.commands.demo``), same as ``calmon demo``."""
    parser = argparse.ArgumentParser(prog="calmon")
    register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["demo", *(sys.argv[1:] if argv is None else argv)])
    return int(args.func(args))


if __name__ == "__main__":
    sys.exit(main())
