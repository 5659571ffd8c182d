"""Exact smCE dynamic program vs. LPs solved by HiGHS, binning bound, testers and their level."""

from __future__ import annotations

import json

import numpy as np
import pytest

from calmon.algorithms.smooth import (
    grid_points,
    smce,
    smce_chain_lp,
    smce_grid,
    smce_null_pvalue,
    smce_null_pvalue_grid,
    smce_pairwise_lp,
    smce_points,
    smce_tolerant,
    smce_witness,
)
from calmon.algorithms.smooth.dp import smce_dp
from calmon.stats.grid import ScoreGrid
from calmon.testers import TESTERS, CalibrationData, run_tester
from calmon.testers.smce import smce_tester


def _instance(rng: np.random.Generator, n: int) -> tuple[np.ndarray, np.ndarray]:
    """Scores with ties/duplicates (rounded to 1-3 decimals, sometimes exact 0/1) and random-rate outcomes."""
    kind = rng.integers(4)
    if kind == 0:
        z = np.round(rng.random(n), int(rng.integers(1, 4)))
    elif kind == 1:
        z = rng.choice(np.array([0.0, 0.25, 0.5, 1.0]), n)
    else:
        z = rng.random(n)
    shift = rng.uniform(-0.3, 0.3) if kind != 3 else 0.0
    y = (rng.random(n) < np.clip(z + shift, 0, 1)).astype(float)
    return z, y


def test_dp_equals_chain_lp_1000_instances() -> None:
    rng = np.random.default_rng(20240501)
    worst = 0.0
    for _ in range(1000):
        n = int(rng.integers(1, 60))
        z, y = _instance(rng, n)
        dp = smce(z, y)
        lp, _, _ = smce_chain_lp(z, y - z, n)
        worst = max(worst, abs(dp - lp))
    assert worst <= 1e-9, worst


def test_dp_equals_chain_lp_weighted_points() -> None:
    # arbitrary real residual sums (not y - z), points with ties, random normaliser
    rng = np.random.default_rng(7)
    for _ in range(300):
        k = int(rng.integers(1, 80))
        v = np.round(rng.random(k), int(rng.integers(1, 4)))
        r = rng.normal(size=k) * rng.choice([0.01, 1.0, 100.0])
        total = float(rng.uniform(1, 1000))
        lp = smce_chain_lp(v, r, total)[0]
        assert smce_points(v, r, total) == pytest.approx(lp, abs=1e-9 * abs(r).max() / total)


def test_dp_equals_full_pairwise_lp_small_n() -> None:
    rng = np.random.default_rng(11)
    for _ in range(200):
        n = int(rng.integers(1, 31))
        z, y = _instance(rng, n)
        assert abs(smce(z, y) - smce_pairwise_lp(z, y - z, n)) <= 1e-9


def test_dp_equals_chain_lp_larger_n() -> None:
    rng = np.random.default_rng(3)
    for n in (2000, 5000):
        z = rng.random(n)
        y = (rng.random(n) < z ** 1.3).astype(float)
        assert abs(smce(z, y) - smce_chain_lp(z, y - z, n)[0]) <= 1e-9


def test_closed_forms_and_invariances() -> None:
    rng = np.random.default_rng(5)
    # a single distinct score: smCE = |mean residual|
    y = (rng.random(50) < 0.3).astype(float)
    assert smce(np.full(50, 0.6), y) == pytest.approx(abs(y.mean() - 0.6), abs=1e-15)
    # residuals of one sign: w = +-1, smCE = |mean residual|
    z = rng.random(100)
    assert smce(z, np.ones(100)) == pytest.approx(np.mean(1 - z), abs=1e-12)
    assert smce(z, np.zeros(100)) == pytest.approx(np.mean(z), abs=1e-12)
    # permutation invariance and the lower bound |mean(y - z)|
    for _ in range(20):
        z, y = _instance(rng, 200)
        perm = rng.permutation(200)
        val = smce(z, y)
        assert smce(z[perm], y[perm]) == pytest.approx(val, abs=1e-12)
        assert val >= abs(np.mean(y - z)) - 1e-12
        # smCE is 1-homogeneous in the residuals and a weighted point equals its duplicated events
        assert smce_points(z, 3 * (y - z), 200) == pytest.approx(3 * val, abs=1e-12)
        assert smce_points(np.r_[z, z], np.r_[y - z, y - z], 400) == pytest.approx(val, abs=1e-12)


