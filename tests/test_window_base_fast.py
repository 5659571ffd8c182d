"""The cheaper ``window_base`` (H4) publishes exactly the document the straightforward code published.

A reference implementation of the computation as it was is kept here -- every grid field read through its
property, ``ScoreGrid.coarsen``, ``np.clip``/``np.column_stack``/``np.unique``, the expected metrics and their
standard deviations computed separately -- and the documents of many varied windows (binary and multiclass,
empty to dense, sparse and dense grids, every share of labelled events, with and without a calibrator in
service or a score-drift reference) are compared as JSON text: floats bit for bit through ``repr``, keys in
the order written.  Likewise the verdict (``calmon.evaluate.verdict.summarize``, assemble's summary) against its grid
reader as it was, the other estimate paths, and the grid readers the fast paths are built on.
"""

from __future__ import annotations

import json
import math
from typing import Any

import numpy as np
import pytest
from scipy import special, stats

from calmon.config import EstimationConfig
from calmon.evaluate.round import SUMMARY_KEYS, window_base
from calmon.state.buckets import BucketStats
from calmon.stats.grid import FIELDS, ScoreGrid

EPS = 1e-12


# -- references: the computation as it was ------------------------------------------------------------------
def ref_clean(x: Any) -> Any:
    if isinstance(x, float):
        return x if math.isfinite(x) else None
    if isinstance(x, dict):
        return {str(k): ref_clean(v) for k, v in x.items()}
    if isinstance(x, list | tuple):
        return [ref_clean(v) for v in x]
    if isinstance(x, np.ndarray):
        return ref_clean(x.tolist())
    if isinstance(x, np.generic):
        return ref_clean(x.item())
    return x


def ref_l2(g: ScoreGrid, debiased: bool) -> float:
    counts, s, q = g.n, g.sum_y - g.sum_z, g.sum_y - 2.0 * g.sum_zy + g.sum_zz
    total = counts.sum()
    if total <= 0:
        return float("nan")
    nz = counts > 0
    num = s[nz] * s[nz] - (q[nz] if debiased else 0.0)
    return float((num / counts[nz]).sum() / total)


def ref_summary(st: Any, top_label: bool) -> dict[str, Any]:
    fine = st.fine
    n = fine.count
    out: dict[str, Any] = {"count": n, "classes": st.classes}
    if n == 0:
        return out
    brier = float((fine.sum_zz - 2.0 * fine.sum_zy + fine.sum_y).sum() / n)
    sum_y = float(fine.sum_y.sum())
    if st.classes == 2 and not top_label:
        upper = fine.coarsen(2)
        out["accuracy"] = (upper.sum_y.tolist()[1] + (upper.n.tolist()[0] - upper.sum_y.tolist()[0])) / n
        out["base_rate"] = sum_y / n
        out["brier"] = brier
    elif st.classes == 2:
        out["accuracy"] = sum_y / n
        out["brier"] = brier
    else:
        cw = st.classwise
        out["accuracy"] = sum_y / n
        out["brier"] = float((cw.sum_zz - 2.0 * cw.sum_zy + cw.sum_y).sum() / cw.n[0].sum())
        out["top_label_brier"] = brier
        out["classwise_ece"] = float(np.mean(np.abs(cw.sum_y - cw.sum_z).sum(axis=1) / cw.n.sum(axis=1)))
    out["mean_confidence"] = float(fine.sum_z.sum() / n)
    e = st.ece
    out["ece"] = float(np.abs(e.sum_y - e.sum_z).sum() / e.count) if e.count else float("nan")
    m = max(n, 2) ** 0.4
    l2_bins = int(min(2 ** max(int(np.floor(np.log2(m))), 1), fine.bins))
    out["l2_bins"] = l2_bins
    g = fine.coarsen(l2_bins)
    out["ece_l2_plugin"], out["ece_l2_debiased"] = ref_l2(g, False), ref_l2(g, True)
    return out


def ref_reliability(g: ScoreGrid) -> list[dict[str, Any]]:
    return [{"bin": i / g.bins, "hi": (i + 1) / g.bins, "events": int(n),
             "mean_score": None if n == 0 else float(mz), "mean_outcome": None if n == 0 else float(my)}
            for i, (n, mz, my) in enumerate(zip(g.n, g.mean_z, g.mean_y))]


def ref_cells(g: ScoreGrid) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    n = g.n
    keep = np.flatnonzero(n)
    n = n[keep]
    return n, g.sum_z[keep] / n, g.sum_zz[keep] / n, keep


