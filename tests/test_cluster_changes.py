"""Change detectors in cluster mode (#33.4): the deltas carry each range's labeled pairs in record order and the
evaluator owning the model feeds its detectors with them -- a drift injected into the stream is detected by the
cluster as by the single process, a stream without drift alarms neither, and every pair is fed exactly once."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from test_cluster import config, evaluator, partitioned_deltas  # noqa: E402

from calmon.cluster.deltas import Delta  # noqa: E402
from calmon.cluster.snapshots import ModelSnapshot  # noqa: E402
from calmon.state.agentstate import AgentState  # noqa: E402
from calmon.state.ingest import Ingestor  # noqa: E402
from connectors.base import Batch  # noqa: E402
from connectors.simulation import SimulationSpec, Simulator  # noqa: E402

PARTITIONS = 3
EVENTS = 24_000
DRIFT_AT = 12_000


def drifting(drift: str | None, seed: int = 5) -> list[tuple[int, bytes | None, bytes]]:
    """Labeled events of one model, calibrated until ``DRIFT_AT`` then ``drift`` (or calibrated throughout),
    spread round robin over the partitions (no key), as the cluster tests' traffic."""
    spec = SimulationSpec(model="m", seed=seed, delay=0.0, rate=50.0, drift=drift, drift_at=DRIFT_AT if drift else None)
    sim = Simulator(spec)
    lines = sim.batch(EVENTS) + sim.flush()
    return [(i % PARTITIONS, None, line) for i, line in enumerate(lines)]


def single_view(cfg, records):
    st = AgentState(cfg)
    ing = Ingestor(st, None, lambda: 1767225600.0)
    values = [v for _, _, v in records]
    for i in range(0, len(values), 500):
        ing.ingest(Batch(values[i:i + 500], {}, "events"))
    return st.changes.view()


def cluster_view(tmp_path, records, size=1000):
    """The evaluator's detectors after merging every partition's deltas in the order a consumer reads them
    (partitions interleaved range by range), then every delta once more (a replay: dropped, not fed again)."""
    cfg = config()
    deltas = partitioned_deltas(cfg, records, partitions=PARTITIONS, size=size)
    assert all(d.pairs is not None and len(d.pairs) for d in deltas)
    by_part: dict[str, list[Delta]] = {}
    for d in deltas:
        by_part.setdefault(d.source, []).append(d)
    order = [d for rnd in range(max(map(len, by_part.values())))
             for part in sorted(by_part) for d in by_part[part][rnd:rnd + 1]]
    ev = evaluator(tmp_path)
    values = [d.to_bytes() for d in order]
    ev.ingest(Batch(values, {}, "deltas", [f"calmon-deltas/0@{i}" for i in range(len(values))]))
    first = ev.state.changes.view()
    ev.ingest(Batch(values, {}, "deltas", [f"calmon-deltas/0@{len(values) + i}" for i in range(len(values))]))
    assert ev.state.changes.view() == first and ev.dropped_repeats == len(values)
    det = ev.state.changes.detectors["m"]
    ev.deltas.close()
    return first, det


def detections(view) -> dict[str, int]:
    return {s: v["detections"] for s, v in view["m"]["signals"].items()}


def test_a_drift_is_detected_by_the_cluster_as_by_the_single_process(tmp_path):
    cfg = config()
    records = drifting("temperature:0.5")
    single = single_view(cfg, records)
    cluster, det = cluster_view(tmp_path, records)
    assert cluster["m"]["events"] == single["m"]["events"] > 0  # every labeled pair fed exactly once
    hit = {s for s, n in detections(single).items() if n}
    assert hit, single  # the injected drift is detectable at all
    assert {s for s, n in detections(cluster).items() if n} == hit
    for s in hit:  # detected after the drift, within a few blocks of the single process
        one, two = single["m"]["signals"][s]["last"], cluster["m"]["signals"][s]["last"]
        assert one["direction"] == two["direction"] and one["events"] > DRIFT_AT and two["events"] > DRIFT_AT
        assert abs(one["events"] - two["events"]) <= 8 * cfg.changes.block, (s, one, two)
    # the detector travels with its model's snapshot (a new owner continues it, it does not start over)
    snap = ModelSnapshot.from_bytes(ModelSnapshot("m", 1, det_windows(), changes=det.to_dict()).to_bytes())
    assert snap.changes == det.to_dict()


def det_windows():
    from calmon.state.buckets import ModelWindows
    return ModelWindows("m", 2, [(60, 2)])


def test_no_drift_no_alarm_in_either(tmp_path):
    records = drifting(None, seed=11)
    single = single_view(config(), records)
    cluster, _ = cluster_view(tmp_path, records)
    assert cluster["m"]["events"] == single["m"]["events"] > 0
    assert not any(detections(single).values()) and not any(detections(cluster).values())


@pytest.mark.parametrize("enabled", [False])
def test_detectors_off_means_no_pairs_in_the_deltas(enabled):
    cfg = config(changes={"enabled": enabled})
    deltas = partitioned_deltas(cfg, drifting(None)[:3000], partitions=PARTITIONS, size=500)
    assert deltas and all(d.pairs is None for d in deltas)


@pytest.mark.integration
@pytest.mark.slow
def test_a_drift_is_detected_by_a_cluster_on_the_broker(tmp_path):
    """The same drifting stream through Kafka: one ingest worker and one evaluator (`calmon run --role ...`) on the
    Tansu broker; the evaluator's ``calmon_change_detected_total`` fires on the signals the single process fires on
    (and nowhere else) once every record is in."""
    from kafka_broker import KafkaBroker, require_broker
    from test_cluster_kafka import TOPIC, Worker, evaluator_client_fix, produce, wait_until, write_config

    require_broker()
    records = drifting("temperature:0.5")
    single = single_view(config(), records)
    hit = {s for s, n in detections(single).items() if n}
    assert hit
    with KafkaBroker() as broker:
        broker.create_topic(TOPIC, partitions=PARTITIONS)
        produce(broker.bootstrap, records)
        cfg = write_config(tmp_path / "run", source="kafka", bootstrap=broker.bootstrap, batch_size=1000)
        evaluator_client_fix(cfg)
        workers = [Worker(cfg, "ingest", "ingest-0"), Worker(cfg, "evaluate", "evaluate-0")]
        try:
            for w in workers:
                w.wait_serving(120)
            ev = workers[1]

            def fired() -> set[str]:
                got = ev.metric("calmon_change_detected_total")
                return {s for s in detections(single) if got.get(f'{{model="m",signal="{s}"}}', 0) > 0}

            def events() -> float:
                return sum(v for k, v in ev.metric("calmon_events_total").items() if 'model="m"' in k)

            wait_until(lambda: events() == len(records), 600, "every event merged", workers, events)
            wait_until(lambda: fired() == hit, 120, f"detections on {sorted(hit)}", workers, fired)
        finally:
            for w in workers:
                w.proc.terminate()
            for w in workers:
                w.proc.wait(60)
