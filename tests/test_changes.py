"""Sequential change detection on the calibration stream (calmon.algorithms.changepoint)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from calmon.algorithms.changepoint import SIGNALS, CalibrationChangeDetector


def calibrated(rng, n, dist="uniform"):
    q = rng.uniform(0.05, 0.95, n) if dist == "uniform" else np.clip(rng.beta(0.5, 0.5, n), 1e-4, 1 - 1e-4)
    return q, (rng.uniform(size=n) < q).astype(float)


def sigmoid(x):
    return 1 / (1 + np.exp(-x))


def logit(q):
    return np.log(q) - np.log1p(-q)


@pytest.mark.parametrize("dist", ["uniform", "beta"])
def test_no_false_alarm_on_calibrated_streams(dist):
    """Design rate ~1 per 2e7 events and signal: 3e6 calibrated events (x3 signals) should raise none."""
    rng = np.random.default_rng(11)
    det = CalibrationChangeDetector()
    alarms = []
    for k in range(3):
        q, y = calibrated(rng, 1_000_000, dist)
        alarms += det.update(q, y, k * 1e6 + np.arange(q.size, dtype=float))
    assert alarms == []
    assert det.events == 3_000_000


def test_block_statistic_is_standard_normal_under_calibration():
    """The block statistic's null law (the basis of the threshold): mean 0, variance 1 on skewed scores."""
    rng = np.random.default_rng(3)
    q = np.clip(rng.beta(0.3, 2.0, 256 * 8000), 1e-4, 1 - 1e-4)
    y = (rng.uniform(size=q.size) < q).astype(float)
    for w in (np.ones_like(q), 2 * q - 1):
        num = (w * (y - q)).reshape(-1, 256).sum(1)
        var = (w * w * q * (1 - q)).reshape(-1, 256).sum(1)
        s = num / np.sqrt(var)
        assert abs(s.mean()) < 4 / np.sqrt(s.size) and abs(s.var() - 1) < 0.06


@pytest.mark.parametrize("drift,signal", [
    (lambda q: sigmoid(logit(q) / 0.7), "confidence"),
    (lambda q: sigmoid(logit(q) + 0.3), "residual"),
    (lambda q: np.where(q > 0.8, sigmoid(logit(q) / 0.5), q), "high"),
])
def test_detects_drift_soon_and_locates_it(drift, signal):
    rng = np.random.default_rng(5)
    pre, post = 300_000, 100_000
    q, y = calibrated(rng, pre + post)
    p = q.copy()
    p[pre:] = drift(q[pre:])
    ts = np.arange(q.size, dtype=float)
    changes = CalibrationChangeDetector().update(p, y, ts)
    mine = [c for c in changes if c.signal == signal]
    assert mine, changes
    first = mine[0]
    assert pre <= first.detected_at < pre + 20_000  # within 20k events of the drift
    assert abs(first.change_point - pre) < 6_000   # the CUSUM's estimate of where it started


def test_batch_boundaries_do_not_matter():
    rng = np.random.default_rng(8)
    q, y = calibrated(rng, 200_000)
    q[120_000:] = sigmoid(logit(q[120_000:]) / 0.6)
    ts = np.arange(q.size, dtype=float)
    one = CalibrationChangeDetector()
    a = one.update(q, y, ts)
    two = CalibrationChangeDetector()
    cuts = np.sort(rng.choice(q.size, 300, replace=False))
    b = []
    for s, e in zip(np.r_[0, cuts], np.r_[cuts, q.size]):
        b += two.update(q[s:e], y[s:e], ts[s:e])
    assert a == b and a
    assert json.dumps(one.to_dict()) == json.dumps(two.to_dict())


def test_checkpoint_round_trip_continues_identically():
    rng = np.random.default_rng(9)
    q, y = calibrated(rng, 300_000)
    q[200_000:] = sigmoid(logit(q[200_000:]) + 0.4)
    ts = np.arange(q.size, dtype=float)
    ref = CalibrationChangeDetector()
    want = ref.update(q, y, ts)
    det = CalibrationChangeDetector()
    got = det.update(q[:150_001], y[:150_001], ts[:150_001])
    det = CalibrationChangeDetector.from_dict(json.loads(json.dumps(det.to_dict())))
    got += det.update(q[150_001:], y[150_001:], ts[150_001:])
    assert got == want and want
    assert det.to_dict() == ref.to_dict()


def test_bad_parameters():
    with pytest.raises(ValueError, match="block"):
        CalibrationChangeDetector(block=4)
    with pytest.raises(ValueError, match="unknown signals"):
        CalibrationChangeDetector(signals=("nope",))
    assert set(CalibrationChangeDetector().signals) == set(SIGNALS)


@pytest.mark.parametrize("temperature", [0.5, 2.0])
def test_stationary_miscalibration_is_not_a_change(temperature):
    """A model that is miscalibrated all along (but the same) raises no change: the detector finds changes."""
    rng = np.random.default_rng(12)
    det = CalibrationChangeDetector()
    alarms = []
    for k in range(3):
        q, y = calibrated(rng, 1_000_000, "beta")
        p = sigmoid(logit(q) / temperature)
        alarms += det.update(p, y, k * 1e6 + np.arange(q.size, dtype=float))
    assert alarms == []
