"""The sample sizes below which a scheduled refresh fits nothing: their one place, importable without the methods.

The configuration (:class:`calmon.config.schema.RecalibrationOptions`) extends :class:`RefreshLimits`, so it must be
cheap to import (no numpy, no scipy): ``calmon`` commands that only read a configuration stay fast.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["RefreshLimits", "DEFAULT_LIMITS"]


@dataclass(frozen=True)
class RefreshLimits:
    """Sample sizes below which :func:`calmon.calibration.refresh.refresh` fits and publishes nothing
    (``reason = "insufficient data"``).

    The one place of these defaults: the agent's ``recalibration.options``
    (:class:`calmon.config.schema.RecalibrationOptions`) extends this class.  They are sized for the
    agent's default reservoir of 256 rows, of which every fifth is held out
    (:func:`calmon.evaluate.recalibrate.split_holdout`): 205 training and 51 held-out rows, so a
    model with a full default reservoir is refitted; a larger ``models.<name>.reservoir`` (and
    ``min_holdout``) makes the held-out comparison less noisy.
    """

    #: Rows to fit on.
    min_train: int = 200
    #: Held-out rows the candidates are judged on.
    min_holdout: int = 50


#: The limits of :func:`refresh` when none are given.
DEFAULT_LIMITS = RefreshLimits()
