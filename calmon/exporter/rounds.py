"""The per-round part of ``/metrics``: rendered once per evaluation round, within a series budget.

Everything that changes only when a round is published -- per-window gauges, tester results,
label-free estimates, reliability diagrams, alerts, calibrators, scheduler counters, state bytes
-- is rendered to Prometheus text (format 0.0.4, the same number formatting as
``prometheus_client``) once, by :meth:`RoundPart.build`, and served as cached bytes; a scrape
adds only the live counters (:mod:`calmon.exporter.metrics`) and the test ages.

Tiers and where they are served
-------------------------------
Per-window series fall in tiers, kept in this order: ``core`` (events and the metric gauges, 8 per window),
``tests`` (per tester: p-value and rejected), ``estimates`` (the window's predictions and the label-free
estimates: ``headline`` -- the point estimates, the accuracy interval, the accuracy estimation error and the
score drift, 12 -- or ``full``, up to 30), ``details`` (per tester: statistic, insufficient data, age),
``reliability`` (3 x ``evaluation.reliability_bins``, 60 by default).

A plain ``/metrics`` serves the live part, the round's fixed families and the tiers of :data:`DEFAULT_COLLECT`
(``core`` and ``tests``: what the dashboard's time series and the alert rules read, 14 series a window with
three testers); ``/metrics?collect[]=estimates&collect[]=details&collect[]=reliability`` serves the named tiers
alone -- the shipped Prometheus configuration scrapes them as a second job (``calmon-detail``) every minute, the
round's period.  This is node_exporter's ``collect[]``: an operator drops or slows a job instead of losing the
whole export, and the main scrape stays small (about 3 MB at 200 models x 3 rings x 4 windows).

Series budget
-------------
* **Per window** (``exporter.max_series_per_window``, 40 in the agent's configuration): a
  (model, segment, window) keeps ``core``, ``tests``, ``estimates`` and ``details``, in order, while they fit;
  a tier that does not fit is dropped whole for that window, and so is every tier after it.  With
  the default three testers and headline estimates a window has 8 + 6 + 13 + 9 = 36 series.
* **Reliability diagrams** are outside the per-window cap: ``exporter.reliability`` chooses the
  windows whose diagram is exported (``all``, ``none`` or a comma-separated list of window names;
  the agent's ``longest`` is resolved by the configuration to the longest configured window).
  Every diagram is always served in full by ``/api/status``.
* **Per model and in total**: a model keeps the tiers, in order, while its series fit
  ``exporter.max_series_per_model``; then the whole export keeps families, in that order, while
  the total fits ``exporter.max_series`` (a family is kept or dropped for every model alike: no
  alphabetical favourites).

Dropped series are counted by reason (``window_cap``, ``model_cap``, ``total_cap``) in
``calmon_metrics_series_over_budget{reason}`` (last round) and ``calmon_metrics_series_dropped_total``
(summed over rounds).  :class:`SeriesBudget` itself defaults to no per-window cap and full estimates
(the library's neutral setting); the agent's defaults are those of :class:`calmon.config.schema.ExporterConfig`.

Examples
--------
>>> ev = {"model": "m", "segment": "all", "window": "1h", "n": 5, "metrics": {"ece": 0.1},
...       "tests": {"tcal": {"statistic": 0.0, "p_value": 0.5, "decision": "calibrated", "evaluated_at": 100.0}}}
>>> part = RoundPart.build(RoundView(evaluations=[ev]), SeriesBudget())
>>> 'calmon_ece{model="m",segment="all",window="1h"} 0.1' in part.render(None, now=130.0).decode()
True
>>> part.render(["details"], now=130.0).decode().splitlines()[-1]
'calmon_test_age_seconds{model="m",segment="all",test="tcal",window="1h"} 30.0'
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from prometheus_client.utils import floatToGoString

from calmon.evaluate.types import Evaluation
from calmon.exporter.views import RoundView

__all__ = ["DEFAULT_COLLECT", "TIERS", "WINDOW_GAUGES", "RoundPart", "RoundRenderer", "SeriesBudget", "as_number"]

#: Evaluation metrics exported per (model, segment, window): metric name -> key in ``evaluation["metrics"]``.
WINDOW_GAUGES: dict[str, tuple[str, str]] = {
    "calmon_ece": ("ece", "15-bin equal-width l1-ECE (Guo et al. 2017)"),
    "calmon_ece_l2_debiased": ("ece_l2_debiased",
                               "Debiased squared l2-ECE at the adaptive dyadic scale (T-Cal eq. 6)"),
    "calmon_smce": ("smce", "Smooth calibration error (Blasiok et al. 2023)"),
    "calmon_ldtc": ("ldtc", "Lower distance to calibration (Blasiok et al. 2023)"),
    "calmon_brier_score": ("brier", "Brier score"),
    "calmon_accuracy": ("accuracy", "Accuracy (binary: 0.5 threshold; multiclass: top-1)"),
    "calmon_mean_confidence": ("mean_confidence", "Mean score (binary) or mean top-label confidence"),
}
#: Label-free estimates exported per window: ``calmon_estimated_<metric>`` (+ ``_lower``/``_upper``).
ESTIMATED = ("accuracy", "precision", "recall", "base_rate", "brier", "log_loss", "roc_auc")
#: The estimate whose interval and estimation error ``estimates: headline`` keeps (CBPE's headline, as NannyML's
#: estimated-performance plot: the point estimates of the others are kept, their bounds are in ``/api/status``).
HEADLINE = "accuracy"
ESTIMATE_SETS = ("headline", "full", "none")
TIERS = ("core", "tests", "estimates", "details", "reliability")
#: The tiers a plain ``/metrics`` serves (with the live part and the round's fixed families); the others are
#: served at ``/metrics?collect[]=TIER`` (a second scrape job, as node_exporter's ``collect[]``).
DEFAULT_COLLECT = ("core", "tests")
AGE = "calmon_test_age_seconds"
REL_EVENTS, REL_SCORE, REL_OUTCOME = (f"calmon_reliability_{k}" for k in ("events", "mean_score", "mean_outcome"))
WIN = ("model", "segment", "window")


@dataclass(frozen=True)
class SeriesBudget:
    """How much per-window detail ``/metrics`` carries (see the module docstring).

    Parameters
    ----------
    reliability
        Windows whose reliability diagram is exported: ``all``, ``none``, comma-separated window names, or a
        tuple of window names (taken literally: ``("all",)`` is the window ``all`` alone).
    max_series_per_model, max_series
        Caps per model and in total.
    max_series_per_window
        Cap of the ``core``, ``tests`` and ``estimates`` tiers per (model, segment, window); ``None``: no cap.
    estimates
        ``headline`` (point estimates, the accuracy interval and estimation error, the score drift),
        ``full`` (every bound and every estimation error) or ``none``.
    """

    reliability: str | tuple[str, ...] = "all"
    max_series_per_model: int = 5000
    max_series: int = 200_000
    max_series_per_window: int | None = None
    estimates: str = "full"
    #: The windows of ``reliability`` (``None``: every window).
    _diagrams: frozenset[str] | None = field(init=False, repr=False, compare=False, default=None)

    def __post_init__(self) -> None:
        if self.estimates not in ESTIMATE_SETS:
            raise ValueError(f"estimates must be one of {', '.join(ESTIMATE_SETS)}, got {self.estimates!r}")
        r = self.reliability
        names = (None if r == "all" else frozenset() if r == "none" else frozenset(r) if isinstance(r, tuple)
                 else frozenset(w.strip() for w in r.split(",")))
        object.__setattr__(self, "_diagrams", names)

    def reliability_for(self, window: str) -> bool:
        return self._diagrams is None or window in self._diagrams


def _esc(v: Any) -> str:
    v = str(v)
    if "\\" not in v and "\n" not in v and '"' not in v:
        return v
    return v.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _labels(names: Sequence[str], values: Sequence[Any]) -> str:
    """Label pairs sorted by name, as prometheus_client writes them."""
    return ",".join(f'{k}="{_esc(v)}"' for k, v in sorted(zip(names, values)))


def _fmt(v: Any) -> str:
    """The sample value as prometheus_client writes it (``1.0``, ``NaN``, ``1e-05``)."""
    if type(v) is float and -1e6 < v < 1e6:  # repr, as floatToGoString gives below 1e6 (NaN fails the test)
        return repr(v)
    return str(floatToGoString(as_number(v)))


def as_number(v: Any) -> float:
    """A sample value: the number, or NaN for None and what does not convert (the live and the round part)."""
    if v is None:
        return math.nan
    try:
        return float(v)
    except (TypeError, ValueError):
        return math.nan


class _Family:
    """One metric family's header and sample lines (counters get ``_total``, as prometheus_client writes)."""

    def __init__(self, name: str, doc: str, kind: str = "gauge") -> None:
        self.name = f"{name}_total" if kind == "counter" else name
        self.head = f"# HELP {self.name} {doc}\n# TYPE {self.name} {kind}\n"
        self.lines: list[str] = []

    def add(self, labels: str, value: Any) -> None:
        self.lines.append(f"{self.name}{{{labels}}} {floatToGoString(as_number(value))}\n" if labels
                          else f"{self.name} {floatToGoString(as_number(value))}\n")

    def text(self) -> str:
        return self.head + "".join(self.lines)


