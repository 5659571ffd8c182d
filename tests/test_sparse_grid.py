"""State sized by content: sparse grids, lazy reservoir rows and folded buckets equal the dense computation."""

from __future__ import annotations

import json

import numpy as np
import pytest
from bucket_reference import RefWindows

from calmon.state.buckets import PENDING_CELLS, BucketStats, ModelWindows
from calmon.state.windows import TieredRing
from calmon.stats.grid import FIELDS, QUANTUM_BITS, ScoreGrid
from calmon.stats.reservoir import Reservoir

TIERS = [(60.0, 4), (600.0, 3), (3600.0, 2)]


def reference(z: np.ndarray, y: np.ndarray, bins: int) -> dict[str, np.ndarray]:
    """Per-cell fixed-point sums computed event by event with Python integers (independent of ScoreGrid)."""
    s = float(2**QUANTUM_BITS)
    out = {f: np.zeros(bins, dtype=np.int64) for f in FIELDS}
    for zi, yi in zip(z.tolist(), y.tolist()):
        c = min(max(int(np.floor(zi * bins)), 0), bins - 1)
        qz = int(np.rint(zi * s))
        v = zi * (1 - zi)
        for f, w in zip(FIELDS, (1, qz, int(yi * s), int(np.rint(zi * zi * s)), qz * int(yi), int(np.rint(v * v * s)))):
            out[f][c] += w
    return out


def raw(g: ScoreGrid) -> dict[str, np.ndarray]:
    return {f: np.rint(getattr(g, f) * (1 if f == "n" else 2**QUANTUM_BITS)).astype(np.int64) for f in FIELDS}


def dense(bins: int, channels: int | None = None) -> ScoreGrid:
    g = ScoreGrid(bins, channels)
    g._densify()  # force the dense storage from the start
    return g


@pytest.mark.parametrize("seed", range(6))
def test_sparse_and_dense_grids_hold_the_same_sums(seed):
    rng = np.random.default_rng(seed)
    bins = int(rng.choice([64, 256, 1024]))
    n = int(rng.integers(1, 600))
    z = rng.random(n) ** rng.uniform(0.3, 3)  # from concentrated to spread over the cells
    y = (rng.random(n) < z).astype(float)
    sp, de = ScoreGrid(bins), dense(bins)
    cuts = np.sort(rng.integers(0, n, 5))
    for part in np.split(np.arange(n), cuts):
        sp.update(z[part], y[part])
        de.update(z[part], y[part])
    ref = reference(z, y, bins)
    assert all(np.array_equal(raw(sp)[f], ref[f]) for f in FIELDS)
    assert sp == de and de == sp and sp.count == de.count == n
    assert sp.to_dict() == de.to_dict()  # the document depends on the content only
    for g in (sp, de):
        back = ScoreGrid.from_dict(json.loads(json.dumps(g.to_dict())))
        assert back == g and back.to_dict() == g.to_dict()
    assert sp.coarsen(16) == de.coarsen(16)
    # merge and subtract across storages are exact
    other = ScoreGrid(bins)
    other.update(rng.random(7), np.ones(7))
    for a, b in ((sp.copy(), de.copy()), (de.copy(), sp.copy())):
        a.merge(other)
        b.merge(other)
        assert a == b
        a.subtract(other)
        assert a == de
    assert (sp + de - sp) == de and (de - de).count == 0 and (sp - sp) == ScoreGrid(bins)


def test_sparse_storage_is_sized_by_content_and_densifies():
    g = ScoreGrid(1024)
    assert g.is_sparse and g.nbytes() == 0
    g.update(np.array([0.1, 0.1, 0.7]), np.array([0.0, 1.0, 1.0]))
    assert g.is_sparse and g.nbytes() == 2 * 8 * (1 + len(FIELDS))
    g.update(np.linspace(0, 1, 2000), np.zeros(2000))
    assert not g.is_sparse and g.nbytes() == 1024 * 8 * len(FIELDS)
    assert not ScoreGrid(15).is_sparse  # small grids are always dense
    d = ScoreGrid(1024).to_dict()
    assert d["version"] == 2 and ScoreGrid.from_dict(d).is_sparse


def test_channels_sparse_equal_dense():
    rng = np.random.default_rng(4)
    probs = rng.dirichlet(np.ones(5), 10)
    onehot = np.eye(5)[rng.integers(0, 5, 10)]
    sp, de = ScoreGrid(64, channels=5), dense(64, channels=5)
    sp.update(probs, onehot)
    de.update(probs, onehot)
    assert sp.is_sparse and sp == de and sp.to_dict() == de.to_dict()
    assert all(sp.channel(k) == de.channel(k) for k in range(5))


def test_sparse_document_is_checked():
    d = ScoreGrid(256).to_dict()
    g = ScoreGrid(256)
    g.update(np.array([0.2, 0.9]), np.array([1.0, 0.0]))
    bad = g.to_dict()
    bad["cells"] = ScoreGrid(256).to_dict()["cells"]  # 0 cells for 2 columns of sums
    with pytest.raises(ValueError):
        ScoreGrid.from_dict(bad)
    assert ScoreGrid.from_dict(d) == ScoreGrid(256)


