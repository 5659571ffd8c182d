"""``calmon report``: one self-contained HTML (or PNG / SVG page) report of predictions with outcomes."""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from calmon.algorithms.smooth import smce_witness
from calmon.calibration.document import load
from calmon.commands import SUMMARIES
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
    from calmon.report import Panel, ReportInput
#: Per-class panels drawn at most (the first classes by index).
MAX_CLASS_PANELS = 10


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("report", help=SUMMARIES["report"],
                       description="Reliability diagrams with histogram and bands, the smCE witness, the tests "
                                   "and the verdict, in one self-contained file.")
    p.add_argument("input", nargs="+", help=INPUTS_HELP)
    p.add_argument("-o", "--output", required=True, help="report file to write (e.g. report.html)")
    p.add_argument("--format", choices=("html", "png", "svg"), default=None,
                   help="html (default, or from the output's extension), png or svg (one page: verdict, tests, "
                        "metrics, diagrams)")
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


def _calibrated(ds: Dataset, path: str) -> tuple[Dataset, str]:
    """The same outcomes with the calibrator's scores, and the calibrator's method."""
    cal = load(path)
    if cal.kind == "multiclass":
        if ds.probs is None or ds.labels is None or ds.classes != cal.classes:
            raise ValueError(f"--calibrator {path}: a multiclass calibrator of {cal.classes} classes cannot "
                             f"recalibrate {ds.kind} data with {ds.classes} classes")
        probs = np.asarray(cal.predict(ds.probs), dtype=float)
        return dataclasses.replace(ds, probs=probs, z=probs.max(axis=1),
                                   y=(probs.argmax(axis=1) == ds.labels).astype(float)), cal.method
    # a binary calibrator maps the binary score, or the top-label confidence (as `calmon fit` fitted it)
    z = np.clip(np.asarray(cal.predict(ds.z), dtype=float), 0.0, 1.0)
    if ds.classes > 2 or ds.top_label_only:
        return dataclasses.replace(ds, z=z, probs=None, labels=None, classes=2, top_label_only=True), cal.method
    return dataclasses.replace(ds, z=z), cal.method


def _after(ds: Dataset, after: Dataset) -> ModelStats:
    """Statistics of the predictions after the calibrator, with the same outcomes."""
    if after.probs is not None and after.labels is not None:
        stats = ModelStats(ds.classes, bins=4096, reservoir=0)
        stats.update(probs=after.probs, labels=after.labels)
        return stats
    stats = ModelStats(2, bins=4096, reservoir=0)
    stats.update(score=after.z, labels=ds.y.astype("int64"))
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


def report_input(args: argparse.Namespace, progress: Steps | None = None) -> tuple[ReportInput, Dataset]:
    """Read the inputs, run the check (before and after ``--calibrator``), build every panel: what is drawn."""
    from calmon.report import ReportInput
    from calmon.report.page import witness_informative
    from calmon.report.timeview import estimates_html, time_view, time_view_html

    def step(name: str) -> None:
        if progress is not None:
            progress.start(name)

    def done(k: int = 1) -> None:
        if progress is not None:
            progress.done(k)

    step("read")
    mapping = mapping_from_arguments(args)
    ds = read_inputs(args.input, model=args.model, skip_invalid=args.skip_invalid, mapping=mapping)
    done()
    doc = report(ds, args, progress)
    stats = build_stats(ds, args.bins)
    calibrator, after, after_doc = None, None, None
    if args.calibrator:
        calibrated, method = _calibrated(ds, args.calibrator)
        after = _after(ds, calibrated)
        after_doc = report(calibrated, args)  # the header's "after" verdict, tests and metrics
        calibrator = {"file": args.calibrator, "method": method}
    step("witness")
    informative, note = witness_informative(doc)
    witness = _witness(stats.fine) if informative else None
    done()
    tv = time_view(ds.z, ds.y, ds.ts)
    data = ReportInput(doc, _panels(ds, stats, after), witness, calibrator,
                       sections=[time_view_html(tv), estimates_html(ds.z, ds.y)], facts={"time_view": tv.to_dict()},
                       after_doc=after_doc, witness_note=note)
    return data, ds


def run(args: argparse.Namespace) -> int:
    from calmon.report import render_html, render_png, render_svg
    check_numbers(args)
    check_replaceable(args.output)  # before the work: the write refuses a device, fifo or directory anyway
    ext = str(args.output).lower().rsplit(".", 1)[-1]
    fmt = args.format or (ext if ext in ("png", "svg") else "html")
    steps = 4 + len(parse_testers(args.tests))
    with Steps(steps) as progress:
        data, ds = report_input(args, progress)
        progress.start("draw")
        out = (render_png(data) if fmt == "png" else render_svg(data).encode("utf-8") if fmt == "svg"
               else render_html(data).encode("utf-8"))
        progress.done(2)
    write_bytes_atomic(Path(args.output), out)
    print(f"{args.output}: {fmt} report of {ds.n} predictions; {data.doc['summary']['text']}")
    if data.after_doc is not None:
        print(f"after the calibrator {args.calibrator}: {data.after_doc['summary']['text']}")
    return 0
