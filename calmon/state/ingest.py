"""Ingestion: one batch of raw records -> decoded events -> dead letters, joined events, binned statistics.

Event time
----------
The watermark is the largest event time seen, in record order, over every kind of event
(:func:`calmon.state.join.event_watermarks`): labeled events advance it like predictions and
outcomes, and it carries over from batch to batch, so it is a function of the record order
only.  A record without a time never moves the watermark by itself (issue #31, :func:`fill_times`): an
outcome without ``ts`` is joined by id and takes its prediction's time; a prediction or labeled event
without one takes its source's current event time (the newest time that source's records carried, kept
per source in the join state and checkpointed with it), and the arrival (wall-clock) time only where
the source has carried no times at all.  A labeled event older than
``allowed_lateness`` behind the watermark *at its own record* is dropped and counted
(``calmon_events_late_total``): "late" means the same at any batch size.  Joined events are
placed at their prediction's time.

Into the rings
--------------
Every event reaches its model's rings one way, :func:`calmon.state.buckets.fold`, called a few times a
batch whatever the number of models (issue #15): the events of the batch's models are concatenated
once per payload (:class:`Columns`: binary scores, or the probabilities of K classes), lateness is
tested and counted over the whole batch, and each ring gets its predictions (with estimation
enabled), then its labeled events, then its joined pairs.  The labeled pairs (on-time labeled events
and joined predictions) of every model then reach the change detectors in one call
(:meth:`~calmon.state.monitors.ChangeMonitor.feed`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from calmon.events.decoder import KINDS, LABELED, OUTCOME, PREDICTION, DecodedBatch, ModelBatch
from calmon.formats.collection import collection_paused
from calmon.formats.records import Batch, DeadLetterSink
from calmon.state.agentstate import AgentState
from calmon.state.buckets import fold
from calmon.state.counters import Counters
from calmon.state.join import event_watermarks
from calmon.state.monitors import calibration_pairs

log = logging.getLogger("calmon.agent")

__all__ = ["Ingestor", "fill_times"]


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
        with collection_paused():
            decoded = st.decoder_for(batch.source).decode(batch.records, batch.origins, batch.meta)
        if decoded.rejected and self.dead_letter is not None:
            self.dead_letter.write([batch.records[r.index] for r in decoded.rejected],
                                   [r.reason for r in decoded.rejected], batch.source,
                                   [r.origin or "" for r in decoded.rejected] if batch.origins else None,
                                   [batch.meta[r.index] for r in decoded.rejected] if batch.meta else None)
        with st.lock:
            self._apply(decoded, batch.source, now)
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
            st.advise_join(now)

    def _fill_time(self, decoded: DecodedBatch, source: str, now: float) -> dict[str, np.ndarray]:
        """Give predictions and labeled events without a time their source's event time; return the watermark
        at each event (record order).  See :func:`fill_times`."""
        joiner = self.state.joiner
        times = [mb.ts for mb in decoded.models.values() if mb.ts.size]
        if times:
            every = np.concatenate(times)
            if np.isnan(every).any():  # rare: look model by model only then
                fill_times(decoded.models, joiner.source_times.get(source, -np.inf), now)
            if not np.isnan(every).all():  # only the times records carried move the source's event time
                newest = float(np.nanmax(every))
                if newest > joiner.source_times.get(source, -np.inf):
                    joiner.source_times[source] = newest
        return event_watermarks(decoded.models, joiner.watermark)

    def _apply(self, decoded: DecodedBatch, source: str, now: float) -> None:
        st = self.state
        wms = self._fill_time(decoded, source, now)
        if not wms:
            return
        joined = st.joiner.process(decoded.models, wms, now)  # advances the watermark in record order
        watermark = st.joiner.watermark
        count_events(st.counters, decoded.models)
        events = Columns.decoded({name: mb for name, mb in decoded.models.items() if name and name in wms}, wms)
        kept = [self._on_time(cols) for cols in events]  # late labeled events counted
        for cols, (prows, lrows) in zip(events, kept):
            n = len(cols.names)
            busy = np.bincount(cols.part[prows], minlength=n) + np.bincount(cols.part[lrows], minlength=n)
            for i in np.flatnonzero(busy).tolist():  # rings created in model order
                st.windows_of(cols.names[i], cols.classes)
        for name, jb in joined.items():
            st.windows_of(name, jb.classes)
        pairs = Columns.of(joined)
        # each ring: its predictions first, then its labeled events, then its joined pairs
        for cols, (prows, _) in zip(events, kept):
            self._fold(cols, prows, watermark, labeled=False)
        for cols, (_, lrows) in zip(events, kept):
            self._fold(cols, lrows, watermark, labeled=True, predictions=st.cfg.estimation.enabled)
        for cols in pairs:
            self._fold(cols, None, watermark, labeled=True)
        completed: list[tuple[Columns, np.ndarray | None]] = [(c, lrows) for c, (_, lrows) in zip(events, kept)]
        self._changes(completed + [(cols, None) for cols in pairs])

    def _on_time(self, cols: Columns) -> tuple[np.ndarray, np.ndarray]:
        """Count the late labeled events of ``cols``; return the rows of its on-time predictions (none
        without estimation) and labeled events."""
        st = self.state
        assert cols.kind is not None and cols.wm is not None  # decoded events
        on_time = cols.ts >= cols.wm - st.cfg.windows.allowed_lateness
        lab = cols.kind == LABELED
        late = np.bincount(cols.part[lab & ~on_time], minlength=len(cols.names))
        for i in np.flatnonzero(late).tolist():
            st.counters.add_late(cols.names[i], int(late[i]))
        estimation = st.cfg.estimation.enabled
        prows = np.flatnonzero(on_time & (cols.kind == PREDICTION)) if estimation else _NONE
        return prows, np.flatnonzero(lab & on_time)

    def _fold(self, cols: Columns, rows: np.ndarray | None, watermark: float, labeled: bool,
              predictions: bool = False) -> None:
        """:func:`~calmon.state.buckets.fold` of the events ``rows`` of ``cols`` (``None``: all) into their
        models' rings (``labeled=False``: as predictions)."""
        if rows is not None and not rows.size:
            return
        rows = _every(rows, cols)
        part = _pick(cols.part, rows)
        heads = np.flatnonzero(np.concatenate([[True], part[1:] != part[:-1]]))
        ends = [*heads[1:].tolist(), part.size]
        parts = [(self.state.windows_of(cols.names[p], cols.classes), np.arange(a, b))
                 for p, a, b in zip(part[heads].tolist(), heads.tolist(), ends)]
        fold(parts, _pick(cols.ts, rows), _pick(cols.segment, rows), _pick(cols.label, rows) if labeled else None,
             watermark, score=None if cols.score is None else _pick(cols.score, rows),
             probs=None if cols.probs is None else _pick(cols.probs, rows), predictions=predictions)

    def _changes(self, labeled: Sequence[tuple[Columns, np.ndarray | None]]) -> None:
        """The labeled pairs ``labeled`` (rows of columns, ``None``: all) to the change detectors, in one
        :meth:`~calmon.state.monitors.ChangeMonitor.feed`."""
        mon = self.state.changes
        if not mon.cfg.enabled:
            return
        names: list[str] = []
        parts: list[tuple[np.ndarray, ...]] = []
        for cols, rows in labeled:
            if rows is not None and not rows.size:
                continue
            sel = _every(rows, cols)
            p, y = calibration_pairs(None if cols.score is None else _pick(cols.score, sel),
                                     None if cols.probs is None else _pick(cols.probs, sel), _pick(cols.label, sel))
            parts.append((_pick(cols.part, sel) + len(names), _pick(cols.index, sel), _pick(cols.ts, sel), p, y))
            names.extend(cols.names)
        if parts:
            part, index, ts, p, y = (np.concatenate(c) for c in zip(*parts))
            mon.feed(names, part, index, ts, p, y)


