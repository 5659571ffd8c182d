"""Reference vs current: the within-cell permutation test of a calibration change."""

from __future__ import annotations

import numpy as np
import pytest

from calmon.algorithms.ece import l2_ece_squared
from calmon.algorithms.twosample import calibration_change_test
from calmon.stats.grid import ScoreGrid


def sample(rng, n, a=2.0, b=2.0, temperature=1.0, shift=0.0, cells=1024):
    p = rng.beta(a, b, n)
    y = rng.random(n) < p
    logit = (np.log(p) - np.log1p(-p)) / temperature + shift
    g = ScoreGrid(cells)
    g.update(1 / (1 + np.exp(-logit)), y)
    return g


def test_level_with_different_score_distributions():
    """Reduced benchmarks/twosample_level.py: 300 replications at alpha 0.05 must reject 1.5-9.5 % (4 sd)."""
    rng = np.random.default_rng(11)
    rejections = 0
    for _ in range(300):
        ref = sample(rng, 1500, 2, 2, temperature=0.7, cells=256)
        cur = sample(rng, 1500, 2, 5, temperature=0.7, cells=256)  # same calibration, other scores
        rejections += calibration_change_test(ref, cur, permutations=99, rng=rng).p_value < 0.05
    assert 0.015 <= rejections / 300 <= 0.095, rejections


def test_power_against_a_temperature_change():
    rng = np.random.default_rng(12)
    hits = sum(calibration_change_test(sample(rng, 3000), sample(rng, 3000, temperature=0.6),
                                       permutations=99, rng=rng).decision == "changed" for _ in range(20))
    assert hits >= 17


def test_dpes_agree_with_the_independent_estimator():
    rng = np.random.default_rng(13)
    ref, cur = sample(rng, 5000), sample(rng, 5000, temperature=0.7)
    r = calibration_change_test(ref, cur, permutations=19, bins=16)
    assert r.reference_dpe == pytest.approx(l2_ece_squared(ref, 16), abs=2e-5)
    assert r.current_dpe == pytest.approx(l2_ece_squared(cur, 16), abs=2e-5)
    assert r.statistic == pytest.approx(r.current_dpe - r.reference_dpe)
    assert r.n_reference == 5000 and r.permutations == 19
    assert r.p_value * 20 == pytest.approx(round(r.p_value * 20))  # a permutation p-value: k / (R + 1)
    assert set(r.to_dict()) >= {"statistic", "p_value", "decision", "method"}


def test_identical_grids_never_reject():
    rng = np.random.default_rng(14)
    g = sample(rng, 3000, temperature=0.5)
    assert calibration_change_test(g, g.copy(), permutations=99).p_value > 0.5


def test_bad_input():
    rng = np.random.default_rng(15)
    g = sample(rng, 100)
    with pytest.raises(ValueError, match="same cells"):
        calibration_change_test(g, sample(rng, 100, cells=256))
    with pytest.raises(ValueError, match="need events"):
        calibration_change_test(g, ScoreGrid(1024))
    with pytest.raises(ValueError, match="single-channel"):
        calibration_change_test(ScoreGrid(16, channels=2), ScoreGrid(16, channels=2))
    with pytest.raises(ValueError, match="must divide"):
        calibration_change_test(g, g, bins=15)
    with pytest.raises(ValueError, match="permutations"):
        calibration_change_test(g, g, permutations=0)
