"""Change detection in the agent: one :class:`~calmon.algorithms.changepoint.CalibrationChangeDetector` per model.

Ingestion feeds every labeled pair of a batch (labeled events and joined predictions), of every
model, in one call (:meth:`ChangeMonitor.feed`), under the state lock, so the detectors are part of
the state: checkpointed with it and replayed exactly after a crash (their block sums are
fixed-point).  Binary models feed the score, multiclass models the top-label confidence with ``y``
= correct (:func:`calibration_pairs`).  Detections are exported as
``calmon_change_detected_total{model,signal}`` and ``calmon_change_point_timestamp_seconds``, and
judged by alert rules of kind ``change_detected``.

Examples
--------
>>> import numpy as np
>>> from calmon.config import ChangesConfig
>>> mon = ChangeMonitor(ChangesConfig(block=64))
>>> p, y = calibration_pairs(np.full(128, 0.7), None, np.ones(128, np.int64))
>>> mon.feed(["m"], np.zeros(128, np.int64), np.arange(128), np.arange(128.0), p, y)
>>> mon.view()["m"]["events"], sorted(mon.view()["m"]["signals"])
(128, ['confidence', 'high', 'residual'])
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from calmon.algorithms.changepoint import CalibrationChangeDetector
from calmon.config import ChangesConfig
from calmon.stats.model import top_label

__all__ = ["ChangeMonitor", "STATE_VERSION", "calibration_pairs"]

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

    def feed(self, names: Sequence[str], part: np.ndarray, index: np.ndarray, ts: np.ndarray, p: np.ndarray,
             y: np.ndarray) -> None:
        """Feed labeled pairs of several models (:func:`calibration_pairs`): pair ``j`` is model
        ``names[part[j]]``'s (a name may stand at several positions), completed by record ``index[j]`` of the
        batch at event time ``ts[j]``.

        Each model gets its pairs in record order (ties in the order given), and the detectors of new
        models are created in name order (the order a checkpoint lists them in), in one vectorised pass
        (:meth:`CalibrationChangeDetector.update_many`, issue #15).
        """
        if not self.cfg.enabled or not part.size:
            return
        every = sorted(set(names))
        rank = {n: i for i, n in enumerate(every)}
        code = np.array([rank[n] for n in names], dtype=np.int64)[part]
        order = np.lexsort((index, code))
        sc = code[order]
        present = np.unique(sc)
        bounds = [*np.searchsorted(sc, present).tolist(), sc.size]
        dets = [self._detector(every[i]) for i in present.tolist()]
        CalibrationChangeDetector.update_many(dets, bounds, p[order], y[order], ts[order])

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


def calibration_pairs(score: np.ndarray | None, probs: np.ndarray | None, labels: np.ndarray
                      ) -> tuple[np.ndarray, np.ndarray]:
    """What a detector reads of labeled events: the binary ``score`` and the label, or the top-label
    confidence of multiclass ``probs`` and whether the label is the top class (float64 outcomes)."""
    if probs is not None:
        return top_label(probs, np.asarray(labels, dtype=np.int64))
    if score is None:
        raise ValueError("calibration_pairs needs score or probs")
    return score, labels.astype(np.float64)