def test_reservoir_rows_allocated_as_filled_same_sample():
    rows = np.random.default_rng(0).random((700, 3))
    r = Reservoir(256, 3, seed=5)
    assert r.nbytes() == 0
    for part in np.array_split(rows, 13):
        r.update(part)
        assert r.nbytes() <= 256 * 3 * 8
    whole = Reservoir(256, 3, seed=5)
    whole.update(rows)
    assert r == whole and r.nbytes() == 256 * 3 * 8
    back = Reservoir.from_dict(json.loads(json.dumps(r.to_dict())))
    assert back == r and back.to_dict() == r.to_dict()


def _update_path(mw: ModelWindows, ts, seg, y, z, wm, predictions: bool) -> None:
    """Per-bucket eager updates (what ingestion did before folding prepared batches; ``mw``'s buckets are the
    eager reference of tests/bucket_reference.py)."""
    for name, ring in mw.rings.items():
        sel = np.arange(ts.size) if name == "all" else np.flatnonzero(seg == name)
        if sel.size:
            ring.add(ts[sel], lambda b, i, sel=sel: b.update(z[sel[i]], None, y[sel[i]], predictions), wm)


@pytest.mark.parametrize("seed", range(3))
def test_folded_batches_equal_per_bucket_updates(seed):
    rng = np.random.default_rng(seed)
    n = 3000
    ts = np.sort(rng.uniform(0, 20000, n)) - rng.uniform(0, 200, n) * (rng.random(n) < 0.2)
    seg = rng.choice(np.array(["web", "app", "x"], dtype=object), n)
    z = rng.random(n)
    y = (rng.random(n) < z).astype(np.int64)
    fold = ModelWindows("m", 2, TIERS, ["web", "app"], bins=256, reservoir=32)
    upd = RefWindows("m", 2, TIERS, ["web", "app"], bins=256, reservoir=32)
    for part in np.array_split(np.arange(n), 23):
        wm = float(ts[: part[-1] + 1].max())
        fold.add(ts[part], seg[part], y[part], z[part], None, wm, predictions=bool(seed % 2))
        _update_path(upd, ts[part], seg[part], y[part], z[part], wm, bool(seed % 2))
        fold.add_predictions(ts[part][:5], seg[part][:5], z[part][:5], None, wm)
        sub = part[:5]
        for name, ring in upd.rings.items():
            sel = sub if name == "all" else sub[seg[sub] == name]
            if sel.size:
                ring.add(ts[sel], lambda b, i, sel=sel: b.update_predictions(z[sel[i]]), wm)
    lengths = {"5m": 300.0, "1h": 3600.0, "all": None}
    for name in fold.rings:
        a, b = fold.rings[name].window_sums(lengths), upd.rings[name].window_sums(lengths)
        assert all(a[w].to_dict() == b[w].to_dict() for w in lengths), name
    assert json.dumps(fold.to_dict()) == json.dumps(upd.to_dict())
    back = ModelWindows.from_dict(json.loads(json.dumps(fold.to_dict())))
    assert json.dumps(back.to_dict()) == json.dumps(fold.to_dict())


def test_folded_events_wait_bounded_and_count_in_nbytes():
    b = BucketStats(2, bins=1024, reservoir=64)
    empty = b.nbytes()
    mw = ModelWindows("m", 2, [(60.0, 2)], bins=1024, reservoir=64)
    for i in range(200):
        mw.add(np.array([1.0, 2.0]), np.array(["a", "a"], dtype=object), np.array([0, 1]), np.array([0.3, 0.6]),
               None, 2.0)
        bucket = mw.rings["all"].buckets[0][0.0]
        assert bucket._pending_cells < PENDING_CELLS
    assert bucket.nbytes() > empty and bucket.count == 400 and bucket._pending_cells == 0


def test_ring_of_sparse_grids_matches_dense_ring():
    rng = np.random.default_rng(9)
    ts = np.sort(rng.uniform(0, 9000, 800))
    z, y = rng.random(800), (rng.random(800) < 0.5).astype(float)
    sp = TieredRing(TIERS, lambda: ScoreGrid(256))
    de = TieredRing(TIERS, lambda: dense(256))
    for part in np.array_split(np.arange(800), 17):
        for r in (sp, de):
            r.add(ts[part], lambda g, i, p=part: g.update(z[p][i], y[p][i]))
    lengths = {"2m": 120.0, "30m": 1800.0, "all": None}
    a, b = sp.window_sums(lengths), de.window_sums(lengths)
    assert all(a[w] == b[w] and a[w].to_dict() == b[w].to_dict() for w in lengths)
    assert sum(s.nbytes() for _, _, _, s in sp.entries()) < sum(s.nbytes() for _, _, _, s in de.entries())


def test_reservoir_owed_draws_give_the_eager_generator_state():
    r = Reservoir(10, 2, seed=7)
    r.update(np.zeros((3, 2)))
    r.update(np.zeros((4, 2)))
    eager = np.random.default_rng(7)
    eager.random(3)
    eager.random(4)
    assert r.to_dict()["rng"] == json.loads(json.dumps(eager.bit_generator.state))
    r.update(np.ones((9, 2)))  # now past capacity: draws are taken from the advanced generator
    u = eager.random(9)
    t = 7 + np.arange(9)
    kept = [j for j in range(9) if t[j] < 10 or np.floor(u[j] * (t[j] + 1)) < 10]
    assert r.seen == 16 and len(kept) >= 3 and r.to_dict()["rng"] == json.loads(json.dumps(eager.bit_generator.state))
