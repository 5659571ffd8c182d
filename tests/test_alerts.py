"""Alert engine: state machine against a declarative reference, hysteresis, validation,
checkpoints, the Prometheus gauge, and pushes to a real Alertmanager."""

from __future__ import annotations

import json
import math
import socket
import threading
import time

import numpy as np
import pytest
from _deploy_helpers import http, start_alertmanager, stop
from prometheus_client import CollectorRegistry, Gauge

from calmon.alerts import AlertEngine, AlertmanagerClient, AlertState, validate_rules


def ev(decision=None, *, model="m", segment="all", window="1h", n=1000, metrics=None, p=0.01, test="tcal"):
    tests = {} if decision is None else {test: {"decision": decision, "p_value": p, "statistic": 2.0,
                                                "method": "x"}}
    return {"model": model, "segment": segment, "window": window, "n": n, "metrics": metrics or {},
            "tests": tests}


CODE = {"B": "miscalibrated", "O": "calibrated", "U": "insufficient data"}


def reference_states(seq: str, N: int, M: int) -> list[str]:
    """Declarative definition of the alert state after each evaluation of ``seq`` (B bad, O ok, U unknown).

    Unknown evaluations are dropped; on the judged sequence h:
    firing(t)  <=> exists s <= t with h[s-N+1..s] all bad and no M consecutive OKs in h[s+1..t];
    pending(t) <=> not firing(t) and h[t] bad;
    resolved(t) <=> not firing(t), and for the last u < t with firing(u), h[u+1..t] has no bad;
    inactive otherwise.
    """
    judged: list[str] = []
    out: list[str] = []
    states: list[str] = []
    for c in seq:
        if c == "U":
            out.append(states[-1] if states else "inactive")
            continue
        judged.append(c)
        t = len(judged) - 1
        h = "".join(judged)

        def firing_at(t: int) -> bool:
            for s in range(N - 1, t + 1):
                if h[s - N + 1: s + 1] == "B" * N and "O" * M not in h[s + 1: t + 1]:
                    return True
            return False

        if firing_at(t):
            st = "firing"
        elif h[t] == "B":
            st = "pending"
        else:
            us = [u for u in range(t) if firing_at(u)]
            st = "resolved" if us and "B" not in h[us[-1] + 1: t + 1] else "inactive"
        states.append(st)
        out.append(st)
    return out


@pytest.mark.parametrize("N,M", [(1, 1), (2, 1), (3, 2), (2, 4)])
def test_state_machine_matches_reference_on_random_sequences(N, M):
    rng = np.random.default_rng(100 * N + M)
    for _ in range(60):
        length = int(rng.integers(1, 30))
        seq = "".join(rng.choice(list("BOU"), size=length, p=[0.45, 0.4, 0.15]))
        eng = AlertEngine([{"name": "Drift", "kind": "test_rejected", "test": "tcal",
                            "consecutive": N, "clear_after": M}], resolved_retention=1e9)
        got = []
        for t, c in enumerate(seq):
            states = eng.evaluate([ev(CODE[c])], now=float(t))
            got.append(states[0].state if states else "inactive")
        assert got == reference_states(seq, N, M), seq


def test_fire_and_resolve_timing_and_timestamps():
    eng = AlertEngine([{"name": "Drift", "kind": "test_rejected", "test": "tcal", "consecutive": 3,
                        "clear_after": 2, "severity": "critical"}])
    seq = ["calibrated", "miscalibrated", "miscalibrated", "miscalibrated", "calibrated", "calibrated"]
    states = [eng.evaluate([ev(d)], now=100.0 + 10 * i)[0] for i, d in enumerate(seq)]
    assert [s.state for s in states] == ["inactive", "pending", "pending", "firing", "firing", "resolved"]
    final = states[-1]
    assert final.started_at == 130.0 and final.ended_at == 150.0 and final.since == 150.0
    assert final.severity == "critical" and final.value == pytest.approx(0.01)


