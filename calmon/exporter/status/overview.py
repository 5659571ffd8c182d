"""The status page's overview: one row per (model, segment, window), filtered, sorted and paged.

A thousand models with four windows are 4,000 rows: the page shows one page of them (:data:`PAGE_SIZE`),
worst first (firing alerts, then rejected calibration, then the largest ECE), and the query string selects
others -- ``q`` (a substring of model, segment or window), ``verdict``, ``alert``, ``sort``, ``desc`` and
``page`` -- so the table works as plain HTML links and forms with JavaScript off.  Each row's HTML is built
once per round (:func:`overview_rows`); a query filters and sorts precomputed keys and joins at most one page
of those strings, so its cost is bounded by the number of rows, not by what the page would hold unpaged.

Examples
--------
>>> doc = {"evaluations": [
...     {"model": "fraud", "segment": "all", "window": "1h", "n": 10, "metrics": {"ece": 0.01}, "tests": {}},
...     {"model": "churn", "segment": "all", "window": "1h", "n": 900, "metrics": {"ece": 0.2}, "tests": {},
...      "summary": {"calibrated": False, "direction": "over-confident", "ece_ci": [0.15, 0.25]}}],
...     "alerts": [{"model": "churn", "segment": "all", "window": "1h", "state": "firing"}]}
>>> rows = overview_rows(doc)
>>> [r.model for r in select(rows, {}).rows]          # worst first
['churn', 'fraud']
>>> [r.model for r in select(rows, {"q": ["FRA"]}).rows], select(rows, {"verdict": ["miscalibrated"]}).total
(['fraud'], 1)
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from html import escape
from typing import Any
from urllib.parse import quote, urlencode

from calmon.exporter.status.diagram import finite, fmt_time

__all__ = ["PAGE_SIZE", "Query", "Row", "Selection", "model_href", "overview_rows", "overview_table", "select",
           "verdict_class"]

#: Rows per page of the overview (a page stays well under 100 kB).
PAGE_SIZE = 100
#: Longest filter string honoured (a longer one is cut: the filter's cost stays bounded).
MAX_QUERY = 200

#: verdict class -> (words, rank: lower sorts first)
VERDICTS: dict[str, tuple[str, int]] = {
    "miscalibrated": ("miscalibrated", 0), "error": ("tester error", 1), "unknown": ("not enough evidence", 2),
    "tolerance": ("calibrated within tolerance", 3), "calibrated": ("no evidence of miscalibration", 4)}
#: alert state -> rank (lower sorts first); rows without an alert rank last
ALERTS = {"firing": 0, "pending": 1, "resolved": 2, "inactive": 3}
#: sortable columns -> header text
COLUMNS = {"model": "model", "segment": "segment", "window": "window", "n": "n", "ece": "ECE",
           "verdict": "verdict", "change": "last change", "alert": "alert"}
_TIPS = {"n": "labelled events in the window",
         "ece": "expected calibration error with its interval (from the verdict)",
         "change": "when the model's change detectors last detected a calibration change (event time)",
         "alert": "the most urgent state of the alerts on this row"}

Query = Mapping[str, Sequence[str]]


def verdict_class(ev: Mapping[str, Any]) -> str:
    """One of :data:`VERDICTS`: from the verdict's summary, else from the testers' decisions."""
    s = ev.get("summary") if isinstance(ev.get("summary"), dict) else None
    decisions = [t.get("decision") for t in (ev.get("tests") or {}).values() if isinstance(t, dict)]
    if s is not None:
        word = str(s.get("verdict") or "")
        if "tolerance" in word:
            return "tolerance"
        if s.get("calibrated") is True:
            return "calibrated"
        if s.get("calibrated") is False:
            return "miscalibrated"
    if "miscalibrated" in decisions:
        return "miscalibrated"
    if "calibrated" in decisions:
        return "calibrated"
    return "error" if "error" in decisions else "unknown"


def model_href(model: str) -> str:
    """The model's detail page (relative: works behind a path-rewriting proxy)."""
    return "model/" + quote(model, safe="")


