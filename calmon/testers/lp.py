"""Tester ``lp``: the multiclass l_p calibration error ``Err_p`` against a tolerance ``eps``.

An adapter from :class:`~calmon.stats.data.CalibrationData` (a window's level-set statistics,
or raw multiclass arrays) to :func:`calmon.algorithms.lp_errors.lp_test`.  It is listed in the
tester table of :mod:`calmon.testers`; this module registers nothing itself.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from calmon.algorithms.lp_errors import lp_test
from calmon.algorithms.lp_params import lambda_of
from calmon.stats.data import CalibrationData
from calmon.stats.levelset import LevelSetStats

__all__ = ["lp_tester"]


def lp_tester(data: CalibrationData, *, alpha: float, mc: int, rng: np.random.Generator, eps: float = 0.1,
              p: float = math.inf, lam: int | None = None) -> dict[str, Any]:
    """Tester ``lp``: Err_p vs ``eps`` from ``data.levelset`` (a window) or raw multiclass arrays.

    ``mc`` and ``rng`` are unused (the bounds are analytic).  The resolution is ``lam`` (default
    Algorithm 2's ``ceil(1/beta(eps, p))``); level-set statistics are coarsened to it when their
    lambda is a multiple of it, and used at their own lambda otherwise (the result's ``lam`` says
    which).

    Examples
    --------
    >>> data = CalibrationData(n=4000, probs=np.tile([[0.9, 0.1]], (4000, 1)),
    ...                        labels=np.repeat([0, 1], 2000), raw_is_complete=True)
    >>> res = lp_tester(data, alpha=0.05, mc=0, rng=np.random.default_rng(0))
    >>> res["decision"], res["source"], res["lam"]
    ('miscalibrated', 'raw', 10)
    """
    p = float(p)
    want = int(lam) if lam else lambda_of(eps, p)
    if data.levelset is not None:
        stats = data.levelset
        if want != stats.lam:
            if lam is not None and stats.lam % want:
                raise ValueError(f"tester 'lp': level-set statistics have lambda={stats.lam}, which is not a "
                                 f"multiple of lam={want}")
            if stats.lam % want == 0:
                stats = stats.coarsen(want)
        source = "levelset"
    elif data.probs is not None and data.labels is not None:
        probs = np.asarray(data.probs, dtype=np.float64)
        stats = LevelSetStats(probs.shape[1], want, pools=1)
        stats.update(probs, data.labels)
        source = "raw" if data.raw_is_complete else "reservoir"
    else:
        return {"method": "lp", "statistic": None, "p_value": None, "decision": "insufficient data",
                "reason": "needs multiclass probabilities and labels or level-set statistics"}
    out = lp_test(stats, eps=eps, p=p, alpha=alpha)
    out["source"] = source
    return out