def test_hysteresis_flapping_never_resolves():
    eng = AlertEngine([{"name": "Drift", "kind": "test_rejected", "test": "tcal", "consecutive": 1,
                        "clear_after": 2}])
    eng.evaluate([ev("miscalibrated")], now=0)
    for t in range(1, 40):
        st = eng.evaluate([ev("calibrated" if t % 2 else "miscalibrated")], now=t)[0]
        assert st.state == "firing"
    assert eng.evaluate([ev("calibrated")], now=41)[0].state == "resolved"


def test_insufficient_data_and_min_events_freeze_the_state():
    eng = AlertEngine([{"name": "Drift", "kind": "test_rejected", "test": "tcal", "consecutive": 2,
                        "clear_after": 1, "min_events": 500}])
    assert eng.evaluate([ev("miscalibrated", n=100)], now=0)[0].state == "inactive"
    assert eng.evaluate([ev("miscalibrated", n=100)], now=1)[0].state == "inactive"
    assert eng.evaluate([ev("miscalibrated")], now=2)[0].state == "pending"
    assert eng.evaluate([ev("insufficient data")], now=3)[0].state == "pending"
    assert eng.evaluate([ev("miscalibrated")], now=4)[0].state == "firing"
    assert eng.evaluate([ev("calibrated", n=10)], now=5)[0].state == "firing"
    assert eng.evaluate([ev(None)], now=6)[0].state == "firing"  # tester missing from this round
    assert eng.evaluate([ev("calibrated")], now=7)[0].state == "resolved"


def test_a_rejection_within_the_verdicts_tolerance_does_not_alert_unless_asked():
    """The verdict said "calibrated within tolerance; no action" while the rule paged: the rule follows it now."""
    def judged(material: bool | None) -> dict:
        e = ev("miscalibrated")
        e["summary"] = {"verdict": "calibrated within tolerance" if material is False else "miscalibrated",
                        "material": material}
        return e

    follows = AlertEngine([{"name": "Drift", "kind": "test_rejected", "test": "tcal", "consecutive": 2,
                            "clear_after": 2}])
    strict = AlertEngine([{"name": "Drift", "kind": "test_rejected", "test": "tcal", "consecutive": 2,
                           "clear_after": 2, "ignore_immaterial": False}])
    got = [(follows.evaluate([judged(m)], now=t)[0].state, strict.evaluate([judged(m)], now=t)[0].state)
           for t, m in enumerate([False, False, True, True, False, False, None, None])]
    assert got == [("inactive", "pending"), ("inactive", "firing"), ("pending", "firing"), ("firing", "firing"),
                   ("firing", "firing"), ("resolved", "firing"), ("pending", "firing"), ("firing", "firing")]
    # an evaluation without a verdict (older checkpoints, plugins) is judged by the test alone
    assert follows.evaluate([ev("miscalibrated")], now=9)[0].state == "firing"
    with pytest.raises(ValueError, match=r"^alerts\[0\]\.ignore_immaterial: only valid for kind 'test_rejected'"):
        validate_rules([{"name": "x", "kind": "threshold", "metric": "ece", "threshold": 1,
                         "ignore_immaterial": False}])
    with pytest.raises(ValueError, match=r"^alerts\[0\]\.ignore_immaterial: expected true or false"):
        validate_rules([{"name": "x", "kind": "test_rejected", "test": "t", "ignore_immaterial": "no"}])


