"""``python -m benchmarks.docs_performance`` rewrites the performance page's table, and only it (issue #34.5)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from benchmarks import docs_performance


def test_tiny_run_rewrites_only_the_marked_table(tmp_path: Path) -> None:
    page = tmp_path / "performance.md"
    page.write_text("# Performance\n\nprose above\n\n" + docs_performance.BEGIN + "\nold figures\n"
                    + docs_performance.END + "\n\nprose below\n")
    assert docs_performance.main(["--size", "tiny", "--page", str(page)]) == 0
    text = page.read_text()
    assert text.startswith("# Performance\n\nprose above\n\n") and text.endswith("\n\nprose below\n")
    assert "old figures" not in text
    rows = [ln for ln in text.splitlines() if ln.startswith("| ") and "**" in ln]
    assert len(rows) == 3
    for row in rows:  # a figure, a baseline figure and their ratio, each a number
        assert re.search(r"\| [\d,.]+ [a-z/]+ \| .+: [\d,.]+ [a-z/]+ \| \*\*[\d,.]+x\*\* \|", row), row
    assert re.search(r"Measured \d{4}-\d\d-\d\d \d\d:\d\d UTC by `python -m benchmarks.docs_performance --size tiny`",
                     text)
    assert "load average" in text and "commit" in text and "cores" in text


def test_the_committed_page_holds_a_measured_table_and_no_history() -> None:
    text = docs_performance.PAGE.read_text()
    block = text.split(docs_performance.BEGIN, 1)[1].split(docs_performance.END, 1)[0]
    assert "Measured " in block and "--size tiny" not in block, "run: python -m benchmarks.docs_performance"
    assert "Previous figures" not in text and "Before those" not in text  # current figures only


def test_a_page_without_markers_is_refused(tmp_path: Path) -> None:
    page = tmp_path / "p.md"
    page.write_text("no markers\n")
    with pytest.raises(SystemExit, match="markers"):
        docs_performance.write_page("x", page)
