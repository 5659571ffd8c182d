"""``calmon apply``: recalibrate the predictions of a file with a calibrator document."""

from __future__ import annotations

import argparse
import csv
import io
import json
import sys
from pathlib import Path
from typing import Any

import numpy as np

from calmon.calibration.base import Calibrator
from calmon.calibration.document import load
from calmon.commands import SUMMARIES
from calmon.events.schema import add_schema_arguments, mapping_from_arguments
from calmon.offline.inputs import INPUTS_HELP, Dataset, read_inputs

FORMATS = ("csv", "jsonl", "npz")


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("apply", help=SUMMARIES["apply"],
                       description="Apply a calibrator (from `calmon fit`) to JSONL events, CSV or NPZ and write the "
                                   "recalibrated predictions with their labels (readable by `calmon check`).")
    p.add_argument("calibrator", help="calibrator document (JSON) written by `calmon fit`")
    p.add_argument("input", nargs="+", help=INPUTS_HELP)
    p.add_argument("-o", "--output", default="-", help="output file (default: CSV on standard output)")
    p.add_argument("--format", choices=FORMATS, default=None,
                   help="output format (default: from the output extension, else csv)")
    p.add_argument("--model", default=None, help="model to use when the events hold several")
    p.add_argument("--skip-invalid", action="store_true", help="skip invalid JSONL events instead of stopping")
    add_schema_arguments(p)
    p.set_defaults(func=run)


def apply_dataset(cal: Calibrator, ds: Dataset) -> dict[str, Any]:
    """Recalibrated columns: ``{"kind", "ids", "score"/"confidence"/"probs", "label"/"correct"/"labels", "raw"}``."""
    if cal.kind == "multiclass":
        if ds.probs is None:
            raise ValueError(f"calibrator {cal.method!r} is multiclass; {ds.source} has {ds.kind} data")
        if cal.classes is not None and ds.probs.shape[1] != cal.classes:
            raise ValueError(f"calibrator was fitted on {cal.classes} classes; {ds.source} has {ds.probs.shape[1]}")
        return {"kind": "multiclass", "ids": ds.ids, "probs": cal.predict(ds.probs), "labels": ds.labels}
    out = np.clip(cal.predict(ds.z), 0.0, 1.0)
    if ds.kind == "binary":
        return {"kind": "binary", "ids": ds.ids, "score": out, "label": ds.y, "raw": ds.z}
    return {"kind": "top-label", "ids": ds.ids, "confidence": out, "correct": ds.y, "raw": ds.z}


def _csv_text(res: dict[str, Any]) -> str:
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    ids = res["ids"]
    lead = ["id"] if ids is not None else []
    if res["kind"] == "multiclass":
        probs = res["probs"]
        w.writerow(lead + [f"p{k}" for k in range(probs.shape[1])] + ["label"])
        for i in range(probs.shape[0]):
            w.writerow(([ids[i]] if ids is not None else []) + [repr(float(v)) for v in probs[i]]
                       + [int(res["labels"][i])])
    else:
        zk, yk = ("score", "label") if res["kind"] == "binary" else ("confidence", "correct")
        w.writerow(lead + [zk, yk, f"raw_{zk}"])
        for i in range(res[zk].size):
            w.writerow(([ids[i]] if ids is not None else []) + [repr(float(res[zk][i])), int(res[yk][i]),
                                                                 repr(float(res["raw"][i]))])
    return buf.getvalue()


def _jsonl_text(res: dict[str, Any], model: str | None) -> str:
    if res["kind"] == "top-label":
        raise ValueError("top-label data (confidence, correct) has no event form; write .csv or .npz")
    lines = []
    ids = res["ids"]
    for i in range(len(res["labels"] if res["kind"] == "multiclass" else res["label"])):
        ev: dict[str, Any] = {"type": "labeled", "id": str(ids[i]) if ids is not None else str(i)}
        if model:
            ev["model"] = model
        if res["kind"] == "multiclass":
            ev["probs"] = [float(v) for v in res["probs"][i]]
            ev["label"] = int(res["labels"][i])
        else:
            ev["score"] = float(res["score"][i])
            ev["label"] = int(res["label"][i])
        lines.append(json.dumps(ev, allow_nan=False))
    return "\n".join(lines) + "\n"


def write_output(res: dict[str, Any], path: str, fmt: str | None, model: str | None = None) -> None:
    if fmt is None:
        suffix = Path(path).suffix.lower().lstrip(".") if path != "-" else "csv"
        fmt = {"ndjson": "jsonl", "json": "jsonl"}.get(suffix, suffix)
        if fmt not in FORMATS:
            fmt = "csv"
    if fmt == "npz":
        if path == "-":
            raise ValueError("npz output needs a file name (-o out.npz)")
        arrays = {k: np.asarray(v) for k, v in res.items() if k not in ("kind", "ids") and v is not None}
        if res["ids"] is not None:
            arrays["ids"] = np.asarray(res["ids"], dtype=str)
        with open(path, "wb") as fh:
            np.savez(fh, **arrays)  # type: ignore[arg-type]  # numpy's stub types **kwds as the allow_pickle flag
        return
    text = _csv_text(res) if fmt == "csv" else _jsonl_text(res, model)
    if path == "-":
        sys.stdout.write(text)
    else:
        Path(path).write_text(text, encoding="utf-8")


def run(args: argparse.Namespace) -> int:
    cal = load(args.calibrator)
    mapping = mapping_from_arguments(args)
    ds = read_inputs(args.input, model=args.model, skip_invalid=args.skip_invalid, mapping=mapping)
    res = apply_dataset(cal, ds)
    write_output(res, args.output, args.format, ds.model)
    if args.output != "-":
        print(f"{cal.method}: recalibrated {ds.n} rows ({res['kind']}); wrote {args.output}")
    if cal.training.get("input") == ds.source:  # `calmon check` on the output would judge it on its own fit data
        print(f"note: {cal.training.get('n', 'some')} of these rows were used to fit the calibrator and cannot judge "
              f"it; judge it with `calmon check --calibrator {args.calibrator} {' '.join(args.input)}` (the rows it "
              "was not fitted on)", file=sys.stderr)
    return 0
