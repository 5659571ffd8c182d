"""Optional dependencies (the extras of ``pip install 'calmon[...]'``): import one, or fail with one line naming it.

The base install runs the agent, ``check``, ``fit``, ``apply`` and the demo; heavier features live in extras
(docs/install.md). A feature reached without its extra raises :class:`MissingExtra`, an :class:`ImportError`
whose message is the one line a user needs, e.g. ``calmon report needs matplotlib: pip install 'calmon[report]'``;
the command line prints it and exits 2.

Examples
--------
>>> require("json", extra="none", feature="this example").__name__
'json'
>>> require("surely_not_installed_xyz", extra="report", feature="calmon report")
Traceback (most recent call last):
...
calmon.formats.extras.MissingExtra: calmon report needs surely_not_installed_xyz: pip install 'calmon[report]'
"""

from __future__ import annotations

import importlib
from types import ModuleType

__all__ = ["MissingExtra", "require", "missing_message"]


class MissingExtra(ImportError):
    """A feature needs an optional package that is not installed; the message names the extra to install."""


def missing_message(module: str, extra: str, feature: str) -> str:
    """``"{feature} needs {package}: pip install 'calmon[{extra}]'"`` (the package is the top-level module)."""
    return f"{feature} needs {module.partition('.')[0]}: pip install 'calmon[{extra}]'"


def require(module: str, extra: str, feature: str) -> ModuleType:
    """Import ``module``, or raise :class:`MissingExtra` naming ``extra`` (and chained to the original error).

    Only a missing package is translated: an installed package that fails while importing (a broken build, an
    incompatible numpy) keeps its own error, which is the one to fix.
    """
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as exc:
        top = module.partition(".")[0]
        if exc.name is not None and exc.name != top and not exc.name.startswith(top + "."):
            raise  # the package is there; something it imports is not
        raise MissingExtra(missing_message(module, extra, feature), name=top) from exc
