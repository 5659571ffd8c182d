"""Dead letters to a Kafka topic, exactly once across restarts that replay source records."""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, NamedTuple

from connectors.base import RecordMeta
from connectors.kafka.admin import ensure_topic, scan_topic
from connectors.kafka.clients import KafkaClientError
from connectors.kafka.kafkapython import mapped
from connectors.kafka.positions import position_key, validate_position
from connectors.kafka.settings import FORCED_PRODUCER, check_client

log = logging.getLogger("connectors.kafka")

#: Header carrying the reject reason code on dead letters.
REASON_HEADER = "calmon-reason"
SOURCE_HEADER = "calmon-source"
ORIGIN_HEADER = "calmon-origin"
_OWN_HEADERS = frozenset({REASON_HEADER, SOURCE_HEADER, ORIGIN_HEADER})
_SINK_KEYS = ("topic", "partitions", "buffer_limit", "flush_timeout")


class DeadLetter(NamedTuple):
    """A queued dead letter: the raw record, its headers, its origin (``topic/partition@offset``), its key."""

    value: bytes
    headers: list[tuple[str, bytes]]
    origin: str | None
    key: bytes | None = None


@dataclass
class SinkCounters:
    """Counters of a :class:`KafkaDeadLetterSink`."""

    written: int = 0
    skipped_replayed: int = 0
    dropped: int = 0
    failures: int = 0
    last_error: str | None = None


