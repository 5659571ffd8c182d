"""Prometheus exporter: contract metric names, label values, HTTP endpoints, basic auth and TLS."""

from __future__ import annotations

import base64
import dataclasses
import datetime
import json
import math
import ssl
import urllib.error
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

from calmon.exporter.http import Endpoints, HTTPExporter, HTTPLimits, tls_context
from calmon.exporter.metrics import AgentMetrics
from calmon.exporter.views import LiveView, RoundView

EVAL = {
    "model": "m", "segment": "all", "window": "1h", "n": 1234,
    "metrics": {"ece": 0.031, "ece_l2_debiased": 0.0004, "smce": 0.02, "ldtc": 0.018, "brier": 0.2,
                "accuracy": 0.7, "mean_confidence": 0.66},
    "reliability": [{"bin": 0.0, "hi": 0.05, "events": 0, "mean_score": None, "mean_outcome": None},
                    {"bin": 0.95, "hi": 1.0, "events": 10, "mean_score": 0.97, "mean_outcome": 0.9}],
    "tests": {"tcal": {"statistic": 0.01, "p_value": 0.003, "decision": "miscalibrated", "method": "tcal"},
              "ldtc": {"statistic": 0.018, "p_value": None, "decision": "insufficient data", "method": "ldtc"},
              "broken": {"error": "ValueError: x"}},
}
STATE = {
    "ready": True, "events": {("m", "labeled"): 100, ("m", "prediction"): 7}, "rejected": {"not_json": 3},
    "late": {"m": 1}, "join": {"joined": {"m": 5}, "expired": {"m": 2}, "duplicates": {"m": 1}, "orphans": 4},
    "pending": {"m": 9}, "sources": {"events": {"records": 110, "lag_seconds": 2.5, "lag_bytes": 0}},
    "scheduler": {"evaluations": 3, "overruns": 1, "last_timestamp": 1.7e9},
    "checkpoint": {"last_timestamp": 1.7e9, "duration": 0.01}, "state_bytes": {"m": 1000},
    "evaluations": [EVAL],
    "alerts": [{"alert": "Drift", "model": "m", "segment": "all", "window": "1h", "severity": "warning",
                "state": "firing"}],
    "calibrators": [{"model": "m", "method": "platt", "version": 3, "before": {"nll": 0.6, "ece": 0.05},
                     "after": {"nll": 0.5, "ece": 0.01}}],
}

CONTRACT = """calmon_build_info calmon_events_total calmon_events_rejected_total calmon_join_joined_total
calmon_join_expired_total calmon_join_orphan_outcomes_total calmon_join_duplicate_ids_total calmon_join_pending
calmon_window_events calmon_ece calmon_ece_l2_debiased calmon_smce calmon_ldtc calmon_brier_score calmon_accuracy
calmon_mean_confidence calmon_reliability_mean_score calmon_reliability_mean_outcome calmon_reliability_events
calmon_test_statistic calmon_test_p_value calmon_test_rejected calmon_test_insufficient_data
calmon_evaluation_duration_seconds_count calmon_evaluations_total calmon_evaluation_overruns_total
calmon_last_evaluation_timestamp_seconds calmon_source_records_total calmon_source_lag_seconds
calmon_checkpoint_last_timestamp_seconds calmon_checkpoint_duration_seconds calmon_ready calmon_alert_active
calmon_calibrator_version calmon_calibrator_error""".split()


def agent_metrics(state: dict) -> AgentMetrics:
    """The exporter of a state holding both parts, handed over as the agent does: a live view and a round view."""
    live = {f.name for f in dataclasses.fields(LiveView)}
    m = AgentMetrics(lambda: LiveView(**{k: v for k, v in state.items() if k in live}))
    m.prepare(RoundView(**{k: v for k, v in state.items() if k not in live}))
    return m


def samples(text: str) -> dict[tuple, float]:
    out = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def value(sm, name, **labels):
    return sm[(name, tuple(sorted(labels.items())))]


