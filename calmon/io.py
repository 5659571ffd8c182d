"""Read offline inputs (JSONL events, CSV, NPZ) into arrays for ``calmon check`` / ``fit`` / ``apply``.

Formats
-------
* **JSONL**: events as in :mod:`calmon.events`; predictions and outcomes are joined by id.
* **CSV** with a header: ``score,label`` (binary), ``p0,...,p{K-1},label`` (multiclass) or
  ``confidence,correct`` (top-label); an optional ``id`` column is kept.
* **NPZ**: ``confidence`` + ``correct``, ``score`` + ``label``, or ``probs`` + ``labels``
  (loaded with ``allow_pickle=False``).

Any invalid record stops the read with :class:`InputError`, whose message is one line naming
the file, the line (or array) and the field.
"""

from __future__ import annotations

import csv
import io
import sys
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from calmon.events import LABELED, OUTCOME, PREDICTION, Decoder


class InputError(ValueError):
    """Bad input: the message is one line naming the file, line and field."""


@dataclass
class Dataset:
    """Labeled predictions read from a file.

    ``z``/``y`` are the binary score and label, or for multiclass the top-label confidence
    and correctness; ``probs``/``labels`` are set for multiclass inputs.
    """

    source: str
    classes: int
    z: np.ndarray
    y: np.ndarray
    probs: np.ndarray | None = None
    labels: np.ndarray | None = None
    ids: np.ndarray | None = None
    model: str | None = None
    top_label_only: bool = False
    unjoined_predictions: int = 0
    orphan_outcomes: int = 0
    skipped: dict[str, int] = field(default_factory=dict)

    @property
    def n(self) -> int:
        return int(self.z.size)

    @property
    def kind(self) -> str:
        if self.top_label_only:
            return "top-label"
        return "binary" if self.classes == 2 else "multiclass"


def _read_bytes(path: str) -> bytes:
    if path == "-":
        return sys.stdin.buffer.read()
    p = Path(path)
    if not p.exists():
        raise InputError(f"{path}: no such file")
    if p.is_dir():
        raise InputError(f"{path}: is a directory")
    return p.read_bytes()


def read_input(path: str, model: str | None = None, skip_invalid: bool = False) -> Dataset:
    """Read ``path`` (or ``-`` for standard input); the format follows the extension or the content."""
    data = _read_bytes(path)
    name = "<stdin>" if path == "-" else path
    if not data.strip():
        raise InputError(f"{name}: empty input, no events")
    suffix = Path(path).suffix.lower() if path != "-" else ""
    if suffix == ".npz" or data[:4] == b"PK\x03\x04":
        return _read_npz(name, data)
    if suffix == ".csv" or (suffix not in (".jsonl", ".json", ".ndjson") and not data.lstrip()[:1] == b"{"):
        return _read_csv(name, data)
    return _read_jsonl(name, data, model, skip_invalid)


def _check_arrays(name: str, z: np.ndarray, y: np.ndarray, what: str) -> None:
    if z.size == 0:
        raise InputError(f"{name}: no rows")
    bad = ~np.isfinite(z) | (z < 0) | (z > 1)
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        raise InputError(f"{name}: {what} {i + 1}: score {z.flat[i]!r} is not a probability in [0, 1]")


