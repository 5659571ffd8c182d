"""Held-out errors of a predictor: NLL, Brier, binned l1-ECE and the debiased l2-ECE (T-Cal's DPE).

The ECE estimates use the equal-width bins of :mod:`calmon.algorithms.ece` (last bin closed);
:func:`evaluate` picks raw rows or a fine score grid from a
:class:`~calmon.stats.data.CalibrationData`.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from calmon.algorithms.ece import ece_l1_raw, l2_ece_squared_raw, l2_ece_squared_sums
from calmon.calibration.base import Calibrator
from calmon.calibration.params import check_binary, check_multiclass
from calmon.stats.data import CalibrationData
from calmon.stats.grid import ScoreGrid, cell_index

__all__ = ["NLL_EPS", "binary_metrics", "grid_metrics", "multiclass_metrics", "evaluate"]

NLL_EPS = 1e-12


def binary_metrics(p: np.ndarray, y: np.ndarray, bins: int = 15) -> dict[str, float]:
    """Held-out errors of binary predictions ``p`` for outcomes ``y``.

    Parameters
    ----------
    p
        Predicted probabilities of ``y = 1`` (or top-label confidence), in [0, 1].
    y
        Outcomes in {0, 1} (or top-label correctness).
    bins
        Equal-width bins for the ECE estimates (last bin closed).

    Returns
    -------
    dict
        ``n``; ``nll`` (mean log loss, predictions clipped to [1e-12, 1 - 1e-12]); ``brier``;
        ``ece`` (binned l1-ECE); ``ece_l2_debiased`` (DPE ``T^d`` of eq. 6, an unbiased-under-the-null
        estimate of the squared binned l2-ECE; may be negative).

    Examples
    --------
    >>> import numpy as np
    >>> m = binary_metrics(np.array([0.2, 0.2, 0.8, 0.8]), np.array([0, 1, 1, 1]))
    >>> round(m["ece"], 3), round(m["brier"], 3)
    (0.25, 0.19)

    References
    ----------
    Lee, Huang, Hassani, Dobriban, "T-Cal", JMLR 2023, eqs. (5)-(6) (scalar convention K = 2: half the
    one-hot statistic).
    """
    p, yy, _ = check_binary(p, y, name="predictions")
    ece, dpe = ece_l1_raw(p, yy, bins), l2_ece_squared_raw(p, yy, bins, debiased=True)
    pc = np.clip(p, NLL_EPS, 1 - NLL_EPS)
    nll = float(-np.mean(yy * np.log(pc) + (1 - yy) * np.log1p(-pc))) if p.size else float("nan")
    brier = float(np.mean((p - yy) ** 2)) if p.size else float("nan")
    return {"n": int(p.size), "nll": nll, "brier": brier, "ece": ece, "ece_l2_debiased": dpe}


def grid_metrics(grid: ScoreGrid, cal: Calibrator | None = None, bins: int = 15) -> dict[str, Any]:
    """:func:`binary_metrics` approximated from a fine :class:`~calmon.stats.grid.ScoreGrid`.

    Every event of a cell is given the calibrated score of the cell's mean score (exact for the raw
    predictor's ECE/DPE when ``cal`` is None; otherwise within the cell width of the fine grid).
    """
    nn = grid.n
    keep = nn > 0
    n = nn[keep]
    zbar = grid.sum_z[keep] / n
    sy = grid.sum_y[keep]
    if cal is None:
        f = zbar
        sq = grid.sum_y[keep] - 2 * grid.sum_zy[keep] + grid.sum_zz[keep]  # exact sum (y - z)^2
    else:
        f = np.clip(cal.predict(np.clip(zbar, 0.0, 1.0)), 0.0, 1.0)
        sq = sy - 2 * f * sy + n * f * f
    idx = cell_index(f, bins)
    bn = np.bincount(idx, weights=n, minlength=bins)
    bp = np.bincount(idx, weights=n * f if cal is not None else grid.sum_z[keep], minlength=bins)
    by = np.bincount(idx, weights=sy, minlength=bins)
    bq = np.bincount(idx, weights=sq, minlength=bins)
    total_n = bn.sum()
    ece = float(np.abs(by - bp).sum() / total_n) if total_n > 0 else float("nan")
    dpe = l2_ece_squared_sums(bn, by - bp, bq, debiased=True)
    fc = np.clip(f, NLL_EPS, 1 - NLL_EPS)
    total = n.sum()
    nll = float(-(sy * np.log(fc) + (n - sy) * np.log1p(-fc)).sum() / total)
    return {"n": int(total), "nll": nll, "brier": float(sq.sum() / total), "ece": ece, "ece_l2_debiased": dpe,
            "approximate": cal is not None}


def multiclass_metrics(probs: np.ndarray, labels: np.ndarray, bins: int = 15) -> dict[str, Any]:
    """Held-out errors of probability vectors: multiclass NLL and Brier, top-label ECE and DPE.

    Examples
    --------
    >>> import numpy as np
    >>> m = multiclass_metrics(np.array([[0.7, 0.3], [0.4, 0.6]]), np.array([0, 1]))
    >>> round(m["nll"], 4), round(m["accuracy"], 2)
    (0.4338, 1.0)
    """
    p, lab = check_multiclass(probs, labels)
    n = p.shape[0]
    if n == 0:
        return {"n": 0, "nll": float("nan"), "brier": float("nan"), "ece": float("nan"),
                "ece_l2_debiased": float("nan"), "accuracy": float("nan")}
    pl = np.clip(p[np.arange(n), lab], NLL_EPS, 1.0)
    onehot = np.zeros_like(p)
    onehot[np.arange(n), lab] = 1.0
    top = p.argmax(axis=1)
    conf = np.clip(p[np.arange(n), top], 0.0, 1.0)
    correct = (top == lab).astype(np.float64)
    tl = binary_metrics(conf, correct, bins)
    return {"n": int(n), "nll": float(-np.mean(np.log(pl))), "brier": float(np.mean(((p - onehot) ** 2).sum(1))),
            "ece": tl["ece"], "ece_l2_debiased": tl["ece_l2_debiased"], "accuracy": float(correct.mean())}


def evaluate(cal: Calibrator | None, data: CalibrationData, bins: int = 15) -> dict[str, Any]:
    """Errors of ``cal`` (``None`` = the raw predictions) on a :class:`calmon.stats.data.CalibrationData`.

    Raw data is used when it is complete (or when there is no grid); otherwise a binary
    calibrator is evaluated on the fine grid (:func:`grid_metrics`).
    """
    multiclass = cal.kind == "multiclass" if cal is not None else (data.probs is not None and data.z is None
                                                                      and data.grid is None)
    if multiclass:
        if data.probs is None or data.labels is None:
            raise ValueError("multiclass evaluation needs probabilities and labels")
        probs = data.probs if cal is None else cal.predict(data.probs)
        return {**multiclass_metrics(probs, data.labels, bins), "source": "raw"}
    if data.z is not None and data.y is not None and (data.raw_is_complete or data.grid is None):
        z = np.asarray(data.z, dtype=np.float64)
        return {**binary_metrics(z if cal is None else cal.predict(z), data.y, bins), "source": "raw"}
    if data.grid is not None:
        return {**grid_metrics(data.grid, cal, bins), "source": "grid"}
    raise ValueError("evaluation needs raw scores/labels or a score grid")