def ref_auc(n: np.ndarray, pos: np.ndarray) -> np.ndarray:
    neg = n[:, None] - pos
    below_neg = np.cumsum(neg, axis=0) - neg
    return ((pos * below_neg).sum(0) + 0.5 * (pos * neg).sum(0)) / np.maximum(pos.sum(0) * neg.sum(0), EPS)


def ref_metrics(n: np.ndarray, z: np.ndarray, zz: np.ndarray, pos: np.ndarray, above: np.ndarray) -> np.ndarray:
    total = n.sum()
    zc = np.clip(z, EPS, 1 - EPS)
    log_neg = np.log1p(-zc)
    w = np.empty((4, n.size))
    w[0], w[1], w[2], w[3] = 1.0, above, 1 - 2 * z, np.log(zc) - log_neg
    p_tot, tp, brier_pos, ll_pos = w @ pos
    n_above = float(n @ w[1])
    tn = (total - n_above) - (p_tot - tp)
    brier = (brier_pos + float(n @ zz)) / total
    log_loss = -(ll_pos + float(n @ log_neg)) / total
    with np.errstate(invalid="ignore", divide="ignore"):
        precision = np.where(n_above > 0, tp / n_above, np.nan)
        recall = np.where(p_tot > 0, tp / p_tot, np.nan)
    return np.vstack([(tp + tn) / total, precision, recall, p_tot / total, brier, log_loss, ref_auc(n, pos)])


def ref_auc_sd(n: np.ndarray, q: np.ndarray) -> float:
    pos = n * q
    neg = n - pos
    p, m = float(pos.sum()), float(neg.sum())
    pn = max(p * m, EPS)
    below_neg = np.cumsum(neg) - neg
    above_pos = p - np.cumsum(pos)
    auc = float((pos * (below_neg + 0.5 * neg)).sum()) / pn
    grad = (below_neg - above_pos + 0.5 * (neg - pos) - auc * (m - p)) / pn
    return float(np.sqrt((grad * grad * pos * (1 - q)).sum()))


def ref_sd(n: np.ndarray, z: np.ndarray, q: np.ndarray, above: np.ndarray) -> np.ndarray:
    total = float(n.sum())
    pos = n * q
    v = pos * (1 - q)
    zc = np.clip(z, EPS, 1 - EPS)
    w = np.empty((2, n.size))
    w[0], w[1] = 1.0, above
    (_, p_all, var_all), (n_above, tp, var_tp) = (w @ np.stack([n, pos, v], axis=1)).tolist()
    fn, var_fn = p_all - tp, var_all - var_tp
    recall_var = (fn**2 * var_tp + tp**2 * var_fn) / max(tp + fn, EPS) ** 4
    brier_var, ll_var = (v @ np.stack([(1 - 2 * z) ** 2, np.log((1 - zc) / zc) ** 2], axis=1)).tolist()
    return np.sqrt(np.maximum([var_all / total**2, var_tp / max(n_above, EPS) ** 2, recall_var, var_all / total**2,
                               brier_var / total**2, ll_var / total**2, ref_auc_sd(n, q) ** 2], 0.0))


METRICS = ("accuracy", "precision", "recall", "base_rate", "brier", "log_loss", "roc_auc")


def ref_inputs(g: ScoreGrid, threshold: float, cal: Any) -> tuple[np.ndarray, ...]:
    n, z, zz, keep = ref_cells(g)
    q = np.clip(np.asarray(cal(z) if cal is not None else z, dtype=np.float64), 0.0, 1.0)
    return n, z, zz, q, z >= threshold, keep


def ref_estimated(g: ScoreGrid, threshold: float, cal: Any, level: float) -> dict[str, dict[str, float]]:
    if g.count == 0:
        return {}
    n, z, zz, q, above, _ = ref_inputs(g, threshold, cal)
    expected = ref_metrics(n, z, zz, (n * q)[:, None], above)[:, 0]
    half = float(stats.norm.ppf(1 - (1 - level) / 2)) * ref_sd(n, z, q, above)
    lo, hi = expected - half, expected + half
    return {m: {"value": float(expected[i]), "lo": float(lo[i]), "hi": float(hi[i])} for i, m in enumerate(METRICS)}


def ref_estimation_error(g: ScoreGrid, threshold: float, cal: Any) -> dict[str, float]:
    if g.count == 0:
        return {}
    n, z, zz, q, above, keep = ref_inputs(g, threshold, cal)
    vals = ref_metrics(n, z, zz, np.column_stack([n * q, np.rint(g.sum_y[keep])]), above)
    return {m: float(vals[i, 0] - vals[i, 1]) for i, m in enumerate(METRICS)}


