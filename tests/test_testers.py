"""The tester table, the typed TestResult and the purity of the algorithm layer."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

from calmon.stats.grid import ScoreGrid
from calmon.testers import (
    BUILTIN,
    DECISIONS,
    TESTERS,
    CalibrationData,
    TestResult,
    check_params,
    get_tester,
    register_tester,
    run_tester,
)


def _data(n: int = 2000, seed: int = 0) -> CalibrationData:
    rng = np.random.default_rng(seed)
    z = rng.uniform(size=n)
    y = (rng.uniform(size=n) < z).astype(float)
    g = ScoreGrid()
    g.update(z, y)
    return CalibrationData(n=n, z=z, y=y, grid=g, raw_is_complete=True)


def test_builtin_table_is_the_registry() -> None:
    assert sorted(BUILTIN) == ["ldtc", "lp", "smce", "tcal"]
    for name, fn in BUILTIN.items():
        assert name in TESTERS and get_tester(name) is fn
    with pytest.raises(ValueError, match="unknown tester 'nope'"):
        get_tester("nope")


def test_register_tester_refuses_duplicates_and_accepts_plugins() -> None:
    with pytest.raises(ValueError, match="already registered"):
        register_tester("tcal")(lambda data, **kw: {})

    @register_tester("always_calibrated")
    def plugin(data: CalibrationData, *, alpha: float, mc: int, rng: np.random.Generator, k: int = 1) -> dict:
        return {"statistic": float(k), "p_value": 1.0, "decision": "calibrated", "method": "plugin", "k": k}

    try:
        res = run_tester("always_calibrated", _data(50), k=3)
        assert res == TestResult("plugin", "calibrated", 3.0, 1.0, {"k": 3})
        assert res.to_dict() == {"statistic": 3.0, "p_value": 1.0, "decision": "calibrated", "method": "plugin",
                                 "k": 3}
    finally:
        TESTERS.unregister("always_calibrated")


def test_run_tester_checks_alpha_params_and_decision() -> None:
    data = _data(300)
    with pytest.raises(ValueError, match="alpha"):
        run_tester("smce", data, alpha=1.5)
    with pytest.raises(ValueError, match="'bogus'"):
        run_tester("ldtc", data, bogus=1)
    TESTERS.register("broken", lambda data, **kw: {"decision": "maybe"})
    try:
        with pytest.raises(RuntimeError, match="'maybe'"):
            run_tester("broken", data)
    finally:
        TESTERS.unregister("broken")


def test_check_params_names_unknown_and_reserved_parameters() -> None:
    check_params("tcal", {"method": "mc-grid", "levels": [2, 3]})
    check_params("smce", {})
    with pytest.raises(ValueError, match="tester 'smce' has no parameter 'eps'"):
        check_params("smce", {"eps": 0.1})
    with pytest.raises(ValueError, match="'alpha' is set by the evaluation settings"):
        check_params("tcal", {"alpha": 0.1})
    with pytest.raises(ValueError, match="unknown tester"):
        check_params("nope", {})


def test_to_dict_keeps_the_testers_json_in_order() -> None:
    data = _data()
    for name in ("tcal", "smce", "ldtc"):
        raw = get_tester(name)(data, alpha=0.05, mc=99, rng=np.random.default_rng(1))
        res = run_tester(name, data, mc=99, seed=1)
        assert res.decision in DECISIONS and res.error is None
        assert json.dumps(res.to_dict()) == json.dumps(raw)  # same keys, same order, same values
        assert res.statistic == raw["statistic"] and res.p_value == raw["p_value"]


def test_failed_and_insufficient_shapes() -> None:
    f = TestResult.failed("smce", ValueError("bad grid"))
    assert f.to_dict() == {"decision": "error", "error": "ValueError: bad grid", "method": "smce",
                           "statistic": None, "p_value": None}
    assert list(f.to_dict()) == ["decision", "error", "method", "statistic", "p_value"]
    assert TestResult.failed("x", "plain text").error == "plain text"
    i = TestResult.insufficient("tcal", 12, 100).to_dict()
    assert i == {"statistic": None, "p_value": None, "decision": "insufficient data", "method": "tcal",
                 "reason": "12 events < evaluation.min_events = 100"}
    assert list(i) == ["statistic", "p_value", "decision", "method", "reason"]
    assert "error" in DECISIONS


def test_algorithms_and_stats_import_no_tester_agent_exporter_or_config() -> None:
    code = (
        "import importlib, pkgutil, sys\n"
        "import calmon.algorithms as a, calmon.stats as s\n"
        "for pkg in (a, s):\n"
        "    for m in pkgutil.walk_packages(pkg.__path__, pkg.__name__ + '.'):\n"
        "        importlib.import_module(m.name)\n"
        "bad = [k for k in sys.modules if k.split('.')[:2] in (['calmon', 'testers'], ['calmon', 'agent'],"
        " ['calmon', 'exporter'], ['calmon', 'config'])]\n"
        "print(','.join(bad))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""
