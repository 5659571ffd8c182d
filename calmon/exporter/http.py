"""The agent's HTTP endpoint: /metrics, /healthz, /readyz, / and /model/NAME (status pages), /api/status (JSON).

A :class:`http.server.ThreadingHTTPServer` in a daemon thread.  TLS uses the standard
:mod:`ssl` module (server certificate, optional client-certificate verification); the TLS
handshake runs in the request's own thread so a slow client cannot block the listener.
Connections are bounded (:mod:`calmon.exporter.connections`): a request head must arrive
within ``header_timeout``, a keep-alive connection is closed after ``idle_timeout`` without a
request, and at most ``max_connections`` are open (a new one evicts the longest-idle one), so
idle or slow clients never hold threads for long and ``/metrics`` stays reachable.
Basic authentication (RFC 7617) protects every path except ``/healthz`` and ``/readyz``,
which carry no data and must stay reachable by orchestrator probes.  A response's head and body
leave in one write, on plain HTTP a blocking one (:func:`send_all`): a multi-MB ``/metrics`` then
takes the GIL back once, not once per chunk the socket buffer takes, while the agent's other
threads run Python.
"""

from __future__ import annotations

import base64
import gzip
import hmac
import json
import socket
import ssl
import struct
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs

from calmon.exporter.connections import ConnectionTable, HTTPLimits

__all__ = ["Endpoints", "HTTPExporter", "HTTPLimits", "accepts_gzip", "send_all", "tls_context"]

OPEN_PATHS = ("/healthz", "/readyz")
CONTENT_TYPE_METRICS = "text/plain; version=0.0.4; charset=utf-8"


def accepts_gzip(header: str | None) -> bool:
    """Whether an ``Accept-Encoding`` header accepts gzip (a ``q=0`` refuses it).

    Examples
    --------
    >>> accepts_gzip("gzip"), accepts_gzip("deflate, gzip;q=0.5"), accepts_gzip("gzip;q=0"), accepts_gzip(None)
    (True, True, False, False)
    """
    for item in (header or "").split(","):
        coding, _, params = item.strip().partition(";")
        if coding.strip().lower() in ("gzip", "x-gzip"):
            q = params.strip().lower().removeprefix("q=").strip() if params.strip().lower().startswith("q=") else "1"
            try:
                return float(q) > 0
            except ValueError:
                return False
    return False


#: Below this many bytes a response is written as any socket write (it fits the socket's buffer at once).
BLOCKING_WRITE_BYTES = 64 * 1024


def send_all(sock: socket.socket, data: bytes, timeout: float | None) -> None:
    """Write ``data`` to ``sock`` whole, with one release of the GIL on a plain socket; ``timeout`` bounds each stall.

    A socket with a Python timeout is non-blocking underneath: ``sendall`` writes what the socket buffer takes,
    polls, and takes the GIL back after every partial write -- once per buffer's worth of a 3 MB ``/metrics``
    while the client reads slower than the agent writes -- and while the agent's other threads run Python, each
    take waits up to the switch interval (5 ms).  So a large
    response is written on the blocking socket, the kernel's send timeout (``SO_SNDTIMEO``) bounding a client
    that stops reading as the Python timeout did (a stall longer than ``timeout`` raises ``TimeoutError``); the
    thread then holds no GIL until the last byte is in the kernel.  TLS sockets keep the Python timeout (a blocking
    ``SSL_write`` would retry a timed-out send forever), as does a platform without ``SO_SNDTIMEO``.
    """
    if len(data) < BLOCKING_WRITE_BYTES or isinstance(sock, ssl.SSLSocket) or not hasattr(socket, "SO_SNDTIMEO"):
        sock.sendall(data)
        return
    before = sock.gettimeout()
    try:
        if timeout is not None:
            sec = int(timeout)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO,
                            struct.pack("ll", sec, int((timeout - sec) * 1e6)))
        sock.settimeout(None)
    except OSError:  # an option this platform's socket refuses: the ordinary write
        sock.settimeout(before)
        sock.sendall(data)
        return
    try:
        sock.sendall(data)
    except BlockingIOError as exc:  # the kernel's send timeout: the client read nothing for ``timeout``
        raise TimeoutError(f"client read nothing for {timeout} s") from exc
    finally:
        sock.settimeout(before)


