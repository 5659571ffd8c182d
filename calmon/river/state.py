"""An exact, revertible :class:`~calmon.stats.grid.ScoreGrid` fed one pair at a time.

river calls ``update`` and ``revert`` once per event.  Updating a 4096-cell grid event by event
costs a dozen full-size numpy passes each; instead the pairs are buffered and folded into the
grid in one batch when a value is asked for.  This changes nothing in the result: every event
adds the same fixed-point integers to its cell whatever the batch, so the folded grid is
bit-identical to event-by-event updates, and a revert subtracts exactly what the update added.
"""

from __future__ import annotations

import numpy as np

from calmon.stats.grid import ScoreGrid

__all__ = ["GridAccumulator"]

#: Pairs buffered before a fold; keeps every batch's cell sum far below 2**53 (float64-exact bincount).
_MAX_PENDING = 65536


class GridAccumulator:
    """A :class:`ScoreGrid` with buffered, exact ``add`` and ``remove`` of single (score, outcome) pairs.

    Parameters
    ----------
    bins
        Equal-width cells of the grid on [0, 1].

    Attributes
    ----------
    version
        Increases with every ``add`` or ``remove``: a value computed from :attr:`grid` stays valid
        while ``version`` does not change.

    Examples
    --------
    >>> acc = GridAccumulator(bins=4)
    >>> acc.add(0.9, 1.0); acc.add(0.2, 0.0); acc.remove(0.9, 1.0)
    >>> acc.grid.n.tolist(), acc.count
    ([1.0, 0.0, 0.0, 0.0], 1)
    >>> acc.remove(0.2, 0.0); acc.grid == ScoreGrid(4)
    True
    """

    __slots__ = ("bins", "version", "_grid", "_added", "_removed")

    def __init__(self, bins: int) -> None:
        self.bins = int(bins)
        self.version = 0
        self._grid = ScoreGrid(self.bins)
        self._added: list[tuple[float, float]] = []
        self._removed: list[tuple[float, float]] = []

    @property
    def count(self) -> int:
        """Events held (after the buffered adds and removes)."""
        return self._grid.count + len(self._added) - len(self._removed)

    def add(self, z: float, y: float) -> None:
        """Count the pair (score ``z`` in [0, 1], outcome ``y`` in {0, 1})."""
        self._added.append((z, y))
        self._touch()

    def remove(self, z: float, y: float) -> None:
        """Forget a pair added before; the grid ends exactly as if it had never been added."""
        self._removed.append((z, y))
        self._touch()

    @property
    def grid(self) -> ScoreGrid:
        """The grid of every pair added and not removed (the buffers folded in first)."""
        self._fold()
        return self._grid

    def _touch(self) -> None:
        self.version += 1
        if len(self._added) + len(self._removed) >= _MAX_PENDING:
            self._fold()

    def _fold(self) -> None:
        if self._added:
            z, y = np.array(self._added, dtype=np.float64).T
            self._grid.update(z, y)
            self._added.clear()
        if self._removed:
            gone = ScoreGrid(self.bins)
            z, y = np.array(self._removed, dtype=np.float64).T
            gone.update(z, y)
            self._removed.clear()
            try:
                self._grid.subtract(gone)
            except ValueError:
                self._grid.merge(gone)  # leave the state as it was before the bad fold
                raise ValueError("revert of a pair that was never updated") from None
