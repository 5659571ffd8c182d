"""Tests of T-Cal (calmon.algorithms.tcal) and the exact binomial test (calmon.algorithms.discrete_binomial).

Every estimator is checked against an independent computation (pairwise brute force, exhaustive
enumeration of all outcome vectors, scipy's binomial pmf); the tests' level is checked by reduced
simulations that fail when the level is off; the nine real data sets of the paper must be rejected.
"""

from __future__ import annotations

import itertools
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from scipy import stats

from calmon.algorithms import tcal
from calmon.algorithms.discrete_binomial import binomial_pvalues, binomial_test, discrete_support
from calmon.algorithms.tcal.atoms import Atoms
from calmon.stats.grid import ScoreGrid
from calmon.testers import CalibrationData, run_tester

DATA = Path(__file__).resolve().parents[1] / ".." / "shared" / "data" / "tcal"
NINE = sorted(DATA.glob("*.npz"))


def _brute_dpe(z, y, bins, debiased=True):
    """Pairwise definition: (1/n) sum_i (1/N_i) sum_{j != j' in bin i} r_j r_j' (+ sum r_j^2 if plug-in)."""
    idx = np.minimum(np.floor(z * bins).astype(int), bins - 1)
    r = y - z
    total = 0.0
    for c in np.unique(idx):
        members = np.flatnonzero(idx == c)
        Nc = members.size
        acc = 0.0
        for a in members:
            for b in members:
                if a != b or not debiased:
                    acc += r[a] * r[b] if a != b else r[a] ** 2
        total += acc / Nc
    return total / z.size


def _calibrated(n, rng, kind="uniform"):
    if kind == "uniform":
        z = rng.uniform(size=n)
    elif kind == "beta":
        z = rng.beta(2, 5, size=n)
    else:  # skewed mixture: mass near 1 like top-label confidence, plus a uniform part
        z = np.where(rng.uniform(size=n) < 0.7, 1 - rng.beta(1, 20, size=n), rng.uniform(size=n))
    return z, (rng.uniform(size=n) < z).astype(float)


# -------------------------------------------------------------------------------------------------------
# estimators
# -------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("bins", [1, 3, 8, 15])
def test_estimators_match_pairwise_brute_force(bins):
    rng = np.random.default_rng(bins)
    z = np.r_[rng.uniform(size=40), 1.0, 0.0]  # z = 1 must fall in the last bin
    y = (rng.uniform(size=z.size) < 0.5).astype(float)
    assert tcal.ece2_raw(z, y, bins) == pytest.approx(_brute_dpe(z, y, bins), abs=1e-12)
    assert tcal.ece2_raw(z, y, bins, debiased=False) == pytest.approx(_brute_dpe(z, y, bins, False), abs=1e-12)


def test_multiclass_one_hot_matches_brute_force_and_is_twice_scalar_for_k2():
    rng = np.random.default_rng(1)
    n, k, m = 60, 3, 4
    p = rng.dirichlet(np.ones(k), size=n)
    lab = rng.integers(0, k, size=n)
    r = -p.copy()
    r[np.arange(n), lab] += 1
    cells = [tuple(np.minimum(np.floor(row * m).astype(int), m - 1)) for row in p]
    brute = 0.0
    for c in set(cells):
        mem = [i for i in range(n) if cells[i] == c]
        brute += sum(r[a] @ r[b] for a in mem for b in mem if a != b) / len(mem)
    assert tcal.ece2_multiclass_raw(p, lab, m) == pytest.approx(brute / n, abs=1e-12)
    z = rng.uniform(size=50)
    y = (rng.uniform(size=50) < 0.6).astype(int)
    p2 = np.c_[1 - z, z]
    for deb in (True, False):
        assert tcal.ece2_multiclass_raw(p2, y, 8, debiased=deb) == pytest.approx(
            2 * tcal.ece2_raw(z, y, 8, debiased=deb), abs=1e-12)


