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

from calmon.alerts.alertmanager import AlertmanagerClient
from calmon.alerts.engine import STATES, AlertEngine, AlertState
from calmon.alerts.rules import KINDS, AlertRule, validate_rules

__all__ = [
    "KINDS",
    "STATES",
    "AlertEngine",
    "AlertRule",
    "AlertState",
    "AlertmanagerClient",
    "validate_rules",
]
