"""Alert states and the engine that advances them round after round (see :mod:`calmon.alerts`)."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from calmon.alerts.rules import AlertRule, validate_rules

__all__ = ["STATES", "AlertEngine", "AlertState"]

STATES = ("inactive", "pending", "firing", "resolved")
_TEMPLATE_RE = re.compile(r"\{(alert|model|segment|window|severity|value|threshold|test|metric|n)\}")


@dataclass
class AlertState:
    """State of one rule for one (model, segment, window).

    Attributes
    ----------
    alert, model, segment, window, severity
        Identity and labels.
    state
        One of :data:`STATES`.
    since
        Time the current state was entered (epoch seconds).
    value
        Latest judged value (p-value, statistic or metric; ``None`` if unknown).
    bad_streak, ok_streak
        Consecutive bad / OK evaluations (unknown evaluations leave both unchanged).
    started_at, ended_at
        When the alert last started firing / resolved (``None`` if never).
    last_evaluated
        Time of the last round that judged this key.
    labels, annotations
        Extra labels and rendered annotations.
    """

    alert: str
    model: str
    segment: str
    window: str
    severity: str
    state: str = "inactive"
    since: float = 0.0
    value: float | None = None
    bad_streak: int = 0
    ok_streak: int = 0
    started_at: float | None = None
    ended_at: float | None = None
    last_evaluated: float | None = None
    labels: dict[str, str] = field(default_factory=dict)
    annotations: dict[str, str] = field(default_factory=dict)

    @property
    def key(self) -> tuple[str, str, str, str]:
        return (self.alert, self.model, self.segment, self.window)

    @property
    def active(self) -> bool:
        return self.state == "firing"

    def copy(self) -> AlertState:
        """An independent copy (the engine's own states keep changing)."""
        return replace(self, labels=dict(self.labels), annotations=dict(self.annotations))

    def to_dict(self) -> dict[str, Any]:
        """JSON-serialisable dict (the status page's alert row plus the counters)."""
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> AlertState:
        names = set(cls.__dataclass_fields__)
        return cls(**{k: v for k, v in d.items() if k in names})

    def prometheus_labels(self) -> dict[str, str]:
        """Labels of the ``calmon_alert_active`` gauge."""
        return {"alert": self.alert, "model": self.model, "segment": self.segment,
                "window": self.window, "severity": self.severity}


def _render(template: str, values: dict[str, str]) -> str:
    return _TEMPLATE_RE.sub(lambda m: values.get(m.group(1), ""), template)


def _fmt(v: float | None) -> str:
    return "n/a" if v is None else f"{v:.4g}"


class AlertEngine:
    """Evaluate alert rules round after round.

    Parameters
    ----------
    rules
        Rule dicts (validated with :func:`validate_rules`) or :class:`AlertRule` objects.
    resolved_retention
        Seconds a resolved state is kept (and re-sent to Alertmanager) before it is forgotten.
    path
        Configuration path of the rules, for validation messages (e.g. ``"alerts.rules"``).

    Examples
    --------
    >>> eng = AlertEngine([{"name": "Drift", "kind": "test_rejected", "test": "tcal",
    ...                     "consecutive": 2, "clear_after": 2}])
    >>> def ev(decision):
    ...     return {"model": "m", "segment": "all", "window": "1h", "n": 1000, "metrics": {},
    ...             "tests": {"tcal": {"decision": decision, "p_value": 0.01, "statistic": 1.0}}}
    >>> [eng.evaluate([ev(d)], now=t)[0].state for t, d in enumerate(
    ...     ["miscalibrated", "miscalibrated", "calibrated", "miscalibrated", "calibrated", "calibrated"])]
    ['pending', 'firing', 'firing', 'firing', 'firing', 'resolved']
    """

    def __init__(self, rules: list[dict[str, Any]] | list[AlertRule], *, resolved_retention: float = 3600.0,
                 path: str = "alerts"):
        if rules and all(isinstance(r, AlertRule) for r in rules):
            self.rules: list[AlertRule] = list(rules)  # type: ignore[arg-type]
        else:
            self.rules = validate_rules(list(rules), path=path)
        if not (isinstance(resolved_retention, (int, float)) and resolved_retention >= 0):
            raise ValueError(f"resolved_retention: expected a number >= 0, got {resolved_retention!r}")
        self.resolved_retention = float(resolved_retention)
        self._rules_by_name = {r.name: r for r in self.rules}
        self._states: dict[tuple[str, str, str, str], AlertState] = {}
        self._exported: dict[int, set[tuple[str, ...]]] = {}

    @property
    def states(self) -> list[AlertState]:
        """Copies of all tracked states, sorted by (alert, model, segment, window)."""
        return [self._states[k].copy() for k in sorted(self._states)]

    def evaluate(self, evaluations: Sequence[Mapping[str, Any]], now: float) -> list[AlertState]:
        """Advance every rule on one scheduler round.

        Parameters
        ----------
        evaluations
            Dicts ``{"model", "segment", "window", "n", "metrics": {name: float},
            "tests": {name: {"decision", "p_value", "statistic", ...}}}``.
        now
            Round time, epoch seconds.

        Returns
        -------
        list[AlertState]
            Copies of every tracked state (inactive ones only for keys judged in this round).
        """
        if not isinstance(evaluations, list | tuple):
            raise ValueError(f"evaluations: expected a list of dicts, got {type(evaluations).__name__}")
        now = float(now)
        touched: set[tuple[str, str, str, str]] = set()
        for i, ev in enumerate(evaluations):
            if not isinstance(ev, dict):
                raise ValueError(f"evaluations[{i}]: expected a dict, got {type(ev).__name__}")
            try:
                model, segment, window = str(ev["model"]), str(ev["segment"]), str(ev["window"])
            except KeyError as exc:
                raise ValueError(f"evaluations[{i}].{exc.args[0]}: missing") from None
            for rule in self.rules:
                if not rule.applies_to(ev) or not rule.selects(model, segment, window):
                    continue
                key = (rule.name, model, segment, window)
                st = self._states.get(key)
                if st is None:
                    st = AlertState(rule.name, model, segment, window, rule.severity, since=now,
                                    labels=dict(rule.labels))
                bad, value = rule.judge(ev)
                self._step(rule, st, bad, value, now)
                st.annotations = self._annotations(rule, st, ev)
                self._states[key] = st
                touched.add(key)
        for key, st in list(self._states.items()):
            if key in touched:
                continue
            if key[0] not in self._rules_by_name or st.state == "inactive":
                del self._states[key]
            elif st.state == "resolved" and now - st.since > self.resolved_retention:
                del self._states[key]
        for key, st in list(self._states.items()):
            if st.state == "resolved" and key in touched and now - st.since > self.resolved_retention:
                st.state, st.since = "inactive", now
        return self.states

    @staticmethod
    def _step(rule: AlertRule, st: AlertState, bad: bool | None, value: float | None, now: float) -> None:
        st.value = value
        if bad is None:
            return
        st.last_evaluated = now
        if bad:
            st.bad_streak += 1
            st.ok_streak = 0
            if st.state in ("inactive", "resolved"):
                st.state, st.since = "pending", now
            if st.state == "pending" and st.bad_streak >= rule.consecutive:
                st.state, st.since, st.started_at, st.ended_at = "firing", now, now, None
        else:
            st.ok_streak += 1
            st.bad_streak = 0
            if st.state == "pending":
                st.state, st.since = "inactive", now
            elif st.state == "firing" and st.ok_streak >= rule.clear_after:
                st.state, st.since, st.ended_at = "resolved", now, now

    @staticmethod
    def _annotations(rule: AlertRule, st: AlertState, ev: Mapping[str, Any]) -> dict[str, str]:
        values = {
            "alert": rule.name, "model": st.model, "segment": st.segment, "window": st.window,
            "severity": rule.severity, "value": _fmt(st.value),
            "threshold": _fmt(rule.threshold), "test": rule.test or "", "metric": rule.metric or "",
            "n": str(ev.get("n", "")),
        }
        ann = {k: _render(v, values) for k, v in rule.annotations}
        if "summary" not in ann:
            if rule.kind == "test_rejected":
                ann["summary"] = (f"{rule.test} rejects calibration of {st.model} (segment {st.segment}, "
                                  f"window {st.window}, p = {values['value']})")
            else:
                ann["summary"] = (f"{rule.metric} = {values['value']} {rule.op} {values['threshold']} for "
                                  f"{st.model} (segment {st.segment}, window {st.window})")
        return ann

    def update_gauge(self, gauge: Any) -> None:
        """Set a prometheus-client ``Gauge`` labelled (alert, model, segment, window, severity).

        Firing states are 1, other tracked states 0; label sets no longer tracked are removed.
        """
        wanted = {}
        for st in self._states.values():
            labels = st.prometheus_labels()
            wanted[tuple(labels[k] for k in ("alert", "model", "segment", "window", "severity"))] = (
                1.0 if st.active else 0.0)
        previous = self._exported.get(id(gauge), set())
        for key in previous - set(wanted):
            try:
                gauge.remove(*key)
            except KeyError:
                pass
        for key, v in wanted.items():
            gauge.labels(*key).set(v)
        self._exported[id(gauge)] = set(wanted)

    def to_dict(self) -> dict[str, Any]:
        """Checkpoint: the states (JSON-serialisable)."""
        return {"version": 1, "states": [st.to_dict() for st in self.states]}

    def load_state(self, d: dict[str, Any]) -> None:
        """Restore states from :meth:`to_dict`; states of rules no longer configured are dropped."""
        if not isinstance(d, dict) or d.get("version") != 1 or not isinstance(d.get("states"), list):
            raise ValueError("alert state: expected {'version': 1, 'states': [...]}")
        self._states = {}
        for raw in d["states"]:
            st = AlertState.from_dict(raw)
            rule = self._rules_by_name.get(st.alert)
            if rule is None:
                continue
            if st.state not in STATES:
                raise ValueError(f"alert state: unknown state {st.state!r}")
            st.severity = rule.severity
            self._states[st.key] = st

    @classmethod
    def from_dict(cls, d: dict[str, Any], rules: list[dict[str, Any]] | list[AlertRule],
                  **kwargs: Any) -> AlertEngine:
        """An engine with ``rules`` and the states of checkpoint ``d``."""
        eng = cls(rules, **kwargs)
        eng.load_state(d)
        return eng
