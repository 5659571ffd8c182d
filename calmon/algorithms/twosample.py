"""Has calibration changed?  A conditional permutation test between two score grids.

Null hypothesis: the reference and the current data have the same calibration function
``E[y | z]`` (their score distributions may differ).  Under it the events of one fine grid cell are
exchangeable between the two samples, so the group labels are permuted *within each cell*: the number
of events of each sample per cell is kept and the cell's ``Y_c`` positive outcomes are split at random,
the current sample's share being hypergeometric ``(N_c, Y_c, n_c^cur)``.  The statistic is the
difference of the debiased l2-ECE^2 estimates (T-Cal's DPE, eq. 6) of the two samples at ``bins``
equal-width bins, two-sided; the p-value ``(1 + #{|T*| >= |T|}) / (1 + R)`` is exact for the
permutation distribution (Lehmann and Romano, Testing Statistical Hypotheses, 3rd ed., Section 15.2,
Theorem 15.2.1), so the test holds its level whatever ``R``.

Within a cell the scores are replaced by the cell's pooled mean in ``sum z y`` (the only term that
depends on which events are positive); on a grid of 1024 or more cells this changes the DPE by
``O(1 / cells^2)`` and both the observed and the permuted statistics use the same formula.

The level (1000 replications) and the power are measured by ``benchmarks/twosample_level.py``.

References
----------
Lee, Huang, Hassani, Dobriban. T-Cal: an optimal test for the calibration of predictive models.
JMLR 2023, eq. (6) (the debiased plug-in estimator).  Lehmann and Romano (2005), Section 15.2
(permutation tests; conditioning on the cells keeps exchangeability under the null).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from calmon.stats.grid import ScoreGrid

__all__ = ["TwoSampleResult", "calibration_change_test"]


@dataclass(frozen=True)
class TwoSampleResult:
    """Outcome of :func:`calibration_change_test`; ``to_dict()`` is its JSON.

    ``statistic`` is ``DPE(current) - DPE(reference)`` (positive: the current data is worse calibrated).
    """

    statistic: float
    p_value: float
    decision: str
    reference_dpe: float
    current_dpe: float
    bins: int
    permutations: int
    n_reference: int
    n_current: int
    method: str = "permutation-dpe"

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def calibration_change_test(reference: ScoreGrid, current: ScoreGrid, *, alpha: float = 0.05,
                            permutations: int = 999, bins: int = 16,
                            rng: np.random.Generator | None = None) -> TwoSampleResult:
    """Permutation test of ``DPE(current) - DPE(reference)`` within the cells of two same-shape grids.

    Parameters
    ----------
    reference, current
        Single-channel grids with the same number of cells (binary scores or top-label confidence).
    alpha
        Level of ``decision`` (``"changed"`` iff ``p < alpha``).
    permutations
        Random within-cell permutations ``R``.
    bins
        Bins of the DPE (must divide the grids' cells).
    rng
        Generator (default seeded 0: the result is reproducible).

    Examples
    --------
    >>> rng = np.random.default_rng(1)
    >>> def grid(t, n=4000):
    ...     p = rng.beta(2, 2, n); y = rng.random(n) < p
    ...     z = 1 / (1 + np.exp(-np.log(p / (1 - p)) / t)); g = ScoreGrid(1024); g.update(z, y); return g
    >>> calibration_change_test(grid(1.0), grid(1.0)).decision
    'unchanged'
    >>> r = calibration_change_test(grid(1.0), grid(0.5)); r.decision, r.statistic > 0
    ('changed', True)
    """
    if reference.channels is not None or current.channels is not None:
        raise ValueError("calibration_change_test needs single-channel grids")
    if reference.bins != current.bins:
        raise ValueError(f"grids must have the same cells, got {reference.bins} and {current.bins}")
    if reference.bins % bins:
        raise ValueError(f"bins={bins} must divide the grids' {reference.bins} cells")
    if permutations < 1:
        raise ValueError(f"permutations must be >= 1, got {permutations}")
    if reference.count == 0 or current.count == 0:
        raise ValueError("both grids need events")
    rng = np.random.default_rng(0) if rng is None else rng
    cells = _Cells(reference, current)
    observed = cells.statistic(cells.y_cur[None, :], bins)[0]
    both = cells.mixed
    draws = np.tile(cells.y_cur, (permutations, 1))
    draws[:, both] = rng.hypergeometric(cells.y_all[both].astype(np.int64),
                                        (cells.n_all - cells.y_all)[both].astype(np.int64),
                                        cells.n_cur[both].astype(np.int64), size=(permutations, int(both.sum())))
    null = cells.statistic(draws, bins)
    p = float((1 + np.count_nonzero(np.abs(null) >= abs(observed) - 1e-15)) / (1 + permutations))
    ref_dpe, cur_dpe = cells.dpes(cells.y_cur[None, :], bins)
    return TwoSampleResult(float(observed), p, "changed" if p < alpha else "unchanged", float(ref_dpe[0]),
                           float(cur_dpe[0]), bins, permutations, reference.count, current.count)


class _Cells:
    """Per-cell sums of the two samples, with the positives of the current sample as the free variable."""

    def __init__(self, ref: ScoreGrid, cur: ScoreGrid) -> None:
        self.n_ref, self.n_cur = ref.n, cur.n
        self.n_all = self.n_ref + self.n_cur
        self.y_cur = np.rint(cur.sum_y)
        self.y_all = np.rint(ref.sum_y) + self.y_cur
        self.z_ref, self.z_cur = ref.sum_z, cur.sum_z
        self.zz_ref, self.zz_cur = ref.sum_zz, cur.sum_zz
        with np.errstate(invalid="ignore", divide="ignore"):
            self.mean_z = np.where(self.n_all > 0, (self.z_ref + self.z_cur) / np.where(self.n_all > 0,
                                                                                       self.n_all, 1), 0.0)
        self.mixed = (self.n_ref > 0) & (self.n_cur > 0) & (self.y_all > 0) & (self.y_all < self.n_all)
        self.cells = ref.bins

    def dpes(self, y_cur: np.ndarray, bins: int) -> tuple[np.ndarray, np.ndarray]:
        """DPE of the reference and of the current sample for each row of current positives."""
        y_ref = self.y_all[None, :] - y_cur
        return (_dpe(self.n_ref, y_ref, self.z_ref, self.zz_ref, self.mean_z, bins),
                _dpe(self.n_cur, y_cur, self.z_cur, self.zz_cur, self.mean_z, bins))

    def statistic(self, y_cur: np.ndarray, bins: int) -> np.ndarray:
        ref, cur = self.dpes(y_cur, bins)
        return cur - ref


def _dpe(n: np.ndarray, y: np.ndarray, z: np.ndarray, zz: np.ndarray, mean_z: np.ndarray, bins: int) -> np.ndarray:
    """Rows of debiased l2-ECE^2 (eq. 6) with ``sum zy`` taken as ``y * pooled cell mean``."""
    factor = n.size // bins

    def coarse(a: np.ndarray) -> np.ndarray:
        return a.reshape(*a.shape[:-1], bins, factor).sum(axis=-1)

    cnt = coarse(n)
    s = coarse(y - z[None, :])
    q = coarse(y * (1.0 - 2.0 * mean_z)[None, :] + zz[None, :])
    total = cnt.sum()
    ok = cnt > 0
    return ((s[:, ok] ** 2 - q[:, ok]) / cnt[ok]).sum(axis=1) / total
