"""The agent's status page: one self-contained HTML document served at ``/``.

Per model and window it shows a verdict in plain words, the reliability diagram (inline SVG, with
the score histogram, 95 % intervals per bin and the miscalibrated score ranges shaded), the
window's metrics under plain names (formal names in tooltips) and the tester results with their
columns explained, then the alerts and the calibrators (raw against recalibrated error on held-out
rows).  The header says how fresh the evaluation is, how long it took, how many rounds overran,
and when the first round runs if none has yet.  No JavaScript, no external CSS, fonts or images;
every label from the stream is HTML-escaped.

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

__all__ = ["PAD_TOP", "SIZE", "Region", "bin_regions", "direction_text", "refresh_seconds", "reliability_svg",
           "render"]

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
    s = ev.get("summary") if isinstance(ev.get("summary"), dict) else None
    tests = {k: v for k, v in (ev.get("tests") or {}).items() if isinstance(v, dict)}
    rejects = sorted(k for k, v in tests.items() if v.get("decision") == "miscalibrated")
    accepts = sorted(k for k, v in tests.items() if v.get("decision") == "calibrated")
    calibrated = s.get("calibrated") if s is not None else (False if rejects else (True if accepts else None))
    cls, head = (("calibrated", "no evidence of miscalibration") if calibrated is True else
                 ("miscalibrated", "miscalibrated") if calibrated is False else
                 ("unknown", "not enough evidence yet"))
    lines = [f'<p><span class="badge {cls}">{escape(head)}</span>'
             + (f" {escape(str(s['direction']))}" if s and s.get("direction") else "") + "</p>"]
    if s is not None and s.get("text"):
        lines.append(f"<p>{escape(str(s['text']))}</p>")
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
        evidence = s.get("evidence")
        if isinstance(evidence, list) and evidence:
            lines.append(f'<p class="muted evidence">evidence: {escape("; ".join(map(str, evidence)))}</p>')
    return f'<div class="verdict {cls}">{"".join(lines)}</div>'


def _recalibrated_line(cal: dict[str, Any] | None) -> str:
    if not isinstance(cal, dict):
        return ""
    before, after = cal.get("before"), cal.get("after")
    raw = before.get("ece") if isinstance(before, dict) else None
    new = after.get("ece") if isinstance(after, dict) else None
    if raw is None and new is None:
        return ""
    return (f'<p class="recalibrated">calibrator {escape(str(cal.get("method", "-")))} '
            f'v{fmt_num(cal.get("version"))}: ECE on held-out rows <b>{_pct(raw)}</b> raw &rarr; '
            f"<b>{_pct(new)}</b> recalibrated</p>")


def _evaluation_card(ev: dict[str, Any], cal: dict[str, Any] | None, expected: list[str]) -> str:
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
            f"{_recalibrated_line(cal) if segment == 'all' else ''}"
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


def _alerts_section(alerts: list[dict[str, Any]]) -> str:
    if not alerts:
        return '<h2 id="alerts">Alerts</h2><p class="muted" id="no-alerts">no alerts</p>'
    rows = []
    for a in sorted(alerts, key=lambda a: (_STATE_ORDER.get(str(a.get("state")), 9), str(a.get("alert")),
                                           str(a.get("model")), str(a.get("window")))):
        state, sev = escape(str(a.get("state", ""))), escape(str(a.get("severity", "")))
        ann = a.get("annotations") if isinstance(a.get("annotations"), dict) else {}
        cells = "".join(f"<td>{escape(str(a.get(k, '')))}</td>" for k in ("alert", "model", "segment", "window"))
        rows.append(
            f'<tr class="alert {state}" data-alert="{escape(str(a.get("alert", "")))}" data-state="{state}">'
            f'{cells}<td><span class="badge {sev}">{sev}</span></td>'
            f'<td><span class="badge {state}">{state}</span></td><td>{fmt_time(a.get("since"))}</td>'
            f'<td class="num">{fmt_num(a.get("value"))}</td>'
            f'<td>{escape(str((ann or {}).get("summary", "")))}</td></tr>')
    return ('<h2 id="alerts">Alerts</h2><table class="alerts"><tr><th>alert</th><th>model</th><th>segment</th>'
            '<th>window</th><th>severity</th><th>state</th><th>since</th>'
            '<th title="the value the rule judged (a p-value for test_rejected rules)">value</th>'
            "<th>summary</th></tr>" + "".join(rows) + "</table>")


def _calibrator_facts(c: dict[str, Any]) -> str:
    facts = []
    ev = c.get("evaluation")
    if isinstance(ev, dict):
        facts += [f"{escape(str(k))} = {fmt_num(v)}" for k, v in sorted(ev.items()) if not isinstance(v, (dict, list))]
    for stage in ("before", "after"):
        d = c.get(stage)
        if isinstance(d, dict):
            facts += [f"{escape(str(k))} {stage} = {fmt_num(v)}" for k, v in sorted(d.items())
                      if not isinstance(v, (dict, list))]
    if c.get("reason"):
        facts.append(escape(str(c["reason"])))
    return ", ".join(facts) or "-"


def _held_out_ece(c: dict[str, Any], stage: str) -> Any:
    d = c.get(stage)
    if isinstance(d, dict) and "ece" in d:
        return d["ece"]
    ev = c.get("evaluation")
    return ev.get(f"ece_{stage}") if isinstance(ev, dict) else None


def _calibrators_section(cals: dict[str, Any]) -> str:
    if not cals:
        return '<h2 id="calibrators">Calibrators</h2><p class="muted">no calibrator published</p>'
    rows = []
    for model in sorted(cals):
        c = cals[model] if isinstance(cals[model], dict) else {}
        published = fmt_time(c.get("published_at")) if c.get("published_at") is not None else "-"
        rows.append(f'<tr class="calibrator" data-model="{escape(model)}"><td>{escape(model)}</td>'
                    f'<td>{escape(str(c.get("method", "-")))}</td><td class="num">{fmt_num(c.get("version"))}</td>'
                    f'<td>{published}</td><td class="num raw-ece">{_pct(_held_out_ece(c, "before"))}</td>'
                    f'<td class="num recalibrated-ece">{_pct(_held_out_ece(c, "after"))}</td>'
                    f"<td>{_calibrator_facts(c)}</td></tr>")
    return ('<h2 id="calibrators">Calibrators</h2><table class="calibrators"><tr><th>model</th>'
            "<th>method</th><th>version</th><th>published</th>"
            '<th title="ECE of the raw scores on the held-out rows of the refit">ECE raw</th>'
            '<th title="ECE after the calibrator on the same held-out rows">ECE recalibrated</th>'
            "<th>details (held-out rows)</th></tr>" + "".join(rows) + "</table>")


def render(snapshot: dict[str, Any], *, refresh: int | Literal["auto"] | None = "auto") -> str:
    """Render the status page.

    Parameters
    ----------
    snapshot
        See the module docstring; missing keys render as empty sections.
    refresh
        Seconds between automatic reloads (``<meta http-equiv="refresh">``), ``"auto"`` to follow
        the evaluation period (:func:`refresh_seconds`), ``None`` for none.

    Returns
    -------
    str
        A complete, self-contained HTML5 document.

    Examples
    --------
    >>> page = render({"generated_at": 0, "version": "0.1.0", "evaluations": [
    ...     {"model": "<m>", "segment": "all", "window": "1h", "n": 10, "metrics": {"ece": 0.1},
    ...      "reliability": [], "tests": {}}], "alerts": [], "calibrators": {}})
    >>> page.startswith("<!DOCTYPE html>"), "&lt;m&gt;" in page, "<m>" in page
    (True, True, False)
    """
    if not isinstance(snapshot, dict):
        raise ValueError(f"snapshot: expected a dict, got {type(snapshot).__name__}")
    evaluations = [e for e in snapshot.get("evaluations") or [] if isinstance(e, dict)]
    alerts = [a for a in snapshot.get("alerts") or [] if isinstance(a, dict)]
    cals = snapshot.get("calibrators") if isinstance(snapshot.get("calibrators"), dict) else {}
    by_model: dict[str, list[dict[str, Any]]] = {}
    for ev in evaluations:
        by_model.setdefault(str(ev.get("model", "")), []).append(ev)
    # a tester that answered for one window but not another is shown as missing there
    expected = sorted({str(k) for ev in evaluations for k in (ev.get("tests") or {})})
    firing = sum(1 for a in alerts if a.get("state") == "firing")
    rejected = sum(1 for ev in evaluations for r in (ev.get("tests") or {}).values()
                   if isinstance(r, dict) and r.get("decision") == "miscalibrated")
    period = refresh_seconds(snapshot, refresh)
    agent = snapshot.get("agent") if isinstance(snapshot.get("agent"), dict) else {}
    order = {str(w): i for i, w in enumerate((agent or {}).get("windows") or [])}  # configured order: 5m, 30m
    head = ('<!DOCTYPE html><html lang="en"><head><meta charset="utf-8">'
            '<meta name="viewport" content="width=device-width, initial-scale=1">'
            + (f'<meta http-equiv="refresh" content="{int(period)}">' if period else "")
            + f"<title>calmon status</title><style>{_CSS}</style></head>")
    parts = [head, '<body><header><h1>calmon</h1>',
             f'<span class="meta">version {escape(str(snapshot.get("version", "")))}</span>',
             f'<span class="meta" id="generated">generated {fmt_time(snapshot.get("generated_at"))}</span>'
             "</header><main>",
             f'<div class="summary"><div>models <b id="n-models">{len(by_model)}</b></div>'
             f'<div>windows evaluated <b id="n-evaluations">{len(evaluations)}</b></div>'
             f'<div>firing alerts <b id="n-firing">{firing}</b></div>'
             f'<div title="tester results that reject calibration, over all windows">tester rejections '
             f'<b id="n-rejections">{rejected}</b></div></div>',
             _freshness(snapshot, bool(evaluations)), _alerts_section(alerts), '<h2 id="models">Models</h2>']
    if not by_model:
        parts.append('<p class="muted">no evaluation yet</p>')
    for model in sorted(by_model):
        evs = sorted(by_model[model], key=lambda e: (str(e.get("segment")) != "all", str(e.get("segment")),
                                                      order.get(str(e.get("window")), -1), str(e.get("window"))))
        cal = (cals or {}).get(model)
        cards = "".join(_evaluation_card(e, cal if isinstance(cal, dict) else None, expected) for e in evs)
        parts.append(f'<section class="model" data-model="{escape(model)}"><h2>model {escape(model)}</h2>'
                     f'<div class="cards">{cards}</div></section>')
    parts.append(changes_section((agent or {}).get("changes"), (agent or {}).get("watermark")))
    parts.append(_calibrators_section(cals or {}))
    parts.append("</main></body></html>")
    return "".join(parts)
