"""Every shell and Python example of the docs runs (issue #34.4): in-depth, concept, statistics, reference pages.

The runner is ``tests/docs_examples.py``.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from docs_examples import ALL, check_page, runnable  # noqa: E402


@pytest.mark.parametrize("page", runnable("depth"))
def test_examples_of_the_page_run(page: str, tmp_path: Path) -> None:
    check_page(ALL[page], tmp_path)
