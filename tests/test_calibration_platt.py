"""Platt scaling against scikit-learn's unpenalised logistic regression and a generic optimiser."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from scipy import optimize, special

from calmon.calibration.platt import PlattCalibrator, fit_glm2, logit
from calmon.stats.grid import ScoreGrid


def _sklearn_unpenalised(u: np.ndarray, y: np.ndarray, w: np.ndarray | None = None) -> tuple[float, float]:
    from sklearn.linear_model import LogisticRegression

    try:
        lr = LogisticRegression(C=np.inf, tol=1e-12, max_iter=100000)
    except TypeError:  # pragma: no cover - old scikit-learn
        lr = LogisticRegression(penalty="none", tol=1e-12, max_iter=100000)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        lr.fit(u[:, None], y, sample_weight=w)
    return float(lr.coef_[0, 0]), float(lr.intercept_[0])


def _data(seed: int, n: int, a: float, b: float) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    z = rng.beta(2, 2, n)
    y = (rng.uniform(size=n) < special.expit(a * logit(z) + b)).astype(float)
    return z, y


@pytest.mark.parametrize(("seed", "a", "b"), [(0, 0.7, -0.4), (1, 2.0, 0.5), (2, 1.0, 0.0), (3, 0.3, 1.2)])
def test_platt_raw_matches_sklearn(seed: int, a: float, b: float) -> None:
    z, y = _data(seed, 5000, a, b)
    cal = PlattCalibrator().fit(z, y)
    A, B = _sklearn_unpenalised(logit(z), y)
    assert abs(cal.A - A) < 1e-4 and abs(cal.B - B) < 1e-4


def test_platt_weighted_matches_sklearn_and_replication() -> None:
    z, y = _data(5, 800, 1.5, -0.3)
    w = np.random.default_rng(6).integers(1, 4, z.size).astype(float)
    cal = PlattCalibrator().fit(z, y, sample_weight=w)
    A, B = _sklearn_unpenalised(logit(z), y, w)
    assert abs(cal.A - A) < 1e-4 and abs(cal.B - B) < 1e-4
    rep = PlattCalibrator().fit(np.repeat(z, w.astype(int)), np.repeat(y, w.astype(int)))
    assert abs(rep.A - cal.A) < 1e-8 and abs(rep.B - cal.B) < 1e-8


@pytest.mark.parametrize("seed", [0, 1])
def test_platt_from_4096_cell_grid_within_1e3(seed: int) -> None:
    z, y = _data(seed, 50000, 0.8, 0.3)
    g = ScoreGrid(4096)
    g.update(z, y)
    cal = PlattCalibrator().fit_grid(g)
    A, B = _sklearn_unpenalised(logit(z), y)
    assert abs(cal.A - A) < 1e-3 and abs(cal.B - B) < 1e-3
    assert cal.training["source"] == "grid"


def test_probit_matches_generic_optimiser() -> None:
    z, y = _data(7, 3000, 1.2, 0.2)
    u = logit(z)
    cal = PlattCalibrator(link="probit").fit(z, y)

    def nll(th: np.ndarray) -> float:
        eta = th[0] * u + th[1]
        return -float(np.sum(y * special.log_ndtr(eta) + (1 - y) * special.log_ndtr(-eta)))

    res = optimize.minimize(nll, np.array([0.5, 0.0]), method="Nelder-Mead",
                            options={"xatol": 1e-10, "fatol": 1e-12, "maxiter": 20000})
    assert abs(cal.A - res.x[0]) < 1e-4 and abs(cal.B - res.x[1]) < 1e-4


def test_separable_window_stays_finite_and_bounded() -> None:
    z = np.array([0.1, 0.2, 0.3, 0.7, 0.8, 0.9])
    y = np.array([0, 0, 0, 1, 1, 1.0])
    cal = PlattCalibrator().fit(z, y)
    assert np.isfinite([cal.A, cal.B]).all() and cal.A > 1
    tight = PlattCalibrator(bound=2.0, l2=0.0).fit(z, y)
    assert tight.A == pytest.approx(2.0) and abs(tight.B) <= 2.0
    one_class = PlattCalibrator().fit(z, np.zeros(6))
    assert np.isfinite([one_class.A, one_class.B]).all() and one_class.predict(z).max() < 0.01


def test_glm2_zero_slope_recovers_base_rate() -> None:
    t = np.array([0.3, 0.3, 0.3])
    A, B = fit_glm2(np.array([-1.0, 0.0, 1.0]), t, np.array([10.0, 10.0, 10.0]))
    assert abs(A) < 1e-6 and special.expit(B) == pytest.approx(0.3, abs=1e-6)


def test_platt_input_validation() -> None:
    with pytest.raises(ValueError, match="probabilities"):
        PlattCalibrator().fit(np.array([0.2, 1.5]), np.array([0, 1]))
    with pytest.raises(ValueError, match="0 or 1"):
        PlattCalibrator().fit(np.array([0.2, 0.5]), np.array([0, 2]))
    with pytest.raises(ValueError, match="link"):
        PlattCalibrator(link="cloglog")
    with pytest.raises(ValueError, match="not fitted"):
        PlattCalibrator().predict(np.array([0.5]))
