"""All statistics the monitor keeps for one model (and segment, and time bucket)."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any, NamedTuple

import numpy as np

from calmon.stats.data import CalibrationData
from calmon.stats.grid import GridPart, ScoreGrid
from calmon.stats.levelset import LevelSetStats
from calmon.stats.packed import Packer, Unpacker
from calmon.stats.reservoir import Reservoir, ReservoirPart

FORMAT = "calmon.model_stats"
FORMAT_VERSION = 1


#: PCG64 states of ``default_rng(n)`` by ``n`` (seeding hashes the seed, about 8 us; setting a state, 1 us): the
#: window sums seed a reservoir merge with an event count, and counts repeat across rings and rounds.
_SEEDED: dict[int, dict[str, Any]] = {}
_SEEDED_MAX = 4096


def _seeded_state(n: int) -> dict[str, Any]:
    """The bit generator state of ``np.random.default_rng(n)`` (cached; never mutated by its users)."""
    state = _SEEDED.get(n)
    if state is None:
        if len(_SEEDED) >= _SEEDED_MAX:
            _SEEDED.clear()
        state = _SEEDED[n] = dict(np.random.PCG64(n).state)
    return state


_LOCAL = threading.local()


def _generator() -> np.random.Generator:
    """This thread's generator for seeded merges (its state is set before each use; creating one costs a seeding)."""
    gen: np.random.Generator | None = getattr(_LOCAL, "gen", None)
    if gen is None:
        gen = _LOCAL.gen = np.random.Generator(np.random.PCG64(0))
    return gen


def merge_rng(count: int) -> np.random.Generator:
    """The generator a merge of reservoirs draws from: ``np.random.default_rng(count)``, ``count`` the merged
    statistics' count after the merge (:meth:`ModelStats.summed`), as this thread's generator with its state set
    (no seeding per merge).  Valid until the next call in this thread."""
    gen = _generator()
    gen.bit_generator.state = _seeded_state(count)
    return gen