def _line(head: str, labels: str, v: Any) -> str:
    """One sample line (``head`` is the family name and ``{``): :func:`_fmt` inlined for the common cases (a float
    or an int below 1e6, which prometheus_client writes as ``repr(float(v))``)."""
    if (t := type(v)) is float and -1e6 < v < 1e6:
        return f"{head}{labels}}} {v!r}\n"
    if t is int and -1e6 < v < 1e6:
        return f"{head}{labels}}} {float(v)!r}\n"
    return f"{head}{labels}}} {_fmt(v)}\n"


def _families() -> dict[str, _Family]:
    fams: dict[str, _Family] = {"calmon_window_events": _Family("calmon_window_events", "Labeled events in the window")}
    fams.update({n: _Family(n, doc) for n, (_, doc) in WINDOW_GAUGES.items()})
    fams["calmon_window_predictions"] = _Family("calmon_window_predictions",
                                                "Predictions in the window, with or without outcome")
    for name, doc in (("calmon_test_p_value", "Tester p-value (NaN when it has none)"),
                      (AGE, "Seconds since the tester result was computed"),  # rendered per scrape
                      ("calmon_test_rejected", "1 = miscalibrated"),
                      ("calmon_test_insufficient_data", "1 = the tester had too little data"),
                      ("calmon_test_statistic", "Tester statistic")):
        fams[name] = _Family(name, doc)
    for m in ESTIMATED:
        for suffix, doc in (("", ""), ("_lower", ", interval lower bound"), ("_upper", ", interval upper bound")):
            n = f"calmon_estimated_{m}{suffix}"
            fams[n] = _Family(n, f"Label-free estimate of {m.replace('_', ' ')}{doc} (CBPE from the window's scores "
                                 "and the calibrator in service)")
    fams["calmon_estimation_error"] = _Family("calmon_estimation_error", "Estimate minus realised metric on the "
                                              "predictions whose outcomes have arrived")
    fams["calmon_score_drift_psi"] = _Family("calmon_score_drift_psi", "Population stability index of the window's "
                                             "scores against everything before it")
    fams["calmon_score_drift_p_value"] = _Family("calmon_score_drift_p_value",
                                                 "Chi-square test of an unchanged score distribution")
    for k in ("mean_score", "mean_outcome", "events"):
        n = f"calmon_reliability_{k}"
        fams[n] = _Family(n, f"Reliability diagram: {k.replace('_', ' ')} per bin")
    return fams


