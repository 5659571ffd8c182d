"""Ingestion: one batch of raw records -> decoded events -> dead letters, joined events, binned statistics.

Event time
----------
The watermark is the largest event time seen, in record order, over every kind of event
(:func:`calmon.state.join.event_watermarks`): labeled events advance it like predictions and
outcomes, and it carries over from batch to batch, so it is a function of the record order
only.  Events without ``ts`` take the arrival (wall-clock) time.  A labeled event older than
``allowed_lateness`` behind the watermark *at its own record* is dropped and counted
(``calmon_events_late_total``): "late" means the same at any batch size.  Joined events are
placed at their prediction's time.
"""

from __future__ import annotations

import gc
import logging
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import numpy as np

from calmon.events.decoder import LABELED, PREDICTION, DecodedBatch, ModelBatch
from calmon.formats.records import Batch, DeadLetterSink
from calmon.state.agentstate import AgentState
from calmon.state.batchapply import (
    BinaryColumns,
    apply_binary,
    binary_columns,
    changes_binary,
    count_events,
    is_binary,
)
from calmon.state.batchfold import fold_binary
from calmon.state.buckets import ModelWindows
from calmon.state.join import JoinedBatch, event_watermarks

log = logging.getLogger("calmon.agent")

__all__ = ["Ingestor"]


class Ingestor:
    """Applies batches to an :class:`~calmon.state.agentstate.AgentState` (runs on the ingestion thread only).

    Parameters
    ----------
    state
        The state to update (its lock is taken for the apply step only).
    dead_letter
        Where rejected records go (``None``: counted, not kept).
    clock
        Wall clock for arrival times.
    """

    def __init__(self, state: AgentState, dead_letter: DeadLetterSink | None, clock: Callable[[], float]) -> None:
        self.state = state
        self.dead_letter = dead_letter
        self.clock = clock

    def ingest(self, batch: Batch, lag_records: int | None = None, lag_bytes: int | None = None) -> None:
        """Decode, join and bin one batch; count it; dead-letter its rejects.

        ``lag_records`` / ``lag_bytes``: what the batch's source still has to read, where it knows.
        """
        now = self.clock()
        st = self.state
        with _collection_paused():
            decoded = st.decoder_for(batch.source).decode(batch.records, batch.origins, batch.meta)
        if decoded.rejected and self.dead_letter is not None:
            self.dead_letter.write([batch.records[r.index] for r in decoded.rejected],
                                   [r.reason for r in decoded.rejected], batch.source,
                                   [r.origin or "" for r in decoded.rejected] if batch.origins else None,
                                   [batch.meta[r.index] for r in decoded.rejected] if batch.meta else None)
        with st.lock:
            self._apply(decoded, now)
            c = st.counters
            c.batches += 1
            c.add_rejected(r.reason for r in decoded.rejected)
            c.add_records(batch.source, len(batch.records))
            info = st.source(batch.source)
            times = [mb.ts for mb in decoded.models.values() if mb.ts.size]
            if times:  # one reduction for the batch (issue #15: not one per model)
                info.newest_event = max(float(np.nanmax(np.concatenate(times))), info.newest_event)
            if lag_bytes is not None:
                info.lag_bytes = lag_bytes
            if lag_records is not None:
                info.lag_records = lag_records

    def _fill_time(self, decoded: DecodedBatch, now: float) -> dict[str, np.ndarray]:
        """Fill missing event times with ``now``; return the watermark at each event (record order)."""
        times = [mb.ts for mb in decoded.models.values() if mb.ts.size]
        if times and np.isnan(np.concatenate(times)).any():  # rare: look model by model only then
            for mb in decoded.models.values():
                if mb.ts.size and np.isnan(mb.ts).any():
                    mb.ts = np.where(np.isnan(mb.ts), now, mb.ts)
        return event_watermarks(decoded.models, self.state.joiner.watermark)

    def _apply(self, decoded: DecodedBatch, now: float) -> None:
        st = self.state
        wms = self._fill_time(decoded, now)
        if not wms:
            return
        joined = st.joiner.process(decoded.models, wms)  # advances the watermark in record order
        watermark = st.joiner.watermark
        count_events(st.counters, decoded.models)
        # binary models are applied for the whole batch at once (issue #15, calmon.state.batchapply); the rest
        # model by model.  Each ring gets its predictions, then labeled events, then joined pairs.
        fast = [name for name, mb in decoded.models.items() if name in wms and name and is_binary(mb)
                and getattr(st.models.get(name), "classes", 2) == 2]
        cols = binary_columns(decoded.models, wms, fast) if fast else None
        lrows = apply_binary(st, cols, watermark) if cols is not None else _NONE
        skip = set(fast)
        labeled: dict[str, tuple[np.ndarray, ModelBatch]] = {}
        preds, labs, pairs = _Folds(), _Folds(), _Folds()
        for name, mb in decoded.models.items():
            if name not in skip:
                self._apply_model(name, mb, wms, watermark, preds, labs, labeled)
        preds.fold(watermark)
        labs.fold(watermark, predictions=st.cfg.estimation.enabled)
        for name, jb in joined.items():
            mw = st.windows_of(name, jb.classes)
            if mw.classes == 2 and jb.score is not None:
                pairs.queue(mw, jb.ts, jb.segment, jb.score, jb.label)
            else:
                mw.add(jb.ts, jb.segment, jb.label, jb.score, jb.probs, watermark)
        pairs.fold(watermark)
        self._changes(cols, lrows, labeled, joined)

    def _apply_model(self, name: str, mb: ModelBatch, wms: dict[str, np.ndarray], watermark: float, preds: _Folds,
                     labs: _Folds, labeled: dict[str, tuple[np.ndarray, ModelBatch]]) -> None:
        """One model's events of the batch (the models :func:`~calmon.state.batchapply.apply_binary` does not take:
        multiclass, score-less, and events without a model)."""
        st = self.state
        if not name or name not in wms:
            return
        estimation = st.cfg.estimation.enabled
        on_time = mb.ts >= wms[name] - st.cfg.windows.allowed_lateness
        lab = mb.kind == LABELED
        late = lab & ~on_time
        if late.any():
            st.counters.add_late(name, int(late.sum()))
        # labeled events reach the prediction-side grid through their bucket's update (one ring pass, not two)
        psel = np.flatnonzero(on_time & (mb.kind == PREDICTION)) if estimation else _NONE
        if psel.size:
            mw = st.windows_of(name, mb.classes)
            if mb.score is not None and mb.probs is None:
                preds.queue(mw, mb.ts[psel], mb.segment[psel], mb.score[psel], None)
            else:
                mw.add_predictions(mb.ts[psel], mb.segment[psel], None if mb.score is None else mb.score[psel],
                                   None if mb.probs is None else mb.probs[psel], watermark)
        sel = np.flatnonzero(lab & on_time)
        if sel.size:
            mw = st.windows_of(name, mb.classes)
            if mw.classes == 2 and mb.score is not None:
                labs.queue(mw, mb.ts[sel], mb.segment[sel], mb.score[sel], mb.label[sel])
            else:
                mw.add(mb.ts[sel], mb.segment[sel], mb.label[sel], None if mb.score is None else mb.score[sel],
                       None if mb.probs is None else mb.probs[sel], watermark, predictions=estimation)
            labeled[name] = (sel, mb)

    def _changes(self, cols: BinaryColumns | None, lrows: np.ndarray,
                 labeled: dict[str, tuple[np.ndarray, ModelBatch]], joined: dict[str, JoinedBatch]) -> None:
        """Labeled pairs of each model to its change detector, merged in record order of their completing event:
        binary models' in one pass (:func:`~calmon.state.batchapply.changes_binary`), the others model by model."""
        mon = self.state.changes
        if not mon.cfg.enabled:
            return
        slow = {name for name, jb in joined.items() if not is_binary(jb)} | set(labeled)
        names = set(joined) | set(labeled)
        if cols is not None:
            names.update(cols.names[i] for i in np.unique(cols.part[lrows]).tolist())
        mon.touch(sorted(names))  # detectors in name order, whichever path feeds them
        changes_binary(mon, cols, lrows, [jb for name, jb in joined.items() if name not in slow])
        for name in sorted(slow):
            parts = []
            if name in labeled:
                sel, mb = labeled[name]
                parts.append((mb.index[sel], mb.ts[sel], mb.label[sel], None if mb.score is None else mb.score[sel],
                              None if mb.probs is None else mb.probs[sel]))
            jb = joined.get(name)
            if jb is not None and len(jb):
                assert jb.index is not None  # the Joiner always fills it
                parts.append((jb.index, jb.ts, jb.label, jb.score, jb.probs))
            order = np.argsort(np.concatenate([p[0] for p in parts]), kind="stable")
            cols_ = [_merge([p[i] for p in parts], order) for i in (1, 2, 3, 4)]
            ts, labels = cols_[0], cols_[1]
            assert ts is not None and labels is not None
            mon.update(name, cols_[2], cols_[3], labels.astype(np.int64), ts)