def test_witness_attains_value_and_is_lipschitz() -> None:
    rng = np.random.default_rng(9)
    for _ in range(20):
        z, y = _instance(rng, int(rng.integers(2, 300)))
        wit = smce_witness(z, y)
        pts, w = wit["points"], wit["w"]
        assert np.all(np.abs(w) <= 1 + 1e-9)
        assert np.all(np.abs(np.diff(w)) <= np.diff(pts) + 1e-9)
        achieved = np.mean((y - z) * np.interp(z, pts, w))
        assert achieved == pytest.approx(smce(z, y), abs=1e-8)
        assert wit["value"] == pytest.approx(smce(z, y), abs=1e-9)


def test_witness_direction() -> None:
    # under-prediction below 0.5, over-prediction above: w > 0 low, w < 0 high
    rng = np.random.default_rng(1)
    z = rng.random(4000)
    y = (rng.random(4000) < np.where(z < 0.5, z + 0.2, z - 0.2)).astype(float)
    g = ScoreGrid(4096)
    g.update(z, y)
    wit = smce_witness(grid=g.coarsen(64))
    w_lo, w_hi = np.interp([0.2, 0.8], wit["points"], wit["w"])
    assert w_lo - w_hi > 0.5  # at most 0.6 by the Lipschitz constraint
    assert wit["w"][-1] == pytest.approx(-1.0)


@pytest.mark.parametrize("bins", [4096, 256, 16])
def test_grid_within_binning_bound(bins: int) -> None:
    rng = np.random.default_rng(bins)
    for k in range(15):
        n = int(rng.integers(50, 5000))
        z = rng.random(n) ** rng.uniform(0.5, 2)
        y = (rng.random(n) < np.clip(z + rng.uniform(-0.2, 0.2) * (k % 3), 0, 1)).astype(float)
        raw = smce(z, y)
        g = ScoreGrid(4096)
        g.update(z, y)
        for point, factor in (("center", 0.5), ("mean", 1.0)):
            res = smce_grid(g, point=point, bins=bins)
            h_bound = factor / bins * np.mean(np.abs(y - z)) + 1e-8
            assert res["error_bound"] <= h_bound + 1e-9
            assert abs(res["value"] - raw) <= res["error_bound"], (point, bins, res, raw)


def test_grid_points_residuals_exact() -> None:
    rng = np.random.default_rng(2)
    z = rng.random(1000)
    y = (rng.random(1000) < z).astype(float)
    g = ScoreGrid(64)
    g.update(z, y)
    pts = grid_points(g)
    cell = np.minimum((z * 64).astype(int), 63)
    expect = np.bincount(cell, weights=y - z, minlength=64)
    assert np.allclose(pts["r"], expect[np.bincount(cell, minlength=64) > 0], atol=1e-6)
    assert pts["mean_abs_residual"] == pytest.approx(np.mean(np.abs(y - z)), abs=1e-6)


def test_validation_errors() -> None:
    with pytest.raises(ValueError, match="same length"):
        smce([0.1, 0.2], [1])
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        smce([1.2], [1])
    with pytest.raises(ValueError, match="0 or 1"):
        smce([0.2], [0.5])
    with pytest.raises(ValueError, match="empty"):
        smce([], [])
    with pytest.raises(ValueError, match="eps1 > 4 eps2"):
        smce_tolerant(0.01, 1000, eps1=0.04, eps2=0.01)
    with pytest.raises(ValueError, match="no events"):
        smce_grid(ScoreGrid(16))


