"""Score drift: has the distribution of a model's scores changed? PSI and a chi-square test on score grids.

The earliest warning a monitor has: it needs predictions only, no outcomes.  Both statistics
compare a *reference* score grid (a past window, or a file) with the *current* one, on ``bins``
intervals whose edges are the reference's quantiles (the grid's cell edges nearest to them, so
the comparison is exact on the grid):

- the population stability index ``PSI = sum_i (c_i - r_i) ln(c_i / r_i)`` over the interval
  shares ``r_i`` (reference) and ``c_i`` (current), with empty shares floored at ``1e-4``
  (rule of thumb: < 0.1 stable, 0.1-0.25 moderate, > 0.25 large shift);
- Pearson's chi-square test of homogeneity of the two samples' interval counts
  (``sum (O - E)^2 / E`` over both samples, ``E`` from the pooled shares, ``bins - 1`` degrees of
  freedom after merging intervals whose expected count is below 5): a p-value valid as both
  samples grow, whose level ``benchmarks/scoredrift_level.py`` checks by simulation.

References
----------
K. Pearson (1900); see e.g. Agresti, Categorical Data Analysis (3rd ed.), Section 3.2 (homogeneity).
B. Yurdakul (2018). Statistical properties of population stability index. PhD thesis, Western Michigan University.

Examples
--------
>>> import numpy as np
>>> from calmon.stats.grid import ScoreGrid
>>> rng = np.random.default_rng(0)
>>> ref, same, shifted = ScoreGrid(1024), ScoreGrid(1024), ScoreGrid(1024)
>>> ref.update(rng.beta(2, 5, 20_000), np.zeros(20_000))
>>> same.update(rng.beta(2, 5, 5_000), np.zeros(5_000))
>>> shifted.update(rng.beta(2.4, 5, 5_000), np.zeros(5_000))
>>> r = score_drift(ref, same); r.psi < 0.01, r.p_value > 0.01
(True, True)
>>> r = score_drift(ref, shifted); r.psi > 0.02, r.p_value < 1e-6
(True, True)
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, fields

import numpy as np
from scipy import special

from calmon.stats.grid import ScoreGrid

__all__ = ["ScoreDrift", "score_drift"]

_FLOOR = 1e-4
#: ``ndarray.sum`` without its wrappers (the same reduction)
_sum = np.add.reduce
_reduceat = np.add.reduceat


@dataclass(frozen=True)
class ScoreDrift:
    """PSI, the chi-square statistic, its degrees of freedom and p-value, and the sample sizes."""

    psi: float
    statistic: float
    df: int
    p_value: float
    n_reference: int
    n_current: int

    def to_dict(self) -> dict[str, float | int]:
        # what dataclasses.asdict gives for these scalar fields, without its recursive deep copy
        return {f: getattr(self, f) for f in _FIELDS}


_FIELDS = tuple(f.name for f in fields(ScoreDrift))


def _interval_counts(ref: ScoreGrid, cur: ScoreGrid, bins: int, nr: int | None = None
                     ) -> tuple[np.ndarray, np.ndarray]:
    """Counts of both grids on ``bins`` intervals cut at the reference's quantiles (grid cell edges); ``nr``: the
    reference's count when known (its counts' sum: integers, so the same float as numpy's sum)."""
    rn, cn = ref.n, cur.n
    if rn.shape != cn.shape:
        raise ValueError(f"grids differ in shape: {rn.shape} vs {cn.shape}")
    cum = np.cumsum(rn) / (_sum(rn) if nr is None else float(nr))
    # np.unique of the (sorted) cut positions, those inside the grid, after a 0: a few Python ints
    size = rn.size
    starts = [0, *sorted({c for c in (np.searchsorted(cum, _levels(bins), side="left") + 1).tolist()
                          if 0 < c < size})]
    return _reduceat(rn, starts), _reduceat(cn, starts)


@functools.lru_cache(maxsize=16)
def _levels(bins: int) -> np.ndarray:
    """``np.arange(1, bins) / bins`` (read-only, cached per ``bins``)."""
    out = np.arange(1, bins) / bins
    out.flags.writeable = False
    return out


def _merge_small(r: np.ndarray, c: np.ndarray, minimum: float = 5.0) -> tuple[np.ndarray, np.ndarray]:
    """Merge adjacent intervals until every expected count (pooled share x sample size) is >= ``minimum``."""
    r, c, _ = _merge(r, c, _sum(r), _sum(c), minimum)
    return r, c


def _merge(r: np.ndarray, c: np.ndarray, rt: float, ct: float, minimum: float = 5.0
           ) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """:func:`_merge_small` given the sums ``rt`` and ``ct`` of ``r`` and ``c`` (integer counts: the sample
    sizes are the same floats); also returns, when nothing was merged, the pooled shares ``(r + c) / (rt + ct)``.
    """
    pooled = (r + c) / (rt + ct)
    share = pooled.tolist()  # Python floats: the same sums as numpy's scalars, cheaper
    need = minimum / max(min(rt, ct), 1.0)
    groups, acc, gid = [0] * len(share), 0.0, 0
    for i, s in enumerate(share):
        groups[i] = gid
        acc += s
        if acc >= need:
            gid, acc = gid + 1, 0.0
    if acc > 0 and gid > 0:  # fold a small tail into the last full group
        groups = [g - 1 if g == gid else g for g in groups]
    k = max(groups) + 1
    if k == len(groups):  # every interval its own group: bincount would copy the counts (all >= 0)
        return r, c, pooled
    return np.bincount(groups, r, minlength=k), np.bincount(groups, c, minlength=k), None


def score_drift(reference: ScoreGrid, current: ScoreGrid, *, bins: int = 10, counts: tuple[int, int] | None = None
                ) -> ScoreDrift:
    """Compare the score distributions of two grids of the same resolution (see the module docstring).

    ``counts``: the grids' event counts when the caller has them (``reference.count, current.count``).
    """
    nr, nc = counts if counts is not None else (reference.count, current.count)
    if nr == 0 or nc == 0:
        return ScoreDrift(float("nan"), float("nan"), 0, float("nan"), nr, nc)
    r, c = _interval_counts(reference, current, bins, nr)
    rs, cs = np.maximum(r / nr, _FLOOR), np.maximum(c / nc, _FLOOR)
    psi = float(_sum((cs - rs) * np.log(cs / rs)))
    r, c, pooled = _merge(r, c, float(nr), float(nc))
    if r.size < 2:
        return ScoreDrift(psi, 0.0, 0, 1.0, nr, nc)
    if pooled is None:
        pooled = (r + c) / (nr + nc)
    er, ec = pooled * nr, pooled * nc
    stat = float(_sum((r - er) ** 2 / er) + _sum((c - ec) ** 2 / ec))
    df = int(r.size - 1)
    # chdtrc is what scipy.stats.chi2.sf evaluates (without its ~0.1 ms of argument handling)
    return ScoreDrift(psi, stat, df, float(special.chdtrc(df, stat)), nr, nc)