def test_null_mean_and_variance_by_exhaustive_enumeration():
    rng = np.random.default_rng(2)
    z = rng.uniform(size=10)
    t_list, w_list = [], []
    for ys in itertools.product([0.0, 1.0], repeat=z.size):
        y = np.array(ys)
        t_list.append(tcal.ece2_raw(z, y, 3))
        w_list.append(np.prod(np.where(y == 1, z, 1 - z)))
    ts, ws = np.array(t_list), np.array(w_list)
    assert ws @ ts == pytest.approx(0.0, abs=1e-14)
    assert ws @ ts**2 == pytest.approx(tcal.null_variance_raw(z, 3), rel=1e-10)
    # exact third cumulant used by the three-moment approximation (raw atoms: exact power sums)
    atoms = Atoms.from_raw(z, np.zeros_like(z))
    lev = atoms.add_level(3)
    assert ws @ ts**3 == pytest.approx(atoms.third_cumulant(lev), rel=1e-10)
    assert atoms.variance(lev) == pytest.approx(ws @ ts**2, rel=1e-10)


@pytest.mark.parametrize("b", [1, 4, 9, 12])
def test_grid_estimators_equal_raw(b):
    rng = np.random.default_rng(b)
    z, y = _calibrated(5000, rng, "mix")
    g = ScoreGrid()
    g.update(z[:2000], y[:2000])
    g.update(z[2000:], y[2000:])  # additive: two batches
    assert tcal.ece2_grid(g, 2**b) == pytest.approx(tcal.ece2_raw(z, y, 2**b), abs=1e-9)
    assert tcal.ece2_grid(g, 2**b, debiased=False) == pytest.approx(tcal.ece2_raw(z, y, 2**b, False), abs=1e-9)
    assert tcal.null_variance_grid(g, 2**b) == pytest.approx(tcal.null_variance_raw(z, 2**b), rel=1e-6)


def test_levels_and_theorem3():
    assert tcal.n_levels(10_000) == int(np.ceil(2 * np.log2(10_000 / np.sqrt(np.log(10_000)))))
    # scalar threshold is half the one-hot threshold of Theorem 3
    assert tcal.theorem3_threshold(1000, 8, 0.05) == pytest.approx(
        0.5 * np.sqrt(8 / 0.05) * min(np.sqrt(8) / 1000, 1 / np.sqrt(8)))
    with pytest.raises(ValueError):
        tcal.ece2_raw(np.array([0.2, 1.2]), np.array([0, 1]), 4)
    with pytest.raises(ValueError):
        tcal.ece2_raw(np.array([0.2, 0.5]), np.array([0, 2]), 4)


# -------------------------------------------------------------------------------------------------------
# Monte Carlo engine
# -------------------------------------------------------------------------------------------------------
def test_observed_statistics_and_null_draws_match_direct_computation():
    rng = np.random.default_rng(3)
    z, y = _calibrated(3000, rng, "beta")
    z = np.round(z, 3)  # ties: grouped into atoms drawn as Bin(count, z)
    r = tcal.tcal_test(z, y, bins=[2, 16, 100, 1000], rng=0, mc=50, min_resolution=False, screen=False,
                       curtail=False)
    assert r["statistics"] == pytest.approx([tcal.ece2_raw(z, y, m) for m in (2, 16, 100, 1000)], abs=1e-12)
    assert r["plugin"] == pytest.approx([tcal.ece2_raw(z, y, m, False) for m in (2, 16, 100, 1000)], abs=1e-12)
    # the simulated draws have the exact null variance (raw: exact Y-only law) ...
    atoms = Atoms.from_raw(z, y)
    for m in (16, 1000):
        atoms.add_level(m)
    k, g = atoms.draw(4000, rng)
    T = atoms.stats(k, g)
    for j, m in enumerate((16, 1000)):
        v = tcal.null_variance_raw(z, m)
        assert abs(T[:, j].mean()) < 4 * np.sqrt(v / 4000)
        assert T[:, j].var() == pytest.approx(v, rel=0.1)
    # ... and one draw equals a direct DPE computation with the drawn outcomes
    yd = (rng.uniform(size=z.size) < z).astype(float)
    a2 = Atoms.from_raw(z, yd)
    a2.add_level(100)
    assert a2.stats(a2.k_obs[:, None], a2.g_obs[:, None])[0, 0] == pytest.approx(tcal.ece2_raw(z, yd, 100))


