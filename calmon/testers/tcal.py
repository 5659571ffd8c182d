"""Tester ``"tcal"``: adaptive T-Cal on whatever the caller has (a file's raw data, a window's grid or sample).

The adapter only chooses the data source and the method; the statistics live in
:mod:`calmon.algorithms.tcal` and :mod:`calmon.algorithms.discrete_binomial`.
"""

from __future__ import annotations

import contextvars
from collections.abc import Sequence
from typing import Any, Literal

import numpy as np

from calmon.algorithms.discrete_binomial import binomial_test, discrete_support, grid_discrete_support
from calmon.algorithms.tcal import METHODS, SimulationNeeded, insufficient_result, tcal_test
from calmon.algorithms.tcal.multiclass import canonical_tcal_test
from calmon.algorithms.tcal.views import classwise_tcal_test
from calmon.stats.data import CalibrationData
from calmon.stats.grid import ScoreGrid

__all__ = ["tcal_screen", "tcal_tester"]

Source = Literal["raw", "grid", "reservoir"]
#: ``False`` inside :func:`tcal_screen`: a call that would simulate raises :class:`SimulationNeeded` instead.
_SIMULATE: contextvars.ContextVar[bool] = contextvars.ContextVar("tcal_simulate", default=True)


def tcal_tester(data: CalibrationData, *, alpha: float, mc: int, rng: np.random.Generator,
                method: str = "auto", combine: str = "bonferroni", levels: Sequence[int] | None = None,
                bins: Sequence[int] | None = None, screen: bool = True, discrete: bool | None = None,
                discrete_max_values: int = 50, raw_max: int = 200_000, views: bool = True,
                views_max_classes: int = 100) -> dict[str, Any]:
    """Tester ``"tcal"``: adaptive T-Cal from a file's raw data or a window's statistics.

    On multiclass data (``data.probs`` with K > 2 columns and ``data.labels``) and with ``views``, the
    result is the *canonical* test of the whole probability vector
    (:func:`~calmon.algorithms.tcal.multiclass.canonical_tcal_test`, exact Y-only Monte Carlo on the full
    data or the reservoir sample, levels combined by its default single-step min-p) and ``views`` holds the
    three notions side by side: ``canonical``, ``top_label`` (the binary test below on the top-label
    confidence) and ``classwise`` (:func:`~calmon.algorithms.tcal.views.classwise_tcal_test`).  Binary results
    are unchanged.

    Parameters
    ----------
    data
        What the caller has: ``z``/``y`` (full data when ``raw_is_complete``, else a reservoir sample)
        and/or the fine ``grid``.
    alpha, mc, rng
        Level, Monte Carlo draws, generator (see :func:`~calmon.algorithms.tcal.tcal_test`).
    method
        ``"auto"`` (default): exact binomial test when the predictions take few distinct values
        (Appendix B.4); else Y-only Monte Carlo on raw data when complete (``"mc-raw"``), else Monte Carlo
        on the fine grid (``"mc-grid"``), else on the reservoir sample.  Or one of ``"mc-raw"``,
        ``"mc-grid"``, ``"cantelli"``, ``"theorem3"``, ``"moment3"``, ``"binomial"``.
    combine
        ``"bonferroni"`` or ``"minp"`` (the binary / top-label test; the canonical test always uses min-p).
    levels, bins
        Dyadic exponents ``b`` (bins ``2**b``) or explicit numbers of bins; default eq. (7).
    screen
        Cantelli screen before Monte Carlo.
    discrete
        Force (``True``) or forbid (``False``) the binomial test; ``None`` decides automatically.
    discrete_max_values
        At most this many distinct values (and at least 10 events per value) count as discrete.
    raw_max
        ``"auto"`` uses the exact raw Monte Carlo on complete raw data only up to this many events; larger
        files use the grid (the cost of the raw simulation grows with n, the grid's does not).
    views
        On multiclass data, run the canonical and class-wise tests beside the top-label one (default).
    views_max_classes
        Class-wise view: test at most this many classes (Bonferroni factor stays K).

    Returns
    -------
    The dict of :func:`~calmon.algorithms.tcal.tcal_test` (or
    :func:`~calmon.algorithms.discrete_binomial.binomial_test`) with ``source`` (``"raw"``, ``"grid"``,
    ``"reservoir"``).

    Examples
    --------
    >>> rng = np.random.default_rng(0); z = rng.uniform(size=3000); y = (rng.uniform(size=3000) < z) * 1.0
    >>> g = ScoreGrid(); g.update(z, y)
    >>> tcal_tester(CalibrationData(n=3000, grid=g), alpha=0.05, mc=300, rng=rng)["method"]
    'mc-grid'
    """
    with_views = views and _multiclass(data)
    if with_views and not _SIMULATE.get():  # before the top-label screen, whose answer would be discarded
        raise SimulationNeeded("the canonical multiclass test always simulates")
    top = _top_label(data, alpha=alpha, mc=mc, rng=rng, method=method, combine=combine, levels=levels, bins=bins,
                     screen=screen, discrete=discrete, discrete_max_values=discrete_max_values, raw_max=raw_max)
    if not with_views:
        return top
    assert data.probs is not None and data.labels is not None  # checked by _multiclass
    source = "raw" if data.raw_is_complete else "reservoir"
    canonical = canonical_tcal_test(data.probs, data.labels, alpha=alpha, mc=mc, rng=rng)
    classwise = classwise_tcal_test(data.probs, data.labels, alpha=alpha, mc=mc, rng=rng,
                                    max_classes=views_max_classes)
    summary = {k: canonical.get(k) for k in ("statistic", "p_value", "decision", "method")}
    return {**canonical, "source": source, "notion": "canonical",
            "views": {"canonical": {**summary, "source": source}, "top_label": top,
                      "classwise": {**classwise, "source": source}}}


