"""A verdict in plain words: calibrated or not, by how much, in which direction, where, and what to do.

:func:`summarize` reads the fine :class:`~calmon.stats.grid.ScoreGrid` of a window or file and the testers'
JSON results and returns a :class:`Summary`.  Everything is closed form on the grid (no Monte Carlo), so
it costs well under a millisecond on 1024 cells and the agent may call it for every window every round.

The pieces, and why:

- **calibrated**: the tests with a p-value are combined by Bonferroni (reject iff ``min p < alpha / k``),
  so the verdict keeps the level ``alpha`` however many testers ran; with no p-value the testers'
  own decisions are used (miscalibrated if any says so); ``None`` without a usable test.
- **regions**: the grid coarsened to ``bins`` equal-width bins; per bin the residual sum
  ``S = sum (y - z)`` is standardised by its exact null variance ``V = sum z (1 - z)`` (binomial
  outcomes, Bernoulli(z) under calibration), bins with ``|S| / sqrt(V)`` above the Bonferroni normal
  quantile ``z_{1 - alpha / (2 m)}`` are significant, and adjacent significant bins of one sign form
  a region.  A bin whose scores are all exactly 0 or 1 has ``V = 0``: any residual there is significant.
- **direction**: top-label (``y`` = correct): gaps below zero (accuracy under confidence) are
  *over-confident*, above zero *under-confident*.  Binary scores: the sign of the gap relative to 0.5
  on each side -- outcomes above the scores on the low side (``z < 0.5``) and below them on the high
  side mean the scores are too extreme, *over-confident*; the reverse *under-confident*; the same sign on
  both sides is a shift, *biased up* (scores too high) or *biased down*.  With evidence on one side
  only, that side decides over/under-confidence.  Significant bins of both signs on one side (or in a
  top-label grid) with each at least a quarter of the gap mass make it *mixed*.  Without significant
  bins the side sums are used when their z-score exceeds 1 (top-label: the sign of accuracy minus
  confidence).
- **ece_ci**: a conservative interval for the binned l1-ECE ``sum_i |E S_i| / n``.  By the triangle
  inequality ``| sum |S_i| - sum |E S_i| | <= D = sum |S_i - E S_i|``; each ``S_i - E S_i`` is about
  normal with ``sigma_i^2 = Q_i - S_i^2 / n`` (``Q_i = sum (y - z)^2``; the plug-in variance of a sum of
  ``n`` i.i.d. terms ``(y - z) 1[bin i]``), so ``D`` is a sum of half-normals with mean
  ``sqrt(2/pi) sum sigma_i`` and variance ``(1 - 2/pi) sum sigma_i^2``; it exceeds
  ``sqrt(2/pi) sum sigma_i + z_{1-alpha/2} sqrt((1 - 2/pi) sum sigma_i^2)`` with probability below
  ``alpha`` (the two-sided quantile is a margin for ``D``'s right skew, about ``1/sqrt(bins)``, and for
  the estimated ``sigma_i``); the interval ``(sum |S_i| -+ that bound) / n`` (clipped at 0) therefore
  covers with probability at least about ``1 - alpha`` -- also at ECE = 0, where ``|S_i|`` is biased
  upwards and a delta-method or percentile-bootstrap interval misses.  Coverage is checked by simulation in
  ``tests/test_verdict.py`` and ``benchmarks/verdict_coverage.py``.
- **material**: significant is not the same as worth acting on.  With a ``tolerance`` on the ECE (``--tolerance``,
  ``verdict.tolerance.ece``), a rejection whose whole ECE interval lies below it (upper bound ``< tolerance``) is
  *significant but immaterial*: "calibrated within tolerance; no action".  The rule is that of an equivalence
  test (the interval excludes every error at least as large as the tolerance), so at ``tolerance = 0`` nothing is
  immaterial and the verdict is the tests' alone.
- **extremes**: scores at exactly 0 or 1 claim certainty, and the exact binomial test (T-Cal on a discrete
  predictor) rejects them at the first contrary outcome whatever the ECE.  When its rejection comes from such
  values, the verdict names them ("driven by 3 scores ... at exactly 1.0 with observed frequency 0.998") and
  recommends keeping the scores off 0 and 1 rather than another recalibrator.

References
----------
Guo, Pleiss, Sun, Weinberger. On calibration of modern neural networks. ICML 2017, eq. (3) (binned ECE).
Lee, Huang, Hassani, Dobriban. T-Cal. JMLR 2023, Section 3 (per-bin residual sums, null variance
``sum z(1-z)``).  Hu, Tian, Yang. Testing calibration in subquadratic time, 2024, Definition 3 (smCE
and its witness: ``w > 0`` where outcomes exceed predictions).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from functools import lru_cache
from statistics import NormalDist
from typing import Any, Literal

import numpy as np

from calmon.stats.grid import ScoreGrid

__all__ = ["Direction", "Extreme", "Region", "Summary", "summarize", "RECOMMENDED", "RECOMMENDED_METHODS"]

Direction = Literal["over-confident", "under-confident", "biased up", "biased down", "mixed"]

#: Method family that fits each direction when no held-out comparison is available.
RECOMMENDED: Mapping[str, str] = {
    "over-confident": "temperature scaling (one parameter, it pulls the scores towards the middle) or Platt scaling",
    "under-confident": "temperature scaling or Platt scaling (they stretch the scores)",
    "biased up": "Platt scaling (its intercept removes a shift), or histogram binning",
    "biased down": "Platt scaling (its intercept removes a shift), or histogram binning",
    "mixed": "a non-parametric recalibrator: isotonic regression or histogram binning",
}

#: The ``calmon fit --method`` names behind each recommendation (every one fits binary, top-label and multiclass data).
RECOMMENDED_METHODS: Mapping[str, tuple[str, ...]] = {
    "over-confident": ("temperature", "platt"),
    "under-confident": ("temperature", "platt"),
    "biased up": ("platt", "histogram"),
    "biased down": ("platt", "histogram"),
    "mixed": ("isotonic", "histogram"),
}

#: Bins with fewer events than this are not used for regions.
MIN_BIN_EVENTS = 20
#: ``ndarray.sum`` of a float array without its wrappers (the same reduction)
_sum = np.add.reduce


@dataclass(frozen=True)
class Region:
    """A score interval where outcomes differ significantly from the scores.

    ``gap`` is mean outcome minus mean score over the interval's events (negative: scores too high).
    """

    lo: float
    hi: float
    sign: Literal["+", "-"]
    gap: float
    events: int
    z: float


@dataclass(frozen=True)
class Extreme:
    """Predictions at exactly 0 or 1 that the exact binomial test rejects (a certainty an outcome contradicts).

    ``score`` is 0.0 or 1.0, ``events`` the predictions at it, ``frequency`` their observed mean outcome,
    ``p_value`` the Bonferroni-adjusted p-value of that value alone; ``alone`` is true when no other value's
    test rejects (the rejection is driven by the extremes only).
    """

    score: float
    events: int
    frequency: float
    p_value: float
    alone: bool

    def phrase(self) -> str:
        """``"3 scores ... at exactly 1.0 with observed frequency 0.998"`` in words."""
        contrary = round(self.events * (1.0 - self.frequency) if self.score >= 1.0 else self.events * self.frequency)
        outcome = "negative" if self.score >= 1.0 else "positive"
        return (f"{self.events:,} scores at exactly {self.score:.1f} with observed frequency {self.frequency:.4g} "
                f"({contrary:,} {outcome} outcome{'s' if contrary != 1 else ''} where the score claims none)")


@dataclass(frozen=True)
class Summary:
    """The verdict of one window or file; :meth:`to_dict` is the JSON ``summary`` object.

    Examples
    --------
    >>> rng = np.random.default_rng(0); z = rng.random(20000); y = rng.random(20000) < z ** 2
    >>> g = ScoreGrid(1024); g.update(z, y)
    >>> s = summarize(g, {"tcal": {"p_value": 0.0, "decision": "miscalibrated"}}, alpha=0.05)
    >>> s.calibrated, s.direction, s.to_dict()["regions"][0]["sign"]
    (False, 'biased up', '-')
    """

    calibrated: bool | None
    direction: Direction | None
    regions: tuple[Region, ...]
    ece: float | None
    ece_ci: tuple[float, float] | None
    recommendation: str
    evidence: tuple[str, ...]
    text: str
    n: int
    alpha: float
    kind: Literal["binary", "top-label"] = "binary"
    #: Worth acting on: miscalibrated beyond the tolerance (``False`` when calibrated or within tolerance,
    #: ``None`` without a verdict); ``calibrated`` stays the tests' decision (significance).
    material: bool | None = None
    material_reason: str = ""
    tolerance: float = 0.0
    #: ``"calibrated"``, ``"miscalibrated"``, ``"calibrated within tolerance"`` or ``"no verdict"``.
    verdict: str = "no verdict"
    extremes: tuple[Extreme, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe dict (tuples as lists, NaN-free), keys in field order (as ``dataclasses.asdict``)."""
        return {"calibrated": self.calibrated, "direction": self.direction,
                "regions": [{"lo": r.lo, "hi": r.hi, "sign": r.sign, "gap": r.gap, "events": r.events, "z": r.z}
                            for r in self.regions],
                "ece": self.ece, "ece_ci": None if self.ece_ci is None else list(self.ece_ci),
                "recommendation": self.recommendation, "evidence": list(self.evidence), "text": self.text,
                "n": self.n, "alpha": self.alpha, "kind": self.kind, "material": self.material,
                "material_reason": self.material_reason, "tolerance": self.tolerance, "verdict": self.verdict,
                "extremes": [{"score": e.score, "events": e.events, "frequency": e.frequency, "p_value": e.p_value,
                              "alone": e.alone} for e in self.extremes]}


