"""The demo's console narrates in plain words: the drift starting, the first rejection after it, the
alert firing and resolving, and a calibrator published with its held-out before/after."""

from __future__ import annotations

import io
import time
from types import SimpleNamespace

from calmon.commands.demo import DEMO_CONFIG, console_hook


def evaluation(p: float, window: str = "5m") -> dict:
    return {"model": "fraud-demo", "segment": "all", "window": window, "n": 50000, "metrics": {"ece": 0.05},
            "tests": {"tcal": {"p_value": p, "alpha": 0.01,
                               "decision": "miscalibrated" if p < 0.01 else "calibrated"}}}


def test_console_states_drift_rejection_alert_and_recalibration():
    out = io.StringIO()
    pub = SimpleNamespace(alerts=(), calibrators={})
    now = time.time()
    hook = console_hook(now - 10, drift_time=now + 3600, out=out, published=lambda: pub, url="http://h:1")
    hook([evaluation(0.5), evaluation(0.5, "30m")])
    first = out.getvalue()
    assert "calibrated phase" in first and "==>" not in first and "before drift" not in first
    hook([evaluation(0.001)])  # a rejection before the drift is not announced as the detection
    assert "drift detected" not in out.getvalue()

    hook = console_hook(now - 100, drift_time=now - 40, out=out, published=lambda: pub, url="http://h:1")
    hook([evaluation(0.5)])
    text = out.getvalue()
    assert text.count("the drift has started") == 1 and "drift +40 s" in text
    hook([evaluation(1e-4)])
    hook([evaluation(1e-5)])
    text = out.getvalue()
    assert text.count("calibration drift detected") == 1 and "p = 0.0001 < alpha = 0.01" in text
    pub.alerts = ({"alert": "CalibrationDrift", "model": "fraud-demo", "segment": "all", "window": "5m",
                   "state": "firing"},)
    pub.calibrators = {"fraud-demo": {"method": "platt", "version": 2,
                                      "before": {"n": 400, "nll": 0.69, "ece": 0.13},
                                      "after": {"n": 400, "nll": 0.6, "ece": 0.02}}}
    hook([evaluation(1e-5)])
    hook([evaluation(1e-5)])  # said once, not every round
    text = out.getvalue()
    assert text.count("ALERT CalibrationDrift is FIRING for fraud-demo") == 1 and "http://h:1/" in text
    assert text.count("published platt calibrator v2") == 1 and "13.00 % raw -> 2.00 % recalibrated" in text
    pub.alerts = ({**pub.alerts[0], "state": "resolved"},)
    hook([evaluation(0.5)])
    assert "alert CalibrationDrift resolved for fraud-demo" in out.getvalue()


def test_demo_runs_the_whole_loop():
    rc = DEMO_CONFIG["recalibration"]
    assert rc["enabled"] and rc["window"] in DEMO_CONFIG["windows"]["names"]
    assert DEMO_CONFIG["alerts"]["rules"][0]["name"] == "CalibrationDrift"
