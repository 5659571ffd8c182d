"""gzip, zstd, bzip2 and xz streams: recognised by their magic bytes, decompressed piece by piece, a truncated
end noticed.

Used by :func:`calmon.offline.inputs.read_input` (``calmon check events.jsonl.gz``) and by
:class:`connectors.files.FileSource` (compressed JSON Lines or CSV files). Multi-member gzip files
(``cat a.gz b.gz``), multi-frame zstd files and multi-stream bzip2 (``pbzip2``) and xz files decompress as
one stream. A stream that ends inside a member or frame (a copy cut short, a file still being written)
raises :class:`CorruptStream` at :meth:`Decompressor.finish` instead of silently losing its last lines;
so does corrupt data, at :meth:`Decompressor.feed`. Python's :mod:`gzip`, :mod:`bz2` and :mod:`lzma` file
objects raise ``EOFError`` for the first case, and ``zstandard``'s stream reader does not notice it at all,
hence this small incremental wrapper over :func:`zlib.decompressobj` (RFC 1952 members),
``zstandard.ZstdDecompressor.decompressobj`` (RFC 8878 frames), :class:`bz2.BZ2Decompressor` and
:class:`lzma.LZMADecompressor` (the ``.xz`` container, whose stream padding between streams is skipped).

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
calmon.formats.compressed.CorruptStream: gzip stream is truncated (it ends inside a member)
"""

from __future__ import annotations

import bz2
import lzma
import zlib
from collections.abc import Callable, Iterator
from typing import Any

__all__ = ["CODECS", "CorruptStream", "Decompressor", "codec_of", "codec_of_name", "iter_decompressed"]

CODECS = ("gzip", "zstd", "bzip2", "xz")
#: magic bytes (at most 4 are needed: callers sniff 4): gzip, zstd, bzip2 ``BZh`` + block size 1-9, xz
_MAGIC = ((b"\x1f\x8b", "gzip"), (b"\x28\xb5\x2f\xfd", "zstd"), (b"\xfd7zX", "xz")) + tuple(
    (b"BZh" + bytes([c]), "bzip2") for c in b"123456789")
_SUFFIX = {".gz": "gzip", ".gzip": "gzip", ".zst": "zstd", ".zstd": "zstd", ".bz2": "bzip2", ".xz": "xz"}
_UNIT = {"gzip": "member", "zstd": "frame", "bzip2": "stream", "xz": "stream"}
_PIECE = 8 << 20  # largest piece a gzip member yields at once (bounds memory on highly compressed input)


class CorruptStream(ValueError):
    """A compressed stream that is truncated or corrupt (one line naming the codec and why)."""


def codec_of(head: bytes) -> str | None:
    """``"gzip"``, ``"zstd"``, ``"bzip2"``, ``"xz"`` or ``None`` from the first (four) bytes of a stream.

    >>> codec_of(bz2.compress(b"x")), codec_of(lzma.compress(b"x")[:4]), codec_of(b"BZh0"), codec_of(b"{}")
    ('bzip2', 'xz', None, None)
    """
    return next((codec for magic, codec in _MAGIC if head.startswith(magic)), None)


def codec_of_name(path: str) -> str | None:
    """A codec of :data:`CODECS` or ``None`` from a file name's last suffix (``.gz``, ``.zst``, ``.bz2``, ``.xz``).

    >>> codec_of_name("app.jsonl.gz"), codec_of_name("x.JSONL.ZST"), codec_of_name("a.xz"), codec_of_name("a.jsonl")
    ('gzip', 'zstd', 'xz', None)
    """
    low = path.lower()
    return next((c for s, c in _SUFFIX.items() if low.endswith(s)), None)


class Decompressor:
    """Incremental decompression of one compressed stream (all its members, frames or streams).

    Parameters
    ----------
    codec
        One of :data:`CODECS`.

    Examples
    --------
    >>> d = Decompressor("xz")
    >>> raw = lzma.compress(b"a\\n") + b"\\x00" * 4 + lzma.compress(b"b\\n")  # two streams, stream padding
    >>> b"".join(d.feed(raw)); d.finish()
    b'a\\nb\\n'
    >>> d = Decompressor("bzip2")
    >>> _ = b"".join(d.feed(bz2.compress(b"a\\n" * 100)[:-3]))
    >>> d.finish()
    Traceback (most recent call last):
    ...
    calmon.formats.compressed.CorruptStream: bzip2 stream is truncated (it ends inside a stream)
    """

    def __init__(self, codec: str) -> None:
        if codec not in CODECS:
            raise ValueError(f"codec must be one of {CODECS}, got {codec!r}")
        self.codec = codec
        self._obj: Any = None  # the current member's or frame's decompressor
        self._started = False  # bytes of the current member were fed
        self._zstd: Any = None
        self._errors: tuple[type[Exception], ...] = (zlib.error, OSError, lzma.LZMAError)  # bz2: OSError
        if codec == "zstd":
            import zstandard  # imported when used: JSON Lines without zstd never pay for it

            self._zstd = zstandard.ZstdDecompressor()
            self._errors = (*self._errors, zstandard.ZstdError)

    def _new(self) -> Any:
        if self.codec == "gzip":
            return zlib.decompressobj(wbits=31)
        if self.codec == "bzip2":
            return bz2.BZ2Decompressor()
        if self.codec == "xz":
            return lzma.LZMADecompressor(lzma.FORMAT_XZ)
        return self._zstd.decompressobj()

    def feed(self, raw: bytes) -> Iterator[bytes]:
        """The decompressed pieces of the next raw bytes; raises :class:`CorruptStream` on corrupt data."""
        while raw:
            if self._obj is None:
                if self.codec == "xz":
                    raw = raw.lstrip(b"\x00")  # stream padding (xz file format, section 2.2)
                if not raw.strip(b"\x00"):
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
        if self.codec in ("bzip2", "xz"):  # these keep unconsumed input inside: drain with b""
            out = obj.decompress(raw, _PIECE)
            while True:
                if out:
                    yield out
                if obj.eof or obj.needs_input:
                    return
                out = obj.decompress(b"", _PIECE)
        data = raw
        while data and not obj.eof:
            out = obj.decompress(data, _PIECE)
            if out:
                yield out
            data = obj.unconsumed_tail

    def finish(self) -> None:
        """Check that the stream ended at a member or frame boundary (raises :class:`CorruptStream`)."""
        if self._obj is not None and self._started and not self._obj.eof:
            unit = _UNIT[self.codec]
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
