"""Isotonic regression (vs scikit-learn and scipy) and equal-mass histogram binning (vs brute force)."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import optimize

from calmon.calibration.histogram import HistogramCalibrator
from calmon.calibration.isotonic import IsotonicCalibrator, pava
from calmon.stats.grid import ScoreGrid


def _data(seed: int, n: int, ties: bool = False) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    z = rng.uniform(size=n)
    if ties:
        z = np.round(z, 2)
    y = (rng.uniform(size=n) < z**2).astype(float)
    return z, y


@pytest.mark.parametrize(("seed", "ties"), [(0, False), (1, True), (2, False)])
def test_isotonic_matches_sklearn(seed: int, ties: bool) -> None:
    from sklearn.isotonic import IsotonicRegression

    z, y = _data(seed, 3000, ties)
    w = np.random.default_rng(seed + 10).uniform(0.5, 2.0, z.size) if seed == 2 else None
    ours = IsotonicCalibrator().fit(z, y, sample_weight=w)
    ref = IsotonicRegression(out_of_bounds="clip", y_min=0, y_max=1).fit(z, y, sample_weight=w)
    grid = np.linspace(-0.01, 1.0, 2001).clip(0, 1)
    np.testing.assert_allclose(ours.predict(grid), ref.predict(grid), atol=1e-12)
    np.testing.assert_allclose(ours.predict(z), ref.predict(z), atol=1e-12)


def test_pava_matches_scipy_and_is_optimal() -> None:
    rng = np.random.default_rng(3)
    y = rng.normal(size=500).cumsum() * 0.1 + rng.normal(size=500)
    w = rng.uniform(0.1, 3.0, 500)
    ours = pava(y, w)
    ref = optimize.isotonic_regression(y, weights=w).x
    np.testing.assert_allclose(ours, ref, atol=1e-10)
    assert (np.diff(ours) >= -1e-12).all()
    # small brute-force check: the fit beats random monotone perturbations
    loss = np.sum(w * (y - ours) ** 2)
    for _ in range(20):
        alt = np.sort(ours + rng.normal(scale=0.01, size=ours.size))
        assert np.sum(w * (y - alt) ** 2) >= loss - 1e-9


def test_isotonic_on_grid_equals_weighted_fit_on_cell_means() -> None:
    z, y = _data(4, 20000)
    g = ScoreGrid(256)
    g.update(z, y)
    cal = IsotonicCalibrator().fit_grid(g)
    keep = g.n > 0
    # independent: scipy PAVA on the cell points, weights = counts
    xs = g.mean_z[keep]
    fy = optimize.isotonic_regression(g.sum_y[keep] / g.n[keep], weights=g.n[keep]).x
    np.testing.assert_allclose(cal.predict(np.clip(xs, 0, 1)), fy, atol=1e-10)
    # and close to the raw fit
    raw = IsotonicCalibrator().fit(z, y)
    t = np.linspace(0.05, 0.95, 50)
    assert np.max(np.abs(raw.predict(t) - cal.predict(t))) < 0.1


def test_histogram_equal_mass_bins_and_values() -> None:
    z, y = _data(5, 3000)
    cal = HistogramCalibrator(bins=15).fit(z, y)
    idx = np.searchsorted(cal.edges, z, side="right")
    counts = np.bincount(idx, minlength=15)
    assert cal.edges.size == 14 and counts.min() >= 199 and counts.max() <= 201
    for k in range(15):  # brute force: each bin predicts the mean outcome of its points
        assert cal.values[k] == pytest.approx(y[idx == k].mean(), abs=1e-12)
    np.testing.assert_allclose(cal.predict(z), cal.values[idx])


def test_histogram_ties_and_grid() -> None:
    z, y = _data(6, 5000, ties=True)
    cal = HistogramCalibrator(bins=10).fit(z, y)
    assert cal.edges.size <= 9 and np.all(np.diff(cal.edges) > 0)
    g = ScoreGrid(4096)
    g.update(z, y)
    cg = HistogramCalibrator(bins=10).fit_grid(g)
    t = np.linspace(0, 1, 101)
    # with 0.01-spaced ties and 4096 cells, cell edges separate the same tie groups
    assert np.max(np.abs(cg.predict(t) - cal.predict(t))) < 0.05
    n_bin = np.bincount(np.searchsorted(cg.edges, z, side="right"))
    assert n_bin.sum() == z.size and n_bin.max() < 0.2 * z.size