def _read_npz(name: str, data: bytes) -> Dataset:
    try:
        with np.load(io.BytesIO(data), allow_pickle=False) as f:
            arrays = {k: f[k] for k in f.files}
    except Exception as e:  # zip or npy format errors of every kind
        raise InputError(f"{name}: not a readable NPZ file ({type(e).__name__})") from None
    if "probs" in arrays and "labels" in arrays:
        probs = np.asarray(arrays["probs"], dtype=np.float64)
        labels = np.asarray(arrays["labels"])
        if probs.ndim != 2 or probs.shape[1] < 2 or labels.shape != (probs.shape[0],):
            raise InputError(f"{name}: probs must be (n, K >= 2) and labels (n,), got {probs.shape}, {labels.shape}")
        return _multiclass(name, probs, labels, None, "row")
    for zk, yk, top in (("confidence", "correct", True), ("score", "label", False)):
        if zk in arrays and yk in arrays:
            z = np.asarray(arrays[zk], dtype=np.float64).ravel()
            y = np.asarray(arrays[yk], dtype=np.float64).ravel()
            if z.shape != y.shape:
                raise InputError(f"{name}: {zk} and {yk} have different lengths {z.size} and {y.size}")
            _check_arrays(name, z, y, "row")
            bad = (y != 0) & (y != 1)
            if bad.any():
                i = int(np.flatnonzero(bad)[0])
                raise InputError(f"{name}: row {i + 1}: {yk} {y[i]!r} is not 0 or 1")
            return Dataset(name, 2, z, y, top_label_only=top)
    raise InputError(f"{name}: NPZ needs arrays confidence+correct, score+label or probs+labels; has {sorted(arrays)}")


def _multiclass(name: str, probs: np.ndarray, labels: np.ndarray, ids: np.ndarray | None, what: str,
                tol: float = 1e-3) -> Dataset:
    k = probs.shape[1]
    bad = ~np.isfinite(probs).all(axis=1) | (probs < 0).any(axis=1) | (probs > 1).any(axis=1)
    bad |= np.abs(probs.sum(axis=1) - 1.0) > tol
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        raise InputError(f"{name}: {what} {i + 1}: probs are not a probability vector (sum {probs[i].sum():.6g})")
    lab = np.asarray(labels, dtype=np.float64)
    badl = ~np.isfinite(lab) | (lab < 0) | (lab >= k) | (lab != np.round(lab))
    if badl.any():
        i = int(np.flatnonzero(badl)[0])
        raise InputError(f"{name}: {what} {i + 1}: label {labels[i]!r} is not a class index below {k}")
    labels = lab.astype(np.int64)
    if k == 2:
        return Dataset(name, 2, probs[:, 1].copy(), labels.astype(np.float64), ids=ids)
    pred = probs.argmax(axis=1)
    z = probs[np.arange(len(probs)), pred]
    return Dataset(name, k, z, (pred == labels).astype(np.float64), probs=probs, labels=labels, ids=ids)


def _read_csv(name: str, data: bytes) -> Dataset:
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise InputError(f"{name}: not UTF-8 text (is it a binary file?)") from None
    rows = list(csv.reader(io.StringIO(text)))
    if not rows:
        raise InputError(f"{name}: empty input, no events")
    header = [h.strip() for h in rows[0]]
    body = [r for r in rows[1:] if r]
    if not body:
        raise InputError(f"{name}: header but no rows")
    cols = {h: i for i, h in enumerate(header)}
    pcols = sorted((h for h in header if h[:1] == "p" and h[1:].isdigit()), key=lambda h: int(h[1:]))
    if "score" in cols and "label" in cols:
        needed = ["score", "label"]
    elif "confidence" in cols and "correct" in cols:
        needed = ["confidence", "correct"]
    elif pcols and "label" in cols:
        if [int(h[1:]) for h in pcols] != list(range(len(pcols))):
            raise InputError(f"{name}: line 1: probability columns must be p0..p{{K-1}}, got {pcols}")
        needed = pcols + ["label"]
    else:
        raise InputError(f"{name}: line 1: header needs score,label or confidence,correct or p0..pK-1,label; "
                         f"got {','.join(header)[:80]}")
    values = np.empty((len(body), len(needed)))
    for r, row in enumerate(body):
        for c, h in enumerate(needed):
            try:
                values[r, c] = float(row[cols[h]])
            except (ValueError, IndexError):
                cell = row[cols[h]] if cols[h] < len(row) else "<missing>"
                raise InputError(f"{name}: line {r + 2}: field {h!r}: {cell[:40]!r} is not a number") from None
    ids = np.array([row[cols["id"]] if cols["id"] < len(row) else "" for row in body], dtype=object) \
        if "id" in cols else None
    if needed[0] in ("score", "confidence"):
        z, y = values[:, 0], values[:, 1]
        bad = ~np.isfinite(z) | (z < 0) | (z > 1)
        if bad.any():
            i = int(np.flatnonzero(bad)[0])
            raise InputError(f"{name}: line {i + 2}: field {needed[0]!r}: {z[i]!r} is not a probability in [0, 1]")
        bad = (y != 0) & (y != 1)
        if bad.any():
            i = int(np.flatnonzero(bad)[0])
            raise InputError(f"{name}: line {i + 2}: field {needed[1]!r}: {y[i]!r} is not 0 or 1")
        return Dataset(name, 2, z.copy(), y.copy(), ids=ids, top_label_only=needed[0] == "confidence")
    return _multiclass(name, values[:, :-1], values[:, -1], ids, "line")


