"""The serving-side API: emit predictions and outcomes in calmon's canonical schema.

An :class:`Emitter` validates each event cheaply (:mod:`calmon.client.events`), stamps it with
the serving clock, and hands one JSON line keyed by the prediction id to a sink (a rotating JSONL
file, :class:`~calmon.client.filesink.RotatingFileSink`, or a Kafka topic,
:class:`~calmon.client.kafkasink.KafkaSink`). In a request handler it never raises and never
blocks on I/O beyond one local ``write``: an invalid value is counted (``dropped_invalid``, by
reason) and dropped, unless ``strict=True`` -- also a value whose own conversion raises (a
``__float__`` that fails is ``bad_type``).
"""

from __future__ import annotations

import logging
import os
import threading
import time
import uuid
from collections.abc import Callable, Mapping
from typing import Any, Protocol, TypedDict

from calmon.client.events import MAX_CLASSES, InvalidEventError, labeled_event, outcome_event, prediction_event

__all__ = ["Emitter", "EmitterCounters", "Sink"]

log = logging.getLogger(__name__)


class Sink(Protocol):
    """Where an emitter's lines go; ``write`` must not block for long nor raise."""

    def write(self, key: str, line: bytes) -> None: ...

    def flush(self, timeout: float | None = ...) -> bool: ...

    def close(self, timeout: float | None = ...) -> bool: ...

    def counters(self) -> dict[str, int]: ...


class EmitterCounters(TypedDict):
    """Counts since the emitter was created (events = calls of prediction/outcome/labeled)."""

    sent: int  # written to the file / acknowledged by the broker
    dropped_full: int  # the Kafka queue was full (at-most-once)
    dropped_invalid: int  # failed validation (by reason: Emitter.invalid_reasons())
    errors: int  # I/O errors, broker refusals and timeouts, unsent at close
    pending: int  # queued or awaiting acknowledgement


