"""The report's figures, drawn with matplotlib (Agg) and returned as SVG text plus the numbers drawn.

Each bar of a reliability diagram carries the SVG id ``{name}-bar-{i}`` (matplotlib writes a patch's
``gid`` as the id of its group), so a test can measure the drawn bars against independently computed bins.
"""

from __future__ import annotations

import io
from dataclasses import asdict, dataclass

import matplotlib

matplotlib.use("Agg")  # no display: the report is written by servers and CI

import matplotlib.pyplot as plt  # noqa: E402 - after the backend choice
import numpy as np  # noqa: E402
from matplotlib.axes import Axes  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402

from calmon.stats.grid import ScoreGrid  # noqa: E402

__all__ = ["Bar", "draw_reliability", "draw_witness", "figure_png", "figure_svg", "new_figure", "reliability_bars",
           "witness_limit"]

#: Two-sided normal quantile of the calibration band (95 %).
_BAND_Z = 1.959963984540054


@dataclass(frozen=True)
class Bar:
    """One bin of a reliability diagram as drawn: edges, events, mean score and mean outcome, band."""

    lo: float
    hi: float
    events: int
    mean_score: float | None
    mean_outcome: float | None
    band_lo: float | None
    band_hi: float | None

    def to_dict(self) -> dict[str, float | int | None]:
        return asdict(self)


def reliability_bars(grid: ScoreGrid) -> list[Bar]:
    """Bins of ``grid`` with the 95 % band of the mean outcome *under calibration*.

    The band is ``mean z +- 1.96 sqrt(sum z (1 - z)) / N``: the mean of N independent Bernoulli(z_j)
    outcomes has exactly that variance when the scores are calibrated (T-Cal, Section 3).

    Examples
    --------
    >>> g = ScoreGrid(2); g.update(np.array([0.2, 0.3, 0.9]), np.array([0, 1, 1]))
    >>> [(b.events, b.mean_outcome) for b in reliability_bars(g)]
    [(2, 0.5), (1, 1.0)]
    """
    out = []
    for i in range(grid.bins):
        n = float(grid.n[i])
        if n == 0:
            out.append(Bar(i / grid.bins, (i + 1) / grid.bins, 0, None, None, None, None))
            continue
        mz = float(grid.sum_z[i] / n)
        half = _BAND_Z * float(np.sqrt(max(grid.sum_z[i] - grid.sum_zz[i], 0.0))) / n
        out.append(Bar(i / grid.bins, (i + 1) / grid.bins, int(n), mz, float(grid.sum_y[i] / n),
                       max(mz - half, 0.0), min(mz + half, 1.0)))
    return out


def new_figure(ratios: list[float], width: float = 6.4, unit: float = 1.1) -> tuple[Figure, np.ndarray]:
    """A one-column figure whose rows have the given relative heights (``unit`` inches each)."""
    fig, axes = plt.subplots(len(ratios), 1, figsize=(width, unit * sum(ratios)), squeeze=False,
                             gridspec_kw={"height_ratios": ratios})
    return fig, axes[:, 0]


def draw_reliability(ax: Axes, hist_ax: Axes, bars: list[Bar], name: str, title: str,
                     after: list[Bar] | None = None) -> None:
    """Bars of the mean outcome per bin, the diagonal, the calibration band; score histogram below."""
    labelled = False
    for i, b in enumerate(bars):
        if b.mean_outcome is None:
            continue
        patch = ax.bar(b.lo, b.mean_outcome, width=b.hi - b.lo, align="edge", color="#4c72b0", alpha=0.8,
                       edgecolor="white", label=None if labelled else "mean outcome")[0]
        labelled = True
        patch.set_gid(f"{name}-bar-{i}")
        if b.band_lo is not None and b.band_hi is not None:
            ax.fill_between([b.lo, b.hi], b.band_lo, b.band_hi, color="#dd8452", alpha=0.3, linewidth=0)
    ax.plot([0, 1], [0, 1], color="black", linewidth=1, linestyle="--", label="perfect calibration")
    if after is not None:
        pts = [(b.mean_score, b.mean_outcome) for b in after if b.mean_outcome is not None]
        if pts:
            xs, ys = zip(*pts)
            ax.plot(xs, ys, "o-", color="#55a868", label="after the calibrator")
    ax.fill_between([], [], [], color="#dd8452", alpha=0.3, label="95 % band if calibrated")
    ax.set(xlim=(0, 1), ylim=(0, 1), ylabel="mean outcome", title=title)
    ax.legend(loc="upper left", fontsize=8)
    counts = [b.events for b in bars]
    hist_ax.bar([b.lo for b in bars], counts, width=[b.hi - b.lo for b in bars], align="edge", color="#8c8c8c")
    hist_ax.set(xlim=(0, 1), xlabel="score", ylabel="events")
    nonzero = [c for c in counts if c]
    if nonzero and max(nonzero) > 100 * min(nonzero):  # skewed counts (confident models): log scale shows all bins
        hist_ax.set_yscale("log")


def witness_limit(w: np.ndarray) -> float:
    """The witness axis' half-height: the curve's own range with a margin (never the fixed +-2 of a flat line)."""
    peak = float(np.max(np.abs(w))) if w.size else 0.0
    return max(1.15 * peak, 1e-3)


def draw_witness(ax: Axes, points: np.ndarray, w: np.ndarray) -> None:
    """The (centred) smCE witness: above 0 where outcomes exceed the scores, below where they fall short.

    The y axis follows the curve (:func:`witness_limit`): what matters is its sign and where it changes.
    """
    ax.axhline(0.0, color="black", linewidth=0.8)
    ax.plot(points, w, color="#c44e52")
    ax.fill_between(points, 0, w, where=w > 0, color="#55a868", alpha=0.3, label="outcomes above scores")
    ax.fill_between(points, 0, w, where=w < 0, color="#c44e52", alpha=0.3, label="outcomes below scores")
    lim = witness_limit(w)
    ax.set(xlim=(0, 1), ylim=(-lim, lim), xlabel="score", ylabel="witness w(score), centred",
           title="where: the smooth calibration error's witness")
    ax.legend(loc="lower left", fontsize=8)


def figure_svg(fig: Figure) -> str:
    """The figure as an inline SVG element (no XML prologue), then closed."""
    buf = io.StringIO()
    fig.savefig(buf, format="svg", bbox_inches="tight", metadata={"Date": None})  # reproducible
    plt.close(fig)
    text = buf.getvalue()
    return text[text.index("<svg"):]


def figure_png(fig: Figure, tight: bool = True) -> bytes:
    """The figure as PNG bytes; ``tight=False`` keeps the figure's own size (a laid-out page)."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110, bbox_inches="tight" if tight else None)
    plt.close(fig)
    return buf.getvalue()
