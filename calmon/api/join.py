"""Predictions and outcomes in two frames -> the joined dataset ``calmon check predictions outcomes`` reads.

The rows become the events a file of each would hold (``prediction`` and ``outcome`` records) and go through the
offline reader's one decoder and one join (:class:`calmon.offline.accumulator.EventAccumulator`, the agent's
:class:`calmon.state.join.Joiner` without a time limit), so the result is the one ``calmon check`` gives for the
two files: the same validation (a bad row is one line naming ``<predictions>`` or ``<outcomes>``, the row and the
field), the same treatment of duplicate ids, and the same counts of predictions still without outcome and of
outcomes without prediction.

Examples
--------
>>> preds = {"id": ["a", "b", "c"], "score": [0.2, 0.9, 0.6]}
>>> outs = {"id": ["c", "a"], "label": [1, 0]}
>>> ds = joined_dataset(preds, outs)
>>> ds.n, ds.joined, ds.unjoined_predictions, sorted(ds.ids.tolist())
(2, 2, 1, ['a', 'c'])
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any

import msgspec
import numpy as np

from calmon.api.frame import Column, _column, _model_rows, _raw, _times, columns_of, prediction_columns
from calmon.offline.accumulator import Chunk, EventAccumulator, make_decoder
from calmon.offline.dataset import Dataset
from calmon.offline.inputs import DEFAULT_MODEL

__all__ = ["joined_dataset"]

#: Rows encoded and decoded at a time (the offline reader's chunk size).
CHUNK_ROWS = 65_536
_ENCODER = msgspec.json.Encoder()


def joined_dataset(predictions: Any, outcomes: Any, *, score: Column = None, probs: Column = None,
                   label: Column = "label", id: Column = "id", ts: Column = None,  # noqa: A002 -- the event field
                   model: str | None = None, skip_invalid: bool = False) -> Dataset:
    """The dataset of ``predictions`` joined by id with ``outcomes``, as ``calmon check`` joins two files.

    Parameters
    ----------
    predictions
        Frame (pandas, polars, dict of arrays, structured array) with an id and ``score`` or ``probs`` (column
        names as in :func:`calmon.api.frame.to_dataset`), optional ``ts`` and ``model`` columns.
    outcomes
        Frame with the id and ``label`` columns (same names), optional ``ts`` and ``model`` columns; an outcome
        without model joins its prediction's model.
    score, probs, label, id, ts
        Column names (``id`` and ``label`` default to ``"id"`` and ``"label"``, ``score``/``probs`` to the
        ``score``, ``probs`` or ``p0..p{K-1}`` columns, ``ts`` to the ``ts`` column of each frame when present).
    model
        The model to check when the predictions hold several (as ``--model``); else their only one.
    skip_invalid
        Count invalid rows by reason and skip them instead of raising.

    Raises
    ------
    ValueError
        A missing column, or (without ``skip_invalid``) the first invalid row, in one line naming the frame,
        the row and the field, as ``calmon check`` names the file and the line.
    """
    acc = EventAccumulator(make_decoder(None), "row")
    acc.decoder.max_record_bytes = math.inf
    acc.add_all(_records(predictions, "prediction", score=score, probs=probs, label=None, id=id, ts=ts, model=model))
    acc.add_all(_records(outcomes, "outcome", score=None, probs=None, label=label, id=id, ts=ts, model=None))
    return acc.dataset("<predictions>, <outcomes>", model, skip_invalid)


def _records(data: Any, kind: str, *, score: Column, probs: Column, label: Column, id: Column,  # noqa: A002
             ts: Column, model: str | None) -> Iterator[Chunk]:
    """The rows of one frame as event records (JSON bytes), ``CHUNK_ROWS`` at a time."""
    name = f"<{kind}s>"
    cols = columns_of(data)
    if cols is None:
        raise ValueError(f"{kind}s: expected a DataFrame, a dict of arrays or a structured array, got None")
    present = set(cols)
    fields: dict[str, list[Any]] = {}
    for key, arg in (("id", id), ("ts", ts if ts is not None else ("ts" if "ts" in present else None))):
        if arg is not None:
            try:
                fields[key] = _column(data, cols, arg, key).tolist() if key == "id" else \
                    _times(_column(data, cols, arg, key)).tolist()
            except ValueError as exc:
                raise ValueError(f"{kind}s: {exc}") from None
    if kind == "prediction":
        score, probs = prediction_columns(cols, score, probs, "predictions have")
        if score is not None:
            fields["score"] = _column(data, cols, score, "score").tolist()
        elif isinstance(probs, (list, tuple)) and all(isinstance(c, str) for c in probs):
            fields["probs"] = np.column_stack([_column(data, cols, c, "probs") for c in probs]).tolist()
        else:
            fields["probs"] = [np.asarray(v, dtype=float).tolist() for v in _column(data, cols, probs, "probs")]
    else:
        fields["label"] = [int(v) if isinstance(v, (bool, np.bool_)) else v
                           for v in _column(data, cols, label, "label").tolist()]
    # the predictions of the model to check (as --model); outcomes all go to the join, which finds their model
    keep = _model_rows(data, cols, model)[0] if kind == "prediction" else None
    models = _raw(data["model"]).astype(str).tolist() if "model" in present else None
    n = len(next(iter(fields.values())))
    if any(len(v) != n for v in fields.values()):
        shown = ", ".join(f"{k}: {len(v)}" for k, v in fields.items())
        raise ValueError(f"{kind}s: Found input variables with inconsistent numbers of samples: [{shown}]")
    rows = range(n) if keep is None else np.flatnonzero(keep).tolist()
    default_model = model or DEFAULT_MODEL  # a table without model column, as calmon check names it
    encode = _ENCODER.encode
    batch: list[bytes] = []
    numbers: list[int] = []
    for i in rows:
        rec: dict[str, Any] = {"type": kind}
        for key, values in fields.items():
            v = values[i]
            if key == "id":
                v = str(v)
            elif key == "ts" and (v is None or v != v):  # NaN/NaT: no time, as a record without ts
                continue
            rec[key] = v
        if models is not None:
            rec["model"] = models[i]
        elif kind == "prediction":
            rec["model"] = default_model
        batch.append(encode(rec))
        numbers.append(i + 1)
        if len(batch) == CHUNK_ROWS:
            yield Chunk(name, batch, numbers)
            batch, numbers = [], []
    if batch:
        yield Chunk(name, batch, numbers)
