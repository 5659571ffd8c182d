"""Validation of calibrator inputs and of the parameters stored in calibrator documents.

Every ``from_params`` validates each value it reads (a document is untrusted input) and raises
:class:`~calmon.calibration.base.CalibratorError`; ``fit``/``predict`` validate their arrays and
raise ``ValueError``.

Examples
--------
>>> param_float({"A": 1.5}, "A", lo=0.0)
1.5
>>> param_float({"A": "1"}, "A")
Traceback (most recent call last):
...
calmon.calibration.base.CalibratorError: parameter 'A' must be a finite number in [-inf, inf], got '1'
>>> check_binary([0.2, 0.9], [0, 1])[1].tolist()
[0.0, 1.0]
"""

from __future__ import annotations

import math
from typing import Any, overload

import numpy as np
from numpy.typing import ArrayLike

from calmon.calibration.base import CalibratorError

__all__ = ["param_float", "param_choice", "param_array", "check_binary", "check_multiclass", "grid_cells"]


def param_float(params: dict[str, Any], key: str, *, lo: float = -math.inf, hi: float = math.inf) -> float:
    """A finite float parameter within [lo, hi] (raises :class:`CalibratorError`)."""
    v = params.get(key)
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or not lo <= v <= hi:
        raise CalibratorError(f"parameter {key!r} must be a finite number in [{lo}, {hi}], got {v!r}")
    return float(v)


def param_choice(params: dict[str, Any], key: str, choices: tuple[str, ...]) -> str:
    """A string parameter among ``choices``."""
    v = params.get(key)
    if v not in choices:
        raise CalibratorError(f"parameter {key!r} must be one of {choices}, got {v!r}")
    return str(v)


def param_array(params: dict[str, Any], key: str, *, ndim: int = 1, min_len: int = 1) -> np.ndarray:
    """A finite float array parameter (list in JSON)."""
    v = params.get(key)
    try:
        a = np.asarray(v, dtype=np.float64)
    except (TypeError, ValueError):
        raise CalibratorError(f"parameter {key!r} must be a numeric array, got {type(v).__name__}") from None
    if a.ndim != ndim or a.shape[0] < min_len or not np.isfinite(a).all():
        raise CalibratorError(f"parameter {key!r} must be a finite {ndim}-d array with >= {min_len} entries")
    return a


@overload
def check_binary(x: ArrayLike, y: None = None, sample_weight: ArrayLike | None = None,
                 name: str = "scores") -> tuple[np.ndarray, None, np.ndarray | None]: ...


@overload
def check_binary(x: ArrayLike, y: ArrayLike, sample_weight: ArrayLike | None = None,
                 name: str = "scores") -> tuple[np.ndarray, np.ndarray, np.ndarray | None]: ...


def check_binary(x: Any, y: Any = None, sample_weight: Any = None,
                 name: str = "scores") -> tuple[np.ndarray, np.ndarray | None, np.ndarray | None]:
    """Validate binary inputs: scores in [0, 1], labels in {0, 1}, non-negative weights; same length."""
    x = np.asarray(x, dtype=np.float64)
    if x.ndim != 1:
        raise ValueError(f"{name} must be a 1-d array, got shape {x.shape}")
    if not np.isfinite(x).all() or (x < 0).any() or (x > 1).any():
        raise ValueError(f"{name} must be finite probabilities in [0, 1]")
    yy = None
    if y is not None:
        yy = np.asarray(y, dtype=np.float64)
        if yy.shape != x.shape:
            raise ValueError(f"labels have shape {yy.shape}, {name} have {x.shape}")
        if not np.isin(yy, (0.0, 1.0)).all():
            raise ValueError("binary labels must be 0 or 1")
    w = None
    if sample_weight is not None:
        w = np.asarray(sample_weight, dtype=np.float64)
        if w.shape != x.shape or not np.isfinite(w).all() or (w < 0).any():
            raise ValueError("sample_weight must be finite, non-negative and the same length as the scores")
    return x, yy, w


@overload
def check_multiclass(p: ArrayLike, labels: None = None) -> tuple[np.ndarray, None]: ...


@overload
def check_multiclass(p: ArrayLike, labels: ArrayLike) -> tuple[np.ndarray, np.ndarray]: ...


def check_multiclass(p: Any, labels: Any = None) -> tuple[np.ndarray, np.ndarray | None]:
    """Validate multiclass inputs: probabilities (n, K >= 2), rows in the simplex (tol 1e-3); labels in 0..K-1."""
    p = np.asarray(p, dtype=np.float64)
    if p.ndim != 2 or p.shape[1] < 2:
        raise ValueError(f"probabilities must have shape (n, K) with K >= 2, got {p.shape}")
    if not np.isfinite(p).all() or (p < 0).any() or (np.abs(p.sum(axis=1) - 1.0) > 1e-3).any():
        raise ValueError("probability rows must be finite, non-negative and sum to 1 (tolerance 1e-3)")
    lab = None
    if labels is not None:
        lab_f = np.asarray(labels)
        if lab_f.shape != (p.shape[0],):
            raise ValueError(f"labels have shape {lab_f.shape}, expected ({p.shape[0]},)")
        lab = lab_f.astype(np.int64)
        if (lab != lab_f).any() or (lab < 0).any() or (lab >= p.shape[1]).any():
            raise ValueError(f"labels must be class indices in 0..{p.shape[1] - 1}")
    return p, lab


def grid_cells(grid: Any, what: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Counts, mean scores and positive fractions of the non-empty cells of a single-channel grid.

    ``what`` names the method in the errors (a multi-channel or an empty grid cannot be fitted).
    """
    if getattr(grid, "channels", None) is not None:
        raise ValueError(f"{what} from a grid needs a single-channel grid")
    n = grid.n
    keep = n > 0
    if not keep.any():
        raise ValueError(f"cannot fit {what} on an empty grid")
    return n[keep], np.clip(grid.sum_z[keep] / n[keep], 0.0, 1.0), np.clip(grid.sum_y[keep] / n[keep], 0.0, 1.0)

