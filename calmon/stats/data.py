"""The data a calibration tester or calibrator may use: a typed bundle of statistics and raw arrays."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from calmon.stats.grid import ScoreGrid
from calmon.stats.levelset import LevelSetStats

__all__ = ["CalibrationData"]


@dataclass
class CalibrationData:
    """What a tester may use; any field but ``n`` may be ``None``.

    Attributes
    ----------
    n
        Number of events the data summarises (the window's count, not the reservoir's).
    grid
        Fine grid of binary scores, or of top-label confidence with ``y`` = correct.
    z, y
        Raw binary scores (or top-label confidence) and 0/1 outcomes: the full data from a
        file, or a uniform reservoir sample of a window.
    probs, labels
        Raw multiclass probabilities ``(m, K)`` and class indices, full data or reservoir.
    levelset
        Multiclass level-set statistics (see :mod:`calmon.stats.levelset`).
    raw_is_complete
        True when ``z``/``y`` (or ``probs``/``labels``) hold every event, not a sample.

    Examples
    --------
    >>> d = CalibrationData(n=3, z=np.array([0.2, 0.5, 0.9]), y=np.array([0.0, 1.0, 1.0]), raw_is_complete=True)
    >>> d.n, d.grid is None
    (3, True)
    """

    n: int
    grid: ScoreGrid | None = None
    z: np.ndarray | None = None
    y: np.ndarray | None = None
    probs: np.ndarray | None = None
    labels: np.ndarray | None = None
    levelset: LevelSetStats | None = None
    raw_is_complete: bool = False
