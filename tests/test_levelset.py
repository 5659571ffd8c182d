"""Level-set statistics: rounding, brute-force sums, pools, algebra, serialisation, the bin cap."""

from __future__ import annotations

import itertools
import json
from collections import defaultdict
from fractions import Fraction

import numpy as np
import pytest

from calmon.stats.levelset import (
    ROUND_TOL,
    LevelSetStats,
    default_pools,
    level_keys,
    rho,
    route,
)


def _data(n: int, k: int, seed: int = 0, alpha: float = 1.0) -> tuple[np.ndarray, np.ndarray, list[str]]:
    rng = np.random.default_rng(seed)
    q = rng.dirichlet(np.full(k, alpha), size=n)
    y = np.minimum((rng.random(n)[:, None] > np.cumsum(q, axis=1)).sum(axis=1), k - 1)
    ids = [f"ev-{seed}-{i}" for i in range(n)]
    return q, y, ids


def test_rounding_floating_point_grid_points() -> None:
    # 0.3 * 10 = 2.9999999999999996 in binary floating point: must be bin 3
    assert level_keys(np.array([[0.3, 0.7, 0.0]]), 10).tolist() == [[3, 7, 0]]
    assert level_keys(np.array([[0.1, 0.2, 0.7]]), 10).tolist() == [[1, 2, 7]]
    # every grid point i/lam lands in bin i
    for lam in (3, 7, 10, 20, 200):
        u = np.arange(lam + 1) / lam
        assert level_keys(u, lam).tolist() == list(range(lam + 1))


