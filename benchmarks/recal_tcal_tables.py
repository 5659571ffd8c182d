"""Recalibrate the nine T-Cal models and tabulate 15-bin ECE and adaptive T-Cal decisions (T-Cal Tables 1-3).

For each model (top-1 confidence vs correct), a random split fits each calibrator on 2,000 (CIFAR) or
10,000 (ImageNet) samples and evaluates it on the rest: 15-bin equal-width l1-ECE (%) and the decision of
``calmon.testers.run_tester("tcal", ...)`` at alpha = 0.05 ("R" reject = miscalibrated, "A" accept).
The paper's figures (Tables 1-3) are printed beside ours; recalibrated rows depend on the random split,
so compare directions, not digits.  Each cell: ours, then the paper's in parentheses.  The paper decides
the two discrete methods (histogram binning, scaling-binning) with the binomial test of Appendix B.4; the
tester's ``method = "auto"`` does the same when the predictions take few values.

Usage::

    python -m benchmarks.recal_tcal_tables               # 1 split, T-Cal with 1000 draws (~minutes)
    python -m benchmarks.recal_tcal_tables --splits 5 --no-test   # ECE only, mean over 5 splits
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any

import numpy as np

from benchmarks._child import ROOT
from calmon.calibration import make_calibrator
from calmon.calibration.metrics import binary_metrics

DATA = ROOT / ".." / "shared" / "data" / "tcal"
MODELS = [
    ("cifar10_densenet121", "C10 DenseNet-121", 2000),
    ("cifar10_resnet50", "C10 ResNet-50", 2000),
    ("cifar10_vgg19_bn", "C10 VGG-19", 2000),
    ("cifar100_mobilenetv2_x1_4", "C100 MobileNet-v2", 2000),
    ("cifar100_resnet56", "C100 ResNet-56", 2000),
    ("cifar100_shufflenetv2_x2_0", "C100 ShuffleNet-v2", 2000),
    ("imagenet_densenet161", "IN DenseNet-161", 10000),
    ("imagenet_resnet152", "IN ResNet-152", 10000),
    ("imagenet_efficientnet_b7", "IN EfficientNet-B7", 10000),
]
METHODS: list[tuple[str, str | None, dict[str, Any]]] = [
    ("none", None, {}),
    ("platt", "platt", {}),
    ("platt-probit", "platt", {"link": "probit"}),
    ("polynomial", "polynomial", {}),  # degree 3 on CIFAR-10, 5 elsewhere (set per model below)
    ("isotonic", "isotonic", {}),
    ("histogram", "histogram", {"bins": 15}),
    ("scaling-binning", "scaling-binning", {"bins": 15}),
]
#: T-Cal paper, Tables 1-3: (ECE %, decision) per row of the paper.
_KEYS = ("none", "platt", "polynomial", "isotonic", "histogram", "scaling-binning")
PAPER = {stem: dict(zip(_KEYS, vals)) for stem, vals in {
    "cifar10_densenet121": ((2.02, "R"), (2.32, "R"), (1.71, "R"), (1.16, "R"), (0.97, "R"), (1.94, "R")),
    "cifar10_resnet50": ((2.23, "R"), (1.78, "R"), (1.29, "R"), (0.62, "R"), (1.12, "R"), (1.21, "R")),
    "cifar10_vgg19_bn": ((2.13, "R"), (1.71, "R"), (0.90, "A"), (1.13, "A"), (1.28, "R"), (1.67, "R")),
    "cifar100_mobilenetv2_x1_4": ((11.87, "R"), (1.40, "A"), (1.69, "R"), (1.76, "A"), (1.66, "R"), (1.85, "R")),
    "cifar100_resnet56": ((15.2, "R"), (1.84, "A"), (1.91, "R"), (2.33, "R"), (2.44, "R"), (1.57, "R")),
    "cifar100_shufflenetv2_x2_0": ((9.08, "R"), (1.34, "A"), (1.81, "A"), (1.38, "A"), (2.77, "R"), (1.65, "A")),
    "imagenet_densenet161": ((5.67, "R"), (1.58, "R"), (0.62, "A"), (0.63, "R"), (0.46, "R"), (1.55, "R")),
    "imagenet_resnet152": ((4.99, "R"), (1.41, "R"), (0.64, "A"), (0.80, "R"), (1.26, "R"), (1.40, "R")),
    "imagenet_efficientnet_b7": ((2.82, "R"), (1.90, "R"), (0.71, "A"), (1.06, "R"), (0.88, "R"), (1.97, "R")),
}.items()}


def options_for(stem: str, method: str, opts: dict[str, Any]) -> dict[str, Any]:
    """The paper's per-dataset options: polynomial degree 3 on CIFAR-10, 5 on CIFAR-100 and ImageNet."""
    if method == "polynomial":
        return {**opts, "degree": 3 if stem.startswith("cifar10_") else 5}
    return opts