def _tier(name: str) -> str:
    """The tier of a per-window family (module docstring)."""
    if name in ("calmon_test_p_value", "calmon_test_rejected"):
        return "tests"
    if name.startswith("calmon_test_"):
        return "details"
    if "reliability" in name:
        return "reliability"
    if any(s in name for s in ("estimat", "drift")) or name == "calmon_window_predictions":
        return "estimates"
    return "core"


#: The per-window families in the order they are written: (tier, name, header), fixed for every round.
_ORDER: tuple[tuple[str, str, str], ...] = tuple((_tier(name), name, fam.head) for name, fam in _families().items())
#: The same order, tiers first (the order the series budget keeps families in).
_BY_TIER = tuple(sorted(_ORDER, key=lambda o: TIERS.index(o[0])))
_HEADS = {name: name + "{" for _, name, _ in _ORDER}
_GAUGES = tuple((name, fld) for name, (fld, _) in WINDOW_GAUGES.items())
#: metric -> bound of ``evaluation["estimated"]`` -> family.
_ESTIMATED_NAMES = {m: {b: f"calmon_estimated_{m}{suffix}" for b, suffix in (("value", ""), ("lo", "_lower"),
                                                                           ("hi", "_upper"))} for m in ESTIMATED}
_NO_NAMES: dict[str, str] = {}
_REL = (REL_EVENTS, REL_SCORE, REL_OUTCOME)


