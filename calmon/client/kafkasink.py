"""A Kafka topic as an event sink: a bounded queue drained by a background thread (kafka-python).

The caller's :meth:`KafkaSink.write` only appends to an in-memory queue under a lock, so a slow or
unreachable broker never blocks or raises into a request handler; when the queue is full the
newest (or the oldest) event is dropped and counted (at-most-once). A background thread takes
batches from the queue and hands them to a ``kafka.KafkaProducer`` (created lazily, with
reconnection backoff), keyed by the prediction id so that a prediction and its outcome land on the
same partition. ``sent`` counts records the broker acknowledged, ``errors`` records it refused,
that timed out, or that were still unsent when :meth:`KafkaSink.close` gave up.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Mapping
from typing import Any

from calmon.client.forking import after_fork_in_child

__all__ = ["KafkaSink", "POLICIES"]

log = logging.getLogger(__name__)

POLICIES = ("drop_newest", "drop_oldest")
_ABANDONED: list[Any] = []  # producers inherited through fork(): never closed in the child (the parent owns them)
_DEFAULTS: dict[str, Any] = {"linger_ms": 20, "max_block_ms": 1000, "bootstrap_timeout_ms": 2000,
                             "reconnect_backoff_max_ms": 5000}


def _checked(config: Mapping[str, Any]) -> dict[str, Any]:
    """The caller's producer options; a misspelt one is a ValueError now, not a silent failure later."""
    if not config:
        return {}
    from kafka import KafkaProducer

    unknown = sorted(set(config) - set(KafkaProducer.DEFAULT_CONFIG) - {"bootstrap_servers"})
    if unknown:
        raise ValueError(f"unknown kafka-python producer options: {', '.join(unknown)}")
    return dict(config)