_NONE = np.zeros(0, dtype=np.int64)


@contextmanager
def _collection_paused() -> Iterator[None]:
    """Automatic garbage collection off while a batch is decoded (as :class:`~calmon.state.agentstate.StateLock`
    does while it is applied): the batch's temporaries then die by reference counting instead of being
    promoted to the old generation, whose full collections traverse every object of the state (issue #15:
    a cost that grew with the number of models).  A collection that falls due runs after, as usual."""
    if not gc.isenabled():  # the application (or a caller) manages collection itself
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


class _Folds:
    """Binary events of several models gathered from one batch, folded into their rings at once
    (:func:`~calmon.state.batchfold.fold_binary`)."""

    def __init__(self) -> None:
        self.parts: list[tuple[ModelWindows, np.ndarray, np.ndarray, np.ndarray, np.ndarray | None]] = []

    def queue(self, mw: ModelWindows, ts: np.ndarray, segment: np.ndarray, score: np.ndarray,
              labels: np.ndarray | None) -> None:
        self.parts.append((mw, ts, segment, score, labels))

    def fold(self, watermark: float, predictions: bool = False) -> None:
        if not self.parts:
            return
        sizes = np.cumsum([p[1].size for p in self.parts]).tolist()
        if len(self.parts) == 1:  # one model: its columns as they are (fold_binary only reads them)
            cols, labels = list(self.parts[0][1:4]), self.parts[0][4]
        else:
            cols = [np.concatenate([p[i] for p in self.parts]) for i in (1, 2, 3)]  # ts, segment, score
            labels = None if self.parts[0][4] is None else np.concatenate([p[4] for p in self.parts])
        parts = [(p[0], np.arange(a, b)) for p, a, b in zip(self.parts, [0, *sizes], sizes)]
        fold_binary(parts, cols[0], cols[1], cols[2], labels, watermark, predictions)
        self.parts = []


def _merge(cols: list[np.ndarray | None], order: np.ndarray) -> np.ndarray | None:
    """Concatenate one column of several parts and put it in ``order`` (``None`` if the column is absent)."""
    present = [c for c in cols if c is not None]
    return np.concatenate(present)[order] if present and len(present) == len(cols) else None
