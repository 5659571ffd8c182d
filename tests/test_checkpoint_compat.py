"""Checkpoints written by the previous release restore to the same state; documents are checked by their schema.

``tests/data/checkpoint_v3/`` is the newest generation of a state directory written by the release before the
package moves (commit 5fd9c6d: ``calmon/checkpoint*.py``, ``calmon/agent/checkpoint_schema.py``): manifest version
3, state document version 2, packed buckets in two packs (the newest generation refers to buckets of both).  It
was made by running that tree's ``Agent`` with :data:`CONFIG` (plus a files source, ``evaluation.every: 1h``,
``ingest.batch_size: 600``, a fixed clock 1767400000) over 1,095 hostile mixed records (five models, one of them
multiclass, bad JSON and encodings, pending predictions and early outcomes), checkpointing after the first batch
and at the end; ``expected-state.json.gz`` is that agent's ``state.to_doc()`` at the end.
"""

from __future__ import annotations

import copy
import gzip
import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from calmon.config import build_config
from calmon.state.agentstate import AgentState, StateError
from calmon.state.checkpoint.incremental import Checkpointer, resolver
from calmon.state.checkpoint.schema import (
    STATE_FORMAT,
    STATE_READABLE,
    BlobRefDoc,
    SchemaError,
    convert,
    validate_checkpoint,
)
from calmon.state.checkpoint.store import CheckpointError, CheckpointStore
from calmon.state.delays import LabelDelays

DATA = Path(__file__).resolve().parent / "data" / "checkpoint_v3"
CONFIG: dict[str, Any] = {
    "sources": [{"name": "replay", "path": "input.jsonl"}],
    "models": {"default": {"bins": 64, "reservoir": 8, "segments": ["web", "app"]}},
    "windows": {"tiers": [{"width": 300, "count": 12}, {"width": 3600, "count": 24}, {"width": 86400, "count": 7}]},
}


def _store(tmp_path: Path) -> CheckpointStore:
    directory = tmp_path / "checkpoints"
    shutil.copytree(DATA, directory, ignore=shutil.ignore_patterns("expected-*"))
    return CheckpointStore(directory)


def _restored(store: CheckpointStore) -> tuple[AgentState, dict[str, Any]]:
    doc = store.load()
    assert doc is not None
    st = AgentState(build_config(CONFIG, env={}))
    with store.reader() as reader:
        st.load_doc(doc, resolve=resolver(reader))
    return st, doc


def _plain(st: AgentState) -> Any:
    return json.loads(json.dumps(st.to_doc(), sort_keys=True))


def _expected() -> Any:
    return json.loads(gzip.decompress((DATA / "expected-state.json.gz").read_bytes()))


def _without_added(doc: Any) -> Any:
    """``doc`` without the keys the join document gained since (#31.1 per-source event times, #32.4 label delays),
    checked empty: a restored old checkpoint has no source times and no delays measured yet."""
    added = {k: doc["join"].pop(k) for k in ("sources", "untimed", "delays")}
    assert added == {"sources": {}, "untimed": [], "delays": LabelDelays().to_dict()}
    return doc


def test_previous_release_checkpoint_restores_to_the_same_state(tmp_path: Path) -> None:
    store = _store(tmp_path)
    st, doc = _restored(store)
    assert doc["format"] == STATE_FORMAT and doc["version"] in STATE_READABLE
    want = _expected()
    assert sorted(want["models"]) == ["bprobs", "m1", "m2", "m3", "multi"]
    assert want["join"]["pending"]["ids"] and want["join"]["early"]["ids"]  # the fixture holds join buffers
    assert _without_added(_plain(st)) == want
    # the next generation builds on the old packs: nothing changed, so no bucket is written again
    ck = Checkpointer(store)
    ck.adopt(st, doc)
    ck.submit(ck.capture(st, {k: doc[k] for k in ("format", "version", "created", "sources")}))
    res = ck.wait()
    assert res is not None and res.blobs == 0 and res.generation == 4
    again, _ = _restored(store)
    assert _without_added(_plain(again)) == want


@pytest.mark.parametrize("edit,message", [
    (lambda s: s["join"].pop("pending"), "field join.pending: missing"),
    (lambda s: s["join"].update(ttl="soon"), "field join.ttl: must be a number, got 'soon'"),
    (lambda s: s["join"]["pending"]["ts"].__setitem__(3, "x"), "field join.pending.ts.3: must be a number, got 'x'"),
    (lambda s: s["join"]["early"]["labels"].pop(), "field join.early: columns of different lengths"),
    (lambda s: s["join"]["classes"].update(zz=1.5), "field join.classes.zz: must be an integer, got 1.5"),
    (lambda s: s["join"]["counters"].update(orphans=True), "field join.counters.orphans: must be an integer"),
    (lambda s: s["models"]["m2"]["tiers"][1].__setitem__(0, None), "field models.m2.tiers.1.0: must be a number"),
    (lambda s: s["models"]["multi"].pop("rings"), "field models.multi.rings: missing"),
    (lambda s: s["models"]["m3"]["rings"].update(web=[]), "field models.m3.rings.web: must be an object, got []"),
    (lambda s: s["counters"]["events"].__setitem__(0, ["m1", "labeled"]), "field counters.events.0: "),
    (lambda s: s.update(calibrators={"m1": 3}), "field calibrators.m1: must be an object, got 3"),
    (lambda s: s.update(decoder=None), "field decoder: must be an object, got None"),
    (lambda s: s.pop("created"), "field created: missing"),
])
def test_malformed_state_names_the_field(tmp_path: Path, edit: Any, message: str) -> None:
    doc = _store(tmp_path).load()
    assert doc is not None
    validate_checkpoint(doc)
    bad = copy.deepcopy(doc)
    edit(bad)
    with pytest.raises(SchemaError) as err:
        validate_checkpoint(bad)
    assert str(err.value).startswith(message), str(err.value)
    with pytest.raises(StateError, match=message.replace("[", r"\[").replace("]", r"\]")):
        AgentState(build_config(CONFIG, env={})).load_doc(bad)


def test_keys_not_in_the_schema_are_allowed(tmp_path: Path) -> None:
    doc = _store(tmp_path).load()
    assert doc is not None
    newer = copy.deepcopy(doc)
    newer["join"]["pending"]["note"] = "from a later release"
    newer["models"]["m1"]["params"]["extra"] = 1
    newer["something_new"] = {"x": [1, 2]}
    checked = validate_checkpoint(newer)
    assert checked.join.max_pending == doc["join"]["max_pending"] and set(checked.models) == set(doc["models"])


def test_manifest_and_blob_reference_fields_are_named(tmp_path: Path) -> None:
    store = _store(tmp_path)
    path = store.path_of(3)
    top = json.loads(path.read_text())
    top["sha256"] = None
    top["packs"] = [2, "three"]
    path.write_text(json.dumps(top))
    with pytest.raises(CheckpointError, match=r"field packs\.1: must be an integer, got 'three'"):
        store.read(3)
    for ref, message in [({"pack": 2, "at": -1, "len": 5}, "field at: "),
                         ({"pack": 2, "at": 0, "len": 5, "crc": "x"}, "field crc: must be an integer or null"),
                         ({"pack": 2, "len": 5}, "field at: missing")]:
        with pytest.raises(SchemaError, match=message):
            convert(ref, BlobRefDoc)
