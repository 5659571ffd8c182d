"""The cheaper per-window publishing (H3) gives exactly what the straightforward code gave.

Each fast path is compared with a plain reference implementation kept here (the code as it was
before: deep ``clean`` of everything, ``dataclasses.asdict``, one grid read per use, every sample
formatted by ``prometheus_client``'s ``floatToGoString``) on many random windows: binary and
multiclass, empty, small, with NaN/inf/numpy values.  Documents are compared as JSON text (float
values bit for bit through ``repr``, key order as written) and /metrics as bytes.
"""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path
from statistics import NormalDist
from typing import Any

import numpy as np
import pytest
from prometheus_client.utils import floatToGoString

from calmon.algorithms import ece
from calmon.config import EstimationConfig
from calmon.evaluate.round import SUMMARY_KEYS, assemble, window_base
from calmon.evaluate.verdict import MIN_BIN_EVENTS, Region, Summary, summarize
from calmon.exporter import rounds
from calmon.exporter.rounds import WINDOW_GAUGES, RoundPart, SeriesBudget
from calmon.exporter.views import RoundView
from calmon.formats.jsonio import clean
from calmon.state.buckets import BucketStats
from calmon.stats.grid import ScoreGrid


# -- references -----------------------------------------------------------------------------------------------
def ref_clean(x: Any) -> Any:
    if isinstance(x, float):
        return x if math.isfinite(x) else None
    if isinstance(x, dict):
        return {k if isinstance(k, str) else str(k): ref_clean(v) for k, v in x.items()}
    if isinstance(x, list | tuple | set | frozenset):
        return [ref_clean(v) for v in x]
    if isinstance(x, np.ndarray):
        return ref_clean(x.tolist())
    if isinstance(x, np.generic):
        return ref_clean(x.item())
    if isinstance(x, Path):
        return str(x)
    return x


def ref_reliability(grid: ScoreGrid, bins: int | None = None) -> list[dict[str, Any]]:
    g = grid if bins is None or bins == grid.bins else grid.coarsen(bins)
    return [{"bin": i / g.bins, "hi": (i + 1) / g.bins, "events": int(n),
             "mean_score": None if n == 0 else float(mz), "mean_outcome": None if n == 0 else float(my)}
            for i, (n, mz, my) in enumerate(zip(g.n, g.mean_z, g.mean_y))]


def ref_summary(stats: Any, l2_bins: int | None = None, top_label: bool = False) -> dict[str, Any]:
    fine = stats.fine
    n = fine.count
    out: dict[str, Any] = {"count": n, "classes": stats.classes}
    if n == 0:
        return out
    sum_y = float(fine.sum_y.sum())
    if stats.classes == 2 and not top_label:
        upper = fine.coarsen(2)
        out["accuracy"] = float(upper.sum_y[1] + (upper.n[0] - upper.sum_y[0])) / n
        out["base_rate"] = sum_y / n
        out["brier"] = ece.brier(fine)
    elif stats.classes == 2:
        out["accuracy"] = sum_y / n
        out["brier"] = ece.brier(fine)
    else:
        out["accuracy"] = sum_y / n
        out["brier"] = ece.brier_multiclass(stats.classwise)
        out["top_label_brier"] = ece.brier(fine)
        out["classwise_ece"] = ece.classwise_ece(stats.classwise)
    out["mean_confidence"] = float(fine.sum_z.sum() / n)
    out["ece"] = ece.ece_l1(stats.ece)
    l2_bins = ece.default_l2_bins(n, fine.bins) if l2_bins is None else l2_bins
    out["l2_bins"] = l2_bins
    out["ece_l2_plugin"] = ece.l2_ece_squared(fine, l2_bins, debiased=False)
    out["ece_l2_debiased"] = ece.l2_ece_squared(fine, l2_bins, debiased=True)
    return out


