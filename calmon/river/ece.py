"""Binned calibration errors as river metrics: :class:`ECE` (15-bin l1) and :class:`DebiasedL2ECE` (T-Cal's DPE)."""

from __future__ import annotations

from collections.abc import Hashable

from calmon.algorithms.ece import default_l2_bins, ece_l1, l2_ece_squared
from calmon.river.base import CalibrationMetric, check_dyadic
from calmon.stats.grid import ScoreGrid

__all__ = ["ECE", "DebiasedL2ECE"]


class ECE(CalibrationMetric[float]):
    """Expected calibration error with equal-width bins, l1: ``sum_b |sum_b y - sum_b p| / n``.

    The value ``calmon check`` reports as ``ece`` (Guo et al. 2017 with 15 bins; the bin of ``p``
    is ``min(floor(p * bins), bins - 1)``), computed from calmon's fixed-point sums, so it is
    exact under ``revert`` and ``utils.Rolling``.  0 before the first update.

    Parameters
    ----------
    bins
        Equal-width bins on [0, 1].
    top_label
        ``False`` (binary): the score is ``P(y = pos_val)``.  ``True`` (multiclass): the top-label
        confidence against the correctness of the top label.
    pos_val
        The positive label of a binary model.

    Examples
    --------
    >>> from river import datasets, evaluate, linear_model, preprocessing
    >>> import calmon.river

    >>> model = preprocessing.StandardScaler() | linear_model.LogisticRegression()
    >>> evaluate.progressive_val_score(datasets.Phishing(), model, calmon.river.ECE())
    ECE: 10.45%

    Probabilities may be dicts, as ``predict_proba_one`` returns, or floats:

    >>> metric = calmon.river.ECE()
    >>> for y, p in [(True, 0.9), (False, {True: 0.2, False: 0.8}), (True, 0.65)]:
    ...     metric.update(y, p)
    >>> round(metric.get(), 6)
    0.216667
    >>> metric.revert(True, 0.65); round(metric.get(), 6)
    0.15

    A rolling ECE of the last 1000 predictions:

    >>> from river import utils
    >>> rolling = utils.Rolling(calmon.river.ECE, window_size=1000)

    References
    ----------
    Guo, Pleiss, Sun, Weinberger. On calibration of modern neural networks. ICML 2017, eq. (3).
    """

    def __init__(self, bins: int = 15, top_label: bool = False, pos_val: Hashable = True) -> None:
        super().__init__(bins, top_label, pos_val)

    @property
    def bigger_is_better(self) -> bool:
        return False

    def get(self) -> float:
        return self._cached()

    def _compute(self, grid: ScoreGrid) -> float:
        return ece_l1(grid) if grid.count else 0.0


class DebiasedL2ECE(CalibrationMetric[float]):
    """T-Cal's debiased estimate of the squared l2-ECE (the DPE), at an adaptive or a fixed scale.

    ``T^d = (1/n) sum_i (S_i^2 - Q_i) / N_i`` over ``l2_bins`` equal-width bins (eq. 6 of T-Cal,
    scalar binary convention: ``S_i = sum (y - p)``, ``Q_i = sum (y - p)^2``).  Unbiased for the
    squared l2-ECE of the binned predictor, hence possibly negative for a calibrated model.
    With ``l2_bins=None`` the scale follows ``n`` as in ``calmon check`` (the dyadic number of
    bins nearest below ``n ** 0.4``), and the value is ``calmon check``'s ``ece_l2_debiased``.
    0 before the first update.

    Parameters
    ----------
    bins
        Cells of the fine grid (a power of two); every scale is a coarsening of it.
    l2_bins
        Fixed number of bins (must divide ``bins``), or ``None`` for the adaptive scale.
    top_label, pos_val
        As in :class:`ECE`.

    Examples
    --------
    >>> from river import datasets, evaluate, linear_model, preprocessing
    >>> import calmon.river

    >>> model = preprocessing.StandardScaler() | linear_model.LogisticRegression()
    >>> evaluate.progressive_val_score(datasets.Phishing(), model, calmon.river.DebiasedL2ECE())
    DebiasedL2ECE: 1.475e-02

    References
    ----------
    Lee, Huang, Hassani, Dobriban. T-Cal: an optimal test for the calibration of predictive
    models. JMLR 2023, eqs. (5)-(7).
    """

    _fmt = ".3e"

    def __init__(self, bins: int = 4096, l2_bins: int | None = None, top_label: bool = False,
                 pos_val: Hashable = True) -> None:
        check_dyadic(bins)
        if l2_bins is not None and (l2_bins < 1 or bins % l2_bins):
            raise ValueError(f"l2_bins must divide bins = {bins}, got {l2_bins}")
        super().__init__(bins, top_label, pos_val)
        self.l2_bins = l2_bins

    @property
    def bigger_is_better(self) -> bool:
        return False

    @property
    def scale(self) -> int:
        """Number of bins the current value uses."""
        return self.l2_bins or default_l2_bins(self.n, self.bins)

    def get(self) -> float:
        return self._cached()

    def _compute(self, grid: ScoreGrid) -> float:
        if not grid.count:
            return 0.0
        return l2_ece_squared(grid, self.l2_bins or default_l2_bins(grid.count, self.bins), debiased=True)
