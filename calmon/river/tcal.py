"""The T-Cal calibration test as a river metric: :class:`CalibrationTest` (value: the p-value)."""

from __future__ import annotations

from collections.abc import Hashable

from calmon.algorithms.tcal import COMBINES, METHODS
from calmon.river.base import CalibrationMetric, check_dyadic
from calmon.stats.data import CalibrationData
from calmon.stats.grid import ScoreGrid
from calmon.testers import Decision, TestResult, run_tester

__all__ = ["CalibrationTest"]


class CalibrationTest(CalibrationMetric[TestResult]):
    """Adaptive T-Cal test of "the model is calibrated": the p-value as the metric, the decision as a property.

    Runs calmon's ``tcal`` tester on the grid of the pairs, exactly as ``calmon check --tests
    tcal --test-param tcal.method=mc-grid`` does on a file of the same pairs (a file's check
    otherwise simulates from the raw pairs, which the metric does not keep): with
    ``method="auto"`` the exact binomial test when the scores take few
    distinct values, else Monte Carlo on the fine grid, with ``mc`` draws from a generator seeded
    by ``seed`` -- so the p-value is a deterministic function of the counted pairs.  A small
    p-value is evidence of miscalibration (``bigger_is_better`` is true).  NaN, and decision
    ``"insufficient data"``, before there are enough pairs.  :attr:`result` tells which method
    ran: the exact Cantelli bound rejects without simulating when the evidence is overwhelming.
    The test runs when the value is asked for, at most once per state (each run costs up to
    ``mc`` simulated grids; under ``utils.Rolling`` ask for it at checkpoints, not every step).

    Parameters
    ----------
    alpha
        Level of the test (the decision is ``"miscalibrated"`` when it rejects at ``alpha``).
    mc
        Monte Carlo draws for the critical values.
    seed
        Seed of the draws.
    bins
        Cells of the fine grid (a power of two; default the agent's 4096).
    method
        ``"auto"``, ``"mc-grid"``, ``"binomial"``, ``"cantelli"``, ``"moment3"`` or ``"theorem3"``
        (see :func:`calmon.testers.tcal.tcal_tester`; ``"mc-raw"`` needs raw pairs the metric does not keep).
    combine
        ``"bonferroni"`` (Algorithm 2 of T-Cal) or ``"minp"``.
    top_label, pos_val
        As in :class:`~calmon.river.ECE`.

    Examples
    --------
    >>> from river import datasets, evaluate, linear_model, preprocessing
    >>> import calmon.river

    >>> model = preprocessing.StandardScaler() | linear_model.LogisticRegression()
    >>> test = calmon.river.CalibrationTest()
    >>> evaluate.progressive_val_score(datasets.Phishing(), model, test)
    CalibrationTest: 0.0042 (miscalibrated)
    >>> test.decision, test.result.method
    ('miscalibrated', 'cantelli')

    References
    ----------
    Lee, Huang, Hassani, Dobriban. T-Cal: an optimal test for the calibration of predictive
    models. JMLR 2023, Algorithms 1-2.
    """

    _fmt = ".4f"

    def __init__(self, alpha: float = 0.05, mc: int = 2000, seed: int = 0, bins: int = 4096, method: str = "auto",
                 combine: str = "bonferroni", top_label: bool = False, pos_val: Hashable = True) -> None:
        if not 0.0 < alpha < 1.0:
            raise ValueError(f"alpha must lie in (0, 1), got {alpha}")
        if method == "mc-raw":
            raise ValueError("method 'mc-raw' needs the raw pairs; the metric keeps only the grid")
        if method not in METHODS or combine not in COMBINES:
            raise ValueError(f"method must be one of {METHODS} and combine one of {COMBINES}, "
                             f"got {method!r} and {combine!r}")
        if int(mc) != mc or mc < 0:
            raise ValueError(f"mc must be a non-negative integer, got {mc!r}")
        check_dyadic(bins)
        super().__init__(bins, top_label, pos_val)
        self.alpha = alpha
        self.mc = int(mc)
        self.seed = seed
        self.method = method
        self.combine = combine

    @property
    def bigger_is_better(self) -> bool:
        return True

    @property
    def result(self) -> TestResult:
        """The tester's full result (statistic, per-level details, method) for the current pairs."""
        return self._cached()

    @property
    def decision(self) -> Decision:
        """``"calibrated"``, ``"miscalibrated"`` or ``"insufficient data"``."""
        return self.result.decision

    def get(self) -> float:
        p = self.result.p_value
        return float("nan") if p is None else float(p)

    def __repr__(self) -> str:
        return f"{super().__repr__()} ({self.decision})"

    def _compute(self, grid: ScoreGrid) -> TestResult:
        data = CalibrationData(n=grid.count, grid=grid)
        return run_tester("tcal", data, alpha=self.alpha, mc=self.mc, seed=self.seed, method=self.method,
                          combine=self.combine)