#: One window's samples of one tier before the per-window cap: (family, labels, value).
_Pending = list[tuple[str, str, Any]]


class _WindowPart:
    """One window's samples, rendered once and kept while the round republishes the same evaluation.

    The per-window cap is applied here (it depends on the window alone); the per-model and total caps are
    decided per round from :attr:`counts`.  ``evaluation`` is held so that the cache's key, the evaluation's
    identity, cannot be reused by another object while the part is cached.
    """

    __slots__ = ("ages", "counts", "diagram", "evaluation", "model", "rel", "text", "window_cap")

    def __init__(self, e: Evaluation, budget: SeriesBudget) -> None:
        self.evaluation = e
        self.model = model = e["model"]
        win = (model, e["segment"], e["window"])
        key = _labels(WIN, win)
        ms, wl = key.rsplit(",", 1)  # labels sort as bin < metric < model < segment < test < window
        core: _Pending = [("calmon_window_events", key, e.get("n", 0))]
        metrics = e.get("metrics", {})
        for name, fld in _GAUGES:
            v = metrics.get(fld)
            if v is not None:
                core.append((name, key, v))
        tests: _Pending = []
        details: _Pending = []
        my_ages: list[tuple[str, float]] = []
        for test, r in sorted(e.get("tests", {}).items()):
            if not isinstance(r, dict) or "decision" not in r:
                continue
            k = f'{ms},test="{_esc(test)}",{wl}'
            decision = r.get("decision")
            tests.append(("calmon_test_p_value", k, r.get("p_value")))
            tests.append(("calmon_test_rejected", k, 1.0 if decision == "miscalibrated" else 0.0))
            details.append(("calmon_test_statistic", k, r.get("statistic")))
            details.append(("calmon_test_insufficient_data", k, 1.0 if decision == "insufficient data" else 0.0))
            if r.get("evaluated_at") is not None:
                my_ages.append((k, float(r["evaluated_at"])))  # counted with the details, rendered per scrape
        estimates = _estimates(e, key, budget.estimates)
        if "predictions" in e:
            estimates.insert(0, ("calmon_window_predictions", key, e["predictions"]))
        #: tier -> family -> series; family -> this window's sample lines
        self.counts: dict[str, dict[str, int]] = {}
        self.text: dict[str, str] = {}
        self.ages: list[tuple[str, float]] = []
        self.window_cap = 0
        # the per-window cap: tiers in order while they fit; the first that does not ends the window's export
        cap = budget.max_series_per_window
        used = 0
        text = self.text
        for tier, pending in (("core", core), ("tests", tests), ("estimates", estimates), ("details", details)):
            n = len(pending) + (len(my_ages) if tier == "details" else 0)
            if cap is not None and used + n > cap:
                cap = used  # nothing after a dropped tier either: the tiers stay in order
                self.window_cap += n
                continue
            used += n
            if not n:
                continue
            counts = self.counts[tier] = {}
            for name, labels, v in pending:
                # _line inlined for the common case (a float below 1e6: repr, as prometheus_client writes it)
                line = (f"{name}{{{labels}}} {v!r}\n" if type(v) is float and -1e6 < v < 1e6
                        else _line(name + "{", labels, v))
                prev = text.get(name)
                if prev is None:
                    text[name], counts[name] = line, 1
                else:
                    text[name], counts[name] = prev + line, counts[name] + 1
            if tier == "details" and my_ages:
                counts[AGE] = len(my_ages)
                self.ages = my_ages
        #: the exported reliability diagram (window labels, points) and its rendered families (on first use)
        self.diagram: tuple[str, Sequence[Mapping[str, Any]]] | None = None
        self.rel: dict[str, str] = {}
        points = e.get("reliability")
        if budget.reliability_for(e["window"]) and points:
            self.diagram = (key, points)
            full = sum(1 for p in points if p.get("events"))
            self.counts["reliability"] = {REL_EVENTS: len(points), REL_SCORE: full, REL_OUTCOME: full}

    def reliability(self, name: str) -> str:
        """The diagram's lines of family ``name`` (formatted only if the budget keeps them: most are not)."""
        got = self.rel.get(name)
        if got is None:
            got = ""
            if self.diagram is not None:
                key, points = self.diagram
                head = _HEADS[name]
                parts = []
                for point in points:
                    events = point.get("events")
                    if name != REL_EVENTS and not events:
                        continue
                    v = (point.get("events", 0) if name == REL_EVENTS
                         else point.get("mean_score") if name == REL_SCORE else point.get("mean_outcome"))
                    parts.append(_line(head, f'bin="{point["bin"]:.2f}",' + key, v))
                got = "".join(parts)
            self.rel[name] = got
        return got