def summarize(grid: ScoreGrid, tests: Mapping[str, Mapping[str, Any]], *, alpha: float,
              top_label: bool = False, calibration: Mapping[str, Any] | None = None,
              ece_grid: ScoreGrid | None = None, bins: int = 16, tolerance: float = 0.0,
              judge: str | None = None) -> Summary:
    """The verdict of a grid and its tests (see the module docstring for every rule).

    Parameters
    ----------
    grid
        Fine single-channel grid: binary scores, or top-label confidence with ``y`` = correct.
    tests
        Tester name -> JSON result (``decision``, ``p_value``, ``statistic``, ``method``...).
    alpha
        Level of the verdict and of the intervals.
    top_label
        The grid holds top-label confidence (direction is then over/under-confident only).
    calibration
        Optional recalibration refresh result (``before``, ``after``, ``method``, ``candidates``): the
        recommendation then names the recalibrator that helps most on held-out data.
    ece_grid
        Grid whose bins define the reported ECE (e.g. the 15-bin ECE grid); default ``grid`` coarsened
        to ``bins``.
    bins
        Equal-width bins for the regions (must divide ``grid.bins``; else the grid is used as is).
    tolerance
        ECE below which a significant miscalibration is immaterial: when the ECE interval's upper bound is
        below it the verdict is "calibrated within tolerance; no action" (0: every rejection is material).
    judge
        Why these data cannot judge a recalibration (e.g. the calibrator was fitted on them): the
        recommendation then says so instead of recommending another recalibrator.
    """
    if grid.channels is not None:
        raise ValueError("summarize needs a single-channel grid (binary or top-label confidence)")
    if not 0.0 < alpha < 1.0:
        raise ValueError(f"alpha must lie in (0, 1), got {alpha}")
    if not 0.0 <= tolerance < 1.0:
        raise ValueError(f"tolerance must lie in [0, 1), got {tolerance}")
    n = grid.count
    kind: Literal["binary", "top-label"] = "top-label" if top_label else "binary"
    coarse = _Fields(grid, bins if grid.bins % bins == 0 else grid.bins, n)  # coarsening keeps the count
    calibrated, evidence = _decide(tests, alpha)
    regions = _regions(coarse, alpha) if n else ()
    direction = None if calibrated is not False else _direction(coarse, regions, top_label)
    ece, ci = _ece_ci(_Fields(ece_grid) if ece_grid is not None else coarse, alpha) if n else (None, None)
    rec = _recommend(direction, calibration, calibrated)
    if calibrated and ci is not None and ci[1] > 0.05:
        rec = "collect more labelled predictions: these cannot tell a calibrated model from a clearly miscalibrated one"
    extremes = _extremes(tests, alpha) if calibrated is False else ()
    material, reason = _material(calibrated, ci, tolerance)
    if extremes:
        evidence.append(_extremes_line(extremes))
    if material is False and calibrated is False:
        rec = "no action"
    elif extremes and all(e.alone for e in extremes):
        rec = ("keep the scores off exactly 0 and 1 (e.g. clip the recalibrator's output to [0.001, 0.999]): a score "
               "of exactly 0 or 1 claims certainty, which one contrary outcome refutes; another recalibrator "
               "would not change that")
    if judge and calibrated is False:
        rec = judge
    verdict = ("no verdict" if calibrated is None else "calibrated" if calibrated
               else "miscalibrated" if material else "calibrated within tolerance")
    text = _text(calibrated, direction, regions, ece, ci, rec, n, alpha, kind, material, tolerance, extremes)
    return Summary(calibrated, direction, regions, ece, ci, rec, tuple(evidence), text, n, alpha, kind,
                   material, reason, tolerance, verdict, extremes)


