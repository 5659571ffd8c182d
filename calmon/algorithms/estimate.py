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

Intervals come from that predictive distribution: normal intervals with its exact standard
deviations (delta method for recall; a small bootstrap for the AUC), or a parametric bootstrap (per grid
cell ``k_j ~ Binomial(n_j, q_j)`` positives, the metrics recomputed from the draws, percentile
intervals). They are prediction intervals for the *realised* metric of the window (which is itself
random given the scores), valid when the calibrator in service is calibrated; the estimation error
(estimated minus realised, once the outcomes have arrived) shows how far that holds. Within a cell
all scores are taken at the cell's mean (exact for the confusion matrix when the threshold is a cell
edge; within ``1/bins`` otherwise).

References
----------
NannyML, "Confidence-based Performance Estimation (CBPE)",
https://nannyml.readthedocs.io/en/stable/how_it_works/performance_estimation.html

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

__all__ = ["METRICS", "Estimate", "estimate_performance", "expected_metrics", "realised_metrics"]

METRICS = ("accuracy", "precision", "recall", "base_rate", "brier", "log_loss", "roc_auc")
_EPS = 1e-12
AUC_DRAWS = 100


@dataclass(frozen=True)
class Estimate:
    """Expected value of a metric and a ``level`` prediction interval for its realised value."""

    value: float
    lo: float
    hi: float

    def to_dict(self) -> dict[str, float]:
        return {"value": self.value, "lo": self.lo, "hi": self.hi}


def _cells(grid: ScoreGrid) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Non-empty cells: counts, mean scores, mean squared scores."""
    n = grid.n
    keep = n > 0
    n = n[keep]
    return n, grid.sum_z[keep] / n, grid.sum_zz[keep] / n


def _auc(n: np.ndarray, pos: np.ndarray) -> np.ndarray:
    """ROC AUC of cells in score order with ``pos`` positives each (ties within a cell count half)."""
    neg = n[:, None] - pos
    below_neg = np.cumsum(neg, axis=0) - neg  # negatives in lower cells
    return ((pos * below_neg).sum(0) + 0.5 * (pos * neg).sum(0)) / np.maximum(pos.sum(0) * neg.sum(0), _EPS)


def _metrics(n: np.ndarray, z: np.ndarray, zz: np.ndarray, pos: np.ndarray, above: np.ndarray) -> np.ndarray:
    """Metrics (rows of :data:`METRICS`) for positives ``pos`` per cell (expected or drawn; extra axis last)."""
    neg = n[:, None] - pos
    total = n.sum()
    tp, fp = (pos * above[:, None]).sum(0), (neg * above[:, None]).sum(0)
    tn = (neg * ~above[:, None]).sum(0)
    zc = np.clip(z, _EPS, 1 - _EPS)[:, None]
    brier = (pos * (1 - 2 * z[:, None]) + (n * zz)[:, None]).sum(0) / total
    log_loss = -(pos * np.log(zc) + neg * np.log1p(-zc)).sum(0) / total
    p_tot = pos.sum(0)
    auc = _auc(n, pos)
    with np.errstate(invalid="ignore", divide="ignore"):
        precision = np.where(tp + fp > 0, tp / (tp + fp), np.nan)
        recall = np.where(p_tot > 0, tp / p_tot, np.nan)
    return np.vstack([(tp + tn) / total, precision, recall, p_tot / total, brier, log_loss, auc])


def _analytic_sd(n: np.ndarray, z: np.ndarray, q: np.ndarray, above: np.ndarray) -> np.ndarray:
    """Standard deviations of the realised metrics given the scores (independent Bernoulli(q) outcomes).

    Sums of independent terms have exact variances; recall (a ratio of two independent sums) uses
    the delta method.  The AUC has none here (its interval comes from a small bootstrap).
    """
    total = n.sum()
    v = n * q * (1 - q)  # variance of the positives per cell
    zc = np.clip(z, _EPS, 1 - _EPS)
    n_above = float(n[above].sum())
    tp, fn = float((n * q)[above].sum()), float((n * q)[~above].sum())
    var_tp, var_fn = float(v[above].sum()), float(v[~above].sum())
    recall_var = (fn**2 * var_tp + tp**2 * var_fn) / max(tp + fn, _EPS) ** 4
    return np.sqrt(np.maximum([
        v.sum() / total**2,                                       # accuracy: one Bernoulli term per event
        var_tp / max(n_above, _EPS) ** 2,                         # precision: TP / (predicted positive), fixed
        recall_var,
        v.sum() / total**2,                                       # base rate
        (v * (1 - 2 * z) ** 2).sum() / total**2,                  # Brier: (1-z)^2 vs z^2 differ by 1 - 2z
        (v * np.log((1 - zc) / zc) ** 2).sum() / total**2,        # log loss: -log z vs -log(1-z)
        np.nan,                                                   # AUC: no closed form given the scores
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
        default, O(cells)): normal intervals with the analytic standard deviations of :func:`_analytic_sd`, and
        for the AUC a bootstrap of ``AUC_DRAWS`` draws.

    Returns
    -------
    dict
        Metric name (:data:`METRICS`) -> :class:`Estimate`; an empty dict for an empty grid.
    """
    if grid.count == 0:
        return {}
    n, z, zz, q, above = _expectation_inputs(grid, threshold, calibrator)
    expected = _metrics(n, z, zz, (n * q)[:, None], above)[:, 0]
    a = (1 - level) / 2
    if draws > 0:
        rng = np.random.default_rng(seed)
        pos = rng.binomial(n.astype(np.int64)[:, None], q[:, None], size=(n.size, draws))
        lo, hi = np.nanquantile(_metrics(n, z, zz, pos, above), [a, 1 - a], axis=1)
    else:
        half = _z(a) * _analytic_sd(n, z, q, above)
        lo, hi = expected - half, expected + half
        # the AUC's standard deviation from a small parametric bootstrap of the cells' positives
        k = METRICS.index("roc_auc")
        pos = np.random.default_rng(seed).binomial(n.astype(np.int64)[:, None], q[:, None], (n.size, AUC_DRAWS))
        width = _z(a) * float(np.std(_auc(n, pos), ddof=1))
        lo[k], hi[k] = expected[k] - width, expected[k] + width
    return {m: Estimate(float(expected[i]), float(lo[i]), float(hi[i])) for i, m in enumerate(METRICS)}


