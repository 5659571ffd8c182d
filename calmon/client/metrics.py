"""The emitter's counters as Prometheus metrics, read at scrape time (no double bookkeeping).

``calmon_client_events_total{emitter, result}`` with ``result`` in ``sent``, ``dropped_full``,
``dropped_invalid``, ``errors``, and the gauge ``calmon_client_pending{emitter}``.
``prometheus_client`` is imported only when a registry is given.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any, Protocol

__all__ = ["CountedEmitter", "EmitterCollector", "register"]

_RESULTS = ("sent", "dropped_full", "dropped_invalid", "errors")


class CountedEmitter(Protocol):
    """What the collector reads of an emitter (:class:`~calmon.client.emitter.Emitter` is one)."""

    name: str

    def counters(self) -> Mapping[str, Any]: ...


class EmitterCollector:
    """A ``prometheus_client`` collector over one :class:`~calmon.client.emitter.Emitter`.

    Examples
    --------
    >>> import tempfile, pathlib
    >>> from prometheus_client import CollectorRegistry
    >>> from calmon.client import Emitter
    >>> reg = CollectorRegistry()
    >>> em = Emitter.to_file(pathlib.Path(tempfile.mkdtemp()) / "e.jsonl", registry=reg, name="api")
    >>> _ = em.prediction("fraud", score=0.5)
    >>> reg.get_sample_value("calmon_client_events_total", {"emitter": "api", "result": "sent"})
    1
    >>> _ = em.close()
    """

    def __init__(self, emitter: CountedEmitter) -> None:
        self.emitter = emitter

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        c = self.emitter.counters()
        events = CounterMetricFamily("calmon_client_events", "Events emitted by the calmon client, by result",
                                     labels=["emitter", "result"])
        for result in _RESULTS:
            events.add_metric([self.emitter.name, result], c[result])
        yield events
        pending = GaugeMetricFamily("calmon_client_pending", "Events queued or awaiting acknowledgement",
                                    labels=["emitter"])
        pending.add_metric([self.emitter.name], c["pending"])
        yield pending


def register(emitter: CountedEmitter, registry: Any) -> EmitterCollector:
    """Register ``emitter``'s collector with a ``prometheus_client`` registry; returns it."""
    collector = EmitterCollector(emitter)
    registry.register(collector)
    return collector
