"""Scheduled recalibration refresh: fit on a window, evaluate on held-out data, publish improvements.

The agent's scheduler calls :func:`refresh` every refit period with a window's training data and a
held-out set, either

* a later time bucket (the agent subtracts the last bucket's statistics from the window, since grids
  are exactly subtractable), or
* a deterministic hash split of event ids (:func:`hash_split`, :func:`split_arrays`): an event's side
  depends only on ``salt`` and its id, so it is stable across restarts, replicas and windows.

Each configured method is fitted on the training part and evaluated on the held-out part against the
current predictor (the last published calibrator, or the raw scores when none exists).  A candidate
qualifies only if it lowers **both** the held-out NLL and the held-out debiased l2-ECE estimate
(T-Cal's DPE, eq. 6, at ``bins`` equal-width bins, top-label for multiclass).  The qualifying candidate
with the lowest held-out NLL is published as a new numbered revision to every publisher (atomically in
a directory by :class:`DirectoryStore`; a Kafka compacted-topic publisher implements the same
:class:`Publisher` protocol).  The returned dict is JSON-able and carries what the agent exports as
metrics: ``revision``, ``method``, ``params``, ``before``/``after`` errors.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
import urllib.parse
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import numpy as np

from calmon.calibration.base import (
    FORMAT,
    Calibrator,
    CalibratorError,
    _jsonable,
    check_binary,
    check_multiclass,
    make_calibrator,
)

NLL_EPS = 1e-12


# -- metrics ----------------------------------------------------------------------------------------
def _binned(p: np.ndarray, y: np.ndarray, bins: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    idx = np.clip(np.floor(p * bins).astype(np.int64), 0, bins - 1)
    n = np.bincount(idx, minlength=bins).astype(np.float64)
    sp = np.bincount(idx, weights=p, minlength=bins)
    sy = np.bincount(idx, weights=y, minlength=bins)
    q = np.bincount(idx, weights=(y - p) ** 2, minlength=bins)
    return n, sp, sy, q


def _ece_from_bins(n: np.ndarray, sp: np.ndarray, sy: np.ndarray, q: np.ndarray) -> tuple[float, float]:
    total = n.sum()
    if total <= 0:
        return float("nan"), float("nan")
    nz = n > 0
    ece = float(np.abs(sy[nz] - sp[nz]).sum() / total)
    s = sy[nz] - sp[nz]
    dpe = float(((s * s - q[nz]) / n[nz]).sum() / total)
    return ece, dpe


def binary_metrics(p: np.ndarray, y: np.ndarray, bins: int = 15) -> dict[str, float]:
    """Held-out errors of binary predictions ``p`` for outcomes ``y``.

    Parameters
    ----------
    p
        Predicted probabilities of ``y = 1`` (or top-label confidence), in [0, 1].
    y
        Outcomes in {0, 1} (or top-label correctness).
    bins
        Equal-width bins for the ECE estimates (last bin closed).

    Returns
    -------
    dict
        ``n``; ``nll`` (mean log loss, predictions clipped to [1e-12, 1 - 1e-12]); ``brier``;
        ``ece`` (binned l1-ECE); ``ece_l2_debiased`` (DPE ``T^d`` of eq. 6, an unbiased-under-the-null
        estimate of the squared binned l2-ECE; may be negative).

    Examples
    --------
    >>> import numpy as np
    >>> m = binary_metrics(np.array([0.2, 0.2, 0.8, 0.8]), np.array([0, 1, 1, 1]))
    >>> round(m["ece"], 3), round(m["brier"], 3)
    (0.25, 0.19)

    References
    ----------
    Lee, Huang, Hassani, Dobriban, "T-Cal", JMLR 2023, eqs. (5)-(6) (scalar convention K = 2: half the
    one-hot statistic).
    """
    p, yy, _ = check_binary(p, y, name="predictions")
    n, sp, sy, q = _binned(p, yy, bins)
    ece, dpe = _ece_from_bins(n, sp, sy, q)
    pc = np.clip(p, NLL_EPS, 1 - NLL_EPS)
    nll = float(-np.mean(yy * np.log(pc) + (1 - yy) * np.log1p(-pc))) if p.size else float("nan")
    brier = float(np.mean((p - yy) ** 2)) if p.size else float("nan")
    return {"n": int(p.size), "nll": nll, "brier": brier, "ece": ece, "ece_l2_debiased": dpe}


def grid_metrics(grid: Any, cal: Calibrator | None = None, bins: int = 15) -> dict[str, float]:
    """:func:`binary_metrics` approximated from a fine :class:`~calmon.stats.grid.ScoreGrid`.

    Every event of a cell is given the calibrated score of the cell's mean score (exact for the raw
    predictor's ECE/DPE when ``cal`` is None; otherwise within the cell width of the fine grid).
    """
    nn = grid.n
    keep = nn > 0
    n = nn[keep]
    zbar = grid.sum_z[keep] / n
    sy = grid.sum_y[keep]
    if cal is None:
        f = zbar
        sq = grid.sum_y[keep] - 2 * grid.sum_zy[keep] + grid.sum_zz[keep]  # exact sum (y - z)^2
    else:
        f = np.clip(cal.predict(np.clip(zbar, 0.0, 1.0)), 0.0, 1.0)
        sq = sy - 2 * f * sy + n * f * f
    idx = np.clip(np.floor(f * bins).astype(np.int64), 0, bins - 1)
    bn = np.bincount(idx, weights=n, minlength=bins)
    bp = np.bincount(idx, weights=n * f if cal is not None else grid.sum_z[keep], minlength=bins)
    by = np.bincount(idx, weights=sy, minlength=bins)
    bq = np.bincount(idx, weights=sq, minlength=bins)
    ece, dpe = _ece_from_bins(bn, bp, by, bq)
    fc = np.clip(f, NLL_EPS, 1 - NLL_EPS)
    total = n.sum()
    nll = float(-(sy * np.log(fc) + (n - sy) * np.log1p(-fc)).sum() / total)
    return {"n": int(total), "nll": nll, "brier": float(sq.sum() / total), "ece": ece, "ece_l2_debiased": dpe,
            "approximate": cal is not None}


def multiclass_metrics(probs: np.ndarray, labels: np.ndarray, bins: int = 15) -> dict[str, float]:
    """Held-out errors of probability vectors: multiclass NLL and Brier, top-label ECE and DPE.

    Examples
    --------
    >>> import numpy as np
    >>> m = multiclass_metrics(np.array([[0.7, 0.3], [0.4, 0.6]]), np.array([0, 1]))
    >>> round(m["nll"], 4), round(m["accuracy"], 2)
    (0.4338, 1.0)
    """
    p, lab = check_multiclass(probs, labels)
    n = p.shape[0]
    if n == 0:
        return {"n": 0, "nll": float("nan"), "brier": float("nan"), "ece": float("nan"),
                "ece_l2_debiased": float("nan"), "accuracy": float("nan")}
    pl = np.clip(p[np.arange(n), lab], NLL_EPS, 1.0)
    onehot = np.zeros_like(p)
    onehot[np.arange(n), lab] = 1.0
    top = p.argmax(axis=1)
    conf = np.clip(p[np.arange(n), top], 0.0, 1.0)
    correct = (top == lab).astype(np.float64)
    tl = binary_metrics(conf, correct, bins)
    return {"n": int(n), "nll": float(-np.mean(np.log(pl))), "brier": float(np.mean(((p - onehot) ** 2).sum(1))),
            "ece": tl["ece"], "ece_l2_debiased": tl["ece_l2_debiased"], "accuracy": float(correct.mean())}


def evaluate(cal: Calibrator | None, data: Any, bins: int = 15) -> dict[str, Any]:
    """Errors of ``cal`` (``None`` = the raw predictions) on a :class:`calmon.testers.CalibrationData`.

    Raw data is used when it is complete (or when there is no grid); otherwise a binary
    calibrator is evaluated on the fine grid (:func:`grid_metrics`).
    """
    multiclass = cal.kind == "multiclass" if cal is not None else (data.probs is not None and data.z is None
                                                                      and data.grid is None)
    if multiclass:
        if data.probs is None or data.labels is None:
            raise ValueError("multiclass evaluation needs probabilities and labels")
        probs = data.probs if cal is None else cal.predict(data.probs)
        return {**multiclass_metrics(probs, data.labels, bins), "source": "raw"}
    if data.z is not None and data.y is not None and (data.raw_is_complete or data.grid is None):
        z = np.asarray(data.z, dtype=np.float64)
        return {**binary_metrics(z if cal is None else cal.predict(z), data.y, bins), "source": "raw"}
    if data.grid is not None:
        return {**grid_metrics(data.grid, cal, bins), "source": "grid"}
    raise ValueError("evaluation needs raw scores/labels or a score grid")


# -- splits -------------------------------------------------------------------------------------------
def hash_unit(ids: Iterable[Any], salt: str = "calmon") -> np.ndarray:
    """Deterministic value in [0, 1) per id: the first 8 bytes of BLAKE2b(salt, id) / 2^64.

    Examples
    --------
    >>> u = hash_unit(["a", "b"])
    >>> bool(((u >= 0) & (u < 1)).all()), bool((hash_unit(["a", "b"]) == u).all())
    (True, True)
    """
    key = salt.encode()[:64]
    out = [int.from_bytes(hashlib.blake2b(str(i).encode(), digest_size=8, key=key).digest(), "big")
           for i in ids]
    return np.asarray(out, dtype=np.float64) / 2.0**64


def hash_split(ids: Iterable[Any], fraction: float = 0.2, salt: str = "calmon") -> np.ndarray:
    """Boolean mask: True for the held-out events (about ``fraction`` of them), stable per id."""
    if not 0.0 < fraction < 1.0:
        raise ValueError(f"holdout fraction must lie in (0, 1), got {fraction}")
    return hash_unit(ids, salt) < fraction


def split_arrays(ids: Sequence[Any], *, z: Any = None, y: Any = None, probs: Any = None, labels: Any = None,
                 fraction: float = 0.2, salt: str = "calmon") -> tuple[Any, Any]:
    """Split raw arrays by :func:`hash_split` of ``ids`` into (train, holdout) ``CalibrationData``."""
    import calmon.stats  # noqa: F401  (import order: calmon.stats before calmon.testers)
    from calmon.testers import CalibrationData

    mask = hash_split(ids, fraction, salt)

    def part(sel: np.ndarray) -> Any:
        pick = (lambda a: None if a is None else np.asarray(a)[sel])  # noqa: E731
        return CalibrationData(n=int(sel.sum()), z=pick(z), y=pick(y), probs=pick(probs), labels=pick(labels),
                               raw_is_complete=True)

    return part(~mask), part(mask)


# -- publishing ---------------------------------------------------------------------------------------
@runtime_checkable
class Publisher(Protocol):
    """Where published calibrators go (a directory, a Kafka compacted topic keyed by model, ...).

    Only ``publish`` is required: :func:`refresh` calls ``latest_revision`` and ``load`` when a
    publisher has them, and records a publisher that raises instead of failing the refresh
    (``connectors.kafka.KafkaCalibratorPublisher`` fits as is).
    """

    def latest_revision(self, model: str) -> int | None:
        """Highest revision published for ``model`` (None when unknown or none)."""

    def publish(self, model: str, document: dict[str, Any]) -> dict[str, Any]:
        """Publish ``document`` (a calibrator document with ``revision`` and ``model``); return facts
        about where it went (JSON-able)."""


def _model_dir(model: str) -> str:
    safe = urllib.parse.quote(model, safe="-_.")
    if safe in ("", ".", ".."):
        raise ValueError(f"invalid model name {model!r}")
    return safe


class DirectoryStore:
    """Versioned calibrator store in a directory: ``ROOT/<model>/rev-000001.json`` plus ``latest.json``.

    Each revision is written to a temporary file in the same directory, fsynced and hard-linked to
    its final name (so an existing revision is never overwritten, and readers see whole files only);
    ``latest.json`` is then replaced atomically with ``os.replace``.

    Examples
    --------
    >>> import tempfile, numpy as np
    >>> from calmon.calibration import make_calibrator
    >>> store = DirectoryStore(tempfile.mkdtemp())
    >>> cal = make_calibrator("platt").fit(np.array([0.2, 0.4, 0.6, 0.8]), np.array([0, 1, 0, 1]))
    >>> doc = cal.to_document(); doc.update(model="m", revision=1)
    >>> store.publish("m", doc)["revision"], store.latest_revision("m")
    (1, 1)
    """

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = Path(root)

    def _dir(self, model: str) -> Path:
        return self.root / _model_dir(model)

    def revisions(self, model: str) -> list[int]:
        d = self._dir(model)
        if not d.is_dir():
            return []
        out = []
        for p in d.glob("rev-*.json"):
            try:
                out.append(int(p.stem[4:]))
            except ValueError:
                continue
        return sorted(out)

    def latest_revision(self, model: str) -> int | None:
        revs = self.revisions(model)
        return revs[-1] if revs else None

    def path(self, model: str, revision: int) -> Path:
        return self._dir(model) / f"rev-{int(revision):06d}.json"

    def publish(self, model: str, document: dict[str, Any]) -> dict[str, Any]:
        revision = int(document["revision"])
        d = self._dir(model)
        d.mkdir(parents=True, exist_ok=True)
        final = self.path(model, revision)
        data = (json.dumps(document, indent=2, allow_nan=False) + "\n").encode()
        fd, tmp = tempfile.mkstemp(prefix=".rev.", suffix=".tmp", dir=d)
        try:
            with os.fdopen(fd, "wb") as fh:
                fh.write(data)
                fh.flush()
                os.fsync(fh.fileno())
            try:
                os.link(tmp, final)  # atomic, fails if the revision exists
            except FileExistsError:
                raise ValueError(f"revision {revision} of model {model!r} already exists at {final}") from None
            except OSError:  # file systems without hard links
                if final.exists():
                    raise ValueError(f"revision {revision} of model {model!r} already exists at {final}") from None
                os.replace(tmp, final)
            latest_tmp = d / f".latest.{os.getpid()}.tmp"
            if os.path.exists(tmp):
                os.replace(tmp, latest_tmp)
            else:
                latest_tmp.write_bytes(data)
            os.replace(latest_tmp, d / "latest.json")
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
        return {"publisher": "directory", "revision": revision, "path": str(final)}

    def load_document(self, model: str, revision: int | None = None) -> dict[str, Any] | None:
        """The document of ``revision`` (default the latest), or None if the model has none."""
        rev = self.latest_revision(model) if revision is None else revision
        if rev is None:
            return None
        doc = json.loads(self.path(model, rev).read_text(encoding="utf-8"))
        if doc.get("format") != FORMAT:
            raise CalibratorError(f"{self.path(model, rev)} is not a calibrator document")
        return doc

    def load(self, model: str, revision: int | None = None) -> Calibrator | None:
        """The calibrator of ``revision`` (default the latest), or None."""
        doc = self.load_document(model, revision)
        return None if doc is None else Calibrator.from_document(doc)


# -- refresh ------------------------------------------------------------------------------------------
@dataclass
class MethodSpec:
    """A configured method: registry name plus constructor options (e.g. ``{"link": "probit"}``)."""

    method: str
    options: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def parse(cls, spec: str | dict[str, Any] | MethodSpec) -> MethodSpec:
        """From ``"platt"``, ``{"method": "platt", "link": "probit"}`` or a MethodSpec."""
        if isinstance(spec, MethodSpec):
            return spec
        if isinstance(spec, str):
            return cls(spec)
        if isinstance(spec, dict) and isinstance(spec.get("method"), str):
            opts = {k: v for k, v in spec.items() if k != "method"}
            opts = opts.get("options", opts) if set(opts) == {"options"} else opts
            return cls(spec["method"], dict(opts))
        raise ValueError(f"method spec must be a name or {{'method': name, ...options}}, got {spec!r}")

    @property
    def label(self) -> str:
        if not self.options:
            return self.method
        return self.method + "(" + ",".join(f"{k}={v}" for k, v in sorted(self.options.items())) + ")"


def improves(after: dict[str, Any], before: dict[str, Any]) -> bool:
    """True iff held-out NLL and debiased l2-ECE are both strictly lower."""
    keys = ("nll", "ece_l2_debiased")
    if not all(np.isfinite(after.get(k, np.nan)) and np.isfinite(before.get(k, np.nan)) for k in keys):
        return False
    return all(after[k] < before[k] for k in keys)


def refresh(train: Any, holdout: Any, methods: Sequence[str | dict[str, Any] | MethodSpec], *,
            model: str = "default", publishers: Sequence[Publisher] = (), current: Calibrator | None = None,
            window: dict[str, Any] | None = None, bins: int = 15, min_train: int = 200, min_holdout: int = 200,
            created_at: str | None = None) -> dict[str, Any]:
    """Fit ``methods`` on ``train``, evaluate on ``holdout``, publish the best strict improvement.

    Parameters
    ----------
    train, holdout
        :class:`calmon.testers.CalibrationData` (a window and a later bucket, or a hash split, see
        :func:`split_arrays`).
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
    min_train, min_holdout
        Below these sizes nothing is fitted or published (``reason = "insufficient data"``).

    Returns
    -------
    dict
        JSON-able: ``model``, ``published`` (bool), ``revision`` (int or None), ``method``, ``params``,
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
    >>> res["published"], res["revision"], res["after"]["nll"] < res["before"]["nll"]
    (True, 1, True)
    """
    specs = [MethodSpec.parse(m) for m in methods]
    if not specs:
        raise ValueError("refresh needs at least one method")
    result: dict[str, Any] = {"model": model, "published": False, "revision": None, "method": None, "params": None,
                              "before": None, "current": None, "after": None, "candidates": [],
                              "n_train": int(train.n), "n_holdout": int(holdout.n), "published_to": []}
    if train.n < min_train or holdout.n < min_holdout:
        result["reason"] = "insufficient data"
        return _jsonable(result)
    if current is None:
        for pub in publishers:
            loader = getattr(pub, "load", None)
            if callable(loader):
                try:
                    current = loader(model)
                except (CalibratorError, OSError, ValueError):
                    current = None
                if current is not None:
                    break
    before = evaluate(None, holdout, bins)
    result["before"] = before
    baseline = before
    if current is not None:
        try:
            baseline = evaluate(current, holdout, bins)
            result["current"] = {**baseline, "method": current.method}
        except ValueError:
            current = None
    best: tuple[float, Calibrator, MethodSpec, dict[str, Any]] | None = None
    for spec in specs:
        entry: dict[str, Any] = {"method": spec.method, "label": spec.label, "options": spec.options,
                                 "after": None, "improves": False, "error": None}
        try:
            cal = make_calibrator(spec.method, **spec.options).fit_data(train)
            after = evaluate(cal, holdout, bins)
        except (ValueError, TypeError, NotImplementedError, np.linalg.LinAlgError) as exc:
            entry["error"] = f"{type(exc).__name__}: {exc}"
            result["candidates"].append(entry)
            continue
        entry["after"] = after
        entry["params"] = cal.get_params()
        entry["improves"] = improves(after, baseline)
        result["candidates"].append(entry)
        if entry["improves"] and (best is None or after["nll"] < best[0]):
            best = (after["nll"], cal, spec, after)
    if best is None:
        result["reason"] = "no candidate improves held-out NLL and debiased ECE"
        return _jsonable(result)
    _, cal, spec, after = best
    known = []
    for pub in publishers:
        latest = getattr(pub, "latest_revision", None)
        rev = latest(model) if callable(latest) else None
        if rev is not None:
            known.append(int(rev))
    revision = (max(known) if known else 0) + 1
    evaluation = {"holdout_n": int(holdout.n), "bins": bins, "before": before, "after": after}
    if result["current"] is not None:
        evaluation["current"] = result["current"]
    training = {"window": window} if window else {}
    doc = cal.to_document(training={**training, "window_n": int(train.n)}, evaluation=evaluation,
                          created_at=created_at)
    doc["model"] = model
    doc["revision"] = revision
    doc["options"] = spec.options
    ok = not publishers
    for pub in publishers:
        name = type(pub).__name__
        try:
            out = pub.publish(model, doc)
        except Exception as exc:  # noqa: BLE001 - one sink failing (e.g. Kafka down) must not hide the others
            result["published_to"].append({"publisher": name, "error": f"{type(exc).__name__}: {exc}"})
            continue
        ok = True
        result["published_to"].append(out if isinstance(out, dict) else {"publisher": name, "revision": revision})
    result.update(published=ok, revision=revision if ok else None, method=spec.method, label=spec.label,
                  params=cal.get_params(), after=after, reason="improved" if ok else "every publisher failed",
                  document=doc)
    return _jsonable(result)


def metric_samples(result: dict[str, Any]) -> list[tuple[str, dict[str, str], float]]:
    """Flatten a :func:`refresh` result into ``(name, labels, value)`` samples for the exporter.

    Names: ``calmon_calibrator_revision``, ``calmon_calibrator_published`` (1/0 this run),
    ``calmon_calibrator_param`` (label ``param``), ``calmon_calibrator_heldout_error`` (labels ``stage`` =
    before/after, ``metric`` = nll/ece/ece_l2_debiased/brier).

    Examples
    --------
    >>> metric_samples({"model": "m", "published": False, "revision": None, "before": {"nll": 0.5}})[0]
    ('calmon_calibrator_published', {'model': 'm'}, 0.0)
    """
    model = str(result.get("model", "default"))
    out: list[tuple[str, dict[str, str], float]] = [
        ("calmon_calibrator_published", {"model": model}, float(bool(result.get("published"))))]
    if result.get("revision") is not None:
        out.append(("calmon_calibrator_revision", {"model": model, "method": str(result.get("method"))},
                    float(result["revision"])))
    for k, v in (result.get("params") or {}).items():
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            out.append(("calmon_calibrator_param", {"model": model, "param": k}, float(v)))
    for stage in ("before", "after"):
        for metric, v in (result.get(stage) or {}).items():
            if metric in ("nll", "ece", "ece_l2_debiased", "brier") and v is not None:
                out.append(("calmon_calibrator_heldout_error", {"model": model, "stage": stage, "metric": metric},
                            float(v)))
    return out