def test_grid_and_raw_monte_carlo_agree():
    rng = np.random.default_rng(4)
    n = 20_000
    z = rng.uniform(size=n)
    y = (rng.uniform(size=n) < np.clip(z + 0.02 * np.sin(12 * z), 0, 1)).astype(float)
    g = ScoreGrid()
    g.update(z, y)
    kw: dict[str, Any] = dict(alpha=0.05, mc=999, min_resolution=False, screen=False, curtail=False, max_level=12)
    a = tcal.tcal_test(z, y, rng=1, method="mc-raw", **kw)
    b = tcal.tcal_test(grid=g, rng=2, method="mc-grid", **kw)
    assert a["levels"] == b["levels"] == list(range(1, 13))
    assert a["statistics"] == pytest.approx(b["statistics"], abs=1e-9)
    # p-values from the exact raw Y-only law and from the grid approximation agree within MC error
    pa, pb = np.array(a["p_values"]), np.array(b["p_values"])
    assert np.all(np.abs(pa - pb) <= 4 * np.sqrt(np.maximum(pa * (1 - pa), 0.002) / 999) + 0.01)
    assert a["null_sd"] == pytest.approx(b["null_sd"], rel=1e-6)


def test_three_moment_approximation_tracks_monte_carlo():
    rng = np.random.default_rng(9)
    n = 8000
    z = np.where(rng.uniform(size=n) < 0.6, 1 - rng.beta(1, 15, size=n), rng.uniform(size=n))
    y = (rng.uniform(size=n) < np.clip(z + 0.02 * np.sin(9 * z), 0, 1)).astype(float)
    g = ScoreGrid()
    g.update(z, y)
    r = tcal.tcal_test(grid=g, method="mc-grid", mc=4000, rng=0, screen=False, curtail=False, max_level=10)
    mc, ap = np.array(r["p_values"]), np.array(r["approx_p_values"])
    assert np.all(np.abs(mc - ap) <= 4 * np.sqrt(np.maximum(mc * (1 - mc), 1e-3) / 4000)), np.c_[mc, ap]
    m3 = tcal.tcal_test(grid=g, method="moment3", max_level=10)
    assert m3["p_values"] == pytest.approx(r["approx_p_values"])
    # the accept screen only accepts, and only when every level is far from its threshold
    rz = (rng.uniform(size=n) < z).astype(float)
    g0 = ScoreGrid()
    g0.update(z, rz)
    a = tcal.tcal_test(grid=g0, method="mc-grid", rng=0, accept_margin=4.0)
    if a["screen"] == "approx-accept":
        assert a["decision"] == "calibrated" and a["mc_draws"] == 0
        assert min(a["approx_p_values"]) >= 4 * 0.05 / len(a["levels"])
    b = tcal.tcal_test(grid=g0, method="mc-grid", rng=0, screen=False)
    assert b["decision"] == a["decision"] and b["mc_draws"] > 0


def test_curtailment_keeps_the_full_decision():
    rng = np.random.default_rng(5)
    for s in range(12):
        z = rng.uniform(size=1500)
        y = (rng.uniform(size=1500) < np.clip(z + 0.04 * np.sin(15 * z), 0, 1)).astype(float)
        a = tcal.tcal_test(z, y, rng=s, screen=False, max_level=7)
        b = tcal.tcal_test(z, y, rng=s, screen=False, max_level=7, curtail=False)
        assert a["decision"] == b["decision"]
        assert b["mc_draws"] == b["mc_requested"] >= a["mc_draws"]


# -------------------------------------------------------------------------------------------------------
# level (reduced simulations; the full ones are benchmarks/tcal_level.py)
# -------------------------------------------------------------------------------------------------------
def _rejection_rate(fn, reps, seed):
    rng = np.random.default_rng(seed)
    return np.mean([fn(rng, i) for i in range(reps)])


@pytest.mark.slow
@pytest.mark.parametrize("method", ["mc-raw", "mc-grid"])
def test_single_scale_level_by_simulation(method):
    reps, alpha = 400, 0.05

    def one(rng, i):
        z, y = _calibrated(1000, rng, ["uniform", "beta", "mix"][i % 3])
        if method == "mc-raw":
            r = tcal.tcal_test(z, y, bins=[16], alpha=alpha, mc=99, rng=rng, method=method, screen=False,
                               min_resolution=False)
        else:
            g = ScoreGrid()
            g.update(z, y)
            r = tcal.tcal_test(grid=g, bins=[16], alpha=alpha, mc=99, rng=rng, method=method, screen=False,
                               min_resolution=False)
        return r["decision"] == "miscalibrated"

    rate = _rejection_rate(one, reps, 11)
    sd = np.sqrt(alpha * (1 - alpha) / reps)
    assert abs(rate - alpha) < 3.5 * sd, rate  # exact rank test: size 5/100 = 0.05


