"""Field-by-field copies of the statistics equal their document round trip and stay independent."""

from __future__ import annotations

import numpy as np
import pytest

from calmon.state.buckets import BucketStats
from calmon.stats.model import ModelStats
from calmon.stats.reservoir import Reservoir


@pytest.mark.parametrize("seen", [0, 5, 40, 500])  # empty, draws owed, at capacity, sampling
def test_reservoir_copy_keeps_rows_and_generator(seen: int) -> None:
    rng = np.random.default_rng(seen)
    r = Reservoir(40, 2, seed=3)
    if seen:
        r.update(rng.random((seen, 2)))
    c = r.copy()
    assert c.to_dict() == r.to_dict()
    more = rng.random((300, 2))
    r.update(more)
    assert (c.seen, r.seen) == (seen, seen + 300)  # the copy did not move with the original
    c.update(more)
    assert c.to_dict() == r.to_dict()  # same generator state: the same rows sampled


@pytest.mark.parametrize("classes,levelset", [(2, None), (3, None), (4, 8)])
def test_model_stats_copy_equals_round_trip(classes: int, levelset: int | None) -> None:
    rng = np.random.default_rng(classes)
    s = ModelStats(classes, bins=64, reservoir=32, levelset_lambda=levelset)

    def feed(st: ModelStats, n: int) -> None:
        if classes == 2:
            st.update(score=rng.random(n), labels=rng.integers(0, 2, n))
        else:
            p = rng.dirichlet(np.ones(classes), n)
            st.update(probs=p, labels=rng.integers(0, classes, n))

    feed(s, 100)
    c = s.copy()
    assert c.to_dict() == s.to_dict() == ModelStats.from_dict(s.to_dict()).to_dict()
    state = rng.bit_generator.state
    feed(s, 50)
    assert c.to_dict() != s.to_dict()  # the copy does not move with the original
    rng.bit_generator.state = state
    feed(c, 50)
    assert c.to_dict() == s.to_dict()


def test_bucket_copy_folds_pending_and_is_independent() -> None:
    rng = np.random.default_rng(0)
    b = BucketStats(2, bins=64, reservoir=16)
    b.update(score=rng.random(30), labels=rng.integers(0, 2, 30), predictions=True)
    c = b.copy()
    assert c.to_dict() == b.to_dict()
    b.update(score=rng.random(5), labels=np.ones(5, dtype=np.int64))
    assert c.count == 30 and b.count == 35
