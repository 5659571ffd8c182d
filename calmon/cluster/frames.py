"""Binary framing of internal records: a fixed little-endian header, a JSON header document, raw array bytes.

A JSON document with base64 of zlib of its arrays (delta versions 1 and 2) costs a compression, a
base64 pass and a JSON string per record on both sides.  A *frame* carries the arrays as they are::

    offset  size  field
    0       4     magic  b"\\x00CM" + kind (b"D": a delta); a JSON record never starts with a NUL byte
    4       1     version of the record (3 or 4 for deltas)
    5       1     flags: bit 0 = the payload is zlib-compressed
    6       2     reserved, 0
    8       4     header length h (bytes of UTF-8 JSON: the small fields and the arrays table)
    12      4     payload length p (bytes as stored)
    16      h     header
    16 + h  p     payload: the arrays' bytes (little-endian ``<i8``/``<f8``), as :meth:`Packer.raw` wrote them

Decoding is bounded: the record's size is checked first (:data:`~calmon.cluster.records.MAX_RECORD`),
the lengths must add up to the record, and a compressed payload is inflated to at most the size its
arrays table declares -- a small record cannot expand into gigabytes.  Every failure is a
:class:`~calmon.cluster.records.BadRecord` with a reason of :data:`~calmon.cluster.records.REASONS`.

Examples
--------
>>> data = pack_frame(b"D", 3, b'{"a":1}', b"\\x01" * 8, compress=True)
>>> f = unpack_frame(data, b"D", (3,), lambda header: 8)
>>> f.version, f.header, bytes(f.payload) == b"\\x01" * 8
(3, b'{"a":1}', True)
>>> unpack_frame(data[:20], b"D", (3,), lambda header: 8)
Traceback (most recent call last):
...
calmon.cluster.records.BadRecord: frame of 20 bytes, its header and payload need 15 after the 16-byte prefix
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Callable
from dataclasses import dataclass

from calmon.cluster.records import MAX_RECORD, BadRecord

__all__ = ["MAGIC", "PREFIX", "Frame", "is_frame", "pack_frame", "unpack_frame"]

MAGIC = b"\x00CM"
_PREFIX = struct.Struct("<4sBBHII")
#: Bytes before the header document.
PREFIX = _PREFIX.size
_ZLIB = 1
#: zlib level of a compressed payload: level 1 compresses sparse grid sums nearly as well as 6, far cheaper.
LEVEL = 1


@dataclass(frozen=True)
class Frame:
    """A decoded frame: its version, the header document's bytes and the (inflated) payload."""

    version: int
    header: bytes
    payload: bytes | memoryview


def is_frame(data: bytes) -> bool:
    """Whether a record value is a binary frame (else it may be a JSON record of an older version)."""
    return data[:3] == MAGIC


def pack_frame(kind: bytes, version: int, header: bytes, payload: bytes, compress: bool = False) -> bytes:
    """One record: prefix, header, payload (zlib level :data:`LEVEL` if ``compress`` and it is smaller)."""
    flags = 0
    if compress and payload:
        z = zlib.compress(payload, LEVEL)
        if len(z) < len(payload):
            payload, flags = z, _ZLIB
    return b"".join((_PREFIX.pack(MAGIC + kind, version, flags, 0, len(header), len(payload)), header, payload))


def unpack_frame(data: bytes, kind: bytes, readable: tuple[int, ...], expected: Callable[[bytes], int],
                 what: str = "frame", limit: int = MAX_RECORD) -> Frame:
    """Check and split a record written by :func:`pack_frame`.

    Parameters
    ----------
    data
        The record value.
    kind
        The record kind expected (``b"D"``).
    readable
        Versions this calmon reads.
    expected
        The payload size (inflated) that the header declares; called with the header bytes, it raises
        :class:`BadRecord` if the header is bad.
    what
        The record's name in messages.
    limit
        Largest record and largest inflated payload accepted.

    Raises
    ------
    BadRecord
        ``too_large``, ``format`` (not a frame of ``kind``, lengths that do not add up, a payload that is not
        what its table declares), ``version``, or whatever ``expected`` raises.
    """
    if len(data) > limit:
        raise BadRecord("too_large", f"{what} of {len(data)} bytes, over the {limit}-byte limit")
    if len(data) < PREFIX:
        raise BadRecord("format", f"{what} of {len(data)} bytes is shorter than its {PREFIX}-byte prefix")
    magic, version, flags, reserved, h, p = _PREFIX.unpack_from(data)
    if magic != MAGIC + kind:
        raise BadRecord("format", f"{what} starts with {magic!r}, not {MAGIC + kind!r}")
    if version not in readable:
        raise BadRecord("version", f"{what} version {version} is not supported (this calmon reads versions "
                                   f"{', '.join(map(str, readable))}): upgrade the readers before the writers")
    if flags & ~_ZLIB or reserved:
        raise BadRecord("format", f"{what} has unknown flags {flags:#x}/{reserved:#x}")
    if PREFIX + h + p != len(data):
        raise BadRecord("format", f"{what} of {len(data)} bytes, its header and payload need {h + p} after the "
                                  f"{PREFIX}-byte prefix")
    header = data[PREFIX:PREFIX + h]
    want = expected(header)
    if want > limit:
        raise BadRecord("too_large", f"{what} declares {want} payload bytes, over the {limit}-byte limit")
    payload: bytes | memoryview = memoryview(data)[PREFIX + h:]
    if flags & _ZLIB:
        d = zlib.decompressobj()
        try:
            payload = d.decompress(payload, want + 1)  # bounded: at most one byte more than declared
        except zlib.error as exc:
            raise BadRecord("format", f"{what} payload is not zlib data: {exc}") from None
        if not d.eof or d.unconsumed_tail or d.unused_data:
            raise BadRecord("format", f"{what} payload inflates to more than the {want} bytes its table declares, "
                                      f"or is truncated")
    if len(payload) != want:
        raise BadRecord("format", f"{what} payload holds {len(payload)} bytes, its table declares {want}")
    return Frame(version, bytes(header), payload)
