"""Before the labels arrive: a window's label-free estimates, their error once labels are in, and score drift.

From the window's prediction-side grid (every prediction, labelled or not) and the calibrator in
service (identity if none), :func:`calmon.algorithms.estimate.estimate_performance` gives the
metrics the window will show once its outcomes arrive, with prediction intervals.  The
estimation error is measured on the predictions whose outcomes have arrived: the same estimate
computed from their scores, minus their realised metrics -- near zero while the calibrator in
service is calibrated, growing when calibration drifts.  Score drift compares the window's
scores with everything before it (the ``all`` window minus this one, exact on integer grids).

Examples
--------
>>> import numpy as np
>>> from calmon.state.buckets import BucketStats
>>> from calmon.config import EstimationConfig
>>> b = BucketStats(2, bins=64, reservoir=0)
>>> z = np.linspace(0.05, 0.95, 400)
>>> b.update_predictions(z)
>>> out = window_estimates(b, None, EstimationConfig(), None)
>>> out["predictions"], round(out["estimated"]["accuracy"]["value"], 4)  # = mean(max(z, 1 - z))
(400, 0.7256)
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from calmon.algorithms.estimate import estimated, estimation_error
from calmon.algorithms.scoredrift import score_drift
from calmon.config import EstimationConfig
from calmon.state.buckets import BucketStats
from calmon.stats.grid import ScoreGrid

__all__ = ["window_estimates"]

Predictor = Callable[[np.ndarray], np.ndarray]


def window_estimates(bucket: BucketStats, reference: ScoreGrid | None, cfg: EstimationConfig,
                     predictor: Predictor | None, *, top_label: bool = False, min_events: int = 100) -> dict[str, Any]:
    """``predictions``, ``estimated`` {metric: {value, lo, hi}}, ``estimation_error`` and ``score_drift``."""
    pred = bucket.pred
    count = pred.count
    out: dict[str, Any] = {"predictions": count}
    threshold = 0.0 if top_label else cfg.threshold  # top-label: every prediction is a "positive" (correct or not)
    est = estimated(pred, threshold=threshold, calibrator=predictor, level=cfg.level)
    if est:
        out["estimated"] = est
    fine = bucket.stats.fine
    if fine.count >= max(min_events, 1):
        # expected (no interval needed here) minus realised, from one read of the labelled cells on the
        # prediction grid's resolution (the coarsened fine grid)
        out["estimation_error"] = estimation_error(fine, threshold=threshold, calibrator=predictor,
                                                   bins=min(fine.bins, pred.bins))
    if reference is not None and count >= min_events and (nr := reference.count) >= min_events:
        out["score_drift"] = score_drift(reference, pred, bins=cfg.drift_bins, counts=(nr, count)).to_dict()
    return out
