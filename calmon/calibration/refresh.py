"""Scheduled recalibration refresh: fit on a window, evaluate on held-out data, publish improvements.

The agent's scheduler calls :func:`refresh` every refit period with a window's training data and a
held-out set, either

* a later time bucket (the agent subtracts the last bucket's statistics from the window, since grids
  are exactly subtractable), or
* a deterministic hash split of event ids (:func:`~calmon.calibration.split.hash_split`,
  :func:`~calmon.calibration.split.split_arrays`).

Each configured method is fitted on the training part and evaluated on the held-out part against the
current predictor (the last published calibrator, or the raw scores when none exists).  A candidate
qualifies only if it lowers **both** the held-out NLL and the held-out debiased l2-ECE estimate
(T-Cal's DPE, eq. 6, at ``bins`` equal-width bins, top-label for multiclass).  The qualifying candidate
with the lowest held-out NLL is published as a new numbered revision to every publisher (atomically in
a directory by :class:`~calmon.calibration.store.DirectoryStore`; a Kafka compacted-topic publisher
implements the same :class:`~calmon.calibration.store.Publisher` protocol).  The result
(:class:`RefreshResult`, read by attribute; ``to_dict()`` for its JSON form) carries what the agent
exports as metrics: ``revision``, ``method``, ``params``, ``before``/``after`` errors.

The metrics, splits and stores live in their own modules and are re-exported here.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from calmon.calibration.base import Calibrator, CalibratorError
from calmon.calibration.limits import DEFAULT_LIMITS, RefreshLimits
from calmon.calibration.metrics import NLL_EPS, binary_metrics, evaluate, grid_metrics, multiclass_metrics
from calmon.calibration.registry import MethodLike, MethodSpec, make_calibrator
from calmon.calibration.split import hash_split, hash_unit, split_arrays
from calmon.calibration.store import DirectoryStore, Publisher
from calmon.formats.jsonio import clean
from calmon.stats.data import CalibrationData

__all__ = [
    "Candidate", "DEFAULT_LIMITS", "RefreshLimits", "RefreshResult", "improves", "refresh", "metric_samples",
    # re-exported from their own modules
    "MethodSpec", "NLL_EPS", "binary_metrics", "evaluate", "grid_metrics", "multiclass_metrics", "hash_split",
    "hash_unit", "split_arrays", "DirectoryStore", "Publisher",
]


@dataclass
class Candidate:
    """One method's attempt: its held-out errors and whether it beats the predictor in service."""

    spec: MethodSpec
    after: dict[str, Any] | None = None
    improves: bool = False
    error: str | None = None
    params: dict[str, Any] | None = None

    def to_dict(self) -> dict[str, Any]:
        out = {"method": self.spec.method, "label": self.spec.label, "options": self.spec.options,
               "after": self.after, "improves": self.improves, "error": self.error}
        if self.error is None:
            out["params"] = self.params
        return out


