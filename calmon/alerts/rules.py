"""Alert rules: the validated form of the ``alerts.rules`` configuration and how a rule judges an evaluation."""

from __future__ import annotations

import fnmatch
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from calmon.config.schema import ConfigError, parse_duration

__all__ = ["KINDS", "OPS", "AlertRule", "validate_rules"]

KINDS = ("test_rejected", "threshold", "change_detected")
#: The pseudo-window of change-detection judgements (a detector watches the whole stream, not a window).
CHANGE_WINDOW = "stream"
#: Parts of an evaluation a threshold rule may address by a dotted path besides ``metrics`` and ``tests``.
LABEL_FREE = ("estimated", "estimation_error", "score_drift")
OPS = {
    ">": lambda v, t: v > t,
    ">=": lambda v, t: v >= t,
    "<": lambda v, t: v < t,
    "<=": lambda v, t: v <= t,
}
_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_LABEL_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_ALLOWED_KEYS = {
    "name", "kind", "test", "metric", "op", "threshold", "min_events", "consecutive", "clear_after",
    "models", "segments", "windows", "severity", "labels", "annotations", "signals", "within", "ignore_immaterial",
}
_SEVERITIES = ("info", "warning", "critical", "page")


@dataclass(frozen=True)
class AlertRule:
    """A validated alert rule (build with :func:`validate_rules`).

    Attributes
    ----------
    name
        Alert name (``alertname`` label), ``[A-Za-z_][A-Za-z0-9_]*``.
    kind
        ``"test_rejected"`` or ``"threshold"``.
    test
        Tester name (``test_rejected``).
    metric
        Metric key or ``tests.<name>.<field>`` path (``threshold``).
    op, threshold
        Comparison making a value *bad* (``threshold``).
    min_events
        Windows with fewer events are not judged.
    consecutive
        Bad evaluations in a row before firing (the ``for`` of the rule).
    clear_after
        OK evaluations in a row before a firing alert resolves (hysteresis).
    models, segments, windows
        Shell-style patterns (``fnmatch``) selecting evaluations.
    severity
        ``severity`` label.
    ignore_immaterial
        ``test_rejected``: a rejection the verdict calls immaterial (its ECE interval lies below
        ``verdict.tolerance.ece``: "calibrated within tolerance; no action") is judged OK, so the alert agrees with
        the verdict (default); ``false`` alerts on every significant rejection.
    labels, annotations
        Extra labels; annotation templates with ``{model}``, ``{segment}``, ``{window}``,
        ``{value}``, ``{threshold}``, ``{test}``, ``{metric}``, ``{n}``, ``{alert}``, ``{severity}``.
    """

    name: str
    kind: str
    test: str | None = None
    metric: str | None = None
    op: str = ">"
    threshold: float | None = None
    min_events: int = 0
    consecutive: int = 1
    clear_after: int = 1
    models: tuple[str, ...] = ("*",)
    segments: tuple[str, ...] = ("*",)
    windows: tuple[str, ...] = ("*",)
    severity: str = "warning"
    labels: tuple[tuple[str, str], ...] = ()
    annotations: tuple[tuple[str, str], ...] = ()
    #: ``change_detected``: signal patterns, and how long (event-time seconds) a detection keeps the alert bad.
    signals: tuple[str, ...] = ("*",)
    within: float = 3600.0
    ignore_immaterial: bool = True

    def applies_to(self, ev: Mapping[str, Any]) -> bool:
        """Change rules judge change judgements (they carry ``changes``), the other kinds window evaluations."""
        return (self.kind == "change_detected") == ("changes" in ev)

    def selects(self, model: str, segment: str, window: str) -> bool:
        """True when the rule's selectors match this (model, segment, window)."""
        return (
            any(fnmatch.fnmatchcase(model, p) for p in self.models)
            and any(fnmatch.fnmatchcase(segment, p) for p in self.segments)
            and any(fnmatch.fnmatchcase(window, p) for p in self.windows)
        )

    def judge(self, ev: Mapping[str, Any]) -> tuple[bool | None, float | None]:
        """Judge one evaluation: ``(True, value)`` bad, ``(False, value)`` OK, ``(None, value)`` unknown."""
        n = ev.get("n", 0)
        try:
            n_ok = float(n) >= self.min_events
        except (TypeError, ValueError):
            n_ok = False
        if self.kind == "change_detected":
            return self._judge_change(ev, n_ok)
        if self.kind == "test_rejected":
            res = (ev.get("tests") or {}).get(self.test)
            if not isinstance(res, dict):
                return None, None
            value = _finite(res.get("p_value"))
            if value is None:
                value = _finite(res.get("statistic"))
            decision = res.get("decision")
            if not n_ok or decision not in ("calibrated", "miscalibrated"):
                return None, value
            if decision == "miscalibrated" and self.ignore_immaterial:
                verdict = ev.get("summary")
                if isinstance(verdict, Mapping) and verdict.get("material") is False:
                    return False, value  # significant, but within the verdict's tolerance: no action
            return decision == "miscalibrated", value
        value = _lookup(ev, self.metric or "")
        if value is None or not n_ok:
            return None, value
        return bool(OPS[self.op](value, float(self.threshold))), value  # type: ignore[arg-type]

    def _judge_change(self, ev: Mapping[str, Any], n_ok: bool) -> tuple[bool | None, float | None]:
        """Bad while a selected signal's last detection is within ``within`` seconds of the newest event time."""
        watermark = _finite(ev.get("watermark"))
        if watermark is None or not n_ok:
            return None, None
        last = [(sig.get("last") or {}) for name, sig in (ev.get("changes") or {}).items()
                if any(fnmatch.fnmatchcase(name, p) for p in self.signals)]
        times = [t for t in (_finite(x.get("detected_at")) for x in last) if t is not None]
        if not times:
            return False, None
        newest = max(times)
        cp = [_finite(x.get("change_point")) for x in last if _finite(x.get("detected_at")) == newest]
        return newest >= watermark - self.within, cp[0] if cp else newest