# -- significant or material ----------------------------------------------------------------------------------
def _material(calibrated: bool | None, ci: tuple[float, float] | None, tolerance: float) -> tuple[bool | None, str]:
    """Whether a verdict is worth acting on, and why (see the module docstring)."""
    if calibrated is None:
        return None, "no test decided"
    if calibrated:
        return False, "no test detects miscalibration"
    if tolerance <= 0.0:
        return True, "the tests reject calibration (no tolerance set: every significant error is material)"
    if ci is None:
        return True, "the tests reject calibration and there is no ECE interval to compare with the tolerance"
    if ci[1] < tolerance:
        return False, (f"significant but immaterial: the ECE interval's upper bound {100 * ci[1]:.2f} % is below "
                       f"the tolerance {100 * tolerance:g} %")
    return True, (f"the ECE interval's upper bound {100 * ci[1]:.2f} % is not below the tolerance "
                  f"{100 * tolerance:g} %")


def _extremes(tests: Mapping[str, Mapping[str, Any]], alpha: float) -> tuple[Extreme, ...]:
    """Values at exactly 0 or 1 that an exact binomial test (T-Cal on a discrete predictor) rejects."""
    out: list[Extreme] = []
    for res in tests.values():
        if res.get("method") != "binomial" or res.get("decision") != "miscalibrated":
            continue
        values, counts, positives, pvals = (res.get(k) for k in ("values", "counts", "positives", "p_values"))
        if not (isinstance(values, list) and isinstance(counts, list) and isinstance(positives, list)
                and isinstance(pvals, list) and len(values) == len(counts) == len(positives) == len(pvals)):
            continue
        t = len(values)
        rejects = [c > 0 and min(1.0, t * p) <= alpha for c, p in zip(counts, pvals)]
        ends = [i for i, v in enumerate(values) if rejects[i] and (v <= 0.0 or v >= 1.0)]
        alone = all(not r for i, r in enumerate(rejects) if i not in ends)
        for i in ends:
            out.append(Extreme(float(values[i]), int(counts[i]), positives[i] / counts[i],
                               min(1.0, t * float(pvals[i])), alone))
        if out:
            break  # one binomial test explains it (the views of a multiclass T-Cal repeat the same values)
    return tuple(out)