def ref_regions(g: ScoreGrid, alpha: float) -> list[tuple[float, float, str, float, int, float]]:
    s = g.sum_y - g.sum_z
    sd = np.sqrt(np.maximum(g.sum_z - g.sum_zz, 0.0))
    with np.errstate(divide="ignore", invalid="ignore"):
        zs = np.where(sd > 1e-12, s / sd, np.where(np.abs(s) > 1e-6, np.sign(s) * np.inf, 0.0))
    used = g.n >= MIN_BIN_EVENTS
    crit = NormalDist().inv_cdf(1.0 - alpha / (2 * max(int(used.sum()), 1)))
    sig = used & (np.abs(zs) > crit)
    out, i = [], 0
    while i < g.bins:
        if not sig[i]:
            i += 1
            continue
        j = i
        while j + 1 < g.bins and sig[j + 1] and np.sign(s[j + 1]) == np.sign(s[i]):
            j += 1
        sl = slice(i, j + 1)
        events, tot = float(g.n[sl].sum()), float(s[sl].sum())
        var = float((g.sum_z[sl] - g.sum_zz[sl]).sum())
        z = tot / math.sqrt(var) if var > 1e-12 else math.copysign(math.inf, tot)
        out.append((i / g.bins, (j + 1) / g.bins, "+" if tot > 0 else "-", tot / events, int(events),
                    z if math.isfinite(z) else math.copysign(1e9, z)))
        i = j + 1
    return out


def ref_ece_ci(g: ScoreGrid, alpha: float) -> tuple[float, list[float]]:
    n = float(g.count)
    s = g.sum_y - g.sum_z
    q = g.sum_y - 2.0 * g.sum_zy + g.sum_zz
    occupied = g.n > 0
    sigma = np.sqrt(np.maximum(q - s * s / n, 0.0))[occupied]
    total = float(np.abs(s[occupied]).sum())
    slack = math.sqrt(2.0 / math.pi) * float(sigma.sum()) + NormalDist().inv_cdf(1.0 - alpha / 2) * math.sqrt(
        (1.0 - 2.0 / math.pi) * float((sigma * sigma).sum()))
    return total / n, [max(total - slack, 0.0) / n, (total + slack) / n]


def ref_to_dict(s: Summary) -> dict[str, Any]:
    out = dataclasses.asdict(s)
    out["regions"] = [dataclasses.asdict(r) for r in s.regions]
    out["ece_ci"] = None if s.ece_ci is None else list(s.ece_ci)
    out["evidence"] = list(s.evidence)
    return out


def ref_assemble(base: dict[str, Any], bucket: BucketStats, tests: dict[str, Any], alpha: float) -> Any:
    stats = bucket.stats
    metrics = dict(base["metrics"])
    for name in ("smce", "ldtc"):
        r = tests.get(name)
        if r is not None and r.get("statistic") is not None:
            metrics[name] = r.get("estimate", r["statistic"])
    ev = {**base, "metrics": metrics, "tests": dict(tests)}
    if stats.count > 0:
        ev["summary"] = ref_to_dict(summarize(stats.fine, tests, alpha=alpha, top_label=stats.classes > 2,
                                              ece_grid=stats.ece))
    return ref_clean(ev)


def ref_window_base(bucket: BucketStats, estimation: EstimationConfig | None) -> dict[str, Any]:
    from calmon.evaluate.estimates import window_estimates
    s = ref_summary(bucket.stats)
    base = {"model": "m", "segment": "s", "window": "w", "n": bucket.stats.count,
            "metrics": {k: s[k] for k in SUMMARY_KEYS if k in s}, "reliability": ref_reliability(bucket.rel)}
    if estimation is not None:
        base.update(window_estimates(bucket, None, estimation, None, top_label=bucket.stats.classes > 2))
    return base


def _number(v: Any) -> float:
    if v is None:
        return math.nan
    try:
        return float(v)
    except (TypeError, ValueError):
        return math.nan


