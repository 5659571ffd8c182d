"""Book-keeping of a Kafka source's partitions: positions, assignment, pending partitions, gaps.

No I/O: :class:`PartitionBook` only decides (where a partition starts, which fetched records count,
which positions look truncated); :class:`~connectors.kafka.source.KafkaSource` talks to the client.
Its lock is shared with the client's rebalance callbacks, which may run on another thread.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from connectors.base import RecordMeta
from connectors.kafka.clients import Fetched
from connectors.kafka.origins import Run, RunOrigins
from connectors.kafka.positions import TP


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
    origins: RunOrigins | None = None
    meta: list[RecordMeta] | None = None
    position: dict[str, int] = field(default_factory=dict)
    gaps: list[Gap] = field(default_factory=list)


class PartitionBook:
    """Positions (``"topic/partition"`` -> next offset), assigned and pending (paused) partitions.

    Examples
    --------
    >>> from connectors.kafka.clients import Fetched
    >>> book = PartitionBook()
    >>> book.restore({"t/0": 5})
    []
    >>> book.assign([TP("t", 0)]); book.pending_now()
    [TP(topic='t', partition=0)]
    >>> book.start_offset(TP("t", 0), committed=3, policy="max")
    (5, 5)
    >>> book.positioned([TP("t", 0)])
    [TP(topic='t', partition=0)]
    >>> t = book.take(Fetched.of_partition(TP("t", 0), [b"a", None], [5, 6]), origins=True)
    >>> t.records, t.origins, t.position
    ([b'a', b''], ['t/0@5', 't/0@6'], {'t/0': 7})
    >>> book.take(Fetched.of_partition(TP("u", 0), [b"b"], [0]), origins=True).records  # not assigned: dropped
    []
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

    def take(self, fetched: Fetched, origins: bool) -> Taken:
        """Accept the records of assigned, positioned partitions and advance their positions, run by run.

        Records of a partition revoked or repositioned since they were fetched are dropped (they are read again
        from the right offset).  ``origins`` attaches :class:`~connectors.kafka.origins.RunOrigins`.
        """
        kept: list[Run] = []
        out = Taken()
        with self.lock:
            pos = self.pos
            for run in fetched.runs:
                tp = run.tp
                if tp in self.pending or tp not in self.assigned:
                    continue
                key = tp.key
                expected = pos.get(key)
                if expected is not None and run.first != expected:
                    out.gaps.append(Gap(key, expected, run.first))
                pos[key] = run.last + 1
                kept.append(run)
            out.position = dict(pos)
        if len(kept) == len(fetched.runs):  # the common case: the whole poll, nothing copied
            out.records, out.meta = fetched.values, fetched.metas
        else:
            moved: list[Run] = []
            for run in kept:
                moved.append(run.moved(len(out.records)))
                out.records += fetched.values[run.start:run.stop]
            if fetched.metas is not None:
                out.meta = [m for run in kept for m in fetched.metas[run.start:run.stop]]
            kept = moved
        if origins:
            out.origins = RunOrigins(kept)
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
