"""The snapshots topic: write a partition's model snapshots plus its manifest, read back a partition's latest.

Records are sent to the snapshots partition equal to the deltas partition (explicit partition, so the
two topics need the same partition count); the topic is compacted, so each key's latest record stays.
A new owner reads only the snapshots partitions it was given (never the whole topic), counting the
records it read (:attr:`SnapshotStore.records_read`).

**Chunks.** A model snapshot larger than :data:`CHUNK` bytes (below every broker's default
``max.message.bytes``, 1 MiB) is written as chunk records under keys ``model \\x00 generation \\x00 i``
(binary frames of kind ``C``, :mod:`calmon.cluster.frames`: model, generation, index and count in the
header, the bytes as payload), then -- once every chunk is acknowledged -- a *head* record under the model's
key (a frame of kind ``H``: generation, chunk count, size and CRC-32).  The head is what a restore starts
from, so a write that dies half way leaves the previous head and its chunks valid.  After the new head is
acknowledged the previous generation's chunks get tombstones (compaction removes them).  A model name never
contains a NUL byte (the decoder admits ``[A-Za-z0-9_.:/-]``), so chunk keys cannot collide with models.
"""

from __future__ import annotations

import json
import logging
import threading
import uuid
import zlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import msgspec

from calmon.cluster.frames import is_frame, pack_frame, unpack_frame
from calmon.cluster.records import BadRecord, BadRecords
from calmon.cluster.snapshots import MANIFEST_KEY, MAX_SNAPSHOT, Manifest, ModelSnapshot, SnapshotError
from calmon.cluster.topics import Producer
from connectors.kafka.admin import scan_topic

log = logging.getLogger("calmon.cluster")

__all__ = ["CHUNK", "PartitionSnapshot", "SnapshotStore", "chunk_key"]

#: Largest snapshot written as one record; a larger one is split into chunks of this size.
CHUNK = 1_000_000
_CHUNK_KIND, _HEAD_KIND = b"C", b"H"
_CHUNK_VERSION = 1


class _ChunkDoc(msgspec.Struct):
    model: str
    gen: str
    index: int
    count: int
    size: int


class _HeadDoc(msgspec.Struct):
    model: str
    gen: str
    chunks: int
    size: int
    crc32: int


def chunk_key(model: str, gen: str, index: int) -> bytes:
    """The key of chunk ``index`` of generation ``gen`` of a model's snapshot."""
    return b"\x00".join((model.encode(), gen.encode(), str(index).encode()))


@dataclass
class PartitionSnapshot:
    """What the snapshots topic holds for one deltas partition (latest record per key)."""

    manifest: Manifest | None = None
    models: dict[str, ModelSnapshot] = field(default_factory=dict)
    bad: int = 0
    #: model -> generation of its chunked snapshot (the chunks a later write of this owner tombstones)
    generations: dict[str, tuple[str, int]] = field(default_factory=dict)


