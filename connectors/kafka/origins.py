"""Record origins of a Kafka batch (``"topic/partition@offset"``), kept per run of records and spelt on demand.

A batch of 65,536 records used to carry 65,536 origin strings, made while reading and read only for the few
records the decoder rejects (their dead letters and error messages name them).  :class:`RunOrigins` keeps one
entry per run of consecutive records of one partition and builds the string of record ``i`` when it is asked
for; iterating or changing it spells every string once (:meth:`RunOrigins.materialize`), after which it is an
ordinary list.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, SupportsIndex, overload

from connectors.kafka.positions import TP


@dataclass(frozen=True)
class Run:
    """Consecutive records of one partition: positions ``start .. stop - 1`` of a batch, offsets ascending.

    ``offsets`` is None when the offsets are ``first, first + 1, ...`` (the common case, nothing per record);
    otherwise it holds every record's offset (compacted topics, transaction markers in between).

    Examples
    --------
    >>> r = Run(TP("t", 0), 0, 3, 10)
    >>> r.last, r.offset(2), Run(TP("t", 0), 0, 2, 10, (10, 14)).last
    (12, 12, 14)
    """

    tp: TP
    start: int
    stop: int
    first: int
    offsets: Sequence[int] | None = None

    @property
    def last(self) -> int:
        """Offset of the run's last record."""
        return self.first + self.stop - self.start - 1 if self.offsets is None else int(self.offsets[-1])

    def offset(self, i: int) -> int:
        """Offset of the run's ``i``-th record (0-based within the run)."""
        return self.first + i if self.offsets is None else int(self.offsets[i])

    def moved(self, start: int) -> Run:
        """The same records at positions ``start ..`` of another batch."""
        return Run(self.tp, start, start + self.stop - self.start, self.first, self.offsets)


class RunOrigins(list[str]):
    """``"topic/partition@offset"`` of every record of a batch, as a list built from its runs when first iterated.

    ``len()``, truth and ``origins[i]`` cost nothing per record; any other use (iteration, slicing, comparison,
    changes) spells all of them first, so the object then behaves exactly as the plain list it stands for.

    Examples
    --------
    >>> o = RunOrigins([Run(TP("t", 1), 0, 2, 7), Run(TP("t", 0), 2, 4, 3, (3, 9))])
    >>> len(o), o[1], o[-1], bool(o)
    (4, 't/1@8', 't/0@9', True)
    >>> o == ["t/1@7", "t/1@8", "t/0@3", "t/0@9"], o[1:3]
    (True, ['t/1@8', 't/0@3'])
    """

    __slots__ = ("_runs", "_starts", "_n", "_filled")

    def __init__(self, runs: Sequence[Run]) -> None:
        super().__init__()
        self._runs = list(runs)
        self._starts = [r.start for r in self._runs]
        self._n = self._runs[-1].stop if self._runs else 0
        self._filled = not self._runs

    def materialize(self) -> None:
        """Spell every origin into the list (once)."""
        if self._filled:
            return
        self._filled = True
        for r in self._runs:
            prefix = r.tp.key + "@"
            offs: Sequence[int] = range(r.first, r.last + 1) if r.offsets is None else r.offsets
            super().extend([prefix + str(o) for o in offs])

    def __len__(self) -> int:
        return super().__len__() if self._filled else self._n

    @overload
    def __getitem__(self, i: SupportsIndex) -> str: ...

    @overload
    def __getitem__(self, i: slice) -> list[str]: ...

    def __getitem__(self, i: SupportsIndex | slice) -> str | list[str]:
        if self._filled or isinstance(i, slice):
            self.materialize()
            return super().__getitem__(i)
        k = i.__index__()
        if k < 0:
            k += self._n
        if not 0 <= k < self._n:
            raise IndexError("list index out of range")
        run = self._runs[bisect.bisect_right(self._starts, k) - 1]
        return f"{run.tp.key}@{run.offset(k - run.start)}"

    def __reduce__(self) -> tuple[Any, ...]:
        self.materialize()
        return (list, (list(self),))


def _filling(name: str) -> Callable[..., Any]:
    method = getattr(list, name)

    def call(self: RunOrigins, *args: Any, **kwargs: Any) -> Any:
        self.materialize()
        return method(self, *args, **kwargs)

    call.__name__ = name
    return call


# Every other list operation reads the list's own storage: spell the origins into it first.
for _name in ("__iter__", "__reversed__", "__contains__", "__eq__", "__ne__", "__lt__", "__le__", "__gt__", "__ge__",
              "__add__", "__iadd__", "__mul__", "__rmul__", "__imul__", "__repr__", "__setitem__", "__delitem__",
              "__sizeof__", "append", "extend", "insert", "pop", "remove", "reverse", "sort", "clear", "copy", "count",
              "index"):
    setattr(RunOrigins, _name, _filling(_name))
