"""The AUC's delta-method interval against a large parametric bootstrap; the shared labelled path."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats
from sklearn import metrics as skm

from calmon.algorithms.estimate import estimate_performance, estimation_error, expected_metrics, realised_metrics
from calmon.stats.grid import ScoreGrid

BINS = 256
DRAWS = 20_000


def cells(grid):
    n = grid.n
    keep = n > 0
    return n[keep], grid.sum_z[keep] / n[keep]


def rank_auc(n, pos):
    """Mann-Whitney AUC from mid-ranks (cells in score order, ties within a cell share a mid-rank), per column."""
    midrank = (np.cumsum(n) - n + (n + 1) / 2)[:, None]
    p = pos.sum(0)
    m = n.sum() - p
    return ((pos * midrank).sum(0) - p * (p + 1) / 2) / (p * m)


def test_rank_auc_equals_scikit_learn():
    rng = np.random.default_rng(0)
    n = rng.integers(1, 30, 40).astype(float)
    pos = rng.binomial(n.astype(np.int64)[:, None], 0.4, (n.size, 3)).astype(float)
    z = np.arange(n.size) / n.size
    for d in range(3):
        y = np.r_[np.ones(n.size), np.zeros(n.size)]
        w = np.r_[pos[:, d], n - pos[:, d]]
        want = skm.roc_auc_score(y, np.r_[z, z], sample_weight=w)
        assert rank_auc(n, pos[:, [d]])[0] == pytest.approx(want, rel=1e-12)


@pytest.mark.parametrize("events", [300, 2000, 20_000])
@pytest.mark.parametrize("calibrator", [None, "overconfident", "shifted"])
def test_auc_delta_sd_matches_a_large_parametric_bootstrap(events, calibrator):
    """SD implied by the default AUC interval vs the SD of the AUC over 20,000 draws k_c ~ Binomial(n_c, q_c).

    Tolerance 4 % relative: the bootstrap SD's own Monte Carlo error is about 1 / sqrt(2 * 20,000) = 0.5 %
    (so 4 % is 8 of its standard errors), and the delta method's first-order error is O(1 / n) (observed
    below 1.1 % on these grids, the smallest of ~125 occupied cells and 300 events).
    """
    rng = np.random.default_rng(events)
    g = ScoreGrid(BINS)
    g.update(rng.beta(2, 5, events), np.zeros(events))
    cal = {None: None, "overconfident": lambda s: 1 / (1 + np.exp(-np.log(s / (1 - s)) / 0.6)),
           "shifted": lambda s: np.clip(s + 0.15, 0, 1)}[calibrator]
    est = estimate_performance(g, calibrator=cal, level=0.95)["roc_auc"]
    sd = (est.hi - est.lo) / (2 * stats.norm.ppf(0.975))
    n, z = cells(g)
    q = np.clip(cal(z) if cal else z, 0, 1)
    aucs = np.concatenate([rank_auc(n, rng.binomial(n.astype(np.int64)[:, None], q[:, None], (n.size, DRAWS // 4)))
                           for _ in range(4)])
    boot = float(np.std(aucs, ddof=1))
    assert sd == pytest.approx(boot, rel=0.04), (sd, boot)
    # the interval is centred on the expected AUC, which the bootstrap mean approaches
    assert est.value == pytest.approx(float(aucs.mean()), abs=4 * boot / np.sqrt(DRAWS) + 2 / events)


def test_auc_interval_is_degenerate_when_outcomes_are_certain():
    g = ScoreGrid(BINS)
    g.update(np.r_[np.full(50, 0.01), np.full(50, 0.99)], np.zeros(100))
    est = estimate_performance(g, calibrator=lambda s: (s > 0.5).astype(float))["roc_auc"]
    assert (est.value, est.lo, est.hi) == (1.0, 1.0, 1.0)
    one_cell = ScoreGrid(BINS)
    one_cell.update(np.full(200, 0.3), np.zeros(200))
    est = estimate_performance(one_cell)["roc_auc"]
    assert est.value == pytest.approx(0.5) and est.hi - est.lo == pytest.approx(0.0, abs=1e-12)


def test_estimation_error_is_expected_minus_realised():
    rng = np.random.default_rng(7)
    z = rng.beta(2, 3, 3000)
    y = (rng.uniform(size=z.size) < z).astype(float)
    g = ScoreGrid(BINS)
    g.update(z, y)
    cal = lambda s: 0.9 * s + 0.03  # noqa: E731
    for threshold in (0.0, 0.3, 0.5):
        got = estimation_error(g, threshold=threshold, calibrator=cal)
        mine, real = expected_metrics(g, threshold=threshold, calibrator=cal), realised_metrics(g, threshold=threshold)
        assert got.keys() == mine.keys()
        for m in got:
            assert got[m] == pytest.approx(mine[m] - real[m], rel=1e-12, abs=1e-13), m
    assert estimation_error(ScoreGrid(BINS)) == {}
