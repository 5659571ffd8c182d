"""The decoder at hundreds of models in one batch (issue #15) gives what it gives record by record.

A batch of many models takes the decoder's grouped routes (one numbering of the models, one stable sort, the
per-model slices, the batch-wide segment check); a decoder fed the same stream one record at a time takes the
one-model routes. Batch boundaries never change a decision, so the batch's accepted columns (values, dtypes,
model order in the dict), its rejections (index, reason, origin) and the decoder's state must be those of the
record-by-record decode. The details are compared with the per-event reference route of
``test_decoder_fastpaths`` (a detail may legitimately name the batch context: a model's classes fixed later in
the same batch, string times of the same model).
"""

from __future__ import annotations

import json
import random
from typing import Any

import numpy as np
import pytest

from calmon.events.decoder import DecodedBatch, Decoder, ModelBatch
from calmon.events.parse import parse_records

NOW = 1_767_225_600.0
SEGMENTS = ["web", "app", "ios", "tv", "kiosk"]


def _decoder() -> Decoder:
    declared = {"d-multi": 3, "d-bin": 2, "quiet0": 2, "quiet1": 2, "quiet2": 2}
    dec = Decoder(models=declared, max_models=150, max_segments=3, max_classes=6, max_record_bytes=600,
                  max_id_bytes=24, future_skew=3600, past_horizon=86400 * 365, clock=lambda: NOW)
    # segments already known (allow-listed) for some models, at or over the cap for others
    dec.load_state({"segments": {f"m{i:03d}": SEGMENTS[: 1 + i % 5] for i in range(0, 120, 3)}})
    return dec


def _clean(rng: random.Random, j: int, quiet: bool) -> bytes:
    """A prediction or outcome of a model that knows segment ``web`` already (``quiet``: or of a model that never
    names a segment): the batch-wide segment check has its answer without a look at the records."""
    if quiet and rng.random() < 0.2:
        return json.dumps({"id": f"q{j}", "model": f"quiet{j % 3}", "score": 0.5}).encode()
    ev: dict[str, Any] = {"id": f"c{j}", "model": f"m{3 * rng.randrange(40):03d}", "ts": NOW - 5.0}
    ev.update({"score": 0.25, "segment": "web"} if rng.random() < 0.5 else {"label": 1})
    return json.dumps(ev).encode()


def _record(rng: random.Random, j: int, unreadable: bool = True) -> bytes:
    """A live-like event of one of ~220 models (over the cap of 150), hostile now and then (``unreadable``: some
    records the parser rejects, which sends the batch to the decoder's route for a batch with holes)."""
    roll = rng.random()
    if roll < 0.03 and unreadable:
        return rng.choice([b"nope", b"[1]", b"\xff\xfe", b"{" * 300, b'{"model":"m001","score":1e999}',
                           b'{"model":"m002","label":123456789012345678901234}', b'{"model":"m003","score":"x"}',
                           b'{"model":"m004","id":' + b"9" * 30 + b"}",
                           b'{"model":"m005","pad":"' + b"x" * 700 + b'"}'])
    model: str = rng.choice([f"m{rng.randrange(220):03d}", "d-multi", "d-bin", f"k4-{j % 5}", f"k3-{j % 4}"])
    ev: dict[str, Any] = {"id": f"r{j % 97}", "model": model, "ts": NOW - rng.random() * 1e4,
                          "segment": rng.choice(SEGMENTS)}
    kind = rng.choice(["prediction", "prediction", "outcome", "labeled"])
    if rng.random() < 0.8:
        ev["type"] = kind
    k = 4 if model.startswith("k4") else 3 if model.startswith("k3") or model == "d-multi" else 2
    if kind != "outcome":
        if k == 2 and rng.random() < 0.9:
            ev["score"] = round(rng.random(), 6)
        else:
            p = [round(rng.random(), 3) + 0.01 for _ in range(k)]
            ev["probs"] = [x / sum(p) for x in p]
    if kind != "prediction":
        ev["label"] = rng.randrange(k)
    roll = rng.random()
    if roll < 0.04:
        ev.pop("segment")
    elif roll < 0.06:
        ev["segment"] = rng.choice(["", "bad seg", "x" * 200, "new1", "new2"])
    elif roll < 0.08:
        ev["ts"] = rng.choice(["2026-01-01T00:00:00Z", "soon", NOW + 1e6, 1e12, -1, None])
    elif roll < 0.10:
        ev.pop("model")
        ev["type"] = rng.choice(["outcome", "outcome", "prediction"])
        ev["label"] = rng.randrange(4)
    elif roll < 0.11:
        ev["model"] = rng.choice(["", "bad name!", None, "y" * 200])
    elif roll < 0.13:
        ev["id"] = rng.choice([None, 7, "z" * 30, ""])
    elif roll < 0.15:
        ev["score"] = rng.choice([1.5, -0.1, 0.5])
        ev["probs"] = rng.choice([[0.5, 0.5], [0.2, 0.3, 0.5], [0.1] * 9, [0.6, 0.6]])
    elif roll < 0.16:
        ev["type"] = "guess"
    return json.dumps(ev, separators=(",", ":")).encode()


def _parsed_key(rec: bytes) -> str | None:
    """A record's group in the batch: its model (``""`` without one), ``None`` if the parser rejects it."""
    evs, _ = parse_records([rec], 600)
    return None if evs[0] is None else (evs[0].model or "")