def ref_merge_small(r: np.ndarray, c: np.ndarray, minimum: float = 5.0) -> tuple[np.ndarray, np.ndarray]:
    share = (r + c) / (r.sum() + c.sum())
    need = minimum / max(min(r.sum(), c.sum()), 1.0)
    groups, acc, gid = np.empty(r.size, np.int64), 0.0, 0
    for i, s in enumerate(share):
        groups[i] = gid
        acc += s
        if acc >= need:
            gid, acc = gid + 1, 0.0
    if acc > 0 and gid > 0:
        groups[groups == gid] = gid - 1
    k = int(groups.max()) + 1
    return np.bincount(groups, r, minlength=k), np.bincount(groups, c, minlength=k)


def ref_score_drift(ref: ScoreGrid, cur: ScoreGrid, bins: int) -> dict[str, Any]:
    nr, nc = ref.count, cur.count
    rn, cn = ref.n, cur.n
    cum = np.cumsum(rn) / rn.sum()
    cuts = np.unique(np.searchsorted(cum, np.arange(1, bins) / bins, side="left") + 1)
    cuts = cuts[(cuts > 0) & (cuts < rn.size)]
    starts = np.concatenate(([0], cuts))
    r, c = np.add.reduceat(rn, starts), np.add.reduceat(cn, starts)
    rs, cs = np.maximum(r / nr, 1e-4), np.maximum(c / nc, 1e-4)
    psi = float(np.sum((cs - rs) * np.log(cs / rs)))
    r, c = ref_merge_small(r, c)
    doc: dict[str, Any] = {"psi": psi, "statistic": 0.0, "df": 0, "p_value": 1.0, "n_reference": nr, "n_current": nc}
    if r.size >= 2:
        pooled = (r + c) / (nr + nc)
        er, ec = pooled * nr, pooled * nc
        stat = float(np.sum((r - er) ** 2 / er) + np.sum((c - ec) ** 2 / ec))
        df = int(r.size - 1)
        doc.update(statistic=stat, df=df, p_value=float(special.chdtrc(df, stat)))
    return doc


def ref_window_base(b: BucketStats, cfg: EstimationConfig | None, ref: ScoreGrid | None, cal: Any,
                    min_events: int) -> dict[str, Any]:
    st = b.stats
    top = st.classes > 2
    s = ref_summary(st, top)
    doc: dict[str, Any] = {"model": "m", "segment": "s", "window": "w", "n": st.count,
                           "metrics": ref_clean({k: s[k] for k in SUMMARY_KEYS if k in s}),
                           "reliability": ref_reliability(b.rel)}
    if cfg is None or not cfg.enabled:
        return doc
    pred = b.pred
    out: dict[str, Any] = {"predictions": pred.count}
    threshold = 0.0 if top else cfg.threshold
    est = ref_estimated(pred, threshold, cal, cfg.level)
    if est:
        out["estimated"] = est
    fine = st.fine
    if fine.count >= max(min_events, 1):
        out["estimation_error"] = ref_estimation_error(fine.coarsen(min(fine.bins, pred.bins)), threshold, cal)
    if ref is not None and pred.count >= min_events and ref.count >= min_events:
        out["score_drift"] = ref_score_drift(ref, pred, cfg.drift_bins)
    doc.update(ref_clean(out))
    return doc


# -- windows ----------------------------------------------------------------------------------------------------
CALIBRATORS: list[Any] = [
    None,
    lambda s: 0.9 * s + 0.03,
    lambda s: np.clip(1.3 * s - 0.15, -0.2, 1.2),  # leaves [0, 1]: clipped
    lambda s: np.where(s < 0.3, -0.0, s),  # a negative zero where it maps a score to 0
]


