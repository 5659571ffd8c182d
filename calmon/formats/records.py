"""The raw-record contract between sources and the decoder: what a source hands over, before any parsing.

A source yields a :class:`Batch` of raw records (one JSON document each, as bytes), with its position
after the batch and, optionally, each record's origin and transport metadata (:class:`RecordMeta`). A record
the source did not keep whole arrives as an :class:`OversizedRecord`: a bounded prefix whose ``len()`` is the
real size, so the decoder rejects it by length and the dead-letter sink keeps prefix, size and hash.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

__all__ = ["Batch", "RecordMeta", "OversizedRecord", "DeadLetterSink", "PREFIX_BYTES"]

#: Bytes of an oversized record kept for its dead letter.
PREFIX_BYTES = 4096


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


class OversizedRecord(bytes):
    """A record a source did not keep whole: the bytes are its first bytes, ``len()`` its real size.

    Parameters
    ----------
    prefix
        The first bytes of the record (at most :data:`PREFIX_BYTES` are kept).
    size
        The record's length in bytes.
    sha256
        Hex SHA-256 of the whole record.
    reason
        The reason code the decoder rejects it with: ``too_large``, or ``decompression_bomb`` for the rest of a
        compressed file the source stopped reading (its size is then the bytes decompressed until it stopped).

    Examples
    --------
    >>> r = OversizedRecord(b"x" * 10_000, 200_000_000, "ab" * 32)
    >>> len(r), len(bytes(r)), r.sha256[:4], r.reason
    (200000000, 4096, 'abab', 'too_large')
    """

    size: int
    sha256: str
    reason: str

    def __new__(cls, prefix: bytes, size: int, sha256: str, reason: str = "too_large") -> OversizedRecord:
        self = super().__new__(cls, prefix[:PREFIX_BYTES])
        self.size = int(size)
        self.sha256 = sha256
        self.reason = reason
        return self

    def __len__(self) -> int:
        return self.size


@runtime_checkable
class DeadLetterSink(Protocol):
    def write(self, records: list[bytes], reasons: list[str], source: str, origins: list[str] | None = None,
              meta: list[RecordMeta] | None = None) -> None:
        """Record rejected raw records with their reason codes (and their transport metadata, if any)."""

    def position(self) -> dict[str, Any]:
        """Position to checkpoint with the state (so a restart can drop dead letters written after it)."""

    def seek(self, position: Mapping[str, Any]) -> None: ...

    def flush(self) -> None: ...

    def unacknowledged(self) -> int:
        """Dead letters written and not yet durable in the sink (a checkpoint waits until it is 0)."""

    def close(self) -> None: ...
