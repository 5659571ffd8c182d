"""Generate the Grafana dashboard deploy/grafana/dashboards/calmon.json (the JSON is committed).

    python deploy/grafana/generate_dashboard.py --write    # after editing this file
    python deploy/grafana/generate_dashboard.py            # print the JSON

tests/test_deploy_rules.py checks that the committed JSON equals this script's output, that every query
parses as PromQL and that it uses only the metric contract (docs/deploy.md).
"""

import json

DS = {"type": "prometheus", "uid": "${datasource}"}
SEL = 'model=~"$model",segment=~"$segment",window=~"$window"'
LEG = "{{model}} {{segment}} {{window}}"
DUR = "sum by (le) (rate(calmon_evaluation_duration_seconds_bucket[$__rate_interval]))"
pid = [0]


def nid():
    pid[0] += 1
    return pid[0]


def target(expr, legend="", ref="A", instant=False, fmt="time_series"):
    t = {"datasource": DS, "expr": expr, "legendFormat": legend or "__auto", "refId": ref,
         "range": not instant, "instant": instant, "format": fmt}
    return t


def ts(title, targets, x, y, w=12, h=8, unit="short", desc="", min_=None, max_=None, log=False,
       thresholds=None, draw="line"):
    custom = {"drawStyle": draw, "lineWidth": 1, "fillOpacity": 10, "showPoints": "never", "spanNulls": True}
    if log:
        custom["scaleDistribution"] = {"type": "log", "log": 10}
    defaults = {"unit": unit, "custom": custom}
    if min_ is not None:
        defaults["min"] = min_
    if max_ is not None:
        defaults["max"] = max_
    if thresholds:
        defaults["thresholds"] = {"mode": "absolute", "steps": thresholds}
        custom["thresholdsStyle"] = {"mode": "line"}
    return {"id": nid(), "type": "timeseries", "title": title, "description": desc, "datasource": DS,
            "gridPos": {"x": x, "y": y, "w": w, "h": h}, "targets": targets,
            "fieldConfig": {"defaults": defaults, "overrides": []},
            "options": {"legend": {"displayMode": "table", "placement": "bottom",
                                   "calcs": ["lastNotNull", "max"]},
                        "tooltip": {"mode": "multi", "sort": "desc"}}}


def stat(title, targets, x, y, w=4, h=4, unit="short", desc="", thresholds=None, mappings=None):
    return {"id": nid(), "type": "stat", "title": title, "description": desc, "datasource": DS,
            "gridPos": {"x": x, "y": y, "w": w, "h": h}, "targets": targets,
            "fieldConfig": {"defaults": {"unit": unit, "mappings": mappings or [],
                                         "thresholds": {"mode": "absolute", "steps": thresholds or [
                                             {"color": "green", "value": None}]}}, "overrides": []},
            "options": {"reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False},
                        "colorMode": "background", "graphMode": "none", "textMode": "auto"}}


def table(title, targets, x, y, w=12, h=8, desc="", hide=(), transformations=None):
    excl = {k: True for k in ("Time", *hide)}
    return {"id": nid(), "type": "table", "title": title, "description": desc, "datasource": DS,
            "gridPos": {"x": x, "y": y, "w": w, "h": h}, "targets": targets,
            "fieldConfig": {"defaults": {}, "overrides": []}, "options": {"showHeader": True},
            "transformations": transformations or [
                {"id": "merge", "options": {}},
                {"id": "organize", "options": {"excludeByName": excl}}]}


def row(title, y, repeat=None, collapsed=False):
    r = {"id": nid(), "type": "row", "title": title, "gridPos": {"x": 0, "y": y, "w": 24, "h": 1},
         "collapsed": collapsed, "panels": []}
    if repeat:
        r["repeat"] = repeat
    return r