def _read_jsonl(name: str, data: bytes, model: str | None, skip_invalid: bool) -> Dataset:
    lines = data.split(b"\n")
    if lines and lines[-1].strip() == b"":
        lines.pop()
    keep = [i for i, ln in enumerate(lines) if ln.strip()]
    records = [lines[i] for i in keep]
    decoder = Decoder(max_models=10_000, max_segments=10_000)
    out = decoder.decode(records)
    skipped: dict[str, int] = {}
    if out.rejected:
        if not skip_invalid:
            r = out.rejected[0]
            more = f" (and {len(out.rejected) - 1} more invalid lines)" if len(out.rejected) > 1 else ""
            raise InputError(f"{name}: line {keep[r.index] + 1}: {r.reason}: {r.detail}{more}")
        skipped = out.reason_counts()
    models = sorted(m for m in out.models if m)
    if model is None:
        if len(models) > 1:
            listed = ", ".join(models[:5])
            raise InputError(f"{name}: events of {len(models)} models ({listed}); choose one with --model")
        if not models:
            raise InputError(f"{name}: no prediction or labeled events")
        model = models[0]
    if model not in out.models:
        raise InputError(f"{name}: no events of model {model!r} (models: {', '.join(models[:5])})")
    mb = out.models[model]
    k = mb.classes
    # outcomes may carry the model or not: join on id across both groups
    outcome_groups = [mb.select(mb.kind == OUTCOME)]
    if "" in out.models:
        outcome_groups.append(out.models[""])
    out_ids = np.concatenate([g.ids for g in outcome_groups])
    out_labels = np.concatenate([g.label for g in outcome_groups])
    lab = mb.select(mb.kind == LABELED)
    pred = mb.select(mb.kind == PREDICTION)
    label_of = dict(zip(out_ids.tolist(), out_labels.tolist()))
    joined_labels = np.array([label_of.pop(i, -1) for i in pred.ids.tolist()], dtype=np.int64)
    hit = joined_labels >= 0
    bad = hit & (joined_labels >= k)
    if bad.any():
        raise InputError(f"{name}: outcome for id {pred.ids[np.flatnonzero(bad)[0]]!r}: label must be < {k}")
    labels = np.concatenate([lab.label, joined_labels[hit]])
    ids = np.concatenate([lab.ids, pred.ids[hit]])
    ds_kw = {"ids": ids, "model": model, "unjoined_predictions": int((~hit).sum()),
             "orphan_outcomes": len(label_of), "skipped": skipped}
    if labels.size == 0:
        raise InputError(f"{name}: no labeled events (predictions without outcomes: {int((~hit).sum())})")
    if k == 2:
        z = np.concatenate([lab.score, pred.score[hit]])
        return Dataset(name, 2, z, labels.astype(np.float64), **ds_kw)
    probs = np.concatenate([lab.probs, pred.probs[hit]])
    top = probs.argmax(axis=1)
    z = probs[np.arange(len(probs)), top]
    return Dataset(name, k, z, (top == labels).astype(np.float64), probs=probs, labels=labels, **ds_kw)
