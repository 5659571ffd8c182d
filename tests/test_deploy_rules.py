"""deploy/: promtool checks and rule unit tests, Alertmanager routing, the Grafana dashboard's
queries (parsed by promtool, restricted to the metric contract), and consistency of the
Kubernetes and compose assets with the shipped files."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from _deploy_helpers import CONTRACT, DEPLOY, REPO, require_binary

PROM = DEPLOY / "prometheus"
RULES = PROM / "rules" / "calmon-alerts.yml"
RULE_TESTS = PROM / "tests" / "calmon-alerts.test.yml"
DASHBOARD = DEPLOY / "grafana" / "dashboards" / "calmon.json"

GRAFANA_VARS = {
    "$__rate_interval": "1m", "$__interval": "1m", "$__range": "1h",
    "${model}": "fraud", "$model": "fraud", "${segment}": "all", "$segment": "all",
    "${window}": "1h", "$window": "1h", "${diagram_window}": "all", "$diagram_window": "all",
}


def run(args: list[str], cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(args, cwd=cwd, capture_output=True, text=True, timeout=60)


def recorded_names() -> set[str]:
    doc = yaml.safe_load(RULES.read_text())
    return {r["record"] for g in doc["groups"] for r in g["rules"] if "record" in r}


def metric_names(expr: str) -> set[str]:
    unquoted = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)  # label values are not metric names
    return set(re.findall(r"\bcalmon[a-zA-Z0-9_:]*", unquoted))


def substitute(expr: str) -> str:
    for k in sorted(GRAFANA_VARS, key=len, reverse=True):
        expr = expr.replace(k, GRAFANA_VARS[k])
    assert "$" not in expr.replace("$value", ""), f"unsubstituted variable in {expr!r}"
    return expr


def all_panels(panels: list[dict]) -> list[dict]:
    out = []
    for p in panels:
        out.append(p)
        out.extend(all_panels(p.get("panels", [])))
    return out


def dashboard() -> dict:
    return json.loads(DASHBOARD.read_text())


def dashboard_exprs() -> list[tuple[str, str]]:
    """(where, PromQL) for every panel target, annotation and variable query of the dashboard."""
    d = dashboard()
    out = []
    for p in all_panels(d["panels"]):
        for t in p.get("targets", []):
            out.append((f"panel {p['title']!r} target {t['refId']}", t["expr"]))
    for a in d["annotations"]["list"]:
        if "expr" in a:
            out.append((f"annotation {a['name']!r}", a["expr"]))
    for v in d["templating"]["list"]:
        if v["type"] == "query":
            m = re.fullmatch(r"label_values\((.*),\s*([a-zA-Z_]+)\)", v["query"]["query"])
            assert m, f"variable {v['name']}: expected label_values(selector, label)"
            out.append((f"variable {v['name']}", m.group(1)))
    return out


# ------------------------------------------------------------------------ promtool


def test_promtool_check_rules():
    promtool = require_binary("promtool")
    res = run([promtool, "check", "rules", str(RULES)])
    assert res.returncode == 0, res.stdout + res.stderr
    assert "SUCCESS" in res.stdout


def test_promtool_check_config():
    promtool = require_binary("promtool")
    res = run([promtool, "check", "config", "prometheus.yml"], cwd=PROM)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "1 rule files found" in res.stdout


def test_promtool_rule_unit_tests():
    promtool = require_binary("promtool")
    res = run([promtool, "test", "rules", str(RULE_TESTS)])
    assert res.returncode == 0, res.stdout + res.stderr
    assert "SUCCESS" in res.stdout


@pytest.mark.parametrize("old,new", [
    ("expr: calmon_alert_active == 1", "expr: calmon_alert_active == 2"),
    ('calmon_ece{window="24h"} > 0.05', 'calmon_ece{window="24h"} > 0.5'),
    ("calmon_window_events{window=\"24h\"} >= 1000", "calmon_window_events{window=\"24h\"} >= 0"),
    ("expr: up{job=\"calmon\"} == 0\n        for: 5m", "expr: up{job=\"calmon\"} == 0\n        for: 1m"),
    ("calmon_verdict_material == 0", "calmon_verdict_material == 2"),  # the tolerance ignored
])
def test_rule_unit_tests_catch_a_broken_rule(tmp_path, old, new):
    """The promtool unit tests are not vacuous: a mutated rule makes them fail."""
    promtool = require_binary("promtool")
    text = RULES.read_text()
    assert old in text
    (tmp_path / "rules").mkdir()
    (tmp_path / "rules" / "calmon-alerts.yml").write_text(text.replace(old, new))
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "t.yml").write_text(RULE_TESTS.read_text())
    res = run([promtool, "test", "rules", str(tmp_path / "tests" / "t.yml")])
    assert res.returncode != 0 and "FAILED" in res.stdout + res.stderr


def test_rules_use_only_contract_metrics():
    doc = yaml.safe_load(RULES.read_text())
    recorded = recorded_names()
    used = set()
    for g in doc["groups"]:
        for r in g["rules"]:
            names = metric_names(r["expr"])
            used |= names
            name = r.get("alert") or r.get("record")
            assert names <= CONTRACT | recorded, (name, names - CONTRACT - recorded)
            if "alert" in r:
                assert r["alert"].startswith("Calmon") and "summary" in r["annotations"]
                assert r.get("labels", {}).get("severity") in ("warning", "critical") or \
                    r["alert"] == "CalmonCalibrationAlert"  # carries the agent's severity label
            else:
                assert re.fullmatch(r"calmon:[a-z0-9_]+:[a-z0-9_]+", r["record"]), r["record"]
    assert {"calmon_alert_active", "calmon_test_rejected", "calmon_ece"} <= used


# ------------------------------------------------------------------------ Alertmanager


def test_alertmanager_config_and_routing():
    amtool = require_binary("amtool")
    cfg = DEPLOY / "alertmanager" / "alertmanager.yml"
    res = run([amtool, "check-config", str(cfg)])
    assert res.returncode == 0, res.stdout + res.stderr
    cases = {
        ("alertname=CalmonCalibrationAlert", "model=fraud", "severity=critical"): "ml-calibration",
        ("alertname=CalmonECEHigh", "model=fraud"): "ml-calibration",
        ("alertname=CalmonDown", "instance=a"): "platform",
        ("alertname=Other",): "default",
    }
    for labels, receiver in cases.items():
        res = run([amtool, "config", "routes", "test", f"--config.file={cfg}", *labels])
        assert res.returncode == 0 and res.stdout.strip() == receiver, (labels, res.stdout, res.stderr)


# ------------------------------------------------------------------------ Grafana dashboard


def test_dashboard_queries_parse_as_promql(tmp_path):
    """Every query of the dashboard (variables substituted) parses: promtool checks it as a recording rule."""
    promtool = require_binary("promtool")
    exprs = dashboard_exprs()
    rules = {"groups": [{"name": "dashboard", "rules": [
        {"record": f"dashboard:query_{i}:check", "expr": substitute(e)} for i, (_, e) in enumerate(exprs)]}]}
    path = tmp_path / "dashboard-rules.yml"
    path.write_text(yaml.safe_dump(rules))
    res = run([promtool, "check", "rules", str(path)])
    assert res.returncode == 0, res.stdout + res.stderr
    assert f"SUCCESS: {len(exprs)} rules found" in res.stdout
    # and the check is real: a broken query is refused
    broken = {"record": "dashboard:broken:check", "expr": "sum(rate(calmon_ece[5m])"}
    rules["groups"][0]["rules"].append(broken)
    path.write_text(yaml.safe_dump(rules))
    assert run([promtool, "check", "rules", str(path)]).returncode != 0


def test_dashboard_uses_only_contract_metrics():
    recorded = recorded_names()
    for where, expr in dashboard_exprs():
        names = metric_names(expr)
        assert names, f"{where}: references no calmon metric: {expr}"
        assert names <= CONTRACT | recorded, f"{where}: not in the metric contract: {names - CONTRACT}"


def test_dashboard_structure_and_required_panels():
    d = dashboard()
    panels = all_panels(d["panels"])
    ids = [p["id"] for p in panels]
    assert len(ids) == len(set(ids)), "duplicate panel ids"
    for p in panels:
        g = p["gridPos"]
        assert 0 <= g["x"] and g["x"] + g["w"] <= 24 and g["h"] >= 1, p["title"]
        if p["type"] != "row":
            assert p["targets"], p["title"]
            assert p["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, p["title"]
    names = {v["name"]: v for v in d["templating"]["list"]}
    assert {"datasource", "model", "segment", "window"} <= set(names)
    assert names["model"]["multi"] and names["window"]["multi"]

    def panels_using(metric: str, kind: str | None = None) -> list[dict]:
        return [p for p in panels if p["type"] != "row" and (kind is None or p["type"] == kind)
                and any(metric in t["expr"] for t in p["targets"])]

    bars = panels_using("calmon_reliability_mean_outcome", "barchart")
    rel = [p for p in bars if len(p["targets"]) > 1]  # the diagram: observed and mean score side by side
    assert len(rel) == 1 and rel[0]["repeat"] == "diagram_window"  # the windows whose diagram is exported
    assert any("calmon_reliability_mean_score" in t["expr"] for t in rel[0]["targets"])
    (gap,) = [p for p in bars if len(p["targets"]) == 1]  # observed - mean score per bin: the direction
    assert gap["repeat"] == "diagram_window" and " - calmon_reliability_mean_score" in gap["targets"][0]["expr"]
    (verdict,) = [p for p in panels_using("calmon_test_rejected", "table") if "Verdict" in p["title"]]
    assert verdict["targets"][0]["expr"].startswith("max by (model, segment, window)")
    assert "calmon_verdict_material" in verdict["targets"][0]["expr"]  # "within tolerance" is not "MISCALIBRATED"
    parent_rows = [p for p in d["panels"] if p["type"] == "row" and p.get("repeat") == "model"]
    assert parent_rows, "reliability diagrams must repeat per model"
    for metric, kind in [("calmon_ece{", "timeseries"), ("calmon_smce", "timeseries"),
                         ('calmon_test_p_value{test="tcal"', "timeseries"), ("calmon_alert_active", None),
                         ("calmon_events_total", "timeseries"), ("calmon_join_pending", "timeseries"),
                         ("calmon_source_lag_seconds", "timeseries"), ("calmon_calibrator_version", "table")]:
        assert panels_using(metric, kind), f"no {kind or ''} panel for {metric}"


def test_grafana_provisioning_points_at_the_dashboard():
    ds = yaml.safe_load((DEPLOY / "grafana" / "provisioning" / "datasources" / "calmon.yaml").read_text())
    (source,) = ds["datasources"]
    ds_var = dashboard()["templating"]["list"][0]
    assert source["type"] == "prometheus" and source["uid"] == ds_var["current"]["value"]
    prov = yaml.safe_load((DEPLOY / "grafana" / "provisioning" / "dashboards" / "calmon.yaml").read_text())
    assert prov["providers"][0]["options"]["path"] == "/var/lib/grafana/dashboards/calmon"
    compose = (DEPLOY / "compose.yaml").read_text()
    assert "./grafana/dashboards:/var/lib/grafana/dashboards/calmon" in compose


# ------------------------------------------------------------------------ Kubernetes, compose, systemd


def k8s_docs() -> list[dict]:
    docs = []
    for f in sorted((DEPLOY / "kubernetes").glob("*.yaml")):
        docs.extend(d for d in yaml.safe_load_all(f.read_text()) if d)
    return docs


def test_kubernetes_manifests_are_consistent():
    docs = k8s_docs()
    kinds = {d["kind"]: d for d in docs}
    assert {"Deployment", "Service", "ConfigMap", "PrometheusRule", "ServiceMonitor"} <= set(kinds)
    for d in docs:
        assert d["apiVersion"] and d["metadata"]["name"], d
    # the PrometheusRule carries exactly the shipped rules
    assert kinds["PrometheusRule"]["spec"]["groups"] == yaml.safe_load(RULES.read_text())["groups"]
    dep, svc, mon = kinds["Deployment"], kinds["Service"], kinds["ServiceMonitor"]
    pod = dep["spec"]["template"]
    assert dep["spec"]["selector"]["matchLabels"].items() <= pod["metadata"]["labels"].items()
    assert svc["spec"]["selector"].items() <= pod["metadata"]["labels"].items()
    port_names = {p["name"] for p in svc["spec"]["ports"]}
    assert {e["port"] for e in mon["spec"]["endpoints"]} <= port_names
    assert mon["spec"]["selector"]["matchLabels"].items() <= svc["metadata"]["labels"].items()
    (container,) = pod["spec"]["containers"]
    probes = {container["readinessProbe"]["httpGet"]["path"], container["livenessProbe"]["httpGet"]["path"]}
    assert probes == {"/readyz", "/healthz"}
    cfg = yaml.safe_load(kinds["ConfigMap"]["data"]["calmon.yaml"])
    assert cfg["exporter"]["address"] == "0.0.0.0"
    assert cfg["exporter"]["port"] == container["ports"][0]["containerPort"]


def test_compose_and_systemd_reference_existing_files():
    compose = yaml.safe_load((DEPLOY / "compose.yaml").read_text())
    services = compose["services"]
    assert {"calmon", "kafka", "prometheus", "alertmanager", "grafana"} <= set(services)
    for svc in services.values():
        for vol in svc.get("volumes", []):
            src = vol.split(":")[0]
            if src.startswith("."):
                assert (DEPLOY / src).exists(), f"compose volume source missing: {src}"
    build = services["calmon"]["build"]
    context = (DEPLOY / build["context"]).resolve()
    assert context == REPO and (context / build["dockerfile"]).is_file()
    dockerfile = (context / build["dockerfile"]).read_text()
    for src in re.findall(r"^COPY (?!--from)(.+) \S+$", dockerfile, re.M):
        for item in src.split():
            assert (REPO / item).exists(), f"Dockerfile copies missing {item}"
    unit = (DEPLOY / "systemd" / "calmon.service").read_text()
    assert re.search(r"^ExecStart=.*calmon run -c ", unit, re.M)
    assert "KillSignal=SIGTERM" in unit and "[Install]" in unit


def test_shipped_agent_configurations_validate(tmp_path):
    """The compose and Kubernetes agent configurations pass the agent's validation, alert rules included."""
    from calmon.alerts import validate_rules
    from calmon.config import load_config
    kinds = {d["kind"]: d for d in k8s_docs()}
    k8s_cfg = tmp_path / "calmon.yaml"
    k8s_cfg.write_text(kinds["ConfigMap"]["data"]["calmon.yaml"])
    for path in (DEPLOY / "calmon.compose.yaml", k8s_cfg):
        cfg = load_config(path, env={})
        rules = validate_rules(cfg.alerts.rules, path="alerts.rules")
        assert rules and rules[0].kind == "test_rejected"
        assert cfg.exporter.port == 9464 and cfg.exporter.address == "0.0.0.0"


