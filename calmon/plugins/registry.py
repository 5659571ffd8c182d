"""A small name -> object registry that refuses duplicates (testers, calibrators, plugins).

Like ``prometheus_client``'s ``CollectorRegistry``: registration happens under a lock and a
second object under a taken name is an error, never a silent overwrite.

Examples
--------
>>> r: Registry[int] = Registry("tester")
>>> r.register("a", 1)
1
>>> r.register("a", 2)
Traceback (most recent call last):
...
ValueError: tester 'a' is already registered
>>> r.get("b")
Traceback (most recent call last):
...
ValueError: unknown tester 'b' (known: a)
>>> "a" in r, r.names()
(True, ['a'])
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from typing import Generic, TypeVar

T = TypeVar("T")

__all__ = ["Registry"]


class Registry(Generic[T]):
    """Thread-safe mapping from names to objects of one kind.

    Parameters
    ----------
    kind
        What the entries are (used in error messages: ``"tester"``, ``"calibrator"``).
    """

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._items: dict[str, T] = {}
        self._lock = threading.Lock()

    def register(self, name: str, obj: T) -> T:
        """Add ``obj`` under ``name``; ``ValueError`` if the name is taken."""
        if not isinstance(name, str) or not name:
            raise ValueError(f"{self.kind} name must be a non-empty string, got {name!r}")
        with self._lock:
            if name in self._items:
                raise ValueError(f"{self.kind} {name!r} is already registered")
            self._items[name] = obj
        return obj

    def decorator(self, name: str) -> Callable[[T], T]:
        """``@registry.decorator("name")`` registers the decorated object."""

        def deco(obj: T) -> T:
            return self.register(name, obj)

        return deco

    def unregister(self, name: str) -> None:
        """Remove ``name`` (``KeyError`` if absent); for tests and plugin unloading."""
        with self._lock:
            del self._items[name]

    def get(self, name: str) -> T:
        """The object under ``name``; ``ValueError`` listing the known names if absent."""
        with self._lock:
            try:
                return self._items[name]
            except KeyError:
                known = ", ".join(sorted(self._items)) or "none"
                raise ValueError(f"unknown {self.kind} {name!r} (known: {known})") from None

    def names(self) -> list[str]:
        with self._lock:
            return sorted(self._items)

    def __contains__(self, name: object) -> bool:
        with self._lock:
            return name in self._items

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())

    def __len__(self) -> int:
        with self._lock:
            return len(self._items)