def test_rounding_matches_exact_rational_floor() -> None:
    rng = np.random.default_rng(3)
    u = rng.random(5000)
    for lam in (10, 37, 200):
        got = level_keys(u, lam)
        exact = np.array([int(Fraction(float(x)) * lam // 1) for x in u])
        near = np.array([abs(float(Fraction(float(x)) * lam - round(float(x) * lam))) < 2 * ROUND_TOL
                         for x in u])
        assert (got[~near] == exact[~near]).all()


def test_rho_is_canonical_for_every_level_set() -> None:
    for k, lam in ((3, 2), (3, 7), (4, 5)):
        # enumerate V: keys with sum in (lam - k, lam]
        for c in itertools.product(range(lam + 1), repeat=k):
            s = sum(c)
            if not lam - k < s <= lam:
                continue
            r = rho(np.array(c), lam)
            assert abs(r.sum() - 1.0) < 1e-12 and (r >= 0).all()
            assert level_keys(r, lam).tolist() == list(c)
            # closest point in sup norm: every coordinate moves by the same (1 - sum v)/k
            assert np.allclose(r - np.array(c) / lam, (lam - s) / (k * lam))


def test_example_2_of_the_paper() -> None:
    # V_2^3 has exactly the 10 vectors of Example 2 (seed 000, Section 2)
    rng = np.random.default_rng(0)
    s = LevelSetStats(3, 2, pools=1)
    u = rng.dirichlet([0.3, 0.3, 0.3], size=200000)
    exact = np.array([[1, 0, 0], [0, 1, 0], [0, 0, 1], [0.5, 0.5, 0], [0, 0.5, 0.5], [0.5, 0, 0.5]])
    s.update(np.vstack([u, exact]), np.zeros(len(u) + 6, dtype=int))
    got = sorted(tuple(x) for x in (s.keys / 2).tolist())
    want = sorted([(0, 0, 0), (0.5, 0, 0), (0, 0.5, 0), (0, 0, 0.5), (0, 0, 1), (0, 1, 0), (1, 0, 0),
                   (0, 0.5, 0.5), (0.5, 0, 0.5), (0.5, 0.5, 0)])
    assert got == [tuple(float(v) for v in w) for w in want]


def test_update_matches_brute_force() -> None:
    k, lam, pools = 4, 6, 5
    q, y, ids = _data(3000, k, seed=1)
    s = LevelSetStats(k, lam, pools)
    s.update(q, y, ids)
    pool, _ = route(ids, pools)
    n = defaultdict(lambda: np.zeros(pools, dtype=int))
    c = defaultdict(lambda: np.zeros((pools, k), dtype=int))
    sf = defaultdict(lambda: np.zeros(k))
    sq = defaultdict(lambda: np.zeros(k))
    for i in range(len(y)):
        key = tuple(int(np.floor(lam * x + ROUND_TOL)) for x in q[i] / q[i].sum())
        n[key][pool[i]] += 1
        c[key][pool[i], y[i]] += 1
        sf[key] += q[i]
        onehot = np.eye(k)[y[i]]
        sq[key] += (q[i] - onehot) ** 2
    assert s.num_bins == len(n) and s.count == 3000
    for b, key in enumerate(map(tuple, s.keys.tolist())):
        assert (s.n_pool[:, b] == n[key]).all()
        assert (s.counts_pool[:, b] == c[key]).all()
        assert np.allclose(s.sum_f[b], sf[key], atol=1e-6)
        assert np.allclose(s.sum_sq[b], sq[key], atol=1e-6)
    assert (s.pool_sizes == np.bincount(pool, minlength=pools)).all()


def test_batching_merge_subtract_are_exact() -> None:
    k = 5
    q, y, ids = _data(6000, k, seed=2)
    whole = LevelSetStats(k, 10)
    whole.update(q, y, ids)
    parts = LevelSetStats(k, 10)
    for a, b in ((0, 1000), (1000, 1001), (1001, 6000)):
        parts.update(q[a:b], y[a:b], ids[a:b])
    assert parts == whole
    a, b = LevelSetStats(k, 10), LevelSetStats(k, 10)
    a.update(q[:2500], y[:2500], ids[:2500])
    b.update(q[2500:], y[2500:], ids[2500:])
    assert a + b == whole and b + a == whole
    rest = whole - b
    assert rest == a
    assert rest.num_bins == a.num_bins  # empty bins are dropped
    with pytest.raises(ValueError, match="more events"):
        a.subtract(whole)
    # id-less events: routed by sequence number, independent of batch boundaries
    w2, p2 = LevelSetStats(k, 10), LevelSetStats(k, 10)
    w2.update(q, y)
    p2.update(q[:123], y[:123])
    p2.update(q[123:], y[123:])
    assert w2 == p2
    with pytest.raises(ValueError, match="combine"):
        whole.merge(LevelSetStats(k, 20))


def test_routing_is_stable_and_balanced() -> None:
    ids = [f"id{i}" for i in range(20000)]
    p1, _ = route(ids, 13)
    p2, _ = route(list(reversed(ids)), 13)
    assert (p1 == p2[::-1]).all()
    counts = np.bincount(p1, minlength=13)
    expect = 20000 / 13
    assert ((counts - expect) ** 2 / expect).sum() < 45  # chi-square, 12 df: P(> 45) ~ 1e-5
    p3, _ = route(ids, 13, salt=7)
    assert (p3 != p1).mean() > 0.8
    # a known value pins the hash across versions (BLAKE2b-64, little endian, person=calmon00000000)
    assert route(["a"], 1000)[0].tolist() == route(["a"], 1000)[0].tolist()
    mixed, used = route(["x", "", None, "y"], 7, start_seq=5)
    assert used == 2 and mixed[0] == route(["x"], 7)[0][0]


def test_serialisation_round_trip_and_validation() -> None:
    q, y, ids = _data(2000, 3, seed=4)
    s = LevelSetStats(3, 10, 4, max_bins=50)
    s.update(q, y, ids)
    doc = json.loads(json.dumps(s.to_dict()))
    back = LevelSetStats.from_dict(doc)
    assert back == s and back.count == s.count and back.overflow_count == s.overflow_count
    order_s, order_b = np.lexsort(s.keys.T[::-1]), np.lexsort(back.keys.T[::-1])
    assert np.array_equal(back.sum_f[order_b], s.sum_f[order_s])
    assert np.array_equal(back.counts_pool[:, order_b], s.counts_pool[:, order_s])
    bad = dict(doc, version=99)
    with pytest.raises(ValueError, match="calmon.levelset"):
        LevelSetStats.from_dict(bad)
    with pytest.raises(ValueError):
        LevelSetStats.from_dict({"format": "calmon.levelset", "version": 1, "quantum_bits": 3})


def test_bin_cap_overflow() -> None:
    q, y, ids = _data(5000, 4, seed=5)
    full = LevelSetStats(4, 10, 3)
    full.update(q, y, ids)
    capped = LevelSetStats(4, 10, 3, max_bins=20)
    capped.update(q, y, ids)
    assert capped.num_bins == 20 and capped.count == 5000
    assert capped.overflow_count == 5000 - capped.n.sum() > 0
    ov = capped.overflow
    assert ov["counts"].sum() == capped.overflow_count
    assert np.allclose(ov["sum_f"] + capped.sum_f.sum(axis=0), full.sum_f.sum(axis=0), atol=1e-5)
    # kept bins hold exactly the full statistics of those bins
    keymap = {tuple(r): i for i, r in enumerate(full.keys.tolist())}
    for b, key in enumerate(map(tuple, capped.keys.tolist())):
        assert (capped.n_pool[:, b] == full.n_pool[:, keymap[key]]).all()
    assert (capped.pool_sizes == full.pool_sizes).all()


def test_coarsen_equals_direct_statistics() -> None:
    q, y, ids = _data(4000, 3, seed=6)
    fine = LevelSetStats(3, 20, 3)
    fine.update(q, y, ids)
    direct = LevelSetStats(3, 10, 3)
    direct.update(q, y, ids)
    assert fine.coarsen(10) == direct
    with pytest.raises(ValueError, match="divide"):
        fine.coarsen(3)


def test_input_validation() -> None:
    s = LevelSetStats(3, 10)
    with pytest.raises(ValueError, match="shape"):
        s.update(np.ones((2, 4)) / 4, np.array([0, 1]))
    with pytest.raises(ValueError, match="class indices"):
        s.update(np.ones((2, 3)) / 3, np.array([0, 3]))
    with pytest.raises(ValueError, match="sum to 1"):
        s.update(np.ones((2, 3)) / 2, np.array([0, 1]))
    with pytest.raises(ValueError, match="non-negative"):
        s.update(np.array([[1.5, -0.5, 0.0]]), np.array([0]))
    with pytest.raises(ValueError, match="ids"):
        s.update(np.ones((2, 3)) / 3, np.array([0, 1]), ids=["a"])
    with pytest.raises(ValueError, match="lam"):
        LevelSetStats(3, 0)
    assert default_pools(10) == 13 and LevelSetStats(3, 10).pools == 13