def test_every_contract_metric_is_exported_with_its_labels():
    m = agent_metrics(STATE)
    m.evaluation_duration.observe(0.2)
    sm = samples((m.render() + m.render(["estimates", "details", "reliability"])).decode())  # and its detail
    names = {k[0] for k in sm}
    missing = [n for n in CONTRACT if n not in names]
    assert not missing, missing
    w = {"model": "m", "segment": "all", "window": "1h"}
    assert value(sm, "calmon_events_total", model="m", type="labeled") == 100
    assert value(sm, "calmon_events_rejected_total", reason="not_json") == 3
    assert value(sm, "calmon_join_orphan_outcomes_total") == 4
    assert value(sm, "calmon_window_events", **w) == 1234
    assert value(sm, "calmon_ece", **w) == pytest.approx(0.031)
    assert value(sm, "calmon_reliability_events", bin="0.95", **w) == 10
    assert value(sm, "calmon_reliability_events", bin="0.00", **w) == 0
    assert ("calmon_reliability_mean_score", tuple(sorted({**w, "bin": "0.00"}.items()))) not in sm  # empty bin
    assert value(sm, "calmon_test_rejected", test="tcal", **w) == 1
    assert value(sm, "calmon_test_p_value", test="tcal", **w) == pytest.approx(0.003)
    assert math.isnan(value(sm, "calmon_test_p_value", test="ldtc", **w))
    assert value(sm, "calmon_test_insufficient_data", test="ldtc", **w) == 1
    assert not any(k[0].startswith("calmon_test") and ("test", "broken") in k[1] for k in sm)
    assert value(sm, "calmon_alert_active", alert="Drift", severity="warning", **w) == 1
    assert value(sm, "calmon_calibrator_error", model="m", method="platt", stage="after", metric="ece") == 0.01
    assert value(sm, "calmon_build_info", version=__import__("calmon").__version__) == 1


def test_empty_state_renders():
    sm = samples(AgentMetrics(LiveView).render().decode())
    assert value(sm, "calmon_ready") == 0


def _endpoints(ready=True):
    m = agent_metrics(STATE)
    return Endpoints(m.render, lambda: True, lambda: ready, lambda: {"evaluations": [EVAL], "x": 1},
                     lambda snap: f"<html>{len(snap['evaluations'])} evaluations</html>")


def get(url, auth=None, context=None):
    req = urllib.request.Request(url)
    if auth:
        req.add_header("Authorization", "Basic " + base64.b64encode(f"{auth[0]}:{auth[1]}".encode()).decode())
    try:
        with urllib.request.urlopen(req, timeout=10, context=context) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def test_http_endpoints_and_basic_auth():
    srv = HTTPExporter(_endpoints(ready=False), "127.0.0.1", 0, basic_auth=("calmon", "pa:ss")).start()
    try:
        assert get(f"{srv.url}/metrics")[0] == 401
        assert get(f"{srv.url}/metrics", ("calmon", "wrong"))[0] == 401
        code, body = get(f"{srv.url}/metrics", ("calmon", "pa:ss"))
        assert code == 200 and "calmon_ece{" in body
        assert get(f"{srv.url}/healthz") == (200, "ok\n")        # probes need no credentials
        assert get(f"{srv.url}/readyz")[0] == 503
        code, body = get(f"{srv.url}/api/status", ("calmon", "pa:ss"))
        assert code == 200 and json.loads(body)["x"] == 1
        assert get(f"{srv.url}/", ("calmon", "pa:ss")) == (200, "<html>1 evaluations</html>")
        assert get(f"{srv.url}/nope", ("calmon", "pa:ss"))[0] == 404
    finally:
        srv.stop()


def _self_signed(tmp_path):
    x509 = pytest.importorskip("cryptography.x509")
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(days=1))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName([x509.DNSName("localhost")]), critical=False)
            .sign(key, hashes.SHA256()))
    cert_file, key_file = tmp_path / "cert.pem", tmp_path / "key.pem"
    cert_file.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_file.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    return str(cert_file), str(key_file)


def test_tls(tmp_path):
    cert, key = _self_signed(tmp_path)
    srv = HTTPExporter(_endpoints(), "127.0.0.1", 0, tls=tls_context(cert, key)).start()
    try:
        assert srv.url.startswith("https://")
        ctx = ssl.create_default_context(cafile=cert)
        ctx.check_hostname = False
        code, body = get(f"{srv.url}/metrics", context=ctx)
        assert code == 200 and "calmon_ready 1.0" in body
        with pytest.raises(urllib.error.URLError):  # an unverified server certificate is refused by clients
            get(f"{srv.url}/metrics", context=ssl.create_default_context())
        plain = srv.url.replace("https://", "http://")
        with pytest.raises((urllib.error.URLError, ConnectionError, OSError)):
            get(f"{plain}/metrics")
        code, _ = get(f"{srv.url}/readyz", context=ctx)  # the server still answers after a failed handshake
        assert code == 200
    finally:
        srv.stop()


