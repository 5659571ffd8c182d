"""A Kafka consumer in a reader process: the client library's per-record work on another core.

confluent-kafka turns every record into a Python ``Message`` while holding the GIL, so on the agent's thread a
consume costs about as much as the agent's own work on the record (``docs/kafka.md``, "Where a record's CPU
goes"). :class:`ReaderProcessConsumer` runs the library's adapter (:class:`~connectors.kafka.confluent.
ConfluentConsumer`) in a child process and is itself a :class:`~connectors.kafka.clients.ConsumerClient`: the
source keeps every policy and sees the same calls and events as with the adapter in-process.

How the two ends agree
----------------------
- **Calls** (commit, seek, pause, committed, ...) are requests over a socket pair (:mod:`connectors.kafka.wire`),
  answered in order. A poll's records come back as one payload.
- **One batch ahead.** After answering a poll the child consumes the next batch (``prefetch``) while the agent
  works on this one, and holds it until the next poll. It never holds more than one. A ``seek`` drops the held
  records of that partition; a ``pause`` drops them and seeks the partition back to the first one dropped, so a
  paused partition's records are neither delivered nor skipped.
- **Rebalance events** happen inside the child's consume. The child forwards each one and waits (inside the
  library's callback, as an in-process adapter would) while serving the calls the handler makes, until the
  parent says it is done. The parent runs handlers only inside :meth:`~ReaderProcessConsumer.poll` and
  :meth:`~ReaderProcessConsumer.start`, where an in-process adapter runs them; an event that arrives during
  another call waits for the next poll. A consume starts only when no batch is held, so events always follow the
  batches consumed before them.
- **Lag and connection** ride on each poll's reply (high watermarks of the assigned partitions, ``connected``).
- **Failures.** A library error is raised in the parent as the same :class:`KafkaClientError` or
  :class:`KafkaConfigError`. A child that dies or stops answering is a fatal :class:`KafkaClientError`: the source
  drops the consumer and starts a new one from its own positions, as after any fatal client error.
- **No orphans.** The child asks Linux to kill it when its parent dies (``PR_SET_PDEATHSIG``), exits when its
  socket closes, and ignores SIGINT (the agent stops it on shutdown).

Examples
--------
>>> from connectors.kafka.clients import ConsumerSettings
>>> c = ReaderProcessConsumer(ConsumerSettings("127.0.0.1:9", ["t"], None, "s"))
>>> c.config()["group.id"], c.connected, c.highwater(TP("t", 0))
('calmon-s-nogroup', False, None)
"""

from __future__ import annotations

import collections
import gc
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Mapping
from typing import Any, ClassVar

from connectors.kafka.clients import (
    ConsumerClient,
    ConsumerEvents,
    ConsumerSettings,
    Fetched,
    KafkaClientError,
    KafkaConfigError,
)
from connectors.kafka.confluent import ConfluentConsumer
from connectors.kafka.positions import TP
from connectors.kafka.wire import Channel, decode_fetched, encode_fetched, without

log = logging.getLogger(__name__)

#: Longest wait for the child's answer beyond the call's own timeout before it counts as hung.
GRACE = 30.0
#: A prefetching consume's timeout: a call arriving meanwhile waits at most about this long.
PREFETCH_TIMEOUT = 0.05
#: Seconds between the child's garbage collections.
COLLECT_EVERY = 10.0
#: Seconds to wait for the child to start and import the client library.
START_TIMEOUT = 60.0
_EVENTS = ("assigned", "revoked", "pending")
#: The reader's command (``-c``, not ``-m``: the package imports this module first, and runpy warns about that).
_ENTRY = "import sys; from connectors.kafka.reader import main; sys.exit(main(sys.argv[1:]))"


def _tps(raw: list[list[Any]]) -> list[TP]:
    return [TP(str(t), int(p)) for t, p in raw]


def _raw(tps: list[TP]) -> list[list[Any]]:
    return [[tp.topic, tp.partition] for tp in tps]


