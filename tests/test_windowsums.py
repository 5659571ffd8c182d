"""Incremental window sums (calmon/state/windows.py) equal the from-scratch ``TieredRing.window_sums``."""

from __future__ import annotations

import numpy as np
import pytest

from calmon.state.buckets import BucketStats, ModelWindows
from calmon.state.windows import RingSums, capture

TIERS = [(60.0, 5), (600.0, 3), (3600.0, 2)]
LENGTHS = {"2m": 120.0, "5m": 300.0, "30m": 1800.0, "2h": 7200.0, "all": None}


def _windows() -> ModelWindows:
    # a small reservoir, so that merging reservoirs samples (the order of merges matters)
    return ModelWindows("m", 2, TIERS, segments=["web"], bins=64, reservoir=16)


def _add(mw: ModelWindows, rng: np.random.Generator, now: float) -> None:
    n = int(rng.integers(1, 40))
    late = rng.random() < 0.3  # sometimes events well behind the watermark (stable buckets change)
    ts = now - rng.exponential(900.0 if late else 40.0, n)
    seg = np.where(rng.random(n) < 0.5, "web", "app").astype(object)
    z = rng.random(n)
    y = (rng.random(n) < z).astype(np.int64)
    mw.add(ts, seg, y, z, None, now)


def _doc(sums: dict[str, BucketStats]) -> dict[str, object]:
    return {k: v.to_dict() for k, v in sums.items()}


@pytest.mark.parametrize("seed", range(4))
def test_incremental_sums_equal_from_scratch_after_adds_advances_and_restores(seed: int) -> None:
    rng = np.random.default_rng(seed)
    mw = _windows()
    kept: dict[str, RingSums | None] = {}
    now = 10_000.0
    restarts = []
    for step in range(40):
        now += float(rng.choice([5.0, 20.0, 61.0, 700.0]))  # within a bucket, across tier-0 and tier-1 bounds
        for _ in range(int(rng.integers(1, 4))):
            _add(mw, rng, now)
        if rng.random() < 0.1:  # a restore: new ring objects with new versions
            mw = ModelWindows.from_dict(mw.to_dict())
            kept = {}
        wm = now + float(rng.choice([0.0, 30.0]))  # the joiner's watermark may be ahead of the ring's
        for seg, ring in mw.rings.items():
            plan = capture(ring, LENGTHS, wm, kept.get(seg), BucketStats.copy)
            restarts.append(plan.restart)
            if rng.random() < 0.5:  # the ring changes between the capture (under the lock) and the merge
                _add(mw, rng, now)
                expected = None
            else:
                expected = _doc(ring.window_sums(LENGTHS, watermark=wm))
            sums, kept[seg] = plan.run()
            if expected is not None:
                assert _doc(sums) == expected, (step, seg)
    assert any(r > 0 for r in restarts) and any(r < len(LENGTHS) for r in restarts)  # reuse and recomputation


def test_a_live_event_reuses_every_stable_sum_and_copies_only_hot_buckets() -> None:
    rng = np.random.default_rng(1)
    mw = _windows()
    for now in np.arange(10_000.0, 20_000.0, 45.0):
        _add(mw, rng, float(now))
    ring = mw.rings["all"]
    _, keep = capture(ring, LENGTHS, None, None, BucketStats.copy).run()
    ring.add(np.array([ring.watermark]), lambda b, i: b.update(np.array([0.5]), None, np.array([1])))
    plan = capture(ring, LENGTHS, None, keep, BucketStats.copy)
    assert plan.restart == len(LENGTHS) and plan.todo == []
    assert len(plan.hot) <= 2
    assert _doc(plan.run()[0]) == _doc(ring.window_sums(LENGTHS))


def test_counts_match_the_windows_contents() -> None:
    rng = np.random.default_rng(2)
    mw = _windows()
    for now in np.arange(10_000.0, 14_000.0, 30.0):
        _add(mw, rng, float(now))
    sums = mw.rings["all"].window_sums(LENGTHS)
    counts = [sums[k].count for k in LENGTHS]
    assert counts == sorted(counts) and counts[-1] > counts[0] > 0
    total = sum(b.count for _, _, _, b in mw.rings["all"].entries())
    assert sums["all"].count == total
