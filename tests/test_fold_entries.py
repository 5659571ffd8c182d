"""The pieces of :func:`calmon.state.buckets.fold`'s placement against plain references: the (ring slot,
event) pairs of ``_entries``, and the sorts that replaced numpy's general ones (issue #15) give the same orders."""

from __future__ import annotations

import random
from typing import Any

import numpy as np
import pytest

from calmon.state import buckets
from calmon.state.buckets import _entries


class _Windows:
    """What ``_entries`` reads of a :class:`~calmon.state.buckets.ModelWindows`: its allow-list."""

    def __init__(self, segments: list[str]) -> None:
        self.segments = segments


def _entries_ref(group: Any, segment: np.ndarray) -> tuple[np.ndarray, np.ndarray, int]:
    """By the definition, event by event: every event of part ``p`` in ring slot ``p * width`` (segment ``all``),
    then, in the same order, each event whose segment is on its part's allow-list in slot ``p * width + 1 + k``
    (``k``: the segment's last position in the list)."""
    width = 1 + max(len(mw.segments) for mw, _ in group)
    base: list[tuple[int, int]] = []
    extra: list[tuple[int, int]] = []
    for p, (mw, rows) in enumerate(group):
        for e in rows.tolist():
            base.append((p * width, e))
            ks = [k for k, name in enumerate(mw.segments) if name == segment[e]]
            if ks:
                extra.append((p * width + 1 + ks[-1], e))
    pairs = base + extra
    return (np.array([sl for sl, _ in pairs], dtype=np.int64), np.array([e for _, e in pairs], dtype=np.int64),
            width)


@pytest.mark.parametrize("seed", range(40))
def test_entries_follow_their_definition(seed: int) -> None:
    rng = random.Random(seed)
    names = ["web", "app", "ios", "tv", "car", "", "x", "y"]
    n = rng.choice([1, 5, 200])
    segment = np.array([rng.choice(names) for _ in range(n)], dtype=object)
    rows = np.arange(n)
    if rng.random() < 0.5:  # one part with every row, in order
        cut = [0, n]
    else:
        rng.shuffle(order := list(range(n)))
        cut = sorted({0, n, *rng.sample(range(n + 1), min(3, n))})
        rows = np.array(order)
    group: list[Any] = []
    for a, b in zip(cut, cut[1:]):
        allow = rng.sample(names[:6], rng.choice([0, 1, 2, 4, 5, 6]))
        if allow and rng.random() < 0.3:
            allow.append(allow[0])  # a duplicate: the later position wins
        group.append((_Windows(allow), np.sort(rows[a:b])))
    got, want = _entries(group, segment), _entries_ref(group, segment)
    assert got[2] == want[2] and np.array_equal(got[0], want[0]) and np.array_equal(got[1], want[1])
    assert got[0].dtype == want[0].dtype and got[1].dtype == want[1].dtype


@pytest.mark.parametrize("seed", range(30))
def test_sorts_are_numpys(seed: int) -> None:
    """The ring-by-ring sort and the int16 argsort give numpy's stable orders exactly."""
    rng = np.random.default_rng(seed)
    n = int(rng.choice([0, 1, 9, 3000]))
    hi = int(rng.choice([3, 1 << 15, 1 << 40]))
    slots = rng.integers(-2 if seed % 5 == 0 else 0, hi, n)
    assert np.array_equal(buckets._stable_argsort(slots), np.argsort(slots, kind="stable"))
    rings = int(rng.choice([1, 3, 40]))
    rid = np.sort(rng.integers(0, rings, n))
    bounds = [0, *(np.flatnonzero(rid[1:] != rid[:-1]) + 1).tolist(), n]
    code = rng.integers(0, 5, n) + (np.arange(n) // 100 if seed % 2 else 0) + (1 << 42) * rng.integers(0, 2, n)
    if n:
        assert np.array_equal(buckets._by_ring_then_code(rid, code, bounds), np.lexsort((code, rid)))
