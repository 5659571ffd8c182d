"""Performance before the labels arrive: confidence-based performance estimation (CBPE) on a score grid.

If the (recalibrated) scores are calibrated, ``P(y = 1 | z) = q(z)``, and the outcomes of a window's
predictions are independent Bernoulli(q(z_i)) draws given the scores.  Every metric of the window
is then a known function of those draws, so its expected value and its *predictive distribution*
follow from the scores alone:

- expected confusion matrix at a threshold ``t`` (CBPE, NannyML): ``TP = sum_{z >= t} q``,
  ``FP = sum_{z >= t} (1 - q)``, ``FN = sum_{z < t} q``, ``TN = sum_{z < t} (1 - q)``, giving
  accuracy, precision, recall and the base rate;
- Brier score ``E[(y - z)^2 | z] = q (1 - z)^2 + (1 - q) z^2`` and log loss
  ``E[-y log z - (1 - y) log(1 - z) | z]``;
- ROC AUC as the ratio of expectations ``sum_{j > k} P_j N_k + 1/2 sum_j P_j N_j`` over ``P N``
  with ``P_j = n_j q_j`` and ``N_j = n_j (1 - q_j)`` per score cell (ties within a cell count half).

Intervals come from that predictive distribution: normal intervals with its standard deviations
(exact for the sums; the delta method for recall and for the AUC, see :func:`_analytic`), or a parametric
bootstrap (per grid cell ``k_j ~ Binomial(n_j, q_j)`` positives, the metrics recomputed from the draws,
percentile intervals). They are prediction intervals for the *realised* metric of the window (which is itself
random given the scores), valid when the calibrator in service is calibrated; the estimation error
(estimated minus realised, once the outcomes have arrived) shows how far that holds. Within a cell
all scores are taken at the cell's mean (exact for the confusion matrix when the threshold is a cell
edge; within ``1/bins`` otherwise).

References
----------
NannyML, "Confidence-based Performance Estimation (CBPE)",
https://nannyml.readthedocs.io/en/stable/how_it_works/performance_estimation.html

J. A. Hanley and B. J. McNeil (1982). The meaning and use of the area under a receiver operating
characteristic (ROC) curve. Radiology 143(1), 29-36 (the AUC as the Mann-Whitney U / (P N), and its variance).

A. W. van der Vaart (1998). Asymptotic Statistics, Chapter 3 (the delta method), Cambridge University Press.

Examples
--------
>>> import numpy as np
>>> from calmon.stats.grid import ScoreGrid
>>> rng = np.random.default_rng(0)
>>> z = rng.beta(2, 5, 20_000)
>>> g = ScoreGrid(1024); g.update(z, np.zeros(z.size))
>>> est = estimate_performance(g, threshold=0.5)
>>> round(est["accuracy"].value, 3), est["accuracy"].lo < est["accuracy"].value < est["accuracy"].hi
(0.734, True)
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from scipy import stats

from calmon.stats.grid import ScoreGrid

__all__ = ["METRICS", "Estimate", "estimate_performance", "estimation_error", "expected_metrics",
           "realised_metrics"]

METRICS = ("accuracy", "precision", "recall", "base_rate", "brier", "log_loss", "roc_auc")
_EPS = 1e-12
#: ``ndarray.sum`` without its wrappers (the same reduction)
_sum = np.add.reduce


@dataclass(frozen=True)
class Estimate:
    """Expected value of a metric and a ``level`` prediction interval for its realised value."""

    value: float
    lo: float
    hi: float

    def to_dict(self) -> dict[str, float]:
        return {"value": self.value, "lo": self.lo, "hi": self.hi}


def _cells(grid: ScoreGrid, bins: int | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray,
                                                             np.ndarray]:
    """Non-empty cells (of ``grid.coarsen(bins)``): counts, mean scores, mean squared scores, outcome sums, and
    their indices in the grid, from one read of the grid (:meth:`ScoreGrid.occupied`)."""
    keep, f = grid.occupied(bins)
    n = f[0]
    z, zz = f[1:4:2] / n  # sum_z / n and sum_zz / n in one call
    return n, z, zz, f[2], keep


def _auc(n: np.ndarray, pos: np.ndarray) -> np.ndarray:
    """ROC AUC of cells in score order with ``pos`` positives each (ties within a cell count half)."""
    neg = n[:, None] - pos
    below_neg = np.cumsum(neg, axis=0) - neg  # negatives in lower cells
    return ((_sum(pos * below_neg, axis=0) + 0.5 * _sum(pos * neg, axis=0))
            / np.maximum(_sum(pos, axis=0) * _sum(neg, axis=0), _EPS))


def _weights(z: np.ndarray, above: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per cell the weights of the positives in the count, the true positives, the Brier score and the log loss
    (every metric but the AUC is linear in the positives: one product with them), the clipped scores and
    ``log(1 - z)``."""
    zc = np.minimum(np.maximum(z, _EPS), 1 - _EPS)  # np.clip(z, _EPS, 1 - _EPS) without its wrappers
    log_neg = np.log1p(-zc)
    w = np.empty((4, z.size))
    w[0], w[1] = 1.0, above
    np.subtract(1, 2 * z, out=w[2])
    np.subtract(np.log(zc), log_neg, out=w[3])
    return w, zc, log_neg


