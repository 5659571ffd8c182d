"""Synthetic event streams with known (mis)calibration, drift and delayed outcomes.

A miscalibration is written ``none``, ``temperature:T`` (score = softmax(log p / T); T > 1 is
under-, T < 1 over-confident), ``bias:b`` (binary: logit shifted by b; multiclass: log-probability of
class 0 shifted by b) or ``bump:S,RHO[,M]`` (binary only: the outcome follows T-Cal's alternative
g_m(z) of eq. 10 with smoothness S, amplitude RHO and M bumps, default M from eq. 10's worst case).
"""

from __future__ import annotations

import heapq
from collections.abc import Iterator
from dataclasses import dataclass, field

import msgspec
import numpy as np

_encode = msgspec.json.Encoder().encode


def _softmax(x: np.ndarray) -> np.ndarray:
    x = x - x.max(axis=1, keepdims=True)
    e = np.exp(x)
    return e / e.sum(axis=1, keepdims=True)


def _zeta(x: np.ndarray) -> np.ndarray:
    out = np.zeros_like(x)
    inside = (x > 0) & (x < 1)
    xi = x[inside]
    out[inside] = np.exp(-1.0 / (xi * (1.0 - xi)))
    return out


def bump_mean(z: np.ndarray, s: float, rho: float, m: int) -> np.ndarray:
    """T-Cal's alternative (eq. 10): ``z + rho m^-s sum_j (-1)^j zeta(2 m z - m/2 - j)`` (bumps on [1/4, 3/4])."""
    z = np.asarray(z, dtype=np.float64)
    total = np.zeros_like(z)
    for j in range(m):
        total += (-1) ** j * _zeta(2 * m * z - m / 2 - j)
    return np.clip(z + rho * m ** (-s) * total, 0.0, 1.0)


@dataclass(frozen=True)
class Miscalibration:
    kind: str = "none"
    params: tuple[float, ...] = ()

    @classmethod
    def parse(cls, text: str) -> Miscalibration:
        kind, _, rest = text.partition(":")
        try:
            params = tuple(float(p) for p in rest.split(",") if p.strip())
        except ValueError:
            raise ValueError(f"miscalibration {text!r}: parameters must be numbers") from None
        need = {"none": (0, 0), "temperature": (1, 1), "bias": (1, 1), "bump": (2, 3)}
        if kind not in need:
            raise ValueError(f"miscalibration {text!r}: kind must be one of {', '.join(need)}")
        lo, hi = need[kind]
        if not lo <= len(params) <= hi:
            raise ValueError(f"miscalibration {text!r}: {kind} takes {lo}..{hi} parameters")
        if kind == "temperature" and params[0] <= 0:
            raise ValueError(f"miscalibration {text!r}: temperature must be positive")
        return cls(kind, params)


@dataclass
class SimulationSpec:
    """What to simulate (see the module docstring for the miscalibration syntax)."""

    classes: int = 2
    model: str = "sim"
    seed: int = 0
    miscalibration: str = "none"
    drift: str | None = None
    drift_at: int | None = None
    start: float = 1_767_225_600.0
    rate: float = 100.0
    delay: float = 0.0
    segments: list[str] = field(default_factory=list)


