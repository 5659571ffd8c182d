"""Polynomial scaling and scaling-binning (issue #20), checked against direct fits (numpy, scikit-learn)."""

from __future__ import annotations

import argparse
import json

import numpy as np
import pytest
from sklearn.linear_model import LinearRegression, LogisticRegression
from sklearn.preprocessing import PolynomialFeatures

from calmon.calibration import CALIBRATORS, from_document, make_calibrator
from calmon.calibration.metrics import binary_metrics
from calmon.calibration.polynomial import PolynomialCalibrator
from calmon.calibration.refresh import refresh
from calmon.calibration.scaling_binning import ScalingBinningCalibrator
from calmon.commands import fit as fit_command
from calmon.offline.inputs import Dataset
from calmon.stats.data import CalibrationData
from calmon.stats.grid import ScoreGrid


def _data(seed: int, n: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    z = rng.uniform(0.01, 0.99, n)
    y = (rng.uniform(size=n) < z**2).astype(float)  # over-confident predictor
    return z, y


@pytest.mark.parametrize("degree", [1, 3, 5])
def test_polynomial_matches_numpy_and_sklearn(degree: int) -> None:
    z, y = _data(1, 5000)
    cal = PolynomialCalibrator(degree=degree).fit(z, y)
    direct = np.clip(np.polyval(np.polyfit(z, y, degree), z), 0, 1)
    assert np.allclose(cal.predict(z), direct, atol=1e-7)
    w = np.random.default_rng(2).uniform(0.5, 2.0, z.size)
    feats = PolynomialFeatures(degree).fit_transform(z[:, None])
    sk = LinearRegression(fit_intercept=False).fit(feats, y, sample_weight=w)
    weighted = PolynomialCalibrator(degree=degree).fit(z, y, sample_weight=w)
    assert np.allclose(weighted.predict(z), np.clip(sk.predict(feats), 0, 1), atol=1e-7)


def test_polynomial_from_grid_is_close_to_raw_and_roundtrips() -> None:
    z, y = _data(3, 20000)
    g = ScoreGrid(4096)
    g.update(z, y)
    raw = PolynomialCalibrator(degree=3).fit(z, y)
    grid = PolynomialCalibrator(degree=3).fit_grid(g)
    assert grid.training["source"] == "grid"
    assert np.max(np.abs(raw.predict(z) - grid.predict(z))) < 1e-4
    back = from_document(json.loads(json.dumps(raw.to_document())))
    assert np.array_equal(back.predict(z), raw.predict(z))
    assert binary_metrics(raw.predict(z), y, 15)["ece"] < binary_metrics(z, y, 15)["ece"] / 3


def test_scaling_binning_matches_an_independent_three_way_fit() -> None:
    z, y = _data(4, 9000)
    cal = ScalingBinningCalibrator(bins=15, seed=7).fit(z, y)
    a, b, c = np.array_split(np.random.default_rng(7).permutation(z.size), 3)
    u = np.log(z / (1 - z))
    lr = LogisticRegression(C=1e12, tol=1e-12, max_iter=10_000).fit(u[a, None], y[a])
    assert cal.A == pytest.approx(lr.coef_[0, 0], abs=1e-3) and cal.B == pytest.approx(lr.intercept_[0], abs=1e-3)

    def g(v: np.ndarray) -> np.ndarray:
        return 1 / (1 + np.exp(-(cal.A * np.log(v / (1 - v)) + cal.B)))

    gb = np.sort(g(z[b]))
    edges = gb[np.ceil(np.arange(1, 15) * gb.size / 15).astype(int)]  # equal mass (continuous scores)
    assert np.allclose(cal.edges, edges)
    gc = g(z[c])
    idx = np.searchsorted(edges, gc, side="right")
    values = np.array([gc[idx == k].mean() for k in range(15)])
    assert np.allclose(cal.values, values, atol=1e-12)
    assert np.allclose(cal.predict(z), values[np.searchsorted(edges, g(z), side="right")])
    assert len(np.unique(cal.predict(np.random.default_rng(0).uniform(size=5000)))) <= 15


def test_scaling_binning_grid_fit_roundtrip_and_bad_params() -> None:
    z, y = _data(5, 20000)
    g = ScoreGrid(4096)
    g.update(z, y)
    cal = ScalingBinningCalibrator(bins=10).fit_grid(g)
    assert cal.training["source"] == "grid" and cal.values.size <= 10
    zt, yt = _data(6, 20000)
    assert binary_metrics(cal.predict(zt), yt, 15)["ece"] < binary_metrics(zt, yt, 15)["ece"] / 3
    doc = json.loads(json.dumps(cal.to_document()))
    assert np.array_equal(from_document(doc).predict(zt), cal.predict(zt))
    bad = dict(doc["params"], values=doc["params"]["values"][:-1])
    with pytest.raises(ValueError, match="len"):
        ScalingBinningCalibrator.from_params(bad)
    with pytest.raises(ValueError, match="bins"):
        ScalingBinningCalibrator(bins=0)
    with pytest.raises(ValueError, match="degree"):
        PolynomialCalibrator(degree=-1)
    with pytest.raises(ValueError, match="at least three"):
        ScalingBinningCalibrator().fit(np.array([0.2, 0.4]), np.array([0.0, 1.0]))


def test_registered_in_fit_command_and_refresh() -> None:
    assert {"polynomial", "scaling-binning"} <= set(CALIBRATORS)
    parser = argparse.ArgumentParser()
    fit_command.register(parser.add_subparsers())
    args = parser.parse_args(["fit", "x.npz", "-m", "polynomial", "--degree", "5"])
    assert fit_command._options(args) == {"degree": 5}
    z, y = _data(8, 6000)
    ds = Dataset("mem", 2, z, y)
    doc = fit_command.fit_dataset(ds, "scaling-binning", {"bins": 10}, holdout=0.3)
    assert doc["method"] == "scaling-binning" and doc["evaluation"]["after"]["ece"] < doc["evaluation"]["before"]["ece"]
    g = ScoreGrid(4096)
    g.update(z[:4000], y[:4000])
    res = refresh(CalibrationData(n=4000, grid=g), CalibrationData(n=2000, z=z[4000:], y=y[4000:],
                                                                        raw_is_complete=True),
                  ["polynomial", {"method": "scaling-binning", "bins": 10}])
    out = res.to_dict()
    assert all(not c.get("error") for c in out["candidates"]), out["candidates"]
    assert make_calibrator("polynomial", degree=2).get_params()["degree"] == 2
