"""Sparse level-set statistics of multiclass predictions (the l_p calibration error and Algorithm 2).

A multiclass prediction ``u`` (a point of the simplex) falls in the *level set* (bin)
``v = R(u)`` with ``R(u)_i = floor(lambda * u_i) / lambda``.  A bin is stored by its integer
key ``c = lambda * v`` (K integers in ``0..lambda`` with ``sum(c) <= lambda``).  Only observed
bins are kept, in a hash map from key to a row of dense arrays, so memory grows with the number
of distinct bins seen, never with ``|V| = C(lambda + K, K)``.

Per bin the statistics are

==============  ==================================  ===========================================
field           per event                           used by
==============  ==================================  ===========================================
``n_pool``      1 (per sample pool)                 bin masses (Phase 1), piece masses P_S
``counts_pool`` one-hot label (per sample pool)     label masses E_{S, j}
``sum_f``       f(x)_j (all pools together)         plug-in Err(f, v, j)
``sum_sq``      (f(x)_j - y_j)^2 (all pools)        debiased Err_2^2
==============  ==================================  ===========================================

Events are routed to one of ``pools`` disjoint sample pools by a stable hash (BLAKE2b, salted)
of their id, so Algorithm 2 can use a separate sample for each kind of estimate (the adaptive
data analysis argument of the paper).  Events without an id are routed by a hash of their
sequence number among id-less events, which is deterministic for a given stream order.

``sum_f`` and ``sum_sq`` are stored as exact int64 fixed point (resolution ``2**-28``, as in
:class:`calmon.stats.grid.ScoreGrid`), so merge and subtract are exact.

Memory cap: at most ``max_bins`` distinct bins are kept.  Events that land in a new bin once the
cap is reached are added to one aggregate *overflow* record (per pool count and label counts,
sums of ``f`` and squares); :attr:`overflow_count` reports them, estimators report the overflow
mass (it bounds the error those events can hide), and Algorithm 2 treats them as light bins.
A bin uses ``8 * (pools * (K + 1) + 2 K) + 4 K`` bytes (about 1.4 kB for K = 10 and 13 pools).

References
----------
Bairaktari, Nguyen. Multiclass calibration under the probability-weighted l_p error (seeds 000 /
001): Section 2 (level sets, R, rho), Definition 6 (Err_p), Algorithm 2 and Lemma 9 (pools).
"""

from __future__ import annotations

import hashlib
import math
from typing import Any

import numpy as np

from calmon.formats.jsonio import pack_array, unpack_array
from calmon.stats.levelkeys import ROUND_TOL, level_keys, rho, unique_keys

__all__ = ["LevelSetStats", "ROUND_TOL", "level_keys", "unique_keys", "rho", "default_pools", "route",
           "DEFAULT_MAX_BINS"]

QUANTUM_BITS = 28
_SCALE = float(2**QUANTUM_BITS)
FORMAT = "calmon.levelset"
FORMAT_VERSION = 1
DEFAULT_MAX_BINS = 65536
_MASK64 = (1 << 64) - 1


def default_pools(lam: int) -> int:
    """Pools Algorithm 2 needs at eps ~ 1/lam, p = inf: ``1 + 2 (floor(log2(6 lam)) + 1)``.

    Heavy bins have estimated mass >= beta/6, so ``|B| <= 6/beta ~ 6 lam`` and pieces of M have
    sizes ``2**0 .. 2**floor(log2 |B|)``, each with a mass pool and a label pool, plus Phase 1.

    Examples
    --------
    >>> default_pools(10)
    13
    """
    return 1 + 2 * (int(math.floor(math.log2(6 * lam))) + 1)


def _quantize(x: np.ndarray) -> np.ndarray:
    return np.rint(np.asarray(x, dtype=np.float64) * _SCALE)


def _splitmix64(x: np.ndarray) -> np.ndarray:
    """Stable 64-bit mix of integers (SplitMix64 finaliser), vectorised with uint64 wrap-around."""
    z = np.asarray(x, dtype=np.uint64) + np.uint64(0x9E3779B97F4A7C15)
    with np.errstate(over="ignore"):
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


