"""The status page's reliability diagram: inline SVG with the score histogram, 95 % ranges per bin
and the score regions where the bars depart from the diagonal, plus those regions in plain words.

References
----------
Reliability diagrams: DeGroot & Fienberg (1983), "The comparison and evaluation of forecasters";
Guo et al. (2017), "On calibration of modern neural networks", Section 2 (Figure 1); the range per bin
as in Brocker & Smith (2007), "Increasing the reliability of reliability diagrams" (normal
approximation to the binomial at the bin's mean score, i.e. under the hypothesis of calibration).
"""

from __future__ import annotations

import math
from datetime import datetime, timezone
from html import escape
from typing import Any, TypedDict

__all__ = ["HIST", "HIST_GAP", "PAD_BOTTOM", "PAD_LEFT", "PAD_RIGHT", "PAD_TOP", "SIZE", "Region", "bin_regions",
           "direction_text", "finite", "fmt_num", "regions_of", "reliability_svg"]

#: Plot geometry of the reliability diagram (pixels): the diagram is SIZE x SIZE, the score
#: histogram HIST tall below it.
SIZE = 300
PAD_LEFT, PAD_TOP, PAD_RIGHT = 44, 12, 12
HIST, HIST_GAP, PAD_BOTTOM = 56, 10, 34


class Region(TypedDict):
    """A score interval where the observed frequency departs from the scores.

    ``sign`` is +1 when outcomes are more frequent than the scores say (bar above the diagonal),
    -1 when less frequent; ``gap`` is observed minus mean score (event-weighted).
    """

    lo: float
    hi: float
    sign: int
    gap: float


def fmt_num(v: Any, digits: int = 4) -> str:
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


