"""The ``calmon`` command line: one subcommand per module in :mod:`calmon.commands`.

A command's module is imported only when that command runs (``calmon check`` pulls in scipy and the testers,
``calmon report`` matplotlib): ``calmon --version``, ``calmon --help``, no command or an unknown one import none of
them -- the list comes from :data:`calmon.commands.SUMMARIES`. ``tests/test_imports_light.py`` holds the module sets.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Sequence

from calmon import __version__
from calmon.commands import SUMMARIES
from calmon.formats.extras import MissingExtra

#: Subcommand modules; each exposes ``register(subparsers)`` setting ``func(args) -> int``.
COMMANDS: tuple[str, ...] = tuple(SUMMARIES)


class UsageError(ValueError):
    """Bad usage or input: printed as one line, exit code 2."""


def build_parser(argv: Sequence[str] | None = None) -> argparse.ArgumentParser:
    """The parser of ``argv``: the command ``argv`` names registered in full, the others by their summary only.

    ``build_parser()`` (no ``argv``) registers every command in full, as the reference generator needs.
    """
    parser = argparse.ArgumentParser(prog="calmon", description="Calibration monitor for production ML.")
    parser.add_argument("--version", action="version", version=f"calmon {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    full = _needed(argv)
    for name in COMMANDS:
        if name in full:
            importlib.import_module(f"calmon.commands.{name}").register(sub)
        elif argv is not None and full == ():
            # Top-level help, no command or an unknown one: argparse lists (or offers) the names with their
            # summaries and exits before it would parse a command's arguments.
            sub.add_parser(name, help=SUMMARIES[name], add_help=False)
    return parser


def _needed(argv: Sequence[str] | None) -> Sequence[str]:
    """The commands whose modules parsing ``argv`` needs (the top level has only ``-h`` and ``--version``)."""
    if argv is None:
        return COMMANDS
    first = next((a for a in argv if not a.startswith("-")), None)
    if first in COMMANDS:
        return (first,)
    return ()  # --version, help, no command or an unknown one: the summaries are enough


def main(argv: Sequence[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    try:
        args = build_parser(argv).parse_args(argv)
    except MissingExtra as e:  # a command module that needs an extra at import
        print(e, file=sys.stderr)
        return 2
    try:
        return int(args.func(args) or 0)
    except BrokenPipeError:  # e.g. `calmon simulate | head`: not an error
        devnull = open(os.devnull, "w")  # noqa: SIM115 -- stdout must stay valid until exit
        os.dup2(devnull.fileno(), sys.stdout.fileno())
        return 0
    except MissingExtra as e:  # one line naming the extra to install (calmon.formats.extras)
        print(e, file=sys.stderr)  # already names the feature: "calmon report needs matplotlib: pip install ..."
        return 2
    except (UsageError, ValueError, OSError) as e:  # the commands raise these for bad input
        print(f"calmon {args.command}: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
