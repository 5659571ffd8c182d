"""Sources with a schema mapping: metadata paths switch Kafka metadata on, and are refused on files."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from calmon.agent.build import build_source
from calmon.agent.runtime import StartupError
from calmon.config import SourceConfig

META_SCHEMA = {"fields": {"id": "$key", "model": "$headers.model", "score": "p", "label": "y"}}


def test_kafka_source_reads_metadata_when_the_mapping_needs_it() -> None:
    opts = {"bootstrap_servers": "127.0.0.1:1", "topic": "events"}
    with_meta = build_source(SourceConfig(name="k", type="kafka", options=opts, schema=META_SCHEMA), 0)
    plain = build_source(SourceConfig(name="k", type="kafka", options=opts,
                                      schema={"fields": {"score": "p", "label": "y"}}), 0)
    explicit = build_source(SourceConfig(name="k", type="kafka", options={**opts, "metadata": False},
                                         schema=META_SCHEMA), 0)
    assert getattr(with_meta, "metadata") is True
    assert getattr(plain, "metadata") is False
    assert getattr(explicit, "metadata") is False  # an explicit option wins


def test_file_source_refuses_metadata_paths(tmp_path: Path) -> None:
    with pytest.raises(StartupError, match=r"sources\.0\.schema: .*only on Kafka"):
        build_source(SourceConfig(name="f", type="file", path=str(tmp_path), schema=META_SCHEMA), 0)


@pytest.mark.parametrize("probe", [10, 1000])  # found while decoding, or at the end of a short input
def test_run_exits_2_on_a_path_that_never_matches(tmp_path: Path, probe: int) -> None:
    events = tmp_path / "events.jsonl"
    events.write_text("".join(json.dumps({"type": "labeled", "model": "m", "p": 0.5, "y": 1}) + "\n"
                              for _ in range(20)))
    cfg = tmp_path / "calmon.yaml"
    cfg.write_text(json.dumps({
        "sources": [{"name": "f", "type": "file", "path": str(events),
                     "schema": {"fields": {"score": "p", "label": "y", "ts": "event_tme"}, "probe_records": probe}}],
        "exporter": {"enabled": False}, "checkpoint": {"enabled": False},
        "ingest": {"exit_when_done": True}, "state_dir": str(tmp_path / "state")}))
    proc = subprocess.run([sys.executable, "-m", "calmon", "run", "--config", str(cfg)],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2, proc.stderr
    last = proc.stderr.strip().splitlines()[-1]
    assert "schema error" in last and "event_tme" in last
