"""gzip and zstd streams: recognised by their magic bytes, decompressed piece by piece, a truncated end noticed.

Used by :func:`calmon.io.read_input` (``calmon check events.jsonl.gz``) and by
:class:`connectors.files.FileSource` (compressed JSON Lines or CSV files). Multi-member gzip files
(``cat a.gz b.gz``) and multi-frame zstd files decompress as one stream. A stream that ends inside a
member or frame (a copy cut short, a file still being written) raises :class:`CorruptStream` at
:meth:`Decompressor.finish` instead of silently losing its last lines; so does corrupt data, at
:meth:`Decompressor.feed`. Python's :mod:`gzip` module raises ``EOFError`` for the first case, and
``zstandard``'s stream reader does not notice it at all, hence this small incremental wrapper over
:func:`zlib.decompressobj` (RFC 1952 members) and ``zstandard.ZstdDecompressor.decompressobj`` (RFC 8878
frames).

Examples
--------
>>> import gzip
>>> raw = gzip.compress(b"a\\n") + gzip.compress(b"b\\n")
>>> codec_of(raw)
'gzip'
>>> d = Decompressor("gzip")
>>> b"".join(d.feed(raw)); d.finish()
b'a\\nb\\n'
>>> d = Decompressor("gzip")
>>> _ = b"".join(d.feed(raw[:-4]))
>>> d.finish()
Traceback (most recent call last):
...
calmon.compressed.CorruptStream: gzip stream is truncated (it ends inside a member)
"""

from __future__ import annotations

import zlib
from collections.abc import Callable, Iterator
from typing import Any

__all__ = ["CODECS", "CorruptStream", "Decompressor", "codec_of", "codec_of_name", "iter_decompressed"]

CODECS = ("gzip", "zstd")
_MAGIC = ((b"\x1f\x8b", "gzip"), (b"\x28\xb5\x2f\xfd", "zstd"))
_SUFFIX = {".gz": "gzip", ".gzip": "gzip", ".zst": "zstd", ".zstd": "zstd"}
_PIECE = 8 << 20  # largest piece a gzip member yields at once (bounds memory on highly compressed input)


class CorruptStream(ValueError):
    """A compressed stream that is truncated or corrupt (one line naming the codec and why)."""


def codec_of(head: bytes) -> str | None:
    """``"gzip"``, ``"zstd"`` or ``None`` from the first bytes of a stream."""
    return next((codec for magic, codec in _MAGIC if head.startswith(magic)), None)


def codec_of_name(path: str) -> str | None:
    """``"gzip"``, ``"zstd"`` or ``None`` from a file name's last suffix (``.gz``, ``.zst``).

    >>> codec_of_name("app.jsonl.gz"), codec_of_name("x.JSONL.ZST"), codec_of_name("a.jsonl")
    ('gzip', 'zstd', None)
    """
    low = path.lower()
    return next((c for s, c in _SUFFIX.items() if low.endswith(s)), None)


class Decompressor:
    """Incremental decompression of one gzip or zstd stream (all members or frames).

    Parameters
    ----------
    codec
        ``"gzip"`` or ``"zstd"``.
    """

    def __init__(self, codec: str) -> None:
        if codec not in CODECS:
            raise ValueError(f"codec must be one of {CODECS}, got {codec!r}")
        self.codec = codec
        self._obj: Any = None  # the current member's or frame's decompressor
        self._started = False  # bytes of the current member were fed
        self._zstd: Any = None
        self._errors: tuple[type[Exception], ...] = (zlib.error,)
        if codec == "zstd":
            import zstandard  # imported when used: JSON Lines without zstd never pay for it

            self._zstd = zstandard.ZstdDecompressor()
            self._errors = (zlib.error, zstandard.ZstdError)

    def _new(self) -> Any:
        if self.codec == "gzip":
            return zlib.decompressobj(wbits=31)
        return self._zstd.decompressobj()

    def feed(self, raw: bytes) -> Iterator[bytes]:
        """The decompressed pieces of the next raw bytes; raises :class:`CorruptStream` on corrupt data."""
        while raw:
            if self._obj is None:
                if not self._started and not raw.strip(b"\x00"):
                    return  # zero padding after the last member (tolerated like gzip(1))
                self._obj = self._new()
            self._started = True
            try:
                yield from self._pieces(raw)
            except self._errors as exc:
                raise CorruptStream(f"{self.codec} stream is corrupt: {exc}") from None
            if not self._obj.eof:
                return
            raw = self._obj.unused_data  # the next member or frame starts here
            self._obj, self._started = None, False

    def _pieces(self, raw: bytes) -> Iterator[bytes]:
        obj = self._obj
        if self.codec == "zstd":
            out = obj.decompress(raw)
            if out:
                yield out
            return
        data = raw
        while data and not obj.eof:
            out = obj.decompress(data, _PIECE)
            if out:
                yield out
            data = obj.unconsumed_tail

    def finish(self) -> None:
        """Check that the stream ended at a member or frame boundary (raises :class:`CorruptStream`)."""
        if self._obj is not None and self._started and not self._obj.eof:
            unit = "member" if self.codec == "gzip" else "frame"
            raise CorruptStream(f"{self.codec} stream is truncated (it ends inside a {unit})")


def iter_decompressed(read: Callable[[int], bytes], codec: str, raw_chunk: int = 1 << 18) -> Iterator[bytes]:
    """Decompressed pieces of a stream read with ``read(n)`` until it returns ``b""``; checks the end.

    >>> import io, gzip
    >>> b"".join(iter_decompressed(io.BytesIO(gzip.compress(b"x" * 10)).read, "gzip"))
    b'xxxxxxxxxx'
    """
    d = Decompressor(codec)
    while True:
        raw = read(raw_chunk)
        if not raw:
            break
        yield from d.feed(raw)
    d.finish()
