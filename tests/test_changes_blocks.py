"""CalibrationChangeDetector closes blocks with reshaped sums (the full blocks of a batch at once): the state, the
changes returned and the events they name equal a block-by-block reference, however the pairs are split."""

from __future__ import annotations

import math

import numpy as np
import pytest

from calmon.algorithms.changepoint import _SCALE, CalibrationChangeDetector, Change, _Signal, _terms


def _reference(det: CalibrationChangeDetector, p: np.ndarray, y: np.ndarray, ts: np.ndarray) -> list[Change]:
    """``det.update`` pair by pair: each pair's terms added to the open block, a full block fed at once."""
    p = np.clip(p, 0.0, 1.0)
    out: list[Change] = []
    for name, sig in det.signals.items():
        num, var = _terms(name, p, y)
        for j in range(p.size):
            sig.num += int(num[j])
            sig.var += int(var[j])
            sig.count += 1
            if sig.count == det.block:
                out.extend(_close(det, name, sig, float(ts[j]), j + 1))
    det.events += p.size
    return out


def _close(det: CalibrationChangeDetector, name: str, sig: _Signal, end_ts: float, end: int) -> list[Change]:
    stat = sig.num / math.sqrt(sig.var * _SCALE) if sig.var > 0 else 0.0
    sig.num, sig.var, sig.count = 0, 0, 0
    direction = sig.feed(stat, end_ts)
    if direction is None:
        return []
    cp = sig.up_start if direction == "up" else sig.down_start
    change = Change(name, direction, end_ts, cp if math.isfinite(cp) else end_ts, det.events + end)
    det.detections[name] += 1
    det.last[name] = change
    return [change]


@pytest.mark.parametrize("seed", range(6))
def test_block_sums_equal_pair_by_pair(seed: int) -> None:
    rng = np.random.default_rng(seed)
    n = 30_000
    p = rng.random(n)
    shift = n // 2  # miscalibrated after the middle: the detectors fire
    y = (rng.random(n) < np.where(np.arange(n) < shift, p, np.clip(p + 0.25, 0, 1))).astype(np.float64)
    ts = np.cumsum(rng.random(n))
    det, ref = CalibrationChangeDetector(block=32, min_blocks=5), CalibrationChangeDetector(block=32, min_blocks=5)
    got: list[Change] = []
    want: list[Change] = []
    at = 0
    while at < n:
        m = int(rng.choice([0, 1, 7, 31, 32, 33, 64, 100, 1000, 5000]))
        got += det.update(p[at:at + m], y[at:at + m], ts[at:at + m])
        want += _reference(ref, p[at:at + m], y[at:at + m], ts[at:at + m])
        at += m
    assert want  # the shift was detected: the test compares changes, not only sums
    assert [c.to_dict() for c in got] == [c.to_dict() for c in want]
    assert det.to_dict() == ref.to_dict()
