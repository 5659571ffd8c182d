"""The agent's status page: one self-contained HTML document served at ``/``.

Per model and window it shows the reliability diagram (inline SVG), the window's metrics and the
latest tester results, then the alerts and the current calibrators. No JavaScript, no external
CSS, fonts or images; every label from the stream is HTML-escaped.

Snapshot shape (built by the agent from its latest evaluation round)::

    {"generated_at": float, "version": str,
     "evaluations": [{"model", "segment", "window", "n", "metrics": {name: float},
                      "reliability": [{"bin": lower edge, "hi": upper edge, "mean_score": float | None,
                                       "mean_outcome": float | None, "events": int}],
                      "tests": {name: {"statistic", "p_value", "decision", "method", ...}}}],
     "alerts": [{"alert", "model", "segment", "window", "severity", "state", "since", "value"}],
     "calibrators": {model: {"method", "version", "published_at", "evaluation": {...}}}}

References
----------
Reliability diagrams: DeGroot & Fienberg (1983), "The comparison and evaluation of forecasters";
Guo et al. (2017), "On calibration of modern neural networks", Section 2 (Figure 1).
"""

from __future__ import annotations

import math
from datetime import datetime, timezone
from html import escape
from typing import Any

__all__ = ["render", "reliability_svg"]

#: Plot geometry of the reliability diagram (pixels).
SIZE = 220
PAD_LEFT, PAD_TOP, PAD_RIGHT, PAD_BOTTOM = 36, 10, 10, 30

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
.cards{display:flex;flex-wrap:wrap;gap:16px}.card{border:1px solid var(--line);border-radius:6px;padding:10px;
width:380px}.card figure{margin:0}.badge{display:inline-block;padding:0 7px;border-radius:10px;font-size:12px;
font-weight:600;color:#fff;background:var(--muted)}.badge.firing,.badge.miscalibrated,.badge.critical,
.badge.page{background:var(--bad)}.badge.pending,.badge.warning{background:var(--warn)}
.badge.calibrated,.badge.resolved,.badge.ok{background:var(--ok)}.muted{color:var(--muted)}
.summary{display:flex;gap:12px;flex-wrap:wrap}
.summary div{background:var(--bg);border-radius:6px;padding:6px 12px}
svg text{font:10px system-ui,sans-serif;fill:#5b6474}svg .bar{fill:#5b8def;fill-opacity:.75}
svg .gap{fill:#cf222e;fill-opacity:.25}svg .diag{stroke:#5b6474;stroke-dasharray:4 3}
svg .axis{stroke:#5b6474}svg .dot{fill:#1d2330}
"""


def _fmt(v: Any, digits: int = 4) -> str:
    """Number formatting with ``-`` for missing or non-finite values."""
    if v is None or isinstance(v, bool):
        return "-" if v is None else str(v)
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        if not math.isfinite(v):
            return "-"
        return f"{v:.{digits}g}"
    return escape(str(v))


def _time(t: Any) -> str:
    if isinstance(t, str):  # already formatted (e.g. RFC 3339)
        return escape(t)
    try:
        return datetime.fromtimestamp(float(t), tz=timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")
    except (TypeError, ValueError, OverflowError, OSError):
        return "-"


def _finite(v: Any) -> float | None:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return None
    return float(v) if math.isfinite(v) else None


def _clip01(v: float) -> float:
    return min(1.0, max(0.0, v))


def reliability_svg(bins: list[dict[str, Any]], title: str = "") -> str:
    """Inline SVG reliability diagram.

    One bar per populated bin spans the bin's score interval ``[bin, hi)`` with height equal to the
    mean outcome; a dot marks (mean score, mean outcome); the shaded gap between the bar top and the
    diagonal at the mean score is the bin's calibration error; the dashed diagonal is perfect
    calibration.

    Parameters
    ----------
    bins
        ``[{"bin", "hi", "mean_score", "mean_outcome", "events"}]`` (empty bins have ``None`` means).
    title
        Accessible title (escaped).

    Returns
    -------
    str
        An ``<svg>`` element.

    Examples
    --------
    >>> svg = reliability_svg([{"bin": 0.5, "hi": 1.0, "mean_score": 0.75, "mean_outcome": 0.5,
    ...                         "events": 10}], title="m <1h>")
    >>> svg.count('class="bar"'), "m &lt;1h&gt;" in svg
    (1, True)
    """
    w = PAD_LEFT + SIZE + PAD_RIGHT
    h = PAD_TOP + SIZE + PAD_BOTTOM

    def px(x: float) -> float:
        return PAD_LEFT + _clip01(x) * SIZE

    def py(y: float) -> float:
        return PAD_TOP + (1.0 - _clip01(y)) * SIZE

    out = [f'<svg class="reliability-svg" xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" '
           f'viewBox="0 0 {w} {h}" role="img" aria-label="{escape(title)}"><title>{escape(title)}</title>',
           f'<rect x="{PAD_LEFT}" y="{PAD_TOP}" width="{SIZE}" height="{SIZE}" fill="#fff" '
           'stroke="#d8dde6"/>']
    for t in (0.0, 0.25, 0.5, 0.75, 1.0):
        out.append(f'<text x="{px(t):.1f}" y="{PAD_TOP + SIZE + 13}" text-anchor="middle">{t:g}</text>')
        out.append(f'<text x="{PAD_LEFT - 4}" y="{py(t) + 3:.1f}" text-anchor="end">{t:g}</text>')
    out.append(f'<text x="{PAD_LEFT + SIZE / 2}" y="{h - 3}" text-anchor="middle">mean score</text>')
    out.append(f'<text transform="translate(10 {PAD_TOP + SIZE / 2}) rotate(-90)" text-anchor="middle">'
               "observed frequency</text>")
    for b in bins:
        lo, hi = _finite(b.get("bin")), _finite(b.get("hi"))
        ms, mo = _finite(b.get("mean_score")), _finite(b.get("mean_outcome"))
        events = b.get("events") or 0
        if lo is None or hi is None or mo is None or not events:
            continue
        x0, x1 = px(lo), px(hi)
        tip = (f"[{lo:.2f}, {hi:.2f}): {int(events)} events, mean score {_fmt(ms, 3)}, "
               f"observed {_fmt(mo, 3)}")
        out.append(f'<rect class="bar" data-bin="{lo:.2f}" data-events="{int(events)}" x="{x0 + 0.5:.3f}" '
                   f'y="{py(mo):.3f}" width="{max(x1 - x0 - 1.0, 0.5):.3f}" height="{py(0) - py(mo):.3f}">'
                   f"<title>{escape(tip)}</title></rect>")
        if ms is not None:
            top, bottom = sorted((py(mo), py(ms)))
            out.append(f'<rect class="gap" x="{x0 + 0.5:.3f}" y="{top:.3f}" '
                       f'width="{max(x1 - x0 - 1.0, 0.5):.3f}" height="{bottom - top:.3f}"/>')
            out.append(f'<circle class="dot" cx="{px(ms):.3f}" cy="{py(mo):.3f}" r="2.5"/>')
    out.append(f'<line class="diag" x1="{px(0)}" y1="{py(0)}" x2="{px(1)}" y2="{py(1)}"/>')
    out.append(f'<line class="axis" x1="{px(0)}" y1="{py(0)}" x2="{px(1)}" y2="{py(0)}"/>')
    out.append(f'<line class="axis" x1="{px(0)}" y1="{py(0)}" x2="{px(0)}" y2="{py(1)}"/>')
    out.append("</svg>")
    return "".join(out)


_METRIC_ORDER = ("ece", "ece_l2_debiased", "smce", "ldtc", "brier", "brier_score", "accuracy",
                 "mean_confidence")


def _metrics_table(metrics: dict[str, Any]) -> str:
    keys = [k for k in _METRIC_ORDER if k in metrics] + sorted(k for k in metrics if k not in _METRIC_ORDER)
    if not keys:
        return ""
    rows = "".join(f'<tr><th>{escape(str(k))}</th><td class="num">{_fmt(metrics[k])}</td></tr>' for k in keys)
    return f'<table class="metrics">{rows}</table>'


def _tests_table(tests: dict[str, Any]) -> str:
    if not tests:
        return '<p class="muted">no tester results</p>'
    rows = []
    for name in sorted(tests):
        r = tests[name] if isinstance(tests[name], dict) else {}
        decision = str(r.get("decision", "-"))
        cls = {"calibrated": "calibrated", "miscalibrated": "miscalibrated"}.get(decision, "unknown")
        rows.append(f'<tr class="test" data-test="{escape(name)}"><td>{escape(name)}</td>'
                    f'<td class="num">{_fmt(r.get("statistic"))}</td>'
                    f'<td class="num">{_fmt(r.get("p_value"))}</td>'
                    f'<td><span class="badge {cls}">{escape(decision)}</span></td></tr>')
    return ('<table class="tests"><tr><th>test</th><th>statistic</th><th>p-value</th><th>decision</th></tr>'
            + "".join(rows) + "</table>")


def _evaluation_card(ev: dict[str, Any]) -> str:
    model, segment, window = (str(ev.get(k, "")) for k in ("model", "segment", "window"))
    title = f"{model} / segment {segment} / window {window}"
    attrs = f'data-model="{escape(model)}" data-segment="{escape(segment)}" data-window="{escape(window)}"'
    return (f'<div class="card evaluation" {attrs}><h3>window {escape(window)} '
            f'<span class="muted">segment {escape(segment)} &middot; n = {_fmt(ev.get("n"))}</span></h3>'
            f'<figure class="reliability" {attrs}>{reliability_svg(ev.get("reliability") or [], title)}'
            f"<figcaption class=\"muted\">reliability diagram: bars = observed frequency per score bin, "
            f"dashed = perfect calibration</figcaption></figure>"
            f"{_metrics_table(ev.get('metrics') or {})}{_tests_table(ev.get('tests') or {})}</div>")


_STATE_ORDER = {"firing": 0, "pending": 1, "resolved": 2, "inactive": 3}


def _alerts_section(alerts: list[dict[str, Any]]) -> str:
    if not alerts:
        return '<h2 id="alerts">Alerts</h2><p class="muted" id="no-alerts">no alerts</p>'
    rows = []
    for a in sorted(alerts, key=lambda a: (_STATE_ORDER.get(str(a.get("state")), 9), str(a.get("alert")),
                                           str(a.get("model")), str(a.get("window")))):
        state = str(a.get("state", ""))
        sev = str(a.get("severity", ""))
        rows.append(
            f'<tr class="alert {escape(state)}" data-alert="{escape(str(a.get("alert", "")))}" '
            f'data-state="{escape(state)}"><td>{escape(str(a.get("alert", "")))}</td>'
            f'<td>{escape(str(a.get("model", "")))}</td><td>{escape(str(a.get("segment", "")))}</td>'
            f'<td>{escape(str(a.get("window", "")))}</td>'
            f'<td><span class="badge {escape(sev)}">{escape(sev)}</span></td>'
            f'<td><span class="badge {escape(state)}">{escape(state)}</span></td>'
            f'<td>{_time(a.get("since"))}</td>'
            f'<td class="num">{_fmt(a.get("value"))}</td></tr>')
    return ('<h2 id="alerts">Alerts</h2><table class="alerts"><tr><th>alert</th><th>model</th>'
            "<th>segment</th>"
            "<th>window</th><th>severity</th><th>state</th><th>since</th><th>value</th></tr>"
            + "".join(rows) + "</table>")


def _calibrator_facts(c: dict[str, Any]) -> str:
    facts = []
    ev = c.get("evaluation")
    if isinstance(ev, dict):
        facts += [f"{escape(str(k))} = {_fmt(v)}" for k, v in sorted(ev.items())
                  if not isinstance(v, (dict, list))]
    for stage in ("before", "after"):
        d = c.get(stage)
        if isinstance(d, dict):
            facts += [f"{escape(str(k))} {stage} = {_fmt(v)}" for k, v in sorted(d.items())
                      if not isinstance(v, (dict, list))]
    if c.get("reason"):
        facts.append(escape(str(c["reason"])))
    return ", ".join(facts) or "-"


def _calibrators_section(cals: dict[str, Any]) -> str:
    if not cals:
        return '<h2 id="calibrators">Calibrators</h2><p class="muted">no calibrator published</p>'
    rows = []
    for model in sorted(cals):
        c = cals[model] if isinstance(cals[model], dict) else {}
        rows.append(f'<tr class="calibrator" data-model="{escape(model)}"><td>{escape(model)}</td>'
                    f'<td>{escape(str(c.get("method", "-")))}</td>'
                    f'<td class="num">{_fmt(c.get("version"))}</td>'
                    f'<td>{_time(c.get("published_at")) if c.get("published_at") is not None else "-"}</td>'
                    f"<td>{_calibrator_facts(c)}</td></tr>")
    return ('<h2 id="calibrators">Calibrators</h2><table class="calibrators"><tr><th>model</th>'
            "<th>method</th><th>version</th><th>published</th><th>evaluation</th></tr>"
            + "".join(rows) + "</table>")


def render(snapshot: dict[str, Any], *, refresh: int | None = 60) -> str:
    """Render the status page.

    Parameters
    ----------
    snapshot
        See the module docstring; missing keys render as empty sections.
    refresh
        Seconds between automatic reloads (``<meta http-equiv="refresh">``); ``None`` for none.

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
    cals = snapshot.get("calibrators") or {}
    by_model: dict[str, list[dict[str, Any]]] = {}
    for ev in evaluations:
        by_model.setdefault(str(ev.get("model", "")), []).append(ev)
    firing = sum(1 for a in alerts if a.get("state") == "firing")
    rejected = sum(1 for ev in evaluations for r in (ev.get("tests") or {}).values()
                   if isinstance(r, dict) and r.get("decision") == "miscalibrated")
    version = escape(str(snapshot.get("version", "")))
    head = ('<!DOCTYPE html><html lang="en"><head><meta charset="utf-8">'
            '<meta name="viewport" content="width=device-width, initial-scale=1">'
            + (f'<meta http-equiv="refresh" content="{int(refresh)}">' if refresh else "")
            + f"<title>calmon status</title><style>{_CSS}</style></head>")
    parts = [head, '<body><header><h1>calmon</h1>',
             f'<span class="meta">version {version}</span>',
             f'<span class="meta" id="generated">generated {_time(snapshot.get("generated_at"))}</span>'
             "</header>",
             "<main>",
             f'<div class="summary"><div>models <b id="n-models">{len(by_model)}</b></div>'
             f'<div>windows evaluated <b id="n-evaluations">{len(evaluations)}</b></div>'
             f'<div>firing alerts <b id="n-firing">{firing}</b></div>'
             f'<div>tester rejections <b id="n-rejections">{rejected}</b></div></div>',
             _alerts_section(alerts)]
    parts.append('<h2 id="models">Models</h2>')
    if not by_model:
        parts.append('<p class="muted">no evaluation yet</p>')
    for model in sorted(by_model):
        evs = sorted(by_model[model], key=lambda e: (str(e.get("segment")) != "all", str(e.get("segment")),
                                                      str(e.get("window"))))
        parts.append(f'<section class="model" data-model="{escape(model)}"><h2>model {escape(model)}</h2>'
                     f'<div class="cards">{"".join(_evaluation_card(e) for e in evs)}</div></section>')
    parts.append(_calibrators_section(cals if isinstance(cals, dict) else {}))
    parts.append("</main></body></html>")
    return "".join(parts)
