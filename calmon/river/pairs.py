"""From river's ``(y_true, y_pred)`` to calmon's ``(score, outcome)`` pair.

river classifiers predict a probability dict (``predict_proba_one``); a binary metric may also
get a bare probability.  calmon's statistics need one score ``z`` in [0, 1] and one 0/1 outcome:

* binary: ``z = P(y = pos_val)``, outcome ``y_true == pos_val``;
* top-label (multiclass): ``z`` = the largest probability, outcome "the argmax class is
  ``y_true``" (ties go to the first class in the dict, as river's ``predict_one`` from
  ``predict_proba_one``).
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Mapping

__all__ = ["Prediction", "binary_pair", "top_label_pair"]

#: What river hands a probabilistic metric: a ``{class: probability}`` dict, or a probability.
Prediction = Mapping[Hashable, float] | float


def _score(p: float) -> float:
    """``p`` as a float, refusing what calmon's event validation refuses (NaN, infinity, outside [0, 1])."""
    z = float(p)
    if not math.isfinite(z) or not 0.0 <= z <= 1.0:
        raise ValueError(f"probability must be a finite number in [0, 1], got {p!r}")
    return z


def binary_pair(y_true: Hashable, y_pred: Prediction, pos_val: Hashable = True) -> tuple[float, float]:
    """``(P(y = pos_val), 1.0 if y_true == pos_val else 0.0)`` of a binary prediction.

    Parameters
    ----------
    y_true
        The observed label.
    y_pred
        ``{pos_val: p, other: 1 - p}`` (as ``predict_proba_one`` returns; a missing ``pos_val``
        means ``p = 0``), or ``p`` itself.
    pos_val
        The positive label.

    Examples
    --------
    >>> binary_pair(True, {False: 0.25, True: 0.75})
    (0.75, 1.0)
    >>> binary_pair(0, {0: 0.6, 1: 0.4}, pos_val=1), binary_pair(False, 0.3)
    ((0.4, 0.0), (0.3, 0.0))
    """
    if isinstance(y_pred, Mapping):
        if len(y_pred) > 2:
            raise ValueError(f"binary metric got probabilities of {len(y_pred)} classes; use top_label=True")
        p = y_pred.get(pos_val, 0.0)
    else:
        p = y_pred
    return _score(p), 1.0 if y_true == pos_val else 0.0


def top_label_pair(y_true: Hashable, y_pred: Prediction) -> tuple[float, float]:
    """``(top-label confidence, 1.0 if the top label is y_true else 0.0)`` of a probability dict.

    Examples
    --------
    >>> top_label_pair("b", {"a": 0.2, "b": 0.5, "c": 0.3})
    (0.5, 1.0)
    >>> top_label_pair("a", {"a": 0.2, "b": 0.5, "c": 0.3})
    (0.5, 0.0)
    """
    if not isinstance(y_pred, Mapping) or not y_pred:
        raise ValueError(f"top-label metric needs a non-empty probability dict, got {y_pred!r}")
    top = max(y_pred, key=lambda k: y_pred[k])
    return _score(y_pred[top]), 1.0 if y_true == top else 0.0
