"""``calmon check``: calibration report of a file of predictions with outcomes."""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import sys
from typing import TYPE_CHECKING, Any

import numpy as np

from calmon import __version__
from calmon.algorithms.ece import reliability, summary
from calmon.calibration.split import hash_split
from calmon.commands.progress import Steps
from calmon.evaluate.verdict import summarize
from calmon.events.schema import add_schema_arguments, mapping_from_arguments
from calmon.formats.jsonio import clean
from calmon.offline.inputs import INPUTS_HELP, Dataset, read_input, read_inputs
from calmon.stats.model import ModelStats

if TYPE_CHECKING:
    from calmon.calibration.base import Calibrator

#: Testers run when ``--tests`` is not given (``--tests none`` runs none).
DEFAULT_TESTS = "tcal,smce"
#: Cells of the fine grid at most: the agent's own limit (``models.*.bins``).
MAX_BINS = 1 << 16
#: ``--permutations`` x ``--bins`` at most: the ``--reference`` test holds about 32 bytes per permutation and
#: cell at its peak (measured: 1.4 GB for 9,999 permutations of 4,096 cells), so this keeps it near 1 GiB.
MAX_PERMUTATION_CELLS = 1 << 25
#: Default ``--tolerance``: the default of ``verdict.tolerance.ece`` (an ECE interval below 1 % needs no action).
DEFAULT_TOLERANCE = 0.01


def add_verdict_arguments(p: argparse.ArgumentParser) -> None:
    """``--tolerance`` (check and report): when a significant miscalibration is worth acting on."""
    p.add_argument("--tolerance", type=float, default=DEFAULT_TOLERANCE, metavar="ECE",
                   help="ECE below which a significant miscalibration is immaterial: when the ECE interval's upper "
                        "bound is below it the verdict is 'calibrated within tolerance; no action' (default "
                        f"{DEFAULT_TOLERANCE:g}, as verdict.tolerance.ece; 0: every rejection is material)")


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("check", help="report calibration metrics and tests of a file",
                       description="Calibration report of JSONL events, CSV or NPZ (use - for standard input).")
    p.add_argument("input", nargs="+", help=INPUTS_HELP)
    p.add_argument("--json", action="store_true", help="print one JSON document instead of the readable report")
    p.add_argument("--model", default=None, help="model to check when the events hold several")
    p.add_argument("--tests", default=DEFAULT_TESTS,
                   help=f"comma-separated testers to run, e.g. tcal,smce,ldtc,lp (default {DEFAULT_TESTS}; "
                        "'none' for metrics only)")
    p.add_argument("--reference", default=None, metavar="REF",
                   help="reference file: test whether calibration changed between REF and INPUT")
    p.add_argument("--permutations", type=int, default=999,
                   help="within-cell permutations of the --reference test (default 999)")
    p.add_argument("--alpha", type=float, default=0.05, help="significance level of the tests (default 0.05)")
    p.add_argument("--mc", type=int, default=2000, help="Monte Carlo draws for simulated critical values")
    p.add_argument("--seed", type=int, default=0, help="seed of the Monte Carlo draws")
    p.add_argument("--bins", type=int, default=4096, help="cells of the fine grid (power of two)")
    p.add_argument("--reliability-bins", type=int, default=15, help="bins of the reliability diagram")
    p.add_argument("--test-param", action="append", default=[], metavar="TEST.KEY=VALUE",
                   help="tester option, e.g. lp.eps=0.05 or ldtc.grid_points=101 (repeatable)")
    p.add_argument("--skip-invalid", action="store_true",
                   help="skip invalid JSONL events (counted by reason) instead of stopping at the first")
    p.add_argument("--calibrator", default=None, metavar="FILE",
                   help="check the predictions after this calibrator (from `calmon fit`), on the rows it was not "
                        "fitted on: its --holdout rows when INPUT is the data it was fitted on")
    add_verdict_arguments(p)
    add_schema_arguments(p)
    p.set_defaults(func=run)