@dataclass
class RefreshResult:
    """What :func:`refresh` did (the agent reads it by attribute); :meth:`to_dict` gives its JSON form.

    ``label`` and ``document`` are set when a candidate was chosen (even if every publisher failed).
    """

    model: str
    n_train: int
    n_holdout: int
    published: bool = False
    revision: int | None = None
    method: str | None = None
    params: dict[str, Any] | None = None
    before: dict[str, Any] | None = None
    current: dict[str, Any] | None = None
    after: dict[str, Any] | None = None
    candidates: list[Candidate] = field(default_factory=list)
    published_to: list[dict[str, Any]] = field(default_factory=list)
    reason: str | None = None
    label: str | None = None
    document: dict[str, Any] | None = None

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe dict: ``model``, ``published``, ``revision``, ``method``, ``params``, ``before``,
        ``current``, ``after``, ``candidates``, ``n_train``, ``n_holdout``, ``published_to``, then
        ``label`` (when chosen), ``reason`` and ``document`` (when chosen)."""
        out: dict[str, Any] = {
            "model": self.model, "published": self.published, "revision": self.revision, "method": self.method,
            "params": self.params, "before": self.before, "current": self.current, "after": self.after,
            "candidates": [c.to_dict() for c in self.candidates], "n_train": self.n_train,
            "n_holdout": self.n_holdout, "published_to": self.published_to}
        if self.document is not None:
            out["label"] = self.label
        out["reason"] = self.reason
        if self.document is not None:
            out["document"] = self.document
        return clean(out)


def improves(after: Mapping[str, Any], before: Mapping[str, Any]) -> bool:
    """True iff held-out NLL and debiased l2-ECE are both strictly lower."""
    keys = ("nll", "ece_l2_debiased")
    if not all(np.isfinite(after.get(k, np.nan)) and np.isfinite(before.get(k, np.nan)) for k in keys):
        return False
    return all(after[k] < before[k] for k in keys)


def refresh(train: CalibrationData, holdout: CalibrationData, methods: Sequence[MethodLike], *,
            model: str = "default", publishers: Sequence[Publisher] = (), current: Calibrator | None = None,
            window: dict[str, Any] | None = None, bins: int = 15, limits: RefreshLimits = DEFAULT_LIMITS,
            created_at: str | None = None) -> RefreshResult:
    """Fit ``methods`` on ``train``, evaluate on ``holdout``, publish the best strict improvement.

    Parameters
    ----------
    train, holdout
        A window and a later bucket, or a hash split (see :func:`split_arrays`).
    methods
        Method names or specs (:class:`MethodSpec`), e.g. ``["platt", {"method": "platt", "link": "probit"},
        "isotonic"]``.
    model
        Model key (directory name, Kafka key).
    publishers
        :class:`Publisher` objects; the new revision is one more than the highest any of them knows.
    current
        The calibrator in service; default: the latest in the first publisher that can ``load`` one,
        else none (raw scores).  Candidates must beat it.
    window
        Facts about the training window (start, end, ...) stored in the document.
    bins
        Bins of the held-out ECE estimates.
    limits
        Below ``limits.min_train`` training or ``limits.min_holdout`` held-out rows nothing is fitted or
        published (``reason = "insufficient data"``).

    Returns
    -------
    RefreshResult
        ``to_dict()``: ``model``, ``published`` (bool), ``revision`` (int or None), ``method``, ``params``,
        ``before`` (raw predictions on the holdout), ``current`` (the in-service calibrator, if any),
        ``after`` (the chosen candidate), ``candidates`` (per method: ``after``, ``improves``, ``error``),
        ``reason``, ``n_train``, ``n_holdout``, ``published_to``.

    Examples
    --------
    >>> import numpy as np, tempfile
    >>> rng = np.random.default_rng(0); z = rng.uniform(0.05, 0.95, 8000)
    >>> y = (rng.uniform(size=8000) < z ** 2).astype(float)  # over-confident scores
    >>> train, hold = split_arrays([str(i) for i in range(8000)], z=z, y=y, fraction=0.5)
    >>> res = refresh(train, hold, ["platt"], model="m", publishers=[DirectoryStore(tempfile.mkdtemp())])
    >>> res.published, res.revision, res.after["nll"] < res.before["nll"]
    (True, 1, True)
    """
    specs = [MethodSpec.parse(m) for m in methods]
    if not specs:
        raise ValueError("refresh needs at least one method")
    result = RefreshResult(model=model, n_train=int(train.n), n_holdout=int(holdout.n))
    if train.n < limits.min_train or holdout.n < limits.min_holdout:
        result.reason = "insufficient data"
        return result
    current = current if current is not None else _in_service(publishers, model)
    result.before = evaluate(None, holdout, bins)
    baseline = result.before
    if current is not None:
        try:
            baseline = evaluate(current, holdout, bins)
            result.current = {**baseline, "method": current.method}
        except ValueError:
            current = None
    best: tuple[Calibrator, Candidate] | None = None
    for spec in specs:
        cal, cand = _try(spec, train, holdout, bins, baseline)
        result.candidates.append(cand)
        if cal is not None and cand.improves and cand.after is not None and (
                best is None or cand.after["nll"] < _nll(best[1])):
            best = (cal, cand)
    if best is None:
        result.reason = "no candidate improves held-out NLL and debiased ECE"
        return result
    _publish(result, *best, holdout=holdout, train=train, publishers=publishers, window=window, bins=bins,
             created_at=created_at)
    return result


def _nll(cand: Candidate) -> float:
    assert cand.after is not None
    return float(cand.after["nll"])


def _in_service(publishers: Sequence[Publisher], model: str) -> Calibrator | None:
    """The latest calibrator of the first publisher that can ``load`` one."""
    for pub in publishers:
        loader = getattr(pub, "load", None)
        if not callable(loader):
            continue
        try:
            cal = loader(model)
        except (CalibratorError, OSError, ValueError):
            cal = None
        if cal is not None:
            return cal
    return None


def _try(spec: MethodSpec, train: CalibrationData, holdout: CalibrationData, bins: int,
         baseline: Mapping[str, Any]) -> tuple[Calibrator | None, Candidate]:
    """Fit one method and judge it on the holdout (a fitting error is recorded, not raised)."""
    cand = Candidate(spec)
    try:
        cal = make_calibrator(spec.method, **spec.options).fit_data(train)
        after = evaluate(cal, holdout, bins)
    except (ValueError, TypeError, NotImplementedError, np.linalg.LinAlgError) as exc:
        cand.error = f"{type(exc).__name__}: {exc}"
        return None, cand
    cand.after, cand.params, cand.improves = after, cal.get_params(), improves(after, baseline)
    return cal, cand


def _next_revision(publishers: Sequence[Publisher], model: str) -> int:
    known = []
    for pub in publishers:
        latest = getattr(pub, "latest_revision", None)
        rev = latest(model) if callable(latest) else None
        if rev is not None:
            known.append(int(rev))
    return (max(known) if known else 0) + 1


def _publish(result: RefreshResult, cal: Calibrator, cand: Candidate, *, holdout: CalibrationData,
             train: CalibrationData, publishers: Sequence[Publisher], window: dict[str, Any] | None, bins: int,
             created_at: str | None) -> None:
    """Write the chosen calibrator's document to every publisher and record the outcome in ``result``."""
    revision = _next_revision(publishers, result.model)
    evaluation = {"holdout_n": int(holdout.n), "bins": bins, "before": result.before, "after": cand.after}
    if result.current is not None:
        evaluation["current"] = result.current
    training = {"window": window} if window else {}
    doc = cal.to_document(training={**training, "window_n": int(train.n)}, evaluation=evaluation,
                          created_at=created_at)
    doc.update(model=result.model, revision=revision, options=cand.spec.options)
    ok = not publishers
    for pub in publishers:
        name = type(pub).__name__
        try:
            out = pub.publish(result.model, doc)
        except Exception as exc:  # noqa: BLE001 - one sink failing (e.g. Kafka down) must not hide the others
            result.published_to.append({"publisher": name, "error": f"{type(exc).__name__}: {exc}"})
            continue
        ok = True
        result.published_to.append(out if isinstance(out, dict) else {"publisher": name, "revision": revision})
    result.published, result.revision = ok, revision if ok else None
    result.method, result.label, result.params = cand.spec.method, cand.spec.label, cal.get_params()
    result.after, result.document = cand.after, doc
    result.reason = "improved" if ok else "every publisher failed"


