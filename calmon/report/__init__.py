"""``calmon report``'s drawing: :mod:`~calmon.report.figures` (matplotlib panels) and
:mod:`~calmon.report.page` (the self-contained HTML), :mod:`~calmon.report.sheet` (one PNG / SVG page)."""

from calmon.report.figures import Bar, reliability_bars
from calmon.report.page import Panel, ReportInput, grid_panel, render_html
from calmon.report.sheet import render_png, render_svg, report_figure

__all__ = ["Bar", "Panel", "ReportInput", "grid_panel", "reliability_bars", "render_html", "render_png", "render_svg",
           "report_figure"]
