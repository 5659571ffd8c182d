"""Sources with a schema mapping: metadata paths switch Kafka metadata on, and are refused on files."""

from __future__ import annotations

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
