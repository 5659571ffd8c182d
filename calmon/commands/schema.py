"""``calmon schema suggest``: propose a schema mapping for records of a foreign shape, with its evidence."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from calmon.commands import SUMMARIES

SAMPLE_RECORDS = 2000  # calmon.offline.sample.SAMPLE_RECORDS: the parser imports nothing heavy (lazy imports)
INPUTS_HELP = ("files (.jsonl, .csv, .parquet, .arrow; compressed too), directories, glob patterns, or - for standard "
               "input; predictions and outcomes may be in different files")


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("schema", help=SUMMARIES["schema"],
                       description="Schema mappings from your record shape to calmon's fields (docs/schemas.md).")
    actions = p.add_subparsers(dest="action", metavar="ACTION")
    actions.required = True
    s = actions.add_parser("suggest", help="propose a schema file from sample records",
                           description="Read the first records of each input and print a schema file (YAML) that "
                                       "maps their fields to calmon's -- id, model, time, score or probs, label, "
                                       "event type -- with the evidence for each as a comment. Use it with "
                                       "`calmon check FILES --schema FILE` or a source's `schema:`.")
    s.add_argument("input", nargs="+", help=INPUTS_HELP)
    s.add_argument("-o", "--output", default=None, metavar="FILE",
                   help="write the schema file here (default: print it)")
    s.add_argument("--sample", type=int, default=SAMPLE_RECORDS, metavar="N",
                   help=f"records read per file (default {SAMPLE_RECORDS}, at most 1000000)")
    s.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if not 1 <= args.sample <= 1_000_000:
        raise ValueError(f"--sample: must be in [1, 1000000], got {args.sample}")
    from calmon.events.suggest import suggest_mapping
    from calmon.offline.sample import sample_inputs
    suggestion = suggest_mapping(sample_inputs(args.input, args.sample))
    text = suggestion.to_yaml()
    if args.output is None:
        sys.stdout.write(text)
        return 0
    from calmon.formats.jsonio import write_bytes_atomic
    write_bytes_atomic(args.output, text.encode("utf-8"))
    inputs = " ".join(args.input)
    print(f"calmon schema suggest: wrote {args.output}; next: calmon check {inputs} --schema {Path(args.output)}",
          file=sys.stderr)
    return 0
