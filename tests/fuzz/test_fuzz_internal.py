"""Fuzz: records of the scale-out's internal topics (issue #31, builds 3 and 8).

Hypothesis mutates genuine state, delta and snapshot records -- a value replaced anywhere in the document by
a value of another type, a key dropped or added, bytes flipped, the record truncated -- and feeds them to the
readers at the seam. Invariants:

* a reader returns a record or raises its typed error with a reason code of
  :data:`calmon.cluster.records.REASONS` and a one-line message -- never another exception;
* the evaluator, fed a mix of genuine and mutated deltas, never raises, never admits more models than
  ``limits.max_models``, and counts every record it did not merge.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.fuzz import fuzzkit as fk

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests"))

from test_cluster import config, partitioned_deltas, traffic  # noqa: E402
from test_cluster_hostile import KEY, evaluator, good_state  # noqa: E402

from calmon.cluster.deltas import Delta, DeltaError  # noqa: E402
from calmon.cluster.frames import _PREFIX, PREFIX, is_frame  # noqa: E402
from calmon.cluster.records import REASONS, BadRecord  # noqa: E402
from calmon.cluster.snapshots import ModelSnapshot, SnapshotError  # noqa: E402
from calmon.cluster.topics import PartitionState  # noqa: E402
from calmon.state.buckets import ModelWindows  # noqa: E402
from connectors.base import Batch  # noqa: E402

SETTINGS = settings(max_examples=fk.env_examples(60), deadline=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
_values = st.one_of(st.none(), st.booleans(), st.integers(-(2**70), 2**70), st.floats(allow_nan=True),
                    st.text(max_size=6), st.lists(st.integers(-3, 3), max_size=3),
                    st.dictionaries(st.text(max_size=3), st.integers(), max_size=2))


@pytest.fixture(scope="module")
def genuine() -> dict[str, bytes]:
    records, _ = traffic(400, models=3)
    delta = partitioned_deltas(config(), records)[0]
    snap = ModelSnapshot("m", 1, ModelWindows("m", 2, [(60, 2)], bins=64))
    return {"state": json.dumps(good_state()).encode(), "delta": delta.to_bytes(),
            "delta_json": delta.to_bytes(2), "snapshot": snap.to_bytes()}


def _paths(node: Any, prefix: tuple = ()) -> list[tuple]:
    """Every path into a JSON document (dict keys and list indices), the root's children first."""
    out: list[tuple] = []
    if isinstance(node, dict):
        items = list(node.items())
    elif isinstance(node, list):
        items = list(enumerate(node[:4]))
    else:
        return out
    for k, v in items:
        out.append((*prefix, k))
        out.extend(_paths(v, (*prefix, k)))
    return out


@st.composite
def mutation(draw: st.DrawFn, data: bytes) -> bytes:
    how = draw(st.sampled_from(["replace", "replace", "drop", "add", "flip", "truncate"]))
    if how in ("flip", "truncate"):
        if how == "truncate":
            return data[: draw(st.integers(0, max(0, len(data) - 1)))]
        buf = bytearray(data)
        for _ in range(draw(st.integers(1, 8))):
            i = draw(st.integers(0, len(buf) - 1))
            buf[i] = draw(st.integers(0, 255))
        return bytes(buf)
    if is_frame(data):  # a binary delta: the structured mutations edit its JSON header, the payload stays
        head, header, payload = _split_frame(data)
        return _join_frame(head, draw(mutation(header)), payload)
    doc = json.loads(data)
    paths = _paths(doc)
    path = draw(st.sampled_from(paths))
    node = doc
    for k in path[:-1]:
        node = node[k]
    last = path[-1]
    if how == "replace":
        node[last] = draw(_values)
    elif how == "drop":
        if isinstance(node, dict):
            del node[last]
        else:
            node.pop(last)
    elif isinstance(node, dict):
        node[draw(st.text(min_size=1, max_size=4))] = draw(_values)
    return json.dumps(doc).encode()


def _split_frame(data: bytes) -> tuple[tuple[Any, ...], bytes, bytes]:
    head = _PREFIX.unpack_from(data)
    h = head[4]
    return head, data[PREFIX:PREFIX + h], data[PREFIX + h:]


def _join_frame(head: tuple[Any, ...], header: bytes, payload: bytes) -> bytes:
    """A frame around ``header`` whose lengths add up (so that the reader gets past the prefix)."""
    magic, version, flags, reserved, _h, _p = head
    return _PREFIX.pack(magic, version, flags, reserved, len(header), len(payload)) + header + payload


def forged(delta: bytes, model: str) -> bytes:
    """A genuine delta (JSON or binary) that names another model."""
    if is_frame(delta):
        head, header, payload = _split_frame(delta)
        return _join_frame(head, json.dumps({**json.loads(header), "model": model}).encode(), payload)
    return json.dumps({**json.loads(delta), "model": model}).encode()


READERS = {
    "state": (lambda b: PartitionState.from_bytes(b, KEY.encode()), (BadRecord,)),
    "delta": (Delta.from_bytes, (DeltaError,)),
    "delta_json": (Delta.from_bytes, (DeltaError,)),  # version 2, still read from topics written before v3
    "snapshot": (ModelSnapshot.from_bytes, (SnapshotError,)),
}


@pytest.mark.parametrize("kind", sorted(READERS))
@SETTINGS
@given(data=st.data())
def test_a_mutated_internal_record_is_read_or_refused_with_its_reason(genuine, kind, data):
    bad = data.draw(mutation(genuine[kind]))
    read, errors = READERS[kind]
    fk.STATS["records"] += 1
    try:
        read(bad)
    except errors as exc:
        assert getattr(exc, "reason", None) in REASONS, (type(exc), exc)
        assert "\n" not in str(exc)


@settings(SETTINGS, max_examples=fk.env_examples(8))  # an evaluator per example: ~1 s each
@given(data=st.data())
def test_the_evaluator_survives_mutated_deltas_and_holds_its_model_cap(tmp_path_factory, genuine, data):
    ev = evaluator(tmp_path_factory.mktemp("ev"), limits={"max_models": 4})
    values: list[bytes] = []
    for i in range(data.draw(st.integers(1, 12))):
        if data.draw(st.booleans()):
            values.append(forged(genuine["delta"], f"forged{i}"))
        else:
            values.append(data.draw(mutation(genuine[data.draw(st.sampled_from(["delta", "delta_json"]))])))
    fk.STATS["records"] += len(values)
    try:
        ev.ingest(Batch(values, {}, "deltas", [f"calmon-deltas/0@{i}" for i in range(len(values))]))
        assert len(ev.state.models) <= 4
    finally:  # its deltas consumer: the long run (250 examples) had kept 750 sockets and 256 threads open
        ev.deltas.close()
