"""Deferred merges (issue #35.3): a bucket keeps the buckets merged into it and sums them on its next read.

The content must be bit for bit that of the pairwise merges, folds and merges applied in the order they came
(the reservoir's sample depends on it), and a ring rolling a dozen buckets into a coarser one must not pay one
grid merge per bucket -- the ingest of a live stream at thousands of models was mostly those merges.
"""

import json

import numpy as np
import pytest

from calmon.state import buckets
from calmon.state.buckets import BucketStats, ModelWindows
from calmon.stats.model import ModelStats

DEFERRED_MERGES = getattr(buckets, "DEFERRED_MERGES", 32)  # (the test of the old code runs too)


def _doc(b: BucketStats) -> str:
    return json.dumps(b.to_dict(), sort_keys=True)


def _bucket(rng: np.random.Generator, classes: int, n: int) -> BucketStats:
    b = BucketStats(classes, bins=64, reservoir=8, levelset_lambda=4 if classes > 2 else None)
    labels = rng.integers(classes, size=n)
    if classes == 2:
        b.update(score=rng.random(n), labels=labels, predictions=True)
    else:
        b.update(probs=rng.dirichlet(np.ones(classes), n), labels=labels, predictions=True)
    return b


def _eager_merge(into: BucketStats, other: BucketStats) -> None:
    """The merge before deferral: model statistics, reliability and prediction grids, now."""
    into._thaw()
    into.stats.merge(other.stats)
    into._rel.merge(other.rel)
    into._pred.merge(other.pred)


@pytest.mark.parametrize("classes", [2, 3])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_deferred_merges_equal_pairwise(classes: int, seed: int) -> None:
    """Merges, folds and more merges than DEFERRED_MERGES, interleaved: the same document as eager merges."""
    rng = np.random.default_rng(seed)
    ops = [("merge" if rng.random() < 0.7 else "fold", int(rng.integers(1, 30))) for _ in range(2 * DEFERRED_MERGES)]
    lazy, eager = _bucket(np.random.default_rng(seed), classes, 5), _bucket(np.random.default_rng(seed), classes, 5)
    for i, (op, n) in enumerate(ops):
        src = np.random.default_rng([seed, i])
        if op == "merge":
            lazy.merge(_bucket(src, classes, n))
            _eager_merge(eager, _bucket(np.random.default_rng([seed, i]), classes, n))
        else:
            labels = src.integers(classes, size=n)
            z = src.random(n) if classes == 2 else None
            p = None if classes == 2 else src.dirichlet(np.ones(classes), n)
            for b in (lazy, eager):
                b.update(score=z, probs=p, labels=labels)
        if i % 11 == 0:  # a read in between (a round's snapshot) sums what waits
            assert lazy.count == eager.count
    assert _doc(lazy) == _doc(eager)


def test_ring_roll_merges_once_per_read(monkeypatch: pytest.MonkeyPatch) -> None:
    """Twelve 5-minute buckets rolled into one hour bucket: no grid merge while they roll, one sum when read."""
    calls = {"merge": 0, "summed": 0}
    merge, summed = ModelStats.merge, ModelStats.summed

    def counted_merge(self: ModelStats, *a: object, **k: object) -> None:
        calls["merge"] += 1
        merge(self, *a, **k)  # type: ignore[arg-type]

    def counted_summed(self: ModelStats, *a: object, **k: object) -> ModelStats:
        calls["summed"] += 1
        return summed(self, *a, **k)  # type: ignore[arg-type]

    monkeypatch.setattr(ModelStats, "merge", counted_merge)
    monkeypatch.setattr(ModelStats, "summed", counted_summed)
    mw = ModelWindows("m", 2, [(300.0, 12), (3600.0, 24)], bins=64, reservoir=8)
    rng = np.random.default_rng(0)
    for k in range(26):  # one event per 5 minutes for 2 h 10 min: the first hour rolls into tier 1
        t = 300.0 * k + 1.0
        mw.add(np.array([t]), np.array([""], dtype=object), rng.integers(2, size=1), rng.random(1), None, t)
    ring = mw.rings["all"]
    assert len(ring.buckets[1]) >= 1 and calls == {"merge": 0, "summed": 0}
    assert ring.window_sum(None).count == 26
    assert calls["merge"] == 0 and calls["summed"] >= 1


def test_model_bytes_measured_again_only_after_a_change(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each round publishes every model's bytes: a model whose rings did not change is not walked again."""
    mw = ModelWindows("m", 2, [(300.0, 12), (3600.0, 24)], segments=["web"], bins=64, reservoir=8)
    seg = np.array(["web", "app"], dtype=object)
    mw.add(np.array([1.0, 400.0]), seg, np.array([0, 1]), np.array([0.2, 0.7]), None, 400.0)
    walked = [0]
    nbytes = BucketStats.nbytes

    def counted(self: BucketStats) -> int:
        walked[0] += 1
        return nbytes(self)

    monkeypatch.setattr(BucketStats, "nbytes", counted)
    first = mw.nbytes()
    assert walked[0] > 0
    walked[0] = 0
    assert mw.nbytes() == first and walked[0] == 0  # nothing changed: not walked
    mw.add(np.array([700.0]), seg[:1], np.array([1]), np.array([0.9]), None, 700.0)
    after = mw.nbytes()
    assert walked[0] > 0 and after > first
    assert after == sum(nbytes(b) for ring in mw.rings.values() for tier in ring.buckets for b in tier.values())


@pytest.mark.parametrize("make", ["parts", "dict", "copy", "blank", "read_copy"])
def test_every_way_to_make_a_bucket_takes_deferred_merges(make: str) -> None:
    """A bucket read from a binary delta (``from_parts``) had no list of waiting merges: the evaluator failed
    with AttributeError at the first merge into it. Every constructor that bypasses ``__init__`` goes through
    ``BucketStats._shell`` now; each must take merges like a bucket made by ``__init__``."""
    from calmon.stats.packed import Packer, Unpacker

    rng = np.random.default_rng(7)
    src = _bucket(rng, 2, 50)
    if make == "parts":
        packer = Packer()
        parts = src.to_parts(packer)
        table, raw = packer.raw()
        b = BucketStats.from_parts(parts, Unpacker.of(table, raw))
    elif make == "dict":
        b = BucketStats.from_dict(src.to_dict())
    else:
        b = getattr(src, make)()
    ref = BucketStats.from_dict(b.to_dict()) if make != "read_copy" else None
    other = _bucket(rng, 2, 30)
    b.merge(other)
    if ref is not None:
        _eager_merge(ref, other)
        assert _doc(b) == _doc(ref)
    else:
        assert b.stats.count == src.stats.count + other.stats.count
