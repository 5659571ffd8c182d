"""The binary models of one batch, applied at once (issue #15: per-batch, not per-model costs).

At a thousand models a batch holds a few dozen events per model, and ``Ingestor._apply`` took each model in
turn: counting its events by kind, testing its labeled events for lateness, gathering its predictions and
labeled events for the fold, merging its labeled and joined pairs for its change detector -- a dozen numpy
calls per model and batch, a cost that grew with the number of models.  :func:`binary_columns` concatenates
the columns of the batch's binary models once; :func:`apply_binary` counts, tests lateness and folds all of
them with batch-wide array operations, and :func:`changes_binary` feeds their change detectors in one pass.
Everything ends up as with the model-by-model path (``tests/test_batchapply.py`` compares the two states).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from calmon.events.decoder import KINDS, LABELED, PREDICTION, ModelBatch
from calmon.state.agentstate import AgentState
from calmon.state.batchfold import fold_binary
from calmon.state.counters import Counters
from calmon.state.join import JoinedBatch
from calmon.state.monitors import ChangeMonitor

__all__ = ["BinaryColumns", "apply_binary", "binary_columns", "changes_binary", "count_events", "is_binary"]


def is_binary(mb: ModelBatch | JoinedBatch) -> bool:
    """Events of a binary model with scores (the batched path's case)."""
    return mb.classes == 2 and mb.score is not None and mb.probs is None


@dataclass
class BinaryColumns:
    """The events of several binary models of a batch, concatenated model after model (each model's rows in
    record order)."""

    names: list[str]
    part: np.ndarray  #: the model (position in ``names``) of each row
    kind: np.ndarray
    ts: np.ndarray
    wm: np.ndarray  #: the watermark at each event (:func:`calmon.state.join.event_watermarks`)
    segment: np.ndarray
    score: np.ndarray
    label: np.ndarray
    index: np.ndarray  #: record index in the batch


def binary_columns(models: dict[str, ModelBatch], wms: dict[str, np.ndarray], names: Sequence[str]
                   ) -> BinaryColumns:
    """Concatenate the columns of ``models[name]`` for ``names`` (binary models with events, see :func:`is_binary`)."""
    mbs = [models[n] for n in names]
    sizes = [len(mb) for mb in mbs]

    def cat(cols: list[np.ndarray]) -> np.ndarray:
        return np.concatenate(cols) if cols else np.zeros(0)

    return BinaryColumns(list(names), np.repeat(np.arange(len(mbs)), sizes),
                         cat([mb.kind for mb in mbs]), cat([mb.ts for mb in mbs]), cat([wms[n] for n in names]),
                         cat([mb.segment for mb in mbs]), cat([mb.score for mb in mbs if mb.score is not None]),
                         cat([mb.label for mb in mbs]), cat([mb.index for mb in mbs]))


def count_events(counters: Counters, models: dict[str, ModelBatch]) -> None:
    """Add the events of every model of a batch by kind to ``counters``, in the models' order (one
    ``bincount`` for the batch)."""
    parts = [(name, mb.kind) for name, mb in models.items() if len(mb)]
    if not parts:
        return
    kinds = np.concatenate([k for _, k in parts])
    part = np.repeat(np.arange(len(parts)), [k.size for _, k in parts])
    counts = np.bincount(part * 3 + kinds, minlength=3 * len(parts)).reshape(len(parts), 3).tolist()
    for (name, _), row in zip(parts, counts):
        for k, cnt in enumerate(row):
            if cnt:
                counters.add_events(name or "", KINDS[k], cnt)


def apply_binary(st: AgentState, cols: BinaryColumns, watermark: float) -> np.ndarray:
    """Drop and count the late labeled events of ``cols``'s models, fold their on-time
    predictions (with estimation enabled) and labeled events into their rings.

    Returns the rows of the on-time labeled events (for :func:`changes_binary`).
    """
    n_models = len(cols.names)
    on_time = cols.ts >= cols.wm - st.cfg.windows.allowed_lateness
    lab = cols.kind == LABELED
    late = np.bincount(cols.part[lab & ~on_time], minlength=n_models)
    for i in np.flatnonzero(late).tolist():
        st.counters.add_late(cols.names[i], int(late[i]))
    estimation = st.cfg.estimation.enabled
    prows = np.flatnonzero(on_time & (cols.kind == PREDICTION)) if estimation else np.zeros(0, np.int64)
    lrows = np.flatnonzero(lab & on_time)
    busy = np.bincount(cols.part[prows], minlength=n_models) + np.bincount(cols.part[lrows], minlength=n_models)
    for i in np.flatnonzero(busy).tolist():  # rings created in model order, as the model-by-model path does
        st.windows_of(cols.names[i], 2)
    _fold(st, cols, prows, None, watermark, False)  # each ring: its predictions first, then its labeled events
    _fold(st, cols, lrows, cols.label, watermark, estimation)
    return lrows


def _fold(st: AgentState, cols: BinaryColumns, rows: np.ndarray, labels: np.ndarray | None, watermark: float,
          predictions: bool) -> None:
    """Fold the events ``rows`` of the models of ``cols`` into their rings, with one :func:`fold_binary`."""
    if not rows.size:
        return
    whole = rows.size == cols.part.size  # every row (one model's labeled batch): the columns, not gathers

    def pick(a: np.ndarray) -> np.ndarray:
        return a if whole else a[rows]

    part = pick(cols.part)
    heads = np.flatnonzero(np.concatenate([[True], part[1:] != part[:-1]]))
    ends = [*heads[1:].tolist(), rows.size]
    parts = [(st.windows_of(cols.names[p], 2), np.arange(a, b))
             for p, a, b in zip(part[heads].tolist(), heads.tolist(), ends)]
    fold_binary(parts, pick(cols.ts), pick(cols.segment), pick(cols.score), None if labels is None else pick(labels),
                watermark, predictions)


def changes_binary(mon: ChangeMonitor, cols: BinaryColumns | None, lrows: np.ndarray,
                   joined: Sequence[JoinedBatch]) -> None:
    """Feed the labeled events ``lrows`` of ``cols`` and the ``joined`` pairs (binary models) to the change
    detectors, model by model in name order, each model's pairs in record order of their completing event."""
    names: list[str] = []
    parts: list[tuple[np.ndarray, ...]] = []
    if cols is not None and lrows.size:
        names.extend(cols.names)
        parts.append((cols.part[lrows], cols.index[lrows], cols.ts[lrows], cols.label[lrows], cols.score[lrows]))
    for jb in joined:
        assert jb.index is not None and jb.score is not None  # the Joiner fills them; binary
        parts.append((np.full(len(jb), len(names)), jb.index, jb.ts, jb.label, jb.score))
        names.append(jb.model)
    if not parts:
        return
    part, index, ts, label, score = (np.concatenate(c) for c in zip(*parts))
    every = sorted(set(names))
    rank = {n: i for i, n in enumerate(every)}
    code = np.array([rank[n] for n in names], dtype=np.int64)[part]
    order = np.lexsort((index, code))
    sc = code[order]
    present = np.unique(sc)
    bounds = [*np.searchsorted(sc, present).tolist(), sc.size]
    mon.update_many([every[i] for i in present.tolist()], bounds, score[order], label[order].astype(np.int64),
                    ts[order])