def test_tolerant_rule() -> None:
    # Theorem 3: alpha = eps1/2 - 2 eps2, threshold = 2 eps2 + alpha/2, n >= C/(eps1 - 4 eps2)^2
    res = smce_tolerant(0.0, 10**6, eps1=0.1, eps2=0.01, C=64)
    assert res["alpha"] == pytest.approx(0.03)
    assert res["threshold"] == pytest.approx(0.035)
    assert res["n_required"] == int(np.ceil(64 / 0.06 ** 2))
    assert smce_tolerant(0.0349, 10**6, 0.1, 0.01)["decision"] == "calibrated"
    assert smce_tolerant(0.0351, 10**6, 0.1, 0.01)["decision"] == "miscalibrated"
    assert smce_tolerant(0.0, 17000, 0.1, 0.01)["decision"] == "insufficient data"
    assert smce_tolerant(0.0, 10**6, 0.1, 0.01, error_bound=0.01)["decision"] == "insufficient data"


def test_tolerant_tester_separates_far_and_close() -> None:
    # synthetic family of the paper: dCE = eps*; smCE >= dCE/2
    rng = np.random.default_rng(12)
    n = 40000
    for eps_star, expect in ((0.0, "calibrated"), (0.2, "miscalibrated")):
        z = rng.uniform(0, 1 - eps_star, n)
        y = (rng.random(n) < z + eps_star).astype(float)
        data = CalibrationData(n=n, z=z, y=y, raw_is_complete=True)
        res = smce_tester(data, alpha=0.05, mc=0, rng=rng, eps1=0.2)
        assert res["decision"] == expect, res


def test_registered_tester_raw_and_grid() -> None:
    assert "smce" in TESTERS
    rng = np.random.default_rng(4)
    n = 30000
    z = rng.random(n)
    y = (rng.random(n) < np.clip(z + 0.05, 0, 1)).astype(float)
    g = ScoreGrid(4096)
    g.update(z, y)
    raw = run_tester("smce", CalibrationData(n=n, z=z, y=y, grid=g, raw_is_complete=True), mc=99,
                     seed=1).to_dict()
    win = run_tester("smce", CalibrationData(n=n, z=z[:2000], y=y[:2000], grid=g), mc=99, seed=1).to_dict()
    json.dumps(raw)
    json.dumps(win)
    assert raw["source"] == "raw" and win["source"] == "grid4096"
    assert abs(raw["value"] - win["value"]) <= win["error_bound"]
    for res in (raw, win):
        assert res["decision"] == "miscalibrated" and res["p_value"] <= 0.01
        assert res["bounds"][0] <= res["value"] <= res["bounds"][1]
        for key in ("statistic", "value", "bounds", "threshold", "p_value", "decision", "method"):
            assert key in res
    few = run_tester("smce", CalibrationData(n=5, z=z[:5], y=y[:5], raw_is_complete=True), mc=9).to_dict()
    assert few["decision"] == "insufficient data"
    # no simulation: Theorem 3 with eps2 = 0 and eps1 = sqrt(64/n), threshold 2/sqrt(n)
    nosim = run_tester("smce", CalibrationData(n=n, grid=g), mc=0).to_dict()
    assert nosim["rule"] == "theorem3-default" and nosim["threshold"] == pytest.approx(2 / np.sqrt(n))
    assert nosim["decision"] == ("miscalibrated" if nosim["value"] > 2 / np.sqrt(n) else "calibrated")


def test_level_raw_resampling_reduced() -> None:
    # 200 replications of calibrated data, n = 150, 99 null draws: rejection rate near 0.05
    rng = np.random.default_rng(2024)
    reps, rejections = 200, 0
    for _ in range(reps):
        z = rng.beta(2, 3, 150)
        y = (rng.random(150) < z).astype(float)
        rejections += smce_null_pvalue(z, y, mc=99, rng=rng)["p_value"] <= 0.05
    rate = rejections / reps
    assert 0.01 <= rate <= 0.11, rate  # sd 0.015 at 0.05


def test_level_grid_binomial_reduced() -> None:
    rng = np.random.default_rng(77)
    reps, rejections = 150, 0
    for _ in range(reps):
        z = rng.random(3000)
        y = (rng.random(3000) < z).astype(float)
        g = ScoreGrid(4096)
        g.update(z, y)
        rejections += smce_null_pvalue_grid(g, mc=99, rng=rng, bins=128)["p_value"] <= 0.05
    rate = rejections / reps
    assert 0.005 <= rate <= 0.12, rate


