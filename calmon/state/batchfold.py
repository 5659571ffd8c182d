"""Fold a batch's binary events into the rings of many models at once (issue #15: per-batch, not per-model costs).

:meth:`ModelWindows.add <calmon.state.buckets.ModelWindows.add>` prepares one model's events
(:class:`~calmon.state.buckets.BinaryBatch`: every grid's cells and sums) and places them in buckets ring by
ring; at a thousand models a batch holds a handful of events per model, and those fixed costs (a few
numpy calls per model and per ring) dominated ingestion.  :func:`fold_binary` does the same for the events
of every binary model of a batch with one :class:`BinaryBatch`, places the events of every ring with one
vectorised :func:`~calmon.state.windows.bucket_cells` and splits them by (ring, bucket) with one sort; what
is left per ring is rolling it to the watermark and one :meth:`BucketStats.fold
<calmon.state.buckets.BucketStats.fold>` per bucket touched.  The buckets end up exactly as with
``ModelWindows.add`` called model by model (the same events, in the same order, in the same buckets; the
same ring versions), which ``tests/test_batchfold.py`` checks bucket document by bucket document.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from itertools import repeat

import numpy as np

from calmon.state.buckets import BinaryBatch, BucketStats, ModelWindows
from calmon.state.windows import TieredRing, bucket_cells

__all__ = ["fold_binary"]


def fold_binary(parts: Sequence[tuple[ModelWindows, np.ndarray]], ts: np.ndarray, segment: np.ndarray,
                score: np.ndarray, labels: np.ndarray | None, watermark: float, predictions: bool = False) -> None:
    """Add events of binary models to their rings: part ``(windows, rows)`` adds the events ``rows`` of the
    batch columns (``ts``, ``segment``, ``score``, ``labels``) to ``windows``.

    With ``labels``, the same as ``windows.add(ts[rows], segment[rows], labels[rows], score[rows], None,
    watermark, predictions)`` for each part in turn; without, ``windows.add_predictions(ts[rows],
    segment[rows], score[rows], None, watermark)``.  Each part's rows must be increasing; ``watermark`` must
    not be behind any event (the ingestor's is the largest event time seen), else the parts are added one
    by one.

    Examples
    --------
    >>> mw = ModelWindows("m", 2, [(60, 5), (600, 3)], segments=["web"], bins=64, reservoir=8)
    >>> other = ModelWindows("n", 2, [(60, 5), (600, 3)], bins=64, reservoir=8)
    >>> seg = np.array(["web", "app", "web", ""], dtype=object)
    >>> fold_binary([(mw, np.array([0, 1, 2])), (other, np.array([3]))], np.array([0.0, 10.0, 700.0, 5.0]), seg,
    ...             np.array([0.9, 0.2, 0.7, 0.5]), np.array([1, 0, 1, 1]), 700.0)
    >>> mw.rings["all"].window_sum(None).count, mw.rings["web"].window_sum(None).count, other.rings["all"].layout()
    (3, 2, [[], [0.0]])
    """
    if not parts or not ts.size:
        return
    if float(ts.max()) > watermark:  # not the ingestor's case: keep ModelWindows.add's semantics
        for mw, rows in parts:
            if labels is None:
                mw.add_predictions(ts[rows], segment[rows], score[rows], None, watermark)
            else:
                mw.add(ts[rows], segment[rows], labels[rows], score[rows], None, watermark, predictions)
        return
    by_sizes: dict[tuple[int, int, int], list[tuple[ModelWindows, np.ndarray]]] = {}
    for mw, rows in parts:
        if rows.size:
            by_sizes.setdefault(mw.sizes(), []).append((mw, rows))
    for sizes, group in by_sizes.items():
        batch = BinaryBatch(score, labels, sizes, predictions or labels is None)
        _place(group, segment, ts, watermark, batch)


#: Allow-lists up to this many segments are matched by comparing the segment column with each name.
_COMPARED = 3


def _entries(group: Sequence[tuple[ModelWindows, np.ndarray]], segment: np.ndarray
             ) -> tuple[np.ndarray, np.ndarray, int]:
    """Every (ring, event) pair of the parts: a ring *slot* ``part * width + j`` (``j = 0``: segment ``all``,
    ``j = 1 + k``: the part's k-th allow-listed segment) and the event, found per distinct allow-list (not per
    model), on the events of that list's models only: by comparing their segments with each name of a short
    list, by one dictionary lookup per event for a longer one."""
    rows = [r for _, r in group]
    ev = np.concatenate(rows)
    part = np.repeat(np.arange(len(group)), [r.size for r in rows])
    width = 1 + max(len(mw.segments) for mw, _ in group)
    lists: dict[tuple[str, ...], list[int]] = {}
    for p, (mw, _) in enumerate(group):
        if mw.segments:
            lists.setdefault(tuple(mw.segments), []).append(p)
    seg_of = np.full(ev.size, -1, dtype=np.int64)
    bounds = np.cumsum([0, *(r.size for r in rows)]).tolist()  # part p's events: ev[bounds[p]:bounds[p + 1]]
    for segs, ps in lists.items():
        # only the events of this list's models: a thousand distinct allow-lists cost one pass over the batch
        at: slice | np.ndarray = slice(None) if len(ps) == len(group) else np.concatenate(
            [np.arange(bounds[p], bounds[p + 1]) for p in ps])
        sub = segment[ev[at]]
        if len(segs) <= _COMPARED:  # a comparison per segment over the column beats a lookup per event
            k = np.full(sub.size, -1, dtype=np.int64)
            for j, name in enumerate(segs):
                k[sub == name] = j  # a name listed twice: its last position, as the dict below
        else:
            lut = {s: k for k, s in enumerate(segs)}
            k = np.fromiter(map(lut.get, sub.tolist(), repeat(-1)), np.int64, sub.size)
        seg_of[at] = k
    has = np.flatnonzero(seg_of >= 0)  # positions, gathered twice (cheaper than two boolean selections)
    first = part * width
    slots = np.concatenate([first, first[has] + 1 + seg_of[has]])
    return slots, np.concatenate([ev, ev[has]]), width


def _place(group: Sequence[tuple[ModelWindows, np.ndarray]], segment: np.ndarray, ts: np.ndarray,
           watermark: float, batch: BinaryBatch) -> None:
    """Roll every ring that gets events to ``watermark``, place all their events with one
    :func:`bucket_cells` and sort them by (ring, bucket) once, then land each ring's buckets with one
    :meth:`TieredRing.add` (a bucket's events are a contiguous slice of the sorted batch: no gather per bucket)."""
    slots, ev, width = _entries(group, segment)
    by_slot = _stable_argsort(slots)
    ss = slots[by_slot]
    heads = [0, *(np.flatnonzero(ss[1:] != ss[:-1]) + 1).tolist()]
    rings: list[TieredRing[BucketStats]] = []
    for s in ss[heads].tolist():
        mw = group[s // width][0]
        rings.append(mw.rings["all" if s % width == 0 else mw.segments[s % width - 1]])
    first = rings[0]
    tiers = first.tiers
    # after rolling, every ring must be at ``watermark`` with the same tiers (the ingestor's case); a ring
    # ahead of it would keep its own watermark
    if any(r.watermark > watermark or (r.tiers is not tiers and r.tiers != tiers) for r in rings):
        for ring in rings:
            ring.advance(watermark)
        for ring, a, b in zip(rings, heads, [*heads[1:], ss.size]):
            ring.add(ts[ev[by_slot[a:b]]], _through(batch.fold_into, ev[by_slot[a:b]]), watermark)
        return
    rid = np.repeat(np.arange(len(rings)), np.diff([*heads, ss.size]))  # dense ring index, in sorted order
    ev = ev[by_slot]
    tier, key, code = bucket_cells(tiers, ts[ev], first.bounds(watermark))
    order = _by_ring_then_code(rid, code, [*heads, ss.size])  # each (ring, bucket) keeps its events in batch order
    sr, sc = rid[order], code[order]
    cut = (np.flatnonzero((sr[1:] != sr[:-1]) | (sc[1:] != sc[:-1])) + 1).tolist()
    starts, ends = [0, *cut], [*cut, order.size]
    sorted_batch = batch.subset(ev[order])  # one gather for the whole batch
    heads_at = order[starts]
    groups: list[list[tuple[int, float, slice]]] = [[] for _ in rings]
    for r, t, k, a, b in zip(sr[starts].tolist(), tier[heads_at].tolist(), key[heads_at].tolist(), starts, ends):
        groups[r].append((t, k, slice(a, b)))  # a bucket's events: a contiguous range of the sorted batch
    fold = sorted_batch.fold_into
    for ring, g in zip(rings, groups):
        ring.add(None, fold, watermark, groups=g)  # rolls the ring to ``watermark`` first


#: Rings up to which the events are sorted by bucket ring by ring rather than by one lexsort of the batch.
_RING_SORTS = 32


def _stable_argsort(a: np.ndarray) -> np.ndarray:
    """``np.argsort(a, kind="stable")``; small non-negative integers as int16, which numpy radix-sorts."""
    if a.size and 0 <= int(a.min()) and int(a.max()) < 1 << 15:
        return np.argsort(a.astype(np.int16), kind="stable")
    return np.argsort(a, kind="stable")


def _by_ring_then_code(rid: np.ndarray, code: np.ndarray, bounds: list[int]) -> np.ndarray:
    """``np.lexsort((code, rid))`` for ``rid`` sorted (ring ``r`` holds the entries ``bounds[r]:bounds[r + 1]``):
    a stable sort of each ring's codes, which arrive nearly sorted (events in time order), for a few rings."""
    if len(bounds) - 1 > _RING_SORTS:
        return np.lexsort((code, rid))
    return np.concatenate([a + np.argsort(code[a:b], kind="stable") for a, b in zip(bounds, bounds[1:])])


def _through(fold: Callable[[BucketStats, np.ndarray], None], rows: np.ndarray
             ) -> Callable[[BucketStats, np.ndarray], None]:
    """``fold`` of the events ``rows[idx]`` (``idx``: into the ring's own events)."""
    def update(state: BucketStats, idx: np.ndarray) -> None:
        fold(state, rows[idx])
    return update
