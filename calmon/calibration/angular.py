"""Angular calibration (Li & Sur): offline angle estimator and the streaming form.

Data model: ``y ~ Bern(sigma(<w*, x>))`` with ``x ~ N(0, Sigma)``, ``||w*||_Sigma = 1`` and a link
``sigma(u) = F(a u + b)`` (``F`` logistic or normal CDF; ``a`` carries the signal strength, ``b`` the
intercept).  For a linear score ``s = <w_hat, x>`` the angular predictor (Definition 1, eq. 3) is

    f_ang(s; theta) = E_Z sigma(cos(theta) s / ||w_hat||_Sigma + sin(theta) Z),   Z ~ N(0, 1),

exactly calibrated at the true angle ``theta*`` between ``w*`` and ``w_hat`` (Theorem 8).

Two ways to obtain the angle:

* :func:`estimate_angle` -- the paper's offline estimator, eqs. (11)-(13), from the training data
  ``X, y``, ``w_hat``, ``Sigma``, the loss and the penalty Hessian, with the corrected ``gamma``
  (see ``gamma`` below and ``../shared/specs/angular-platt.md``);
* :meth:`AngularCalibrator.fit` -- the streaming form from scores and labels only, valid when the
  link (``F``, ``a``, ``b``) is declared: ``||w_hat||_Sigma`` = sd of the scores and, by Stein's
  lemma, ``cos(theta) = mean((s - sbar) y) / (sd(s) E sigma'(Z))``; it needs only the additive
  sums ``n, sum s, sum s^2, sum s y`` (:meth:`AngularCalibrator.fit_moments`).  The angle is not
  identifiable from ``(s, y)`` without the link.

Gaussian expectations use probabilists' Gauss-Hermite quadrature (40 nodes: error ~5e-6 at
``tau = 3`` for the logistic); the probit link has the closed form ``Phi(mu / sqrt(1 + tau^2))``.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any

import numpy as np
from scipy import linalg, special

from calmon.calibration.base import Calibrator
from calmon.calibration.params import check_binary, param_choice, param_float
from calmon.calibration.platt import logit

LINKS = ("logit", "probit")
INPUTS = ("logit", "margin")
GAMMAS = ("sigma", "df", "printed")


@lru_cache(maxsize=8)
def _hermite(nodes: int) -> tuple[np.ndarray, np.ndarray]:
    x, w = np.polynomial.hermite_e.hermegauss(nodes)
    return x, w / w.sum()


def gaussian_expectation(mu: np.ndarray | float, tau: np.ndarray | float, link: str = "logit",
                         nodes: int = 40) -> np.ndarray:
    """``E_Z F(mu + tau Z)``, ``Z ~ N(0, 1)``, for ``F`` logistic or standard normal CDF.

    Parameters
    ----------
    mu, tau
        Location and scale (broadcast together).
    link
        ``"logit"`` (Gauss-Hermite with ``nodes`` nodes) or ``"probit"`` (closed form).
    nodes
        Quadrature nodes for the logistic link.

    Returns
    -------
    numpy.ndarray
        The expectation, same broadcast shape as ``mu`` and ``tau``.

    Examples
    --------
    >>> round(float(gaussian_expectation(0.0, 3.0)), 6)
    0.5
    >>> round(float(gaussian_expectation(1.0, 1.0, "probit")), 4)  # Phi(1 / sqrt(2))
    0.7602

    References
    ----------
    Li & Sur, Definition 1, eq. (3) (the expectation over Z in the angular predictor).
    """
    mu = np.asarray(mu, dtype=np.float64)
    tau = np.asarray(tau, dtype=np.float64)
    if link == "probit":
        return special.ndtr(mu / np.sqrt(1.0 + tau * tau))
    if link != "logit":
        raise ValueError(f"link must be one of {LINKS}, got {link!r}")
    x, w = _hermite(int(nodes))
    mu_b, tau_b = np.broadcast_arrays(mu, tau)
    return special.expit(mu_b[..., None] + tau_b[..., None] * x) @ w


def expected_link_slope(a: float, b: float, link: str = "logit", nodes: int = 40) -> float:
    """``E sigma'(Z)`` for ``sigma(u) = F(a u + b)``, ``Z ~ N(0, 1)`` (the Stein factor).

    Examples
    --------
    >>> round(expected_link_slope(1.0, 0.0, "probit"), 4)  # phi(0) / sqrt(2)
    0.2821
    """
    if link == "probit":
        s = np.sqrt(1.0 + a * a)
        return float(a * np.exp(-0.5 * (b / s) ** 2) / np.sqrt(2 * np.pi) / s)
    x, w = _hermite(int(nodes))
    p = special.expit(a * x + b)
    return float(a * (p * (1.0 - p)) @ w)


def platt_limit(cos_theta: float, norm: float, a: float, b: float) -> tuple[float, float]:
    """Platt parameters equal to the angular predictor for a probit data model (eq. 9).

    With ``sigma(u) = Phi(a u + b)``: ``A* = cos / (norm sqrt(1 + a^2 sin^2))``,
    ``B* = (b / a)(1 / sqrt(1 + a^2 sin^2) - 1)``, for the calibrated map ``Phi(a (A* s + B*) + b)``
    written on the data link; on the plain probit scale the slope is ``a A*`` and the intercept
    ``a B* + b = b / sqrt(1 + a^2 sin^2)``.

    Examples
    --------
    >>> A, B = platt_limit(1.0, 1.0, 3.0, 1.0)
    >>> round(A, 6), round(B, 6)
    (1.0, 0.0)
    """
    sin2 = max(0.0, 1.0 - cos_theta * cos_theta)
    k = np.sqrt(1.0 + a * a * sin2)
    return float(cos_theta / (norm * k)), float((b / a) * (1.0 / k - 1.0))


def _loss_derivatives(loss: str, y: np.ndarray, eta: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``psi = -loss'`` and ``loss''`` at the linear predictor ``eta``."""
    if loss == "logistic":
        p = special.expit(eta)
        return y - p, p * (1.0 - p)
    if loss == "squared":
        return y - eta, np.ones_like(eta)
    raise ValueError(f"loss must be 'logistic' or 'squared' (or pass psi and loss_hessian), got {loss!r}")


