"""``python -m benchmarks.bench_kafka --stages`` (issue #33.1): where the reading thread's CPU goes per record.

On the test broker, a tiny run of the memory-fed agent and the agent on Kafka with each installed client: the stage
table has a row per path, the stages of a Kafka path add up to at most its reading thread's CPU, and the memory-fed
agent spends nothing in a client.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


@pytest.mark.integration
def test_stages_split_the_reading_threads_cpu(capsys: pytest.CaptureFixture[str]) -> None:
    from benchmarks import bench_kafka
    from tests.kafka_broker import require_broker

    require_broker()
    runs = ["memory-agent", "agent"]
    try:
        import confluent_kafka  # noqa: F401

        runs += ["confluent-agent", "confluent-agent-inline"]
    except ImportError:
        pass
    assert bench_kafka.main(["--n", "3000", "--partitions", "3", "--repeat", "1", "--stages",
                             "--runs", ",".join(runs)]) == 0
    out = capsys.readouterr().out
    table = out[out.index("\nStages"):]
    rows = {}
    for line in table.splitlines():
        m = re.match(r"\| (agent [^|]+?) \| (.+) \|$", line)
        if m:
            cells = [c.strip() for c in m.group(2).split("|")]
            # each stage is "cpu (wall)"; then the reading thread's and the client threads' CPU
            stages = [float(c.split(" ")[0]) for c in cells[:4]]
            rows[m.group(1)] = (stages, float(cells[4]), float(cells[5]))
    assert set(rows) == {bench_kafka.LABELS[r] for r in runs}
    memory, thread, _ = rows["agent from memory"]
    assert memory[0] == memory[1] == 0 and memory[3] > 0 and thread > 0
    for label, (stages, thread, _client) in rows.items():
        assert all(s >= 0 for s in stages), label
        assert sum(stages) <= thread * 1.05 + 0.05, label  # the stages are inside the reading thread's time
        if label == bench_kafka.LABELS.get("confluent-agent"):  # the client's call is in the reader process
            assert stages[0] == 0 and stages[1] > 0 and stages[3] > 0, label
        elif label != "agent from memory":
            assert stages[0] > 0 and stages[3] > 0, label  # the client's call and the agent's ingest both ran