class ReaderProcessConsumer:
    """:class:`~connectors.kafka.clients.ConsumerClient` whose client library runs in a child process.

    Parameters
    ----------
    settings
        As for the in-process adapter; they are sent to the child (JSON-able values only).
    """

    library = "confluent"
    #: The adapter the child runs (its ``check_options`` and ``config`` are this class's too).
    INNER: ClassVar[type[ConfluentConsumer]] = ConfluentConsumer

    def __init__(self, settings: ConsumerSettings) -> None:
        self.settings = settings
        self._handler: ConsumerEvents | None = None
        self._proc: subprocess.Popen[bytes] | None = None
        self._chan: Channel | None = None
        self._stash: collections.deque[dict[str, Any]] = collections.deque()
        self._highwater: dict[TP, int] = {}
        self._connected = False
        self._lock = threading.RLock()  # one conversation at a time; a handler's calls re-enter it

    check_options = staticmethod(ConfluentConsumer.check_options)
    check_extra = staticmethod(ConfluentConsumer.check_extra)

    def config(self) -> dict[str, Any]:
        return self.INNER(self.settings).config()

    # ------------------------------------------------------------------ parent end
    def start(self, handler: ConsumerEvents, timeout: float) -> None:
        self._handler = handler
        if self._chan is None:  # (a channel already set: attached to a reader started elsewhere, e.g. a test's)
            self._spawn()
        s = self.settings
        settings = {"bootstrap_servers": s.bootstrap_servers, "topics": s.topics, "group_id": s.group_id,
                    "name": s.name, "options": s.options, "auto_offset_reset": s.auto_offset_reset,
                    "metadata": s.metadata}
        try:
            self._call({"op": "start", "settings": settings, "timeout": timeout}, START_TIMEOUT + timeout, True)
        except (KafkaClientError, KafkaConfigError):
            self.close(0.5)
            raise

    def _spawn(self) -> None:
        parent, child = socket.socketpair()
        try:
            self._proc = subprocess.Popen(  # noqa: S603 - our own module, no shell
                [sys.executable, "-c", _ENTRY, str(child.fileno())],
                pass_fds=(child.fileno(),), stdin=subprocess.DEVNULL, close_fds=True, env=_child_env(),
            )
        except OSError as exc:
            parent.close()
            raise KafkaClientError(f"cannot start the reader process: {exc}") from exc
        finally:
            child.close()
        self._chan = Channel(parent)

    def poll(self, max_records: int, timeout: float) -> Fetched:
        with self._lock:
            while self._stash:
                self._dispatch(self._stash.popleft())
            head, payload = self._call({"op": "poll", "max": int(max_records), "timeout": timeout}, timeout, True)
        self._connected = bool(head["connected"])
        self._highwater = {TP(t, int(p)): int(hw) for t, p, hw in head["highwater"]}
        return decode_fetched(head, payload)

    def committed(self, tps: list[TP], timeout: float) -> dict[TP, int]:
        head, _ = self._call({"op": "committed", "tps": _raw(tps), "timeout": timeout}, timeout)
        return {TP(t, int(p)): int(off) for t, p, off in head["offsets"]}

    def commit(self, offsets: Mapping[TP, int], timeout: float) -> None:
        raw = [[tp.topic, tp.partition, int(off)] for tp, off in offsets.items()]
        self._call({"op": "commit", "offsets": raw, "timeout": timeout}, timeout)

    def seek(self, tp: TP, offset: int) -> None:
        self._call({"op": "seek", "tps": _raw([tp]), "offset": int(offset)}, 0.0)

    def pause(self, tps: list[TP]) -> None:
        self._call({"op": "pause", "tps": _raw(tps)}, 0.0)

    def resume(self, tps: list[TP]) -> None:
        self._call({"op": "resume", "tps": _raw(tps)}, 0.0)

    def highwater(self, tp: TP) -> int | None:
        """From the latest poll's reply (no call to the child)."""
        return self._highwater.get(tp)

    def beginning_offset(self, tp: TP, timeout: float) -> int:
        head, _ = self._call({"op": "beginning", "tps": _raw([tp]), "timeout": timeout}, timeout)
        return int(head["offset"])

    @property
    def connected(self) -> bool:
        return self._chan is not None and self._connected

    def close(self, timeout: float) -> None:
        chan, proc, self._chan, self._proc = self._chan, self._proc, None, None
        if chan is not None:
            try:
                chan.send({"op": "close", "timeout": timeout})
                deadline = time.monotonic() + timeout + 5.0
                while (got := chan.recv(max(0.0, deadline - time.monotonic()))) is not None:
                    if got[0].get("t") == "reply" and got[0].get("op") == "close":
                        break
                    if got[0].get("t") == "event" and got[0].get("ev") in _EVENTS:
                        chan.send({"op": "done"})  # a rebalance callback in progress: let it end
            except EOFError:
                pass
            chan.close()
        if proc is not None:
            try:
                proc.wait(timeout + 5.0)
            except subprocess.TimeoutExpired:
                log.warning("kafka source %s: the reader process did not stop; killing it", self.settings.name)
                proc.kill()
                proc.wait()

    def _call(self, head: dict[str, Any], timeout: float, dispatch: bool = False) -> tuple[dict[str, Any], bytes]:
        """Send a request and return its reply; events met meanwhile are run (``dispatch``) or kept for the next
        poll."""
        with self._lock:
            return self._converse(head, timeout, dispatch)

    def _converse(self, head: dict[str, Any], timeout: float, dispatch: bool) -> tuple[dict[str, Any], bytes]:
        chan = self._chan
        if chan is None:
            raise KafkaClientError("the reader process is not running", fatal=True)
        op = head["op"]
        try:
            chan.send(head)
            deadline = time.monotonic() + timeout + GRACE
            while True:
                got = chan.recv(max(0.0, deadline - time.monotonic()))
                if got is None:
                    raise EOFError(f"no answer to {op!r} within {timeout + GRACE:.0f} s")
                msg, payload = got
                if msg.get("t") == "event":
                    if dispatch:
                        self._dispatch(msg)
                    else:
                        self._stash.append(msg)
                    deadline = time.monotonic() + timeout + GRACE  # the handler's time is not the child's
                    continue
                if msg.get("op") != op:
                    raise EOFError(f"reply to {msg.get('op')!r} while waiting for {op!r}")
                break
        except EOFError as exc:
            raise KafkaClientError(f"reader process: {exc}", fatal=True) from exc
        error = msg.get("error")
        if error is not None:
            if error == "config":
                raise KafkaConfigError(msg["message"])
            raise KafkaClientError(msg["message"], fatal=bool(msg.get("fatal")))
        return msg, payload

    def _dispatch(self, ev: dict[str, Any]) -> None:
        handler, kind = self._handler, ev["ev"]
        if kind == "error":
            if handler is not None:
                handler.on_error(str(ev["message"]), bool(ev["counted"]))
            return
        try:
            if handler is not None:
                if kind == "assigned":
                    handler.on_assigned(_tps(ev["tps"]))
                elif kind == "revoked":
                    handler.on_revoked(_tps(ev["tps"]))
                elif kind == "pending":
                    handler.position_pending(float(ev["timeout"]))
        finally:
            chan = self._chan
            if chan is not None:
                try:
                    chan.send({"op": "done"})
                except EOFError:
                    pass  # the next call reports it


