"""calmon: a streaming calibration monitor for production machine learning.

The Python API (:mod:`calmon.api`) is imported on first use, so ``import calmon`` (and ``calmon --version``)
stays light:

>>> import calmon
>>> calmon.check, calmon.fit  # doctest: +ELLIPSIS
(<function check at ...>, <function fit at ...>)
"""

import importlib
from typing import Any

__version__ = "0.1.0"

#: Names of :mod:`calmon.api` reachable as ``calmon.NAME``.
_API = ("check", "fit", "load_calibrator", "CheckResult", "FittedCalibrator")


def __getattr__(name: str) -> Any:
    if name in _API:  # by name, not an import statement: every `from calmon import __version__` stays light
        return getattr(importlib.import_module("calmon.api"), name)
    raise AttributeError(f"module 'calmon' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted([*globals(), *_API])
