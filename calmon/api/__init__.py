"""calmon's Python API, for notebooks and scripts: :func:`check` and :func:`fit` on DataFrames or arrays.

They run the command line's own code (``calmon check``, ``calmon fit``, ``calmon apply``) on in-memory data:
``calmon.check(df).to_dict()`` is the document ``calmon check --json`` prints for the same rows in a file, and
``calmon.fit(df, method=...).save(path)`` writes the document of ``calmon fit -o path``. ``import calmon`` stays
light: ``calmon.check`` imports this package on first use (docs/api.md).
"""

from calmon.api.checker import CheckResult, check
from calmon.api.fitter import FittedCalibrator, fit, load_calibrator

__all__ = ["CheckResult", "FittedCalibrator", "check", "fit", "load_calibrator"]