def top_label(probs: np.ndarray, labels: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Top-label confidence and correctness (ties go to the lowest class index, as numpy's argmax)."""
    pred = probs.argmax(axis=1)
    return probs[np.arange(len(probs)), pred], (pred == labels).astype(np.float64)


class ModelPart(NamedTuple):
    """Model statistics as :meth:`ModelStats.read_part` reads them from a packed payload (views, checked)."""

    classes: int
    fine: GridPart
    ece: GridPart
    classwise: GridPart | None
    reservoir: ReservoirPart | None
    levelset: LevelSetStats | None


class ModelStats:
    """Mergeable statistics of one model's labeled events.

    Parameters
    ----------
    classes
        2 for a binary model (``score`` = P(y = 1)), K > 2 for multiclass probabilities.
    bins
        Cells of the fine grid (binary score, or top-label confidence vs correct); a power of two.
    ece_bins
        Equal-width bins of the exact l1-ECE grid (15 as in Guo et al. and the T-Cal tables);
        also used for the class-wise grid of multiclass models.
    reservoir
        Capacity of the uniform raw sample (0 disables it).
    levelset_lambda
        Level-set resolution for the multiclass l_p statistics (``None`` disables them).
    seed
        Seed of the reservoir sampler.

    Examples
    --------
    >>> import numpy as np
    >>> s = ModelStats(classes=2, bins=64)
    >>> s.update(score=np.array([0.2, 0.8]), labels=np.array([0, 1]))
    >>> (s + s).count
    4
    """

    def __init__(self, classes: int = 2, bins: int = 4096, ece_bins: int = 15, reservoir: int = 2000,
                 levelset_lambda: int | None = None, levelset_pools: int | None = None, seed: int = 0) -> None:
        if classes < 2:
            raise ValueError(f"classes must be >= 2, got {classes}")
        self.classes = int(classes)
        self.fine = ScoreGrid(bins)
        self.ece = ScoreGrid(ece_bins)
        self.classwise = ScoreGrid(ece_bins, channels=classes) if classes > 2 else None
        width = 2 if classes == 2 else classes + 1
        self.reservoir = Reservoir(reservoir, width, seed) if reservoir else None
        self.levelset: LevelSetStats | None = None
        if levelset_lambda is not None and classes > 2:
            self.levelset = LevelSetStats(classes, levelset_lambda, levelset_pools)

    @property
    def count(self) -> int:
        return self.fine.count

    def update(self, score: np.ndarray | None = None, probs: np.ndarray | None = None,
               labels: np.ndarray | None = None, ids: np.ndarray | None = None) -> None:
        """Add labeled events: ``score`` (binary) or ``probs`` (multiclass) with class ``labels``."""
        labels = np.asarray(labels, dtype=np.int64)
        if self.classes == 2:
            if score is None:
                raise ValueError("binary model: score is required")
            z = np.asarray(score, dtype=np.float64)
            y = labels.astype(np.float64)
            self.fine.update(z, y)
            self.ece.update(z, y)
            if self.reservoir is not None:
                self.reservoir.update(np.column_stack([z, y]))
            return
        if probs is None:
            raise ValueError("multiclass model: probs is required")
        probs = np.asarray(probs, dtype=np.float64)
        conf, correct = top_label(probs, labels)
        self.fine.update(conf, correct)
        self.ece.update(conf, correct)
        onehot = np.zeros_like(probs)
        onehot[np.arange(len(labels)), labels] = 1.0
        assert self.classwise is not None
        self.classwise.update(probs, onehot)
        if self.reservoir is not None:
            self.reservoir.update(np.column_stack([probs, labels]))
        if self.levelset is not None:
            self.levelset.update(probs, labels, ids)

    # -- algebra ---------------------------------------------------------------------------
    def copy(self, sample_only: bool = False) -> ModelStats:
        """An independent copy, field by field (a checkpoint copies dirty buckets under the lock: keep it cheap).

        ``sample_only``: the reservoir's rows and count only, no generator (:meth:`Reservoir.sample_copy`), for
        a copy that is only merged from (the window sums' copies of buckets).
        """
        out = ModelStats.__new__(ModelStats)
        out.classes = self.classes
        out.fine, out.ece = self.fine.copy(), self.ece.copy()
        out.classwise = None if self.classwise is None else self.classwise.copy()
        res = self.reservoir
        out.reservoir = None if res is None else res.sample_copy() if sample_only else res.copy()
        out.levelset = None if self.levelset is None else self.levelset.copy()
        return out

    def merge(self, other: ModelStats, rng: np.random.Generator | None = None) -> None:
        """Add ``other`` in place (reservoirs are merged by weighted sampling with ``rng``)."""
        if other.classes != self.classes:
            raise ValueError(f"cannot merge statistics of {self.classes} and {other.classes} classes")
        self.fine.merge(other.fine)
        self.ece.merge(other.ece)
        if self.classwise is not None and other.classwise is not None:
            self.classwise.merge(other.classwise)
        if self.reservoir is not None and other.reservoir is not None:
            self.reservoir = self.reservoir.merged(other.reservoir, rng or np.random.default_rng(self.count))
        if self.levelset is not None and other.levelset is not None:
            self.levelset.merge(other.levelset)

    def summed(self, others: Sequence[ModelStats]) -> ModelStats:
        """A new state equal to a copy of this one into which ``others`` are merged in turn (:meth:`merge`
        without ``rng``); nothing is changed.

        The grids are summed in one pass each (:meth:`ScoreGrid.summed`: exact integers, any order); the
        reservoirs are merged in the given order, each merge seeded with the count after it as
        :meth:`merge` does (the order and seeds define the sample, Vitter 1985 / hypergeometric split), so
        the result is bit for bit the pairwise one, for one grid pass instead of ``len(others)``.

        Examples
        --------
        >>> import numpy as np
        >>> a, b = ModelStats(bins=64, reservoir=3), ModelStats(bins=64, reservoir=3)
        >>> a.update(score=np.array([0.2, 0.8]), labels=np.array([0, 1]))
        >>> b.update(score=np.array([0.3, 0.6, 0.9]), labels=np.array([1, 1, 0]))
        >>> a.summed([b, a]) == (a + b) + a
        True
        """
        for o in others:
            if o.classes != self.classes:
                raise ValueError(f"cannot merge statistics of {self.classes} and {o.classes} classes")
        out = ModelStats.__new__(ModelStats)
        out.classes = self.classes
        out.fine = self.fine.summed([o.fine for o in others])
        out.ece = self.ece.summed([o.ece for o in others])
        out.classwise = None
        if self.classwise is not None:
            out.classwise = self.classwise.summed([o.classwise for o in others if o.classwise is not None])
        out.reservoir = self.reservoir
        count = self.fine.count
        for o in others:
            count += o.fine.count  # ``self.count`` after merging ``o``'s fine grid: the seed merge() uses
            if out.reservoir is not None and o.reservoir is not None:
                out.reservoir = out.reservoir.merged(o.reservoir, merge_rng(count))
        if out.reservoir is self.reservoir and out.reservoir is not None:
            out.reservoir = out.reservoir.copy()
        out.levelset = None if self.levelset is None else self.levelset.copy()
        if out.levelset is not None:
            for o in others:
                if o.levelset is not None:
                    out.levelset.merge(o.levelset)
        return out

    def __add__(self, other: ModelStats) -> ModelStats:
        out = self.copy()
        out.merge(other)
        return out

    def calibration_data(self) -> CalibrationData:
        """What testers get from these statistics: the grid, the reservoir sample, the level-set bins."""
        z = y = probs = labels = None
        if self.reservoir is not None and self.reservoir.seen:
            rows = self.reservoir.rows
            if self.classes == 2:
                z, y = rows[:, 0], rows[:, 1]
            else:
                probs, labels = rows[:, :-1], rows[:, -1].astype(np.int64)
                z, y = top_label(probs, labels)
        complete = self.reservoir is not None and self.reservoir.seen <= self.reservoir.capacity
        return CalibrationData(n=self.count, grid=self.fine, z=z, y=y, probs=probs, labels=labels,
                               levelset=self.levelset, raw_is_complete=complete)

    # -- serialisation ------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        return {"format": FORMAT, "version": FORMAT_VERSION, "classes": self.classes,
                "fine": self.fine.to_dict(), "ece": self.ece.to_dict(),
                "classwise": None if self.classwise is None else self.classwise.to_dict(),
                "reservoir": None if self.reservoir is None else self.reservoir.to_dict(),
                "levelset": None if self.levelset is None else self.levelset.to_dict()}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ModelStats:
        if d.get("format") != FORMAT or d.get("version") != FORMAT_VERSION:
            raise ValueError(f"not a {FORMAT} v{FORMAT_VERSION} document")
        out = cls.__new__(cls)
        out.classes = int(d["classes"])
        out.fine = ScoreGrid.from_dict(d["fine"])
        out.ece = ScoreGrid.from_dict(d["ece"])
        out.classwise = None if d["classwise"] is None else ScoreGrid.from_dict(d["classwise"])
        out.reservoir = None if d["reservoir"] is None else Reservoir.from_dict(d["reservoir"])
        out.levelset = None
        if d.get("levelset") is not None:
            out.levelset = LevelSetStats.from_dict(d["levelset"])
        return out

    def to_parts(self, packer: Packer) -> dict[str, Any]:
        """The statistics for a packed document (:mod:`calmon.stats.packed`; level sets stay a JSON document)."""
        return {"classes": self.classes, "fine": self.fine.to_parts(packer), "ece": self.ece.to_parts(packer),
                "classwise": None if self.classwise is None else self.classwise.to_parts(packer),
                "reservoir": None if self.reservoir is None else self.reservoir.to_parts(packer),
                "levelset": None if self.levelset is None else self.levelset.to_dict()}

    @classmethod
    def from_parts(cls, d: dict[str, Any], unpacker: Unpacker) -> ModelStats:
        """Rebuild from :meth:`to_parts` output."""
        out = cls.__new__(cls)
        out.classes = int(d["classes"])
        if out.classes < 2:
            raise ValueError(f"classes must be >= 2, got {out.classes}")
        out.fine = ScoreGrid.from_parts(d["fine"], unpacker)
        out.ece = ScoreGrid.from_parts(d["ece"], unpacker)
        out.classwise = None if d["classwise"] is None else ScoreGrid.from_parts(d["classwise"], unpacker)
        out.reservoir = None if d["reservoir"] is None else Reservoir.from_parts(d["reservoir"], unpacker)
        out.levelset = None if d.get("levelset") is None else LevelSetStats.from_dict(d["levelset"])
        return out

    @classmethod
    def read_part(cls, d: dict[str, Any], unpacker: Unpacker) -> ModelPart:
        """The statistics :meth:`to_parts` wrote, checked as :meth:`from_parts` checks them, as read-only views
        of the payload: what :meth:`merge_part` adds (nothing is built but a level set, a small document)."""
        classes = int(d["classes"])
        if classes < 2:
            raise ValueError(f"classes must be >= 2, got {classes}")
        return ModelPart(classes, ScoreGrid.read_part(d["fine"], unpacker), ScoreGrid.read_part(d["ece"], unpacker),
                         None if d["classwise"] is None else ScoreGrid.read_part(d["classwise"], unpacker),
                         None if d["reservoir"] is None else Reservoir.read_part(d["reservoir"], unpacker),
                         None if d.get("levelset") is None else LevelSetStats.from_dict(d["levelset"]))

    @classmethod
    def from_part(cls, part: ModelPart) -> ModelStats:
        """The statistics of a :meth:`read_part` (arrays copied), as :meth:`from_parts` builds them."""
        out = cls.__new__(cls)
        out.classes = part.classes
        out.fine, out.ece = ScoreGrid.from_part(part.fine), ScoreGrid.from_part(part.ece)
        out.classwise = None if part.classwise is None else ScoreGrid.from_part(part.classwise)
        out.reservoir = None if part.reservoir is None else Reservoir.from_part(part.reservoir)
        out.levelset = None if part.levelset is None else part.levelset.copy()
        return out

    def check_part(self, part: ModelPart) -> None:
        """Raise ``ValueError`` unless :meth:`merge_part` can add ``part`` whole (classes and grid shapes)."""
        if part.classes != self.classes:
            raise ValueError(f"cannot merge statistics of {self.classes} and {part.classes} classes")
        for grid, got in ((self.fine, part.fine), (self.ece, part.ece), (self.classwise, part.classwise)):
            if grid is not None and got is not None and (got.bins, got.channels) != (grid.bins, grid.channels):
                raise ValueError(f"cannot combine grids of shapes {grid.shape} and bins {got.bins}, channels "
                                 f"{got.channels}")
        res = part.reservoir
        if self.reservoir is not None and res is not None and res.width != self.reservoir.width:
            raise ValueError(f"cannot merge reservoirs of widths {self.reservoir.width} and {res.width}")

    def merge_part(self, part: ModelPart) -> None:
        """:meth:`merge` of the statistics of a :meth:`read_part`, straight from its views: the grids get the
        same integers (and storage) as ``merge(ModelStats.from_part(part))``; the reservoir becomes a uniform
        sample of the union by :meth:`Reservoir.absorb` (in place, drawing from its own generator) -- an
        equally valid sample, not the same rows as :meth:`merge`'s reseeded one.  Call :meth:`check_part`
        first (then nothing here raises)."""
        self.fine.merge_part(part.fine)
        self.ece.merge_part(part.ece)
        if self.classwise is not None and part.classwise is not None:
            self.classwise.merge_part(part.classwise)
        res = part.reservoir
        if self.reservoir is not None and res is not None:
            if res.capacity == self.reservoir.capacity:
                self.reservoir.absorb(res.rows, res.seen)
            else:  # (not between buckets of one model) the general merge
                self.reservoir = self.reservoir.merged(Reservoir.from_part(res), np.random.default_rng(self.count))
        if self.levelset is not None and part.levelset is not None:
            self.levelset.merge(part.levelset)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, ModelStats) and self.to_dict() == other.to_dict()

    __hash__ = None  # type: ignore[assignment]

    def nbytes(self) -> int:
        n = self.fine.nbytes() + self.ece.nbytes() + (self.classwise.nbytes() if self.classwise else 0)
        if self.levelset is not None:
            n += self.levelset.nbytes()
        if self.reservoir is not None:
            n += self.reservoir.nbytes()
        return n