@pytest.mark.slow
def test_adaptive_and_minp_level_by_simulation():
    reps, alpha = 300, 0.1
    rej = {"bonferroni": 0, "minp": 0, "cantelli": 0}
    rng = np.random.default_rng(12)
    for i in range(reps):
        z, y = _calibrated(400, rng, ["uniform", "beta", "mix"][i % 3])
        for comb in ("bonferroni", "minp"):
            r = tcal.tcal_test(z, y, alpha=alpha, mc=99, rng=rng, combine=comb, screen=False, max_level=5)
            rej[comb] += r["decision"] == "miscalibrated"
        rej["cantelli"] += tcal.tcal_test(z, y, alpha=alpha, method="cantelli", max_level=5)["decision"] \
            == "miscalibrated"
    sd = np.sqrt(alpha * (1 - alpha) / reps)
    assert rej["minp"] / reps < alpha + 3.5 * sd and rej["minp"] / reps > alpha - 3.5 * sd
    assert rej["bonferroni"] / reps < alpha + 3.5 * sd
    assert rej["cantelli"] / reps < alpha + 3.5 * sd


def test_power_against_a_clear_alternative():
    rng = np.random.default_rng(6)
    z = rng.uniform(size=5000)
    y = (rng.uniform(size=5000) < 0.8 * z + 0.1).astype(float)  # l2-ECE^2 = 0.01/3
    for method in ("mc-raw", "mc-grid", "cantelli"):
        g = ScoreGrid()
        g.update(z, y)
        r = tcal.tcal_test(z, y, grid=g, method=method, rng=0, max_level=10, screen=False)
        assert r["decision"] == "miscalibrated", method
    # Theorem 3's Chebyshev threshold bounds the variance by m / (2 n^2) (one-hot): more conservative than
    # Cantelli with the exact variance, and it needs a much larger deviation
    c3 = tcal.tcal_test(z, y, method="theorem3", max_level=10)
    cc = tcal.tcal_test(z, y, method="cantelli", max_level=10)
    assert np.all(np.array(c3["p_values"]) >= np.array(cc["p_values"]))
    assert c3["decision"] == "calibrated"
    y2 = (rng.uniform(size=5000) < 0.5 * z + 0.25).astype(float)  # l2-ECE^2 = 0.0625/3
    assert tcal.tcal_test(z, y2, method="theorem3", bins=[16])["decision"] == "miscalibrated"


# -------------------------------------------------------------------------------------------------------
# binomial test (Appendix B.4)
# -------------------------------------------------------------------------------------------------------
def test_binomial_pvalues_match_pmf_sum():
    v, c, k = np.array([0.3, 0.05]), np.array([40, 200]), np.array([19, 4])
    p = binomial_pvalues(v, c, k)
    for vi, ci, ki, pi in zip(v, c, k, p):
        pmf = stats.binom.pmf(np.arange(ci + 1), ci, vi)
        assert pi == pytest.approx(min(1.0, pmf[pmf <= pmf[ki] * (1 + 1e-7)].sum()), rel=1e-6)


def test_binomial_test_chosen_for_discrete_predictors_and_holds_level():
    rng = np.random.default_rng(7)
    vals = np.linspace(0.05, 0.95, 15)  # e.g. histogram binning with 15 bins
    rej = 0
    reps = 300
    for _ in range(reps):
        z = rng.choice(vals, size=3000)
        y = (rng.uniform(size=z.size) < z).astype(float)
        support = discrete_support(z, y)
        assert support is not None
        rej += binomial_test(*support, alpha=0.1)["decision"] == "miscalibrated"
    assert rej / reps < 0.1 + 3.5 * np.sqrt(0.09 / reps)
    y = (rng.uniform(size=z.size) < np.clip(z + 0.08, 0, 1)).astype(float)
    g = ScoreGrid()
    g.update(z, y)
    raw = run_tester("tcal", CalibrationData(n=z.size, z=z, y=y, grid=g, raw_is_complete=True)).to_dict()
    grid = run_tester("tcal", CalibrationData(n=z.size, grid=g)).to_dict()
    assert raw["method"] == grid["method"] == "binomial"
    assert raw["decision"] == grid["decision"] == "miscalibrated"
    assert raw["p_values"] == pytest.approx(grid["p_values"], rel=1e-5)  # grid sums: 2^-28 fixed point
    assert discrete_support(rng.uniform(size=3000), y) is None


