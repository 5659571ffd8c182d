"""The consumer-client contract :class:`~connectors.kafka.source.KafkaSource` is written against.

One small adapter per client library implements :class:`ConsumerClient`
(:mod:`connectors.kafka.kafkapython`, :mod:`connectors.kafka.confluent`); the source keeps every
policy (positions, pending partitions, truncation checks, commits, lag, backoff) and the adapters
only translate calls.  Library exceptions are mapped to :class:`KafkaConfigError` (bad options: the
agent must not start) and :class:`KafkaClientError` (broker or network trouble: retried).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, cast

from connectors.base import RecordMeta
from connectors.kafka.origins import Run
from connectors.kafka.positions import TP


class KafkaConfigError(ValueError):
    """The client library rejected its configuration (not retried)."""


class KafkaClientError(RuntimeError):
    """A broker, network or client-state failure (retried with backoff).

    ``fatal`` asks the source to drop and recreate the consumer (its state is unusable).
    """

    def __init__(self, message: str, *, fatal: bool = False) -> None:
        super().__init__(message)
        self.fatal = fatal


@dataclass
class Fetched:
    """The records of one poll, as the client delivered them: values in one list, partitions and offsets per run.

    Nothing is kept per record but its value (and its :class:`RecordMeta` when the source reads metadata): a
    run of consecutive records of one partition is described once (:class:`~connectors.kafka.origins.Run`),
    so positions, gaps and origins cost a few operations per partition and poll, not per record.

    Attributes
    ----------
    values
        Every record's value in delivery order (``b""`` for a null value).
    runs
        ``values[run.start:run.stop]`` are records of ``run.tp`` with ascending offsets; runs cover ``values``
        in order (a partition may have several runs in one poll).
    metas
        One per record when :attr:`ConsumerSettings.metadata` is set, else None.

    Examples
    --------
    >>> f = Fetched.of_partition(TP("t", 0), [b"a", None], [4, 5])
    >>> f.values, f.runs[0].first, f.runs[0].last, len(f)
    ([b'a', b''], 4, 5, 2)
    """

    values: list[bytes] = field(default_factory=list)
    runs: list[Run] = field(default_factory=list)
    metas: list[RecordMeta] | None = None

    def __len__(self) -> int:
        return len(self.values)

    def add(self, tp: TP, values: Sequence[bytes | None], first: int, last: int,
            offsets: Callable[[], Sequence[int]]) -> None:
        """Append one partition's records (offsets ``first`` .. ``last``); ``offsets()`` lists them all and is
        called only when they are not contiguous."""
        start = len(self.values)
        self.values += cast("Sequence[bytes]", values) if None not in values else [
            b"" if v is None else v for v in values]
        n = len(self.values) - start
        self.runs.append(Run(tp, start, start + n, first, None if last - first + 1 == n else list(offsets())))

    @classmethod
    def of_partition(cls, tp: TP, values: Sequence[bytes | None], offsets: Sequence[int]) -> Fetched:
        """One partition's records (tests, simple adapters)."""
        out = cls()
        if values:
            out.add(tp, values, offsets[0], offsets[-1], lambda: offsets)
        return out


_SHARED_HEADERS: dict[tuple[tuple[str, bytes | None], ...], tuple[tuple[str, bytes | None], ...]] = {}
_SHARED_MAX = 4096


def header_tuple(headers: Sequence[tuple[str, bytes | None]]) -> tuple[tuple[str, bytes], ...]:
    """A record's headers as :attr:`RecordMeta.headers` (order and repeats kept; a null value becomes ``b""``).

    Examples
    --------
    >>> header_tuple([("model", b"fraud"), ("trace", None)])
    (('model', b'fraud'), ('trace', b''))
    """
    out = tuple(headers)
    for _k, v in out:  # a loop, not any(<generator>): this runs once per record
        if v is None:
            out = tuple((k, b"" if v is None else v) for k, v in out)
            break
    # Records of a topic mostly repeat their headers (e.g. a model name): sharing one tuple lets the new ones die
    # young, which saves some of the garbage collector's work on a batch (about a tenth, benchmarks/bench_kafka.py).
    shared = _SHARED_HEADERS.setdefault(out, out)
    if len(_SHARED_HEADERS) > _SHARED_MAX:
        _SHARED_HEADERS.clear()  # headers that never repeat (trace ids): no sharing, bounded memory
    return cast("tuple[tuple[str, bytes], ...]", shared)  # no None value left


class ConsumerEvents(Protocol):
    """What a client reports to its source: rebalances and errors that do not fail a call.

    kafka-python calls the rebalance methods on its IO thread (they must not block); confluent-kafka
    inside ``poll`` on the reading thread, which lets it also call :meth:`position_pending` there.
    """

    def on_assigned(self, tps: list[TP]) -> None: ...

    def on_revoked(self, tps: list[TP]) -> None: ...

    def position_pending(self, timeout: float) -> None: ...

    def on_error(self, message: str, counted: bool) -> None:
        """An error reported outside a failing call (``counted``: a record-level error)."""


@dataclass
class ConsumerSettings:
    """What every adapter needs to create its consumer.

    Examples
    --------
    >>> ConsumerSettings("h:1", ["t"], None, "src").group_id is None
    True
    """

    bootstrap_servers: str | list[str]
    topics: list[str]
    group_id: str | None
    name: str
    options: dict[str, Any] = field(default_factory=dict)
    auto_offset_reset: str = "earliest"
    #: Read each record's timestamp, key and headers (:meth:`ConsumerClient.metas`).
    metadata: bool = False


class ConsumerClient(Protocol):
    """A thin adapter over one Kafka consumer of one client library."""

    def config(self) -> dict[str, Any]:
        """The resolved client configuration (defaults, pass-through options, calmon's forced ones)."""

    def start(self, handler: ConsumerEvents, timeout: float) -> None:
        """Create the consumer: subscribe to the group, or assign every partition without a group.

        Raises :class:`KafkaConfigError` or :class:`KafkaClientError` (the consumer is then closed).
        """

    def poll(self, max_records: int, timeout: float) -> Fetched:
        """At most ``max_records`` records fetched within ``timeout`` seconds (with their metadata when
        ``settings.metadata`` is set)."""

    def committed(self, tps: list[TP], timeout: float) -> dict[TP, int]:
        """The group's committed offsets of ``tps`` (partitions without one are omitted)."""

    def commit(self, offsets: Mapping[TP, int], timeout: float) -> None: ...

    def seek(self, tp: TP, offset: int) -> None: ...

    def pause(self, tps: list[TP]) -> None: ...

    def resume(self, tps: list[TP]) -> None: ...

    def highwater(self, tp: TP) -> int | None:
        """High watermark of ``tp`` from the latest fetch (no network call); None if unknown."""

    def beginning_offset(self, tp: TP, timeout: float) -> int:
        """The first offset still in the log of ``tp``."""

    @property
    def connected(self) -> bool:
        """True while the client believes a broker connection is up."""

    def close(self, timeout: float) -> None:
        """Close without committing (never raises)."""


class ClientFactory(Protocol):
    """An adapter class: validates a library's options and creates a :class:`ConsumerClient`."""

    library: str

    def __call__(self, settings: ConsumerSettings) -> ConsumerClient: ...

    def check_options(self, options: Mapping[str, Any] | None) -> dict[str, Any]:
        """Validate ``client`` pass-through options (``ValueError`` naming the bad ones)."""

    def check_extra(self, extra: Mapping[str, Any]) -> dict[str, Any]:
        """Validate options found at the top level of a source's config (they join ``client``)."""
