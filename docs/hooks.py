"""MkDocs hooks: every page names the calmon version it describes; stale generated pages fail the build.

The version is read from ``pyproject.toml`` (the one place it is kept), so a release bump cannot leave the site
describing the previous one.  The generated reference pages (:mod:`gen_reference`) are compared with what the
code generates now: a key, metric, flag or reason code added without ``python docs/gen_reference.py`` fails the
build (and ``tests/test_docs_reference.py``).
"""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent


def project_version() -> str:
    """The ``version`` of ``[project]`` in pyproject.toml."""
    text = (ROOT / "pyproject.toml").read_text()
    m = re.search(r'^\[project\][^\[]*?^version\s*=\s*"([^"]+)"', text, flags=re.M | re.S)
    if not m:
        raise RuntimeError("pyproject.toml: [project] version not found")
    return m.group(1)


def on_config(config: Any) -> Any:
    version = project_version()
    config.extra["version"] = version
    config.copyright = f"calmon {version}"
    return config


def on_pre_build(config: Any) -> None:
    sys.path.insert(0, str(ROOT / "docs"))
    sys.path.insert(0, str(ROOT))
    import gen_reference

    stale = gen_reference.stale_pages()
    if stale:
        raise SystemExit(f"generated reference pages are stale: {', '.join(stale)} "
                         "(run: python docs/gen_reference.py)")


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    note = f'<p class="calmon-version"><small>This page describes calmon {config.extra["version"]}.</small></p>'
    return note + "\n\n" + markdown
