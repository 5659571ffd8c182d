"""The Kafka reader process (connectors/kafka/reader.py) and its frames (connectors/kafka/wire.py).

Without a broker: the frames round-trip every kind of poll; the child's protocol, driven through the real parent
class over a socket pair with a scripted consumer in a thread, delivers each partition's records exactly as the
consumer would in-process, whatever pauses, seeks and rebalance events come between polls. On the test broker: a
SIGKILLed agent leaves no reader behind, and a killed reader loses and repeats nothing.
"""

from __future__ import annotations

import contextlib
import os
import random
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Mapping
from typing import Any

import pytest

sys.path.insert(0, os.path.dirname(__file__))
from kafka_broker import KafkaBroker, require_broker  # noqa: E402

from connectors.base import RecordMeta  # noqa: E402
from connectors.kafka import reader as reader_mod  # noqa: E402
from connectors.kafka.clients import ConsumerEvents, ConsumerSettings, Fetched, KafkaClientError  # noqa: E402
from connectors.kafka.positions import TP  # noqa: E402
from connectors.kafka.reader import ReaderProcessConsumer, _Child  # noqa: E402
from connectors.kafka.wire import Channel, decode_fetched, encode_fetched, without  # noqa: E402

T0, T1, T2 = TP("t", 0), TP("t", 1), TP("u", 0)


@pytest.fixture(scope="module")
def broker():
    require_broker()
    with KafkaBroker() as b:
        yield b


# ------------------------------------------------------------------------------------------------ frames
def _fetched(rng: random.Random, metas: bool) -> Fetched:
    f = Fetched(metas=[] if metas else None)
    for tp in rng.sample([T0, T1, T2], rng.randint(0, 3)):
        n = rng.randint(1, 6)
        first = rng.randint(0, 1000)
        offsets = sorted(rng.sample(range(first, first + 3 * n), n)) if rng.random() < 0.3 else None
        values = [rng.choice([b'{"a":1}', b"", None, b'{"x":"\\n"}', b"line\nbreak", bytes(range(256))])
                  for _ in range(n)]
        first = offsets[0] if offsets else first
        last = offsets[-1] if offsets else first + n - 1
        f.add(tp, values, first, last, lambda o=offsets: o)
        if f.metas is not None:
            f.metas += [RecordMeta(rng.choice([None, 17]), rng.choice([None, b"k"]),
                                   tuple(rng.choice([(), (("model", b"m"),), (("a", b""), ("a", b"2"))])))
                        for _ in range(n)]
    return f


@pytest.mark.parametrize("seed", range(40))
def test_frames_round_trip_every_poll(seed):
    rng = random.Random(seed)
    f = _fetched(rng, metas=seed % 2 == 1)
    a, b = socket.socketpair()
    head, payload = encode_fetched(f)
    Channel(a).send({"t": "reply", **head}, payload)
    got = Channel(b).recv(timeout=5)
    assert got is not None
    g = decode_fetched(*got)
    assert g.values == f.values and g.metas == f.metas
    assert [(r.tp, r.start, r.stop, r.first, None if r.offsets is None else list(r.offsets)) for r in g.runs] == \
        [(r.tp, r.start, r.stop, r.first, None if r.offsets is None else list(r.offsets)) for r in f.runs]
    assert ("lens" in head) == any(b"\n" in v for v in f.values)


def test_a_closed_or_corrupt_channel_is_an_eof_not_a_hang():
    a, b = socket.socketpair()
    a.sendall(b"\x00\x00\x00\x03\x00\x00\x00\x00\xc1\xc1\xc1")  # 0xc1 is never valid msgpack
    with pytest.raises(EOFError):
        Channel(b).recv(timeout=5)
    a.close()
    with pytest.raises(EOFError):
        Channel(b).recv(timeout=5)
    with pytest.raises(EOFError):
        Channel(b).send({"op": "poll"})


def test_without_drops_only_the_named_partitions_and_says_where_they_started():
    f = Fetched.of_partition(T0, [b"a", b"b"], [3, 4])
    f.add(T1, [b"c"], 8, 8, lambda: [8])
    f.add(T0, [b"d"], 5, 5, lambda: [5])
    g, first = without(f, [T0])
    assert g.values == [b"c"] and [(r.tp, r.start, r.stop, r.first) for r in g.runs] == [(T1, 0, 1, 8)]
    assert first == {T0: 3}
    assert without(f, [T2]) == (f, {})


