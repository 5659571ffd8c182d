"""Scheduled refresh: hash split, held-out metrics, publish only strict improvements, versioned store."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from calmon.calibration import make_calibrator
from calmon.calibration.refresh import (
    DirectoryStore,
    MethodSpec,
    binary_metrics,
    evaluate,
    grid_metrics,
    hash_split,
    metric_samples,
    refresh,
    split_arrays,
)
from calmon.stats.data import CalibrationData
from calmon.stats.grid import ScoreGrid


def _stream(seed: int, n: int, power: float) -> tuple[list[str], np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    z = rng.uniform(0.02, 0.98, n)
    y = (rng.uniform(size=n) < z**power).astype(float)
    return [f"ev-{seed}-{i}" for i in range(n)], z, y


def test_hash_split_is_deterministic_and_balanced() -> None:
    ids = [f"id{i}" for i in range(20000)]
    m = hash_split(ids, 0.25, "s")
    assert np.array_equal(m, hash_split(ids, 0.25, "s"))
    assert abs(m.mean() - 0.25) < 0.015  # binomial sd 0.003
    assert not np.array_equal(m, hash_split(ids, 0.25, "other-salt"))
    # an id's side does not depend on the other ids in the window
    assert np.array_equal(hash_split(ids[100:200], 0.25, "s"), m[100:200])


def test_binary_metrics_against_brute_force() -> None:
    rng = np.random.default_rng(0)
    p = rng.uniform(size=999)
    y = (rng.uniform(size=999) < p).astype(float)
    m = binary_metrics(p, y, bins=10)
    ece = dpe = 0.0
    for b in range(10):
        sel = (p >= b / 10) & (p < (b + 1) / 10)
        if sel.any():
            ece += abs(y[sel].sum() - p[sel].sum())
            r = y[sel] - p[sel]
            dpe += (r.sum() ** 2 - (r**2).sum()) / sel.sum()
    assert m["ece"] == pytest.approx(ece / 999, abs=1e-12)
    assert m["ece_l2_debiased"] == pytest.approx(dpe / 999, abs=1e-12)
    assert m["nll"] == pytest.approx(-np.mean(y * np.log(p) + (1 - y) * np.log(1 - p)))


def test_grid_metrics_close_to_raw() -> None:
    _, z, y = _stream(1, 20000, 2.0)
    g = ScoreGrid(4096)
    g.update(z, y)
    cal = make_calibrator("platt").fit(z, y)
    raw = binary_metrics(cal.predict(z), y)
    approx = grid_metrics(g, cal)
    assert approx["nll"] == pytest.approx(raw["nll"], abs=1e-3)
    assert approx["ece"] == pytest.approx(raw["ece"], abs=2e-3)
    ident = grid_metrics(g, None)
    assert ident["nll"] == pytest.approx(binary_metrics(z, y)["nll"], abs=1e-3)
    assert ident["brier"] == pytest.approx(binary_metrics(z, y)["brier"], abs=1e-9)


def test_refresh_publishes_improvement_then_not_a_copy(tmp_path: Path) -> None:
    ids, z, y = _stream(2, 12000, 2.0)  # over-confident scores: recalibration helps
    train, hold = split_arrays(ids, z=z, y=y, fraction=0.3)
    store = DirectoryStore(tmp_path)
    res = refresh(train, hold, ["platt", {"method": "platt", "link": "probit"}, "isotonic", "histogram"],
                  model="fraud/v1", publishers=[store], window={"start": 0, "end": 3600},
                  created_at="2026-01-01T00:00:00Z").to_dict()
    assert res["published"] and res["revision"] == 1
    assert res["after"]["nll"] < res["before"]["nll"]
    assert res["after"]["ece_l2_debiased"] < res["before"]["ece_l2_debiased"]
    chosen = [c for c in res["candidates"] if c["improves"]]
    assert res["after"]["nll"] == min(c["after"]["nll"] for c in chosen)
    json.dumps(res, allow_nan=False)
    files = sorted(p.name for p in (tmp_path / "fraud%2Fv1").iterdir())
    assert files == ["latest.json", "rev-000001.json"]
    doc = json.loads((tmp_path / "fraud%2Fv1" / "rev-000001.json").read_text())
    assert doc["revision"] == 1 and doc["model"] == "fraud/v1" and doc["training"]["window"]["end"] == 3600
    assert doc["evaluation"]["before"]["nll"] == res["before"]["nll"]
    back = store.load("fraud/v1")
    assert back is not None and hold.z is not None
    np.testing.assert_allclose(back.predict(hold.z), make_calibrator(res["method"], **doc["options"])
                               .fit_data(train).predict(hold.z))
    # same window again: the candidates equal the calibrator in service, so nothing is published
    res2 = refresh(train, hold, ["platt", "isotonic", "histogram"], model="fraud/v1", publishers=[store]).to_dict()
    assert not res2["published"] and res2["revision"] is None and store.latest_revision("fraud/v1") == 1
    assert res2["current"]["method"] == res["method"]


def test_refresh_never_publishes_a_worse_calibrator(tmp_path: Path) -> None:
    ids, z, y = _stream(3, 6000, 2.0)
    _, zc, yc = _stream(4, 6000, 1.0)  # holdout is already calibrated: a fit on the train window hurts
    train = CalibrationData(n=z.size, z=z, y=y, raw_is_complete=True)
    hold = CalibrationData(n=zc.size, z=zc, y=yc, raw_is_complete=True)
    store = DirectoryStore(tmp_path)
    res = refresh(train, hold, ["platt", "isotonic"], model="m", publishers=[store]).to_dict()
    assert not res["published"] and store.latest_revision("m") is None
    assert all(not c["improves"] for c in res["candidates"])
    assert all(c["after"]["nll"] > res["before"]["nll"] for c in res["candidates"])
    assert res["reason"].startswith("no candidate")


def test_refresh_small_windows_and_bad_methods(tmp_path: Path) -> None:
    ids, z, y = _stream(5, 300, 2.0)
    train, hold = split_arrays(ids, z=z, y=y, fraction=0.5)
    res = refresh(train, hold, ["platt"], publishers=[DirectoryStore(tmp_path)]).to_dict()
    assert res["reason"] == "insufficient data" and not res["published"]
    ids, z, y = _stream(6, 4000, 2.0)
    train, hold = split_arrays(ids, z=z, y=y, fraction=0.5)
    res = refresh(train, hold, ["temperature", "lp", "platt"], model="m").to_dict()  # lp needs multiclass data
    assert not res["candidates"][0].get("error") and res["candidates"][1]["error"]
    assert res["published"] and res["method"] in ("temperature", "platt")
    assert res["published_to"] == []
    with pytest.raises(ValueError, match="unknown calibration method"):
        make_calibrator(MethodSpec.parse({"method": "nope"}).method)


def test_refresh_from_window_grid_and_later_bucket(tmp_path: Path) -> None:
    """Agent shape: train = window minus the last bucket (grid subtraction), holdout = the last bucket."""
    _, z, y = _stream(7, 16000, 2.0)
    window, last = ScoreGrid(4096), ScoreGrid(4096)
    window.update(z, y)
    last.update(z[12000:], y[12000:])
    train = CalibrationData(n=12000, grid=window - last, z=z[:500], y=y[:500])  # reservoir is partial
    hold = CalibrationData(n=4000, grid=last)
    store = DirectoryStore(tmp_path)
    res = refresh(train, hold, ["platt"], model="m", publishers=[store]).to_dict()
    assert res["published"] and res["after"]["source"] == "grid"
    doc = store.load_document("m")
    assert doc is not None
    assert doc["training"]["source"] == "grid" and doc["training"]["n"] == 12000
    samples = metric_samples(res)
    names = {s[0] for s in samples}
    assert {"calmon_calibrator_revision", "calmon_calibrator_param", "calmon_calibrator_heldout_error"} <= names
    assert ("calmon_calibrator_revision", {"model": "m", "method": "platt"}, 1.0) in samples


def test_store_never_overwrites_a_revision(tmp_path: Path) -> None:
    store = DirectoryStore(tmp_path)
    _, z, y = _stream(8, 500, 1.0)
    doc = make_calibrator("platt").fit(z, y).to_document()
    doc.update(model="m", revision=1)
    store.publish("m", doc)
    with pytest.raises(ValueError, match="already exists"):
        store.publish("m", doc)
    assert [p.name for p in (tmp_path / "m").iterdir() if p.name.startswith(".")] == []  # no temp files left
    with pytest.raises(ValueError, match="invalid model"):
        store.publish("..", doc)


def test_evaluate_multiclass() -> None:
    from scipy import special

    rng = np.random.default_rng(9)
    logits = rng.normal(size=(3000, 5)) * 2
    labels = np.array([rng.choice(5, p=p) for p in special.softmax(logits, axis=1)])
    over = special.softmax(3 * logits, axis=1)
    data = CalibrationData(n=3000, probs=over, labels=labels, raw_is_complete=True)
    cal = make_calibrator("temperature").fit(over, labels)
    before, after = evaluate(None, data), evaluate(cal, data)
    assert after["nll"] < before["nll"] and after["ece"] < before["ece"]


class _MemoryPublisher:
    """Kafka-publisher shape: publish(model, doc) -> None, no latest_revision."""

    def __init__(self) -> None:
        self.sent: list[tuple[str, dict]] = []

    def publish(self, model: str, document: dict) -> None:
        self.sent.append((model, document))


class _BrokenPublisher:
    def publish(self, model: str, document: dict) -> None:
        raise ConnectionError("broker down")


def test_refresh_with_minimal_and_failing_publishers(tmp_path: Path) -> None:
    ids, z, y = _stream(10, 6000, 2.0)
    train, hold = split_arrays(ids, z=z, y=y, fraction=0.3)
    store, mem = DirectoryStore(tmp_path), _MemoryPublisher()
    res = refresh(train, hold, ["platt"], model="m", publishers=[store, mem, _BrokenPublisher()]).to_dict()
    assert res["published"] and res["revision"] == 1
    assert mem.sent[0][0] == "m" and mem.sent[0][1]["revision"] == 1
    assert res["published_to"][1] == {"publisher": "_MemoryPublisher", "revision": 1}
    assert "broker down" in res["published_to"][2]["error"]
    res = refresh(train, hold, ["platt"], model="m2", publishers=[_BrokenPublisher()]).to_dict()
    assert not res["published"] and res["revision"] is None and res["reason"] == "every publisher failed"
