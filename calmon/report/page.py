"""The self-contained report: reliability diagrams, the smCE witness, the tests and the verdict.

:func:`render_html` writes one HTML file with the figures as inline SVG and, in a
``<script type="application/json" id="report-data">`` block, the numbers every bar was drawn from
(checked against independently computed bins by ``tests/test_report.py`` in headless Chromium).
:mod:`calmon.report.sheet` lays the same report out as one PNG or SVG page.
"""

from __future__ import annotations

import html
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from calmon.formats.jsonio import clean
from calmon.report.figures import (
    Bar,
    draw_reliability,
    draw_witness,
    figure_svg,
    new_figure,
    reliability_bars,
)
from calmon.stats.grid import ScoreGrid

__all__ = ["Panel", "ReportInput", "grid_panel", "render_html", "witness_informative"]


@dataclass(frozen=True)
class Panel:
    """One reliability diagram: ``name`` (SVG ids), ``title``, its bars, optional bars after a calibrator."""

    name: str
    title: str
    bars: list[Bar]
    after: list[Bar] | None = None


@dataclass(frozen=True)
class ReportInput:
    """Everything the report shows: the check document (metrics, tests, summary), panels, the witness."""

    doc: Mapping[str, Any]
    panels: Sequence[Panel]
    witness: tuple[np.ndarray, np.ndarray] | None = None
    calibrator: Mapping[str, Any] | None = field(default=None)
    #: Extra sections (already HTML): the time view with detected changes, estimated vs realised.
    sections: Sequence[str] = ()
    #: JSON facts of those sections for the embedded data block (e.g. the detected changes).
    facts: Mapping[str, Any] = field(default_factory=dict)
    #: The check document of the scores after ``calibrator`` (same outcomes): the "after" verdict and columns.
    after_doc: Mapping[str, Any] | None = None
    #: Why the witness is not drawn (when ``witness`` is ``None``).
    witness_note: str = ""


def witness_informative(doc: Mapping[str, Any]) -> tuple[bool, str]:
    """Whether the smCE witness carries information, and if not, the sentence saying why it is left out.

    The witness is the 1-Lipschitz function with the largest correlation with the residuals ``y - z``; when no
    smooth calibration error is detected that maximum is noise, and the curve shows nothing but its fit to it.

    Examples
    --------
    >>> witness_informative({"tests": {"smce": {"decision": "miscalibrated", "p_value": 0.001}}})
    (True, '')
    >>> print(witness_informative({"tests": {"smce": {"decision": "calibrated", "p_value": 0.4}}})[1][:94])
    The smooth calibration error's witness is not drawn: the smCE test does not reject calibration
    """
    smce = (doc.get("tests") or {}).get("smce")
    if isinstance(smce, Mapping):
        if smce.get("decision") == "miscalibrated":
            return True, ""
        p = smce.get("p_value")
        why = f"the smCE test does not reject calibration (p = {p:.3g})" if isinstance(p, float) else \
            f"the smCE test says {smce.get('decision')}"
    else:
        if (doc.get("summary") or {}).get("calibrated") is False:
            return True, ""
        why = "no miscalibration was detected"
    return False, f"The smooth calibration error's witness is not drawn: {why}, so the curve would only fit noise."


def _panel_figure(panel: Panel) -> Any:
    fig, axes = new_figure([3.5, 1.2])
    draw_reliability(axes[0], axes[1], panel.bars, panel.name, panel.title, panel.after)
    return fig


def _witness_figure(witness: tuple[np.ndarray, np.ndarray]) -> Any:
    fig, axes = new_figure([3.0])
    draw_witness(axes[0], witness[0], witness[1])
    return fig


def _table(rows: Sequence[Sequence[str]], head: Sequence[str]) -> str:
    th = "".join(f"<th>{html.escape(h)}</th>" for h in head)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in r) + "</tr>" for r in rows)
    return f"<table><thead><tr>{th}</tr></thead><tbody>{body}</tbody></table>"


def _fmt(x: Any) -> str:
    if isinstance(x, float):
        return f"{x:.4g}"
    return "n/a" if x is None else str(x)


def _tests_table(tests: Mapping[str, Mapping[str, Any]]) -> str:
    rows = [(name, str(r.get("decision")), _fmt(r.get("statistic")), _fmt(r.get("p_value")), str(r.get("method")))
            for name, r in tests.items()]
    return _table(rows, ("test", "decision", "statistic", "p-value (H0: calibrated)", "method"))


