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
(exact for the sums; the delta method for recall and for the AUC, see :func:`_auc_sd`), or a parametric
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
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from scipy import stats

from calmon.stats.grid import ScoreGrid

__all__ = ["METRICS", "Estimate", "estimate_performance", "estimation_error", "expected_metrics",
           "realised_metrics"]

METRICS = ("accuracy", "precision", "recall", "base_rate", "brier", "log_loss", "roc_auc")
_EPS = 1e-12


@dataclass(frozen=True)
class Estimate:
    """Expected value of a metric and a ``level`` prediction interval for its realised value."""

    value: float
    lo: float
    hi: float

    def to_dict(self) -> dict[str, float]:
        return {"value": self.value, "lo": self.lo, "hi": self.hi}


def _cells(grid: ScoreGrid) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Non-empty cells: counts, mean scores, mean squared scores, and their indices in the grid."""
    n = grid.n
    keep = np.flatnonzero(n)
    n = n[keep]
    return n, grid.sum_z[keep] / n, grid.sum_zz[keep] / n, keep


def _auc(n: np.ndarray, pos: np.ndarray) -> np.ndarray:
    """ROC AUC of cells in score order with ``pos`` positives each (ties within a cell count half)."""
    neg = n[:, None] - pos
    below_neg = np.cumsum(neg, axis=0) - neg  # negatives in lower cells
    return ((pos * below_neg).sum(0) + 0.5 * (pos * neg).sum(0)) / np.maximum(pos.sum(0) * neg.sum(0), _EPS)


def _metrics(n: np.ndarray, z: np.ndarray, zz: np.ndarray, pos: np.ndarray, above: np.ndarray) -> np.ndarray:
    """Metrics (rows of :data:`METRICS`) for positives ``pos`` per cell (expected or drawn; extra axis last)."""
    total = n.sum()
    zc = np.clip(z, _EPS, 1 - _EPS)
    log_neg = np.log1p(-zc)
    # every metric but the AUC is linear in the positives: one product with the cells' weights
    w = np.empty((4, n.size))
    w[0], w[1], w[2], w[3] = 1.0, above, 1 - 2 * z, np.log(zc) - log_neg
    p_tot, tp, brier_pos, ll_pos = w @ pos
    n_above = float(n @ w[1])
    tn = (total - n_above) - (p_tot - tp)
    brier = (brier_pos + float(n @ zz)) / total  # (1 - z)^2 = z^2 + (1 - 2 z) for a positive
    log_loss = -(ll_pos + float(n @ log_neg)) / total
    auc = _auc(n, pos)
    with np.errstate(invalid="ignore", divide="ignore"):
        precision = np.where(n_above > 0, tp / n_above, np.nan)
        recall = np.where(p_tot > 0, tp / p_tot, np.nan)
    return np.vstack([(tp + tn) / total, precision, recall, p_tot / total, brier, log_loss, auc])


def _auc_sd(n: np.ndarray, q: np.ndarray) -> float:
    """Delta-method standard deviation of the realised AUC given the scores, in O(cells).

    With ``k_c ~ Binomial(n_c, q_c)`` positives per cell (cells in score order, independent), the AUC is
    ``U / (P N)`` with ``U = sum_c k_c (B_c + (n_c - k_c) / 2)`` (Mann-Whitney count, ties half; Hanley & McNeil
    1982), ``B_c`` the negatives below cell ``c``, ``P = sum k`` and ``N = sum n - P``.  Its gradient at
    ``k = n q`` is ``dU_c / (P N) - AUC (N - P) / (P N)`` with ``dU_c = B_c - A_c + (n_c - 2 k_c) / 2``
    (``A_c`` the positives above cell ``c``, as ``k_c`` also removes a negative below every higher cell), and
    the delta method (van der Vaart 1998, Theorem 3.1) gives ``Var = sum_c grad_c^2 n_c q_c (1 - q_c)``.
    """
    pos = n * q
    neg = n - pos
    p, m = float(pos.sum()), float(neg.sum())
    pn = max(p * m, _EPS)
    below_neg = np.cumsum(neg) - neg
    above_pos = p - np.cumsum(pos)
    auc = float((pos * (below_neg + 0.5 * neg)).sum()) / pn
    grad = (below_neg - above_pos + 0.5 * (neg - pos) - auc * (m - p)) / pn
    return float(np.sqrt((grad * grad * pos * (1 - q)).sum()))


def _analytic_sd(n: np.ndarray, z: np.ndarray, q: np.ndarray, above: np.ndarray) -> np.ndarray:
    """Standard deviations of the realised metrics given the scores (independent Bernoulli(q) outcomes).

    Sums of independent terms have exact variances; recall (a ratio of two independent sums) and the AUC
    (:func:`_auc_sd`) use the delta method.
    """
    total = float(n.sum())
    pos = n * q
    v = pos * (1 - q)  # variance of the positives per cell
    zc = np.clip(z, _EPS, 1 - _EPS)
    # the sums below as one product: [all, above] x [n, expected positives, variance]
    w = np.empty((2, n.size))
    w[0], w[1] = 1.0, above
    (_, p_all, var_all), (n_above, tp, var_tp) = (w @ np.stack([n, pos, v], axis=1)).tolist()
    fn, var_fn = p_all - tp, var_all - var_tp
    recall_var = (fn**2 * var_tp + tp**2 * var_fn) / max(tp + fn, _EPS) ** 4
    brier_var, ll_var = (v @ np.stack([(1 - 2 * z) ** 2, np.log((1 - zc) / zc) ** 2], axis=1)).tolist()
    return np.sqrt(np.maximum([
        var_all / total**2,                                       # accuracy: one Bernoulli term per event
        var_tp / max(n_above, _EPS) ** 2,                         # precision: TP / (predicted positive), fixed
        recall_var,
        var_all / total**2,                                       # base rate
        brier_var / total**2,                                     # Brier: (1-z)^2 vs z^2 differ by 1 - 2z
        ll_var / total**2,                                        # log loss: -log z vs -log(1-z)
        _auc_sd(n, q) ** 2,
    ], 0.0))


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
        :func:`_analytic_sd` (the delta method for recall and the AUC).

    Returns
    -------
    dict
        Metric name (:data:`METRICS`) -> :class:`Estimate`; an empty dict for an empty grid.
    """
    if grid.count == 0:
        return {}
    n, z, zz, q, above, _ = _expectation_inputs(grid, threshold, calibrator)
    expected = _metrics(n, z, zz, (n * q)[:, None], above)[:, 0]
    a = (1 - level) / 2
    if draws > 0:
        rng = np.random.default_rng(seed)
        pos = rng.binomial(n.astype(np.int64)[:, None], q[:, None], size=(n.size, draws))
        lo, hi = np.nanquantile(_metrics(n, z, zz, pos, above), [a, 1 - a], axis=1)
    else:
        half = _z(a) * _analytic_sd(n, z, q, above)
        lo, hi = expected - half, expected + half
    return {m: Estimate(float(expected[i]), float(lo[i]), float(hi[i])) for i, m in enumerate(METRICS)}


