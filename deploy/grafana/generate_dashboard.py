"""Generate the Grafana dashboard deploy/grafana/dashboards/calmon.json (the JSON is committed).

    python deploy/grafana/generate_dashboard.py --write    # after editing this file
    python deploy/grafana/generate_dashboard.py            # print the JSON

The dashboard is built with Grafana's typed SDK (PyPI ``grafana-foundation-sdk``, the ``deploy`` extra):
panels, variables, transformations and field options are the SDK's models for the Grafana version it
targets, so a misspelt option fails here rather than silently in Grafana. tests/test_deploy_rules.py
checks that the committed JSON equals this script's output, that every query parses as PromQL and uses
only the metric contract (docs/deploy.md); tests/test_e2e_prometheus.py runs every query against a live
Prometheus scraping the agent.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from grafana_foundation_sdk.builders import barchart, common, prometheus, stat, table, timeseries
from grafana_foundation_sdk.builders import dashboard as db
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models import dashboard as dm
from grafana_foundation_sdk.models.common import (
    BigValueColorMode,
    BigValueGraphMode,
    BigValueTextMode,
    GraphDrawStyle,
    GraphThresholdsStyleMode,
    LegendDisplayMode,
    LegendPlacement,
    ScaleDistribution,
    SortOrder,
    TooltipDisplayMode,
    VisibilityMode,
    VizOrientation,
)
from grafana_foundation_sdk.models.prometheus import PromQueryFormat

DS = dm.DataSourceRef(type_val="prometheus", uid="${datasource}")
SEL = 'model=~"$model",segment=~"$segment",window=~"$window"'
#: The reliability diagrams: only the windows whose bins are exported (``exporter.reliability``, by default the
#: longest configured window) -- at /metrics?collect[]=reliability, the shipped second scrape job ``calmon-detail``;
#: the variable ``diagram_window`` lists them, so no panel asks for bins that are not there.
RSEL = 'model="$model",segment="$segment",window="$diagram_window"'
RMSEL = 'model=~"$model",segment=~"$segment",window=~"$diagram_window"'
LEG = "{{model}} {{segment}} {{window}}"
DUR = "sum by (le) (rate(calmon_evaluation_duration_seconds_bucket[$__rate_interval]))"
BY = "model, segment, window"


class Layout:
    """Panel ids and grid positions, left to right, top to bottom (24 columns)."""

    def __init__(self) -> None:
        self.id, self.x, self.y, self.row_h = 0, 0, 0, 0

    def next_id(self) -> int:
        self.id += 1
        return self.id

    def place(self, w: int, h: int) -> dm.GridPos:
        if self.x + w > 24:
            self.newline()
        pos = dm.GridPos(h=h, w=w, x=self.x, y=self.y)
        self.x += w
        self.row_h = max(self.row_h, h)
        return pos

    def newline(self) -> None:
        self.x, self.y, self.row_h = 0, self.y + self.row_h, 0


L = Layout()


def q(expr: str, legend: str = "", ref: str = "A", instant: bool = False, fmt: str = "time_series"
      ) -> prometheus.Dataquery:
    t = (prometheus.Dataquery().expr(expr).ref_id(ref).legend_format(legend or "__auto").datasource(DS)
         .format(PromQueryFormat(fmt)))
    return t.instant() if instant else t.range()


def _common(panel: Any, title: str, targets: Sequence[prometheus.Dataquery], w: int, h: int, desc: str) -> Any:
    panel = panel.id(L.next_id()).title(title).description(desc).datasource(DS).grid_pos(L.place(w, h))
    for t in targets:
        panel = panel.with_target(t)
    return panel


def _thresholds(steps: Sequence[tuple[float | None, str]]) -> db.ThresholdsConfig:
    return db.ThresholdsConfig().mode(dm.ThresholdsMode.ABSOLUTE).steps(
        [dm.Threshold(value=v, color=c) for v, c in steps])


def ts(title: str, targets: Sequence[prometheus.Dataquery], w: int = 12, h: int = 8, unit: str = "short",
       desc: str = "", min_: float | None = None, max_: float | None = None, log: bool = False,
       thresholds: Sequence[tuple[float | None, str]] = ()) -> timeseries.Panel:
    p = (_common(timeseries.Panel(), title, targets, w, h, desc).unit(unit).draw_style(GraphDrawStyle.LINE)
         .line_width(1).fill_opacity(10).show_points(VisibilityMode.NEVER).span_nulls(True)
         .legend(common.VizLegendOptions().display_mode(LegendDisplayMode.TABLE)
                 .placement(LegendPlacement.BOTTOM).calcs(["lastNotNull", "max"]).show_legend(True))
         .tooltip(common.VizTooltipOptions().mode(TooltipDisplayMode.MULTI).sort(SortOrder.DESCENDING)))
    if log:
        p = p.scale_distribution(common.ScaleDistributionConfig().type(ScaleDistribution.LOG).log(10))
    if min_ is not None:
        p = p.min(min_)
    if max_ is not None:
        p = p.max(max_)
    if thresholds:
        p = p.thresholds(_thresholds(thresholds)).thresholds_style(
            common.GraphThresholdsStyleConfig().mode(GraphThresholdsStyleMode.LINE))
    return p


def stat_(title: str, targets: Sequence[prometheus.Dataquery], w: int = 4, h: int = 4, unit: str = "short",
          desc: str = "", steps: Sequence[tuple[float | None, str]] = ((None, "green"),),
          mappings: dict[str, str] | None = None, text_mode: BigValueTextMode = BigValueTextMode.AUTO
          ) -> stat.Panel:
    p = (_common(stat.Panel(), title, targets, w, h, desc).unit(unit).thresholds(_thresholds(steps))
         .reduce_options(common.ReduceDataOptions().calcs(["lastNotNull"]).values(False))
         .color_mode(BigValueColorMode.BACKGROUND).graph_mode(BigValueGraphMode.NONE).text_mode(text_mode))
    if mappings:
        p = p.mappings([_value_map(mappings)])
    return p


def _value_map(texts: dict[str, str], colors: dict[str, str] | None = None) -> dm.ValueMap:
    return dm.ValueMap(options={k: dm.ValueMappingResult(text=v, color=(colors or {}).get(k))
                                for k, v in texts.items()})


def _organize(exclude: Sequence[str], rename: dict[str, str] | None = None,
              index: dict[str, int] | None = None) -> dm.DataTransformerConfig:
    opts: dict[str, Any] = {"excludeByName": {k: True for k in exclude}}
    if rename:
        opts["renameByName"] = rename
    if index:
        opts["indexByName"] = index
    return dm.DataTransformerConfig(id_val="organize", options=opts)


MERGE = dm.DataTransformerConfig(id_val="merge", options={})
HIDDEN = ("Time", "__name__", "job", "instance")


def table_(title: str, targets: Sequence[prometheus.Dataquery], w: int = 12, h: int = 8, desc: str = "",
           transformations: Sequence[dm.DataTransformerConfig] = ()) -> table.Panel:
    p = _common(table.Panel(), title, targets, w, h, desc).show_header(True)
    return p.transformations(list(transformations) or [MERGE, _organize(HIDDEN)])


def row(title: str, repeat: str | None = None) -> db.Row:
    L.newline()
    r = db.Row(title).id(L.next_id()).grid_pos(L.place(24, 1))
    L.newline()
    return r.repeat(repeat) if repeat else r


VERDICT = _value_map({"0": "no test rejects", "1": "MISCALIBRATED", "2": "within tolerance (no action)"},
                     {"0": "green", "1": "red", "2": "yellow"})


def overview(d: db.Dashboard) -> db.Dashboard:
    d = d.with_row(row("Overview"))
    for p in [
        stat_("Firing calibration alerts", [q('sum(calmon_alert_active{model=~"$model"} == 1) or vector(0)',
                                              instant=True)],
              desc="Alerts of the agent's alert engine that are firing (calmon_alert_active).",
              steps=[(None, "green"), (1, "red")]),
        stat_("Agent ready", [q("min(calmon_ready)", instant=True)],
              desc="1 when sources are connected and the state is loaded.", steps=[(None, "red"), (1, "green")],
              mappings={"0": "NOT READY", "1": "READY"}),
        stat_("Last evaluation", [q("time() - max(calmon_last_evaluation_timestamp_seconds)", instant=True)],
              unit="s", desc="Seconds since the last completed evaluation round.",
              steps=[(None, "green"), (300, "orange"), (900, "red")]),
        stat_("Accepted events/s", [q('sum(rate(calmon_events_total{model=~"$model"}[$__rate_interval]))',
                                      instant=True)], unit="reqps"),
        stat_("Join backlog", [q('sum(calmon_join_pending{model=~"$model"})', instant=True)],
              desc="Predictions waiting for their outcome."),
        stat_("Version", [q("calmon_build_info", legend="{{version}}", instant=True)], desc="calmon_build_info",
              text_mode=BigValueTextMode.NAME),
    ]:
        d = d.with_panel(p)
    L.newline()
    d = d.with_panel(table_(
        "Verdict per window: does any test reject calibration?",
        # 2 where a test rejects but the verdict calls it immaterial (calmon_verdict_material 0); an agent
        # without that family falls back to the tests alone
        [q(f"max by ({BY}) (calmon_test_rejected{{{SEL}}}) * on ({BY}) "
           f"(2 - max by ({BY}) (calmon_verdict_material{{{SEL}}})) "
           f"or max by ({BY}) (calmon_test_rejected{{{SEL}}})", instant=True, fmt="table")], w=12, h=6,
        desc="1 = at least one tester rejects calibration at its level (calmon_test_rejected) and the error is "
             "material; 2 = it rejects, but the ECE interval lies below verdict.tolerance.ece "
             "(calmon_verdict_material 0). The status page (the link in every calibration alert) says in which "
             "direction and in which score ranges.",
        transformations=[MERGE, _organize(HIDDEN, rename={"Value": "verdict"})]).mappings([VERDICT]))
    d = d.with_panel(table_("Calibration alerts (firing and pending in the agent)",
                            [q(f"calmon_alert_active{{{SEL}}}", instant=True, fmt="table")], w=12, h=6,
                            desc="calmon_alert_active: 1 = firing, 0 = pending or recently resolved."))
    return d


def over_time(d: db.Dashboard) -> db.Dashboard:
    d = d.with_row(row("Calibration over time"))
    for p in [
        ts("ECE (15-bin, l1)", [q(f"calmon_ece{{{SEL}}}", LEG)], unit="percentunit", min_=0,
           desc="Equal-width 15-bin expected calibration error (Guo et al. 2017) of each window."),
        ts("Smooth calibration error (smCE)", [q(f"calmon_smce{{{SEL}}}", LEG)], min_=0,
           desc="Smooth calibration error (Blasiok et al.); a consistent calibration measure."),
        ts("T-Cal p-value", [q(f'calmon_test_p_value{{test="tcal",{SEL}}}', LEG)], log=True, max_=1,
           thresholds=[(None, "red"), (0.05, "green")],
           desc="p-value of the adaptive T-Cal test (Lee et al. 2022); below the line (alpha) = miscalibrated."),
        ts("Test decisions (1 = miscalibrated)",
           [q(f"calmon_test_rejected{{{SEL}}}", "{{test}} {{model}} {{segment}} {{window}}")], min_=0, max_=1,
           desc="calmon_test_rejected per tester; insufficient data counts as 0."),
        ts("Debiased l2-ECE^2 (T-Cal)", [q(f"calmon_ece_l2_debiased{{{SEL}}}", LEG)],
           desc="Debiased squared l2 calibration error at the adaptive binning scale (T-Cal eq. 6); "
                "unbiased, so it can be slightly negative when the model is calibrated."),
        ts("Lower distance to calibration (LDTC)", [q(f"calmon_ldtc{{{SEL}}}", LEG)], min_=0),
        ts("Accuracy and mean score",
           [q(f"calmon_accuracy{{{SEL}}}", "accuracy {{model}} {{segment}} {{window}}"),
            q(f"calmon_mean_confidence{{{SEL}}}", "mean score {{model}} {{segment}} {{window}}", ref="B")],
           unit="percentunit", desc="Accuracy (binary: at threshold 0.5) and the mean score (binary) or mean "
                                    "top-label confidence (calmon_mean_confidence)."),
        ts("Brier score", [q(f"calmon_brier_score{{{SEL}}}", LEG)], min_=0),
        ts("Score bias (mean score - observed frequency), diagram windows",
           [q(f"sum by ({BY}) (calmon_reliability_events{{{RMSEL}}} * (calmon_reliability_mean_score{{{RMSEL}}} - "
              f"calmon_reliability_mean_outcome{{{RMSEL}}})) / sum by ({BY}) (calmon_reliability_events{{{RMSEL}}})",
              LEG)], unit="percentunit",
           desc="Event-weighted mean of (mean score - observed frequency) over the reliability bins: above 0 the "
                "scores are too high on average, below 0 too low. Over-confidence can have zero bias: read the "
                "gap per bin below. Only for the windows whose diagram is exported (scrape job calmon-detail; the "
                "variable 'Diagram window', set by exporter.reliability); every window's diagram is on the status "
                "page."),
        ts("Test statistics", [q(f"calmon_test_statistic{{{SEL}}}", "{{test}} {{model}} {{segment}} {{window}}")],
           desc="calmon_test_statistic per tester (scrape job calmon-detail, /metrics?collect[]=details)."),
        ts("Events in window", [q(f"calmon_window_events{{{SEL}}}", LEG)]),
    ]:
        d = d.with_panel(p)
    return d


def reliability(d: db.Dashboard) -> db.Dashboard:
    d = d.with_row(row("Reliability diagram: $model", repeat="model"))
    rel = (_common(barchart.Panel(), "Reliability $model / $diagram_window ($segment)",
                   [q(f"calmon_reliability_mean_outcome{{{RSEL}}}", instant=True, fmt="table"),
                    q(f"calmon_reliability_mean_score{{{RSEL}}}", ref="B", instant=True, fmt="table"),
                    q(f"calmon_reliability_events{{{RSEL}}}", ref="C", instant=True, fmt="table")], 8, 9,
                   "Per score bin (lower edge): observed frequency beside mean score. A calibrated model has "
                   "equal bars. Binary: observed above the score = scores too low there; an over-confident "
                   "model has low-score bins above and high-score bins below. Windows: those whose diagram is "
                   "exported (exporter.reliability, by default the longest configured window; scrape job "
                   "calmon-detail, /metrics?collect[]=reliability); every "
                   "window's diagram is on the agent's status page and in /api/status.")
           .repeat("diagram_window").repeat_direction("h").max_per_row(4)
           .transformations([MERGE, _organize(
               ("Time", "__name__", "job", "instance", "model", "segment", "window", "Value #C"),
               rename={"Value #A": "observed frequency", "Value #B": "mean score", "Value #C": "events"},
               index={"bin": 0, "Value #B": 1, "Value #A": 2}),
               dm.DataTransformerConfig(id_val="sortBy", options={"sort": [{"field": "bin"}]})])
           .min(0).max(1).unit("percentunit").x_field("bin").orientation(VizOrientation.VERTICAL)
           .group_width(0.8).bar_width(0.9).show_value(VisibilityMode.NEVER).x_tick_label_rotation(-45)
           .legend(common.VizLegendOptions().display_mode(LegendDisplayMode.LIST).placement(LegendPlacement.BOTTOM)
                   .show_legend(True))
           .tooltip(common.VizTooltipOptions().mode(TooltipDisplayMode.MULTI)))
    L.newline()
    gap = (_common(barchart.Panel(), "Gap per score bin: observed - mean score ($model / $diagram_window)",
                   [q(f"calmon_reliability_mean_outcome{{{RSEL}}} - calmon_reliability_mean_score{{{RSEL}}}",
                      instant=True, fmt="table")], 8, 7,
                   "Above 0: outcomes more frequent than the scores say (binary: scores too low in that bin); "
                   "below 0: too high. Over-confident binary model: positive at low scores, negative at high.")
           .repeat("diagram_window").repeat_direction("h").max_per_row(4)
           .transformations([MERGE, _organize(("Time", "job", "instance", "model", "segment", "window"),
                                              rename={"Value": "observed - mean score"}),
                             dm.DataTransformerConfig(id_val="sortBy", options={"sort": [{"field": "bin"}]})])
           .unit("percentunit").x_field("bin").orientation(VizOrientation.VERTICAL)
           .show_value(VisibilityMode.NEVER).x_tick_label_rotation(-45)
           .thresholds(_thresholds([(None, "red"), (0, "orange")])))
    return d.with_panel(rel).with_panel(gap)


def pipeline(d: db.Dashboard) -> db.Dashboard:
    d = d.with_row(row("Pipeline"))
    rate = "[$__rate_interval]"
    for p in [
        ts("Accepted events/s by model and type",
           [q(f'sum by (model, type) (rate(calmon_events_total{{model=~"$model"}}{rate}))', "{{model}} {{type}}")],
           unit="reqps"),
        ts("Rejected records/s by reason",
           [q(f"sum by (reason) (rate(calmon_events_rejected_total{rate}))", "{{reason}}")], unit="reqps"),
        ts("Join backlog (predictions waiting for an outcome)", [q('calmon_join_pending{model=~"$model"}',
                                                                   "{{model}}")]),
        ts("Join outcomes/s",
           [q(f'sum by (model) (rate(calmon_join_joined_total{{model=~"$model"}}{rate}))', "joined {{model}}"),
            q(f'sum by (model) (rate(calmon_join_expired_total{{model=~"$model"}}{rate}))', "expired {{model}}",
              ref="B"),
            q(f'sum by (model) (rate(calmon_join_duplicate_ids_total{{model=~"$model"}}{rate}))',
              "duplicate ids {{model}}", ref="C"),
            q(f"sum(rate(calmon_join_orphan_outcomes_total{rate}))", "orphan outcomes", ref="D")], unit="reqps"),
        ts("Source lag (event time)", [q("calmon_source_lag_seconds", "{{source}}")], unit="s",
           desc="now - event time of the newest record read, per source."),
        ts("Source backlog", [q("calmon_source_lag_records", "records {{source}}"),
                              q("calmon_source_lag_bytes", "bytes {{source}}", ref="B")],
           desc="Records not yet read (Kafka consumer lag) or bytes not yet read (file sources)."),
        ts("Records read/s by source", [q(f"sum by (source) (rate(calmon_source_records_total{rate}))",
                                          "{{source}}")], w=24, unit="reqps"),
        ts("Evaluation round duration", [q(f"histogram_quantile(0.95, {DUR})", "p95"),
                                         q(f"histogram_quantile(0.5, {DUR})", "p50", ref="B")], unit="s"),
        ts("Evaluations and overruns",
           [q(f"sum(increase(calmon_evaluations_total{rate}))", "rounds"),
            q(f"sum(increase(calmon_evaluation_overruns_total{rate}))", "overruns", ref="B")]),
        ts("Checkpoints", [q("time() - calmon_checkpoint_last_timestamp_seconds", "age"),
                           q("calmon_checkpoint_duration_seconds", "duration", ref="B")], unit="s"),
        ts("Agent ready", [q("calmon_ready", "{{instance}}")], min_=0, max_=1),
    ]:
        d = d.with_panel(p)
    return d


def calibrators(d: db.Dashboard) -> db.Dashboard:
    d = d.with_row(row("Calibrators"))
    d = d.with_panel(table_(
        "Published calibrator versions", [q('calmon_calibrator_version{model=~"$model"}', instant=True, fmt="table")],
        desc="Version number of the calibrator published for each model and method.",
        transformations=[MERGE, _organize(HIDDEN, rename={"Value": "version"})]))
    d = d.with_panel(ts("Calibrator versions over time",
                        [q('calmon_calibrator_version{model=~"$model"}', "{{model}} {{method}}")]))
    d = d.with_panel(table_(
        "Held-out ECE: raw vs recalibrated (latest fit)",
        [q('calmon_calibrator_error{model=~"$model",metric="ece",stage="before"}', instant=True, fmt="table"),
         q('calmon_calibrator_error{model=~"$model",metric="ece",stage="after"}', ref="B", instant=True,
           fmt="table")], w=12,
        desc="ECE of the raw scores and of the calibrator on the refit's held-out rows (calmon_calibrator_error).",
        transformations=[MERGE, _organize((*HIDDEN, "metric", "stage"),
                                          rename={"Value #A": "ECE raw", "Value #B": "ECE recalibrated"})]
    ).unit("percentunit"))
    return d.with_panel(ts("Calibrator error before/after (latest fit)",
                           [q('calmon_calibrator_error{model=~"$model"}',
                              "{{model}} {{method}} {{metric}} {{stage}}")]))


def variable(name: str, query: str, multi: bool = True, include_all: bool = True,
             current: str | None = None, label: str | None = None) -> db.QueryVariable:
    v = (db.QueryVariable(name).label(label or name).datasource(DS).query({"query": query, "refId": f"{name}-var"})
         .refresh(dm.VariableRefresh.ON_TIME_RANGE_CHANGED).multi(multi).include_all(include_all)
         .sort(dm.VariableSort.ALPHABETICAL_ASC))
    if current is not None:
        v = v.current(dm.VariableOption(text=current, value=current, selected=True))
    return v


def build() -> dict[str, Any]:
    """The dashboard as Grafana's JSON model."""
    global L
    L = Layout()
    d = (db.Dashboard("calmon: calibration monitor").uid("calmon-calibration")
         .description("Calibration of production classifiers watched by calmon: verdicts, reliability diagrams, "
                      "ECE, smCE, T-Cal p-values, alerts, event rates, join backlog, source lag, calibrators.")
         .tags(["calmon", "calibration", "ml"]).timezone("utc").editable()
         .tooltip(dm.DashboardCursorSync.CROSSHAIR).refresh("30s").time("now-6h", "now")
         .with_variable(db.DatasourceVariable("datasource").label("Prometheus").type("prometheus")
                        .current(dm.VariableOption(text="Prometheus", value="calmon-prometheus", selected=True)))
         .with_variable(variable("model", "label_values(calmon_window_events, model)"))
         .with_variable(variable("segment", 'label_values(calmon_window_events{model=~"$model"}, segment)',
                                 multi=False, include_all=False, current="all"))
         .with_variable(variable("window", 'label_values(calmon_window_events{model=~"$model"}, window)'))
         .with_variable(variable("diagram_window",
                                 'label_values(calmon_reliability_events{model=~"$model"}, window)',
                                 label="Diagram window"))
         .annotation(db.AnnotationQuery().name("Calibration alerts").datasource(DS).enable(True).icon_color("red")
                     .expr('changes(calmon_alert_active{model=~"$model"}[2m]) > 0 and calmon_alert_active == 1'))
         .annotation(db.AnnotationQuery().name("Calibrator published").datasource(DS).enable(True)
                     .icon_color("blue").expr('changes(calmon_calibrator_version{model=~"$model"}[2m]) > 0')))
    for section in (overview, over_time, reliability, pipeline, calibrators):
        d = section(d)
    doc: dict[str, Any] = json.loads(json.dumps(d.build(), cls=JSONEncoder))
    return doc


def main(argv: list[str] | None = None) -> int:
    import argparse
    from pathlib import Path

    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--write", action="store_true", help="write dashboards/calmon.json")
    args = parser.parse_args(argv)
    text = json.dumps(build(), indent=2) + "\n"
    if args.write:
        (Path(__file__).resolve().parent / "dashboards" / "calmon.json").write_text(text)
    else:
        print(text, end="")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
