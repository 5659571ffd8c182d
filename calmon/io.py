"""Read offline inputs (JSONL events, CSV, NPZ) into arrays for ``calmon check`` / ``fit`` / ``apply``.

Formats
-------
* **JSONL**: events as in :mod:`calmon.events`; predictions and outcomes are joined by id with the
  agent's :class:`calmon.agent.join.Joiner` (without a time limit: the whole file is one batch).
* **CSV** with a header (read as :mod:`calmon.csvrows` reads it for the agent): ``score,label``
  (binary), ``p0,...,p{K-1},label`` (multiclass) or ``confidence,correct`` (top-label); an
  optional ``id`` column is kept.
* **NPZ**: ``confidence`` + ``correct``, ``score`` + ``label``, or ``probs`` + ``labels``
  (loaded with ``allow_pickle=False``).

Any invalid record stops the read with :class:`InputError`, whose message is one line naming
the file, the line (or array) and the field; with ``skip_invalid`` invalid JSONL records are
counted by reason code and skipped instead. Records are decoded by :class:`calmon.events.Decoder`,
which never raises for a record (invalid UTF-8, deep nesting, huge numbers all get a reason code),
but without the agent's wall-clock limits: offline files are historical and event times do not
change the result of ``check``, so ``future_timestamp``/``past_timestamp`` are never raised here
(epoch numbers above 1e11, probable milliseconds, are still ``bad_timestamp``).
"""

from __future__ import annotations

import io
import math
import sys
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np

from calmon.agent.join import JoinedBatch, Joiner
from calmon.csvrows import CsvLayout, read_rows
from calmon.events import LABELED, PREDICTION, DecodedBatch, Decoder, ModelBatch

_MAX_CLASSES = 100_000  # the largest limits.max_classes the configuration accepts


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
    #: Event times (JSON Lines inputs; NaN where an event had none): the report's time view.
    ts: np.ndarray | None = None
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
    except Exception as e:  # noqa: BLE001 - np.load's zip and npy readers raise many unrelated types
        raise InputError(f"{name}: not a readable NPZ file ({type(e).__name__})") from None
    if "probs" in arrays and "labels" in arrays:
        probs = _floats(name, "probs", arrays["probs"])
        labels = _floats(name, "labels", arrays["labels"])
        if probs.ndim != 2 or probs.shape[1] < 2 or labels.shape != (probs.shape[0],):
            raise InputError(f"{name}: probs must be (n, K >= 2) and labels (n,), got {probs.shape}, {labels.shape}")
        return _multiclass(name, probs, labels, None, "row")
    for zk, yk, top in (("confidence", "correct", True), ("score", "label", False)):
        if zk in arrays and yk in arrays:
            for key in (zk, yk):
                if arrays[key].ndim != 1:
                    raise InputError(f"{name}: array {key!r} must be 1-D (n,), got shape {arrays[key].shape}")
            z = _floats(name, zk, arrays[zk])
            y = _floats(name, yk, arrays[yk])
            if z.shape != y.shape:
                raise InputError(f"{name}: {zk} and {yk} have different lengths {z.size} and {y.size}")
            _check_arrays(name, z, y, "row")
            bad = (y != 0) & (y != 1)
            if bad.any():
                i = int(np.flatnonzero(bad)[0])
                raise InputError(f"{name}: row {i + 1}: {yk} {y[i]!r} is not 0 or 1")
            return Dataset(name, 2, z, y, top_label_only=top)
    raise InputError(f"{name}: NPZ needs arrays confidence+correct, score+label or probs+labels; has {sorted(arrays)}")


def _floats(name: str, key: str, a: np.ndarray) -> np.ndarray:
    """An NPZ array as float64, or a one-line error (strings, objects, complex numbers...)."""
    if a.dtype.kind not in "biuf":
        raise InputError(f"{name}: array {key!r} must hold numbers, got dtype {a.dtype}")
    return np.asarray(a, dtype=np.float64)


