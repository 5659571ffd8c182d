"""Push alert states to Alertmanager's v2 API."""

from __future__ import annotations

import json
import urllib.error
import urllib.parse
import urllib.request
from datetime import datetime, timezone
from typing import Any

from calmon.alerts.engine import AlertState, _fmt

__all__ = ["AlertmanagerClient"]


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