def _extremes_line(extremes: tuple[Extreme, ...]) -> str:
    which = "; ".join(e.phrase() for e in extremes)
    share = "driven by" if all(e.alone for e in extremes) else "partly driven by"
    return (f"the exact binomial test's rejection is {share} {which}: at a score of exactly 0 or 1 any contrary "
            "outcome has probability 0 under calibration, whatever the ECE")


# -- the decision ---------------------------------------------------------------------------------------------
def _decide(tests: Mapping[str, Mapping[str, Any]], alpha: float) -> tuple[bool | None, list[str]]:
    """Bonferroni over the p-values; the testers' decisions when none has one; the evidence lines."""
    pvals: dict[str, float] = {}
    decided: dict[str, str] = {}
    evidence: list[str] = []
    for name, res in tests.items():
        decision = str(res.get("decision"))
        p = res.get("p_value")
        if decision in ("calibrated", "miscalibrated"):
            decided[name] = decision
            if isinstance(p, (int, float)) and math.isfinite(p):
                pvals[name] = float(p)
        evidence.append(_evidence_line(name, res, decision, p))
    if pvals:
        k = len(pvals)
        reject = min(pvals.values()) < alpha / k
        if k > 1:
            evidence.append(f"combined: min p = {min(pvals.values()):.3g} against alpha/{k} = {alpha / k:.3g} "
                            f"(Bonferroni over {k} tests)")
        calibrated: bool | None = not reject
        verdict = "miscalibrated" if reject else "calibrated"
        estimate_based = [t for t in decided if t not in pvals and decided[t] != verdict]
        if estimate_based:
            evidence.append(f"{', '.join(estimate_based)} decide(s) from an estimate against a tolerance, not a "
                            "p-value: they answer 'is the error larger than the tolerance?', a different question "
                            "from 'is there any miscalibration?', so they may disagree")
    elif decided:
        calibrated = "miscalibrated" not in decided.values()
    else:
        calibrated = None
        evidence.append("no test gave a decision: run tcal or smce for a verdict")
    return calibrated, evidence


