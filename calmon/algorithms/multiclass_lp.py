"""Multiclass calibration under the probability-weighted l_p error (Bairaktari & Nguyen).

This module gathers the public names of the l_p room; each concept lives in its own module:

* :mod:`calmon.algorithms.lp_params` -- ``beta``, ``lambda``, pools, Lemma 14's iteration cap,
  Lemmas 11/13's squared-error bound and Theorem 7's sample budget;
* :mod:`calmon.algorithms.lp_errors` -- the plug-in estimate of ``Err_p`` (Definition 6), the
  largest cell error, a debiased estimate of ``Err_2**2`` (from
  :class:`~calmon.stats.levelset.LevelSetStats` or raw arrays) and :func:`lp_test`, ``Err_p``
  against a tolerance ``eps`` with simultaneous empirical-Bernstein bounds;
* :mod:`calmon.algorithms.lp_map` -- :class:`LevelSetMap`, the calibrated map ``h``;
* :mod:`calmon.algorithms.lp_fit` -- Algorithm 2 (:func:`fit_lp`): Phase 1 heavy bins, groups G
  with predictions, power-of-two estimation pieces M with one sample pool per piece size and
  estimate type, optional seeded Laplace noise (Lemma 9), a priority queue of violations,
  merges, the iteration cap of Lemma 14, and the option to pass predictions in light bins
  through unchanged.

The tester ``"lp"`` (an adapter from :class:`~calmon.stats.data.CalibrationData` to
:func:`lp_test`) lives in :mod:`calmon.testers.lp`: this layer registers nothing.

Notation: ``K`` classes, bins ``v = R(f(x))`` with keys ``c = lambda v``.  For a bin v and class
j, ``Err(f, v, j) = |E[(f(x)_j - y_j) 1[R(f(x)) = v]]|`` and
``Err_p(f) = (sum_{v, j} Err(f, v, j)**p)**(1/p)`` (``max`` for p = inf).

References
----------
Bairaktari, Nguyen. Multiclass calibration under the probability-weighted l_p error (seeds 000 and
001 in ../shared/seeds): Definition 6 (Err_p), Algorithm 2, Theorem 7 (guarantee and sample
complexity), Lemmas 8-9 (estimates and pools), 11-13 (squared error), 14 (iteration cap).
Maurer, Pontil. Empirical Bernstein bounds and sample variance penalization. COLT 2009, Theorem 4.
"""

from __future__ import annotations

from calmon.algorithms.lp_errors import lp_error, lp_error_raw, lp_test
from calmon.algorithms.lp_fit import LPFit, LPGroup, LPPiece, fit_lp, fit_lp_raw
from calmon.algorithms.lp_map import LevelSetMap
from calmon.algorithms.lp_params import (
    R,
    beta_of,
    iteration_cap,
    lambda_of,
    pools_needed,
    squared_error_bound,
    theorem7_budget,
)
from calmon.algorithms.simplex import project_simplex
from calmon.stats.levelset import ROUND_TOL, default_pools, level_keys, rho, unique_keys

__all__ = [
    "ROUND_TOL", "R", "rho", "project_simplex", "level_keys", "beta_of", "lambda_of", "pools_needed",
    "lp_error", "lp_error_raw", "LevelSetMap", "LPFit", "LPGroup", "LPPiece", "fit_lp", "fit_lp_raw",
    "theorem7_budget", "squared_error_bound", "iteration_cap", "lp_test", "default_pools", "unique_keys",
]
