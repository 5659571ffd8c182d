"""The report as one laid-out page (PNG or SVG): the verdict, the tests and metrics tables, the diagrams.

Everything is placed in inches on a figure whose height follows its content, so nothing is clipped: the
header's lines are wrapped to the page width (the verdict in full; with a calibrator the verdict before and
after it), the tests and the metrics are tables side by side (before and after columns with a calibrator),
then the reliability diagrams (two a row when there are per-class panels) and the smCE witness when it
carries information (:func:`calmon.report.page.witness_informative`).  :func:`report_figure` returns the
figure, so a test can check that every text's extent lies inside it; the PNG is saved at the figure's own size
(no tight crop that would hide an overflow).
"""

from __future__ import annotations

import io
import textwrap
from collections.abc import Mapping, Sequence
from typing import Any

import matplotlib
import matplotlib.pyplot as plt
from matplotlib.figure import Figure
from matplotlib.transforms import Bbox

from calmon.report.figures import draw_reliability, draw_witness, figure_png
from calmon.report.page import Panel, ReportInput

__all__ = ["report_figure", "render_png", "render_svg"]

WIDTH = 8.5  #: inches
_LEFT, _RIGHT, _TOP, _BOTTOM = 0.75, 0.3, 0.3, 0.55
_FONT = 9.0
_LINE = 0.19  #: inches per header line at _FONT
_ROW = 0.24  #: inches per table row
_METRICS = {"ece": "ECE (15 bins)", "smce": "smooth calibration error", "classwise_ece": "class-wise ECE",
            "accuracy": "accuracy", "base_rate": "base rate", "mean_confidence": "mean score / confidence",
            "brier": "Brier score"}
_PCT = {"ece", "smce", "classwise_ece", "accuracy", "base_rate", "mean_confidence"}


def _wrap(text: str, width_in: float, fontsize: float) -> list[str]:
    """Lines of ``text`` that fit ``width_in`` inches (a character is at most ~0.6 em wide in the UI font)."""
    chars = max(20, int(width_in * 72 / (fontsize * 0.6)))
    return textwrap.wrap(text, chars, break_on_hyphens=False) or [""]


def _value(key: str, v: Any) -> str:
    if not isinstance(v, int | float) or isinstance(v, bool):
        return "-"
    return f"{100 * v:.2f} %" if key in _PCT else f"{v:.4g}"


def _p(v: Any) -> str:
    return f"{v:.3g}" if isinstance(v, int | float) and not isinstance(v, bool) else "-"


def _tests_rows(before: Mapping[str, Any], after: Mapping[str, Any] | None) -> tuple[list[str], list[list[str]]]:
    tb: Mapping[str, Any] = before.get("tests") or {}
    ta: Mapping[str, Any] = (after or {}).get("tests") or {}
    names = sorted(set(tb) | set(ta))
    if after is None:
        head = ["test", "decision", "p-value", "statistic"]
        return head, [[n, str(tb[n].get("decision", "-")), _p(tb[n].get("p_value")), _p(tb[n].get("statistic"))]
                      for n in names]
    head = ["test", "before", "p-value", "after", "p-value"]
    rows = []
    for n in names:
        b, a = tb.get(n) or {}, ta.get(n) or {}
        rows.append([n, str(b.get("decision", "-")), _p(b.get("p_value")), str(a.get("decision", "-")),
                     _p(a.get("p_value"))])
    return head, rows


def _metrics_rows(before: Mapping[str, Any], after: Mapping[str, Any] | None
                  ) -> tuple[list[str], list[list[str]]]:
    mb: Mapping[str, Any] = before.get("metrics") or {}
    ma: Mapping[str, Any] = (after or {}).get("metrics") or {}
    keys = [k for k in _METRICS if k in mb or k in ma]
    if after is None:
        return ["metric", "value"], [[_METRICS[k], _value(k, mb.get(k))] for k in keys]
    return ["metric", "before", "after"], [[_METRICS[k], _value(k, mb.get(k)), _value(k, ma.get(k))] for k in keys]


def _table(fig: Figure, rect: tuple[float, float, float, float], head: list[str], rows: list[list[str]],
           widths: list[float]) -> None:
    ax = fig.add_axes(rect)
    ax.axis("off")
    if not rows:
        ax.text(0, 1, "none run (--tests none)", va="top", fontsize=8, color="#555555")
        return
    tbl = ax.table(cellText=[[c[:40] for c in r] for r in rows], colLabels=head, colWidths=widths,
                   cellLoc="left", colLoc="left", bbox=Bbox.from_bounds(0.0, 0.0, 1.0, 1.0))
    tbl.auto_set_font_size(False)
    tbl.set_fontsize(8)
    for (r, _), cell in tbl.get_celld().items():
        cell.set_edgecolor("#cccccc")
        if r == 0:
            cell.set_facecolor("#f0f0f0")
            cell.get_text().set_fontweight("bold")