# -- hostile clients (issue #14) ------------------------------------------------------------------------------------
def _wait(cond, timeout: float = 20.0) -> bool:
    """Poll ``cond`` until it holds (the deadline is a safety net, not a performance assertion)."""
    import time

    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if cond():
            return True
        time.sleep(0.05)
    return cond()


def _handler_threads() -> int:
    import threading

    return sum(1 for t in threading.enumerate() if t.name.startswith("Thread-") and "process_request" in t.name)


def test_500_idle_connections_do_not_hold_500_threads_and_metrics_stays_up():
    import socket

    limits = HTTPLimits(header_timeout=1.0, idle_timeout=1.0, max_connections=32)
    srv = HTTPExporter(_endpoints(), "127.0.0.1", 0, limits=limits).start()
    idle = []
    try:
        for _ in range(500):
            idle.append(socket.create_connection(("127.0.0.1", srv.port), timeout=10))
        # every idle connection beyond the cap evicted an older one: never more than 32 open ...
        assert _wait(lambda: len(srv.connections) <= 32)
        # ... and a scrape gets through while they are all open
        code, body = get(f"{srv.url}/metrics")
        assert code == 200 and "calmon_ready 1.0" in body
        # the survivors are closed at their header deadline: their threads end
        assert _wait(lambda: len(srv.connections) == 0 and _handler_threads() == 0)
        table = srv.connections
        assert table.evicted + table.expired == 500 and table.expired >= 1 and table.refused == 0
        closed = 0
        for s in idle:
            try:
                closed += s.recv(1) == b""
            except OSError:
                closed += 1
        assert closed == 500
    finally:
        for s in idle:
            s.close()
        srv.stop()


def test_slow_request_head_is_cut_at_the_header_deadline():
    import socket
    import time

    srv = HTTPExporter(_endpoints(), "127.0.0.1", 0, limits=HTTPLimits(header_timeout=0.5)).start()
    try:
        s = socket.create_connection(("127.0.0.1", srv.port), timeout=10)
        s.sendall(b"GET /metrics HTTP/1.1\r\n")
        cut = False
        for _ in range(100):  # one header byte every 0.1 s: 10 s if nobody cuts it
            try:
                s.sendall(b"X")
            except OSError:
                cut = True
                break
            time.sleep(0.1)
            s.setblocking(False)
            try:
                cut = s.recv(1) == b""
            except BlockingIOError:
                pass
            except OSError:
                cut = True
            s.setblocking(True)
            if cut:
                break
        assert cut and srv.connections.expired == 1
        s.close()
    finally:
        srv.stop()


def test_keep_alive_connection_is_closed_after_the_idle_timeout():
    import http.client

    srv = HTTPExporter(_endpoints(), "127.0.0.1", 0, limits=HTTPLimits(idle_timeout=0.3)).start()
    try:
        conn = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=10)
        conn.request("GET", "/healthz")
        assert conn.getresponse().read() == b"ok\n"
        conn.request("GET", "/healthz")  # same connection, still open
        assert conn.getresponse().read() == b"ok\n"
        assert _wait(lambda: srv.connections.expired == 1 and len(srv.connections) == 0)
        conn.close()
    finally:
        srv.stop()


def test_busy_connections_are_not_evicted_and_a_full_table_refuses():
    import socket
    import threading

    gate = threading.Event()

    def slow_metrics() -> bytes:
        gate.wait(10)
        return b"calmon_ready 1\n"

    ep = Endpoints(slow_metrics, lambda: True, lambda: True, lambda: {}, lambda s: "")
    srv = HTTPExporter(ep, "127.0.0.1", 0, limits=HTTPLimits(max_connections=1)).start()
    try:
        result: dict[str, tuple[int, str]] = {}
        t = threading.Thread(target=lambda: result.update(r=get(f"{srv.url}/metrics")))
        t.start()
        assert _wait(lambda: len(srv.connections) == 1 and srv.connections._conns and
                     next(iter(srv.connections._conns.values())).busy)
        extra = socket.create_connection(("127.0.0.1", srv.port), timeout=10)
        assert _wait(lambda: srv.connections.refused == 1)
        assert extra.recv(1) == b""
        extra.close()
        gate.set()
        t.join(10)
        assert result["r"] == (200, "calmon_ready 1\n")
    finally:
        gate.set()
        srv.stop()


def test_limits_are_validated():
    with pytest.raises(ValueError, match="max_connections"):
        HTTPLimits(max_connections=0)
    with pytest.raises(ValueError, match="positive"):
        HTTPLimits(header_timeout=0)
