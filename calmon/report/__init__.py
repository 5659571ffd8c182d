"""``calmon report``'s drawing: :mod:`~calmon.report.figures` (matplotlib panels) and
:mod:`~calmon.report.page` (the self-contained HTML / PNG)."""

from calmon.report.figures import Bar, reliability_bars
from calmon.report.page import Panel, ReportInput, grid_panel, render_html, render_png

__all__ = ["Bar", "Panel", "ReportInput", "grid_panel", "reliability_bars", "render_html", "render_png"]