def estimate_angle(X: np.ndarray, y: np.ndarray, w_hat: np.ndarray, sigma: np.ndarray, *,
                   penalty_hessian: float | np.ndarray, loss: str = "logistic",
                   psi: np.ndarray | None = None, loss_hessian: np.ndarray | None = None,
                   holdout_scores: np.ndarray | None = None, holdout_labels: np.ndarray | None = None,
                   sign: float | None = None, gamma: str = "sigma") -> dict[str, Any]:
    """The paper's offline estimate of ``<w*, w_hat>_Sigma`` and of the angle, eqs. (11)-(13).

    ``w_hat`` minimises ``(1/n) sum_i loss(y_i, x_i^T w) + g(w)``; ``H = (X^T D X + n hess g)^{-1}``
    with ``D = diag(loss'')``, ``psi = -loss'``, ``v = Tr(D - D X H X^T D) / n``,
    ``r = (||psi||^2 / n)^{1/2}``.

    Parameters
    ----------
    X, y
        Training design ``(n, d)`` and labels (0/1 for the logistic loss).
    w_hat
        Fitted coefficients ``(d,)``.
    sigma
        Feature covariance ``(d, d)`` (known).
    penalty_hessian
        ``hess g(w_hat)``: a scalar ``c`` for ``c I`` (ridge ``(lambda/(2d))||w||^2`` gives ``lambda/d``) or
        a ``(d, d)`` matrix.
    loss
        ``"logistic"`` or ``"squared"``; ignored when ``psi`` and ``loss_hessian`` are given.
    holdout_scores, holdout_labels
        Independent holdout scores ``w_hat^T x`` and 0/1 labels for the sign, eq. (12) (labels are
        centred to +-1 internally; a positive correlation means a positive sign).
    sign
        Use this sign instead of eq. (12) (e.g. +1 when known).
    gamma
        ``"sigma"``: ``Tr(Sigma H)`` (default, the leave-one-out correction ``x_i^T H x_i``);
        ``"df"``: ``Tr(X H X^T D) / (n v)``; ``"printed"``: the paper's printed ``Tr(X H X^T D)``, which
        grows like ``n`` and gives nonsense (kept only to show the correction).

    Returns
    -------
    dict
        ``a2`` (eq. 11), ``inner`` (signed estimate of ``<w*, w_hat>_Sigma``), ``norm``
        (``||w_hat||_Sigma``), ``cos_theta``, ``theta`` (eq. 13), ``sign``, ``gamma``, ``v``, ``r``.

    Examples
    --------
    >>> import numpy as np
    >>> rng = np.random.default_rng(0); n, d = 400, 200
    >>> X = rng.normal(size=(n, d)) / np.sqrt(d); w = rng.normal(size=d); w *= np.sqrt(d) / np.linalg.norm(w)
    >>> y = (rng.uniform(size=n) < 1 / (1 + np.exp(-3 * X @ w))).astype(float)
    >>> lam = 0.5; c = lam / d
    >>> w_hat = np.zeros(d)
    >>> for _ in range(30):
    ...     p = 1 / (1 + np.exp(-X @ w_hat)); g = X.T @ (p - y) / n + c * w_hat
    ...     Hm = X.T @ (X * (p * (1 - p))[:, None]) / n + c * np.eye(d); w_hat -= np.linalg.solve(Hm, g)
    >>> est = estimate_angle(X, y, w_hat, np.eye(d) / d, penalty_hessian=c, sign=1.0)
    >>> bool(abs(est["inner"] - w @ w_hat / d) < 0.1)
    True

    References
    ----------
    Li & Sur, eqs. (11)-(13) and Theorem 13; Bellec (2022), "Observable adjustments in single-index
    models for regularized M-estimators". The printed ``gamma = Tr(X H X^T D)`` is corrected here.
    """
    X, y, w_hat, sigma = _check_angle_inputs(X, y, w_hat, sigma, gamma)
    n, d = X.shape
    eta = X @ w_hat
    if psi is None or loss_hessian is None:
        psi, dd = _loss_derivatives(loss, y, eta)
    else:
        psi, dd = np.asarray(psi, dtype=np.float64), np.asarray(loss_hessian, dtype=np.float64)
    L = _hessian_factor(X, dd, penalty_hessian)
    # Tr(D X H X^T D) = ||L^{-1} X^T D||_F^2 ; Tr(X H X^T D) = ||L^{-1} X^T D^{1/2}||_F^2
    sq = np.sqrt(dd)
    B = linalg.solve_triangular(L, X.T * sq, lower=True)
    df = float(np.sum(B * B))
    v = float((dd.sum() - float(np.sum((B * sq) ** 2))) / n)
    g_val = _gamma(gamma, L, sigma, df, n, v)
    r2 = float(psi @ psi / n)
    a2 = _a2(X, psi, eta, sigma, v, g_val, r2)
    norm = float(np.sqrt(w_hat @ sigma @ w_hat))
    if sign is None:
        sign = _holdout_sign(holdout_scores, holdout_labels)
    inner = float(np.sign(sign) * np.sqrt(max(a2, 0.0))) if np.isfinite(a2) else float("nan")
    cos = float(np.clip(inner / norm, -1.0, 1.0)) if norm > 0 and np.isfinite(inner) else float("nan")
    return {"a2": a2, "inner": inner, "norm": norm, "cos_theta": cos, "theta": float(np.arccos(cos)),
            "sign": float(np.sign(sign)), "gamma": g_val, "gamma_rule": gamma, "v": v, "r": float(np.sqrt(r2)),
            "df": df}


