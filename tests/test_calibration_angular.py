"""Angular calibration: quadrature, Stein streaming estimate, offline eqs. (11)-(13), Platt limit (eq. 9)."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import integrate, special

from calmon.calibration.angular import (
    AngularCalibrator,
    estimate_angle,
    expected_link_slope,
    gaussian_expectation,
    platt_limit,
)
from calmon.calibration.platt import PlattCalibrator


def _quad(f, mu: float, tau: float) -> float:
    val, _ = integrate.quad(lambda z: f(mu + tau * z) * np.exp(-z * z / 2) / np.sqrt(2 * np.pi), -np.inf, np.inf,
                            epsabs=1e-13)
    return val


@pytest.mark.parametrize(("mu", "tau"), [(0.0, 0.5), (1.0, 3.0), (-2.0, 1.5), (4.0, 0.1)])
def test_gaussian_expectation_against_quad(mu: float, tau: float) -> None:
    assert float(gaussian_expectation(mu, tau, "logit")) == pytest.approx(_quad(special.expit, mu, tau), abs=1e-5)
    assert float(gaussian_expectation(mu, tau, "probit")) == pytest.approx(_quad(special.ndtr, mu, tau), abs=1e-10)


def test_link_slope_against_quad() -> None:
    dens = {"logit": lambda x: special.expit(x) * special.expit(-x),
            "probit": lambda x: np.exp(-x * x / 2) / np.sqrt(2 * np.pi)}
    for link, tol in (("logit", 1e-4), ("probit", 1e-12)):
        ref = 3.0 * _quad(dens[link], 1.0, 3.0)  # E sigma'(Z) for sigma(u) = F(3u + 1)
        assert expected_link_slope(3.0, 1.0, link) == pytest.approx(ref, abs=tol)
    assert expected_link_slope(3.0, 1.0, "logit", nodes=120) == pytest.approx(3.0 * _quad(dens["logit"], 1.0, 3.0),
                                                                              abs=1e-7)


@pytest.mark.parametrize(("link", "cos"), [("logit", 0.6), ("probit", 0.3), ("logit", -0.5)])
def test_streaming_angle_recovers_truth(link: str, cos: float) -> None:
    rng = np.random.default_rng(11)
    n, norm = 400_000, 1.7
    u = rng.normal(size=n)
    s = norm * (cos * u + np.sqrt(1 - cos * cos) * rng.normal(size=n))
    prob = special.expit(3 * u + 1) if link == "logit" else special.ndtr(3 * u + 1)
    y = (rng.uniform(size=n) < prob).astype(float)
    cal = AngularCalibrator(link=link, link_scale=3.0, link_intercept=1.0, score_input="margin").fit(s, y)
    assert cal.cos_theta == pytest.approx(cos, abs=0.02)
    assert cal.score_scale == pytest.approx(norm, rel=0.01)
    # the moment form from additive sums is the same fit
    m = AngularCalibrator(link=link, link_scale=3.0, link_intercept=1.0, score_input="margin").fit_moments(
        n, s.sum(), (s * s).sum(), (s * y).sum(), y.sum())
    assert m.cos_theta == pytest.approx(cal.cos_theta, abs=1e-12)
    # and with the true angle the predictor is calibrated: E[y | s] = f(s) (binned check)
    f = cal.predict(s)
    bins = np.clip((f * 10).astype(int), 0, 9)
    for b in range(10):
        sel = bins == b
        if sel.sum() > 5000:
            assert abs(y[sel].mean() - f[sel].mean()) < 0.02


def test_angular_from_grid_matches_raw_fit() -> None:
    from calmon.stats.grid import ScoreGrid
    rng = np.random.default_rng(5)
    n = 100_000
    u = rng.normal(size=n)
    s = 1.2 * (0.5 * u + np.sqrt(0.75) * rng.normal(size=n))
    y = (rng.uniform(size=n) < special.expit(3 * u + 1)).astype(float)
    z = special.expit(s)
    g = ScoreGrid(4096)
    g.update(z, y)
    raw = AngularCalibrator(link_scale=3.0, link_intercept=1.0).fit(z, y)
    grid = AngularCalibrator(link_scale=3.0, link_intercept=1.0).fit_grid(g)
    assert grid.cos_theta == pytest.approx(raw.cos_theta, abs=2e-3)
    assert grid.score_scale == pytest.approx(raw.score_scale, rel=2e-3)
    assert raw.cos_theta == pytest.approx(0.5, abs=0.02)


def test_probit_angular_is_exactly_a_platt_map() -> None:
    """Li & Sur, Section 5: for sigma = Phi(a u + b), f_ang = Phi(a (A* s + B*) + b) with eq. (9)."""
    a, b, cos, norm = 2.0, 0.5, 0.7, 1.3
    cal = AngularCalibrator(link="probit", link_scale=a, link_intercept=b, score_input="margin")
    cal.cos_theta, cal.score_scale, cal.score_center, cal.fitted = cos, norm, 0.0, True
    s = np.linspace(-4, 4, 41)
    A, B = platt_limit(cos, norm, a, b)
    np.testing.assert_allclose(cal.predict(s), special.ndtr(a * (A * s + B) + b), atol=1e-12)
    # and Platt scaling (probit link, on the margin) fitted on a large holdout converges to it
    rng = np.random.default_rng(2)
    n = 200_000
    u = rng.normal(size=n)
    sh = norm * (cos * u + np.sqrt(1 - cos * cos) * rng.normal(size=n))
    y = (rng.uniform(size=n) < special.ndtr(a * u + b)).astype(float)
    platt = PlattCalibrator(link="probit").fit(special.expit(sh), y)  # logit(expit(s)) = s
    assert platt.A == pytest.approx(a * A, abs=0.02) and platt.B == pytest.approx(a * B + b, abs=0.02)


def _ridge_logistic(X: np.ndarray, y: np.ndarray, c: float) -> np.ndarray:
    n, d = X.shape
    w = np.zeros(d)
    for _ in range(40):
        p = special.expit(X @ w)
        g = X.T @ (p - y) / n + c * w
        H = X.T @ (X * (p * (1 - p))[:, None]) / n + c * np.eye(d)
        step = np.linalg.solve(H, g)
        w -= step
        if np.abs(step).max() < 1e-12:
            break
    return w


def test_offline_estimator_reduced_section7() -> None:
    """Eqs. (11)-(13) with the corrected gamma on a reduced Section 7 (n = 600, d = 300)."""
    n, d, lam = 600, 300, 0.5
    errs, printed = [], []
    for seed in range(2):
        rng = np.random.default_rng(seed)
        idx = np.arange(d)
        sigma = 0.5 ** np.abs(idx[:, None] - idx[None, :]) / d
        C = np.linalg.cholesky(sigma)
        w_star = rng.normal(size=d)
        w_star /= np.sqrt(w_star @ sigma @ w_star)
        X = rng.normal(size=(n, d)) @ C.T
        y = (rng.uniform(size=n) < special.expit(3 * X @ w_star + 1)).astype(float)
        w_hat = _ridge_logistic(X, y, lam / d)
        Xh = rng.normal(size=(200, d)) @ C.T
        yh = (rng.uniform(size=200) < special.expit(3 * Xh @ w_star + 1)).astype(float)
        est = estimate_angle(X, y, w_hat, sigma, penalty_hessian=lam / d, holdout_scores=Xh @ w_hat,
                             holdout_labels=yh)
        errs.append(abs(est["inner"] - w_hat @ sigma @ w_star))
        assert est["norm"] == pytest.approx(np.sqrt(w_hat @ sigma @ w_hat))
        assert est["sign"] == 1.0
        if seed == 0:
            df = estimate_angle(X, y, w_hat, sigma, penalty_hessian=lam / d, sign=1.0, gamma="df")
            assert df["inner"] == pytest.approx(est["inner"], abs=0.05)
            printed.append(estimate_angle(X, y, w_hat, sigma, penalty_hessian=lam / d, sign=1.0, gamma="printed"))
    assert max(errs) < 0.1
    # the printed gamma is far off (that is why it is corrected)
    assert all(not (abs(p["inner"]) < 1.5) for p in printed)


def test_angular_validation() -> None:
    with pytest.raises(ValueError, match="zero variance"):
        AngularCalibrator(score_input="margin").fit(np.ones(10), np.r_[np.zeros(5), np.ones(5)])
    with pytest.raises(ValueError, match="link_scale"):
        AngularCalibrator(link_scale=0.0)
    with pytest.raises(ValueError, match="holdout"):
        estimate_angle(np.eye(3), np.zeros(3), np.ones(3), np.eye(3), penalty_hessian=1.0)