@pytest.mark.skipif(sys.version_info < (3, 11), reason="grafana-foundation-sdk needs Python >= 3.11")
def test_dashboard_json_is_the_generator_output():
    """The committed JSON is what Grafana's typed SDK builds (the `deploy` extra installs it)."""
    res = run([sys.executable, str(DEPLOY / "grafana" / "generate_dashboard.py")])
    assert res.returncode == 0, res.stderr
    assert res.stdout == DASHBOARD.read_text(), "run: python deploy/grafana/generate_dashboard.py --write"


# ------------------------------------------------------------------ the dashboard against the default /metrics
MATCHER = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)\s*(=~|!=|!~|=)\s*"((?:[^"\\]|\\.)*)"')
SELECTOR = re.compile(r"\b(calmon_[a-zA-Z0-9_:]*)\s*(?:\{([^}]*)\})?")


def default_export(tmp_path: Path) -> dict[str, list[dict[str, str]]]:
    """Sample name -> label sets of /metrics as ``calmon run`` with the default configuration exports it: the
    budget the agent builds, a round with every default tester, estimates, an alert and a calibrator, and
    every live counter."""
    from prometheus_client.parser import text_string_to_metric_families

    from calmon.agent.runtime import Agent
    from calmon.config import build_config
    from calmon.exporter.metrics import AgentMetrics
    from calmon.exporter.rounds import ESTIMATED, WINDOW_GAUGES
    from calmon.exporter.views import LiveView, RoundView

    cfg = build_config({"sources": [{"path": str(tmp_path / "events.jsonl")}], "state_dir": str(tmp_path / "s")},
                       env={})
    budget = Agent(cfg, sources=[]).metrics.budget
    model = GRAFANA_VARS["$model"]
    evs = [{"model": model, "segment": "all", "window": w, "n": 500, "predictions": 600,
            "metrics": {fld: 0.1 for fld, _ in WINDOW_GAUGES.values()},
            "reliability": [{"bin": b / 20, "events": 3, "mean_score": b / 20, "mean_outcome": b / 20}
                            for b in range(20)],
            "tests": {t.name: {"statistic": 0.1, "p_value": 0.4, "decision": "calibrated", "evaluated_at": 1.0}
                      for t in cfg.evaluation.tests},
            "estimated": {m: {"value": 0.5, "lo": 0.4, "hi": 0.6} for m in ESTIMATED},
            "estimation_error": {m: 0.01 for m in ESTIMATED}, "score_drift": {"psi": 0.1, "p_value": 0.5},
            "summary": {"verdict": "calibrated", "material": False}}  # as summarize() says of these tests
           for w in cfg.windows.names]
    view = RoundView(scheduler={"evaluations": 3, "overruns": 0, "last_timestamp": 1.0}, evaluations=evs,
                     state_bytes={model: 100},
                     alerts=[{"alert": "CalibrationDrift", "model": model, "segment": "all", "window": w,
                              "severity": "critical", "state": "firing"} for w in cfg.windows.names],
                     calibrators=[{"model": model, "method": "platt", "version": 1, "before": {"ece": 0.1},
                                   "after": {"ece": 0.01}, "reason": None, "published_at": 1.0}])
    live = LiveView(ready=True, events={(model, "labeled"): 5}, rejected={"bad_json": 1}, late={model: 1},
                    join={"joined": {model: 1}, "expired": {model: 1}, "duplicates": {model: 1}, "orphans": 1},
                    pending={model: 2},
                    sources={"events": {"records": 5, "lag_seconds": 1.0, "lag_bytes": 10, "lag_records": 3}},
                    checkpoint={"last_timestamp": 1.0, "duration": 0.1, "count": 1},
                    changes={model: {"signals": {"residual": {"detections": 1, "last": {"change_point": 1.0}}}}})
    metrics = AgentMetrics(lambda: live, budget, clock=lambda: 2.0)
    metrics.evaluation_duration.observe(0.5)
    metrics.prepare(view)
    out: dict[str, list[dict[str, str]]] = {}
    # what the shipped Prometheus configuration scrapes: /metrics, and its detail job's collect[]
    text = metrics.render().decode() + "".join(metrics.render(c).decode() for c in shipped_collect())
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out.setdefault(s.name, []).append(s.labels)
    return out


