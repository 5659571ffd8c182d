"""Multiclass T-Cal (issue #20): canonical test on the cube partition of the simplex, class-wise and top-label views.

Estimators are checked against a brute force over the simplex cells (explicit pair sums), the exact null
variance against the pairwise trace formula, the level of the exact Monte Carlo test by a reduced
simulation that fails when the level is off; the full tables are ``benchmarks/tcal_multiclass_level.py``.
"""

from __future__ import annotations

import functools
import json
import math
from collections import defaultdict

import numpy as np
import pytest

from calmon.algorithms.tcal import ece2_multiclass_raw, n_levels
from calmon.algorithms.tcal.multiclass import (
    CubeLevel,
    _draw_labels,
    _NullStack,
    canonical_tcal_test,
    check_probs,
    cube_cells,
)
from calmon.algorithms.tcal.views import classwise_tcal_test, top_label_arrays
from calmon.testers import CalibrationData, run_tester


def _calibrated(rng: np.random.Generator, n: int, k: int) -> tuple[np.ndarray, np.ndarray]:
    p = rng.dirichlet(np.ones(k), size=n)
    y = np.minimum((rng.random((n, 1)) > p.cumsum(axis=1)).sum(axis=1), k - 1)
    return p, y


def _cells(p: np.ndarray, m: int) -> dict[tuple[int, ...], list[int]]:
    out: dict[tuple[int, ...], list[int]] = defaultdict(list)
    for j, row in enumerate(p):
        out[tuple(min(int(math.floor(m * x)), m - 1) for x in row)].append(j)
    return out


def _brute(p: np.ndarray, y: np.ndarray, m: int) -> tuple[float, float, float]:
    """DPE, plug-in and exact null variance by explicit loops over the cells and their pairs."""
    n, k = p.shape
    r = np.eye(k)[y] - p
    dpe = plug = var = 0.0
    for members in _cells(p, m).values():
        nc = len(members)
        pair = sum(float(r[a] @ r[b]) for a in members for b in members if a != b)
        dpe += pair / nc
        plug += (pair + sum(float(r[a] @ r[a]) for a in members)) / nc
        sig = [np.diag(p[a]) - np.outer(p[a], p[a]) for a in members]
        var += sum(float(np.trace(sig[i] @ sig[j])) for i in range(nc) for j in range(nc) if i != j) / nc**2
    return dpe / n, plug / n, 2.0 * var / n**2


@pytest.mark.parametrize("k,m", [(3, 2), (3, 4), (4, 2), (4, 8), (5, 4)])
def test_estimators_match_brute_force_over_simplex_cells(k: int, m: int) -> None:
    rng = np.random.default_rng(k * 10 + m)
    p, y = _calibrated(rng, 120, k)
    p = np.round(p, 3)
    p[:, -1] = 1.0 - p[:, :-1].sum(axis=1)  # ties and cell edges included
    p = np.clip(p, 0.0, 1.0)
    dpe, plug, var = _brute(p, y, m)
    res = canonical_tcal_test(p, y, bins=[m], mc=50, rng=0, screen=False, min_resolution=False)
    assert res["statistics"][0] == pytest.approx(dpe, abs=1e-12)
    assert res["plugin"][0] == pytest.approx(plug, abs=1e-12)
    assert res["null_sd"][0] ** 2 == pytest.approx(var, rel=1e-9, abs=1e-15)
    assert ece2_multiclass_raw(p, y, m) == pytest.approx(dpe, abs=1e-12)


def test_cells_are_nested_and_statistic_vectorises_over_draws() -> None:
    rng = np.random.default_rng(1)
    p, y = _calibrated(rng, 400, 3)
    for m in (2, 4, 8, 16):
        fine, _ = cube_cells(p, 2 * m)
        coarse, _ = cube_cells(p, m)
        for c in np.unique(fine):  # every fine cell lies inside one coarse cell
            assert np.unique(coarse[fine == c]).size == 1
    lv = CubeLevel.build(p, 4)
    ys = np.stack([y, np.roll(y, 1), np.zeros_like(y)])
    assert lv.statistic(ys) == pytest.approx([ece2_multiclass_raw(p, row, 4) for row in ys], abs=1e-12)


@pytest.mark.parametrize(("k", "n", "bins"), [(3, 3000, [2, 4, 8, 16, 32, 64, 128, 256]), (10, 2000, [2, 4, 8]),
                                              (4, 600, [3, 6, 12]), (3, 800, [3, 5, 8]), (5, 50, [2, 4])])