def _metrics(n: np.ndarray, z: np.ndarray, zz: np.ndarray, pos: np.ndarray, above: np.ndarray) -> np.ndarray:
    """Metrics (rows of :data:`METRICS`) for positives ``pos`` per cell (expected or drawn; extra axis last)."""
    total = _sum(n)
    w, _, log_neg = _weights(z, above)
    p_tot, tp, brier_pos, ll_pos = w @ pos
    n_above = float(n @ w[1])
    tn = (total - n_above) - (p_tot - tp)
    brier = (brier_pos + float(n @ zz)) / total  # (1 - z)^2 = z^2 + (1 - 2 z) for a positive
    log_loss = -(ll_pos + float(n @ log_neg)) / total
    auc = _auc(n, pos)
    precision = tp / n_above if n_above > 0 else np.full(tp.shape, np.nan)
    if (p_tot > 0).all():
        recall = tp / p_tot
    else:
        with np.errstate(invalid="ignore", divide="ignore"):
            recall = np.where(p_tot > 0, tp / p_tot, np.nan)
    return np.array([(tp + tn) / total, precision, recall, p_tot / total, brier, log_loss, auc])


def _metric_columns(n: np.ndarray, z: np.ndarray, zz: np.ndarray, pos: np.ndarray, above: np.ndarray
                    ) -> list[list[float]]:
    """:func:`_metrics` as Python floats, a list of :data:`METRICS` values per column of ``pos``: for a column or
    two the scalar steps are Python's (the same IEEE operations on the same sums, without small arrays)."""
    total = float(_sum(n))
    w, _, log_neg = _weights(z, above)
    p_tot, tp, brier_pos, ll_pos = (w @ pos).tolist()
    n_above, brier_n, ll_n = float(n @ w[1]), float(n @ zz), float(n @ log_neg)
    neg = n[:, None] - pos
    below_neg = np.cumsum(neg, axis=0) - neg  # negatives in lower cells
    u_below, u_tie = _sum(pos * below_neg, axis=0).tolist(), _sum(pos * neg, axis=0).tolist()
    p_sum, n_sum = _sum(pos, axis=0).tolist(), _sum(neg, axis=0).tolist()
    nan = float("nan")
    out = []
    for j in range(pos.shape[1]):
        tn = (total - n_above) - (p_tot[j] - tp[j])
        out.append([(tp[j] + tn) / total, tp[j] / n_above if n_above > 0 else nan,
                    tp[j] / p_tot[j] if p_tot[j] > 0 else nan, p_tot[j] / total, (brier_pos[j] + brier_n) / total,
                    -(ll_pos[j] + ll_n) / total, (u_below[j] + 0.5 * u_tie[j]) / max(p_sum[j] * n_sum[j], _EPS)])
    return out


