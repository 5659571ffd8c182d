"""Packed statistics documents: every array of a document in one compressed binary payload.

A statistics document written with :func:`calmon.formats.jsonio.pack_array` compresses and base64-encodes
each array on its own: a checkpointed time bucket holds about seventeen of them, so writing and
reading it costs a zlib stream and a base64 string per array (about 0.2 ms to read, 0.5 ms to
write a bucket).  A *packed* document keeps the small fields as JSON and refers to its arrays by
index into one table; their bytes are concatenated, compressed once and base64-encoded once::

    {..., "arrays": [["<i8", [6, 15]], ["<f8", [30, 2]]], "data": "<base64 of zlib of the bytes>"}

so reading a bucket is one base64 decode, one decompression and a zero-copy view per array.
The values are the same integers and floats as in the unpacked document (nothing is rounded).

Examples
--------
>>> import numpy as np
>>> p = Packer()
>>> doc = {"cells": p.put(np.array([3, 9]), "<i8"), "rows": p.put(np.ones((2, 2)), "<f8"), **p.finish()}
>>> u = Unpacker(doc)
>>> u.get(doc["cells"], "<i8").tolist(), u.get(doc["rows"], "<f8", (2, 2)).sum()
([3, 9], np.float64(4.0))
"""

from __future__ import annotations

import base64
import binascii
import zlib
from typing import Any

import numpy as np

__all__ = ["Packer", "Unpacker", "LEVEL"]

#: zlib level of the payload: level 1 compresses grid sums nearly as well as 6 at a fraction of the time.
LEVEL = 1
_DTYPES = frozenset({"<i8", "<f8"})


class Packer:
    """Collect arrays for one packed document: :meth:`put` each, then :meth:`finish`.

    Parameters
    ----------
    level
        zlib level of the payload (default :data:`LEVEL`).
    """

    __slots__ = ("_table", "_parts", "level")

    def __init__(self, level: int = LEVEL) -> None:
        self._table: list[list[Any]] = []
        self._parts: list[bytes] = []
        self.level = level

    def put(self, a: np.ndarray, dtype: str) -> int:
        """Add an array (stored little-endian as ``dtype``, ``"<i8"`` or ``"<f8"``); returns its index."""
        if dtype not in _DTYPES:
            raise ValueError(f"packed arrays are '<i8' or '<f8', got {dtype!r}")
        self._table.append([dtype, list(np.shape(a))])
        self._parts.append(np.ascontiguousarray(a, dtype=dtype).tobytes())
        return len(self._table) - 1

    def finish(self) -> dict[str, Any]:
        """The ``arrays`` table and the ``data`` payload, to merge into the document."""
        raw = b"".join(self._parts)
        return {"arrays": self._table, "data": base64.b64encode(zlib.compress(raw, self.level)).decode("ascii")}

    def raw(self) -> tuple[list[list[Any]], bytes]:
        """The ``arrays`` table and the arrays' bytes as they are (no compression, no base64): a binary record
        (:mod:`calmon.cluster.deltas`) carries them in its own framing and reads them with :meth:`Unpacker.of`."""
        return self._table, b"".join(self._parts)


class Unpacker:
    """Read the arrays of a packed document (the payload is decoded once, when constructed).

    Raises ``ValueError`` naming what is wrong when the table or the payload is damaged.
    """

    __slots__ = ("_raw", "_entries", "_words")

    def __init__(self, doc: dict[str, Any]) -> None:
        table, data = doc.get("arrays"), doc.get("data")
        if not isinstance(table, list) or not isinstance(data, str):
            raise ValueError("packed document needs an 'arrays' list and a 'data' string")
        try:
            self._raw: bytes | memoryview = zlib.decompress(base64.b64decode(data, validate=True))
        except (binascii.Error, ValueError, zlib.error) as exc:
            raise ValueError(f"packed payload is corrupt: {exc}") from None
        entries = _table(table)
        end = entries[-1][3] + 8 * entries[-1][2] if entries else 0
        if end != len(self._raw):
            raise ValueError(f"packed payload holds {len(self._raw)} bytes, its arrays need {end}")
        self._entries = entries
        self._words: np.ndarray | None = None

    @classmethod
    def of(cls, table: Any, raw: bytes | memoryview) -> Unpacker:
        """Read the arrays of ``raw`` (the bytes of :meth:`Packer.raw`) described by ``table``, checking that
        the table accounts for every byte (``ValueError`` otherwise)."""
        if not isinstance(table, list):
            raise ValueError("packed arrays need an 'arrays' list")
        entries = _table(table)
        end = entries[-1][3] + 8 * entries[-1][2] if entries else 0
        if end != len(raw):
            raise ValueError(f"packed payload holds {len(raw)} bytes, its arrays need {end}")
        out = cls.__new__(cls)
        out._raw, out._entries, out._words = raw, entries, None
        return out

    def get(self, ref: Any, dtype: str, shape: tuple[int, ...] | None = None, writable: bool = False) -> np.ndarray:
        """Array ``ref`` (an index from :meth:`Packer.put`), checked against ``dtype`` and ``shape``.

        The result is a read-only view of the payload unless ``writable`` (then a copy).
        """
        if type(ref) is not int or not 0 <= ref < len(self._entries):
            raise ValueError(f"packed array reference {ref!r:.40} is not an index into the table")
        got, dims, n, at = self._entries[ref]
        if got != dtype:
            raise ValueError(f"packed array {ref} has dtype {got!r}, expected {dtype!r}")
        if shape is not None and dims != shape:
            raise ValueError(f"packed array {ref} has shape {list(dims)}, expected {list(shape)}")
        words = self._words
        if words is None:  # the payload as 8-byte words once: a slice per array, not a frombuffer (hundreds a record)
            words = self._words = np.frombuffer(self._raw, dtype="<i8")
        a = words[at >> 3:(at >> 3) + n]
        a = (a if dtype == "<i8" else a.view("<f8")).reshape(dims)
        return a.copy() if writable else a


def _table(table: list[Any]) -> list[tuple[str, tuple[int, ...], int, int]]:
    """``(dtype, shape, values, byte offset)`` of each array of a table (``ValueError`` naming a bad entry).

    A delta record's table has hundreds of entries: plain loops and type tests, no generator per entry."""
    entries: list[tuple[str, tuple[int, ...], int, int]] = []
    end = 0
    for i, entry in enumerate(table):
        dims = entry[1] if type(entry) in (list, tuple) and len(entry) == 2 else None
        if type(dims) is not list or entry[0] not in _DTYPES:
            raise ValueError(f"packed array {i}: expected [dtype, shape], got {entry!r:.60}")
        n = 1
        for s in dims:
            if type(s) is not int or s < 0:
                raise ValueError(f"packed array {i}: expected [dtype, shape], got {entry!r:.60}")
            n *= s
        entries.append((entry[0], tuple(dims), n, end))
        end += 8 * n
    return entries
