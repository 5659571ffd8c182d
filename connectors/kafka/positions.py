"""Kafka positions: ``"topic/partition"`` keys and the ``{key: next offset}`` dicts that are checkpointed.

A position maps each partition a source has read from to the offset of the next record to read, so
seeking to a checkpointed position continues right after the last record the checkpoint contains.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, NamedTuple


class TP(NamedTuple):
    """A topic partition; equal to (and hashed like) kafka-python's ``TopicPartition`` tuple.

    Examples
    --------
    >>> tp = TP("events", 2)
    >>> tp.key, tp == ("events", 2)
    ('events/2', True)
    """

    topic: str
    partition: int

    @property
    def key(self) -> str:
        """The partition's key in a position dict (see :func:`position_key`)."""
        return position_key(self.topic, self.partition)


def position_key(topic: str, partition: int) -> str:
    """Key of a partition in a position dict.

    Examples
    --------
    >>> position_key("events", 3)
    'events/3'
    """
    return f"{topic}/{int(partition)}"


def split_position_key(key: str) -> tuple[str, int]:
    """Inverse of :func:`position_key`.

    Examples
    --------
    >>> split_position_key("a/b/2")
    ('a/b', 2)
    """
    topic, sep, part = key.rpartition("/")
    if not sep or not topic or not part.isdigit():
        raise ValueError(f"bad Kafka position key {key!r}: expected 'topic/partition'")
    return topic, int(part)


def key_tp(key: str) -> TP:
    """The :class:`TP` of a position key.

    Examples
    --------
    >>> key_tp("events/1")
    TP(topic='events', partition=1)
    """
    return TP(*split_position_key(key))


def validate_position(position: Mapping[str, Any]) -> dict[str, int]:
    """Check a position dict (``"topic/partition"`` -> offset >= 0) and return a plain copy.

    Examples
    --------
    >>> validate_position({"events/0": 42})
    {'events/0': 42}
    >>> validate_position({"events/0": -1})
    Traceback (most recent call last):
    ...
    ValueError: Kafka position 'events/0': offset must be an integer >= 0, got -1
    """
    if not isinstance(position, Mapping):
        raise ValueError(
            f"Kafka position must be a dict 'topic/partition' -> offset, got {type(position).__name__}"
        )
    out: dict[str, int] = {}
    for key, off in position.items():
        split_position_key(str(key))
        if isinstance(off, bool) or not isinstance(off, int) or off < 0:
            raise ValueError(f"Kafka position {key!r}: offset must be an integer >= 0, got {off!r}")
        out[str(key)] = int(off)
    return out