def _multiclass(name: str, probs: np.ndarray, labels: np.ndarray, ids: np.ndarray | None, what: str,
                lines: list[int] | None = None, tol: float = 1e-3) -> Dataset:
    """A multiclass dataset (binary when K = 2); ``lines`` number the rows in messages (default 1, 2, ...)."""
    k = probs.shape[1]
    bad = ~np.isfinite(probs).all(axis=1) | (probs < 0).any(axis=1) | (probs > 1).any(axis=1)
    bad |= np.abs(probs.sum(axis=1) - 1.0) > tol
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        raise InputError(f"{name}: {what} {_row(i, lines)}: probs are not a probability vector "
                         f"(sum {probs[i].sum():.6g})")
    lab = np.asarray(labels, dtype=np.float64)
    badl = ~np.isfinite(lab) | (lab < 0) | (lab >= k) | (lab != np.round(lab))
    if badl.any():
        i = int(np.flatnonzero(badl)[0])
        raise InputError(f"{name}: {what} {_row(i, lines)}: label {labels[i]!r} is not a class index below {k}")
    labels = lab.astype(np.int64)
    if k == 2:
        return Dataset(name, 2, probs[:, 1].copy(), labels.astype(np.float64), ids=ids)
    pred = probs.argmax(axis=1)
    z = probs[np.arange(len(probs)), pred]
    return Dataset(name, k, z, (pred == labels).astype(np.float64), probs=probs, labels=labels, ids=ids)


def _row(i: int, lines: list[int] | None) -> int:
    return i + 1 if lines is None else lines[i]


def _read_csv(name: str, data: bytes) -> Dataset:
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise InputError(f"{name}: not UTF-8 text (is it a binary file?)") from None
    rows = list(read_rows(text))
    if not rows:
        raise InputError(f"{name}: empty input, no events")
    header, body = rows[0][1], rows[1:]
    if not body:
        raise InputError(f"{name}: header but no rows")
    layout = CsvLayout.from_names(header)
    score, label, id_col = layout.column("score"), layout.column("label"), layout.column("id")
    if label is None or (score is None and not layout.probs):
        raise InputError(f"{name}: line 1: header needs score,label or confidence,correct or p0..pK-1,label; "
                         f"got {','.join(header)[:80]}")
    if layout.error is not None:
        raise InputError(f"{name}: line 1: {layout.error}")
    needed = [score] if score is not None else list(layout.probs)
    values = _csv_numbers(name, body, [*needed, label], layout)
    ids = np.array([cells[id_col] if id_col < len(cells) else "" for _, cells in body], dtype=object) \
        if id_col is not None else None
    if score is None:
        return _multiclass(name, values[:, :-1], values[:, -1], ids, "line", [n for n, _ in body])
    z, y = values[:, 0], values[:, 1]
    for bad, col, what in ((~np.isfinite(z) | (z < 0) | (z > 1), score, "is not a probability in [0, 1]"),
                           ((y != 0) & (y != 1), label, "is not 0 or 1")):
        if bad.any():
            i = int(np.flatnonzero(bad)[0])
            v = values[i, 0 if col == score else 1]
            raise InputError(f"{name}: line {body[i][0]}: field {layout.names[col]!r}: {v!r} {what}")
    return Dataset(name, 2, z.copy(), y.copy(), ids=ids, top_label_only=layout.top_label)


def _csv_numbers(name: str, body: list[tuple[int, list[str]]], cols: list[int], layout: CsvLayout) -> np.ndarray:
    """The cells of ``cols`` as floats; the first cell that is not a number stops the read."""
    values = np.empty((len(body), len(cols)))
    for r, (line, cells) in enumerate(body):
        for c, col in enumerate(cols):
            try:
                values[r, c] = float(cells[col])
            except (ValueError, IndexError):
                cell = cells[col] if col < len(cells) else "<missing>"
                raise InputError(f"{name}: line {line}: field {layout.names[col]!r}: {cell[:40]!r} "
                                 f"is not a number") from None
    return values


def _read_jsonl(name: str, data: bytes, model: str | None, skip_invalid: bool) -> Dataset:
    lines = data.split(b"\n")
    if lines and lines[-1].strip() == b"":
        lines.pop()
    keep = [i for i, ln in enumerate(lines) if ln.strip()]
    # offline files are historical and their times do not affect the result: no wall-clock limits here
    out = Decoder(max_models=10_000, max_segments=10_000, max_classes=_MAX_CLASSES,
                  max_id_bytes=65_536).decode([lines[i] for i in keep])
    skipped: dict[str, int] = {}
    if out.rejected:
        if not skip_invalid:
            r = out.rejected[0]
            more = f" (and {len(out.rejected) - 1} more invalid lines)" if len(out.rejected) > 1 else ""
            raise InputError(f"{name}: line {keep[r.index] + 1}: {r.reason}: {r.detail}{more}")
        skipped = out.reason_counts()
    model = _choose_model(name, out, model)
    return _labeled_dataset(name, out, model, skipped)


