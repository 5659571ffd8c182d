"""The snapshots topic: write a partition's model snapshots plus its manifest, read back a partition's latest.

Records are sent to the snapshots partition equal to the deltas partition (explicit partition, so the
two topics need the same partition count); the topic is compacted, so each key's latest record stays.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from calmon.cluster.records import BadRecord, BadRecords
from calmon.cluster.snapshots import MANIFEST_KEY, Manifest, ModelSnapshot, SnapshotError
from calmon.cluster.topics import Producer
from connectors.kafka.admin import scan_topic

log = logging.getLogger("calmon.cluster")

__all__ = ["PartitionSnapshot", "SnapshotStore"]


@dataclass
class PartitionSnapshot:
    """What the snapshots topic holds for one deltas partition (latest record per key)."""

    manifest: Manifest | None = None
    models: dict[str, ModelSnapshot] = field(default_factory=dict)
    bad: int = 0


class SnapshotStore:
    """Writes and reads evaluator snapshots on ``topic`` (see the module docstring)."""

    def __init__(self, bootstrap: str, topic: str, client: Mapping[str, Any], producer: Producer) -> None:
        self.bootstrap, self.topic, self.client, self.producer = bootstrap, topic, dict(client), producer

    def write(self, partition: int, snapshots: list[ModelSnapshot], manifest: Manifest) -> int:
        """Send the model records, wait for their acks, then the manifest; the bytes written."""
        items = [(s.model.encode(), s.to_bytes()) for s in snapshots]
        items.append((MANIFEST_KEY, manifest.to_bytes()))
        kp = self.producer.producer
        futures = [kp.send(self.topic, key=k, value=v, partition=partition) for k, v in items[:-1]]
        kp.flush(timeout=30)
        for f in futures:
            f.get(timeout=30)
        kp.send(self.topic, key=items[-1][0], value=items[-1][1], partition=partition).get(timeout=30)
        return sum(len(v) for _, v in items)

    def read(self, partition: int, timeout: float = 30.0, bad: BadRecords | None = None) -> PartitionSnapshot | None:
        """The latest records of ``partition``; None when the topic could not be read to its end in time.

        A record that cannot be read (or whose key names another model) is skipped and counted in ``bad``;
        the partition then has no manifest, so its owner replays it from offset 0.
        """
        out = PartitionSnapshot()
        raw: dict[bytes, bytes] = {}

        def visit(record: Any) -> None:
            if record.partition == partition and record.key is not None:
                if record.value is None:
                    raw.pop(record.key, None)
                else:
                    raw[record.key] = record.value

        scan = scan_topic(self.bootstrap, self.topic, self.client, visit, timeout=timeout)
        if not scan.complete:
            return None
        for key, value in raw.items():
            try:
                if key == MANIFEST_KEY:
                    out.manifest = Manifest.from_bytes(value)
                else:
                    snap = ModelSnapshot.from_bytes(value)
                    if key != snap.model.encode():
                        raise SnapshotError(f"snapshot of {snap.model[:80]!r} under key {key[:80]!r}", "key_mismatch")
                    out.models[snap.model] = snap
            except SnapshotError as exc:
                out.bad += 1
                if bad is not None:
                    bad.count("snapshot", BadRecord(exc.reason, str(exc)), f"{self.topic}/{partition} key {key[:80]!r}")
                else:
                    log.warning("snapshots %s/%d: ignoring record %r: %s", self.topic, partition, key[:80], exc)
        if out.bad:  # a model we cannot read must be replayed: no manifest, so the partition restarts at 0
            out.manifest = None
        return out
