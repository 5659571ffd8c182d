"""Recalibration maps (Platt, angular, temperature, histogram, isotonic, polynomial, scaling-binning, l_p) and
their JSON documents.

* :mod:`~calmon.calibration.base` -- the :class:`Calibrator` interface and the versioned document;
* :mod:`~calmon.calibration.document` -- a document (or file) back to its calibrator (:func:`load`);
* :mod:`~calmon.calibration.params` -- validation of inputs and of stored parameters;
* :mod:`~calmon.calibration.registry` -- the explicit table of methods, :func:`get_calibrator`,
  :func:`make_calibrator`, :func:`check_methods`;
* one module per method (``platt``, ``angular``, ``temperature``, ``histogram``, ``isotonic``, ``polynomial``,
  ``scaling_binning``, ``lp``);
* scheduled refresh: :mod:`~calmon.calibration.metrics` (held-out errors),
  :mod:`~calmon.calibration.split` (hash splits), :mod:`~calmon.calibration.store` (publishers and the
  directory store), :mod:`~calmon.calibration.refresh` (fit, compare, publish).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from calmon.calibration.base import FORMAT, FORMAT_VERSION, Calibrator, CalibratorError
    from calmon.calibration.document import from_document, load
    from calmon.calibration.registry import (
        CALIBRATORS,
        MethodSpec,
        check_methods,
        get_calibrator,
        make_calibrator,
        register_calibrator,
    )

# The names below are imported on first use (PEP 562): importing a light submodule (``limits``) or the package
# does not load every method and scipy.
_WHERE = {"FORMAT": "base", "FORMAT_VERSION": "base", "Calibrator": "base", "CalibratorError": "base",
          "from_document": "document", "load": "document", "CALIBRATORS": "registry", "MethodSpec": "registry",
          "check_methods": "registry", "get_calibrator": "registry", "make_calibrator": "registry",
          "register_calibrator": "registry"}


def __getattr__(name: str) -> Any:
    if name in _WHERE:
        return getattr(importlib.import_module(f"calmon.calibration.{_WHERE[name]}"), name)
    raise AttributeError(f"module 'calmon.calibration' has no attribute {name!r}")


__all__ = [
    "CALIBRATORS",
    "FORMAT",
    "FORMAT_VERSION",
    "Calibrator",
    "CalibratorError",
    "MethodSpec",
    "check_methods",
    "from_document",
    "get_calibrator",
    "load",
    "make_calibrator",
    "register_calibrator",
]
