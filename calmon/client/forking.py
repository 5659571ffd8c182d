"""Run an object's method in the child after ``fork()``, without keeping the object alive.

Web servers fork workers (gunicorn ``--preload``) after the application created its emitter: the
child inherits the parent's queue, file descriptor and lock but not its threads, so each sink
resets itself there. ``os.register_at_fork`` hooks cannot be unregistered, hence the weak reference.

Examples
--------
>>> class Sink:
...     def reset(self) -> None:
...         print("reset in the child")
>>> s = Sink()
>>> after_fork_in_child(s, Sink.reset)
"""

from __future__ import annotations

import os
import weakref
from collections.abc import Callable
from typing import TypeVar

__all__ = ["after_fork_in_child"]

T = TypeVar("T")


def after_fork_in_child(obj: T, method: Callable[[T], None]) -> None:
    """Call ``method(obj)`` in every forked child while ``obj`` is alive."""
    ref = weakref.ref(obj)

    def hook() -> None:
        target = ref()
        if target is not None:
            method(target)

    os.register_at_fork(after_in_child=hook)
