"""The typed views between the agent and the exporter: built by calmon.agent.views, read by attribute."""

from __future__ import annotations

import dataclasses
import json

import pytest

from calmon.agent.views import Published, round_state
from calmon.exporter.metrics import AgentMetrics
from calmon.exporter.rounds import RoundPart
from calmon.exporter.views import LiveView, RoundView


def _calibrator(model: str, version: int | None) -> dict:
    return {"model": model, "method": "platt", "version": version, "before": {"ece": 0.2}, "after": {"ece": 0.1},
            "reason": "improved" if version else "insufficient data", "published_at": None}


@pytest.mark.parametrize("view", [LiveView(), RoundView()])
def test_views_are_frozen_and_their_documents_have_one_key_per_field(view):
    assert list(view.to_doc()) == [f.name for f in dataclasses.fields(view)]
    with pytest.raises(dataclasses.FrozenInstanceError):
        view.ready = True  # type: ignore[misc]


def test_round_view_of_a_published_round_exports_published_calibrators_only():
    pub = Published(calibrators={"a": _calibrator("a", 2), "b": _calibrator("b", None)},
                    scheduler={"evaluations": 5, "overruns": 0, "last_timestamp": 1.7e9}, nbytes={"a": 10})
    view = round_state(pub)
    assert [c["model"] for c in view.calibrators] == ["a"]
    assert view.scheduler["evaluations"] == 5 and view.state_bytes == {"a": 10}
    m = AgentMetrics(LiveView)
    m.prepare(view)
    text = m.render().decode()
    assert 'calmon_calibrator_version{method="platt",model="a"} 2.0' in text and 'model="b"' not in text
    assert "calmon_evaluations_total 5.0" in text and 'calmon_state_bytes{model="a"} 10.0' in text


def test_before_the_first_round_the_round_part_is_empty():
    live = LiveView(ready=True, events={("m", "labeled"): 3}, join={"joined": {"m": 2}, "expired": {},
                                                                     "duplicates": {}, "orphans": 1})
    fresh = AgentMetrics(lambda: live, clock=lambda: 100.0)
    text = fresh.render().decode()
    assert RoundPart.build(RoundView(), fresh.budget).render(None, now=100.0).decode() in text
    assert 'calmon_events_total{model="m",type="labeled"} 3.0' in text and "calmon_join_orphan_outcomes_total 1.0" \
        in text and "calmon_evaluations_total 0.0" in text and "calmon_ready 1.0" in text


def test_agent_hands_typed_views_to_the_exporter(tmp_path):
    from calmon.agent.runtime import Agent
    from calmon.config import build_config
    src = tmp_path / "ev.jsonl"
    src.write_text("".join(json.dumps({"model": "m", "ts": 1767225600 + i, "score": 0.5, "label": i % 2}) + "\n"
                           for i in range(50)) + "not json\n")
    agent = Agent(build_config({"state_dir": str(tmp_path / "state"), "sources": [{"path": str(src)}],
                                "exporter": {"enabled": False}, "evaluation": {"tests": []},
                                "ingest": {"exit_when_done": True}}, env={}))
    agent.run()
    live = agent.live_state()
    assert isinstance(live, LiveView) and live.events[("m", "labeled")] == 50 and live.rejected == {"not_json": 1}
    assert live.sources[next(iter(live.sources))]["records"] == 51
    st = agent.metrics_state()  # both views and the work-item scheduler as one plain dict
    assert set(st) == {f.name for f in dataclasses.fields(LiveView)} | {f.name for f in dataclasses.fields(RoundView)
                                                                      } | {"work"}
    assert st["scheduler"]["evaluations"] >= 1 and st["events"] == {("m", "labeled"): 50}
    doc = agent.status()
    assert doc["agent"]["rejected"] == {"not_json": 1} and doc["agent"]["events"] == [
        {"model": "m", "type": "labeled", "count": 50}]
    assert doc["agent"]["state_bytes"]["m"] > 0 and len(doc["evaluations"]) == len(st["evaluations"])
