"""A batch's models applied at once (calmon.state.ingest: one fold per kind of event, one feed of the change
detectors) against an eager model-by-model reference (tests/bucket_reference.py: each model's rings updated ring
by ring and bucket by bucket, each detector fed its pairs in record order by plain Python)."""

import json
import time

import numpy as np
import pytest
from bucket_reference import RefWindows

import calmon.state.agentstate as agentstate_module
import calmon.state.ingest as ingest_module
from calmon.algorithms.changepoint import CalibrationChangeDetector
from calmon.config import build_config
from calmon.state.agentstate import AgentState
from calmon.state.ingest import Ingestor
from calmon.state.monitors import ChangeMonitor
from connectors.base import Batch

CLOCK = 1_767_400_000.0


def _records(seed: int, models: int = 40, n: int = 6000) -> list[bytes]:
    """Binary models' predictions with delayed outcomes and labeled events, plus a multiclass model, a binary
    model sending ``probs`` and the join's and lateness's corner cases (outcomes without a model, early outcomes,
    duplicate ids, late labeled events, no ``ts``)."""
    rng = np.random.default_rng(seed)
    out: list[tuple[float, dict]] = []
    t0 = CLOCK - 3700.0
    for i in range(n):
        t = t0 + 3600.0 * i / n
        m = f"m{int(rng.integers(models)):03d}"
        seg = str(rng.choice(["web", "app", "ios", ""]))
        p = float(rng.random())
        y = int(rng.random() < p)
        k = rng.random()
        if k < 0.45:
            out.append((t, {"type": "prediction", "id": f"p{i}", "model": m, "ts": t, "score": p, "segment": seg}))
            outcome = {"type": "outcome", "id": f"p{i}", "ts": t + float(rng.exponential(60)), "label": y}
            if rng.random() < 0.9:
                outcome["model"] = m
            out.append((outcome["ts"] - (120.0 if rng.random() < 0.05 else 0.0), outcome))  # some arrive early
        elif k < 0.85:
            late = rng.random() < 0.03
            out.append((t, {"type": "labeled", "model": m, "ts": t - (5 * 86400 if late else 0), "score": p,
                            "label": y, "segment": seg}))
        elif k < 0.9:
            probs = rng.dirichlet(np.ones(3)).tolist()
            out.append((t, {"type": "labeled", "model": "digits", "ts": t, "probs": probs, "label": int(y)}))
        elif k < 0.93:
            out.append((t, {"type": "labeled", "model": "two", "ts": t, "probs": [1 - p, p], "label": y}))
        elif k < 0.95:
            out.append((t, {"type": "prediction", "id": f"p{max(0, i - 3)}", "model": m, "ts": t, "score": p}))
        elif k < 0.96 and i > 0.98 * n:  # arrival time (the clock, just after the stream): only at its end
            out.append((t, {"type": "labeled", "model": m, "score": p, "label": y}))
        else:
            out.append((t, {"type": "labeled", "model": m, "ts": t, "score": p, "label": y, "segment": seg}))
    out.sort(key=lambda x: x[0])
    return [json.dumps(d).encode() for _, d in out]


def _state(records: list[bytes], batch: int, reservoir: int = 64) -> str:
    cfg = build_config({"sources": [{"path": "x"}], "join": {"ttl": "30m"}, "windows": {"allowed_lateness": "1d"},
                        "models": {"default": {"bins": 64, "reservoir": reservoir, "segments": ["web", "app"]}},
                        "changes": {"block": 16}, "limits": {"max_models": 500}}, env={})
    st = AgentState(cfg)
    ing = Ingestor(st, None, lambda: CLOCK)
    for i in range(0, len(records), batch):
        ing.ingest(Batch(records[i:i + batch], {}, "s"))
    doc = st.to_doc()
    doc["counters"].pop("batches")
    return json.dumps(doc, sort_keys=True, default=str)


def _same(ours: str, ref: str) -> None:
    """Equal documents, else the first path where they differ (pytest's diff of two large strings takes minutes)."""
    if ours == ref:
        return

    def first(a, b, path):
        if type(a) is not type(b) or not isinstance(a, (dict, list)):
            return None if a == b else path
        keys = sorted(set(a) | set(b)) if isinstance(a, dict) else range(max(len(a), len(b)))
        for k in keys:
            try:
                got = first(a[k], b[k], f"{path}/{k}")
            except (KeyError, IndexError):
                return f"{path}/{k}"
            if got:
                return got
        return None

    pytest.fail(f"the documents differ at {first(json.loads(ours), json.loads(ref), '')}")