_NONE = np.zeros(0, dtype=np.int64)


def _every(rows: np.ndarray | None, cols: Columns) -> np.ndarray | None:
    """``rows`` of ``cols`` (increasing), ``None`` for every row (the columns themselves, not gathers)."""
    return None if rows is None or rows.size == cols.part.size else rows


def _pick(a: np.ndarray, rows: np.ndarray | None) -> np.ndarray:
    return a if rows is None else a[rows]


class _Events(Protocol):
    """What :class:`Columns` reads of a :class:`~calmon.events.rows.ModelBatch` or a
    :class:`~calmon.state.join.JoinedBatch`."""

    @property
    def classes(self) -> int: ...
    @property
    def ts(self) -> np.ndarray: ...
    @property
    def segment(self) -> np.ndarray: ...
    @property
    def label(self) -> np.ndarray: ...
    @property
    def score(self) -> np.ndarray | None: ...
    @property
    def probs(self) -> np.ndarray | None: ...
    @property
    def index(self) -> np.ndarray | None: ...


@dataclass
class Columns:
    """The events of several models with one payload (binary scores, or the probabilities of ``classes``
    classes), concatenated model after model (each model's events in record order)."""

    names: list[str]
    classes: int
    part: np.ndarray  #: the model (position in ``names``) of each event
    ts: np.ndarray
    segment: np.ndarray
    label: np.ndarray
    index: np.ndarray  #: record index in the batch (of a joined pair: of its completing event)
    score: np.ndarray | None
    probs: np.ndarray | None
    kind: np.ndarray | None = None  #: decoded events only
    wm: np.ndarray | None = None  #: the watermark at each event (:func:`calmon.state.join.event_watermarks`)

    @classmethod
    def of(cls, batches: Mapping[str, _Events]) -> list[Columns]:
        """The events of ``batches`` (model -> its events) by payload: binary models first, then multiclass
        models by number of classes in order of first appearance."""
        by_classes: dict[int, list[str]] = {}
        for name, b in batches.items():
            by_classes.setdefault(b.classes, []).append(name)
        out = []
        for classes in sorted(by_classes, key=lambda k: k != 2):  # stable: binary first
            names = by_classes[classes]
            bs = [batches[n] for n in names]
            cols = cls(names, classes, np.repeat(np.arange(len(bs)), [b.ts.size for b in bs]),
                       _cat([b.ts for b in bs]), _cat([b.segment for b in bs]), _cat([b.label for b in bs]),
                       _cat([b.index for b in bs]), _cat([b.score for b in bs]) if classes == 2 else None,
                       None if classes == 2 else _cat([b.probs for b in bs]))
            out.append(cols)
        return out

    @classmethod
    def decoded(cls, models: Mapping[str, ModelBatch], wms: Mapping[str, np.ndarray]) -> list[Columns]:
        """:meth:`of` decoded events, with their kinds and their watermarks ``wms``."""
        out = cls.of(models)
        for cols in out:
            cols.kind = _cat([models[n].kind for n in cols.names])
            cols.wm = _cat([wms[n] for n in cols.names])
        return out


