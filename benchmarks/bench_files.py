"""Throughput of the file source: reading + splitting JSONL lines, and CSV rows converted to JSON.

Usage::

    python -m benchmarks.bench_files --lines 1000000 [--max-records 65536] [--repeat 3]

Prints a table of lines/s and MB/s for: JSONL with and without origins, CSV ``score,label`` (fast
path), CSV ``id,model,ts,score,label`` with RFC 3339 timestamps, CSV ``p0..p9,label``, and the dead-letter
sink writing every record. Files are generated in a temporary directory (page cache warm: the
numbers measure the source, not the disk).
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

import numpy as np

from connectors.deadletter import FileDeadLetterSink
from connectors.files import FileSource


def _write(path: Path, header: str | None, rows: list[str]) -> None:
    with open(path, "w") as fh:
        if header:
            fh.write(header + "\n")
        fh.write("\n".join(rows))
        fh.write("\n")


def make_files(d: Path, n: int, seed: int = 0) -> dict[str, Path]:
    rng = np.random.default_rng(seed)
    z = rng.random(n)
    y = (rng.random(n) < z).astype(int)
    zs = [f"{v:.6f}" for v in z]
    files = {}
    p = d / "events.jsonl"
    tpl = '{{"type":"labeled","id":"e{}","model":"m","ts":{:.1f},"score":{},"label":{}}}'
    _write(p, None, [tpl.format(i, 1.7e9 + i, s, t) for i, (s, t) in enumerate(zip(zs, y))])
    files["jsonl"] = p
    p = d / "binary.csv"
    _write(p, "score,label", [f"{s},{t}" for s, t in zip(zs, y)])
    files["csv score,label"] = p
    p = d / "full.csv"
    _write(p, "id,model,ts,score,label",
           [f"e{i},m,2026-11-21T10:{(i // 60) % 60:02d}:{i % 60:02d}Z,{s},{t}"
            for i, (s, t) in enumerate(zip(zs, y))])
    files["csv id,model,ts(rfc3339),score,label"] = p
    k = 10
    pr = rng.dirichlet(np.ones(k), size=n)
    lab = rng.integers(0, k, n)
    p = d / "multi.csv"
    _write(p, ",".join(f"p{j}" for j in range(k)) + ",label",
           [",".join(f"{v:.5f}" for v in row) + f",{c}" for row, c in zip(pr, lab)])
    files["csv p0..p9,label"] = p
    return files


def bench_source(path: Path, max_records: int, origins: bool, fmt: str = "auto") -> tuple[int, float]:
    src = FileSource(path, format=fmt, origins=origins)
    t0 = time.perf_counter()
    n = 0
    while True:
        b = src.read(max_records)
        if b is None:
            break
        n += len(b.records)
    dt = time.perf_counter() - t0
    src.close()
    return n, dt


def bench_deadletter(path: Path, d: Path, max_records: int) -> tuple[int, float]:
    src = FileSource(path, origins=True)
    batches = []
    while (b := src.read(max_records)) is not None:
        batches.append(b)
    sink = FileDeadLetterSink(d / "dead.jsonl")
    t0 = time.perf_counter()
    n = 0
    for b in batches:
        sink.write(b.records, ["not_json"] * len(b.records), b.source, b.origins)
        n += len(b.records)
    sink.position()
    dt = time.perf_counter() - t0
    sink.close()
    return n, dt


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lines", type=int, default=1_000_000)
    ap.add_argument("--max-records", type=int, default=65536)
    ap.add_argument("--repeat", type=int, default=3, help="best of REPEAT runs")
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp)
        files = make_files(d, args.lines)
        rows = []
        for label, path in files.items():
            for origins in ([False, True] if label == "jsonl" else [True]):
                best = min((bench_source(path, args.max_records, origins) for _ in range(args.repeat)),
                           key=lambda t: t[1])
                rows.append((f"{label}{'' if origins else ' (no origins)'}", best[0], best[1],
                             os.path.getsize(path)))
        best = min((bench_deadletter(files["jsonl"], d, args.max_records) for _ in range(args.repeat)),
                   key=lambda t: t[1])
        rows.append(("dead-letter sink (jsonl records)", best[0], best[1], os.path.getsize(d / "dead.jsonl")))
    print(f"{'input':42s} {'lines':>10s} {'seconds':>8s} {'lines/s':>12s} {'MB/s':>8s}")
    for label, n, dt, size in rows:
        print(f"{label:42s} {n:10d} {dt:8.3f} {n / dt:12,.0f} {size / dt / 1e6:8.1f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
