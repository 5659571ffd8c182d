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

Storage is sized by content: a grid of at least :data:`SPARSE_MIN_CELLS` cells starts *sparse*
(the occupied cells and their six sums, 56 bytes per occupied cell, see :mod:`calmon.stats.sparse`)
and becomes dense (48 bytes per cell) once more than a quarter of its cells are occupied.  The
two storages hold the same integers; every reader (the field properties, :meth:`ScoreGrid.coarsen`,
equality, :meth:`ScoreGrid.to_dict`) sees the same values whichever is in use, and the document
written by :meth:`ScoreGrid.to_dict` is chosen by content alone (sparse while at most a quarter of
the cells are occupied), so it does not depend on the history of merges.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

import numpy as np

from calmon.formats.jsonio import pack_array, unpack_array
from calmon.stats import sparse
from calmon.stats.packed import Packer, Unpacker

FIELDS: tuple[str, ...] = ("n", "sum_z", "sum_y", "sum_zz", "sum_zy", "sum_vv")
QUANTUM_BITS = 28
_SCALE = float(2**QUANTUM_BITS)
FORMAT = "calmon.score_grid"
FORMAT_VERSION = 1
#: Version of the sparse document (occupied cells only); dense documents keep version 1.
SPARSE_VERSION = 2
#: Grids with fewer cells are always dense (a sparse index would not pay).
SPARSE_MIN_CELLS = 64
_F = len(FIELDS)


class GridPart(NamedTuple):
    """A grid as :meth:`ScoreGrid.read_part` reads it from a packed payload: ``dense`` ``(6, size)``, or (``dense``
    None) the sorted unique occupied ``cells`` and their sums ``vals`` ``(6, len(cells))``; read-only views."""

    bins: int
    channels: int | None
    dense: np.ndarray | None
    cells: np.ndarray
    vals: np.ndarray


def cell_index(z: np.ndarray, bins: int) -> np.ndarray:
    """Equal-width cell of each score: ``min(floor(z * bins), bins - 1)`` (so z = 1 is in the last cell)."""
    # truncation equals floor for z >= 0, and every z < 0 lands in cell 0 either way after the clip
    idx = (np.asarray(z, dtype=np.float64) * bins).astype(np.int64)
    np.minimum(idx, bins - 1, out=idx)
    np.maximum(idx, 0, out=idx)
    return idx


def quantize(x: np.ndarray) -> np.ndarray:
    """Fixed-point representation (units of ``2**-28``) used by every stored sum."""
    return np.rint(np.asarray(x, dtype=np.float64) * _SCALE)


def event_sums(z: np.ndarray, y: np.ndarray) -> np.ndarray:
    """The per-event fixed-point contributions to the six fields, int64 of shape ``(6, n)``.

    Summing the columns of a set of events gives exactly what :meth:`ScoreGrid.update` adds
    (the sums of integers below ``2**53`` are the same in float64 and int64).
    """
    z = np.asarray(z, dtype=np.float64)
    y = np.asarray(y, dtype=np.float64)
    qz = quantize(z)
    v = z * (1.0 - z)
    out = np.empty((_F, z.size), dtype=np.int64)
    out[0] = 1
    out[1] = qz
    out[2] = y * _SCALE
    out[3] = quantize(z * z)
    out[4] = qz * y
    out[5] = quantize(v * v)
    return out


def _floats(ints: np.ndarray) -> np.ndarray:
    """Fields as the properties give them (counts as floats, sums in their units), C-ordered whatever the layout
    of ``ints``: each row is contiguous, as a property's array is (a strided row would take other BLAS paths)."""
    out = ints.astype(np.float64, order="C")  # the conversion ``ints / _SCALE`` makes, then the same division
    out[1:] /= _SCALE
    return out


