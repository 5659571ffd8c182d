"""The agent knows its label delay (#32.4): labels 0.1-20 h late against ``join.ttl: 1h`` lost 98 % of them with
nothing said.  Now the delay is a histogram metric, the lost labels are counted, and one warning names
``join.ttl`` and the value that would have kept them -- in the log and in ``/api/status``."""

from __future__ import annotations

import html
import json
import logging
import math
import re
import zlib
from pathlib import Path

import numpy as np
import pytest
from prometheus_client.parser import text_string_to_metric_families

from calmon.agent.runtime import Agent
from calmon.config import build_config, parse_duration
from calmon.state.join import Joiner

T0 = 1_767_225_600.0
N = 1500


def _delays() -> np.ndarray:
    return np.random.default_rng(1).uniform(0.1 * 3600, 20 * 3600, N)


def _events(path: Path) -> None:
    """``N`` predictions 72 s apart and their outcomes 0.1-20 h later, in event-time order (one file)."""
    rng = np.random.default_rng(2)
    ts, d, p = T0 + np.arange(N) * 72.0, _delays(), rng.uniform(0, 1, N)
    y = (rng.uniform(0, 1, N) < p).astype(int)
    ev = [(ts[i], json.dumps({"type": "prediction", "id": f"p{i}", "model": "churn", "ts": ts[i], "score": p[i]}))
          for i in range(N)]
    ev += [(ts[i] + d[i], json.dumps({"type": "outcome", "id": f"p{i}", "model": "churn", "ts": ts[i] + d[i],
                                      "label": int(y[i])})) for i in range(N)]
    path.write_text("\n".join(line for _, line in sorted(ev)) + "\n")


def _agent(tmp_path: Path, ttl: str) -> Agent:
    _events(tmp_path / "in.jsonl")
    return _run(tmp_path, ttl)


def _warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING and "join.ttl" in r.getMessage()]


def test_a_short_ttl_is_named_with_the_value_that_keeps_the_labels(tmp_path, caplog):
    from calmon.state.delays import PROMETHEUS_BUCKETS  # here: the file collects before #32
    caplog.set_level(logging.WARNING, logger="calmon")
    agent = _agent(tmp_path, "1h")
    st = agent.status()
    expired = agent.state.joiner.counters.expired["churn"]
    assert expired > 0.9 * N  # the trap itself: most labels lost
    [w] = st["warnings"]
    assert set(w) == {"code", "message", "count", "setting", "suggested"}  # the status page renders this shape
    assert w["code"] == "join_expired" and w["setting"] == "join.ttl"
    true_p99 = float(np.percentile(_delays(), 99))
    assert true_p99 <= parse_duration(w["suggested"]) <= 1.25 * true_p99  # enough, and not absurdly more
    lost = N - agent.state.joiner.counters.joined["churn"]
    assert w["count"] == st["agent"]["join"]["late_outcomes"]["churn"] == lost
    assert f"{expired} predictions expired unjoined" in w["message"] and f"join.ttl >= {w['suggested']}" in w["message"]
    # the quantiles under the join section: every delay observed (joined or after expiry)
    q = st["agent"]["join"]["delays"]["churn"]
    assert q["count"] == N and q["p99"] >= true_p99 and q["p50"] <= q["p90"] <= q["p99"] <= q["max"]
    logged = _warnings(caplog)
    assert logged == [w["message"]]  # ONE line, with the replay's final numbers
    # the histogram: model label only, cumulative, every delay counted
    fams = {f.name: f for f in text_string_to_metric_families(agent.metrics.render().decode())}
    samples = fams["calmon_label_delay_seconds"].samples
    assert {frozenset(s.labels) - {"le"} for s in samples} == {frozenset({"model"})}
    buckets = [s for s in samples if s.name.endswith("_bucket")]
    assert len(buckets) == len(PROMETHEUS_BUCKETS) + 1
    assert [s.value for s in buckets] == sorted(s.value for s in buckets) and buckets[-1].value == N
    le_1h = next(s.value for s in buckets if s.labels["le"] == "3600.0")
    assert le_1h == int((_delays() <= 3600).sum())
    late = fams["calmon_join_late_outcomes"].samples
    assert [(s.labels, s.value) for s in late if s.name.endswith("_total")] == [({"model": "churn"}, w["count"])]


def test_a_ttl_longer_than_the_delays_says_nothing(tmp_path, caplog):
    caplog.set_level(logging.WARNING, logger="calmon")
    agent = _agent(tmp_path, "24h")
    st = agent.status()
    assert st["warnings"] == [] and _warnings(caplog) == []
    assert agent.state.joiner.counters.joined == {"churn": N}
    assert st["agent"]["join"]["delays"]["churn"]["count"] == N