class _ModelPart:
    """One model's windows: series per tier and family, the per-model cap, and its lines per family (joined
    from its windows' on first use), kept while none of its windows changed."""

    __slots__ = ("counts", "kept", "lines", "model_cap", "windows")

    def __init__(self, windows: tuple[_WindowPart, ...], budget: SeriesBudget) -> None:
        self.windows = windows
        counts: dict[str, dict[str, int]] = {tier: {} for tier in TIERS}
        for w in windows:
            for tier, fams in w.counts.items():
                into = counts[tier]
                for name, n in fams.items():
                    into[name] = into.get(name, 0) + n
        self.counts = counts
        # the per-model cap: tiers in order while they fit (a tier that does not fit is dropped, later ones may fit)
        self.kept: set[str] = set()
        self.model_cap = 0
        used = 0
        for tier in TIERS:
            n = sum(counts[tier].values())
            if used + n <= budget.max_series_per_model:
                self.kept.add(tier)
                used += n
            else:
                self.model_cap += n
        self.lines: dict[str, str] = {}

    def text(self, tier: str, name: str) -> str:
        got = self.lines.get(name)
        if got is None:
            if tier == "reliability":
                got = "".join([w.reliability(name) for w in self.windows])
            else:
                got = "".join([w.text.get(name, "") for w in self.windows])
            self.lines[name] = got
        return got