class Endpoints:
    """What the server serves; each callable is invoked per request.

    Parameters
    ----------
    metrics
        Returns the Prometheus text exposition (bytes).
    healthy
        True while the agent's threads are alive.
    ready
        True when sources are connected and the state is loaded.
    status
        Returns the status snapshot (a JSON-serialisable dict).
    status_html
        Renders the snapshot to an HTML page (per request; used when ``pages`` is not given).
    metrics_collect
        Returns the named tiers of the round part (``/metrics?collect[]=TIER``; raises ``ValueError`` for an
        unknown one: 400); ``None``: a process without rounds, whose ``collect[]`` is empty.
    pages
        Returns the body of a status page -- ``pages(path, query)`` for ``/`` and ``/model/NAME``, the
        query string parsed -- or ``None`` when there is no such page (404); e.g.
        :meth:`calmon.exporter.status.pages.StatusPages.serve`, which caches a round's pages.
    """

    def __init__(self, metrics: Callable[[], bytes], healthy: Callable[[], bool], ready: Callable[[], bool],
                 status: Callable[[], dict[str, Any]], status_html: Callable[[dict[str, Any]], str],
                 pages: Callable[[str, dict[str, list[str]]], bytes | None] | None = None,
                 metrics_collect: Callable[[list[str]], bytes] | None = None) -> None:
        self.metrics = metrics
        self.metrics_collect = metrics_collect
        self.healthy = healthy
        self.ready = ready
        self.status = status
        self.status_html = status_html
        self.pages = pages


def _handler(endpoints: Endpoints, auth: tuple[str, str] | None, table: ConnectionTable,
             ) -> type[BaseHTTPRequestHandler]:
    expected = None
    if auth is not None:
        expected = b"Basic " + base64.b64encode(f"{auth[0]}:{auth[1]}".encode())

    class Handler(BaseHTTPRequestHandler):
        server_version = "calmon"
        protocol_version = "HTTP/1.1"
        #: per recv/send: bounds the writes to a client that stops reading (reads are bounded by the table)
        timeout = table.limits.header_timeout + table.limits.idle_timeout
        _headers_buffer: list[bytes]  # BaseHTTPRequestHandler's head being written (send_header appends to it)

        def parse_request(self) -> bool:
            ok = super().parse_request()
            if ok:
                table.busy(self.connection)
            return ok

        def handle_one_request(self) -> None:
            super().handle_one_request()
            if not self.close_connection:
                table.idle(self.connection)

        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - silence access logs
            return

        def _send(self, code: int, body: bytes, ctype: str, extra: dict[str, str] | None = None) -> None:
            self.send_response(code)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            self.send_header("Cache-Control", "no-store")
            for k, v in (extra or {}).items():
                self.send_header(k, v)
            # the head and the body in one write (end_headers would flush the head as a write of its own); an
            # HTTP/0.9 request has no head (send_header buffered nothing)
            lines = getattr(self, "_headers_buffer", [])
            head = b"".join(lines) + b"\r\n" if self.request_version != "HTTP/0.9" else b""
            self._headers_buffer = []
            send_all(self.connection, head if self.command == "HEAD" else head + body, self.timeout)

        def _metrics(self, collect: list[str] | None) -> None:
            if collect is None:
                body = endpoints.metrics()
            elif endpoints.metrics_collect is None:
                body = b""  # a process without rounds (a cluster's ingest worker) has no tier to serve
            else:
                try:
                    body = endpoints.metrics_collect(collect)
                except ValueError as exc:
                    self._send(400, f"{exc}\n".encode(), "text/plain; charset=utf-8")
                    return
            if accepts_gzip(self.headers.get("Accept-Encoding")):
                # Prometheus asks for gzip: ~10x fewer bytes on the wire for a few ms of one core (level 1)
                self._send(200, gzip.compress(body, compresslevel=1), CONTENT_TYPE_METRICS,
                           {"Content-Encoding": "gzip", "Vary": "Accept-Encoding"})
            else:
                self._send(200, body, CONTENT_TYPE_METRICS, {"Vary": "Accept-Encoding"})

        def _authorised(self) -> bool:
            if expected is None:
                return True
            got = (self.headers.get("Authorization") or "").encode()
            return hmac.compare_digest(got, expected)

        def do_HEAD(self) -> None:  # noqa: N802 - http.server naming
            self.do_GET()

        def do_GET(self) -> None:  # noqa: N802 - http.server naming
            path, _, qs = self.path.partition("?")
            path = path.rstrip("/") or "/"
            if path not in OPEN_PATHS and not self._authorised():
                self._send(401, b"unauthorized\n", "text/plain; charset=utf-8",
                           {"WWW-Authenticate": 'Basic realm="calmon", charset="UTF-8"'})
                return
            try:
                if path == "/metrics":
                    self._metrics(parse_qs(qs[:2048]).get("collect[]"))
                elif path == "/healthz":
                    ok = endpoints.healthy()
                    self._send(200 if ok else 503, b"ok\n" if ok else b"unhealthy\n", "text/plain; charset=utf-8")
                elif path == "/readyz":
                    ok = endpoints.ready()
                    self._send(200 if ok else 503, b"ready\n" if ok else b"not ready\n", "text/plain; charset=utf-8")
                elif path == "/api/status":
                    body = json.dumps(endpoints.status(), allow_nan=False, default=str).encode()
                    self._send(200, body, "application/json")
                elif endpoints.pages is not None and (path in ("/", "/index.html") or path.startswith("/model/")):
                    page = endpoints.pages(path, parse_qs(qs[:2048]))
                    if page is None:
                        self._send(404, b"no such model in this round\n", "text/plain; charset=utf-8")
                    else:
                        self._send(200, page, "text/html; charset=utf-8")
                elif path in ("/", "/index.html"):
                    html = endpoints.status_html(endpoints.status())
                    self._send(200, html.encode(), "text/html; charset=utf-8")
                else:
                    self._send(404, b"not found\n", "text/plain; charset=utf-8")
            except (BrokenPipeError, ConnectionResetError, TimeoutError):
                self.close_connection = True  # a response cut short: the connection cannot carry another
            except Exception as exc:  # noqa: BLE001 - a failing page must not kill the server
                self._send(500, f"internal error: {type(exc).__name__}: {exc}\n".encode(), "text/plain; charset=utf-8")

    return Handler


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 128
    tls: ssl.SSLContext | None = None
    table: ConnectionTable

    def process_request(self, request: Any, client_address: Any) -> None:
        if not self.table.admit(request):  # every slot busy serving: refuse at once, spawn nothing
            self.shutdown_request(request)
            return
        super().process_request(request, client_address)

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self.table.release(request)

    def finish_request(self, request: Any, client_address: Any) -> None:
        if self.tls is not None:
            request.settimeout(self.table.limits.header_timeout)
            raw = request
            try:
                request = self.tls.wrap_socket(request, server_side=True)
            except (ssl.SSLError, OSError):
                return
            self.table.rebind(raw, request)
        try:
            super().finish_request(request, client_address)
        finally:
            self.table.release(request)

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A connection shut down by the table (or reset by its client) is not an error worth a traceback."""
        return


def tls_context(cert_file: str, key_file: str, client_ca_file: str = "") -> ssl.SSLContext:
    """Server-side TLS context (TLS >= 1.2); with ``client_ca_file`` client certificates are required."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.load_cert_chain(cert_file, key_file)
    if client_ca_file:
        ctx.load_verify_locations(client_ca_file)
        ctx.verify_mode = ssl.CERT_REQUIRED
    return ctx


