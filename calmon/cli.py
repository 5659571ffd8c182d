"""The ``calmon`` command line: one subcommand per module in :mod:`calmon.commands`."""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Sequence

from calmon import __version__

#: Subcommand modules; each exposes ``register(subparsers)`` setting ``func(args) -> int``.
COMMANDS: tuple[str, ...] = ("run", "demo", "check", "report", "simulate", "fit", "apply", "schema")


class UsageError(ValueError):
    """Bad usage or input: printed as one line, exit code 2."""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="calmon", description="Calibration monitor for production ML.")
    parser.add_argument("--version", action="version", version=f"calmon {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    for name in COMMANDS:
        importlib.import_module(f"calmon.commands.{name}").register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except BrokenPipeError:  # e.g. `calmon simulate | head`: not an error
        devnull = open(os.devnull, "w")  # noqa: SIM115 -- stdout must stay valid until exit
        os.dup2(devnull.fileno(), sys.stdout.fileno())
        return 0
    except (UsageError, ValueError, OSError) as e:  # the commands raise these for bad input
        print(f"calmon {args.command}: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