# --------------------------------------------------------------------------- the protocol, scripted consumer
class Scripted:
    """An in-memory consumer with the adapter's contract: partitions of numbered records, positions, pauses, and
    rebalance events fired inside ``poll`` (as confluent-kafka fires them inside ``consume()``). A poll takes up to
    five records of each partition not paused, so a reader's prefetch takes what a poll in-process would."""

    library = "confluent"
    instances: list[Scripted] = []

    def __init__(self, settings: ConsumerSettings) -> None:
        self.settings = settings
        self.logs = {tp: [f"{tp.topic}/{tp.partition}@{i}".encode() for i in range(200)] for tp in (T0, T1, T2)}
        self.pos = {T0: 0, T1: 0, T2: 0}
        self.paused: set[TP] = set()
        self.handler: ConsumerEvents | None = None
        self.events_at = set(settings.options.get("events_at", []))
        self.polls = 0
        self.in_callback = False
        self.commits: list[dict[TP, int]] = []
        Scripted.instances.append(self)

    def config(self) -> dict[str, Any]:
        return {"group.id": "scripted"}

    def start(self, handler: ConsumerEvents, timeout: float) -> None:
        self.handler = handler

    def poll(self, max_records: int, timeout: float) -> Fetched:
        self.polls += 1
        if self.polls in self.events_at and self.handler is not None:
            self.in_callback = True
            try:  # the source's handler calls back into the consumer from inside the event
                self.handler.on_revoked([T2])
                self.handler.on_assigned([T2])
                self.handler.position_pending(1.0)
            finally:
                self.in_callback = False
        out = Fetched()
        for tp in (T0, T1, T2):
            if tp in self.paused:
                continue
            n = min(5, max_records - len(out), len(self.logs[tp]) - self.pos[tp])
            if n > 0:
                p = self.pos[tp]
                out.add(tp, self.logs[tp][p:p + n], p, p + n - 1, lambda p=p, n=n: range(p, p + n))
                self.pos[tp] += n
        if not out.values:
            time.sleep(min(timeout, 0.01))  # as a consumer waits for records (a reader's prefetch does not spin)
        return out

    def committed(self, tps: list[TP], timeout: float) -> dict[TP, int]:
        return {tp: 0 for tp in tps}

    def commit(self, offsets: Mapping[TP, int], timeout: float) -> None:
        self.commits.append(dict(offsets))

    def seek(self, tp: TP, offset: int) -> None:
        self.pos[tp] = offset

    def pause(self, tps: list[TP]) -> None:
        self.paused.update(tps)

    def resume(self, tps: list[TP]) -> None:
        self.paused.difference_update(tps)

    def highwater(self, tp: TP) -> int | None:
        return len(self.logs[tp])

    def beginning_offset(self, tp: TP, timeout: float) -> int:
        return 0

    @property
    def connected(self) -> bool:
        return True

    def close(self, timeout: float) -> None:
        pass


class Recorder:
    """A source's handler: records events, and inside ``position_pending`` calls the consumer back."""

    def __init__(self) -> None:
        self.client: Any = None
        self.events: list[str] = []

    def on_assigned(self, tps: list[TP]) -> None:
        self.events.append(f"assigned {[tp.key for tp in tps]}")
        self.client.pause(tps)

    def on_revoked(self, tps: list[TP]) -> None:
        self.events.append(f"revoked {[tp.key for tp in tps]}")

    def position_pending(self, timeout: float) -> None:
        self.events.append("pending")
        assert self.client.committed([T2], 1.0) == {T2: 0}
        self.client.seek(T2, 150)
        self.client.resume([T2])

    def on_error(self, message: str, counted: bool) -> None:
        self.events.append(f"error {message}")


def _threaded_reader(monkeypatch, options: dict[str, Any]) -> tuple[ReaderProcessConsumer, threading.Thread]:
    """The real parent class talking to the real child loop, the child in a thread running :class:`Scripted`."""
    monkeypatch.setattr(ReaderProcessConsumer, "INNER", Scripted)
    a, b = socket.socketpair()
    child = _Child(Channel(b))

    def run() -> None:
        with contextlib.suppress(EOFError):  # as the reader's main: the parent went away
            child.run()

    t = threading.Thread(target=run, daemon=True)
    t.start()
    r = ReaderProcessConsumer(ConsumerSettings("h:1", ["t"], "g", "s", options))
    r._chan = Channel(a)
    return r, t