def shipped_collect() -> list[list[str]]:
    """The ``collect[]`` of every calmon job of the shipped prometheus.yml that has one."""
    cfg = yaml.safe_load((PROM / "prometheus.yml").read_text())
    return [j["params"]["collect[]"] for j in cfg["scrape_configs"]
            if j["job_name"].startswith("calmon") and "collect[]" in (j.get("params") or {})]


def _matches(labels: dict[str, str], matchers: str) -> bool:
    for name, op, value in MATCHER.findall(matchers):
        have = labels.get(name, "")
        hit = have == value if op in ("=", "!=") else re.fullmatch(value, have) is not None
        if hit != (op in ("=", "=~")):
            return False
    return True


def unresolved(expr: str, exported: dict[str, list[dict[str, str]]]) -> list[str]:
    """The selectors of ``expr`` (variables substituted) that no exported series matches."""
    return [f"{name}{{{m or ''}}}" for name, m in SELECTOR.findall(re.sub(r"\[[^\]]*\]", "", expr))
            if not any(_matches(labels, m or "") for labels in exported.get(name, []))]


def test_dashboard_queries_resolve_against_the_default_export(tmp_path):
    """Every panel, annotation and variable query finds its series in /metrics as the default configuration
    exports it (exporter.reliability, max_series_per_window, estimates), for every value of every variable --
    a panel asking for series the default no longer exports (a diagram of a window without one, an interval
    of a non-headline estimate) fails here."""
    exported = default_export(tmp_path)
    d = dashboard()
    values: dict[str, list[str]] = {k.lstrip("$").strip("{}"): [v] for k, v in GRAFANA_VARS.items()}
    for v in d["templating"]["list"]:  # as Grafana does: each variable's values from its query
        if v["type"] == "query":
            sel, label = re.fullmatch(r"label_values\((.*),\s*([a-zA-Z_]+)\)", v["query"]["query"]).groups()
            name, m = SELECTOR.fullmatch(substitute(sel)).groups()
            values[v["name"]] = sorted({s[label] for s in exported.get(name, []) if _matches(s, m or "")
                                        and label in s})
            assert values[v["name"]], f"variable {v['name']}: no values in the default export"
    assert values["window"] == sorted(["1h", "24h", "7d", "all"]) and values["diagram_window"] == ["all"]
    missing = []
    for where, expr in dashboard_exprs():
        for var in sorted(set(re.findall(r"\$\{?([a-z_]+)\}?", expr)) - {"__rate_interval", "__interval",
                                                                         "__range", "value"}):
            for value in values[var]:  # one variable at a time over its values, the others at their defaults
                e = re.sub(r"\$\{?" + var + r"\}?(?![a-z_])", value, expr)
                missing += [f"{where} ({var}={value}): {s}" for s in unresolved(substitute(e), exported)]
        missing += [f"{where}: {s}" for s in unresolved(substitute(expr), exported)]
    assert not missing, "dashboard queries without series in the default /metrics:\n" + "\n".join(missing)
    # the check can fail: series the default does not export
    for gone in ('calmon_reliability_events{model="fraud",window="1h"}', "calmon_estimated_brier_lower",
                 'calmon_estimation_error{metric="brier"}'):
        assert unresolved(gone, exported), gone


