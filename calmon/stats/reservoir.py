"""Bounded uniform sample of raw rows (Algorithm R), for methods that need raw vectors."""

from __future__ import annotations

import base64
import zlib
from typing import Any, NamedTuple

import numpy as np

from calmon.formats.jsonio import clean, pack_array, unpack_array
from calmon.stats.packed import Packer, Unpacker

FORMAT = "calmon.reservoir"
#: 2: rows as a :func:`calmon.formats.jsonio.pack_array` document; 1 (still read): a bare base64 string.
FORMAT_VERSION = 2


#: numpy's hypergeometric draw takes populations below this; larger ones are split by :func:`_split`'s own draws.
_HYPERGEOMETRIC_MAX = 10**9


def _split(rng: np.random.Generator, a: int, b: int, take: int) -> int:
    """How many of a uniform ``take``-subset of ``a + b`` items are among the first ``a``: hypergeometric.

    numpy refuses populations of ``10**9`` or more (an archive bucket's stream of a long-running agent): those
    are drawn item by item (``take`` draws, without replacement), exact up to the float resolution of a draw."""
    if a < _HYPERGEOMETRIC_MAX and b < _HYPERGEOMETRIC_MAX:
        return int(rng.hypergeometric(a, b, take))
    k, left_a, left = 0, a, a + b
    for u in rng.random(take).tolist():
        if u * left < left_a:
            k += 1
            left_a -= 1
        left -= 1
    return k


class ReservoirPart(NamedTuple):
    """A reservoir as :meth:`Reservoir.read_part` reads it from a packed payload: its sample ``rows`` (a read-only
    view, ``min(seen, capacity)`` rows) of ``seen`` rows, and the document (for :meth:`Reservoir.from_parts`)."""

    capacity: int
    width: int
    seen: int
    rows: np.ndarray
    doc: dict[str, Any]