def _choose_model(name: str, out: DecodedBatch, model: str | None) -> str:
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
    return model


def _join(out: DecodedBatch, model: str) -> tuple[JoinedBatch | None, int]:
    """The model's predictions joined with outcomes (with or without the model), and the orphan count.

    One batch and no time limit, so event times do not matter (NaN ones are set to 0 because the
    joiner compares them); predictions and outcomes may come in either order.
    """
    groups = {m: out.models[m] for m in (model, "") if m in out.models}
    filled = {m: replace(b, ts=np.where(np.isnan(b.ts), 0.0, b.ts)) for m, b in groups.items()}
    joiner = Joiner(ttl=math.inf, max_pending=max(1, sum(len(b) for b in groups.values())))
    joined = joiner.process(filled).get(model)
    return joined, joiner.counters.orphans + len(joiner.early)


def _labeled_dataset(name: str, out: DecodedBatch, model: str, skipped: dict[str, int]) -> Dataset:
    """Labeled events in record order, then joined predictions in the order of the predictions."""
    mb = out.models[model]
    k = mb.classes
    lab, pred = mb.select(mb.kind == LABELED), mb.select(mb.kind == PREDICTION)
    joined, orphans = _join(out, model)
    pairs = _in_prediction_order(joined, pred) if joined is not None else None
    n_joined = 0 if pairs is None else len(pairs.label)
    if pairs is not None and (pairs.label >= k).any():
        bad = int(np.flatnonzero(pairs.label >= k)[0])
        raise InputError(f"{name}: outcome for id {pairs.ids[bad]!r}: label must be < {k}")
    unjoined = len(pred) - n_joined
    if len(lab) + n_joined == 0:
        raise InputError(f"{name}: no labeled events (predictions without outcomes: {unjoined})")
    labels = lab.label if pairs is None else np.concatenate([lab.label, pairs.label])
    ids = lab.ids if pairs is None else np.concatenate([lab.ids, pairs.ids])
    ts = lab.ts if pairs is None else np.concatenate([lab.ts, pairs.ts])
    if k == 2:
        z = _stack(lab.score, None if pairs is None else pairs.score)
        return Dataset(name, 2, z, labels.astype(np.float64), ids=ids, ts=ts, model=model,
                       unjoined_predictions=unjoined, orphan_outcomes=orphans, skipped=skipped)
    probs = _stack(lab.probs, None if pairs is None else pairs.probs)
    top = probs.argmax(axis=1)
    return Dataset(name, k, probs[np.arange(len(probs)), top], (top == labels).astype(np.float64), probs=probs,
                   labels=labels, ids=ids, ts=ts, model=model, unjoined_predictions=unjoined, orphan_outcomes=orphans,
                   skipped=skipped)


@dataclass
class _Pairs:
    label: np.ndarray
    ids: np.ndarray
    ts: np.ndarray
    score: np.ndarray | None
    probs: np.ndarray | None


def _in_prediction_order(joined: JoinedBatch, pred: ModelBatch) -> _Pairs:
    """Reorder joined pairs (completed in outcome order) into the record order of their predictions."""
    first: dict[str, int] = {}
    for i, key in enumerate(pred.ids.tolist()):
        first.setdefault(key, i)
    assert joined.ids is not None
    order = np.argsort([first[key] for key in joined.ids.tolist()], kind="stable")
    return _Pairs(joined.label[order], joined.ids[order], joined.ts[order],
                  None if joined.score is None else joined.score[order],
                  None if joined.probs is None else joined.probs[order])


def _stack(a: np.ndarray | None, b: np.ndarray | None) -> np.ndarray:
    parts = [x for x in (a, b) if x is not None]
    return np.concatenate(parts) if parts else np.zeros(0)
