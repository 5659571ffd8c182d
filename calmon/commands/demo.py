"""``calmon demo [--port PORT] [--duration SECONDS]``: the agent on a simulated stream with an injected drift.

No Kafka, no files: a simulated binary model ``fraud-demo`` (200 predictions per second, outcomes
arriving a few seconds later, two segments) is replayed with ten minutes of well-calibrated
history, then runs live; one minute after the start its scores become over-confident
(``temperature:0.5``).  The testers on the 5-minute window catch the drift within about a
minute; the console prints every evaluation round and the URLs of the status page, the
Prometheus metrics and the JSON snapshot.  The configuration is :data:`DEMO_CONFIG` (the same as
``config/demo.yaml``, which ``calmon run -c config/demo.yaml`` also runs).
"""

from __future__ import annotations

import argparse
import copy
import logging
import sys
import tempfile
import time
from typing import Any

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
}


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("demo", help="run the agent on a simulated stream with an injected calibration drift",
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


def console_hook(t0: float, drift_time: float | None, out: Any = sys.stdout) -> Any:
    """A round hook printing one line per window of segment ``all`` and marking detections."""
    state: dict[str, Any] = {"detected": False}

    def hook(evaluations: list[dict[str, Any]]) -> None:
        now = time.time()
        parts = []
        flagged = False
        for ev in evaluations:
            if ev["segment"] != "all":
                continue
            tc = ev["tests"].get("tcal", {})
            ece = ev["metrics"].get("ece")
            mark = "DRIFT" if tc.get("decision") == "miscalibrated" else "ok"
            flagged |= mark == "DRIFT" and ev["window"] == "5m"
            parts.append(f"{ev['window']}: n={ev['n']:>6} ECE={100 * (ece or 0):5.2f}% "
                         f"tcal p={_fmt_p(tc.get('p_value'))} {mark}")
        phase = "" if drift_time is None else ("before drift" if now < drift_time else
                                               f"drift +{now - drift_time:4.0f}s")
        print(f"[{now - t0:6.0f}s {phase}] " + " | ".join(parts), file=out, flush=True)
        if flagged and not state["detected"] and drift_time is not None and now >= drift_time:
            state["detected"] = True
            print(f"==> calibration drift detected {now - drift_time:.0f} s after it started "
                  "(tcal rejects on the 5m window; the CalibrationDrift alert fires on the next round)",
                  file=out, flush=True)

    return hook


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
  Evaluation every {cfg.evaluation.every:.0f} s of windows {', '.join(cfg.windows.names)}; Ctrl-C stops.""",
          flush=True)
    if not args.quiet:
        agent.round_hooks.append(console_hook(t0, drift_time))
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
