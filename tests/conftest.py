"""Shared test helpers: the path of ../shared and a flag for components that must exist in CI."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO / ".." / "shared"
TCAL_DATA = SHARED / "data" / "tcal"
IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")


def require(condition: bool, reason: str) -> None:
    """Fail in CI, skip loudly elsewhere, when an external component is missing."""
    if condition:
        return
    if IN_CI:
        pytest.fail(f"required component missing in CI: {reason}")
    pytest.skip(f"SKIPPED (component missing): {reason}")


@pytest.fixture
def tcal_files() -> list[Path]:
    files = sorted(TCAL_DATA.glob("*.npz"))
    require(len(files) == 9, f"the nine T-Cal data files in {TCAL_DATA}")
    return files