def expected_metrics(grid: ScoreGrid, *, threshold: float = 0.5,
                     calibrator: Callable[[np.ndarray], np.ndarray] | None = None) -> dict[str, float]:
    """The expected values of :func:`estimate_performance` alone (no interval: O(cells), no random draws)."""
    if grid.count == 0:
        return {}
    n, z, zz, q, above = _expectation_inputs(grid, threshold, calibrator)
    vals = _metrics(n, z, zz, (n * q)[:, None], above)[:, 0]
    return {m: float(vals[i]) for i, m in enumerate(METRICS)}


def _expectation_inputs(grid: ScoreGrid, threshold: float, calibrator: Callable[[np.ndarray], np.ndarray] | None
                        ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Non-empty cells' counts, mean scores, mean squared scores, calibrated probabilities, and z >= threshold."""
    n, z, zz = _cells(grid)
    q = np.clip(np.asarray(calibrator(z) if calibrator is not None else z, dtype=np.float64), 0.0, 1.0)
    return n, z, zz, q, z >= threshold


def realised_metrics(grid: ScoreGrid, *, threshold: float = 0.5) -> dict[str, float]:
    """The same metrics computed from a labelled grid (outcomes known), for the estimation error.

    Scores within a cell are taken at the cell mean, as in :func:`estimate_performance`, so the two differ only
    by the outcomes.
    """
    if grid.count == 0:
        return {}
    keep = grid.n > 0
    n = grid.n[keep]
    z, zz = grid.sum_z[keep] / n, grid.sum_zz[keep] / n
    pos = np.rint(grid.sum_y[keep])[:, None]
    vals = _metrics(n, z, zz, pos, z >= threshold)[:, 0]
    return {m: float(vals[i]) for i, m in enumerate(METRICS)}