def test_join_ttl_alone_is_enough_lateness_follows():
    cfg = build_config({"sources": [{"path": "x.jsonl"}], "join": {"ttl": "30d"}}, env={})  # beyond the default 7d
    assert cfg.join.ttl == 30 * 86400 and cfg.windows.allowed_lateness >= cfg.join.ttl


def test_the_sketch_is_bounded_and_its_quantiles_never_fall_below_the_truth():
    from calmon.state.delays import EDGES, DelaySketch  # here: the file collects before #32
    rng = np.random.default_rng(3)
    s = DelaySketch()
    size = s.counts.nbytes
    for _ in range(20):
        x = rng.lognormal(8, 2, 50_000)
        s.observe(x)
    assert s.counts.nbytes == size and s.count == 1_000_000
    x = rng.lognormal(8, 2, 200_000)
    t = DelaySketch()
    t.observe(x)
    for q in (0.5, 0.9, 0.99):
        got, true = t.quantile(q), float(np.quantile(x, q))
        assert true <= got <= true * 2 ** (1 / 8) * 1.0001  # one bin of 2**(1/8) at most
    assert DelaySketch.from_dict(json.loads(json.dumps(t.to_dict()))) == t
    assert EDGES.size < 256


def test_the_expired_sample_is_bounded_and_estimates_the_late_outcomes():
    from calmon.state.delays import SAMPLE_CAP, LabelDelays  # here: the file collects before #32
    d = LabelDelays()
    n = 5 * SAMPLE_CAP
    for i in range(n):
        d.expire(f"id-{i}", "m", float(i))
        if i % 1000 == 999:
            d.prune(float(i), ttl=1e9)  # nothing old enough to forget: the sample thins instead
    assert len(d.expired) <= SAMPLE_CAP and d.level >= 2
    for i in range(n):  # every expired prediction's outcome comes, 3600 s after it
        if d.outcome_after_expiry(f"id-{i}", float(i) + 3600.0):
            pass
    assert abs(d.late["m"] - n) < 0.1 * n  # estimated from the sample
    assert d.sketch("m").quantile(0.99) == pytest.approx(3600.0)
    # the sample is the same in every process (CRC-32, not the salted hash)
    assert all(zlib.crc32(k.encode()) & ((1 << d.level) - 1) == 0 for k in d.expired)


def test_delays_survive_a_checkpoint_and_old_join_documents_still_load():
    j = Joiner(ttl=60)
    from calmon.events.decoder import Decoder
    dec = Decoder()
    j.process(dec.decode([b'{"id": "a", "model": "m", "ts": 1767225600, "score": 0.9}',
                          b'{"id": "a", "model": "m", "ts": 1767225630, "label": 1}',
                          b'{"id": "b", "model": "m", "ts": 1767225631, "score": 0.9}',
                          b'{"id": "z", "model": "m", "ts": 1767225900, "score": 0.9}',
                          b'{"id": "b", "model": "m", "ts": 1767226000, "label": 1}']).models)
    assert j.counters.joined == {"m": 1} and j.delays.late == {"m": 1}
    doc = json.loads(json.dumps(j.to_dict()))
    back = Joiner.from_dict(doc)
    assert back.delays.to_dict() == j.delays.to_dict() and back.delays.sketch("m").quantile(1.0) >= 369
    old = {k: v for k, v in doc.items() if k not in ("sources", "untimed", "delays")}  # before #31.1/#32.4
    restored = Joiner.from_dict(old)
    assert restored.source_times == {} and restored.delays.sketches() == {} and not math.isnan(restored.watermark)


def test_suggested_values_parse_as_durations():
    from calmon.state.delays import suggest_ttl
    for seconds in (1, 59, 90, 3599, 3601, 73080, 86400 * 3 + 1, 86400 * 400):
        s = suggest_ttl(float(seconds))
        assert re.fullmatch(r"\d+[smhd]", s) and parse_duration(s) >= seconds


def test_the_table_reads_every_model_as_its_own_sketch_does():
    """The status and /metrics read all models at once (one matrix); it gives each model's own numbers."""
    from calmon.state.delays import DelaySketch, LabelDelays  # here: the file collects before #32
    rng = np.random.default_rng(5)
    d = LabelDelays()
    per = {f"m{i}": rng.lognormal(6, 2, int(rng.integers(1, 60))) for i in range(40)}
    d.observe_batch(per)
    table = d.table()
    summaries, hists = table.summaries(), table.histograms()
    for m, x in per.items():
        own = DelaySketch()
        own.observe(x)
        assert summaries[m] == own.summary()
        assert [n for _, n in hists[m]["buckets"]] == own.cumulative() and hists[m]["count"] == x.size
        assert hists[m]["sum"] == pytest.approx(x.sum())
    assert table.merged().count == sum(x.size for x in per.values())


