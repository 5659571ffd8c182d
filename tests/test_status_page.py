"""Status page: rendered from a synthetic snapshot built from simulated data, checked as HTML
(self-contained, escaped, bars equal to the reliability statistics computed independently here),
then loaded in headless Chromium for DOM assertions and a screenshot saved under artifacts/."""

from __future__ import annotations

import html.parser
import math
import os
import struct
import subprocess
import tempfile
import urllib.parse
from pathlib import Path

import numpy as np
import pytest
from _deploy_helpers import ARTIFACTS, require_binary

from calmon.exporter.http import Endpoints, HTTPExporter
from calmon.exporter.status.page import PAD_TOP, SIZE, reliability_svg, render, render_model
from calmon.exporter.status.pages import StatusPages

EVIL = '<script>alert("x")</script>&co'
EVIL_URL = urllib.parse.quote(EVIL, safe="")


def reliability(z: np.ndarray, y: np.ndarray, bins: int = 20) -> list[dict]:
    """Reliability bins by a direct loop (independent of the agent's grid code)."""
    out = []
    for i in range(bins):
        lo, hi = i / bins, (i + 1) / bins
        mask = (z >= lo) & ((z < hi) if i < bins - 1 else (z <= hi))
        k = int(mask.sum())
        out.append({"bin": lo, "hi": hi, "events": k,
                    "mean_score": float(z[mask].mean()) if k else None,
                    "mean_outcome": float(y[mask].mean()) if k else None})
    return out


def snapshot() -> dict:
    rng = np.random.default_rng(3)
    evaluations = []
    for model, shift in (("fraud", 0.0), ("churn", 0.15), (EVIL, -0.1)):
        for window, n in (("1h", 2000), ("24h", 20000)):
            z = rng.beta(2, 3, size=n)
            y = (rng.random(n) < np.clip(z + shift, 0, 1)).astype(float)
            rel = reliability(z, y)
            ece = sum(b["events"] * abs(b["mean_score"] - b["mean_outcome"]) for b in rel if b["events"]) / n
            evaluations.append({
                "model": model, "segment": "all", "window": window, "n": n,
                "metrics": {"ece": ece, "accuracy": float(y.mean()), "mean_confidence": float(z.mean()),
                            "smce": ece / 2, "ece_l2_debiased": float("nan")},
                "reliability": rel,
                "tests": {"tcal": {"statistic": ece ** 2, "p_value": 0.5 if shift == 0 else 1e-4,
                                   "decision": "calibrated" if shift == 0 else "miscalibrated",
                                   "method": "tcal"},
                          "smce": {"statistic": ece / 2, "p_value": None, "decision": "insufficient data",
                                   "method": "smce"}},
            })
    evaluations.append({"model": "fraud", "segment": 'eu "west"', "window": "1h", "n": 0, "metrics": {},
                        "reliability": [{"bin": i / 20, "hi": (i + 1) / 20, "events": 0, "mean_score": None,
                                         "mean_outcome": None} for i in range(20)], "tests": {}})
    alerts = [
        {"alert": "CalibrationDrift", "model": "churn", "segment": "all", "window": "1h",
         "severity": "critical", "state": "firing", "since": 1.7e9, "value": 1e-4},
        {"alert": "CalibrationDrift", "model": EVIL, "segment": "all", "window": "24h", "severity": "warning",
         "state": "pending", "since": 1.7e9 + 60, "value": 1e-4},
        {"alert": "EceHigh", "model": "fraud", "segment": "all", "window": "24h", "severity": "warning",
         "state": "resolved", "since": 1.7e9 + 120, "value": 0.01},
    ]
    calibrators = {"churn": {"method": "temperature", "version": 3, "published_at": 1.7e9,
                             "evaluation": {"ece_before": 0.15, "ece_after": 0.02, "n": 20000}}}
    return {"generated_at": 1.7e9 + 180, "version": "0.1.0", "evaluations": evaluations, "alerts": alerts,
            "calibrators": calibrators}


