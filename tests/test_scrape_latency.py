"""What a ``/metrics`` scrape costs on the request path while the agent's other threads run Python (issue #35).

A scrape's wall time is its own interpreter steps times the share of the GIL it gets, plus a wait of up to the
switch interval each time it takes the GIL back after I/O.  So these tests count steps, deterministically, instead
of timing them: the live part's Python calls per series, the cyclic collector kept off the request path, and the
response written by one blocking write (one GIL release) instead of a write per chunk the socket buffer takes.
"""

from __future__ import annotations

import gc
import socket
import struct
import sys
import threading
import time
import urllib.request

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from calmon.exporter.http import Endpoints, HTTPExporter, send_all
from calmon.exporter.live import render_live
from calmon.exporter.metrics import AgentCollector, AgentMetrics
from calmon.exporter.views import LiveView

BOUNDS = [0.5, 1.0, 2.0, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0, 3600.0, 86400.0]


def live_view(models: int) -> LiveView:
    """A live view of ``models`` models with every family filled, as the agent's at 200 models."""
    names = [f"model-{i:04d}" for i in range(models)]
    delays = {m: {"buckets": [(le, 3 * k) for k, le in enumerate(BOUNDS)], "sum": 812.5, "count": 40} for m in names}
    signals = {"residual": {"detections": 2, "last": {"change_point": 1.7e9 + 0.25}}, "score": {"detections": 0}}
    return LiveView(
        ready=True, watermark=1.7e9,
        events={(m, k): 1_234_567 + i for i, m in enumerate(names) for k in ("prediction", "outcome", "labeled")},
        rejected={"not_json": 3, "too_many_models": 2_000_000}, late={m: 1 for m in names},
        join={"joined": {m: 5 for m in names}, "expired": {m: 2 for m in names}, "duplicates": {m: 0 for m in names},
              "orphans": 4, "late_outcomes": {m: 1 for m in names}, "delays": {}},
        pending={m: 30 for m in names}, delays=delays,  # type: ignore[arg-type]
        sources={"events": {"records": 10, "lag_seconds": 2.5, "lag_bytes": 0, "lag_records": None},
                 'odd "name"\\\n': {"records": 3, "lag_seconds": None, "lag_bytes": None, "lag_records": 7}},
        checkpoint={"last_timestamp": 1.7e9, "duration": None, "count": 2},
        changes={m: {"signals": signals} for m in names})


def collector_text(view: LiveView, dropped: dict[str, tuple[int, int]]) -> str:
    """What ``prometheus_client`` writes for the live part (the reference :func:`render_live` must match)."""
    collector = AgentCollector(lambda: view)
    collector.dropped = dropped
    registry = CollectorRegistry(auto_describe=False)
    registry.register(collector)
    return generate_latest(registry).decode()


@pytest.mark.parametrize("models", [0, 1, 3])
def test_live_part_is_the_text_prometheus_client_writes(models):
    """Byte for byte: family order, label order and escaping, number formatting (1e6 and above, NaN), empty
    families, missing lags, a checkpoint without duration, a detector without a change."""
    view = live_view(models)
    dropped = {"window_cap": (3, 10), "total_cap": (0, 2_500_000)}
    assert render_live(view, dropped) == collector_text(view, dropped)
    assert render_live(LiveView(), {}) == collector_text(LiveView(), {})
    m = AgentMetrics(lambda: view)
    m.collector.dropped = dropped
    assert collector_text(view, dropped) in m.render().decode()


def test_live_part_costs_two_interpreter_calls_a_series():
    """At 200 models the live part is ~6,000 series rendered at every scrape: ``prometheus_client`` made 12
    Python calls a series (a ``Sample``, a label dict, escaping and formatting each); written straight to text it
    is at most 3 -- the steps a scrape must get the GIL for while the scheduler and the ingestion run."""
    view = live_view(200)
    m = AgentMetrics(lambda: view)
    m.render()  # imports and caches warmed
    series = sum(1 for line in collector_text(view, {}).splitlines() if line and not line.startswith("#"))
    calls = 0

    def count(frame, event, arg):
        nonlocal calls
        calls += event == "call"

    sys.setprofile(count)
    try:
        m.render()
    finally:
        sys.setprofile(None)
    assert series > 5000
    assert calls <= 3 * series, f"{calls} Python calls for {series} live series"


def test_scrape_renders_with_the_collector_paused():
    """A full collection falling due among a scrape's allocations traverses the agent's whole state (seconds at a
    thousand models): the render keeps it off the request path, and the collector is back on after."""
    seen = []

    def view():
        seen.append(gc.isenabled())
        return live_view(2)

    assert gc.isenabled()
    AgentMetrics(view).render()
    assert seen == [False] and gc.isenabled()


def test_metrics_response_is_one_blocking_write(monkeypatch):
    """The head and a multi-MB body go out in one ``sendall`` on a blocking socket -- one release of the GIL
    until the last byte is in the kernel -- bounded by the kernel's send timeout (the handler's timeout) instead
    of Python's, whose non-blocking ``sendall`` takes the GIL back after every chunk the socket buffer took."""
    body = b"calmon_x 1.0\n" * 300_000  # ~3.9 MB, the size of /metrics at 200 models
    writes: list[tuple[int, float | None, tuple[int, int]]] = []
    plain_sendall = socket.socket.sendall

    def recording(self, data, *args):
        if len(data) >= len(body):
            sndtimeo = struct.unpack("ll", self.getsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, 16))
            writes.append((len(data), self.gettimeout(), sndtimeo))
        return plain_sendall(self, data, *args)

    monkeypatch.setattr(socket.socket, "sendall", recording)
    srv = HTTPExporter(Endpoints(lambda: body, lambda: True, lambda: True, dict, str), "127.0.0.1", 0).start()
    try:
        with urllib.request.urlopen(f"{srv.url}/metrics", timeout=60) as resp:
            assert resp.read() == body
        timeout = srv.connections.limits.header_timeout + srv.connections.limits.idle_timeout
        assert len(writes) == 1, writes
        size, python_timeout, sndtimeo = writes[0]
        assert size > len(body) and python_timeout is None and sndtimeo == (int(timeout), 0)
        with urllib.request.urlopen(f"{srv.url}/healthz", timeout=60) as resp:  # the connection's timeout is back
            assert resp.read() == b"ok\n"
    finally:
        srv.stop()


def test_a_client_that_stops_reading_is_cut_by_the_send_timeout():
    """The blocking write keeps the old bound: a client that reads nothing for ``timeout`` gets the write cut
    (``TimeoutError``), and the socket has its Python timeout back."""
    listener = socket.create_server(("127.0.0.1", 0))
    client = socket.socket()
    client.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 16)  # small buffers: 16 MB cannot fit them
    client.connect(listener.getsockname())
    server, _ = listener.accept()
    server.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 1 << 16)
    server.settimeout(30.0)
    outcome: list[BaseException | None] = []

    def write():
        try:
            send_all(server, b"x" * (16 << 20), 0.3)
            outcome.append(None)
        except BaseException as exc:  # noqa: BLE001 - the test inspects it
            outcome.append(exc)

    t = threading.Thread(target=write, daemon=True)
    started = time.monotonic()
    t.start()
    t.join(60)
    try:
        assert not t.is_alive(), "the write to a client that reads nothing never ended"
        assert isinstance(outcome[0], TimeoutError), outcome
        assert server.gettimeout() == 30.0 and time.monotonic() - started < 60
    finally:
        for s in (client, server, listener):
            s.close()

