"""Deterministic hash splits of events into training and held-out parts.

An event's side depends only on ``salt`` and its id, so it is stable across restarts, replicas and
windows.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

from calmon.stats.data import CalibrationData

__all__ = ["hash_unit", "hash_split", "split_arrays"]


def hash_unit(ids: Iterable[Any], salt: str = "calmon") -> np.ndarray:
    """Deterministic value in [0, 1) per id: the first 8 bytes of BLAKE2b(salt, id) / 2^64.

    Examples
    --------
    >>> u = hash_unit(["a", "b"])
    >>> bool(((u >= 0) & (u < 1)).all()), bool((hash_unit(["a", "b"]) == u).all())
    (True, True)
    """
    key = salt.encode()[:64]
    out = [int.from_bytes(hashlib.blake2b(str(i).encode(), digest_size=8, key=key).digest(), "big")
           for i in ids]
    return np.asarray(out, dtype=np.float64) / 2.0**64


def hash_split(ids: Iterable[Any], fraction: float = 0.2, salt: str = "calmon") -> np.ndarray:
    """Boolean mask: True for the held-out events (about ``fraction`` of them), stable per id."""
    if not 0.0 < fraction < 1.0:
        raise ValueError(f"holdout fraction must lie in (0, 1), got {fraction}")
    return hash_unit(ids, salt) < fraction


def split_arrays(ids: Sequence[Any], *, z: Any = None, y: Any = None, probs: Any = None, labels: Any = None,
                 fraction: float = 0.2, salt: str = "calmon") -> tuple[CalibrationData, CalibrationData]:
    """Split raw arrays by :func:`hash_split` of ``ids`` into (train, holdout) ``CalibrationData``.

    Examples
    --------
    >>> train, hold = split_arrays([str(i) for i in range(1000)], z=np.full(1000, 0.5), y=np.zeros(1000))
    >>> train.n + hold.n, 150 < hold.n < 250, hold.raw_is_complete
    (1000, True, True)
    """
    mask = hash_split(ids, fraction, salt)

    def pick(a: Any, sel: np.ndarray) -> np.ndarray | None:
        return None if a is None else np.asarray(a)[sel]

    def part(sel: np.ndarray) -> CalibrationData:
        return CalibrationData(n=int(sel.sum()), z=pick(z, sel), y=pick(y, sel), probs=pick(probs, sel),
                               labels=pick(labels, sel),
                               raw_is_complete=True)

    return part(~mask), part(mask)
