"""Calibrator interface, registry and the versioned JSON calibrator document.

A calibrator maps model outputs to recalibrated outputs:

* binary (``kind = "binary"``): scores ``P(y = 1)`` (or top-label confidence) of shape ``(n,)``
  to calibrated scores of shape ``(n,)``;
* multiclass (``kind = "multiclass"``): probability matrices ``(n, K)`` to probability
  matrices ``(n, K)``.

Every calibrator is fully described by :meth:`Calibrator.get_params` (a JSON-able dict of
options and fitted values) and rebuilt by :meth:`Calibrator.from_params`; nothing is pickled and
loading never executes code: the document names a ``method`` that must be a registered class.

Document format (``format = "calmon.calibrator"``, ``version = 1``)::

    {"format": "calmon.calibrator", "version": 1,
     "method": "platt", "kind": "binary", "classes": 2,
     "params": {...},                      # Calibrator.get_params()
     "training": {"n": 2000, "source": "raw", "window": {...}, ...},
     "evaluation": {"before": {"nll": ..., "ece": ...}, "after": {...}, "n": ...},
     "created_at": "2026-01-01T00:00:00Z", "calmon_version": "0.1.0", "info": {...}}

Writing a new calibrator
------------------------
Subclass :class:`Calibrator`, set ``method`` and ``kind``, implement ``fit`` (and optionally
``fit_grid`` for binned statistics or override ``fit_data``), ``predict``, ``get_params`` and
``from_params``, and decorate the class with ``@register_calibrator``.  Put the module name in
:data:`BUILTIN_MODULES` (modules that do not exist are skipped, so optional calibrators such as
``calmon.calibration.lp`` are picked up when present).
"""

from __future__ import annotations

import datetime as _dt
import importlib
import json
import math
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any, ClassVar, TypeVar

import numpy as np

FORMAT = "calmon.calibrator"
FORMAT_VERSION = 1
KINDS = ("binary", "multiclass")

#: Modules that register the built-in calibrators when imported (missing ones are skipped).
BUILTIN_MODULES: tuple[str, ...] = (
    "calmon.calibration.platt",
    "calmon.calibration.angular",
    "calmon.calibration.temperature",
    "calmon.calibration.histogram",
    "calmon.calibration.isotonic",
    "calmon.calibration.lp",
)

#: Registered calibrator classes by method name (fill with :func:`register_calibrator`).
CALIBRATORS: dict[str, type[Calibrator]] = {}

C = TypeVar("C", bound="type[Calibrator]")


class CalibratorError(ValueError):
    """A calibrator document or parameter set is invalid (unknown method, bad version, bad values)."""


