"""Emit calmon events from serving code: ``Emitter.to_file`` (rotating JSONL) or ``Emitter.to_kafka``.

Standard library only for the file sink; ``kafka-python`` is imported by the Kafka sink when it
connects, ``prometheus_client`` only when a registry is given. See README "Emitting events from
serving code".

Examples
--------
>>> import tempfile, pathlib
>>> from calmon.client import Emitter
>>> with Emitter.to_file(pathlib.Path(tempfile.mkdtemp()) / "events.jsonl") as em:
...     rid = em.prediction("digits", probs=[0.1, 0.7, 0.2])
...     ok = em.outcome(rid, 1)
>>> em.counters()["sent"]
2
"""

from calmon.client.emitter import Emitter, EmitterCounters, Sink
from calmon.client.events import InvalidEventError
from calmon.client.filesink import RotatingFileSink
from calmon.client.kafkasink import KafkaSink

__all__ = ["Emitter", "EmitterCounters", "Sink", "InvalidEventError", "RotatingFileSink", "KafkaSink"]