def _finite(v: Any) -> float | None:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return None
    v = float(v)
    return v if math.isfinite(v) else None


def _lookup(ev: Mapping[str, Any], path: str) -> float | None:
    if path.startswith("tests."):
        parts = path.split(".", 2)
        if len(parts) != 3:
            return None
        res = (ev.get("tests") or {}).get(parts[1])
        if not isinstance(res, dict):
            return None
        if res.get("decision") == "insufficient data":
            return None
        return _finite(res.get(parts[2]))
    head, _, rest = path.partition(".")
    if head in LABEL_FREE and rest:  # e.g. score_drift.p_value, estimated.accuracy.value, estimation_error.brier
        node: Any = ev.get(head)
        for part in rest.split("."):
            node = node.get(part) if isinstance(node, Mapping) else None
        return _finite(node)
    return _finite((ev.get("metrics") or {}).get(path))


def _patterns(rule: dict[str, Any], key: str, where: str) -> tuple[str, ...]:
    v = rule.get(key, ["*"])
    if isinstance(v, str):
        v = [v]
    if not isinstance(v, (list, tuple)) or not v or not all(isinstance(p, str) and p for p in v):
        raise ValueError(f"{where}.{key}: expected a non-empty string or list of non-empty strings, "
                         f"got {v!r}")
    return tuple(v)


def _int(rule: dict[str, Any], key: str, where: str, default: int, minimum: int) -> int:
    v = rule.get(key, default)
    if isinstance(v, bool) or not isinstance(v, int) or v < minimum:
        raise ValueError(f"{where}.{key}: expected an integer >= {minimum}, got {v!r}")
    return v


def _str_map(rule: dict[str, Any], key: str, where: str, check_names: bool) -> tuple[tuple[str, str], ...]:
    v = rule.get(key, {})
    if not isinstance(v, dict):
        raise ValueError(f"{where}.{key}: expected a mapping of strings, got {type(v).__name__}")
    out = []
    for k, s in v.items():
        if not isinstance(k, str) or (check_names and not _LABEL_RE.match(k)):
            raise ValueError(f"{where}.{key}.{k}: not a valid label name")
        if check_names and k in ("alertname", "alert", "model", "segment", "window", "severity"):
            raise ValueError(f"{where}.{key}.{k}: reserved label, set by the engine")
        if not isinstance(s, str):
            raise ValueError(f"{where}.{key}.{k}: expected a string, got {s!r}")
        out.append((k, s))
    return tuple(sorted(out))


def validate_rules(config: Any, path: str = "alerts") -> list[AlertRule]:
    """Validate alert rule configuration and build :class:`AlertRule` objects.

    Parameters
    ----------
    config
        A list of rule dicts, or a dict with a ``rules`` list.
    path
        Configuration path used in error messages.

    Returns
    -------
    list[AlertRule]

    Raises
    ------
    ValueError
        Naming the offending key, e.g. ``alerts[1].threshold: ...``.

    Examples
    --------
    >>> rules = validate_rules([{"name": "Drift", "kind": "test_rejected", "test": "tcal",
    ...                          "consecutive": 2, "clear_after": 3}])
    >>> rules[0].consecutive, rules[0].clear_after
    (2, 3)
    >>> validate_rules([{"name": "Hi", "kind": "threshold", "metric": "ece"}])
    Traceback (most recent call last):
    ...
    ValueError: alerts[0].threshold: required for kind 'threshold' (a finite number)
    """
    if isinstance(config, dict):
        unknown = set(config) - {"rules"}
        if unknown:
            raise ValueError(f"{path}.{sorted(unknown)[0]}: unknown key (expected 'rules')")
        config = config.get("rules", [])
        path = f"{path}.rules"
    if not isinstance(config, list):
        raise ValueError(f"{path}: expected a list of rules, got {type(config).__name__}")
    rules: list[AlertRule] = []
    seen: set[str] = set()
    for i, rule in enumerate(config):
        rules.append(_rule(rule, f"{path}[{i}]", seen))
    return rules


