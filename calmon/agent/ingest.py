"""Ingestion: one batch of raw records -> decoded events -> dead letters, joined events, binned statistics.

Event time
----------
The watermark is the largest event time seen, in record order.  Events without ``ts`` take
the arrival (wall-clock) time.  Labeled events older than ``watermark - allowed_lateness`` are
dropped and counted (``calmon_events_late_total``); joined events are placed at their
prediction's time.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import numpy as np

from calmon.agent.state import AgentState
from calmon.events import KINDS, LABELED, DecodedBatch
from connectors.base import Batch, ByteLagReporting, DeadLetterSink, LagReporting, Source

log = logging.getLogger("calmon.agent")

__all__ = ["Ingestor"]


class Ingestor:
    """Applies batches to an :class:`~calmon.agent.state.AgentState` (runs on the ingestion thread only).

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

    def ingest(self, batch: Batch, src: Source | None = None) -> None:
        """Decode, join and bin one batch; count it; dead-letter its rejects."""
        now = self.clock()
        st = self.state
        decoded = st.decoder.decode(batch.records, batch.origins)
        if decoded.rejected and self.dead_letter is not None:
            self.dead_letter.write([batch.records[r.index] for r in decoded.rejected],
                                   [r.reason for r in decoded.rejected], batch.source,
                                   [r.origin or "" for r in decoded.rejected] if batch.origins else None)
        lag_records = _lag_records(src)
        with st.lock:
            self._apply(decoded, now)
            c = st.counters
            c.batches += 1
            c.add_rejected(r.reason for r in decoded.rejected)
            c.add_records(batch.source, len(batch.records))
            info = st.source(batch.source)
            newest = max((float(np.nanmax(mb.ts)) for mb in decoded.models.values() if mb.ts.size), default=None)
            if newest is not None:
                info.newest_event = max(newest, info.newest_event)
            if isinstance(src, ByteLagReporting):
                info.lag_bytes = src.lag_bytes()
            if lag_records is not None:
                info.lag_records = lag_records

    def _fill_time(self, decoded: DecodedBatch, now: float) -> np.ndarray | None:
        """Fill missing event times with ``now``; return the watermark at each event (record order)."""
        mbs = list(decoded.models.values())
        if not mbs:
            return None
        for mb in mbs:
            if np.isnan(mb.ts).any():
                mb.ts = np.where(np.isnan(mb.ts), now, mb.ts)
        idx = np.concatenate([mb.index for mb in mbs])
        ts = np.concatenate([mb.ts for mb in mbs])
        order = np.argsort(idx, kind="stable")
        wm_sorted = np.maximum.accumulate(np.concatenate([[self.state.joiner.watermark], ts[order]]))[1:]
        wm = np.empty_like(wm_sorted)
        wm[order] = wm_sorted
        return wm

    def _apply(self, decoded: DecodedBatch, now: float) -> None:
        st = self.state
        wm_all = self._fill_time(decoded, now)
        if wm_all is None:
            return
        joined = st.joiner.process(decoded.models)  # advances the watermark in record order
        watermark = st.joiner.watermark
        lateness = st.cfg.windows.allowed_lateness
        offsets = np.cumsum([0] + [len(mb) for mb in decoded.models.values()])
        for (name, mb), off in zip(decoded.models.items(), offsets[:-1]):
            for k, cnt in enumerate(np.bincount(mb.kind, minlength=3).tolist()):
                if cnt:
                    st.counters.add_events(name or "", KINDS[k], cnt)
            if not name:
                continue
            lab = mb.kind == LABELED
            if not lab.any():
                continue
            late = lab & (mb.ts < wm_all[off:off + len(mb)] - lateness)
            if late.any():
                st.counters.add_late(name, int(late.sum()))
                lab &= ~late
            sel = np.flatnonzero(lab)
            if sel.size:
                st.windows_of(name, mb.classes).add(
                    mb.ts[sel], mb.segment[sel], mb.label[sel], None if mb.score is None else mb.score[sel],
                    None if mb.probs is None else mb.probs[sel], watermark)
        for name, jb in joined.items():
            st.windows_of(name, jb.classes).add(jb.ts, jb.segment, jb.label, jb.score, jb.probs, watermark)


def _lag_records(src: Source | None) -> int | None:
    """Consumer lag of a source that reports one (best effort: a broker may be unreachable)."""
    if not isinstance(src, LagReporting):
        return None
    try:
        return int(sum(src.lag().values()))
    except (OSError, RuntimeError, ValueError) as exc:
        log.debug("lag of %s unavailable: %s", getattr(src, "name", "?"), exc)
        return None
