"""``calmon fit``: fit a recalibration map on a labeled file and write its JSON document."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

import numpy as np

from calmon.calibration.base import Calibrator
from calmon.calibration.metrics import binary_metrics, multiclass_metrics
from calmon.calibration.registry import CALIBRATORS, make_calibrator
from calmon.calibration.split import hash_split
from calmon.commands import SUMMARIES
from calmon.events.schema import add_schema_arguments, mapping_from_arguments
from calmon.formats.jsonio import check_replaceable, write_json_atomic
from calmon.offline.inputs import INPUTS_HELP, Dataset, read_inputs

#: ``--bins`` (``--option bins=``) and ``--ece-bins`` at most: every bin's estimate needs events, and at this
#: bound a million-row file already has only ten per bin (larger values only allocate memory).
MAX_FIT_BINS = 100_000


def register(sub: argparse._SubParsersAction) -> None:
    methods = ", ".join(CALIBRATORS.names())
    p = sub.add_parser("fit", help=SUMMARIES["fit"],
                       description="Fit a calibrator on JSONL events, CSV or NPZ and write a versioned JSON "
                                   f"document (methods: {methods}). Binary methods fit the binary score, or "
                                   "the top-label confidence of multiclass data.")
    p.add_argument("input", nargs="+", help=INPUTS_HELP)
    p.add_argument("--method", "-m", required=True, help=f"calibration method ({methods})")
    p.add_argument("-o", "--output", default="-", help="calibrator document to write (default: standard output)")
    p.add_argument("--model", default=None, help="model to use when the events hold several")
    p.add_argument("--link", choices=("logit", "probit"), default=None, help="link of platt / angular")
    p.add_argument("--bins", type=int, default=None, help="bins of histogram / scaling-binning (default 15)")
    p.add_argument("--degree", type=int, default=None, help="degree of polynomial scaling (default 3)")
    p.add_argument("--link-scale", type=float, default=None, help="angular: declared link scale a")
    p.add_argument("--link-intercept", type=float, default=None, help="angular: declared link intercept b")
    p.add_argument("--option", action="append", default=[], metavar="KEY=VALUE",
                   help="other constructor option (VALUE parsed as JSON when possible); repeatable")
    p.add_argument("--holdout", type=float, default=0.0, metavar="FRACTION",
                   help="hold out this fraction (hash of event ids, or of row numbers) to report held-out "
                        "errors before/after in the document (default 0: fit on everything)")
    p.add_argument("--salt", default="calmon", help="salt of the holdout hash")
    p.add_argument("--ece-bins", type=int, default=15, help="bins of the reported ECE (default 15)")
    p.add_argument("--skip-invalid", action="store_true", help="skip invalid JSONL events instead of stopping")
    add_schema_arguments(p)
    p.set_defaults(func=run)


def _options(args: argparse.Namespace) -> dict[str, Any]:
    opts: dict[str, Any] = {}
    for flag, key in (("link", "link"), ("bins", "bins"), ("degree", "degree"), ("link_scale", "link_scale"),
                      ("link_intercept", "link_intercept")):
        v = getattr(args, flag)
        if v is not None:
            opts[key] = v
    for item in args.option:
        key, sep, raw = item.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"--option expects KEY=VALUE, got {item!r}")
        try:
            opts[key.strip()] = json.loads(raw)
        except json.JSONDecodeError:
            opts[key.strip()] = raw
    return opts


def _errors(cal: Calibrator | None, ds: Dataset, sel: np.ndarray, bins: int, multiclass: bool) -> dict[str, Any]:
    if multiclass:
        x, y = _multiclass(ds)
        probs = x[sel] if cal is None else cal.predict(x[sel])
        return multiclass_metrics(probs, y[sel], bins)
    z = ds.z[sel]
    return binary_metrics(z if cal is None else cal.predict(z), ds.y[sel], bins)


def _multiclass(ds: Dataset) -> tuple[np.ndarray, np.ndarray]:
    if ds.probs is None or ds.labels is None:
        raise ValueError(f"{ds.source} has {ds.kind} data, not multiclass probabilities and labels")
    return ds.probs, ds.labels


def fit_dataset(ds: Dataset, method: str, options: dict[str, Any], *, holdout: float = 0.0, salt: str = "calmon",
                ece_bins: int = 15) -> dict[str, Any]:
    """Fit ``method`` on a dataset; return the calibrator document (with held-out errors if ``holdout``)."""
    if method == "angular" and "link_scale" not in options:
        raise ValueError("angular calibration needs the declared data link: --link-scale A [--link-intercept B] "
                         "[--link logit|probit] (sigma(u) = F(A u + B)); the angle is not identifiable without it")
    try:
        cal = make_calibrator(method, **options)
    except TypeError as exc:
        raise ValueError(f"bad option for method {method!r}: {exc}") from None
    # a method fitting both kinds (temperature) is multiclass on multiclass data, binary on binary/top-label scores
    multiclass = cal.kind == "multiclass" and ("binary" not in cal.kinds or ds.kind == "multiclass")
    if multiclass and ds.probs is None:
        raise ValueError(f"method {method!r} needs multiclass probabilities; {ds.source} has {ds.kind} data")
    if not 0.0 <= holdout < 1.0:
        raise ValueError(f"--holdout must lie in [0, 1), got {holdout}")
    n = ds.n
    if holdout > 0:
        ids = ds.ids if ds.ids is not None and all(ds.ids) else np.arange(n).astype(str)
        hold = hash_split(ids, holdout, salt)
    else:
        hold = np.zeros(n, dtype=bool)
    train = ~hold
    if train.sum() < 2:
        raise ValueError(f"only {int(train.sum())} training rows; need at least 2")
    if multiclass:
        x, y = _multiclass(ds)
        cal.fit(x[train], y[train])
    else:
        cal.fit(ds.z[train], ds.y[train])
    evaluation: dict[str, Any] = {}
    if hold.any():
        evaluation = {"holdout_fraction": holdout, "holdout_n": int(hold.sum()), "bins": ece_bins, "split": "hash",
                      "before": _errors(None, ds, hold, ece_bins, multiclass),
                      "after": _errors(cal, ds, hold, ece_bins, multiclass)}
    else:
        evaluation = {"in_sample": True, "bins": ece_bins, "before": _errors(None, ds, train, ece_bins, multiclass),
                      "after": _errors(cal, ds, train, ece_bins, multiclass)}
    training = {"input": ds.source, "input_kind": ds.kind, "n": int(train.sum()), "model": ds.model}
    if holdout > 0:  # `calmon check --calibrator` judges the calibrator on these held-out rows only
        training.update(holdout_fraction=holdout, holdout_salt=salt)
    doc = cal.to_document(training=training, evaluation=evaluation)
    doc["options"] = options
    return doc


def _check_bins(options: dict[str, Any], ece_bins: int) -> None:
    """Refuse bin counts beyond :data:`MAX_FIT_BINS` before any input is read (one line)."""
    bins = options.get("bins")
    if isinstance(bins, int | float) and not isinstance(bins, bool) and bins > MAX_FIT_BINS:
        raise ValueError(f"--bins must be at most {MAX_FIT_BINS:,}, got {bins}")
    if not 1 <= ece_bins <= MAX_FIT_BINS:
        raise ValueError(f"--ece-bins must be in [1, {MAX_FIT_BINS:,}], got {ece_bins}")


def run(args: argparse.Namespace) -> int:
    options = _options(args)
    _check_bins(options, args.ece_bins)
    if args.output != "-":
        check_replaceable(args.output)  # before the work: the write refuses a device, fifo or directory anyway
    mapping = mapping_from_arguments(args)
    ds = read_inputs(args.input, model=args.model, skip_invalid=args.skip_invalid, mapping=mapping)
    doc = fit_dataset(ds, args.method, options, holdout=args.holdout, salt=args.salt, ece_bins=args.ece_bins)
    if args.output == "-":
        json.dump(doc, sys.stdout, indent=2, allow_nan=False)
        sys.stdout.write("\n")
        return 0
    write_json_atomic(args.output, doc)
    ev = doc["evaluation"]
    where = "held-out" if "holdout_n" in ev else "in-sample"
    print(f"{doc['method']}: fitted on {doc['training']['n']} rows; {where} ECE "
          f"{100 * ev['before']['ece']:.2f}% -> {100 * ev['after']['ece']:.2f}%, NLL {ev['before']['nll']:.4f} -> "
          f"{ev['after']['nll']:.4f}; wrote {args.output}")
    return 0
