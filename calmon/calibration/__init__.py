"""Recalibration maps (Platt, angular, temperature, histogram, isotonic, ...) and their JSON documents.

The registry is filled lazily: :func:`get_calibrator` imports the modules listed in
:data:`calmon.calibration.base.BUILTIN_MODULES`.
"""

from calmon.calibration.base import (
    CALIBRATORS,
    FORMAT,
    FORMAT_VERSION,
    Calibrator,
    CalibratorError,
    get_calibrator,
    load,
    load_builtin,
    make_calibrator,
    register_calibrator,
)

__all__ = [
    "CALIBRATORS",
    "FORMAT",
    "FORMAT_VERSION",
    "Calibrator",
    "CalibratorError",
    "get_calibrator",
    "load",
    "load_builtin",
    "make_calibrator",
    "register_calibrator",
]
