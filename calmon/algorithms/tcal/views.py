"""The class-wise view of multiclass T-Cal: each class's one-vs-rest probability tested, Bonferroni over classes.

Beside canonical calibration (:mod:`calmon.algorithms.tcal.multiclass`) practitioners look at two
one-dimensional views: *top-label* (the top probability against "the top class is right", the binary
:func:`~calmon.algorithms.tcal.tcal_test` on ``(max_k z_k, 1[y = argmax z])``) and *class-wise* (for every
class ``k`` the binary test of ``(z_k, 1[y = k])``).  Canonical calibration implies both; neither implies it.

The class-wise test runs the adaptive binary T-Cal of each class at level ``alpha / K`` and reports the
Bonferroni-adjusted p-value ``min(1, K min_k p_k)``: valid whatever the dependence between classes.

References
----------
Lee, Huang, Hassani, Dobriban. T-Cal (JMLR 2023): Section 2 (top-label and class-wise notions), Algorithm 2.
Kull et al. Beyond temperature scaling (NeurIPS 2019): class-wise calibration.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from calmon.algorithms.tcal.adaptive import tcal_test
from calmon.algorithms.tcal.estimators import n_levels
from calmon.algorithms.tcal.multiclass import check_probs

__all__ = ["classwise_tcal_test", "top_label_arrays"]


def top_label_arrays(probs: np.ndarray, labels: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Top-label confidence and correctness ``(max_k z_k, 1[y = argmax z])``.

    Examples
    --------
    >>> z, y = top_label_arrays(np.array([[0.2, 0.5, 0.3], [0.6, 0.3, 0.1]]), np.array([1, 2]))
    >>> z.tolist(), y.tolist()
    ([0.5, 0.6], [1.0, 0.0])
    """
    p, lab = check_probs(probs, labels)
    top = p.argmax(axis=1)
    return p[np.arange(p.shape[0]), top], (top == lab).astype(np.float64)


def classwise_tcal_test(probs: np.ndarray, labels: np.ndarray, *, alpha: float = 0.05, mc: int = 2000,
                        rng: np.random.Generator | int | None = None, max_classes: int = 100,
                        stop_early: bool = True) -> dict[str, Any]:
    """Class-wise T-Cal: the adaptive binary test of every class's one-vs-rest probability, Bonferroni over K.

    Parameters
    ----------
    probs, labels
        Probability vectors ``(n, K)`` and class indices.
    alpha, mc, rng
        Level of the combined test, Monte Carlo draws per class test (at least ``2 K L / alpha`` for ``L``
        levels, so that ``alpha / (K L)`` is resolved), generator or seed.
    max_classes
        Test at most this many classes (the most frequent by mean predicted probability); the Bonferroni
        factor is still K, so the test stays valid, only less powerful for the classes left out.
    stop_early
        Stop at the first class that rejects at ``alpha / K``: the decision is settled and ``K p_k`` of that
        class is a valid (conservative) p-value; a rejecting class's Monte Carlo test cannot be curtailed,
        so this saves up to K - 1 full simulations.  Classes are visited in order of their Cantelli bound.

    Returns
    -------
    dict with ``statistic`` (DPE of the most significant class, scalar convention), ``p_value``
    (``min(1, K min_k p_k)``), ``decision``, ``method`` (``"classwise-bonferroni"``), ``classes``,
    ``tested_classes``, ``class_p_values`` (per tested class, ``None`` when a class cannot be tested),
    ``worst_class``.

    Examples
    --------
    >>> rng = np.random.default_rng(0)
    >>> p = rng.dirichlet(np.ones(3), size=3000)
    >>> y = (rng.random((3000, 1)) > p.cumsum(axis=1)).sum(axis=1)
    >>> classwise_tcal_test(p, y, rng=1)["decision"]
    'calibrated'
    >>> q = p.copy(); q[:, 0] += 0.1; q /= q.sum(axis=1, keepdims=True)  # class 0 over-predicted
    >>> classwise_tcal_test(q, y, rng=1)["decision"]
    'miscalibrated'

    References
    ----------
    T-Cal paper, Algorithm 2 per class; Bonferroni over classes.
    """
    p, lab = check_probs(probs, labels)
    n, k = p.shape
    if int(max_classes) < 1:
        raise ValueError(f"max_classes must be >= 1, got {max_classes!r}")
    gen = rng if isinstance(rng, np.random.Generator) else np.random.default_rng(rng)
    chosen = np.sort(np.argsort(-p.mean(axis=0), kind="stable")[: int(max_classes)])
    onehot = [(lab == j).astype(np.float64) for j in chosen]
    order = np.argsort([_cantelli(p[:, j], yj, alpha / k) for j, yj in zip(chosen, onehot)], kind="stable")
    pvals: list[float | None] = [None] * chosen.size
    stats: list[float | None] = [None] * chosen.size
    # draws enough to resolve alpha / (K L) twice over, not the binary test's 20 times: a class near its
    # threshold cannot be curtailed, and K of them would cost K full 20 K L / alpha simulations
    draws = max(int(mc), math.ceil(2 * k * n_levels(max(n, 1)) / alpha))
    for i in order:
        res = tcal_test(p[:, chosen[i]], onehot[i], alpha=alpha / k, mc=draws, rng=gen, method="mc-raw",
                        min_resolution=False)
        pvals[i], stats[i] = res.get("p_value"), res.get("statistic")
        if stop_early and res["decision"] == "miscalibrated":
            break
    usable = [(pv, j) for j, pv in enumerate(pvals) if pv is not None]
    out: dict[str, Any] = {"method": "classwise-bonferroni", "alpha": alpha, "n": int(n), "classes": int(k),
                           "tested_classes": [int(c) for c in chosen], "class_p_values": pvals,
                           "class_statistics": stats, "stopped_early": any(v is None for v in pvals)}
    if not usable:
        return {**out, "statistic": None, "p_value": None, "decision": "insufficient data", "worst_class": None}
    best_p, best = min(usable)
    adjusted = float(min(1.0, k * best_p))
    return {**out, "statistic": stats[best], "p_value": adjusted, "worst_class": int(chosen[best]),
            "decision": "miscalibrated" if adjusted <= alpha else "calibrated"}


def _cantelli(z: np.ndarray, y: np.ndarray, alpha: float) -> float:
    """The exact Cantelli p-value of a class's test (cheap; orders the classes most significant first)."""
    res = tcal_test(z, y, alpha=alpha, method="cantelli")
    pv = res.get("p_value")
    return 1.0 if pv is None else float(pv)