def _cat(cols: Sequence[np.ndarray | None]) -> np.ndarray:
    """One column of several models, concatenated (the model's own array for one model: columns are only read).
    Every model has it (a joined pair's record index: the Joiner always fills it)."""
    present = [c for c in cols if c is not None]
    assert len(present) == len(cols), "a column missing for some models"
    return present[0] if len(present) == 1 else np.concatenate(present)


def fill_times(models: Mapping[str, ModelBatch], start: float, now: float) -> None:
    """Give the predictions and labeled events of one source's batch that carry no time (NaN) the source's
    event time at their record; outcomes keep NaN (the join gives a pair its prediction's time).

    The source's event time at a record is the newest time its records carried before it (``start``: the
    newest of earlier batches, ``-inf`` for none).  Where the source has carried no time at all, the arrival
    time ``now``: a source that never carries times runs on the wall clock (issue #31: filling every missing
    time with ``now`` moved the watermark of a replay to the present and expired every pending prediction).

    Examples
    --------
    >>> from calmon.events.decoder import Decoder
    >>> b = Decoder().decode([b'{"id": "a", "model": "m", "score": 0.5}',
    ...                       b'{"id": "b", "model": "m", "ts": 7, "score": 0.5}',
    ...                       b'{"id": "c", "model": "m", "score": 0.5}', b'{"id": "b", "model": "m", "label": 1}'])
    >>> fill_times(b.models, -np.inf, now=1e9); b.models["m"].ts.tolist()
    [1000000000.0, 7.0, 7.0, nan]
    """
    parts = [mb for mb in models.values() if mb.ts.size]
    ts = np.concatenate([mb.ts for mb in parts])
    idx = np.concatenate([mb.index for mb in parts])
    order = np.argsort(idx, kind="stable")
    # the newest carried time strictly before each record, in record order (NaN does not move np.fmax)
    before = np.fmax.accumulate(np.concatenate([[start], ts[order]]))[:-1]
    current = np.empty_like(before)
    current[order] = before
    fill = np.where(current > -np.inf, current, now)
    pos = 0
    for mb in parts:
        n = mb.ts.size
        missing = np.isnan(mb.ts) & (mb.kind != OUTCOME)
        if missing.any():
            mb.ts = np.where(missing, fill[pos:pos + n], mb.ts)
        pos += n


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