def _check_angle_inputs(X: np.ndarray, y: np.ndarray, w_hat: np.ndarray, sigma: np.ndarray,
                        gamma: str) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    X = np.asarray(X, dtype=np.float64)
    y = np.asarray(y, dtype=np.float64)
    w_hat = np.asarray(w_hat, dtype=np.float64)
    sigma = np.asarray(sigma, dtype=np.float64)
    if X.ndim != 2:
        raise ValueError(f"X must be 2-d, got shape {X.shape}")
    n, d = X.shape
    if y.shape != (n,) or w_hat.shape != (d,) or sigma.shape != (d, d):
        raise ValueError(f"shapes: X {X.shape}, y {y.shape}, w_hat {w_hat.shape}, sigma {sigma.shape} disagree")
    if gamma not in GAMMAS:
        raise ValueError(f"gamma must be one of {GAMMAS}, got {gamma!r}")
    return X, y, w_hat, sigma


def _hessian_factor(X: np.ndarray, dd: np.ndarray, penalty_hessian: float | np.ndarray) -> np.ndarray:
    """Lower Cholesky factor ``L`` of ``H^{-1} = X^T D X + n hess g``."""
    n, d = X.shape
    ph = np.asarray(penalty_hessian, dtype=np.float64)
    M = X.T @ (X * dd[:, None])
    if ph.ndim == 0:
        M[np.diag_indices(d)] += n * float(ph)
    elif ph.shape == (d, d):
        M += n * ph
    else:
        raise ValueError(f"penalty_hessian must be a scalar or ({d}, {d}), got shape {ph.shape}")
    cf = linalg.cho_factor(M, lower=True)
    return np.tril(cf[0])