class KafkaSink:
    """Non-blocking, batched producer of event lines to one topic.

    Parameters
    ----------
    bootstrap_servers
        ``host:port[,host:port...]``.
    topic
        Destination topic (auto-created by brokers that allow it; create it with the partitions you
        want beforehand).
    queue_size
        Events held in memory while the producer catches up or the broker is away.
    policy
        ``"drop_newest"`` (refuse the new event) or ``"drop_oldest"`` when the queue is full.
    batch_size
        Events handed to the producer per loop of the background thread.
    producer_config
        Extra ``kafka.KafkaProducer`` options (``security_protocol``, ``sasl_*``, ``acks``, ...).

    Examples
    --------
    >>> sink = KafkaSink("127.0.0.1:1", "events", queue_size=2, start=False)  # no broker needed
    >>> for i in range(3):
    ...     sink.write(f"id{i}", b"{}\\n")
    >>> sink.counters()["dropped_full"], sink.counters()["pending"]
    (1, 2)
    >>> sink.close(timeout=0)
    False
    """

    def __init__(self, bootstrap_servers: str | list[str], topic: str, queue_size: int = 10_000,
                 policy: str = "drop_newest", batch_size: int = 500,
                 producer_config: Mapping[str, Any] | None = None, *, start: bool = True) -> None:
        if policy not in POLICIES:
            raise ValueError(f"policy must be one of {POLICIES}, got {policy!r}")
        if queue_size < 1 or batch_size < 1:
            raise ValueError("queue_size and batch_size must be >= 1")
        if not topic:
            raise ValueError("topic is required")
        self.bootstrap_servers = bootstrap_servers
        self.topic = topic
        self.queue_size = int(queue_size)
        self.policy = policy
        self.batch_size = int(batch_size)
        self.config = {**_DEFAULTS, **_checked(producer_config or {})}
        self._queue: deque[tuple[bytes, bytes]] = deque()
        self._cond = threading.Condition()
        self._inflight = 0  # taken from the queue, not yet acknowledged or failed
        self.sent = self.dropped_full = self.errors = 0
        self.last_error = ""
        self._closing = False
        self._final = False  # close() has accounted for everything: late callbacks are ignored
        self._deadline = float("inf")
        self._producer: Any = None
        self._thread = self._new_thread()
        if start:
            self._thread.start()
            after_fork_in_child(self, KafkaSink._after_fork)

    def _new_thread(self) -> threading.Thread:
        return threading.Thread(target=self._run, name=f"calmon-client-kafka-{self.topic}", daemon=True)

    def _after_fork(self) -> None:
        """In a forked child: the queue, producer and thread are the parent's; start empty, with a new thread."""
        self._cond = threading.Condition()  # the parent's lock may have been held at the fork
        self._queue = deque()
        self._inflight = 0
        self.sent = self.dropped_full = self.errors = 0
        if self._producer is not None:
            _ABANDONED.append(self._producer)
            self._producer = None
        if not self._closing:
            self._thread = self._new_thread()
            self._thread.start()

    # ------------------------------------------------------------------ the caller's side
    def write(self, key: str, line: bytes) -> None:
        """Queue one event keyed by ``key``; drops (and counts) by :attr:`policy` when full."""
        item = (key.encode(), line.rstrip(b"\n"))
        with self._cond:
            if self._closing:
                self.errors += 1
                return
            if len(self._queue) >= self.queue_size:
                self.dropped_full += 1
                if self.policy == "drop_newest":
                    return
                self._queue.popleft()
            self._queue.append(item)
            if len(self._queue) >= self.batch_size:
                self._cond.notify()

    def counters(self) -> dict[str, int]:
        """``sent``, ``dropped_full``, ``errors`` and ``pending`` (queued or awaiting acknowledgement)."""
        with self._cond:
            return {"sent": self.sent, "dropped_full": self.dropped_full, "errors": self.errors,
                    "pending": len(self._queue) + self._inflight}

    def flush(self, timeout: float | None = 10.0) -> bool:
        """Wait until everything queued so far is acknowledged or failed; False on timeout."""
        end = time.monotonic() + (float("inf") if timeout is None else timeout)
        with self._cond:
            self._cond.notify_all()
            while self._queue or self._inflight:
                left = end - time.monotonic()
                if left <= 0 or not self._thread.is_alive():
                    return False
                self._cond.wait(min(left, 0.05))
        return True

    def close(self, timeout: float | None = 10.0) -> bool:
        """Deliver what is queued within ``timeout`` seconds, then stop; unsent events count as errors.

        Returns True when everything queued was acknowledged or refused by the broker in time.
        """
        start = time.monotonic()
        with self._cond:
            if self._final:
                return True
            self._closing = True
            self._deadline = start + (float("inf") if timeout is None else max(0.0, timeout))
            self._cond.notify_all()
        if self._thread.is_alive():
            self._thread.join(None if timeout is None else max(0.0, self._deadline - time.monotonic()) + 1.0)
        with self._cond:
            complete = not self._queue and not self._inflight
            self.errors += len(self._queue) + self._inflight
            self._queue.clear()
            self._inflight = 0
            self._final = True
        return complete

    # ------------------------------------------------------------------ the background thread
    def _run(self) -> None:
        backoff = 0.0
        while True:
            with self._cond:
                if backoff and not self._closing:
                    self._cond.wait(backoff)  # woken early by close()
                while not self._queue and not self._closing:
                    self._cond.wait(0.05)
                if not self._queue or time.monotonic() >= self._deadline:
                    break
                n = min(self.batch_size, len(self._queue))
                batch = [self._queue.popleft() for _ in range(n)]
                self._inflight += n
            backoff = 0.0 if self._send(batch) else min(5.0, max(0.5, 2 * backoff))
        self._shutdown()

    def _send(self, batch: list[tuple[bytes, bytes]]) -> bool:
        """Hand a batch to the producer; on a connection failure put the rest back and return False."""
        if self._producer is None and not self._connect():
            self._requeue(batch)
            return False
        for i, (key, value) in enumerate(batch):
            try:
                future = self._producer.send(self.topic, key=key, value=value)
            except Exception as exc:  # noqa: BLE001 - kafka-python raises many types (timeouts, buffer, state)
                self._failed(exc)
                self._requeue(batch[i + 1:])
                return False
            future.add_callback(self._acked)
            future.add_errback(self._failed)
        return True

    def _connect(self) -> bool:
        try:
            from kafka import KafkaProducer

            known = KafkaProducer.DEFAULT_CONFIG  # our defaults, minus those an older kafka-python lacks
            config = {k: v for k, v in self.config.items() if k in known or k not in _DEFAULTS}
            self._producer = KafkaProducer(bootstrap_servers=self.bootstrap_servers, **config)
        except Exception as exc:  # noqa: BLE001 - NoBrokersAvailable, DNS and TLS errors, bad options
            self._note(exc)
            return False
        return True

    def _requeue(self, items: list[tuple[bytes, bytes]]) -> None:
        """Put unsent items back at the front; what no longer fits is dropped by the policy."""
        with self._cond:
            if self._final:
                return
            self._inflight -= len(items)
            for item in reversed(items):
                if len(self._queue) >= self.queue_size:
                    self.dropped_full += 1
                    if self.policy == "drop_newest":
                        self._queue.pop()
                    else:
                        continue  # the requeued item is the oldest: it is the one dropped
                self._queue.appendleft(item)

    def _acked(self, _metadata: object) -> None:
        with self._cond:
            if not self._final:
                self.sent += 1
                self._inflight -= 1
                self._cond.notify_all()

    def _failed(self, exc: BaseException) -> None:
        self._note(exc)
        with self._cond:
            if not self._final:
                self.errors += 1
                self._inflight -= 1
                self._cond.notify_all()

    def _note(self, exc: BaseException) -> None:
        text = f"{type(exc).__name__}: {exc}"
        if text != self.last_error:
            log.warning("calmon client: Kafka topic %s: %s", self.topic, text)
        self.last_error = text

    def _shutdown(self) -> None:
        if self._producer is None:
            return
        left = max(0.0, self._deadline - time.monotonic())
        left = min(left, 30.0)
        try:
            self._producer.flush(timeout=left)
        except Exception as exc:  # noqa: BLE001 - a flush timeout; the records left count as errors in close()
            self._note(exc)
        try:
            self._producer.close(timeout=min(left, 1.0))
        except Exception as exc:  # noqa: BLE001 - closing a broken client must not escape the thread
            self._note(exc)