def test_threshold_rules_ops_paths_and_nan():
    eng = AlertEngine([
        {"name": "EceHigh", "kind": "threshold", "metric": "ece", "threshold": 0.05, "min_events": 100},
        {"name": "PLow", "kind": "threshold", "metric": "tests.tcal.p_value", "op": "<", "threshold": 0.001},
        {"name": "AccLow", "kind": "threshold", "metric": "accuracy", "op": "<=", "threshold": 0.5,
         "windows": ["24h"]},
    ])

    def by_name(states, window="1h"):
        return {s.alert: s for s in states if s.window == window}

    s = by_name(eng.evaluate([ev("miscalibrated", p=1e-4, metrics={"ece": 0.08, "accuracy": 0.5})], now=0))
    assert s["EceHigh"].state == "firing" and s["EceHigh"].value == pytest.approx(0.08)
    assert s["PLow"].state == "firing" and "AccLow" not in s  # window 1h not selected
    states = eng.evaluate([ev("miscalibrated", p=0.01, metrics={"ece": 0.05}, window="24h")], now=1)
    s24 = by_name(states, "24h")
    assert s24["AccLow"].state == "inactive" and s24["AccLow"].value is None  # missing metric: unknown
    assert s24["EceHigh"].state == "inactive" and s24["PLow"].state == "inactive"
    assert by_name(states)["EceHigh"].state == "firing"  # the 1h state is kept while not evaluated
    nan_ev = ev("calibrated", p=0.5, metrics={"ece": float("nan"), "accuracy": 0.4})
    s = by_name(eng.evaluate([nan_ev], now=2))
    assert s["EceHigh"].state == "firing" and s["EceHigh"].value is None  # NaN: unknown
    assert s["PLow"].state == "resolved"
    s = by_name(eng.evaluate([ev("calibrated", metrics={"ece": 0.05}, n=1000)], now=3))
    assert s["EceHigh"].state == "resolved"  # 0.05 > 0.05 is False
    s = by_name(eng.evaluate([ev("calibrated", metrics={"accuracy": 0.5}, window="24h")], now=4), "24h")
    assert s["AccLow"].state == "firing"  # <= is inclusive
    s = by_name(eng.evaluate([ev("calibrated", metrics={"ece": 0.5}, n=99)], now=5))
    assert s["EceHigh"].state == "resolved"  # below min_events: not judged


def test_selectors_and_independent_keys():
    eng = AlertEngine([{"name": "Drift", "kind": "test_rejected", "test": "tcal", "models": ["fraud-*"],
                        "segments": "all", "windows": ["1h", "24h"]}])
    evs = [ev("miscalibrated", model="fraud-v1"), ev("miscalibrated", model="churn"),
           ev("miscalibrated", model="fraud-v2", window="7d"),
           ev("calibrated", model="fraud-v2", window="24h"),
           ev("miscalibrated", model="fraud-v1", segment="eu")]
    states = eng.evaluate(evs, now=0)
    assert [(s.model, s.segment, s.window, s.state) for s in states] == [
        ("fraud-v1", "all", "1h", "firing"), ("fraud-v2", "all", "24h", "inactive")]


def test_annotations_are_templated_without_format_injection():
    eng = AlertEngine([{"name": "Drift", "kind": "test_rejected", "test": "tcal", "labels": {"team": "risk"},
                        "annotations": {"summary": "{model}/{window}: p={value} {model.__class__} {0}"}}])
    st = eng.evaluate([ev("miscalibrated", p=0.00123)], now=0)[0]
    assert st.annotations["summary"] == "m/1h: p=0.00123 {model.__class__} {0}"
    assert st.labels == {"team": "risk"}


def test_resolved_retention_forgets_and_missing_keys_are_pruned():
    eng = AlertEngine([{"name": "Drift", "kind": "test_rejected", "test": "tcal"}], resolved_retention=60)
    eng.evaluate([ev("miscalibrated"), ev("calibrated", model="other")], now=0)
    assert {s.model: s.state for s in eng.states} == {"m": "firing", "other": "inactive"}
    eng.evaluate([ev("calibrated")], now=10)
    assert {s.model: s.state for s in eng.states} == {"m": "resolved"}  # inactive 'other' not seen: pruned
    eng.evaluate([], now=50)
    assert [s.state for s in eng.states] == ["resolved"]
    eng.evaluate([], now=71)
    assert eng.states == []
    eng.evaluate([ev("miscalibrated")], now=80)
    eng.evaluate([], now=90)  # a firing alert whose model vanished stays firing
    assert [s.state for s in eng.states] == ["firing"]


