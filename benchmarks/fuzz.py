"""The fuzz suite (``tests/fuzz``) at length: many examples per property, then a table of what was fed.

Usage::

    python -m benchmarks.fuzz --examples 2000             # each property 2000 examples (CI runs 12)
    python -m benchmarks.fuzz --examples 50 -k mapping    # one property

Runs pytest on ``tests/fuzz`` in this process with ``CALMON_FUZZ_EXAMPLES`` set, so the harness's counters
(records, hostile records, files, replays) can be printed after it, with the wall time, the peak RSS and the
machine's load. Exit status: pytest's (0 when no property found a counterexample). A counterexample is printed
by hypothesis as a reproducible ``@reproduce_failure`` blob; make it a regression test.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--examples", type=int, default=200, help="examples per property (default 200)")
    ap.add_argument("-k", default=None, help="pytest -k expression selecting properties")
    args = ap.parse_args(argv)
    import pytest

    os.environ["CALMON_FUZZ_EXAMPLES"] = str(args.examples)
    fuzz_dir = ROOT / "tests" / "fuzz"
    from tests.fuzz import fuzzkit  # the suite's harness: the module whose counters the properties add to

    load0 = os.getloadavg()[0]
    t0 = time.perf_counter()
    # In this process (-n 0): the counters live in the harness module of the process running the properties.
    opts = ["-q", "-n", "0", "-p", "no:cacheprovider", str(fuzz_dir)] + (["-k", args.k] if args.k else [])
    rc = int(pytest.main(opts))
    wall = time.perf_counter() - t0
    s = fuzzkit.STATS
    print("| examples/property | replays | records | hostile records | files | wall s | peak RSS MiB | load 1m "
          "(start/end) | result |")
    print("| ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- | --- |")
    print(f"| {args.examples} | {int(s['replays'])} | {int(s['records']):,} | {int(s['hostile']):,} | "
          f"{int(s['files']):,} | {wall:.0f} | {fuzzkit.rss_mib():.0f} | {load0:.1f} / {os.getloadavg()[0]:.1f} | "
          f"{'nothing found' if rc == 0 else 'COUNTEREXAMPLE (see above)'} |")
    return rc


if __name__ == "__main__":
    sys.exit(main())