def _two_speed(path: Path, hours: float) -> int:
    """Predictions 3.6 s apart for 3 h; half their labels come 0.1-1 h later (automatic), half 20-24 h later
    (a human review), and the file stops ``hours`` after the first prediction: what a live agent has seen."""
    rng = np.random.default_rng(4)
    n = 3000
    ts = T0 + np.arange(n) * 3.6
    fast = rng.uniform(size=n) < 0.5
    d = np.where(fast, rng.uniform(0.1, 1.0, n), rng.uniform(20.0, 24.0, n)) * 3600
    ev = [(ts[i], {"type": "prediction", "id": f"p{i}", "model": "churn", "ts": ts[i], "score": 0.5})
          for i in range(n)]
    ev += [(ts[i] + d[i], {"type": "outcome", "id": f"p{i}", "model": "churn", "ts": ts[i] + d[i], "label": i % 2})
           for i in range(n) if ts[i] + d[i] <= T0 + hours * 3600]
    ev += [(T0 + hours * 3600, {"type": "prediction", "id": "last", "model": "churn", "ts": T0 + hours * 3600,
                                "score": 0.5})]  # the stream goes on: the watermark reaches the file's end
    path.write_text("".join(json.dumps(e) + "\n" for _, e in sorted(ev, key=lambda x: x[0])))
    return int(fast.sum())


def _run(tmp_path: Path, ttl: str) -> Agent:
    doc = {"state_dir": str(tmp_path / "state"), "sources": [{"path": str(tmp_path / "in.jsonl")}],
           "exporter": {"enabled": False}, "evaluation": {"tests": [], "min_events": 10},
           "ingest": {"exit_when_done": True}, "join": {"ttl": ttl}}
    agent = Agent(build_config(doc, env={}))
    agent.open()
    agent.run()
    return agent


@pytest.mark.parametrize("hours", [6.0, 30.0])
def test_predictions_expiring_while_the_delays_run_up_to_the_ttl_are_named(tmp_path, caplog, hours):
    """Before any outcome comes late (6 h into the stream) the expired predictions are the only sign: the agent
    warns when the joined delays run up to the TTL, asking for at least twice it; once the late labels come
    (30 h), the warning gives the measured value instead."""
    caplog.set_level(logging.WARNING, logger="calmon")
    fast = _two_speed(tmp_path / "in.jsonl", hours)
    agent = _run(tmp_path, "1h")
    st = agent.status()
    expired = agent.state.joiner.counters.expired["churn"]
    assert agent.state.joiner.counters.joined["churn"] == fast and expired == 3000 - fast
    [w] = st["warnings"]
    assert w["setting"] == "join.ttl" and f"{expired} predictions expired unjoined" in w["message"]
    assert _warnings(caplog) == [w["message"]]
    from calmon.exporter.status.page import render  # the status page's banner shows it
    page = render(st)
    assert f'data-code="{w["code"]}"' in page and html.escape(w["message"]) in page
    if hours == 6.0:  # no outcome has come late yet
        assert w["code"] == "join_ttl_reached" and w["count"] == expired and w["suggested"] == "2h", w
        assert "join.ttl >= 2h" in w["message"] and "twice" in w["message"]
    else:  # the reviews came: the measured p99 (about 24 h)
        assert w["code"] == "join_expired" and w["count"] == expired, w
        assert 24 * 3600 <= parse_duration(w["suggested"]) <= 1.25 * 24 * 3600


def test_expiring_predictions_whose_delays_stop_well_before_the_ttl_say_nothing(tmp_path, caplog):
    """Predictions that never get a label expire too: no warning while the delays stop far below the TTL."""
    caplog.set_level(logging.WARNING, logger="calmon")
    rng = np.random.default_rng(5)
    n = 3000
    ts = T0 + np.arange(n) * 3.6
    ev = [(ts[i], {"type": "prediction", "id": f"p{i}", "model": "churn", "ts": ts[i], "score": 0.5})
          for i in range(n)]
    d = rng.uniform(0.05, 0.4, n) * 3600
    ev += [(ts[i] + d[i], {"type": "outcome", "id": f"p{i}", "model": "churn", "ts": ts[i] + d[i],
                           "label": (i // 3) % 2}) for i in range(0, n, 3)]  # 2 in 3 unlabelled
    (tmp_path / "in.jsonl").write_text("".join(json.dumps(e) + "\n" for _, e in sorted(ev, key=lambda x: x[0])))
    agent = _run(tmp_path, "1h")
    assert agent.state.joiner.counters.expired["churn"] > 1000
    assert agent.status()["warnings"] == [] and _warnings(caplog) == []