@dataclass(frozen=True)
class Row:
    """One overview row: the keys it is filtered and sorted by, and its HTML (built once per round)."""

    model: str
    segment: str
    window: str
    n: int
    ece: float | None
    verdict: str
    change: float | None
    alert: str
    #: lower-cased "model segment window" for the ``q`` filter
    text: str
    html: str

    def key(self, column: str) -> tuple[Any, ...]:
        """Sort key of ``column``; missing values sort last in either direction (see :func:`select`)."""
        if column == "n":
            return (self.n,)
        if column == "ece":
            return (self.ece is None, self.ece or 0.0)
        if column == "verdict":
            return (VERDICTS[self.verdict][1],)
        if column == "change":
            return (self.change is None, self.change or 0.0)
        if column == "alert":
            return (ALERTS.get(self.alert, 9),)
        return (getattr(self, column),)


def _pct(v: float | None) -> str:
    return "-" if v is None else f"{100 * v:.2f} %"


def _alert_states(alerts: Any) -> dict[tuple[str, str, str], str]:
    out: dict[tuple[str, str, str], str] = {}
    for a in alerts if isinstance(alerts, list) else []:
        if not isinstance(a, dict):
            continue
        k = (str(a.get("model", "")), str(a.get("segment", "")), str(a.get("window", "")))
        state = str(a.get("state", ""))
        if ALERTS.get(state, 9) < ALERTS.get(out.get(k, ""), 9):
            out[k] = state
    return out


def _last_changes(changes: Any) -> dict[str, tuple[float, str]]:
    """Per model: the newest detection time over its signals, with the signal and direction (tooltip)."""
    out: dict[str, tuple[float, str]] = {}
    for model, view in (changes.items() if isinstance(changes, dict) else ()):
        for signal, sig in ((view or {}).get("signals") or {}).items() if isinstance(view, dict) else ():
            last = sig.get("last") if isinstance(sig, dict) else None
            t = finite(last.get("detected_at")) if isinstance(last, dict) else None
            if isinstance(last, dict) and t is not None and (model not in out or t > out[model][0]):
                way = "outcomes above the scores" if last.get("direction") == "up" else "outcomes below the scores"
                out[str(model)] = (t, f"{signal}: {way}")
    return out


def _worst_first(r: Row) -> tuple[Any, ...]:
    return (ALERTS.get(r.alert, 9), VERDICTS[r.verdict][1], -(r.ece or 0.0), r.model, r.segment, r.window)


