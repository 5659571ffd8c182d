"""Change detection in the agent: one :class:`~calmon.algorithms.changepoint.CalibrationChangeDetector` per model.

Ingestion feeds every labeled pair (labeled events and joined predictions) in record order,
under the state lock, so the detectors are part of the state: checkpointed with it and replayed
exactly after a crash (their block sums are fixed-point).  Binary models feed the score,
multiclass models the top-label confidence with ``y`` = correct.  Detections are exported as
``calmon_change_detected_total{model,signal}`` and ``calmon_change_point_timestamp_seconds``, and
judged by alert rules of kind ``change_detected``.

Examples
--------
>>> import numpy as np
>>> from calmon.config import ChangesConfig
>>> mon = ChangeMonitor(ChangesConfig(block=64))
>>> mon.update("m", np.full(128, 0.7), None, np.ones(128, np.int64), np.arange(128.0))
>>> mon.view()["m"]["events"], sorted(mon.view()["m"]["signals"])
(128, ['confidence', 'high', 'residual'])
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np

from calmon.algorithms.changepoint import CalibrationChangeDetector
from calmon.config import ChangesConfig

__all__ = ["ChangeMonitor", "STATE_VERSION"]

STATE_VERSION = 1


class ChangeMonitor:
    """Per-model detectors (created on a model's first labeled pair; bounded by ``limits.max_models``)."""

    def __init__(self, cfg: ChangesConfig) -> None:
        self.cfg = cfg
        self.detectors: dict[str, CalibrationChangeDetector] = {}

    def _detector(self, model: str) -> CalibrationChangeDetector:
        det = self.detectors.get(model)
        if det is None:
            c = self.cfg
            det = self.detectors[model] = CalibrationChangeDetector(c.block, c.delta, c.threshold,
                                                                    signals=tuple(c.signals))
        return det

    def update(self, model: str, score: np.ndarray | None, probs: np.ndarray | None, labels: np.ndarray,
               ts: np.ndarray) -> None:
        """Feed labeled pairs of ``model`` in record order (binary ``score`` or multiclass ``probs``)."""
        if not self.cfg.enabled or labels.size == 0:
            return
        if probs is not None:
            top = np.argmax(probs, axis=1)
            p = probs[np.arange(top.size), top]
            y = (top == labels).astype(np.float64)
        elif score is not None:
            p, y = score, labels.astype(np.float64)
        else:
            raise ValueError("ChangeMonitor.update needs score or probs")
        self._detector(model).update(p, y, ts)

    def update_many(self, models: Sequence[str], bounds: Sequence[int], score: np.ndarray, labels: np.ndarray,
                    ts: np.ndarray) -> None:
        """Feed binary models at once: ``models[i]`` gets the pairs ``bounds[i]:bounds[i + 1]`` (record order, at
        least one each), the same as :meth:`update` model by model (issue #15: one vectorised pass a batch).

        Detectors are created in the order of ``models``.
        """
        if not self.cfg.enabled or not models:
            return
        dets = [self._detector(m) for m in models]
        CalibrationChangeDetector.update_many(dets, bounds, score, labels.astype(np.float64), ts)

    def touch(self, models: Iterable[str]) -> None:
        """Create the detectors of ``models`` in this order, if enabled (the order a checkpoint lists them in)."""
        if self.cfg.enabled:
            for m in models:
                self._detector(m)

    def view(self) -> dict[str, dict[str, Any]]:
        """Per model: events seen and, per signal, detections and the last change (JSON)."""
        out: dict[str, dict[str, Any]] = {}
        for model, det in sorted(self.detectors.items()):
            out[model] = {"events": det.events, "signals": {
                s: {"detections": det.detections.get(s, 0),
                    "last": det.last[s].to_dict() if s in det.last else None} for s in det.signals}}
        return out

    def to_dict(self) -> dict[str, Any]:
        return {"version": STATE_VERSION, "models": {m: d.to_dict() for m, d in self.detectors.items()}}

    def load(self, d: Mapping[str, Any] | None) -> None:
        """Restore :meth:`to_dict` (``None``: a checkpoint written before change detection existed)."""
        self.detectors = {}
        if not d:
            return
        if d.get("version") != STATE_VERSION:
            raise ValueError(f"changes: state version {d.get('version')!r}, expected {STATE_VERSION}")
        self.detectors = {str(m): CalibrationChangeDetector.from_dict(v) for m, v in d["models"].items()}