def _gamma(rule: str, L: np.ndarray, sigma: np.ndarray, df: float, n: int, v: float) -> float:
    """The leave-one-out correction ``gamma`` by ``rule`` (see :func:`estimate_angle`)."""
    if rule == "sigma":
        C = linalg.cholesky(sigma, lower=True)
        G = linalg.solve_triangular(L, C, lower=True)
        return float(np.sum(G * G))
    if rule == "df":
        return df / (n * v)
    return df


def _a2(X: np.ndarray, psi: np.ndarray, eta: np.ndarray, sigma: np.ndarray, v: float, g_val: float,
        r2: float) -> float:
    """Eq. (11): the estimate of ``<w*, w_hat>_Sigma**2`` (NaN when its denominator is not positive)."""
    n, d = X.shape
    resid = eta - g_val * psi
    rr = float(resid @ resid)
    psi_eta = float(psi @ eta)
    xtpsi = X.T @ psi
    sc = linalg.cho_factor(sigma, lower=True)
    quad = float(xtpsi @ linalg.cho_solve(sc, xtpsi))  # ||Sigma^{-1/2} X^T psi||^2
    num = (v / n * rr + psi_eta / n - g_val * r2) ** 2
    den = quad / n**2 + 2 * v / n * psi_eta + v * v / n * rr - d / n * r2
    return float(num / den) if den > 0 else float("nan")


def _holdout_sign(scores: np.ndarray | None, labels: np.ndarray | None) -> float:
    """Eq. (12): the sign of the correlation of holdout scores with +-1 labels."""
    if scores is None or labels is None:
        raise ValueError("give holdout_scores and holdout_labels (eq. 12) or an explicit sign")
    hs = np.asarray(scores, dtype=np.float64)
    hy = np.asarray(labels, dtype=np.float64)
    # labels in {0,1}: use 2y - 1 so that the statistic does not depend on the base rate
    stat = float(hs @ (2.0 * hy - 1.0))
    return 1.0 if stat >= 0 else -1.0


