"""calmon's calibration estimators as river metrics.

river evaluates online models with ``evaluate.progressive_val_score`` and ``utils.Rolling``
through metrics with ``update(y_true, y_pred)`` / ``revert`` / ``get``.  calmon's statistics are
additive fixed-point integer sums, so ``revert`` is exact and a rolling metric equals the metric
of the last ``window_size`` pairs to the last bit.  Each metric gives the number ``calmon check``
reports for a file of the same (prediction, label) pairs.

========================  =====================================================  ===========================
metric                    value                                                  ``calmon check --json`` key
========================  =====================================================  ===========================
:class:`ECE`              15-bin l1 expected calibration error                   ``metrics.ece``
:class:`DebiasedL2ECE`    T-Cal's debiased squared l2-ECE at the adaptive scale  ``metrics.ece_l2_debiased``
:class:`SmoothCE`         exact smooth calibration error of the 4096-cell grid   ``tests.smce.value`` (*)
:class:`CalibrationTest`  T-Cal p-value; ``.decision``                           ``tests.tcal.p_value`` (**)
========================  =====================================================  ===========================

(*) ``calmon check`` computes the smCE of the raw pairs; the grid's value is within
``SmoothCE.error_bound`` of it.  (**) with ``--test-param tcal.method=mc-grid`` (a file's
check otherwise simulates from the raw pairs, which a metric does not keep).

Binary models: ``y_pred`` is ``predict_proba_one``'s dict or ``P(y = pos_val)``; multiclass
models: pass ``top_label=True`` to measure the top-label confidence against its correctness.

Layout
------
:mod:`~calmon.river.pairs` (``(y_true, y_pred)`` -> (score, outcome)),
:mod:`~calmon.river.state` (buffered exact grid), :mod:`~calmon.river.base` (the river metric base),
:mod:`~calmon.river.ece`, :mod:`~calmon.river.smooth`, :mod:`~calmon.river.tcal` (the metrics).

Examples
--------
>>> from river import datasets, evaluate, linear_model, metrics, preprocessing
>>> import calmon.river

>>> model = preprocessing.StandardScaler() | linear_model.LogisticRegression()
>>> metric = metrics.Accuracy() + calmon.river.ECE() + calmon.river.CalibrationTest()
>>> evaluate.progressive_val_score(datasets.Phishing(), model, metric)
Accuracy: 89.28%
ECE: 10.45%
CalibrationTest: 0.0042 (miscalibrated)
"""

from calmon.river.base import CalibrationMetric
from calmon.river.ece import ECE, DebiasedL2ECE
from calmon.river.smooth import SmoothCE
from calmon.river.tcal import CalibrationTest

__all__ = ["CalibrationMetric", "ECE", "DebiasedL2ECE", "SmoothCE", "CalibrationTest"]