class Collector(html.parser.HTMLParser):
    """Elements as (tag, attrs) plus all text."""

    def __init__(self) -> None:
        super().__init__()
        self.elements: list[tuple[str, dict[str, str]]] = []
        self.text: list[str] = []

    def handle_starttag(self, tag, attrs):
        self.elements.append((tag, dict(attrs)))

    def handle_startendtag(self, tag, attrs):
        self.elements.append((tag, dict(attrs)))

    def handle_data(self, data):
        self.text.append(data)

    def find(self, tag: str, **attrs: str) -> list[dict[str, str]]:
        def ok(a: dict[str, str]) -> bool:
            return all((v in a.get("class", "").split()) if k == "class_" else a.get(k) == v
                       for k, v in attrs.items())

        return [a for t, a in self.elements if t == tag and ok(a)]


def parse(page: str) -> Collector:
    c = Collector()
    c.feed(page)
    return c


def check_index(dom: Collector, snap: dict) -> None:
    """The overview: one row per evaluation, worst first, nothing fetched, every link relative."""
    evs = snap["evaluations"]
    scripts = dom.find("script")
    assert all("src" not in s for s in scripts) and len(scripts) <= 1  # one small inline script at most
    assert not dom.find("link") and not dom.find("iframe") and not dom.find("img")
    for _, attrs in dom.elements:  # nothing is fetched from anywhere; links stay on this server
        assert "src" not in attrs, attrs
        assert "://" not in attrs.get("href", "") and not attrs.get("href", "").startswith("/"), attrs
    rows = dom.find("tr", class_="row")
    assert sorted((r["data-model"], r["data-segment"], r["data-window"]) for r in rows) == sorted(
        (e["model"], e["segment"], e["window"]) for e in evs)
    ranks = [0 if r["data-alert"] == "firing" else 1 if r["data-alert"] == "pending" else 2 for r in rows]
    assert ranks == sorted(ranks)  # firing alerts first
    assert not dom.find("svg", class_="reliability-svg")  # diagrams are on the model pages
    text = "".join(dom.text)
    assert EVIL in text  # shown as text, not markup
    assert [r["data-state"] for r in dom.find("tr", class_="alert")] == ["firing", "pending", "resolved"]
    assert len(dom.find("tr", class_="calibrator")) == 1


def check_models(snap: dict) -> None:
    """Each model's page: its cards, bars equal to the reliability statistics."""
    evs = snap["evaluations"]
    for model in sorted({e["model"] for e in evs}):
        page = render_model(snap, model)
        assert page is not None and page.startswith("<!DOCTYPE html>") and "<script" not in page
        dom = parse(page)
        mine = sorted((e for e in evs if e["model"] == model),
                      key=lambda e: (e["segment"] != "all", e["segment"], e["window"]))
        figures = dom.find("figure", class_="reliability")
        assert [(f["data-model"], f["data-segment"], f["data-window"]) for f in figures] == [
            (e["model"], e["segment"], e["window"]) for e in mine]
        # every populated bin is a bar whose height is the observed frequency
        bars = dom.find("rect", class_="bar")
        expected = [b for e in mine for b in e["reliability"] if b["events"]]
        assert len(bars) == len(expected)
        for bar, b in zip(bars, expected):
            assert bar["data-bin"] == f"{b['bin']:.2f}" and int(bar["data-events"]) == b["events"]
            assert float(bar["height"]) / SIZE == pytest.approx(b["mean_outcome"], abs=2e-5)
            assert (float(bar["y"]) - PAD_TOP) / SIZE == pytest.approx(1 - b["mean_outcome"], abs=2e-5)
        tests = dom.find("tr", class_="test")
        missing = dom.find("tr", class_="missing")
        assert len(tests) - len(missing) == 2 * sum(1 for e in mine if e["tests"])
        if model == "fraud":  # the window without results shows both testers as missing, not nothing
            assert sorted(m["data-test"] for m in missing) == ["smce", "tcal"]
            (seg,) = dom.find("details", class_="segment")  # a segment other than all: collapsed
            assert seg["data-segment"] == 'eu "west"'
    assert render_model(snap, "no such model") is None


