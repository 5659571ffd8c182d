"""The typed result of a calibration tester and its JSON form.

Every tester answers with the same four fields -- ``statistic``, ``p_value``, ``decision`` and
``method`` -- plus tester-specific extras (levels, bounds, thresholds...).  :class:`TestResult`
holds the four as typed attributes and the extras in ``details``; :meth:`TestResult.to_dict`
gives back the JSON document of ``calmon check --json`` and ``/api/status`` key for key, in the
order the tester wrote it.

Examples
--------
>>> r = TestResult.from_dict("demo", {"method": "demo", "statistic": 0.1, "p_value": 0.5,
...                                    "decision": "calibrated", "n": 10})
>>> r.decision, r.details
('calibrated', {'n': 10})
>>> r.to_dict()
{'method': 'demo', 'statistic': 0.1, 'p_value': 0.5, 'decision': 'calibrated', 'n': 10}
>>> TestResult.failed("tcal", ValueError("boom")).to_dict()
{'decision': 'error', 'error': 'ValueError: boom', 'method': 'tcal', 'statistic': None, 'p_value': None}
>>> TestResult.insufficient("smce", 3, 100).to_dict()["reason"]
'3 events < evaluation.min_events = 100'
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, get_args

__all__ = ["Decision", "DECISIONS", "TESTER_DECISIONS", "TestResult"]

Decision = Literal["calibrated", "miscalibrated", "insufficient data", "error"]
#: Every decision a result may carry; ``"error"`` only comes from :meth:`TestResult.failed`.
DECISIONS: tuple[Decision, ...] = get_args(Decision)
#: The decisions a tester function may return itself.
TESTER_DECISIONS: tuple[Decision, ...] = ("calibrated", "miscalibrated", "insufficient data")

_CORE = ("statistic", "p_value", "decision", "method", "error")
_FAILED_ORDER = ("decision", "error", "method", "statistic", "p_value")


@dataclass(frozen=True)
class TestResult:
    """Outcome of one tester run.

    Attributes
    ----------
    method
        What actually ran (``"mc-grid"``, ``"binomial"``, ``"smce"``...), not necessarily the
        tester's registered name.
    decision
        One of :data:`DECISIONS`.
    statistic, p_value
        The headline statistic and p-value (``None`` when the tester has none).
    details
        Tester-specific extras, JSON-serialisable.
    error
        ``"ExceptionType: message"`` when the tester failed (decision ``"error"``).
    key_order
        Order of the keys in :meth:`to_dict` (the tester's own order); not part of equality.

    Examples
    --------
    >>> r = TestResult("binomial", "miscalibrated", statistic=0.2, p_value=1e-4, details={"n": 50})
    >>> r.to_dict()
    {'statistic': 0.2, 'p_value': 0.0001, 'decision': 'miscalibrated', 'method': 'binomial', 'n': 50}
    """

    __test__ = False  # not a pytest test class despite the name

    method: str
    decision: Decision
    statistic: float | None = None
    p_value: float | None = None
    details: dict[str, Any] = field(default_factory=dict)
    error: str | None = None
    key_order: tuple[str, ...] = field(default=(), repr=False, compare=False)

    @classmethod
    def from_dict(cls, name: str, raw: Mapping[str, Any]) -> TestResult:
        """Type the dict a tester function returned; ``RuntimeError`` on a missing or unknown decision.

        ``name`` is the registered tester name, used in the error message and as ``method`` when the
        tester did not set one.
        """
        if not isinstance(raw, Mapping):
            raise RuntimeError(f"tester {name!r} returned {type(raw).__name__}, not a dict")
        decision = raw.get("decision")
        if decision not in TESTER_DECISIONS:
            raise RuntimeError(f"tester {name!r} returned decision {decision!r}, not one of {TESTER_DECISIONS}")
        details = {k: v for k, v in raw.items() if k not in _CORE}
        return cls(method=str(raw.get("method", name)), decision=decision, statistic=raw.get("statistic"),
                   p_value=raw.get("p_value"), details=details, error=raw.get("error"), key_order=tuple(raw))

    @classmethod
    def failed(cls, method: str, exc_or_message: BaseException | str) -> TestResult:
        """Result of a tester that raised: decision ``"error"`` and the exception as text."""
        if isinstance(exc_or_message, BaseException):
            message = f"{type(exc_or_message).__name__}: {exc_or_message}"
        else:
            message = str(exc_or_message)
        return cls(method=method, decision="error", error=message, key_order=_FAILED_ORDER)

    @classmethod
    def insufficient(cls, method: str, n: int, minimum: int) -> TestResult:
        """Result for a window with fewer than ``evaluation.min_events`` events (the tester is not run)."""
        return cls(method=method, decision="insufficient data",
                   details={"reason": f"{n} events < evaluation.min_events = {minimum}"},
                   key_order=("statistic", "p_value", "decision", "method", "reason"))

    def to_dict(self) -> dict[str, Any]:
        """The JSON document: the four core keys (``error`` too when set) and ``details``, in ``key_order``."""
        core: dict[str, Any] = {"statistic": self.statistic, "p_value": self.p_value, "decision": self.decision,
                                "method": self.method}
        if self.error is not None:
            core["error"] = self.error
        out: dict[str, Any] = {}
        for key in self.key_order:
            if key in core:
                out[key] = core[key]
            elif key in self.details:
                out[key] = self.details[key]
        for key, value in (*core.items(), *self.details.items()):
            out.setdefault(key, value)
        return out
