"""LDTC linear program: dual certificate, closed forms, smCE sandwich, binning bound, Theorem 4 tester."""

from __future__ import annotations

import json

import numpy as np
import pytest

from calmon.algorithms.ldtc import (
    ldtc,
    ldtc_dual_value,
    ldtc_grid,
    ldtc_lp,
    ldtc_tolerant,
    theorem4_resolution,
    u_grid,
)
from calmon.algorithms.smooth import smce
from calmon.stats.grid import ScoreGrid
from calmon.testers import TESTERS, CalibrationData, run_tester


def _random_points(rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    k = int(rng.integers(1, 12))
    v = np.round(rng.random(k), 2)
    n1 = rng.integers(0, 6, k).astype(float)
    n0 = rng.integers(0, 6, k).astype(float)
    n1[0] += 1
    return v, n1, n0


def test_strong_duality_certificate() -> None:
    # the hand-derived dual function at HiGHS' multipliers equals the primal value; random multipliers
    # give lower bounds (weak duality)
    rng = np.random.default_rng(1)
    for _ in range(60):
        v, n1, n0 = _random_points(rng)
        u = u_grid(int(rng.integers(2, 30)))
        res = ldtc_lp(v, n1, n0, u, return_dual=True)
        assert ldtc_dual_value(v, n1, n0, u, res["dual"]) == pytest.approx(res["value"], abs=1e-8)
        for _ in range(3):
            assert ldtc_dual_value(v, n1, n0, u, rng.normal(size=u.size)) <= res["value"] + 1e-9


def test_coupling_is_calibrated_and_has_data_marginal() -> None:
    rng = np.random.default_rng(2)
    v, n1, n0 = _random_points(rng)
    res = ldtc_lp(v, n1, n0, u_grid(21))
    ok = res["mass_u"] > 1e-9
    assert res["mass_u"].sum() == pytest.approx(1.0)
    assert np.allclose(res["mean_y_u"][ok], res["u"][ok], atol=1e-6)


def test_single_score_closed_form() -> None:
    # one score a with positive fraction p on the grid: dCE = |p - a| (E|u - a| >= |E u - a| = |p - a|)
    rng = np.random.default_rng(3)
    for _ in range(20):
        a = float(rng.random())
        k = int(rng.integers(0, 11))
        res = ldtc_lp([a], [k], [10 - k], u_grid(11))
        assert res["value"] == pytest.approx(abs(k / 10 - a), abs=1e-9)


def test_calibrated_points_have_zero_distance() -> None:
    v = np.array([0.0, 0.25, 0.5, 1.0])
    assert ldtc_lp(v, [0, 1, 2, 3], [3, 3, 2, 0], u_grid(5))["value"] == pytest.approx(0.0, abs=1e-12)


def test_smce_sandwich_lemma12_and_mean_bound() -> None:
    # dCE/2 <= smCE <= 2 dCE with dCE <= dCE^U <= dCE + s, and dCE >= |mean(y - z)|
    rng = np.random.default_rng(4)
    for _ in range(25):
        n = int(rng.integers(5, 120))
        z = np.round(rng.random(n), 2)
        y = (rng.random(n) < np.clip(z + rng.uniform(-0.3, 0.3), 0, 1)).astype(float)
        res = ldtc(z, y, u_grid(41))
        s = res["grid_error"]
        sm = smce(z, y)
        assert sm <= 2 * res["value"] + 1e-9
        assert res["value"] - s <= 2 * sm + 1e-9
        assert res["value"] >= abs(np.mean(y - z)) - 1e-9


def test_grid_refinement_decreases_to_common_limit() -> None:
    rng = np.random.default_rng(5)
    z = rng.random(60)
    y = (rng.random(60) < z ** 2).astype(float)
    coarse = ldtc(z, y, u_grid(11))["value"]
    fine = ldtc(z, y, u_grid(101))["value"]  # u_grid(101) contains u_grid(11)
    finest = ldtc(z, y, u_grid(401))["value"]
    assert fine <= coarse + 1e-12 and finest <= fine + 1e-12
    assert coarse - finest <= 0.1 + 1e-12 and fine - finest <= 0.01 + 1e-12


@pytest.mark.parametrize("bins", [16, 64, 256])
def test_binned_within_half_cell_of_raw(bins: int) -> None:
    rng = np.random.default_rng(bins)
    u = u_grid(51)
    for _ in range(4):
        n = 400
        z = rng.random(n)
        y = (rng.random(n) < np.clip(z + rng.uniform(-0.2, 0.2), 0, 1)).astype(float)
        g = ScoreGrid(4096)
        g.update(z, y)
        raw = ldtc(z, y, u)["value"]
        binned = ldtc_grid(g, bins=bins, u=u)
        assert abs(binned["value"] - raw) <= 0.5 / bins + 1e-9
        lo, hi = binned["bounds"]
        assert lo <= raw <= hi + binned["grid_error"]


def test_validation() -> None:
    with pytest.raises(ValueError, match="contain both 0 and 1"):
        ldtc_lp([0.5], [1], [1], [0.0, 0.5])
    with pytest.raises(ValueError, match="non-negative"):
        ldtc_lp([0.5], [-1], [1])
    with pytest.raises(ValueError, match="0 or 1"):
        ldtc([0.5], [2])
    with pytest.raises(ValueError, match="eps2 < eps1"):
        ldtc_tolerant(0.1, 1000, eps1=0.05, eps2=0.05)


def test_tolerant_rule_theorem4() -> None:
    res = ldtc_tolerant(0.0, 10**6, eps1=0.06, eps2=0.02, C=36)
    assert res["alpha"] == pytest.approx(0.04) and res["threshold"] == pytest.approx(0.04)
    assert res["n_required"] == int(np.ceil(36 / 0.04 ** 2))
    assert ldtc_tolerant(0.0399, 10**6, 0.06, 0.02)["decision"] == "calibrated"
    assert ldtc_tolerant(0.0401, 10**6, 0.06, 0.02)["decision"] == "miscalibrated"
    assert ldtc_tolerant(0.0, 20000, 0.06, 0.02)["decision"] == "insufficient data"


def test_registered_tester_decisions() -> None:
    assert "ldtc" in TESTERS
    rng = np.random.default_rng(6)
    n = 20000
    for eps_star, expect in ((0.0, "calibrated"), (0.1, "miscalibrated")):
        z = rng.uniform(0, 1 - eps_star, n)
        y = (rng.random(n) < z + eps_star).astype(float)
        g = ScoreGrid(4096)
        g.update(z, y)
        for data in (CalibrationData(n=n, z=z, y=y, raw_is_complete=True), CalibrationData(n=n, grid=g)):
            res = run_tester("ldtc", data, eps1=0.06, eps2=0.01, bins=64).to_dict()  # h/2 = 0.0078 <= alpha/6
            json.dumps(res)
            assert res["decision"] == expect, res
            assert res["bounds"][0] <= eps_star + 1e-3 or expect == "miscalibrated"
            assert res["u_points"] >= 6 / 0.05 and res["bins"] == 64
    small = run_tester("ldtc", CalibrationData(n=300, z=z[:300], y=y[:300], raw_is_complete=True),
                       eps1=0.06).to_dict()
    assert small["decision"] == "insufficient data"


def test_default_resolution_and_speed_budget() -> None:
    # defaults: 256 cells and a 101-point grid for eps1 >= 0.06
    b, m = theorem4_resolution(0.06, 4096, 256, 1024, 101, 401)
    assert (b, m) == (256, 101)
    b, m = theorem4_resolution(0.02, 4096, 256, 1024, 101, 401)
    assert m == 301 and 0.5 / b <= 0.02 / 6


# ----------------------------------------------------------------------------------------------------------
# the null-simulation p-value (issue #20)
# ----------------------------------------------------------------------------------------------------------
def test_fixed_lp_matches_the_full_lp() -> None:
    from calmon.algorithms.ldtc import FixedLP, ldtc_lp
    rng = np.random.default_rng(11)
    v = np.sort(rng.random(12))
    lp = FixedLP(v, u_grid(21))
    for _ in range(3):
        n = rng.integers(1, 40, v.size).astype(float)
        n1 = rng.binomial(n.astype(int), v).astype(float)
        n1[0] = 0.0  # an empty (v, y) pair stays in the fixed LP with mass 0
        assert lp.solve(n1, n - n1) == pytest.approx(ldtc_lp(v, n1, n - n1, u_grid(21))["value"], abs=1e-9)


def test_null_pvalue_level_reduced_and_power() -> None:
    from calmon.algorithms.ldtc import ldtc_null_pvalue
    # 60 calibrated replications at alpha 0.05 (expected 3, sd 1.7): more than 8 rejections fails;
    # the on-demand table with 1000 replications is benchmarks/ldtc_level.py
    rng = np.random.default_rng(12)
    rejections = 0
    for _ in range(60):
        z = rng.random(1500)
        g = ScoreGrid(1024)
        g.update(z, (rng.random(1500) < z).astype(float))
        rejections += ldtc_null_pvalue(g, mc=39, rng=rng)["p_value"] <= 0.05
    assert rejections <= 8
    z = rng.random(3000)
    g = ScoreGrid(1024)
    g.update(z, (rng.random(3000) < z**1.6).astype(float))
    res = ldtc_null_pvalue(g, mc=39, rng=rng)
    assert res["p_value"] <= 0.05 and res["mc_draws"] == 39 and not res["curtailed"]


def test_tester_reports_p_value_and_one_decision_rule_with_smce() -> None:
    rng = np.random.default_rng(13)
    z = rng.random(4000)
    y = (rng.random(4000) < z**1.5).astype(float)
    data = CalibrationData(n=4000, z=z, y=y, raw_is_complete=True)
    res = run_tester("ldtc", data, mc=99, seed=1, bins=64).to_dict()
    assert res["rule"] == "p-value" and res["p_value"] is not None
    assert res["decision"] == ("miscalibrated" if res["p_value"] < 0.05 else "calibrated") == "miscalibrated"
    assert run_tester("smce", data, mc=99, seed=1).to_dict()["decision"] == res["decision"]
    tol = run_tester("ldtc", data, mc=99, seed=1, bins=64, eps1=0.3).to_dict()
    assert tol["rule"] == "theorem4" and tol["p_value"] is not None
    none = run_tester("ldtc", data, mc=0, seed=1, bins=64).to_dict()
    assert none["p_value"] is None and none["rule"] == "theorem4-default"