class RoundRenderer:
    """Renders the round part of every round, re-rendering only the windows whose evaluation changed.

    The evaluator publishes an unchanged window's evaluation again as the same object (evaluations are never
    mutated once published), so a window's rendered samples are kept, keyed by its evaluation's identity, and a
    model's joined lines while none of its windows changed -- as a Prometheus exporter caches its collector's
    output.  A round then costs in proportion to the windows that changed, plus a pass over the models to apply
    the per-model and total caps; the output is byte-identical to :meth:`RoundPart.build` (a renderer without a
    cache).  One renderer serves one budget; calls to :meth:`build` must not overlap (the caller serialises them).
    """

    def __init__(self, budget: SeriesBudget) -> None:
        self.budget = budget
        self._windows: dict[int, _WindowPart] = {}
        self._models: dict[Any, _ModelPart] = {}
        #: windows rendered by the last :meth:`build` (the others came from the cache)
        self.rendered = 0

    def build(self, view: RoundView) -> RoundPart:
        """The round part of ``view`` (built by :func:`calmon.agent.views.round_state`)."""
        budget = self.budget
        old, windows = self._windows, {}
        by_model: dict[Any, list[_WindowPart]] = {}
        order: list[_WindowPart] = []
        rendered = 0
        for e in view.evaluations:
            w = old.get(id(e))
            if w is None or w.evaluation is not e:
                w = _WindowPart(e, budget)
                rendered += 1
            windows[id(e)] = w
            order.append(w)
            got = by_model.get(w.model)
            if got is None:
                by_model[w.model] = [w]
            else:
                got.append(w)
        models: dict[Any, _ModelPart] = {}
        for model, ws in by_model.items():
            mp = self._models.get(model)
            if mp is None or len(mp.windows) != len(ws) or any(a is not b for a, b in zip(mp.windows, ws)):
                mp = _ModelPart(tuple(ws), budget)
            models[model] = mp
        self._windows, self._models, self.rendered = windows, models, rendered
        dropped = {"window_cap": sum(w.window_cap for w in order), "model_cap": 0, "total_cap": 0} \
            if budget.max_series_per_window is not None else {"model_cap": 0, "total_cap": 0}
        # the total cap: families in tier order while the series of every model's kept tiers fit
        per_family: dict[str, int] = {}
        for mp in models.values():
            dropped["model_cap"] += mp.model_cap
            for tier in mp.kept:
                for name, n in mp.counts[tier].items():
                    per_family[name] = per_family.get(name, 0) + n
        total = 0
        families = set()
        for _, name, _ in _BY_TIER:
            n = per_family.get(name, 0)
            if total + n <= budget.max_series:
                families.add(name)
                total += n
            else:
                dropped["total_cap"] += n
        fixed = _fixed(view)
        series = sum(len(f.lines) for f in fixed)
        out: dict[str, list[str]] = {t: [] for t in TIERS}
        for tier, name, head in _ORDER:
            if name == AGE:
                continue
            out[tier].append(head)
            if name not in families:
                continue
            for mp in models.values():
                if tier in mp.kept:
                    n = mp.counts[tier].get(name, 0)
                    if n:
                        series += n
                        out[tier].append(mp.text(tier, name))
        age_labels = tuple(a for w in order if "details" in models[w.model].kept for a in w.ages) \
            if AGE in families else ()
        return RoundPart("".join(f.text() for f in fixed).encode(), {t: "".join(v).encode() for t, v in out.items()},
                         age_labels, dropped, series + len(age_labels))


def _estimates(e: Evaluation, key: str, which: str) -> _Pending:
    """The window's label-free estimates: every bound (``full``), or the headline set (module docstring)."""
    out: _Pending = []
    if which == "none":
        return out
    full = which == "full"
    for m, bounds in (e.get("estimated") or {}).items():
        names = _ESTIMATED_NAMES.get(m, _NO_NAMES)
        for b, v in bounds.items():
            name = names.get(b)
            if name is not None and (full or b == "value" or m == HEADLINE):
                out.append((name, key, v))
    for m, v in sorted((e.get("estimation_error") or {}).items()):
        if full or m == HEADLINE:
            out.append(("calmon_estimation_error", f'metric="{_esc(m)}",{key}', v))  # metric < model in label order
    drift = e.get("score_drift")
    if drift:
        out.append(("calmon_score_drift_psi", key, drift.get("psi")))
        out.append(("calmon_score_drift_p_value", key, drift.get("p_value")))
    return out