def make_window(seed: int) -> tuple[BucketStats, ScoreGrid | None, Any, int, EstimationConfig]:
    rng = np.random.default_rng(seed)
    classes = 2 if seed % 5 else int(rng.integers(3, 6))
    n = 0 if seed % 17 == 0 else int(np.exp(rng.uniform(0, np.log(8000))))
    bins = int(rng.choice([64, 256, 1024]))
    b = BucketStats(classes, bins=bins, reservoir=int(rng.choice([0, 256])))
    k = int(n * rng.choice([0.0, 0.3, 0.7, 1.0]))
    if classes == 2:
        a, c = rng.uniform(0.3, 5.0, 2)
        z = rng.beta(a, c, n)
        if seed % 11 == 0:
            z[: n // 3] = rng.choice([0.0, 0.5, 1.0], n // 3)  # scores on cell edges and at the ends
        logit = np.log(np.clip(z, 1e-9, 1) / np.clip(1 - z, 1e-9, 1))
        y = (rng.uniform(size=n) < 1 / (1 + np.exp(-logit / rng.uniform(0.5, 2.0)))).astype(np.int64)
        if k:
            b.update(score=z[:k], labels=y[:k], predictions=True)
        if k < n:
            b.update_predictions(score=z[k:])
        hist = z
    else:
        probs = rng.dirichlet(np.full(classes, rng.uniform(0.3, 3.0)), n)
        y = np.array([rng.choice(classes, p=p) for p in probs], dtype=np.int64)
        if k:
            b.update(probs=probs[:k], labels=y[:k], predictions=True)
        if k < n:
            b.update_predictions(probs=probs[k:])
        hist = probs.max(axis=1)
    ref = None
    if seed % 3:
        other = BucketStats(2, bins=bins, reservoir=0)
        extra = int(rng.choice([0, 50, 3000, 60_000]))
        other.update_predictions(score=np.concatenate([hist, rng.beta(2, 3, extra)]))
        ref = other.pred - b.pred
    cal = CALIBRATORS[seed % len(CALIBRATORS)]
    min_events = int(rng.choice([1, 30, 100]))
    cfg = EstimationConfig(threshold=float(rng.choice([0.5, 0.3])), level=float(rng.choice([0.95, 0.8])),
                           drift_bins=int(rng.choice([10, 4, 20])))
    return b, ref, cal, min_events, cfg


@pytest.mark.parametrize("chunk", range(6))
def test_documents_identical_to_reference(chunk: int) -> None:
    for seed in range(chunk * 40, (chunk + 1) * 40):  # 240 windows in all
        b, ref, cal, min_events, cfg = make_window(seed)
        for est in (cfg, None) if seed % 9 == 0 else (cfg,):
            want = json.dumps(ref_window_base(b, est, ref, cal, min_events))
            got = json.dumps(window_base("m", "s", "w", b, estimation=est, reference=ref, predictor=cal,
                                         min_events=min_events))
            assert got == want, f"window {seed} differs"


def test_float_path_of_large_windows(monkeypatch: pytest.MonkeyPatch) -> None:
    """Windows of 2**23 events or more sum the fine grid's float fields (their integer totals are not
    guaranteed to give the same floats): the same documents."""
    from calmon.algorithms import ece
    monkeypatch.setattr(ece, "_EXACT_EVENTS", 0)
    for seed in range(0, 240, 4):
        b, ref, cal, min_events, cfg = make_window(seed)
        want = json.dumps(ref_window_base(b, cfg, ref, cal, min_events))
        got = json.dumps(window_base("m", "s", "w", b, estimation=cfg, reference=ref, predictor=cal,
                                     min_events=min_events))
        assert got == want, f"window {seed} differs"


def test_reference_is_sensitive() -> None:
    """The comparison can fail: a last-bit change in one estimate shows in the JSON text."""
    b, ref, cal, min_events, cfg = make_window(1)
    doc = ref_window_base(b, cfg, ref, cal, min_events)
    v = doc["estimated"]["log_loss"]["value"]
    doc["estimated"]["log_loss"]["value"] = float(np.nextafter(v, 2.0))
    got = window_base("m", "s", "w", b, estimation=cfg, reference=ref, predictor=cal, min_events=min_events)
    assert json.dumps(got) != json.dumps(doc)


# -- the grid readers the fast path is built on -----------------------------------------------------------------
@pytest.mark.parametrize("seed", range(40))
def test_fields_and_occupied_match_the_properties(seed: int) -> None:
    rng = np.random.default_rng(seed)
    bins = int(rng.choice([16, 64, 256, 1024]))
    channels = None if seed % 4 else int(rng.integers(2, 4))
    g = ScoreGrid(bins, channels)
    n = int(rng.choice([0, 1, 5, 40, 300, 5000]))
    shape = (n,) if channels is None else (n, channels)
    g.update(rng.beta(0.7, 0.9, shape), (rng.uniform(size=shape) < 0.4).astype(np.float64))
    if seed % 3 == 0 and n:
        g = g + g - g  # a sparse grid after a subtraction, or dense
    coarse = [b for b in (bins, bins // 4, 2, 1) if b >= 1]
    for b, f in zip(coarse, g.fields(*coarse)):
        c = g.coarsen(b)
        assert f.flags.c_contiguous
        for i, name in enumerate(FIELDS):
            assert np.array_equal(f[i], getattr(c, name).ravel())
        cells, occ = g.occupied(b)
        keep = np.flatnonzero(c.n.ravel())
        assert np.array_equal(cells, keep)
        assert occ.flags.c_contiguous
        for i, name in enumerate(FIELDS):
            assert np.array_equal(occ[i], getattr(c, name).ravel()[keep])
    with pytest.raises(ValueError):
        g.fields(3)
    with pytest.raises(ValueError):
        g.occupied(3)


# -- the verdict (assemble's summary) ---------------------------------------------------------------------------
class RefFields:
    """The verdict's grid reader as it was: the grid coarsened, then each field read through its property."""

    def __init__(self, g: ScoreGrid, bins: int | None = None, count: int | None = None) -> None:
        if bins is not None and bins != g.bins:
            g = g.coarsen(bins)
        self.bins, self.count = g.bins, g.count
        self.n, self.sum_z, self.sum_y, self.sum_zz, self.sum_zy = g.n, g.sum_z, g.sum_y, g.sum_zz, g.sum_zy


VERDICT_TESTS: list[dict[str, dict[str, Any]]] = [
    {},
    {"tcal": {"decision": "calibrated", "p_value": 0.41, "statistic": 0.001, "method": "tcal"},
     "smce": {"decision": "miscalibrated", "p_value": 0.003, "statistic": 0.02, "estimate": 0.018}},
    {"tcal": {"decision": "insufficient data", "p_value": None}},
    {"tcal": {"decision": "miscalibrated", "p_value": 1e-9, "statistic": 0.05, "method": "tcal"}},
    {"ece": {"decision": "miscalibrated", "statistic": 0.2}},
]


@pytest.mark.parametrize("chunk", range(3))
def test_verdict_identical_to_reference(chunk: int, monkeypatch: pytest.MonkeyPatch) -> None:
    from calmon.evaluate import verdict
    for seed in range(chunk * 40, (chunk + 1) * 40):
        b, *_ = make_window(seed)
        st = b.stats
        for i, tests in enumerate(VERDICT_TESTS):
            bins = (16, 16, 7, 1024, 2)[(seed + i) % 5]  # 7 does not divide: the grid as it is
            kw: dict[str, Any] = {"alpha": (0.05, 0.01)[i % 2], "top_label": st.classes > 2, "bins": bins,
                                  "ece_grid": st.ece if i % 2 else None}
            got = json.dumps(verdict.summarize(st.fine, tests, **kw).to_dict())
            with monkeypatch.context() as m:
                m.setattr(verdict, "_Fields", RefFields)
                want = json.dumps(verdict.summarize(st.fine, tests, **kw).to_dict())
            assert got == want, f"window {seed}, tests {i}"


@pytest.mark.filterwarnings("ignore:All-NaN slice:RuntimeWarning")  # a metric undefined in every draw
@pytest.mark.parametrize("seed", range(12))
def test_other_estimate_paths_identical(seed: int) -> None:
    """The bootstrap intervals, the expected and the realised metrics share the rewritten ``_metrics``."""
    from calmon.algorithms import estimate
    b, _, cal, _, _ = make_window(seed * 7 + 1)
    pred, fine = b.pred, b.stats.fine
    for g in (pred, fine):
        if g.count == 0:
            assert estimate.expected_metrics(g) == {} and estimate.realised_metrics(g) == {}
            continue
        n, z, zz, q, above, keep = ref_inputs(g, 0.5, cal)
        want = ref_metrics(n, z, zz, (n * q)[:, None], above)[:, 0]
        assert json.dumps(estimate.expected_metrics(g, calibrator=cal)) == json.dumps(
            {m: float(want[i]) for i, m in enumerate(METRICS)})
        real = ref_metrics(n, z, zz, np.rint(g.sum_y[keep])[:, None], above)[:, 0]
        assert json.dumps(estimate.realised_metrics(g)) == json.dumps(
            {m: float(real[i]) for i, m in enumerate(METRICS)})
        rng = np.random.default_rng(3)
        pos = rng.binomial(n.astype(np.int64)[:, None], q[:, None], size=(n.size, 40))
        a = (1 - 0.95) / 2
        lo, hi = np.nanquantile(ref_metrics(n, z, zz, pos, above), [a, 1 - a], axis=1)
        got = estimate.estimate_performance(g, calibrator=cal, draws=40, seed=3)
        assert json.dumps({m: e.to_dict() for m, e in got.items()}) == json.dumps(
            {m: {"value": float(want[i]), "lo": float(lo[i]), "hi": float(hi[i])} for i, m in enumerate(METRICS)})
        got = estimate.estimate_performance(g, calibrator=cal, level=0.9)
        assert json.dumps({m: e.to_dict() for m, e in got.items()}) == json.dumps(ref_estimated(g, 0.5, cal, 0.9))
