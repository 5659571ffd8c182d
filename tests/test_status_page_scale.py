"""Status page at a thousand models: the overview (filter, sort, pages), bounded size, warnings, calibrator
reasons, and ``/`` served from a per-round cache at about the cost of ``/metrics``."""

from __future__ import annotations

import html
import re
import threading
import time
import urllib.request
from dataclasses import dataclass
from urllib.parse import parse_qs, urlsplit

import pytest

from calmon.exporter.http import Endpoints, HTTPExporter
from calmon.exporter.metrics import AgentMetrics
from calmon.exporter.status.overview import PAGE_SIZE
from calmon.exporter.status.page import index_frame, render, render_model
from calmon.exporter.status.pages import StatusPages
from calmon.exporter.views import LiveView, RoundView

#: The index of a thousand models stays under this many bytes (one page of rows, bounded sections).
MAX_INDEX_BYTES = 300_000


def evaluation(i: int, segment: str, window: str) -> dict:
    """A synthetic window of model ``i``: every seventh model miscalibrated, ECE growing with i."""
    bad = i % 7 == 0
    ece = 0.001 * (i % 100) + (0.05 if bad else 0.0)
    tests = {t: {"statistic": 0.01, "p_value": 1e-4 if bad else 0.3,
                 "decision": "miscalibrated" if bad else "calibrated", "method": t} for t in ("tcal", "smce")}
    return {"model": f"model-{i:04d}", "segment": segment, "window": window, "n": 1000 + i,
            "metrics": {"ece": ece, "smce": ece / 2, "brier": 0.2, "accuracy": 0.8, "mean_confidence": 0.6},
            "reliability": [{"bin": b / 20, "hi": (b + 1) / 20, "events": 10, "mean_score": b / 20 + 0.02,
                             "mean_outcome": b / 20} for b in range(20)],
            "tests": tests,
            "summary": {"calibrated": not bad, "direction": "over-confident" if bad else None,
                        "ece": ece, "ece_ci": [ece / 2, ece * 2], "kind": "binary",
                        "text": f"verdict of model {i} in words"}}


def document(models: int, segments: tuple[str, ...] = ("all", "web"), windows: tuple[str, ...] = ("1h", "24h"),
             ) -> dict:
    evs = [evaluation(i, s, w) for i in range(models) for s in segments for w in windows]
    alerts = [{"alert": "CalibrationDrift", "model": f"model-{i:04d}", "segment": "all", "window": "1h",
               "severity": "warning", "state": "firing", "since": 1.7e9, "value": 1e-4}
              for i in range(0, models, 7)]
    cals = {f"model-{i:04d}": ({"model": f"model-{i:04d}", "method": "platt", "version": 1, "published_at": 1.7e9,
                                "before": {"ece": 0.05}, "after": {"ece": 0.01}, "reason": "improved"}
                               if i % 7 == 0 else
                               {"model": f"model-{i:04d}", "method": "none", "version": None, "before": None,
                                "after": None, "reason": "insufficient data", "published_at": None})
            for i in range(models)}
    changes = {f"model-{i:04d}": {"events": 100, "signals": {"residual": {"detections": 1, "last": {
        "direction": "up", "change_point": 1.7e9 - 60, "detected_at": 1.7e9 + i}}}} for i in range(0, models, 3)}
    return {"generated_at": 1.7e9 + 5000, "version": "test", "evaluations": evs, "alerts": alerts,
            "calibrators": cals,
            "agent": {"windows": list(windows), "changes": changes,
                      "scheduler": {"every": 30.0, "evaluations": 3, "overruns": 0, "last_timestamp": 1.7e9 + 4990,
                                    "last_duration": 2.0}}}


@dataclass
class Rows:
    """The overview's rows (their data attributes) and the pager's next link of one page."""

    rows: list[dict[str, str]]
    next: str | None


_ROW = re.compile(r'<tr class="row [^"]*"((?: data-[a-z]+="[^"]*")+)>')
_NEXT = re.compile(r'<a rel="next" href="([^"]*)">')


def rows_of(page: str) -> Rows:
    rows = [{k: html.unescape(v) for k, v in re.findall(r' (data-[a-z]+)="([^"]*)"', m)} for m in _ROW.findall(page)]
    nxt = _NEXT.search(page)
    return Rows(rows, None if nxt is None else html.unescape(nxt.group(1)))


def query_of(href: str) -> dict[str, list[str]]:
    return parse_qs(urlsplit(href).query)


