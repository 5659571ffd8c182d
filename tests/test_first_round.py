"""Issue #35.2 b: the first evaluation round comes once the backlog is read, not one period after the start.

An agent with a period of ten minutes reads a backlog of several full batches, then live records that keep
coming (the source is never exhausted, as a live topic).  Before the change its first round came ten minutes
after the start; now it comes as soon as a poll reads less than a full batch -- and never while full batches are
still being read, so that round sees the whole backlog.
"""

from __future__ import annotations

import json
import threading
import time
from typing import Any

from connectors.base import Batch

BATCH = 500
BACKLOG = 6 * BATCH


class LiveSource:
    """A backlog of ``BACKLOG`` labeled records in full batches, then one record per read, for ever."""

    name = "live"

    def __init__(self) -> None:
        self.records = 0
        self.rounds_while_behind: list[int] = []  # rounds completed when a full batch was handed out
        self.agent: Any = None
        self.closed = threading.Event()

    @property
    def exhausted(self) -> bool:
        return False

    def _record(self, i: int) -> bytes:
        score = (i % 97 + 1) / 99.0
        return json.dumps({"type": "labeled", "model": "m", "ts": 1_700_000_000.0 + i, "score": score,
                           "label": int((i * 7919) % 100 < 100 * score)}).encode()

    def read(self, max_records: int = 65536, timeout: float = 0.5) -> Batch | None:
        if self.closed.is_set():
            return None
        if self.records < BACKLOG:
            n = min(max_records, BACKLOG - self.records)
            if self.agent is not None and self.agent.scheduler is not None:
                self.rounds_while_behind.append(self.agent.scheduler.rounds)
        else:
            time.sleep(min(timeout, 0.05))
            n = 1
        out = [self._record(self.records + i) for i in range(n)]
        self.records += n
        return Batch(out, self.position(), self.name)

    def position(self) -> dict[str, Any]:
        return {"records": self.records}

    def seek(self, position: dict[str, Any]) -> None:
        self.records = int(position["records"])

    def close(self) -> None:
        self.closed.set()


def test_the_first_round_comes_once_the_backlog_is_read(tmp_path) -> None:
    from calmon.agent.runtime import Agent
    from calmon.config import build_config

    cfg = build_config({"state_dir": str(tmp_path / "state"), "sources": [{"path": "unused.jsonl"}],
                        "exporter": {"enabled": False}, "checkpoint": {"enabled": False},
                        "ingest": {"batch_size": BATCH}, "limits": {"future_skew": "3650d"},
                        "evaluation": {"every": 600, "budget": 60, "tests": ["tcal"], "pool": "inline"}},
                       env={})
    src = LiveSource()
    agent = Agent(cfg, sources=[src])
    src.agent = agent
    agent.open()
    runner = threading.Thread(target=agent.run, name="test-agent", daemon=True)
    runner.start()
    try:
        assert agent.scheduler is not None
        # generous: the round itself is quick, the machine may be loaded; on the old code it came after 600 s
        assert agent.scheduler.wait_round(0, timeout=120), "no round within 120 s of a 600 s period"
        assert src.rounds_while_behind == [0] * (BACKLOG // BATCH)  # none while full batches were being read
        evs = [e for e in agent.status()["evaluations"] if e["window"] == "all" and e["segment"] == "all"]
        assert evs and evs[0]["n"] >= BACKLOG  # the first round saw the whole backlog
        assert agent.scheduler.rounds == 1  # only the first round moved: the next one keeps the period
    finally:
        agent.stop()
        runner.join(60)
