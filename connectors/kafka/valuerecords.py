"""kafka-python's fetched record batches read as ``(offset, value)`` pairs, without a record object per record.

kafka-python turns every record of a fetch response into a ``DefaultRecord`` (seven calls of its pure-Python
varint decoder) and then a thirteen-field ``ConsumerRecord``; a profile of ``KafkaConsumer.poll`` on small JSON
records spends most of its time there, not on the network.  The source only needs each record's value and
offset.  :func:`install` swaps the fetcher's ``PartitionRecords`` class for :class:`ValueRecords` on one consumer:
batch-level work (CRC-32C of the batch, decompression, control batches, aborted transactions under
``read_committed``) stays kafka-python's own, and only the loop over a batch's records is replaced by
:func:`batch_values`, which walks the records with the varints decoded inline and cuts each value as one slice
of the batch.  ``poll`` then returns ``(offset, value)`` tuples instead of ``ConsumerRecord`` s (made in C by
``zip``).

Used only without record metadata (``metadata: true`` needs each record's key, timestamp and headers: kafka-python's
own path) and only on kafka-python 3 (the fetcher internals it relies on; others keep the ordinary path).

Offsets: a v2 batch whose ``lastOffsetDelta`` is its record count - 1 holds consecutive offsets (they strictly
increase), so no record's offset delta is decoded; a batch with gaps (compaction) is read record by record by
kafka-python's own iterator.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Iterator
from typing import Any

log = logging.getLogger(__name__)

#: Offset of the first record in a v2 batch (the size of its header, ``DefaultRecordBatch.HEADER_STRUCT``).
HEADER_SIZE = 61


def _varint(buf: bytes, pos: int) -> tuple[int, int]:
    """A zigzag varint at ``buf[pos]`` (the multi-byte case of :func:`batch_values`): ``(value, next position)``."""
    result = buf[pos] & 0x7F
    shift = 7
    pos += 1
    while True:
        b = buf[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if not b & 0x80:
            return (result >> 1) ^ -(result & 1), pos
        shift += 7
        if shift >= 64:
            raise ValueError("varint out of int64 range")


def batch_values(buf: bytes, pos: int, count: int) -> list[bytes | None]:
    """The values of the ``count`` records of an (uncompressed) v2 batch body starting at ``buf[pos]``.

    Each record is ``Length Attributes TimestampDelta OffsetDelta KeyLength Key ValueLength Value Headers``
    (varints zigzag-encoded); ``Length`` gives the next record's start, so headers are skipped without being
    read.  Raises ``ValueError`` (or ``IndexError``) on a malformed batch: a value overrunning its record, a
    record overrunning the batch, bytes left after the last record.

    Examples
    --------
    >>> from kafka.record.default_records import DefaultRecordBatchBuilder
    >>> b = DefaultRecordBatchBuilder(magic=2, compression_type=0, is_transactional=False, producer_id=-1,
    ...                               producer_epoch=-1, base_sequence=-1, batch_size=1 << 20)
    >>> for i, v in enumerate([b"a", None, b"x" * 200]):
    ...     _ = b.append(i, timestamp=None, key=b"k" if i else None, value=v, headers=[("h", b"v")])
    >>> vs = batch_values(bytes(b.build()), HEADER_SIZE, 3)
    >>> vs[0], vs[1], len(vs[2])
    (b'a', None, 200)
    """
    out: list[bytes | None] = []
    append = out.append
    end_all = len(buf)
    for _ in range(count):
        # Length: a record of 32..8191 bytes has a two-byte varint; one- and two-byte cases inline (zigzag)
        b = buf[pos]
        if b < 0x80:
            length, pos = (b >> 1) ^ -(b & 1), pos + 1
        elif buf[pos + 1] < 0x80:
            z = (b & 0x7F) | (buf[pos + 1] << 7)
            length, pos = (z >> 1) ^ -(z & 1), pos + 2
        else:
            length, pos = _varint(buf, pos)
        end = pos + length
        if length < 0 or end > end_all:
            raise ValueError(f"record length {length} overruns the batch at byte {pos}")
        p = pos + 1  # Attributes: one byte (int8, unused)
        while buf[p] > 0x7F:  # TimestampDelta: skipped
            p += 1
        p += 2
        while buf[p - 1] > 0x7F:  # OffsetDelta: implied by the batch (see the module docstring)
            p += 1
        b = buf[p]  # KeyLength, then the key: skipped
        if b < 0x80:
            p += 1 if b & 1 else 1 + (b >> 1)
        else:
            klen, p = _varint(buf, p)
            if klen > 0:
                p += klen
        b = buf[p]  # ValueLength, then the value
        if b < 0x80:
            vlen, p = (b >> 1) ^ -(b & 1), p + 1
        elif buf[p + 1] < 0x80:
            z = (b & 0x7F) | (buf[p + 1] << 7)
            vlen, p = (z >> 1) ^ -(z & 1), p + 2
        else:
            vlen, p = _varint(buf, p)
        if vlen >= 0:
            if p + vlen > end:
                raise ValueError(f"record value overruns its record at byte {p}")
            append(buf[p:p + vlen])
        else:
            append(None)
        pos = end
    if pos != end_all:
        raise ValueError(f"{end_all - pos} unconsumed bytes after all records consumed")
    return out


def _base() -> Any:
    from kafka.consumer.fetcher import Fetcher

    return Fetcher.PartitionRecords


@functools.cache
def value_records_class() -> Any:
    """``ValueRecords``, defined once on first use (it subclasses a kafka-python class: no import before)."""
    return _define(_base())


def supported() -> bool:
    """True when the installed kafka-python has the fetcher internals :class:`ValueRecords` relies on."""
    try:
        import kafka
        from kafka.record.default_records import DefaultRecordBatch

        major = int(str(kafka.__version__).split(".")[0])
        base = _base()
    except (ImportError, ValueError, AttributeError):
        return False
    return major >= 3 and all(hasattr(base, a) for a in ("_unpack_records", "take", "_maybe_skip_record",
                                                           "_consume_aborted_transactions_up_to")) and all(
        a in DefaultRecordBatch.__slots__ for a in ("_buffer", "_pos", "_num_records"))


def install(consumer: Any) -> bool:
    """Make ``consumer`` (a fresh ``kafka.KafkaConsumer``) return ``(offset, value)`` tuples from ``poll``.

    Returns False (and changes nothing) when the kafka-python version is not supported.
    """
    fetcher = getattr(consumer, "_fetcher", None)
    if fetcher is None or not supported():
        return False
    fetcher.PartitionRecords = value_records_class()  # the instance attribute wins over Fetcher's class
    return True


def _define(base: Any) -> Any:
    from kafka import errors
    from kafka.consumer.fetcher import IsolationLevel

    class ValueRecords(base):
        """``Fetcher.PartitionRecords`` yielding ``(offset, value)`` tuples (see the module docstring)."""

        next_fetch_offset: int  # set by kafka-python's __init__

        def _maybe_skip_record(self, record: tuple[int, bytes | None]) -> bool:
            # records of a batch before the fetch offset (a fetch from the middle of a compressed batch)
            return record[0] < self.fetch_offset

        def take(self, n: int | None = None) -> list[tuple[int, bytes | None]]:
            records: list[tuple[int, bytes | None]] = super().take(n)
            if records:  # kafka-python moves it per record inside its loop; here it moves per take
                self.next_fetch_offset = max(self.next_fetch_offset, records[-1][0] + 1)
            return records

        def _unpack_records(self, tp: Any, records: Any, key_deserializer: Any,
                            value_deserializer: Any) -> Iterator[tuple[int, bytes | None]]:
            # kafka-python's own loop over batches (Fetcher.PartitionRecords._unpack_records, 3.0), with the loop
            # over a batch's records replaced and no deserializers (calmon sets none)
            try:
                batch = records.next_batch()
                last_batch = None
                while batch is not None:
                    last_batch = batch
                    if self.check_crcs and not batch.validate_crc():
                        raise errors.CorruptRecordError(
                            f"Record batch for partition {self.topic_partition} at offset {batch.base_offset} "
                            "failed crc check")
                    if batch.magic == 2:
                        self.leader_epoch = batch.leader_epoch
                        if self.isolation_level == IsolationLevel.READ_COMMITTED and batch.has_producer_id():
                            self._consume_aborted_transactions_up_to(batch.last_offset)
                            producer_id = batch.producer_id
                            if self._contains_abort_marker(batch):
                                self.aborted_producer_ids.discard(producer_id)
                            elif self._is_batch_aborted(batch):
                                self.next_fetch_offset = batch.next_offset
                                batch = records.next_batch()
                                continue
                        if batch.is_control_batch:
                            self.next_fetch_offset = batch.next_offset
                            batch = records.next_batch()
                            continue
                        yield from self._batch(batch)
                    else:
                        yield from self._legacy(batch)
                    batch = records.next_batch()
                if last_batch is not None and last_batch.magic == 2:
                    self.next_fetch_offset = last_batch.next_offset
                self.drain()
            except StopIteration:
                log.exception("StopIteration raised unpacking messageset")
                raise RuntimeError("StopIteration raised unpacking messageset") from None

        def _batch(self, batch: Any) -> Iterator[tuple[int, bytes | None]]:
            count = batch.records_count
            base_offset = batch.base_offset
            if count and batch.last_offset_delta == count - 1:
                iter(batch)  # decompresses the body (kafka-python's codecs) into batch._buffer
                try:
                    values = batch_values(bytes(batch._buffer), batch._pos, count)
                except (ValueError, IndexError) as exc:
                    raise errors.CorruptRecordError(
                        f"Found invalid record structure in partition {self.topic_partition} "
                        f"at offset {base_offset}: {exc!r}") from exc
                self.records_read += count
                self.bytes_read += batch.size_in_bytes
                yield from zip(range(base_offset, base_offset + count), values)
            else:  # offsets with gaps (a compacted batch): kafka-python's record iterator
                for r in batch:
                    self.records_read += 1
                    self.bytes_read += r.size_in_bytes
                    yield (r.offset, r.value)

        def _legacy(self, batch: Any) -> Iterator[tuple[int, bytes | None]]:
            for r in batch:  # message format v0/v1 (brokers before 0.11): rare, kafka-python's path
                if self.check_crcs and not r.validate_crc():
                    raise errors.CorruptRecordError(
                        f"Record for partition {self.topic_partition} at offset {r.offset} failed crc check")
                self.records_read += 1
                self.bytes_read += r.size_in_bytes
                yield (r.offset, r.value)

    return ValueRecords


__all__ = ["HEADER_SIZE", "batch_values", "install", "supported", "value_records_class"]
