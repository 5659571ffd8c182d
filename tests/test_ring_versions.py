"""Ring versions: monotone, bumped on every mutation, per-bucket versions say what changed."""

from __future__ import annotations

import math

import numpy as np

from calmon.state.buckets import ModelWindows
from calmon.state.windows import ARCHIVE_KEY, ARCHIVE_TIER, TieredRing
from calmon.stats.grid import ScoreGrid

TIERS = [(60.0, 3), (600.0, 2)]


def ring(archive: bool = True) -> TieredRing:
    return TieredRing(TIERS, lambda: ScoreGrid(8), archive)


def add(r: TieredRing, ts, watermark=None) -> None:
    ts = np.asarray(ts, dtype=float)
    r.add(ts, lambda g, i: g.update(np.full(i.size, 0.5), np.ones(i.size)), watermark)


def snap(r: TieredRing) -> dict:
    return {(t, k): v for t, k, v, _ in r.entries()}


def test_version_bumps_on_add_and_only_touched_buckets_change():
    r = ring()
    assert r.version == 0 and r.entries() == []
    add(r, [0.0, 65.0])
    v1 = r.version
    assert v1 > 0 and snap(r) == {(0, 0.0): v1, (0, 60.0): v1}
    add(r, [70.0])  # same watermark bucket, one bucket touched
    v2 = r.version
    assert v2 > v1 and snap(r) == {(0, 0.0): v1, (0, 60.0): v2}
    before = r.version
    r.window_sums({"a": 120.0, "all": None})  # reading is not a mutation
    r.advance(10.0)  # watermark does not move
    add(r, [])
    assert r.version == before


def test_roll_and_archive_and_drop_are_mutations():
    r = ring()
    add(r, [0.0, 30.0])
    v1 = r.version
    r.advance(200.0)  # lo_0 = 60, lo_1 = -1200: tier-0 bucket 0 rolls into tier-1 bucket 0
    assert r.version > v1
    e = snap(r)
    assert (0, 0.0) not in e and e[(1, 0.0)] == r.version
    v2 = r.version
    r.advance(5000.0)  # everything leaves the last tier -> archive
    e = snap(r)
    assert r.version > v2 and e == {(ARCHIVE_TIER, ARCHIVE_KEY): r.version}
    assert ARCHIVE_TIER == -1 and ARCHIVE_KEY == -math.inf
    # without an archive, a dropped bucket disappears and the version still moves
    d = ring(archive=False)
    add(d, [0.0])
    v = d.version
    d.advance(5000.0)
    assert d.version > v and d.entries() == []
    v = d.version
    add(d, [1.0], watermark=5000.0)  # lands nowhere: no mutation
    assert d.version == v


def test_versions_monotone_over_a_stream_and_restore():
    rng = np.random.default_rng(3)
    r = ring()
    last = r.version
    seen: dict = {}
    for start in range(0, 3000, 50):
        ts = start + rng.uniform(-40, 50, 7)
        prev = snap(r)
        add(r, ts)
        assert r.version > last
        last = r.version
        now = snap(r)
        for key, v in now.items():
            assert v <= r.version
            if key in prev and v == prev[key]:  # unchanged version -> unchanged content
                assert seen[key] == _state(r, key)
            seen[key] = _state(r, key)
    back = TieredRing.from_dict(r.to_dict(lambda g: g.to_dict()), lambda: ScoreGrid(8), ScoreGrid.from_dict)
    assert back.version == 1 and set(snap(back).values()) == {1}
    doc = r.to_dict(lambda g: g.to_dict())
    doc["version"] = r.version
    back = TieredRing.from_dict(doc, lambda: ScoreGrid(8), ScoreGrid.from_dict)
    assert back.version == r.version + 1 and snap(back).keys() == snap(r).keys()


def _state(r: TieredRing, key) -> dict:
    for t, k, _, s in r.entries():
        if (t, k) == key:
            return s.to_dict()
    raise KeyError(key)


def test_model_windows_versions_per_segment():
    mw = ModelWindows("m", 2, TIERS, segments=["web", "app"], bins=16, reservoir=4)
    assert mw.versions() == {"all": 0, "web": 0, "app": 0}
    seg = np.array(["web", "web"], dtype=object)
    mw.add(np.array([0.0, 10.0]), seg, np.array([1, 0]), np.array([0.9, 0.2]), None, 10.0)
    v = mw.versions()
    assert v["all"] > 0 and v["web"] > 0 and v["app"] == 0
    mw.add_predictions(np.array([20.0]), np.array(["app"], dtype=object), np.array([0.3]), None, 20.0)
    w = mw.versions()
    assert w["all"] > v["all"] and w["app"] > 0 and w["web"] == v["web"]