# -------------------------------------------------------------------------------------------------------
# tester interface and the nine real data sets
# -------------------------------------------------------------------------------------------------------
def test_tester_fields_and_sources():
    rng = np.random.default_rng(8)
    z, y = _calibrated(4000, rng)
    g = ScoreGrid()
    g.update(z, y)
    res = {
        "raw": run_tester("tcal", CalibrationData(n=4000, z=z, y=y, grid=g, raw_is_complete=True),
                          mc=200).to_dict(),
        "grid": run_tester("tcal", CalibrationData(n=4000, z=z[:500], y=y[:500], grid=g), mc=200).to_dict(),
        "reservoir": run_tester("tcal", CalibrationData(n=4000, z=z[:500], y=y[:500]), mc=200).to_dict(),
    }
    for source, r in res.items():
        json.dumps(r)
        assert r["source"] == source
        for key in ("levels", "statistics", "critical_values", "p_values", "adjusted_p_value", "decision",
                    "method", "statistic", "p_value"):
            assert key in r
        assert len(r["p_values"]) == len(r["levels"]) == len(r["critical_values"])
    assert res["raw"]["method"] == "mc-raw" and res["grid"]["method"] == "mc-grid"
    assert len(res["grid"]["levels"]) == 12 and len(res["raw"]["levels"]) == tcal.n_levels(4000)
    r = run_tester("tcal", CalibrationData(n=4000, grid=g), method="cantelli", levels=[2, 3]).to_dict()
    assert r["method"] == "cantelli" and r["levels"] == [2, 3]
    assert run_tester("tcal", CalibrationData(n=0)).to_dict()["decision"] == "insufficient data"
    assert run_tester("tcal", CalibrationData(n=0, grid=ScoreGrid())).to_dict()["decision"] == "insufficient data"
    with pytest.raises(ValueError):
        run_tester("tcal", CalibrationData(n=4000, grid=g), method="nope")
    with pytest.raises(ValueError):
        run_tester("tcal", CalibrationData(n=4000, grid=g), bogus=1)


@pytest.mark.skipif(len(NINE) != 9, reason="shared T-Cal data not found beside the repository")
@pytest.mark.parametrize("path", NINE, ids=[p.stem for p in NINE])
def test_nine_real_models_rejected_from_files_and_from_streaming_statistics(path):
    d = np.load(path)
    z, y = d["confidence"].astype(float), d["correct"].astype(float)
    g = ScoreGrid()
    for lo in range(0, z.size, 4096):  # streamed in batches
        g.update(z[lo:lo + 4096], y[lo:lo + 4096])
    sample = np.random.default_rng(0).choice(z.size, 2000, replace=False)
    full = run_tester("tcal", CalibrationData(n=z.size, z=z, y=y, grid=g, raw_is_complete=True),
                      seed=1).to_dict()
    window = run_tester("tcal", CalibrationData(n=z.size, z=z[sample], y=y[sample], grid=g),
                        seed=1).to_dict()
    assert full["decision"] == "miscalibrated" and full["source"] == "raw"
    assert window["decision"] == "miscalibrated" and window["source"] == "grid"


@pytest.mark.skipif(len(NINE) != 9, reason="shared T-Cal data not found beside the repository")
def test_real_data_rejected_by_grid_monte_carlo_without_screen():
    d = np.load(DATA / "cifar10_densenet121.npz")  # the weakest of the nine
    g = ScoreGrid()
    g.update(d["confidence"], d["correct"].astype(float))
    r = tcal.tcal_test(grid=g, method="mc-grid", screen=False, mc=999, rng=0, min_resolution=False)
    assert r["decision"] == "miscalibrated" and r["method"] == "mc-grid"
