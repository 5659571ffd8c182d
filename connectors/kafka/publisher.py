"""Refreshed calibrators to a compacted Kafka topic keyed by model name.

:class:`KafkaCalibratorPublisher` implements :class:`calmon.calibration.refresh.Publisher`, so the
agent can list it under ``recalibration.publish`` (``{type: kafka, options: {...}}``, see
:meth:`KafkaCalibratorPublisher.from_config`).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from typing import Any

from connectors.kafka.admin import ensure_topic, scan_topic
from connectors.kafka.clients import KafkaClientError
from connectors.kafka.kafkapython import mapped
from connectors.kafka.settings import FORCED_PRODUCER, check_client

log = logging.getLogger("connectors.kafka")

#: Options of :meth:`KafkaCalibratorPublisher.from_config` besides ``bootstrap_servers``.
PUBLISHER_KEYS = ("topic", "client", "partitions", "replication_factor", "timeout")


def _positive_int(options: Mapping[str, Any], key: str, default: int) -> int:
    value = options.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{key}: must be an integer >= 1, got {value!r}")
    return value


class KafkaCalibratorPublisher:
    """Publish refreshed calibrators to a compacted topic keyed by model name.

    The topic is created with ``cleanup.policy=compact`` if missing, so the latest calibrator of
    every model survives retention; :meth:`latest` reads the topic and returns the last value per
    key (correct whether or not the broker has compacted yet).  ``None`` publishes a tombstone.

    Parameters
    ----------
    bootstrap_servers
        ``"host:port"`` or a list.
    topic
        Compacted topic name.
    client
        kafka-python producer options passed through (security, ...).
    partitions, replication_factor
        Of the topic when it is created.
    timeout
        Seconds to wait for the broker (acknowledgement of a publish, reading the topic back).

    Examples
    --------
    >>> pub = KafkaCalibratorPublisher("127.0.0.1:9", "calibrators")
    >>> pub.encode({"method": "platt", "a": 1.0, "b": 0.0})
    b'{"a":1.0,"b":0.0,"method":"platt"}'
    """

    def __init__(
        self,
        bootstrap_servers: str | list[str],
        topic: str = "calmon-calibrators",
        *,
        client: Mapping[str, Any] | None = None,
        partitions: int = 1,
        replication_factor: int = 1,
        timeout: float = 10.0,
    ) -> None:
        if not topic:
            raise ValueError("calibrator topic must be a non-empty string")
        self.bootstrap_servers = bootstrap_servers
        self.topic = topic
        self.partitions = int(partitions)
        self.replication_factor = int(replication_factor)
        self.timeout = float(timeout)
        self.client = check_client(client, "producer", FORCED_PRODUCER)
        self._producer: Any = None
        self._topic_ready = False

    @classmethod
    def from_config(cls, options: Mapping[str, Any]) -> KafkaCalibratorPublisher:
        """Build from the ``options`` of a ``{type: kafka}`` entry of ``recalibration.publish``.

        Keys: ``bootstrap_servers`` (required), ``topic``, ``client`` (kafka-python producer options),
        ``partitions``, ``replication_factor``, ``timeout``.  A bad key raises ``ValueError("<key>: why")``.

        Examples
        --------
        >>> KafkaCalibratorPublisher.from_config({"bootstrap_servers": "h:1", "topic": "cal"}).topic
        'cal'
        >>> KafkaCalibratorPublisher.from_config({"bootstrap_servers": "h:1", "partitions": 0})
        Traceback (most recent call last):
        ...
        ValueError: partitions: must be an integer >= 1, got 0
        """
        unknown = sorted(set(options) - {"bootstrap_servers", "type", *PUBLISHER_KEYS})
        if unknown:
            raise ValueError(f"{unknown[0]}: unknown option (known: bootstrap_servers, {', '.join(PUBLISHER_KEYS)})")
        servers = options.get("bootstrap_servers")
        if not servers or not isinstance(servers, (str, list)):
            raise ValueError("bootstrap_servers: required, 'host:port' or a list of them")
        topic = options.get("topic", "calmon-calibrators")
        if not isinstance(topic, str) or not topic:
            raise ValueError(f"topic: must be a non-empty string, got {topic!r}")
        client = options.get("client") or {}
        if not isinstance(client, Mapping):
            raise ValueError(f"client: must be a mapping of kafka-python producer options, got {client!r}")
        try:
            check_client(client, "producer", FORCED_PRODUCER)
        except ValueError as exc:
            raise ValueError(f"client: {exc}") from None
        timeout = options.get("timeout", 10.0)
        if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or timeout <= 0:
            raise ValueError(f"timeout: must be a number of seconds > 0, got {timeout!r}")
        return cls(servers, topic, client=client, partitions=_positive_int(options, "partitions", 1),
                   replication_factor=_positive_int(options, "replication_factor", 1), timeout=float(timeout))

    @staticmethod
    def encode(calibrator: Mapping[str, Any] | bytes | None) -> bytes | None:
        """JSON bytes of a calibrator (sorted keys, compact), bytes unchanged, None for a tombstone."""
        if calibrator is None or isinstance(calibrator, bytes):
            return calibrator
        if not isinstance(calibrator, Mapping):
            raise ValueError(f"calibrator must be a dict, bytes or None, got {type(calibrator).__name__}")
        return json.dumps(calibrator, sort_keys=True, separators=(",", ":"), allow_nan=False).encode()

    def ensure_topic(self) -> bool:
        """Create the topic with ``cleanup.policy=compact`` if it does not exist; True if created."""
        created = ensure_topic(self.bootstrap_servers, self.topic, self.partitions, {"cleanup.policy": "compact"},
                               self.client, self.replication_factor)
        self._topic_ready = True
        return created

    def publish(
        self, model: str, document: Mapping[str, Any] | bytes | None, timeout: float | None = None
    ) -> dict[str, Any]:
        """Publish (and wait for the acknowledgement of) the calibrator document of ``model``.

        Returns
        -------
        dict
            ``publisher`` (``"kafka"``), ``topic``, ``partition``, ``offset`` and ``revision`` (the
            document's, None for a tombstone or a document without one).

        Raises
        ------
        KafkaClientError
            If the broker does not acknowledge within ``timeout``; the caller retries at the next refresh.
        """
        if not isinstance(model, str) or not model:
            raise ValueError("model must be a non-empty string")
        value = self.encode(document)
        wait = self.timeout if timeout is None else float(timeout)
        if not self._topic_ready:
            self.ensure_topic()
        headers = [("content-type", b"application/json"), ("calmon-model", model.encode())]
        with mapped("publish"):
            if self._producer is None:
                from kafka import KafkaProducer

                cfg = {"acks": "all", "max_block_ms": int(wait * 1000), "bootstrap_timeout_ms": int(wait * 1000)}
                cfg.update(self.client)
                self._producer = KafkaProducer(bootstrap_servers=self.bootstrap_servers, **cfg)
            md = self._producer.send(self.topic, key=model.encode(), value=value, headers=headers).get(timeout=wait)
        revision = document.get("revision") if isinstance(document, Mapping) else None
        return {"publisher": "kafka", "topic": self.topic, "partition": int(md.partition), "offset": int(md.offset),
                "revision": revision}

    def latest(self, timeout: float | None = None) -> dict[str, dict[str, Any]]:
        """Read the topic from the beginning; the last calibrator per model (tombstones delete).

        Raises
        ------
        KafkaClientError
            The broker is unreachable.
        """
        out: dict[str, dict[str, Any]] = {}

        def visit(record: Any) -> None:
            model = record.key.decode() if record.key is not None else ""
            if record.value is None:
                out.pop(model, None)
            else:
                out[model] = json.loads(record.value)

        wait = self.timeout if timeout is None else float(timeout)
        scan_topic(self.bootstrap_servers, self.topic, self.client, visit, timeout=wait, connect_timeout=wait)
        return out

    def latest_revision(self, model: str) -> int | None:
        """Revision of the last document published for ``model``; None if none (or the broker is unreachable)."""
        try:
            doc = self.latest().get(model)
        except KafkaClientError as exc:
            log.warning("calibrator publisher %s: cannot read the topic back: %s", self.topic, exc)
            return None
        revision = doc.get("revision") if doc is not None else None
        return revision if isinstance(revision, int) and not isinstance(revision, bool) else None

    def close(self) -> None:
        """Flush and close the producer."""
        producer, self._producer = self._producer, None
        if producer is not None:
            with mapped("close"):
                try:
                    producer.flush(timeout=5)
                finally:
                    producer.close(timeout=2)
