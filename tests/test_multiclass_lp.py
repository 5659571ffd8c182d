"""Multiclass l_p calibration: projection, Err_p estimators, Algorithm 2 invariants, ground truth, tester."""

from __future__ import annotations

import itertools
import json
import math
from typing import Any, cast

import numpy as np
import pytest

from calmon.algorithms.multiclass_lp import (
    LevelSetMap,
    beta_of,
    fit_lp,
    fit_lp_raw,
    iteration_cap,
    lambda_of,
    lp_error,
    lp_error_raw,
    lp_test,
    pools_needed,
    squared_error_bound,
    theorem7_budget,
)
from calmon.algorithms.simplex import project_simplex
from calmon.calibration import CalibratorError, from_document, get_calibrator
from calmon.stats.data import CalibrationData
from calmon.stats.levelset import LevelSetStats, level_keys, rho
from calmon.testers import run_tester


# -- helpers -------------------------------------------------------------------------------------
def world(n: int, k: int, rng: np.random.Generator, alpha: float = 20.0, bias: float = 2.0,
          temperature: float = 2.0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """True class probabilities q ~ Dirichlet(alpha), labels y ~ q, predictions softmax((log q + b) / T)."""
    q = rng.dirichlet(np.full(k, alpha), size=n)
    q = np.clip(q, 1e-12, None)
    q /= q.sum(axis=1, keepdims=True)
    y = np.minimum((rng.random(n)[:, None] > np.cumsum(q, axis=1)).sum(axis=1), k - 1)
    z = (np.log(q) + np.linspace(-bias, bias, k)) / temperature
    f = np.exp(z - z.max(axis=1, keepdims=True))
    f /= f.sum(axis=1, keepdims=True)
    return q, y, f


def brute_projection(z: np.ndarray) -> np.ndarray:
    """Closest simplex point by enumerating supports (projection onto each face's affine hull)."""
    k = len(z)
    best, best_d = None, math.inf
    for r in range(1, k + 1):
        for sup in itertools.combinations(range(k), r):
            idx = list(sup)
            w = np.zeros(k)
            w[idx] = z[idx] - (z[idx].sum() - 1.0) / r
            if (w >= -1e-12).all():
                d = float(((w - z) ** 2).sum())
                if d < best_d:
                    best, best_d = w, d
    assert best is not None
    return best


def brute_err(probs: np.ndarray, labels: np.ndarray, lam: int, p: float) -> float:
    cells: dict[tuple[tuple[int, ...], int], float] = {}
    n, k = probs.shape
    for i in range(n):
        key = tuple(int(math.floor(lam * x + 1e-9)) for x in probs[i])
        for j in range(k):
            cells[(key, j)] = cells.get((key, j), 0.0) + probs[i, j] - (labels[i] == j)
    vals = np.abs(np.array(list(cells.values()))) / n
    return float(vals.max()) if math.isinf(p) else float((vals**p).sum() ** (1 / p))


# -- projection ----------------------------------------------------------------------------------------
def test_projection_matches_brute_force_and_kkt() -> None:
    rng = np.random.default_rng(0)
    for k in (2, 3, 4, 5):
        z = rng.normal(0.3, 0.8, size=(300, k))
        got = project_simplex(z)
        for i in range(len(z)):
            assert np.allclose(got[i], brute_projection(z[i]), atol=1e-10)
        # KKT: u = max(z - theta, 0) with one theta per row
        assert np.allclose(got.sum(axis=1), 1.0) and (got >= 0).all()
        theta = (z - got)[got > 0]
        assert theta.size
    assert project_simplex(np.array([0.2, 0.3, 0.5])).tolist() == pytest.approx([0.2, 0.3, 0.5])
    with pytest.raises(ValueError):
        project_simplex(np.array([np.nan, 1.0]))


# -- Err_p ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("p", [2.0, 3.0, math.inf])
def test_err_p_three_ways(p: float) -> None:
    rng = np.random.default_rng(1)
    q, y, f = world(1500, 3, rng, alpha=2.0, bias=1.0)
    s = LevelSetStats(3, 7, pools=3)
    s.update(f, y)
    want = brute_err(f, y, 7, p)
    assert lp_error(s, p)["err_p"] == pytest.approx(want, rel=1e-6)
    assert lp_error_raw(f, y, 7, p)["err_p"] == pytest.approx(want, rel=1e-9)


def test_debiased_err2_is_unbiased_and_plugin_is_not() -> None:
    # two prediction points; Err(v, j) = P(v) |f_j - q_j| known exactly
    rng = np.random.default_rng(2)
    pts = np.array([[0.55, 0.25, 0.20], [0.15, 0.15, 0.70]])
    truth = np.array([[0.50, 0.30, 0.20], [0.15, 0.15, 0.70]])
    mass = np.array([0.6, 0.4])
    exact_sq = float(((mass[:, None] * (pts - truth)) ** 2).sum())
    n, reps = 400, 400
    deb, plug = [], []
    for _ in range(reps):
        which = rng.choice(2, size=n, p=mass)
        f = pts[which]
        y = np.minimum((rng.random(n)[:, None] > np.cumsum(truth[which], axis=1)).sum(axis=1), 2)
        s = LevelSetStats(3, 10, pools=1)
        s.update(f, y)
        e = lp_error(s, 2.0)
        deb.append(e["err2_sq_debiased"])
        plug.append(e["err_2"] ** 2)
    se = np.std(deb) / math.sqrt(reps)
    assert abs(np.mean(deb) - exact_sq) < 4 * se
    assert np.mean(plug) - exact_sq > 4 * np.std(plug) / math.sqrt(reps)


def test_parameters_of_the_paper() -> None:
    assert beta_of(0.1) == 0.1 and lambda_of(0.1) == 10
    assert beta_of(0.1, 2.0) == pytest.approx(0.005) and lambda_of(0.1, 2.0) == 200
    assert beta_of(0.2, 3.0) == pytest.approx(0.2**1.5 * 2**-0.5)
    assert iteration_cap(0.1, 10) == math.ceil((9 + 3.6 * math.log2(360)) / 0.01)
    assert squared_error_bound(0.1, 10) == pytest.approx(0.4 * (1 + math.log2(360)))
    assert pools_needed(0.1) == 13
    # the spec's order of magnitude: ~4e10 samples for p = inf, eps = 0.1, K = 10 (|B| = 60)
    b = theorem7_budget(0.1, math.inf, 0.05, 10, 60)
    assert 1e10 < b["total"] < 1e11
    assert b["total"] == pytest.approx(b["phase1"] + sum(x["mass"] + x["labels"] for x in b["per_pool"]))
    with pytest.raises(ValueError, match="p must be > 1"):
        beta_of(0.1, 1.0)


# -- Algorithm 2 ---------------------------------------------------------------------------------------
def check_invariants(stats: LevelSetStats, fit, eps: float, p: float) -> None:  # noqa: ANN001
    d = fit.diagnostics
    lam, beta = d["lam"], d["beta"]
    nb = d["heavy_bins"]
    # separate pools: Phase 1 = pool 0, size 2^i: masses from pool 1 + 2i, labels from pool 2 + 2i
    roles = d["pool_roles"]
    if stats.pools >= d["pools_needed"]:
        sizes_ = len(roles["mass"])
        assert roles["mass"] == [1 + 2 * i for i in range(sizes_)]
        assert roles["labels"] == [2 + 2 * i for i in range(sizes_)]
        assert len({0, *roles["mass"], *roles["labels"]}) == 1 + 2 * sizes_
        assert not d["pools_shared"]
    # B = bins whose Phase-1 (pool 0) mass is at least beta / 6
    mu = stats.n_pool[0] / stats.pool_sizes[0]
    want = sorted(map(tuple, stats.keys[mu >= beta / 6].tolist()))
    assert sorted(map(tuple, fit.heavy_keys.tolist())) == want
    # G partitions B; predictions are simplex points with distinct level sets
    all_bins = sorted(b for g in fit.groups for b in g["bins"])
    assert all_bins == list(range(nb))
    keys = [tuple(level_keys(np.array(g["pred"]), lam).tolist()) for g in fit.groups]
    assert len(set(keys)) == len(keys)
    for g in fit.groups:
        pred = np.array(g["pred"])
        assert abs(pred.sum() - 1) < 1e-9 and (pred >= 0).all()
        # M: pieces inside the group partition it, have distinct power-of-two sizes
        sizes = [pc["size_exp"] for pc in g["pieces"]]
        assert len(set(sizes)) == len(sizes)
        assert sorted(b for pc in g["pieces"] for b in pc["bins"]) == g["bins"]
        for pc in g["pieces"]:
            assert len(pc["bins"]) == 2 ** pc["size_exp"]
            # each piece is estimated from the pools of its size (no noise here)
            mp, lp = d["pool_roles"]["mass"][pc["size_exp"]], d["pool_roles"]["labels"][pc["size_exp"]]
            idx = [int(np.flatnonzero((stats.keys == fit.heavy_keys[b]).all(axis=1))[0]) for b in pc["bins"]]
            assert pc["P"] == pytest.approx(stats.n_pool[mp, idx].sum() / stats.pool_sizes[mp])
            assert np.allclose(pc["E"], stats.counts_pool[lp, idx].sum(axis=0) / stats.pool_sizes[lp])
        assert g["P"] == pytest.approx(sum(pc["P"] for pc in g["pieces"]))
        if d["stopped"] == "converged":
            assert max(g["error"]) <= beta / 2 + 1e-12
    assert d["iterations"] <= d["iteration_cap"]
    assert d["groups"] == len(fit.groups) == nb - d["merges"]
    # h maps every heavy bin to its group's prediction and light bins to rho
    for g in fit.groups:
        for b in g["bins"]:
            x = rho(fit.heavy_keys[b], lam)[None, :]
            assert np.allclose(fit.map.predict(x)[0], g["pred"])


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_algorithm2_invariants_with_merges(seed: int) -> None:
    rng = np.random.default_rng(seed)
    q, y, f = world(10000, 3, rng)
    stats = LevelSetStats(3, lambda_of(0.05), pools_needed(0.05))
    stats.update(f, y, [f"e{seed}-{i}" for i in range(len(y))])
    fit = fit_lp(stats, eps=0.05)
    check_invariants(stats, fit, 0.05, math.inf)
    assert fit.diagnostics["iterations"] > 0


def test_merges_and_piece_merges_happen() -> None:
    merges = piece_merges = 0
    for seed in range(6):
        rng = np.random.default_rng(100 + seed)
        q, y, f = world(4000, 3, rng, alpha=5.0)
        stats = LevelSetStats(3, lambda_of(0.04), 1)
        stats.update(f, y)
        fit = fit_lp(stats, eps=0.04)
        check_invariants(stats, fit, 0.04, math.inf)
        merges += fit.diagnostics["merges"]
        piece_merges += fit.diagnostics["piece_merges"]
        if merges and piece_merges:
            break
    assert merges > 0 and piece_merges > 0


def test_ground_truth_error_falls_below_eps() -> None:
    """Reduced version of benchmarks/lp_groundtruth.py: K = 3, n = 2e4, exact Err from the known truth."""
    rng = np.random.default_rng(7)
    eps = 0.05
    lam = lambda_of(eps)
    q_test, _, f_test = world(200000, 3, rng)
    before = lp_error_raw(f_test, q_test, lam)["err_inf"]
    assert before > 2 * eps
    q, y, f = world(20000, 3, rng)
    fit = fit_lp_raw(f, y, eps=eps)
    h = fit.map.predict(f_test)
    after = lp_error_raw(h, q_test, lam)
    assert after["err_inf"] <= eps
    assert after["err_2"] < lp_error_raw(f_test, q_test, lam)["err_2"]
    dsq = np.mean(((h - q_test) ** 2).sum(1)) - np.mean(((f_test - q_test) ** 2).sum(1))
    assert dsq <= fit.diagnostics["squared_error_bound"]
    assert dsq < 0  # here recalibration also improves the squared error


def test_multiple_lambda_statistics_are_coarsened() -> None:
    rng = np.random.default_rng(8)
    q, y, f = world(5000, 3, rng)
    ids = [str(i) for i in range(len(y))]
    fine = LevelSetStats(3, 40, 9)
    fine.update(f, y, ids)
    coarse = LevelSetStats(3, 20, 9)
    coarse.update(f, y, ids)
    a, b = fit_lp(fine, eps=0.05), fit_lp(coarse, eps=0.05)
    assert np.allclose(a.map.predict(f), b.map.predict(f))
    with pytest.raises(ValueError, match="multiple"):
        fit_lp(LevelSetStats(3, 30, 9), eps=0.05)


def test_noise_cap_passthrough_and_empty() -> None:
    rng = np.random.default_rng(9)
    q, y, f = world(6000, 3, rng)
    a = fit_lp_raw(f, y, eps=0.05, noise=True, seed=3, max_iter=300)
    b = fit_lp_raw(f, y, eps=0.05, noise=True, seed=3, max_iter=300)
    c = fit_lp_raw(f, y, eps=0.05, noise=True, seed=4, max_iter=300)
    assert np.array_equal(a.map.predict(f), b.map.predict(f))
    assert a.diagnostics["noise_scales"]["mass"][0] > 0
    assert not np.array_equal(a.map.predict(f), c.map.predict(f)) or a.diagnostics != c.diagnostics
    capped = fit_lp_raw(f, y, eps=0.05, max_iter=1)
    assert capped.diagnostics["iterations"] == 1 and capped.diagnostics["stopped"] == "iteration cap"
    # passthrough: light-bin predictions are returned unchanged
    pt = fit_lp_raw(f, y, eps=0.05, passthrough=True)
    keys = level_keys(f, pt.diagnostics["lam"])
    heavy = {tuple(k) for k in pt.heavy_keys.tolist()}
    light = np.array([tuple(k) not in heavy for k in keys.tolist()])
    assert light.any()
    assert np.allclose(pt.map.predict(f[light]), f[light])
    np_ = fit_lp_raw(f, y, eps=0.05)
    assert np.allclose(np_.map.predict(f[light]), rho(keys[light], np_.diagnostics["lam"]))
    # no heavy bin at all: h = rho(R(f))
    empty = fit_lp(LevelSetStats(3, 20, 3), eps=0.05)
    assert empty.diagnostics["heavy_bins"] == 0 and empty.map.predict(f[:3]).shape == (3, 3)


# -- tester --------------------------------------------------------------------------------------------
def boundary_sample(n: int, rng: np.random.Generator, gap: float) -> tuple[np.ndarray, np.ndarray]:
    """Two bins of mass 1/2; the first has Err(v, 0) = gap / 2 (so Err_inf = gap / 2)."""
    pts = np.array([[0.55, 0.25, 0.20], [0.15, 0.15, 0.70]])
    truth = pts.copy()
    truth[0] = [0.55 - gap, 0.25 + gap, 0.20]
    which = rng.integers(0, 2, size=n)
    y = np.minimum((rng.random(n)[:, None] > np.cumsum(truth[which], axis=1)).sum(axis=1), 2)
    return pts[which], y


def test_tester_level_and_power() -> None:
    rng = np.random.default_rng(10)
    eps, reps, n = 0.05, 120, 3000
    null_rej = alt_rej = 0
    for _ in range(reps):
        f, y = boundary_sample(n, rng, gap=2 * eps)  # Err_inf = eps exactly: the boundary of H0
        s = LevelSetStats(3, 10, 1)
        s.update(f, y)
        null_rej += lp_test(s, eps=eps, alpha=0.05)["decision"] == "miscalibrated"
        f, y = boundary_sample(n, rng, gap=0.2)  # Err_inf = 0.1
        s = LevelSetStats(3, 10, 1)
        s.update(f, y)
        alt_rej += lp_test(s, eps=eps, alpha=0.05)["decision"] == "miscalibrated"
    assert null_rej / reps <= 0.05 + 2 * math.sqrt(0.05 * 0.95 / reps)
    assert alt_rej / reps >= 0.9


def test_tester_registry_raw_and_levelset_agree() -> None:
    rng = np.random.default_rng(11)
    f, y = boundary_sample(5000, rng, gap=0.0)
    s = LevelSetStats(3, 10, 13)
    s.update(f, y)
    a = run_tester("lp", CalibrationData(n=5000, probs=f, labels=y, raw_is_complete=True), eps=0.1).to_dict()
    b = run_tester("lp", CalibrationData(n=5000, levelset=s), eps=0.1).to_dict()
    assert a["statistic"] == pytest.approx(b["statistic"]) and a["p_value"] == pytest.approx(b["p_value"])
    assert a["decision"] == b["decision"] == "calibrated"
    json.dumps(a, allow_nan=False)
    c = run_tester("lp", CalibrationData(n=20, probs=f[:20], labels=y[:20]), eps=0.1).to_dict()
    assert c["decision"] == "insufficient data"
    d = run_tester("lp", CalibrationData(n=0), eps=0.1).to_dict()
    assert d["decision"] == "insufficient data"
    e = run_tester("lp", CalibrationData(n=5000, levelset=s), eps=0.1, p=2.0).to_dict()
    assert e["p"] == 2.0 and e["lower"] <= e["statistic"] <= e["upper"] and e["lam"] == 10
    # a window at a multiple of lambda is coarsened to the tester's lambda
    fine = LevelSetStats(3, 30, 2)
    fine.update(f, y)
    g = run_tester("lp", CalibrationData(n=5000, levelset=fine), eps=0.1).to_dict()
    assert g["lam"] == 10 and g["statistic"] == pytest.approx(b["statistic"])


# -- calibrator ----------------------------------------------------------------------------------------
def test_calibrator_document_and_data_paths() -> None:
    rng = np.random.default_rng(12)
    q, y, f = world(8000, 4, rng)
    cls: Any = get_calibrator("lp")  # the registry types classes as plain Calibrator
    cal = cls(eps=0.1, p="inf").fit(f, y)
    doc = json.loads(json.dumps(cal.to_document()))
    back = from_document(doc)
    assert np.array_equal(back.predict(f), cal.predict(f))
    assert doc["training"]["heavy_bins"] == cal.diagnostics["heavy_bins"]
    s = LevelSetStats(4, 10)
    s.update(f, y)
    via_stats = cls(eps=0.1).fit_data(CalibrationData(n=8000, levelset=s))
    assert via_stats.training["source"] == "levelset" and via_stats.training["window_n"] == 8000
    raw = CalibrationData(n=8000, probs=f, labels=y, raw_is_complete=True)
    via_raw = cls(eps=0.1, pools=13).fit_data(raw)
    assert np.array_equal(via_raw.predict(f), via_stats.predict(f))  # same sequence routing
    bad = json.loads(json.dumps(doc))
    bad["params"]["map"]["keys"] = [[99, 0, 0, 0]]
    with pytest.raises(CalibratorError):
        from_document(bad)
    with pytest.raises(ValueError):
        cls(eps=0.1, p=1.0)
    with pytest.raises(ValueError):
        cal.predict(np.ones((2, 3)) / 3)


def test_map_validation() -> None:
    with pytest.raises(ValueError, match="simplex"):
        LevelSetMap(lam=2, classes=2, keys=np.array([[1, 0]]), group_of=np.array([0]),
                    preds=np.array([[0.9, 0.9]]))
    m = LevelSetMap.from_params({"lam": 3, "classes": 3, "keys": [], "group_of": [], "preds": []})
    assert m.predict(np.array([[0.2, 0.3, 0.5]])).shape == (1, 3)


@pytest.mark.parametrize(("n1", "c1", "n2", "c2", "kept"), [
    (300, 165, 500, 225, [0.525, 0.475]),  # the updated group is heavier: its new prediction is kept
    (600, 330, 400, 180, [0.55, 0.45]),    # the other group is heavier: pred(S') wins
])
def test_merge_keeps_the_prediction_of_the_heavier_group(n1: int, c1: int, n2: int, c2: int,
                                                         kept: list[float]) -> None:
    # bin v1 = (0.5, 0.4) (rho = (0.55, 0.45)) is calibrated; bin v2 = (0.6, 0.4) has class-0 frequency
    # 0.45, so step 3b moves it to pi((0.45, 0.4)) = (0.525, 0.475), whose level set is v1's: merge.
    f = np.array([[0.55, 0.45]] * n1 + [[0.6, 0.4]] * n2)
    y = np.array([0] * c1 + [1] * (n1 - c1) + [0] * c2 + [1] * (n2 - c2))
    s = LevelSetStats(2, 10, pools=1)
    s.update(f, y)
    fit = fit_lp(s, eps=0.1)
    d = fit.diagnostics
    assert (d["heavy_bins"], d["groups"], d["merges"], d["piece_merges"], d["iterations"]) == (2, 1, 1, 1, 1)
    assert fit.groups[0]["pred"] == pytest.approx(kept)
    assert [pc["size_exp"] for pc in fit.groups[0]["pieces"]] == [1]
    assert np.allclose(fit.map.predict(np.array([[0.55, 0.45], [0.6, 0.4]])), [kept, kept])


def test_model_stats_window_feeds_tester_and_calibrator() -> None:
    from calmon.stats.model import ModelStats
    rng = np.random.default_rng(13)
    q, y, f = world(6000, 4, rng)
    ids = np.array([f"id{i}" if i % 7 else "" for i in range(len(y))], dtype=object)
    a = ModelStats(classes=4, bins=64, reservoir=100, levelset_lambda=10, levelset_pools=13)
    b = ModelStats(classes=4, bins=64, reservoir=100, levelset_lambda=10, levelset_pools=13)
    a.update(probs=f[:3000], labels=y[:3000], ids=ids[:3000])
    b.update(probs=f[3000:], labels=y[3000:], ids=ids[3000:])
    a.merge(b)
    back = ModelStats.from_dict(json.loads(json.dumps(a.to_dict())))
    assert back.levelset == a.levelset and back.levelset is not None and back.levelset.count == 6000
    data = back.calibration_data()
    res = run_tester("lp", data, eps=0.1).to_dict()
    direct = lp_error_raw(f, y, 10)
    assert res["source"] == "levelset" and res["statistic"] == pytest.approx(direct["err_inf"])
    cal = cast(Any, get_calibrator("lp"))(eps=0.1).fit_data(data)
    assert cal.training["source"] == "levelset" and cal.predict(f[:5]).shape == (5, 4)