def _coarsen_ints(a: np.ndarray, at: int, b: int) -> np.ndarray:
    """Dense integer sums on ``at`` cells per channel summed to ``b`` (as :meth:`ScoreGrid.coarsen`: exact), by
    slice additions when few cells merge (a reduction over a short axis costs a call per output cell)."""
    v = a.reshape(_F, -1, b, at // b)
    if v.shape[-1] > 8:
        return v.sum(axis=-1).reshape(_F, -1)
    out = v[..., 0].copy()
    for j in range(1, v.shape[-1]):
        out += v[..., j]
    return out.reshape(_F, -1)


_NO_CELLS = np.zeros(0, dtype=np.int64)
_NO_VALUES = np.zeros((_F, 0), dtype=np.int64)


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

    A large grid holding few events stores only its occupied cells:

    >>> big = ScoreGrid(bins=1024)
    >>> big.update(np.array([0.1, 0.2]), np.array([0, 1]))
    >>> big.is_sparse, big.nbytes(), big.count
    (True, 112, 2)

    References
    ----------
    Lee, Huang, Hassani, Dobriban. T-Cal: an optimal test for the calibration of predictive
    models. JMLR 2023 -- Section 3 (binned estimators, eqs. 5-6) need exactly these sums.
    """

    __slots__ = ("bins", "channels", "_dense", "_cells", "_vals")

    def __init__(self, bins: int = 4096, channels: int | None = None) -> None:
        if int(bins) != bins or bins < 1:
            raise ValueError(f"bins must be a positive integer, got {bins!r}")
        if channels is not None and (int(channels) != channels or channels < 1):
            raise ValueError(f"channels must be None or a positive integer, got {channels!r}")
        self.bins = int(bins)
        self.channels = None if channels is None else int(channels)
        # dense: int64 (6, size) in FIELDS order; sparse (``_dense is None``): sorted occupied flat cells and
        # their sums, treated as immutable (replaced, never written in place) so copies may share them
        self._dense: np.ndarray | None = None
        self._cells = _NO_CELLS
        self._vals = _NO_VALUES
        if self.size < SPARSE_MIN_CELLS:
            self._dense = np.zeros((_F, self.size), dtype=np.int64)

    # -- shape and views -------------------------------------------------------------------
    @property
    def shape(self) -> tuple[int, ...]:
        return (self.bins,) if self.channels is None else (self.channels, self.bins)

    @property
    def size(self) -> int:
        """Cells over all channels."""
        return self.bins * (self.channels or 1)

    @property
    def is_sparse(self) -> bool:
        """Whether only the occupied cells are stored."""
        return self._dense is None

    def _all(self) -> np.ndarray:
        """The six fields as a dense int64 ``(6, size)`` array (the storage itself when dense)."""
        if self._dense is not None:
            return self._dense
        return sparse.to_dense(self._cells, self._vals, self.size)

    def _densify(self) -> np.ndarray:
        if self._dense is None:
            self._dense = sparse.to_dense(self._cells, self._vals, self.size)
            self._cells, self._vals = _NO_CELLS, _NO_VALUES
        return self._dense

    def _set_sparse(self, cells: np.ndarray, vals: np.ndarray) -> None:
        """Store sparse cell sums, dense instead when the grid is small or the cells are many."""
        if self.size < SPARSE_MIN_CELLS or cells.size > self.size // 4:
            self._dense = sparse.to_dense(cells, vals, self.size)
            self._cells, self._vals = _NO_CELLS, _NO_VALUES
        else:
            self._dense = None
            self._cells, self._vals = cells, vals

    def _view(self, field: str) -> np.ndarray:
        i = FIELDS.index(field)
        if self._dense is not None:
            a = self._dense[i]
        else:
            a = np.zeros(self.size, dtype=np.int64)
            a[self._cells] = self._vals[i]
        a = a.reshape(self.shape)
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
        return int((self._dense if self._dense is not None else self._vals)[0].sum())

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

    def fields(self, *bins: int) -> list[np.ndarray]:
        """Every field at once, on each of ``bins`` cell counts (default: the grid's own), from one read.

        Per count a float64 ``(6, size)`` array (channels flattened) whose row ``i`` is bit for bit
        ``coarsen(b).<FIELDS[i]>``: exact integer sums, then the properties' conversion (each of which converts
        its whole field), in contiguous rows.

        Examples
        --------
        >>> g = ScoreGrid(4); g.update(np.array([0.1, 0.9]), np.array([0, 1]))
        >>> full, half = g.fields(4, 2)
        >>> full[0].tolist(), half[2].tolist()
        ([1.0, 0.0, 0.0, 1.0], [0.0, 1.0])
        """
        # integer sums: the same whichever grid they are summed from (the previous, coarser one when it can be)
        dense, cells, vals, at = self._dense, self._cells, self._vals, self.bins
        out = []
        for b in bins or (self.bins,):
            if b < 1 or self.bins % b:
                raise ValueError(f"cannot coarsen {self.bins} cells to {b}: {b} must divide {self.bins}")
            if at % b:
                dense, cells, vals, at = self._dense, self._cells, self._vals, self.bins
            if dense is not None:
                if b != at:
                    dense = _coarsen_ints(dense, at, b)
                out.append(_floats(dense))
            else:
                if b != at:
                    cells, vals = self._sparse_coarsen(cells, vals, at, b)
                f = np.zeros((_F, b * (self.channels or 1)))
                f[:, cells] = vals  # the int64 -> float64 conversion of astype
                f[1:] /= _SCALE
                out.append(f)
            at = b
        return out

    def _sparse_coarsen(self, cells: np.ndarray, vals: np.ndarray, at: int, b: int) -> tuple[np.ndarray, np.ndarray]:
        """Sparse sums on ``at`` cells per channel coarsened to ``b``: the coarse cells of sorted cells are sorted,
        so equal ones are runs summed in one ``reduceat`` (no sort, unlike :func:`sparse.aggregate`)."""
        if cells.size == 0:
            return cells, vals
        factor = at // b
        c = cells // factor if self.channels is None else cells // at * b + cells % at // factor
        start = np.flatnonzero(np.concatenate(([True], c[1:] != c[:-1])))
        if start.size == c.size:
            return c, vals
        return c[start], np.add.reduceat(vals, start, axis=1)

    def totals(self) -> list[int]:
        """Each field summed over every cell: exact integers (``n`` in events, the sums in units of ``2**-28``).

        >>> g = ScoreGrid(128); g.update(np.array([0.25, 0.5]), np.array([0, 1]))
        >>> g.totals()[:3] == [2, 3 * 2**QUANTUM_BITS // 4, 2**QUANTUM_BITS]
        True
        """
        return (self._dense if self._dense is not None else self._vals).sum(axis=1).tolist()

    def occupied(self, bins: int | None = None) -> tuple[np.ndarray, np.ndarray]:
        """The occupied cells (``n > 0``) on ``bins`` cells (default: the grid's own) and their fields.

        Returns the flat cell indices (ascending) and a float64 ``(6, cells)`` array: column ``j`` is bit for
        bit ``coarsen(bins).<field>[cells[j]]`` (row order of :data:`FIELDS`).  A sparse grid is read
        without materialising its empty cells.

        Examples
        --------
        >>> g = ScoreGrid(128); g.update(np.array([0.1, 0.12, 0.9]), np.array([0, 1, 1]))
        >>> cells, f = g.occupied(8)
        >>> cells.tolist(), f[0].tolist(), f[2].tolist()
        ([0, 7], [2.0, 1.0], [1.0, 1.0])
        """
        b = self.bins if bins is None else bins
        if b < 1 or self.bins % b:
            raise ValueError(f"cannot coarsen {self.bins} cells to {b}: {b} must divide {self.bins}")
        if self._dense is not None:
            d = self._dense if b == self.bins else _coarsen_ints(self._dense, self.bins, b)
            cells = np.flatnonzero(d[0])
            vals = d[:, cells]
        else:
            cells, vals = self._cells, self._vals
            if b != self.bins:
                cells, vals = self._sparse_coarsen(cells, vals, self.bins, b)
            if not vals[0].all():
                keep = vals[0] != 0
                cells, vals = cells[keep], vals[:, keep]
        return cells, _floats(vals)

    def cell_sums(self) -> tuple[np.ndarray, np.ndarray]:
        """The stored cells (any field nonzero; flat indices, ascending) and their exact int64 sums ``(6, cells)``:
        what :meth:`add_cells` with ``aggregated`` adds back (copies or immutable arrays).

        >>> g = ScoreGrid(128); g.update(np.array([0.1, 0.9]), np.array([0, 1]))
        >>> cells, sums = g.cell_sums(); cells.tolist(), sums[0].tolist()
        ([12, 115], [1, 1])
        """
        if self._dense is not None:
            return sparse.from_dense(self._dense)
        return sparse.prune(self._cells, self._vals)

    # -- updates -----------------------------------------------------------------------------
    def update(self, z: np.ndarray, y: np.ndarray) -> None:
        """Add a batch of scores ``z`` in [0, 1] and outcomes ``y`` in {0, 1}.

        For a single grid ``z`` and ``y`` have shape ``(n,)``; with channels they have shape
        ``(n, channels)`` (e.g. the probability matrix and the one-hot labels).
        Inputs are assumed validated (see :mod:`calmon.events.decoder`).
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
        if flat.size:
            self.add_cells(flat, event_sums(z, y))

    def add_cells(self, cells: np.ndarray, sums: np.ndarray, aggregated: bool = False) -> None:
        """Add per-event (or, with ``aggregated``, per sorted unique cell) sums to flat ``cells``.

        ``sums`` is int64 of shape ``(6, len(cells))`` as made by :func:`event_sums`; this is the
        vectorised ingestion path (the caller computes cells and sums once for a whole batch).
        """
        if cells.size == 0:
            return
        if self._dense is not None:
            if not aggregated and cells.size > 64:
                # float64 bincount of integers is exact while a batch's cell sum stays below 2**53
                for i in range(_F):
                    self._dense[i] += np.bincount(cells, weights=sums[i], minlength=self.size).astype(np.int64)
                return
            if not aggregated:
                cells, sums = sparse.aggregate(cells, sums)
            self._dense[:, cells] += sums
            return
        if not aggregated:
            cells, sums = sparse.aggregate(cells, sums)
        self._set_sparse(*sparse.combine(self._cells, self._vals, cells, sums))

    # -- algebra ---------------------------------------------------------------------------
    def _check_compatible(self, other: ScoreGrid) -> None:
        if not isinstance(other, ScoreGrid) or other.shape != self.shape:
            raise ValueError(f"cannot combine grids of shapes {self.shape} and {getattr(other, 'shape', None)}")

    def copy(self) -> ScoreGrid:
        out = ScoreGrid.__new__(ScoreGrid)
        out.bins, out.channels = self.bins, self.channels
        out._dense = None if self._dense is None else self._dense.copy()
        out._cells, out._vals = self._cells, self._vals
        return out

    def _combine(self, other: ScoreGrid, sign: int) -> None:
        self._check_compatible(other)
        if other._dense is not None:
            mine = self._densify()
            if sign > 0:
                mine += other._dense
            else:
                mine -= other._dense
        elif self._dense is not None:
            self._dense[:, other._cells] += other._vals if sign > 0 else -other._vals
        else:
            cells, vals = sparse.combine(self._cells, self._vals, other._cells, other._vals, sign)
            self._set_sparse(*(sparse.prune(cells, vals) if sign < 0 else (cells, vals)))

    def merge(self, other: ScoreGrid) -> None:
        """Add ``other``'s statistics into this grid, in place."""
        self._combine(other, 1)

    def subtract(self, other: ScoreGrid) -> None:
        """Remove ``other``'s statistics (which must be contained in this grid), in place."""
        self._combine(other, -1)
        if ((self._dense if self._dense is not None else self._vals)[0] < 0).any():
            raise ValueError("subtract removed more events than the grid holds")

    def summed(self, others: Sequence[ScoreGrid]) -> ScoreGrid:
        """A new grid holding this grid plus every grid of ``others`` (none of them is changed).

        The same integers, and the same storage, as copying this grid and merging the others one by one
        (:meth:`merge`): integer sums do not depend on their order, and occupied cells only accumulate, so
        the pairwise merges end dense exactly when a grid is dense or the union of the occupied cells
        exceeds a quarter of the grid.  One pass instead of ``len(others)`` merges (the window sums).

        Examples
        --------
        >>> import numpy as np
        >>> a, b = ScoreGrid(128), ScoreGrid(128)
        >>> a.update(np.array([0.1, 0.5]), np.array([0, 1])); b.update(np.array([0.5]), np.array([1]))
        >>> a.summed([b, b]) == a + b + b, a.summed([b, b]).is_sparse, a.count
        (True, True, 2)
        """
        shape = self.shape
        for g in others:
            if not isinstance(g, ScoreGrid) or g.shape != shape:
                self._check_compatible(g)
        out = ScoreGrid.__new__(ScoreGrid)
        out.bins, out.channels = self.bins, self.channels
        out._cells, out._vals = _NO_CELLS, _NO_VALUES
        grids = [self, *others]
        dense = [g._dense for g in grids if g._dense is not None]
        sparse_parts = [g for g in grids if g._dense is None and g._cells.size]
        cells: np.ndarray | None = None
        vals = _NO_VALUES
        if len(sparse_parts) == 1:
            cells, vals = sparse_parts[0]._cells, sparse_parts[0]._vals
        elif sparse_parts:
            cells, vals = sparse.aggregate(np.concatenate([g._cells for g in sparse_parts]),
                                           np.concatenate([g._vals for g in sparse_parts], axis=1))
        if dense:
            total = dense[0].copy()
            for d in dense[1:]:
                total += d
            if cells is not None:
                total[:, cells] += vals  # cells are unique: a plain fancy add is exact
            out._dense = total
        elif cells is None:
            out._set_sparse(_NO_CELLS, _NO_VALUES)
        else:  # the arrays of a sparse grid are never written in place: sharing them is safe
            out._set_sparse(cells, vals)
        return out

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
        if not isinstance(other, ScoreGrid) or other.shape != self.shape:
            return False
        if self._dense is None and other._dense is None:
            a, b = sparse.prune(self._cells, self._vals), sparse.prune(other._cells, other._vals)
            return np.array_equal(a[0], b[0]) and np.array_equal(a[1], b[1])
        return np.array_equal(self._all(), other._all())

    __hash__ = None  # type: ignore[assignment]

    def coarsen(self, bins: int) -> ScoreGrid:
        """The same statistics on ``bins`` cells (``bins`` must divide the current number)."""
        if bins < 1 or self.bins % bins:
            raise ValueError(f"cannot coarsen {self.bins} cells to {bins}: {bins} must divide {self.bins}")
        out = ScoreGrid(bins, self.channels)
        factor = self.bins // bins
        if self._dense is not None:
            out._dense = self._dense.reshape(_F, -1, bins, factor).sum(axis=-1).reshape(_F, -1)
            out._cells, out._vals = _NO_CELLS, _NO_VALUES
        else:
            cells = self._cells // self.bins * bins + self._cells % self.bins // factor
            out._set_sparse(*sparse.aggregate(cells, self._vals))
        return out

    def channel(self, k: int) -> ScoreGrid:
        """The single grid of channel ``k``."""
        if self.channels is None:
            raise ValueError("grid has no channels")
        out = ScoreGrid(self.bins)
        if self._dense is not None:
            out._dense = self._dense[:, k * self.bins:(k + 1) * self.bins].copy()
            out._cells, out._vals = _NO_CELLS, _NO_VALUES
        else:
            keep = (self._cells >= k * self.bins) & (self._cells < (k + 1) * self.bins)
            out._set_sparse(self._cells[keep] - k * self.bins, self._vals[:, keep])
        return out

    def nbytes(self) -> int:
        """Bytes held by the statistics (dense fields, or the occupied cells and their sums)."""
        if self._dense is not None:
            return int(self._dense.nbytes)
        return int(self._cells.nbytes + self._vals.nbytes)

    # -- serialisation --------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        """Versioned, pickle-free document, chosen by content: the occupied cells and their sums (version 2)
        while at most a quarter of a grid of >= :data:`SPARSE_MIN_CELLS` cells is occupied, else each int64
        field as zlib-compressed little-endian bytes in base64 (version 1)."""
        if self._dense is None:
            cells, vals = sparse.prune(self._cells, self._vals)
        else:
            cells, vals = sparse.from_dense(self._dense)
        base = {"format": FORMAT, "bins": self.bins, "channels": self.channels, "quantum_bits": QUANTUM_BITS}
        if self.size >= SPARSE_MIN_CELLS and cells.size <= self.size // 4:
            return {**base, "version": SPARSE_VERSION, "cells": pack_array(cells), "values": pack_array(vals)}
        dense = self._all().reshape(_F, *self.shape)
        return {**base, "version": FORMAT_VERSION, "fields": {f: pack_array(dense[i]) for i, f in enumerate(FIELDS)}}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ScoreGrid:
        """Rebuild from :meth:`to_dict` output (dense version 1 or sparse version 2), stored by content."""
        if d.get("format") != FORMAT or d.get("version") not in (FORMAT_VERSION, SPARSE_VERSION):
            raise ValueError(f"not a {FORMAT} v{FORMAT_VERSION}/v{SPARSE_VERSION} document: "
                             f"{d.get('format')} v{d.get('version')}")
        if d.get("quantum_bits") != QUANTUM_BITS:
            raise ValueError(f"grid uses quantum 2^-{d.get('quantum_bits')}, this build uses 2^-{QUANTUM_BITS}")
        out = cls(d["bins"], d["channels"])
        if d["version"] == SPARSE_VERSION:
            cells = unpack_array(d["cells"], "<i8").astype(np.int64)
            vals = unpack_array(d["values"], "<i8", (_F, cells.size)).astype(np.int64)
            if cells.ndim != 1 or (cells.size and (cells.min() < 0 or cells.max() >= out.size
                                                   or (np.diff(cells) <= 0).any())):
                raise ValueError("sparse grid cells must be sorted, unique and inside the grid")
            out._set_sparse(cells, vals)
        else:
            dense = np.stack([unpack_array(d["fields"][f], "<i8", out.shape).reshape(-1) for f in FIELDS])
            cells, vals = sparse.from_dense(dense)
            if out.size >= SPARSE_MIN_CELLS and cells.size <= out.size // 4:
                out._set_sparse(cells, vals)
            else:
                out._dense = dense.astype(np.int64)
                out._cells, out._vals = _NO_CELLS, _NO_VALUES
        return out

    def to_parts(self, packer: Packer) -> dict[str, Any]:
        """The grid for a packed document (:mod:`calmon.stats.packed`): the same content and the same
        storage rule as :meth:`to_dict`, its arrays put into ``packer``."""
        out: dict[str, Any] = {"bins": self.bins, "channels": self.channels, "quantum_bits": QUANTUM_BITS}
        if self.size < SPARSE_MIN_CELLS:  # always dense (the ECE and reliability grids): no occupied cells to find
            out["dense"] = packer.put(self._all(), "<i8")
            return out
        if self._dense is None:
            cells, vals = sparse.prune(self._cells, self._vals)
        else:
            cells, vals = sparse.from_dense(self._dense)
        if cells.size <= self.size // 4:
            out.update(cells=packer.put(cells, "<i8"), values=packer.put(vals, "<i8"))
        else:
            out["dense"] = packer.put(self._all(), "<i8")
        return out

    @classmethod
    def from_parts(cls, d: dict[str, Any], unpacker: Unpacker) -> ScoreGrid:
        """Rebuild from :meth:`to_parts` output; storage chosen by content as in :meth:`from_dict`.

        The part is checked by :meth:`read_part` and copied by :meth:`from_part`, so that the decoded payload
        is freed (a view would keep all of it alive)."""
        return cls.from_part(cls.read_part(d, unpacker))

    @classmethod
    def read_part(cls, d: dict[str, Any], unpacker: Unpacker) -> GridPart:
        """The grid :meth:`to_parts` wrote, checked as :meth:`from_parts` checks it, as read-only views of the
        payload (no grid built, nothing copied): what :meth:`merge_part` adds.

        Raises
        ------
        ValueError
            The part is damaged.
        """
        if d.get("quantum_bits") != QUANTUM_BITS:
            raise ValueError(f"grid uses quantum 2^-{d.get('quantum_bits')}, this build uses 2^-{QUANTUM_BITS}")
        bins, channels = d["bins"], d["channels"]
        if type(bins) is not int or bins < 1 or not (channels is None or (type(channels) is int and channels >= 1)):
            raise ValueError(f"grid needs a positive integer bins and channels null or positive, got {bins!r}, "
                             f"{channels!r}")
        size = bins * (channels or 1)
        if "dense" in d:
            return GridPart(bins, channels, unpacker.get(d["dense"], "<i8", (_F, size)), _NO_CELLS, _NO_VALUES)
        cells = unpacker.get(d["cells"], "<i8")
        vals = unpacker.get(d["values"], "<i8", (_F, cells.size))
        if cells.ndim != 1 or (cells.size and (cells[0] < 0 or cells[-1] >= size
                                               or not (cells[1:] > cells[:-1]).all())):
            raise ValueError("sparse grid cells must be sorted, unique and inside the grid")
        return GridPart(bins, channels, None, cells, vals)

    @classmethod
    def from_part(cls, part: GridPart) -> ScoreGrid:
        """The grid of a :meth:`read_part` (copies: the payload is not kept alive), as :meth:`from_parts`."""
        out = cls.__new__(cls)
        out.bins, out.channels = part.bins, part.channels
        out._dense, out._cells, out._vals = None, _NO_CELLS, _NO_VALUES
        if part.dense is not None:
            out._dense = part.dense.copy()
        else:
            out._set_sparse(part.cells.copy(), part.vals.copy())
        return out

    def merge_part(self, part: GridPart) -> None:
        """:meth:`merge` of the grid of a :meth:`read_part`, straight from its views: the same integers and the
        same storage as ``merge(ScoreGrid.from_part(part))``, without building that grid.

        Raises
        ------
        ValueError
            The part's shape is not this grid's (nothing was added).
        """
        if part.bins != self.bins or part.channels != self.channels:
            raise ValueError(f"cannot combine grids of shapes {self.shape} and bins {part.bins}, channels "
                             f"{part.channels}")
        if part.dense is not None:
            self._densify()
            assert self._dense is not None
            self._dense += part.dense
        elif not part.cells.size:
            return
        elif self._dense is not None:
            self._dense[:, part.cells] += part.vals
        else:  # combine() copies what it keeps: no view of the payload stays in the grid
            self._set_sparse(*sparse.combine(self._cells, self._vals, part.cells, part.vals))

    def __repr__(self) -> str:
        ch = "" if self.channels is None else f", channels={self.channels}"
        return f"ScoreGrid(bins={self.bins}{ch}, count={self.count})"
