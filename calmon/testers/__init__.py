"""Calibration testers: one table of names, one way to run them, one typed result.

A tester is a function ``fn(data, *, alpha, mc, rng, **params) -> dict`` (see :data:`Tester`).
``data`` is a :class:`CalibrationData` holding whatever the caller has: a file gives raw arrays
and the fine grid; a window of the agent gives the fine grid, a reservoir sample and
(multiclass) the level-set statistics.  The function returns a JSON-serialisable dict with at
least ``statistic``, ``p_value`` (or ``None``), ``decision`` and ``method``;
:func:`run_tester` turns it into a :class:`TestResult`.

The built-in testers are listed in :data:`BUILTIN` (the adapters of this package over the pure
algorithms of :mod:`calmon.algorithms`); plugins add theirs with :func:`register_tester`, which
refuses a name already taken.

Examples
--------
>>> import numpy as np
>>> rng = np.random.default_rng(0); z = rng.uniform(size=500); y = (rng.uniform(size=500) < z) * 1.0
>>> r = run_tester("smce", CalibrationData(n=500, z=z, y=y, raw_is_complete=True), mc=19)
>>> r.decision in DECISIONS, r.method, sorted(BUILTIN)
(True, 'smce', ['ldtc', 'lp', 'smce', 'tcal'])
>>> check_params("tcal", {"method": "mc-grid", "bogus": 1})  # doctest: +ELLIPSIS
Traceback (most recent call last):
...
ValueError: tester 'tcal' has no parameter 'bogus' (known: bins, combine, discrete, ...)
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from calmon.plugins.registry import Registry
from calmon.stats.data import CalibrationData
from calmon.testers.ldtc import ldtc_tester
from calmon.testers.lp import lp_tester
from calmon.testers.result import DECISIONS, TESTER_DECISIONS, Decision, TestResult
from calmon.testers.smce import smce_tester
from calmon.testers.tcal import tcal_screen, tcal_tester

__all__ = [
    "BUILTIN", "CalibrationData", "DECISIONS", "Decision", "MAX_MC", "TESTERS", "TESTER_DECISIONS", "TestResult",
    "Tester", "SCREENS", "check_params", "get_tester", "has_screen", "register_tester", "run_tester", "screen_tester",
]

#: ``fn(data: CalibrationData, *, alpha: float, mc: int, rng: np.random.Generator, **params) -> dict``.
Tester = Callable[..., dict[str, Any]]

#: The built-in testers, by name.
BUILTIN: Mapping[str, Tester] = {
    "tcal": tcal_tester,
    "smce": smce_tester,
    "ldtc": ldtc_tester,
    "lp": lp_tester,
}

#: Testers with a fast answer for the data that need no simulation: ``fn(data, **same as the tester) -> dict``
#: or ``None`` when only the full call can answer (see :func:`screen_tester`).
SCREENS: Mapping[str, Callable[..., dict[str, Any] | None]] = {"tcal": tcal_screen}
#: Every tester known to this process: :data:`BUILTIN` plus registered plugins.
TESTERS: Registry[Tester] = Registry("tester")
for _name, _fn in BUILTIN.items():
    TESTERS.register(_name, _fn)

#: Monte Carlo draws of one tester call at most: p-values resolve to ``1 / (mc + 1)``, so a million draws
#: already pin a p-value to 1e-6 (its Monte Carlo error at p = 0.05 is 2e-4); more only cost time -- a
#: null simulation that cannot stop early runs through every draw.
MAX_MC = 1_000_000
#: Keyword arguments :func:`run_tester` passes itself (from ``evaluation.alpha``/``mc``/``seed``).
_RESERVED = frozenset({"data", "alpha", "mc", "rng", "seed"})


def register_tester(name: str) -> Callable[[Tester], Tester]:
    """Decorator registering a plugin tester under ``name``; ``ValueError`` if the name is taken."""
    return TESTERS.decorator(name)


def get_tester(name: str) -> Tester:
    """The tester function under ``name``; ``ValueError`` listing the known names if absent."""
    return TESTERS.get(name)


def check_params(name: str, params: Mapping[str, Any]) -> None:
    """Raise ``ValueError`` naming the first parameter tester ``name`` does not take (start-up validation).

    A tester whose signature has ``**kwargs`` accepts any name here and validates at run time.
    """
    if not params:
        get_tester(name)  # unknown tester: ValueError
        return
    accepts_any, known = _keywords(get_tester(name))
    for key in params:
        if key in _RESERVED:
            raise ValueError(f"tester {name!r}: parameter {key!r} is set by the evaluation settings, not per tester")
        if not accepts_any and key not in known:
            raise ValueError(f"tester {name!r} has no parameter {key!r} (known: {', '.join(known) or 'none'})")


@functools.lru_cache(maxsize=256)
def _keywords(fn: Callable[..., Any]) -> tuple[bool, list[str]]:
    """Whether ``fn`` takes ``**kwargs``, and its keyword-only parameters a configuration may set (a
    signature is costly to inspect, and a round checks the same testers on thousands of windows)."""
    sig = inspect.signature(fn)
    accepts_any = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in sig.parameters.values())
    known = sorted(p.name for p in sig.parameters.values()
                   if p.kind is inspect.Parameter.KEYWORD_ONLY and p.name not in _RESERVED)
    return accepts_any, known


def run_tester(name: str, data: CalibrationData, *, alpha: float = 0.05, mc: int = 2000, seed: int | None = 0,
               **params: Any) -> TestResult:
    """Run tester ``name`` on ``data`` with a generator seeded by ``seed``; the result typed and checked.

    Raises ``ValueError`` for an unknown tester or parameter, an ``alpha`` outside (0, 1) or an ``mc``
    above :data:`MAX_MC` (and whatever the tester raises on bad data); ``RuntimeError`` if the tester
    answers with no valid decision.
    """
    raw = _call(get_tester(name), name, data, alpha, mc, seed, params)
    return TestResult.from_dict(name, raw)


def _call(fn: Callable[..., Any], name: str, data: CalibrationData, alpha: float, mc: int, seed: int | None,
          params: Mapping[str, Any]) -> Any:
    """``fn`` (tester ``name`` or its screen) on ``data`` after checking ``alpha`` and the parameters."""
    if not 0.0 < alpha < 1.0:
        raise ValueError(f"alpha must lie in (0, 1), got {alpha}")
    if mc > MAX_MC:
        raise ValueError(f"mc must be at most {MAX_MC:,}, got {mc}")
    check_params(name, params)
    return fn(data, alpha=alpha, mc=mc, rng=np.random.default_rng(seed), **params)


def has_screen(name: str) -> bool:
    """Tester ``name`` can answer some data without simulating (:func:`screen_tester`)."""
    return name in SCREENS and name in TESTERS and TESTERS.get(name) is BUILTIN.get(name)


def screen_tester(name: str, data: CalibrationData, *, alpha: float = 0.05, mc: int = 2000, seed: int | None = 0,
                  **params: Any) -> TestResult | None:
    """:func:`run_tester`'s result when tester ``name`` can answer without simulating, else ``None``.

    A tester without an entry in :data:`SCREENS` (or a plugin registered under a built-in's name)
    always needs the full call.  Where this gives a result it is the one :func:`run_tester` gives.
    """
    if not has_screen(name):
        return None
    raw = _call(SCREENS[name], name, data, alpha, mc, seed, params)
    return None if raw is None else TestResult.from_dict(name, raw)