BAD_CONFIGS = [
    ({"name": "x", "kind": "nope", "test": "t"}, "alerts[0].kind"),
    ({"kind": "test_rejected", "test": "t"}, "alerts[0].name"),
    ({"name": "9x", "kind": "test_rejected", "test": "t"}, "alerts[0].name"),
    ({"name": "x", "kind": "test_rejected"}, "alerts[0].test"),
    ({"name": "x", "kind": "test_rejected", "test": "t", "threshold": 1}, "alerts[0].threshold"),
    ({"name": "x", "kind": "threshold", "metric": "ece"}, "alerts[0].threshold"),
    ({"name": "x", "kind": "threshold", "metric": "ece", "threshold": float("nan")}, "alerts[0].threshold"),
    ({"name": "x", "kind": "threshold", "metric": "ece", "threshold": True}, "alerts[0].threshold"),
    ({"name": "x", "kind": "threshold", "threshold": 1}, "alerts[0].metric"),
    ({"name": "x", "kind": "threshold", "metric": "tests.tcal", "threshold": 1}, "alerts[0].metric"),
    ({"name": "x", "kind": "threshold", "metric": "ece", "threshold": 1, "op": "=="}, "alerts[0].op"),
    ({"name": "x", "kind": "test_rejected", "test": "t", "consecutive": 0}, "alerts[0].consecutive"),
    ({"name": "x", "kind": "test_rejected", "test": "t", "clear_after": 1.5}, "alerts[0].clear_after"),
    ({"name": "x", "kind": "test_rejected", "test": "t", "min_events": -1}, "alerts[0].min_events"),
    ({"name": "x", "kind": "test_rejected", "test": "t", "models": []}, "alerts[0].models"),
    ({"name": "x", "kind": "test_rejected", "test": "t", "windows": [1]}, "alerts[0].windows"),
    ({"name": "x", "kind": "test_rejected", "test": "t", "severity": "loud"}, "alerts[0].severity"),
    ({"name": "x", "kind": "test_rejected", "test": "t", "labels": {"model": "a"}}, "alerts[0].labels.model"),
    ({"name": "x", "kind": "test_rejected", "test": "t", "labels": {"bad-name": "a"}},
     "alerts[0].labels.bad-name"),
    ({"name": "x", "kind": "test_rejected", "test": "t", "annotations": {"s": 1}}, "alerts[0].annotations.s"),
    ({"name": "x", "kind": "test_rejected", "test": "t", "tresHold": 1}, "alerts[0].tresHold"),
]


@pytest.mark.parametrize("rule,key", BAD_CONFIGS)
def test_validation_names_the_offending_key(rule, key):
    with pytest.raises(ValueError) as info:
        validate_rules([rule])
    assert str(info.value).startswith(key + ":"), str(info.value)


def test_validation_of_containers_and_duplicates():
    with pytest.raises(ValueError, match=r"^alerts: expected a list"):
        validate_rules("nope")
    with pytest.raises(ValueError, match=r"^alerts\[1\]: expected a mapping"):
        validate_rules([{"name": "a", "kind": "test_rejected", "test": "t"}, 3])
    with pytest.raises(ValueError, match=r"^alerts\[1\]\.name: duplicate"):
        validate_rules([{"name": "a", "kind": "test_rejected", "test": "t"}] * 2)
    with pytest.raises(ValueError, match=r"^alerts\.oops: unknown key"):
        validate_rules({"rules": [], "oops": 1})
    assert validate_rules({"rules": [{"name": "a", "kind": "test_rejected", "test": "t"}]})[0].name == "a"
    with pytest.raises(ValueError, match=r"^alerts\[0\]\.kind"):
        AlertEngine([{"name": "a"}])


