"""The connector protocol: sources yield batches of raw records with their positions; sinks take rejects.

A position is a JSON-serialisable dict that the agent stores in its checkpoint together with
the statistics; ``seek(position)`` makes the source continue right after the last record the
checkpointed state contains, so a restart neither loses nor repeats a record.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol, runtime_checkable

from calmon.formats.records import Batch, DeadLetterSink, RecordMeta

__all__ = ["Batch", "RecordMeta", "Source", "Committable", "LagReporting", "ByteLagReporting",
           "Connectable", "HealthReporting", "DeadLetterSink"]


@runtime_checkable
class Source(Protocol):
    name: str

    def read(self, max_records: int = 65536, timeout: float = 0.5) -> Batch | None:
        """Next batch (at most ``max_records``), or ``None`` if nothing arrived within ``timeout`` seconds."""

    @property
    def exhausted(self) -> bool:
        """True when a read-once source has delivered everything (never for followed files or Kafka)."""

    def position(self) -> dict[str, Any]:
        """Position after the last record returned by ``read``."""

    def seek(self, position: Mapping[str, Any]) -> None:
        """Continue right after ``position`` (as returned by :meth:`position`)."""

    def close(self) -> None: ...


# Optional capabilities: the runtime checks them with ``isinstance`` instead of ``hasattr``.
@runtime_checkable
class Committable(Protocol):
    """A source that can tell its upstream (e.g. a Kafka consumer group) what has been checkpointed."""

    def commit(self, position: Mapping[str, Any] | None = None, timeout: float = 5.0) -> bool: ...


@runtime_checkable
class LagReporting(Protocol):
    """A source that knows how many records are still to read, per partition (``{key: records}``)."""

    def lag(self) -> dict[str, int]: ...


@runtime_checkable
class ByteLagReporting(Protocol):
    """A source that knows how many bytes are still to read (files)."""

    def lag_bytes(self) -> int: ...


@runtime_checkable
class Connectable(Protocol):
    """A source with a connection that can be down (``/readyz`` is false while it is)."""

    @property
    def connected(self) -> bool: ...


@runtime_checkable
class HealthReporting(Protocol):
    """A source that describes its connection for the status page."""

    def health(self) -> dict[str, Any]: ...