def test_render_is_self_contained_escaped_and_faithful():
    snap = snapshot()
    page = render(snap)
    assert page.startswith("<!DOCTYPE html>") and page.endswith("</html>")
    assert "<script>alert" not in page and "&lt;script&gt;" in page
    assert 'data-segment="eu &quot;west&quot;"' in page
    check_index(parse(page), snap)
    check_models(snap)
    assert 'content="60"' in page and 'http-equiv="refresh"' not in render(snap, refresh=None)


def test_render_edge_cases():
    empty = render({})
    assert "no evaluation yet" in empty and "no alerts" in empty and "no calibrator published" in empty
    with pytest.raises(ValueError, match="snapshot"):
        render([])  # type: ignore[arg-type]
    # non-finite and out-of-range values do not break the SVG
    svg = reliability_svg([
        {"bin": 0.0, "hi": 0.5, "mean_score": float("nan"), "mean_outcome": 1.5, "events": 3},
        {"bin": 0.5, "hi": 1.0, "mean_score": 0.7, "mean_outcome": None, "events": 3}])
    dom = parse(svg)
    (bar,) = dom.find("rect", class_="bar")
    assert float(bar["height"]) == pytest.approx(SIZE) and not dom.find("circle")
    assert all(math.isfinite(float(v)) for _, a in dom.elements for k, v in a.items()
               if k in ("x", "y", "width", "height", "cx", "cy"))


def chromium_args(user_dir: str) -> list[str]:
    return [require_binary("chromium", "chromium-browser"), "--headless", "--no-sandbox", "--disable-gpu",
            "--disable-quic", "--no-first-run", "--disable-background-networking",
            "--disable-component-update", "--disable-sync", f"--user-data-dir={user_dir}",
            "--hide-scrollbars"]


