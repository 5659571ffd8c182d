"""Folded events (BucketStats.fold, aggregated lazily by _flush) against an eager reference on the same events.

The pending folds of a bucket mix labeled batches with and without the prediction-side grid, prediction-only
batches, whole batches, index arrays and slices (the fold's ranges of a sorted batch), of binary and multiclass
models; their aggregation must equal the grids, reservoir and level sets updated eagerly on the same events in
the same order (tests/bucket_reference.py: ModelStats.update, ScoreGrid.update), bit for bit.
"""

import json

import numpy as np
import pytest
from bucket_reference import RefBucket

from calmon.state.buckets import PENDING_CELLS, BucketStats, EventCells

SIZES = (64, 15, 2, 20)


def _doc(b: BucketStats | RefBucket) -> str:
    return json.dumps(b.to_dict(), sort_keys=True)


@pytest.mark.parametrize("events", [3, 40, 400])  # a handful per fold; sums over the bincount path; flushes on the way
@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("classes", [2, 4])
def test_folds_equal_updates(events: int, seed: int, classes: int) -> None:
    rng = np.random.default_rng(seed)
    levelset = 4 if classes > 2 else None  # a level set's bins are allocated fold by fold
    folded = BucketStats(classes, bins=64, reservoir=16, levelset_lambda=levelset)
    updated = RefBucket(classes, bins=64, reservoir=16, levelset_lambda=levelset)
    layout = (64, 15, classes, 20)
    for b in (folded, updated):  # a few level-set bins only: which ones overflow depends on how folds are split
        if b.stats.levelset is not None:
            b.stats.levelset.max_bins = 6
    flushed = False
    for step in range(12):
        n = int(rng.integers(1, events + 1)) + 2
        z = rng.random(n)
        probs = rng.dirichlet(np.ones(classes), n) if classes > 2 else None
        y = (rng.random(n) < z).astype(np.int64) if probs is None else rng.integers(0, classes, n)
        kind = step % 3  # labeled + prediction side, labeled only, predictions only
        score = z if probs is None else None
        batch = EventCells(layout, None if kind == 2 else y, score, probs, kind == 0)
        a = int(rng.integers(0, n - 1))
        b = int(rng.integers(a + 1, n + 1))
        for idx in (slice(a, b), np.arange(a, b), np.arange(n), np.array([a, b - 1])):
            folded.fold(batch, idx)
            flushed |= not folded._pending
            sc, pr = (None if score is None else score[idx]), (None if probs is None else probs[idx])
            if kind == 2:
                updated.update_predictions(score=sc, probs=pr)
            else:
                updated.update(score=sc, probs=pr, labels=y[idx], predictions=kind == 0)
    if events == 3:
        assert not flushed  # every fold still pending at the read
    if events == 400:
        assert flushed and PENDING_CELLS <= 4 * 400  # PENDING_CELLS reached: folds aggregated before the read
    assert _doc(folded) == _doc(updated)
    assert folded.count == updated.count > 0
    if levelset:
        ls = folded.stats.levelset
        assert ls is not None and ls.count == folded.count and ls.num_bins == 6 and ls.overflow_count > 0


def test_update_is_the_fold_of_its_events() -> None:
    """BucketStats.update / update_predictions (the fold of the events given) equal the eager reference."""
    rng = np.random.default_rng(3)
    ours, ref = BucketStats(3, bins=64, reservoir=8), RefBucket(3, bins=64, reservoir=8)
    for _ in range(5):
        probs, labels = rng.dirichlet(np.ones(3), 30), rng.integers(0, 3, 30)
        ours.update(probs=probs, labels=labels, predictions=True)
        ref.update(probs=probs, labels=labels, predictions=True)
        ours.update_predictions(probs=probs[:7])
        ref.update_predictions(probs=probs[:7])
    assert _doc(ours) == _doc(ref) and ours.count == 150 and ours.pred.count == 185
    with pytest.raises(ValueError, match="multiclass model: probs is required"):
        ours.update(score=np.array([0.5]), labels=np.array([1]))


def test_take_of_a_slice_is_a_copied_range() -> None:
    z = np.linspace(0.05, 0.95, 7)
    batch = EventCells(SIZES, np.array([0, 1, 1, 0, 1, 0, 1]), score=z, predictions=True)
    keys, sums, rows = batch.take(slice(2, 5))
    ref = batch.take(np.arange(2, 5))
    assert rows is not None and ref[2] is not None
    assert np.array_equal(keys, ref[0]) and np.array_equal(sums, ref[1]) and np.array_equal(rows, ref[2])
    assert not np.shares_memory(keys, batch.keys) and not np.shares_memory(sums, batch.sums)
    whole = batch.take(slice(0, 7))
    assert whole[0] is batch.keys and whole[1] is batch.sums  # the whole batch: the arrays themselves


def test_cells_by_definition() -> None:
    """Each event's combined cells follow the grids' definition (cell = min(floor(z * bins), bins - 1) from each
    grid's first combined cell), computed here event by event in plain Python."""
    rng = np.random.default_rng(5)
    layout = (32, 15, 3, 20)
    probs = np.vstack([rng.dirichlet(np.ones(3), 40), [[0.0, 0.0, 1.0], [1 / 3, 1 / 3, 1 / 3]]])
    labels = np.append(rng.integers(0, 3, 40), [2, 1])
    cells = EventCells(layout, labels, probs=probs, predictions=True)
    fine, ece, classwise, rel = 0, 32, 47, 47 + 45
    pred = rel + 20
    for j, (p, y) in enumerate(zip(probs.tolist(), labels.tolist())):
        conf = max(p)
        top = p.index(conf)

        def cell(z: float, bins: int) -> int:
            return min(int(z * bins), bins - 1)

        want = [fine + cell(conf, 32), ece + cell(conf, 15), *(classwise + 15 * k + cell(p[k], 15) for k in range(3)),
                rel + cell(conf, 20), pred + cell(conf, 256)]
        assert cells.keys[:, j].tolist() == want
        counts = cells.sums[:, 0, j].tolist()
        assert counts == [1] * 7
        outcome = cells.sums[:, 2, j].tolist()  # fixed-point y: correctness, each class's indicator, none for pred
        scale = 1 << 28
        assert outcome == [scale * (top == y)] * 2 + [scale * (k == y) for k in range(3)] + [scale * (top == y), 0]
