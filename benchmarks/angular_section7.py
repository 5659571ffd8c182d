"""Re-run Section 7 of Li & Sur (angular calibration vs Platt scaling), several seeds, print a table.

Setting (paper, Section 7): x ~ N(0, Sigma), Sigma = Sbar / d with Sbar_kl = 0.5^|k-l|; w* ~ N(0, I_d)
normalised to ||w*||_Sigma = 1; y ~ Bern(sigmoid(3 <w*, x> + 1)); ridge logistic regression without
intercept, penalty (lambda / (2d)) ||w||^2 with lambda = 0.5; n = 1000, d = 2000; 20,000 test points.

Holdout and test points only enter through the pair (s, u) = (<w_hat, x>, <w*, x>), which is exactly
bivariate normal with covariance [[||w_hat||_Sigma^2, <w_hat, w*>_Sigma], [., 1]]; we sample it directly
(the same distribution as drawing x and projecting, without 42,000 x 2,000 matrices).

Usage::

    python -m benchmarks.angular_section7 --seeds 5       # ~1-2 min on one core
    python -m benchmarks.angular_section7 --seeds 5 --n 500 --d 1000   # quicker

Columns: true and estimated <w*, w_hat>_Sigma (eq. 11 with the corrected gamma = Tr(Sigma H), sign by
eq. 12 on the n_ho = 100 holdout), 15-bin ECE (drawn test labels) of the uncalibrated predictor
sigmoid(s), the angular predictor with the true and the estimated angle, and Platt scaling (logit link
on the logit of the score) fitted on independent holdouts of 100, 2000 and 20000 points.
"""

from __future__ import annotations

import argparse
import sys
import time

import numpy as np
from scipy import linalg, special

from calmon.calibration.angular import AngularCalibrator, estimate_angle, platt_limit
from calmon.calibration.metrics import binary_metrics
from calmon.calibration.platt import PlattCalibrator

LINK_A, LINK_B, LAM = 3.0, 1.0, 0.5
HOLDOUTS = (100, 2000, 20000)


def ridge_logistic(X: np.ndarray, y: np.ndarray, c: float, iters: int = 50) -> np.ndarray:
    """argmin (1/n) sum logloss(y, Xw) + (c/2)||w||^2 by Newton with Woodbury solves in R^n."""
    n, d = X.shape
    w = np.zeros(d)
    for _ in range(iters):
        eta = X @ w
        p = special.expit(eta)
        g = X.T @ (p - y) / n + c * w
        U = X.T * np.sqrt(p * (1 - p) / n)  # d x n; Hessian = c I + U U^T
        small = c * np.eye(n) + U.T @ U
        step = (g - U @ linalg.solve(small, U.T @ g, assume_a="pos")) / c
        w -= step
        if np.max(np.abs(step)) < 1e-12 * max(1.0, np.max(np.abs(w))):
            break
    return w


def sample_pairs(rng: np.random.Generator, m: int, norm2: float, inner: float) -> tuple[np.ndarray, np.ndarray]:
    """(s, y) for m fresh points: (s, u) bivariate normal, y ~ Bern(sigmoid(3u + 1))."""
    u = rng.normal(size=m)
    cond_var = max(norm2 - inner * inner, 0.0)
    s = inner * u + np.sqrt(cond_var) * rng.normal(size=m)
    y = (rng.uniform(size=m) < special.expit(LINK_A * u + LINK_B)).astype(float)
    return s, y