def _apply(client: Any, op: str, tp: TP, at: int) -> None:
    if op == "pause":
        client.pause([tp])
    elif op == "resume":
        client.resume([tp])
    elif op == "seek":
        client.seek(tp, at)
    elif op == "commit":
        client.commit({tp: at}, 1.0)


def _run(client: Any, script: list[tuple[str, TP, int]]) -> None:
    """Play ``script`` on ``client``, checking every record delivered against the calls made so far, as the
    caller sees them: a partition's next record is the one after its last, or the offset it was sought to; none
    arrives while it is paused. Returns each partition's next offset after draining what is not paused."""
    handler = Recorder()
    handler.client = client
    client.start(handler, 1.0)
    want = {T0: 0, T1: 0, T2: 0}
    paused: set[TP] = set()
    for op, tp, at in script + [("poll", T0, 0)] * 60:  # then drain what is not paused
        if op != "poll":
            _apply(client, op, tp, at)
            if op == "seek":
                want[tp] = at
            elif op == "pause":
                paused.add(tp)
            elif op == "resume":
                paused.discard(tp)
            continue
        f = client.poll(20, 0.2)
        for r in f.runs:
            assert r.tp not in paused, f"{r.tp} delivered while paused"
            got = [int(v.split(b"@")[1]) for v in f.values[r.start:r.stop]]
            assert got == list(range(want[r.tp], want[r.tp] + len(got))), (r.tp, want[r.tp], got)
            want[r.tp] += len(got)
    assert all(want[tp] == 200 for tp in want if tp not in paused)


@pytest.mark.parametrize("seed", range(12))
def test_one_batch_ahead_delivers_what_a_consumer_in_process_may_deliver(monkeypatch, seed):
    """Random polls, pauses, resumes, seeks and commits: through the reader (which consumes one batch ahead) each
    partition's records follow the caller's calls exactly as they must in-process -- a held record of a partition
    paused or sought meanwhile is neither delivered nor skipped -- and the consumer receives the same commits."""
    rng = random.Random(seed)
    script = [(rng.choice(["poll", "poll", "poll", "pause", "resume", "seek", "commit"]), rng.choice([T0, T1, T2]),
               rng.randint(0, 190)) for _ in range(60)]
    Scripted.instances = []
    _run(Scripted(ConsumerSettings("h:1", ["t"], "g", "s", {})), script)  # the checker holds in-process
    r, t = _threaded_reader(monkeypatch, {})
    _run(r, script)
    r.close(1.0)
    t.join(10)
    assert not t.is_alive()
    assert Scripted.instances[-1].commits == Scripted.instances[0].commits


def test_rebalance_events_reach_the_handler_at_a_poll_and_its_calls_act_inside_the_event(monkeypatch):
    """An event fired inside the prefetching consume reaches the handler at the parent's next poll (not inside
    the commit the parent is making meanwhile); the handler's pause, committed, seek and resume reach the consumer
    while the event is still open, and the records that follow start where it sought."""
    r, t = _threaded_reader(monkeypatch, {"events_at": [2]})
    handler = Recorder()
    in_poll = []
    handler.on_revoked = lambda tps: in_poll.append(r._lock._is_owned() and polling[0])  # type: ignore[method-assign]
    polling = [False]
    handler.client = r
    r.start(handler, 1.0)
    got: list[bytes] = []
    for _ in range(80):
        polling[0] = True
        f = r.poll(20, 0.2)
        polling[0] = False
        got += [v for v in f.values if v.startswith(b"u/0")]
        r.commit({T0: 1}, 1.0)
    r.close(1.0)
    t.join(10)
    assert in_poll == [True]
    assert handler.events == ["assigned ['u/0']", "pending"]
    offsets = [int(v.split(b"@")[1]) for v in got]
    k = offsets.index(150)
    assert offsets[:k] == list(range(k)) and offsets[k:] == list(range(150, 200))