def check_numbers(args: argparse.Namespace) -> None:
    """Refuse numeric options beyond what the command can hold, before any input is read (``ValueError``,
    one line naming the bound): ``--bins``, ``--mc`` and ``--permutations`` (where the command has them)."""
    bins = args.bins
    if bins < 2 or bins & (bins - 1) or bins > MAX_BINS:
        raise ValueError(f"--bins must be a power of two in [2, {MAX_BINS}], got {bins}")
    tolerance = getattr(args, "tolerance", 0.0)
    if not 0.0 <= tolerance < 1.0:
        raise ValueError(f"--tolerance must lie in [0, 1) (an ECE, e.g. 0.01 for 1 %), got {tolerance}")
    from calmon.testers import MAX_MC  # here: scipy and the testers only when a command runs, not for --help

    if args.mc > MAX_MC:
        raise ValueError(f"--mc must be at most {MAX_MC:,} (p-values resolve to 1/(mc+1)), got {args.mc}")
    permutations = getattr(args, "permutations", None)
    if permutations is not None and not 1 <= permutations <= MAX_PERMUTATION_CELLS // bins:
        raise ValueError(f"--permutations must be in [1, {MAX_PERMUTATION_CELLS // bins}] at --bins {bins} "
                         f"(permutations x bins <= 2^25 bounds the test's memory near 1 GiB), got {permutations}")


def build_stats(ds: Dataset, bins: int = 4096) -> ModelStats:
    """Statistics of a dataset, exactly as the agent would build them from the same events."""
    if bins < 2 or bins & (bins - 1):
        raise ValueError(f"--bins must be a power of two >= 2, got {bins}")
    if ds.probs is not None:
        stats = ModelStats(ds.classes, bins=bins, reservoir=0)
        stats.update(probs=ds.probs, labels=ds.labels)
    else:
        stats = ModelStats(2, bins=bins, reservoir=0)
        stats.update(score=ds.z, labels=ds.y.astype("int64"))
    return stats


def parse_testers(spec: str) -> list[str]:
    """``"tcal,smce"`` -> ``["tcal", "smce"]``; ``"none"`` or ``""`` -> ``[]``."""
    names = [t.strip() for t in spec.split(",") if t.strip()]
    return [] if names == ["none"] else names


def recalibrated(cal: Calibrator, ds: Dataset, path: str) -> tuple[Dataset, dict[str, Any], str | None]:
    """``ds`` after ``cal`` on the rows that can judge it, the ``calibrator`` object of the document, and why the
    rows cannot judge it (``None`` when they can).

    A calibrator is judged, as scikit-learn users judge ``CalibratedClassifierCV``, on data it was not fitted on:
    when ``ds`` is the input it was fitted on (``training.input``), only its ``--holdout`` rows (the same hash of
    ids and salt) are kept; fitted there without a holdout, no row can judge it, and the verdict says so instead
    of recommending another recalibrator.
    """
    if cal.kind == "multiclass":
        if ds.probs is None or ds.labels is None or ds.classes != cal.classes:
            raise ValueError(f"--calibrator {path}: a multiclass calibrator of {cal.classes} classes cannot "
                             f"recalibrate {ds.kind} data with {ds.classes} classes")
        probs = np.asarray(cal.predict(ds.probs))
        after = dataclasses.replace(ds, probs=probs, z=probs.max(axis=1),
                                    y=(probs.argmax(axis=1) == ds.labels).astype(np.float64))
    else:
        after = dataclasses.replace(ds, z=np.clip(cal.predict(ds.z), 0.0, 1.0))
    tr = cal.training
    info: dict[str, Any] = {"file": path, "method": cal.method, "fitted_on": tr.get("input"), "rows": ds.n}
    judge: str | None = None
    if tr.get("input") is not None and tr.get("input") == ds.source:
        fraction, salt = tr.get("holdout_fraction"), tr.get("holdout_salt")
        if isinstance(fraction, (int, float)) and 0 < fraction < 1 and isinstance(salt, str):
            ids = ds.ids if ds.ids is not None and all(ds.ids) else np.arange(ds.n).astype(str)
            keep = hash_split(ids, float(fraction), salt)
            after = _rows(after, keep)
            info.update(evaluated_on="holdout", rows=after.n,
                        note=f"judged on the {after.n:,} held-out rows of {ds.n:,} (the calibrator was fitted on "
                             "the others, which cannot judge it)")
        else:
            judge = (f"judge the calibrator on data it was not fitted on: {path} was fitted on all of "
                     f"{ds.source}, which cannot judge it (refit with --holdout 0.2, or check newer data)")
            info.update(evaluated_on="fit data", note=judge)
    else:
        info.update(evaluated_on="all rows", note=f"judged on all {ds.n:,} rows (the calibrator was fitted on "
                                                  f"{tr.get('input') or 'other data'})")
    return after, info, judge