panels = []
y = 0
panels.append(row("Overview", y))
y += 1
panels += [
    stat("Firing calibration alerts", [target('sum(calmon_alert_active{model=~"$model"} == 1) or vector(0)',
                                              instant=True)], 0, y,
         desc="Alerts of the agent's alert engine that are firing (calmon_alert_active).",
         thresholds=[{"color": "green", "value": None}, {"color": "red", "value": 1}]),
    stat("Agent ready", [target("min(calmon_ready)", instant=True)], 4, y,
         desc="1 when sources are connected and the state is loaded.",
         thresholds=[{"color": "red", "value": None}, {"color": "green", "value": 1}],
         mappings=[{"type": "value", "options": {"0": {"text": "NOT READY"}, "1": {"text": "READY"}}}]),
    stat("Last evaluation", [target("time() - max(calmon_last_evaluation_timestamp_seconds)", instant=True)],
         8, y, unit="s", desc="Seconds since the last completed evaluation round.",
         thresholds=[{"color": "green", "value": None}, {"color": "orange", "value": 300},
                     {"color": "red", "value": 900}]),
    stat("Accepted events/s", [target('sum(rate(calmon_events_total{model=~"$model"}[$__rate_interval]))',
                                      instant=True)], 12, y, unit="reqps"),
    stat("Join backlog", [target('sum(calmon_join_pending{model=~"$model"})', instant=True)], 16, y,
         desc="Predictions waiting for their outcome."),
    stat("Version", [target("calmon_build_info", legend="{{version}}", instant=True)], 20, y,
         desc="calmon_build_info", ),
]
panels[-1]["options"]["textMode"] = "name"
y += 4
panels.append(table("Calibration alerts (firing and pending in the agent)",
                    [target('calmon_alert_active{model=~"$model",segment=~"$segment",window=~"$window"}',
                            instant=True, fmt="table")], 0, y, w=24, h=6,
                    desc="calmon_alert_active: 1 = firing, 0 = pending or recently resolved.",
                    hide=("__name__", "job", "instance")))
y += 6

panels.append(row("Calibration over time", y))
y += 1
panels += [
    ts("ECE (15-bin, l1)", [target(f"calmon_ece{{{SEL}}}", LEG)], 0, y,
       unit="percentunit", min_=0,
       desc="Equal-width 15-bin expected calibration error (Guo et al. 2017) of each window."),
    ts("Smooth calibration error (smCE)", [target(f"calmon_smce{{{SEL}}}", LEG)],
       12, y, min_=0, desc="Smooth calibration error (Blasiok et al.); a consistent calibration measure."),
]
y += 8
panels += [
    ts("T-Cal p-value", [target(f'calmon_test_p_value{{test="tcal",{SEL}}}', LEG)],
       0, y, log=True, max_=1,
       thresholds=[{"color": "red", "value": None}, {"color": "green", "value": 0.05}],
       desc="p-value of the adaptive T-Cal test (Lee et al. 2022); below the line (alpha) = miscalibrated."),
    ts("Test decisions (1 = miscalibrated)",
       [target(f"calmon_test_rejected{{{SEL}}}", "{{test}} {{model}} {{segment}} {{window}}")], 12, y,
       min_=0, max_=1, draw="line",
       desc="calmon_test_rejected per tester; insufficient data counts as 0."),
]
y += 8
panels += [
    ts("Debiased l2-ECE^2 (T-Cal)", [target(f"calmon_ece_l2_debiased{{{SEL}}}", LEG)],
       0, y, desc="Debiased squared l2 calibration error at the adaptive binning scale (T-Cal eq. 6)."),
    ts("Lower distance to calibration (LDTC)", [target(f"calmon_ldtc{{{SEL}}}", LEG)],
       12, y, min_=0),
]
y += 8
panels += [
    ts("Accuracy and mean confidence",
       [target(f"calmon_accuracy{{{SEL}}}", "accuracy {{model}} {{segment}} {{window}}"),
        target(f"calmon_mean_confidence{{{SEL}}}", "confidence {{model}} {{segment}} {{window}}", ref="B")],
       0, y, unit="percentunit", desc="Mean outcome (accuracy) against mean score (confidence)."),
    ts("Brier score", [target(f"calmon_brier_score{{{SEL}}}", LEG)], 12, y, min_=0),
]
y += 8
panels.append(ts("Test statistics", [target(f"calmon_test_statistic{{{SEL}}}",
                                            "{{test}} {{model}} {{segment}} {{window}}")], 0, y, w=12))
panels.append(ts("Events in window", [target(f"calmon_window_events{{{SEL}}}", LEG)],
                 12, y, w=12))
y += 8

