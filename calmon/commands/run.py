"""``calmon run -c FILE [--role all|ingest|evaluate]``: the long-running agent.

``--role all`` (the default) is the single-process agent.  ``ingest`` and ``evaluate`` are the two
stages of the partitioned agent on Kafka (:mod:`calmon.cluster`, ``docs/cluster.md``): ingest workers
turn event partitions into statistic deltas, evaluators own the models' windows and ``/metrics``.

Exit codes: 0 after a clean stop (SIGTERM/SIGINT, or every source exhausted with
``--exit-when-done``), 2 with one line on stderr for a bad configuration (naming the key
path and the reason) or a startup failure.
"""

from __future__ import annotations

import argparse
import logging
import signal
import sys
from typing import Any

from calmon.commands import SUMMARIES
from calmon.config import ConfigError, load_config

ROLES = ("all", "ingest", "evaluate")


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("run", help=SUMMARIES["run"],
                       description="Run the agent: ingest events, keep windowed statistics, evaluate on a "
                                   "schedule, serve /metrics. Environment variables CALMON__SECTION__KEY "
                                   "override configuration values.")
    p.add_argument("-c", "--config", required=True, help="YAML configuration file (see config/calmon.example.yaml)")
    p.add_argument("--check-config", action="store_true", help="validate the configuration, print it and exit")
    p.add_argument("--exit-when-done", action="store_true",
                   help="stop after a final evaluation and checkpoint when every source is exhausted, and print the "
                        "verdict table (model, segment, window, n, ECE, tests, verdict)")
    p.add_argument("--results", metavar="FILE", default=None,
                   help="when the agent stops, write its /api/status document (every window's metrics, tests and "
                        "verdict) to FILE as JSON")
    p.add_argument("--port", type=int, default=None, help="override exporter.port")
    p.add_argument("--log-level", default="INFO", choices=["DEBUG", "INFO", "WARNING", "ERROR"])
    p.add_argument("--role", default="all", choices=list(ROLES),
                   help="all: the single-process agent (default); ingest / evaluate: one stage of the partitioned "
                        "agent on Kafka (configuration section cluster; see docs/cluster.md)")
    p.set_defaults(func=run)


def install_signal_handlers(agent: Any) -> None:
    """SIGTERM and SIGINT stop the agent after its current batch (then it checkpoints and exits)."""
    def handler(signum: int, frame: Any) -> None:
        logging.getLogger("calmon.agent").info("signal %d: stopping", signum)
        on_signal = getattr(agent, "on_signal", None)  # the agent times and logs its stop; a stage just stops
        if on_signal is not None:
            on_signal(signal.Signals(signum).name)
        else:
            agent.stop()

    signal.signal(signal.SIGTERM, handler)
    signal.signal(signal.SIGINT, handler)


def run(args: argparse.Namespace) -> int:
    logging.basicConfig(level=getattr(logging, args.log_level), stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        cfg = load_config(args.config)
        if args.port is not None:
            if not 0 <= args.port <= 65535:
                raise ConfigError("exporter.port", f"must be an integer in [0, 65535], got {args.port}")
            cfg.exporter.port = args.port
    except ConfigError as exc:
        print(f"calmon run: configuration error: {exc}", file=sys.stderr)
        return 2
    if args.exit_when_done:
        cfg.ingest.exit_when_done = True
    if args.role != "all":
        return run_stage(args, cfg)
    from calmon.agent.runtime import Agent
    try:
        agent = Agent(cfg)  # validates testers, their parameters, alert rules and recalibration methods
    except ConfigError as exc:
        print(f"calmon run: configuration error: {exc}", file=sys.stderr)
        return 2
    if args.check_config:
        return print_config(cfg)
    return serve(agent, results=args.results, table=args.exit_when_done)


def print_config(cfg: Any) -> int:
    import json

    print(json.dumps(cfg.to_dict(), indent=2, default=str))
    return 0


def serve(agent: Any, results: str | None = None, table: bool = False) -> int:
    """Open the agent (single-process or evaluator), serve, run until stopped.

    Then write the ``/api/status`` document to ``results`` (if given) and print the verdict table (if ``table``).
    """
    from calmon.agent.runtime import StartupError
    try:
        agent.open()
    except (StartupError, ValueError, OSError) as exc:
        print(f"calmon run: cannot start: {exc}", file=sys.stderr)
        agent.close()
        return 2
    install_signal_handlers(agent)
    if agent.http is not None:
        print(f"calmon run: serving {agent.http.url}/metrics", file=sys.stderr, flush=True)
    from calmon.events.schema import MappingError
    try:
        rc = int(agent.run())
    except MappingError as exc:  # a mapped path that matched none of the first records: the batch was not applied
        print(f"calmon run: schema error: {exc}", file=sys.stderr)
        return 2
    if results is None and not table:
        return rc
    doc = agent.status()
    if results is not None:
        from calmon.formats.jsonio import write_json_atomic
        try:
            write_json_atomic(results, doc)
        except (OSError, ValueError) as exc:
            print(f"calmon run: cannot write --results {results}: {exc}", file=sys.stderr)
            return 2
        print(f"calmon run: wrote the status document to {results}", file=sys.stderr)
    if table:
        from calmon.exporter.status.table import verdict_table
        print(verdict_table(doc), flush=True)
    return rc


def run_stage(args: argparse.Namespace, cfg: Any) -> int:
    """``--role ingest`` or ``--role evaluate``."""
    from calmon.agent.runtime import StartupError
    from calmon.cluster.evaluate import evaluate_agent
    from calmon.cluster.ingest import IngestWorker
    from calmon.cluster.topics import ClusterError
    if not cfg.cluster.bootstrap_servers:
        print(f"calmon run: configuration error: cluster.bootstrap_servers: required by --role {args.role}",
              file=sys.stderr)
        return 2
    if args.check_config:
        return print_config(cfg)
    if args.role == "evaluate":
        try:
            return serve(evaluate_agent(cfg))
        except ConfigError as exc:
            print(f"calmon run: configuration error: {exc}", file=sys.stderr)
            return 2
    worker = IngestWorker(cfg)
    install_signal_handlers(worker)
    try:
        if cfg.exporter.enabled:  # first: /healthz answers and /readyz is false while the broker is unreachable
            http = worker.start_http()
            print(f"calmon run: serving {http.url}/metrics", file=sys.stderr, flush=True)
        if not worker.open_retrying():  # stopped while waiting for the broker
            worker.close()
            return 0
    except (StartupError, ClusterError, ValueError, OSError) as exc:
        print(f"calmon run: cannot start: {exc}", file=sys.stderr)
        worker.close()
        return 2
    return worker.run()


def main(argv: list[str] | None = None) -> int:
    """Standalone entry point (``python -m calmon.commands.run``), same as ``calmon run``."""
    parser = argparse.ArgumentParser(prog="calmon")
    register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["run", *(sys.argv[1:] if argv is None else argv)])
    return int(args.func(args))


if __name__ == "__main__":
    sys.exit(main())
