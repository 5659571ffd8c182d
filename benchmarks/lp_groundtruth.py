"""Ground-truth experiment for Algorithm 2 (multiclass calibration under the l_p error).

The paper (Bairaktari & Nguyen, seeds 000/001) has no experiments; this is the one it lacks.
True class probabilities ``q ~ Dirichlet(alpha 1_K)``, labels ``y ~ q``, and a distorted model
``f = softmax((log q + b) / T)`` with temperature ``T = 2`` and a per-class bias
``b = linspace(-bias, bias, K)``.  Because ``E[y | x] = q`` is known, the exact error of any
predictor ``h(f(x))`` is computed on a large fresh sample without label noise:
``Err(h, v, j) = |E[(h_j - q_j) 1[R(h) = v]]|`` and ``E||h - y||^2 - E||f - y||^2 =
E||h - q||^2 - E||f - q||^2``.

Run::

    python -m benchmarks.lp_groundtruth              # full table (n up to 1e6; a few minutes)
    python -m benchmarks.lp_groundtruth --quick      # n up to 1e5, smaller evaluation sample

Columns: Err_inf / Err_2 of f (before) and h (after) at the algorithm's lambda, the squared-error
change ``dSq`` against the Lemma 11 + 13 bound ``(4/lambda)(1 + log2(36/beta))``, |B|, groups,
iterations, merges, how the loop stopped, fit time and the Theorem 7 budget.
"""

from __future__ import annotations

import argparse
import math
import time

import numpy as np

from calmon.algorithms.multiclass_lp import fit_lp_raw, lambda_of, lp_error_raw

#: (name, K, Dirichlet alpha, bias scale, eps, p)
SETTINGS = [
    ("concentrated", 3, 20.0, 2.0, 0.05, math.inf),
    ("concentrated", 3, 20.0, 2.0, 0.02, math.inf),
    ("concentrated", 3, 20.0, 2.0, 0.3, 2.0),
    ("concentrated", 10, 20.0, 4.5, 0.1, math.inf),
    ("spread", 3, 1.0, 1.0, 0.1, math.inf),
    ("spread", 10, 1.0, 1.0, 0.1, math.inf),
]


def world(n: int, k: int, alpha: float, bias: float, rng: np.random.Generator,
          temperature: float = 2.0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(q, y, f)``: truth, labels and the distorted predictions."""
    q = rng.dirichlet(np.full(k, alpha), size=n)
    q = np.clip(q, 1e-12, None)
    q /= q.sum(axis=1, keepdims=True)
    y = np.minimum((rng.random(n)[:, None] > np.cumsum(q, axis=1)).sum(axis=1), k - 1)
    z = (np.log(q) + np.linspace(-bias, bias, k)) / temperature
    f = np.exp(z - z.max(axis=1, keepdims=True))
    f /= f.sum(axis=1, keepdims=True)
    return q, y, f


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", default="1e4,1e5,1e6", help="training sizes (comma separated)")
    ap.add_argument("--eval-n", type=float, default=1e6, help="fresh evaluation sample size")
    ap.add_argument("--quick", action="store_true", help="sizes 1e4,1e5 and an evaluation sample of 2e5")
    ap.add_argument("--passthrough", action="store_true", help="pass light-bin predictions through")
    ap.add_argument("--pools", type=int, default=None, help="sample pools (default: what Algorithm 2 needs)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--settings", default=None,
                    help=f"comma-separated rows of the settings table, 0..{len(SETTINGS) - 1} (default all)")
    args = ap.parse_args(argv)
    rows = range(len(SETTINGS)) if args.settings is None else [int(i) for i in args.settings.split(",")]
    sizes = [int(float(s)) for s in ("1e4,1e5" if args.quick else args.sizes).split(",")]
    eval_n = int(2e5 if args.quick else args.eval_n)
    head = (f"{'setting':<13}{'K':>3}{'p':>5}{'eps':>6}{'lam':>5}{'n':>9} | {'Einf f':>7}{'Einf h':>7} "
            f"{'E2 f':>7}{'E2 h':>7} | {'dSq':>8}{'bound':>7} | {'|B|':>4}{'G':>4}{'iter':>6}{'merg':>5} "
            f"{'stopped':>9}{'fit s':>7}{'budget':>9}")
    print(head)
    print("-" * len(head))
    for si in rows:
        name, k, alpha, bias, eps, p = SETTINGS[si]
        rng = np.random.default_rng([args.seed, si])
        lam = lambda_of(eps, p)
        q_e, _, f_e = world(eval_n, k, alpha, bias, rng)
        b = lp_error_raw(f_e, q_e, lam, p)
        sq_f = float(np.mean(((f_e - q_e) ** 2).sum(axis=1)))
        for n in sizes:
            _, y, f = world(n, k, alpha, bias, rng)
            t0 = time.perf_counter()
            fit = fit_lp_raw(f, y, eps=eps, p=p, pools=args.pools, passthrough=args.passthrough)
            dt = time.perf_counter() - t0
            h = fit.map.predict(f_e)
            a = lp_error_raw(h, q_e, lam, p)
            dsq = float(np.mean(((h - q_e) ** 2).sum(axis=1))) - sq_f
            d = fit.diagnostics
            ps = "inf" if math.isinf(p) else f"{p:g}"
            print(f"{name:<13}{k:>3}{ps:>5}{eps:>6g}{lam:>5}{n:>9.0e} | "
                  f"{b['err_inf']:>7.4f}{a['err_inf']:>7.4f} "
                  f"{b['err_2']:>7.4f}{a['err_2']:>7.4f} | {dsq:>+8.4f}{d['squared_error_bound']:>7.2f} | "
                  f"{d['heavy_bins']:>4}{d['groups']:>4}{d['iterations']:>6}{d['merges']:>5} "
                  f"{d['stopped'][:9]:>9}{dt:>7.2f}{d['budget']['total']:>9.1e}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
