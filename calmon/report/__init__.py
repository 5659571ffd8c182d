"""``calmon report``'s drawing: :mod:`~calmon.report.figures` (matplotlib panels) and
:mod:`~calmon.report.page` (the self-contained HTML), :mod:`~calmon.report.sheet` (one PNG / SVG page).

matplotlib is the ``report`` extra: importing this package without it raises
:class:`~calmon.formats.extras.MissingExtra` ("calmon report needs matplotlib: pip install 'calmon[report]'").
"""

from calmon.formats.extras import require

require("matplotlib", extra="report", feature="calmon report")  # before the modules that import it

from calmon.report.figures import Bar, reliability_bars  # noqa: E402
from calmon.report.page import Panel, ReportInput, grid_panel, render_html  # noqa: E402
from calmon.report.sheet import render_png, render_svg, report_figure  # noqa: E402

__all__ = ["Bar", "Panel", "ReportInput", "grid_panel", "reliability_bars", "render_html", "render_png", "render_svg",
           "report_figure"]
