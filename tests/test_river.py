"""calmon.river: river metrics that give what ``calmon check`` gives, with exact ``revert`` and ``utils.Rolling``."""

from __future__ import annotations

import json
import math
import subprocess
import sys
import warnings
from typing import Any

import numpy as np
import pytest
from river import datasets, evaluate, linear_model, metrics, preprocessing, utils

import calmon.river
from calmon.river import ECE, CalibrationMetric, CalibrationTest, DebiasedL2ECE, SmoothCE
from calmon.stats.grid import ScoreGrid

TOL = 1e-9
#: Scores are summed in fixed point of resolution 2**-28, so a binned mean score is off by at most 2**-29.
QUANTUM_ERROR = 2.0 ** -29 + 1e-15
ALL: tuple[type[CalibrationMetric[Any]], ...] = (ECE, DebiasedL2ECE, SmoothCE, CalibrationTest)


def check_json(tmp_path, name, events, *tests: str) -> dict:
    """``calmon check FILE --json`` (with T-Cal on the grid, as the metric runs it) on JSONL events."""
    path = tmp_path / name
    path.write_text("".join(json.dumps({"model": "m", **e}) + "\n" for e in events))
    args = [sys.executable, "-m", "calmon", "check", str(path), "--json"]
    if tests:
        args += ["--tests", ",".join(tests)]
    if "tcal" in tests:
        args += ["--test-param", "tcal.method=mc-grid"]
    out = subprocess.run(args, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def binary_pairs(n: int, seed: int, centres: bool = False, slope: float = 0.8) -> tuple[np.ndarray, np.ndarray]:
    """Over-confident binary scores with Bernoulli labels; ``centres`` puts every score on a grid-cell centre."""
    rng = np.random.default_rng(seed)
    z = rng.beta(2.0, 2.0, n)
    if centres:
        z = (np.floor(z * 4096) + 0.5) / 4096
    truth = 0.5 + slope * (z - 0.5)
    return z, (rng.random(n) < truth).astype(int)


def fed(metric, z, y, as_dict: bool = True):
    for zi, yi in zip(z, y):
        metric.update(bool(yi), {True: float(zi), False: 1.0 - float(zi)} if as_dict else float(zi))
    return metric


def numpy_ece(z, y, bins: int = 15) -> float:
    """Plain ECE: 15 equal-width bins, ``sum_b |mean(y) - mean(p)| * n_b / n``."""
    z, y = np.asarray(z, float), np.asarray(y, float)
    idx = np.minimum((z * bins).astype(int), bins - 1)
    total = 0.0
    for b in range(bins):
        sel = idx == b
        if sel.any():
            total += abs(y[sel].mean() - z[sel].mean()) * sel.sum() / len(z)
    return total


@pytest.fixture(scope="module")
def binary_case(tmp_path_factory):
    z, y = binary_pairs(4000, seed=11)
    doc = check_json(tmp_path_factory.mktemp("bin"), "b.jsonl",
                     [{"score": float(a), "label": int(b)} for a, b in zip(z, y)], "tcal", "smce")
    return z, y, doc


def test_ece_and_debiased_l2_match_check(binary_case):
    z, y, doc = binary_case
    m = doc["metrics"]
    assert fed(ECE(), z, y).get() == pytest.approx(m["ece"], abs=TOL)
    assert fed(ECE(), z, y, as_dict=False).get() == pytest.approx(m["ece"], abs=TOL)
    l2 = fed(DebiasedL2ECE(), z, y)
    assert l2.get() == pytest.approx(m["ece_l2_debiased"], abs=TOL)
    assert l2.scale == m["l2_bins"]


def test_calibration_test_matches_check_tcal(binary_case):
    z, y, doc = binary_case
    t = fed(CalibrationTest(), z, y)
    ref = doc["tests"]["tcal"]
    assert ref["method"] == t.result.method
    assert t.get() == pytest.approx(ref["p_value"], abs=TOL)
    assert t.result.statistic == pytest.approx(ref["statistic"], abs=TOL)
    assert t.decision == ref["decision"]
    assert repr(t).startswith("CalibrationTest: ") and repr(t).endswith(f"({ref['decision']})")


def test_smooth_ce_within_its_bound_of_checks_raw_smce(binary_case):
    z, y, doc = binary_case
    s = fed(SmoothCE(), z, y)
    ref = doc["tests"]["smce"]
    assert ref["source"] == "raw"
    assert 0 < s.error_bound < 1e-3
    assert abs(s.get() - ref["value"]) <= s.error_bound


def test_smooth_ce_and_monte_carlo_tcal_equal_check_when_scores_are_cell_centres(tmp_path):
    z, y = binary_pairs(3000, seed=12, centres=True, slope=0.87)  # borderline: T-Cal has to simulate
    doc = check_json(tmp_path, "c.jsonl", [{"score": float(a), "label": int(b)} for a, b in zip(z, y)],
                     "tcal", "smce")
    assert fed(SmoothCE(), z, y).get() == pytest.approx(doc["tests"]["smce"]["value"], abs=TOL)
    assert fed(ECE(), z, y).get() == pytest.approx(doc["metrics"]["ece"], abs=TOL)
    t, ref = fed(CalibrationTest(), z, y), doc["tests"]["tcal"]
    assert t.result.method == ref["method"] == "mc-grid" and ref["mc_draws"] > 0
    assert t.get() == pytest.approx(ref["p_value"], abs=TOL) and t.decision == ref["decision"]
    assert json.loads(json.dumps(t.result.to_dict())) == ref  # the whole result, key for key


def test_multiclass_top_label_matches_check(tmp_path):
    rng = np.random.default_rng(13)
    probs = rng.dirichlet([0.6, 0.6, 0.6], 3000)
    labels = np.array([rng.choice(3, p=0.7 * p + 0.1) for p in probs])
    doc = check_json(tmp_path, "m.jsonl", [{"probs": p.tolist(), "label": int(k)} for p, k in zip(probs, labels)],
                     "tcal")
    ms: list[CalibrationMetric[Any]] = [ECE(top_label=True), DebiasedL2ECE(top_label=True),
                                        CalibrationTest(top_label=True)]
    for p, k in zip(probs, labels):
        for m in ms:
            m.update(int(k), {c: float(v) for c, v in enumerate(p)})
    assert ms[0].get() == pytest.approx(doc["metrics"]["ece"], abs=TOL)
    assert ms[1].get() == pytest.approx(doc["metrics"]["ece_l2_debiased"], abs=TOL)
    top = doc["tests"]["tcal"]["views"]["top_label"]  # multiclass: check's tcal is canonical; top-label is a view
    assert ms[2].get() == pytest.approx(top["p_value"], abs=TOL)
    assert isinstance(ms[2], CalibrationTest) and ms[2].decision == top["decision"]


def test_rolling_ece_is_the_ece_of_the_last_1000_pairs():
    z, y = binary_pairs(5000, seed=14)
    rolling = utils.Rolling(ECE, window_size=1000)
    for i, (zi, yi) in enumerate(zip(z, y)):
        rolling.update(bool(yi), {True: float(zi), False: 1.0 - float(zi)})
        if i % 250 == 0 or i == len(z) - 1:
            lo = max(0, i - 999)
            # a short window can sit near the fixed-point bound; a full one is far inside 1e-9
            tol = TOL if i >= 999 else QUANTUM_ERROR
            assert rolling.obj.get() == pytest.approx(numpy_ece(z[lo:i + 1], y[lo:i + 1]), abs=tol)
    assert rolling.obj.grid == fed(ECE(), z[-1000:], y[-1000:]).grid  # bit-identical state


def test_rolling_with_an_instance_as_the_issue_writes_it():
    z, y = binary_pairs(1500, seed=15)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # river >= 0.24 prefers the class
        rolling = utils.Rolling(calmon.river.ECE(), 1000)
    fed(rolling, z, y)
    assert rolling.obj.get() == pytest.approx(numpy_ece(z[-1000:], y[-1000:]), abs=TOL)


@pytest.mark.parametrize("cls", ALL)
def test_rolling_equals_a_fresh_metric_on_the_window(cls):
    z, y = binary_pairs(1200, seed=16)
    rolling = utils.Rolling(cls, window_size=500)
    fed(rolling, z, y)
    fresh = fed(cls(), z[-500:], y[-500:])
    assert rolling.obj.grid == fresh.grid
    assert rolling.obj.get() == fresh.get()


@pytest.mark.parametrize("cls", ALL)
def test_revert_is_exact(cls):
    z, y = binary_pairs(800, seed=17)
    m = fed(cls(), z[:500], y[:500])
    before, value = m.grid.copy(), m.get()
    fed(m, z[500:], y[500:])
    order = np.random.default_rng(0).permutation(np.arange(500, 800))
    for i in order:
        m.revert(bool(y[i]), {True: float(z[i]), False: 1.0 - float(z[i])})
    assert m.grid == before and m.get() == value
    for i in range(500):
        m.revert(bool(y[i]), float(z[i]))
    assert m.grid == ScoreGrid(m.bins) and m.n == 0
    fresh = cls()
    assert repr(m) == repr(fresh)


def test_phishing_progressive_validation_matches_check(tmp_path):
    model = preprocessing.StandardScaler() | linear_model.LogisticRegression()
    score = evaluate.progressive_val_score(datasets.Phishing(), model.clone(), ECE())
    assert isinstance(score, ECE) and 0.0 < score.get() < 0.5
    # the same predictions by hand, then calmon check on them
    ms: list[CalibrationMetric[Any]] = [ECE(), DebiasedL2ECE(), CalibrationTest()]
    pairs = []
    for x, label in datasets.Phishing():
        p = model.predict_proba_one(x)
        for m in ms:
            m.update(label, p)
        pairs.append({"score": p.get(True, 0.0), "label": int(label)})
        model.learn_one(x, label)
    assert ms[0].get() == score.get()
    doc = check_json(tmp_path, "phishing.jsonl", pairs, "tcal")
    assert ms[0].get() == pytest.approx(doc["metrics"]["ece"], abs=TOL)
    assert ms[1].get() == pytest.approx(doc["metrics"]["ece_l2_debiased"], abs=TOL)
    assert ms[2].get() == pytest.approx(doc["tests"]["tcal"]["p_value"], abs=TOL)


def test_combines_with_river_metrics():
    model = preprocessing.StandardScaler() | linear_model.LogisticRegression()
    acc, smce, l2 = metrics.Accuracy(), SmoothCE(), DebiasedL2ECE()
    evaluate.progressive_val_score(datasets.Phishing(), model, acc + smce + l2)
    assert 0.8 < acc.get() < 1.0 and 0.0 < smce.get() < 0.2 and -0.1 < l2.get() < 0.1


def test_river_conventions():
    m = ECE()
    assert not m.bigger_is_better and CalibrationTest().bigger_is_better
    assert not m.requires_labels and not m.works_with_weights
    assert m.works_with(linear_model.LogisticRegression())
    assert not m.works_with(linear_model.LinearRegression())
    assert m.get() == 0.0 and repr(m) == "ECE: 0.00%"
    t = CalibrationTest()
    assert math.isnan(t.get()) and t.decision == "insufficient data"
    clone = DebiasedL2ECE(l2_bins=8).clone()
    assert clone.l2_bins == 8 and clone.n == 0


def test_labels_and_probability_shapes():
    a, b, c = ECE(pos_val=1), ECE(), ECE()
    a.update(1, {0: 0.3, 1: 0.7})
    b.update(True, 0.7)
    c.update(True, {True: 0.7})  # a missing class has probability 0
    assert a.grid == b.grid == c.grid
    with pytest.raises(ValueError, match="top_label=True"):
        ECE().update(0, {0: 0.2, 1: 0.3, 2: 0.5})
    with pytest.raises(ValueError, match="in \\[0, 1\\]"):
        ECE().update(True, 1.5)
    with pytest.raises(ValueError, match="in \\[0, 1\\]"):
        ECE().update(True, float("nan"))
    with pytest.raises(ValueError, match="weights"):
        ECE().update(True, 0.5, w=2.0)
    top = ECE(top_label=True)
    top.update("b", {"a": 0.2, "b": 0.5, "c": 0.3})
    top.update("a", {"a": 0.1, "b": 0.9})
    assert top.get() == pytest.approx((0.5 + 0.9) / 2)  # |1 - 0.5| and |0 - 0.9| in their own bins


def test_revert_of_an_unseen_pair_is_refused_and_leaves_the_state():
    m = ECE()
    m.update(True, 0.9)
    m.revert(False, 0.1)
    with pytest.raises(ValueError, match="never updated"):
        m.get()
    expected = ScoreGrid(15)
    expected.update(np.array([0.9]), np.array([1.0]))
    assert m.grid == expected


def test_invalid_parameters():
    with pytest.raises(ValueError):
        DebiasedL2ECE(bins=1000)
    with pytest.raises(ValueError):
        DebiasedL2ECE(l2_bins=3)
    with pytest.raises(ValueError):
        SmoothCE(point="median")
    with pytest.raises(ValueError):
        CalibrationTest(alpha=1.5)
    with pytest.raises(ValueError):
        CalibrationTest(method="mc-raw")
    for bad in ({"method": "nope"}, {"combine": "max"}, {"bins": 1000}, {"mc": -1}):
        with pytest.raises(ValueError):
            CalibrationTest(**bad)
