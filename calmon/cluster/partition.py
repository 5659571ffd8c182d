"""One input partition in the ingest stage: its records in offset order, join and decoder state, range by range.

Applying a range is deterministic in (the partition state at its start, its records, the range's
``now``): the joiner runs on event time only (watermarks and sweeps follow record order, see
:mod:`calmon.state.join`), and events without ``ts`` take the range's ``now`` instead of the wall
clock.  A full range is cut at exactly ``ingest.batch_size`` records (:meth:`PartitionIngest.cut`), so
a new owner restored from the same state cuts the same ranges as the previous one.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from calmon.cluster.changes import PairRecorder
from calmon.cluster.deltas import Delta, extract_deltas
from calmon.cluster.topics import PartitionState, Range
from calmon.config import Config
from calmon.state.agentstate import AgentState
from calmon.state.counters import Counters
from calmon.state.ingest import Ingestor
from calmon.state.join import Joiner
from connectors.base import Batch, RecordMeta

__all__ = ["PartitionIngest", "Rejects", "Applied", "stage_config"]


def stage_config(cfg: Config) -> Config:
    """The configuration a partition's state runs with (the agent's: its change monitor is a
    :class:`~calmon.cluster.changes.PairRecorder`, whose pairs the deltas carry to the evaluators)."""
    return cfg


@dataclass
class Rejects:
    """The dead letters of one range, as :meth:`connectors.base.DeadLetterSink.write` takes them."""

    records: list[bytes] = field(default_factory=list)
    reasons: list[str] = field(default_factory=list)
    origins: list[str] = field(default_factory=list)
    meta: list[RecordMeta] = field(default_factory=list)
    source: str = ""

    def write(self, records: list[bytes], reasons: list[str], source: str, origins: list[str] | None = None,
              meta: list[RecordMeta] | None = None) -> None:
        self.records += records
        self.reasons += reasons
        self.origins += origins or [""] * len(records)
        if meta:
            self.meta += meta
        self.source = source

    def flush(self) -> None:
        """Nothing to do: the worker writes the rejects to the real sink once the range is applied."""

    def unacknowledged(self) -> int:
        """Nothing is acknowledged here: the range's rejects reach the real sink when the range completes."""
        return 0

    def position(self) -> dict[str, int]:
        return {}

    def seek(self, position: object) -> None:
        """Never sought: a collector of one range."""

    def close(self) -> None:
        """Nothing held."""


@dataclass
class Applied:
    """What one range produced: the deltas per model, the dead letters, the counters and the next state."""

    deltas: list[Delta]
    rejects: Rejects
    counters: Counters
    state: PartitionState


class PartitionIngest:
    """The ingest state of one input partition and its buffered records.

    Parameters
    ----------
    cfg
        The configuration (see :func:`stage_config`).
    key
        ``"topic/partition"``.
    source_name
        The Kafka source's name (selects a schema mapping's decoder; names dead letters).
    state
        The restored state (``None``: a partition never processed, starting at offset 0).
    """

    def __init__(self, cfg: Config, key: str, source_name: str, state: PartitionState | None) -> None:
        self.key, self.source_name = key, source_name
        self.st = AgentState(stage_config(cfg))
        self.pairs = PairRecorder(cfg.changes)
        self.st.changes = self.pairs
        if state is not None:
            joiner = Joiner.from_dict(state.join, cfg.limits.max_join_bytes)
            joiner.ttl, joiner.max_pending = cfg.join.ttl, cfg.join.max_pending
            self.st.joiner = joiner
            self.st.decoder.load_state(state.decoder)
            dec = self.st.decoder
            if len(dec.names) > max(dec.max_models, len(dec.declared)):  # the cap holds for restored names too
                raise ValueError(f"{len(dec.names)} models, over limits.max_models {dec.max_models}")
        self.next = 0 if state is None else state.offset
        self.offsets: list[int] = []
        self.records: list[bytes] = []
        self.origins: list[str] = []
        self.meta: list[RecordMeta] | None = None
        #: monotonic time the oldest buffered record arrived
        self.since: float | None = None

    # -- buffering -----------------------------------------------------------------------------
    def add(self, offsets: list[int], records: list[bytes], origins: list[str], meta: list[RecordMeta] | None,
            now: float) -> None:
        """Buffer records of this partition (those already buffered or before :attr:`next` are ignored)."""
        floor = self.offsets[-1] + 1 if self.offsets else self.next
        keep = [i for i, off in enumerate(offsets) if off >= floor]
        if not keep:
            return
        if self.since is None:
            self.since = now
        self.offsets += [offsets[i] for i in keep]
        self.records += [records[i] for i in keep]
        self.origins += [origins[i] for i in keep]
        if meta is not None:
            self.meta = (self.meta or []) + [meta[i] for i in keep]

    @property
    def buffered(self) -> int:
        return len(self.offsets)

    def cut(self, size: int) -> int:
        """The end of the next range: one past the ``size``-th buffered record, or past the last one.

        Examples
        --------
        >>> p = PartitionIngest.__new__(PartitionIngest); p.offsets = [4, 5, 7, 8]
        >>> p.cut(2), p.cut(10)
        (6, 9)
        """
        return self.offsets[min(size, len(self.offsets)) - 1] + 1

    def take(self, end: int) -> Batch:
        """The buffered records before ``end`` as one batch (the rest stays buffered)."""
        n = sum(1 for off in self.offsets if off < end)
        meta = None if self.meta is None else self.meta[:n]
        batch = Batch(self.records[:n], {self.key: end}, self.source_name, self.origins[:n], meta)
        del self.offsets[:n], self.records[:n], self.origins[:n]
        if self.meta is not None:
            del self.meta[:n]
        if not self.offsets:
            self.since = None
        return batch

    # -- applying a range ------------------------------------------------------------------------
    def apply(self, batch: Batch, rng: Range) -> Applied:
        """Decode, join and bin the range ``rng`` (``batch``: its records) into fresh rings; advance."""
        st = self.st
        st.models, st.counters = {}, Counters()
        rejects = Rejects()
        now = rng.now
        Ingestor(st, rejects, lambda: now).ingest(batch, None)
        deltas = extract_deltas(self.key, rng.start, rng.end, st.joiner.watermark, st.models, st.counters,
                                self.pairs.take())
        counters = st.counters
        st.models, st.counters = {}, Counters()
        self.next = rng.end
        state = PartitionState(self.key, rng.end, st.joiner.to_dict(), st.decoder.state(), rng.writer)
        return Applied(deltas, rejects, counters, state)