def _model_by_model(parts, ts, segment, labels, watermark, *, score=None, probs=None, predictions=False):
    """The reference of ``fold``: each model's events added to its rings on their own (RefWindows: ring by ring,
    bucket by bucket, eagerly)."""
    for mw, rows in parts:
        assert isinstance(mw, RefWindows)
        sc, pr = (None if score is None else score[rows]), (None if probs is None else probs[rows])
        if labels is None:
            mw.add_predictions(ts[rows], segment[rows], sc, pr, watermark)
        else:
            mw.add(ts[rows], segment[rows], labels[rows], sc, pr, watermark, predictions)


def _pair_by_pair(self, names, part, index, ts, p, y):
    """The reference of ``ChangeMonitor.feed``: per model in name order, its pairs in record order (ties in the
    order given) to its detector's own update."""
    if not self.cfg.enabled or not part.size:
        return
    by_model: dict[str, list[int]] = {}
    for j, k in enumerate(part.tolist()):
        by_model.setdefault(names[k], []).append(j)
    for name in sorted(by_model):
        js = sorted(by_model[name], key=lambda j: int(index[j]))
        self._detector(name).update(p[js], y[js], ts[js])


@pytest.mark.parametrize(("seed", "batch"), [(0, 1000), (1, 1000), (2, 1), (3, 13), (4, 65536)])
def test_batched_models_equal_model_by_model(seed, batch, monkeypatch):
    records = _records(seed, n=6000 if batch > 1 else 1500)
    taken: list[str] = []
    fold = ingest_module.fold

    def counting(parts, *args, **kw):
        taken.extend(mw.name for mw, _ in parts)
        return fold(parts, *args, **kw)

    monkeypatch.setattr(ingest_module, "fold", counting)
    ours = _state(records, batch)
    assert len(set(taken)) >= 30 and "digits" in taken  # the batch fold ran, for every model (multiclass too)
    monkeypatch.setattr(ingest_module, "fold", _model_by_model)  # every model on its own, eagerly
    monkeypatch.setattr(agentstate_module, "ModelWindows", RefWindows)
    monkeypatch.setattr(ChangeMonitor, "feed", _pair_by_pair)
    taken.clear()
    ref = _state(records, batch)
    assert not taken
    _same(ours, ref)
    doc = json.loads(ours)
    assert sum(doc["counters"]["late"].values()) > 5 and sum(doc["join"]["counters"]["joined"].values()) > 200
    assert sum(d["events"] for d in doc["changes"]["models"].values()) > 1000
    assert doc["changes"]["models"]["digits"]["events"] > 50  # the multiclass model's detector was fed


def test_update_many_equals_update_detector_by_detector():
    rng = np.random.default_rng(4)
    ours = [CalibrationChangeDetector(block=16, threshold=3.0, min_blocks=2) for _ in range(6)]
    ref = [CalibrationChangeDetector(block=16, threshold=3.0, min_blocks=2) for _ in range(6)]
    detections = 0
    for r in range(40):
        sizes = rng.integers(1, 30, 6)
        bounds = np.concatenate([[0], np.cumsum(sizes)]).tolist()
        n = bounds[-1]
        shift = 0.4 if r >= 20 else 0.0  # calibrated, then outcomes above the scores
        p = rng.random(n)
        y = (rng.random(n) < np.clip(p + shift, 0, 1)).astype(np.float64)
        ts = time.time() + np.arange(n, dtype=np.float64)
        CalibrationChangeDetector.update_many(ours, bounds, p, y, ts)
        for det, a, b in zip(ref, bounds, bounds[1:]):
            detections += len(det.update(p[a:b], y[a:b], ts[a:b]))
    assert [d.to_dict() for d in ours] == [d.to_dict() for d in ref]
    assert detections > 0  # blocks completed and alarms were raised, not only the sums' fast path


def test_update_many_needs_a_pair_per_detector():
    with pytest.raises(ValueError, match="at least one pair"):
        CalibrationChangeDetector.update_many([CalibrationChangeDetector(block=16)] * 2, [0, 3, 3], np.full(3, 0.5),
                                              np.ones(3), np.arange(3.0))