def _rows(ds: Dataset, keep: np.ndarray) -> Dataset:
    def pick(a: np.ndarray | None) -> np.ndarray | None:
        return None if a is None else a[keep]
    return dataclasses.replace(ds, z=ds.z[keep], y=ds.y[keep], probs=pick(ds.probs), labels=pick(ds.labels),
                               ids=pick(ds.ids), ts=pick(ds.ts))


def report(ds: Dataset, args: argparse.Namespace, progress: Steps | None = None,
           judge: str | None = None) -> dict[str, Any]:
    """The JSON document of ``calmon check``: metrics, reliability, tests, ``summary`` (and ``reference``).

    ``judge`` says why these data cannot judge a recalibration (:func:`recalibrated`)."""
    stats = build_stats(ds, args.bins)
    doc: dict[str, Any] = {
        "calmon_version": __version__, "input": ds.source, "model": ds.model, "n": ds.n,
        "classes": ds.classes, "kind": ds.kind, "metrics": summary(stats, top_label=ds.top_label_only),
        "reliability": reliability(stats.ece.copy() if args.reliability_bins == 15 else stats.fine,
                                   None if args.reliability_bins == 15 else args.reliability_bins),
    }
    if ds.model is not None:
        doc["join"] = {"joined": ds.joined, "unjoined_predictions": ds.unjoined_predictions,
                       "orphan_outcomes": ds.orphan_outcomes}
    if ds.skipped:
        doc["skipped"] = ds.skipped
    names = parse_testers(args.tests)
    if names:
        from calmon.testers import CalibrationData, check_params, run_tester

        data = CalibrationData(n=ds.n, grid=stats.fine, z=ds.z, y=ds.y, probs=ds.probs, labels=ds.labels,
                               levelset=None, raw_is_complete=True)
        params = parse_test_params(args.test_param, names)
        for name in names:
            check_params(name, params[name])
        doc["tests"] = {}
        for name in names:
            if progress is not None:
                progress.start(f"test {name}")
            doc["tests"][name] = run_tester(name, data, alpha=args.alpha, mc=args.mc, seed=args.seed,
                                            **params[name]).to_dict()
            if progress is not None:
                progress.done()
    top_label = ds.top_label_only or ds.classes > 2
    doc["summary"] = summarize(stats.fine, doc.get("tests", {}), alpha=args.alpha, top_label=top_label,
                               ece_grid=stats.ece, tolerance=getattr(args, "tolerance", 0.0), judge=judge).to_dict()
    return doc


def compare(ref: Dataset, ds: Dataset, args: argparse.Namespace) -> dict[str, Any]:
    """``reference`` object: the within-cell permutation test of a calibration change (REF -> INPUT)."""
    if (ref.probs is None) != (ds.probs is None) or ref.classes != ds.classes:
        raise ValueError(f"--reference {ref.source}: {ref.kind} with {ref.classes} classes cannot be compared "
                         f"with {ds.kind} with {ds.classes} classes")
    from calmon.algorithms.twosample import calibration_change_test

    res = calibration_change_test(build_stats(ref, args.bins).fine, build_stats(ds, args.bins).fine,
                                  alpha=args.alpha, permutations=args.permutations,
                                  rng=np.random.default_rng(args.seed))
    return {"input": ref.source, **res.to_dict()}


def parse_test_params(items: list[str], names: list[str]) -> dict[str, dict[str, Any]]:
    """``["lp.eps=0.05", "tcal.method=grid"]`` -> ``{"lp": {"eps": 0.05}, "tcal": {"method": "grid"}}``.

    Values are read as JSON when they parse (numbers, true/false, null), else kept as strings.
    """
    out: dict[str, dict[str, Any]] = {n: {} for n in names}
    for item in items:
        key, sep, raw = item.partition("=")
        test, dot, opt = key.partition(".")
        if not sep or not dot or not opt:
            raise ValueError(f"--test-param {item!r}: expected TEST.KEY=VALUE")
        if test not in out:
            raise ValueError(f"--test-param {item!r}: test {test!r} is not among --tests {','.join(names) or '(none)'}")
        try:
            value: Any = json.loads(raw)
        except ValueError:
            value = raw
        out[test][opt] = value
    return out