def test_a_thousand_models_one_bounded_page_worst_first_every_row_reachable():
    doc = document(1000)  # 4,000 windows: the old page drew 4,000 cards with a diagram each
    page = render(doc)
    assert len(page.encode()) < MAX_INDEX_BYTES, len(page)
    first = rows_of(page)
    assert len(first.rows) == PAGE_SIZE and "reliability-svg" not in page
    # firing alerts first (every seventh model), then by ECE, largest first
    assert all(r["data-alert"] == "firing" and r["data-verdict"] == "miscalibrated" for r in first.rows)
    eces = [float(r["data-ece"]) for r in first.rows]
    assert eces == sorted(eces, reverse=True)
    seen = [(r["data-model"], r["data-segment"], r["data-window"]) for r in first.rows]
    href, pages = first.next, 1
    frame = index_frame(doc)  # what the cache keeps for the round: a query re-selects its rows
    while href is not None:  # following "next" visits every row exactly once
        got = rows_of(frame.page(query_of(href)))
        seen += [(r["data-model"], r["data-segment"], r["data-window"]) for r in got.rows]
        href, pages = got.next, pages + 1
    assert pages == 4000 // PAGE_SIZE and len(seen) == len(set(seen)) == 4000
    # bounded sections: 50 alerts, 50 calibrators, the models without one grouped by the reason
    assert page.count('<tr class="alert ') == 50 and "and 93 more" in page
    assert page.count('<tr class="calibrator"') == 50
    assert 'data-count="857"' in page and "too few labelled rows" in page
    detail = render_model(doc, "model-0007")
    assert detail is not None and detail.count('class="reliability-svg"') == 4
    assert len(detail.encode()) < 200_000


def test_filter_sort_and_page_by_query_string():
    doc = document(30)
    q = {"q": ["MODEL-001"], "verdict": ["calibrated"]}  # case-insensitive substring; model-0014 is bad
    rows = rows_of(render(doc, query=q)).rows
    assert {r["data-model"] for r in rows} == {f"model-{i:04d}" for i in range(10, 20) if i % 7}
    assert all(r["data-verdict"] == "calibrated" for r in rows)
    by_n = rows_of(render(doc, query={"sort": ["n"]})).rows
    assert [int(r["data-n"]) for r in by_n] == sorted(int(r["data-n"]) for r in by_n)
    by_n_desc = rows_of(render(doc, query={"sort": ["n"], "desc": ["1"]})).rows
    ns = [int(r["data-n"]) for r in by_n_desc]
    assert ns == sorted(ns, reverse=True) and ns[0] == 1029 and by_n[0]["data-n"] == "1000"
    firing = rows_of(render(doc, query={"alert": ["firing"]})).rows
    assert {r["data-model"] for r in firing} == {f"model-{i:04d}" for i in range(0, 30, 7)}
    # nonsense is ignored, never an error; a page past the end shows the last one
    junk = render(doc, query={"sort": ["<x>"], "page": ["999999"], "verdict": ["?"], "desc": ["x" * 10_000]})
    assert len(rows_of(junk).rows) == 120 - PAGE_SIZE and "&lt;x&gt;" not in junk
    none = render(doc, query={"q": ["no such model"]})
    assert not rows_of(none).rows and "no row matches" in none
    # with JavaScript off the table still sorts and filters: header links and a GET form
    page = render(doc)
    assert 'href="./?sort=ece&amp;desc=1"' in page and '<form class="filters" method="get"' in page


def test_warnings_banner_from_the_document():
    doc = {**document(2), "warnings": [
        {"code": "predictions_expired", "message": "1,200 predictions expired before their outcome arrived",
         "count": 1200, "setting": "join.ttl", "suggested": "21h"},
        {"code": "<odd>", "message": "something <b>else</b>"}]}
    page = render(doc)
    banner = page[page.index('<div class="warnings"'):page.index("</div>", page.index('<div class="warnings"'))]
    assert page.index('id="warnings"') < page.index('id="overview"')  # above the table
    assert "1,200 predictions expired before their outcome arrived" in banner
    assert "set <code>join.ttl</code> to <code>21h</code>" in banner and "(1,200 times)" in banner
    assert "something &lt;b&gt;else&lt;/b&gt;" in banner and 'data-code="&lt;odd&gt;"' in banner
    assert 'id="warnings"' not in render(document(2))  # no warnings: no banner


def test_calibrator_line_says_why_none_was_published():
    doc = document(8)
    none = render_model(doc, "model-0001") or ""
    assert "calibrator: <b>none</b> &mdash; too few labelled rows in the recalibration window" in none
    assert "recalibration.min_train" in none and "v-" not in none
    platt = render_model(doc, "model-0007") or ""
    assert "calibrator: <b>platt</b> version 1" in platt and "5.00 %" in platt and "1.00 %" in platt
    # a model the refit never reached
    alone = {"evaluations": [evaluation(3, "all", "1h")]}
    assert "no refit has run for this model yet" in (render_model(alone, "model-0003") or "")
    # the verdict text once on the model page, not repeated by the ECE and next-step lines
    assert platt.count("verdict of model 7 in words") == platt.count('<div class="card evaluation"') == 4