def test_batched_null_statistics_equal_each_levels_statistic(k: int, n: int, bins: list[int]) -> None:
    # the Monte Carlo's batched statistic (nested histograms, shared gather) against CubeLevel.statistic,
    # itself checked against brute force above; non-nested bins (3, 5, 8) exercise the per-level path
    rng = np.random.default_rng(k * n)
    p, _ = _calibrated(rng, n, k)
    levels = [CubeLevel.build(p, m) for m in bins]
    cum = np.cumsum(p, axis=1)
    cum /= cum[:, -1:]
    ys = _draw_labels(cum, 40, rng)
    reference = np.stack([lv.statistic(ys) for lv in levels], axis=1)
    assert _NullStack(p, levels).statistics(ys) == pytest.approx(reference, rel=1e-9, abs=1e-13)
    u = np.random.default_rng(0).random((40, n, 1))  # the draws are y* = min(#{k: u > cum_k}, K - 1)
    expected = np.minimum((u > cum[None]).sum(axis=2), k - 1)
    assert np.array_equal(_draw_labels(cum, 40, np.random.default_rng(0)), expected)


def test_null_variance_matches_simulation() -> None:
    rng = np.random.default_rng(2)
    p, _ = _calibrated(rng, 300, 4)
    lv = CubeLevel.build(p, 4)
    cum = p.cumsum(axis=1)
    draws = np.minimum((rng.random((3000, 300, 1)) > cum[None]).sum(axis=2), 3)
    t = lv.statistic(draws)
    assert abs(t.mean()) < 4 * t.std() / math.sqrt(t.size)  # E T^d = 0 under the null
    assert t.var() == pytest.approx(lv.variance(), rel=0.1)


def test_levels_follow_eq7_for_k_classes() -> None:
    rng = np.random.default_rng(3)
    p, y = _calibrated(rng, 2000, 10)
    res = canonical_tcal_test(p, y, rng=0)
    assert res["B_eq7"] == n_levels(2000, 10) and res["bins"] == [2**b for b in range(1, n_levels(2000, 10) + 1)]
    assert res["classes"] == 10 and res["convention"] == "one-hot"
    json.dumps(res, allow_nan=False)


def test_level_of_the_exact_monte_carlo_test_reduced() -> None:
    # 300 replications of the exact test (no screens): binomial sd 0.0126 at 0.05 -> 0.09 is ~3.2 sd
    rng = np.random.default_rng(4)
    rejections = 0
    reps = 300
    for _ in range(reps):
        p, y = _calibrated(rng, 200, 3)
        res = canonical_tcal_test(p, y, rng=rng, screen=False, mc=99, min_resolution=False, bins=[2, 4, 8])
        rejections += res["decision"] == "miscalibrated"
    assert rejections / reps <= 0.09


@pytest.mark.parametrize(("screen", "n", "seed"), [(False, 200, 8), (True, 300, 8)])
def test_level_of_the_minp_combination_reduced(screen: bool, n: int, seed: int) -> None:
    # the default combination (min-p over levels) must hold its level without Bonferroni's conservatism:
    # 400 replications, binomial sd 0.011 at 0.05 -> [0.025, 0.085] is -2.3 / +3.2 sd.  Unscreened: the exact
    # test on 3 levels; screened: every level of eq. (7) (7 at n = 300), both screens on.
    rng = np.random.default_rng(seed)
    rejections = 0
    reps = 400
    for _ in range(reps):
        p, y = _calibrated(rng, n, 3)
        res = canonical_tcal_test(p, y, rng=rng, screen=screen, mc=199 if screen else 99, min_resolution=False,
                                  pilot=50, bins=None if screen else [2, 4, 8])
        assert res["combine"] == "minp"
        rejections += res["decision"] == "miscalibrated"
    assert 0.025 <= rejections / reps <= 0.085


def test_minp_with_one_level_is_that_levels_rank_test() -> None:
    # one level, normal transform (pilot=0), no curtailing: M = q(T) is monotone in T, so the min-p p-value
    # equals the level's rank p-value; the generator's stream is the same (batch sizes do not matter)
    rng = np.random.default_rng(9)
    p, y = _calibrated(rng, 800, 3)
    y[:200] = p[:200].argmax(axis=1)  # some miscalibration, so the p-value is not trivially 1
    run = functools.partial(canonical_tcal_test, p, y, rng=3, bins=[4], screen=False, curtail=False, mc=300,
                            min_resolution=False)
    a, b = run(combine="minp", pilot=0), run(combine="bonferroni")
    assert a["mc_draws"] == b["mc_draws"] == 300
    assert a["p_value"] == pytest.approx(b["p_value"]) and a["p_values"] == pytest.approx(b["p_values"])