class AngularCalibrator(Calibrator):
    """Angular predictor ``E_Z F(a (cos(theta) (s - c) / scale + sin(theta) Z) + b)`` for a declared link.

    Parameters
    ----------
    link
        Data link family ``F``: ``"logit"`` or ``"probit"``.
    link_scale, link_intercept
        ``a`` and ``b`` in ``sigma(u) = F(a u + b)`` (the paper's experiments: logit, 3, 1).
    score_input
        ``"logit"``: inputs are probabilities ``sigmoid(s)`` of a linear score ``s`` (the stream's
        ``score``), converted back with the logit; ``"margin"``: inputs are the linear scores ``s``.
    nodes
        Gauss-Hermite nodes.

    Examples
    --------
    >>> import numpy as np
    >>> rng = np.random.default_rng(1); n = 200000
    >>> u = rng.normal(size=n); s = 2.0 * (0.6 * u + 0.8 * rng.normal(size=n))  # cos = 0.6, ||w_hat|| = 2
    >>> y = (rng.uniform(size=n) < 1 / (1 + np.exp(-(3 * u + 1)))).astype(float)
    >>> cal = AngularCalibrator(link_scale=3.0, link_intercept=1.0, score_input="margin").fit(s, y)
    >>> round(cal.cos_theta, 1), round(cal.score_scale, 1)
    (0.6, 2.0)

    References
    ----------
    Li & Sur, Definition 1 (eq. 3), Theorems 8 and 10; Stein's lemma for the streaming angle (see
    ``../shared/specs/angular-platt.md``).
    """

    method = "angular"
    kind = "binary"

    def __init__(self, link: str = "logit", link_scale: float = 1.0, link_intercept: float = 0.0,
                 score_input: str = "logit", nodes: int = 40) -> None:
        super().__init__()
        if link not in LINKS:
            raise ValueError(f"link must be one of {LINKS}, got {link!r}")
        if score_input not in INPUTS:
            raise ValueError(f"score_input must be one of {INPUTS}, got {score_input!r}")
        if not np.isfinite(link_scale) or link_scale <= 0 or not np.isfinite(link_intercept):
            raise ValueError("link_scale must be finite and > 0, link_intercept finite")
        if int(nodes) != nodes or not 2 <= nodes <= 200:
            raise ValueError(f"nodes must be an integer in [2, 200], got {nodes!r}")
        self.link, self.score_input = link, score_input
        self.link_scale, self.link_intercept, self.nodes = float(link_scale), float(link_intercept), int(nodes)
        self.cos_theta = 1.0
        self.score_scale = 1.0
        self.score_center = 0.0

    # -- inputs ---------------------------------------------------------------------------------
    def _margins(self, x: np.ndarray) -> np.ndarray:
        if self.score_input == "logit":
            z, _, _ = check_binary(x)
            return logit(z)
        s = np.asarray(x, dtype=np.float64)
        if s.ndim != 1 or not np.isfinite(s).all():
            raise ValueError("margins must be a finite 1-d array")
        return s

    # -- fitting --------------------------------------------------------------------------------
    def fit(self, x: np.ndarray, y: np.ndarray, sample_weight: np.ndarray | None = None) -> AngularCalibrator:
        """Streaming form from scores and 0/1 labels (the link must be declared in the constructor)."""
        s = self._margins(x)
        yy = np.asarray(y, dtype=np.float64)
        if yy.shape != s.shape or not np.isin(yy, (0.0, 1.0)).all():
            raise ValueError("labels must be 0/1 with the same length as the scores")
        if sample_weight is not None:
            w = np.asarray(sample_weight, dtype=np.float64)
            if w.shape != s.shape or (w < 0).any() or not np.isfinite(w).all():
                raise ValueError("sample_weight must be finite, non-negative, same length as the scores")
        else:
            w = np.ones_like(s)
        return self.fit_moments(float(w.sum()), float(w @ s), float(w @ (s * s)), float(w @ (s * yy)),
                                float(w @ yy))

    def fit_moments(self, n: float, sum_s: float, sum_ss: float, sum_sy: float, sum_y: float) -> AngularCalibrator:
        """Fit from the additive sums ``n, sum s, sum s^2, sum s y, sum y`` of margins ``s`` and labels ``y``."""
        if not n >= 2:
            raise ValueError("the streaming angular fit needs at least 2 observations")
        mean = sum_s / n
        var = max(sum_ss / n - mean * mean, 0.0)
        if var <= 0:
            raise ValueError("scores have zero variance; the angle is not identifiable")
        sd = float(np.sqrt(var))
        cov_sy = sum_sy / n - mean * sum_y / n  # mean((s - sbar) y)
        slope = expected_link_slope(self.link_scale, self.link_intercept, self.link, self.nodes)
        self.cos_theta = float(np.clip(cov_sy / (sd * slope), -1.0, 1.0))
        self.score_scale, self.score_center = sd, float(mean)
        self.fitted = True
        self.training = {"n": int(round(n)), "source": "moments"}
        return self

    def fit_grid(self, grid: Any) -> AngularCalibrator:
        """Streaming fit from a single-channel score grid (``score_input="logit"`` only).

        Each non-empty cell contributes its count at the margin ``logit(mean z)``; the within-cell
        spread of the margin is ignored (negligible for fine grids away from 0 and 1).
        """
        if self.score_input != "logit":
            raise ValueError("a score grid holds probabilities; use score_input='logit'")
        if getattr(grid, "channels", None) is not None:
            raise ValueError("angular calibration from a grid needs a single-channel grid")
        n = grid.n
        keep = n > 0
        if not keep.any():
            raise ValueError("cannot fit angular calibration on an empty grid")
        nk, sy = n[keep], grid.sum_y[keep]
        s = logit(np.clip(grid.sum_z[keep] / nk, 0.0, 1.0))
        self.fit_moments(float(nk.sum()), float(nk @ s), float(nk @ (s * s)), float(sy @ s), float(sy.sum()))
        self.training = {"n": int(nk.sum()), "source": "grid", "bins": int(grid.bins)}
        return self

    @classmethod
    def from_offline(cls, estimate: dict[str, Any], *, link: str = "logit", link_scale: float = 1.0,
                     link_intercept: float = 0.0, score_input: str = "margin", nodes: int = 40) -> AngularCalibrator:
        """Calibrator from :func:`estimate_angle` output (``cos_theta`` and ``norm``; no centring)."""
        cal = cls(link=link, link_scale=link_scale, link_intercept=link_intercept, score_input=score_input,
                  nodes=nodes)
        if not np.isfinite(estimate["cos_theta"]) or not estimate["norm"] > 0:
            raise ValueError("the offline estimate has no finite angle (eq. 11 denominator <= 0?)")
        cal.cos_theta, cal.score_scale, cal.score_center = float(estimate["cos_theta"]), float(estimate["norm"]), 0.0
        cal.fitted = True
        cal.training = {"source": "offline", "estimate": {k: estimate[k] for k in ("a2", "inner", "norm", "gamma")}}
        return cal

    # -- prediction -----------------------------------------------------------------------------
    def predict_margin(self, s: np.ndarray) -> np.ndarray:
        """Angular predictor at linear scores ``s``."""
        self._check_fitted()
        cos = self.cos_theta
        sin = float(np.sqrt(max(0.0, 1.0 - cos * cos)))
        mu = self.link_scale * cos * (np.asarray(s, dtype=np.float64) - self.score_center) / self.score_scale
        mu = mu + self.link_intercept
        return gaussian_expectation(mu, self.link_scale * sin, self.link, self.nodes)

    def predict(self, x: np.ndarray) -> np.ndarray:
        """Calibrated scores for inputs in the ``score_input`` convention."""
        return self.predict_margin(self._margins(x))

    # -- params ---------------------------------------------------------------------------------
    def get_params(self) -> dict[str, Any]:
        return {"link": self.link, "link_scale": self.link_scale, "link_intercept": self.link_intercept,
                "score_input": self.score_input, "nodes": self.nodes, "cos_theta": self.cos_theta,
                "theta": float(np.arccos(self.cos_theta)), "score_scale": self.score_scale,
                "score_center": self.score_center}

    @classmethod
    def from_params(cls, params: dict[str, Any]) -> AngularCalibrator:
        cal = cls(link=param_choice(params, "link", LINKS), link_scale=param_float(params, "link_scale", lo=1e-12),
                  link_intercept=param_float(params, "link_intercept"),
                  score_input=param_choice(params, "score_input", INPUTS),
                  nodes=int(param_float(params, "nodes", lo=2, hi=200)))
        cal.cos_theta = param_float(params, "cos_theta", lo=-1.0, hi=1.0)
        cal.score_scale = param_float(params, "score_scale", lo=1e-300)
        cal.score_center = param_float(params, "score_center")
        cal.fitted = True
        return cal

    def __repr__(self) -> str:
        return (f"AngularCalibrator(link={self.link!r}, a={self.link_scale:g}, b={self.link_intercept:g}, "
                f"cos_theta={self.cos_theta:.4g}, scale={self.score_scale:.4g})")
