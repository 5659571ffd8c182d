"""#32.7: significant is not material -- the verdict's tolerance, the exact-0/1 explanation, and a calibrator
judged on the rows it was not fitted on, through the CLI as a user calls it (fit -> apply -> check)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from calmon.calibration.split import hash_split
from calmon.cli import main as cli_main
from calmon.config.loader import build_config
from calmon.config.schema import ConfigError

N = 60_000
HOLDOUT = 0.3


def _write(path: Path, ids: list[str], z: np.ndarray, y: np.ndarray) -> None:
    with path.open("w", encoding="utf-8") as fh:
        fh.write("id,score,label\n")
        fh.writelines(f"{i},{float(s)!r},{int(v)}\n" for i, s, v in zip(ids, z, y))


@pytest.fixture(scope="module")
def churn(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An over-confident model on 20 score levels; its top level (0.999) is always right on the rows `fit` uses,
    and wrong 3 times on the held-out rows: isotonic maps it to exactly 1.0, which those 3 outcomes contradict."""
    rng = np.random.default_rng(3)
    levels = np.r_[np.arange(0.025, 0.95, 0.05), 0.999]
    z = rng.choice(levels, N)
    y = (rng.random(N) < z ** 1.3).astype(int)
    ids = [f"r{i}" for i in range(N)]
    top = z == 0.999
    y[top] = 1
    y[np.flatnonzero(top & hash_split(ids, HOLDOUT, "calmon"))[:3]] = 0
    path = tmp_path_factory.mktemp("churn") / "churn.csv"
    _write(path, ids, z, y)
    return path


def _check(capsys: pytest.CaptureFixture[str], *argv: str) -> dict[str, Any]:
    capsys.readouterr()
    assert cli_main(["check", *argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


@pytest.fixture(scope="module")
def applied(churn: Path) -> tuple[Path, Path]:
    cal, out = churn.parent / "iso.json", churn.parent / "applied.csv"
    assert cli_main(["fit", str(churn), "-m", "isotonic", "--holdout", str(HOLDOUT), "-o", str(cal)]) == 0
    assert cli_main(["apply", str(cal), str(churn), "-o", str(out)]) == 0
    return cal, out


def test_round_trip_is_calibrated_within_tolerance(applied: tuple[Path, Path],
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    doc = _check(capsys, str(applied[1]))
    s = doc["summary"]
    # the tests still reject (significant) ...
    assert s["calibrated"] is False and doc["tests"]["tcal"]["decision"] == "miscalibrated"
    # ... but the whole ECE interval is below the default 1 % tolerance: immaterial, no action
    assert s["ece_ci"][1] < 0.01
    assert s["material"] is False and s["verdict"] == "calibrated within tolerance"
    assert "immaterial" in s["material_reason"] and s["tolerance"] == 0.01
    assert s["text"].startswith("Calibrated within tolerance") and "no action" in s["text"]
    assert "temperature" not in s["text"] and s["recommendation"] == "no action"


def test_rejection_at_exactly_one_is_explained(applied: tuple[Path, Path],
                                               capsys: pytest.CaptureFixture[str]) -> None:
    doc = _check(capsys, str(applied[1]))
    tcal = doc["tests"]["tcal"]
    assert tcal["method"] == "binomial"
    at_one = tcal["values"].index(1.0)
    events, positives = tcal["counts"][at_one], tcal["positives"][at_one]
    assert events - positives == 3
    [ext] = doc["summary"]["extremes"]
    assert ext["score"] == 1.0 and ext["events"] == events and ext["alone"] is True
    assert ext["frequency"] == pytest.approx(positives / events)
    phrase = f"driven by {events:,} scores at exactly 1.0 with observed frequency {positives / events:.4g}"
    assert phrase in doc["summary"]["text"]
    assert any(phrase in e for e in doc["summary"]["evidence"])


def test_tolerance_zero_gives_the_tests_verdict(applied: tuple[Path, Path],
                                                capsys: pytest.CaptureFixture[str]) -> None:
    doc = _check(capsys, str(applied[1]), "--tolerance", "0")
    s = doc["summary"]
    assert s["calibrated"] is False and s["material"] is True and s["verdict"] == "miscalibrated"
    assert s["text"].startswith("Miscalibrated at level 0.05")
    # and the recommendation is about the certain scores, not another recalibrator
    assert "exactly 0 and 1" in s["recommendation"] and "temperature" not in s["recommendation"]


def test_clearly_miscalibrated_stays_miscalibrated(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rng = np.random.default_rng(5)
    z = rng.random(20_000)
    y = rng.random(20_000) < z ** 2
    path = tmp_path / "bad.csv"
    _write(path, [f"b{i}" for i in range(z.size)], z, y)
    for tol in ("0.01", "0.05"):
        s = _check(capsys, str(path), "--tolerance", tol)["summary"]
        assert s["calibrated"] is False and s["material"] is True and s["verdict"] == "miscalibrated", tol
        assert s["text"].startswith("Miscalibrated") and s["ece_ci"][0] > 0.05


def test_calibrator_is_judged_on_its_holdout(churn: Path, applied: tuple[Path, Path],
                                             capsys: pytest.CaptureFixture[str]) -> None:
    doc = _check(capsys, str(churn), "--calibrator", str(applied[0]))
    held = int(hash_split([f"r{i}" for i in range(N)], HOLDOUT, "calmon").sum())
    assert doc["n"] == held and doc["calibrator"]["evaluated_on"] == "holdout"
    assert "held-out rows" in doc["calibrator"]["note"]


def test_calibrator_fitted_on_everything_is_not_judged_by_its_fit_data(
        churn: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cal = churn.parent / "iso-all.json"
    assert cli_main(["fit", str(churn), "-m", "isotonic", "-o", str(cal)]) == 0
    doc = _check(capsys, str(churn), "--calibrator", str(cal), "--tolerance", "0")
    assert doc["calibrator"]["evaluated_on"] == "fit data"
    rec = doc["summary"]["recommendation"]
    if doc["summary"]["calibrated"] is False:
        assert rec.startswith("judge the calibrator on data it was not fitted on") and "recalibrate" not in rec
    assert "cannot judge it" in doc["calibrator"]["note"]


def test_tolerance_flag_and_key_are_validated(applied: tuple[Path, Path], capsys: pytest.CaptureFixture[str]) -> None:
    capsys.readouterr()
    assert cli_main(["check", str(applied[1]), "--tolerance", "1.5"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--tolerance" in err[0]
    base = {"sources": [{"name": "f", "type": "file", "path": "x.jsonl"}]}
    assert build_config({**base}).verdict.tolerance.ece == 0.01
    assert build_config({**base, "verdict": {"tolerance": {"ece": 0}}}).verdict.tolerance.ece == 0.0
    for bad in (-0.1, 1.0, "x"):
        with pytest.raises(ConfigError, match=r"^verdict\.tolerance\.ece: "):
            build_config({**base, "verdict": {"tolerance": {"ece": bad}}})


def test_apply_on_the_fit_input_points_to_check_calibrator(churn: Path, applied: tuple[Path, Path],
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    capsys.readouterr()
    out = churn.parent / "again.csv"
    assert cli_main(["apply", str(applied[0]), str(churn), "-o", str(out)]) == 0
    err = capsys.readouterr().err
    assert "cannot judge it" in err and f"calmon check --calibrator {applied[0]} {churn}" in err
