"""Regenerate the screenshots in docs/ (never edited by hand).

    python scripts/screenshots.py            # docs/status_page.png, docs/status_model.png and docs/report.png
    python scripts/screenshots.py --only status
    python scripts/screenshots.py --only site   # docs/assets/site_home.png

* ``docs/status_page.png`` and ``docs/status_model.png``: ``calmon demo`` is started on a free port with the
  drift after 10 s; once the ``CalibrationDrift`` alert fires and a refreshed calibrator is published after the
  drift (or after ``--timeout`` seconds, whatever the agent shows then), its status page (the overview) and the
  page of the model with the firing alert (diagrams, tests, calibrator) are rendered by headless Chromium
  from the running agent.
* ``docs/report.png``: ``calmon report ... -o report.png`` on 20 000 simulated over-confident binary scores
  (temperature 0.5, seed 7): the PNG report itself (verdict, tests, metrics, diagrams, witness).

* ``docs/assets/site_home.png``: the documentation site's home page, built by ``mkdocs build --strict`` into a
  temporary directory and rendered from there (needs the ``docs`` extra).

Needs the Debian ``chromium`` package. Takes one to three minutes (the demo's rounds run every 15 s).
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
DOCS = REPO / "docs"


def chromium_shot(url: str, out: Path, width: int, height: int) -> None:
    """Screenshot of ``url`` by headless Chromium (a fresh profile, no network besides the URL)."""
    exe = shutil.which("chromium") or shutil.which("chromium-browser")
    if exe is None:
        raise SystemExit("screenshots: chromium not found (apt-get install chromium)")
    with tempfile.TemporaryDirectory() as profile:
        cmd = [exe, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-sync",
               "--disable-background-networking", "--disable-component-update", "--hide-scrollbars",
               f"--user-data-dir={profile}", f"--window-size={width},{height}", f"--screenshot={out}", url]
        res = subprocess.run(cmd, capture_output=True, text=True, timeout=120, env={**os.environ, "HOME": profile})
    if res.returncode != 0 or not out.exists():
        raise SystemExit(f"screenshots: chromium failed: {res.stderr[-2000:]}")
    print(f"wrote {out.relative_to(REPO)}")


def _get(url: str) -> bytes:
    with urllib.request.urlopen(url, timeout=30) as r:
        data: bytes = r.read()
        return data


def _loop_done(narration: list[str]) -> bool:
    """The demo said that the alert fired and that a calibrator was published after the detection
    (so it was fitted on data that contains the drift)."""
    text = "".join(narration)
    detected = text.find("calibration drift detected")
    return detected >= 0 and "is FIRING" in text and text.find("recalibration: published", detected) > detected


def status_page(timeout: float) -> None:
    cmd = [sys.executable, "-m", "calmon", "demo", "--port", "0", "--drift-after", "10", "--duration", "900"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, cwd=REPO)
    assert proc.stdout is not None
    narration: list[str] = []
    try:
        head = ""
        while "Ctrl-C" not in head:
            line = proc.stdout.readline()
            if not line:
                raise SystemExit(f"screenshots: calmon demo did not start:\n{head}")
            head += line
        m = re.search(r"status page\s+(http://\S+)/", head)
        if m is None:
            raise SystemExit(f"screenshots: no status page URL in:\n{head}")
        url, started = m.group(1), time.time()
        out = proc.stdout
        reader = threading.Thread(target=lambda: narration.extend(iter(out.readline, "")), daemon=True)
        reader.start()
        while time.time() - started < timeout and not _loop_done(narration):
            time.sleep(2.0)
        if not _loop_done(narration):
            print(f"screenshots: the loop did not complete in {timeout:.0f} s; taking the page as it is")
        time.sleep(1.0)  # the page of the round that said it
        index = _get(f"{url}/").decode()
        row = re.search(r'<tr class="row [^"]*" data-model="[^"]*"[^>]*><td><a href="([^"]+)"', index)
        detail = _get(f"{url}/{row.group(1)}").decode() if row else ""
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
    print("".join(line for line in narration if line.startswith("==>")), end="")
    with tempfile.TemporaryDirectory() as tmp:
        for name, page, height in (("status_page", index, 1100), ("status_model", detail, 2200)):
            if not page:
                continue
            html = Path(tmp) / f"{name}.html"
            html.write_text(re.sub(r'<meta http-equiv="refresh"[^>]*>', "", page), encoding="utf-8")
            chromium_shot(html.as_uri(), DOCS / f"{name}.png", 1400, height)


def report() -> None:
    rng = np.random.default_rng(7)
    p = rng.beta(2, 2, size=20000)
    z = 1 / (1 + np.exp(-np.log(p / (1 - p)) / 0.5))  # over-confident: scores more extreme than p
    y = (rng.random(p.size) < p).astype(int)
    with tempfile.TemporaryDirectory() as tmp:
        csv = Path(tmp) / "overconfident.csv"
        csv.write_text("score,label\n" + "".join(f"{a:.6f},{b}\n" for a, b in zip(z, y)))
        out = Path(tmp) / "report.png"
        res = subprocess.run([sys.executable, "-m", "calmon", "report", csv.name, "-o", out.name],
                             capture_output=True, text=True, cwd=tmp, timeout=600)
        if res.returncode != 0:
            raise SystemExit(f"screenshots: calmon report failed:\n{res.stderr[-2000:]}")
        shutil.copyfile(out, DOCS / "report.png")
        print(f"wrote {(DOCS / 'report.png').relative_to(REPO)}")


def site_home() -> None:
    """The documentation site's home page, built in a temporary directory, as docs/assets/site_home.png."""
    with tempfile.TemporaryDirectory() as site:
        res = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", site], cwd=REPO,
                             capture_output=True, text=True, timeout=1200,
                             env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})
        if res.returncode != 0:
            raise SystemExit(f"screenshots: mkdocs build failed: {res.stderr[-2000:]}")
        (DOCS / "assets").mkdir(exist_ok=True)
        chromium_shot((Path(site) / "index.html").as_uri(), DOCS / "assets" / "site_home.png", 1400, 1000)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--only", choices=("status", "report", "site"), help="regenerate one screenshot only")
    parser.add_argument("--timeout", type=float, default=300.0,
                        help="seconds to wait for the demo's alert and refreshed calibrator (default 300)")
    args = parser.parse_args(argv)
    DOCS.mkdir(exist_ok=True)
    if args.only in (None, "status"):
        status_page(args.timeout)
    if args.only in (None, "report"):
        report()
    if args.only in (None, "site"):
        site_home()
    return 0


if __name__ == "__main__":
    sys.exit(main())
