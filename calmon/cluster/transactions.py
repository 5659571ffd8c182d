"""One Kafka transaction per range: the transactional producer of one input partition of the ingest stage.

Each input partition has its own transactional id, ``<cluster.ingest_group>.<topic>.<partition>``.  The worker
that gets the partition opens a :class:`PartitionProducer` under that id *before* it reads the partition's
state: ``init_transactions`` bumps the id's producer epoch, which aborts whatever transaction the previous
owner left open and fences that owner -- a zombie (a worker that was paused, lost the partition and resumed)
fails at its next send or commit with ``ProducerFencedError`` and writes nothing more.

A range ``[c, e)`` is then one transaction (:meth:`PartitionProducer.commit_range`): its deltas, the
partition's state at ``e`` and the consumed offset ``e`` of the input partition
(``send_offsets_to_transaction`` to ``cluster.ingest_group``), committed together.  ``read_committed``
readers (the evaluators, the state restore) see all of it or none of it.

Why one id per input partition and not KIP-447 (one producer per worker, fenced through the consumer group's
generation): measured on the test broker (Tansu 0.6, kafka-python 3.0.12), a ``send_offsets_to_transaction``
with the group metadata of a generation the group had left *committed* -- the broker does not fence by
generation -- while a second ``init_transactions`` with the same id fenced the first producer at once.  The
per-partition id also works with either consumer client (the group metadata of KIP-447 must come from a
consumer of the same library as the producer).  The cost is one producer (one connection) per owned
partition.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any, NamedTuple

from calmon.cluster.topics import ClusterError
from connectors.kafka.settings import common_options

log = logging.getLogger("calmon.cluster")

__all__ = ["PartitionProducer", "Fenced", "Item", "transactional_id", "TRANSACTION_TIMEOUT_MS"]

#: The broker aborts a transaction left open longer than this (a worker SIGKILLed mid-range whose partition
#: nobody took over yet); a range's transaction lasts well under a second.
TRANSACTION_TIMEOUT_MS = 60_000


class Fenced(ClusterError):
    """Another worker opened this input partition's transactional id: this worker no longer owns it."""


class Item(NamedTuple):
    """One record of a transaction: key, value and (dead letters) headers."""

    key: bytes | None
    value: bytes
    headers: list[tuple[str, bytes]] | None = None


Items = Mapping[str, Sequence[tuple[bytes, bytes] | Item]]


def transactional_id(group: str, key: str) -> str:
    """The transactional id of input partition ``key`` (``"topic/partition"``) in ingest group ``group``.

    Examples
    --------
    >>> transactional_id("calmon-ingest", "events/3")
    'calmon-ingest.events.3'
    """
    topic, _, part = key.rpartition("/")
    return f"{group}.{topic}.{part}"


@contextmanager
def _errors(op: str) -> Iterator[None]:
    """Kafka client errors as :class:`ClusterError` (:class:`Fenced` for a fenced producer)."""
    from kafka.errors import KafkaError, ProducerFencedError

    try:
        yield
    except ProducerFencedError as exc:
        raise Fenced(f"{op}: fenced by a newer owner ({exc})") from None
    except (KafkaError, OSError, ValueError) as exc:
        if "Fenced" in type(exc).__name__ or "fenced" in str(exc).lower():
            raise Fenced(f"{op}: fenced by a newer owner ({exc})") from None
        raise ClusterError(f"{op}: {type(exc).__name__}: {exc}") from None


def _send(kp: Any, topic: str, item: tuple[bytes, bytes] | Item) -> Any:
    headers = item.headers if isinstance(item, Item) else None
    return kp.send(topic, key=item[0], value=item[1], headers=headers)


class PartitionProducer:
    """The transactional producer of one input partition (see the module docstring).

    Parameters
    ----------
    bootstrap, client
        The cluster's bootstrap servers and kafka-python client options.
    group
        ``cluster.ingest_group``: the consumer group the offsets are committed to, and the id's prefix.
    key
        The input partition, ``"topic/partition"``.

    Raises
    ------
    ClusterError
        The producer could not be created or its transactions initialised.
    """

    def __init__(self, bootstrap: str, client: Mapping[str, Any], group: str, key: str) -> None:
        from kafka import KafkaProducer

        self.key, self.group = key, group
        self.id = transactional_id(group, key)
        cfg = {"acks": "all", "linger_ms": 5, "retries": 5, "max_request_size": 16 << 20,
               "bootstrap_timeout_ms": 5000, "max_block_ms": 10000,
               "transaction_timeout_ms": TRANSACTION_TIMEOUT_MS}
        cfg.update(common_options(client, "producer"))
        with _errors(f"open the transactional producer {self.id}"):
            self.producer = KafkaProducer(bootstrap_servers=bootstrap, transactional_id=self.id, **cfg)
        try:
            with _errors(f"init transactions of {self.id}"):
                self.producer.init_transactions()  # fences every earlier producer of this id
        except ClusterError:
            self.close()
            raise

    def commit_range(self, records: Items, offset: int, last: Items | None = None) -> None:
        """One transaction: ``records`` (topic -> ``(key, value)`` or :class:`Item`), then ``last`` once
        ``records`` are acknowledged, and the input partition's consumed offset.

        ``records`` holds the range's deltas and, when the dead-letter sink is a Kafka topic, its dead letters
        (with their headers): a fenced or failed range's letters are aborted with its deltas.

        ``last`` is the partition's state: sending it only after the deltas are acknowledged keeps the state of
        an *aborted* range from being visible without its deltas to a reader that takes aborted records for
        committed ones (on Tansu 0.6, any reader without :mod:`connectors.kafka.committed`, see
        ``docs/cluster.md``); it costs one round trip.

        Raises
        ------
        Fenced
            A newer owner opened this partition's id: nothing of this transaction is committed.
        ClusterError
            Any other failure; the transaction is aborted (or left to the broker's timeout).
        """
        from kafka import TopicPartition
        from kafka.structs import OffsetAndMetadata

        topic, _, part = self.key.rpartition("/")
        kp = self.producer
        try:
            with _errors(f"transaction of {self.key}"):
                kp.begin_transaction()
                futures = [_send(kp, t, item) for t, items in records.items() for item in items]
                if last:
                    kp.flush()
                    for fut in futures:
                        fut.get(timeout=0)
                    futures += [_send(kp, t, item) for t, items in last.items() for item in items]
                kp.send_offsets_to_transaction({TopicPartition(topic, int(part)): OffsetAndMetadata(offset, "", -1)},
                                               self.group)
                kp.commit_transaction()
                for fut in futures:  # (all acknowledged once committed; a failed one raises here)
                    fut.get(timeout=0)
        except Fenced:
            raise
        except ClusterError:
            self._abort()
            raise

    def _abort(self) -> None:
        try:
            with _errors(f"abort the transaction of {self.key}"):
                self.producer.abort_transaction()
        except ClusterError as exc:  # fenced or broken: the broker aborts it (fencing or timeout)
            log.debug("%s", exc)

    def close(self) -> None:
        """Close the producer (an open transaction is aborted by the broker's timeout or the next owner)."""
        try:
            with _errors(f"close {self.id}"):
                self.producer.close(timeout=2)
        except ClusterError as exc:
            log.warning("%s", exc)