class Calibrator:
    """Base class of all recalibration maps.

    Class attributes
    ----------------
    method
        Registry name, stored in the document (e.g. ``"platt"``).
    kind
        ``"binary"`` (scores -> scores) or ``"multiclass"`` (probabilities -> probabilities).

    Instance attributes
    -------------------
    classes
        Number of classes (2 for binary calibrators; K once a multiclass calibrator is fitted).
    training
        Dict describing the fit (``n``, ``source`` = ``"raw"``, ``"grid"``, ``"reservoir"`` ...),
        filled by ``fit`` and copied into the document.

    Examples
    --------
    >>> import numpy as np
    >>> from calmon.calibration import get_calibrator
    >>> cal = get_calibrator("platt")()
    >>> rng = np.random.default_rng(0)
    >>> z = rng.uniform(0.01, 0.99, 2000); y = (rng.uniform(size=2000) < z ** 2).astype(float)
    >>> _ = cal.fit(z, y)
    >>> back = Calibrator.from_document(json.loads(json.dumps(cal.to_document())))
    >>> bool(np.allclose(back.predict(z), cal.predict(z)))
    True
    """

    method: ClassVar[str] = ""
    kind: ClassVar[str] = "binary"

    def __init__(self) -> None:
        self.classes: int | None = 2 if self.kind == "binary" else None
        self.training: dict[str, Any] = {}
        self.fitted: bool = False

    # -- to implement ----------------------------------------------------------------------
    def fit(self, x: np.ndarray, y: np.ndarray, sample_weight: np.ndarray | None = None) -> Calibrator:
        """Fit on raw data: binary ``x`` = scores (n,) with ``y`` in {0, 1}; multiclass ``x`` =
        probabilities (n, K) with ``y`` class indices.  Returns ``self``."""
        raise NotImplementedError

    def fit_grid(self, grid: Any) -> Calibrator:
        """Fit on binned statistics (a :class:`calmon.stats.grid.ScoreGrid`).  Optional."""
        raise NotImplementedError(f"calibrator {self.method!r} cannot be fitted from binned statistics")

    def predict(self, x: np.ndarray) -> np.ndarray:
        """Calibrated scores (binary, shape (n,)) or probabilities (multiclass, shape (n, K))."""
        raise NotImplementedError

    def get_params(self) -> dict[str, Any]:
        """Options and fitted values as a JSON-able dict (finite floats, ints, strings, lists)."""
        raise NotImplementedError

    @classmethod
    def from_params(cls, params: dict[str, Any]) -> Calibrator:
        """Rebuild a fitted calibrator from :meth:`get_params` output (validate every value)."""
        raise NotImplementedError

    # -- provided ------------------------------------------------------------------------------
    @classmethod
    def supports_grid(cls) -> bool:
        """True if the subclass implements :meth:`fit_grid`."""
        return cls.fit_grid is not Calibrator.fit_grid

    def fit_data(self, data: Any) -> Calibrator:
        """Fit from a :class:`calmon.testers.CalibrationData` (a file, or an agent window).

        Binary calibrators use complete raw data when present, else the fine grid when the method
        supports it, else the reservoir sample; multiclass calibrators use ``probs``/``labels``.
        Subclasses with other statistics (e.g. level sets) override this.
        """
        if self.kind == "multiclass":
            if data.probs is None or data.labels is None:
                raise ValueError(f"calibrator {self.method!r} needs multiclass probabilities and labels")
            self.fit(data.probs, data.labels)
            self.training["source"] = "raw" if data.raw_is_complete else "reservoir"
            return self
        if data.z is not None and data.y is not None and data.raw_is_complete:
            self.fit(data.z, data.y)
            self.training["source"] = "raw"
        elif data.grid is not None and self.supports_grid():
            self.fit_grid(data.grid)
            self.training["source"] = "grid"
        elif data.z is not None and data.y is not None:
            self.fit(data.z, data.y)
            self.training["source"] = "reservoir"
        else:
            raise ValueError(f"calibrator {self.method!r} needs raw scores/labels or a score grid")
        self.training["window_n"] = int(data.n)
        return self

    def __call__(self, x: np.ndarray) -> np.ndarray:
        return self.predict(x)

    def _check_fitted(self) -> None:
        if not self.fitted:
            raise ValueError(f"calibrator {self.method!r} is not fitted; call fit() first")

    def to_document(self, *, training: dict[str, Any] | None = None, evaluation: dict[str, Any] | None = None,
                    created_at: str | None = None, **info: Any) -> dict[str, Any]:
        """The versioned JSON document (see module docstring).

        Parameters
        ----------
        training
            Extra training facts (``window``: {start, end}, ``model``, ...) merged over ``self.training``.
        evaluation
            Held-out errors before/after (e.g. from :func:`calmon.calibration.refresh.evaluate`).
        created_at
            RFC 3339 timestamp; default now (UTC).
        **info
            Any other JSON-able facts, stored under ``"info"``.

        Returns
        -------
        dict
            JSON-serialisable document; ``json.dumps(doc, allow_nan=False)`` succeeds.
        """
        self._check_fitted()
        from calmon import __version__

        doc = {
            "format": FORMAT,
            "version": FORMAT_VERSION,
            "method": self.method,
            "kind": self.kind,
            "classes": self.classes,
            "params": self.get_params(),
            "training": {**self.training, **(training or {})},
            "evaluation": dict(evaluation or {}),
            "created_at": created_at or _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ"),
            "calmon_version": __version__,
        }
        if info:
            doc["info"] = info
        doc = _jsonable(doc)
        json.dumps(doc, allow_nan=False)  # fail early on non-finite values
        return doc

    @staticmethod
    def from_document(doc: dict[str, Any]) -> Calibrator:
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

    def save(self, path: str | os.PathLike[str], **info: Any) -> dict[str, Any]:
        """Write :meth:`to_document` atomically (temp file + ``os.replace``) and return the document."""
        doc = self.to_document(**info)
        write_json_atomic(path, doc)
        return doc

    @staticmethod
    def load(path: str | os.PathLike[str]) -> Calibrator:
        """Read a calibrator document from ``path`` (see :func:`load`)."""
        return load(path)

    def __repr__(self) -> str:
        state = "fitted" if self.fitted else "unfitted"
        return f"{type(self).__name__}({state})"