def expected_metrics(grid: ScoreGrid, *, threshold: float = 0.5,
                     calibrator: Callable[[np.ndarray], np.ndarray] | None = None) -> dict[str, float]:
    """The expected values of :func:`estimate_performance` alone (no interval: O(cells), no random draws)."""
    if grid.count == 0:
        return {}
    n, z, zz, q, above, _ = _expectation_inputs(grid, threshold, calibrator)
    vals = _metrics(n, z, zz, (n * q)[:, None], above)[:, 0]
    return {m: float(vals[i]) for i, m in enumerate(METRICS)}


def _expectation_inputs(grid: ScoreGrid, threshold: float, calibrator: Callable[[np.ndarray], np.ndarray] | None
                        ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Non-empty cells' counts, mean scores, mean squared scores, calibrated probabilities, z >= threshold, and
    the cells' indices."""
    n, z, zz, keep = _cells(grid)
    q = np.clip(np.asarray(calibrator(z) if calibrator is not None else z, dtype=np.float64), 0.0, 1.0)
    return n, z, zz, q, z >= threshold, keep


def realised_metrics(grid: ScoreGrid, *, threshold: float = 0.5) -> dict[str, float]:
    """The same metrics computed from a labelled grid (outcomes known), for the estimation error.

    Scores within a cell are taken at the cell mean, as in :func:`estimate_performance`, so the two differ only
    by the outcomes.
    """
    if grid.count == 0:
        return {}
    n, z, zz, keep = _cells(grid)
    pos = np.rint(grid.sum_y[keep])[:, None]
    vals = _metrics(n, z, zz, pos, z >= threshold)[:, 0]
    return {m: float(vals[i]) for i, m in enumerate(METRICS)}


def estimation_error(grid: ScoreGrid, *, threshold: float = 0.5,
                     calibrator: Callable[[np.ndarray], np.ndarray] | None = None) -> dict[str, float]:
    """:func:`expected_metrics` minus :func:`realised_metrics` of a labelled grid, its cells read once.

    The expected and the realised positives per cell are two columns of one :func:`_metrics` call.
    """
    if grid.count == 0:
        return {}
    n, z, zz, q, above, keep = _expectation_inputs(grid, threshold, calibrator)
    vals = _metrics(n, z, zz, np.column_stack([n * q, np.rint(grid.sum_y[keep])]), above)
    return {m: float(vals[i, 0] - vals[i, 1]) for i, m in enumerate(METRICS)}