def _evidence_line(name: str, res: Mapping[str, Any], decision: str, p: Any) -> str:
    if decision == "error":
        return f"{name}: failed ({res.get('error')})"
    if decision == "insufficient data":
        return f"{name}: insufficient data"
    ptxt = f"p = {p:.3g}" if isinstance(p, (int, float)) and math.isfinite(p) else "no p-value"
    return f"{name}: {decision} ({ptxt}, method {res.get('method', name)})"


class _Fields:
    """The fields of a grid coarsened to ``bins`` cells (default: its own), all read at once
    (:meth:`ScoreGrid.fields`; the rules below use each several times).  The same values as the coarsened
    grid's properties, in contiguous arrays, so every result is the same float."""

    __slots__ = ("bins", "count", "n", "sum_z", "sum_y", "sum_zz", "sum_zy")

    def __init__(self, g: ScoreGrid, bins: int | None = None, count: int | None = None) -> None:
        self.bins = g.bins if bins is None else bins
        self.count = g.count if count is None else count
        self.n, self.sum_z, self.sum_y, self.sum_zz, self.sum_zy = g.fields(self.bins)[0][:5]


@lru_cache(maxsize=256)
def _normal_quantile(p: float) -> float:
    """``NormalDist().inv_cdf(p)``, cached: a round asks for the same few levels in every window."""
    return NormalDist().inv_cdf(p)


# -- where and which way -------------------------------------------------------------------------------------
def _significant(g: _Fields, alpha: float) -> tuple[np.ndarray, list[bool]]:
    """Per bin: the residual sum S, and whether its z-score ``S / sqrt(sum z(1-z))`` is significant.

    A bin with a null standard deviation of at most 1e-12 has z-score ``sign(S) * inf`` when ``|S| > 1e-6``,
    else 0; the z-scores are compared with the Bonferroni normal quantile over the bins with enough events.
    Per bin in Python floats (``|S| / sd``: the magnitude of numpy's ``S / sd``, the same IEEE division).
    """
    s = g.sum_y - g.sum_z
    sd = np.sqrt(np.maximum(g.sum_z - g.sum_zz, 0.0))
    used = [c >= MIN_BIN_EVENTS for c in g.n.tolist()]
    crit = _normal_quantile(1.0 - alpha / (2 * max(sum(used), 1)))
    sig = [u and (abs(r) / d > crit if d > 1e-12 else abs(r) > 1e-6)  # inf > crit, 0 is not
           for u, r, d in zip(used, s.tolist(), sd.tolist())]
    return s, sig


def _regions(g: _Fields, alpha: float) -> tuple[Region, ...]:
    s, sig = _significant(g, alpha)
    cnt = g.n
    if not any(sig):
        return ()
    out: list[Region] = []
    i = 0
    while i < g.bins:
        if not sig[i]:
            i += 1
            continue
        j = i
        while j + 1 < g.bins and sig[j + 1] and np.sign(s[j + 1]) == np.sign(s[i]):
            j += 1
        sl = slice(i, j + 1)
        events = float(_sum(cnt[sl]))
        var = float(_sum(g.sum_z[sl] - g.sum_zz[sl]))
        tot = float(_sum(s[sl]))
        zval = tot / math.sqrt(var) if var > 1e-12 else math.copysign(math.inf, tot)
        out.append(Region(i / g.bins, (j + 1) / g.bins, "+" if tot > 0 else "-", tot / events, int(events),
                          zval if math.isfinite(zval) else math.copysign(1e9, zval)))
        i = j + 1
    return tuple(out)