def test_checkpoint_round_trip_continues_identically():
    rules = [{"name": "Drift", "kind": "test_rejected", "test": "tcal", "consecutive": 3, "clear_after": 2},
             {"name": "Ece", "kind": "threshold", "metric": "ece", "threshold": 0.1, "consecutive": 2}]
    rng = np.random.default_rng(7)
    seqs = [[ev(CODE[c], model=m, metrics={"ece": float(rng.uniform(0, 0.2))})
             for m in ("a", "b")] for c in rng.choice(list("BOU"), size=40)]
    straight = AlertEngine(rules, resolved_retention=1e9)
    cut = AlertEngine(rules, resolved_retention=1e9)
    seen = set()
    for t, evs in enumerate(seqs):
        a = [s.to_dict() for s in straight.evaluate(evs, now=t)]
        b = [s.to_dict() for s in cut.evaluate(evs, now=t)]
        assert a == b
        seen |= {d["state"] for d in a}
        cut = AlertEngine.from_dict(json.loads(json.dumps(cut.to_dict())), rules, resolved_retention=1e9)
    assert seen == {"inactive", "pending", "firing", "resolved"}  # the sequence exercised every state
    # a rule removed from the configuration drops its states on restore
    restored = AlertEngine.from_dict(straight.to_dict(), rules[:1])
    assert {s.alert for s in restored.states} <= {"Drift"}
    with pytest.raises(ValueError):
        AlertEngine.from_dict({"version": 99}, rules)


def test_update_gauge_exports_firing_as_one_and_removes_stale_series():
    reg = CollectorRegistry()
    gauge = Gauge("calmon_alert_active", "1 while firing",
                  ["alert", "model", "segment", "window", "severity"], registry=reg)
    eng = AlertEngine([{"name": "Drift", "kind": "test_rejected", "test": "tcal", "consecutive": 2}],
                      resolved_retention=5)
    labels = {"alert": "Drift", "model": "m", "segment": "all", "window": "1h", "severity": "warning"}
    eng.evaluate([ev("miscalibrated")], now=0)
    eng.update_gauge(gauge)
    assert reg.get_sample_value("calmon_alert_active", labels) == 0.0  # pending
    eng.evaluate([ev("miscalibrated")], now=1)
    eng.update_gauge(gauge)
    assert reg.get_sample_value("calmon_alert_active", labels) == 1.0
    eng.evaluate([ev("calibrated")], now=2)
    eng.update_gauge(gauge)
    assert reg.get_sample_value("calmon_alert_active", labels) == 0.0
    eng.evaluate([], now=10)
    eng.update_gauge(gauge)
    assert reg.get_sample_value("calmon_alert_active", labels) is None


# ---------------------------------------------------------------- Alertmanager


def test_payload_shape():
    st = AlertState("Drift", "m", "all", "1h", "warning", state="firing", since=10.0, started_at=10.0,
                    value=0.001, labels={"team": "risk"}, annotations={"summary": "s"})
    c = AlertmanagerClient("http://127.0.0.1:1/prefix/", firing_ttl=120, generator_url="http://agent/",
                           external_labels={"instance": "i"})
    assert c.url == "http://127.0.0.1:1/prefix/api/v2/alerts"
    (item,) = c.payload([st, AlertState("X", "m", "all", "1h", "info", state="pending")], now=100.0)
    assert item["labels"] == {"instance": "i", "team": "risk", "alertname": "Drift", "model": "m",
                              "segment": "all", "window": "1h", "severity": "warning"}
    assert item["startsAt"] == "1970-01-01T00:00:10.000000Z"
    assert item["endsAt"] == "1970-01-01T00:03:40.000000Z"
    assert item["annotations"] == {"summary": "s", "value": "0.001"} and item["generatorURL"] == "http://agent/"
    with pytest.raises(ValueError, match="alertmanager.url"):
        AlertmanagerClient("file:///etc/passwd")
    with pytest.raises(ValueError, match="alertmanager.timeout"):
        AlertmanagerClient("http://x:1", timeout=0)