def _analytic(n: np.ndarray, z: np.ndarray, zz: np.ndarray, q: np.ndarray, above: np.ndarray
              ) -> tuple[list[float], list[float]]:
    """The expected metrics (:func:`_metrics` at ``n q`` positives) and the standard deviations of the realised
    ones given the scores (independent Bernoulli(q) outcomes), their common terms computed once.

    Sums of independent terms have exact variances; recall (a ratio of two independent sums) and the AUC use
    the delta method.  The AUC's: with ``k_c ~ Binomial(n_c, q_c)`` positives per cell (cells in score order,
    independent), the AUC is ``U / (P N)`` with ``U = sum_c k_c (B_c + (n_c - k_c) / 2)`` (Mann-Whitney count,
    ties half; Hanley & McNeil 1982), ``B_c`` the negatives below cell ``c``, ``P = sum k`` and
    ``N = sum n - P``.  Its gradient at ``k = n q`` is ``dU_c / (P N) - AUC (N - P) / (P N)`` with
    ``dU_c = B_c - A_c + (n_c - 2 k_c) / 2`` (``A_c`` the positives above cell ``c``, as ``k_c`` also removes
    a negative below every higher cell), and the delta method (van der Vaart 1998, Theorem 3.1) gives
    ``Var = sum_c grad_c^2 n_c q_c (1 - q_c)``.

    Every float is the one the separate computations give (the same operations on the same arrays; scalars
    as Python floats, whose arithmetic is the same IEEE double arithmetic): ``tests/test_window_base_fast.py``.
    """
    k = n.size
    total = float(_sum(n))
    w, zc, log_neg = _weights(z, above)
    # per cell: expected positives and negatives, negatives below the cell, and the Mann-Whitney count per
    # positive (below + half the cell's own); rows of one array, so that their sums are one call
    rows = np.empty((4, k))
    pos, neg, below_neg, u = rows
    np.multiply(n, q, out=pos)
    np.subtract(n, pos, out=neg)
    cum_pos, cum_neg = np.cumsum(rows[:2], axis=1)  # row by row, as np.cumsum of each
    np.subtract(cum_neg, neg, out=below_neg)
    np.add(below_neg, 0.5 * neg, out=u)
    p_tot, tp, brier_pos, ll_pos = (w @ pos[:, None]).ravel().tolist()
    n_above = float(n @ w[1])
    tn = (total - n_above) - (p_tot - tp)
    brier = (brier_pos + float(n @ zz)) / total  # (1 - z)^2 = z^2 + (1 - 2 z) for a positive
    log_loss = -(ll_pos + float(n @ log_neg)) / total
    p, m = _sum(rows[:2], axis=1).tolist()  # row sums: each the pairwise sum of a 1-d array
    s_tie, s_below, s_u = _sum(pos * rows[1:], axis=1).tolist()
    pn = max(p * m, _EPS)
    nan = float("nan")
    expected = [(tp + tn) / total, tp / n_above if n_above > 0 else nan, tp / p_tot if p_tot > 0 else nan,
                p_tot / total, brier, log_loss, (s_below + 0.5 * s_tie) / pn]
    # the standard deviations: sums as products with the cells' weights
    omq = 1 - q
    v = pos * omq  # variance of the positives per cell (contiguous: a strided vector takes another BLAS path)
    cols = np.empty((k, 3))
    cols[:, 0], cols[:, 1], cols[:, 2] = n, pos, v
    (_, p_all, var_all), (n_above, tp, var_tp) = (w[:2] @ cols).tolist()
    fn, var_fn = p_all - tp, var_all - var_tp
    recall_var = (fn**2 * var_tp + tp**2 * var_fn) / max(tp + fn, _EPS) ** 4
    sq = np.empty((k, 2))
    np.square(w[2], out=sq[:, 0])
    np.square(np.log((1 - zc) / zc), out=sq[:, 1])
    brier_var, ll_var = (v @ sq).tolist()
    above_pos = p - cum_pos
    auc = s_u / pn
    grad = (below_neg - above_pos + 0.5 * (neg - pos) - auc * (m - p)) / pn
    auc_sd = math.sqrt(_sum(grad * grad * pos * omq))
    variances = [
        var_all / total**2,                                       # accuracy: one Bernoulli term per event
        var_tp / max(n_above, _EPS) ** 2,                         # precision: TP / (predicted positive), fixed
        recall_var,
        var_all / total**2,                                       # base rate
        brier_var / total**2,                                     # Brier: (1-z)^2 vs z^2 differ by 1 - 2z
        ll_var / total**2,                                        # log loss: -log z vs -log(1-z)
        auc_sd ** 2,
    ]
    # np.sqrt(np.maximum(variances, 0.0)) in Python floats: maximum keeps x if x > 0 or x is NaN, else 0.0
    # (also for -0.0), and both square roots are correctly rounded
    return expected, [math.sqrt(v if v > 0.0 or v != v else 0.0) for v in variances]


