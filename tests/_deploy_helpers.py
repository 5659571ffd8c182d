"""Helpers for tests that start real Prometheus, Alertmanager and Chromium binaries.

In CI (``CI=true``) a missing binary fails the test; elsewhere it skips with a loud reason.
Servers listen on free loopback ports and are stopped by the caller (``stop``).
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
DEPLOY = REPO / "deploy"
ARTIFACTS = REPO / "artifacts"

#: The metric contract between the agent, the rules and the dashboard (docs/deploy.md).
CONTRACT = {
    "calmon_build_info", "calmon_events_total", "calmon_events_rejected_total", "calmon_join_joined_total",
    "calmon_join_expired_total", "calmon_join_orphan_outcomes_total", "calmon_join_duplicate_ids_total",
    "calmon_join_pending", "calmon_window_events", "calmon_ece", "calmon_ece_l2_debiased", "calmon_smce",
    "calmon_ldtc", "calmon_brier_score", "calmon_accuracy", "calmon_mean_confidence",
    "calmon_reliability_mean_score", "calmon_reliability_mean_outcome", "calmon_reliability_events",
    "calmon_test_statistic", "calmon_test_p_value", "calmon_test_rejected", "calmon_test_insufficient_data",
    "calmon_verdict_material",
    "calmon_evaluation_duration_seconds_bucket", "calmon_evaluation_duration_seconds_sum",
    "calmon_evaluation_duration_seconds_count", "calmon_evaluations_total",
    "calmon_evaluation_overruns_total",
    "calmon_last_evaluation_timestamp_seconds", "calmon_source_records_total", "calmon_source_lag_seconds",
    "calmon_source_lag_records", "calmon_source_lag_bytes", "calmon_checkpoint_last_timestamp_seconds",
    "calmon_checkpoint_duration_seconds", "calmon_ready", "calmon_alert_active", "calmon_calibrator_version",
    "calmon_calibrator_error",
}


def require_binary(*names: str) -> str:
    """Path of the first of ``names`` on PATH; fail in CI, skip loudly elsewhere."""
    for name in names:
        path = shutil.which(name)
        if path:
            return path
    msg = (f"REQUIRED BINARY MISSING: {' or '.join(names)} -- install the Debian packages "
           "prometheus, prometheus-alertmanager, chromium")
    if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
        pytest.fail(msg)
    pytest.skip(msg)
    raise AssertionError("unreachable")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def http(method: str, url: str, body: object = None, timeout: float = 5.0) -> tuple[int, object]:
    """One JSON HTTP request; returns (status, decoded body or text)."""
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, method=method, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            raw = resp.read()
            status = resp.status
    except urllib.error.HTTPError as exc:
        raw, status = exc.read(), exc.code
    try:
        return status, json.loads(raw)
    except ValueError:
        return status, raw.decode(errors="replace")


def wait_ready(url: str, proc: subprocess.Popen, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{proc.args[0]} exited with {proc.returncode}: {_log(proc)}")
        try:
            with urllib.request.urlopen(url, timeout=1.0) as resp:
                if resp.status == 200:
                    return
        except (urllib.error.URLError, OSError):
            pass
        time.sleep(0.1)
    raise RuntimeError(f"{url} not ready after {timeout} s: {_log(proc)}")


def _log(proc: subprocess.Popen) -> str:
    path = getattr(proc, "log_path", None)
    if path and Path(path).exists():
        return Path(path).read_text(errors="replace")[-2000:]
    return ""


def _spawn(args: list[str], log_path: Path) -> subprocess.Popen:
    log = open(log_path, "wb")  # noqa: SIM115 -- closed with the process
    proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    proc.log_path = str(log_path)  # type: ignore[attr-defined]
    proc.log_file = log  # type: ignore[attr-defined]
    return proc


def stop(proc: subprocess.Popen | None) -> None:
    """Terminate a server started here (by its own handle), then kill it if it lingers."""
    if proc is None:
        return
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=5)
    log = getattr(proc, "log_file", None)
    if log is not None:
        log.close()


def start_alertmanager(tmp: Path, config: str | None = None) -> tuple[subprocess.Popen, str]:
    """Start Alertmanager on a free loopback port; returns (process, base URL)."""
    binary = require_binary("prometheus-alertmanager", "alertmanager")
    tmp.mkdir(parents=True, exist_ok=True)
    cfg = tmp / "alertmanager.yml"
    cfg.write_text(config or (
        "route:\n  receiver: blackhole\n  group_wait: 1s\n  group_interval: 1s\n  repeat_interval: 1h\n"
        "receivers:\n  - name: blackhole\n"))
    port = free_port()
    proc = _spawn([binary, f"--config.file={cfg}", f"--storage.path={tmp / 'am-data'}",
                   f"--web.listen-address=127.0.0.1:{port}", "--cluster.listen-address=",
                   "--log.level=warn"], tmp / "alertmanager.log")
    url = f"http://127.0.0.1:{port}"
    try:
        wait_ready(url + "/-/ready", proc)
    except RuntimeError:
        stop(proc)
        raise
    return proc, url


def start_prometheus(tmp: Path, config: str,
                     extra_args: list[str] | None = None) -> tuple[subprocess.Popen, str]:
    """Start Prometheus with ``config`` (YAML text) on a free loopback port; returns (process, URL)."""
    binary = require_binary("prometheus")
    tmp.mkdir(parents=True, exist_ok=True)
    cfg = tmp / "prometheus.yml"
    cfg.write_text(config)
    port = free_port()
    proc = _spawn([binary, f"--config.file={cfg}", f"--storage.tsdb.path={tmp / 'tsdb'}",
                   f"--web.listen-address=127.0.0.1:{port}", "--log.level=warn",
                   *(extra_args or [])], tmp / "prometheus.log")
    url = f"http://127.0.0.1:{port}"
    try:
        wait_ready(url + "/-/ready", proc)
    except RuntimeError:
        stop(proc)
        raise
    return proc, url