def test_cantelli_screen_spends_its_share_of_alpha() -> None:
    rng = np.random.default_rng(10)
    p, y = _calibrated(rng, 3000, 3)
    sharp = p**4 / (p**4).sum(axis=1, keepdims=True)
    res = canonical_tcal_test(sharp, y, rng=0)
    L = len(res["bins"])
    assert res["screen"] == "cantelli-reject" and res["cantelli_share"] == 0.05 and res["mc_draws"] == 0
    assert res["p_value"] == pytest.approx(min(1.0, L * min(res["cantelli_p_values"]) / 0.05))
    ran = canonical_tcal_test(sharp, y, rng=0, cantelli_share=0.0, mc=50, min_resolution=False)
    assert ran["screen"] is None and ran["mc_draws"] > 0 and ran["decision"] == "miscalibrated"
    mid = canonical_tcal_test(p, y, rng=0, accept_margin=None)  # calibrated: the simulation decides
    assert mid["screen"] is None and mid["p_value"] == pytest.approx(min(
        mid["mc_p_value"] / 0.95, L * min(mid["cantelli_p_values"]) / 0.05))
    with pytest.raises(ValueError, match="combine"):
        canonical_tcal_test(p, y, combine="fisher")
    with pytest.raises(ValueError, match="cantelli_share"):
        canonical_tcal_test(p, y, cantelli_share=1.0)
    with pytest.raises(ValueError, match="pilot"):
        canonical_tcal_test(p, y, pilot=-1)


def test_power_against_temperature_and_single_class_bias() -> None:
    rng = np.random.default_rng(5)
    p, y = _calibrated(rng, 3000, 3)
    sharp = p**2 / (p**2).sum(axis=1, keepdims=True)  # temperature 0.5
    assert canonical_tcal_test(sharp, y, rng=0)["decision"] == "miscalibrated"
    biased = 0.85 * p
    biased[:, 0] += 0.15
    cw = classwise_tcal_test(biased, y, rng=0)
    assert cw["decision"] == "miscalibrated" and cw["p_value"] <= 0.05
    assert canonical_tcal_test(p, y, rng=0)["decision"] == "calibrated"


def test_classwise_is_bonferroni_over_classes() -> None:
    rng = np.random.default_rng(6)
    p, y = _calibrated(rng, 1500, 4)
    res = classwise_tcal_test(p, y, rng=0, stop_early=False)
    pv = [v for v in res["class_p_values"] if v is not None]
    assert len(pv) == 4
    assert res["p_value"] == pytest.approx(min(1.0, 4 * min(pv)))
    z, c = top_label_arrays(p, y)
    assert np.array_equal(z, p.max(axis=1)) and np.array_equal(c, (p.argmax(axis=1) == y).astype(float))


def test_bad_input_gets_a_clear_error() -> None:
    with pytest.raises(ValueError, match="sum to 1"):
        check_probs(np.array([[0.5, 0.4, 0.3]]), np.array([0]))
    with pytest.raises(ValueError, match="labels"):
        check_probs(np.array([[0.5, 0.3, 0.2]]), np.array([3]))
    with pytest.raises(ValueError, match="shape"):
        canonical_tcal_test(np.ones((3, 3)) / 3, np.zeros(2, dtype=int))
    res = canonical_tcal_test(np.array([[0.2, 0.3, 0.5]]), np.array([1]))
    assert res["decision"] == "insufficient data"


def test_tester_reports_three_views_on_multiclass_data_and_keeps_binary_json() -> None:
    rng = np.random.default_rng(7)
    p, y = _calibrated(rng, 2000, 4)
    z, c = top_label_arrays(p, y)
    data = CalibrationData(n=2000, z=z, y=c, probs=p, labels=y, raw_is_complete=True)
    res = run_tester("tcal", data, mc=200, seed=1).to_dict()
    json.dumps(res, allow_nan=False)
    views = res["views"]
    assert set(views) == {"canonical", "top_label", "classwise"}
    assert res["decision"] == views["canonical"]["decision"] and res["notion"] == "canonical"
    assert views["classwise"]["method"] == "classwise-bonferroni" and views["top_label"]["source"] == "raw"
    binary = run_tester("tcal", CalibrationData(n=2000, z=z, y=c, raw_is_complete=True), mc=200, seed=1).to_dict()
    assert "views" not in binary and binary == views["top_label"]  # the binary result is unchanged
    off = run_tester("tcal", data, mc=200, seed=1, views=False).to_dict()
    assert "views" not in off
    sample = CalibrationData(n=50000, z=z, y=c, probs=p, labels=y, raw_is_complete=False)
    assert run_tester("tcal", sample, mc=200, seed=1).to_dict()["source"] == "reservoir"