def fmt_time(t: Any) -> str:
    """An epoch time as ``YYYY-MM-DD HH:MM:SS UTC`` (strings, already formatted, are escaped as they are)."""
    if isinstance(t, str):
        return escape(t)
    try:
        return datetime.fromtimestamp(float(t), tz=timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")
    except (TypeError, ValueError, OverflowError, OSError):
        return "-"


def finite(v: Any) -> float | None:
    """The value as a float if it is a finite number (not a bool), else ``None``."""
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return None
    return float(v) if math.isfinite(v) else None


def _clip01(v: float) -> float:
    return min(1.0, max(0.0, v))


# ----------------------------------------------------------------------------- direction
def bin_regions(bins: list[dict[str, Any]], z: float = 3.0, min_events: int = 30) -> list[Region]:
    """Score ranges whose bins depart significantly from the diagonal, adjacent bins merged.

    A bin counts when ``|observed - mean score| > z * sqrt(s (1 - s) / events)`` (the binomial
    standard error at the bin's mean score ``s``, i.e. under calibration); ``z = 3`` keeps the
    chance of a spurious bin small over 20 bins. Used only when the evaluation carries no
    ``summary`` (the verdict module's regions are preferred).

    Examples
    --------
    >>> b = [{"bin": 0.0, "hi": 0.5, "mean_score": 0.25, "mean_outcome": 0.40, "events": 1000},
    ...      {"bin": 0.5, "hi": 1.0, "mean_score": 0.75, "mean_outcome": 0.60, "events": 1000}]
    >>> [(r["lo"], r["hi"], r["sign"]) for r in bin_regions(b)]
    [(0.0, 0.5, 1), (0.5, 1.0, -1)]
    """
    out: list[Region] = []
    weight = 0.0
    for b in bins:
        lo, hi = finite(b.get("bin")), finite(b.get("hi"))
        s, o = finite(b.get("mean_score")), finite(b.get("mean_outcome"))
        k = int(b.get("events") or 0)
        if lo is None or hi is None or s is None or o is None or k < min_events:
            continue
        se = math.sqrt(max(s * (1 - s), 1e-12) / k)
        if abs(o - s) <= z * se:
            continue
        sign = 1 if o > s else -1
        if out and out[-1]["sign"] == sign and abs(out[-1]["hi"] - lo) < 1e-9:
            last = out[-1]
            last["gap"] = (last["gap"] * weight + (o - s) * k) / (weight + k)
            last["hi"], weight = hi, weight + k
        else:
            out.append(Region(lo=lo, hi=hi, sign=sign, gap=o - s))
            weight = float(k)
    return out


def _region_sign(r: dict[str, Any]) -> int:
    s = r.get("sign")
    if isinstance(s, str):
        return {"+": 1, "above": 1, "positive": 1, "up": 1, "-": -1, "below": -1, "negative": -1,
                "down": -1}.get(s.strip().lower(), 0)
    v = finite(s)
    if v is None:
        v = finite(r.get("gap")) or 0.0
    return (v > 0) - (v < 0)


def direction_text(regions: list[Region], binary: bool) -> str:
    """Plain words for the regions: where the scores are too high or too low.

    Binary scores: a bar above the diagonal means positives are more frequent than the score says,
    so the scores are too low there (an over-confident binary model has its low-score bins above
    the diagonal and its high-score bins below it). Top-label confidence: a bar below the diagonal
    means the model is right less often than its confidence says: over-confident there.

    Examples
    --------
    >>> direction_text([Region(lo=0.0, hi=0.3, sign=1, gap=0.05), Region(lo=0.7, hi=1.0, sign=-1, gap=-0.05)],
    ...                binary=True)  # doctest: +NORMALIZE_WHITESPACE
    'over-confident (scores too extreme); scores too low in [0.00, 0.30) (outcomes more frequent than
    predicted); scores too high in [0.70, 1.00) (outcomes less frequent than predicted)'
    >>> direction_text([Region(lo=0.8, hi=1.0, sign=-1, gap=-0.1)], binary=False)
    'over-confident; over-confident in [0.80, 1.00) (right less often than the confidence says)'
    """
    words = [_overall(regions, binary)] if regions else []
    for r in regions:
        span = f"[{r['lo']:.2f}, {r['hi']:.2f})"
        if binary:
            words.append(f"scores too low in {span} (outcomes more frequent than predicted)" if r["sign"] > 0
                         else f"scores too high in {span} (outcomes less frequent than predicted)")
        else:
            words.append(f"under-confident in {span} (right more often than the confidence says)"
                         if r["sign"] > 0 else
                         f"over-confident in {span} (right less often than the confidence says)")
    return "; ".join(words)


def _overall(regions: list[Region], binary: bool) -> str:
    """One word for the pattern: over/under-confident, biased up/down, or mixed."""
    above = [(r["lo"] + r["hi"]) / 2 for r in regions if r["sign"] > 0]
    below = [(r["lo"] + r["hi"]) / 2 for r in regions if r["sign"] < 0]
    if not binary:
        return "over-confident" if not above else ("under-confident" if not below else "mixed")
    if above and below and max(above) < min(below):
        return "over-confident (scores too extreme)"
    if above and below and max(below) < min(above):
        return "under-confident (scores too close to the middle)"
    if above and not below:
        return "scores biased down (too low)"
    if below and not above:
        return "scores biased up (too high)"
    return "mixed"


def regions_of(ev: dict[str, Any]) -> list[Region]:
    summary = ev.get("summary")
    if isinstance(summary, dict) and isinstance(summary.get("regions"), list):
        out = []
        for r in summary["regions"]:
            lo, hi = (finite(r.get(k)) if isinstance(r, dict) else None for k in ("lo", "hi"))
            if isinstance(r, dict) and lo is not None and hi is not None and _region_sign(r):
                out.append(Region(lo=lo, hi=hi, sign=_region_sign(r), gap=finite(r.get("gap")) or 0.0))
        return out
    return bin_regions(ev.get("reliability") or [])


# ----------------------------------------------------------------------------- diagram
def _bar_parts(b: dict[str, Any], px: Any, py: Any) -> list[str]:
    lo, hi = finite(b.get("bin")), finite(b.get("hi"))
    ms, mo = finite(b.get("mean_score")), finite(b.get("mean_outcome"))
    events = int(b.get("events") or 0)
    if lo is None or hi is None or mo is None or not events:
        return []
    x0, x1 = px(lo), px(hi)
    wid = max(x1 - x0 - 1.0, 0.5)
    tip = (f"scores [{lo:.2f}, {hi:.2f}): {events} events, mean score {fmt_num(ms, 3)}, "
           f"observed frequency {fmt_num(mo, 3)}")
    out = [f'<rect class="bar" data-bin="{lo:.2f}" data-events="{events}" x="{x0 + 0.5:.3f}" '
           f'y="{py(mo):.3f}" width="{wid:.3f}" height="{py(0) - py(mo):.3f}">'
           f"<title>{escape(tip)}</title></rect>"]
    if ms is not None:
        top, bottom = sorted((py(mo), py(ms)))
        half = 1.96 * math.sqrt(max(ms * (1 - ms), 0.0) / events)
        xc = px(ms)
        out += [f'<rect class="gap" x="{x0 + 0.5:.3f}" y="{top:.3f}" width="{wid:.3f}" '
                f'height="{bottom - top:.3f}"/>',
                f'<line class="ci" x1="{xc:.3f}" y1="{py(ms - half):.3f}" x2="{xc:.3f}" '
                f'y2="{py(ms + half):.3f}"><title>95 % range of the observed frequency if calibrated: '
                f"{_clip01(ms - half):.3f} to {_clip01(ms + half):.3f}</title></line>",
                f'<circle class="dot" cx="{xc:.3f}" cy="{py(mo):.3f}" r="2.5"/>']
    return out


def _histogram(bins: list[dict[str, Any]], px: Any) -> list[str]:
    top = PAD_TOP + SIZE + HIST_GAP
    counts = [int(b.get("events") or 0) for b in bins]
    peak = max(counts, default=0)
    out = [f'<text x="{PAD_LEFT - 4}" y="{top + 8}" text-anchor="end">n</text>']
    for b, k in zip(bins, counts):
        lo, hi = finite(b.get("bin")), finite(b.get("hi"))
        if lo is None or hi is None or not k or not peak:
            continue
        h = HIST * k / peak
        out.append(f'<rect class="hist" data-bin="{lo:.2f}" data-events="{k}" x="{px(lo) + 0.5:.3f}" '
                   f'y="{top + HIST - h:.3f}" width="{max(px(hi) - px(lo) - 1.0, 0.5):.3f}" height="{h:.3f}">'
                   f"<title>{k} events with scores in [{lo:.2f}, {hi:.2f})</title></rect>")
    return out


def reliability_svg(bins: list[dict[str, Any]], title: str = "", regions: list[Region] | None = None,
                    binary: bool = True) -> str:
    """Inline SVG reliability diagram with the score histogram below it.

    One bar per populated bin spans the bin's score interval ``[bin, hi)`` with height equal to the
    observed frequency; a dot marks (mean score, observed frequency); the shaded gap between the bar
    top and the diagonal is the bin's calibration error; the black tick at the mean score is the
    95 % range of the observed frequency if the model were calibrated there (so a bar top outside
    it is a real departure); the dashed diagonal is perfect calibration. ``regions`` are shaded over
    the plot's full height (amber: bar above the diagonal, red: below). The grey histogram under
    the plot shows how many events fall in each bin (scaled to the fullest bin).

    Parameters
    ----------
    bins
        ``[{"bin", "hi", "mean_score", "mean_outcome", "events"}]`` (empty bins have ``None`` means).
    title
        Accessible title (escaped).
    regions
        Score ranges to shade (:class:`Region`).
    binary
        Axis label: "observed frequency" (binary scores) or "accuracy" (top-label confidence).

    Returns
    -------
    str
        An ``<svg>`` element.

    Examples
    --------
    >>> svg = reliability_svg([{"bin": 0.5, "hi": 1.0, "mean_score": 0.75, "mean_outcome": 0.5,
    ...                         "events": 10}], title="m <1h>")
    >>> svg.count('class="bar"'), svg.count('class="hist"'), "m &lt;1h&gt;" in svg
    (1, 1, True)
    """
    w = PAD_LEFT + SIZE + PAD_RIGHT
    h = PAD_TOP + SIZE + HIST_GAP + HIST + PAD_BOTTOM

    def px(x: float) -> float:
        return PAD_LEFT + _clip01(x) * SIZE

    def py(y: float) -> float:
        return PAD_TOP + (1.0 - _clip01(y)) * SIZE

    out = [f'<svg class="reliability-svg" xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" '
           f'viewBox="0 0 {w} {h}" role="img" aria-label="{escape(title)}"><title>{escape(title)}</title>',
           f'<rect x="{PAD_LEFT}" y="{PAD_TOP}" width="{SIZE}" height="{SIZE}" fill="#fff" stroke="#d8dde6"/>']
    for r in regions or []:
        side = "above" if r["sign"] > 0 else "below"
        out.append(f'<rect class="region {side}" data-lo="{r["lo"]:.3f}" data-hi="{r["hi"]:.3f}" '
                   f'x="{px(r["lo"]):.3f}" y="{PAD_TOP}" width="{max(px(r["hi"]) - px(r["lo"]), 0.5):.3f}" '
                   f'height="{SIZE}"><title>bars {side} the diagonal in [{r["lo"]:.2f}, {r["hi"]:.2f})'
                   "</title></rect>")
    for t in (0.0, 0.25, 0.5, 0.75, 1.0):
        out.append(f'<text x="{px(t):.1f}" y="{h - PAD_BOTTOM + 14}" text-anchor="middle">{t:g}</text>')
        out.append(f'<text x="{PAD_LEFT - 4}" y="{py(t) + 4:.1f}" text-anchor="end">{t:g}</text>')
    xlabel = "score" if binary else "confidence (top-label score)"
    ylabel = "observed frequency of positives" if binary else "accuracy (fraction correct)"
    out.append(f'<text x="{PAD_LEFT + SIZE / 2}" y="{h - 4}" text-anchor="middle">{xlabel}</text>')
    out.append(f'<text transform="translate(12 {PAD_TOP + SIZE / 2}) rotate(-90)" text-anchor="middle">'
               f"{ylabel}</text>")
    for b in bins:
        out += _bar_parts(b, px, py)
    out += _histogram(bins, px)
    out.append(f'<line class="diag" x1="{px(0)}" y1="{py(0)}" x2="{px(1)}" y2="{py(1)}"/>')
    out.append(f'<line class="axis" x1="{px(0)}" y1="{py(0)}" x2="{px(1)}" y2="{py(0)}"/>')
    out.append(f'<line class="axis" x1="{px(0)}" y1="{py(0)}" x2="{px(0)}" y2="{py(1)}"/>')
    out.append("</svg>")
    return "".join(out)
