"""Alert engine: calibration alert rules evaluated on each scheduler round.

Rules come from the agent's configuration as plain dicts and are validated by
:func:`validate_rules` (a ``ValueError`` names the offending key).  Two kinds exist:

``test_rejected``
    a registered tester (``test``) decides ``"miscalibrated"`` in ``consecutive`` consecutive
    evaluations of a (model, segment, window);
``threshold``
    a metric (``metric``: a key of the evaluation's ``metrics``, or ``tests.<name>.<field>``
    such as ``tests.tcal.p_value``) compared with ``threshold`` by ``op`` is bad in
    ``consecutive`` consecutive evaluations.

Both kinds ignore evaluations whose window holds fewer than ``min_events`` events (and
testers answering ``"insufficient data"``, and missing or non-finite values): such an
evaluation is *unknown* and neither advances nor resets the streaks, so a firing alert does
not flap while a window refills.

Each (rule, model, segment, window) has a state machine::

    inactive --bad--> pending --(consecutive bad)--> firing --(clear_after OK)--> resolved
       ^                 |                                                         |
       +------OK---------+                                <---------bad------------+ (-> pending)

``consecutive = 1`` fires on the first bad evaluation (no pending state is visible); a firing
alert needs ``clear_after`` consecutive OK evaluations to resolve (hysteresis).  Resolved
states are kept for ``resolved_retention`` seconds so that the resolution reaches
Alertmanager, then forgotten.

The states are exported as the ``calmon_alert_active{alert,model,segment,window,severity}``
gauge (1 while firing) by :meth:`AlertEngine.update_gauge`, optionally pushed to
Alertmanager's v2 API by :class:`AlertmanagerClient`, and checkpointed with
:meth:`AlertEngine.to_dict` / :meth:`AlertEngine.from_dict`.

References
----------
Prometheus alerting rules (``for``, pending/firing) and the Alertmanager v2 API
(``POST /api/v2/alerts``, ``startsAt``/``endsAt``): https://prometheus.io/docs/alerting/.
"""

from __future__ import annotations

import fnmatch
import json
import math
import re
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import asdict, dataclass, field, replace
from datetime import datetime, timezone
from typing import Any

__all__ = [
    "KINDS",
    "STATES",
    "AlertEngine",
    "AlertRule",
    "AlertState",
    "AlertmanagerClient",
    "validate_rules",
]

