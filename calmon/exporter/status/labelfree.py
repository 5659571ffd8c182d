"""Status-page blocks for what needs no labels: estimated beside realised metrics, score drift, detected changes.

Examples
--------
>>> ev = {"n": 50, "predictions": 200, "metrics": {"accuracy": 0.7},
...       "estimated": {"accuracy": {"value": 0.72, "lo": 0.69, "hi": 0.75}},
...       "estimation_error": {"accuracy": 0.01}, "score_drift": {"psi": 0.01, "p_value": 0.4}}
>>> html = estimates_block(ev)
>>> "outcomes in for 50 of 200 predictions" in html, "72.00 %" in html
(True, True)
>>> "CalibrationChanged" in changes_section({"m": {"events": 10, "signals": {}}}, None)
False
"""

from __future__ import annotations

from html import escape
from typing import Any

from calmon.exporter.status.diagram import finite, fmt_time

__all__ = ["changes_section", "estimates_block"]

_NAMES = {"accuracy": "accuracy", "precision": "precision", "recall": "recall", "base_rate": "base rate",
          "brier": "Brier score", "log_loss": "log loss", "roc_auc": "ROC AUC"}
_PERCENT = {"accuracy", "precision", "recall", "base_rate", "roc_auc"}
_SIGNALS = {"residual": "bias (outcomes vs scores)", "confidence": "over-/under-confidence",
            "high": "scores >= 0.8"}


def _fmt(metric: str, v: Any) -> str:
    x = finite(v)
    if x is None:
        return "-"
    return f"{100 * x:.2f} %" if metric in _PERCENT else f"{x:.4f}"


def _when(t: Any) -> str:
    return "-" if finite(t) is None else fmt_time(t)


def estimates_block(ev: dict[str, Any]) -> str:
    """Estimated (with interval) beside realised per metric, the estimation error, and the score drift."""
    est: dict[str, Any] = ev["estimated"] if isinstance(ev.get("estimated"), dict) else {}
    if not est:
        return ""
    realised = ev.get("metrics") or {}
    err: dict[str, Any] = ev["estimation_error"] if isinstance(ev.get("estimation_error"), dict) else {}
    preds, n = ev.get("predictions"), ev.get("n")
    rows = []
    for m, name in _NAMES.items():
        e = est.get(m)
        if not isinstance(e, dict):
            continue
        rows.append(f'<tr data-metric="{m}"><td>{escape(name)}</td><td class="num">{_fmt(m, e.get("value"))}</td>'
                    f'<td class="num muted">{_fmt(m, e.get("lo"))} - {_fmt(m, e.get("hi"))}</td>'
                    f'<td class="num">{_fmt(m, realised.get(m))}</td><td class="num">{_fmt(m, err.get(m))}</td></tr>')
    share = ""
    if finite(preds):
        share = (f"outcomes in for {int(n or 0):,} of {int(preds or 0):,} predictions "
                 f"({100 * (n or 0) / float(preds or 1):.0f} %); ")
    drift = ev.get("score_drift") if isinstance(ev.get("score_drift"), dict) else None
    drift_txt = ""
    if drift:
        p = finite(drift.get("p_value"))
        verdict = "the scores have shifted" if p is not None and p < 0.001 else "no shift detected"
        drift_txt = (f' Score drift against everything before this window: PSI {_fmt("psi", drift.get("psi"))}, '
                     f'p = {"-" if p is None else f"{p:.3g}"} ({verdict}).')
    return ('<details class="estimates"><summary>before the labels: estimated performance</summary>'
            f'<p class="muted">{share}estimated from every prediction\'s score and the calibrator in service; the '
            f'error is the estimate minus the realised value on the predictions whose outcomes are in.{drift_txt}</p>'
            '<table><tr><th>metric</th><th title="expected value given the scores">estimated</th>'
            '<th title="95 % prediction interval of the realised value">interval</th>'
            '<th title="on the outcomes that have arrived">realised</th><th>error</th></tr>'
            f'{"".join(rows)}</table></details>')


def changes_section(changes: Any, watermark: Any, limit: int | None = None) -> str:
    """Per model and signal: detections of a calibration change and where the last one started (event time).

    With ``limit``, the newest ``limit`` detections (by detection time) and a count of the others.
    """
    if not isinstance(changes, dict):
        return ""
    rows: list[tuple[float, str]] = []
    for model in sorted(changes):
        view = changes[model] if isinstance(changes[model], dict) else {}
        for signal, sig in sorted((view.get("signals") or {}).items()):
            last = sig.get("last") if isinstance(sig, dict) else None
            if not isinstance(last, dict):
                continue
            rows.append((-(finite(last.get("detected_at")) or 0.0),
                         f'<tr data-model="{escape(model)}" data-signal="{escape(signal)}"><td>{escape(model)}</td>'
                        f'<td title="{escape(signal)}">{escape(_SIGNALS.get(signal, signal))}</td>'
                        f'<td class="num">{int(sig.get("detections", 0))}</td>'
                        f'<td>{"outcomes above the scores" if last.get("direction") == "up" else "outcomes below"}</td>'
                        f'<td>{_when(last.get("change_point"))}</td><td>{_when(last.get("detected_at"))}</td></tr>'))
    more = ""
    if limit is not None and len(rows) > limit:
        rows.sort(key=lambda r: r[0])
        more = f'<p class="muted">and {len(rows) - limit:,} older detections (on each model\'s page)</p>'
        rows = rows[:limit]
    body = ("".join(r[1] for r in rows) if rows else
            '<tr><td colspan="6" class="muted">no change detected in any model\'s calibration</td></tr>')
    return ('<h2 id="changes">Calibration changes</h2><p class="muted">sequential detection (Page-Hinkley) on each '
            f'model\'s calibration residuals; newest event time {_when(watermark)}</p>'
            '<table class="changes"><tr><th>model</th><th>signal</th><th>detections</th><th>direction</th>'
            '<th title="where the change most likely started">change point</th><th>detected at</th></tr>'
            f"{body}</table>{more}")