def metric_samples(result: RefreshResult | Mapping[str, Any]) -> list[tuple[str, dict[str, str], float]]:
    """Flatten a :func:`refresh` result into ``(name, labels, value)`` samples for the exporter.

    Names: ``calmon_calibrator_revision``, ``calmon_calibrator_published`` (1/0 this run),
    ``calmon_calibrator_param`` (label ``param``), ``calmon_calibrator_heldout_error`` (labels ``stage`` =
    before/after, ``metric`` = nll/ece/ece_l2_debiased/brier).

    Examples
    --------
    >>> metric_samples({"model": "m", "published": False, "revision": None, "before": {"nll": 0.5}})[0]
    ('calmon_calibrator_published', {'model': 'm'}, 0.0)
    """
    res = result.to_dict() if isinstance(result, RefreshResult) else result
    model = str(res.get("model", "default"))
    out: list[tuple[str, dict[str, str], float]] = [
        ("calmon_calibrator_published", {"model": model}, float(bool(res.get("published"))))]
    if res.get("revision") is not None:
        out.append(("calmon_calibrator_revision", {"model": model, "method": str(res.get("method"))},
                    float(res["revision"])))
    for k, v in (res.get("params") or {}).items():
        if isinstance(v, int | float) and not isinstance(v, bool):
            out.append(("calmon_calibrator_param", {"model": model, "param": k}, float(v)))
    for stage in ("before", "after"):
        for metric, v in (res.get(stage) or {}).items():
            if metric in ("nll", "ece", "ece_l2_debiased", "brier") and v is not None:
                out.append(("calmon_calibrator_heldout_error", {"model": model, "stage": stage, "metric": metric},
                            float(v)))
    return out