def tcal_decision(p: np.ndarray, y: np.ndarray, mc: int, seed: int) -> str:
    """Adaptive T-Cal decision on raw predictions via the tester registry; "-" if the tester is missing."""
    try:
        from calmon.stats.data import CalibrationData
        from calmon.testers import run_tester
    except ImportError:
        return "-"
    data = CalibrationData(n=int(p.size), z=p, y=y, raw_is_complete=True)
    res = run_tester("tcal", data, alpha=0.05, mc=mc, seed=seed)
    return {"miscalibrated": "R", "calibrated": "A"}.get(res.decision, "?")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--splits", type=int, default=1, help="random splits (ECE averaged; decisions counted)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--mc", type=int, default=1000, help="Monte Carlo draws of the T-Cal tester")
    ap.add_argument("--no-test", action="store_true", help="ECE only (skip T-Cal)")
    ap.add_argument("--models", default="", help="comma-separated subset of file stems")
    args = ap.parse_args(argv)
    chosen = [m for m in MODELS if not args.models or m[0] in args.models.split(",")]
    t0 = time.time()
    results: dict[str, dict[str, list]] = {}
    for stem, _, n_fit in chosen:
        d = np.load(DATA / f"{stem}.npz", allow_pickle=False)
        z, y = np.asarray(d["confidence"], dtype=np.float64), np.asarray(d["correct"], dtype=np.float64)
        z = np.clip(z, 0.0, 1.0)
        results[stem] = {name: [] for name, _, _ in METHODS}
        for split in range(args.splits):
            rng = np.random.default_rng(args.seed + split)
            perm = rng.permutation(z.size)
            fit_idx, test_idx = perm[:n_fit], perm[n_fit:]
            for name, method, opts in METHODS:
                if method is None:
                    p = z[test_idx]
                else:
                    cal = make_calibrator(method, **options_for(stem, method, opts)).fit(z[fit_idx], y[fit_idx])
                    p = np.clip(cal.predict(z[test_idx]), 0.0, 1.0)
                ece = 100 * binary_metrics(p, y[test_idx], 15)["ece"]
                dec = "-" if args.no_test else tcal_decision(p, y[test_idx], args.mc, args.seed + split)
                results[stem][name].append((ece, dec))
        print(f"# {stem} done ({time.time() - t0:.0f} s)", file=sys.stderr)
    names = [n for n, _, _ in METHODS]
    what = "no test" if args.no_test else f"adaptive T-Cal at alpha 0.05 (R reject, A accept), mc = {args.mc}"
    print(f"15-bin l1-ECE (%) on the test part, mean of {args.splits} split(s); {what}.  paper = T-Cal Tables 1-3.")
    print("| model | " + " | ".join(names) + " |")
    print("|---|" + "---|" * len(names))
    for stem, label, _ in chosen:
        cells = []
        for n in names:
            vals = results[stem][n]
            ece = np.mean([v[0] for v in vals])
            decs = "".join(v[1] for v in vals)
            paper = PAPER[stem].get(n)
            cells.append(f"{ece:.2f} {decs}" + (f" ({paper[0]:.2f} {paper[1]})" if paper else ""))
        print(f"| {label} | " + " | ".join(cells) + " |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
