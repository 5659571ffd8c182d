"""The seams of :class:`~calmon.agent.runtime.Agent`: what it ingests and what it adds to ``/metrics``.

An agent is built with one :class:`Input` and any number of :class:`MetricsCollector` objects:

* the input reads and ingests, one :meth:`Input.poll` at a time on the ingestion thread.  The
  default, :class:`SourcesInput`, polls the configured sources and decodes, joins and bins their
  events (:class:`~calmon.state.ingest.Ingestor`); the cluster evaluator's
  (:class:`calmon.cluster.evaluate.DeltasInput`) merges pre-binned deltas from a consumer group;
* a collector's :meth:`MetricsCollector.render` (Prometheus text) is appended to the agent's own
  ``/metrics`` at every scrape, on an HTTP thread.

The agent keeps the lifecycle of the input's :attr:`Input.sources`: it checkpoints and restores
their positions, commits offsets after a checkpoint, reports them connected on ``/readyz``, stops
when every one is exhausted (``exit_when_done``) and closes them.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection, Sequence
from typing import Protocol, runtime_checkable

from calmon.agent.build import build_source
from calmon.config import Config
from calmon.formats.records import DeadLetterSink
from calmon.state.agentstate import AgentState
from calmon.state.ingest import Ingestor
from connectors.base import Batch, ByteLagReporting, LagReporting, Source

log = logging.getLogger("calmon.agent")

__all__ = ["BacklogReporting", "Host", "Input", "MetricsCollector", "SourcesInput"]


class Host(Protocol):
    """What an input reads of the agent it feeds (:class:`~calmon.agent.runtime.Agent` is one)."""

    cfg: Config
    state: AgentState
    dead_letter: DeadLetterSink | None
    clock: Callable[[], float]
    #: The agent has opened (its state loaded and its sources connected once).
    ready: bool

    @property
    def stopping(self) -> bool:
        """A stop was requested: what the input owns is frozen for the final checkpoint."""
        ...

    def withdraw(self, models: Collection[str]) -> None:
        """Drop ``models`` from the state and the exports (their partition moved to another worker)."""


class Input(Protocol):
    """What an agent ingests.

    The agent calls :meth:`attach` once, in its constructor (its configuration, state and clock
    exist from then on); :meth:`open` first thing in :meth:`Agent.open
    <calmon.agent.runtime.Agent.open>`; :meth:`poll` from its ingestion loop; :meth:`ready` for
    ``/readyz``; :meth:`close` first thing in :meth:`Agent.close <calmon.agent.runtime.Agent.close>`,
    while the state, the exporter and the sources are still there (the agent closes the sources).
    """

    #: The connectors read (filled by :meth:`open`); the agent owns their lifecycle from then on.
    sources: list[Source]

    def attach(self, agent: Host) -> None:
        """Bind to the agent whose state this input feeds."""

    def open(self) -> None:
        """Build the sources (before the agent loads its checkpoint and seeks them)."""

    def poll(self) -> bool:
        """Read and ingest what is available; True if anything was read."""
        ...

    def ingest(self, batch: Batch, src: Source | None = None) -> None:
        """Ingest one batch read from ``src`` into the agent's state."""

    def ready(self) -> bool:
        """What ``/readyz`` needs besides a loaded state and connected sources."""
        ...

    def close(self) -> None:
        """The agent is closing: last work on a whole state (nothing by default)."""


@runtime_checkable
class BacklogReporting(Protocol):
    """An input that tells whether it has read its backlog (the first round waits for it, see
    :mod:`calmon.agent.scheduler`); an input without it is taken as caught up at its first empty poll."""

    def caught_up(self) -> bool:
        """The last poll read less than a full batch from every source: what was waiting has been read."""
        ...


class MetricsCollector(Protocol):
    """Families an agent appends to its ``/metrics`` (called at each scrape, on an HTTP thread)."""

    def render(self) -> bytes:
        """Prometheus text exposition lines, each ending with a newline."""
        ...


class SourcesInput:
    """The agent's default input: its sources polled in turn, their events decoded, joined and binned.

    Parameters
    ----------
    sources
        Connectors to use instead of building them from ``cfg.sources`` (tests, the demo); ``None``
        or empty: build them on :meth:`open`.
    """

    def __init__(self, sources: Sequence[Source] | None = None) -> None:
        self._given = list(sources) if sources is not None else None
        self.sources: list[Source] = []
        self.ingestor: Ingestor | None = None
        self._agent: Host | None = None
        self._full = True  # the last poll read a full batch from some source (none yet: not caught up)

    @property
    def agent(self) -> Host:
        if self._agent is None:
            raise RuntimeError("SourcesInput is not attached to an agent")
        return self._agent

    def attach(self, agent: Host) -> None:
        if self._agent is not None and self._agent is not agent:
            raise ValueError("an input feeds one agent")
        self._agent = agent

    def open(self) -> None:
        cfg = self.agent.cfg
        limit = cfg.limits.max_record_bytes
        self.sources = self._given or [build_source(s, i, limit) for i, s in enumerate(cfg.sources)]
        self.ingestor = None  # built at the first batch, with the dead-letter sink the agent opens next

    def poll(self) -> bool:
        """Read and ingest at most one batch per source; True if anything was read."""
        ing = self.agent.cfg.ingest
        got = full = False
        timeout = ing.poll_timeout / max(1, len(self.sources))
        for src in self.sources:
            if src.exhausted:
                continue
            batch = src.read(ing.batch_size, timeout)
            if batch is not None and batch.records:
                self.ingest(batch, src)
                got = True
                full |= len(batch.records) >= ing.batch_size
        self._full = full
        return got

    def caught_up(self) -> bool:
        """No source gave a full batch at the last poll (:class:`BacklogReporting`)."""
        return not self._full

    def ingest(self, batch: Batch, src: Source | None = None) -> None:
        """Decode, join and bin one batch (see :class:`~calmon.state.ingest.Ingestor`)."""
        if self.ingestor is None:
            agent = self.agent
            self.ingestor = Ingestor(agent.state, agent.dead_letter, agent.clock)
        self.ingestor.ingest(batch, _lag_records(src), src.lag_bytes() if isinstance(src, ByteLagReporting) else None)

    def ready(self) -> bool:
        return True

    def close(self) -> None:
        pass


def _lag_records(src: Source | None) -> int | None:
    """Consumer lag of a source that reports one (best effort: a broker may be unreachable)."""
    if not isinstance(src, LagReporting):
        return None
    try:
        return int(sum(src.lag().values()))
    except (OSError, RuntimeError, ValueError) as exc:
        log.debug("lag of %s unavailable: %s", getattr(src, "name", "?"), exc)
        return None