class HTTPExporter:
    """Serve :class:`Endpoints` on ``address:port`` in a background thread.

    Parameters
    ----------
    endpoints
        What to serve.
    address, port
        Listening address (``"0.0.0.0"`` for every interface) and port (0 = pick a free one).
    tls
        Optional server TLS context (see :func:`tls_context`).
    basic_auth
        Optional ``(username, password)``.
    limits
        Header and idle timeouts, connection cap (default :class:`HTTPLimits`).

    Examples
    --------
    >>> import urllib.request
    >>> ep = Endpoints(lambda: b"calmon_ready 1\\n", lambda: True, lambda: True, lambda: {}, lambda s: "<html/>")
    >>> srv = HTTPExporter(ep, "127.0.0.1", 0).start()
    >>> urllib.request.urlopen(f"{srv.url}/metrics").read()
    b'calmon_ready 1\\n'
    >>> srv.stop()
    """

    def __init__(self, endpoints: Endpoints, address: str = "127.0.0.1", port: int = 9464,
                 tls: ssl.SSLContext | None = None, basic_auth: tuple[str, str] | None = None,
                 limits: HTTPLimits | None = None) -> None:
        self.tls = tls
        self.connections = ConnectionTable(limits or HTTPLimits())
        family = socket.AF_INET6 if ":" in address else socket.AF_INET
        server_cls = type("Server", (_Server,), {"address_family": family, "tls": tls, "table": self.connections})
        self.server = server_cls((address, port), _handler(endpoints, basic_auth, self.connections))
        self.address = address
        self.port = int(self.server.server_address[1])
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        host = self.address if self.address not in ("0.0.0.0", "::", "") else "127.0.0.1"  # noqa: S104
        if ":" in host:
            host = f"[{host}]"
        return f"{'https' if self.tls else 'http'}://{host}:{self.port}"

    def start(self) -> HTTPExporter:
        self.connections.start()
        self._thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.2},
                                        name="calmon-http", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.connections.stop()
        if self._thread is not None:
            self._thread.join(timeout=5)
