"""Frames between the agent and its Kafka reader process (:mod:`connectors.kafka.reader`), and a poll's records in one.

A frame is a small msgpack head (a dict: requests, replies and events) followed by one byte payload. A poll's
records travel as one payload: the values joined by ``b"\\n"`` when none contains one (the parent then cuts them
with one ``bytes.split``, a C loop), else concatenated with their lengths in the head. Runs (partition, first
offset) go in the head, so nothing per record is encoded but the value itself -- and, with ``metadata``, its
timestamp, key and headers.

No pickle: heads are msgpack (``msgspec``), payloads raw bytes; a head that is not a dict is refused.

Examples
--------
>>> from connectors.kafka.clients import Fetched
>>> f = Fetched.of_partition(TP("t", 0), [b'{"a":1}', None, b'{"b":\\n2}'], [5, 6, 9])
>>> head, payload = encode_fetched(f)
>>> g = decode_fetched(head, payload)
>>> g.values, g.runs[0].first, list(g.runs[0].offsets)
([b'{"a":1}', b'', b'{"b":\\n2}'], 5, [5, 6, 9])
"""

from __future__ import annotations

import itertools
import select
import socket
import struct
from array import array
from collections.abc import Iterable
from typing import Any

import msgspec

from connectors.base import RecordMeta
from connectors.kafka.clients import Fetched, header_tuple
from connectors.kafka.origins import Run
from connectors.kafka.positions import TP

_FRAME = struct.Struct("!II")  # head length, payload length
#: The largest head accepted (a poll's runs and, with metadata, its records' metas are in the head).
MAX_HEAD = 1 << 30
_ENCODER = msgspec.msgpack.Encoder()
_DECODER = msgspec.msgpack.Decoder(dict)


class Channel:
    """Frames over one connected stream socket (one end of a ``socketpair``); not thread-safe.

    Raises ``EOFError`` when the other end is gone.

    Examples
    --------
    >>> a, b = socket.socketpair()
    >>> Channel(a).send({"op": "poll"}, b"x\\ny"); Channel(b).recv()
    ({'op': 'poll'}, b'x\\ny')
    >>> Channel(b).recv(timeout=0) is None
    True
    """

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock

    def send(self, head: dict[str, Any], payload: bytes = b"") -> None:
        h = _ENCODER.encode(head)
        try:
            self.sock.sendall(_FRAME.pack(len(h), len(payload)) + h)
            if payload:
                self.sock.sendall(payload)
        except OSError as exc:
            raise EOFError(f"reader channel closed: {exc}") from exc

    def recv(self, timeout: float | None = None) -> tuple[dict[str, Any], bytes] | None:
        """The next frame; None if none started within ``timeout`` seconds (None: wait)."""
        if timeout is not None and not select.select([self.sock], [], [], max(0.0, timeout))[0]:
            return None
        nh, np_ = _FRAME.unpack(self._exact(_FRAME.size))
        if nh > MAX_HEAD:
            raise EOFError(f"reader channel: a head of {nh} bytes (corrupt stream)")
        try:
            head = _DECODER.decode(self._exact(nh))
        except msgspec.DecodeError as exc:
            raise EOFError(f"reader channel: undecodable head ({exc})") from exc
        return head, self._exact(np_) if np_ else b""

    def _exact(self, n: int) -> bytes:
        parts = []
        while n:
            try:
                got = self.sock.recv(n, socket.MSG_WAITALL)
            except InterruptedError:
                continue
            except OSError as exc:
                raise EOFError(f"reader channel closed: {exc}") from exc
            if not got:
                raise EOFError("reader channel closed")
            parts.append(got)
            n -= len(got)
        return parts[0] if len(parts) == 1 else b"".join(parts)

    def close(self) -> None:
        try:
            self.sock.close()
        except OSError:
            pass


def encode_fetched(f: Fetched) -> tuple[dict[str, Any], bytes]:
    """A poll's records as a head and one payload (see the module's docstring)."""
    values = f.values
    runs = [[r.tp.topic, r.tp.partition, r.start, r.stop, r.first, None if r.offsets is None else list(r.offsets)]
            for r in f.runs]
    head: dict[str, Any] = {"n": len(values), "runs": runs}
    payload = b"\n".join(values)
    if payload.count(b"\n") != max(len(values) - 1, 0):  # a value holds a newline: lengths instead
        head["lens"] = array("q", map(len, values)).tobytes()
        payload = b"".join(values)
    if f.metas is not None:
        head["metas"] = [[m.timestamp_ms, m.key, [list(h) for h in m.headers]] for m in f.metas]
    return head, payload


def decode_fetched(head: dict[str, Any], payload: bytes) -> Fetched:
    """The :class:`Fetched` of :func:`encode_fetched`'s head and payload."""
    n = int(head["n"])
    lens = head.get("lens")
    if n == 0:
        values: list[bytes] = []
    elif lens is None:
        values = payload.split(b"\n")
    else:
        sizes = array("q")
        sizes.frombytes(lens)
        ends = list(itertools.accumulate(sizes))
        values = [payload[a:b] for a, b in zip([0, *ends[:-1]], ends, strict=True)]
    if len(values) != n:
        raise EOFError(f"reader channel: {len(values)} values for {n} records (corrupt stream)")
    runs = [Run(TP(t, int(p)), int(a), int(b), int(first), offs) for t, p, a, b, first, offs in head["runs"]]
    metas = head.get("metas")
    return Fetched(values, runs, None if metas is None else [
        RecordMeta(ts, key, header_tuple([(k, v) for k, v in hs])) for ts, key, hs in metas])


def without(f: Fetched, tps: Iterable[TP]) -> tuple[Fetched, dict[TP, int]]:
    """``f`` without the records of ``tps``, and the first dropped offset of each partition that had some.

    Examples
    --------
    >>> f = Fetched.of_partition(TP("t", 0), [b"a", b"b"], [3, 4])
    >>> f.add(TP("t", 1), [b"c"], 8, 8, lambda: [8])
    >>> g, dropped = without(f, [TP("t", 0)])
    >>> g.values, g.runs[0].start, dropped
    ([b'c'], 0, {TP(topic='t', partition=0): 3})
    """
    drop = set(tps)
    if not any(r.tp in drop for r in f.runs):
        return f, {}
    out = Fetched(metas=None if f.metas is None else [])
    first: dict[TP, int] = {}
    for r in f.runs:
        if r.tp in drop:
            first.setdefault(r.tp, r.first)
            continue
        start = len(out.values)
        out.values += f.values[r.start:r.stop]
        if out.metas is not None and f.metas is not None:
            out.metas += f.metas[r.start:r.stop]
        out.runs.append(Run(r.tp, start, start + r.stop - r.start, r.first, r.offsets))
    return out, first
