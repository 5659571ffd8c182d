"""``calmon simulate``: write a synthetic event stream as JSONL."""

from __future__ import annotations

import argparse
import math
import sys

from calmon.commands import SUMMARIES
from connectors.simulation import SimulationSpec, Simulator

#: ``--classes`` at most: the agent's largest class limit (``limits.max_classes``).
MAX_CLASSES = 100_000


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("simulate", help=SUMMARIES["simulate"],
                       description="Write a synthetic event stream as JSONL (to standard output by default).")
    p.add_argument("-n", "--events", type=int, default=10000, help="number of predictions (default 10000)")
    p.add_argument("--classes", type=int, default=2, help="2 for binary scores, K > 2 for probabilities")
    p.add_argument("--model", default="sim", help="model name (default sim)")
    p.add_argument("--miscalibration", default="none",
                   help="none | temperature:T | bias:B | bump:S,RHO[,M] (T-Cal eq. 10; binary)")
    p.add_argument("--drift", default=None, help="miscalibration from --drift-at on (same syntax)")
    p.add_argument("--drift-at", type=int, default=None, help="index of the first drifted prediction")
    p.add_argument("--delay", type=float, default=0.0,
                   help="mean outcome delay in seconds; > 0 writes separate, out-of-order outcome events")
    p.add_argument("--rate", type=float, default=100.0, help="predictions per second of event time")
    p.add_argument("--start", type=float, default=1_767_225_600.0, help="event time of the first prediction")
    p.add_argument("--segments", default="", help="comma-separated segment values assigned at random")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("-o", "--output", default="-", help="output file (default: standard output)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if args.events < 0:
        raise ValueError("--events must be >= 0")
    if args.drift is not None and args.drift_at is None:
        raise ValueError("--drift needs --drift-at")
    if args.classes > MAX_CLASSES:
        raise ValueError(f"--classes must be at most {MAX_CLASSES:,} (the agent's largest limits.max_classes), "
                         f"got {args.classes}")
    for flag in ("rate", "start", "delay"):
        if not math.isfinite(getattr(args, flag)):
            raise ValueError(f"--{flag} must be a finite number, got {getattr(args, flag)}")
    spec = SimulationSpec(classes=args.classes, model=args.model, seed=args.seed,
                          miscalibration=args.miscalibration, drift=args.drift, drift_at=args.drift_at,
                          start=args.start, rate=args.rate, delay=args.delay,
                          segments=[s for s in args.segments.split(",") if s])
    sim = Simulator(spec)
    out = sys.stdout.buffer if args.output == "-" else open(args.output, "wb")  # noqa: SIM115
    try:
        chunk: list[bytes] = []
        for line in sim.stream(args.events):
            chunk.append(line)
            if len(chunk) >= 8192:
                out.write(b"\n".join(chunk) + b"\n")
                chunk.clear()
        if chunk:
            out.write(b"\n".join(chunk) + b"\n")
        out.flush()
    finally:
        if out is not sys.stdout.buffer:
            out.close()
    return 0
