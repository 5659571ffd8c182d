"""``calmon report``: the self-contained HTML (and PNG), every diagram bar checked against independent bins."""

from __future__ import annotations

import html.parser
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import pytest
from _deploy_helpers import ARTIFACTS
from test_status_page import chromium_args, png_size

from connectors.simulation import SimulationSpec, Simulator

BAR = re.compile(r'<g id="(?P<name>[\w-]+)-bar-(?P<i>\d+)">\s*<path d="(?P<d>[^"]+)"')


def calmon(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "calmon", *args], capture_output=True, text=True, timeout=300)


def binary_csv(path: Path, mis: str = "temperature:0.6", n: int = 5000) -> tuple[np.ndarray, np.ndarray]:
    sim = Simulator(SimulationSpec(seed=3, miscalibration=mis))
    z, y = sim._draw(n, sim.before)
    path.write_text("score,label\n" + "".join(f"{float(a)!r},{int(b)}\n" for a, b in zip(z, y)))
    return z, y.astype(float)


def independent_bins(z: np.ndarray, y: np.ndarray, bins: int = 15) -> list[tuple[int, float | None, float | None]]:
    """(events, mean score, mean outcome) per equal-width bin, straight from the raw arrays."""
    out = []
    for i in range(bins):
        inside = (z >= i / bins) & ((z < (i + 1) / bins) if i < bins - 1 else (z <= 1.0))
        out.append((int(inside.sum()), float(z[inside].mean()) if inside.any() else None,
                    float(y[inside].mean()) if inside.any() else None))
    return out


def report_data(page: str) -> dict:
    m = re.search(r"<script type=.application/json. id=.report-data.>(.*?)</script>", page, re.S)
    assert m, "no report-data block"
    return json.loads(m.group(1).replace("<\\/", "</"))


def check_page(page: str, z: np.ndarray, y: np.ndarray, panel: str = "main") -> dict:
    """The data block equals the independent bins, and every drawn bar's geometry equals its data."""
    data = report_data(page)
    bars = next(p for p in data["panels"] if p["name"] == panel)["bars"]
    for bar, (events, mz, my) in zip(bars, independent_bins(z, y), strict=True):
        assert bar["events"] == events
        if events:
            assert bar["mean_score"] == pytest.approx(mz, abs=1e-7)
            assert bar["mean_outcome"] == pytest.approx(my, abs=1e-12)
            assert bar["band_lo"] <= bar["mean_score"] <= bar["band_hi"]
    drawn = {int(m["i"]): m["d"] for m in BAR.finditer(page) if m["name"] == panel}
    assert sorted(drawn) == [i for i, b in enumerate(bars) if b["events"]]
    rects = {}
    for i, d in drawn.items():
        pts = np.array([float(v) for v in re.findall(r"-?\d+(?:\.\d+)?", d)]).reshape(-1, 2)
        rects[i] = (pts[:, 0].min(), pts[:, 0].max(), pts[:, 1].min(), pts[:, 1].max())
    # one affine map from data to SVG units for all bars: x = x0 + sx * score, height = sy * mean outcome
    ids = sorted(rects)
    (a, b) = ids[0], ids[-1]
    sx = (rects[b][0] - rects[a][0]) / (bars[b]["lo"] - bars[a]["lo"])
    x0 = rects[a][0] - sx * bars[a]["lo"]
    bottoms = {round(r[3], 2) for r in rects.values()}
    assert len(bottoms) == 1, bottoms
    sy = max((r[3] - r[2]) / bars[i]["mean_outcome"] for i, r in rects.items() if bars[i]["mean_outcome"] > 0.2)
    for i, (left, right, top, bottom) in rects.items():
        assert left == pytest.approx(x0 + sx * bars[i]["lo"], abs=0.01)
        assert right == pytest.approx(x0 + sx * bars[i]["hi"], abs=0.01)
        assert bottom - top == pytest.approx(sy * bars[i]["mean_outcome"], abs=0.01)
    return data


@pytest.fixture(scope="module")
def over_confident(tmp_path_factory):
    d = tmp_path_factory.mktemp("report")
    z, y = binary_csv(d / "scores.csv")
    out = d / "report.html"
    r = calmon("report", str(d / "scores.csv"), "-o", str(out), "--mc", "199")
    assert r.returncode == 0, r.stderr
    assert r.stderr == ""  # no progress bar without a terminal
    return out, z, y, r.stdout


