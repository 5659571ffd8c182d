"""Tester registry: one interface for ``calmon check`` and the agent's scheduler.

A tester is a function ``fn(data, *, alpha, mc, rng, **params) -> dict`` registered under a
name with :func:`register_tester`.  ``data`` is a :class:`CalibrationData` holding whatever
the caller has: a file gives raw arrays and the fine grid; a window of the agent gives the fine
grid, a reservoir sample and (multiclass) the level-set statistics.  The result is a
JSON-serialisable dict with at least ``statistic``, ``p_value`` (or ``None``), ``decision``
(one of :data:`DECISIONS`) and ``method``.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from calmon.stats.grid import ScoreGrid

DECISIONS = ("calibrated", "miscalibrated", "insufficient data")
#: Modules that register the built-in testers when imported.
BUILTIN_MODULES: tuple[str, ...] = (
    "calmon.algorithms.tcal", "calmon.algorithms.smooth", "calmon.algorithms.ldtc", "calmon.algorithms.multiclass_lp",
)


@dataclass
class CalibrationData:
    """What a tester may use; any field but ``n`` may be ``None``.

    Attributes
    ----------
    n
        Number of events the data summarises (the window's count, not the reservoir's).
    grid
        Fine grid of binary scores, or of top-label confidence with ``y`` = correct.
    z, y
        Raw binary scores (or top-label confidence) and 0/1 outcomes: the full data from a
        file, or a uniform reservoir sample of a window.
    probs, labels
        Raw multiclass probabilities ``(m, K)`` and class indices, full data or reservoir.
    levelset
        Multiclass level-set statistics (see :mod:`calmon.stats.levelset`).
    raw_is_complete
        True when ``z``/``y`` (or ``probs``/``labels``) hold every event, not a sample.
    """

    n: int
    grid: ScoreGrid | None = None
    z: np.ndarray | None = None
    y: np.ndarray | None = None
    probs: np.ndarray | None = None
    labels: np.ndarray | None = None
    levelset: Any = None
    raw_is_complete: bool = False


Tester = Callable[..., dict[str, Any]]
REGISTRY: dict[str, Tester] = {}


def register_tester(name: str) -> Callable[[Tester], Tester]:
    """Decorator registering ``fn`` as tester ``name``."""

    def deco(fn: Tester) -> Tester:
        REGISTRY[name] = fn
        return fn

    return deco


def load_builtin() -> dict[str, Tester]:
    for mod in BUILTIN_MODULES:
        importlib.import_module(mod)
    return REGISTRY


def get_tester(name: str) -> Tester:
    load_builtin()
    try:
        return REGISTRY[name]
    except KeyError:
        known = ", ".join(sorted(REGISTRY)) or "none"
        raise ValueError(f"unknown tester {name!r} (known: {known})") from None


def run_tester(name: str, data: CalibrationData, *, alpha: float = 0.05, mc: int = 2000, seed: int | None = 0,
               **params: Any) -> dict[str, Any]:
    """Run tester ``name`` and check the shape of its result."""
    if not 0.0 < alpha < 1.0:
        raise ValueError(f"alpha must lie in (0, 1), got {alpha}")
    result = get_tester(name)(data, alpha=alpha, mc=mc, rng=np.random.default_rng(seed), **params)
    if result.get("decision") not in DECISIONS:
        raise RuntimeError(f"tester {name!r} returned decision {result.get('decision')!r}, not one of {DECISIONS}")
    return result