def route(ids: Any, pools: int, salt: int = 0, start_seq: int = 0) -> tuple[np.ndarray, int]:
    """Pool index of each event: BLAKE2b-64 of the (salted) id modulo ``pools``.

    Events whose id is ``None`` or ``""`` get the SplitMix64 hash of their sequence number
    (``start_seq, start_seq + 1, ...`` in order) instead.

    Parameters
    ----------
    ids
        Sequence of ids (str), or ``None`` for no ids.
    pools
        Number of pools.
    salt
        Integer mixed into the hash (use different salts for independent splits).
    start_seq
        Sequence number of the first id-less event.

    Returns
    -------
    tuple
        ``(pool index array, number of id-less events consumed)``.

    Examples
    --------
    >>> route(["a", "b", "a"], 4)[0].tolist() == route(["a", "b", "a"], 4)[0].tolist()
    True
    """
    if ids is None:
        raise ValueError("route needs ids (use route_sequence for id-less events)")
    ids = list(ids)
    out = np.empty(len(ids), dtype=np.int64)
    person = f"calmon{salt & 0xFFFFFFFF:08x}".encode()[:16]
    missing = []
    for i, s in enumerate(ids):
        if s is None or s == "":
            missing.append(i)
            continue
        h = hashlib.blake2b(str(s).encode("utf-8"), digest_size=8, person=person).digest()
        out[i] = int.from_bytes(h, "little") % pools
    if missing:
        seq = np.arange(start_seq, start_seq + len(missing), dtype=np.uint64) ^ np.uint64(salt & _MASK64)
        out[np.asarray(missing)] = (_splitmix64(seq) % np.uint64(pools)).astype(np.int64)
    return out, len(missing)