def test_pages_render_once_per_round_and_serve_the_old_round_while_rendering():
    docs: list[dict] = []
    round_key = ["r1"]
    now = [0.0]
    gate = threading.Event()
    entered = threading.Event()

    def build() -> dict:
        if docs:  # every render after the first: the test holds it open
            entered.set()
            assert gate.wait(30)
        docs.append(document(3))
        return docs[-1]

    pages = StatusPages(build, lambda: round_key[0], max_age=30.0, clock=lambda: now[0])
    first = pages.serve("/", {})
    assert [pages.serve("/", {}) is first for _ in range(5)] == [True] * 5 and pages.renders == 1
    filtered = pages.serve("/", {"q": ["model-0001"]})
    assert filtered is pages.serve("/", {"q": ["model-0001"]}) and pages.renders == 1
    round_key[0] = "r2"  # a new round: the next request renders it; the others get the old bytes meanwhile
    t = threading.Thread(target=pages.serve, args=("/", {}))
    t.start()
    assert entered.wait(30)
    assert pages.serve("/", {}) is first  # not queued behind the render
    gate.set()
    t.join(30)
    assert pages.renders == 2 and pages.serve("/", {}) is not first
    second = pages.serve("/", {})
    now[0] += 31.0  # no new round for longer than max_age: rendered again (freshness stays true)
    assert pages.serve("/", {}) is not second and pages.renders == 3
    assert pages.serve("/model/model-0002", {}) is not None and pages.serve("/model/nope", {}) is None


def _cpu_of_requests(url: str, n: int) -> float:
    t0 = time.process_time()  # the whole process: the server's threads and the client
    for _ in range(n):
        with urllib.request.urlopen(url, timeout=60) as r:
            assert r.status == 200 and r.read()
    return time.process_time() - t0


@pytest.mark.parametrize("models", [100])
def test_index_costs_about_what_metrics_costs(models):
    """#31.8: `/` reached p95 10 s under load at 100 models while `/metrics` took 0.1 s. Both are now
    rendered once per round; N requests of each cost about the same CPU (a generous ratio, no wall clock)."""
    doc = document(models, segments=("all", "web", "app"), windows=("1h", "24h", "7d", "all"))
    metrics = AgentMetrics(lambda: LiveView(ready=True))
    metrics.prepare(RoundView(scheduler={"evaluations": 1}, evaluations=doc["evaluations"],
                              state_bytes={f"model-{i:04d}": 1 for i in range(models)}))
    pages = StatusPages(lambda: doc, lambda: "one round", max_age=3600.0)
    ep = Endpoints(metrics.render, lambda: True, lambda: True, lambda: doc, render, pages=pages.serve)
    srv = HTTPExporter(ep, "127.0.0.1", 0).start()
    try:
        n = 20
        cpu_metrics = _cpu_of_requests(f"{srv.url}/metrics", n)
        cpu_index = _cpu_of_requests(f"{srv.url}/", n)  # the first request renders the round's page
        cpu_metrics = min(cpu_metrics, _cpu_of_requests(f"{srv.url}/metrics", n))
        cpu_index = min(cpu_index, _cpu_of_requests(f"{srv.url}/", n))  # each the best of two, as under load
    finally:
        srv.stop()
    assert pages.renders == 1
    print(f"{n} requests at {models} models: / {cpu_index:.3f} s CPU, /metrics {cpu_metrics:.3f} s CPU")
    assert cpu_index < 1.5 * cpu_metrics, (cpu_index, cpu_metrics)


def test_the_agent_serves_its_pages_from_the_round_cache(tmp_path):
    """Wired in the agent: `/` renders once per published round; `/model/NAME` and 404 for an unknown model."""
    import urllib.error

    from calmon.agent.runtime import Agent
    from calmon.config import build_config
    src = tmp_path / "in.jsonl"
    src.write_text("".join(f'{{"model": "m", "ts": {1767225600 + i}, "score": {0.1 + 0.8 * (i % 5) / 4}, '
                           f'"label": {i % 2}}}\n' for i in range(400)))
    cfg = build_config({"state_dir": str(tmp_path / "state"), "sources": [{"path": str(src)}],
                        "exporter": {"port": 0}, "evaluation": {"tests": [], "min_events": 10, "every": "1h"},
                        "checkpoint": {"enabled": False}}, env={})
    agent = Agent(cfg)
    agent.open()
    try:
        while agent.poll_once():
            pass
        agent.evaluate_round()
        assert agent.http is not None and agent.pages is not None
        url = agent.http.url
        bodies = [urllib.request.urlopen(f"{url}/", timeout=30).read() for _ in range(3)]
        renders = agent.pages.renders
        assert len(set(bodies)) == 1 and renders == 1 and b'data-model="m"' in bodies[0]
        detail = urllib.request.urlopen(f"{url}/model/m", timeout=30).read()
        assert b'class="reliability-svg"' in detail
        with pytest.raises(urllib.error.HTTPError) as err:
            urllib.request.urlopen(f"{url}/model/nope", timeout=30)
        assert err.value.code == 404
        agent.evaluate_round()  # a new round: rendered again on the next request
        urllib.request.urlopen(f"{url}/", timeout=30).read()
        assert agent.pages.renders == renders + 1
    finally:
        agent.close()