# reliability diagrams: one row per model, one panel per window
rel = row("Reliability diagram: $model", y, repeat="model")
y += 1
panels.append(rel)
rsel = 'model="$model",segment="$segment",window="$window"'
panels.append({
    "id": nid(), "type": "barchart", "title": "Reliability $model / $window ($segment)",
    "description": "Per score bin (lower edge): mean outcome (observed frequency) beside mean score. "
                   "A calibrated model has equal bars.",
    "datasource": DS, "repeat": "window", "repeatDirection": "h", "maxPerRow": 4,
    "gridPos": {"x": 0, "y": y, "w": 8, "h": 9},
    "targets": [target(f"calmon_reliability_mean_outcome{{{rsel}}}", ref="A", instant=True, fmt="table"),
                target(f"calmon_reliability_mean_score{{{rsel}}}", ref="B", instant=True, fmt="table"),
                target(f"calmon_reliability_events{{{rsel}}}", ref="C", instant=True, fmt="table")],
    "transformations": [
        {"id": "merge", "options": {}},
        {"id": "organize", "options": {
            "excludeByName": {"Time": True, "__name__": True, "job": True, "instance": True, "model": True,
                              "segment": True, "window": True, "Value #C": True},
            "indexByName": {"bin": 0, "Value #B": 1, "Value #A": 2},
            "renameByName": {"Value #A": "mean outcome", "Value #B": "mean score", "Value #C": "events"}}},
        {"id": "sortBy", "options": {"sort": [{"field": "bin"}]}},
    ],
    "fieldConfig": {"defaults": {"min": 0, "max": 1, "unit": "percentunit"}, "overrides": []},
    "options": {"xField": "bin", "orientation": "vertical", "groupWidth": 0.8, "barWidth": 0.9,
                "showValue": "never", "legend": {"displayMode": "list", "placement": "bottom"},
                "tooltip": {"mode": "multi"}, "xTickLabelRotation": -45},
})
y += 9

panels.append(row("Pipeline", y))
y += 1
panels += [
    ts("Accepted events/s by model and type",
       [target('sum by (model, type) (rate(calmon_events_total{model=~"$model"}[$__rate_interval]))',
               "{{model}} {{type}}")], 0, y, unit="reqps"),
    ts("Rejected records/s by reason",
       [target("sum by (reason) (rate(calmon_events_rejected_total[$__rate_interval]))", "{{reason}}")],
       12, y, unit="reqps"),
]
y += 8
panels += [
    ts("Join backlog (predictions waiting for an outcome)",
       [target('calmon_join_pending{model=~"$model"}', "{{model}}")], 0, y),
    ts("Join outcomes/s",
       [target('sum by (model) (rate(calmon_join_joined_total{model=~"$model"}[$__rate_interval]))',
               "joined {{model}}"),
        target('sum by (model) (rate(calmon_join_expired_total{model=~"$model"}[$__rate_interval]))',
               "expired {{model}}", ref="B"),
        target('sum by (model) (rate(calmon_join_duplicate_ids_total{model=~"$model"}[$__rate_interval]))',
               "duplicate ids {{model}}", ref="C"),
        target("sum(rate(calmon_join_orphan_outcomes_total[$__rate_interval]))", "orphan outcomes", ref="D")],
       12, y, unit="reqps"),
]
y += 8
panels += [
    ts("Source lag (event time)", [target("calmon_source_lag_seconds", "{{source}}")], 0, y, unit="s",
       desc="now - event time of the newest record read, per source."),
    ts("Source backlog", [target("calmon_source_lag_records", "records {{source}}"),
                          target("calmon_source_lag_bytes", "bytes {{source}}", ref="B")], 12, y,
       desc="Records not yet read (Kafka consumer lag) or bytes not yet read (file sources)."),
]
y += 8
panels += [
    ts("Records read/s by source",
       [target("sum by (source) (rate(calmon_source_records_total[$__rate_interval]))", "{{source}}")], 0, y,
       w=24, unit="reqps"),
]
y += 8
panels += [
    ts("Evaluation round duration",
       [target(f"histogram_quantile(0.95, {DUR})",
               "p95"),
        target(f"histogram_quantile(0.5, {DUR})",
               "p50", ref="B")], 0, y, unit="s"),
    ts("Evaluations and overruns",
       [target("sum(increase(calmon_evaluations_total[$__rate_interval]))", "rounds"),
        target("sum(increase(calmon_evaluation_overruns_total[$__rate_interval]))", "overruns", ref="B")],
       12, y),
]
y += 8
panels += [
    ts("Checkpoints", [target("time() - calmon_checkpoint_last_timestamp_seconds", "age"),
                       target("calmon_checkpoint_duration_seconds", "duration", ref="B")], 0, y, unit="s"),
    ts("Agent ready", [target("calmon_ready", "{{instance}}")], 12, y, min_=0, max_=1),
]
y += 8

