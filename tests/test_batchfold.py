"""fold_binary (a batch's binary events into many models' rings at once) against ModelWindows.add model by model."""

import json

import numpy as np
import pytest

from calmon.state.batchfold import fold_binary
from calmon.state.buckets import ModelWindows

TIERS = [(60.0, 4), (600.0, 3), (3600.0, 2)]
SEGMENTS = ("web", "app")


def _models(n: int, other_tiers: bool = False) -> list[ModelWindows]:
    # models with other grid sizes, without segments, with another allow-list (and, optionally, other tiers)
    segments = {1: (), 3: ("app",)}
    return [ModelWindows(f"m{i}", 2, [(120.0, 3), (1200.0, 2)] if other_tiers and i == 4 else TIERS,
                         segments=segments.get(i, SEGMENTS), bins=32 if i == 2 else 64, reservoir=8)
            for i in range(n)]


def _doc(mw: ModelWindows) -> str:
    rings = {seg: {"versions": [sorted(v.items()) for v in ring.bucket_versions], "version": ring.version,
                   "archive_version": ring.archive_version, "doc": ring.to_dict(lambda b: b.to_dict())}
             for seg, ring in mw.rings.items()}
    return json.dumps(rings, sort_keys=True)


@pytest.mark.parametrize("span", [300.0, 20000.0])  # live-like (tier 0) and replay-like (rolls, archive)
@pytest.mark.parametrize("other_tiers", [False, True])
def test_fold_binary_equals_model_by_model(span, other_tiers):
    rng = np.random.default_rng(int(span))
    ours, ref = _models(5, other_tiers), _models(5, other_tiers)
    wm = 0.0
    for _ in range(6):
        n = int(rng.integers(0, 60))
        model = rng.integers(0, 5, n)
        ts = wm + rng.random(n) * span - span / 3  # some events behind the watermark (older tiers, archive)
        ts = np.maximum(ts, 0.0)
        seg = rng.choice(np.array(["web", "app", "", "other"], dtype=object), n)
        score = rng.random(n)
        labels = (rng.random(n) < score).astype(np.int64)
        wm = max(wm, float(ts.max()) if n else wm) + float(rng.integers(0, 2)) * span / 2
        for labeled, predictions in ((False, True), (True, True), (True, False)):
            lab = labels if labeled else None
            parts = [(mw, np.flatnonzero(model == i)) for i, mw in enumerate(ours)]
            fold_binary(parts, ts, seg, score, lab, wm, predictions)
            for i, mw in enumerate(ref):
                rows = np.flatnonzero(model == i)
                if lab is None:
                    mw.add_predictions(ts[rows], seg[rows], score[rows], None, wm)
                else:
                    mw.add(ts[rows], seg[rows], lab[rows], score[rows], None, wm, predictions)
    for a, b in zip(ours, ref):
        assert _doc(a) == _doc(b)
    assert sum(mw.rings["all"].window_sum(None).count for mw in ours) > 0


def test_watermark_behind_an_event_falls_back_to_model_by_model():
    ours, ref = _models(2), _models(2)
    ts = np.array([10.0, 900.0, 30.0])
    seg = np.array(["web", "app", "web"], dtype=object)
    score, labels = np.array([0.2, 0.6, 0.9]), np.array([0, 1, 1])
    fold_binary([(ours[0], np.array([0, 1])), (ours[1], np.array([2]))], ts, seg, score, labels, 100.0)
    ref[0].add(ts[:2], seg[:2], labels[:2], score[:2], None, 100.0)
    ref[1].add(ts[2:], seg[2:], labels[2:], score[2:], None, 100.0)
    assert [_doc(m) for m in ours] == [_doc(m) for m in ref]
    assert ours[0].rings["all"].watermark == 900.0