def overview_rows(doc: Mapping[str, Any]) -> list[Row]:
    """The rows of a status document's evaluations, each with its HTML, worst first (see the module docstring)."""
    agent = doc.get("agent") if isinstance(doc.get("agent"), dict) else {}
    alerts = _alert_states(doc.get("alerts"))
    changes = _last_changes((agent or {}).get("changes"))
    rows = []
    for ev in doc.get("evaluations") or []:
        if not isinstance(ev, dict):
            continue
        model, segment, window = (str(ev.get(k, "")) for k in ("model", "segment", "window"))
        s: dict[str, Any] = ev["summary"] if isinstance(ev.get("summary"), dict) else {}
        ece = finite((ev.get("metrics") or {}).get("ece"))
        if ece is None:
            ece = finite(s.get("ece"))
        ci = s.get("ece_ci")
        lo, hi = (finite(ci[0]), finite(ci[1])) if isinstance(ci, list) and len(ci) == 2 else (None, None)
        n = int(finite(ev.get("n")) or 0)
        verdict = verdict_class(ev)
        words = VERDICTS[verdict][0]
        direction = str(s.get("direction") or "") if verdict == "miscalibrated" else ""
        alert = alerts.get((model, segment, window), "")
        change = changes.get(model)
        interval = (f' <span class="muted">({_pct(lo)} &ndash; {_pct(hi)})</span>'
                    if lo is not None and hi is not None else "")
        html = (f'<tr class="row {verdict}" data-model="{escape(model)}" data-segment="{escape(segment)}" '
                f'data-window="{escape(window)}" data-n="{n}" data-ece="{"" if ece is None else f"{ece:.6g}"}" '
                f'data-verdict="{verdict}" data-alert="{escape(alert)}">'
                f'<td><a href="{escape(model_href(model))}">{escape(model)}</a></td>'
                f"<td>{escape(segment)}</td><td>{escape(window)}</td><td class=\"num\">{n:,}</td>"
                f'<td class="num">{_pct(ece)}{interval}</td>'
                f'<td><span class="badge {verdict}">{escape(words)}</span>'
                + (f" {escape(direction)}" if direction else "") + "</td>"
                + (f'<td title="{escape(change[1])}">{fmt_time(change[0])}</td>' if change else
                   '<td class="muted">-</td>')
                + (f'<td><span class="badge {escape(alert)}">{escape(alert)}</span></td>' if alert else
                   '<td class="muted">-</td>') + "</tr>")
        rows.append(Row(model, segment, window, n, ece, verdict, change[0] if change else None, alert,
                        f"{model} {segment} {window}".lower(), html))
    rows.sort(key=_worst_first)  # the default order, once per round: a query without sort only filters
    return rows


def _first(query: Query, name: str, default: str = "") -> str:
    v = query.get(name)
    return str(v[0])[:MAX_QUERY] if v else default


@dataclass(frozen=True)
class Selection:
    """One page of the overview: its rows, how many matched, the page number and the query that chose them."""

    rows: list[Row]
    total: int
    page: int
    pages: int
    q: str
    verdict: str
    alert: str
    sort: str
    desc: bool

    def href(self, **change: Any) -> str:
        """This selection's URL with some parameters changed (defaults are left out of the URL)."""
        params = {"q": self.q, "verdict": self.verdict, "alert": self.alert, "sort": self.sort,
                  "desc": "1" if self.desc else "", "page": str(self.page) if self.page > 1 else ""}
        params.update({k: str(v) for k, v in change.items()})
        kept = {k: v for k, v in params.items() if v and not (k == "page" and v == "1")}
        return "./" + ("?" + urlencode(kept) if kept else "")


def select(rows: Sequence[Row], query: Query, page_size: int = PAGE_SIZE) -> Selection:
    """Filter, sort and page ``rows`` by a parsed query string (unknown values are ignored)."""
    q = _first(query, "q").strip().lower()
    verdict = _first(query, "verdict")
    verdict = verdict if verdict in VERDICTS else ""
    alert = _first(query, "alert")
    alert = alert if alert in ALERTS or alert == "any" else ""
    sort = _first(query, "sort")
    sort = sort if sort in COLUMNS else ""
    desc = _first(query, "desc") in ("1", "true", "yes")
    chosen = [r for r in rows if (not q or q in r.text) and (not verdict or r.verdict == verdict)
              and (not alert or (r.alert == alert if alert != "any" else r.alert in ("firing", "pending")))]
    if sort:
        present = [r for r in chosen if r.key(sort)[0] is not True]
        missing = [r for r in chosen if r.key(sort)[0] is True]  # no ECE / no change: last either way
        present.sort(key=lambda r: (r.key(sort), r.model, r.segment, r.window), reverse=desc)
        chosen = present + missing
    pages = max(1, math.ceil(len(chosen) / page_size))
    try:
        page = min(max(1, int(_first(query, "page", "1"))), pages)
    except ValueError:
        page = 1
    return Selection(chosen[(page - 1) * page_size: page * page_size], len(chosen), page, pages, q, verdict, alert,
                     sort, desc)


