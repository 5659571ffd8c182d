"""A griffe extension for the API reference: Sphinx roles in calmon's docstrings as Markdown code.

calmon's numpy-style docstrings cross-reference with reST roles (``:class:`Sink```, ``:func:`~calmon.x.load```,
double-backquoted literals), which Python's ``help()`` and the source read well; mkdocstrings would print them
verbatim. This rewrites them to Markdown code spans when the site is built, without touching the docstrings.
"""

from __future__ import annotations

import re
from typing import Any

import griffe

_ROLE = re.compile(r":(?:class|mod|data|func|meth|attr|exc|obj|ref|py:\w+):`~?([^`<]+?)(?:\s*<[^>]+>)?`")


def to_markdown(text: str) -> str:
    """``:class:`~a.B``` -> ```B```, ``:func:`x``` -> ```x```, double backquotes -> single."""
    text = _ROLE.sub(lambda m: "`" + (m.group(1).rsplit(".", 1)[-1] if ":`~" in m.group(0) else m.group(1)) + "`",
                     text)
    return text.replace("``", "`")


class RstRoles(griffe.Extension):
    """Rewrite every docstring's reST roles as it is loaded."""

    def on_instance(self, *, obj: Any, **kwargs: Any) -> None:
        doc = getattr(obj, "docstring", None)
        if doc is not None and doc.value:
            doc.value = to_markdown(doc.value)