def test_a_reader_error_is_the_parents_error_and_a_dead_reader_is_fatal(monkeypatch):
    r, t = _threaded_reader(monkeypatch, {})
    handler = Recorder()
    handler.client = r
    r.start(handler, 1.0)

    def fail(self: Scripted, *a: Any) -> None:
        raise KafkaClientError("broker said no")

    monkeypatch.setattr(Scripted, "commit", fail)
    with pytest.raises(KafkaClientError, match="broker said no") as info:
        r.commit({T0: 1}, 1.0)
    assert not info.value.fatal
    assert r.poll(5, 0.2) is not None and r.highwater(T0) == 200 and r.connected
    r._chan.sock.shutdown(socket.SHUT_RDWR)  # the reader is gone
    with pytest.raises(KafkaClientError) as info:
        r.seek(T0, 3)
    assert info.value.fatal
    t.join(10)


# ------------------------------------------------------------------------------------------------ on a broker
def _children(pid: int) -> list[int]:
    out = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True, check=False).stdout
    return [int(x) for x in out.split()]


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ")[1][0] != "Z"
    except OSError:
        return False


@pytest.mark.integration
def test_a_sigkilled_agent_leaves_no_reader_process(broker):
    pytest.importorskip("confluent_kafka")
    broker.create_topic("orphans", partitions=2)
    script = textwrap.dedent(f"""
        import sys, time
        from connectors.kafka import ConfluentKafkaSource
        src = ConfluentKafkaSource({broker.bootstrap!r}, "orphans", None, reader="process")
        src.read(timeout=1.0)
        print("reading", flush=True)
        while True:
            src.read(timeout=0.2)
    """)
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    agent = subprocess.Popen([sys.executable, "-c", script], cwd=root, stdout=subprocess.PIPE, text=True)
    try:
        assert agent.stdout is not None and agent.stdout.readline().strip() == "reading"
        readers = _children(agent.pid)
        assert len(readers) == 1 and _alive(readers[0])
        agent.send_signal(signal.SIGKILL)
        agent.wait(10)
        deadline = time.monotonic() + 10
        while _alive(readers[0]) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not _alive(readers[0]), "the reader outlived its agent"
    finally:
        agent.kill()


@pytest.mark.integration
def test_a_killed_reader_is_replaced_and_nothing_is_lost_or_read_twice(broker):
    pytest.importorskip("confluent_kafka")
    from kafka import KafkaProducer

    from connectors.kafka import ConfluentKafkaSource

    broker.create_topic("replaced", partitions=3)
    p = KafkaProducer(bootstrap_servers=broker.bootstrap, linger_ms=5)
    values = [f'{{"i": {i}}}'.encode() for i in range(3000)]
    for i, v in enumerate(values):
        p.send("replaced", v, partition=i % 3)
    p.flush(30)
    p.close()
    src = ConfluentKafkaSource(broker.bootstrap, "replaced", None, reader="process", backoff_initial=0.1)
    got: list[bytes] = []
    killed = 0
    deadline = time.monotonic() + 60
    try:
        while len(got) < len(values) and time.monotonic() < deadline:
            b = src.read(max_records=200, timeout=0.3)
            if b is not None:
                got += b.records
            if killed < 2 and len(got) >= (killed + 1) * 1000:
                proc = src._consumer._proc  # type: ignore[union-attr]
                os.kill(proc.pid, signal.SIGKILL)
                proc.wait(10)
                killed += 1
        time.sleep(0.3)
        assert src.read(timeout=0.5) is None
    finally:
        src.close()
    assert killed == 2 and src.stats.connects == 3
    assert sorted(got) == sorted(values)
    assert len(got) == len(values)


def test_a_reader_process_is_refused_for_kafka_python_and_a_bad_reader_named():
    from connectors.kafka import KafkaSource

    with pytest.raises(ValueError, match="reader: process needs library: confluent"):
        KafkaSource("h:1", "t", reader="process")
    with pytest.raises(ValueError, match="reader must be one of auto, process, inline"):
        KafkaSource.from_config({"bootstrap_servers": "h:1", "topic": "t", "reader": "thread"})


def test_the_reader_module_is_a_program_with_no_pickle():
    src = open(reader_mod.__file__).read() + open(reader_mod.__file__.replace("reader.py", "wire.py")).read()
    assert "pickle" not in src.replace("No pickle", "") and "multiprocessing" not in src
    assert "import pickle" not in src and "shell=True" not in src