class LevelSetStats:
    """Sparse per-level-set statistics of multiclass predictions, split into sample pools.

    Parameters
    ----------
    classes
        Number of classes K (>= 2).
    lam
        Level-set resolution lambda (Algorithm 2 uses ``ceil(1/beta)``; any multiple also works,
        see :meth:`coarsen`).
    pools
        Number of disjoint sample pools (``None``: :func:`default_pools` ``(lam)``).
    max_bins
        Cap on the number of distinct bins kept (see the module docstring for the overflow rule).
    salt
        Salt of the routing hash.

    Examples
    --------
    >>> import numpy as np
    >>> s = LevelSetStats(3, 10, pools=2)
    >>> s.update(np.array([[0.31, 0.69, 0.0], [0.35, 0.65, 0.0], [0.1, 0.1, 0.8]]), np.array([1, 0, 2]))
    >>> s.count, s.num_bins
    (3, 2)
    >>> s.keys.tolist(), s.n.tolist(), s.counts.tolist()
    ([[3, 6, 0], [1, 1, 8]], [2, 1], [[1, 1, 0], [0, 0, 1]])
    >>> back = LevelSetStats.from_dict(s.to_dict())
    >>> back == s, (s + s - s) == s
    (True, True)

    References
    ----------
    Bairaktari & Nguyen (seed 000), Section 2 and Algorithm 2; Lemma 3 bounds the number of bins.
    """

    def __init__(self, classes: int, lam: int, pools: int | None = None, *, max_bins: int = DEFAULT_MAX_BINS,
                 salt: int = 0) -> None:
        if int(classes) != classes or classes < 2:
            raise ValueError(f"classes must be an integer >= 2, got {classes!r}")
        if int(lam) != lam or not 1 <= lam <= 2**20:
            raise ValueError(f"lam (level-set resolution) must be an integer in [1, 2**20], got {lam!r}")
        if pools is None:
            pools = default_pools(int(lam))
        if int(pools) != pools or not 1 <= pools <= 4096:
            raise ValueError(f"pools must be an integer in [1, 4096], got {pools!r}")
        if int(max_bins) != max_bins or max_bins < 1:
            raise ValueError(f"max_bins must be a positive integer, got {max_bins!r}")
        self.classes = int(classes)
        self.lam = int(lam)
        self.pools = int(pools)
        self.max_bins = int(max_bins)
        self.salt = int(salt)
        self._seq = 0
        self._index: dict[bytes, int] = {}
        self._nb = 0
        self._alloc(16)
        k, p = self.classes, self.pools
        self._on = np.zeros(p, dtype=np.int64)
        self._ocnt = np.zeros((p, k), dtype=np.int64)
        self._osf = np.zeros(k, dtype=np.int64)
        self._osq = np.zeros(k, dtype=np.int64)

    # -- storage ---------------------------------------------------------------------------
    def _alloc(self, cap: int) -> None:
        k, p = self.classes, self.pools
        self._keys = np.zeros((cap, k), dtype=np.int32)
        self._n = np.zeros((p, cap), dtype=np.int64)
        self._cnt = np.zeros((p, cap, k), dtype=np.int64)
        self._sf = np.zeros((cap, k), dtype=np.int64)
        self._sq = np.zeros((cap, k), dtype=np.int64)

    def _grow(self, need: int) -> None:
        cap = self._keys.shape[0]
        if need <= cap:
            return
        new = max(need, 2 * cap)
        old = (self._keys, self._n, self._cnt, self._sf, self._sq)
        self._alloc(new)
        nb = self._nb
        self._keys[:nb] = old[0][:nb]
        self._n[:, :nb] = old[1][:, :nb]
        self._cnt[:, :nb] = old[2][:, :nb]
        self._sf[:nb] = old[3][:nb]
        self._sq[:nb] = old[4][:nb]

    def _rows_for(self, keys: np.ndarray) -> np.ndarray:
        """Row index of each key (unique keys), creating bins; -1 where the cap sends it to overflow."""
        rows = np.empty(len(keys), dtype=np.int64)
        kb = np.ascontiguousarray(keys, dtype="<i4")
        new: list[int] = []
        for i in range(len(kb)):
            b = kb[i].tobytes()
            r = self._index.get(b)
            if r is None:
                if self._nb + len(new) >= self.max_bins:
                    r = -1
                else:
                    r = self._nb + len(new)
                    self._index[b] = r
                    new.append(i)
            rows[i] = r
        if new:
            self._grow(self._nb + len(new))
            self._keys[self._nb:self._nb + len(new)] = kb[new]
            self._nb += len(new)
        return rows

    # -- views -----------------------------------------------------------------------------
    @property
    def num_bins(self) -> int:
        """Number of distinct bins kept."""
        return self._nb

    @property
    def keys(self) -> np.ndarray:
        """Integer keys ``lam * v`` of the kept bins, shape ``(num_bins, K)``."""
        return self._keys[: self._nb].astype(np.int64)

    @property
    def bins(self) -> np.ndarray:
        """The level sets ``v`` (keys / lam)."""
        return self.keys / self.lam

    @property
    def n_pool(self) -> np.ndarray:
        """Events per pool and bin, shape ``(pools, num_bins)``."""
        return self._n[:, : self._nb].copy()

    @property
    def counts_pool(self) -> np.ndarray:
        """Label counts per pool, bin and class, shape ``(pools, num_bins, K)``."""
        return self._cnt[:, : self._nb].copy()

    @property
    def n(self) -> np.ndarray:
        """Events per bin over all pools."""
        return self._n[:, : self._nb].sum(axis=0)

    @property
    def counts(self) -> np.ndarray:
        """Label counts per bin and class over all pools, shape ``(num_bins, K)``."""
        return self._cnt[:, : self._nb].sum(axis=0)

    @property
    def sum_f(self) -> np.ndarray:
        """Sum of predicted probabilities per bin and class, shape ``(num_bins, K)``."""
        return self._sf[: self._nb] / _SCALE

    @property
    def sum_sq(self) -> np.ndarray:
        """Sum of ``(f_j - y_j)**2`` per bin and class, shape ``(num_bins, K)``."""
        return self._sq[: self._nb] / _SCALE

    @property
    def pool_sizes(self) -> np.ndarray:
        """Events per pool (including overflow events)."""
        return self._n[:, : self._nb].sum(axis=1) + self._on

    @property
    def overflow_count(self) -> int:
        """Events that landed in new bins after the ``max_bins`` cap was reached."""
        return int(self._on.sum())

    @property
    def overflow(self) -> dict[str, np.ndarray]:
        """The overflow record: per pool ``n``, per pool label ``counts``, ``sum_f``, ``sum_sq``."""
        return {"n": self._on.copy(), "counts": self._ocnt.copy(), "sum_f": self._osf / _SCALE,
                "sum_sq": self._osq / _SCALE}

    @property
    def count(self) -> int:
        """Total number of events."""
        return int(self._n[:, : self._nb].sum() + self._on.sum())

    def nbytes(self) -> int:
        return int(self._keys.nbytes + self._n.nbytes + self._cnt.nbytes + self._sf.nbytes + self._sq.nbytes)

    # -- updates ---------------------------------------------------------------------------
    def update(self, probs: np.ndarray, labels: np.ndarray, ids: Any = None) -> None:
        """Add a batch of labeled multiclass predictions.

        Parameters
        ----------
        probs
            Probabilities ``(n, K)``, finite, non-negative, rows summing to 1 within 1e-3; rows are
            renormalised to sum to 1 before rounding.
        labels
            Class indices ``(n,)`` in ``0..K-1``.
        ids
            Optional event ids (sequence of str; ``""``/``None`` for missing) used to route events to
            pools; without ids events are routed by their sequence number.
        """
        p = np.asarray(probs, dtype=np.float64)
        k = self.classes
        if p.ndim != 2 or p.shape[1] != k:
            raise ValueError(f"probs must have shape (n, {k}), got {p.shape}")
        lab_raw = np.asarray(labels)
        if lab_raw.shape != (p.shape[0],):
            raise ValueError(f"labels must have shape ({p.shape[0]},), got {lab_raw.shape}")
        m = p.shape[0]
        if m == 0:
            return
        lab = lab_raw.astype(np.int64)
        if (lab != lab_raw).any() or lab.min() < 0 or lab.max() >= k:
            raise ValueError(f"labels must be class indices in 0..{k - 1}")
        if not np.isfinite(p).all() or (p < 0).any():
            raise ValueError("probs must be finite and non-negative")
        tot = p.sum(axis=1)
        if (np.abs(tot - 1.0) > 1e-3).any():
            raise ValueError("probability rows must sum to 1 (tolerance 1e-3)")
        p = p / tot[:, None]
        # pools
        if self.pools == 1:
            pool = np.zeros(m, dtype=np.int64)
        elif ids is None:
            seq = np.arange(self._seq, self._seq + m, dtype=np.uint64) ^ np.uint64(self.salt & _MASK64)
            pool = (_splitmix64(seq) % np.uint64(self.pools)).astype(np.int64)
            self._seq += m
        else:
            if len(ids) != m:
                raise ValueError(f"ids has length {len(ids)}, expected {m}")
            pool, used = route(ids, self.pools, self.salt, self._seq)
            self._seq += used
        # bins: unique keys of the batch
        keys = level_keys(p, self.lam)
        uniq, _, inv = unique_keys(keys, self.lam)
        rows = self._rows_for(uniq)
        nu = len(uniq)
        onehot = np.zeros((m, k))
        onehot[np.arange(m), lab] = 1.0
        qf = _quantize(p)
        qs = _quantize((p - onehot) ** 2)
        # per (pool, unique bin)
        pc = pool * nu + inv
        size = self.pools * nu
        n_pu = np.bincount(pc, minlength=size).reshape(self.pools, nu)
        c_pu = np.bincount(pc * k + lab, minlength=size * k).reshape(self.pools, nu, k)
        sf_u = np.empty((nu, k))
        sq_u = np.empty((nu, k))
        for j in range(k):
            sf_u[:, j] = np.bincount(inv, weights=qf[:, j], minlength=nu)
            sq_u[:, j] = np.bincount(inv, weights=qs[:, j], minlength=nu)
        kept = rows >= 0
        r = rows[kept]
        self._n[:, r] += n_pu[:, kept]
        self._cnt[:, r] += c_pu[:, kept]
        self._sf[r] += sf_u[kept].astype(np.int64)
        self._sq[r] += sq_u[kept].astype(np.int64)
        if not kept.all():
            lost = ~kept
            self._on += n_pu[:, lost].sum(axis=1)
            self._ocnt += c_pu[:, lost].sum(axis=1)
            self._osf += sf_u[lost].sum(axis=0).astype(np.int64)
            self._osq += sq_u[lost].sum(axis=0).astype(np.int64)

    # -- algebra ---------------------------------------------------------------------------
    def _check_compatible(self, other: LevelSetStats) -> None:
        if not isinstance(other, LevelSetStats):
            raise ValueError(f"cannot combine LevelSetStats with {type(other).__name__}")
        mine = (self.classes, self.lam, self.pools, self.salt)
        theirs = (other.classes, other.lam, other.pools, other.salt)
        if mine != theirs:
            raise ValueError(f"cannot combine level-set statistics with (classes, lam, pools, salt) = {mine} "
                             f"and {theirs}")

    def copy(self) -> LevelSetStats:
        out = LevelSetStats(self.classes, self.lam, self.pools, max_bins=self.max_bins, salt=self.salt)
        out._seq = self._seq
        out._index = dict(self._index)
        out._nb = self._nb
        out._keys, out._n, out._cnt = self._keys.copy(), self._n.copy(), self._cnt.copy()
        out._sf, out._sq = self._sf.copy(), self._sq.copy()
        out._copy_overflow(self)
        return out

    def _copy_overflow(self, other: LevelSetStats) -> None:
        self._on, self._ocnt = other._on.copy(), other._ocnt.copy()
        self._osf, self._osq = other._osf.copy(), other._osq.copy()

    def _combine(self, other: LevelSetStats, sign: int) -> None:
        self._check_compatible(other)
        nb = other._nb
        okeys = other._keys[:nb]
        if sign > 0:
            rows = self._rows_for(okeys)
        else:
            rows = np.array([self._index.get(okeys[i].astype("<i4").tobytes(), -1) for i in range(nb)],
                            dtype=np.int64)
        kept = rows >= 0
        r = rows[kept]
        self._n[:, r] += sign * other._n[:, :nb][:, kept]
        self._cnt[:, r] += sign * other._cnt[:, :nb][:, kept]
        self._sf[r] += sign * other._sf[:nb][kept]
        self._sq[r] += sign * other._sq[:nb][kept]
        lost = ~kept
        self._on += sign * (other._on + other._n[:, :nb][:, lost].sum(axis=1))
        self._ocnt += sign * (other._ocnt + other._cnt[:, :nb][:, lost].sum(axis=1))
        self._osf += sign * (other._osf + other._sf[:nb][lost].sum(axis=0))
        self._osq += sign * (other._osq + other._sq[:nb][lost].sum(axis=0))
        self._seq += sign * other._seq

    def merge(self, other: LevelSetStats) -> None:
        """Add ``other`` in place (bins beyond ``max_bins`` go to the overflow record)."""
        self._combine(other, +1)

    def subtract(self, other: LevelSetStats) -> None:
        """Remove ``other`` (whose events this object contains), in place; empty bins are dropped.

        Exact while neither side overflowed; raises ValueError if a count would become negative
        (e.g. ``other`` kept a bin that this object had sent to overflow).
        """
        self._check_compatible(other)
        trial = self.copy()
        trial._combine(other, -1)
        if (trial._n < 0).any() or (trial._cnt < 0).any() or (trial._on < 0).any() or (trial._ocnt < 0).any():
            raise ValueError("subtract removed more events than the level-set statistics hold")
        trial._compact()
        for name in ("_seq", "_index", "_nb", "_keys", "_n", "_cnt", "_sf", "_sq",
                     "_on", "_ocnt", "_osf", "_osq"):
            setattr(self, name, getattr(trial, name))

    def _compact(self) -> None:
        """Drop bins without events (keeps memory bounded by the bins of the current window)."""
        nb = self._nb
        alive = self._n[:, :nb].sum(axis=0) > 0
        if alive.all():
            return
        idx = np.flatnonzero(alive)
        keys, n, cnt, sf, sq = (self._keys[idx], self._n[:, idx], self._cnt[:, idx], self._sf[idx],
                                self._sq[idx])
        self._alloc(max(16, len(idx)))
        self._nb = len(idx)
        self._keys[: self._nb], self._n[:, : self._nb], self._cnt[:, : self._nb] = keys, n, cnt
        self._sf[: self._nb], self._sq[: self._nb] = sf, sq
        self._index = {self._keys[i].astype("<i4").tobytes(): i for i in range(self._nb)}

    def __add__(self, other: LevelSetStats) -> LevelSetStats:
        out = self.copy()
        out.merge(other)
        return out

    def __sub__(self, other: LevelSetStats) -> LevelSetStats:
        out = self.copy()
        out.subtract(other)
        return out

    merged = __add__

    def __eq__(self, other: object) -> bool:
        return isinstance(other, LevelSetStats) and self.to_dict() == other.to_dict()

    __hash__ = None  # type: ignore[assignment]

    def coarsen(self, lam: int) -> LevelSetStats:
        """The same statistics at a resolution ``lam`` that divides ``self.lam``.

        ``floor(lam u) = floor(floor(c lam u) / c)`` for ``c = self.lam / lam``, so the coarse key
        is the fine key integer-divided by ``c`` (the tolerance becomes ``ROUND_TOL / c``).
        """
        if int(lam) != lam or lam < 1 or self.lam % lam:
            raise ValueError(f"cannot coarsen level sets from lambda={self.lam} to {lam}: {lam} must divide "
                             f"{self.lam}")
        c = self.lam // int(lam)
        out = LevelSetStats(self.classes, int(lam), self.pools, max_bins=self.max_bins, salt=self.salt)
        out._seq = self._seq
        nb = self._nb
        if nb:
            ck = self._keys[:nb] // c
            view = np.ascontiguousarray(ck.astype("<i4")).view(np.dtype((np.void, 4 * self.classes))).ravel()
            _, first, inv = np.unique(view, return_index=True, return_inverse=True)
            inv = inv.ravel()
            rows = out._rows_for(ck[first])
            nu = len(first)
            if (rows < 0).any():  # cannot happen: coarse bins <= fine bins <= max_bins
                raise RuntimeError("coarsen overflowed")
            out._n[:, :nu] = np.stack([np.bincount(inv, weights=self._n[q, :nb], minlength=nu)
                                       for q in range(self.pools)]).astype(np.int64)
            for q in range(self.pools):
                for j in range(self.classes):
                    out._cnt[q, :nu, j] = np.bincount(inv, weights=self._cnt[q, :nb, j],
                                                      minlength=nu).astype(np.int64)
            for j in range(self.classes):
                np.add.at(out._sf[:, j], inv, self._sf[:nb, j])
                np.add.at(out._sq[:, j], inv, self._sq[:nb, j])
        out._copy_overflow(self)
        return out

    # -- serialisation ---------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        """Versioned JSON document (no pickle); bins sorted by key: equal statistics, equal documents."""
        nb = self._nb
        keys = self._keys[:nb].astype(np.int64)
        order = np.lexsort(keys.T[::-1]) if nb else np.zeros(0, dtype=np.int64)
        k, p = self.classes, self.pools
        return {
            "format": FORMAT, "version": FORMAT_VERSION, "classes": k, "lam": self.lam, "pools": p,
            "max_bins": self.max_bins, "salt": self.salt, "seq": int(self._seq), "quantum_bits": QUANTUM_BITS,
            "num_bins": int(nb),
            "fields": {
                "keys": pack_array(keys[order]),
                "n": pack_array(self._n[:, :nb][:, order]),
                "counts": pack_array(self._cnt[:, :nb][:, order]),
                "sum_f": pack_array(self._sf[:nb][order]),
                "sum_sq": pack_array(self._sq[:nb][order]),
                "overflow_n": pack_array(self._on), "overflow_counts": pack_array(self._ocnt),
                "overflow_sum_f": pack_array(self._osf), "overflow_sum_sq": pack_array(self._osq),
            },
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> LevelSetStats:
        """Rebuild from :meth:`to_dict` output (validates format, version and shapes)."""
        if not isinstance(d, dict) or d.get("format") != FORMAT or d.get("version") != FORMAT_VERSION:
            got = (d.get("format"), d.get("version")) if isinstance(d, dict) else type(d).__name__
            raise ValueError(f"not a {FORMAT} v{FORMAT_VERSION} document: {got}")
        if d.get("quantum_bits") != QUANTUM_BITS:
            raise ValueError(f"levelset uses quantum 2^-{d.get('quantum_bits')}, "
                             f"this build uses 2^-{QUANTUM_BITS}")
        out = cls(d["classes"], d["lam"], d["pools"], max_bins=d["max_bins"], salt=d["salt"])
        nb = int(d["num_bins"])
        if nb < 0 or nb > out.max_bins:
            raise ValueError(f"levelset document has {nb} bins, cap is {out.max_bins}")
        k, p = out.classes, out.pools
        f = d["fields"]
        keys = unpack_array(f["keys"], "<i8", (nb, k))
        if (keys < 0).any() or (keys > out.lam).any() or (keys.sum(axis=1) > out.lam).any():
            raise ValueError("levelset document has keys outside the level-set grid")
        out._alloc(max(16, nb))
        out._nb = nb
        out._keys[:nb] = keys
        out._n[:, :nb] = unpack_array(f["n"], "<i8", (p, nb))
        out._cnt[:, :nb] = unpack_array(f["counts"], "<i8", (p, nb, k))
        out._sf[:nb] = unpack_array(f["sum_f"], "<i8", (nb, k))
        out._sq[:nb] = unpack_array(f["sum_sq"], "<i8", (nb, k))
        out._on = unpack_array(f["overflow_n"], "<i8", (p,))
        out._ocnt = unpack_array(f["overflow_counts"], "<i8", (p, k))
        out._osf = unpack_array(f["overflow_sum_f"], "<i8", (k,))
        out._osq = unpack_array(f["overflow_sum_sq"], "<i8", (k,))
        out._seq = int(d["seq"])
        out._index = {out._keys[i].astype("<i4").tobytes(): i for i in range(nb)}
        if len(out._index) != nb:
            raise ValueError("levelset document has duplicate bin keys")
        return out

    def __repr__(self) -> str:
        return (f"LevelSetStats(classes={self.classes}, lam={self.lam}, pools={self.pools}, bins={self._nb}, "
                f"count={self.count})")
