"""The plain-words verdict: direction on simulated data, the decision rule, regions, the ECE interval's coverage."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest

from calmon.evaluate.verdict import RECOMMENDED, summarize
from calmon.stats.grid import ScoreGrid
from calmon.testers import CalibrationData, run_tester
from connectors.simulation import SimulationSpec, Simulator

REJECT = {"tcal": {"statistic": 1.0, "p_value": 0.0, "decision": "miscalibrated", "method": "mc-grid"}}


def simulated(miscalibration: str, classes: int = 2, n: int = 20000, seed: int = 1) -> tuple[np.ndarray, np.ndarray]:
    """Binary scores and outcomes, or top-label confidence and correctness, from connectors.simulation."""
    sim = Simulator(SimulationSpec(classes=classes, seed=seed, miscalibration=miscalibration))
    x, y = sim._draw(n, sim.before)
    if classes == 2:
        return x, y.astype(float)
    return x.max(axis=1), (x.argmax(axis=1) == y).astype(float)


def grid_of(z: np.ndarray, y: np.ndarray, bins: int = 1024) -> ScoreGrid:
    g = ScoreGrid(bins)
    g.update(z, y)
    return g


def real_tests(z: np.ndarray, y: np.ndarray, g: ScoreGrid) -> dict[str, dict[str, Any]]:
    data = CalibrationData(n=len(z), grid=g)
    return {name: run_tester(name, data, alpha=0.05, mc=199, seed=0).to_dict() for name in ("tcal", "smce")}


@pytest.mark.parametrize("mis,classes,expected", [
    ("temperature:0.6", 2, "over-confident"),
    ("temperature:1.7", 2, "under-confident"),
    ("bias:0.5", 2, "biased up"),
    ("bias:-0.5", 2, "biased down"),
    ("bump:1,30,4", 2, "mixed"),
    ("temperature:0.6", 3, "over-confident"),
    ("temperature:1.7", 3, "under-confident"),
    ("none", 2, None),
    ("none", 3, None),
])
def test_direction_on_simulated_data_with_the_real_tests(mis, classes, expected):
    z, y = simulated(mis, classes)
    g = grid_of(z, y)
    s = summarize(g, real_tests(z, y, g), alpha=0.05, top_label=classes > 2)
    assert s.calibrated is (expected is None)
    assert s.direction == expected
    if expected is None:
        assert s.text.startswith("Calibrated") and s.regions == ()
    else:
        assert s.text.startswith("Miscalibrated") and expected in s.text
        assert RECOMMENDED[expected] in s.recommendation


@pytest.mark.parametrize("seed", range(3))
def test_direction_does_not_depend_on_the_seed(seed):
    for mis, expected in (("temperature:0.7", "over-confident"), ("bias:0.4", "biased up")):
        z, y = simulated(mis, 2, 10000, seed=10 + seed)
        assert summarize(grid_of(z, y), REJECT, alpha=0.05).direction == expected


def test_binary_direction_is_relative_to_one_half():
    # over-confident binary scores: the LOW bins sit ABOVE the diagonal (outcome rate > score), the high ones below
    z, y = simulated("temperature:0.5")
    s = summarize(grid_of(z, y), REJECT, alpha=0.05)
    assert s.direction == "over-confident"
    low = [r for r in s.regions if r.hi <= 0.5]
    high = [r for r in s.regions if r.lo >= 0.5]
    assert low and high and {r.sign for r in low} == {"+"} and {r.sign for r in high} == {"-"}


def test_one_sided_scores_decide_over_confidence():
    rng = np.random.default_rng(4)
    p = rng.uniform(0.6, 0.95, 20000)
    y = (rng.random(20000) < p - 0.08).astype(float)  # only high scores, outcomes below them
    assert summarize(grid_of(p, y), REJECT, alpha=0.05).direction == "over-confident"


def test_regions_against_an_independent_computation():
    z, y = simulated("temperature:0.6", n=30000, seed=7)
    s = summarize(grid_of(z, y), REJECT, alpha=0.05)
    assert s.regions
    for r in s.regions:
        inside = (z >= r.lo) & (z < r.hi) if r.hi < 1 else (z >= r.lo)
        gap = y[inside].mean() - z[inside].mean()
        assert r.events == inside.sum()
        assert r.gap == pytest.approx(gap, abs=1e-6)
        assert r.sign == ("+" if gap > 0 else "-")
        zscore = (y[inside] - z[inside]).sum() / math.sqrt((z[inside] * (1 - z[inside])).sum())
        assert r.z == pytest.approx(zscore, rel=1e-4)


def test_decision_is_bonferroni_over_p_values_and_explains_estimate_based_testers():
    g = grid_of(*simulated("none", n=2000))
    tests: dict[str, dict[str, Any]] = {"tcal": {"p_value": 0.03, "decision": "miscalibrated", "method": "mc-grid"},
             "smce": {"p_value": 0.4, "decision": "calibrated", "method": "smce"},
             "ldtc": {"p_value": None, "decision": "miscalibrated", "method": "ldtc"}}
    s = summarize(g, tests, alpha=0.05)
    assert s.calibrated is True  # 0.03 > 0.05 / 2
    assert any("Bonferroni" in e for e in s.evidence)
    assert any(e.startswith("ldtc") and "tolerance" in e for e in s.evidence)
    tests["tcal"]["p_value"] = 0.01
    assert summarize(g, tests, alpha=0.05).calibrated is False
    only_estimates = {"ldtc": {"p_value": None, "decision": "miscalibrated"}}
    assert summarize(g, only_estimates, alpha=0.05).calibrated is False
    errors = {"tcal": {"decision": "error", "error": "boom"}, "smce": {"decision": "insufficient data"}}
    s = summarize(g, errors, alpha=0.05)
    assert s.calibrated is None and s.direction is None and "No verdict" in s.text
    assert summarize(g, {}, alpha=0.05).calibrated is None


def test_recommendation_names_the_best_held_out_recalibrator():
    g = grid_of(*simulated("temperature:0.6", n=5000))
    refresh = {"method": "platt", "before": {"ece": 0.08, "nll": 0.60},
               "candidates": {"platt": {"after": {"ece": 0.01, "nll": 0.52}, "improves": True},
                              "temperature": {"after": {"ece": 0.012, "nll": 0.51}, "improves": True},
                              "isotonic": {"after": {"ece": 0.005, "nll": 0.50}, "improves": False}}}
    s = summarize(g, REJECT, alpha=0.05, calibration=refresh)
    assert s.recommendation.startswith("recalibrate with temperature") and "8.00 % -> 1.20 %" in s.recommendation
    none = summarize(g, REJECT, alpha=0.05, calibration={"before": {}, "candidates": {}})
    assert none.recommendation.startswith("no recalibrator improved")


def test_json_shape_and_bad_input():
    g = grid_of(*simulated("bias:0.5", n=5000))
    d = summarize(g, REJECT, alpha=0.05).to_dict()
    for key in ("calibrated", "direction", "regions", "ece", "ece_ci", "recommendation", "evidence", "text"):
        assert key in d
    assert isinstance(d["ece_ci"], list) and d["ece_ci"][0] <= d["ece"] <= d["ece_ci"][1]
    assert summarize(ScoreGrid(64), {}, alpha=0.05).text == "No labelled predictions yet."
    with pytest.raises(ValueError, match="single-channel"):
        summarize(ScoreGrid(16, channels=3), {}, alpha=0.05)
    with pytest.raises(ValueError, match="alpha"):
        summarize(g, {}, alpha=1.5)


def test_scores_at_exactly_one_with_misses_are_a_region():
    # the isotonic case: predictions at exactly 1.0 with a miss have zero null variance
    z = np.r_[np.full(392, 1.0), np.linspace(0.05, 0.95, 4000)]
    rng = np.random.default_rng(0)
    y = np.r_[np.ones(391), 0.0, (rng.random(4000) < np.linspace(0.05, 0.95, 4000)).astype(float)]
    g = grid_of(z, y, 4096)
    s = summarize(g, REJECT, alpha=0.05, bins=4096)
    assert any(r.lo >= 4095 / 4096 and r.sign == "-" for r in s.regions)


def _binned_ece_truth(kind: str) -> float:
    """Population 15-bin ECE sum_b |E[(y - z) 1_b]| by numerical integration over the score density."""
    u = (np.arange(2_000_000) + 0.5) / 2_000_000  # p ~ Beta(2, 2) via its quantiles on a fine grid
    from scipy.stats import beta

    p = beta(2, 2).ppf(u)
    z = 1 / (1 + np.exp(-(np.log(p) - np.log1p(-p)) / 0.7)) if kind == "temperature:0.7" else p
    idx = np.minimum((z * 15).astype(int), 14)
    return float(np.abs(np.bincount(idx, weights=p - z, minlength=15)).sum() / z.size)


@pytest.mark.parametrize("kind", ["none", "temperature:0.7"])
def test_ece_interval_coverage_by_simulation(kind):
    """Reduced version of benchmarks/verdict_coverage.py: 200 replications, coverage must reach 0.92."""
    truth = _binned_ece_truth(kind)
    hits = 0
    for rep in range(200):
        z, y = simulated(kind, n=2000, seed=100 + rep)
        s = summarize(grid_of(z, y, 1024), REJECT, alpha=0.05, ece_grid=grid_of(z, y, 15))
        assert s.ece_ci is not None
        hits += s.ece_ci[0] <= truth <= s.ece_ci[1]
    assert hits / 200 >= 0.92, (kind, truth, hits)