def _child_env() -> dict[str, str]:
    """The agent's environment, with this package importable whatever the child's ``sys.path`` would be."""
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([root, *filter(None, [env.get("PYTHONPATH")])])
    return env


# ---------------------------------------------------------------------- child end
class _Child:
    """The reader process: one adapter, one channel, at most one batch held ahead."""

    def __init__(self, chan: Channel) -> None:
        self.chan = chan
        self.client: ConsumerClient | None = None
        self.held: Fetched | KafkaClientError | None = None
        self.deferred: dict[str, Any] | None = None  # a poll that arrived inside a rebalance callback
        self.max_records = 0  # 0: no poll yet, so no prefetch
        self.closing = False
        self.known: set[TP] = set()  # partitions whose high watermark rides on each poll's reply

    def run(self) -> None:
        collected = time.monotonic()
        while not self.closing:
            if time.monotonic() - collected > COLLECT_EVERY:
                gc.collect()  # automatic collection is off (main); the little state here is quick to scan
                collected = time.monotonic()
            if self.deferred is not None:
                msg, self.deferred = self.deferred, None
            else:
                idle = self.held is None and self.max_records > 0
                got = self.chan.recv(0.0 if idle else None)
                if got is None:
                    self._prefetch()
                    continue
                msg = got[0]
            self.serve(msg)
        if self.client is not None:
            self.client.close(5.0)
            self.client = None
        self.chan.send({"t": "reply", "op": "close"})

    def _prefetch(self) -> None:
        assert self.client is not None
        try:
            f = self.client.poll(self.max_records, PREFETCH_TIMEOUT)
        except KafkaClientError as exc:
            self.held = exc
            return
        if self.deferred is not None or f.values:  # a poll waiting for this consume gets it, even empty
            self.held = f

    def serve(self, msg: dict[str, Any]) -> None:
        op = msg.get("op")
        if op == "close":
            self.closing = True  # answered once the consumer is closed (main)
            return
        try:
            reply, payload = self._serve(op, msg)
        except KafkaConfigError as exc:
            reply, payload = {"error": "config", "message": str(exc)}, b""
        except KafkaClientError as exc:
            reply, payload = {"error": "client", "message": str(exc), "fatal": exc.fatal}, b""
        except Exception as exc:  # noqa: BLE001 - reported to the parent, which recreates the consumer
            log.exception("reader process: %s failed", op)
            reply, payload = {"error": "client", "message": f"{op}: {exc!r}", "fatal": True}, b""
        self.chan.send({"t": "reply", "op": op, **reply}, payload)

    def _serve(self, op: Any, msg: dict[str, Any]) -> tuple[dict[str, Any], bytes]:
        if op == "start":
            return self._start(msg), b""
        client = self.client
        if client is None:
            raise KafkaClientError("the reader process has no consumer", fatal=True)
        if op == "poll":
            return self._poll(client, msg)
        if op == "committed":
            got = client.committed(_tps(msg["tps"]), float(msg["timeout"]))
            return {"offsets": [[tp.topic, tp.partition, off] for tp, off in got.items()]}, b""
        if op == "commit":
            client.commit({TP(t, int(p)): int(o) for t, p, o in msg["offsets"]}, float(msg["timeout"]))
        elif op == "seek":
            tp = _tps(msg["tps"])[0]
            self.known.add(tp)
            self._drop([tp])
            client.seek(tp, int(msg["offset"]))
        elif op == "pause":
            tps = _tps(msg["tps"])
            client.pause(tps)
            for tp, first in self._drop(tps).items():
                client.seek(tp, first)  # held records of a paused partition are fetched again on resume
        elif op == "resume":
            client.resume(_tps(msg["tps"]))
        elif op == "beginning":
            return {"offset": client.beginning_offset(_tps(msg["tps"])[0], float(msg["timeout"]))}, b""
        else:
            raise KafkaClientError(f"unknown request {op!r}", fatal=True)
        return {}, b""

    def _start(self, msg: dict[str, Any]) -> dict[str, Any]:
        s = msg["settings"]
        settings = ConsumerSettings(s["bootstrap_servers"], list(s["topics"]), s["group_id"], s["name"],
                                    dict(s["options"]), s["auto_offset_reset"], bool(s["metadata"]))
        client = ReaderProcessConsumer.INNER(settings)
        self.client = client
        try:
            client.start(_Forwarder(self), float(msg["timeout"]))
        except BaseException:
            self.client = None
            raise
        return {}

    def _poll(self, client: ConsumerClient, msg: dict[str, Any]) -> tuple[dict[str, Any], bytes]:
        self.max_records = int(msg["max"])
        held, self.held = self.held, None
        if isinstance(held, KafkaClientError):
            raise held
        f = held if held is not None else client.poll(self.max_records, float(msg["timeout"]))
        self.known.update(r.tp for r in f.runs)
        head, payload = encode_fetched(f)
        head["connected"] = client.connected
        head["highwater"] = [[tp.topic, tp.partition, hw] for tp in self.known
                             if (hw := client.highwater(tp)) is not None]
        return head, payload

    def _drop(self, tps: list[TP]) -> dict[TP, int]:
        """Drop the held records of ``tps``; the first offset dropped per partition."""
        if not isinstance(self.held, Fetched):
            return {}
        self.held, first = without(self.held, tps)
        return first

    def event(self, kind: str, **fields: Any) -> None:
        """Forward a rebalance event and serve the handler's calls until the parent is done with it."""
        self.chan.send({"t": "event", "ev": kind, **fields})
        while True:
            got = self.chan.recv()
            assert got is not None
            msg = got[0]
            op = msg.get("op")
            if op == "done":
                return
            if op == "poll":
                self.deferred = msg  # answered once the consume that is running the callback returns
            else:
                self.serve(msg)
            if self.closing:
                return


