"""A fold of a contiguous range of a sorted batch (the fold's case) reads views of the batch's arrays when it
is aggregated at once (PENDING_CELLS reached), copies when it waits: the bucket equals the eager reference
(tests/bucket_reference.py) on the same events bit for bit either way, and a waiting fold never holds on to the
batch's memory."""

import json

import numpy as np
import pytest
from bucket_reference import RefBucket

from calmon.state.buckets import BINCOUNT_CELLS, PENDING_CELLS, BucketStats, EventCells

SIZES = (1024, 15, 2, 20)


def _doc(b: BucketStats | RefBucket) -> str:
    return json.dumps(b.to_dict(), sort_keys=True)


@pytest.mark.parametrize("predictions", [False, True])
@pytest.mark.parametrize("ranges", [[(0, 3), (3, 900), (900, 905), (905, 3000)],  # waits, flushes at once, ...
                                    [(10, 2900)], [(0, 100), (100, 200), (200, 300), (300, 3000)]])
def test_ranges_equal_updates(predictions: bool, ranges: list[tuple[int, int]]) -> None:
    rng = np.random.default_rng(len(ranges))
    z = np.concatenate([rng.random(2990), [0.0, 1.0, 0.5, 1e-12, 1 - 1e-12] * 2])
    y = (rng.random(z.size) < z).astype(np.int64)
    batch = EventCells(SIZES, y, score=z, predictions=predictions)
    folded = BucketStats(2, bins=SIZES[0], reservoir=64)
    updated = RefBucket(2, bins=SIZES[0], reservoir=64)
    for a, b in ranges:
        folded.fold(batch, slice(a, b))
        for _, keys, sums, rows in folded._pending:  # what waits is a copy, not a view of the batch
            assert not np.shares_memory(keys, batch.keys) and not np.shares_memory(sums, batch.sums)
            assert rows is None or batch.rows is None or not np.shares_memory(rows, batch.rows)
        updated.update(score=z[a:b], labels=y[a:b], predictions=predictions)
    assert _doc(folded) == _doc(updated)
    assert 4 * 2000 >= PENDING_CELLS and 3 * 2000 >= BINCOUNT_CELLS  # the large ranges take the bincount route