def png_size(path: Path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and data[12:16] == b"IHDR"
    return struct.unpack(">II", data[16:24])


def dump_dom(url: str, tmp_path: Path) -> Collector:
    env = {**os.environ, "HOME": str(tmp_path)}
    with tempfile.TemporaryDirectory() as user_dir:
        res = subprocess.run([*chromium_args(user_dir), "--dump-dom", url], capture_output=True, text=True,
                             timeout=90, env=env)
    assert res.returncode == 0, res.stderr[-2000:]
    return parse(res.stdout)


@pytest.mark.integration
def test_status_page_in_headless_chromium(tmp_path):
    """The pages as the agent serves them (cached per round), read by a browser: its DOM agrees with the snapshot."""
    snap = snapshot()
    pages = StatusPages(lambda: snap, lambda: "round")
    ep = Endpoints(lambda: b"", lambda: True, lambda: True, lambda: snap, render, pages=pages.serve)
    srv = HTTPExporter(ep, "127.0.0.1", 0).start()
    try:
        dom = dump_dom(f"{srv.url}/", tmp_path)
        assert dom.find("title") and "calmon status" in "".join(dom.text)
        check_index(dom, snap)  # nothing injected, nothing lost (the inline script only hides rows as one types)
        model = dump_dom(f"{srv.url}/model/{EVIL_URL}", tmp_path)  # the link of the escaped model name works
        assert [f["data-model"] for f in model.find("figure", class_="reliability")] == [EVIL, EVIL]
        assert pages.renders == 1  # one render for every request of the round

        ARTIFACTS.mkdir(exist_ok=True)
        shot = ARTIFACTS / "status_page.png"
        shot.unlink(missing_ok=True)
        env = {**os.environ, "HOME": str(tmp_path)}
        with tempfile.TemporaryDirectory() as user_dir:
            res = subprocess.run([*chromium_args(user_dir), "--window-size=1300,1800", f"--screenshot={shot}",
                                  f"{srv.url}/"], capture_output=True, text=True, timeout=90, env=env)
    finally:
        srv.stop()
    assert res.returncode == 0 and shot.exists(), res.stderr[-2000:]
    assert png_size(shot) == (1300, 1800)
    # a blank or unstyled page compresses to a few kB; the tables do not
    assert shot.stat().st_size > 30_000, shot.stat().st_size


def test_render_accepts_the_agents_shapes():
    """The agent's snapshot: RFC 3339 generated_at, calibrators with before/after error dicts, labelled."""
    snap = {"generated_at": "2026-11-21T23:00:00Z", "version": "0.1.0", "evaluations": [],
            "alerts": [{"alert": "A", "model": "m", "segment": "all", "window": "1h",
                        "severity": "info", "state": "firing", "since": 0.0, "value": None,
                        "started_at": 0.0}],
            "calibrators": {"m": {"model": "m", "method": "platt", "version": 2,
                                  "before": {"ece": 0.12, "nll": 0.7},
                                  "after": {"ece": 0.01, "nll": 0.6},
                                  "reason": None}}}
    dom = parse(render(snap))
    assert "generated 2026-11-21T23:00:00Z" in "".join(dom.text)
    (row,) = dom.find("tr", class_="calibrator")
    text = "".join(dom.text)
    assert "12.00 %" in text and "1.00 %" in text and "platt" in text
    assert [r["data-state"] for r in dom.find("tr", class_="alert")] == ["firing"]
    page = render_model(snap, "m")
    assert page is not None and " = " not in "".join(parse(page).text)  # no raw key = value dumps
    held = parse(page)
    assert [r["data-measure"] for r in held.find("tr")if "data-measure" in r] == ["ece", "nll"]
    assert "log loss" in "".join(held.text)


def overconfident_bins(n: int = 40000, temperature: float = 0.5, seed: int = 5) -> list[dict]:
    """Binary scores sharpened by a temperature < 1: the true probability is less extreme than the score."""
    rng = np.random.default_rng(seed)
    p = rng.beta(2, 2, size=n)
    logit = np.log(p / (1 - p))
    z = 1 / (1 + np.exp(-logit / temperature))
    y = (rng.random(n) < p).astype(float)
    return reliability(z, y)


def test_direction_regions_and_histogram_from_the_bins():
    from calmon.exporter.status.page import bin_regions, direction_text
    over = overconfident_bins()
    regions = bin_regions(over)
    # over-confident binary model: the low-score bins sit ABOVE the diagonal, the high-score bins BELOW
    assert regions and all(r["sign"] > 0 for r in regions if r["hi"] <= 0.5)
    assert all(r["sign"] < 0 for r in regions if r["lo"] >= 0.5)
    assert direction_text(regions, binary=True).startswith("over-confident")
    under = bin_regions(overconfident_bins(temperature=2.0))
    assert direction_text(under, binary=True).startswith("under-confident")
    rng = np.random.default_rng(9)
    z = rng.random(40000)
    assert bin_regions(reliability(z, (rng.random(40000) < z).astype(float))) == []  # calibrated: nothing
    dom = parse(reliability_svg(over, regions=regions))
    assert len(dom.find("rect", class_="region")) == len(regions)
    hist = dom.find("rect", class_="hist")
    peak = max(b["events"] for b in over)
    assert [int(h["data-events"]) for h in hist] == [b["events"] for b in over if b["events"]]
    tallest = max(float(h["height"]) for h in hist)
    for h in hist:
        assert float(h["height"]) / tallest == pytest.approx(int(h["data-events"]) / peak, abs=1e-4)


def test_plain_names_summary_freshness_and_calibrators():
    over = overconfident_bins()
    ev = {"model": "m", "segment": "all", "window": "5m", "n": 40000, "reliability": over,
          "metrics": {"ece": 0.06, "ece_l2_debiased": -1e-5, "l2_bins": 64, "mean_confidence": 0.5,
                      "base_rate": 0.5, "accuracy": 0.69},
          "tests": {"tcal": {"statistic": 1e-3, "p_value": 1e-4, "decision": "miscalibrated", "alpha": 0.01}}}
    other = {**ev, "window": "30m", "tests": {**ev["tests"], "smce": {"decision": "miscalibrated",
                                                                       "p_value": 0.001, "statistic": 0.02}}}
    snap = {"generated_at": 1000.0, "evaluations": [ev, other],
            "agent": {"windows": ["5m", "30m"], "scheduler": {"every": 15.0, "overruns": 2, "evaluations": 9,
                                                               "last_timestamp": 990.0, "last_duration": 2.5}},
            "calibrators": {"m": {"method": "platt", "version": 2, "before": {"ece": 0.13},
                                  "after": {"ece": 0.02}}}}
    page = render_model(snap, "m")
    assert page is not None
    dom = parse(page)
    text = "".join(dom.text)
    assert 'content="15"' in page  # reloads with the evaluation period
    assert "mean score" in text and "mean confidence" not in text and ">l2_bins<" not in page
    assert "not detectable" in text and "-1e-05" not in text.replace("= -1e-05", "")
    assert "last evaluation 10 s ago" in text and "2 round(s) overran" in text and "took 2.5 s" in text
    assert "over-confident" in text and dom.find("rect", class_="region")
    figs = dom.find("figure", class_="reliability")
    assert [f["data-window"] for f in figs] == ["5m", "30m"]  # the configured order, not the string order
    (missing,) = dom.find("tr", class_="missing")  # smce answered for 30m only
    assert missing["data-test"] == "smce"
    assert dom.find("th", title=next(a["title"] for t, a in dom.elements if t == "th" and "p-value:" in
                                     a.get("title", "")))
    (line,) = dom.find("p", class_="calibrator-line")
    assert "13.00 %" in text and "2.00 %" in text and "recalibrated" in text
    (cal,) = parse(render(snap)).find("tr", class_="calibrator")
    # with the verdict module's summary, its words and regions are shown (escaped) once, not the page's own
    summary = {"calibrated": False, "direction": "over-confident", "ece": 0.06, "ece_ci": [0.05, 0.07],
               "regions": [{"lo": 0.0, "hi": 0.2, "sign": 1, "gap": 0.04}], "recommendation": "fit <platt>",
               "text": "Scores are too extreme & should be softened."}
    one = {**snap, "evaluations": [{**ev, "summary": summary}]}
    dom = parse(render_model(one, "m") or "")
    text = "".join(dom.text)
    assert text.count("Scores are too extreme & should be softened.") == 1
    assert "5.00 % \u2013 7.00 %" in "".join(parse(render(one)).text)  # the interval in the overview row
    (region,) = dom.find("rect", class_="region")
    assert region["data-lo"] == "0.000" and region["data-hi"] == "0.200" and "above" in region["class"]
    # before the first round: when it runs
    text = "".join(parse(render({"agent": {"uptime_seconds": 4.0, "scheduler": {"every": 15.0}}})).text)
    assert "no evaluation yet" in text and "the first round runs about 11 s from now" in text


def test_renders_the_verdict_modules_summary():
    """The agent puts calmon.evaluate.verdict.summarize(...).to_dict() into each evaluation: rendered as is."""
    verdict = pytest.importorskip("calmon.evaluate.verdict")
    from calmon.stats.grid import ScoreGrid
    rng = np.random.default_rng(11)
    p = rng.beta(2, 2, size=30000)
    z = 1 / (1 + np.exp(-np.log(p / (1 - p)) / 0.5))
    y = (rng.random(p.size) < p).astype(float)
    grid = ScoreGrid(1024)
    grid.update(z, y)
    tests = {"tcal": {"p_value": 0.0, "decision": "miscalibrated", "statistic": 0.01}}
    summary = verdict.summarize(grid, tests, alpha=0.01).to_dict()
    ev = {"model": "m", "segment": "all", "window": "1h", "n": int(p.size), "metrics": {"ece": summary["ece"]},
          "reliability": reliability(z, y), "tests": tests, "summary": summary}
    dom = parse(render_model({"evaluations": [ev]}, "m") or "")
    text = "".join(dom.text)
    assert text.count(summary["text"]) == 1 and text.count(summary["recommendation"]) == 1  # the verdict once
    assert len(dom.find("rect", class_="region")) == len(summary["regions"]) > 0
    for rect, r in zip(dom.find("rect", class_="region"), summary["regions"]):
        assert ("above" if r["sign"] == "+" else "below") in rect["class"]
