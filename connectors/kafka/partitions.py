"""Book-keeping of a Kafka source's partitions: positions, assignment, pending partitions, gaps.

No I/O: :class:`PartitionBook` only decides (where a partition starts, which fetched records count,
which positions look truncated); :class:`~connectors.kafka.source.KafkaSource` talks to the client.
Its lock is shared with the client's rebalance callbacks, which may run on another thread.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from connectors.base import RecordMeta
from connectors.kafka.clients import Polled, RecordLike
from connectors.kafka.positions import TP, position_key


@dataclass
class Gap:
    """A partition whose first fetched offset is not its position: ``first < expected`` is a reset."""

    key: str
    expected: int
    first: int


@dataclass
class Taken:
    """Records :meth:`PartitionBook.take` accepted from one poll."""

    records: list[bytes] = field(default_factory=list)
    origins: list[str] | None = None
    meta: list[RecordMeta] | None = None
    position: dict[str, int] = field(default_factory=dict)
    gaps: list[Gap] = field(default_factory=list)


class PartitionBook:
    """Positions (``"topic/partition"`` -> next offset), assigned and pending (paused) partitions.

    Examples
    --------
    >>> from connectors.kafka.clients import Record
    >>> book = PartitionBook()
    >>> book.restore({"t/0": 5})
    []
    >>> book.assign([TP("t", 0)]); book.pending_now()
    [TP(topic='t', partition=0)]
    >>> book.start_offset(TP("t", 0), committed=3, policy="max")
    (5, 5)
    >>> book.positioned([TP("t", 0)])
    [TP(topic='t', partition=0)]
    >>> t = book.take({TP("t", 0): [Record(5, b"a"), Record(6, None)]}, origins=True)
    >>> t.records, t.origins, t.position
    ([b'a', b''], ['t/0@5', 't/0@6'], {'t/0': 7})
    >>> from connectors.base import RecordMeta
    >>> book.take({TP("t", 0): [Record(7, b"b", RecordMeta(1, b"k"))]}, False, lambda rs: [r.meta for r in rs]).meta
    [RecordMeta(timestamp_ms=1, key=b'k', headers=())]
    """

    def __init__(self) -> None:
        self.lock = threading.RLock()
        self.pos: dict[str, int] = {}
        self.assigned: set[TP] = set()
        self.pending: set[TP] = set()
        self._suspects: set[TP] = set()

    def position(self) -> dict[str, int]:
        with self.lock:
            return dict(self.pos)

    def restore(self, position: Mapping[str, int]) -> list[TP]:
        """Adopt a checkpointed position; assigned partitions become pending (returned: to pause)."""
        with self.lock:
            self.pos = dict(position)
            self.pending.update(self.assigned)
            return sorted(self.assigned)

    def assign(self, tps: Iterable[TP]) -> None:
        with self.lock:
            self.assigned.update(tps)
            self.pending.update(tps)

    def revoke(self, tps: Iterable[TP]) -> None:
        with self.lock:
            self.assigned.difference_update(tps)
            self.pending.difference_update(tps)

    def clear(self) -> None:
        """Forget the assignment (the consumer is gone); positions stay."""
        with self.lock:
            self.assigned.clear()
            self.pending.clear()

    def assigned_keys(self) -> list[str]:
        with self.lock:
            return sorted(tp.key for tp in self.assigned)

    def pending_now(self) -> list[TP]:
        """Pending partitions still assigned (revoked ones are dropped)."""
        with self.lock:
            self.pending.intersection_update(self.assigned)
            return sorted(self.pending)

    def needs_committed(self, tps: list[TP], policy: str) -> list[TP]:
        """Partitions whose start depends on the group's committed offset under ``policy``."""
        with self.lock:
            return [tp for tp in tps if policy == "max" or tp.key not in self.pos]

    def start_offset(self, tp: TP, committed: int | None, policy: str) -> tuple[int | None, int | None]:
        """``(start, checkpointed)``: max(checkpointed, committed), or the checkpoint alone under
        policy ``"checkpoint"``; start is None when neither is known (the client's reset policy applies)."""
        with self.lock:
            own = self.pos.get(tp.key)
            if policy == "checkpoint" and own is not None:
                committed = None
            candidates = [o for o in (own, committed) if o is not None]
            if not candidates:
                return None, own
            self.pos[tp.key] = max(candidates)
            return self.pos[tp.key], own

    def positioned(self, tps: list[TP]) -> list[TP]:
        """Mark ``tps`` as positioned; return those still assigned (to resume)."""
        with self.lock:
            self.pending.difference_update(tps)
            return [tp for tp in tps if tp in self.assigned]

    def take(
        self, polled: Polled, origins: bool, metas: Callable[[Sequence[RecordLike]], list[RecordMeta]] | None = None
    ) -> Taken:
        """Accept the records of assigned, positioned partitions and advance their positions.

        ``metas`` (the client's :meth:`~connectors.kafka.clients.ConsumerClient.metas`) fills
        :attr:`Taken.meta`, one per record.
        """
        out = Taken(origins=[] if origins else None, meta=None if metas is None else [])
        with self.lock:
            for tp in sorted(polled):
                rs = polled[tp]
                if not rs or tp in self.pending or tp not in self.assigned:
                    continue  # fetched before a revoke/seek: read again from the right offset
                key = position_key(tp.topic, tp.partition)
                expected = self.pos.get(key)
                if expected is not None and rs[0].offset != expected:
                    out.gaps.append(Gap(key, expected, rs[0].offset))
                out.records.extend([r.value if r.value is not None else b"" for r in rs])
                if out.origins is not None:
                    out.origins.extend([f"{key}@{r.offset}" for r in rs])
                if out.meta is not None and metas is not None:
                    out.meta.extend(metas(rs))
                self.pos[key] = rs[-1].offset + 1
            out.position = dict(self.pos)
        return out

    def lag(self, highwater: Callable[[TP], int | None]) -> dict[str, int]:
        """Records behind ``highwater(tp)`` per assigned partition with a known position and watermark."""
        with self.lock:
            assigned = list(self.assigned)
            pos = dict(self.pos)
        out: dict[str, int] = {}
        for tp in assigned:
            hw = highwater(tp)
            if hw is not None and tp.key in pos:
                out[tp.key] = max(0, hw - pos[tp.key])
        return out

    def truncated(self, highwater: Callable[[TP], int | None]) -> list[tuple[TP, int]]:
        """Partitions whose position lies beyond the high watermark now *and* at the previous call.

        Examples
        --------
        >>> book = PartitionBook(); _ = book.restore({"t/0": 9}); book.assign([TP("t", 0)])
        >>> _ = book.positioned([TP("t", 0)])
        >>> book.truncated(lambda tp: 0), book.truncated(lambda tp: 0)
        ([], [(TP(topic='t', partition=0), 9)])
        """
        with self.lock:
            tps = [tp for tp in self.assigned if tp not in self.pending]
            pos = dict(self.pos)
        suspects = set()
        for tp in tps:
            hw = highwater(tp)
            if hw is not None and tp.key in pos and pos[tp.key] > hw:
                suspects.add(tp)
        confirmed = suspects & self._suspects
        self._suspects = suspects - confirmed
        return [(tp, pos[tp.key]) for tp in sorted(confirmed)]

    def reset(self, tp: TP, offset: int, seek: Callable[[TP, int], Any]) -> bool:
        """Move an assigned ``tp`` to ``offset`` (calling ``seek`` under the lock); False if it was revoked."""
        with self.lock:
            if tp not in self.assigned:
                return False
            seek(tp, offset)
            self.pos[tp.key] = offset
            return True
