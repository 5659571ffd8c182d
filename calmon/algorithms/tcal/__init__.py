"""T-Cal: debiased l2-ECE and the adaptive calibration test (Lee, Huang, Hassani, Dobriban, JMLR 2023).

Convention
----------
Binary predictors (and top-label confidence with ``y`` = correct) use the *scalar* form of the
authors' code: ``z = P(y = 1)``, residual ``r = y - z``.  The paper's one-hot form for K = 2 counts both
coordinates and is exactly **twice** the scalar value; :func:`theorem3_threshold` converts.  For K > 2
(:func:`ece2_multiclass_raw`) the one-hot form is used with cube cells ``floor(m z_k)`` (clipped).

Per cell ``i`` (``N_i`` events, ``S_i = sum r``, ``Q_i = sum r**2``):

* plug-in, eq. (5):   ``T^b = (1/n) sum_{N_i >= 1} S_i**2 / N_i``
* debiased (DPE), eq. (6): ``T^d = (1/n) sum_{N_i >= 1} (S_i**2 - Q_i) / N_i``

From a :class:`~calmon.stats.grid.ScoreGrid`: ``S = sum_y - sum_z``, ``Q = sum_y - 2 sum_zy + sum_zz``.
Under calibration and conditionally on the scores, ``E T^d = 0`` and
``Var T^d = (2/n**2) sum_i (V_i**2 - W_i) / N_i**2`` with ``V = sum z(1-z)`` (= ``sum_z - sum_zz``) and
``W = sum (z(1-z))**2`` (= ``sum_vv``): exact, and available from the grid.

Critical values
---------------
``"mc-raw"`` (a)
    Y-only Monte Carlo on raw scores (full data or a reservoir sample): keep ``z``, draw ``y* ~ Ber(z)``.
    Observed and simulated statistics are exchangeable under the null, so the rank p-value
    ``(1 + #{T* >= T}) / (R + 1)`` is exact (Appendix C.3).  Identical scores are grouped into atoms and
    drawn as ``Bin(count, z)`` -- still exact.
``"mc-grid"`` (b)
    The same on the fine grid: per non-empty fine cell ``k ~ Bin(N, zbar)``; every coarser level is
    aggregated from the same draws (joint null across levels).  Approximate (the within-cell spread of
    ``z`` is ignored; the binomial slightly over-disperses, which errs on the conservative side);
    the error shrinks with the cell width.
``"cantelli"`` (c)
    One-sided Chebyshev (Cantelli) bound ``P(T >= t) <= s2 / (s2 + t**2)`` with the exact null variance
    ``s2``: a valid, conservative p-value needing no simulation.
``"theorem3"`` (c)
    The closed-form threshold of Theorem 3, ``sqrt(2 K**2 / a) * min(m**((K-1)/2) / n, m**(-(K-1)/2))``
    (one-hot units), turned into a p-value ``min(1, 2 K**2 c**2 / T_onehot**2)``.

``"moment3"``
    Pearson's three-moment chi-square approximation with the exact null variance and third cumulant
    ``E T^3 = (8/n^3) sum_i (e2(mu3) + 6 e3(v)) / N_i^3`` (``e_k`` elementary symmetric polynomials of the
    ``v_j = z_j(1-z_j)`` and ``mu3_j = v_j (1 - 2 z_j)`` in bin ``i``).  Not exact, but in our checks within
    Monte Carlo error of 20,000 draws down to p ~ 1e-3.

Combining levels
----------------
``combine="bonferroni"`` is Algorithm 2 (level ``alpha / L`` per scale).  ``combine="minp"`` is a max-type
combination over the joint null: ``M = min_b q_b(T_b)`` with ``q_b`` the three-moment tail of level ``b``
(a fixed continuous transform given the scores), and the exact Monte Carlo rank p-value of ``M``.
The canonical multiclass test (:func:`canonical_tcal_test`) uses min-p by default, with the third cumulant
of each level estimated on an independent pilot batch of null draws (the transform is fixed before the
counted draws, so the rank p-value stays exact).

Speed
-----
Monte Carlo is *curtailed*: draws stop as soon as no level can reach rejection any more (every level
has more than ``alpha_b (R + 1) - 1`` exceedances); the reported p-value of such a level is the
Besag-Clifford sequential p-value ``h / L``, which is valid, and the decision is identical to that of
the full ``R``-draw test on the same random stream.  With ``screen=True`` the exact Cantelli bound is
tried first (when it already rejects, no simulation is run), then the three-moment approximation: when it
puts every level's p-value above ``accept_margin`` (2) times the level's alpha, the test accepts without
simulating.  Rejections therefore always come from an exact bound or the exact Monte Carlo test.

References
----------
Lee, Huang, Hassani, Dobriban. T-Cal: An optimal test for the calibration of predictive models.
JMLR 24 (2023): eqs. (5)-(7), Algorithms 1-2, Theorems 3 and 5, Appendix B.4 and C.3.
Besag, Clifford. Sequential Monte Carlo p-values. Biometrika 78 (1991).
Westfall, Young. Resampling-based multiple testing (1993): min-p combinations over a joint null.

Layout
------
:mod:`~calmon.algorithms.tcal.estimators` (plug-in / debiased estimates, null variance, scale rules, cell sums of
every level at once),
:mod:`~calmon.algorithms.tcal.tails` (Cantelli bound, three-moment approximation),
:mod:`~calmon.algorithms.tcal.atoms` (the Monte Carlo engine: atoms and levels, and its kernel
:class:`~calmon.algorithms.tcal.atoms.Simulator`: draws and level statistics in place),
:mod:`~calmon.algorithms.tcal.adaptive` (:func:`tcal_test`, one function per critical-value method),
:mod:`~calmon.algorithms.tcal.multiclass` (:func:`canonical_tcal_test`: K > 2, cube cells of the simplex,
Y-only ``Categorical(z)`` Monte Carlo) and :mod:`~calmon.algorithms.tcal.views` (:func:`classwise_tcal_test`,
top-label arrays).
The tester ``"tcal"`` over these is :mod:`calmon.testers.tcal`.
"""

from calmon.algorithms.tcal.adaptive import (
    COMBINES,
    CRITICAL_VALUES,
    METHODS,
    SimulationNeeded,
    insufficient_result,
    tcal_test,
)
from calmon.algorithms.tcal.atoms import simulate_null
from calmon.algorithms.tcal.estimators import (
    ece2_grid,
    ece2_multiclass_raw,
    ece2_raw,
    grid_cells,
    n_levels,
    null_variance_grid,
    null_variance_raw,
    theorem3_bins,
    theorem3_threshold,
)
from calmon.algorithms.tcal.multiclass import canonical_tcal_test
from calmon.algorithms.tcal.tails import cantelli_pvalue, three_moment_pvalue
from calmon.algorithms.tcal.views import classwise_tcal_test, top_label_arrays

__all__ = [
    "METHODS", "COMBINES", "CRITICAL_VALUES", "SimulationNeeded", "n_levels", "theorem3_bins", "theorem3_threshold",
    "ece2_raw", "null_variance_raw", "ece2_multiclass_raw", "grid_cells", "ece2_grid", "null_variance_grid",
    "cantelli_pvalue", "three_moment_pvalue", "simulate_null", "tcal_test", "insufficient_result",
    "canonical_tcal_test", "classwise_tcal_test", "top_label_arrays",
]
