"""The agent's status page: an overview of every model, and a page per model, served at ``/`` and ``/model/NAME``.

The index (:func:`render`) opens with the document's warnings as a banner, the counts and how fresh the
evaluation is, then an **overview table**: one row per model, segment and window with its labelled events,
ECE with its interval, the verdict, the last detected change and the alert state, worst first, filtered,
sorted and paged by the query string (:mod:`calmon.exporter.status.overview`; readable at a thousand models,
a page is at most :data:`~calmon.exporter.status.overview.PAGE_SIZE` rows).  Then the alerts, the detected
changes and the calibrators, each bounded (the models without a calibrator are grouped by the reason).

A model's page (:func:`render_model`) holds the details: which calibrator is in service and what it did on
held-out rows, or why none was published; per window a verdict in plain words (once), the reliability diagram
(inline SVG, with the score histogram, 95 % intervals per bin and the miscalibrated score ranges shaded), the
window's metrics under plain names (formal names in tooltips) and the tester results; segments other than
``all`` collapsed.  No external CSS, fonts, scripts or images; every label from the stream is HTML-escaped.

Snapshot shape (``/api/status``; every key optional, missing ones render as "unknown")::

    {"generated_at": float | RFC 3339 str, "version": str,
     "evaluations": [{"model", "segment", "window", "n", "metrics": {name: float},
                      "reliability": [{"bin": lower edge, "hi": upper edge, "mean_score": float | None,
                                       "mean_outcome": float | None, "events": int}],
                      "tests": {name: {"statistic", "p_value", "decision", "method", ...}},
                      "summary": {"calibrated", "direction", "regions": [{"lo", "hi", "sign", "gap"}],
                                  "ece", "ece_ci", "recommendation", "text"}}],
     "alerts": [{"alert", "model", "segment", "window", "severity", "state", "since", "value"}],
     "calibrators": {model: {"method", "version", "published_at", "before": {...}, "after": {...}}},
     "agent": {"uptime_seconds", "scheduler": {"evaluations", "overruns", "last_timestamp",
                                                "last_duration", "every", "next_at"}}}

A region's ``sign`` is the sign of (observed frequency - mean score): positive = the bar is above
the diagonal.  Without a ``summary`` the page derives regions from the bins alone (see
:func:`bin_regions`).

References
----------
Reliability diagrams: DeGroot & Fienberg (1983), "The comparison and evaluation of forecasters";
Guo et al. (2017), "On calibration of modern neural networks", Section 2 (Figure 1); intervals per bin
as in Brocker & Smith (2007), "Increasing the reliability of reliability diagrams" (normal
approximation to the binomial at the bin's mean score, i.e. under the hypothesis of calibration).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from datetime import datetime
from html import escape
from typing import Any, Literal

from calmon.exporter.status.diagram import (
    PAD_TOP,
    SIZE,
    Region,
    bin_regions,
    direction_text,
    finite,
    fmt_num,
    fmt_time,
    regions_of,
    reliability_svg,
)
from calmon.exporter.status.labelfree import changes_section, estimates_block
from calmon.exporter.status.overview import (
    VERDICTS,
    Query,
    Row,
    model_href,
    overview_rows,
    overview_table,
    select,
    verdict_class,
)

__all__ = ["PAD_TOP", "SIZE", "IndexFrame", "Region", "bin_regions", "calibrator_line", "direction_text",
           "index_frame", "refresh_seconds", "reliability_svg", "render", "render_model"]

#: Fallback reload period when the snapshot does not say how often the agent evaluates.
DEFAULT_REFRESH = 60

_CSS = """
:root{--fg:#1d2330;--muted:#5b6474;--line:#d8dde6;--ok:#1a7f37;--warn:#9a6700;--bad:#cf222e;--bg:#f6f8fa}
*{box-sizing:border-box}body{font:14px/1.45 system-ui,-apple-system,Segoe UI,Roboto,sans-serif;
color:var(--fg);margin:0;background:#fff}
header{background:#1d2330;color:#fff;padding:12px 24px;display:flex;gap:24px;
align-items:baseline;flex-wrap:wrap}header h1{font-size:20px;margin:0}header .meta{color:#c9d1d9}
main{padding:16px 24px}h2{font-size:18px;border-bottom:1px solid var(--line);padding-bottom:4px;
margin-top:28px}
h3{font-size:15px;margin:0 0 6px}table{border-collapse:collapse;margin:6px 0 12px}
th,td{border:1px solid var(--line);padding:3px 8px;text-align:left;vertical-align:top}
th{background:var(--bg);font-weight:600}td.num{text-align:right;font-variant-numeric:tabular-nums}
th[title],td[title],span[title]{text-decoration:underline dotted var(--muted);cursor:help}
.cards{display:flex;flex-wrap:wrap;gap:16px}.card{border:1px solid var(--line);border-radius:6px;padding:12px;
width:430px}.card figure{margin:0}.badge{display:inline-block;padding:0 7px;border-radius:10px;font-size:12px;
font-weight:600;color:#fff;background:var(--muted)}.badge.firing,.badge.miscalibrated,.badge.critical,
.badge.page,.badge.error{background:var(--bad)}.badge.pending,.badge.warning{background:var(--warn)}
.badge.calibrated,.badge.resolved,.badge.ok{background:var(--ok)}.muted{color:var(--muted)}
.summary{display:flex;gap:12px;flex-wrap:wrap}
.summary div{background:var(--bg);border-radius:6px;padding:6px 12px}
.verdict{border-left:4px solid var(--muted);background:var(--bg);padding:6px 10px;margin:6px 0 10px}
.verdict.miscalibrated{border-color:var(--bad)}.verdict.calibrated{border-color:var(--ok)}
.verdict p{margin:2px 0}.bad{color:var(--bad);font-weight:600}
.fresh{margin:8px 0 0}.fresh.stale{color:var(--bad);font-weight:600}
.legend span{display:inline-block;width:10px;height:10px;margin:0 3px 0 8px;vertical-align:middle}
svg text{font:11px system-ui,sans-serif;fill:#5b6474}svg .bar{fill:#5b8def;fill-opacity:.75}
svg .gap{fill:#cf222e;fill-opacity:.3}svg .diag{stroke:#1d2330;stroke-dasharray:5 3}
svg .axis{stroke:#5b6474}svg .dot{fill:#1d2330}svg .ci{stroke:#1d2330;stroke-width:1.2}
svg .hist{fill:#8c959f}svg .region.above{fill:#f0b400;fill-opacity:.16}
svg .region.below{fill:#cf222e;fill-opacity:.12}
.badge.tolerance{background:var(--ok)}.badge.unknown{background:var(--muted)}
.warnings{border:1px solid var(--warn);border-left:6px solid var(--warn);background:#fff8c5;padding:8px 12px;
margin:0 0 12px}.warnings ul{margin:4px 0 0;padding-left:20px}.warnings code{background:#fff;padding:0 3px}
.counts a{display:inline-block;margin:8px 12px 4px 0}.filters{margin:6px 0}.filters input{width:260px}
.filters input,.filters select,.filters button{font:inherit;padding:2px 6px;margin-right:6px}
table.overview th a{color:inherit;text-decoration:none}table.overview tbody tr:hover{background:var(--bg)}
tr.row.miscalibrated td:first-child{border-left:3px solid var(--bad)}.pager a{margin:0 6px}
details.segment{margin:12px 0}details.segment>summary{cursor:pointer;font-size:15px}
.calibrator-line{background:var(--bg);padding:6px 10px;border-radius:6px}
"""



# ----------------------------------------------------------------------------- formatting
def _pct(v: Any) -> str:
    f = finite(v)
    return "-" if f is None else f"{100 * f:.2f} %"


def _epoch(t: Any) -> float | None:
    """Seconds since the epoch from a number or an RFC 3339 string (``None`` if neither)."""
    if isinstance(t, str):
        try:
            return datetime.fromisoformat(t.replace("Z", "+00:00")).timestamp()
        except ValueError:
            return None
    return finite(t)


def _ago(seconds: float) -> str:
    s = max(0.0, seconds)
    return f"{s:.0f} s" if s < 120 else (f"{s / 60:.0f} min" if s < 7200 else f"{s / 3600:.1f} h")


# ----------------------------------------------------------------------------- metrics and tests
#: metric key -> (plain name for binary scores, plain name for top-label confidence, tooltip, kind)
_METRICS: dict[str, tuple[str, str, str, str]] = {
    "ece": ("calibration error (ECE)", "calibration error (ECE)",
            "ece: expected calibration error, l1 over 15 equal-width bins (Guo et al. 2017, eq. 3)", "pct"),
    "smce": ("smooth calibration error", "smooth calibration error",
             "smce: smooth calibration error (Blasiok et al. 2023), a consistent calibration measure", "pct"),
    "ece_l2_debiased": ("l2 calibration error (debiased)", "l2 calibration error (debiased)",
                        "ece_l2_debiased: debiased estimate of the squared l2-ECE (T-Cal, Lee et al. 2022, eq. 6), "
                        "shown as its square root; an estimate at or below 0 means no detectable error", "sqrt"),
    "ece_l2_plugin": ("l2 calibration error (plug-in)", "l2 calibration error (plug-in)",
                      "ece_l2_plugin: plug-in squared l2-ECE, shown as its square root (biased upwards)", "sqrt"),
    "ldtc": ("distance to calibration (lower)", "distance to calibration (lower)",
             "ldtc: lower distance to calibration (Blasiok et al. 2023)", "num"),
    "mean_confidence": ("mean score", "mean confidence",
                        "mean_confidence: mean of the scores (binary) or of the top-label confidence", "pct"),
    "base_rate": ("observed frequency of positives", "observed frequency of positives",
                  "base_rate: mean outcome; compare with the mean score", "pct"),
    "accuracy": ("accuracy at threshold 0.5", "accuracy (top-1)",
                 "accuracy: fraction of correct decisions (binary: score >= 0.5 predicts positive)", "pct"),
    "brier": ("Brier score", "Brier score", "brier: mean squared error of the probabilities (lower is better)",
              "num"),
    "brier_score": ("Brier score", "Brier score", "brier_score: mean squared error of the probabilities", "num"),
    "top_label_brier": ("top-label Brier score", "top-label Brier score", "top_label_brier", "num"),
    "classwise_ece": ("class-wise calibration error", "class-wise calibration error",
                      "classwise_ece: mean over classes of the one-vs-rest ECE (Kull et al. 2019)", "pct"),
    "l2_bins": ("bins of the l2 error", "bins of the l2 error",
                "l2_bins: number of equal-width bins of the l2 estimates (grows with n, T-Cal eq. 7)", "num"),
}

#: tester name -> (plain name, tooltip)
_TESTS: dict[str, tuple[str, str]] = {
    "tcal": ("T-Cal binned test", "tcal: adaptive debiased l2-ECE test (Lee, Huang, Hassani, Dobriban 2022)"),
    "smce": ("smooth calibration test", "smce: test of the smooth calibration error (Blasiok et al. 2023)"),
    "ldtc": ("distance-to-calibration estimate",
             "ldtc: decides from an estimate against a tolerance, not from a p-value, so it can disagree "
             "with the tests"),
}


def _metric_value(key: str, kind: str, v: Any) -> str:
    f = finite(v)
    if f is None:
        return "-"
    if kind == "sqrt":
        return "&asymp; 0 (not detectable)" if f <= 0 else _pct(math.sqrt(f))
    if kind == "pct":
        return _pct(f)
    return f"{int(f)}" if key == "l2_bins" else fmt_num(f)


def _metrics_table(metrics: dict[str, Any], binary: bool) -> str:
    keys = [k for k in _METRICS if k in metrics] + sorted(k for k in metrics if k not in _METRICS)
    if not keys:
        return ""
    rows = []
    for k in keys:
        name, other, tip, kind = _METRICS.get(k, (k, k, k, "num"))
        label = name if binary else other
        rows.append(f'<tr data-metric="{escape(str(k))}"><th title="{escape(tip)}">{escape(label)}</th>'
                    f'<td class="num" title="{escape(str(k))} = {fmt_num(metrics[k], 6)}">'
                    f"{_metric_value(k, kind, metrics[k])}</td></tr>")
    return f'<table class="metrics"><tr><th>metric</th><th>value</th></tr>{"".join(rows)}</table>'


_P_TIP = ("p-value: how often a calibrated model would show a discrepancy at least this large; "
          "below the level alpha the test rejects calibration")


def _test_row(name: str, r: dict[str, Any] | None) -> str:
    plain, tip = _TESTS.get(name, (name, name))
    cls = "test" if r is not None else "test missing"
    head = f'<tr class="{cls}" data-test="{escape(name)}"><td title="{escape(tip)}">{escape(plain)}</td>'
    if r is None:
        return (head + '<td colspan="2" class="muted">-</td><td><span class="badge missing">no result</span> '
                '<span class="muted">not run this round (time budget or too few events)</span></td></tr>')
    decision = str(r.get("decision", "-"))
    cls = {"calibrated": "calibrated", "miscalibrated": "miscalibrated", "error": "error"}.get(decision, "unknown")
    why = r.get("reason") or r.get("error") or ""
    alpha = finite(r.get("alpha"))
    return (head + f'<td class="num">{fmt_num(r.get("p_value"))}'
            + (f' <span class="muted">(&alpha; = {fmt_num(alpha)})</span>' if alpha is not None else "")
            + f'</td><td class="num" title="{escape(str(r.get("method", name)))} statistic">'
            f'{fmt_num(r.get("statistic"))}</td><td><span class="badge {cls}">{escape(decision)}</span>'
            + (f' <span class="muted">{escape(str(why))}</span>' if why else "") + "</td></tr>")


def _tests_table(tests: dict[str, Any], expected: list[str]) -> str:
    names = sorted(set(tests) | set(expected))
    if not names:
        return '<p class="muted">no tester results</p>'
    rows = [_test_row(n, tests[n] if isinstance(tests.get(n), dict) else None) for n in names]
    return ('<table class="tests"><tr><th>test</th>'
            f'<th title="{escape(_P_TIP)}">p-value</th>'
            '<th title="the test statistic (its scale depends on the test)">statistic</th>'
            "<th>decision</th></tr>" + "".join(rows) + "</table>")


# ----------------------------------------------------------------------------- verdict and cards
def _verdict(ev: dict[str, Any], binary: bool, regions: list[Region]) -> str:
    """The verdict once: a badge with the direction, then the verdict module's sentence (which already holds
    the ECE, where and the next step) -- or, without one, the same facts built from the tests and bins."""
    s = ev.get("summary") if isinstance(ev.get("summary"), dict) else None
    tests = {k: v for k, v in (ev.get("tests") or {}).items() if isinstance(v, dict)}
    rejects = sorted(k for k, v in tests.items() if v.get("decision") == "miscalibrated")
    accepts = sorted(k for k, v in tests.items() if v.get("decision") == "calibrated")
    cls = verdict_class(ev)
    head = VERDICTS[cls][0]
    direction = s.get("direction") if s and cls == "miscalibrated" else None
    lines = [f'<p><span class="badge {cls}">{escape(head)}</span>'
             + (f" {escape(str(direction))}" if direction else "") + "</p>"]
    if s is not None and s.get("text"):
        lines.append(f'<p class="verdict-text">{escape(str(s["text"]))}</p>')
    else:
        if rejects or accepts:
            lines.append(f"<p>rejected by {escape(', '.join(rejects) or 'no test')}; "
                         f"accepted by {escape(', '.join(accepts) or 'no test')}</p>")
        if regions:
            lines.append(f'<p class="direction">{escape(direction_text(regions, binary))}</p>')
        if s is not None:
            ci = s.get("ece_ci")
            ci_txt = (f" (95 % interval {_pct(ci[0])} to {_pct(ci[1])})"
                      if isinstance(ci, list) and len(ci) == 2 else "")
            if finite(s.get("ece")) is not None:
                lines.append(f"<p>ECE {_pct(s.get('ece'))}{escape(ci_txt)}</p>")
            if s.get("recommendation"):
                lines.append(f"<p>next step: {escape(str(s['recommendation']))}</p>")
    evidence = s.get("evidence") if s is not None else None
    if isinstance(evidence, list) and evidence:
        lines.append(f'<p class="muted evidence">evidence: {escape("; ".join(map(str, evidence)))}</p>')
    return f'<div class="verdict {cls}">{"".join(lines)}</div>'


#: held-out measure -> plain name (calibrator documents); others keep their key
_HELD_OUT = {"ece": "calibration error (ECE)", "ece_l2_debiased": "l2 calibration error (debiased)",
             "nll": "log loss", "brier": "Brier score", "accuracy": "accuracy", "n": "held-out rows"}
#: refresh reasons -> plain words
_REASONS = {"insufficient data": "too few labelled rows in the recalibration window to fit and hold out "
                                 "(recalibration.min_train / min_holdout)",
            "no candidate improves held-out NLL and debiased ECE": "no candidate method beat the scores in service "
                                                                   "on held-out log loss and debiased ECE",
            "every publisher failed": "every publisher failed to store the new revision"}


def _reason(c: dict[str, Any]) -> str:
    r = str(c.get("reason") or "")
    return _REASONS.get(r, r)


def _cal_published(c: dict[str, Any]) -> bool:
    return c.get("version") is not None and str(c.get("method", "none")) != "none"


def calibrator_line(cal: dict[str, Any] | None) -> str:
    """One sentence: which calibrator is in service and what it did on held-out rows, or why there is none."""
    if not isinstance(cal, dict):
        return ('<p class="calibrator-line">calibrator: <b>none</b> &mdash; no refit has run for this model yet '
                "(recalibration off, or too few labelled events in its window)</p>")
    raw, new = _held_out_ece(cal, "before"), _held_out_ece(cal, "after")
    if not _cal_published(cal):
        why = _reason(cal) or "no reason recorded"
        return (f'<p class="calibrator-line">calibrator: <b>none</b> &mdash; {escape(why)}'
                + (f"; raw ECE on held-out rows {_pct(raw)}" if finite(raw) is not None else "") + "</p>")
    since = f", published {fmt_time(cal.get('published_at'))}" if cal.get("published_at") is not None else ""
    result = (f": ECE on held-out rows <b>{_pct(raw)}</b> raw &rarr; <b>{_pct(new)}</b> recalibrated"
              if finite(raw) is not None or finite(new) is not None else "")
    last = _reason(cal)
    note = (f' <span class="muted">(last refit: {escape(last)})</span>'
            if last and cal.get("reason") != "improved" else "")
    return (f'<p class="calibrator-line recalibrated">calibrator: <b>{escape(str(cal.get("method", "-")))}</b> '
            f"version {fmt_num(cal.get('version'))}{since}{result}{note}</p>")


def _held_out_table(cal: dict[str, Any]) -> str:
    """Raw against recalibrated measures on the held-out rows, under plain names."""
    before = cal.get("before") if isinstance(cal.get("before"), dict) else {}
    after = cal.get("after") if isinstance(cal.get("after"), dict) else {}
    keys = [k for k in _HELD_OUT if k in (before or {}) or k in (after or {})]
    keys += sorted(k for k in {**(before or {}), **(after or {})} if k not in _HELD_OUT)
    rows = []
    for k in keys:
        b, a = (before or {}).get(k), (after or {}).get(k)
        if isinstance(b, (dict, list)) or isinstance(a, (dict, list)):
            continue
        f = _pct if k in ("ece", "accuracy") else (lambda v: fmt_num(v))
        rows.append(f'<tr data-measure="{escape(str(k))}"><th title="{escape(str(k))}">'
                    f"{escape(_HELD_OUT.get(k, str(k)))}</th><td class=\"num\">{f(b)}</td>"
                    f'<td class="num">{f(a)}</td></tr>')
    if not rows:
        return ""
    return ('<table class="held-out"><tr><th>on held-out rows</th><th>raw scores</th><th>recalibrated</th></tr>'
            + "".join(rows) + "</table>")


def _evaluation_card(ev: dict[str, Any], expected: list[str]) -> str:
    model, segment, window = (str(ev.get(k, "")) for k in ("model", "segment", "window"))
    metrics = ev.get("metrics") or {}
    summary: dict[str, Any] = ev["summary"] if isinstance(ev.get("summary"), dict) else {}
    binary = summary.get("kind", "binary" if "classwise_ece" not in metrics else "top-label") == "binary"
    regions = regions_of(ev)
    title = f"{model} / segment {segment} / window {window}"
    attrs = f'data-model="{escape(model)}" data-segment="{escape(segment)}" data-window="{escape(window)}"'
    ylab = "observed frequency" if binary else "accuracy"
    return (f'<div class="card evaluation" {attrs}><h3>window {escape(window)} '
            f'<span class="muted">segment {escape(segment)} &middot; n = {fmt_num(ev.get("n"))}</span></h3>'
            f"{_verdict(ev, binary, regions)}"
            f'<figure class="reliability" {attrs}>'
            f"{reliability_svg(ev.get('reliability') or [], title, regions, binary)}"
            f'<figcaption class="muted legend">bars: {ylab} per score bin; dashed: perfect calibration; '
            f"black tick: 95 % range if calibrated; grey: events per bin"
            f'<span style="background:#f0b400;opacity:.4"></span>bars above'
            f'<span style="background:#cf222e;opacity:.3"></span>bars below the diagonal</figcaption></figure>'
            f"{_metrics_table(metrics, binary)}{_tests_table(ev.get('tests') or {}, expected)}"
            f"{estimates_block(ev)}</div>")


# ----------------------------------------------------------------------------- page sections
def _scheduler(snapshot: dict[str, Any]) -> dict[str, Any]:
    agent = snapshot.get("agent")
    sched = agent.get("scheduler") if isinstance(agent, dict) else None
    return sched if isinstance(sched, dict) else {}


def refresh_seconds(snapshot: dict[str, Any], refresh: int | Literal["auto"] | None = "auto") -> int | None:
    """The page's reload period: ``"auto"`` follows ``agent.scheduler.every`` (at least 5 s).

    Examples
    --------
    >>> refresh_seconds({"agent": {"scheduler": {"every": 15.0}}}), refresh_seconds({}), refresh_seconds({}, 30)
    (15, 60, 30)
    """
    if refresh != "auto":
        return refresh
    every = finite(_scheduler(snapshot).get("every"))
    return DEFAULT_REFRESH if every is None or every <= 0 else max(5, int(math.ceil(every)))


def _freshness(snapshot: dict[str, Any], have_evaluations: bool) -> str:
    sched = _scheduler(snapshot)
    now = _epoch(snapshot.get("generated_at")) or time.time()
    every, last = finite(sched.get("every")), finite(sched.get("last_timestamp"))
    every_txt = f"; evaluated every {every:.0f} s" if every else ""
    overruns = int(finite(sched.get("overruns")) or 0)
    over = (f'; <span class="bad" id="overruns">{overruns} round(s) overran the period</span>' if overruns
            else '; <span id="overruns">no overruns</span>')
    if last is not None and not have_evaluations:
        return (f'<p class="fresh" id="freshness">last round {_ago(now - last)} ago evaluated no window: '
                f"no model has joined events in its windows yet{escape(every_txt)}{over}</p>")
    if last is None:
        nxt = finite(sched.get("next_at"))
        up = finite((snapshot.get("agent") or {}).get("uptime_seconds"))
        when = (f"at {fmt_time(nxt)}" if nxt is not None else
                f"about {_ago(every - up)} from now" if every and up is not None and up < every else
                f"within {every:.0f} s of the start" if every else "after the first evaluation period")
        return (f'<p class="fresh" id="freshness">no evaluation yet &mdash; the first round runs {when}'
                f"{escape(every_txt)}</p>")
    age = now - last
    stale = every is not None and age > 3 * every
    took = finite(sched.get("last_duration"))
    return (f'<p class="fresh{" stale" if stale else ""}" id="freshness">last evaluation {_ago(age)} ago '
            f"({fmt_time(last)})" + (f", took {took:.1f} s" if took is not None else "")
            + f"{every_txt}; {fmt_num(sched.get('evaluations'))} rounds{over}"
            + (" &mdash; <b>stale: the scheduler has fallen behind</b>" if stale else "") + "</p>")


_STATE_ORDER = {"firing": 0, "pending": 1, "resolved": 2, "inactive": 3}
#: Rows of the index's alerts, calibrators and changes tables at most (the rest: the overview's filters).
SECTION_ROWS = 50


def _alerts_section(alerts: list[dict[str, Any]], limit: int = SECTION_ROWS) -> str:
    if not alerts:
        return '<h2 id="alerts">Alerts</h2><p class="muted" id="no-alerts">no alerts</p>'
    rows = []
    ordered = sorted(alerts, key=lambda a: (_STATE_ORDER.get(str(a.get("state")), 9), str(a.get("alert")),
                                            str(a.get("model")), str(a.get("window"))))
    for a in ordered[:limit]:
        state, sev = escape(str(a.get("state", ""))), escape(str(a.get("severity", "")))
        ann = a.get("annotations") if isinstance(a.get("annotations"), dict) else {}
        cells = "".join(f"<td>{escape(str(a.get(k, '')))}</td>" for k in ("alert", "model", "segment", "window"))
        rows.append(
            f'<tr class="alert {state}" data-alert="{escape(str(a.get("alert", "")))}" data-state="{state}">'
            f'{cells}<td><span class="badge {sev}">{sev}</span></td>'
            f'<td><span class="badge {state}">{state}</span></td><td>{fmt_time(a.get("since"))}</td>'
            f'<td class="num">{fmt_num(a.get("value"))}</td>'
            f'<td>{escape(str((ann or {}).get("summary", "")))}</td></tr>')
    more = (f'<p class="muted" id="more-alerts">and {len(ordered) - limit:,} more; '
            f'<a href="./?alert=any">firing or pending rows in the overview</a></p>' if len(ordered) > limit else "")
    return ('<h2 id="alerts">Alerts</h2><table class="alerts"><tr><th>alert</th><th>model</th><th>segment</th>'
            '<th>window</th><th>severity</th><th>state</th><th>since</th>'
            '<th title="the value the rule judged (a p-value for test_rejected rules)">value</th>'
            "<th>summary</th></tr>" + "".join(rows) + "</table>" + more)


def _held_out_ece(c: dict[str, Any], stage: str) -> Any:
    d = c.get(stage)
    if isinstance(d, dict) and "ece" in d:
        return d["ece"]
    ev = c.get("evaluation")
    return ev.get(f"ece_{stage}") if isinstance(ev, dict) else None


def _calibrators_section(cals: dict[str, Any], limit: int = SECTION_ROWS) -> str:
    """Published calibrators (newest first, at most ``limit``), then the models without one grouped by reason."""
    if not cals:
        return '<h2 id="calibrators">Calibrators</h2><p class="muted">no calibrator published</p>'
    items = [(m, c if isinstance(c, dict) else {}) for m, c in cals.items()]
    published = sorted((mc for mc in items if _cal_published(mc[1])),
                       key=lambda mc: (-(finite(mc[1].get("published_at")) or 0.0), mc[0]))
    without: dict[str, list[str]] = {}
    for m, c in items:
        if not _cal_published(c):
            without.setdefault(_reason(c) or "no reason recorded", []).append(m)
    rows = []
    for model, c in published[:limit]:
        when = fmt_time(c.get("published_at")) if c.get("published_at") is not None else "-"
        rows.append(f'<tr class="calibrator" data-model="{escape(model)}">'
                    f'<td><a href="{escape(model_href(model))}">{escape(model)}</a></td>'
                    f'<td>{escape(str(c.get("method", "-")))}</td><td class="num">{fmt_num(c.get("version"))}</td>'
                    f'<td>{when}</td><td class="num raw-ece">{_pct(_held_out_ece(c, "before"))}</td>'
                    f'<td class="num recalibrated-ece">{_pct(_held_out_ece(c, "after"))}</td></tr>')
    out = ['<h2 id="calibrators">Calibrators</h2>']
    if rows:
        out.append('<table class="calibrators"><tr><th>model</th><th>method</th><th>version</th><th>published</th>'
                   '<th title="ECE of the raw scores on the held-out rows of the refit">ECE raw</th>'
                   '<th title="ECE after the calibrator on the same held-out rows">ECE recalibrated</th></tr>'
                   + "".join(rows) + "</table>")
        if len(published) > limit:
            out.append(f'<p class="muted">and {len(published) - limit:,} more published calibrators '
                       "(on each model's page)</p>")
    else:
        out.append('<p class="muted">no calibrator published</p>')
    for why, models in sorted(without.items(), key=lambda kv: -len(kv[1])):
        names = ", ".join(f'<a href="{escape(model_href(m))}">{escape(m)}</a>' for m in sorted(models)[:10])
        out.append(f'<p class="no-calibrator" data-count="{len(models)}">none for {len(models):,} '
                   f"model{'s' if len(models) != 1 else ''}: {escape(why)} &mdash; {names}"
                   + (" &hellip;" if len(models) > 10 else "") + "</p>")
    return "".join(out)


def _warnings(snapshot: dict[str, Any]) -> str:
    """The document's ``warnings`` (label delay, expiry, ...) as a banner above everything else."""
    ws = [w for w in snapshot.get("warnings") or [] if isinstance(w, dict)]
    if not ws:
        return ""
    items = []
    for w in ws:
        code = str(w.get("code", ""))
        count = finite(w.get("count"))
        fix = ""
        if w.get("setting"):
            fix = (f' <span class="fix">set <code>{escape(str(w["setting"]))}</code>'
                   + (f" to <code>{escape(str(w['suggested']))}</code>" if w.get("suggested") is not None else "")
                   + "</span>")
        items.append(f'<li class="warning" data-code="{escape(code)}">{escape(str(w.get("message", code)))}'
                     + (f' <span class="muted">({int(count):,} times)</span>' if count is not None else "")
                     + f"{fix}</li>")
    return f'<div class="warnings" role="alert" id="warnings"><b>warnings</b><ul>{"".join(items)}</ul></div>'


def _head(title: str, period: int | None) -> str:
    return ('<!DOCTYPE html><html lang="en"><head><meta charset="utf-8">'
            '<meta name="viewport" content="width=device-width, initial-scale=1">'
            + (f'<meta http-equiv="refresh" content="{int(period)}">' if period else "")
            + f"<title>{escape(title)}</title><style>{_CSS}</style></head>")


def _banner(snapshot: dict[str, Any]) -> str:
    return ('<body><header><h1>calmon</h1>'
            f'<span class="meta">version {escape(str(snapshot.get("version", "")))}</span>'
            f'<span class="meta" id="generated">generated {fmt_time(snapshot.get("generated_at"))}</span>'
            "</header><main>")


def _evaluations(snapshot: dict[str, Any]) -> list[dict[str, Any]]:
    return [e for e in snapshot.get("evaluations") or [] if isinstance(e, dict)]


@dataclass(frozen=True)
class IndexFrame:
    """The index page around its overview table, built once per round; a query only re-selects rows."""

    top: str
    bottom: str
    rows: list[Row]
    counts: dict[str, int]

    def page(self, query: Query | None = None) -> str:
        """The index with the overview rows chosen by ``query`` (see :func:`calmon.exporter.status.overview.select`)."""
        return self.top + overview_table(select(self.rows, query or {}), self.counts) + self.bottom


def index_frame(snapshot: dict[str, Any], *, refresh: int | Literal["auto"] | None = "auto") -> IndexFrame:
    """The parts of the index page of ``snapshot`` (see :func:`render`)."""
    if not isinstance(snapshot, dict):
        raise ValueError(f"snapshot: expected a dict, got {type(snapshot).__name__}")
    evaluations = _evaluations(snapshot)
    alerts = [a for a in snapshot.get("alerts") or [] if isinstance(a, dict)]
    cals = snapshot.get("calibrators") if isinstance(snapshot.get("calibrators"), dict) else {}
    agent = snapshot.get("agent") if isinstance(snapshot.get("agent"), dict) else {}
    rows = overview_rows(snapshot)
    counts: dict[str, int] = {}
    for r in rows:
        counts[r.verdict] = counts.get(r.verdict, 0) + 1
    models = len({r.model for r in rows})
    firing = sum(1 for a in alerts if a.get("state") == "firing")
    top = (_head("calmon status", refresh_seconds(snapshot, refresh)) + _banner(snapshot) + _warnings(snapshot)
           + f'<div class="summary"><div>models <b id="n-models">{models:,}</b></div>'
           f'<div>windows evaluated <b id="n-evaluations">{len(evaluations):,}</b></div>'
           f'<div>miscalibrated <b id="n-miscalibrated">{counts.get("miscalibrated", 0):,}</b></div>'
           f'<div>firing alerts <b id="n-firing">{firing:,}</b></div></div>'
           + _freshness(snapshot, bool(evaluations)) + '<h2 id="overview-title">Overview</h2>')
    if not rows:
        top += '<p class="muted">no evaluation yet</p>'
    bottom = (_alerts_section(alerts)
              + changes_section((agent or {}).get("changes"), (agent or {}).get("watermark"), limit=SECTION_ROWS)
              + _calibrators_section(cals or {}) + "</main></body></html>")
    return IndexFrame(top, bottom, rows, counts)


def render(snapshot: dict[str, Any], *, refresh: int | Literal["auto"] | None = "auto",
           query: Query | None = None) -> str:
    """Render the index page: warnings, summary, freshness, the overview table, alerts, changes, calibrators.

    Parameters
    ----------
    snapshot
        See the module docstring; missing keys render as empty sections.
    refresh
        Seconds between automatic reloads (``<meta http-equiv="refresh">``), ``"auto"`` to follow
        the evaluation period (:func:`refresh_seconds`), ``None`` for none.
    query
        The parsed query string choosing the overview's rows (filters, sort, page).

    Returns
    -------
    str
        A complete, self-contained HTML5 document (no external assets; its small script only filters
        the rows shown as one types).

    Examples
    --------
    >>> page = render({"generated_at": 0, "version": "0.1.0", "evaluations": [
    ...     {"model": "<m>", "segment": "all", "window": "1h", "n": 10, "metrics": {"ece": 0.1},
    ...      "reliability": [], "tests": {}}], "alerts": [], "calibrators": {}})
    >>> page.startswith("<!DOCTYPE html>"), "&lt;m&gt;" in page, "<m>" in page, 'href="model/%3Cm%3E"' in page
    (True, True, False, True)
    """
    return index_frame(snapshot, refresh=refresh).page(query)


def render_model(snapshot: dict[str, Any], model: str, *,
                 refresh: int | Literal["auto"] | None = "auto") -> str | None:
    """One model's page: its calibrator, alerts and changes, then a card per segment and window.

    The segment ``all`` is open; every other segment is a collapsed ``<details>``.  ``None`` when the
    snapshot knows nothing of ``model``.

    Examples
    --------
    >>> doc = {"evaluations": [{"model": "m", "segment": "all", "window": "1h", "n": 5, "metrics": {},
    ...                         "reliability": [], "tests": {}}], "calibrators": {"m": {
    ...        "method": "none", "version": None, "reason": "insufficient data"}}}
    >>> "too few labelled rows" in render_model(doc, "m"), render_model(doc, "x")
    (True, None)
    """
    if not isinstance(snapshot, dict):
        raise ValueError(f"snapshot: expected a dict, got {type(snapshot).__name__}")
    evs = [e for e in _evaluations(snapshot) if str(e.get("model", "")) == model]
    cals = snapshot.get("calibrators") if isinstance(snapshot.get("calibrators"), dict) else {}
    cal = (cals or {}).get(model)
    if not evs and cal is None:
        return None
    agent = snapshot.get("agent") if isinstance(snapshot.get("agent"), dict) else {}
    order = {str(w): i for i, w in enumerate((agent or {}).get("windows") or [])}  # configured order: 5m, 30m
    evs.sort(key=lambda e: (str(e.get("segment")) != "all", str(e.get("segment")),
                            order.get(str(e.get("window")), -1), str(e.get("window"))))
    expected = sorted({str(k) for ev in evs for k in (ev.get("tests") or {})})
    alerts = [a for a in snapshot.get("alerts") or [] if isinstance(a, dict) and str(a.get("model")) == model]
    changes = (agent or {}).get("changes")
    mine = {model: changes[model]} if isinstance(changes, dict) and model in changes else {}
    by_segment: dict[str, list[dict[str, Any]]] = {}
    for e in evs:
        by_segment.setdefault(str(e.get("segment", "")), []).append(e)
    sections = []
    for segment, group in by_segment.items():
        cards = f'<div class="cards">{"".join(_evaluation_card(e, expected) for e in group)}</div>'
        verdicts = ", ".join(f"{escape(str(e.get('window')))}: {escape(VERDICTS[verdict_class(e)][0])}"
                             for e in group)
        if segment == "all":
            sections.append(f'<section class="segment" data-segment="all"><h2>all events</h2>{cards}</section>')
        else:
            sections.append(f'<details class="segment" data-segment="{escape(segment)}"><summary>segment '
                            f'<b>{escape(segment)}</b> <span class="muted">({verdicts})</span></summary>'
                            f"{cards}</details>")
    body = (f'<p><a href="../">&larr; all models</a></p><section class="model" data-model="{escape(model)}">'
            f"<h2>model {escape(model)}</h2>{calibrator_line(cal if isinstance(cal, dict) else None)}"
            + (_held_out_table(cal) if isinstance(cal, dict) else "")
            + ("".join(sections) or '<p class="muted">no evaluation of this model in this round</p>')
            + "</section>" + (_alerts_section(alerts) if alerts else "")
            + (changes_section(mine, (agent or {}).get("watermark")) if mine else ""))
    return (_head(f"calmon: {model}", refresh_seconds(snapshot, refresh)) + _banner(snapshot)
            + _freshness(snapshot, bool(evs)) + body + "</main></body></html>")
