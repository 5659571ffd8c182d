"""Label-free estimates (CBPE on the grid) and score drift: against brute force, scikit-learn and simulation."""

from __future__ import annotations

import numpy as np
import pytest
from sklearn import metrics as skm

from calmon.algorithms.estimate import METRICS, estimate_performance, realised_metrics
from calmon.algorithms.scoredrift import score_drift
from calmon.stats.grid import ScoreGrid

BINS = 256


def on_centres(rng, n, a=2.0, b=3.0):
    """Scores at grid cell centres: the grid's cell means are then the scores themselves (no binning error)."""
    return (np.floor(rng.beta(a, b, n) * BINS) + 0.5) / BINS


def grids(z, y):
    pred, lab = ScoreGrid(BINS), ScoreGrid(BINS)
    pred.update(z, np.zeros(z.size))
    lab.update(z, y)
    return pred, lab


def test_realised_metrics_equal_scikit_learn():
    rng = np.random.default_rng(1)
    z = on_centres(rng, 5000)
    y = (rng.uniform(size=z.size) < z).astype(float)
    got = realised_metrics(grids(z, y)[1], threshold=0.5)
    yhat = z >= 0.5
    want = {"accuracy": skm.accuracy_score(y, yhat), "precision": skm.precision_score(y, yhat),
            "recall": skm.recall_score(y, yhat), "base_rate": y.mean(), "brier": skm.brier_score_loss(y, z),
            "log_loss": skm.log_loss(y, z), "roc_auc": skm.roc_auc_score(y, z)}
    for m in METRICS:
        assert got[m] == pytest.approx(want[m], rel=1e-9, abs=1e-12), m


def test_expected_metrics_equal_brute_force_expectation():
    """Expectation over y ~ Bernoulli(q(z)) computed per event, independently of the grid code."""
    rng = np.random.default_rng(2)
    z = on_centres(rng, 4000)
    q = np.clip(z * 0.8 + 0.05, 0, 1)  # a calibrator in service
    est = estimate_performance(grids(z, np.zeros(z.size))[0], threshold=0.5, calibrator=lambda s: s * 0.8 + 0.05)
    above = z >= 0.5
    assert est["accuracy"].value == pytest.approx(np.mean(np.where(above, q, 1 - q)), rel=1e-9)
    assert est["precision"].value == pytest.approx(q[above].mean(), rel=1e-9)
    assert est["recall"].value == pytest.approx(q[above].sum() / q.sum(), rel=1e-9)
    assert est["base_rate"].value == pytest.approx(q.mean(), rel=1e-9)
    assert est["brier"].value == pytest.approx(np.mean(q * (1 - z) ** 2 + (1 - q) * z ** 2), rel=1e-9)
    assert est["log_loss"].value == pytest.approx(np.mean(-q * np.log(z) - (1 - q) * np.log1p(-z)), rel=1e-9)
    # AUC as the ratio of expected pair counts (ties count half)
    order = np.argsort(z)
    zs, qs = z[order], q[order]
    pos, neg = qs, 1 - qs
    wins = sum(pos[i] * neg[zs < zs[i]].sum() + 0.5 * pos[i] * neg[zs == zs[i]].sum() for i in range(zs.size))
    assert est["roc_auc"].value == pytest.approx(wins / (pos.sum() * neg.sum()), rel=1e-9)


@pytest.mark.parametrize("draws", [0, 200])
def test_intervals_cover_the_realised_metrics(draws):
    """Reduced version of benchmarks/estimate_eval.py: 95 % intervals over 300 calibrated windows."""
    rng = np.random.default_rng(3)
    cover = dict.fromkeys(METRICS, 0)
    reps = 300
    for r in range(reps):
        z = rng.beta(2, 3, 2000)
        y = (rng.uniform(size=z.size) < z).astype(float)
        pred, lab = grids(z, y)
        est = estimate_performance(pred, draws=draws, seed=r)
        real = realised_metrics(lab)
        for m in METRICS:
            cover[m] += est[m].lo <= real[m] <= est[m].hi
    for m in METRICS:
        assert 0.90 <= cover[m] / reps <= 0.99, (m, cover[m] / reps)


def test_score_drift_holds_its_level_and_has_power():
    rng = np.random.default_rng(4)
    reps, rej = 400, 0
    for _ in range(reps):
        a, b = grids(rng.beta(2, 5, 4000), np.zeros(4000))[0], grids(rng.beta(2, 5, 1000), np.zeros(1000))[0]
        rej += score_drift(a, b).p_value < 0.05
    assert 0.025 <= rej / reps <= 0.08  # 0.05 +- 3 standard errors
    ref, cur = grids(rng.beta(2, 5, 4000), np.zeros(4000))[0], grids(rng.beta(2.5, 5, 1000), np.zeros(1000))[0]
    d = score_drift(ref, cur)
    assert d.p_value < 1e-3 and d.psi > 0.02


def test_empty_inputs():
    assert estimate_performance(ScoreGrid(BINS)) == {}
    assert realised_metrics(ScoreGrid(BINS)) == {}
    d = score_drift(ScoreGrid(BINS), ScoreGrid(BINS))
    assert d.n_reference == 0 and np.isnan(d.p_value)


def test_expected_metrics_are_the_estimates_values():
    rng = np.random.default_rng(6)
    pred = grids(on_centres(rng, 3000), np.zeros(3000))[0]
    cal = lambda s: s * 0.9 + 0.03  # noqa: E731
    est = estimate_performance(pred, calibrator=cal)
    from calmon.algorithms.estimate import expected_metrics
    assert expected_metrics(pred, calibrator=cal) == {m: e.value for m, e in est.items()}
    assert expected_metrics(ScoreGrid(BINS)) == {}