def _side_sign(regions: tuple[Region, ...], lo: float, hi: float, g: _Fields) -> int | None:
    """+1 / -1 / 0 for the gap on [lo, hi); ``None`` when significant regions of both signs matter."""
    inside = [r for r in regions if r.lo >= lo and r.hi <= hi]
    if inside:
        pos = sum(r.gap * r.events for r in inside if r.sign == "+")
        neg = -sum(r.gap * r.events for r in inside if r.sign == "-")
        if min(pos, neg) >= 0.25 * (pos + neg):
            return None
        return 1 if pos > neg else -1
    a, b = int(round(lo * g.bins)), int(round(hi * g.bins))
    s = float(_sum(g.sum_y[a:b] - g.sum_z[a:b]))
    var = float(_sum(g.sum_z[a:b] - g.sum_zz[a:b]))
    if var <= 1e-12 or abs(s) / math.sqrt(var) <= 1.0:
        return 0
    return 1 if s > 0 else -1


def _direction(g: _Fields, regions: tuple[Region, ...], top_label: bool) -> Direction | None:
    if g.count == 0:
        return None
    if top_label:
        sign = _side_sign(regions, 0.0, 1.0, g)
        if sign == 0:  # the tests see what no bin shows: the overall accuracy-minus-confidence decides
            sign = 1 if float(_sum(g.sum_y)) > float(_sum(g.sum_z)) else -1
        return "under-confident" if sign == 1 else "over-confident" if sign == -1 else "mixed"
    half = g.bins // 2 if g.bins % 2 == 0 else None
    low = _side_sign(regions, 0.0, 0.5, g) if half else None
    high = _side_sign(regions, 0.5, 1.0, g) if half else None
    if low is None or high is None:
        return "mixed"
    table: dict[tuple[int, int], Direction] = {
        (1, -1): "over-confident", (0, -1): "over-confident", (1, 0): "over-confident",
        (-1, 1): "under-confident", (0, 1): "under-confident", (-1, 0): "under-confident",
        (-1, -1): "biased up", (1, 1): "biased down",
    }
    return table.get((low, high), "mixed")


# -- how much -------------------------------------------------------------------------------------------------
def _ece_ci(g: _Fields, alpha: float) -> tuple[float, tuple[float, float]]:
    """Binned l1-ECE and its conservative interval (triangle inequality, see the module docstring)."""
    n = float(g.count)
    s = g.sum_y - g.sum_z
    q = g.sum_y - 2.0 * g.sum_zy + g.sum_zz
    occupied = g.n > 0
    sigma = np.sqrt(np.maximum(q - s * s / n, 0.0))[occupied]
    total = float(_sum(np.abs(s[occupied])))
    # sum |S_i - E S_i| <= sqrt(2/pi) sum sigma_i + z sqrt((1 - 2/pi) sum sigma_i^2) w.p. >= ~1 - alpha
    # z_{1 - alpha/2}, not z_{1 - alpha}: D is right-skewed (about 1/sqrt(bins)) and sigma_i is estimated;
    # with z_{1 - alpha} the simulated coverage at ECE = 0 was 0.93-0.944 (benchmarks/verdict_coverage.py)
    slack = _HALF_NORMAL_MEAN * float(_sum(sigma)) + _normal_quantile(1.0 - alpha / 2) * math.sqrt(
        _HALF_NORMAL_VAR * float(_sum(sigma * sigma)))
    return total / n, (max(total - slack, 0.0) / n, (total + slack) / n)


_HALF_NORMAL_MEAN = math.sqrt(2.0 / math.pi)
_HALF_NORMAL_VAR = 1.0 - 2.0 / math.pi


# -- what to do -----------------------------------------------------------------------------------------------
def _recommend(direction: Direction | None, calibration: Mapping[str, Any] | None,
               calibrated: bool | None) -> str:
    held = _held_out(calibration) if calibration else None
    if held:
        return held
    if calibrated is True:
        return "no recalibration needed; keep monitoring"
    if direction is None:
        return "run the tests (tcal, smce) to decide whether a recalibrator is needed"
    return f"fit a recalibrator on recent labelled data: {RECOMMENDED[direction]}; check it on held-out data"


