"""Automatic garbage collection paused for a block of work that makes many short-lived objects.

Decoding a batch, turning a Kafka poll into a batch, or restoring the state creates tens of thousands of tracked
objects; the collections they trigger promote the survivors to the old generation, whose full collections traverse
every object of the agent's state (issue #15: a cost that grew with the number of models). Paused, temporaries die
by reference counting only; a collection that falls due runs after, as usual.

Examples
--------
>>> import gc
>>> with collection_paused():
...     gc.isenabled()
False
>>> gc.isenabled()
True
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["collection_paused"]


@contextmanager
def collection_paused() -> Iterator[None]:
    """Automatic collection off for the block, then as it was (left alone if the application disabled it)."""
    if not gc.isenabled():
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        gc.enable()