def test_report_is_self_contained_and_faithful(over_confident):
    out, z, y, stdout = over_confident
    page = out.read_text()
    assert "over-confident" in stdout
    data = check_page(page, z, y)
    assert data["summary"]["direction"] == "over-confident"
    pts, w = np.array(data["witness"]["points"]), np.array(data["witness"]["w"])
    assert w[pts < 0.3].min() > 0 and w[pts > 0.7].max() < 0  # outcomes above low scores, below high ones
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:|//)|url\(\s*["']?(https?:|//)|@import""", page)
    assert page.count("<svg") == 3  # the reliability panel, the witness and the time view
    assert 'id="verdict"' in page.replace("'", '"') and "p-value (H0: calibrated)" in page


class _Dom(html.parser.HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.ids: set[str] = set()

    def handle_starttag(self, tag, attrs):
        self.ids.update(v for k, v in attrs if k == "id" and v)


@pytest.mark.integration
def test_report_in_headless_chromium(over_confident, tmp_path):
    out, z, y, _ = over_confident
    env = {**os.environ, "HOME": str(tmp_path)}
    with tempfile.TemporaryDirectory() as user_dir:
        res = subprocess.run([*chromium_args(user_dir), "--dump-dom", out.as_uri()], capture_output=True,
                             text=True, timeout=90, env=env)
    assert res.returncode == 0, res.stderr[-2000:]
    dom = _Dom()
    dom.feed(res.stdout)
    assert {"verdict", "panel-main", "witness", "report-data"} <= dom.ids
    check_page(res.stdout, z, y)  # what the browser parsed still holds every bar, where the data says
    ARTIFACTS.mkdir(exist_ok=True)
    shot = ARTIFACTS / "report.png"
    shot.unlink(missing_ok=True)
    with tempfile.TemporaryDirectory() as user_dir:
        res = subprocess.run([*chromium_args(user_dir), "--window-size=1200,1600", f"--screenshot={shot}",
                              out.as_uri()], capture_output=True, text=True, timeout=90, env=env)
    assert res.returncode == 0 and shot.exists(), res.stderr[-2000:]
    assert png_size(shot) == (1200, 1600) and shot.stat().st_size > 30_000


def test_png_report_and_calibrator_before_after(tmp_path):
    z, y = binary_csv(tmp_path / "s.csv", n=3000)
    cal = tmp_path / "cal.json"
    assert calmon("fit", str(tmp_path / "s.csv"), "--method", "platt", "-o", str(cal)).returncode == 0
    r = calmon("report", str(tmp_path / "s.csv"), "-o", str(tmp_path / "r.png"), "--tests", "none",
               "--calibrator", str(cal))
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "r.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    r = calmon("report", str(tmp_path / "s.csv"), "-o", str(tmp_path / "r.html"), "--tests", "none",
               "--calibrator", str(cal))
    data = check_page((tmp_path / "r.html").read_text(), z, y)
    after = data["panels"][0]["after"]
    bins_after = sum(b["events"] for b in after)
    assert bins_after == 3000
    gap_before = sum(abs(b["mean_outcome"] - b["mean_score"]) * b["events"] for b in data["panels"][0]["bars"]
                     if b["events"])
    gap_after = sum(abs(b["mean_outcome"] - b["mean_score"]) * b["events"] for b in after if b["events"])
    assert gap_after < 0.5 * gap_before  # Platt fixes temperature miscalibration


def test_multiclass_report_has_per_class_panels(tmp_path):
    rng = np.random.default_rng(5)
    probs = rng.dirichlet([1, 1, 1], 3000)
    labels = np.array([rng.choice(3, p=p) for p in probs])
    np.savez(tmp_path / "m.npz", probs=probs, labels=labels)
    r = calmon("report", str(tmp_path / "m.npz"), "-o", str(tmp_path / "m.html"), "--tests", "none")
    assert r.returncode == 0, r.stderr
    page = (tmp_path / "m.html").read_text()
    conf, correct = probs.max(1), (probs.argmax(1) == labels).astype(float)
    check_page(page, conf, correct)
    for k in range(3):
        check_page(page, probs[:, k], (labels == k).astype(float), panel=f"class{k}")


def test_report_bad_input_is_one_line(tmp_path):
    binary_csv(tmp_path / "s.csv", n=200)
    (tmp_path / "cal.json").write_text("{not json")
    r = calmon("report", str(tmp_path / "s.csv"), "-o", str(tmp_path / "r.html"), "--calibrator",
               str(tmp_path / "cal.json"), "--tests", "none")
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "Traceback" not in r.stderr
    assert not (tmp_path / "r.html").exists()
    assert calmon("report", str(tmp_path / "missing.csv"), "-o", str(tmp_path / "r.html")).returncode == 2
