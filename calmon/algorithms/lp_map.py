"""The calibrator map of Algorithm 2: heavy level sets mapped to group predictions.

References
----------
Bairaktari, Nguyen. Multiclass calibration under the probability-weighted l_p error (seeds 000 and
001 in ../shared/seeds): Algorithm 2 (output h).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from calmon.stats.levelset import level_keys, rho, unique_keys

__all__ = ["LevelSetMap"]


@dataclass
class LevelSetMap:
    """The output ``h`` of Algorithm 2: bins of B mapped to group predictions.

    ``h(x) = preds[group_of[R(f(x))]]`` if ``R(f(x))`` is a heavy bin, else ``rho(R(f(x)))``, or
    ``f(x)`` itself when ``passthrough`` is set (light bins keep the guarantee: their cells have
    mass below beta/4 either way, and passing through cannot raise the squared error).

    Examples
    --------
    >>> m = LevelSetMap(lam=2, classes=2, keys=np.array([[1, 0]]), group_of=np.array([0]),
    ...                 preds=np.array([[0.7, 0.3]]))
    >>> m.predict(np.array([[0.6, 0.4], [0.1, 0.9]])).tolist()
    [[0.7, 0.3], [0.25, 0.75]]
    """

    lam: int
    classes: int
    keys: np.ndarray
    group_of: np.ndarray
    preds: np.ndarray
    passthrough: bool = False
    _index: dict[bytes, int] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        k = int(self.classes)
        if k < 2:
            raise ValueError(f"classes must be >= 2, got {k}")
        self.classes = k
        self.keys = np.asarray(self.keys, dtype=np.int64).reshape(-1, k)
        self.group_of = np.asarray(self.group_of, dtype=np.int64).reshape(-1)
        self.preds = np.asarray(self.preds, dtype=np.float64).reshape(-1, k)
        if len(self.group_of) != len(self.keys):
            raise ValueError("group_of must have one entry per heavy bin")
        if len(self.keys) and (self.group_of.min() < 0 or self.group_of.max() >= len(self.preds)):
            raise ValueError("group_of refers to a missing group")
        if self.preds.size and (not np.isfinite(self.preds).all() or (self.preds < -1e-12).any()
                                or np.abs(self.preds.sum(axis=1) - 1.0).max() > 1e-6):
            raise ValueError("group predictions must be points of the simplex")
        self._index = {self.keys[i].astype("<i4").tobytes(): int(self.group_of[i])
                       for i in range(len(self.keys))}

    def predict(self, probs: np.ndarray) -> np.ndarray:
        """Calibrated probabilities for predictions ``probs`` of shape ``(n, K)``."""
        f = np.asarray(probs, dtype=np.float64)
        if f.ndim != 2 or f.shape[1] != self.classes:
            raise ValueError(f"probs must have shape (n, {self.classes}), got {f.shape}")
        f = f / f.sum(axis=1, keepdims=True)
        keys = level_keys(f, self.lam)
        out = f.copy() if self.passthrough else rho(keys, self.lam)
        if not self._index or len(f) == 0:
            return out
        uk, _, inv = unique_keys(keys, self.lam)
        gid = np.array([self._index.get(uk[i].astype("<i4").tobytes(), -1) for i in range(len(uk))],
                       dtype=np.int64)[inv]
        hit = gid >= 0
        out[hit] = self.preds[gid[hit]]
        return out

    def to_params(self) -> dict[str, Any]:
        """JSON-ready parameters (inverse of :meth:`from_params`)."""
        return {"lam": int(self.lam), "classes": self.classes, "keys": self.keys.tolist(),
                "group_of": self.group_of.tolist(), "preds": self.preds.tolist(),
                "passthrough": bool(self.passthrough)}

    @classmethod
    def from_params(cls, d: dict[str, Any]) -> LevelSetMap:
        """Rebuild a map from :meth:`to_params` output, validating keys, classes and predictions."""
        lam = d["lam"]
        if isinstance(lam, bool) or not isinstance(lam, int) or lam < 1:
            raise ValueError(f"lam must be a positive integer, got {lam!r}")
        k = d["classes"]
        if isinstance(k, bool) or not isinstance(k, int) or k < 2:
            raise ValueError(f"classes must be an integer >= 2, got {k!r}")
        keys = np.asarray(d["keys"], dtype=np.int64).reshape(-1, k)
        if (keys < 0).any() or (keys.sum(axis=1) > lam).any():
            raise ValueError("keys must be level-set keys (non-negative integers summing to at most lam)")
        if len({r.tobytes() for r in keys}) != len(keys):
            raise ValueError("keys must be distinct")
        preds = np.asarray(d["preds"], dtype=np.float64).reshape(-1, k)
        return cls(lam=lam, classes=k, keys=keys, group_of=np.asarray(d["group_of"], dtype=np.int64),
                   preds=preds, passthrough=bool(d.get("passthrough", False)))

