"""``"path:line"`` origins of a file batch's records, formatted only when one is read.

A file source used to format one origin string per record (about a tenth of the agent's per-event cost,
issue #15) although only rejected records' origins are ever read (dead letters, error messages).
:class:`LineOrigins` keeps runs of line numbers per file instead and formats an origin on access.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Iterator, Sequence
from typing import overload

__all__ = ["LineOrigins"]


class LineOrigins(Sequence[str]):
    """The origins ``f"{path}:{line}"`` of a batch's records, as a read-only sequence of strings.

    Examples
    --------
    >>> o = LineOrigins()
    >>> o.add("a.jsonl", range(1, 4))
    >>> o.add("b.jsonl", [2, 5])
    >>> len(o), o[0], o[3], o[-1], list(o[2:4])
    (5, 'a.jsonl:1', 'b.jsonl:2', 'b.jsonl:5', ['a.jsonl:3', 'b.jsonl:2'])
    >>> o == ["a.jsonl:1", "a.jsonl:2", "a.jsonl:3", "b.jsonl:2", "b.jsonl:5"]
    True
    """

    __slots__ = ("_starts", "_runs", "_n")

    def __init__(self) -> None:
        self._starts: list[int] = []  # position of each run's first record
        self._runs: list[tuple[str, Sequence[int]]] = []
        self._n = 0

    def add(self, path: str, lines: Sequence[int]) -> None:
        """Append the origins of records at ``lines`` (1-based line numbers, or rows) of ``path``."""
        if len(lines):
            self._starts.append(self._n)
            self._runs.append((path, lines))
            self._n += len(lines)

    def __len__(self) -> int:
        return self._n

    @overload
    def __getitem__(self, i: int) -> str: ...

    @overload
    def __getitem__(self, i: slice) -> list[str]: ...

    def __getitem__(self, i: int | slice) -> str | list[str]:
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(self._n))]
        if i < 0:
            i += self._n
        if not 0 <= i < self._n:
            raise IndexError("origin index out of range")
        r = bisect_right(self._starts, i) - 1
        path, lines = self._runs[r]
        return f"{path}:{lines[i - self._starts[r]]}"

    def __iter__(self) -> Iterator[str]:
        for path, lines in self._runs:
            yield from [f"{path}:{n}" for n in lines]

    def __eq__(self, other: object) -> bool:
        if isinstance(other, (LineOrigins, list, tuple)):
            return len(self) == len(other) and all(a == b for a, b in zip(self, other))
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]  # mutable, like a list

    def __repr__(self) -> str:
        return f"LineOrigins({list(self)!r})"
