"""Buckets not materialised until read (BucketStats.blank) and rolled into a coarser tier without materialising
(BucketStats.absorb), against the eager path on the same random traffic (issue #35, build item 3).

The eager path is the one before the change: ``blank`` copies the pristine bucket's grids, reservoir and level
sets at once, and a bucket leaving its tier is merged (``BucketStats.merge``: materialised, flushed, grids merged,
reservoir merged by seeded sampling).  Both must give the same rings -- every bucket's document (grids, reservoir
rows, count and generator state, level sets) and its packed checkpoint form -- bit for bit, whatever reads
happen between batches (a read materialises a bucket; a bucket read before its roll is merged the eager way).
"""

import json
from collections.abc import Iterator
from contextlib import contextmanager

import numpy as np
import pytest

from calmon.state.buckets import PACKED_PREFIX, BucketStats, ModelWindows, fold
from calmon.state.checkpoint.store import encode

TIERS = [(60.0, 3), (600.0, 2), (3600.0, 2)]


@contextmanager
def eager() -> Iterator[None]:
    """The path before lazy buckets: ``blank`` materialises at once, a roll is a ``merge``."""
    blank, absorb = BucketStats.blank, BucketStats.absorb

    def eager_blank(self: BucketStats) -> BucketStats:
        out = blank(self)
        out._materialise()
        return out

    BucketStats.blank = eager_blank  # type: ignore[method-assign]
    BucketStats.absorb = BucketStats.merge  # type: ignore[method-assign]
    try:
        yield
    finally:
        BucketStats.blank, BucketStats.absorb = blank, absorb  # type: ignore[method-assign]


def _models(classes: int, reservoir: int, levelset: int | None) -> list[ModelWindows]:
    return [ModelWindows(f"m{i}", classes, TIERS, segments=["web"] if i % 2 else [], bins=64,
                         reservoir=reservoir, levelset_lambda=levelset) for i in range(4)]


def _restore(models: list[ModelWindows]) -> None:
    """Every bucket replaced by its packed checkpoint form, as a restore keeps it (decoded on first use)."""
    for mw in models:
        for ring in mw.rings.values():
            for tier in ring.buckets:
                for key, b in tier.items():
                    raw = encode(b.to_packed())
                    assert raw.startswith(PACKED_PREFIX)
                    tier[key] = BucketStats.load(raw)


def _traffic(seed: int, classes: int, read: bool, models: list[ModelWindows]) -> None:
    """Batches of predictions and labeled events over 4 h, a few per (model, minute), some late; with ``read``,
    some buckets are read between batches (materialising them before they roll); half way, every bucket is
    restored from its packed form (kept packed until read)."""
    rng = np.random.default_rng(seed)
    t0, wm = 1_767_225_600.0, 0.0
    for step in range(60):
        n = int(rng.integers(1, 30))
        ts = t0 + step * 240.0 + rng.random(n) * 240.0 - (rng.random(n) < 0.2) * rng.random(n) * 3000.0
        wm = max(wm, float(ts.max()))
        seg = rng.choice(np.array(["web", "app"], dtype=object), n)
        part = np.sort(rng.integers(0, len(models), n))
        parts = [(mw, np.flatnonzero(part == i)) for i, mw in enumerate(models)]
        probs = rng.dirichlet(np.ones(classes), n) if classes > 2 else None
        score = None if probs is not None else rng.random(n)
        labels = rng.integers(0, classes, n)
        if step % 3:
            fold(parts, ts, seg, None, wm, score=score, probs=probs)
        fold(parts, ts, seg, labels, wm, score=score, probs=probs, predictions=bool(step % 2))
        if step == 30:
            _restore(models)
        if read and step % 7 == 3:
            for mw in models:
                for ring in mw.rings.values():
                    for tier in ring.buckets:
                        for b in list(tier.values())[::2]:
                            _ = b.count


def _docs(models: list[ModelWindows]) -> tuple[list[str], list[str]]:
    plain, packed = [], []
    for mw in models:
        for ring in mw.rings.values():
            buckets = [b for tier in ring.buckets for b in tier.values()]
            buckets += [] if ring.archive is None else [ring.archive]
            plain += [json.dumps(b.to_dict(), sort_keys=True) for b in buckets]
            packed += [json.dumps(b.to_packed(), sort_keys=True) for b in buckets]
            plain.append(json.dumps(ring.layout()))
    return plain, packed


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("read", [False, True])
@pytest.mark.parametrize(("classes", "reservoir", "levelset"), [(2, 256, None), (2, 8, None), (3, 16, None),
                                                                (3, 16, 4)])
def test_lazy_buckets_equal_the_eager_path(seed: int, read: bool, classes: int, reservoir: int,
                                           levelset: int | None) -> None:
    lazy = _models(classes, reservoir, levelset)
    _traffic(seed, classes, read, lazy)
    with eager():
        ref = _models(classes, reservoir, levelset)
        _traffic(seed, classes, read, ref)
    assert sum(ring.bucket_count() for mw in ref for ring in mw.rings.values()) > 20
    assert _docs(lazy) == _docs(ref)


def test_a_fresh_bucket_is_only_its_pending_rows_until_read() -> None:
    mw = _models(2, 256, None)[0]
    fold([(mw, np.arange(3))], np.array([0.0, 1.0, 2.0]), np.array(["", "", ""], dtype=object),
         np.array([0, 1, 1]), 2.0, score=np.array([0.1, 0.5, 0.9]))
    (bucket,) = mw.rings["all"].buckets[0].values()
    assert bucket._proto is not None and not hasattr(bucket, "_stats")
    assert 0 < bucket.nbytes() < 1000  # the pending rows, not ~1.7 kB of grids
    assert bucket.layout() == mw.layout() and bucket._proto is not None  # the layout does not materialise
    assert bucket.count == 3 and bucket._proto is None