@functools.lru_cache(maxsize=16)
def _z(a: float) -> float:
    """The normal quantile ``Phi^-1(1 - a)``, once per level (scipy's ``ppf`` costs ~0.1 ms a call, per window)."""
    return float(stats.norm.ppf(1 - a))


def estimate_performance(grid: ScoreGrid, *, threshold: float = 0.5, calibrator: Callable[[np.ndarray], np.ndarray]
                         | None = None, level: float = 0.95, draws: int = 0, seed: int = 0) -> dict[str, Estimate]:
    """Expected metrics of the window the grid's predictions will have, with prediction intervals.

    Parameters
    ----------
    grid
        Prediction-side statistics (scores only; outcomes ignored): binary scores, or top-label confidences
        (then "accuracy" is the top-1 accuracy with threshold 0).
    threshold
        Decision threshold of the binary confusion matrix.
    calibrator
        Maps scores to calibrated probabilities (the calibrator in service); identity if ``None``.
    level
        Interval level.
    draws, seed
        ``draws > 0``: percentile intervals from a parametric bootstrap (per cell Binomial(n, q)); ``0`` (the
        default, O(cells), no random draws): normal intervals with the standard deviations of
        :func:`_analytic` (the delta method for recall and the AUC).

    Returns
    -------
    dict
        Metric name (:data:`METRICS`) -> :class:`Estimate`; an empty dict for an empty grid.
    """
    if draws <= 0:
        return {m: Estimate(*t) for m, t in _analytic_estimates(grid, threshold, calibrator, level)}
    if grid.count == 0:
        return {}
    n, z, zz, q, above, _ = _expectation_inputs(grid, threshold, calibrator)
    expected = _metric_columns(n, z, zz, (n * q)[:, None], above)[0]
    a = (1 - level) / 2
    rng = np.random.default_rng(seed)
    pos = rng.binomial(n.astype(np.int64)[:, None], q[:, None], size=(n.size, draws))
    lo, hi = np.nanquantile(_metrics(n, z, zz, pos, above), [a, 1 - a], axis=1)
    return {m: Estimate(e, float(lo[i]), float(hi[i])) for i, (m, e) in enumerate(zip(METRICS, expected))}


def estimated(grid: ScoreGrid, *, threshold: float = 0.5, calibrator: Callable[[np.ndarray], np.ndarray]
              | None = None, level: float = 0.95) -> dict[str, dict[str, float]]:
    """``{m: e.to_dict()}`` of :func:`estimate_performance` (normal intervals), without the :class:`Estimate`
    objects: what a window publishes under ``estimated``."""
    return {m: {"value": v, "lo": lo, "hi": hi} for m, (v, lo, hi) in _analytic_estimates(grid, threshold,
                                                                                            calibrator, level)}


