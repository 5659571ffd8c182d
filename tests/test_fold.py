"""fold (a batch's events into many models' rings at once) against the eager reference, ring by ring.

The reference (tests/bucket_reference.py) adds each model's events ring by ring, each ring grouping its
events by bucket itself, and computes each bucket's statistics eagerly with the grids' and model
statistics' own updates; the fold's buckets, versions and reservoirs must equal it document by document.
"""

import json

import numpy as np
import pytest
from bucket_reference import RefWindows

from calmon.state.buckets import ModelWindows, fold

TIERS = [(60.0, 4), (600.0, 3), (3600.0, 2)]
SEGMENTS = ("web", "app")


def _models(n: int, other_tiers: bool = False, ref: bool = False) -> list[ModelWindows]:
    # models with other grid sizes, without segments, with another allow-list (and, optionally, other tiers)
    segments = {1: (), 3: ("app",)}
    kind = RefWindows if ref else ModelWindows
    return [kind(f"m{i}", 2, [(120.0, 3), (1200.0, 2)] if other_tiers and i == 4 else TIERS,
                 segments=segments.get(i, SEGMENTS), bins=32 if i == 2 else 64, reservoir=8)
            for i in range(n)]


def _doc(mw: ModelWindows) -> str:
    rings = {seg: {"versions": [sorted(v.items()) for v in ring.bucket_versions], "version": ring.version,
                   "archive_version": ring.archive_version, "doc": ring.to_dict(lambda b: b.to_dict())}
             for seg, ring in mw.rings.items()}
    return json.dumps(rings, sort_keys=True)


@pytest.mark.parametrize("span", [300.0, 20000.0])  # live-like (tier 0) and replay-like (rolls, archive)
@pytest.mark.parametrize("other_tiers", [False, True])
def test_fold_equals_ring_by_ring(span, other_tiers):
    rng = np.random.default_rng(int(span))
    ours, ref = _models(5, other_tiers), _models(5, other_tiers, ref=True)
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
            fold(parts, ts, seg, lab, wm, score=score, predictions=predictions)
            for i, mw in enumerate(ref):
                rows = np.flatnonzero(model == i)
                if lab is None:
                    mw.add_predictions(ts[rows], seg[rows], score[rows], None, wm)
                else:
                    mw.add(ts[rows], seg[rows], lab[rows], score[rows], None, wm, predictions)
    for a, b in zip(ours, ref):
        assert _doc(a) == _doc(b)
    assert sum(mw.rings["all"].window_sum(None).count for mw in ours) > 0


@pytest.mark.parametrize("span", [300.0, 20000.0])
def test_fold_of_multiclass_models_equals_ring_by_ring(span):
    """Multiclass models (class-wise grid, reservoir rows of K + 1 columns, level sets) take the same fold."""
    rng = np.random.default_rng(7 + int(span))

    def models(kind: type[ModelWindows]) -> list[ModelWindows]:
        return [kind(f"k{i}", 4, TIERS, segments=SEGMENTS if i else (), bins=64, reservoir=8,
                     levelset_lambda=3 if i == 1 else None) for i in range(3)]

    ours, ref = models(ModelWindows), models(RefWindows)
    wm = 0.0
    for _ in range(5):
        n = int(rng.integers(1, 80))
        model = rng.integers(0, 3, n)
        ts = np.maximum(wm + rng.random(n) * span - span / 3, 0.0)
        seg = rng.choice(np.array(["web", "app", ""], dtype=object), n)
        probs = rng.dirichlet(np.ones(4), n)
        labels = rng.integers(0, 4, n)
        wm = max(wm, float(ts.max()))
        for lab in (None, labels):
            fold([(mw, np.flatnonzero(model == i)) for i, mw in enumerate(ours)], ts, seg, lab, wm, probs=probs,
                 predictions=True)
            for i, mw in enumerate(ref):
                rows = np.flatnonzero(model == i)
                if lab is None:
                    mw.add_predictions(ts[rows], seg[rows], None, probs[rows], wm)
                else:
                    mw.add(ts[rows], seg[rows], lab[rows], None, probs[rows], wm, True)
    for a, b in zip(ours, ref):
        assert _doc(a) == _doc(b)
    whole = ours[1].rings["all"].window_sum(None)
    assert whole.count > 0 and whole.stats.classwise is not None and whole.stats.classwise.count == 4 * whole.count
    assert whole.stats.levelset is not None and whole.stats.levelset.count == whole.count


def test_watermark_behind_an_event_falls_back_to_ring_by_ring():
    ours, ref = _models(2), _models(2, ref=True)
    ts = np.array([10.0, 900.0, 30.0])
    seg = np.array(["web", "app", "web"], dtype=object)
    score, labels = np.array([0.2, 0.6, 0.9]), np.array([0, 1, 1])
    fold([(ours[0], np.array([0, 1])), (ours[1], np.array([2]))], ts, seg, labels, 100.0, score=score)
    ref[0].add(ts[:2], seg[:2], labels[:2], score[:2], None, 100.0)
    ref[1].add(ts[2:], seg[2:], labels[2:], score[2:], None, 100.0)
    assert [_doc(m) for m in ours] == [_doc(m) for m in ref]
    assert ours[0].rings["all"].watermark == 900.0


def test_model_windows_add_is_the_fold():
    """ModelWindows.add / add_predictions: the fold of one model's events."""
    ours, ref = _models(1), _models(1, ref=True)
    ts = np.array([5.0, 70.0, 130.0, 20.0])
    seg = np.array(["web", "app", "", "web"], dtype=object)
    score, labels = np.array([0.1, 0.4, 0.8, 0.99]), np.array([0, 1, 1, 1])
    for mw in (ours[0], ref[0]):
        mw.add_predictions(ts, seg, score, None, 130.0)
        mw.add(ts, seg, labels, score, None, 130.0, True)
    assert _doc(ours[0]) == _doc(ref[0])
    assert ours[0].rings["web"].window_sum(None).count == 2