def _header_lines(data: ReportInput, width_in: float) -> list[tuple[str, float, str]]:
    """(text, font size, weight) per line: title, facts, the verdict(s) in full."""
    doc = data.doc
    lines: list[tuple[str, float, str]] = []
    lines += [(t, 13.0, "bold") for t in _wrap(f"Calibration report: {doc.get('input')}", width_in, 13.0)]
    facts = f"{doc.get('n')} labelled predictions ({doc.get('kind')})"
    cal = data.calibrator or {}
    if data.after_doc is not None:
        facts += (f"; after the calibrator {cal.get('file', '')} ({cal.get('method', '?')}): the green curves "
                  "and the 'after' columns are the recalibrated scores on the same outcomes")
    lines += [(t, _FONT, "normal") for t in _wrap(facts, width_in, _FONT)]
    verdicts = [("", doc)] if data.after_doc is None else [("Before: ", doc), ("After the calibrator: ",
                                                                                 data.after_doc)]
    for label, d in verdicts:
        text = str((d.get("summary") or {}).get("text", "no verdict"))
        lines += [(t, _FONT, "bold" if i == 0 and label else "normal")
                  for i, t in enumerate(_wrap(label + text, width_in, _FONT))]
    if data.witness is None and data.witness_note:
        lines += [(t, 8.0, "normal") for t in _wrap(data.witness_note, width_in, 8.0)]
    return lines


def report_figure(data: ReportInput) -> Figure:
    """The whole report as one figure, every part placed in inches (see the module docstring)."""
    inner = WIDTH - _LEFT - _RIGHT
    head = _header_lines(data, WIDTH - 0.6)
    head_h = sum(_LINE * (f / _FONT) for _, f, _ in head) + 0.15
    th, trows = _tests_rows(data.doc, data.after_doc)
    mh, mrows = _metrics_rows(data.doc, data.after_doc)
    table_h = _ROW * (max(len(trows), len(mrows), 1) + 1)
    tables_h = 0.3 + table_h + 0.35
    panels: Sequence[Panel] = data.panels
    cols = 2 if len(panels) > 1 else 1
    panel_rows = -(-len(panels) // cols)
    panel_h = 4.9  # title, diagram 3.0, gap, histogram 0.9, its x label
    wit_h = 2.9 if data.witness is not None else 0.0
    height = _TOP + head_h + tables_h + 0.3 + panel_rows * panel_h + wit_h + _BOTTOM
    fig = plt.figure(figsize=(WIDTH, height))

    def rect(x: float, top: float, w: float, h: float) -> tuple[float, float, float, float]:
        """Inches from the top-left corner -> figure fractions (left, bottom, width, height)."""
        return (x / WIDTH, (height - top - h) / height, w / WIDTH, h / height)

    y = _TOP
    for text, size, weight in head:  # header: wrapped lines, top to bottom
        fig.text(0.3 / WIDTH, 1 - y / height, text, fontsize=size, fontweight=weight, va="top", ha="left")
        y += _LINE * (size / _FONT)
    y += 0.15
    half = (WIDTH - 0.6 - 0.3) / 2
    fig.text(0.3 / WIDTH, 1 - y / height, "Tests", fontsize=11, fontweight="bold", va="top")
    fig.text((0.3 + half + 0.3) / WIDTH, 1 - y / height, "Metrics", fontsize=11, fontweight="bold", va="top")
    y += 0.3
    tw = [0.2, 0.3, 0.25, 0.25] if len(th) == 4 else [0.16, 0.26, 0.16, 0.26, 0.16]
    _table(fig, rect(0.3, y, half, _ROW * (len(trows) + 1)), th, trows, tw)
    mw = [0.6, 0.4] if len(mh) == 2 else [0.5, 0.25, 0.25]
    _table(fig, rect(0.3 + half + 0.3, y, half, _ROW * (len(mrows) + 1)), mh, mrows, mw)
    y += table_h + 0.35
    fig.text(0.3 / WIDTH, 1 - y / height, "Reliability diagrams", fontsize=11, fontweight="bold", va="top")
    y += 0.3
    gap = 0.9  # between two columns: room for the right panel's y label
    pw = inner if cols == 1 else (inner - gap) / 2
    for k, p in enumerate(panels):
        row, col = divmod(k, cols)
        x = _LEFT + col * (pw + gap)
        top = y + row * panel_h + 0.3  # the diagram's title sits above it
        ax = fig.add_axes(rect(x, top, pw, 3.0))
        hist = fig.add_axes(rect(x, top + 3.15, pw, 0.9))
        draw_reliability(ax, hist, p.bars, p.name, p.title, p.after)
        ax.set_xticklabels([])
    y += panel_rows * panel_h
    if data.witness is not None:
        ax = fig.add_axes(rect(_LEFT, y + 0.3, inner, 2.0))
        draw_witness(ax, data.witness[0], data.witness[1])
    return fig


def render_png(data: ReportInput) -> bytes:
    """The report page as PNG (110 dpi, the figure's own size)."""
    return figure_png(report_figure(data), tight=False)


def render_svg(data: ReportInput) -> str:
    """The report page as an SVG document whose texts stay text (searchable, testable)."""
    with matplotlib.rc_context({"svg.fonttype": "none"}):
        fig = report_figure(data)
        buf = io.StringIO()
        fig.savefig(buf, format="svg", metadata={"Date": None})
    plt.close(fig)
    return buf.getvalue()