class KafkaDeadLetterSink:
    """Write rejected records to a Kafka topic, the reason code in header ``calmon-reason``.

    Each dead letter keeps the raw record as value and carries headers ``calmon-reason``,
    ``calmon-source`` and ``calmon-origin`` (e.g. ``"events/0@1234"``); given the records' transport
    metadata (a Kafka source's ``Batch.meta``) it also keeps their key and, before calmon's, their
    headers (except any of those three names, which would shadow this rejection's).

    The position (end offset of the dead-letter topic per partition after a flush) is checkpointed
    with the agent's state; after :meth:`seek` the sink reads the dead letters written after that
    position and skips re-writing records with the same origin, so a restart that replays source
    records does not duplicate dead letters (exactly once, given unique origins).  A send that fails
    (its acknowledgement may be all that was lost) is resent only after the same read from the last
    acknowledged offsets.

    Parameters
    ----------
    bootstrap_servers
        ``"host:port"`` or a list.
    topic
        Dead-letter topic (created with ``partitions`` partitions if missing).
    client
        kafka-python producer options passed through (security, ``acks``, ...).
    buffer_limit
        Dead letters kept in memory while the broker is unreachable; the oldest beyond it are
        dropped and counted in ``stats.dropped``.
    flush_timeout
        Seconds :meth:`flush` waits for acknowledgements.

    Examples
    --------
    >>> sink = KafkaDeadLetterSink("127.0.0.1:9", "dead")
    >>> sink.position()
    {}
    >>> sink.close()
    """

    def __init__(
        self,
        bootstrap_servers: str | list[str],
        topic: str = "calmon-dead-letters",
        *,
        client: Mapping[str, Any] | None = None,
        partitions: int = 1,
        buffer_limit: int = 100_000,
        flush_timeout: float = 5.0,
    ) -> None:
        if not topic:
            raise ValueError("dead-letter topic must be a non-empty string")
        if partitions < 1:
            raise ValueError("partitions must be >= 1")
        self.bootstrap_servers = bootstrap_servers
        self.topic = topic
        self.client = check_client(client, "producer", FORCED_PRODUCER)
        self.partitions = int(partitions)
        self.buffer_limit = int(buffer_limit)
        self.flush_timeout = float(flush_timeout)
        self.stats = SinkCounters()
        self._producer: Any = None
        self._buffer: list[DeadLetter] = []
        self._inflight: list[tuple[Any, DeadLetter]] = []  # (kafka-python future, letter)
        self._end: dict[str, int] = {}
        self._skip: set[str] = set()  # origins already in the topic after the sought position
        self._pending_seek: dict[str, int] | None = None
        self._scan_failures = 0
        self._flush_blocked_until = 0.0
        self._next_attempt = 0.0

    @classmethod
    def from_config(cls, cfg: Mapping[str, Any]) -> KafkaDeadLetterSink:
        """Build from ``{"bootstrap_servers", "topic", "partitions", "client", <producer options>}``.

        Examples
        --------
        >>> KafkaDeadLetterSink.from_config({"bootstrap_servers": "h:1", "acks": 1}).client
        {'acks': 1}
        """
        cfg = dict(cfg)
        cfg.pop("type", None)
        if "bootstrap_servers" not in cfg:
            raise ValueError("kafka dead-letter config needs 'bootstrap_servers'")
        kw = {k: cfg.pop(k) for k in _SINK_KEYS if k in cfg}
        client = dict(cfg.pop("client", None) or {})
        bootstrap = cfg.pop("bootstrap_servers")
        client.update(check_client(cfg, "producer"))
        return cls(bootstrap, client=client, **kw)

    # ------------------------------------------------------------------ DeadLetterSink protocol
    def write(
        self,
        records: list[bytes],
        reasons: list[str],
        source: str,
        origins: list[str] | None = None,
        meta: list[RecordMeta] | None = None,
    ) -> None:
        """Queue rejected ``records`` with their reason codes (sent asynchronously; see :meth:`flush`).

        ``meta`` (one per record, optional): each dead letter keeps the record's key and headers.
        """
        for letter in self.letters(records, reasons, source, origins, meta):
            if not self._replayed(letter.origin):
                self._buffer.append(letter)
        if len(self._buffer) > self.buffer_limit:
            drop = len(self._buffer) - self.buffer_limit
            self.stats.dropped += drop
            del self._buffer[:drop]
        self._send()

    @staticmethod
    def letters(
        records: list[bytes],
        reasons: list[str],
        source: str,
        origins: list[str] | None = None,
        meta: list[RecordMeta] | None = None,
    ) -> list[DeadLetter]:
        """The dead letters of rejected ``records`` as :meth:`write` would send them (value, headers, key), not
        queued: for a writer that produces them itself (the ingest stage of the scale-out sends them in the
        Kafka transaction of their range, ``docs/cluster.md``).

        Examples
        --------
        >>> [d] = KafkaDeadLetterSink.letters([b"x"], ["not_json"], "events", ["events/0@4"])
        >>> d.value, d.headers
        (b'x', [('calmon-reason', b'not_json'), ('calmon-source', b'events'), ('calmon-origin', b'events/0@4')])
        """
        n = len(records)
        if len(reasons) != n or (origins is not None and len(origins) != n) or (meta is not None and len(meta) != n):
            raise ValueError("records, reasons (and origins, meta) must have the same length")
        src = source.encode()
        out = []
        for i, rec in enumerate(records):
            origin = origins[i] if origins is not None else None
            m = meta[i] if meta is not None else None
            # a record's own calmon-* headers (an older dead letter read back) would shadow this rejection's
            headers = [h for h in m.headers if h[0] not in _OWN_HEADERS] if m is not None else []
            headers += [(REASON_HEADER, str(reasons[i]).encode()), (SOURCE_HEADER, src)]
            if origin is not None:
                headers.append((ORIGIN_HEADER, origin.encode()))
            out.append(DeadLetter(bytes(rec), headers, origin, None if m is None else m.key))
        return out

    def flush(self, *, force: bool = False) -> None:
        """Send queued dead letters and wait for their acknowledgement (failed ones stay queued).

        After a flush that timed out, the next ones within 5 s return at once (so that a broker
        outage does not block the agent at every checkpoint) unless ``force`` (:meth:`close`).
        """
        self._send()
        if self._producer is None or (time.monotonic() < self._flush_blocked_until and not force):
            return  # the broker did not acknowledge the last flush: do not block the agent again so soon
        try:
            with mapped("flush"):
                self._producer.flush(timeout=self.flush_timeout)
        except KafkaClientError as exc:
            self.stats.last_error = str(exc)
        # a failed letter may have been written at any offset after the end acknowledged before this flush
        acked_before = dict(self._end)
        inflight, self._inflight = self._inflight, []
        retry = []
        for fut, letter in inflight:
            if fut.is_done and fut.succeeded():
                md = fut.value
                key = position_key(md.topic, md.partition)
                self._end[key] = max(self._end.get(key, 0), int(md.offset) + 1)
                self.stats.written += 1
            elif fut.is_done:
                self.stats.failures += 1
                self.stats.last_error = repr(fut.exception)
                retry.append(letter)
            else:
                self._inflight.append((fut, letter))
        if retry:
            # a failed send may still have reached the topic (only its acknowledgement lost): learn the
            # origins written past the offsets acknowledged before it, before sending these again
            seek = dict(acked_before)
            for key, offset in (self._pending_seek or {}).items():
                seek[key] = min(offset, seek.get(key, offset))
            self._pending_seek = seek
            self._scan_failures = 0
        self._buffer = retry + self._buffer
        if self._inflight:
            self._flush_blocked_until = time.monotonic() + 5.0

    def unacknowledged(self) -> int:
        """Dead letters written to this sink and not yet acknowledged by the broker (0: all in the topic).

        The agent defers a checkpoint while this is not 0: the checkpoint would otherwise cover
        source records whose dead letters a crash could still lose.
        """
        return len(self._buffer) + len(self._inflight)

    def position(self) -> dict[str, int]:
        """End offset per dead-letter partition after flushing (checkpoint it with the state)."""
        if self._buffer or self._inflight:
            self.flush()
        out = dict(self._pending_seek or {})
        for k, v in self._end.items():
            out[k] = max(out.get(k, 0), v)
        return out

    def seek(self, position: Mapping[str, Any]) -> None:
        """Restore a checkpointed position: dead letters already written after it are not written again."""
        pos = validate_position(position)
        self._pending_seek = pos
        self._end = dict(pos)
        self._skip.clear()
        self._scan_failures = 0

    def close(self) -> None:
        """Flush (waiting for acknowledgements even right after a timed-out flush) and close the producer.

        Letters still unacknowledged are logged: the agent's last checkpoint did not cover their
        records (see :meth:`unacknowledged`), so a restart replays those records and writes them.
        """
        try:
            self.flush(force=True)
            if self.unacknowledged():
                log.warning("dead-letter sink %s: %d dead letters not acknowledged at close (%s); their records "
                            "are after the last checkpoint and are dead-lettered again on restart", self.topic,
                            self.unacknowledged(), self.stats.last_error)
        finally:
            producer, self._producer = self._producer, None
            if producer is not None:
                try:
                    with mapped("close"):
                        producer.close(timeout=2)
                except KafkaClientError as exc:
                    log.debug("dead-letter sink %s: close failed: %s", self.topic, exc)

    # ------------------------------------------------------------------ internals
    def _replayed(self, origin: str | None) -> bool:
        """True (and counted) if a dead letter with this origin is already in the topic."""
        if origin is None or origin not in self._skip:
            return False
        self._skip.discard(origin)
        self.stats.skipped_replayed += 1
        return True

    def _ensure_producer(self) -> bool:
        if self._producer is not None:
            return True
        if time.monotonic() < self._next_attempt:
            return False
        from kafka import KafkaProducer

        cfg = {"linger_ms": 20, "max_block_ms": 2000, "bootstrap_timeout_ms": 2000, "acks": "all",
               "reconnect_backoff_max_ms": 5000}
        cfg.update(self.client)
        try:
            ensure_topic(self.bootstrap_servers, self.topic, self.partitions, {}, self.client)
            with mapped("connect"):
                self._producer = KafkaProducer(bootstrap_servers=self.bootstrap_servers, **cfg)
        except KafkaClientError as exc:
            self._failed(exc)
            log.warning("dead-letter sink %s: producer unavailable (%s); buffering", self.topic, exc)
            return False
        return True

    def _failed(self, exc: KafkaClientError) -> None:
        self.stats.failures += 1
        self.stats.last_error = str(exc)
        self._next_attempt = time.monotonic() + 2.0

    def _send(self) -> None:
        if not self._buffer or time.monotonic() < self._next_attempt or not self._ensure_producer():
            return
        if not self._replay_scanned():
            return
        buf, self._buffer = self._buffer, []
        for i, letter in enumerate(buf):
            if self._replayed(letter.origin):
                continue
            try:
                with mapped("send"):
                    fut = self._producer.send(self.topic, value=letter.value, key=letter.key, headers=letter.headers)
            except KafkaClientError as exc:  # broker down: keep the rest for later
                self.stats.failures += 1
                self.stats.last_error = str(exc)
                self._buffer = buf[i:] + self._buffer
                return
            self._inflight.append((fut, letter))

    def _replay_scanned(self) -> bool:
        """After a seek, learn the dead letters already written; False = not yet possible, send later."""
        if self._pending_seek is None or self._scan_replayed():
            return True
        self._scan_failures += 1
        if "authoriz" not in str(self.stats.last_error).lower():
            # unreachable or slow: the letters wait (bounded by buffer_limit) -- sending them unscanned could
            # write twice those whose acknowledgement was lost
            self._next_attempt = time.monotonic() + min(30.0, 2.0 * self._scan_failures)
            if self._scan_failures % 10 == 3:
                log.warning("dead-letter sink %s: cannot read the dead letters written after the last acknowledged "
                            "offsets yet (%s); %d dead letters wait", self.topic, self.stats.last_error,
                            len(self._buffer))
            return False
        log.warning("dead-letter sink %s: not allowed to read the dead letters written after the checkpoint (%s); "
                    "dead letters of replayed records may be duplicated (grant the agent Read on the topic)",
                    self.topic, self.stats.last_error)
        self._pending_seek = None
        return True

    def _scan_replayed(self, timeout: float = 10.0) -> bool:
        """Collect the origins of dead letters written after the sought position."""
        found: set[str] = set()

        def visit(record: Any) -> None:
            origin = dict(record.headers or []).get(ORIGIN_HEADER)
            if origin is not None:
                found.add(origin.decode())

        try:
            scan = scan_topic(self.bootstrap_servers, self.topic, self.client, visit,
                              start=self._pending_seek, timeout=timeout)
        except KafkaClientError as exc:
            self.stats.last_error = str(exc)
            return False
        if not scan.complete:
            return False
        self._skip |= found
        for key, end in scan.ends.items():
            self._end[key] = max(self._end.get(key, 0), end)
        self._pending_seek = None
        return True
