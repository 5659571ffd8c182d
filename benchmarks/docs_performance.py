"""Re-measure the headline figures and rewrite the tables of ``docs/performance.md``.

    python -m benchmarks.docs_performance --size small     # a few minutes on 2 cores
    python -m benchmarks.docs_performance --size full      # the sizes the statistics pages quote
    python -m benchmarks.docs_performance --size small --print   # print the tables, leave the page alone

Each row times calmon's way and a baseline doing the same work, interleaved in the same run (so a loaded machine
slows both alike), and reports the best CPU time of ``--repeat`` rounds: CPU time, because the 2-core machines
this runs on are shared. The page gets the figures, their ratio, the machine, its load before and after, the
commit and the date -- and nothing older: history lives in git.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import re
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")  # one BLAS thread: CPU time then measures one core's work

import numpy as np  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
PAGE = ROOT / "docs" / "performance.md"
BEGIN, END = "<!-- BEGIN benchmarks.docs_performance -->", "<!-- END benchmarks.docs_performance -->"

#: size -> (decoder events, smCE n, T-Cal window events, rounds)
SIZES: dict[str, tuple[int, int, int, int]] = {
    "tiny": (2_000, 500, 5_000, 1),  # the smoke test's
    "small": (100_000, 10_000, 100_000, 3),
    "full": (1_000_000, 100_000, 1_000_000, 5),
}


@dataclass(frozen=True)
class Row:
    what: str
    unit: str
    ours: float  # per second (higher is better) of calmon's way
    base: float  # the same for the baseline
    baseline: str
    command: str


def _best_cpu(fns: dict[str, Callable[[], Any]], rounds: int) -> dict[str, float]:
    """Best CPU seconds of each function over ``rounds`` interleaved rounds."""
    best = {k: float("inf") for k in fns}
    for _ in range(max(1, rounds)):
        for name, fn in fns.items():
            t = time.process_time()
            fn()
            best[name] = min(best[name], time.process_time() - t)
    return best


def decoder_row(events: int, rounds: int) -> Row:
    from benchmarks.bench_decoders import _minimal, run_calmon
    from connectors.simulation import SimulationSpec, Simulator

    lines = list(Simulator(SimulationSpec(seed=1)).stream(events))
    best = _best_cpu({"calmon": lambda: run_calmon(lines), "json": lambda: _minimal(json.loads)(lines)}, rounds)
    return Row("JSON Lines -> binned statistics (decode, validate with reason codes, bin)", "events/s",
               events / best["calmon"], events / best["json"], "stdlib `json`, minimal validation, same binning",
               f"python -m benchmarks.bench_decoders --events {events:g} --repeat {rounds}")


def smce_row(n: int, rounds: int) -> Row:
    from benchmarks.bench_smooth import _chain_lp, _data
    from calmon.algorithms.smooth import smce

    z, y = _data(n, 0)
    best = _best_cpu({"dp": lambda: smce(z, y), "lp": lambda: _chain_lp(z, y)}, rounds)
    return Row(f"smooth calibration error, exact, n = {n:,}", "computations/s", 1 / best["dp"], 1 / best["lp"],
               "HiGHS on the chain LP (objective rescaled)",
               f"python -m benchmarks.bench_smooth --sizes {n:g} --repeat {rounds}")


def tcal_row(n: int, rounds: int) -> Row:
    from benchmarks.bench_tcal import build_grid, ours

    rng = np.random.default_rng(0)
    z = rng.random(n)
    y = (rng.random(n) < z).astype(float)  # calibrated: the test must simulate to accept
    grid, _ = build_grid(z, y)
    seeds = iter(range(10_000))
    best = _best_cpu({"default": lambda: ours(grid, "default", next(seeds)),
                      "full": lambda: ours(grid, "full", next(seeds))}, rounds)
    return Row(f"adaptive T-Cal on a window's statistics, calibrated, n = {n:,}", "tests/s", 1 / best["default"],
               1 / best["full"], "the same test, every Monte Carlo draw (no screens, no curtailing)",
               "python -m benchmarks.bench_tcal --skip-nine")


def machine() -> dict[str, str]:
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            m = re.search(r"^model name\s*:\s*(.+)$", f.read(), flags=re.M)
            if m:
                cpu = m.group(1).strip()
    except OSError:
        pass
    mem = ""
    try:
        with open("/proc/meminfo") as f:
            m = re.search(r"^MemTotal:\s*(\d+) kB", f.read(), flags=re.M)
            if m:
                mem = f", {int(m.group(1)) / 2**20:.0f} GiB"
    except OSError:
        pass
    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                                timeout=10).stdout.strip() or "unknown"
    except (OSError, subprocess.SubprocessError):
        commit = "unknown"
    return {"cpu": f"{cpu}, {os.cpu_count()} cores{mem}", "python": platform.python_version(),
            "numpy": np.__version__, "commit": commit}


def _load() -> str:
    try:
        return "/".join(f"{x:.1f}" for x in os.getloadavg())
    except OSError:
        return "n/a"


def _fmt(v: float) -> str:
    return f"{v:,.0f}" if v >= 100 else f"{v:.3g}"


def render(rows: list[Row], size: str, info: dict[str, str], load_before: str, load_after: str,
           started: datetime.datetime, seconds: float) -> str:
    lines = [BEGIN,
             f"Measured {started:%Y-%m-%d %H:%M} UTC by `python -m benchmarks.docs_performance --size {size}` "
             f"({seconds:.0f} s) on {info['cpu']}; load average (1/5/15 min) {load_before} before, {load_after} "
             f"after; Python {info['python']}, numpy {info['numpy']}, commit {info['commit']}. Best CPU time of "
             "interleaved rounds; the ratio divides calmon's rate by the baseline's, measured in the same run.",
             "",
             "| benchmark | calmon | baseline (same run) | ratio | details |",
             "| --- | ---: | --- | ---: | --- |"]
    for r in rows:
        lines.append(f"| {r.what} | {_fmt(r.ours)} {r.unit} | {r.baseline}: {_fmt(r.base)} {r.unit} | "
                     f"**{r.ours / r.base:,.2f}x** | `{r.command}` |")
    lines.append(END)
    return "\n".join(lines)


def write_page(block: str, page: Path = PAGE, begin: str = BEGIN, end: str = END) -> None:
    """Replace the page's block between ``begin`` and ``end`` (``block`` carries both markers); other benchmarks
    writing a table of their own (``bench_platform --docs``) pass their markers."""
    text = page.read_text()
    if begin not in text or end not in text:
        raise SystemExit(f"{page}: markers {begin} / {end} not found")
    head, rest = text.split(begin, 1)
    _, tail = rest.split(end, 1)
    page.write_text(head + block + tail)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", choices=sorted(SIZES), default="small")
    ap.add_argument("--repeat", type=int, default=None, help="interleaved rounds (default: by size)")
    ap.add_argument("--print", dest="print_only", action="store_true", help="print the tables, do not write the page")
    ap.add_argument("--page", type=Path, default=PAGE, help="the page to rewrite (default docs/performance.md)")
    args = ap.parse_args(argv)
    events, n_smce, n_tcal, rounds = SIZES[args.size]
    rounds = args.repeat or rounds
    started = datetime.datetime.now(datetime.timezone.utc)
    t0, load_before = time.perf_counter(), _load()
    rows = []
    for build, arg in ((decoder_row, events), (smce_row, n_smce), (tcal_row, n_tcal)):
        rows.append(build(arg, rounds))
        print(f"  {rows[-1].what}: {rows[-1].ours:,.1f} vs {rows[-1].base:,.1f} {rows[-1].unit}", file=sys.stderr)
    block = render(rows, args.size, machine(), load_before, _load(), started, time.perf_counter() - t0)
    print(block)
    if not args.print_only:
        write_page(block, args.page)
        print(f"wrote {args.page}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