def test_dashboard_verdict_table_tells_material_from_within_tolerance(tmp_path):
    """The verdict table's query, evaluated by Prometheus' own engine (promtool): 0 no test rejects, 1 a material
    rejection, 2 a rejection within the verdict's tolerance, and the tests alone without calmon_verdict_material."""
    promtool = require_binary("promtool")
    panels = all_panels(dashboard()["panels"])
    (verdict,) = [p for p in panels if p["type"] == "table" and "Verdict" in p["title"]]
    expr = substitute(verdict["targets"][0]["expr"])
    series = []
    for model, rejected, material in (("ok", 0, 0), ("bad", 1, 1), ("small", 1, 0), ("old", 1, None)):
        for test, r in (("tcal", rejected), ("smce", 0)):
            series.append({"series": f'calmon_test_rejected{{model="{model}",segment="all",window="1h",'
                                     f'test="{test}"}}', "values": f"{r}x3"})
        if material is not None:
            series.append({"series": f'calmon_verdict_material{{model="{model}",segment="all",window="1h"}}',
                           "values": f"{material}x3"})
    expr = expr.replace('model=~"fraud"', 'model=~".*"')
    want = {"ok": 0, "bad": 1, "small": 2, "old": 1}
    doc = {"rule_files": [], "evaluation_interval": "1m", "tests": [{
        "interval": "1m", "input_series": series,
        "promql_expr_test": [{"expr": expr, "eval_time": "2m", "exp_samples": [
            {"labels": f'{{model="{m}",segment="all",window="1h"}}', "value": v} for m, v in want.items()]}]}]}
    (tmp_path / "t.yml").write_text(yaml.safe_dump(doc))
    res = run([promtool, "test", "rules", str(tmp_path / "t.yml")])
    assert res.returncode == 0, res.stdout + res.stderr
