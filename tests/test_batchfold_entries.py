"""The pieces of :func:`calmon.agent.batchfold.fold_binary`'s placement against plain references: the (ring slot,
event) pairs of ``_entries``, and the sorts that replaced numpy's general ones (issue #15) give the same orders."""

from __future__ import annotations

import random
from itertools import repeat
from typing import Any

import numpy as np
import pytest

from calmon.agent import batchfold
from calmon.agent.batchfold import _entries


class _Windows:
    """What ``_entries`` reads of a :class:`~calmon.agent.buckets.ModelWindows`: its allow-list."""

    def __init__(self, segments: list[str]) -> None:
        self.segments = segments


def _entries_ref(group: Any, segment: np.ndarray) -> tuple[np.ndarray, np.ndarray, int]:
    rows = [r for _, r in group]
    ev = np.concatenate(rows)
    part = np.repeat(np.arange(len(group)), [r.size for r in rows])
    width = 1 + max(len(mw.segments) for mw, _ in group)
    lists: dict[tuple[str, ...], list[int]] = {}
    for p, (mw, _) in enumerate(group):
        if mw.segments:
            lists.setdefault(tuple(mw.segments), []).append(p)
    seg_of = np.full(ev.size, -1, dtype=np.int64)
    if lists:
        names = segment[ev].tolist()
        for segs, ps in lists.items():
            lut = {s: k for k, s in enumerate(segs)}
            k = np.fromiter(map(lut.get, names, repeat(-1)), np.int64, ev.size)
            mine = slice(None) if len(ps) == len(group) else np.isin(part, ps)
            seg_of[mine] = k[mine]
    has = seg_of >= 0
    slots = np.concatenate([part * width, part[has] * width + 1 + seg_of[has]])
    return slots, np.concatenate([ev, ev[has]]), width


@pytest.mark.parametrize("seed", range(40))
def test_entries_are_the_dictionary_lookup(seed: int) -> None:
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
    assert np.array_equal(batchfold._stable_argsort(slots), np.argsort(slots, kind="stable"))
    rings = int(rng.choice([1, 3, 40]))
    rid = np.sort(rng.integers(0, rings, n))
    bounds = [0, *(np.flatnonzero(rid[1:] != rid[:-1]) + 1).tolist(), n]
    code = rng.integers(0, 5, n) + (np.arange(n) // 100 if seed % 2 else 0) + (1 << 42) * rng.integers(0, 2, n)
    if n:
        assert np.array_equal(batchfold._by_ring_then_code(rid, code, bounds), np.lexsort((code, rid)))
