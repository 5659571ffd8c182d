"""Bucket merges (issue #35.3): merges and folds in any interleaving give the document of the same merges and folds
applied one by one; every way to make a bucket takes merges; a model's bytes are walked only after a change.

(Deferred merges -- keeping the merged buckets and summing them on the next read -- were tried and taken out:
the partitioned agent's evaluators then differed from the single process, see ``calmon/state/buckets.py``.)
"""

import json

import numpy as np
import pytest

from calmon.state.buckets import BucketStats, ModelWindows

OPS = 64


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
def test_interleaved_merges_and_folds_equal_the_grid_merges(classes: int, seed: int) -> None:
    """Merges and folds interleaved: the same document as merging the grids one by one."""
    rng = np.random.default_rng(seed)
    ops = [("merge" if rng.random() < 0.7 else "fold", int(rng.integers(1, 30))) for _ in range(OPS)]
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
def test_every_way_to_make_a_bucket_takes_merges(make: str) -> None:
    """Every constructor that bypasses ``__init__`` goes through ``BucketStats._shell`` (a bucket read from a
    binary delta once lacked a field the merge needed); each must take merges like a bucket made by ``__init__``."""
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