def _analytic_estimates(grid: ScoreGrid, threshold: float, calibrator: Callable[[np.ndarray], np.ndarray] | None,
                        level: float) -> zip[tuple[str, tuple[float, float, float]]]:
    """(metric, (value, lo, hi)) with normal intervals (:func:`_analytic`); nothing for an empty grid."""
    n, z, zz, q, above, _ = _expectation_inputs(grid, threshold, calibrator)
    if n.size == 0:
        return zip((), ())
    expected, sd = _analytic(n, z, zz, q, above)
    zq = _z((1 - level) / 2)
    half = [zq * h for h in sd]  # Python floats: the same IEEE products and sums as numpy's, cheaper
    return zip(METRICS, zip(expected, [e - h for e, h in zip(expected, half)],
                            [e + h for e, h in zip(expected, half)]))


def expected_metrics(grid: ScoreGrid, *, threshold: float = 0.5,
                     calibrator: Callable[[np.ndarray], np.ndarray] | None = None) -> dict[str, float]:
    """The expected values of :func:`estimate_performance` alone (no interval: O(cells), no random draws)."""
    if grid.count == 0:
        return {}
    n, z, zz, q, above, _ = _expectation_inputs(grid, threshold, calibrator)
    return dict(zip(METRICS, _metric_columns(n, z, zz, (n * q)[:, None], above)[0]))


def _expectation_inputs(grid: ScoreGrid, threshold: float, calibrator: Callable[[np.ndarray], np.ndarray] | None,
                        bins: int | None = None
                        ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Non-empty cells' counts, mean scores, mean squared scores, calibrated probabilities, z >= threshold, and
    the cells' outcome sums (of ``grid.coarsen(bins)``)."""
    n, z, zz, y, _ = _cells(grid, bins)
    if calibrator is None or not n.size:  # an empty grid is answered without calling the calibrator
        # np.clip(z, 0, 1) without its wrappers: the same floats, as z (a quotient of a sum and a positive
        # count) is never -0.0, the one value where they differ
        q = np.minimum(np.maximum(z, 0.0), 1.0)
    else:
        q = np.clip(np.asarray(calibrator(z), dtype=np.float64), 0.0, 1.0)
    return n, z, zz, q, z >= threshold, y


def realised_metrics(grid: ScoreGrid, *, threshold: float = 0.5) -> dict[str, float]:
    """The same metrics computed from a labelled grid (outcomes known), for the estimation error.

    Scores within a cell are taken at the cell mean, as in :func:`estimate_performance`, so the two differ only
    by the outcomes.
    """
    n, z, zz, y, _ = _cells(grid)
    if n.size == 0:
        return {}
    return dict(zip(METRICS, _metric_columns(n, z, zz, np.rint(y)[:, None], z >= threshold)[0]))


def estimation_error(grid: ScoreGrid, *, threshold: float = 0.5,
                     calibrator: Callable[[np.ndarray], np.ndarray] | None = None,
                     bins: int | None = None) -> dict[str, float]:
    """:func:`expected_metrics` minus :func:`realised_metrics` of a labelled grid (of ``grid.coarsen(bins)``,
    without building it), its cells read once.

    The expected and the realised positives per cell are two columns of one :func:`_metric_columns` call.
    """
    n, z, zz, q, above, y = _expectation_inputs(grid, threshold, calibrator, bins)
    if n.size == 0:
        return {}
    pos = np.empty((n.size, 2))  # np.column_stack, without its wrappers
    pos[:, 0], pos[:, 1] = n * q, np.rint(y)
    expected, realised = _metric_columns(n, z, zz, pos, above)
    return dict(zip(METRICS, [e - r for e, r in zip(expected, realised)]))
