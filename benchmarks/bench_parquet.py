"""Memory and speed of Parquet inputs: peak RSS of reading 1e6 and 1e7 rows, in a fresh process each.

Writes Parquet files of ``n`` labeled binary events (``model, score, label``, row groups of 1e5 rows,
written group by group so this script stays small) into a temporary directory, then measures, each in its
own subprocess (peak RSS from ``resource.getrusage(RUSAGE_CHILDREN)`` of a wrapper whose only child it is):

* ``baseline``: the interpreter with calmon, numpy and pyarrow imported (fixed cost);
* ``reader``: the file streamed through :class:`calmon.formats.parquet.TableFile` -> :func:`batch_records` ->
  :class:`calmon.events.decoder.Decoder`, events counted and dropped: the reader's own memory, which must not
  grow with ``n``;
* ``check``: ``calmon check FILE --json --tests none``, which also keeps the accepted events as arrays
  (score, label, ts, ids, segment, kind, index: about 50 bytes a row while reading, then the joined
  dataset): that part grows with ``n`` by design.

Usage::

    nice -n 10 python -m benchmarks.bench_parquet         # 1e6 and 1e7 rows
    python -m benchmarks.bench_parquet --rows 1e5 3e5      # quicker
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

GROUP = 100_000

READER = """
import sys
from calmon.offline.accumulator import make_decoder
from calmon.formats.parquet import TableFile, batch_records, canonical_plan
t = TableFile(sys.argv[1], "parquet")
plan = canonical_plan(t.names)
dec = make_decoder()
n = 0
for b in t.batches(plan.read):
    n += dec.decode(batch_records(b, plan)).accepted
print(n)
"""

BASELINE = "import numpy, pyarrow, pyarrow.parquet, calmon.offline.inputs, calmon.events.decoder; print(0)"

WRAPPER = """
import resource, subprocess, sys, time
t0 = time.perf_counter()
r = subprocess.run(sys.argv[1:], capture_output=True)
wall = time.perf_counter() - t0
if r.returncode:
    sys.exit(r.stderr.decode()[-2000:])
print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss, wall)
"""


def write(path: Path, n: int, seed: int = 0) -> None:
    rng = np.random.default_rng(seed)
    schema = pa.schema([("model", pa.string()), ("score", pa.float64()), ("label", pa.int8())])
    with pq.ParquetWriter(path, schema) as w:
        for lo in range(0, n, GROUP):
            m = min(GROUP, n - lo)
            s = rng.uniform(size=m)
            w.write_table(pa.table({"model": pa.array(["fraud"] * m), "score": s,
                                    "label": (rng.uniform(size=m) < s).astype(np.int8)}, schema=schema))


def measure(cmd: list[str]) -> tuple[float, float]:
    """(peak RSS in MiB, wall seconds) of ``cmd`` run as the only child of a fresh wrapper."""
    out = subprocess.run([sys.executable, "-c", WRAPPER, *cmd], capture_output=True, text=True, check=False)
    if out.returncode:
        raise SystemExit(f"{cmd[:4]} failed: {out.stderr.strip()[-500:]}")
    rss_kib, wall = out.stdout.split()
    return int(rss_kib) / 1024, float(wall)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", nargs="+", type=float, default=[1e6, 1e7])
    args = ap.parse_args(argv)
    rows = [int(r) for r in args.rows]
    print(f"{'rows':>12} {'what':>9} {'peak RSS MiB':>13} {'seconds':>8} {'rows/s':>10}")
    base, _ = measure([sys.executable, "-c", BASELINE])
    print(f"{'-':>12} {'baseline':>9} {base:13.0f} {'-':>8} {'-':>10}")
    with tempfile.TemporaryDirectory() as tmp:
        for n in rows:
            path = Path(tmp) / f"events_{n}.parquet"
            t0 = time.perf_counter()
            write(path, n)
            size = path.stat().st_size / 2**20
            print(f"{n:>12,} {'(file)':>9} {size:13.0f} {time.perf_counter() - t0:8.1f} {'-':>10}")
            for what, cmd in (("reader", [sys.executable, "-c", READER, str(path)]),
                              ("check", [sys.executable, "-m", "calmon", "check", str(path), "--json", "--tests",
                                         "none"])):
                rss, wall = measure(cmd)
                print(f"{n:>12,} {what:>9} {rss:13.0f} {wall:8.1f} {n / wall:10,.0f}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