class Reservoir:
    """Uniform random sample of at most ``capacity`` rows of ``width`` floats.

    One uniform draw is consumed per offered row, so the sample depends only on the seed and
    the sequence of rows -- not on how they were split into batches (a restarted agent that
    replays from its checkpoint rebuilds the same sample).

    Memory is sized by content: rows are allocated as the sample fills (doubling, up to
    ``capacity``), and the generator is created on first use (a time bucket that never
    receives an event costs neither).

    Parameters
    ----------
    capacity
        Maximum number of rows kept.
    width
        Floats per row (binary: score, label; K classes: K probabilities, label).
    seed
        Seed of the sampling generator (its state is part of :meth:`to_dict`).

    Examples
    --------
    >>> import numpy as np
    >>> r = Reservoir(capacity=100, width=2, seed=1)
    >>> r.update(np.column_stack([np.linspace(0, 1, 1000), np.zeros(1000)]))
    >>> r.seen, r.rows.shape
    (1000, (100, 2))
    >>> small = Reservoir(capacity=100, width=2)
    >>> small.update(np.zeros((3, 2)))
    >>> small.nbytes()
    48

    References
    ----------
    Vitter. Random sampling with a reservoir. ACM TOMS 11(1), 1985 (Algorithm R).
    """

    def __init__(self, capacity: int = 2000, width: int = 2, seed: int = 0) -> None:
        if capacity < 1 or width < 1:
            raise ValueError(f"capacity and width must be positive, got {capacity}, {width}")
        self.capacity = int(capacity)
        self.width = int(width)
        self.seen = 0
        self._data = np.zeros((0, self.width))
        self._seed = seed
        self._gen: np.random.Generator | None = None
        #: a restored generator state, applied when the generator is first used (restoring costs no generator)
        self._state: dict[str, Any] | None = None
        #: uniform draws consumed by rows that filled an empty slot (their draw is not needed), not yet taken
        self._owed = 0

    @property
    def _rng(self) -> np.random.Generator:
        """The sampling generator, created from the seed on first use and advanced past the draws owed.

        ``PCG64.advance(k)`` moves the stream exactly as ``k`` calls of ``random()`` would (one 64-bit output per
        double), so the state is the same as if every draw had been taken.
        """
        if self._gen is None:
            if self._state is not None:
                self._gen = np.random.Generator(np.random.PCG64(0))
                self._gen.bit_generator.state, self._state = self._state, None
            else:
                self._gen = np.random.default_rng(self._seed)
        if self._owed:
            bits = self._gen.bit_generator
            if not isinstance(bits, np.random.PCG64):
                raise TypeError(f"reservoir generator must be PCG64, got {type(bits).__name__}")
            bits.advance(self._owed)
            self._owed = 0
        return self._gen

    @_rng.setter
    def _rng(self, gen: np.random.Generator) -> None:
        self._gen, self._owed, self._state = gen, 0, None

    @property
    def rows(self) -> np.ndarray:
        return self._data[: min(self.seen, self.capacity)]

    def nbytes(self) -> int:
        """Bytes of the allocated rows."""
        return int(self._data.nbytes)

    def _reserve(self, rows: int) -> None:
        """Room for ``rows`` rows (at most ``capacity``), growing geometrically and keeping the filled ones."""
        have = len(self._data)
        if rows > have:
            grown = np.zeros((min(self.capacity, max(rows, 2 * have)), self.width))
            grown[:have] = self._data
            self._data = grown

    def update(self, rows: np.ndarray) -> None:
        rows = np.asarray(rows, dtype=np.float64)
        if rows.ndim != 2 or rows.shape[1] != self.width:
            raise ValueError(f"expected rows of shape (n, {self.width}), got {rows.shape}")
        m = rows.shape[0]
        if m == 0:
            return
        if self.seen + m <= self.capacity:  # every row fills an empty slot: its draw is owed, not taken
            self._reserve(self.seen + m)
            self._data[self.seen:self.seen + m] = rows
            self._owed += m
            self.seen += m
            return
        u: np.ndarray = self._rng.random((m,))
        if self.seen >= self.capacity:  # full (the common case): only the rows that replace a slot
            self._replace(rows, u)
            return
        t = self.seen + np.arange(m)  # 0-based index of each row in the stream
        fill = t < self.capacity
        self._reserve(min(self.capacity, self.seen + m))
        self._data[t[fill]] = rows[fill]
        slot = np.floor(u * (t + 1)).astype(np.int64)
        repl = ~fill & (slot < self.capacity)
        if repl.any():
            slots, src = slot[repl], np.flatnonzero(repl)
            # the last row written to a slot wins, as in the sequential algorithm
            rev_u, rev_i = np.unique(slots[::-1], return_index=True)
            self._data[rev_u] = rows[src[::-1][rev_i]]
        self.seen += m

    def _replace(self, rows: np.ndarray, u: np.ndarray) -> None:
        """The rest of :meth:`update` when every slot is filled already: row ``j`` (draw ``u[j]``, stream index
        ``t = seen + j``) replaces slot ``floor(u (t + 1))`` when that is below the capacity, i.e. when
        ``u (t + 1) < capacity`` (an integer) -- tested on the products, the floor taken of the few hits only."""
        x = u * np.arange(self.seen + 1, self.seen + u.size + 1)  # t + 1, exact as float64 below 2**53
        src = np.flatnonzero(x < self.capacity)
        self._reserve(self.capacity)  # as update() does (a sample restored short of its count)
        if src.size:
            slots = x[src].astype(np.int64)  # truncation: the floor of these non-negative products
            # the last row written to a slot wins, as in the sequential algorithm
            rev_u, rev_i = np.unique(slots[::-1], return_index=True)
            self._data[rev_u] = rows[src[::-1][rev_i]]
        self.seen += u.size

    def copy(self) -> Reservoir:
        """An independent copy: rows, count, seed, generator state and draws owed (no document round trip)."""
        out = Reservoir.__new__(Reservoir)
        out.capacity, out.width, out.seen, out._seed, out._owed = (self.capacity, self.width, self.seen,
                                                                   self._seed, self._owed)
        out._data = self._data.copy()
        out._gen, out._state = None, self._state  # a pending state is never mutated: share it
        if self._gen is not None:
            out._gen = np.random.Generator(np.random.PCG64(0))
            out._gen.bit_generator.state = self._gen.bit_generator.state
        return out

    @classmethod
    def of_rows(cls, capacity: int, width: int, rows: np.ndarray) -> Reservoir:
        """The reservoir of seed 0 that was offered exactly ``rows`` (at most ``capacity``), holding them: what
        :meth:`update` leaves below its capacity, which keeps every row in order and draws nothing.

        Examples
        --------
        >>> r = Reservoir.of_rows(4, 1, np.array([[1.0], [2.0]]))
        >>> f = Reservoir(4, 1)
        >>> f.update(np.array([[1.0], [2.0]]))
        >>> r == f
        True
        """
        if rows.ndim != 2 or rows.shape[1] != width or rows.shape[0] > capacity:
            raise ValueError(f"of_rows: expected at most {capacity} rows of width {width}, got {rows.shape}")
        out = cls.__new__(cls)  # no empty row array to allocate and drop
        out.capacity, out.width, out.seen = capacity, width, rows.shape[0]
        out._seed, out._owed, out._gen, out._state = 0, 0, None, None
        out._data = rows
        return out

    def sample_copy(self) -> Reservoir:
        """A copy of the sample alone (rows, count, capacity), for merging from (:meth:`merged` reads nothing
        else): its generator is a fresh one of seed 0, so updating it would not continue this stream."""
        out = Reservoir.__new__(Reservoir)
        out.capacity, out.width, out.seen = self.capacity, self.width, self.seen
        out._seed, out._owed, out._gen, out._state = 0, 0, None, None
        out._data = self.rows.copy()
        return out

    def merged(self, other: Reservoir, rng: np.random.Generator) -> Reservoir:
        """A uniform sample of the union of both streams (counts drawn hypergeometrically).

        The draws from ``rng`` (the new seed, the split, three permutations) define the sample; the window
        sums merge thousands of reservoirs per round, so the result is built without the constructor's
        empty arrays (the same rows, count and seed), and two draws are taken in a cheaper form with the
        same outcome: ``integers(2**63)`` is one raw 64-bit output shifted right by one (Lemire's bounded
        draw never rejects for a range of ``2**63``), and a split that takes every row of both
        (``hypergeometric(a, b, a + b)``) is ``a`` and draws nothing (``tests/test_windowsums_batched.py``).
        """
        if other.width != self.width:
            raise ValueError(f"cannot merge reservoirs of widths {self.width} and {other.width}")
        out = Reservoir.__new__(Reservoir)
        out.capacity, out.width = max(self.capacity, other.capacity), self.width
        bits = rng.bit_generator
        if isinstance(bits, np.random.PCG64):
            out._seed = int(bits.random_raw()) >> 1
        else:  # random_raw() is the next 64-bit draw for PCG64; other generators take the documented call
            out._seed = int(rng.integers(2**63))
        out._gen, out._state, out._owed = None, None, 0
        seen_a, seen_b = self.seen, other.seen
        total = seen_a + seen_b
        take = min(out.capacity, total)
        out.seen = total
        if not take:
            out._data = np.zeros((0, self.width))
            return out
        if not (seen_a and seen_b):
            k_a = take if seen_a else 0
        elif take == total:  # every row of both: hypergeometric() would return seen_a and draw nothing
            k_a = seen_a
        else:
            k_a = _split(rng, seen_a, seen_b, take)
        mine = self._data[: min(seen_a, self.capacity)]
        theirs = other._data[: min(seen_b, other.capacity)]
        # take(): the rows fancy indexing gives, for a fraction of its cost on arrays this small
        a = mine.take(rng.permutation(len(mine))[:k_a], axis=0)
        b = theirs.take(rng.permutation(len(theirs))[: take - k_a], axis=0)
        out._data = np.concatenate([a, b]).take(rng.permutation(take), axis=0)
        return out

    def absorb(self, rows: np.ndarray, seen: int) -> None:
        """Merge in place a uniform sample ``rows`` of another stream of ``seen`` rows (another reservoir of
        this capacity: ``len(rows) == min(seen, capacity)``): afterwards this reservoir is a uniform sample of
        the union, as :meth:`merged` makes it, at a fraction of its cost (the evaluators of the partitioned
        agent merge one small delta reservoir per bucket of every range, ``calmon.cluster.deltas``).

        When both fit, the rows are appended and nothing is drawn.  Otherwise the number kept from each side
        is drawn hypergeometrically (the split of a uniform ``capacity``-subset of the union); the rows that
        ``rows`` contributes overwrite uniformly chosen slots of this sample (the kept rows are then a uniform
        subset of it) or are appended.  The draws come from this reservoir's own generator, which a merge
        never reseeds (no seeding per merge: that cost more than the merge); ``rows`` is only read (a view of
        a record's payload is fine).

        Examples
        --------
        >>> r = Reservoir(4, 1, seed=0)
        >>> r.update(np.array([[1.0], [2.0]]))
        >>> r.absorb(np.array([[3.0]]), 1)
        >>> r.seen, r.rows[:, 0].tolist()
        (3, [1.0, 2.0, 3.0])
        >>> r.absorb(np.array([[5.0], [6.0], [7.0], [8.0]]), 10)
        >>> r.seen, r.rows.shape
        (13, (4, 1))
        """
        rows = np.asarray(rows, dtype=np.float64)
        if rows.ndim != 2 or rows.shape[1] != self.width or len(rows) != min(seen, self.capacity):
            raise ValueError(f"absorb: expected a sample of shape ({min(seen, self.capacity)}, {self.width}) of "
                             f"{seen} rows, got {rows.shape}")
        if not seen:
            return
        have = min(self.seen, self.capacity)
        total = self.seen + seen
        take = min(self.capacity, total)
        if take == total:  # every row of both: the union itself
            self._reserve(total)
            self._data[have:total] = rows
            self.seen = total
            return
        rng = self._rng
        k_a = _split(rng, self.seen, seen, take) if self.seen else 0
        k_b = take - k_a
        theirs = rows.take(rng.permutation(len(rows))[:k_b], axis=0) if k_b < len(rows) else rows
        if have == take:  # full (the common case): theirs replace k_b uniformly chosen slots
            if k_b:
                self._data[rng.permutation(have)[:k_b]] = theirs
        else:  # room left: keep a uniform k_a-subset of ours (all of it when k_a == have), then append theirs
            self._reserve(take)
            if k_a < have:
                self._data[:k_a] = self._data[:have].take(rng.permutation(have)[:k_a], axis=0)
            self._data[k_a:take] = theirs
        self.seen = total

    def to_dict(self) -> dict[str, Any]:
        """Versioned, pickle-free document (rows packed with :func:`calmon.formats.jsonio.pack_array`)."""
        return {"format": FORMAT, "version": FORMAT_VERSION, "capacity": self.capacity, "width": self.width,
                "seen": self.seen, "rows": pack_array(self.rows, "<f8"),
                "rng": clean(self._rng.bit_generator.state)}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Reservoir:
        """Rebuild from :meth:`to_dict` output (version 1 documents included)."""
        if d.get("format") != FORMAT or d.get("version") not in (1, FORMAT_VERSION):
            raise ValueError(f"not a {FORMAT} v{FORMAT_VERSION} document")
        out = cls(d["capacity"], d["width"])
        out.seen = int(d["seen"])
        rows = _rows_v1(d["rows_zlib_b64"], out.width) if d["version"] == 1 else unpack_array(d["rows"], "<f8")
        if rows.ndim != 2 or rows.shape[1] != out.width or len(rows) > out.capacity:
            raise ValueError(f"reservoir rows have shape {rows.shape}, expected (<= {out.capacity}, {out.width})")
        out._reserve(len(rows))
        out._data[: len(rows)] = rows
        out._state = _checked_state(d["rng"])
        return out

    def to_parts(self, packer: Packer) -> dict[str, Any]:
        """The reservoir for a packed document (:mod:`calmon.stats.packed`): rows put into ``packer``.

        A generator not created yet is stored as its seed and the draws owed (``PCG64.advance`` brings
        it to the same state when first used), so reading it back costs no generator; nothing of the
        reservoir changes (it may be serialised while another thread reads it).
        """
        out: dict[str, Any] = {"capacity": self.capacity, "width": self.width, "seen": self.seen,
                               "rows": packer.put(self.rows, "<f8")}
        if self._gen is None and self._state is None:
            out.update(seed=int(self._seed), owed=self._owed)
        elif self._gen is None:
            out.update(rng=self._state, owed=self._owed)
        else:  # read, not advanced: a checkpoint serialises a bucket while other threads may read it too
            out.update(rng=clean(self._gen.bit_generator.state), owed=self._owed)
        return out

    @classmethod
    def from_parts(cls, d: dict[str, Any], unpacker: Unpacker) -> Reservoir:
        """Rebuild from :meth:`to_parts` output (same rows, count and generator state)."""
        capacity, width, seen = d["capacity"], d["width"], d["seen"]
        if not all(type(v) is int for v in (capacity, width, seen)) or capacity < 1 or width < 1 or seen < 0:
            raise ValueError(f"reservoir needs positive capacity and width and seen >= 0, got {capacity!r}, "
                             f"{width!r}, {seen!r}")
        return cls._built(d, unpacker.get(d["rows"], "<f8", (min(seen, capacity), width), writable=True))

    @classmethod
    def from_part(cls, part: ReservoirPart) -> Reservoir:
        """The reservoir of a :meth:`read_part` (its rows copied), as :meth:`from_parts` builds it."""
        return cls._built(part.doc, part.rows.copy())

    @classmethod
    def _built(cls, d: dict[str, Any], rows: np.ndarray) -> Reservoir:
        """A reservoir of the checked fields ``d`` of :meth:`to_parts` holding ``rows`` (its own array)."""
        out = cls.__new__(cls)  # no empty row array to allocate and drop
        out.capacity, out.width, out.seen, out._seed, out._gen, out._state = (d["capacity"], d["width"], d["seen"],
                                                                              0, None, None)
        out._data = rows
        if "rng" in d:  # a generator state, then the draws owed after it (none when absent)
            out._state = _checked_state(d["rng"])
            out._owed = int(d.get("owed", 0))
        else:
            out._seed, out._owed = int(d["seed"]), int(d["owed"])
        if out._owed < 0:
            raise ValueError(f"reservoir draws owed must be >= 0, got {out._owed}")
        return out

    @classmethod
    def read_part(cls, d: dict[str, Any], unpacker: Unpacker) -> ReservoirPart:
        """The sample :meth:`to_parts` wrote, checked as :meth:`from_parts` checks it (the generator state
        included), its rows a read-only view of the payload: what :meth:`absorb` merges."""
        capacity, width, seen = d["capacity"], d["width"], d["seen"]
        if not all(type(v) is int for v in (capacity, width, seen)) or capacity < 1 or width < 1 or seen < 0:
            raise ValueError(f"reservoir needs positive capacity and width and seen >= 0, got {capacity!r}, "
                             f"{width!r}, {seen!r}")
        if "rng" in d:
            _checked_state(d["rng"])
            owed = d.get("owed", 0)
        else:
            int(d["seed"])
            owed = d["owed"]
        if int(owed) < 0:
            raise ValueError(f"reservoir draws owed must be >= 0, got {owed}")
        return ReservoirPart(capacity, width, seen, unpacker.get(d["rows"], "<f8", (min(seen, capacity), width)), d)

    def __eq__(self, other: object) -> bool:
        return (isinstance(other, Reservoir) and self.seen == other.seen and self.width == other.width
                and np.array_equal(self.rows, other.rows))

    __hash__ = None  # type: ignore[assignment]


def _checked_state(state: Any) -> dict[str, Any]:
    """A PCG64 state document as :meth:`numpy.random.PCG64.state` gives it (checked now, applied on first use)."""
    inner = state.get("state") if isinstance(state, dict) else None
    if (not isinstance(inner, dict) or state.get("bit_generator") != "PCG64"
            or not all(type(inner.get(k)) is int for k in ("state", "inc"))
            or not all(type(state.get(k)) is int for k in ("has_uint32", "uinteger"))):
        raise ValueError(f"reservoir generator state must be a PCG64 state, got {state!r:.80}")
    return state


def _rows_v1(packed: str, width: int) -> np.ndarray:
    """Rows of a version-1 document: zlib-compressed little-endian float64 in a bare base64 string."""
    return np.frombuffer(zlib.decompress(base64.b64decode(packed)), dtype="<f8").reshape(-1, width)
