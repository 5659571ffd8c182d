"""gzip, zstd, bzip2 and xz streams: recognised by their magic bytes, decompressed in bounded pieces, a truncated
end noticed, a decompression bomb stopped.

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

Bounds
------
Whatever the input, one step of decompression yields at most :data:`PIECE` bytes (8 MiB): gzip, bzip2 and xz
through their ``max_length``; zstd, whose ``decompressobj`` has none, by being handed at most 63 whole blocks
at a time (:class:`_ZstdBlocks` reads the frame and block headers), since a block decompresses to at most
128 KiB. The codecs' own memory is capped at 128 MiB (a zstd window, an xz dictionary: zstd's default limit;
``zstd -19`` and ``xz -9`` need 8 and 64 MiB). The expansion ratio (decompressed over compressed bytes taken)
is checked over every :data:`RATIO_WINDOW` (64 MiB) of output; a stream above the cap raises
:class:`DecompressionBomb` (reason ``decompression_bomb``). Ordinary JSON Lines expand 5-25 times (gzip to xz),
rows with a constant kilobyte payload up to ~450 times; a stream of one repeated line, or of zeros, 230-1030
times with gzip (deflate cannot do more than 1032) and 6000-33000 times with bzip2, xz or zstd.

References
----------
RFC 1952 (gzip members); RFC 8878 (zstd frames, section 3.1.1; block headers and Block_Maximum_Size, section
3.1.1.2); the .xz file format 1.1.0 (stream padding, section 2.2). The default cap of 100 is that of Apache POI's
``ZipSecureFile`` (a minimum inflate ratio of 0.01).

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
>>> bomb = gzip.compress(bytes(1 << 20), 6)
>>> d = Decompressor("gzip", max_ratio=100, window=1 << 20)
>>> b"".join(d.feed(bomb))  # doctest: +ELLIPSIS
Traceback (most recent call last):
...
calmon.formats.compressed.DecompressionBomb: gzip stream expands more than 100 times (1.0 MiB from 1.0 KiB): ...
"""

from __future__ import annotations

import bz2
import lzma
import zlib
from collections.abc import Callable, Generator, Iterator
from typing import Any

__all__ = ["CODECS", "CorruptStream", "DecompressionBomb", "Decompressor", "DecompressedReader", "codec_of",
           "codec_of_name", "iter_decompressed", "PIECE", "RATIO_WINDOW", "MAX_EXPANSION_RATIO"]

CODECS = ("gzip", "zstd", "bzip2", "xz")
#: magic bytes (at most 4 are needed: callers sniff 4): gzip, zstd, bzip2 ``BZh`` + block size 1-9, xz
_MAGIC = ((b"\x1f\x8b", "gzip"), (b"\x28\xb5\x2f\xfd", "zstd"), (b"\xfd7zX", "xz")) + tuple(
    (b"BZh" + bytes([c]), "bzip2") for c in b"123456789")
_SUFFIX = {".gz": "gzip", ".gzip": "gzip", ".zst": "zstd", ".zstd": "zstd", ".bz2": "bzip2", ".xz": "xz"}
_UNIT = {"gzip": "member", "zstd": "frame", "bzip2": "stream", "xz": "stream"}

#: Most decompressed bytes one step yields.
PIECE = 8 << 20
#: Decompressed bytes over which the expansion ratio is measured (and before which it is not).
RATIO_WINDOW = 64 << 20
#: Default cap on the expansion ratio (Apache POI's zip-bomb default too).
MAX_EXPANSION_RATIO = 100.0
_SLICE = 1 << 16  # compressed bytes per step (gzip/bzip2/xz output is capped by max_length)
_CODEC_MEMORY = 1 << 27  # zstd window / xz dictionary accepted


class CorruptStream(ValueError):
    """A compressed stream that is truncated or corrupt (one line naming the codec and why)."""

    reason = "corrupt_stream"


class DecompressionBomb(CorruptStream):
    """A compressed stream whose output over a window of :data:`RATIO_WINDOW` bytes exceeds the cap times its input."""

    reason = "decompression_bomb"


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