_SCRIPT = """
(function(){var f=document.getElementById('filter');if(!f)return;var t=document.getElementById('overview');
f.addEventListener('input',function(){var q=f.value.toLowerCase();var rs=t.tBodies[0].rows;
for(var i=0;i<rs.length;i++){var r=rs[i];var s=(r.dataset.model+' '+r.dataset.segment+' '+r.dataset.window)
.toLowerCase();r.style.display=s.indexOf(q)<0?'none':'';}});})();
"""


def _options(name: str, chosen: str, values: dict[str, str]) -> str:
    opts = "".join(f'<option value="{escape(v)}"{" selected" if v == chosen else ""}>{escape(w)}</option>'
                   for v, w in values.items())
    return f'<select name="{name}" aria-label="{name}">{opts}</select>'


def overview_table(sel: Selection, counts: Mapping[str, int]) -> str:
    """The filter form, the counts per verdict (as filter links), one page of rows and the pager."""
    links = " ".join(f'<a class="count {v}" href="{escape(sel.href(verdict=v, page=1))}">{escape(VERDICTS[v][0])} '
                     f"<b>{counts.get(v, 0):,}</b></a>" for v in VERDICTS if counts.get(v))
    form = ('<form class="filters" method="get" action="./">'
            f'<input id="filter" name="q" value="{escape(sel.q)}" placeholder="filter model, segment, window" '
            'aria-label="filter">'
            + _options("verdict", sel.verdict, {"": "any verdict", **{k: v[0] for k, v in VERDICTS.items()}})
            + _options("alert", sel.alert, {"": "any alert state", "any": "firing or pending", "firing": "firing",
                                            "pending": "pending", "resolved": "resolved"})
            + (f'<input type="hidden" name="sort" value="{escape(sel.sort)}">' if sel.sort else "")
            + ('<input type="hidden" name="desc" value="1">' if sel.desc else "")
            + '<button type="submit">apply</button>'
            + (' <a href="./">clear</a>' if sel.q or sel.verdict or sel.alert or sel.sort else "") + "</form>")
    heads = []
    for col, text in COLUMNS.items():
        desc = not sel.desc if sel.sort == col else col in ("n", "ece", "change")  # numbers: largest first
        mark = (" &#9660;" if sel.desc else " &#9650;") if sel.sort == col else ""
        tip = f' title="{escape(_TIPS[col])}"' if col in _TIPS else ""
        heads.append(f'<th{tip}><a href="{escape(sel.href(sort=col, desc="1" if desc else "", page=1))}">'
                     f"{escape(text)}</a>{mark}</th>")
    first = (sel.page - 1) * PAGE_SIZE
    shown = (f"rows {first + 1:,}&ndash;{first + len(sel.rows):,} of {sel.total:,}" if sel.rows
             else "no row matches" if sel.total == 0 else "")
    order = ("worst first: firing alerts, then miscalibrated, then the largest ECE" if not sel.sort else
             f"sorted by {COLUMNS[sel.sort]}{', descending' if sel.desc else ''}")
    pager = []
    if sel.page > 1:
        pager.append(f'<a rel="prev" href="{escape(sel.href(page=sel.page - 1))}">&larr; previous</a>')
    if sel.pages > 1:
        pager.append(f"page {sel.page} of {sel.pages}")
    if sel.page < sel.pages:
        pager.append(f'<a rel="next" href="{escape(sel.href(page=sel.page + 1))}">next &rarr;</a>')
    body = "".join(r.html for r in sel.rows) or '<tr><td colspan="8" class="muted">no row matches</td></tr>'
    return (f'<div class="counts">{links}</div>{form}'
            f'<p class="muted" id="shown">{shown}; {order}; a model name opens its diagrams and tests</p>'
            f'<table id="overview" class="overview"><thead><tr>{"".join(heads)}</tr></thead>'
            f"<tbody>{body}</tbody></table>"
            f'<p class="pager">{" &middot; ".join(pager)}</p><script>{_SCRIPT}</script>')
