"""A simulated event source (``sources: [{type: simulate, ...}]``), used by ``calmon demo``.

Wraps :class:`connectors.simulation.Simulator`.  With ``realtime`` the stream is paced by the wall
clock: event time ``start + i / rate`` is released once it is in the past, so a ``history``
of past events is replayed at full speed on start and then events arrive live.  A drift can
be injected ``drift_after`` seconds after the agent started.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Any

from connectors.base import Batch
from connectors.simulation import SimulationSpec, Simulator

SPEC_KEYS = ("classes", "model", "seed", "miscalibration", "drift", "rate", "delay", "segments")


class SimulatedSource:
    """Source of simulated events.

    Parameters
    ----------
    name
        Source name.
    history
        Seconds of event time before the start that are emitted at once.
    drift_after
        Seconds after the start at which ``drift`` begins (``None``: no drift).
    realtime
        Pace events by the wall clock; otherwise emit ``total`` predictions as fast as read.
    total
        Number of predictions of a non-realtime stream (then :attr:`exhausted`).
    clock
        Wall clock.
    spec
        :class:`~connectors.simulation.SimulationSpec` fields (``classes``, ``model``, ``seed``,
        ``miscalibration``, ``drift``, ``rate``, ``delay``, ``segments``).

    Examples
    --------
    >>> src = SimulatedSource(realtime=False, total=5, rate=10.0, seed=1)
    >>> b = src.read(100)
    >>> len(b.records), src.exhausted, b.position["records"]
    (5, True, 5)
    """

    def __init__(self, name: str = "simulated", history: float = 600.0, drift_after: float | None = None,
                 realtime: bool = True, total: int | None = None, start: float | None = None,
                 clock: Callable[[], float] = time.time, **spec: Any) -> None:
        unknown = set(spec) - set(SPEC_KEYS)
        if unknown:
            raise ValueError(f"simulate source: unknown option(s) {sorted(unknown)} (known: {', '.join(SPEC_KEYS)})")
        if not realtime and total is None:
            raise ValueError("simulate source: a non-realtime stream needs 'total'")
        self.name = name
        self.clock = clock
        self.realtime = realtime
        self.total = total
        self.spec_args = dict(spec)
        rate = float(spec.get("rate", 100.0))
        self.t0 = float(clock() if start is None else start)
        self.start = self.t0 - float(history) if realtime else (start if start is not None else 1_767_225_600.0)
        self.drift_at = None
        if spec.get("drift") and drift_after is not None:
            self.drift_at = int((self.t0 + float(drift_after) - self.start) * rate)
        self.drift_time = None if self.drift_at is None else self.start + self.drift_at / rate
        self._new()

    def _new(self) -> None:
        args = {k: v for k, v in self.spec_args.items()}
        self.sim = Simulator(SimulationSpec(start=self.start, drift_at=self.drift_at, **args))
        self.records = 0
        self.predictions = 0
        self._buffer: list[bytes] = []
        self._done = False

    @property
    def exhausted(self) -> bool:
        return self._done and not self._buffer

    def _due(self) -> int:
        if not self.realtime:
            return max(0, (self.total or 0) - self.predictions)
        return max(0, int((self.clock() - self.start) * self.sim.spec.rate) - self.predictions)

    def read(self, max_records: int = 65536, timeout: float = 0.5) -> Batch | None:
        deadline = time.monotonic() + timeout
        while len(self._buffer) < max_records:
            m = min(self._due(), max_records, 20000)
            if m <= 0:
                if not self.realtime and not self._done:
                    self._buffer.extend(self.sim.flush())
                    self._done = True
                if self._buffer or time.monotonic() >= deadline:
                    break
                time.sleep(min(0.05, max(0.0, deadline - time.monotonic())))
                continue
            self._buffer.extend(self.sim.batch(m))
            self.predictions += m
        if not self._buffer:
            return None
        out, self._buffer = self._buffer[:max_records], self._buffer[max_records:]
        self.records += len(out)
        return Batch(out, self.position_after(len(self._buffer)), self.name)

    def position_after(self, buffered: int) -> dict[str, Any]:
        return {"kind": "simulate", "start": self.start, "drift_at": self.drift_at, "records": self.records}

    def position(self) -> dict[str, Any]:
        return self.position_after(len(self._buffer))

    def seek(self, position: Mapping[str, Any]) -> None:
        """Regenerate the stream from its seed and skip the records already delivered."""
        self.start = float(position["start"])
        self.drift_at = position.get("drift_at")
        self._new()
        skip = int(position["records"])
        while len(self._buffer) < skip:
            m = max(1, min(10000, skip - len(self._buffer)))
            self._buffer.extend(self.sim.batch(m))
            self.predictions += m
        self._buffer = self._buffer[skip:]
        self.records = skip

    def close(self) -> None:
        self._buffer = []