def _held_out(cal: Mapping[str, Any]) -> str | None:
    """The candidate with the lowest held-out NLL among those that improve, with its before/after ECE."""
    before = cal.get("before") or {}
    best: tuple[float, str, Mapping[str, Any]] | None = None
    for method, cand in (cal.get("candidates") or {}).items():
        after = cand.get("after") if isinstance(cand, Mapping) else None
        if cand.get("improves") and isinstance(after, Mapping) and _finite(after.get("nll")):
            if best is None or after["nll"] < best[0]:
                best = (float(after["nll"]), str(method), after)
    if best is None and cal.get("method") and isinstance(cal.get("after"), Mapping):
        best = (float("nan"), str(cal["method"]), cal["after"])
    if best is None:
        return "no recalibrator improved held-out NLL and ECE: collect more labelled data or check for drift"
    _, method, after = best
    if _finite(before.get("ece")) and _finite(after.get("ece")):
        return (f"recalibrate with {method}: on held-out data ECE {100 * before['ece']:.2f} % -> "
                f"{100 * after['ece']:.2f} %, NLL {before.get('nll', float('nan')):.4f} -> "
                f"{after.get('nll', float('nan')):.4f}")
    return f"recalibrate with {method} (best on held-out data)"


def _finite(x: Any) -> bool:
    return isinstance(x, (int, float)) and math.isfinite(x)


# -- in words -------------------------------------------------------------------------------------------------
_MEANING = {
    "over-confident": "the scores are too extreme (too close to 0 or 1 for what happens)",
    "under-confident": "the scores are too timid (outcomes are more extreme than predicted)",
    "biased up": "the scores are too high across the range",
    "biased down": "the scores are too low across the range",
    "mixed": "the scores are too high in some ranges and too low in others",
}


_TOP_LABEL_MEANING = {
    "over-confident": "the confidence exceeds the accuracy",
    "under-confident": "the accuracy exceeds the confidence",
    "mixed": "the confidence is too high in some ranges and too low in others",
}


def _text(calibrated: bool | None, direction: Direction | None, regions: tuple[Region, ...], ece: float | None,
          ci: tuple[float, float] | None, rec: str, n: int, alpha: float, kind: str, material: bool | None = None,
          tolerance: float = 0.0, extremes: tuple[Extreme, ...] = ()) -> str:
    if n == 0:
        return "No labelled predictions yet."
    size = "" if ece is None or ci is None else (f"ECE {100 * ece:.2f} % "
                                                f"({100 * (1 - alpha):.0f} % CI {100 * ci[0]:.2f}-{100 * ci[1]:.2f} %)")
    if calibrated is None:
        return f"No verdict (no test ran) on {n} predictions; {size}. Next: {rec}."
    if calibrated:
        caveat = ""
        if ci is not None and ci[1] > 0.05:  # failing to reject is weak evidence with few predictions
            caveat = f" Few predictions: an ECE up to {100 * ci[1]:.1f} % cannot be excluded."
        return (f"Calibrated at level {alpha:g}: no test detects miscalibration in {n} predictions; {size}."
                f"{caveat} Next: {rec}.")
    why = ""
    if extremes:
        share = "driven by" if all(e.alone for e in extremes) else "partly driven by"
        why = f" The rejection is {share} " + "; ".join(e.phrase() for e in extremes) + "."
    if material is False:
        return (f"Calibrated within tolerance: {size}, below the tolerance of {100 * tolerance:g} %; no action. "
                f"The tests reject calibration at level {alpha:g} on {n} predictions (significant but "
                f"immaterial{f', {direction}' if direction else ''}).{why}")
    first = f"Miscalibrated at level {alpha:g} on {n} predictions; {size}"
    if direction is not None:
        meaning = _TOP_LABEL_MEANING.get(direction, _MEANING[direction]) if kind == "top-label" else _MEANING[direction]
        first += f": {direction}, {meaning}"
    where = ""
    if regions:
        worst = sorted(regions, key=lambda r: -abs(r.gap) * r.events)[:3]
        parts = [f"{r.lo:.2f}-{r.hi:.2f} outcomes {'above' if r.sign == '+' else 'below'} scores by "
                 f"{100 * abs(r.gap):.1f} points" for r in worst]
        where = " Where: " + "; ".join(parts) + "."
    return f"{first}.{where}{why} Next: {rec}."