class Emitter:
    """Emit canonical calmon events from serving code.

    Parameters
    ----------
    sink
        A :class:`Sink`; usually built by :meth:`to_file` or :meth:`to_kafka`.
    strict
        Raise :class:`~calmon.client.events.InvalidEventError` for an invalid event instead of
        counting and dropping it (for tests and batch jobs, not request paths).
    stamp
        Give events without ``ts`` the current time of ``clock`` (the serving time; without it the
        agent uses the arrival time).
    clock
        Wall clock in epoch seconds.
    registry
        A ``prometheus_client`` ``CollectorRegistry`` to export the counters to, as
        ``calmon_client_events_total{emitter, result}`` and ``calmon_client_pending{emitter}``.
    name
        The ``emitter`` label of those metrics.
    max_classes
        Longest ``probs`` accepted: the agent's ``limits.max_classes`` (default that of the agent,
        :data:`~calmon.client.events.MAX_CLASSES`). A longer one is ``too_many_classes``, refused
        from its length before any element is converted.

    Examples
    --------
    >>> import json, tempfile, pathlib
    >>> d = pathlib.Path(tempfile.mkdtemp())
    >>> em = Emitter.to_file(d / "events.jsonl", clock=lambda: 1767225600.0)
    >>> rid = em.prediction("fraud", score=0.83, segment="eu")
    >>> em.outcome(rid, 1)
    True
    >>> em.prediction("fraud", score=float("nan"))  # counted and dropped, never raised  # doctest: +ELLIPSIS
    '...'
    >>> _ = em.close(); em.counters()
    {'sent': 2, 'dropped_full': 0, 'dropped_invalid': 1, 'errors': 0, 'pending': 0}
    >>> [json.loads(x)["type"] for x in (d / "events.jsonl").read_text().splitlines()]
    ['prediction', 'outcome']
    """

    def __init__(self, sink: Sink, *, strict: bool = False, stamp: bool = True,
                 clock: Callable[[], float] = time.time, registry: Any = None, name: str = "default",
                 max_classes: int = MAX_CLASSES) -> None:
        if not 2 <= max_classes <= 100_000:  # the agent's bounds of limits.max_classes
            raise ValueError(f"max_classes must be in [2, 100000], got {max_classes!r}")
        self.max_classes = int(max_classes)
        self.sink = sink
        self.strict = strict
        self.stamp = stamp
        self.clock = clock
        self.name = name
        self._lock = threading.Lock()
        self._invalid: dict[str, int] = {}
        self.last_invalid = ""
        if registry is not None:
            from calmon.client.metrics import register
            register(self, registry)

    @classmethod
    def to_file(cls, path: str | os.PathLike[str], *, max_bytes: int | None = 64 << 20,
                max_age: float | None = 3600.0, fsync: bool = False, **kwargs: Any) -> Emitter:
        """An emitter writing to a rotating JSONL file (see :class:`~calmon.client.filesink.RotatingFileSink`)."""
        from calmon.client.filesink import RotatingFileSink
        return cls(RotatingFileSink(path, max_bytes=max_bytes, max_age=max_age, fsync=fsync), **kwargs)

    @classmethod
    def to_kafka(cls, bootstrap_servers: str | list[str], topic: str, *, queue_size: int = 10_000,
                 policy: str = "drop_newest", batch_size: int = 500,
                 producer_config: Mapping[str, Any] | None = None, **kwargs: Any) -> Emitter:
        """An emitter producing to a Kafka topic (see :class:`~calmon.client.kafkasink.KafkaSink`)."""
        from calmon.client.kafkasink import KafkaSink
        sink = KafkaSink(bootstrap_servers, topic, queue_size=queue_size, policy=policy, batch_size=batch_size,
                         producer_config=producer_config)
        return cls(sink, **kwargs)

    # ------------------------------------------------------------------ events
    def prediction(self, model: str, score: Any = None, probs: Any = None, id: Any = None,  # noqa: A002
                   segment: str | None = None, ts: Any = None) -> str:
        """Emit a prediction: ``score`` = P(y = 1) (binary) or ``probs`` (K classes); returns its id.

        A missing ``id`` is generated (``uuid4().hex``); keep the returned id to emit the outcome.
        """
        rid = uuid.uuid4().hex if id is None else id
        self._emit(prediction_event, rid, model, rid, score, probs, segment, self._ts(ts),
                   max_classes=self.max_classes)
        return str(rid)

    def outcome(self, id: Any, label: Any, ts: Any = None, model: str | None = None) -> bool:  # noqa: A002
        """Emit the label of an earlier prediction; False if it was invalid (and dropped)."""
        return self._emit(outcome_event, id, id, label, self._ts(ts), model)

    def labeled(self, model: str, label: Any, score: Any = None, probs: Any = None, id: Any = None,  # noqa: A002
                segment: str | None = None, ts: Any = None) -> str:
        """Emit a prediction that already carries its label; returns its id."""
        rid = uuid.uuid4().hex if id is None else id
        self._emit(labeled_event, rid, model, label, rid, score, probs, segment, self._ts(ts),
                   max_classes=self.max_classes)
        return str(rid)

    def _ts(self, ts: Any) -> Any:
        return self.clock() if ts is None and self.stamp else ts

    def _emit(self, build: Callable[..., bytes], key: Any, *args: Any, **kwargs: Any) -> bool:
        try:
            line = build(*args, **kwargs)
        except Exception as raised:  # noqa: BLE001 - whatever a caller's value does, the request goes on
            exc = raised if isinstance(raised, InvalidEventError) else InvalidEventError(
                "bad_type", f"checking the event raised {type(raised).__name__}")
            if self.strict:
                if exc is raised:
                    raise
                raise exc from raised
            with self._lock:
                self._invalid[exc.reason] = self._invalid.get(exc.reason, 0) + 1
                first = len(self._invalid) == 1 and self._invalid[exc.reason] == 1
                self.last_invalid = str(exc)
            if first:
                log.warning("calmon client %s: invalid event dropped (%s); see counters()", self.name, exc)
            return False
        self.sink.write(str(key), line)
        return True

    # ------------------------------------------------------------------ lifecycle and counters
    def counters(self) -> EmitterCounters:
        """``sent``, ``dropped_full``, ``dropped_invalid``, ``errors``, ``pending``."""
        s = self.sink.counters()
        with self._lock:
            invalid = sum(self._invalid.values())
        return {"sent": s.get("sent", 0), "dropped_full": s.get("dropped_full", 0), "dropped_invalid": invalid,
                "errors": s.get("errors", 0), "pending": s.get("pending", 0)}

    def invalid_reasons(self) -> dict[str, int]:
        """Dropped invalid events by reason code (the decoder's codes)."""
        with self._lock:
            return dict(self._invalid)

    def flush(self, timeout: float | None = 10.0) -> bool:
        """Wait until everything emitted so far is delivered (or failed); False on timeout."""
        return self.sink.flush(timeout)

    def close(self, timeout: float | None = 10.0) -> bool:
        """Deliver what is pending within ``timeout`` seconds and release the sink."""
        return self.sink.close(timeout)

    def __enter__(self) -> Emitter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
