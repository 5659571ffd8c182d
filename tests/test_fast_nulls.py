"""Issue #35.2: the LDTC LP in its CDF form (exact, warm-started) and the smCE tester's capped, coarse null."""

from __future__ import annotations

import threading

import numpy as np
import pytest

import calmon.algorithms.ldtc_cdf as cdf
from calmon.algorithms.ldtc import ldtc_grid, ldtc_lp, ldtc_null_pvalue, u_grid
from calmon.algorithms.ldtc_cdf import CdfLP, ldtc_cdf, shared_lp
from calmon.stats.grid import ScoreGrid
from calmon.testers import CalibrationData, run_tester


def _points(rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    k = int(rng.integers(1, 25))
    v = np.round(rng.random(k), int(rng.integers(1, 3)))  # ties, and scores on grid points
    v[rng.random(k) < 0.1] = 1.0  # a score at 1 lies past every breakpoint
    v[rng.random(k) < 0.1] = 0.0
    n1 = rng.integers(0, 9, k).astype(float)
    n0 = rng.integers(0, 9, k).astype(float)
    n1[0] += 1
    return v, n1, n0


def test_cdf_form_equals_the_transport_lp_of_lemma_16() -> None:
    rng = np.random.default_rng(35)
    for _ in range(120):
        v, n1, n0 = _points(rng)
        u = u_grid(int(rng.integers(2, 30)))
        ref = ldtc_lp(v, n1, n0, u)
        got = ldtc_cdf(v, n1, n0, u)
        assert got["value"] == pytest.approx(ref["value"], abs=1e-9)
        # the optimal t is a calibrated distribution of total mass 1
        assert got["mass_u"].sum() == pytest.approx(1.0, abs=1e-9)


def test_cdf_form_is_small() -> None:
    # |U| + 4K variables (K intervals between the points of V and U) instead of 2 |V| |U|
    lp = CdfLP((np.arange(256) + 0.5) / 256, u_grid(101))
    assert lp.a_eq.shape[1] <= 101 + 4 * (256 + 101)
    assert lp.a_eq.shape[1] * 20 < 2 * 256 * 101


def test_warm_started_solves_equal_cold_ones_and_the_fallback(monkeypatch: pytest.MonkeyPatch) -> None:
    # one kept model re-solved from its last basis for many right-hand sides gives linprog's values
    rng = np.random.default_rng(36)
    v = np.sort(rng.random(16))
    N = rng.integers(20, 400, v.size).astype(float)
    k = rng.binomial(N.astype(np.int64), v, size=(30, v.size)).astype(float)
    warm = shared_lp(v, u_grid(17)).solve_many(k, N - k)
    assert shared_lp(v, u_grid(17)) is shared_lp(v.copy(), u_grid(17))  # one model per (points, grid)
    monkeypatch.setattr(cdf, "_hc", None)  # scipy without the HiGHS class: linprog on every solve
    cold = CdfLP(v, u_grid(17)).solve_many(k, N - k)
    ref = [ldtc_lp(v, k[i], N - k[i], u_grid(17))["value"] for i in range(0, 30, 7)]
    assert np.allclose(warm, cold, atol=1e-9)
    assert np.allclose(warm[::7], ref, atol=1e-9)


def test_kept_model_is_safe_across_threads() -> None:
    rng = np.random.default_rng(37)
    v = np.sort(rng.random(8))
    N = rng.integers(20, 200, v.size).astype(float)
    k = rng.binomial(N.astype(np.int64), v, size=(40, v.size)).astype(float)
    lp = CdfLP(v, u_grid(11))
    expect = [ldtc_lp(v, k[i], N - k[i], u_grid(11))["value"] for i in range(40)]
    got: dict[int, list[float]] = {}

    def work(t: int) -> None:
        got[t] = lp.solve_many(k, N - k).tolist()

    threads = [threading.Thread(target=work, args=(t,)) for t in range(3)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    for t in range(3):
        assert np.allclose(got[t], expect, atol=1e-9)


def test_ldtc_grid_keeps_its_value_with_empty_cells() -> None:
    # empty cells enter the LP with mass 0 (so windows share a model): the value is the non-empty cells' LP
    rng = np.random.default_rng(38)
    z = rng.beta(5, 2, 800)
    g = ScoreGrid(1024)
    g.update(z, (rng.random(800) < z**1.3).astype(float))
    c = g.coarsen(64)
    keep = c.n > 0
    assert not keep.all()
    ref = ldtc_lp(c.centers[keep], c.sum_y[keep], c.n[keep] - c.sum_y[keep], u_grid(41))["value"]
    assert ldtc_grid(g, bins=64, u=u_grid(41))["value"] == pytest.approx(ref, abs=1e-9)


def test_null_pvalue_same_draws_as_one_by_one() -> None:
    # replicates are drawn in blocks but taken in order: a curtailed run stops at the same replicate
    rng = np.random.default_rng(39)
    z = rng.random(2000)
    g = ScoreGrid(1024)
    g.update(z, (rng.random(2000) < z).astype(float))
    full = ldtc_null_pvalue(g, mc=99, rng=np.random.default_rng(1), curtail=False)
    cut = ldtc_null_pvalue(g, mc=99, rng=np.random.default_rng(1))
    assert full["mc_draws"] == 99 and (cut["p_value"] <= 0.05) == (full["p_value"] <= 0.05)
    if cut["curtailed"]:
        assert cut["mc_draws"] < 99 and cut["p_value"] > 0.05


def test_smce_tester_null_is_capped_and_coarse() -> None:
    # a clearly miscalibrated window used to run all evaluation.mc = 1000 draws on 1024 cells; now at most
    # 199 (an exact level-0.05 Monte Carlo test) on 256 cells, and it still rejects
    rng = np.random.default_rng(40)
    z = rng.random(20000)
    g = ScoreGrid(1024)
    g.update(z, (rng.random(20000) < np.clip(z + 0.04, 0, 1)).astype(float))
    res = run_tester("smce", CalibrationData(n=20000, grid=g), mc=1000, seed=0).to_dict()
    assert res["decision"] == "miscalibrated" and res["p_value"] <= 0.05
    assert res["mc"] == 199 and res["null_method"] == "binomial/grid256"
    # an explicit cap above evaluation.mc keeps evaluation.mc; a smaller evaluation.mc wins
    assert run_tester("smce", CalibrationData(n=20000, grid=g), mc=99, seed=0).to_dict()["mc"] == 99
    more = run_tester("smce", CalibrationData(n=20000, grid=g), mc=1000, seed=0, null_mc=999).to_dict()
    assert more["mc"] == 999


@pytest.mark.parametrize("name", ["smce", "ldtc"])
def test_default_testers_keep_their_level_reduced(name: str) -> None:
    # 60 calibrated windows as the agent keeps them (1024-cell grid, no complete raw sample), the tester's
    # defaults with evaluation.mc = 1000: expected 3 rejections at 0.05 (sd 1.7), more than 8 fails; and 12
    # clearly miscalibrated windows are nearly all rejected.  The full runs (1000 replications) are
    # benchmarks/smce_level.py --mode tester and benchmarks/ldtc_level.py --tester (docs/statistics/fast-nulls.md).
    rng = np.random.default_rng(41 if name == "smce" else 42)
    rejections = 0
    for rep in range(60):
        z = rng.beta(2, 3, 3000)
        g = ScoreGrid(1024)
        g.update(z, (rng.random(3000) < z).astype(float))
        rejections += run_tester(name, CalibrationData(n=3000, grid=g), mc=1000, seed=rep).decision == "miscalibrated"
    assert rejections <= 8, rejections
    power = 0
    for rep in range(12):
        z = rng.beta(2, 3, 3000)
        g = ScoreGrid(1024)
        g.update(z, (rng.random(3000) < np.clip(z + 0.05, 0, 1)).astype(float))
        power += run_tester(name, CalibrationData(n=3000, grid=g), mc=1000, seed=rep).decision == "miscalibrated"
    assert power >= 10, power


def test_ldtc_result_does_not_depend_on_earlier_solves() -> None:
    # warm starts begin from whatever basis the last window left: the result must still be a function of the
    # data and the seed alone (the last bits of an optimum are rounded off)
    rng = np.random.default_rng(43)
    grids = []
    for shift in (0.0, 0.03):
        z = rng.random(4000)
        g = ScoreGrid(1024)
        g.update(z, (rng.random(4000) < np.clip(z + shift, 0, 1)).astype(float))
        grids.append(CalibrationData(n=4000, grid=g))
    first = run_tester("ldtc", grids[0], mc=99, seed=1).to_dict()
    run_tester("ldtc", grids[1], mc=99, seed=1)
    assert run_tester("ldtc", grids[0], mc=99, seed=1).to_dict() == first


def test_ldtc_estimate_is_solved_at_its_sampling_scale_and_the_test_is_unchanged() -> None:
    """#35.2 a: under the p-value rule the estimate's LP follows 1/sqrt(n) (64 x 26 at n = 900, 128 x 51 at
    n = 3000, Theorem 4's 256 x 121 at n = 20000), its bounds still hold the raw dCE, and the p-value, null
    statistic and decision are those of the fine LP (``error_scale=0``, the tester before the change)."""
    rng = np.random.default_rng(44)
    for n, want, old in ((900, (64, 26), 101), (3000, (128, 51), 101), (20000, (256, 121), 121)):
        for shift in (0.0, 0.06):
            z = rng.random(n)
            y = (rng.random(n) < np.clip(z + shift, 0, 1)).astype(float)
            g = ScoreGrid(1024)
            g.update(z, y)
            data = CalibrationData(n=n, grid=g)
            got = run_tester("ldtc", data, mc=1000, seed=3).to_dict()
            fine = run_tester("ldtc", data, mc=1000, seed=3, error_scale=0.0).to_dict()
            assert (got["bins"], got["u_points"]) == want and (fine["bins"], fine["u_points"]) == (256, old)
            assert got["error_bound"] <= 1.0 / np.sqrt(n) + 1e-12
            for key in ("p_value", "null_statistic", "decision", "mc"):
                assert got[key] == fine[key], key
            assert run_tester("ldtc", data, mc=1000, seed=3).to_dict() == got  # a function of data and seed
            # the raw dCE lies in the bounds of the full 1024-cell, 101-point LP: the two intervals meet
            lo, hi = ldtc_grid(g, bins=1024, u=u_grid(101))["bounds"]
            assert got["bounds"][0] - 1e-9 <= hi and lo <= got["bounds"][1] + 1e-9
    # Theorem 4's rule (eps1 given) keeps its own resolution
    exp = run_tester("ldtc", CalibrationData(n=n, grid=g), mc=1000, seed=3, eps1=0.05).to_dict()
    assert (exp["bins"], exp["u_points"]) == (256, 121)
