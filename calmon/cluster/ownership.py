"""What a cluster worker owns and how far behind it is, as Prometheus text (``calmon_cluster_*``).

Both stages export, per worker: the partitions it owns, its lag per partition, and the
restore time of the last partition it took over; an evaluator also the number of models it owns.
Every series carries ``stage`` (``ingest`` or ``evaluate``) and ``worker`` (a process id), so
Prometheus scraping every worker sees each partition under exactly one worker.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from calmon.cluster.records import BadRecords

if TYPE_CHECKING:
    from calmon.cluster.partition import Applied
    from calmon.cluster.topics import Range
    from connectors.kafka import KafkaSource
__all__ = ["IngestMetrics", "render_ownership", "escape", "GROUP_REPAIRS_HELP"]

#: ``calmon_cluster_group_repairs_total`` (both stages; :mod:`connectors.kafka.groupwatch`)
GROUP_REPAIRS_HELP = ("Repairs of this worker's consumer group after it did not form for several session timeouts "
                      "(the departed leader it waited for expired by one JoinGroup under its id).")


def escape(value: str) -> str:
    """A label value escaped for the text exposition format.

    Examples
    --------
    >>> escape('a"b\\\\c')
    'a\\\\"b\\\\\\\\c'
    """
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def render_ownership(stage: str, worker: str, owned: list[str], lag: dict[str, int], models: int | None,
                     restore_seconds: float | None, position: dict[str, int] | None = None) -> list[str]:
    """The ``calmon_cluster_*`` ownership lines of one worker.

    Examples
    --------
    >>> print("\\n".join(render_ownership("evaluate", "w1", ["d/0"], {"d/0": 3}, 5, 0.25)))  # doctest: +ELLIPSIS
    # HELP calmon_cluster_owned_partitions Partitions this worker owns.
    # TYPE calmon_cluster_owned_partitions gauge
    calmon_cluster_owned_partitions{stage="evaluate",worker="w1"} 1
    ...
    calmon_cluster_lag_records{stage="evaluate",worker="w1",partition="d/0"} 3
    ...
    calmon_cluster_owned_models{stage="evaluate",worker="w1"} 5
    ...
    """
    base = f'stage="{escape(stage)}",worker="{escape(worker)}"'
    out = ["# HELP calmon_cluster_owned_partitions Partitions this worker owns.",
           "# TYPE calmon_cluster_owned_partitions gauge",
           f"calmon_cluster_owned_partitions{{{base}}} {len(owned)}",
           "# HELP calmon_cluster_lag_records Records behind the partition's end, per owned partition.",
           "# TYPE calmon_cluster_lag_records gauge"]
    out += [f'calmon_cluster_lag_records{{{base},partition="{escape(k)}"}} {int(v)}' for k, v in sorted(lag.items())]
    if position is not None:
        out += ["# HELP calmon_cluster_position Next offset to read, per owned partition.",
                "# TYPE calmon_cluster_position gauge"]
        out += [f'calmon_cluster_position{{{base},partition="{escape(k)}"}} {int(v)}'
                for k, v in sorted(position.items()) if k in owned]
    if models is not None:
        out += ["# HELP calmon_cluster_owned_models Models whose statistics this evaluator owns.",
                "# TYPE calmon_cluster_owned_models gauge", f"calmon_cluster_owned_models{{{base}}} {models}"]
    if restore_seconds is not None:
        out += ["# HELP calmon_cluster_restore_seconds Duration of the last partition restore.",
                "# TYPE calmon_cluster_restore_seconds gauge",
                f"calmon_cluster_restore_seconds{{{base}}} {restore_seconds:.6f}"]
    return out


@dataclass
class IngestMetrics:
    """Counters of one ingest worker (written by its loop, read by the HTTP thread: plain ints and copies)."""

    worker: str
    owned: list[str] = field(default_factory=list)
    lag: dict[str, int] = field(default_factory=dict)
    records: dict[str, int] = field(default_factory=dict)
    ranges: int = 0
    fenced: int = 0
    errors: int = 0
    delta_records: int = 0
    delta_bytes: int = 0
    rejected: dict[str, int] = field(default_factory=dict)
    restore_seconds: float | None = None
    restores: int = 0
    #: next offset of each owned partition (the state's)
    position: dict[str, int] = field(default_factory=dict)
    #: repairs of the consumer group (``calmon_cluster_group_repairs_total``, :mod:`connectors.kafka.groupwatch`)
    group_repairs: int = 0
    #: state records skipped (``calmon_cluster_bad_records_total``)
    bad: BadRecords = field(init=False)

    def __post_init__(self) -> None:
        self.bad = BadRecords("ingest", self.worker)

    def restored(self, seconds: float, partitions: int) -> None:
        self.restores += partitions
        self.restore_seconds = seconds

    def completed(self, key: str, rng: Range, applied: Applied, delta_bytes: int) -> None:
        self.ranges += 1
        self.position[key] = rng.end
        n = sum(applied.counters.records.values())
        self.records[key] = self.records.get(key, 0) + n
        self.delta_records += len(applied.deltas)
        self.delta_bytes += delta_bytes
        for reason, k in applied.counters.rejected.items():
            self.rejected[reason] = self.rejected.get(reason, 0) + k

    def update_source(self, source: KafkaSource) -> None:
        self.lag = dict(source.lag())
        self.group_repairs = source.group_watch.repairs

    def render(self) -> bytes:
        base = f'stage="ingest",worker="{escape(self.worker)}"'
        lines = render_ownership("ingest", self.worker, list(self.owned), dict(self.lag), None, self.restore_seconds,
                                 dict(self.position))
        counters: list[tuple[str, str, Any]] = [
            ("ranges", "Ranges committed (one Kafka transaction each).", self.ranges),
            ("fenced", "Partitions dropped because a newer owner fenced this worker's transactional id.",
             self.fenced),
            ("errors", "Ranges abandoned on an internal-topic error (restored from the state topic).", self.errors),
            ("restores", "Partitions restored from the state topic.", self.restores),
            ("delta_records", "Delta records published.", self.delta_records),
            ("delta_bytes", "Bytes of delta records published.", self.delta_bytes),
            ("group_repairs", GROUP_REPAIRS_HELP, self.group_repairs)]
        for name, help_, value in counters:
            lines += [f"# HELP calmon_cluster_{name}_total {help_}", f"# TYPE calmon_cluster_{name}_total counter",
                      f"calmon_cluster_{name}_total{{{base}}} {value}"]
        lines += ["# HELP calmon_cluster_records_total Input records completed, per partition.",
                  "# TYPE calmon_cluster_records_total counter"]
        lines += [f'calmon_cluster_records_total{{{base},partition="{escape(k)}"}} {v}'
                  for k, v in sorted(dict(self.records).items())]
        lines += ["# HELP calmon_cluster_rejected_total Records rejected by the decoder, per reason.",
                  "# TYPE calmon_cluster_rejected_total counter"]
        lines += [f'calmon_cluster_rejected_total{{{base},reason="{escape(k)}"}} {v}'
                  for k, v in sorted(dict(self.rejected).items())]
        lines += self.bad.render()
        return ("\n".join(lines) + "\n").encode()
