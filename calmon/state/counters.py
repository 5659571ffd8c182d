"""The agent's monotonic counters, kept in its checkpointed state so a restart continues them.

Examples
--------
>>> c = Counters()
>>> c.add_events("m", "labeled", 3); c.add_rejected(["bad_json", "bad_json"]); c.add_records("f", 5)
>>> Counters.from_dict(c.to_dict()) == c
True
>>> c.to_dict()["events"]
[['m', 'labeled', 3]]
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

__all__ = ["Counters", "SourceInfo"]


@dataclass
class Counters:
    """Events accepted per (model, type), rejects per reason, late events per model, records per source."""

    events: dict[tuple[str, str], int] = field(default_factory=dict)
    rejected: dict[str, int] = field(default_factory=dict)
    late: dict[str, int] = field(default_factory=dict)
    records: dict[str, int] = field(default_factory=dict)
    batches: int = 0

    def add_events(self, model: str, kind: str, n: int) -> None:
        key = (model, kind)
        self.events[key] = self.events.get(key, 0) + n

    def add_rejected(self, reasons: Iterable[str]) -> None:
        for r in reasons:
            self.rejected[r] = self.rejected.get(r, 0) + 1

    def add_late(self, model: str, n: int) -> None:
        self.late[model] = self.late.get(model, 0) + n

    def add_records(self, source: str, n: int) -> None:
        self.records[source] = self.records.get(source, 0) + n

    def copy(self) -> Counters:
        return Counters(dict(self.events), dict(self.rejected), dict(self.late), dict(self.records), self.batches)

    def to_dict(self) -> dict[str, Any]:
        """Checkpoint form (JSON has no tuple keys: events become ``[model, type, n]`` rows)."""
        return {"events": [[m, k, n] for (m, k), n in self.events.items()], "rejected": dict(self.rejected),
                "late": dict(self.late), "records": dict(self.records), "batches": self.batches}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Counters:
        return cls(events={(str(m), str(k)): int(n) for m, k, n in d["events"]},
                   rejected={str(k): int(v) for k, v in d["rejected"].items()},
                   late={str(k): int(v) for k, v in d["late"].items()},
                   records={str(k): int(v) for k, v in d["records"].items()}, batches=int(d["batches"]))


@dataclass
class SourceInfo:
    """What the agent last learned about one source (not checkpointed: re-learned from the next batch)."""

    newest_event: float = -math.inf
    lag_bytes: int | None = None
    lag_records: int | None = None

    def lag_seconds(self, now: float) -> float | None:
        return None if self.newest_event == -math.inf else max(0.0, now - self.newest_event)
