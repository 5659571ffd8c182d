"""Event time without a clock's surprises (#31.1): a record without a time never moves the watermark by itself.

Replaying old traffic (simulated 2026-01-01, replayed later) with one record without ``ts`` used to move the
watermark to the present and expire every pending prediction (4,000 predictions: 1,301 joined).  Each case below
must give the clean file's joins and windows exactly.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from calmon.agent.runtime import Agent
from calmon.config import build_config
from calmon.formats.records import Batch
from calmon.state.agentstate import AgentState
from calmon.state.ingest import Ingestor
from connectors.simulation import SimulationSpec, Simulator

T0 = 1_767_225_600.0  #: 2026-01-01: "last month's traffic" for a replay
N = 2500  # predictions; outcomes ~20 s late (exponential), join TTL and lateness 30 days


def _replay() -> list[bytes]:
    return list(Simulator(SimulationSpec(model="m", seed=4, delay=20.0, rate=4.0)).stream(N))


def _without_ts(lines: list[bytes], kind: str) -> list[bytes]:
    """The replay with one record of ``kind`` a third of the way in stripped of its ``ts``."""
    out = list(lines)
    if kind == "unknown-model outcome":
        out.insert(len(out) // 3, b'{"type": "outcome", "id": "nobody", "model": "ghost", "label": 1}')
        return out
    want = {"outcome": b'"outcome"', "prediction": b'"prediction"'}[kind]
    i = next(i for i in range(len(out) // 3, len(out)) if want in out[i])
    doc = json.loads(out[i])
    del doc["ts"]
    out[i] = json.dumps(doc).encode()
    return out


def _run(tmp: Path, lines: list[bytes], **extra: object) -> Agent:
    tmp.mkdir(parents=True, exist_ok=True)
    src = tmp / "in.jsonl"
    src.write_bytes(b"\n".join(lines) + b"\n")
    doc = {"state_dir": str(tmp / "state"), "sources": [{"path": str(src)}], "exporter": {"enabled": False},
           "evaluation": {"tests": [], "min_events": 10}, "ingest": {"exit_when_done": True},
           "join": {"ttl": "30d"}, "windows": {"names": ["1h", "24h", "all"]}, **extra}
    agent = Agent(build_config(doc, env={}))
    agent.open()
    agent.run()
    return agent


def _windows(agent: Agent) -> dict[tuple[str, str], tuple[int, float]]:
    return {(e["segment"], e["window"]): (e["n"], e["metrics"]["ece"]) for e in agent.status()["evaluations"]
            if e["model"] == "m"}


@pytest.fixture(scope="module")
def clean(tmp_path_factory: pytest.TempPathFactory) -> Agent:
    return _run(tmp_path_factory.mktemp("clean"), _replay())


@pytest.mark.parametrize("kind", ["outcome", "unknown-model outcome", "prediction"])
def test_a_replay_with_one_record_without_ts_equals_the_clean_replay(tmp_path, clean, kind):
    agent = _run(tmp_path, _without_ts(_replay(), kind))
    j, c = agent.state.joiner.counters, clean.state.joiner.counters
    assert c.joined == {"m": N} and not c.expired
    assert j.joined == {"m": N}, "every outcome joins (it was 1,301 of 4,000 before #31.1)"
    assert not j.expired and j.orphans == 0
    assert agent.state.watermark == clean.state.watermark  # the replay's own time, never the present
    got, want = _windows(agent), _windows(clean)
    assert got.keys() == want.keys() and ("all", "all") in got
    for key, (n, ece) in want.items():
        assert got[key][0] == n, key
        assert math.isclose(got[key][1], ece, rel_tol=1e-12, abs_tol=1e-15), key


def test_calmon_run_exit_when_done_replays_history_exactly(tmp_path):
    """The user's way: `calmon run --exit-when-done --results` on a file with ts-less outcomes."""
    lines = _replay()
    for kind in ("outcome", "unknown-model outcome"):
        lines = _without_ts(lines, kind)
    join = _calmon_run(tmp_path, lines)["agent"]["join"]
    assert join["joined"] == {"m": N} and join["expired"] == {}


def _state(**join: object) -> AgentState:
    return AgentState(build_config({"sources": [{"path": "x.jsonl"}], "join": {"ttl": "1h", **join},
                                    "limits": {"future_skew": "3650d"}}, env={}))


def _batch(source: str, *docs: dict) -> Batch:
    return Batch([json.dumps(d).encode() for d in docs], position=None, source=source)


def test_a_prediction_without_ts_takes_its_source_time_even_after_a_restart():
    """The source's event time is checkpointed: the first record after a restore does not take the present."""
    now = T0 + 300 * 86400.0
    st = _state()
    Ingestor(st, None, lambda: now).ingest(_batch("a", {"id": "p1", "model": "m", "ts": T0, "score": 0.3}))
    restored = _state()
    restored.load_doc(json.loads(json.dumps({**st.to_doc(), "format": "calmon.checkpoint", "version": 2,
                                             "created": 0.0, "sources": {}})))
    assert restored.joiner.source_times == {"a": T0}
    ing = Ingestor(restored, None, lambda: now)
    ing.ingest(_batch("a", {"id": "p2", "model": "m", "score": 0.6},
                      {"id": "p1", "model": "m", "label": 1}, {"id": "p2", "model": "m", "label": 0}))
    assert restored.watermark == T0
    assert restored.joiner.counters.joined == {"m": 2} and not restored.joiner.counters.expired


