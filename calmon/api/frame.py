"""In-memory data -> the :class:`~calmon.offline.dataset.Dataset` that ``calmon check``/``fit`` read from a file.

``data`` is anything with columns: a pandas or polars DataFrame (neither is imported here: any object with
``.columns`` and ``data[name]`` works), a dict of arrays, a numpy structured array -- or ``None`` with the arrays
passed directly (``score=z, label=y``). A column argument is a column name or an array.

Bad input raises ``ValueError`` with a scikit-learn style message naming the argument, the row and the value
(inconsistent lengths, NaN, a score outside [0, 1], probabilities not summing to 1, a label that is not a class).

Examples
--------
>>> import numpy as np
>>> ds = to_dataset({"score": [0.2, 0.9, 0.6], "label": [False, True, True]})
>>> ds.kind, ds.n, ds.y.tolist()
('binary', 3, [0.0, 1.0, 1.0])
>>> to_dataset(None, score=np.array([0.2, 0.9]), label=np.array([0, 1, 1]))
Traceback (most recent call last):
...
ValueError: Found input variables with inconsistent numbers of samples: [score: 2, label: 3]
>>> to_dataset({"p0": [0.5, 0.2], "p1": [0.3, 0.3], "p2": [0.1, 0.5], "label": [0, 2]})
Traceback (most recent call last):
...
ValueError: probs rows must sum to 1 (within 0.001): row 0 sums to 0.9
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from calmon.offline.dataset import Dataset

__all__ = ["Column", "to_dataset", "columns_of", "show"]

#: A column argument: the name of a column of ``data``, or the values themselves.
Column = Any
#: Probability vectors must sum to 1 within this (as ``calmon check`` requires of CSV and NPZ rows).
SUM_TOLERANCE = 1e-3


def columns_of(data: Any) -> list[str] | None:
    """The column names of ``data`` (``None`` for no data); ``TypeError`` for an object without columns."""
    if data is None:
        return None
    if hasattr(data, "columns"):  # pandas, polars, pyarrow.Table, ...
        return [str(c) for c in data.columns]
    if isinstance(data, Mapping):
        return [str(k) for k in data]
    names = getattr(getattr(data, "dtype", None), "names", None)  # numpy structured array
    if names:
        return list(names)
    raise TypeError(f"data must be a DataFrame (pandas, polars), a dict of arrays or a structured array; "
                    f"got {type(data).__name__} (pass arrays as score=..., label=... with data=None)")


def to_dataset(data: Any = None, *, score: Column = None, label: Column = "label", probs: Column = None,
               id: Column = None, ts: Column = None, model: str | None = None,  # noqa: A002 -- the event field
               source: str | None = None) -> Dataset:
    """The dataset of ``data``, as :func:`calmon.offline.inputs.read_inputs` builds it from a file.

    Parameters
    ----------
    data
        DataFrame, dict of arrays, structured array, or ``None`` (the other arguments are then arrays).
    score
        Binary scores P(y = 1): a column name or array (default: the ``score`` column, when there is one).
    label
        Outcomes: 0/1 or booleans for scores, class indices for ``probs`` (default: the ``label`` column).
    probs
        Multiclass probabilities: a column of vectors, a list of columns (one per class) or an (n, K) array
        (default: a ``probs`` column, else columns ``p0, p1, ...`` as in calmon's CSV layout).
    id, ts
        Optional prediction ids (kept for ``fit``'s hash holdout) and event times (seconds or datetimes);
        by default the ``id`` and ``ts`` columns when present.
    model
        The model to check: with a ``model`` column, its rows (required when the column holds several);
        without one, the name given to the data (as in events).
    source
        The name shown as the report's ``input`` (default ``<DataFrame>``, ``<dict>``, ``<arrays>``).
    """
    cols = columns_of(data)
    kind = "arrays" if data is None else "dict" if isinstance(data, Mapping) else type(data).__name__
    name = source or f"<{kind}>"
    present = set(cols or ())
    score, probs = prediction_columns(cols, score, probs)
    keep, model = _model_rows(data, cols, model)
    arrays: dict[str, np.ndarray] = {}
    if score is not None:
        arrays["score"] = _column(data, cols, score, "score")
    else:
        arrays["probs"] = _probs(data, cols, probs)
    arrays["label"] = _column(data, cols, label, "label")
    for key, arg in (("id", id), ("ts", ts)):
        if arg is None and key in present:
            arg = key
        if arg is not None:
            arrays[key] = _column(data, cols, arg, key)
    _same_lengths(arrays)
    if keep is not None:
        arrays = {k: v[keep] for k, v in arrays.items()}
    n = len(arrays["label"])
    if n == 0:
        raise ValueError("Found array with 0 sample(s) while a minimum of 1 is required")
    ids = arrays["id"].astype(str) if "id" in arrays else None
    times = _times(arrays["ts"]) if "ts" in arrays else None
    if "score" in arrays:
        z = _numbers(arrays["score"], "score")
        _probabilities(z, "score")
        y = _binary_labels(arrays["label"])
        return Dataset(name, 2, z, y, ids=ids, ts=times, model=model)
    p = arrays["probs"]
    labels = _class_labels(arrays["label"], p.shape[1])
    if p.shape[1] == 2:  # two-class vectors are binary scores P(y = 1), as calmon check reads them
        return Dataset(name, 2, p[:, 1].copy(), labels.astype(np.float64), ids=ids, ts=times, model=model)
    top = p.argmax(axis=1)
    return Dataset(name, p.shape[1], p[np.arange(n), top], (top == labels).astype(np.float64), probs=p,
                   labels=labels, ids=ids, ts=times, model=model)


def prediction_columns(cols: Sequence[str] | None, score: Column, probs: Column,
                       subject: str = "data has") -> tuple[Column, Column]:
    """``(score, probs)`` with the defaults of a table filled in: the ``score`` column, else ``probs``, else
    ``p0..p{K-1}`` -- or a one-line ``ValueError`` (``subject`` begins it) when there is none or both are given."""
    if score is not None and probs is not None:
        raise ValueError("pass score (binary) or probs (multiclass), not both")
    if score is not None or probs is not None:
        return score, probs
    present = set(cols or ())
    if "score" in present:
        return "score", None
    if "probs" in present:
        return None, "probs"
    found = _p_columns(cols or [])
    if not found:
        raise ValueError(f"{subject} neither a score column (binary) nor probs or p0..p{{K-1}} columns "
                         f"(multiclass); columns: {_listed(cols)}. Pass score='...' or probs=[...]")
    return None, found


def show(v: Any) -> Any:
    """A numpy scalar as the Python value it holds (``3``, not ``np.int64(3)``) for messages."""
    return v.item() if isinstance(v, np.generic) else v


def _listed(cols: Sequence[str] | None, limit: int = 12) -> str:
    if not cols:
        return "(none)"
    return ", ".join(cols[:limit]) + (", ..." if len(cols) > limit else "")


def _p_columns(cols: Sequence[str]) -> list[str]:
    """``p0, p1, ..., p{K-1}`` when ``p0`` and ``p1`` are among ``cols`` (the CSV layout), else ``[]``."""
    out: list[str] = []
    while f"p{len(out)}" in cols:
        out.append(f"p{len(out)}")
    return out if len(out) >= 2 else []


def _raw(col: Any) -> np.ndarray:
    to_numpy = getattr(col, "to_numpy", None)  # pandas / polars Series: their own conversion knows their types
    return np.asarray(to_numpy() if callable(to_numpy) else col)


def _column(data: Any, cols: list[str] | None, arg: Column, what: str) -> np.ndarray:
    if not isinstance(arg, str):
        a = _raw(arg)
        if a.ndim == 0:
            raise ValueError(f"{what} must be a column name or an array of values, got {arg!r}")
        return a
    if cols is None:
        raise ValueError(f"{what}={arg!r} names a column, but no data was given: pass data or the values")
    if arg not in cols:
        raise ValueError(f"data has no column {arg!r} for {what} (columns: {_listed(cols)}); "
                         f"pass {what}='<column>'")
    return _raw(data[arg])


def _probs(data: Any, cols: list[str] | None, probs: Column) -> np.ndarray:
    if isinstance(probs, (list, tuple)) and probs and all(isinstance(c, str) for c in probs):
        parts = [_numbers(_column(data, cols, c, "probs"), f"probs column {c!r}") for c in probs]
        _same_lengths({f"probs column {c!r}": a for c, a in zip(probs, parts)})
        p = np.column_stack(parts)
    else:
        a = _column(data, cols, probs, "probs")
        if a.dtype == object:  # a column of vectors (lists, arrays)
            lengths = {len(v) if hasattr(v, "__len__") else -1 for v in a}
            if len(lengths) > 1 or -1 in lengths:
                raise ValueError(f"probs rows must be vectors of one length (the classes); got lengths "
                                 f"{sorted(lengths)[:5]}")
            a = np.array([np.asarray(v, dtype=np.float64) for v in a]) if len(a) else np.zeros((0, 0))
        p = _numbers(a, "probs")
    if p.ndim != 2 or p.shape[1] < 2:
        raise ValueError(f"probs must be 2-D (n_samples, n_classes >= 2), got shape {p.shape}")
    bad = (p < 0) | (p > 1)
    if bad.any():
        i, k = (int(v[0]) for v in np.nonzero(bad))
        raise ValueError(f"probs must lie in [0, 1]: row {i}, class {k} is {show(p[i, k])!r}")
    sums = p.sum(axis=1)
    off = np.abs(sums - 1.0) > SUM_TOLERANCE
    if off.any():
        i = int(np.flatnonzero(off)[0])
        raise ValueError(f"probs rows must sum to 1 (within {SUM_TOLERANCE:g}): row {i} sums to {sums[i]:.6g}")
    return p


def _same_lengths(arrays: Mapping[str, np.ndarray]) -> None:
    lengths = {k: len(v) for k, v in arrays.items()}
    if len(set(lengths.values())) > 1:
        shown = ", ".join(f"{k}: {n}" for k, n in lengths.items())
        raise ValueError(f"Found input variables with inconsistent numbers of samples: [{shown}]")


def _numbers(a: np.ndarray, what: str) -> np.ndarray:
    """Float64 values, or a one-line error (strings, missing values, NaN, infinity)."""
    if a.dtype.kind not in "biuf":
        try:
            a = a.astype(np.float64)
        except (TypeError, ValueError):
            raise ValueError(_not_number(a, what)) from None
    out = np.asarray(a, dtype=np.float64)
    bad = ~np.isfinite(out)
    if bad.any():
        i = int(np.flatnonzero(bad.reshape(len(out), -1).any(axis=1))[0])
        kind = "NaN" if np.isnan(out.reshape(len(out), -1)[i]).any() else "infinity"
        raise ValueError(f"Input {what} contains {kind} (first at row {i})")
    return out


def _not_number(a: np.ndarray, what: str) -> str:
    """Why ``a`` is not numeric, naming the first bad row (only on the error path: a Python loop is fine)."""
    for i, v in enumerate(a.reshape(len(a), -1) if a.ndim > 1 else a):
        try:
            float(v) if np.ndim(v) == 0 else np.asarray(v, dtype=np.float64)
        except (TypeError, ValueError):
            missing = v is None or str(v) in ("<NA>", "NaT", "nan", "None")
            return (f"Input {what} contains missing values (first at row {i})" if missing
                    else f"{what} must hold numbers: row {i} is {show(v)!r}")
    return f"{what} must hold numbers, got dtype {a.dtype}"


def _probabilities(z: np.ndarray, what: str) -> None:
    if z.ndim != 1:
        raise ValueError(f"{what} must be 1-D (n_samples,), got shape {z.shape}; multiclass data goes in probs")
    bad = (z < 0) | (z > 1)
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        raise ValueError(f"{what} must be probabilities in [0, 1]: row {i} is {show(z[i])!r}")


def _binary_labels(a: np.ndarray) -> np.ndarray:
    y = _numbers(a, "label")
    bad = (y != 0) & (y != 1)
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        raise ValueError(f"label must be 0/1 or booleans for binary scores: row {i} is {show(a[i])!r}")
    return y


def _class_labels(a: np.ndarray, k: int) -> np.ndarray:
    y = _numbers(a, "label")
    bad = (y < 0) | (y >= k) | (y != np.round(y))
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        raise ValueError(f"label must be a class index in [0, {k}) (one per probs column): row {i} is {show(a[i])!r}")
    return y.astype(np.int64)


def _times(a: np.ndarray) -> np.ndarray:
    if a.dtype.kind == "M":  # datetimes: seconds since the epoch, as events carry them
        ns = a.astype("datetime64[ns]")
        out = ns.astype(np.int64) / 1e9
        out[np.isnat(ns)] = np.nan
        return out
    try:
        return np.asarray(a, dtype=np.float64)
    except (TypeError, ValueError):
        raise ValueError(f"ts must hold epoch seconds or datetimes, got dtype {a.dtype}") from None


def _model_rows(data: Any, cols: list[str] | None, model: str | None) -> tuple[np.ndarray | None, str | None]:
    """The rows of ``model`` (``None``: every row) and the model's name, as ``calmon check --model`` chooses."""
    if cols is None or "model" not in cols:
        return None, model
    values = _raw(data["model"]).astype(str)
    names = sorted(set(values.tolist()))
    if model is None:
        if len(names) > 1:
            raise ValueError(f"data holds {len(names)} models ({_listed(names, 5)}): pass model='...' to check one")
        return None, names[0] if names else None
    if model not in names:
        raise ValueError(f"no rows of model {model!r} (models: {_listed(names, 5)})")
    return values == model, model
