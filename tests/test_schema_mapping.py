"""Bring your own schema (issue #16): the same events in several record shapes give the same results.

Each shape is a writer ``(events, directory) -> (file, mapping)``: the file holds the events in that
shape and ``mapping`` (a dict, or ``None`` for calmon's own schema) reads them back. A new shape
(e.g. Parquet) is one more entry in :data:`SHAPES`.
"""

from __future__ import annotations

import csv
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from calmon.cli import main as cli_main

T0 = 1767225600.0
Event = dict[str, Any]
Shape = Callable[[list[Event], Path], tuple[Path, "dict[str, Any] | None"]]


def make_events(n: int = 300, seed: int = 7) -> list[Event]:
    """Labeled events, predictions with later outcomes (some without a model), in time order."""
    rng = np.random.default_rng(seed)
    out: list[Event] = []
    pending: list[Event] = []
    for i in range(n):
        ts = T0 + 0.25 * i
        z = float(np.round(rng.uniform(0.02, 0.98), 6))
        y = int(rng.random() < z ** 1.3)
        if i % 2 == 0:
            out.append({"type": "labeled", "id": f"l{i}", "model": "fraud", "ts": ts, "score": z, "label": y})
        else:
            out.append({"type": "prediction", "id": f"p{i}", "model": "fraud", "ts": ts, "score": z})
            pending.append({"type": "outcome", "id": f"p{i}", "label": y, "model": "fraud" if i % 4 == 1 else None})
        if len(pending) > 3:
            ev = pending.pop(0)
            out.append({**ev, "ts": ts + 0.125})
    for k, ev in enumerate(pending):
        out.append({**ev, "ts": T0 + 0.25 * n + k})
    return out


def _jsonl(path: Path, records: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps({k: v for k, v in r.items() if v is not None}) + "\n" for r in records))
    return path


def canonical(events: list[Event], d: Path) -> tuple[Path, dict[str, Any] | None]:
    return _jsonl(d / "canonical.jsonl", events), None


_KIND = {"prediction": "pred", "outcome": "out", "labeled": "lab"}


def flat(events: list[Event], d: Path) -> tuple[Path, dict[str, Any] | None]:
    recs = [{"prediction_id": e["id"], "model_name": e.get("model"), "kind": _KIND[e["type"]], "p": e.get("score"),
             "y": e.get("label"), "event_time": e["ts"]} for e in events]
    mapping = {"fields": {"id": "prediction_id", "model": "model_name", "type": "kind", "score": "p", "label": "y",
                          "ts": "event_time"}, "types": {"prediction": "pred", "outcome": "out", "labeled": "lab"}}
    return _jsonl(d / "flat.json", recs), mapping


def nested(events: list[Event], d: Path) -> tuple[Path, dict[str, Any] | None]:
    recs = []
    for e in events:
        r: dict[str, Any] = {"rid": e["id"], "meta": {"model": e.get("model"), "kind": _KIND[e["type"]]},
                             "event_time": round(e["ts"] * 1000)}
        if "score" in e:
            r["out"] = {"p": e["score"]}
        if "label" in e:
            r["y"] = "yes" if e["label"] else "no"
        recs.append(r)
    mapping = {"fields": {"id": "rid", "model": "/meta/model", "type": "meta.kind", "score": "out.p", "label": "y",
                          "ts": "event_time"},
               "ts_unit": "ms", "labels": {"positive": ["yes"], "negative": ["no"]},
               "types": {"prediction": "pred", "outcome": "out", "labeled": "lab"}}
    return _jsonl(d / "nested.jsonl", recs), mapping