def _size(n: int) -> str:
    for unit, shift in (("GiB", 30), ("MiB", 20)):
        if n >= 1 << shift:
            return f"{n / (1 << shift):.1f} {unit}"
    return f"{n / 1024:.1f} KiB"


class Decompressor:
    """Incremental decompression of one compressed stream (all its members, frames or streams), in bounded pieces.

    Parameters
    ----------
    codec
        One of :data:`CODECS`.
    max_ratio
        Cap on decompressed / compressed bytes over each ``window`` of output (``None``: no cap).
    window
        Decompressed bytes per ratio check.

    Attributes
    ----------
    consumed, produced
        Compressed bytes taken by the codec, decompressed bytes yielded.

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

    def __init__(self, codec: str, max_ratio: float | None = MAX_EXPANSION_RATIO, window: int = RATIO_WINDOW) -> None:
        if codec not in CODECS:
            raise ValueError(f"codec must be one of {CODECS}, got {codec!r}")
        self.codec = codec
        self.max_ratio = max_ratio
        self.window = window
        self.consumed = 0
        self.produced = 0
        self._mark = (0, 0)  # (consumed, produced) where the current ratio window began
        self._obj: Any = None  # the current member's or frame's decompressor
        self._started = False  # bytes of the current member were fed
        self._zstd: Any = None
        self._blocks: _ZstdBlocks | None = None
        self._errors: tuple[type[Exception], ...] = (zlib.error, OSError, lzma.LZMAError)  # bz2: OSError
        if codec == "zstd":
            import zstandard  # imported when used: JSON Lines without zstd never pay for it

            self._zstd = zstandard.ZstdDecompressor(max_window_size=_CODEC_MEMORY)
            self._blocks = _ZstdBlocks()
            self._errors = (*self._errors, zstandard.ZstdError)

    def _new(self) -> Any:
        if self.codec == "gzip":
            return zlib.decompressobj(wbits=31)
        if self.codec == "bzip2":
            return bz2.BZ2Decompressor()
        if self.codec == "xz":
            return lzma.LZMADecompressor(lzma.FORMAT_XZ, memlimit=_CODEC_MEMORY)
        return self._zstd.decompressobj(write_size=1 << 13)  # small output buffers: most steps yield a few KiB

    def feed(self, raw: bytes) -> Iterator[bytes]:
        """The decompressed pieces of the next raw bytes (each at most :data:`PIECE`, produced as they are
        taken); raises :class:`CorruptStream` on corrupt data, :class:`DecompressionBomb` above the cap."""
        cuts = self._blocks.cuts(raw) if self._blocks is not None else range(_SLICE, len(raw), _SLICE)
        start = 0
        for end in (*cuts, len(raw)):
            if end > start:
                yield from self._feed(raw[start:end] if end - start < len(raw) else raw)
                start = end

    def _feed(self, raw: bytes) -> Iterator[bytes]:
        while raw:
            if self._obj is None:
                if self.codec == "xz":
                    raw = raw.lstrip(b"\x00")  # stream padding (xz file format, section 2.2)
                if not raw.strip(b"\x00"):
                    self.consumed += len(raw)
                    return  # zero padding after the last member (tolerated like gzip(1))
                self._obj = self._new()
            self._started = True
            try:
                raw = yield from self._pieces(raw)
            except self._errors as exc:
                why = "needs more than 128 MiB of memory" if "emory" in str(exc) else f"is corrupt: {exc}"
                raise CorruptStream(f"{self.codec} stream {why}") from None
            if not self._obj.eof:
                return
            self._obj, self._started = None, False  # the next member or frame starts in ``raw``

    def _pieces(self, raw: bytes) -> Generator[bytes, None, bytes]:
        """Decompress ``raw`` into the current member or frame; returns the bytes after its end, if it ended."""
        obj = self._obj
        if self.codec == "zstd":  # at most _ZstdBlocks.PER_STEP blocks (see feed)
            out = obj.decompress(raw)
            self.consumed += len(raw) - (len(obj.unused_data) if obj.eof else 0)
            if out:
                yield self._count(out)
        elif self.codec in ("bzip2", "xz"):  # these keep unconsumed input inside: drain with b""
            self.consumed += len(raw)  # (what they hold counts as taken: at most one slice)
            out = obj.decompress(raw, PIECE)
            ended = False
            while True:
                if obj.eof and not ended:
                    self.consumed -= len(obj.unused_data)
                    ended = True
                if out:
                    yield self._count(out)
                if obj.eof or obj.needs_input:
                    break
                out = obj.decompress(b"", PIECE)
        else:
            data = raw
            while data and not obj.eof:
                out = obj.decompress(data, PIECE)
                tail = obj.unconsumed_tail
                self.consumed += len(data) - len(tail) - (len(obj.unused_data) if obj.eof else 0)
                if out:
                    yield self._count(out)
                data = tail
        return obj.unused_data if obj.eof else b""

    def _count(self, out: bytes) -> bytes:
        """``out``, once counted; raises :class:`DecompressionBomb` when a window of output ends above the cap."""
        self.produced += len(out)
        din, dout = self.consumed - self._mark[0], self.produced - self._mark[1]
        if self.max_ratio is not None and dout >= self.window:
            if dout > self.max_ratio * max(din, 1):
                raise DecompressionBomb(
                    f"{self.codec} stream expands more than {self.max_ratio:g} times ({_size(dout)} from "
                    f"{_size(din)}): a decompression bomb, not read further")
            self._mark = (self.consumed, self.produced)
        return out

    def finish(self) -> None:
        """Check that the stream ended at a member or frame boundary (raises :class:`CorruptStream`)."""
        if self._obj is not None and self._started and not self._obj.eof:
            unit = _UNIT[self.codec]
            raise CorruptStream(f"{self.codec} stream is truncated (it ends inside a {unit})")


class _ZstdBlocks:
    """Where to cut a zstd stream so that a step hands the decoder at most :attr:`PER_STEP` whole blocks.

    A block decompresses to at most 128 KiB (RFC 8878, section 3.1.1.2.4), so :attr:`PER_STEP` blocks (and the
    end of one begun in the step before) bound a step's output at :data:`PIECE`; zstandard's ``decompressobj``
    has no ``max_length``. Only the frame and block headers are read (RFC 8878, sections 3.1.1 and 3.1.2); past
    anything else (zero padding, a corrupt header: the decoder will say what) steps are 256 bytes, the fewest
    bytes 8 MiB can come from (a 4-byte RLE block of 128 KiB).

    >>> import zstandard
    >>> z = zstandard.ZstdCompressor(level=1).compress(bytes(64 << 20))  # 512 blocks of 128 KiB zeros
    >>> w = _ZstdBlocks()
    >>> cuts = w.cuts(z)
    >>> len(cuts), max(b - a for a, b in zip((0, *cuts), (*cuts, len(z)))) < 300, w.lost
    (8, True, False)
    """

    PER_STEP = PIECE // (128 << 10) - 1
    _FALLBACK = PIECE // (1 << 15)

    def __init__(self) -> None:
        self.state = "magic"
        self.need = 4  # header bytes the state reads
        self.head = b""  # header bytes read so far (a header may straddle two chunks)
        self.skip = 0  # payload bytes to pass over
        self.checksum = 0
        self.blocks = 0  # block headers since the last cut
        self.lost = False
        self._lost_at = 0

    def cuts(self, raw: bytes) -> list[int]:
        """Offsets in ``raw`` to cut it at (``raw`` follows the bytes of the previous call)."""
        out: list[int] = []
        i, n = 0, len(raw)
        while i < n and not self.lost:
            if self.skip:
                k = min(self.skip, n - i)
                i += k
                self.skip -= k
                continue
            start = i - len(self.head)
            take = raw[i:i + self.need - len(self.head)]
            i += len(take)
            self.head += take
            if len(self.head) < self.need:
                break
            h, self.head = self.head, b""
            if self.state == "block":
                if self.blocks >= self.PER_STEP:
                    out.append(max(start, 0))
                    self.blocks = 0
                self.blocks += 1
                b = int.from_bytes(h, "little")
                kind, size = b >> 1 & 3, b >> 3
                if kind == 3:
                    self._lose(i)
                self.skip = 1 if kind == 1 else size
                if b & 1:  # the last block, then the checksum
                    self.skip += 4 * self.checksum
                    self.state, self.need = "magic", 4
            elif self.state == "magic":
                m = int.from_bytes(h, "little")
                if m == 0xFD2FB528:
                    self.state, self.need = "frame", 1
                elif m >> 4 == 0x184D2A5:  # a skippable frame: its size, then its bytes
                    self.state = "skippable"
                else:
                    self._lose(start)
            elif self.state == "skippable":
                self.skip = int.from_bytes(h, "little")
                self.state = "magic"
            else:  # the frame header descriptor: window, dictionary id and content size fields follow
                d = h[0]
                single = d >> 5 & 1
                self.checksum = d >> 2 & 1
                self.skip = (1 - single) + (0, 1, 2, 4)[d & 3] + (single, 2, 4, 8)[d >> 6]
                self.state, self.need = "block", 3
        if self.lost:
            if self._lost_at > (out[-1] if out else 0):
                out.append(self._lost_at)
            out.extend(range(self._lost_at + self._FALLBACK, n, self._FALLBACK))
            self._lost_at = 0
        return out

    def _lose(self, at: int) -> None:
        self.lost, self._lost_at = True, max(at, 0)


class DecompressedReader:
    """Pull the decompressed bytes of a stream read with ``read(n)``, a bounded chunk at a time.

    Parameters
    ----------
    read
        Returns up to ``n`` more compressed bytes, ``b""`` at the end.
    codec, max_ratio, window
        As for :class:`Decompressor`.
    raw_chunk
        Compressed bytes read at a time.
    gather
        :meth:`read` returns once it holds this many bytes (pieces of zstd's small steps are joined).

    Examples
    --------
    >>> import io, gzip
    >>> r = DecompressedReader(io.BytesIO(gzip.compress(b"x" * 10)).read, "gzip")
    >>> r.read(), r.read(), r.raw_pos, r.produced
    (b'xxxxxxxxxx', b'', 23, 10)
    """

    def __init__(self, read: Callable[[int], bytes], codec: str, max_ratio: float | None = MAX_EXPANSION_RATIO,
                 window: int = RATIO_WINDOW, raw_chunk: int = 1 << 18, gather: int = 1 << 20) -> None:
        self._read = read
        self._dec = Decompressor(codec, max_ratio, window)
        self.raw_chunk = raw_chunk
        self.gather = gather
        self.raw_pos = 0  # compressed bytes read
        self.eof = False
        self._pending: Iterator[bytes] = iter(())
        self._error: CorruptStream | None = None  # raised at the next read, once the bytes before it are returned

    @property
    def produced(self) -> int:
        """Decompressed bytes so far."""
        return self._dec.produced

    def read(self) -> bytes:
        """The next decompressed bytes (at most ``gather`` + :data:`PIECE`), ``b""`` at the end of a complete
        stream; raises :class:`CorruptStream` or :class:`DecompressionBomb` once the bytes before it are read."""
        if self._error is not None:
            self.eof = True
            raise self._error
        out: list[bytes] = []
        n = 0
        try:
            while n < self.gather and not self.eof:
                piece = next(self._pending, None)
                if piece is not None:
                    out.append(piece)
                    n += len(piece)
                    continue
                raw = self._read(self.raw_chunk)
                if not raw:
                    self.eof = True
                    self._dec.finish()
                    break
                self.raw_pos += len(raw)
                self._pending = self._dec.feed(raw)
        except CorruptStream as exc:
            if not out:
                self.eof = True
                raise
            self._error = exc
        return out[0] if len(out) == 1 else b"".join(out)


def iter_decompressed(read: Callable[[int], bytes], codec: str, raw_chunk: int = 1 << 18,
                      max_ratio: float | None = MAX_EXPANSION_RATIO) -> Iterator[bytes]:
    """Decompressed pieces of a stream read with ``read(n)`` until it returns ``b""``; checks the end.

    >>> import io, gzip
    >>> b"".join(iter_decompressed(io.BytesIO(gzip.compress(b"x" * 10)).read, "gzip"))
    b'xxxxxxxxxx'
    """
    r = DecompressedReader(read, codec, max_ratio, raw_chunk=raw_chunk)
    while piece := r.read():
        yield piece