def test_push_errors_are_counted_not_raised():
    with socket.socket() as s:  # a closed port: connection refused
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    firing = [AlertState("Drift", "m", "all", "1h", "warning", state="firing", since=0, started_at=0)]
    c = AlertmanagerClient(f"http://127.0.0.1:{port}", timeout=1)
    assert c.push(firing, now=1) is False and c.errors_total == 1 and "Error" in c.last_error
    assert c.push([], now=1) is True and c.errors_total == 1  # nothing to send

    srv = socket.socket()  # accepts, never answers: a timeout
    srv.bind(("127.0.0.1", 0))
    srv.listen(5)
    conns = []
    th = threading.Thread(target=lambda: conns.append(srv.accept()), daemon=True)
    th.start()
    try:
        c = AlertmanagerClient(f"http://127.0.0.1:{srv.getsockname()[1]}", timeout=0.5)
        t0 = time.monotonic()
        assert c.push(firing, now=1) is False
        assert time.monotonic() - t0 < 5 and c.errors_total == 1 and "timed out" in c.last_error.lower()
    finally:
        srv.close()
        for conn, _ in conns:
            conn.close()


@pytest.mark.integration
def test_push_to_real_alertmanager(tmp_path):
    proc, url = start_alertmanager(tmp_path)
    try:
        eng = AlertEngine([{"name": "CalmonCalibrationDrift", "kind": "test_rejected", "test": "tcal",
                            "consecutive": 2, "clear_after": 1, "severity": "critical",
                            "annotations": {"description": "p = {value} on {n} events"}}])
        client = AlertmanagerClient(url, timeout=3, generator_url="http://calmon.local/")
        now = time.time() - 5  # so that the resolution time is in Alertmanager's past
        client.push(eng.evaluate([ev("miscalibrated", p=1e-5)], now=now), now=now)  # pending: nothing sent
        assert client.sent_total == 0
        states = eng.evaluate([ev("miscalibrated", p=2e-5), ev("calibrated", model="ok")], now=now + 1)
        assert client.push(states, now=now + 1) is True, client.last_error
        assert client.sent_total == 1 and client.errors_total == 0

        status, alerts = http("GET", url + "/api/v2/alerts")
        assert status == 200 and len(alerts) == 1
        a = alerts[0]
        assert a["labels"] == {"alertname": "CalmonCalibrationDrift", "model": "m", "segment": "all",
                               "window": "1h", "severity": "critical"}
        assert a["annotations"]["description"] == "p = 2e-05 on 1000 events"
        assert a["annotations"]["value"] == "2e-05" and a["generatorURL"] == "http://calmon.local/"
        assert a["status"]["state"] == "active"
        assert abs(_parse_ts(a["startsAt"]) - (now + 1)) < 1e-3

        states = eng.evaluate([ev("calibrated", p=0.4)], now=now + 2)
        assert [s.state for s in states] == ["resolved"]
        assert client.push(states, now=now + 2) is True
        status, alerts = http("GET", url + "/api/v2/alerts")
        assert status == 200 and alerts == []  # resolved (endsAt in the past): no longer active

        bad = AlertmanagerClient(url + "/not-here", timeout=3)  # Alertmanager answers 404
        one = [AlertState("X", "m", "all", "1h", "info", state="firing", since=now)]
        assert bad.push(one, now=now) is False
        assert bad.errors_total == 1 and bad.last_error.startswith("HTTP 404")
    finally:
        stop(proc)


def _parse_ts(s: str) -> float:
    from datetime import datetime

    s = s.replace("Z", "+00:00")
    if "." in s:
        head, frac_tz = s.split(".", 1)
        frac, tz = frac_tz[:-6], frac_tz[-6:]
        s = f"{head}.{frac[:6]}{tz}"
    return datetime.fromisoformat(s).timestamp()


def test_reference_is_not_trivial():
    # guard the guard: the reference distinguishes all four states
    assert reference_states("BBOBOO", 2, 2) == ["pending", "firing", "firing", "firing", "firing", "resolved"]
    assert reference_states("BOUBB", 2, 1) == ["pending", "inactive", "inactive", "pending", "firing"]
    assert not math.isnan(0.0)


def test_engine_reports_the_configuration_path():
    with pytest.raises(ValueError, match=r"^alerts\.rules\[0\]\.threshold:"):
        AlertEngine([{"name": "x", "kind": "threshold", "metric": "ece"}], path="alerts.rules")
