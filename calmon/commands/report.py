"""``calmon report``: one self-contained HTML (or PNG) report of a file of predictions with outcomes."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from calmon.algorithms.smooth import smce_witness
from calmon.calibration.document import load
from calmon.commands.check import (
    DEFAULT_TESTS,
    Steps,
    add_verdict_arguments,
    build_stats,
    check_numbers,
    parse_testers,
    report,
)
from calmon.events.schema import add_schema_arguments, mapping_from_arguments
from calmon.formats.jsonio import check_replaceable, write_bytes_atomic
from calmon.offline.inputs import INPUTS_HELP, Dataset, read_inputs
from calmon.stats.grid import ScoreGrid
from calmon.stats.model import ModelStats

if TYPE_CHECKING:  # matplotlib is imported only when a report is drawn: `calmon --help` stays fast
    from calmon.report import Panel
#: Per-class panels drawn at most (the first classes by index).
MAX_CLASS_PANELS = 10


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("report", help="write an HTML or PNG calibration report of a file",
                       description="Reliability diagrams with histogram and bands, the smCE witness, the tests "
                                   "and the verdict, in one self-contained file.")
    p.add_argument("input", nargs="+", help=INPUTS_HELP)
    p.add_argument("-o", "--output", required=True, help="report file to write (e.g. report.html)")
    p.add_argument("--format", choices=("html", "png"), default=None,
                   help="html (default, or from the output's extension) or png")
    p.add_argument("--calibrator", default=None, metavar="FILE",
                   help="calibrator document (from `calmon fit`): adds the after-recalibration curves")
    p.add_argument("--model", default=None, help="model to report when the events hold several")
    p.add_argument("--tests", default=DEFAULT_TESTS, help=f"testers to run (default {DEFAULT_TESTS}; 'none')")
    p.add_argument("--alpha", type=float, default=0.05, help="significance level (default 0.05)")
    p.add_argument("--mc", type=int, default=2000, help="Monte Carlo draws of the tests")
    p.add_argument("--seed", type=int, default=0, help="seed of the Monte Carlo draws")
    p.add_argument("--bins", type=int, default=4096, help="cells of the fine grid (power of two)")
    p.add_argument("--skip-invalid", action="store_true", help="skip invalid JSONL events instead of stopping")
    add_verdict_arguments(p)
    add_schema_arguments(p)
    p.set_defaults(func=run, reliability_bins=15, test_param=[])


def _after(ds: Dataset, path: str) -> ModelStats:
    """Statistics of the predictions after the calibrator, with the same outcomes."""
    cal = load(path)
    if cal.kind == "multiclass":
        if ds.probs is None or ds.classes != cal.classes:
            raise ValueError(f"--calibrator {path}: a multiclass calibrator of {cal.classes} classes cannot "
                             f"recalibrate {ds.kind} data with {ds.classes} classes")
        stats = ModelStats(ds.classes, bins=4096, reservoir=0)
        stats.update(probs=np.asarray(cal.predict(ds.probs)), labels=ds.labels)
        return stats
    # a binary calibrator maps the binary score, or the top-label confidence (as `calmon fit` fitted it)
    stats = ModelStats(2, bins=4096, reservoir=0)
    stats.update(score=np.clip(cal.predict(ds.z), 0.0, 1.0), labels=ds.y.astype("int64"))
    return stats


def _panels(ds: Dataset, stats: ModelStats, after: ModelStats | None) -> list[Panel]:
    from calmon.report import grid_panel
    top = ds.top_label_only or ds.classes > 2
    title = "top-label confidence vs accuracy" if top else "binary score vs outcome rate"
    panels = [grid_panel("main", title, stats.ece, None if after is None else after.ece)]
    if stats.classwise is not None:
        for k in range(min(stats.classes, MAX_CLASS_PANELS)):
            cw_after = None if after is None or after.classwise is None else after.classwise.channel(k)
            panels.append(grid_panel(f"class{k}", f"class {k}: P(y = {k}) vs frequency",
                                     stats.classwise.channel(k), cw_after))
    return panels


def _witness(grid: ScoreGrid) -> tuple[np.ndarray, np.ndarray] | None:
    if grid.count == 0:
        return None
    g = grid.coarsen(256) if grid.bins % 256 == 0 else grid
    wit = smce_witness(grid=g)
    points, w = np.asarray(wit["points"]), np.asarray(wit["w"])
    # w is optimal up to a constant when the overall bias is ~0 (the LP then picks any level), so the
    # event-weighted mean is removed: the centred curve's sign shows where outcomes exceed the scores
    weights = g.n[np.clip(np.floor(points * g.bins).astype(np.int64), 0, g.bins - 1)]
    return points, w - float(np.average(w, weights=weights))


def run(args: argparse.Namespace) -> int:
    from calmon.report import ReportInput, render_html, render_png
    from calmon.report.timeview import estimates_html, time_view, time_view_html
    check_numbers(args)
    check_replaceable(args.output)  # before the work: the write refuses a device, fifo or directory anyway
    fmt = args.format or ("png" if str(args.output).lower().endswith(".png") else "html")
    steps = 4 + len(parse_testers(args.tests))
    with Steps(steps) as progress:
        progress.start("read")
        mapping = mapping_from_arguments(args)
        ds = read_inputs(args.input, model=args.model, skip_invalid=args.skip_invalid, mapping=mapping)
        progress.done()
        doc = report(ds, args, progress)
        stats = build_stats(ds, args.bins)
        after = _after(ds, args.calibrator) if args.calibrator else None
        progress.start("witness")
        witness = _witness(stats.fine)
        progress.done()
        progress.start("draw")
        tv = time_view(ds.z, ds.y, ds.ts)
        data = ReportInput(doc, _panels(ds, stats, after), witness,
                           None if args.calibrator is None else {"file": args.calibrator},
                           sections=[time_view_html(tv), estimates_html(ds.z, ds.y)], facts={"time_view": tv.to_dict()})
        out = render_png(data) if fmt == "png" else render_html(data).encode("utf-8")
        progress.done(2)
    write_bytes_atomic(Path(args.output), out)
    print(f"{args.output}: {fmt} report of {ds.n} predictions; {doc['summary']['text']}")
    return 0
