import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from calmon.stats.grid import ScoreGrid


def make(seed: int, n: int, bins: int = 4096, channels=None) -> tuple[ScoreGrid, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    shape = (n,) if channels is None else (n, channels)
    z = rng.random(shape)
    z[: n // 10] = np.round(z[: n // 10] * 8) / 8  # values on dyadic edges and exactly 0 or 1
    y = (rng.random(shape) < z).astype(float)
    g = ScoreGrid(bins, channels)
    g.update(z, y)
    return g, z, y


def test_statistics_equal_raw_computation():
    g, z, y = make(0, 50_000)
    idx = np.minimum(np.floor(z * 4096).astype(int), 4095)
    tol = 50_000 * 2.0**-28
    for field, vals in {"n": np.ones_like(z), "sum_z": z, "sum_y": y, "sum_zz": z * z, "sum_zy": z * y,
                        "sum_vv": (z * (1 - z)) ** 2}.items():
        raw = np.bincount(idx, weights=vals, minlength=4096)
        assert np.abs(getattr(g, field) - raw).max() <= tol, field
    assert g.count == 50_000


def test_merge_associative_and_subtract_inverts():
    a, _, _ = make(1, 1000)
    b, _, _ = make(2, 2000)
    c, _, _ = make(3, 3000)
    assert (a + b) + c == a + (b + c)
    assert (a + b) - b == a
    with pytest.raises(ValueError, match="more events"):
        a - (a + b)


def test_batch_boundaries_do_not_matter():
    g, z, y = make(4, 10_000)
    h = ScoreGrid(4096)
    for i in range(0, 10_000, 777):
        h.update(z[i:i + 777], y[i:i + 777])
    assert g == h


@pytest.mark.parametrize("level", range(0, 13))
def test_coarsening_equals_direct_binning(level):
    g, z, y = make(5, 20_000)
    direct = ScoreGrid(2**level)
    direct.update(z, y)
    assert g.coarsen(2**level) == direct


def test_channels_and_serialisation():
    g, z, y = make(6, 5000, bins=64, channels=3)
    for k in range(3):
        single = ScoreGrid(64)
        single.update(z[:, k], y[:, k])
        assert g.channel(k) == single
    doc = json.loads(json.dumps(g.to_dict()))
    assert ScoreGrid.from_dict(doc) == g
    doc["version"] = 99
    with pytest.raises(ValueError, match="v1"):
        ScoreGrid.from_dict(doc)


def test_rejects_bad_shapes():
    with pytest.raises(ValueError):
        ScoreGrid(0)
    with pytest.raises(ValueError, match="combine"):
        ScoreGrid(8) + ScoreGrid(16)
    with pytest.raises(ValueError, match="divide"):
        ScoreGrid(16).coarsen(3)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.floats(0, 1), st.booleans()), min_size=1, max_size=60), st.integers(1, 6))
def test_property_merge_of_split_equals_whole(pairs, cut):
    z = np.array([p[0] for p in pairs])
    y = np.array([float(p[1]) for p in pairs])
    whole = ScoreGrid(64)
    whole.update(z, y)
    k = min(cut, len(z))
    left, right = ScoreGrid(64), ScoreGrid(64)
    left.update(z[:k], y[:k])
    right.update(z[k:], y[k:])
    assert left + right == whole
    assert whole - right == left