def ref_metrics(st: dict[str, Any], budget: SeriesBudget) -> tuple[bytes, tuple[Any, ...], dict[str, int], int]:
    """The per-round /metrics part straight from the module docstring's rules."""
    order = rounds._ORDER  # (tier, family, header) in the order families are written
    tier_of = {name: tier for tier, name, _ in order}
    rows: dict[str, list[tuple[str, str, Any]]] = {}  # model -> (family, labels, value) in window order
    ages: list[tuple[str, str, float]] = []

    def esc(v: Any) -> str:
        return str(v).replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')

    for e in st["evaluations"]:
        model = e["model"]
        labels = dict(zip(("model", "segment", "window"), (model, e["segment"], e["window"])))

        def lab(**extra: Any) -> str:
            return ",".join(f'{k}="{esc(v)}"' for k, v in sorted({**labels, **extra}.items()))

        out = rows.setdefault(model, [])
        put = out.append
        put(("calmon_window_events", lab(), e.get("n", 0)))
        for name, (fld, _) in WINDOW_GAUGES.items():
            if e.get("metrics", {}).get(fld) is not None:
                put((name, lab(), e["metrics"][fld]))
        for test, r in sorted(e.get("tests", {}).items()):
            if isinstance(r, dict) and "decision" in r:
                put(("calmon_test_statistic", lab(test=test), r.get("statistic")))
                put(("calmon_test_p_value", lab(test=test), r.get("p_value")))
                put(("calmon_test_rejected", lab(test=test), float(r.get("decision") == "miscalibrated")))
                put(("calmon_test_insufficient_data", lab(test=test), float(r.get("decision") == "insufficient data")))
                if r.get("evaluated_at") is not None:
                    put((rounds.AGE, lab(test=test), 0.0))
                    ages.append((model, lab(test=test), float(r["evaluated_at"])))
        if "predictions" in e:
            put(("calmon_window_predictions", lab(), e["predictions"]))
        for m, bounds in (e.get("estimated") or {}).items():
            for b, v in bounds.items():
                name = f"calmon_estimated_{m}" + {"value": "", "lo": "_lower", "hi": "_upper"}.get(b, "?")
                if name in tier_of:
                    put((name, lab(), v))
        for m, v in sorted((e.get("estimation_error") or {}).items()):
            put(("calmon_estimation_error", lab(metric=m), v))
        if e.get("score_drift"):
            put(("calmon_score_drift_psi", lab(), e["score_drift"].get("psi")))
            put(("calmon_score_drift_p_value", lab(), e["score_drift"].get("p_value")))
        if budget.reliability_for(e["window"]) and e.get("reliability"):
            for p in e["reliability"]:
                b = f"{p['bin']:.2f}"
                put((rounds.REL_EVENTS, lab(bin=b), p.get("events", 0)))
                if p.get("events"):
                    put((rounds.REL_SCORE, lab(bin=b), p.get("mean_score")))
                    put((rounds.REL_OUTCOME, lab(bin=b), p.get("mean_outcome")))
    kept: dict[str, set[str]] = {}
    dropped = {"model_cap": 0, "total_cap": 0}
    per_family: dict[str, int] = {}
    for model, out in rows.items():
        used, kept[model] = 0, set()
        for tier in rounds.TIERS:
            mine = [f for f, _, _ in out if tier_of[f] == tier]
            if used + len(mine) <= budget.max_series_per_model:
                kept[model].add(tier)
                used += len(mine)
                for f in mine:
                    per_family[f] = per_family.get(f, 0) + 1
            else:
                dropped["model_cap"] += len(mine)
    total, families = 0, set()
    for tier in rounds.TIERS:
        for _, name, _ in (o for o in order if o[0] == tier):
            if total + per_family.get(name, 0) <= budget.max_series:
                families.add(name)
                total += per_family.get(name, 0)
            else:
                dropped["total_cap"] += per_family.get(name, 0)
    fixed = rounds._fixed(RoundView(**st))
    text = [f.text() for f in fixed]
    series = sum(len(f.lines) for f in fixed)
    for tier, name, head in sorted(order, key=lambda o: rounds.TIERS.index(o[0])):  # served by tier
        if name == rounds.AGE:
            continue
        text.append(head)
        for model, out in rows.items():
            if tier in kept[model] and name in families:
                lines = [f"{name}{{{lab}}} {floatToGoString(_number(v))}\n" for f, lab, v in out if f == name]
                series += len(lines)
                text.extend(lines)
    age_labels = tuple((k, at) for m, k, at in ages if "details" in kept[m] and rounds.AGE in families)
    return "".join(text).encode(), age_labels, dropped, series + len(age_labels)


# -- random inputs --------------------------------------------------------------------------------------------
def _bucket(rng: np.random.Generator, classes: int, n: int) -> BucketStats:
    b = BucketStats(classes, bins=int(rng.choice([64, 256, 1024])), reservoir=0,
                    reliability_bins=int(rng.choice([10, 20, 15])))
    if n == 0:
        return b
    if classes == 2:
        z = rng.beta(0.5, 0.5, n) if rng.random() < 0.5 else rng.random(n)
        if rng.random() < 0.2:
            z = np.round(z, 1)  # scores exactly 0, 0.5 or 1: empty bins, zero variances
        y = (rng.random(n) < np.clip(z + rng.normal(0, 0.2), 0, 1)).astype(np.int64)
        b.update(score=z, labels=y, predictions=True)
    else:
        p = rng.dirichlet(np.full(classes, float(rng.choice([0.3, 1.0, 5.0]))), n)
        y = np.array([rng.choice(classes, p=row) for row in p], dtype=np.int64)
        b.update(probs=p, labels=y, predictions=True)
    return b


