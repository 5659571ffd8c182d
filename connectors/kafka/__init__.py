"""Kafka connectors: an event source, a dead-letter sink and a calibrator publisher.

Modules
-------
- :mod:`~connectors.kafka.positions`: ``"topic/partition"`` keys and checkpointed position dicts;
- :mod:`~connectors.kafka.settings`: splitting and validating source, sink and client options;
- :mod:`~connectors.kafka.clients`: the consumer-client contract (a poll is a ``Fetched``: values and runs)
  and calmon's Kafka exceptions;
- :mod:`~connectors.kafka.origins`: runs of records of one partition and a batch's origins kept per run;
- :mod:`~connectors.kafka.kafkapython`, :mod:`~connectors.kafka.confluent`: one adapter per library;
- :mod:`~connectors.kafka.reader`: the confluent-kafka adapter in a reader process, one batch ahead (``reader``),
  and :mod:`~connectors.kafka.wire`, its frames;
- :mod:`~connectors.kafka.source`: :class:`KafkaSource` (and :class:`ConfluentKafkaSource`);
- :mod:`~connectors.kafka.backoff`: the reconnect backoff;
- :mod:`~connectors.kafka.deadletter`: :class:`KafkaDeadLetterSink`;
- :mod:`~connectors.kafka.publisher`: :class:`KafkaCalibratorPublisher`;
- :mod:`~connectors.kafka.admin`: topic creation and reading a topic to its end.

Exactly-once scheme
-------------------
The source's position is a dict ``"topic/partition" -> next offset`` covering every record that
:meth:`KafkaSource.read` has returned.  The agent stores it in its checkpoint atomically with the
statistics, then calls :meth:`KafkaSource.commit` so the consumer group's committed offsets (and
hence the lag seen by Kafka tooling) follow the checkpoints.  On start, and whenever partitions are
(re)assigned by the group, the source pauses the new partitions, looks up their committed offsets
and seeks each one to ``max(checkpointed offset, committed offset)`` before fetching (policy
``"max"``; ``"checkpoint"`` uses the checkpoint alone).  Because an offset is only committed after
a checkpoint that contains it, the checkpointed offset is never behind the committed one for a
single agent, so a restart replays exactly the records after the checkpoint: nothing is lost or
counted twice.  With several agents in one group the committed offset of a partition that moved
from another agent wins, so the partition's records are counted by one agent each, except the span
the previous owner consumed but had not yet checkpointed (at-least-once for that span, as in any
Kafka consumer group without transactions).

Faults
------
The consumer is created lazily; while the broker is unreachable at start or mid-stream,
:meth:`KafkaSource.read` returns ``None`` after at most ``timeout`` seconds and retries with a bounded
exponential backoff (never raising for connectivity errors); :attr:`KafkaSource.connected` and
:meth:`KafkaSource.health` report the state for readiness probes and metrics.  An offset that goes
backwards (the broker lost data and the consumer was reset) is counted in ``offset_resets``; an
offset that jumps forward (retention deleted records not yet read) in ``skipped_offsets``.

Record metadata
---------------
With ``metadata=True`` (source option ``metadata: true``) each batch carries every record's
timestamp (create or log-append time; ``None`` when the broker gives none), key and headers as
:attr:`connectors.base.Batch.meta`, which schema mappings read as ``$timestamp``, ``$key`` and
``$headers.NAME``; :class:`KafkaDeadLetterSink` keeps a rejected record's key and headers when
given them.  Off by default: one object per record costs 30-65 % of the consume rate.

References
----------
Apache Kafka documentation, "Consumer position", "Offset management" and "Log compaction"
(design sections 4.6 and 4.8), https://kafka.apache.org/documentation/#design .
"""

from __future__ import annotations

from connectors.kafka.clients import KafkaClientError, KafkaConfigError
from connectors.kafka.deadletter import ORIGIN_HEADER, REASON_HEADER, SOURCE_HEADER, KafkaDeadLetterSink
from connectors.kafka.positions import position_key, split_position_key
from connectors.kafka.publisher import KafkaCalibratorPublisher
from connectors.kafka.source import ConfluentKafkaSource, KafkaSource

__all__ = [
    "ORIGIN_HEADER",
    "REASON_HEADER",
    "SOURCE_HEADER",
    "ConfluentKafkaSource",
    "KafkaCalibratorPublisher",
    "KafkaClientError",
    "KafkaConfigError",
    "KafkaDeadLetterSink",
    "KafkaSource",
    "position_key",
    "split_position_key",
]
