"""``calmon.fit(df, method=...)``: ``calmon fit`` on in-memory data; ``.predict`` is ``calmon apply``.

The data become a dataset as a file would (:mod:`calmon.api.frame`) and are fitted by ``calmon fit``'s own
:func:`calmon.commands.fit.fit_dataset`; the calibrator is rebuilt from the document it wrote, exactly as
``calmon apply`` loads a file, so ``.predict`` answers what ``calmon apply`` writes and ``.save`` writes what
``calmon fit -o`` does.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from calmon.api.frame import Column, show, to_dataset
from calmon.calibration.base import Calibrator
from calmon.calibration.document import from_document, load
from calmon.commands import fit as fit_command
from calmon.formats.jsonio import write_json_atomic

__all__ = ["FittedCalibrator", "fit", "load_calibrator"]


def fit(data: Any = None, *, method: str, score: Column = None, label: Column = "label", probs: Column = None,
        id: Column = None, model: str | None = None, holdout: float = 0.0,  # noqa: A002 -- the event field
        salt: str = "calmon", ece_bins: int = 15, source: str | None = None, **options: Any) -> FittedCalibrator:
    """Fit a recalibration map, as ``calmon fit`` does on a file.

    Parameters
    ----------
    data, score, label, probs, id, model, source
        The labeled predictions, as for :func:`calmon.check`.
    method
        ``platt``, ``isotonic``, ``temperature``, ``histogram``, ``scaling-binning``, ... (``calmon fit --help``).
    holdout
        Fraction held out by a hash of the ids (or row numbers) to report held-out errors (``--holdout``).
    salt, ece_bins
        ``--salt`` (of the holdout hash) and ``--ece-bins`` (of the reported ECE).
    **options
        The method's options, as ``--option KEY=VALUE``: ``bins=``, ``link=``, ``degree=``, ...

    Returns
    -------
    FittedCalibrator
        ``.predict(scores_or_probs)``, ``.save(path)``, ``.document``, ``.evaluation``.

    Examples
    --------
    >>> import numpy as np
    >>> rng = np.random.default_rng(1)
    >>> z = rng.uniform(0.01, 0.99, 4000); y = rng.uniform(size=4000) < z ** 2   # over-confident scores
    >>> cal = fit({"score": z, "label": y}, method="platt", holdout=0.3)
    >>> ev = cal.evaluation
    >>> ev["after"]["ece"] < ev["before"]["ece"]
    True
    >>> bool(np.abs(cal.predict([0.5, 0.9]) - [0.5 ** 2, 0.9 ** 2]).max() < 0.05)   # the truth is z ** 2
    True
    >>> cal.predict([0.5, 1.5])
    Traceback (most recent call last):
    ...
    ValueError: scores must be probabilities in [0, 1]: row 1 is 1.5
    """
    fit_command._check_bins(options, ece_bins)  # noqa: SLF001 -- the command's own bounds, before any work
    ds = to_dataset(data, score=score, label=label, probs=probs, id=id, model=model, source=source)
    doc = fit_command.fit_dataset(ds, method, options, holdout=holdout, salt=salt, ece_bins=ece_bins)
    return FittedCalibrator(json.loads(json.dumps(doc, allow_nan=False)))


def load_calibrator(path: str | os.PathLike[str]) -> FittedCalibrator:
    """A calibrator document written by ``calmon fit -o`` or :meth:`FittedCalibrator.save`."""
    cal = load(path)
    with open(path, encoding="utf-8") as f:
        doc = json.load(f)
    return FittedCalibrator(doc, cal)


@dataclass(frozen=True)
class FittedCalibrator:
    """A fitted recalibration map and its document (method, parameters, training, held-out errors)."""

    document: dict[str, Any]
    calibrator: Calibrator = field(default=None, repr=False)  # type: ignore[assignment]  # set in __post_init__

    def __post_init__(self) -> None:
        if self.calibrator is None:  # rebuilt from the document, as `calmon apply` rebuilds it from the file
            object.__setattr__(self, "calibrator", from_document(self.document))

    @property
    def method(self) -> str:
        return str(self.document["method"])

    @property
    def evaluation(self) -> dict[str, Any]:
        """ECE, NLL, Brier before and after (held out with ``holdout``, else in-sample)."""
        return dict(self.document.get("evaluation", {}))

    def predict(self, x: Any) -> np.ndarray:
        """Recalibrated scores (n,) of scores (n,), or probabilities (n, K) of probabilities (n, K).

        A binary calibrator given (n, K) probabilities maps their top-label confidence (``calmon apply`` on
        multiclass data), returned as (n,). Scores are clipped to [0, 1] as ``calmon apply`` writes them.
        """
        a = np.asarray(x.to_numpy() if hasattr(x, "to_numpy") else x, dtype=np.float64)
        if a.ndim == 0 or len(a) == 0:
            raise ValueError(f"Expected an array of scores or probabilities with at least 1 sample, got {x!r}")
        finite = np.isfinite(a).reshape(len(a), -1).all(axis=1)
        if not finite.all():
            raise ValueError(f"Input contains NaN or infinity (first at row {int(np.flatnonzero(~finite)[0])})")
        cal = self.calibrator
        if cal.kind == "multiclass":
            if a.ndim != 2:
                raise ValueError(f"{self.method} is a multiclass calibrator: pass probabilities (n_samples, "
                                 f"n_classes), got shape {a.shape}")
            if cal.classes is not None and a.shape[1] != cal.classes:
                raise ValueError(f"calibrator was fitted on {cal.classes} classes; got {a.shape[1]}")
            return np.asarray(cal.predict(a))
        if a.ndim == 2:  # the top-label confidence, as `calmon apply` maps multiclass data
            a = a.max(axis=1)
        elif a.ndim != 1:
            raise ValueError(f"scores must be 1-D (n_samples,), got shape {a.shape}")
        bad = (a < 0) | (a > 1)
        if bad.any():
            i = int(np.flatnonzero(bad)[0])
            raise ValueError(f"scores must be probabilities in [0, 1]: row {i} is {show(a[i])!r}")
        return np.clip(cal.predict(a), 0.0, 1.0)

    def save(self, path: str | os.PathLike[str]) -> None:
        """Write the document as ``calmon fit -o PATH`` does (atomically); ``calmon apply PATH`` reads it."""
        write_json_atomic(os.fspath(path), self.document)
