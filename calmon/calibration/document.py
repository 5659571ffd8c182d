"""Calibrator documents in: a JSON document (or file) -> the calibrator it describes, without executing code.

The method named in the document is looked up in the explicit table of
:mod:`calmon.calibration.registry`; parameters are checked by the method's ``from_params``.

Examples
--------
>>> import numpy as np
>>> from calmon.calibration import make_calibrator
>>> cal = make_calibrator("platt").fit(np.array([0.2, 0.8, 0.9, 0.3, 0.6]), np.array([0, 1, 1, 1, 0]))
>>> back = from_document(cal.to_document())
>>> type(back).__name__, bool(np.allclose(back.predict(np.array([0.5])), cal.predict(np.array([0.5]))))
('PlattCalibrator', True)
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from calmon.calibration.base import FORMAT, FORMAT_VERSION, Calibrator, CalibratorError
from calmon.calibration.registry import get_calibrator

__all__ = ["from_document", "load"]


def from_document(doc: Any) -> Calibrator:
    """Rebuild the calibrator a document describes (no code execution: the method must be registered)."""
    if not isinstance(doc, dict):
        raise CalibratorError(f"calibrator document must be a JSON object, got {type(doc).__name__}")
    if doc.get("format") != FORMAT:
        raise CalibratorError(f"not a calibrator document: format is {doc.get('format')!r}, expected {FORMAT!r}")
    version = doc.get("version")
    if not isinstance(version, int) or version < 1 or version > FORMAT_VERSION:
        raise CalibratorError(f"unsupported calibrator document version {version!r} (this build reads 1..."
                              f"{FORMAT_VERSION})")
    cls = get_calibrator(doc.get("method"))
    params = doc.get("params")
    if not isinstance(params, dict):
        raise CalibratorError("calibrator document has no 'params' object")
    try:
        cal = cls.from_params(params)
    except CalibratorError:
        raise
    except (KeyError, TypeError, ValueError) as exc:
        raise CalibratorError(f"invalid parameters for calibrator {cls.method!r}: {exc}") from exc
    cal.training = dict(doc.get("training") or {})
    classes = doc.get("classes")
    if classes is not None:
        cal.classes = int(classes)
    return cal


def load(path: str | os.PathLike[str]) -> Calibrator:
    """Load a calibrator from a JSON document file.

    Raises
    ------
    CalibratorError
        Not JSON, not a calibrator document, unsupported version, unknown method or bad parameters.
    """
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as exc:
        raise CalibratorError(f"cannot read calibrator {p}: {exc.strerror or exc}") from exc
    try:
        doc = json.loads(text, parse_constant=_reject_constant)
    except (json.JSONDecodeError, ValueError) as exc:
        raise CalibratorError(f"{p}: not valid JSON ({exc})") from exc
    return from_document(doc)


def _reject_constant(name: str) -> float:
    raise ValueError(f"non-finite number {name} in calibrator document")
