"""The connector protocol: sources yield batches of raw records with their positions; sinks take rejects.

A position is a JSON-serialisable dict that the agent stores in its checkpoint together with
the statistics; ``seek(position)`` makes the source continue right after the last record the
checkpointed state contains, so a restart neither loses nor repeats a record.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable


@dataclass
class Batch:
    """Raw records read together.

    Attributes
    ----------
    records
        One JSON document (bytes, UTF-8) per record; CSV sources convert rows to JSON objects.
    position
        The source position just after the last record of this batch.
    source
        Name of the source (for metrics and dead letters).
    origins
        Optional per-record origin (e.g. ``"file.jsonl:17"`` or ``"topic/0@1234"``) for error messages.
    meta
        Optional per-record transport metadata (a Kafka record's timestamp, key and headers), which a
        schema mapping may read (``$timestamp``, ``$key``, ``$headers.NAME``).
    """

    records: list[bytes]
    position: dict[str, Any]
    source: str
    origins: list[str] | None = None
    meta: list[RecordMeta] | None = None


@dataclass(frozen=True)
class RecordMeta:
    """Transport metadata of one record (Kafka: ``ConsumerRecord.timestamp``, ``key``, ``headers``).

    ``timestamp_ms`` is the record's create or log-append time in epoch milliseconds (``None`` when the
    broker gives none, e.g. timestamp type -1); ``headers`` keep their order and repeats.
    """

    timestamp_ms: int | None = None
    key: bytes | None = None
    headers: tuple[tuple[str, bytes], ...] = ()


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


@runtime_checkable
class DeadLetterSink(Protocol):
    def write(self, records: list[bytes], reasons: list[str], source: str, origins: list[str] | None = None,
              meta: list[RecordMeta] | None = None) -> None:
        """Record rejected raw records with their reason codes (and their transport metadata, if any)."""

    def position(self) -> dict[str, Any]:
        """Position to checkpoint with the state (so a restart can drop dead letters written after it)."""

    def seek(self, position: Mapping[str, Any]) -> None: ...

    def flush(self) -> None: ...

    def close(self) -> None: ...
