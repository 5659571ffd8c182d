import numpy as np
import pytest

from calmon.algorithms.ece import (
    brier,
    classwise_ece,
    ece_l1,
    ece_l1_raw,
    l2_ece_squared,
    l2_ece_squared_raw,
    reliability,
    summary,
)
from calmon.stats.grid import ScoreGrid
from calmon.stats.model import ModelStats

# T-Cal Tables 1-3, row "None": 15-bin l1-ECE in percent
TABLE_NONE = {
    "cifar10_densenet121": 2.02, "cifar10_resnet50": 2.23, "cifar10_vgg19_bn": 2.13,
    "cifar100_mobilenetv2_x1_4": 11.87, "cifar100_resnet56": 15.2, "cifar100_shufflenetv2_x2_0": 9.08,
    "imagenet_densenet161": 5.67, "imagenet_resnet152": 4.99, "imagenet_efficientnet_b7": 2.82,
}


def test_reproduces_tcal_tables_none_row(tcal_files):
    for f in tcal_files:
        d = np.load(f)
        z, y = d["confidence"].astype(float), d["correct"].astype(float)
        stats = ModelStats(bins=4096, reservoir=0)
        stats.update(score=z, labels=y.astype(int))
        from_stats = summary(stats, top_label=True)["ece"]
        assert round(100 * from_stats, 2) == pytest.approx(TABLE_NONE[f.stem], abs=1e-9), f.stem
        assert from_stats == pytest.approx(ece_l1_raw(z, y), abs=1e-9)


def _data(seed, n, shift=0.0):
    rng = np.random.default_rng(seed)
    z = rng.beta(2, 5, n)
    y = (rng.random(n) < np.clip(z + shift, 0, 1)).astype(float)
    return z, y


@pytest.mark.parametrize("bins", [2, 8, 64, 1024])
@pytest.mark.parametrize("debiased", [True, False])
def test_l2_ece_from_grid_equals_pairwise_form(bins, debiased):
    z, y = _data(1, 5000, 0.05)
    g = ScoreGrid(4096)
    g.update(z, y)
    assert l2_ece_squared(g, bins, debiased) == pytest.approx(l2_ece_squared_raw(z, y, bins, debiased), abs=1e-8)


def test_debiased_is_unbiased_under_calibration_and_plugin_is_not():
    dpe, plug = [], []
    for seed in range(200):
        z, y = _data(seed, 2000)
        g = ScoreGrid(64)
        g.update(z, y)
        dpe.append(l2_ece_squared(g, 64))
        plug.append(l2_ece_squared(g, 64, debiased=False))
    se = np.std(dpe) / np.sqrt(len(dpe))
    assert abs(np.mean(dpe)) < 4 * se
    assert np.mean(plug) > 10 * se  # plug-in is biased upward by about sum_i Var_i / n


def test_brier_and_reliability_match_raw():
    z, y = _data(2, 3000, 0.1)
    g = ScoreGrid(4096)
    g.update(z, y)
    assert brier(g) == pytest.approx(np.mean((z - y) ** 2), abs=1e-7)
    pts = reliability(g, 16)
    idx = np.minimum((z * 16).astype(int), 15)
    for i, p in enumerate(pts):
        sel = idx == i
        assert p["events"] == sel.sum()
        if sel.any():
            assert p["mean_score"] == pytest.approx(z[sel].mean(), abs=1e-7)
            assert p["mean_outcome"] == pytest.approx(y[sel].mean(), abs=1e-12)
    assert ece_l1(g.coarsen(16)) == pytest.approx(ece_l1_raw(z, y, 16), abs=1e-7)


def test_multiclass_summary_matches_raw():
    rng = np.random.default_rng(3)
    probs = rng.dirichlet(np.ones(4), 5000)
    labels = np.array([rng.choice(4, p=p) for p in probs])
    s = ModelStats(classes=4, reservoir=100)
    s.update(probs=probs, labels=labels)
    m = summary(s)
    onehot = np.eye(4)[labels]
    assert m["brier"] == pytest.approx(np.mean(((probs - onehot) ** 2).sum(axis=1)), abs=1e-7)
    pred = probs.argmax(axis=1)
    assert m["accuracy"] == pytest.approx(np.mean(pred == labels))
    conf = probs.max(axis=1)
    assert m["ece"] == pytest.approx(ece_l1_raw(conf, (pred == labels).astype(float)), abs=1e-7)
    cw = np.mean([ece_l1_raw(probs[:, k], onehot[:, k]) for k in range(4)])
    assert classwise_ece(s.classwise) == pytest.approx(cw, abs=1e-7)


def test_binary_accuracy_uses_half_threshold():
    s = ModelStats(reservoir=0)
    s.update(score=np.array([0.5, 0.49, 0.9, 0.1]), labels=np.array([1, 1, 0, 0]))
    assert summary(s)["accuracy"] == 0.5