@pytest.mark.parametrize("shift", [0.0, 0.02, 0.05])
def test_curtailed_null_same_decision_as_all_draws(shift: float) -> None:
    # Besag-Clifford curtailing: the curtailed run's draws are a prefix of the full run's (same seed), so the
    # decision at alpha must be the same; a curtailed p-value exceeds alpha, an uncurtailed one is the full one
    rng = np.random.default_rng(int(shift * 1000) + 5)
    for rep in range(12):
        z = rng.random(2500)
        y = (rng.random(2500) < np.clip(z + shift, 0, 1)).astype(float)
        g = ScoreGrid(4096)
        g.update(z, y)
        full = smce_null_pvalue_grid(g, mc=199, rng=np.random.default_rng(rep), bins=128, curtail=False)
        cut = smce_null_pvalue_grid(g, mc=199, rng=np.random.default_rng(rep), bins=128)
        assert (cut["p_value"] < 0.05) == (full["p_value"] < 0.05)
        assert not full["curtailed"] and full["mc"] == 199
        if cut["curtailed"]:
            assert cut["p_value"] > 0.05 and cut["mc"] < 199
        else:
            assert cut["p_value"] == full["p_value"] and cut["mc"] == 199
        raw = smce_null_pvalue(z[:300], y[:300], mc=99, rng=np.random.default_rng(rep))
        raw_full = smce_null_pvalue(z[:300], y[:300], mc=99, rng=np.random.default_rng(rep), curtail=False)
        assert (raw["p_value"] < 0.05) == (raw_full["p_value"] < 0.05)


def test_curtailed_null_is_cheap_and_valid_on_calibrated_data() -> None:
    # under the null the curtailed p-value is a valid p-value, P(p <= u) <= u (Besag and Clifford 1991, and
    # the simulation stops after few draws: h = ceil(0.05 * 1000) = 50 exceedances take ~100 draws on average
    rng = np.random.default_rng(11)
    reps, draws, pvals = 120, [], []
    for _ in range(reps):
        z = rng.random(2000)
        y = (rng.random(2000) < z).astype(float)
        g = ScoreGrid(4096)
        g.update(z, y)
        res = smce_null_pvalue_grid(g, mc=999, rng=rng, bins=64)
        draws.append(res["mc"])
        pvals.append(res["p_value"])
    assert np.median(draws) < 250, np.median(draws)
    p = np.asarray(pvals)
    for u in (0.1, 0.3, 0.5):  # binomial sd at u = 0.5 over 120 reps: 0.046
        assert np.mean(p <= u) <= u + 0.13, (u, np.mean(p <= u))
    assert np.mean(p <= 0.5) >= 0.25  # and not degenerate: p spreads over (0, 1]


def test_power_against_miscalibration() -> None:
    rng = np.random.default_rng(8)
    z = rng.random(3000)
    y = (rng.random(3000) < np.clip(z + 0.06, 0, 1)).astype(float)
    assert smce_null_pvalue(z[:1500], y[:1500], mc=99, rng=rng)["p_value"] <= 0.05
    g = ScoreGrid(4096)
    g.update(z, y)
    assert smce_null_pvalue_grid(g, mc=99, rng=rng, bins=256)["p_value"] <= 0.05


def test_dp_heap_fallback_any_pivot() -> None:
    # the DP splits its heaps at a pivot breakpoint and falls back to two full heaps when a side runs
    # empty; any pivot must give the same exact value (pivot 0 or m - 1 forces the fallback at once)
    rng = np.random.default_rng(31)
    for _ in range(300):
        n = int(rng.integers(1, 60))
        z, y = _instance(rng, n)
        vu, inv = np.unique(z, return_inverse=True)
        c = np.bincount(inv, weights=y - z) / n
        ref = smce_chain_lp(z, y - z, n)[0]
        for pivot in (0, vu.size - 1, int(rng.integers(0, vu.size))):
            assert abs(smce_dp(vu, c, pivot=pivot) - ref) <= 1e-9