class Simulator:
    """Generate the events of a :class:`SimulationSpec` batch by batch, in arrival order.

    With ``delay == 0`` every event is ``labeled``; otherwise each prediction is followed by an
    outcome event after an exponential delay of mean ``delay`` seconds (event time), so outcomes
    arrive out of order.

    Examples
    --------
    >>> sim = Simulator(SimulationSpec(seed=1))
    >>> lines = sim.batch(3)
    >>> len(lines), lines[0].startswith(b'{"type":"labeled"')
    (3, True)
    """

    def __init__(self, spec: SimulationSpec) -> None:
        if spec.classes < 2:
            raise ValueError("classes must be >= 2")
        if spec.rate <= 0:
            raise ValueError("rate must be positive")
        self.spec = spec
        self.before = Miscalibration.parse(spec.miscalibration)
        self.after = Miscalibration.parse(spec.drift) if spec.drift else self.before
        for m in (self.before, self.after):
            if m.kind == "bump" and spec.classes != 2:
                raise ValueError("the bump alternative is binary only")
        self.rng = np.random.default_rng(spec.seed)
        self.index = 0
        self._pending: list[tuple[float, int, bytes]] = []

    def _draw(self, m: int, mis: Miscalibration) -> tuple[np.ndarray, np.ndarray]:
        """Predictions (scores or probs) and labels for ``m`` events under ``mis``."""
        rng = self.rng
        k = self.spec.classes
        if k == 2:
            if mis.kind == "bump":
                s, rho = mis.params[0], mis.params[1]
                mm = int(mis.params[2]) if len(mis.params) > 2 else 16
                z = rng.random(m)
                y = (rng.random(m) < bump_mean(z, s, rho, mm)).astype(np.int64)
                return z, y
            p = rng.beta(2.0, 2.0, m)
            y = (rng.random(m) < p).astype(np.int64)
            logit = np.log(p) - np.log1p(-p)
            if mis.kind == "temperature":
                logit = logit / mis.params[0]
            elif mis.kind == "bias":
                logit = logit + mis.params[0]
            return 1.0 / (1.0 + np.exp(-logit)), y
        logits = rng.normal(0.0, 1.5, (m, k))
        p = _softmax(logits)
        y = (rng.random(m)[:, None] > np.cumsum(p, axis=1)).sum(axis=1)
        y = np.minimum(y, k - 1)
        logq = np.log(p)
        if mis.kind == "temperature":
            logq = logq / mis.params[0]
        elif mis.kind == "bias":
            logq[:, 0] += mis.params[0]
        return _softmax(logq), y

    def batch(self, m: int) -> list[bytes]:
        """The next ``m`` predictions' events (and the outcomes that became due), as JSON lines."""
        spec = self.spec
        idx = self.index + np.arange(m)
        labels = np.zeros(m, dtype=np.int64)
        drifted = np.zeros(m, bool) if spec.drift_at is None else idx >= spec.drift_at
        rows: list[list[float] | float] = [0.0] * m
        for flag, mis in ((False, self.before), (True, self.after)):
            sel = np.flatnonzero(drifted == flag)
            if sel.size:
                pr, lab = self._draw(sel.size, mis)
                labels[sel] = lab
                vals = pr.tolist()
                for row, v in zip(sel.tolist(), vals):
                    rows[row] = v
        ts = spec.start + idx / spec.rate
        seg = (np.array(spec.segments, dtype=object)[self.rng.integers(len(spec.segments), size=m)]
               if spec.segments else None)
        key = "score" if spec.classes == 2 else "probs"
        out: list[bytes] = []
        delays = self.rng.exponential(spec.delay, m) if spec.delay > 0 else None
        for j in range(m):
            ev: dict[str, object] = {"id": f"{spec.model}-{idx[j]}", "model": spec.model,
                                     "ts": round(float(ts[j]), 3), key: rows[j]}
            if seg is not None:
                ev["segment"] = seg[j]
            if delays is None:
                ev = {"type": "labeled", **ev, "label": int(labels[j])}
                out.append(_encode(ev))
                continue
            # emit outcomes that are due before this prediction
            while self._pending and self._pending[0][0] <= ts[j]:
                out.append(heapq.heappop(self._pending)[2])
            out.append(_encode({"type": "prediction", **ev}))
            due = float(ts[j] + delays[j])
            heapq.heappush(self._pending, (due, int(idx[j]), _encode(
                {"type": "outcome", "id": ev["id"], "model": spec.model, "ts": round(due, 3),
                 "label": int(labels[j])})))
        self.index += m
        return out

    def flush(self) -> list[bytes]:
        """Outcomes still pending (call at the end of a finite stream)."""
        out = [heapq.heappop(self._pending)[2] for _ in range(len(self._pending))]
        return out

    def stream(self, n: int, chunk: int = 10000) -> Iterator[bytes]:
        """All events of an ``n``-prediction stream, outcomes included."""
        done = 0
        while done < n:
            m = min(chunk, n - done)
            yield from self.batch(m)
            done += m
        yield from self.flush()