def run_seed(seed: int, n: int, d: int, n_test: int, sign_trials: int) -> dict[str, float]:
    rng = np.random.default_rng(seed)
    idx = np.arange(d)
    sigma = 0.5 ** np.abs(idx[:, None] - idx[None, :]) / d
    C = linalg.cholesky(sigma, lower=True)
    w_star = rng.normal(size=d)
    w_star /= np.sqrt(w_star @ sigma @ w_star)
    X = rng.normal(size=(n, d)) @ C.T
    y = (rng.uniform(size=n) < special.expit(LINK_A * (X @ w_star) + LINK_B)).astype(float)
    c = LAM / d
    w_hat = ridge_logistic(X, y, c)
    norm2 = float(w_hat @ sigma @ w_hat)
    inner = float(w_hat @ sigma @ w_star)
    holdouts = {m: sample_pairs(rng, m, norm2, inner) for m in HOLDOUTS}
    est = estimate_angle(X, y, w_hat, sigma, penalty_hessian=c, holdout_scores=holdouts[100][0],
                         holdout_labels=holdouts[100][1])
    s_te, y_te = sample_pairs(rng, n_test, norm2, inner)
    row: dict[str, float] = {"seed": seed, "inner_true": inner, "inner_hat": est["inner"],
                             "norm": np.sqrt(norm2)}
    p_unc = special.expit(s_te)
    row["ece_uncal"] = binary_metrics(p_unc, y_te)["ece"]
    ang_true = AngularCalibrator(link_scale=LINK_A, link_intercept=LINK_B, score_input="margin")
    ang_true = ang_true.from_offline({"cos_theta": inner / np.sqrt(norm2), "norm": np.sqrt(norm2), "a2": inner**2,
                                      "inner": inner, "gamma": float("nan")},
                                     link_scale=LINK_A, link_intercept=LINK_B)
    row["ece_ang_true"] = binary_metrics(ang_true.predict(s_te), y_te)["ece"]
    ang_hat = AngularCalibrator.from_offline(est, link_scale=LINK_A, link_intercept=LINK_B)
    row["ece_ang_hat"] = binary_metrics(ang_hat.predict(s_te), y_te)["ece"]
    for m in HOLDOUTS:
        s_ho, y_ho = holdouts[m]
        platt = PlattCalibrator().fit(special.expit(s_ho), y_ho)
        row[f"ece_platt_{m}"] = binary_metrics(platt.predict(p_unc), y_te)["ece"]
        if m == max(HOLDOUTS):
            row["platt_A"], row["platt_B"] = platt.A, platt.B
    # streaming angular (declared link) on the largest holdout, for comparison
    stream = AngularCalibrator(link_scale=LINK_A, link_intercept=LINK_B, score_input="margin")
    stream.fit(*holdouts[max(HOLDOUTS)])
    row["ece_ang_stream"] = binary_metrics(stream.predict(s_te), y_te)["ece"]
    row["cos_stream"] = stream.cos_theta
    # wrong-sign rate of eq. (12) with n_ho = 100 over fresh holdouts
    wrong = wrong01 = done = 0
    while done < sign_trials:
        k = min(1000, sign_trials - done)
        s_b, y_b = sample_pairs(rng, 100 * k, norm2, inner)
        stat = ((2 * y_b - 1) * s_b).reshape(k, 100).sum(axis=1)  # labels as +-1 (what estimate_angle uses)
        stat01 = (y_b * s_b).reshape(k, 100).sum(axis=1)  # eq. (12) literally with 0/1 labels
        wrong += int(np.sum(np.sign(stat) != np.sign(inner)))
        wrong01 += int(np.sum(np.sign(stat01) != np.sign(inner)))
        done += k
    row["wrong_sign"] = wrong / max(sign_trials, 1)
    row["wrong_sign_01"] = wrong01 / max(sign_trials, 1)
    # probit approximation of eq. (9) (sigmoid ~ Phi(sqrt(pi/8) x)), on the logit scale of the data link
    cos_true = inner / np.sqrt(norm2)
    k = np.sqrt(np.pi / 8)
    a_star, b_star = platt_limit(cos_true, np.sqrt(norm2), k * LINK_A, k * LINK_B)
    row["A_star"], row["B_star"] = a_star * LINK_A, b_star * LINK_A + LINK_B  # as sigmoid(A s + B)
    return row


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("--first-seed", type=int, default=0)
    ap.add_argument("--n", type=int, default=1000)
    ap.add_argument("--d", type=int, default=2000)
    ap.add_argument("--test", type=int, default=20000)
    ap.add_argument("--sign-trials", type=int, default=5000)
    args = ap.parse_args(argv)
    rows = []
    t0 = time.time()
    for seed in range(args.first_seed, args.first_seed + args.seeds):
        rows.append(run_seed(seed, args.n, args.d, args.test, args.sign_trials))
        print(f"# seed {seed} done ({time.time() - t0:.0f} s)", file=sys.stderr)
    cols = ["seed", "inner_true", "inner_hat", "ece_uncal", "ece_ang_true", "ece_ang_hat", "ece_ang_stream",
            "ece_platt_100", "ece_platt_2000", "ece_platt_20000", "platt_A", "platt_B", "A_star", "B_star",
            "wrong_sign", "wrong_sign_01"]
    print(f"Section 7 re-run: n={args.n}, d={args.d}, test={args.test}, seeds={args.seeds}")
    print("| " + " | ".join(cols) + " |")
    print("|" + "---|" * len(cols))
    for r in rows:
        print("| " + " | ".join(f"{r[c]:.4f}" if c != "seed" else str(r[c]) for c in cols) + " |")
    mean = {c: float(np.mean([r[c] for r in rows])) for c in cols[1:]}
    print("| mean | " + " | ".join(f"{mean[c]:.4f}" for c in cols[1:]) + " |")
    err = max(abs(r["inner_hat"] - r["inner_true"]) for r in rows)
    print(f"max |inner_hat - inner_true| = {err:.4f} (target <= 0.1); "
          f"max angular(theta_hat) ECE = {max(r['ece_ang_hat'] for r in rows):.4f} (target <= 0.03)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
