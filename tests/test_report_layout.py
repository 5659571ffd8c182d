"""The report page (PNG/SVG): complete -- verdict, tests table, metrics table, diagrams -- and unclipped (every
text inside the figure, every table text inside its cell); the smCE witness drawn on its own scale where it
carries information, else left out with the reason; with ``--calibrator`` the verdicts before and after."""

from __future__ import annotations

import html
import re
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("matplotlib")

import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.table import Table  # noqa: E402
from matplotlib.text import Text  # noqa: E402

from calmon.cli import build_parser  # noqa: E402


def binary_csv(path: Path, temperature: float, n: int = 6000, seed: int = 7) -> Path:
    """Scores sharpened (T < 1: over-confident) or not (T = 1: calibrated) around true probabilities."""
    rng = np.random.default_rng(seed)
    p = rng.beta(2, 2, size=n)
    z = 1 / (1 + np.exp(-np.log(p / (1 - p)) / temperature))
    y = (rng.random(n) < p).astype(int)
    path.write_text("score,label\n" + "".join(f"{a:.6f},{b}\n" for a, b in zip(z, y)))
    return path


def multiclass_npz(path: Path, n: int = 4000) -> Path:
    rng = np.random.default_rng(5)
    probs = rng.dirichlet([1, 1, 1, 1], n)
    labels = np.array([rng.choice(4, p=p) for p in probs])
    np.savez(path, probs=probs, labels=labels)
    return path


def data_of(*argv: str):
    from calmon.commands.report import report_input  # here: the file collects before #32
    args = build_parser().parse_args(["report", *argv, "--mc", "199"])
    data, _ = report_input(args)
    return data


def svg_text(svg: str) -> str:
    """The texts of an SVG whose fonts are kept as text (svg.fonttype none)."""
    return html.unescape(" ".join(re.findall(r"<text[^>]*>([^<]*)</text>", svg)))


def check_layout(data) -> None:
    """Every visible text inside the figure; every table text inside its cell (nothing clipped or overlapping)."""
    from calmon.report import report_figure  # here: the file collects before #32
    fig = report_figure(data)
    try:
        fig.canvas.draw()
        renderer = fig.canvas.get_renderer()  # type: ignore[attr-defined]
        page = fig.bbox
        texts = [t for t in fig.findobj(Text) if t.get_visible() and t.get_text().strip()]
        assert len(texts) > 25  # header, tables, axes: the check below looks at something
        for t in texts:
            bb = t.get_window_extent(renderer)
            assert page.x0 - 0.5 <= bb.x0 and bb.x1 <= page.x1 + 0.5, (t.get_text(), bb, page)
            assert page.y0 - 0.5 <= bb.y0 and bb.y1 <= page.y1 + 0.5, (t.get_text(), bb, page)
        tables = fig.findobj(Table)
        assert len(tables) == 2  # tests and metrics
        for table in tables:
            for cell in table.get_celld().values():
                cb, tb = cell.get_window_extent(renderer), cell.get_text().get_window_extent(renderer)
                assert cb.x0 - 0.5 <= tb.x0 and tb.x1 <= cb.x1 + 0.5, (cell.get_text().get_text(), tb, cb)
    finally:
        plt.close(fig)


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("layout")
    return {"over": binary_csv(d / "over.csv", 0.5), "calibrated": binary_csv(d / "cal.csv", 1.0, seed=8),
            "multi": multiclass_npz(d / "m.npz"), "dir": d}


def test_binary_report_is_complete_and_unclipped(files):
    from calmon.report import render_svg, report_figure  # here: the file collects before #32
    data = data_of(str(files["over"]), "-o", "r.png")
    check_layout(data)
    text = svg_text(render_svg(data))
    for part in ("Calibration report:", "over.csv", "Tests", "Metrics", "Reliability diagrams", "tcal", "smce",
                 "miscalibrated", "ECE (15 bins)", "Brier score", "binary score vs outcome rate",
                 "where: the smooth calibration error's witness"):
        assert part in text, part
    # the verdict in full, wrapped over the header's lines (no word lost at the edges)
    verdict = data.doc["summary"]["text"]
    assert " ".join(verdict.split()) in " ".join(text.split())
    # the witness on its own scale: the curve fills its axis, it is not a flat line on +-2
    fig = report_figure(data)
    try:
        ax = next(a for a in fig.axes if "witness" in a.get_title())
        lo, hi = ax.get_ylim()
        w = data.witness[1]
        assert hi == -lo and np.abs(w).max() <= hi <= 1.2 * np.abs(w).max()
    finally:
        plt.close(fig)


def test_witness_left_out_where_it_carries_no_information(files):
    from calmon.report import render_svg  # here: the file collects before #32
    data = data_of(str(files["calibrated"]), "-o", "r.png")
    assert data.doc["tests"]["smce"]["decision"] == "calibrated"  # nothing for the witness to show
    assert data.witness is None and "not drawn" in data.witness_note
    check_layout(data)
    text = svg_text(render_svg(data))
    assert "witness" not in text.replace("witness is not drawn", "") and "not drawn" in " ".join(text.split())


def test_multiclass_report_is_complete_and_unclipped(files):
    from calmon.report import render_svg  # here: the file collects before #32
    data = data_of(str(files["multi"]), "-o", "r.png", "--tests", "tcal")
    check_layout(data)
    text = svg_text(render_svg(data))
    assert "top-label confidence vs accuracy" in text and "class 3: P(y = 3) vs frequency" in text
    assert "tcal" in text and "class-wise ECE" in text


def test_calibrator_header_shows_before_and_after(files):
    from calmon.cli import main
    from calmon.report import render_svg  # here: the file collects before #32
    cal = files["dir"] / "platt.json"
    assert main(["fit", str(files["over"]), "--method", "platt", "-o", str(cal)]) == 0
    data = data_of(str(files["over"]), "-o", "r.png", "--calibrator", str(cal))
    assert data.after_doc is not None
    assert data.doc["summary"]["calibrated"] is False and data.after_doc["summary"]["calibrated"] is True
    check_layout(data)
    text = " ".join(svg_text(render_svg(data)).split())
    assert "Before: " + " ".join(data.doc["summary"]["text"].split()) in text
    assert "After the calibrator: " + " ".join(data.after_doc["summary"]["text"].split()) in text
    assert "after the calibrator" in text and "platt" in text
    # the tables' after columns are the calibrated data's numbers
    assert f"{100 * data.after_doc['metrics']['ece']:.2f} %" in text
    assert data.after_doc["metrics"]["ece"] < 0.5 * data.doc["metrics"]["ece"]


def test_png_and_svg_outputs_through_the_cli(files, tmp_path):
    from calmon.cli import main
    assert main(["report", str(files["calibrated"]), "-o", str(tmp_path / "r.svg"), "--tests", "none"]) == 0
    svg = (tmp_path / "r.svg").read_text()
    assert svg.lstrip().startswith("<?xml") and "Reliability diagrams" in svg_text(svg)
    assert main(["report", str(files["calibrated"]), "-o", str(tmp_path / "r.png"), "--tests", "none"]) == 0
    assert (tmp_path / "r.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
