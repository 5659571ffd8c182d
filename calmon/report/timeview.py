"""The report's time view and label-free section: calibration over time with detected changes, estimated vs realised.

The time view runs the agent's change detector (:class:`calmon.algorithms.changepoint.CalibrationChangeDetector`)
over the file's labelled predictions in event-time order (record order when times are missing) and
draws the cumulative residual ``sum (y - p)`` -- flat while calibrated, sloped where outcomes run
above or below the scores -- with the detected change points.  The label-free section shows what
:func:`calmon.algorithms.estimate.estimate_performance` would have estimated from the scores alone
beside the realised metrics of the same predictions.
"""

from __future__ import annotations

import html
from dataclasses import dataclass
from typing import Any

import numpy as np
from matplotlib.axes import Axes

from calmon.algorithms.changepoint import CalibrationChangeDetector, Change
from calmon.algorithms.estimate import estimate_performance, realised_metrics
from calmon.report.figures import figure_svg, new_figure
from calmon.stats.grid import ScoreGrid

__all__ = ["TimeView", "estimates_html", "time_view"]


@dataclass
class TimeView:
    """Positions (event time or index), the cumulative residual, and the detected changes."""

    x: np.ndarray
    cumulative: np.ndarray
    changes: list[Change]
    by_time: bool

    def to_dict(self) -> dict[str, Any]:
        return {"by_time": self.by_time, "changes": [c.to_dict() for c in self.changes]}


def time_view(z: np.ndarray, y: np.ndarray, ts: np.ndarray | None) -> TimeView:
    """Order the pairs by event time (when every event has one) and run the change detector over them."""
    by_time = ts is not None and ts.size == z.size and bool(np.all(np.isfinite(ts) & (ts > 0)))
    order = np.argsort(ts, kind="stable") if by_time and ts is not None else np.arange(z.size)
    x = ts[order] if by_time and ts is not None else np.arange(z.size, dtype=np.float64)
    zs, ys = z[order], y[order]
    block = int(min(256, max(64, z.size // 100)))  # small files: smaller blocks (>= 64 for the block CLT)
    changes = CalibrationChangeDetector(block=block).update(zs, ys, x)
    return TimeView(x, np.cumsum(ys - zs), changes, by_time)


def draw_time_view(ax: Axes, tv: TimeView) -> None:
    ax.plot(tv.x, tv.cumulative, color="#1d2330", lw=1)
    ax.axhline(0, color="#5b6474", lw=0.6, ls=":")
    for c in tv.changes:
        ax.axvline(c.change_point, color="#cf222e", lw=1, ls="--")
        ax.annotate(c.signal, (c.change_point, float(np.max(tv.cumulative))), fontsize=7, color="#cf222e",
                    rotation=90, va="top", ha="right")
    ax.set_xlabel("event time (epoch s)" if tv.by_time else "prediction (record order)")
    ax.set_ylabel("cumulative outcome - score")


def time_view_html(tv: TimeView) -> str:
    fig, axes = new_figure([2.2])
    draw_time_view(axes[0], tv)
    rows = "".join(f"<tr><td>{html.escape(c.signal)}</td><td>{c.direction}</td><td>{c.change_point:.6g}</td>"
                   f"<td>{c.detected_at:.6g}</td></tr>" for c in tv.changes)
    table = ("<table><tr><th>signal</th><th>direction</th><th>change point</th><th>detected at</th></tr>"
             f"{rows}</table>" if rows else "<p>No change of calibration detected over the file.</p>")
    return ("<h2>Over time: when did calibration change?</h2><p>Cumulative outcome minus score (flat while "
            "calibrated); red: change points found by the agent's detector (Page-Hinkley on block-standardised "
            f"residuals).</p><div class='panel' id='time-view'>{figure_svg(fig)}</div>{table}")


def estimates_html(z: np.ndarray, y: np.ndarray) -> str:
    """Estimated (from the scores alone, as before the labels arrive) beside realised metrics."""
    pred, lab = ScoreGrid(256), ScoreGrid(256)
    pred.update(z, np.zeros(z.size))
    lab.update(z, y)
    est, real = estimate_performance(pred), realised_metrics(lab)
    rows = "".join(f"<tr><td>{m}</td><td>{e.value:.4f}</td><td>{e.lo:.4f} - {e.hi:.4f}</td><td>{real[m]:.4f}</td>"
                   f"<td>{e.value - real[m]:+.4f}</td></tr>" for m, e in est.items())
    return ("<h2>Before the labels: estimated vs realised</h2><p>What the scores alone predict if they are "
            "calibrated (the agent exports these as calmon_estimated_*), beside what the outcomes show; a large "
            "error means the scores cannot be taken at face value.</p><table id='estimates'><tr><th>metric</th>"
            f"<th>estimated</th><th>95 % interval</th><th>realised</th><th>error</th></tr>{rows}</table>")