def _rule(rule: Any, where: str, seen: set[str]) -> AlertRule:
    """One rule dict -> :class:`AlertRule` (``seen``: names so far, to refuse duplicates)."""
    if not isinstance(rule, dict):
        raise ValueError(f"{where}: expected a mapping, got {type(rule).__name__}")
    for k in rule:
        if k not in _ALLOWED_KEYS:
            raise ValueError(f"{where}.{k}: unknown key (allowed: {', '.join(sorted(_ALLOWED_KEYS))})")
    name = rule.get("name")
    if not isinstance(name, str) or not _NAME_RE.match(name):
        raise ValueError(f"{where}.name: required, letters, digits and '_' not starting with a digit; "
                         f"got {name!r}")
    if name in seen:
        raise ValueError(f"{where}.name: duplicate rule name {name!r}")
    seen.add(name)
    kind = rule.get("kind")
    if kind not in KINDS:
        raise ValueError(f"{where}.kind: expected one of {', '.join(KINDS)}, got {kind!r}")
    for k in ("signals", "within"):
        if k in rule and kind != "change_detected":
            raise ValueError(f"{where}.{k}: only valid for kind 'change_detected'")
    ignore_immaterial = rule.get("ignore_immaterial", True)
    if "ignore_immaterial" in rule and kind != "test_rejected":
        raise ValueError(f"{where}.ignore_immaterial: only valid for kind 'test_rejected'")
    if not isinstance(ignore_immaterial, bool):
        raise ValueError(f"{where}.ignore_immaterial: expected true or false, got {ignore_immaterial!r}")
    if kind == "test_rejected":
        test, metric, op, threshold = _test_fields(rule, where)
    elif kind == "threshold":
        test, metric, op, threshold = _threshold_fields(rule, where)
    else:
        test, metric, op, threshold = _change_fields(rule, where)
    severity = rule.get("severity", "warning")
    if severity not in _SEVERITIES:
        raise ValueError(f"{where}.severity: expected one of {', '.join(_SEVERITIES)}, got {severity!r}")
    return AlertRule(
        name=name, kind=kind, test=test, metric=metric, op=op, threshold=threshold,
        min_events=_int(rule, "min_events", where, 0, 0),
        consecutive=_int(rule, "consecutive", where, 1, 1),
        clear_after=_int(rule, "clear_after", where, 1, 1),
        models=_patterns(rule, "models", where),
        segments=_patterns(rule, "segments", where),
        windows=_patterns(rule, "windows", where),
        severity=severity,
        labels=_str_map(rule, "labels", where, True),
        annotations=_str_map(rule, "annotations", where, False),
        signals=_patterns(rule, "signals", where),
        within=_seconds(rule, "within", where, 3600.0),
        ignore_immaterial=ignore_immaterial,
    )


_Fields = tuple[str | None, str | None, str, float | None]


def _change_fields(rule: dict[str, Any], where: str) -> _Fields:
    for k in ("test", "metric", "op", "threshold"):
        if k in rule:
            raise ValueError(f"{where}.{k}: not valid for kind 'change_detected' (use signals, within)")
    return None, None, ">", None


def _seconds(rule: dict[str, Any], key: str, where: str, default: float) -> float:
    if key not in rule:
        return default
    try:
        v = parse_duration(rule[key], f"{where}.{key}")
    except ConfigError as exc:
        raise ValueError(str(exc)) from None
    if not v > 0:
        raise ValueError(f"{where}.{key}: must be positive")
    return v


def _test_fields(rule: dict[str, Any], where: str) -> _Fields:
    test = rule.get("test")
    if not isinstance(test, str) or not test:
        raise ValueError(f"{where}.test: required for kind 'test_rejected' (a tester name)")
    for k in ("metric", "op", "threshold"):
        if k in rule:
            raise ValueError(f"{where}.{k}: only valid for kind 'threshold'")
    return test, None, ">", None


def _threshold_fields(rule: dict[str, Any], where: str) -> _Fields:
    if "test" in rule:
        raise ValueError(f"{where}.test: only valid for kind 'test_rejected' (use metric: tests.NAME.FIELD)")
    metric = rule.get("metric")
    if not isinstance(metric, str) or not metric:
        raise ValueError(f"{where}.metric: required for kind 'threshold' (a metric name or tests.NAME.FIELD)")
    if metric.startswith("tests.") and len(metric.split(".", 2)) != 3:
        raise ValueError(f"{where}.metric: expected tests.NAME.FIELD, got {metric!r}")
    op = rule.get("op", ">")
    if op not in OPS:
        raise ValueError(f"{where}.op: expected one of {', '.join(OPS)}, got {op!r}")
    t = rule.get("threshold")
    if isinstance(t, bool) or not isinstance(t, (int, float)) or not math.isfinite(t):
        raise ValueError(f"{where}.threshold: required for kind 'threshold' (a finite number)")
    return None, metric, op, float(t)