def _metrics_table(m: Mapping[str, Any]) -> str:
    names = {"accuracy": "accuracy", "base_rate": "base rate", "mean_confidence": "mean score / confidence",
             "brier": "Brier score", "ece": "ECE (15 bins)", "classwise_ece": "class-wise ECE"}
    return _table([(label, _fmt(m[k])) for k, label in names.items() if k in m], ("metric", "value"))


_STYLE = ("body{font-family:sans-serif;max-width:1100px;margin:1em auto;color:#222}"
          "table{border-collapse:collapse;margin:.5em 0}td,th{border:1px solid #ccc;padding:3px 8px;text-align:left}"
          ".verdict{font-size:1.1em;background:#f4f4f4;padding:.6em;border-left:4px solid #4c72b0}"
          ".panels{display:flex;flex-wrap:wrap;gap:1em}.panel svg{width:520px;height:auto}")


def render_html(data: ReportInput) -> str:
    """The report as one self-contained HTML document (inline SVG, no external resource)."""
    doc = data.doc
    summary = doc.get("summary", {})
    parts = [f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>calmon report: "
             f"{html.escape(str(doc.get('input')))}</title><style>{_STYLE}</style></head><body>",
             f"<h1>Calibration report: {html.escape(str(doc.get('input')))}</h1>",
             f"<p>{doc.get('n')} labelled predictions ({html.escape(str(doc.get('kind')))})</p>",
             f"<p class='verdict' id='verdict'>{'<b>Before the calibrator:</b> ' if data.after_doc else ''}"
             f"{html.escape(str(summary.get('text', 'no verdict')))}</p>",
             "<ul>" + "".join(f"<li>{html.escape(e)}</li>" for e in summary.get("evidence", [])) + "</ul>",
             "<h2>Tests</h2>", _tests_table(doc.get("tests", {})), "<h2>Metrics</h2>",
             _metrics_table(doc.get("metrics", {}))]
    if data.calibrator:
        cal = data.calibrator
        parts.append(f"<h2>Calibrator</h2><p id='calibrator'>{html.escape(str(cal.get('file', '')))}: "
                     f"{html.escape(str(cal.get('method', '?')))}; the green curves are the recalibrated scores on "
                     "the same outcomes.</p>")
        if data.after_doc is not None:
            after = data.after_doc
            parts += ["<p class='verdict' id='verdict-after'><b>After the calibrator:</b> "
                      f"{html.escape(str((after.get('summary') or {}).get('text', 'no verdict')))}</p>",
                      "<h3>Tests after the calibrator</h3>", _tests_table(after.get("tests", {})),
                      "<h3>Metrics after the calibrator</h3>", _metrics_table(after.get("metrics", {}))]
    parts.append("<h2>Reliability diagrams</h2><p>Bars: mean outcome per score bin; dashed: perfect calibration; "
                 "orange: where 95 % of bars fall if the scores are calibrated; grey: how many scores per bin."
                 "</p><div class='panels'>")
    for p in data.panels:
        parts.append(f"<div class='panel' id='panel-{html.escape(p.name)}'>{figure_svg(_panel_figure(p))}</div>")
    parts.append("</div>")
    if data.witness is not None:
        parts.append("<h2>Where: the smooth calibration error's witness</h2>"
                     f"<div class='panel' id='witness'>{figure_svg(_witness_figure(data.witness))}</div>")
    elif data.witness_note:
        parts.append(f"<p class='muted' id='witness-note'>{html.escape(data.witness_note)}</p>")
    parts.extend(data.sections)
    payload = {"summary": summary, **data.facts, "panels": [{"name": p.name, "title": p.title,
                                               "bars": [b.to_dict() for b in p.bars],
                                               "after": None if p.after is None else [b.to_dict() for b in p.after]}
                                              for p in data.panels],
               "witness": None if data.witness is None else {"points": data.witness[0].tolist(),
                                                             "w": data.witness[1].tolist()}}
    # "</" cannot occur in JSON numbers or in our escaped strings, but escape it anyway for the HTML parser
    blob = json.dumps(clean(payload), allow_nan=False).replace("</", "<\\/")
    parts.append(f"<script type='application/json' id='report-data'>{blob}</script></body></html>")
    return "".join(parts)


def grid_panel(name: str, title: str, grid: ScoreGrid, after: ScoreGrid | None = None) -> Panel:
    """A panel from a grid (and the grid after a calibrator)."""
    return Panel(name, title, reliability_bars(grid), None if after is None else reliability_bars(after))