def _pct(x: float | None) -> str:
    return "n/a" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{100 * x:.2f} %"


def render(doc: dict[str, Any]) -> str:
    m = doc["metrics"]
    what = {"binary": "binary", "top-label": "top-label confidence"}.get(doc["kind"], f"{doc['classes']} classes")
    lines = [f"{doc['input']}: {doc['n']} labeled predictions ({what})"
             + (f", model {doc['model']}" if doc.get("model") else "")]
    if "calibrator" in doc:
        c = doc["calibrator"]
        lines.append(f"  after calibrator {c['file']} ({c['method']}): {c['note']}")
    if "summary" in doc:
        lines.append(f"  verdict: {doc['summary']['text']}")
        lines.extend(f"    evidence: {e}" for e in doc["summary"]["evidence"])
    if "reference" in doc:
        r = doc["reference"]
        lines.append(f"  vs reference {r['input']}: calibration {r['decision']} (p = {r['p_value']:.4g}; debiased "
                     f"l2-ECE^2 {r['reference_dpe']:.3e} -> {r['current_dpe']:.3e}, {r['permutations']} "
                     "within-cell permutations)")
    j = doc.get("join")
    if j and (j["joined"] or j["unjoined_predictions"] or j["orphan_outcomes"]):
        lines.append(f"  join: {j['joined']} predictions joined with their outcome by id, {j['unjoined_predictions']} "
                     f"without outcome, {j['orphan_outcomes']} outcomes without prediction")
    lines.append(f"  accuracy            {_pct(m.get('accuracy'))}")
    if "base_rate" in m:
        lines.append(f"  base rate           {_pct(m['base_rate'])}")
    lines.append(f"  mean confidence     {_pct(m.get('mean_confidence'))}")
    lines.append(f"  Brier score         {m.get('brier', float('nan')):.5f}")
    lines.append(f"  ECE (15 bins, l1)   {_pct(m.get('ece'))}")
    if "classwise_ece" in m:
        lines.append(f"  class-wise ECE      {_pct(m['classwise_ece'])}")
    lines.append(f"  l2-ECE^2 at {m.get('l2_bins')} bins: plug-in {m.get('ece_l2_plugin', float('nan')):.3e}, "
                 f"debiased {m.get('ece_l2_debiased', float('nan')):.3e}")
    lines.append("  reliability (bin: events, mean score -> mean outcome):")
    for b in doc["reliability"]:
        if b["events"]:
            lines.append(f"    [{b['bin']:.3f}, {b['hi']:.3f}): {b['events']:>8d}  "
                         f"{b['mean_score']:.3f} -> {b['mean_outcome']:.3f}")
    for name, res in doc.get("tests", {}).items():
        p = res.get("p_value")
        ptxt = "n/a" if p is None else f"{p:.4g}"
        lines.append(f"  test {name}: {res['decision']} (statistic {res.get('statistic')!s:.10}, p = {ptxt}, "
                     f"method {res.get('method')})")
        for view, vr in (res.get("views") or {}).items():  # multiclass T-Cal: canonical, top-label, class-wise
            vp = vr.get("p_value")
            lines.append(f"    {view}: {vr.get('decision')} (p = {'n/a' if vp is None else f'{vp:.4g}'})")
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    check_numbers(args)
    steps = 2 + len(parse_testers(args.tests)) + (2 if args.reference else 0)
    with Steps(steps) as progress:
        progress.start("read")
        mapping = mapping_from_arguments(args)
        ds = read_inputs(args.input, model=args.model, skip_invalid=args.skip_invalid, mapping=mapping)
        judge, info = None, None
        if args.calibrator:
            from calmon.calibration.document import load

            ds, info, judge = recalibrated(load(args.calibrator), ds, args.calibrator)
        progress.done()
        doc = report(ds, args, progress, judge)
        if info is not None:
            doc["calibrator"] = info
        progress.done()
        if args.reference:
            progress.start("read reference")
            ref = read_input(args.reference, model=args.model, skip_invalid=args.skip_invalid, mapping=mapping)
            progress.done()
            progress.start("compare with the reference")
            doc["reference"] = compare(ref, ds, args)
            progress.done()
    if args.json:
        json.dump(clean(doc), sys.stdout, indent=2, allow_nan=False)
        sys.stdout.write("\n")
    else:
        print(render(doc))
    return 0
