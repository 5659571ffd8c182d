"""Score drift: the chi-square statistic against scipy's contingency test; p-value and document as scipy/asdict."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from scipy import stats

from calmon.algorithms.scoredrift import _interval_counts, _merge_small, score_drift
from calmon.stats.grid import ScoreGrid


def grid(z):
    g = ScoreGrid(256)
    g.update(z, np.zeros(z.size))
    return g


@pytest.mark.parametrize("seed", range(6))
def test_score_drift_equals_scipy(seed):
    rng = np.random.default_rng(seed)
    nr, nc = int(rng.integers(20, 30_000)), int(rng.integers(20, 5_000))
    ref, cur = grid(rng.beta(2, 5, nr)), grid(rng.beta(2 + 0.3 * rng.uniform(), 5, nc))
    bins = int(rng.integers(2, 30))
    d = score_drift(ref, cur, bins=bins)
    r, c = _merge_small(*_interval_counts(ref, cur, bins))
    want = stats.chi2_contingency(np.vstack([r, c]), correction=False)
    assert (d.statistic, d.df) == (pytest.approx(want.statistic, rel=1e-10), want.dof)
    assert d.p_value == pytest.approx(want.pvalue, rel=1e-9, abs=1e-300)
    assert d.p_value == float(stats.chi2.sf(d.statistic, d.df))  # bit for bit: the same special function
    assert d.to_dict() == dataclasses.asdict(d)
    assert (d.n_reference, d.n_current) == (nr, nc)
