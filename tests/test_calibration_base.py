"""Calibrator documents: JSON round trips of every method, validation, registry, no code execution."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from scipy import special

from calmon.calibration import (
    CALIBRATORS,
    Calibrator,
    CalibratorError,
    from_document,
    get_calibrator,
    load,
    make_calibrator,
)
from calmon.stats.data import CalibrationData
from calmon.stats.grid import ScoreGrid

BINARY = [("platt", {}), ("platt", {"link": "probit"}), ("platt", {"transform": "identity"}), ("isotonic", {}),
          ("histogram", {"bins": 7}), ("angular", {"link_scale": 3.0, "link_intercept": 1.0})]


def _binary_data(n: int = 3000) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    z = rng.uniform(0.01, 0.99, n)
    return z, (rng.uniform(size=n) < z**1.5).astype(float)


def test_builtin_registry() -> None:
    reg = CALIBRATORS
    assert {"platt", "angular", "temperature", "histogram", "isotonic"} <= set(reg)
    assert "lp" in CALIBRATORS  # listed in the built-in table
    for name in CALIBRATORS:
        cls = CALIBRATORS.get(name)
        assert cls.method == name and cls.kind in ("binary", "multiclass")


@pytest.mark.parametrize(("method", "opts"), BINARY)
def test_binary_json_round_trip(tmp_path: Path, method: str, opts: dict) -> None:
    z, y = _binary_data()
    cal = make_calibrator(method, **opts).fit(z, y)
    path = tmp_path / "cal.json"
    doc = cal.save(path, training={"window": {"start": "2026-01-01T00:00:00Z"}},
                   evaluation={"before": {"nll": 1.0}, "after": {"nll": 0.5}}, model="m")
    text = path.read_text()
    assert "NaN" not in text and "Infinity" not in text
    raw = json.loads(text)
    assert raw == json.loads(json.dumps(doc))
    assert raw["format"] == "calmon.calibrator" and raw["version"] == 1 and raw["method"] == method
    assert raw["training"]["n"] == z.size and raw["training"]["window"]["start"].startswith("2026")
    assert raw["evaluation"]["after"]["nll"] == 0.5 and raw["info"]["model"] == "m" and raw["created_at"]
    back = load(path)
    assert type(back) is type(cal)
    t = np.linspace(0, 1, 501)
    np.testing.assert_array_equal(back.predict(t), cal.predict(t))  # floats survive JSON exactly
    assert back.get_params() == cal.get_params()


def test_multiclass_json_round_trip(tmp_path: Path) -> None:
    rng = np.random.default_rng(1)
    probs = special.softmax(2 * rng.normal(size=(500, 4)), axis=1)
    labels = rng.integers(0, 4, 500)
    cal = make_calibrator("temperature").fit(probs, labels)
    cal.save(tmp_path / "t.json")
    back = load(tmp_path / "t.json")
    assert back.classes == 4
    np.testing.assert_array_equal(back.predict(probs), cal.predict(probs))


def _doc() -> dict:
    z, y = _binary_data(500)
    return make_calibrator("platt").fit(z, y).to_document()


@pytest.mark.parametrize(("mutate", "match"), [
    (lambda d: d.update(method="os.system"), "unknown calibration method"),
    (lambda d: d.update(method="__import__('os')"), "unknown calibration method"),
    (lambda d: d.update(format="something.else"), "not a calibrator document"),
    (lambda d: d.update(version=2), "unsupported calibrator document version"),
    (lambda d: d.update(params=[1, 2]), "params"),
    (lambda d: d["params"].update(A="1.0"), "'A'"),
    (lambda d: d["params"].update(A=1e6), "'A'"),
    (lambda d: d["params"].update(link="cloglog"), "link"),
    (lambda d: d["params"].pop("B"), "'B'"),
])
def test_invalid_documents_raise_clear_errors(tmp_path: Path, mutate, match: str) -> None:
    doc = _doc()
    mutate(doc)
    with pytest.raises(CalibratorError, match=match):
        from_document(doc)


def test_load_errors(tmp_path: Path) -> None:
    with pytest.raises(CalibratorError, match="cannot read"):
        load(tmp_path / "missing.json")
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(CalibratorError, match="not valid JSON"):
        load(bad)
    nan = tmp_path / "nan.json"
    doc = _doc()
    nan.write_text(json.dumps(doc).replace('"A": ' + json.dumps(doc["params"]["A"]), '"A": NaN'))
    with pytest.raises(CalibratorError, match="NaN"):
        load(nan)
    with pytest.raises(CalibratorError, match="unknown calibration method 'nope'"):
        get_calibrator("nope")


def test_fit_data_prefers_complete_raw_then_grid() -> None:
    z, y = _binary_data(20000)
    g = ScoreGrid(4096)
    g.update(z, y)
    raw: Any = make_calibrator("platt").fit_data(CalibrationData(n=z.size, grid=g, z=z, y=y, raw_is_complete=True))
    assert raw.training["source"] == "raw"
    grid: Any = make_calibrator("platt").fit_data(CalibrationData(n=z.size, grid=g, z=z[:100], y=y[:100]))
    assert grid.training["source"] == "grid" and abs(grid.A - raw.A) < 1e-3
    assert not make_calibrator("lp").supports_grid() and make_calibrator("isotonic").supports_grid()
    ang = make_calibrator("angular").fit_data(CalibrationData(n=z.size, z=z[:500], y=y[:500]))
    assert ang.training["source"] == "reservoir"
    with pytest.raises(ValueError, match="multiclass"):
        make_calibrator("lp").fit_data(CalibrationData(n=1, z=z, y=y))
    temp = make_calibrator("temperature").fit_data(CalibrationData(n=z.size, grid=g, z=z[:100], y=y[:100]))
    assert temp.kind == "binary" and temp.training["source"] == "grid"


def test_unfitted_and_registration_errors() -> None:
    with pytest.raises(ValueError, match="not fitted"):
        make_calibrator("isotonic").to_document()
    from calmon.calibration import register_calibrator
    class Nameless(Calibrator):
        pass

    with pytest.raises(TypeError, match="method"):
        register_calibrator(Nameless)
