"""Temperature scaling against a brute-force search of the multiclass NLL."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import optimize, special

from calmon.calibration.temperature import TemperatureCalibrator


def _data(seed: int, n: int, k: int, factor: float) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    logits = 1.5 * rng.normal(size=(n, k))
    true = special.softmax(logits, axis=1)
    labels = (rng.uniform(size=(n, 1)) > true.cumsum(1)).sum(1).clip(0, k - 1)
    return special.softmax(factor * logits, axis=1), labels


@pytest.mark.parametrize(("factor", "k"), [(2.5, 5), (0.5, 3), (1.0, 10)])
def test_temperature_minimises_nll(factor: float, k: int) -> None:
    probs, labels = _data(int(10 * factor), 4000, k, factor)
    cal = TemperatureCalibrator().fit(probs, labels)
    logp = np.log(probs)

    def nll(t: float) -> float:
        return -float(np.mean(special.log_softmax(logp / t, axis=1)[np.arange(labels.size), labels]))

    grid = np.exp(np.linspace(np.log(0.1), np.log(10), 201))  # coarse brute force, then Brent on the NLL
    t0 = grid[int(np.argmin([nll(t) for t in grid]))]
    ref = optimize.minimize_scalar(nll, bounds=(t0 / 1.05, t0 * 1.05), method="bounded", options={"xatol": 1e-8})
    assert cal.temperature == pytest.approx(ref.x, rel=1e-5)
    assert cal.temperature == pytest.approx(factor, rel=0.1)
    out = cal.predict(probs)
    np.testing.assert_allclose(out.sum(1), 1.0)
    assert (out.argmax(1) == probs.argmax(1)).all()  # temperature keeps the ranking


def test_temperature_validation_and_bounds() -> None:
    with pytest.raises(ValueError, match="sum to 1"):
        TemperatureCalibrator().fit(np.array([[0.5, 0.6]]), np.array([0]))
    with pytest.raises(ValueError, match="class indices"):
        TemperatureCalibrator().fit(np.array([[0.5, 0.5]]), np.array([2]))
    # all predictions correct and confident: NLL decreases as T -> 0, fit stops at t_min
    probs = np.array([[0.9, 0.1], [0.2, 0.8]] * 10)
    cal = TemperatureCalibrator(t_min=0.05).fit(probs, np.array([0, 1] * 10))
    assert cal.temperature == pytest.approx(0.05)
    with pytest.raises(ValueError, match="fitted on 2 classes"):
        cal.predict(np.full((1, 3), 1 / 3))


@pytest.mark.parametrize("factor", [2.0, 0.6])
def test_binary_temperature_minimises_the_bernoulli_nll(factor: float) -> None:
    """Binary scores: ``sigmoid(logit(z) / T)``, T from a brute-force search of the Bernoulli NLL (issue #32)."""
    rng = np.random.default_rng(int(10 * factor))
    u = 1.5 * rng.normal(size=8000)
    y = (rng.uniform(size=u.size) < special.expit(u)).astype(float)
    z = special.expit(factor * u)  # over-confident (factor > 1) or under-confident scores
    cal = TemperatureCalibrator().fit(z, y)
    assert cal.kind == "binary" and cal.classes == 2
    lz = np.log(z) - np.log1p(-z)

    def nll(t: float) -> float:
        return float(np.mean(np.logaddexp(0.0, lz / t) - y * lz / t))

    grid = np.exp(np.linspace(np.log(0.1), np.log(10), 201))
    t0 = grid[int(np.argmin([nll(t) for t in grid]))]
    ref = optimize.minimize_scalar(nll, bounds=(t0 / 1.05, t0 * 1.05), method="bounded", options={"xatol": 1e-8})
    assert cal.temperature == pytest.approx(ref.x, rel=1e-5)
    assert cal.temperature == pytest.approx(factor, rel=0.1)
    np.testing.assert_allclose(cal.predict(z), special.expit(lz / cal.temperature))
    # from binned statistics: the same temperature within the grid's resolution
    from calmon.stats.grid import ScoreGrid
    g = ScoreGrid(4096)
    g.update(z, y)
    assert TemperatureCalibrator().fit_grid(g).temperature == pytest.approx(cal.temperature, rel=2e-2)
    # the document round-trips with its kind; a document without a kind (older releases) is multiclass
    back = TemperatureCalibrator.from_params(cal.get_params())
    assert back.kind == "binary"
    np.testing.assert_allclose(back.predict(z), cal.predict(z))
    old = {k: v for k, v in cal.get_params().items() if k != "kind"}
    assert TemperatureCalibrator.from_params(old).kind == "multiclass"
