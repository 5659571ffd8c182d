"""Mapped decoding's fast paths (issue #16) give exactly what the canonical schema gives for the same events.

The mapped reader decodes chunks with a ``Literal`` struct where raw labels or types form a closed set,
falls back to a permissive struct for a chunk holding another value (and keeps it for the rest of the
batch), and reads nested columns level by level through fixed comprehensions. Each test writes the
same events canonically and in a mapped shape and compares the decoded batches field by field, with
refused records in chunks of their own and in the middle of a batch.
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pytest

from calmon.events.decoder import DecodedBatch, Decoder
from calmon.events.schema import load_mapping

T0 = 1767225600.0


def _events(n: int, seed: int = 3, classes: int = 2) -> list[dict[str, Any]]:
    rng = np.random.default_rng(seed)
    out: list[dict[str, Any]] = []
    for i in range(n):
        kind = ("labeled", "prediction", "outcome")[i % 3]
        e: dict[str, Any] = {"type": kind, "id": f"r{i}", "model": f"m{i % 2}", "ts": T0 + i,
                             "segment": ("FR", "DE")[i % 2]}
        if kind != "outcome":
            if classes == 2:
                e["score"] = float(np.round(rng.random(), 6))
            else:
                p = rng.dirichlet(np.ones(classes))
                p = np.round(p, 6)
                p[-1] = np.round(1.0 - p[:-1].sum(), 6)
                e["probs"] = [float(x) for x in p]
        if kind != "prediction":
            e["label"] = int(rng.integers(classes))
        out.append(e)
    return out


def _canonical(events: list[dict[str, Any]]) -> list[bytes]:
    return [json.dumps(e).encode() for e in events]


def _same(a: DecodedBatch, b: DecodedBatch) -> None:
    assert sorted(a.models) == sorted(b.models)
    assert [(r.index, r.reason) for r in a.rejected] == [(r.index, r.reason) for r in b.rejected]
    for name, x in a.models.items():
        y = b.models[name]
        for col in ("kind", "ids", "ts", "segment", "label", "index"):
            assert np.array_equal(getattr(x, col), getattr(y, col)), (name, col)
        for col in ("score", "probs"):
            u, v = getattr(x, col), getattr(y, col)
            assert (u is None) == (v is None) and (u is None or np.array_equal(u, v, equal_nan=True)), (name, col)


_KIND = {"prediction": "pred", "outcome": "out", "labeled": "lab"}
NESTED = {"fields": {"id": "/x.y/rid", "model": "a.b.model", "segment": "a.b.country", "type": "a.kind",
                     "score": "out.p", "label": "y", "ts": "t"},
          "ts_unit": "ms", "labels": {"positive": ["yes"], "negative": ["no"]},
          "types": {"prediction": "pred", "outcome": "out", "labeled": "lab"}}


def _nested(e: dict[str, Any]) -> dict[str, Any]:
    r: dict[str, Any] = {"x.y": {"rid": e["id"]}, "a": {"b": {"model": e["model"], "country": e["segment"]},
                                                        "kind": _KIND[e["type"]]}, "t": round(e["ts"] * 1000)}
    if "score" in e:
        r["out"] = {"p": e["score"]}
    if "label" in e:
        r["y"] = "yes" if e["label"] else "no"
    return r


@pytest.mark.parametrize("bad_at", [[], [5], [1500], [0, 1023, 1024, 2999]])
def test_nested_mapping_with_closed_values_decodes_like_the_canonical_schema(bad_at: list[int]) -> None:
    """Deep and shared paths (``a.b.model``, ``a.b.country``, ``a.kind``), a JSON Pointer with a dotted key, raw
    types and labels; some records hold a raw value outside the closed sets (refused, the rest unchanged)."""
    events = _events(3000)
    shaped = [_nested(e) for e in events]
    canonical = _canonical(events)
    want = {}
    for i in bad_at:  # an unknown raw label, or an integer type where the raw types are strings
        if "y" in shaped[i]:
            shaped[i]["y"], want[i] = "maybe", "unmapped_label"
        else:
            shaped[i]["a"]["kind"], want[i] = 7, "unknown_type"
        canonical[i] = b'{"model": "m0", "type": "bogus", "score": 0.5}'
    mapped = Decoder(mapping=load_mapping(NESTED)).decode([json.dumps(r).encode() for r in shaped])
    reference = Decoder().decode(canonical)
    assert {r.index: r.reason for r in mapped.rejected} == want
    assert {r.index for r in reference.rejected} == set(bad_at)
    for r in reference.rejected:
        r.reason = want[r.index]
    _same(mapped, reference)


def test_a_batch_keeps_the_permissive_struct_after_a_refused_value() -> None:
    """The fallback is per batch: the next batch tries the Literal struct again, with the same results."""
    events = _events(5000)
    shaped = [_nested(e) for e in events]
    shaped[10]["y"] = "unknown"
    dec = Decoder(mapping=load_mapping(NESTED))
    first = dec.decode([json.dumps(r).encode() for r in shaped])
    second = dec.decode([json.dumps(r).encode() for r in shaped[1024:]])
    assert [(r.index, r.reason) for r in first.rejected] == [(10, "unmapped_label")]
    assert second.rejected == [] and sum(map(len, second.models.values())) == 5000 - 1024
    s1, s2 = first.models["m0"].score, second.models["m0"].score
    assert s1 is not None and s2 is not None and np.array_equal(s1[-100:], s2[-100:], equal_nan=True)


@pytest.mark.parametrize("labels", [{"classes": ["cat", "dog", "bird"]}, {"classes": [10, 20, 30]},
                                    {"classes": ["cat", 20, "bird"]}])
def test_multiclass_probs_per_class_paths_and_class_labels(labels: dict[str, Any]) -> None:
    """Nested per-class paths (one getter over the generated names) and raw class labels as a Literal."""
    names = labels["classes"]
    events = _events(2500, classes=3)
    shaped = []
    for e in events:
        r: dict[str, Any] = {"id": e["id"], "model": e["model"], "ts": e["ts"], "segment": e["segment"],
                             "type": e["type"]}
        if "probs" in e:
            r["s"] = {"p_cat": e["probs"][0], "p_dog": e["probs"][1], "p_bird": e["probs"][2]}
        if "label" in e:
            r["y"] = names[e["label"]]
        shaped.append(r)
    mapping = load_mapping({"fields": {"probs": ["s.p_cat", "s.p_dog", "s.p_bird"], "label": "y"}, "labels": labels})
    _same(Decoder(mapping=mapping).decode([json.dumps(r).encode() for r in shaped]),
          Decoder().decode(_canonical(events)))


def test_boolean_raw_labels_stay_on_the_permissive_struct() -> None:
    """``true``/``false`` raw labels get no Literal struct (a Literal of booleans is msgspec's ``bool``, which
    does not mix with integer values): still mapped exactly."""
    events = _events(1200)
    shaped = [{**{k: v for k, v in e.items() if k != "label"}, **({"ok": bool(e["label"])} if "label" in e else {})}
              for e in events]
    mapping = load_mapping({"fields": {"label": "ok"}, "labels": {"positive": [True], "negative": [False]}})
    _same(Decoder(mapping=mapping).decode([json.dumps(r).encode() for r in shaped]),
          Decoder().decode(_canonical(events)))


def test_positive_only_labels_learn_the_other_raw_values() -> None:
    """With ``positive`` alone every other raw label means 0: the reader learns those it meets (for its Literal
    struct) batch by batch, and stops learning past 64 distinct values or at a boolean; results never change."""
    events = _events(6000, seed=5)
    rng = np.random.default_rng(9)
    others = ["no", "legit", 0]
    shaped = []
    for i, e in enumerate(events):
        r = {k: v for k, v in e.items() if k != "label"}
        if "label" in e:
            if e["label"]:
                r["y"] = ("yes", 1)[i % 2]
            elif i >= 4000:  # the last batches: many distinct values, then a boolean
                r["y"] = f"other-{i % 80}" if i < 5500 else False
            else:
                r["y"] = others[int(rng.integers(len(others)))]
        shaped.append(json.dumps(r).encode())
    dec = Decoder(mapping=load_mapping({"fields": {"label": "y"}, "labels": {"positive": ["yes", 1]}}))
    ref = Decoder()
    canonical = _canonical(events)
    learned = []
    for start in range(0, 6000, 1000):
        _same(dec.decode(shaped[start:start + 1000]), ref.decode(canonical[start:start + 1000]))
        assert dec.reader is not None
        learned.append(dec.reader._literals.get("label"))
    assert set(learned[0] or ()) == {"yes", 1, "no", "legit", 0} and learned[1] == learned[0]  # learned once
    assert learned[-1] is None  # too many distinct values: back to the permissive struct