def _odd(rng: np.random.Generator) -> Any:
    return [math.nan, math.inf, -math.inf, -0.0, 0.0, 1e-300, 1e300, 1e6, -1e6, 2.5e6, 999999.5, -3e7,
            np.float64(0.25), np.float32(0.1), np.int64(7), np.bool_(True), 3, 0, -2, 10**7, True, False, None,
            "x", np.float64(math.nan), 10**6, 999_999, -10**6, rng.random()][int(rng.integers(0, 29))]


def _tests(rng: np.random.Generator) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name in rng.permutation(["tcal", "smce", "ldtc", "ks", 'we"ird\\n']).tolist()[:int(rng.integers(0, 5))]:
        decision = str(rng.choice(["calibrated", "miscalibrated", "insufficient data", "error"]))
        r: dict[str, Any] = {"decision": decision, "method": name, "statistic": _odd(rng), "p_value": _odd(rng)}
        if rng.random() < 0.5:
            r["estimate"] = _odd(rng)
        if rng.random() < 0.7:
            r["evaluated_at"] = 1.7e9 + rng.random()
        if rng.random() < 0.3:
            r["levels"] = np.arange(int(rng.integers(0, 4)), dtype=np.int64)
            r["detail"] = (1.0, math.nan, {3: np.float64(math.inf)})
        out[name] = r
    return out


def _windows(seed: int, count: int) -> list[tuple[BucketStats, dict[str, Any]]]:
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(count):
        classes = int(rng.choice([2, 2, 3, 5]))
        n = int(rng.choice([0, 1, 7, 60, 400, 3000]))
        out.append((_bucket(rng, classes, n), _tests(rng)))
    return out


# -- tests ----------------------------------------------------------------------------------------------------
def test_clean_matches_reference_on_odd_values() -> None:
    rng = np.random.default_rng(1)

    def doc(depth: int) -> Any:
        r = rng.random()
        if depth > 3 or r < 0.4:
            return _odd(rng)
        kids = [doc(depth + 1) for _ in range(int(rng.integers(0, 5)))]
        if r < 0.6:
            return {[f"k{i}", i, 1.5, ("t", i)][i % 4]: v for i, v in enumerate(kids)}
        if r < 0.75:
            return kids
        if r < 0.85:
            return tuple(kids)
        return np.array([_odd(rng) for _ in kids], dtype=object) if r < 0.9 else np.array(rng.random(3))

    for _ in range(500):
        d = doc(0)
        want, got = ref_clean(d), clean(d)
        assert json.dumps(got) == json.dumps(want)
        assert repr(got) == repr(want)  # the same types too (np.float64 stays, as before)
    assert clean(Path("/a")) == "/a" and clean({1, 2}) == [1, 2] and clean(frozenset()) == []


@pytest.mark.parametrize("seed", range(4))
def test_metrics_reliability_and_verdict_match_reference(seed: int) -> None:
    for bucket, _ in _windows(seed, 25):
        stats = bucket.stats
        assert json.dumps(ece.reliability(bucket.rel)) == json.dumps(ref_reliability(bucket.rel))
        assert json.dumps(ece.reliability(stats.fine, 16)) == json.dumps(ref_reliability(stats.fine, 16))
        for top in (False, True):
            assert repr(ece.summary(stats, top_label=top)) == repr(ref_summary(stats, top_label=top))
        assert repr(ece.summary(stats, l2_bins=stats.fine.bins)) == repr(ref_summary(stats, l2_bins=stats.fine.bins))
        if stats.count == 0:
            continue
        for alpha in (0.05, 0.01):
            s = summarize(stats.fine, {"t": {"decision": "miscalibrated", "p_value": 0.0}}, alpha=alpha,
                          top_label=stats.classes > 2, ece_grid=stats.ece)
            assert json.dumps(s.to_dict()) == json.dumps(ref_to_dict(s))
            assert [dataclasses.astuple(r) for r in s.regions] == ref_regions(stats.fine.coarsen(16), alpha)
            assert json.dumps([s.ece, list(s.ece_ci or ())]) == json.dumps(list(ref_ece_ci(stats.ece, alpha)))


