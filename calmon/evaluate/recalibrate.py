"""Scheduled recalibration inside the agent: refit on a window's reservoir, judge on held-out rows, publish.

The reservoir of the configured window (segment ``all``) is split into a training part and a
held-out part (every fifth row: reservoir order is random), and
:func:`calmon.calibration.refresh.refresh` fits the configured methods and publishes a new
revision to every configured publisher (a directory store, a Kafka compacted topic) only when
it beats the calibrator in service on the held-out rows.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence

import numpy as np

from calmon.calibration.base import Calibrator
from calmon.calibration.refresh import DirectoryStore, Publisher, refresh
from calmon.config import RecalibrationConfig
from calmon.evaluate.types import CalibratorInfo
from calmon.formats.jsonio import clean
from calmon.state.agentstate import WindowSnapshot
from calmon.stats.data import CalibrationData

log = logging.getLogger("calmon.agent")

__all__ = ["Recalibrator", "split_holdout"]

#: Every ``HOLDOUT_EVERY``-th reservoir row is held out.
HOLDOUT_EVERY = 5


def split_holdout(data: CalibrationData, every: int = HOLDOUT_EVERY) -> tuple[CalibrationData, CalibrationData]:
    """Split raw rows into (train, held-out): row ``i`` is held out when ``i % every == every - 1``.

    Examples
    --------
    >>> import numpy as np
    >>> d = CalibrationData(n=10, z=np.linspace(0, 1, 10), y=np.arange(10) % 2)
    >>> train, hold = split_holdout(d)
    >>> train.n, hold.n, hold.z.tolist()
    (8, 2, [0.4444444444444444, 1.0])
    """
    if data.z is None or data.y is None:
        raise ValueError("split_holdout needs raw rows (z, y)")
    cut = np.arange(len(data.z)) % every == every - 1

    def part(mask: np.ndarray) -> CalibrationData:
        return CalibrationData(n=int(mask.sum()), z=data.z[mask] if data.z is not None else None,
                               y=data.y[mask] if data.y is not None else None,
                               probs=None if data.probs is None else data.probs[mask],
                               labels=None if data.labels is None else data.labels[mask])

    return part(~cut), part(cut)


class Recalibrator:
    """Refits every ``rc.every`` seconds (the first time as soon as a model has data).

    Parameters
    ----------
    rc
        The ``recalibration`` configuration.
    publishers
        Where new revisions go (the first one that can ``load`` supplies the calibrator in service).
    monotonic, clock
        Clock for the period; wall clock for ``published_at``.
    """

    def __init__(self, rc: RecalibrationConfig, publishers: Sequence[Publisher],
                 monotonic: Callable[[], float] = time.monotonic, clock: Callable[[], float] = time.time) -> None:
        self.rc = rc
        self.clock = clock
        self.publishers = list(publishers)
        self.monotonic = monotonic
        self.last_refresh: float | None = None
        self._in_service: dict[str, tuple[int | None, Calibrator | None]] = {}

    def predictor(self, model: str) -> Callable[[np.ndarray], np.ndarray] | None:
        """The binary calibrator in service for ``model`` as a function of scores (``None``: raw scores).

        Read from the first publisher that can load documents, cached per revision; multiclass
        calibrators map whole probability vectors and do not apply to top-label confidences.
        """
        store = next((p for p in self.publishers if isinstance(p, DirectoryStore)), None)
        if store is None:
            return None
        rev = store.latest_revision(model)
        cached = self._in_service.get(model)
        if cached is None or cached[0] != rev:
            cal = store.load(model, rev) if rev is not None else None
            cached = self._in_service[model] = (rev, cal if cal is not None and cal.kind == "binary" else None)
        cal = cached[1]
        return None if cal is None else cal.predict

    def due(self) -> bool:
        return self.last_refresh is None or self.monotonic() - self.last_refresh >= self.rc.every

    def run(self, snap: Sequence[WindowSnapshot], calibrators: Mapping[str, CalibratorInfo]
            ) -> dict[str, CalibratorInfo]:
        """Refit every model with data in the configured window; returns the updated calibrators."""
        out = dict(calibrators)
        ran = False
        for w in snap:
            if w.segment != "all" or w.window != self.rc.window:
                continue
            data = w.bucket.stats.calibration_data()
            if data.z is None or len(data.z) < 10:
                continue
            ran = True
            got = self._refit(w.model, data)
            if got is not None and (got[1] or w.model not in out):
                out[w.model] = got[0]
        if ran:  # the period starts with the first refit on real data
            self.last_refresh = self.monotonic()
        return out

    def _refit(self, model: str, data: CalibrationData) -> tuple[CalibratorInfo, bool] | None:
        """The refit's record and whether it published a new revision (``None`` if fitting failed)."""
        train, hold = split_holdout(data)
        try:
            res = refresh(train, hold, self.rc.methods, model=model, publishers=self.publishers,
                          window={"name": self.rc.window}, limits=self.rc.options)
        except Exception as exc:  # noqa: BLE001 - fitting runs numerical code on live data; one model must not stop the round
            log.warning("recalibration of %s failed: %s", model, exc)
            return None
        # before/after are exported, checkpointed and served as JSON: cleaned as RefreshResult.to_dict() does
        info: CalibratorInfo = {"model": model, "method": res.method or "none", "version": res.revision,
                                "before": clean(res.before), "after": clean(res.after), "reason": res.reason,
                                "published_at": self.clock() if res.published else None}
        return info, res.published
