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
``from_params`` (validating with :mod:`calmon.calibration.params`), and add the class to the
table :data:`calmon.calibration.registry.BUILTIN` (or call
:func:`calmon.calibration.registry.register_calibrator` once, e.g. from a plugin).
"""

from __future__ import annotations

import datetime as _dt
import json
import os
from typing import Any, ClassVar

import numpy as np

from calmon import __version__
from calmon.formats.jsonio import clean, write_json_atomic
from calmon.stats.data import CalibrationData

__all__ = ["FORMAT", "FORMAT_VERSION", "KINDS", "Calibrator", "CalibratorError"]

FORMAT = "calmon.calibrator"
FORMAT_VERSION = 1
KINDS = ("binary", "multiclass")


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
    kinds
        The kinds the method can fit (temperature scaling: both; it takes the kind of its data).

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
    >>> from calmon.calibration import from_document, get_calibrator
    >>> cal = get_calibrator("platt")()
    >>> rng = np.random.default_rng(0)
    >>> z = rng.uniform(0.01, 0.99, 2000); y = (rng.uniform(size=2000) < z ** 2).astype(float)
    >>> _ = cal.fit(z, y)
    >>> back = from_document(json.loads(json.dumps(cal.to_document())))
    >>> bool(np.allclose(back.predict(z), cal.predict(z)))
    True
    """

    method: ClassVar[str] = ""
    #: The kind of a new instance; a calibrator whose ``kinds`` hold both takes the kind of the data it is fitted on.
    kind: str = "binary"
    #: Every kind the method fits (default: just ``kind``).
    kinds: ClassVar[tuple[str, ...]] = ()

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "kinds" not in cls.__dict__:
            cls.kinds = (cls.kind,)

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

    def fit_data(self, data: CalibrationData) -> Calibrator:
        """Fit from a :class:`calmon.stats.data.CalibrationData` (a file, or an agent window).

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
        json.dumps(doc, allow_nan=False, default=_plain)  # fail early on non-finite values (clean() would null them)
        return clean(doc)

    def save(self, path: str | os.PathLike[str], **info: Any) -> dict[str, Any]:
        """Write :meth:`to_document` atomically and durably (:func:`calmon.formats.jsonio.write_json_atomic`)."""
        doc = self.to_document(**info)
        write_json_atomic(path, doc)
        return doc

    def __repr__(self) -> str:
        state = "fitted" if self.fitted else "unfitted"
        return f"{type(self).__name__}({state})"


def _plain(o: Any) -> Any:
    """``json.dumps`` default for numpy values: their Python form, still checked for NaN/inf."""
    if isinstance(o, np.ndarray | np.generic):
        return o.tolist()
    raise TypeError(f"{type(o).__name__} is not JSON serialisable")
