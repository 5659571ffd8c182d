"""Exact empirical smooth calibration error (smCE) and its tolerant / null-simulation testers.

The empirical smCE of predictions ``v`` with outcomes ``y`` is the value of the chain linear program
(paper eq. 11 restricted to adjacent constraints by Lemma 7)::

    smCE = max_{x in [-1, 1]^n} sum_i c_i x_i   s.t. |x_{i+1} - x_i| <= v_{i+1} - v_i,
    c_i = (y_i - v_i) / n,  v sorted.

The paper solves it approximately in O(n log n / eps).  Here it is solved *exactly* in O(n log n) by
the dual dynamic program of the spec (``shared/specs/smooth-calibration.md``): with ``C_i`` the
cumulative residual sums and ``d_i = v_{i+1} - v_i``,

    smCE = min_{z_0 = 0, z_n = C_n} sum_i |z_i - z_{i-1}| + sum_{i<n} d_i |z_i - C_i|.

The convex piecewise-linear cost-to-come ``F_i`` always has slope -1 left of its breakpoints and +1
right of them (total breakpoint weight 2).  A step adds ``d_i |z - C_i|`` (one breakpoint of weight
``2 d_i``) and then takes the infimal convolution with ``|.|`` -- which removes weight ``d_i`` from
each outer end.  ``F`` is stored as its left intercept plus the breakpoint weights (a list indexed
by the breakpoint's rank among all positions, known in advance), with a min-heap for the left end
and a max-heap for the right end split at the initial kink; removing weight ``r`` at position ``p``
from the left lowers the intercept by ``r p``.  Each step does one push and amortised O(1) pops.

The same DP serves weighted points (e.g. the cells of a :class:`~calmon.stats.grid.ScoreGrid`, each
with its exact residual sum ``sum y - sum z``): ties merge, only ``c`` changes.

References
----------
Hu, Tian, Yang. Testing Calibration in Subquadratic Time (2024): Definition 3 (smCE), eq. (11)
(empirical LP), Lemma 7 (adjacent constraints suffice), Lemma 12 (dCE/2 <= smCE <= 2 dCE),
Theorem 3 (tolerant tester).  Blasiok, Gopalan, Hu, Nakkiran. A unifying theory of distance from
calibration (STOC 2023) -- smooth calibration error.

Layout
------
:mod:`~calmon.algorithms.smooth.dp` (the exact DP on raw events or grid cells),
:mod:`~calmon.algorithms.smooth.lp` (HiGHS references and the witness),
:mod:`~calmon.algorithms.smooth.null` (null simulation, Theorem 3's tolerant rule).
The tester ``"smce"`` over these is :mod:`calmon.testers.smce`.
"""

from calmon.algorithms.smooth.dp import grid_points, smce, smce_grid, smce_points
from calmon.algorithms.smooth.lp import LP_MAX_POINTS, smce_chain_lp, smce_pairwise_lp, smce_witness
from calmon.algorithms.smooth.null import smce_null_pvalue, smce_null_pvalue_grid, smce_tolerant

__all__ = [
    "smce", "smce_points", "smce_grid", "grid_points", "smce_chain_lp", "smce_pairwise_lp", "smce_witness",
    "smce_null_pvalue", "smce_null_pvalue_grid", "smce_tolerant", "LP_MAX_POINTS",
]