def _record_by_record(dec: Decoder, records: list[bytes], origins: list[str]) -> DecodedBatch:
    """``dec.decode(records, origins)`` assembled from decodes of one record each."""
    parts: dict[str, list[tuple[int, ModelBatch]]] = {}
    rejected = []
    for i, rec in enumerate(records):
        out = dec.decode([rec], [origins[i]])
        for r in out.rejected:
            r.index = i
            rejected.append(r)
        for name, mb in out.models.items():
            parts.setdefault(name, []).append((i, mb))
    first: dict[str, int] = {}  # the batch numbers the models of the records that parse, outcomes without one last
    for i, rec in enumerate(records):
        key = _parsed_key(rec)
        if key is not None:
            first.setdefault(key, i if key else len(records))
    models = {}
    for name in sorted(parts, key=first.__getitem__):
        rows = [mb for _, mb in parts[name]]
        classes = dec.models.get(name, 2)  # the classes the model had at the batch's end
        cat = {col: np.concatenate([getattr(mb, col) for mb in rows])
               for col in ("kind", "ids", "ts", "segment", "label")}
        index = np.array([i for i, mb in parts[name] for _ in range(len(mb))], dtype=np.int64)
        if classes > 2:  # outcomes decoded before the first prediction fixed the classes: NaN rows
            probs = np.vstack([mb.probs if mb.probs is not None else np.full((len(mb), classes), np.nan)
                               for mb in rows])
            models[name] = ModelBatch(name, classes, score=None, probs=probs, index=index, **cat)
        else:
            score = np.concatenate([mb.score for mb in rows])  # binary: scores
            models[name] = ModelBatch(name, classes, score=score, probs=None, index=index, **cat)
    return DecodedBatch(models, rejected, len(records))


def _same_events(a: DecodedBatch, b: DecodedBatch) -> None:
    assert a.total == b.total
    assert [(r.index, r.reason, r.origin) for r in a.rejected] == [(r.index, r.reason, r.origin) for r in b.rejected]
    assert list(a.models) == list(b.models)
    for name, ma in a.models.items():
        mb = b.models[name]
        assert (ma.model, ma.classes) == (mb.model, mb.classes), name
        for col in ("kind", "ids", "ts", "segment", "label", "score", "probs", "index"):
            x, y = getattr(ma, col), getattr(mb, col)
            if x is None or y is None:
                assert x is None and y is None, (name, col)
                continue
            assert x.dtype == y.dtype and x.shape == y.shape, (name, col)
            assert np.array_equal(x, y, equal_nan=x.dtype.kind == "f"), (name, col)
            if x.dtype == object:
                assert [type(e) for e in x.tolist()] == [type(e) for e in y.tolist()], (name, col)


@pytest.mark.parametrize("seed", range(3))
def test_many_models_decode_as_record_by_record(seed: int) -> None:
    rng = random.Random(seed)
    batch, ref = _decoder(), _decoder()
    sizes = [2500, 1, 1500, 3000]
    reasons: set[str] = set()
    for b, size in enumerate(sizes):  # several batches: admitted models, classes and segments carry over
        recs = [_record(rng, j, unreadable=b % 2 == 0) for j in range(size)]
        origins = [f"f{b}:{j + 1}" for j in range(size)]
        got = batch.decode(recs, origins)
        _same_events(got, _record_by_record(ref, recs, origins))
        assert batch.state() == ref.state()
        assert batch.models == ref.models
        reasons.update(r.reason for r in got.rejected)
    for quiet in (False, True):  # every model knows every segment; then models without segments join in
        recs = [_clean(rng, j, quiet) for j in range(800)]
        origins = [f"c:{j}" for j in range(len(recs))]
        _same_events(batch.decode(recs, origins), _record_by_record(ref, recs, origins))
        assert batch.state() == ref.state()
    assert "quiet0" in batch.names and "quiet0" not in batch.segments
    assert {"too_many_models", "too_many_segments", "k_mismatch", "not_json", "bad_type"} <= reasons
    assert len(got.models) > 100 and sum(mb.probs is not None for mb in got.models.values()) >= 8
    assert "" in got.models and list(got.models)[-1] == ""


@pytest.mark.parametrize("seed", range(3))
def test_many_models_details_are_the_per_event_route(seed: int) -> None:
    from test_decoder_fastpaths import _decode_ref, _same

    rng = random.Random(100 + seed)
    fast, ref = _decoder(), _decoder()
    for b in range(3):
        recs = [_record(rng, j, unreadable=b != 1) for j in range(rng.choice([700, 3000]))]
        origins = [f"f{b}:{j + 1}" for j in range(len(recs))]
        _same(fast.decode(recs, origins), _decode_ref(ref, recs, origins))
        assert fast.state() == ref.state()


def test_the_reference_can_fail() -> None:
    """The record-by-record reference sees a model order or a column that differs."""
    rng = random.Random(7)
    recs = [_record(rng, j) for j in range(400)]
    origins = [str(j) for j in range(len(recs))]
    got = _decoder().decode(recs, origins)
    want = _record_by_record(_decoder(), recs, origins)
    swapped = DecodedBatch(dict(reversed(list(got.models.items()))), got.rejected, got.total)
    with pytest.raises(AssertionError):
        _same_events(swapped, want)
    name = next(iter(got.models))
    got.models[name].index = got.models[name].index[::-1].copy()
    with pytest.raises(AssertionError):
        _same_events(got, want)