def csv_columns(events: list[Event], d: Path) -> tuple[Path, dict[str, Any] | None]:
    path = d / "events.csv"
    with path.open("w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["prediction_id", "model_name", "kind", "p", "y", "t"])
        for e in events:
            w.writerow([e["id"], e.get("model") or "", _KIND[e["type"]], e.get("score", ""), e.get("label", ""),
                        repr(e["ts"])])
    mapping = {"fields": {"id": "prediction_id", "model": "model_name", "type": "kind", "score": "p", "label": "y",
                          "ts": "t"}, "types": {"prediction": "pred", "outcome": "out", "labeled": "lab"}}
    return path, mapping


def parquet_columns(events: list[Event], d: Path) -> tuple[Path, dict[str, Any] | None]:
    """Parquet: a struct column (dotted paths), nulls for absent fields, a UTC timestamp column."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pa.table({"prediction_id": [e["id"] for e in events],
                      "meta": [{"model": e.get("model"), "kind": _KIND[e["type"]]} for e in events],
                      "p": pa.array([e.get("score") for e in events], pa.float64()),
                      "y": pa.array([e.get("label") for e in events], pa.int8()),
                      "event_time": pa.array([round(e["ts"] * 1000) for e in events], pa.timestamp("ms", "UTC")),
                      "unused": ["x" * 20] * len(events)})
    pq.write_table(table, d / "events.parquet", row_group_size=64)
    mapping = {"fields": {"id": "prediction_id", "model": "meta.model", "type": "meta.kind", "score": "p",
                          "label": "y", "ts": "event_time"},
               "types": {"prediction": "pred", "outcome": "out", "labeled": "lab"}}
    return d / "events.parquet", mapping


#: The shapes compared with the canonical one.
SHAPES: list[Shape] = [flat, nested, csv_columns, parquet_columns]


def _check_json(capsys: pytest.CaptureFixture[str], path: Path, mapping: dict[str, Any] | None,
                tmp: Path) -> dict[str, Any]:
    args = ["check", str(path), "--json", "--mc", "300", "--tests", "tcal,smce"]
    if mapping is not None:
        schema = tmp / f"{path.stem}.schema.json"
        schema.write_text(json.dumps(mapping))
        args += ["--schema", str(schema)]
    capsys.readouterr()
    assert cli_main(args) == 0
    doc = json.loads(capsys.readouterr().out)
    doc.pop("input")
    return doc


@pytest.mark.parametrize("shape", SHAPES, ids=lambda f: f.__name__)
def test_check_json_is_the_same_in_every_shape(shape: Shape, tmp_path: Path, capsys: pytest.CaptureFixture[str]
                                               ) -> None:
    events = make_events()
    ref = _check_json(capsys, *canonical(events, tmp_path), tmp_path)
    got = _check_json(capsys, *shape(events, tmp_path), tmp_path)
    assert ref["n"] == 300 and ref["join"]["unjoined_predictions"] == 0
    assert got == ref


def _agent_windows(path: Path, mapping: dict[str, Any] | None, state: Path) -> tuple[Any, ...]:
    from calmon.agent.runtime import Agent
    from calmon.config import build_config
    source: dict[str, Any] = {"path": str(path)}
    if mapping is not None:
        source["schema"] = mapping
    doc = {"state_dir": str(state), "sources": [source], "exporter": {"enabled": False},
           "evaluation": {"tests": [], "min_events": 10}, "ingest": {"exit_when_done": True},
           "checkpoint": {"enabled": False}}
    agent = Agent(build_config(doc, env={}))
    agent.run()
    snaps = agent.state.snapshot()
    windows = sorted((s.model, s.segment, s.window, s.bucket.count,
                      json.dumps(s.bucket.to_dict(), sort_keys=True, default=str)) for s in snaps)
    counters = agent.state.counters
    return tuple(windows), agent.state.joiner.counters.to_dict(), dict(counters.rejected), counters.to_dict()["events"]


@pytest.mark.parametrize("shape", SHAPES, ids=lambda f: f.__name__)
def test_agent_statistics_are_the_same_in_every_shape(shape: Shape, tmp_path: Path) -> None:
    events = make_events()
    ref = _agent_windows(*canonical(events, tmp_path), tmp_path / "s0")
    got = _agent_windows(*shape(events, tmp_path), tmp_path / "s1")
    assert ref[0] and any(w[3] == 300 for w in ref[0])
    assert got == ref