class _Forwarder:
    """The child's :class:`ConsumerEvents`: every event goes to the parent."""

    def __init__(self, child: _Child) -> None:
        self.child = child

    def on_assigned(self, tps: list[TP]) -> None:
        self.child.known.update(tps)
        self.child.event("assigned", tps=_raw(tps))

    def on_revoked(self, tps: list[TP]) -> None:
        self.child.known.difference_update(tps)
        self.child.event("revoked", tps=_raw(tps))

    def position_pending(self, timeout: float) -> None:
        self.child.event("pending", timeout=timeout)

    def on_error(self, message: str, counted: bool) -> None:
        self.child.chan.send({"t": "event", "ev": "error", "message": message, "counted": counted})


def _die_with_parent() -> None:
    """Linux: SIGKILL this process when its parent dies (a killed agent leaves no reader behind).

    Linux sends it when the parent *thread* that started the reader ends: the agent reads its sources on its main
    thread; a reader started by a thread that ends before its source does is replaced at the source's next read
    (a fatal client error), like any dead reader.
    """
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def main(argv: list[str]) -> int:
    """The reader process's program (:data:`_ENTRY`); ``argv``: the file descriptor of its end of the socket pair."""
    _die_with_parent()
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the whole group: the agent stops us
    if os.getppid() == 1:
        return 1  # the parent died before we could ask to die with it
    gc.disable()  # no cycles are made per record; Message objects would otherwise trigger collections
    logging.basicConfig(level=logging.WARNING, format="calmon reader: %(levelname)s %(message)s")
    chan = Channel(socket.socket(fileno=int(argv[0])))
    child = _Child(chan)
    try:
        child.run()
    except EOFError:
        pass  # the parent is gone
    finally:
        if child.client is not None:
            child.client.close(1.0)
    chan.close()
    return 0