def test_to_dict_with_regions_matches_asdict() -> None:
    s = Summary(False, "mixed", (Region(0.0, 0.25, "+", 0.1, 30, 4.5), Region(0.5, 1.0, "-", -0.2, 99, -1e9)),
                0.1, (0.05, 0.15), "r", ("a", "b"), "t", 129, 0.05, "top-label")
    assert json.dumps(s.to_dict()) == json.dumps(ref_to_dict(s))


@pytest.mark.parametrize("seed", range(4))
def test_window_base_and_assemble_match_reference(seed: int) -> None:
    for i, (bucket, tests) in enumerate(_windows(100 + seed, 25)):
        est = EstimationConfig() if i % 2 else None
        base = window_base("m", "s", "w", bucket, estimation=est)
        want_base = ref_window_base(bucket, est)
        assert json.dumps(ref_clean(base)) == json.dumps(ref_clean(want_base))
        assert json.dumps(base, allow_nan=False) == json.dumps(ref_clean(want_base))  # already clean
        for alpha in (0.05, 0.2):
            got = assemble(base, bucket, tests, alpha)
            assert json.dumps(got, allow_nan=False) == json.dumps(ref_assemble(want_base, bucket, tests, alpha))
            assert got is not base and got["metrics"] is not base["metrics"]


def _evaluation(rng: np.random.Generator, i: int) -> dict[str, Any]:
    bucket, tests = _windows(int(rng.integers(1 << 30)), 1)[0]
    ev: dict[str, Any] = dict(assemble(window_base(f"m{i % 7}" if i % 11 else 'm"\\\n', str(rng.choice(["all", "web"])),
                                                   str(rng.choice(["1h", "24h", "7d"])), bucket,
                                                   estimation=EstimationConfig() if rng.random() < 0.7 else None),
                                       bucket, tests, 0.05))
    ev["metrics"] = {**ev["metrics"], **{k: _odd(rng) for k in ("ece", "smce", "brier") if rng.random() < 0.3}}
    ev["tests"] = {**_tests(rng), "bad": "not a dict", "nodecision": {"p_value": 0.1}}
    if rng.random() < 0.3:
        ev["n"] = _odd(rng)
    if rng.random() < 0.3:
        ev["predictions"] = int(rng.integers(0, 3_000_000))
    if rng.random() < 0.3:
        ev["estimated"] = {"accuracy": {"value": _odd(rng), "lo": 0.1, "hi": 0.2, "odd": 1.0},
                           "unknown": {"value": 1.0}}
    if rng.random() < 0.3:
        ev["estimation_error"] = {"b\"rier": _odd(rng), "accuracy": 0.25}
    if rng.random() < 0.2:
        ev["score_drift"] = {"psi": _odd(rng), "p_value": None}
    if ev.get("reliability") and rng.random() < 0.3:
        ev["reliability"] = [{**p, "bin": -0.0 if j == 0 else p["bin"], "events": _odd(rng)}
                             for j, p in enumerate(ev["reliability"])]
    return ev


@pytest.mark.parametrize("seed", range(3))
def test_round_part_matches_reference(seed: int) -> None:
    rng = np.random.default_rng(seed)
    evaluations = [_evaluation(rng, i) for i in range(40)]
    st = {"evaluations": evaluations, "scheduler": {"evaluations": 3, "overruns": 1, "last_timestamp": 1.7e9},
          "state_bytes": {"m0": 12345}, "alerts": [{"alert": "a", "model": "m0", "state": "firing"}],
          "calibrators": [{"model": "m0", "method": "platt", "version": 2, "before": {"ece": 0.1}, "after": {}}]}
    budgets = [SeriesBudget(), SeriesBudget(reliability="none"), SeriesBudget(reliability="1h, 7d"),
               SeriesBudget(max_series_per_model=60), SeriesBudget(max_series_per_model=200, max_series=500),
               SeriesBudget(max_series=40), SeriesBudget(max_series=0, max_series_per_model=0)]
    for budget in budgets:
        part = RoundPart.build(RoundView(**st), budget)
        text, age_labels, dropped, series = ref_metrics(st, budget)
        assert part.text == text, budget
        assert part.age_labels == age_labels and dict(part.dropped) == dropped and part.series == series, budget