panels.append(row("Calibrators", y))
y += 1
panels += [
    table("Published calibrator versions",
          [target('calmon_calibrator_version{model=~"$model"}', instant=True, fmt="table")], 0, y,
          desc="Version number of the calibrator published for each model and method.",
          hide=("__name__", "job", "instance"),
          transformations=[{"id": "merge", "options": {}},
                           {"id": "organize", "options": {
                               "excludeByName": {"Time": True, "__name__": True, "job": True,
                                                 "instance": True},
                               "renameByName": {"Value": "version"}}}]),
    ts("Calibrator versions over time",
       [target('calmon_calibrator_version{model=~"$model"}', "{{model}} {{method}}")],
       12, y, draw="line"),
]
y += 8
panels.append(ts("Calibrator error before/after (latest fit)",
                 [target('calmon_calibrator_error{model=~"$model"}',
                         "{{model}} {{method}} {{metric}} {{stage}}")],
                 0, y, w=24))


def var(name, query, multi=True, include_all=True, current=None, label=None):
    v = {"name": name, "label": label or name, "type": "query", "datasource": DS,
         "query": {"query": query, "refId": f"{name}-var"}, "definition": query, "refresh": 2,
         "multi": multi, "includeAll": include_all, "sort": 1, "hide": 0, "regex": "", "options": []}
    if current is not None:
        v["current"] = current
    return v


dash = {
    "uid": "calmon-calibration",
    "title": "calmon: calibration monitor",
    "description": "Calibration of production classifiers watched by calmon: reliability diagrams, ECE, "
                   "smCE, "
                   "T-Cal p-values, alerts, event rates, join backlog, source lag, calibrator versions.",
    "tags": ["calmon", "calibration", "ml"],
    "timezone": "utc", "editable": True, "graphTooltip": 1, "schemaVersion": 39, "version": 1,
    "refresh": "30s", "time": {"from": "now-6h", "to": "now"},
    "templating": {"list": [
        {"name": "datasource", "label": "Prometheus", "type": "datasource", "query": "prometheus",
         "current": {"text": "Prometheus", "value": "calmon-prometheus"}, "hide": 0, "refresh": 1,
         "regex": "", "options": []},
        var("model", "label_values(calmon_window_events, model)"),
        var("segment", 'label_values(calmon_window_events{model=~"$model"}, segment)', multi=False,
            include_all=False, current={"text": "all", "value": "all"}),
        var("window", 'label_values(calmon_window_events{model=~"$model"}, window)'),
    ]},
    "annotations": {"list": [
        {"name": "Calibration alerts", "datasource": DS, "enable": True, "iconColor": "red",
         "expr": 'changes(calmon_alert_active{model=~"$model"}[2m]) > 0 and calmon_alert_active == 1',
         "titleFormat": "{{alert}}", "textFormat": LEG, "step": "60s"},
        {"name": "Calibrator published", "datasource": DS, "enable": True, "iconColor": "blue",
         "expr": 'changes(calmon_calibrator_version{model=~"$model"}[2m]) > 0',
         "titleFormat": "calibrator {{method}} published", "textFormat": "{{model}}", "step": "60s"},
    ]},
    "panels": panels,
}


def main(argv: list[str] | None = None) -> int:
    import argparse
    from pathlib import Path

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write", action="store_true", help="write dashboards/calmon.json")
    args = parser.parse_args(argv)
    text = json.dumps(dash, indent=2) + "\n"
    if args.write:
        (Path(__file__).resolve().parent / "dashboards" / "calmon.json").write_text(text)
    else:
        print(text, end="")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
