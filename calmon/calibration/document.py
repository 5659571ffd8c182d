"""Calibrator documents in: a JSON document (or file) -> the calibrator it describes, without executing code.

The document's fields are checked by the :class:`CalibratorDocument` struct (msgspec; fields not listed,
such as ``evaluation`` or ``created_at``, are allowed), the method named in it is looked up in the explicit
table of :mod:`calmon.calibration.registry`, and its parameters are checked by the method's ``from_params``.

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

import msgspec

from calmon.calibration.base import FORMAT, FORMAT_VERSION, Calibrator, CalibratorError
from calmon.calibration.registry import get_calibrator

__all__ = ["CalibratorDocument", "from_document", "load"]


class CalibratorDocument(msgspec.Struct):
    """The fields of a calibrator document this module reads (``Calibrator.to_document`` writes them)."""

    format: str
    version: int
    method: str
    params: dict[str, Any]
    training: dict[str, Any] | None = None
    classes: int | None = None


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
    try:
        got = msgspec.convert(doc, CalibratorDocument)
    except msgspec.ValidationError as exc:
        raise CalibratorError(_field_error(str(exc))) from None
    cls = get_calibrator(got.method)
    try:
        cal = cls.from_params(got.params)
    except CalibratorError:
        raise
    except (KeyError, TypeError, ValueError) as exc:
        raise CalibratorError(f"invalid parameters for calibrator {cls.method!r}: {exc}") from exc
    cal.training = dict(got.training or {})
    if got.classes is not None:
        cal.classes = got.classes
    return cal


def _field_error(message: str) -> str:
    """msgspec's ``Expected `object`, got `array` - at `$.params``` as ``calibrator document field params: ...``
    (the document is flat: a field is a top-level key)."""
    why, _, at = message.partition(" - at `$.")
    why = why[:1].lower() + why[1:]
    return f"calibrator document field {at.rstrip('`')}: {why}" if at else f"calibrator document: {why}"


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