@dataclass(frozen=True)
class RoundPart:
    """The rendered per-round families: the fixed ones, each tier's, and the test ages' labels for the live part."""

    fixed: bytes = b""
    tiers: Mapping[str, bytes] = field(default_factory=dict)
    age_labels: tuple[tuple[str, float], ...] = ()
    dropped: Mapping[str, int] = field(default_factory=dict)
    series: int = 0

    @property
    def text(self) -> bytes:
        """Every family of the round (the fixed ones, then every tier's), test ages aside."""
        return self.fixed + b"".join(self.tiers.get(t, b"") for t in TIERS)

    def render(self, collect: Sequence[str] | None, now: float) -> bytes:
        """The plain ``/metrics`` round part (``collect`` None: the fixed families and :data:`DEFAULT_COLLECT`), or
        the tiers named by ``collect`` alone (``/metrics?collect[]=...``); the test ages with ``details``."""
        names = DEFAULT_COLLECT if collect is None else collect
        out = [self.fixed] if collect is None else []
        out += [self.tiers.get(t, b"") for t in TIERS if t in names]
        if "details" in names:
            out.append(self.ages(now))
        return b"".join(out)

    @classmethod
    def build(cls, view: RoundView, budget: SeriesBudget) -> RoundPart:
        """Render the round's families from ``view`` (built by :func:`calmon.agent.views.round_state`), every window
        anew (:class:`RoundRenderer` keeps the windows that did not change from one round to the next)."""
        return RoundRenderer(budget).build(view)

    def ages(self, now: float) -> bytes:
        """``calmon_test_age_seconds``: now minus each result's ``evaluated_at`` (rendered per scrape)."""
        fam = _Family(AGE, "Seconds since the tester result was computed")
        for labels, at in self.age_labels:
            fam.add(labels, max(0.0, now - at))
        return fam.text().encode()


def _fixed(view: RoundView) -> tuple[_Family, ...]:
    """The round's families outside the series budget: scheduler, state bytes, alerts, calibrators."""
    sched = view.scheduler
    total = _Family("calmon_evaluations", "Evaluation rounds completed", "counter")
    total.add("", sched.get("evaluations", 0))
    over = _Family("calmon_evaluation_overruns", "Rounds that exceeded the time budget", "counter")
    over.add("", sched.get("overruns", 0))
    last = _Family("calmon_last_evaluation_timestamp_seconds", "End of the last evaluation round")
    last_ts = sched.get("last_timestamp")
    if last_ts is not None:
        last.add("", last_ts)
    mem = _Family("calmon_state_bytes", "Bytes held by the windowed statistics")
    for model, n in sorted(view.state_bytes.items()):
        mem.add(_labels(("model",), (model,)), n)
    alert = _Family("calmon_alert_active", "1 while the alert is firing")
    for a in view.alerts:
        alert.add(_labels(("alert", "model", "segment", "window", "severity"),
                          [a.get(k, "") for k in ("alert", "model", "segment", "window", "severity")]),
                  1.0 if a.get("state") == "firing" else 0.0)
    cal_v = _Family("calmon_calibrator_version", "Version of the published calibrator")
    cal_e = _Family("calmon_calibrator_error", "Calibration error before/after the calibrator")
    for c in view.calibrators:
        cal_v.add(_labels(("model", "method"), (c["model"], c["method"])), c.get("version"))
        for stage, errors in (("before", c.get("before")), ("after", c.get("after"))):
            for metric, v in sorted((errors or {}).items()):
                cal_e.add(_labels(("model", "method", "stage", "metric"), (c["model"], c["method"], stage, metric)), v)
    return (total, over, last, mem, alert, cal_v, cal_e)