KINDS = ("test_rejected", "threshold")
STATES = ("inactive", "pending", "firing", "resolved")
OPS = {
    ">": lambda v, t: v > t,
    ">=": lambda v, t: v >= t,
    "<": lambda v, t: v < t,
    "<=": lambda v, t: v <= t,
}
_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_LABEL_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_TEMPLATE_RE = re.compile(r"\{(alert|model|segment|window|severity|value|threshold|test|metric|n)\}")
_ALLOWED_KEYS = {
    "name", "kind", "test", "metric", "op", "threshold", "min_events", "consecutive", "clear_after",
    "models", "segments", "windows", "severity", "labels", "annotations",
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

    def selects(self, model: str, segment: str, window: str) -> bool:
        """True when the rule's selectors match this (model, segment, window)."""
        return (
            any(fnmatch.fnmatchcase(model, p) for p in self.models)
            and any(fnmatch.fnmatchcase(segment, p) for p in self.segments)
            and any(fnmatch.fnmatchcase(window, p) for p in self.windows)
        )

    def judge(self, ev: dict[str, Any]) -> tuple[bool | None, float | None]:
        """Judge one evaluation: ``(True, value)`` bad, ``(False, value)`` OK, ``(None, value)`` unknown."""
        n = ev.get("n", 0)
        try:
            n_ok = float(n) >= self.min_events
        except (TypeError, ValueError):
            n_ok = False
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
            return decision == "miscalibrated", value
        value = _lookup(ev, self.metric or "")
        if value is None or not n_ok:
            return None, value
        return bool(OPS[self.op](value, float(self.threshold))), value  # type: ignore[arg-type]


def _finite(v: Any) -> float | None:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return None
    v = float(v)
    return v if math.isfinite(v) else None


def _lookup(ev: dict[str, Any], path: str) -> float | None:
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
        where = f"{path}[{i}]"
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
        test = metric = None
        op = ">"
        threshold = None
        if kind == "test_rejected":
            test = rule.get("test")
            if not isinstance(test, str) or not test:
                raise ValueError(f"{where}.test: required for kind 'test_rejected' (a tester name)")
            for k in ("metric", "op", "threshold"):
                if k in rule:
                    raise ValueError(f"{where}.{k}: only valid for kind 'threshold'")
        else:
            if "test" in rule:
                raise ValueError(f"{where}.test: only valid for kind 'test_rejected' "
                                 "(use metric: tests.NAME.FIELD)")
            metric = rule.get("metric")
            if not isinstance(metric, str) or not metric:
                raise ValueError(f"{where}.metric: required for kind 'threshold' (a metric name or "
                                 "tests.NAME.FIELD)")
            if metric.startswith("tests.") and len(metric.split(".", 2)) != 3:
                raise ValueError(f"{where}.metric: expected tests.NAME.FIELD, got {metric!r}")
            op = rule.get("op", ">")
            if op not in OPS:
                raise ValueError(f"{where}.op: expected one of {', '.join(OPS)}, got {op!r}")
            t = rule.get("threshold")
            if isinstance(t, bool) or not isinstance(t, (int, float)) or not math.isfinite(t):
                raise ValueError(f"{where}.threshold: required for kind 'threshold' (a finite number)")
            threshold = float(t)
        severity = rule.get("severity", "warning")
        if severity not in _SEVERITIES:
            raise ValueError(f"{where}.severity: expected one of {', '.join(_SEVERITIES)}, got {severity!r}")
        rules.append(AlertRule(
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
        ))
    return rules


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

    def evaluate(self, evaluations: list[dict[str, Any]], now: float) -> list[AlertState]:
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
        if not isinstance(evaluations, list):
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
                if not rule.selects(model, segment, window):
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
    def _annotations(rule: AlertRule, st: AlertState, ev: dict[str, Any]) -> dict[str, str]:
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


def _rfc3339(t: float) -> str:
    return datetime.fromtimestamp(t, tz=timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class AlertmanagerClient:
    """Push alert states to Alertmanager's v2 API (``POST /api/v2/alerts``).

    Firing alerts are sent with ``endsAt = now + firing_ttl`` (Alertmanager resolves them by
    itself if the agent dies; re-push more often than that), resolved ones with
    ``endsAt`` = the resolution time.  Network and HTTP errors are counted, never raised.

    Parameters
    ----------
    url
        Alertmanager base URL, ``http(s)://host:port`` (path prefix allowed).
    timeout
        Seconds per request.
    firing_ttl
        Seconds added to ``now`` for the ``endsAt`` of firing alerts.
    generator_url
        Link shown by Alertmanager (e.g. the agent's status page).
    headers
        Extra HTTP headers (e.g. ``Authorization``).
    external_labels
        Labels added to every alert (e.g. ``{"instance": "calmon-0"}``).

    Examples
    --------
    >>> c = AlertmanagerClient("http://127.0.0.1:9")
    >>> c.payload([AlertState("Drift", "m", "all", "1h", "warning", state="firing", since=0.0,
    ...                       started_at=0.0)], now=60.0)[0]["endsAt"]
    '1970-01-01T00:06:00.000000Z'
    """

    def __init__(self, url: str, *, timeout: float = 5.0, firing_ttl: float = 300.0, generator_url: str = "",
                 headers: dict[str, str] | None = None, external_labels: dict[str, str] | None = None):
        parsed = urllib.parse.urlparse(url)
        if parsed.scheme not in ("http", "https") or not parsed.netloc:
            raise ValueError(f"alertmanager.url: expected http(s)://host:port, got {url!r}")
        if not (isinstance(timeout, (int, float)) and timeout > 0):
            raise ValueError(f"alertmanager.timeout: expected a number > 0, got {timeout!r}")
        if not (isinstance(firing_ttl, (int, float)) and firing_ttl > 0):
            raise ValueError(f"alertmanager.firing_ttl: expected a number > 0, got {firing_ttl!r}")
        self.url = url.rstrip("/") + "/api/v2/alerts"
        self.timeout = float(timeout)
        self.firing_ttl = float(firing_ttl)
        self.generator_url = generator_url
        self.headers = dict(headers or {})
        self.external_labels = dict(external_labels or {})
        self.sent_total = 0
        self.errors_total = 0
        self.last_error: str | None = None

    def payload(self, states: list[AlertState], now: float) -> list[dict[str, Any]]:
        """The JSON body for ``states`` (firing and resolved ones only)."""
        out = []
        for st in states:
            if st.state not in ("firing", "resolved"):
                continue
            labels = {**self.external_labels, **st.labels, "alertname": st.alert, "model": st.model,
                      "segment": st.segment, "window": st.window, "severity": st.severity}
            start = st.started_at if st.started_at is not None else st.since
            end = (now + self.firing_ttl) if st.state == "firing" else (st.ended_at or st.since)
            annotations = dict(st.annotations)
            if st.value is not None:
                annotations["value"] = _fmt(st.value)
            item: dict[str, Any] = {
                "labels": labels,
                "annotations": annotations,
                "startsAt": _rfc3339(start),
                "endsAt": _rfc3339(max(end, start)),
            }
            if self.generator_url:
                item["generatorURL"] = self.generator_url
            out.append(item)
        return out

    def push(self, states: list[AlertState], now: float) -> bool:
        """POST the firing and resolved states; returns True on success (also when nothing to send)."""
        body = self.payload(states, now)
        if not body:
            return True
        req = urllib.request.Request(  # noqa: S310 -- scheme checked in __init__
            self.url, data=json.dumps(body).encode(), method="POST",
            headers={"Content-Type": "application/json", **self.headers},
        )
        try:
            with urllib.request.urlopen(req, timeout=self.timeout) as resp:  # noqa: S310
                resp.read()
                status = resp.status
        except urllib.error.HTTPError as exc:
            self.errors_total += 1
            self.last_error = f"HTTP {exc.code}: {exc.read()[:200].decode(errors='replace')}"
            return False
        except (urllib.error.URLError, OSError, ValueError) as exc:
            self.errors_total += 1
            self.last_error = f"{type(exc).__name__}: {exc}"
            return False
        if not 200 <= status < 300:
            self.errors_total += 1
            self.last_error = f"HTTP {status}"
            return False
        self.sent_total += len(body)
        return True