# -- registry ---------------------------------------------------------------------------------
def register_calibrator(cls: C) -> C:
    """Class decorator registering a :class:`Calibrator` subclass under ``cls.method``."""
    if not (isinstance(cls, type) and issubclass(cls, Calibrator)):
        raise TypeError("register_calibrator expects a Calibrator subclass")
    if not cls.method:
        raise TypeError(f"{cls.__name__} must set the class attribute 'method'")
    if cls.kind not in KINDS:
        raise TypeError(f"{cls.__name__}.kind must be one of {KINDS}, got {cls.kind!r}")
    CALIBRATORS[cls.method] = cls
    return cls


def load_builtin() -> dict[str, type[Calibrator]]:
    """Import the modules in :data:`BUILTIN_MODULES` (skipping absent ones) and return the registry."""
    for name in BUILTIN_MODULES:
        try:
            importlib.import_module(name)
        except ModuleNotFoundError as exc:  # optional module not present in this build
            if exc.name != name:
                raise
    return CALIBRATORS


def get_calibrator(method: Any) -> type[Calibrator]:
    """The registered class for ``method``; :class:`CalibratorError` naming the known methods otherwise."""
    load_builtin()
    if isinstance(method, str) and method in CALIBRATORS:
        return CALIBRATORS[method]
    known = ", ".join(sorted(CALIBRATORS)) or "none"
    raise CalibratorError(f"unknown calibration method {method!r} (known: {known})")


def make_calibrator(method: str, **options: Any) -> Calibrator:
    """Instantiate ``method`` with constructor ``options`` (e.g. ``make_calibrator("platt", link="probit")``)."""
    return get_calibrator(method)(**options)


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
    return Calibrator.from_document(doc)


def write_json_atomic(path: str | os.PathLike[str], doc: Any) -> None:
    """Write ``doc`` as JSON to ``path`` atomically: a temp file in the same directory, fsync, ``os.replace``."""
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{p.name}.", suffix=".tmp", dir=p.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            json.dump(doc, fh, indent=2, sort_keys=False, allow_nan=False)
            fh.write("\n")
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, p)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise


# -- parameter helpers for subclasses ----------------------------------------------------------
def _reject_constant(name: str) -> float:
    raise ValueError(f"non-finite number {name} in calibrator document")


def _jsonable(x: Any) -> Any:
    """Convert numpy scalars/arrays (recursively) to plain Python for ``json``."""
    if isinstance(x, dict):
        return {str(k): _jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_jsonable(v) for v in x]
    if isinstance(x, np.ndarray):
        return _jsonable(x.tolist())
    if isinstance(x, np.generic):
        return x.item()
    return x


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


Factory = Callable[..., Calibrator]