def test_a_source_that_never_carries_times_runs_on_the_arrival_clock():
    """Live traffic without ``ts`` keeps the wall clock: the TTL still expires what never gets an outcome."""
    clock = [T0]
    st = _state()
    ing = Ingestor(st, None, lambda: clock[0])
    ing.ingest(_batch("live", {"id": "p1", "model": "m", "score": 0.3}))
    assert st.watermark == T0
    clock[0] += 7200.0
    ing.ingest(_batch("live", {"id": "p2", "model": "m", "score": 0.3}))
    st.joiner.sweep()
    assert st.watermark == T0 + 7200 and st.joiner.counters.expired == {"m": 1}


def test_an_early_outcome_without_ts_waits_from_the_event_time_and_joins():
    """An outcome before its prediction, without a time: it waits from the watermark (no delay measured)."""
    st = _state()
    ing = Ingestor(st, None, lambda: T0 + 300 * 86400.0)
    ing.ingest(_batch("a", {"id": "x", "model": "m", "ts": T0 + 100, "score": 0.5},
                      {"id": "p", "model": "m", "label": 1}))
    assert st.watermark == T0 + 100 and st.joiner.early["p"][1] == T0 + 100
    ing.ingest(_batch("b", {"id": "p", "model": "m", "ts": T0 + 90, "score": 0.8}))
    assert st.joiner.counters.joined == {"m": 1} and st.joiner.delays.sketch("m").count == 0
    assert st.watermark == T0 + 100


# -- the "Done when": last month's traffic replayed the user's way -----------------------------------------
MONTH_N = 20_000  #: predictions over 30 days, outcomes ~20 s late (exponential): the issue's simulated stream
MONTH_T0 = 1_790_812_800.0  #: 2026-10-01
GHOSTS = [b'{"type": "outcome", "id": "ghost-1", "model": "ghost", "label": 1}',
          b'{"type": "prediction", "id": "ghost-2", "model": "ghost", "score": 0.4}',
          b'{"type": "labeled", "model": "ghost", "score": 0.7, "label": 1}']


def _month() -> list[bytes]:
    spec = SimulationSpec(model="m", seed=7, delay=20.0, rate=MONTH_N / (30 * 86400.0), start=MONTH_T0)
    return list(Simulator(spec).stream(MONTH_N))


def _strip_ts(lines: list[bytes]) -> list[bytes]:
    """The month with three outcomes and three predictions of ``m`` stripped of their ``ts`` (at a quarter, half and
    three quarters of the file) and, next to each, ts-less records of a model no record before named."""
    out = list(lines)
    for frac, ghost in zip((0.75, 0.5, 0.25), GHOSTS):  # from the back, so earlier indices stay put
        start = int(len(out) * frac)
        for kind in (b'"outcome"', b'"prediction"'):
            i = next(i for i in range(start, len(out)) if kind in out[i])
            doc = json.loads(out[i])
            del doc["ts"]
            out[i] = json.dumps(doc).encode()
        out.insert(start, ghost)
    return out


def _calmon_run(tmp: Path, lines: list[bytes]) -> dict:
    tmp.mkdir(parents=True, exist_ok=True)
    src = tmp / "events.jsonl"
    src.write_bytes(b"\n".join(lines) + b"\n")
    cfg = tmp / "calmon.yaml"
    cfg.write_text(f"state_dir: {tmp / 'state'}\nsources: [{{name: f, path: {src}}}]\nexporter: {{enabled: false}}\n"
                   "evaluation: {tests: [], min_events: 10}\njoin: {ttl: 30d}\nwindows: {allowed_lateness: 30d}\n")
    results = tmp / "results.json"
    out = subprocess.run([sys.executable, "-m", "calmon", "run", "-c", str(cfg), "--exit-when-done",
                          "--results", str(results)], capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(results.read_text())


def test_last_months_traffic_with_ts_less_records_replays_to_the_clean_files_ece(tmp_path):
    """#31 "Done when": `calmon run --exit-when-done` on a month of traffic (20,000 predictions, outcomes ~20 s
    late, join TTL and lateness 30 d) with ts-less outcomes, predictions and unknown-model records joins every
    outcome and gives the clean file's windows -- the `all` window's n and ECE above all.  Before #31.1 the first
    ts-less record moved the watermark to the present and every pending prediction expired."""
    lines = _month()
    dirty = _strip_ts(lines)
    assert sum(b'"ts"' not in line for line in dirty) == 9
    clean, got = _calmon_run(tmp_path / "clean", lines), _calmon_run(tmp_path / "dirty", dirty)
    assert clean["agent"]["join"]["joined"] == {"m": MONTH_N} and clean["agent"]["join"]["expired"] == {}
    join = got["agent"]["join"]
    assert join["joined"].get("m") == MONTH_N, join
    assert join["expired"] == {} and join["orphans"] == 0, join

    def windows(doc: dict) -> dict[tuple[str, str], tuple[int, float]]:
        return {(e["segment"], e["window"]): (e["n"], e["metrics"]["ece"]) for e in doc["evaluations"]
                if e["model"] == "m"}

    want, have = windows(clean), windows(got)
    assert want[("all", "all")][0] == MONTH_N
    assert have.keys() == want.keys()
    for key, (n, ece) in want.items():
        assert have[key][0] == n, key
        assert math.isclose(have[key][1], ece, rel_tol=1e-12, abs_tol=1e-15), key