def tcal_screen(data: CalibrationData, **kwargs: Any) -> dict[str, Any] | None:
    """:func:`tcal_tester`'s result when it needs no Monte Carlo (a screen decides, the exact binomial test,
    too little data), else ``None``.

    The agent answers these windows in its round and sends the others, the full call, to its worker
    pool: a ``None`` here and ``tcal_tester`` with the same arguments and seed give the result an
    inline call would have given, bit for bit (the screens draw no random numbers).

    Examples
    --------
    >>> rng = np.random.default_rng(0); z = rng.uniform(size=3000); y = (rng.uniform(size=3000) < z) * 1.0
    >>> g = ScoreGrid(); g.update(z, y)
    >>> d = CalibrationData(n=3000, grid=g)
    >>> yb = (rng.uniform(size=3000) < np.clip(1.5 * z - 0.25, 0, 1)) * 1.0
    >>> gb = ScoreGrid(); gb.update(z, yb)
    >>> tcal_screen(CalibrationData(n=3000, grid=gb), alpha=0.05, mc=300, rng=rng)["screen"]
    'cantelli-reject'
    """
    token = _SIMULATE.set(False)
    try:
        return tcal_tester(data, **kwargs)
    except SimulationNeeded:
        return None
    finally:
        _SIMULATE.reset(token)


def _multiclass(data: CalibrationData) -> bool:
    return (data.probs is not None and data.labels is not None and np.ndim(data.probs) == 2
            and np.shape(data.probs)[1] > 2 and len(data.labels) > 0)


def _top_label(data: CalibrationData, *, alpha: float, mc: int, rng: np.random.Generator, method: str,
               combine: str, levels: Sequence[int] | None, bins: Sequence[int] | None, screen: bool,
               discrete: bool | None, discrete_max_values: int, raw_max: int) -> dict[str, Any]:
    """The binary (or top-label) test: binomial, raw, grid or reservoir Monte Carlo."""
    if method not in METHODS:
        raise ValueError(f"tcal method must be one of {METHODS}, got {method!r}")
    if levels is not None and bins is not None:
        raise ValueError("give levels (dyadic exponents) or bins, not both")
    if levels is not None:
        bins = [2 ** int(b) for b in levels]
    grid = _usable_grid(data.grid)
    source = _source(data, grid, method, raw_max)
    if source is None:
        return insufficient_result(method, alpha, int(data.n or 0), "no grid and no raw samples")
    if method in ("auto", "binomial") and discrete is not False:
        found = _binomial(data, grid, source, alpha, method, discrete, discrete_max_values)
        if found is not None:
            return found
    if method == "auto":
        method = "mc-grid" if source == "grid" else "mc-raw"
    use_z = source != "grid" and method != "mc-grid"
    if method == "mc-grid" and grid is None:
        raise ValueError("method 'mc-grid' needs a grid")
    if method == "mc-raw" and not _has_raw(data):
        raise ValueError("method 'mc-raw' needs raw scores (full data or a reservoir)")
    out = tcal_test(data.z if use_z else None, data.y if use_z else None, None if use_z else grid,
                    alpha=alpha, mc=mc, rng=rng, method=method, bins=bins, combine=combine, screen=screen,
                    simulate=_SIMULATE.get())
    out["source"] = "grid" if not use_z else ("raw" if _complete(data) else "reservoir")
    return out


def _has_raw(data: CalibrationData) -> bool:
    return data.z is not None and data.y is not None and len(data.z) > 0


def _complete(data: CalibrationData) -> bool:
    return _has_raw(data) and data.raw_is_complete


def _usable_grid(grid: ScoreGrid | None) -> ScoreGrid | None:
    """The single-channel, non-empty grid T-Cal can use, if any."""
    if grid is None or grid.channels is not None or grid.count == 0:
        return None
    return grid


def _source(data: CalibrationData, grid: ScoreGrid | None, method: str, raw_max: int) -> Source | None:
    """Complete raw data (unless huge and the method may use the grid), else the grid, else the sample."""
    if _complete(data) and data.z is not None and (
            grid is None or len(data.z) <= raw_max or method not in ("auto", "binomial")):
        return "raw"
    if grid is not None:
        return "grid"
    return "reservoir" if _has_raw(data) else None


def _binomial(data: CalibrationData, grid: ScoreGrid | None, source: Source, alpha: float, method: str,
              discrete: bool | None, max_values: int) -> dict[str, Any] | None:
    """The exact binomial test (Appendix B.4) when the predictions take few values; ``None`` otherwise."""
    if source == "grid" and grid is not None:
        sup = grid_discrete_support(grid, max_values)
    elif data.z is not None and data.y is not None:
        sup = discrete_support(data.z, data.y, max_values)
    else:
        sup = None
    if sup is not None:
        out = binomial_test(*sup, alpha=alpha)
        out["source"] = source
        out["n"] = int(np.sum(sup[1]))
        return out
    if method == "binomial" or discrete:
        raise ValueError("predictions take too many distinct values for the binomial test "
                         f"(more than {max_values}, or fewer than 10 events per value)")
    return None
