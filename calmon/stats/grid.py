"""Equal-width binned sufficient statistics of scores in [0, 1] with binary outcomes.

One concept: a grid of ``bins`` equal-width cells over [0, 1] (optionally one grid per
channel, e.g. per class) holding, per cell, the additive statistics

=========  ===========================  ==========================================
field      per event                    used by
=========  ===========================  ==========================================
``n``      1                            every metric
``sum_z``  z                            ECE, DPE residual sums, Platt on bin means
``sum_y``  y                            ECE, DPE, accuracy, binomial null draws
``sum_zz`` z**2                         Brier score, DPE's Q, variance of z in a cell
``sum_zy`` z*y                          Brier score, DPE's Q
``sum_vv`` (z*(1-z))**2                 exact null variance of the DPE (T-Cal)
=========  ===========================  ==========================================

Values are stored as exact int64 fixed point with resolution ``2**-28``: merging and
subtracting grids is exact integer arithmetic, so a window computed as a sum of buckets,
or a state rebuilt after a crash with other batch boundaries, is bit-identical to the
uninterrupted computation.  A cell holds up to ``2**35`` (3.4e10) events before overflow.

With ``bins = 2**d`` the cell of z is ``floor(z * 2**d)`` computed exactly in binary
floating point, so every dyadic level ``2**b`` (``b <= d``) is an exact ``coarsen(2**b)``.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from calmon.jsonio import pack_array, unpack_array

FIELDS: tuple[str, ...] = ("n", "sum_z", "sum_y", "sum_zz", "sum_zy", "sum_vv")
QUANTUM_BITS = 28
_SCALE = float(2**QUANTUM_BITS)
FORMAT = "calmon.score_grid"
FORMAT_VERSION = 1


def cell_index(z: np.ndarray, bins: int) -> np.ndarray:
    """Equal-width cell of each score: ``min(floor(z * bins), bins - 1)`` (so z = 1 is in the last cell)."""
    idx = np.floor(np.asarray(z, dtype=np.float64) * bins).astype(np.int64)
    np.clip(idx, 0, bins - 1, out=idx)
    return idx


def quantize(x: np.ndarray) -> np.ndarray:
    """Fixed-point representation (units of ``2**-28``) used by every stored sum."""
    return np.rint(np.asarray(x, dtype=np.float64) * _SCALE)


class ScoreGrid:
    """Binned sufficient statistics of (score, binary outcome) pairs on an equal-width grid.

    Parameters
    ----------
    bins
        Number of equal-width cells on [0, 1]; use a power of two (default ``2**12``) to get
        every coarser dyadic scale exactly.
    channels
        ``None`` for a single grid (binary score, or top-label confidence), or the number of
        channels (e.g. K classes for class-wise statistics); fields then have shape
        ``(channels, bins)``.

    Examples
    --------
    >>> import numpy as np
    >>> g = ScoreGrid(bins=4)
    >>> g.update(np.array([0.1, 0.2, 0.9, 1.0]), np.array([0, 1, 1, 1]))
    >>> g.n.tolist(), g.sum_y.tolist()
    ([2.0, 0.0, 0.0, 2.0], [1.0, 0.0, 0.0, 2.0])
    >>> g.coarsen(2).n.tolist()
    [2.0, 2.0]
    >>> (g + g - g).n.tolist() == g.n.tolist()
    True

    References
    ----------
    Lee, Huang, Hassani, Dobriban. T-Cal: an optimal test for the calibration of predictive
    models. JMLR 2023 -- Section 3 (binned estimators, eqs. 5-6) need exactly these sums.
    """

    __slots__ = ("bins", "channels", "_raw")

    def __init__(self, bins: int = 4096, channels: int | None = None) -> None:
        if int(bins) != bins or bins < 1:
            raise ValueError(f"bins must be a positive integer, got {bins!r}")
        if channels is not None and (int(channels) != channels or channels < 1):
            raise ValueError(f"channels must be None or a positive integer, got {channels!r}")
        self.bins = int(bins)
        self.channels = None if channels is None else int(channels)
        self._raw: dict[str, np.ndarray] = {f: np.zeros(self.shape, dtype=np.int64) for f in FIELDS}

    # -- shape and views -------------------------------------------------------------------
    @property
    def shape(self) -> tuple[int, ...]:
        return (self.bins,) if self.channels is None else (self.channels, self.bins)

    def _view(self, field: str) -> np.ndarray:
        a = self._raw[field]
        return a.astype(np.float64) if field == "n" else a / _SCALE

    n = property(lambda self: self._view("n"), doc="Events per cell.")
    sum_z = property(lambda self: self._view("sum_z"), doc="Sum of scores per cell.")
    sum_y = property(lambda self: self._view("sum_y"), doc="Sum of outcomes per cell.")
    sum_zz = property(lambda self: self._view("sum_zz"), doc="Sum of squared scores per cell.")
    sum_zy = property(lambda self: self._view("sum_zy"), doc="Sum of score x outcome per cell.")
    sum_vv = property(lambda self: self._view("sum_vv"), doc="Sum of (z(1-z))^2 per cell.")

    @property
    def count(self) -> int:
        """Total number of events (over all cells; per channel events are counted once per channel)."""
        return int(self._raw["n"].sum())

    @property
    def edges(self) -> np.ndarray:
        return np.linspace(0.0, 1.0, self.bins + 1)

    @property
    def centers(self) -> np.ndarray:
        return (np.arange(self.bins) + 0.5) / self.bins

    @property
    def mean_z(self) -> np.ndarray:
        """Mean score per cell (nan where the cell is empty)."""
        n = self.n
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.where(n > 0, self.sum_z / np.where(n > 0, n, 1), np.nan)

    @property
    def mean_y(self) -> np.ndarray:
        """Mean outcome per cell (nan where the cell is empty)."""
        n = self.n
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.where(n > 0, self.sum_y / np.where(n > 0, n, 1), np.nan)

    # -- updates -----------------------------------------------------------------------------
    def update(self, z: np.ndarray, y: np.ndarray) -> None:
        """Add a batch of scores ``z`` in [0, 1] and outcomes ``y`` in {0, 1}.

        For a single grid ``z`` and ``y`` have shape ``(n,)``; with channels they have shape
        ``(n, channels)`` (e.g. the probability matrix and the one-hot labels).
        Inputs are assumed validated (see :mod:`calmon.events`).
        """
        z = np.asarray(z, dtype=np.float64)
        y = np.asarray(y, dtype=np.float64)
        if z.shape != y.shape:
            raise ValueError(f"z and y must have the same shape, got {z.shape} and {y.shape}")
        if self.channels is None:
            if z.ndim != 1:
                raise ValueError(f"expected 1-d scores for a single grid, got shape {z.shape}")
            flat = cell_index(z, self.bins)
        else:
            if z.ndim != 2 or z.shape[1] != self.channels:
                raise ValueError(f"expected scores of shape (n, {self.channels}), got {z.shape}")
            flat = (cell_index(z, self.bins) + np.arange(self.channels) * self.bins).ravel()
            z, y = z.ravel(), y.ravel()
        if flat.size == 0:
            return
        size = self.bins * (self.channels or 1)
        qz = quantize(z)
        v = z * (1.0 - z)
        weights = {"sum_z": qz, "sum_y": y, "sum_zz": quantize(z * z), "sum_zy": qz * y,
                   "sum_vv": quantize(v * v)}
        self._raw["n"] += np.bincount(flat, minlength=size).reshape(self.shape)
        for field, w in weights.items():
            if field == "sum_y":
                w = w * _SCALE
            # float64 bincount of integers is exact while a batch's cell sum stays below 2**53
            self._raw[field] += np.bincount(flat, weights=w, minlength=size).astype(np.int64).reshape(self.shape)

    # -- algebra ---------------------------------------------------------------------------
    def _check_compatible(self, other: ScoreGrid) -> None:
        if not isinstance(other, ScoreGrid) or other.shape != self.shape:
            raise ValueError(f"cannot combine grids of shapes {self.shape} and {getattr(other, 'shape', None)}")

    def copy(self) -> ScoreGrid:
        out = ScoreGrid(self.bins, self.channels)
        out._raw = {f: a.copy() for f, a in self._raw.items()}
        return out

    def merge(self, other: ScoreGrid) -> None:
        """Add ``other``'s statistics into this grid, in place."""
        self._check_compatible(other)
        for f in FIELDS:
            self._raw[f] += other._raw[f]

    def subtract(self, other: ScoreGrid) -> None:
        """Remove ``other``'s statistics (which must be contained in this grid), in place."""
        self._check_compatible(other)
        for f in FIELDS:
            self._raw[f] -= other._raw[f]
        if (self._raw["n"] < 0).any():
            raise ValueError("subtract removed more events than the grid holds")

    def __add__(self, other: ScoreGrid) -> ScoreGrid:
        out = self.copy()
        out.merge(other)
        return out

    def __sub__(self, other: ScoreGrid) -> ScoreGrid:
        out = self.copy()
        out.subtract(other)
        return out

    merged = __add__

    def __eq__(self, other: object) -> bool:
        return (isinstance(other, ScoreGrid) and other.shape == self.shape
                and all(np.array_equal(self._raw[f], other._raw[f]) for f in FIELDS))

    __hash__ = None  # type: ignore[assignment]

    def coarsen(self, bins: int) -> ScoreGrid:
        """The same statistics on ``bins`` cells (``bins`` must divide the current number)."""
        if bins < 1 or self.bins % bins:
            raise ValueError(f"cannot coarsen {self.bins} cells to {bins}: {bins} must divide {self.bins}")
        out = ScoreGrid(bins, self.channels)
        factor = self.bins // bins
        for f in FIELDS:
            out._raw[f] = self._raw[f].reshape(*self.shape[:-1], bins, factor).sum(axis=-1)
        return out

    def channel(self, k: int) -> ScoreGrid:
        """The single grid of channel ``k``."""
        if self.channels is None:
            raise ValueError("grid has no channels")
        out = ScoreGrid(self.bins)
        out._raw = {f: a[k].copy() for f, a in self._raw.items()}
        return out

    def nbytes(self) -> int:
        return sum(a.nbytes for a in self._raw.values())

    # -- serialisation --------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        """Versioned, pickle-free document: each int64 field as zlib-compressed little-endian bytes in base64."""
        return {"format": FORMAT, "version": FORMAT_VERSION, "bins": self.bins, "channels": self.channels,
                "quantum_bits": QUANTUM_BITS, "fields": {f: pack_array(self._raw[f]) for f in FIELDS}}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ScoreGrid:
        if d.get("format") != FORMAT or d.get("version") != FORMAT_VERSION:
            raise ValueError(f"not a {FORMAT} v{FORMAT_VERSION} document: {d.get('format')} v{d.get('version')}")
        if d.get("quantum_bits") != QUANTUM_BITS:
            raise ValueError(f"grid uses quantum 2^-{d.get('quantum_bits')}, this build uses 2^-{QUANTUM_BITS}")
        out = cls(d["bins"], d["channels"])
        out._raw = {f: unpack_array(d["fields"][f], "<i8", out.shape) for f in FIELDS}
        return out

    def __repr__(self) -> str:
        ch = "" if self.channels is None else f", channels={self.channels}"
        return f"ScoreGrid(bins={self.bins}{ch}, count={self.count})"
