"""The verdicts of a status document as a plain-text table (``calmon run --exit-when-done``).

One row per (model, segment, window) with its labelled events, ECE with its interval, each tester's decision and the
verdict in words -- what a replay was run for, printed before the agent exits instead of vanishing with it.

Examples
--------
>>> doc = {"evaluations": [{"model": "churn", "segment": "all", "window": "1h", "n": 2000,
...         "metrics": {"ece": 0.031}, "tests": {"tcal": {"decision": "miscalibrated", "p_value": 0.0004}},
...         "summary": {"calibrated": False, "direction": "over-confident", "ece_ci": [0.02, 0.04]}}]}
>>> print(verdict_table(doc))
model  segment  window  n      ECE                  tests                        verdict
churn  all      1h      2,000  3.10% (2.00%-4.00%)  tcal miscalibrated p=0.0004  miscalibrated (over-confident)
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

__all__ = ["verdict_table", "verdict_rows"]

COLUMNS = ("model", "segment", "window", "n", "ECE", "tests", "verdict")


def _pct(v: Any) -> str:
    return f"{100 * v:.2f}%" if isinstance(v, int | float) else "-"


def _tests(tests: Mapping[str, Any]) -> str:
    out = []
    for name, t in sorted(tests.items()):
        p = t.get("p_value")
        out.append(f"{name} {t.get('decision', '?')}" + (f" p={p:.2g}" if isinstance(p, int | float) else ""))
    return ", ".join(out) or "-"


def _verdict(ev: Mapping[str, Any]) -> str:
    s = ev.get("summary") or {}
    if not s:
        return "no verdict (too few events)" if not ev.get("n") else "-"
    word = s.get("verdict") or ("calibrated" if s.get("calibrated") else "miscalibrated")
    direction = s.get("direction")
    return f"{word} ({direction})" if direction and not s.get("calibrated") else str(word)


def verdict_rows(doc: Mapping[str, Any]) -> list[tuple[str, ...]]:
    """One row of :data:`COLUMNS` per evaluation of an ``/api/status`` document."""
    rows: list[tuple[str, ...]] = []
    for ev in doc.get("evaluations", []):
        s = ev.get("summary") or {}
        ci = s.get("ece_ci")
        ece = _pct((ev.get("metrics") or {}).get("ece"))
        if isinstance(ci, Sequence) and len(ci) == 2:
            ece += f" ({_pct(ci[0])}-{_pct(ci[1])})"
        rows.append((str(ev.get("model")), str(ev.get("segment")), str(ev.get("window")), f"{int(ev.get('n') or 0):,}",
                     ece, _tests(ev.get("tests") or {}), _verdict(ev)))
    return rows


def verdict_table(doc: Mapping[str, Any]) -> str:
    """The rows of :func:`verdict_rows` under a header, columns aligned (two spaces apart)."""
    rows = [COLUMNS, *verdict_rows(doc)]
    widths = [max(len(r[i]) for r in rows) for i in range(len(COLUMNS) - 1)]
    return "\n".join("  ".join([*(c.ljust(w) for c, w in zip(r[:-1], widths)), r[-1]]).rstrip() for r in rows)
