"""recalibration.options: one dataclass holds the refit's minimum sizes, used by refresh() and by the agent."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from calmon.calibration.refresh import DEFAULT_LIMITS, DirectoryStore, RefreshLimits, refresh
from calmon.config import ConfigError, ModelConfig, build_config, load_config
from calmon.config.schema import RecalibrationOptions
from calmon.evaluate.recalibrate import Recalibrator, split_holdout
from calmon.stats.data import CalibrationData


def _reservoir(n: int, seed: int = 0) -> CalibrationData:
    """Over-confident scores (outcome rate z**3): Platt scaling improves them even on a few held-out rows."""
    rng = np.random.default_rng(seed)
    z = rng.uniform(0.05, 0.95, n)
    return CalibrationData(n=n, z=z, y=(rng.uniform(size=n) < z**3).astype(float))


def _window(model: str, window: str, data: CalibrationData) -> SimpleNamespace:
    """What :meth:`Recalibrator.run` reads of a window snapshot."""
    return SimpleNamespace(model=model, segment="all", window=window,
                           bucket=SimpleNamespace(stats=SimpleNamespace(calibration_data=lambda: data)))


def test_yaml_form_loads_as_before(tmp_path):
    path = tmp_path / "calmon.yaml"
    path.write_text("sources: [{path: ev.jsonl}]\n"
                    "recalibration: {options: {min_train: 300, min_holdout: 60, store_dir: cal}}\n")
    opts = load_config(path, env={}).recalibration.options
    assert isinstance(opts, RecalibrationOptions) and isinstance(opts, RefreshLimits)
    assert (opts.min_train, opts.min_holdout, opts.store_dir) == (300, 60, "cal")
    env = {"CALMON__RECALIBRATION__OPTIONS__MIN_HOLDOUT": "70"}
    opts = build_config({"sources": [{"path": "x"}]}, env=env).recalibration.options
    assert (opts.min_train, opts.min_holdout, opts.store_dir) == (200, 70, None)


def test_one_default_fits_the_default_reservoir():
    opts = build_config({"sources": [{"path": "x"}]}, env={}).recalibration.options
    assert (opts.min_train, opts.min_holdout) == (DEFAULT_LIMITS.min_train, DEFAULT_LIMITS.min_holdout) == (200, 50)
    # every fifth row of a full default reservoir is held out: both minimums are met, so the agent refits
    train, hold = split_holdout(_reservoir(ModelConfig().reservoir))
    assert train.n >= opts.min_train and hold.n >= opts.min_holdout
    assert (train.n, hold.n) == (205, 51)


@pytest.mark.parametrize("options,key", [
    ("{min_holdout: 0}", "recalibration.options.min_holdout"),
    ("{min_train: many}", "recalibration.options.min_train"),
    ("{min_train: true}", "recalibration.options.min_train"),
    ("{min_holdout: 1.5}", "recalibration.options.min_holdout"),
    ("{nosuch: 1}", "recalibration.options.nosuch"),
    ("[1, 2]", "recalibration.options"),
])
def test_bad_options_fail_at_start_with_one_line_naming_the_key(tmp_path, capsys, options, key):
    from calmon.commands import run as run_cmd
    path = tmp_path / "calmon.yaml"
    path.write_text(f"state_dir: {tmp_path}/state\nsources: [{{path: {tmp_path}/ev.jsonl}}]\n"
                    f"exporter: {{enabled: false}}\nrecalibration: {{enabled: true, options: {options}}}\n")
    with pytest.raises(ConfigError) as err:
        load_config(path, env={})
    assert err.value.path == key
    assert run_cmd.main(["-c", str(path), "--check-config"]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and f"{key}: " in lines[0], lines


def test_refresh_and_the_agent_use_the_same_limits(tmp_path):
    data = _reservoir(256)
    train, hold = split_holdout(data)
    alone = refresh(train, hold, ["platt"], model="m")  # refresh's own default: 51 held-out rows are enough
    assert alone.reason == "improved" and alone.published

    def refit(options: dict, store: str) -> dict:
        rc = build_config({"sources": [{"path": "x"}], "recalibration": {
            "enabled": True, "window": "all", "methods": ["platt"], "options": options}}, env={}).recalibration
        out = Recalibrator(rc, [DirectoryStore(tmp_path / store)]).run([_window("m", "all", data)], {})
        return dict(out["m"])

    info = refit({}, "default")
    assert info["reason"] == "improved" and info["version"] == 1 and info["published_at"] is not None
    assert info["before"] == alone.to_dict()["before"] and info["after"] == alone.to_dict()["after"]
    info = refit({"min_holdout": 52}, "strict")  # one row more than the reservoir holds out
    assert info["reason"] == "insufficient data" and info["version"] is None and info["published_at"] is None
    assert refresh(train, hold, ["platt"], limits=RefreshLimits(min_holdout=52)).reason == "insufficient data"
