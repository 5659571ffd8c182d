"""The evaluator's direct merge of binary deltas (#33.3) is exact, and its reservoir merge is uniform.

``merge_delta`` adds a decoded version-3 delta's cells straight into the ring's buckets
(:meth:`BucketStats.merge_part`) instead of building a :class:`BucketStats` per delta bucket and merging it;
:meth:`Reservoir.absorb` merges a delta bucket's sample in place.  The reference here is the previous path,
written out independently: every bucket of the JSON (version 2) decoding of the same delta placed by its own
``ring.add`` and merged with :meth:`BucketStats.merge`.
"""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats

from calmon.cluster.deltas import ARCHIVE_TIER, Delta, extract_deltas, merge_delta
from calmon.state.buckets import BucketStats, ModelWindows
from calmon.state.counters import Counters
from calmon.stats.reservoir import Reservoir

TIERS = [(60, 4), (600, 3)]


def windows(classes):
    return ModelWindows("m", classes, TIERS, segments=["web"], bins=256, reservoir=16,
                        levelset_lambda=4 if classes > 2 else None)


def random_delta(rng, classes, watermark):
    """A delta of a random range: events spread over every tier and the archive, some buckets dense."""
    mw = windows(classes)
    n = int(rng.integers(1, 400))
    ts = watermark - rng.exponential(rng.choice([30.0, 600.0, 5000.0]), n)
    seg = rng.choice(np.array(["web", "app"], dtype=object), n)
    y = rng.integers(0, classes, n)
    if classes == 2:
        score, probs = rng.beta(2, 2, n), None
    else:
        score, probs = None, rng.dirichlet(np.ones(classes), n)
    mw.add(ts, seg, y, score, probs, watermark, predictions=bool(rng.integers(2)))
    mw.add_predictions(ts[: n // 2], seg[: n // 2], score if score is None else score[: n // 2],
                       None if probs is None else probs[: n // 2], watermark)
    return extract_deltas("events/0", 0, n, watermark, {"m": mw}, Counters())[0]


def reference_merge(target, delta):
    """The previous merge: each bucket of the version-2 decoding placed on its own and merged whole."""
    for b in Delta.from_bytes(delta.to_bytes(2)).buckets:
        at = -1e300 if b.tier == ARCHIVE_TIER else b.start
        target.rings[b.segment].add(np.array([at]), lambda s, _i, b=b: s.merge(b.bucket), watermark=delta.watermark)


def grids_of(mw):
    """Every ring's buckets as (tier, start, storage, document without the reservoir's sample)."""
    out = []
    for seg, ring in sorted(mw.rings.items()):
        for tier, start, _version, b in ring.entries():
            doc = b.to_dict()
            res = doc["stats"].pop("reservoir")
            out.append((seg, tier, start, b.stats.fine.is_sparse, b.pred.is_sparse, res["seen"], doc))
    return out


def samples_of(mw):
    return {(seg, t, k): b.stats.reservoir for seg, ring in mw.rings.items() for t, k, _v, b in ring.entries()}


@pytest.mark.parametrize("classes", [2, 3])
@pytest.mark.parametrize("seed", range(6))
def test_direct_merge_equals_the_bucket_merge_on_random_deltas(classes, seed):
    rng = np.random.default_rng(seed)
    direct, reference = windows(classes), windows(classes)
    watermark = 10_000.0
    for _ in range(int(rng.integers(3, 9))):
        watermark += float(rng.choice([0.0, 20.0, 300.0, 4000.0]))
        delta = random_delta(rng, classes, watermark)
        decoded = Delta.from_bytes(delta.to_bytes(3))
        assert all(b.part is not None for b in decoded.buckets)  # the direct path: no bucket built ...
        merge_delta(direct, decoded)
        assert all(b._bucket is None for b in decoded.buckets)  # ... not even by the merge
        reference_merge(reference, delta)
    for mw in (direct, reference):
        for ring in mw.rings.values():
            ring.advance(watermark + 5000.0)  # rolled alike: buckets merged into coarser tiers and the archive
    assert grids_of(direct) == grids_of(reference)  # same integers, storage and counts
    for key, res in samples_of(direct).items():  # the sample: of the right size, rows of the bucket's events
        ref = samples_of(reference)[key]
        assert res.seen == ref.seen and len(res.rows) == len(ref.rows) == min(res.seen, res.capacity)


def test_a_forged_grid_shape_is_refused_before_anything_is_merged():
    rng = np.random.default_rng(1)
    delta = random_delta(rng, 2, 10_000.0)
    other = ModelWindows("m", 2, TIERS, segments=["web"], bins=256, reservoir=8)  # reservoir width alike, ok
    merge_delta(other, Delta.from_bytes(delta.to_bytes()))
    wide = ModelWindows("m", 3, TIERS, segments=["web"], bins=256, reservoir=16)
    from calmon.cluster.deltas import DeltaError
    d = Delta.from_bytes(delta.to_bytes())
    d.classes = 3  # a header that lies about its buckets
    with pytest.raises(DeltaError):
        merge_delta(wide, d)
    assert all(not ring.entries() for ring in wide.rings.values())


def inclusion(cap, na, nb, trials, seed, fill_a=True):
    """Over ``trials`` merges of a sample of stream A (ids ``0..na-1``) into one of stream B (``na..``):
    how often each id is in the merged sample, and how many of A's ids each merged sample holds."""
    hits = np.zeros(na + nb)
    from_a = np.zeros(cap + 1)
    ids_a, ids_b = np.arange(na, dtype=float)[:, None], np.arange(na, na + nb, dtype=float)[:, None]
    for t in range(trials):
        a = Reservoir(cap, 1, seed=seed * 100_000 + 2 * t)
        if fill_a:
            a.update(ids_a)
        b = Reservoir(cap, 1, seed=seed * 100_000 + 2 * t + 1)
        b.update(ids_b)
        a.absorb(b.rows, b.seen)
        assert a.seen == na * fill_a + nb and len(a.rows) == min(cap, a.seen)
        got = a.rows[:, 0].astype(int)
        assert np.unique(got).size == got.size  # a sample without repeats
        hits[got] += 1
        from_a[(got < na).sum()] += 1
    return hits, from_a


@pytest.mark.parametrize("cap, na, nb", [(10, 40, 25),  # both full: rows replace slots
                                         (10, 6, 30),  # ours not full, the union is: the append branch
                                         (10, 0, 30),  # empty: theirs alone
                                         (10, 30, 3)])  # theirs small
def test_absorb_is_a_uniform_sample_of_the_union(cap, na, nb):
    """Inclusion frequencies of every row against the uniform ``cap / (na + nb)`` (chi-square), and the number
    taken from each side against the hypergeometric law (the split of a uniform subset), by simulation."""
    trials = 3000
    hits, from_a = inclusion(cap, max(na, 1), nb, trials, seed=cap + na, fill_a=na > 0)
    n = (na if na else 0) + nb
    hits = hits[:n] if na else hits[1:]
    expected = np.full(n, trials * cap / n)
    assert abs(hits.sum() - expected.sum()) < 1e-6
    assert stats.chisquare(hits, expected).pvalue > 1e-3
    if na and n > cap:
        law = stats.hypergeom(n, na, cap).pmf(np.arange(cap + 1)) * trials
        keep = law > 5  # chi-square needs expected counts of about 5 or more: pool the tails
        observed, want = from_a[keep], law[keep]
        if law[~keep].sum() > 1e-9:
            observed, want = np.append(observed, from_a[~keep].sum()), np.append(want, law[~keep].sum())
        assert stats.chisquare(observed, want * observed.sum() / want.sum()).pvalue > 1e-3


def test_absorb_of_everything_appends_and_draws_nothing():
    r = Reservoir(8, 2, seed=3)
    r.update(np.ones((3, 2)))
    state = r._rng.bit_generator.state
    r.absorb(np.full((4, 2), 2.0), 4)
    assert r.seen == 7 and r.rows[3:].tolist() == [[2.0, 2.0]] * 4
    assert r._rng.bit_generator.state == state
    with pytest.raises(ValueError):
        r.absorb(np.ones((3, 2)), 2)  # a sample larger than its stream


def test_a_bucket_built_from_its_part_equals_the_decoded_bucket():
    rng = np.random.default_rng(5)
    delta = random_delta(rng, 3, 10_000.0)
    lazy = Delta.from_bytes(delta.to_bytes())
    for a, b in zip(lazy.buckets, delta.buckets):
        assert a.bucket.stats == b.bucket.stats and a.bucket.to_dict() == b.bucket.to_dict()
        assert isinstance(a.bucket, BucketStats) and a.part is not None


def test_merges_of_streams_past_a_billion_rows_still_split_uniformly():
    """numpy's hypergeometric draw refuses populations of 10**9 (an archive bucket of a long-running agent): the
    split is then drawn item by item; its mean is the hypergeometric one (and the merge does not raise)."""
    big, small = 3 * 10**9, 10**9
    kept = []
    for seed in range(300):
        a, b = Reservoir(20, 1, seed=seed), Reservoir(20, 1, seed=10_000 + seed)
        a.update(np.zeros((20, 1)))
        b.update(np.ones((20, 1)))
        a.seen, b.seen = big, small  # (counts as a long stream leaves them; the rows are a sample of it)
        m = a.merged(b, np.random.default_rng(seed))
        a.absorb(b.rows, b.seen)
        assert m.seen == a.seen == big + small
        kept += [(m.rows[:, 0] == 0).sum(), (a.rows[:, 0] == 0).sum()]
    assert abs(np.mean(kept) - 20 * big / (big + small)) < 0.25  # 15 of 20 expected; sd of the mean ~0.06
