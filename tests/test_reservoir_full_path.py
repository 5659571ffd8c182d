"""Reservoir.update on a full sample takes a shorter route (only the rows that replace a slot): the same rows,
count and generator state as the sequential Algorithm R, whatever the split into updates."""

from __future__ import annotations

import numpy as np
import pytest

from calmon.stats.reservoir import Reservoir


def _sequential(capacity: int, rows: np.ndarray, seed: int) -> tuple[np.ndarray, int]:
    """Algorithm R one row at a time with the reservoir's draws (one uniform per row, owed while filling)."""
    rng = np.random.default_rng(seed)
    u = rng.random(len(rows))
    data = np.zeros((min(capacity, len(rows)), rows.shape[1]))
    for t in range(len(rows)):
        if t < capacity:
            data[t] = rows[t]
        else:
            slot = int(np.floor(u[t] * (t + 1)))
            if slot < capacity:
                data[slot] = rows[t]
    return data, len(rows)


@pytest.mark.parametrize("capacity,sizes", [(8, [3, 5, 100, 1, 40]), (16, [20, 300, 7]), (5, [5, 5, 5, 2000]),
                                            (256, [300, 2600, 2600, 13])])
def test_full_reservoir_matches_sequential(capacity: int, sizes: list[int]) -> None:
    rng = np.random.default_rng(capacity)
    rows = np.column_stack([rng.random(sum(sizes)), rng.integers(0, 2, sum(sizes))]).astype(np.float64)
    r = Reservoir(capacity=capacity, width=2, seed=3)
    at = 0
    for m in sizes:
        r.update(rows[at:at + m])
        at += m
    expect, seen = _sequential(capacity, rows, 3)
    assert r.seen == seen
    np.testing.assert_array_equal(r.rows, expect)
    one = Reservoir(capacity=capacity, width=2, seed=3)
    one.update(rows)
    np.testing.assert_array_equal(one.rows, r.rows)
    assert one.to_dict() == r.to_dict()