class SnapshotStore:
    """Writes and reads evaluator snapshots on ``topic`` (see the module docstring)."""

    def __init__(self, bootstrap: str, topic: str, client: Mapping[str, Any], producer: Producer) -> None:
        self.bootstrap, self.topic, self.client, self.producer = bootstrap, topic, dict(client), producer
        #: records read by :meth:`read` (all calls): a restore reads its own partitions only
        self.records_read = 0
        #: model -> (generation, chunks) of its last chunked snapshot written or read here
        self.generations: dict[str, tuple[str, int]] = {}
        self._lock = threading.Lock()

    def write(self, partition: int, snapshots: list[ModelSnapshot], manifest: Manifest) -> int:
        """Send the model records (chunks first, their heads once the chunks are acknowledged), then the
        manifest, then tombstones for replaced chunks; the bytes written."""
        kp = self.producer.producer
        first: list[tuple[bytes, bytes]] = []  # whole snapshots and chunks
        heads: list[tuple[bytes, bytes]] = []
        replaced: list[bytes] = []
        new: dict[str, tuple[str, int]] = {}
        for s in snapshots:
            data = s.to_bytes()
            key = s.model.encode()
            if len(data) <= CHUNK:
                first.append((key, data))
            else:
                gen = uuid.uuid4().hex[:16]
                pieces = [data[i:i + CHUNK] for i in range(0, len(data), CHUNK)]
                for i, piece in enumerate(pieces):
                    header = msgspec.json.encode(_ChunkDoc(s.model, gen, i, len(pieces), len(piece)))
                    first.append((chunk_key(s.model, gen, i), pack_frame(_CHUNK_KIND, _CHUNK_VERSION, header, piece)))
                header = msgspec.json.encode(_HeadDoc(s.model, gen, len(pieces), len(data), zlib.crc32(data)))
                heads.append((key, pack_frame(_HEAD_KIND, _CHUNK_VERSION, header, b"")))
                new[s.model] = (gen, len(pieces))
            old = self.generations.get(s.model)
            if old is not None:
                replaced += [chunk_key(s.model, old[0], i) for i in range(old[1])]
        for batch in (first, [*heads, (MANIFEST_KEY, manifest.to_bytes())]):
            futures = [kp.send(self.topic, key=k, value=v, partition=partition) for k, v in batch]
            kp.flush(timeout=60)
            for f in futures:
                f.get(timeout=60)
        for s in snapshots:
            self.generations.pop(s.model, None)
        self.generations.update(new)
        if replaced:  # the new heads are acknowledged: the old chunks are garbage (compaction drops them)
            futures = [kp.send(self.topic, key=k, value=None, partition=partition) for k in replaced]
            kp.flush(timeout=60)
            for f in futures:
                f.get(timeout=60)
        return sum(len(v) for _, v in first) + sum(len(v) for _, v in heads)

    def forget(self, models: set[str]) -> None:
        """Stop tracking the chunks of models this evaluator no longer owns (their next owner replaces them)."""
        for m in models:
            self.generations.pop(m, None)

    def read(self, partition: int, timeout: float = 30.0, bad: BadRecords | None = None) -> PartitionSnapshot | None:
        """The latest records of ``partition`` (that partition only); None when it could not be read to its end
        in time.

        A record that cannot be read (or whose key names another model, or a chunked snapshot missing a chunk)
        is skipped and counted in ``bad``; the partition then has no manifest, so its owner replays it from
        offset 0.
        """
        out = PartitionSnapshot()
        raw: dict[bytes, bytes] = {}
        seen = 0

        def visit(record: Any) -> None:
            nonlocal seen
            seen += 1
            if record.partition == partition and record.key is not None:
                if record.value is None:
                    raw.pop(record.key, None)
                else:
                    raw[record.key] = record.value

        scan = scan_topic(self.bootstrap, self.topic, self.client, visit, timeout=timeout, partitions=[partition])
        with self._lock:
            self.records_read += seen
        if not scan.complete:
            return None
        for key, value in raw.items():
            if b"\x00" in key[1:]:
                continue  # a chunk: read through its head
            try:
                if key == MANIFEST_KEY:
                    out.manifest = Manifest.from_bytes(value)
                    continue
                if is_frame(value):
                    value = self._assemble(key, value, raw, out)
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
        self.generations.update(out.generations)
        return out

    def _assemble(self, key: bytes, value: bytes, raw: Mapping[bytes, bytes], out: PartitionSnapshot) -> bytes:
        """The bytes of a chunked snapshot from its head record (:class:`SnapshotError` naming what is wrong)."""
        try:
            head = _parse(value, _HEAD_KIND, _HeadDoc, "snapshot head")
            if head.chunks < 1 or head.size > MAX_SNAPSHOT or head.chunks > head.size // CHUNK + 1:
                raise BadRecord("invalid", f"snapshot head of {head.chunks} chunks, {head.size} bytes")
            parts = []
            for i in range(head.chunks):
                data = raw.get(chunk_key(head.model, head.gen, i))
                if data is None:
                    raise BadRecord("format", f"chunk {i} of {head.chunks} of snapshot {head.gen} is missing")
                frame = unpack_frame(data, _CHUNK_KIND, (_CHUNK_VERSION,), _chunk_size, "snapshot chunk")
                c = msgspec.json.decode(frame.header, type=_ChunkDoc)
                if (c.model, c.gen, c.index, c.count) != (head.model, head.gen, i, head.chunks):
                    raise BadRecord("key_mismatch", f"chunk {i} of snapshot {head.gen} holds {c.model[:80]!r} "
                                                    f"{c.gen[:20]} {c.index}/{c.count}")
                parts.append(frame.payload)
            data = b"".join(parts)
            if len(data) != head.size or zlib.crc32(data) != head.crc32:
                raise BadRecord("format", f"snapshot {head.gen} of {len(data)} bytes does not match its head "
                                          f"({head.size} bytes, CRC-32 {head.crc32})")
        except BadRecord as exc:
            raise SnapshotError(f"chunked snapshot under key {key[:80]!r}: {exc}", exc.reason) from None
        out.generations[head.model] = (head.gen, head.chunks)
        return data


def _chunk_size(header: bytes) -> int:
    return _parse_header(header, _ChunkDoc, "snapshot chunk").size


def _parse(value: bytes, kind: bytes, into: type[Any], what: str) -> Any:
    frame = unpack_frame(value, kind, (_CHUNK_VERSION,), lambda header: 0, what)
    return _parse_header(frame.header, into, what)


def _parse_header(header: bytes, into: type[Any], what: str) -> Any:
    try:
        return msgspec.json.decode(header, type=into)
    except msgspec.ValidationError as exc:
        raise BadRecord("schema", f"{what}: {exc}") from None
    except (msgspec.DecodeError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise BadRecord("not_json", f"{what} is not JSON: {exc}") from None
