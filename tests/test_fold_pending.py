"""Folded events (BucketStats.fold, aggregated lazily by _flush) against the eager updates on the same events.

The pending folds of a bucket mix labeled batches with and without the prediction-side grid, prediction-only
batches, whole batches, index arrays and slices (fold_binary's ranges of a sorted batch); their aggregation
must equal BucketStats.update / update_predictions called on the same events in the same order, bit for bit.
"""

import json

import numpy as np
import pytest

from calmon.state.buckets import PENDING_CELLS, BinaryBatch, BucketStats

SIZES = (64, 15, 20)


def _doc(b: BucketStats) -> str:
    return json.dumps(b.to_dict(), sort_keys=True)


@pytest.mark.parametrize("events", [3, 40, 400])  # a handful per fold; sums over the bincount path; flushes on the way
@pytest.mark.parametrize("seed", [0, 1])
def test_folds_equal_updates(events: int, seed: int) -> None:
    rng = np.random.default_rng(seed)
    folded, updated = BucketStats(2, bins=64, reservoir=16), BucketStats(2, bins=64, reservoir=16)
    flushed = False
    for step in range(12):
        n = int(rng.integers(1, events + 1)) + 2
        z = rng.random(n)
        y = (rng.random(n) < z).astype(np.int64)
        kind = step % 3  # labeled + prediction side, labeled only, predictions only
        batch = BinaryBatch(z, None if kind == 2 else y, SIZES, kind == 0)
        a = int(rng.integers(0, n - 1))
        b = int(rng.integers(a + 1, n + 1))
        for idx in (slice(a, b), np.arange(a, b), np.arange(n), np.array([a, b - 1])):
            folded.fold(batch, idx)
            flushed |= not folded._pending
            if kind == 2:
                updated.update_predictions(score=z[idx])
            else:
                updated.update(score=z[idx], labels=y[idx], predictions=kind == 0)
    if events == 3:
        assert not flushed  # every fold still pending at the read
    if events == 400:
        assert flushed and PENDING_CELLS <= 4 * 400  # PENDING_CELLS reached: folds aggregated before the read
    assert _doc(folded) == _doc(updated)
    assert folded.count == updated.count > 0


def test_take_of_a_slice_is_a_copied_range() -> None:
    z = np.linspace(0.05, 0.95, 7)
    batch = BinaryBatch(z, np.array([0, 1, 1, 0, 1, 0, 1]), SIZES, True)
    keys, sums, rows = batch.take(slice(2, 5))
    ref = batch.take(np.arange(2, 5))
    assert rows is not None and ref[2] is not None
    assert np.array_equal(keys, ref[0]) and np.array_equal(sums, ref[1]) and np.array_equal(rows, ref[2])
    assert not np.shares_memory(keys, batch.keys) and not np.shares_memory(sums, batch.sums)
    whole = batch.take(slice(0, 7))
    assert whole[0] is batch.keys and whole[1] is batch.sums  # the whole batch: the arrays themselves
