"""Event inputs of ``calmon check`` / ``fit`` / ``apply``: records decoded chunk by chunk, then joined.

Records (JSON Lines, plain or compressed, and rows of Parquet/Arrow files as JSON objects) arrive as
:class:`Chunk` s and are decoded by one :class:`calmon.events.decoder.Decoder` (with the schema mapping, if any);
:class:`EventAccumulator` keeps the accepted events per model as column arrays and only the first
rejection with its line or row, so reading memory does not grow with the chunks' raw bytes. The
decoder's state decisions are taken in record order, so the result does not depend on chunk sizes.
At the end predictions and outcomes are joined by id with the agent's
:class:`calmon.state.join.Joiner` (no time limit: the whole input is one batch).

Offline files are historical and event times do not change the result of ``check``, so the decoder has
no wall-clock limits here (``future_timestamp``/``past_timestamp`` are never raised).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

import msgspec
import numpy as np

from calmon.events.decoder import LABELED, PREDICTION, Decoder, ModelBatch, Rejection
from calmon.events.suggest import suggest_mapping
from calmon.offline.dataset import Dataset, InputError
from calmon.state.join import JoinedBatch, Joiner

if TYPE_CHECKING:
    from calmon.events.schema import Mapping
__all__ = ["Chunk", "EventAccumulator", "jsonl_chunks", "make_decoder", "MAX_CLASSES"]

MAX_CLASSES = 100_000  # the largest limits.max_classes the configuration accepts
_CHUNK_LINES = 65_536
_HINT_SAMPLE = 500  # records per input kept to propose a mapping in the first error
_decode_json = msgspec.json.Decoder().decode


@dataclass
class Chunk:
    """Records of one file with their 1-based line (JSON Lines) or row (tables) numbers."""

    source: str
    records: list[bytes]
    numbers: Sequence[int]


def make_decoder(mapping: Mapping | None = None) -> Decoder:
    """The offline decoder: generous caps, no wall-clock limits, the schema mapping if any."""
    return Decoder(max_models=10_000, max_segments=10_000, max_classes=MAX_CLASSES, max_id_bytes=65_536,
                   mapping=mapping, probe="raise")


def jsonl_chunks(source: str, pieces: Iterable[bytes], lines: int = _CHUNK_LINES) -> Iterator[Chunk]:
    """Non-blank lines of a byte stream given in pieces (split anywhere), ``lines`` at a time.

    >>> [(c.records, list(c.numbers)) for c in jsonl_chunks("x", [b'{"a"', b': 1}\\n\\n{"b": 2}'])]
    [([b'{"a": 1}', b'{"b": 2}'], [1, 3])]
    """
    rest = b""
    line = 1
    recs: list[bytes] = []
    nums: list[int] = []
    for piece in pieces:
        parts = (rest + piece if rest else piece).split(b"\n")
        rest = parts.pop()
        for ln in parts:
            if ln.strip():
                recs.append(ln)
                nums.append(line)
                if len(recs) >= lines:
                    yield Chunk(source, recs, nums)
                    recs, nums = [], []
            line += 1
    if rest.strip():
        recs.append(rest)
        nums.append(line)
    if recs:
        yield Chunk(source, recs, nums)


class _Origins(Sequence[str]):
    """``"line 7 of a.jsonl"`` of a chunk's records, formatted only when one is read (a rejection, the probe)."""

    def __init__(self, chunk: Chunk, what: str) -> None:
        self.chunk, self.what = chunk, what

    def __len__(self) -> int:
        return len(self.chunk.records)

    def __getitem__(self, i: Any) -> Any:
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        return f"{self.what} {self.chunk.numbers[i]} of {self.chunk.source}"


@dataclass
class _Bad:
    source: str
    number: int
    rejection: Rejection
    what: str = "line"


@dataclass
class EventAccumulator:
    """Decode chunks and keep their accepted events per model (see the module docstring).

    Parameters
    ----------
    decoder
        The decoder (:func:`make_decoder`).
    what
        ``"line"`` or ``"row"``: how error messages number records.
    """

    decoder: Decoder
    what: str = "line"
    total: int = 0
    invalid: int = 0
    reasons: dict[str, int] = field(default_factory=dict)
    first_bad: _Bad | None = None
    _parts: dict[str, list[ModelBatch]] = field(default_factory=dict)
    #: without a mapping, each input's first records: a mapping is proposed from them if most records are refused
    _samples: dict[str, list[bytes]] = field(default_factory=dict)

    def add(self, chunk: Chunk, what: str | None = None) -> None:
        """Decode one chunk (``what``: how its records are numbered, default the accumulator's)."""
        if self.decoder.mapping is None and chunk.source not in self._samples and len(self._samples) < 20:
            self._samples[chunk.source] = chunk.records[:_HINT_SAMPLE]
        out = self.decoder.decode(chunk.records, _Origins(chunk, what or self.what))
        for r in out.rejected:
            self.reasons[r.reason] = self.reasons.get(r.reason, 0) + 1
        if out.rejected and self.first_bad is None:
            r = out.rejected[0]
            self.first_bad = _Bad(chunk.source, int(chunk.numbers[r.index]), r, what or self.what)
        self.invalid += len(out.rejected)
        for m, mb in out.models.items():
            mb.index = mb.index + self.total
            self._parts.setdefault(m, []).append(mb)
        self.total += len(chunk.records)

    def add_all(self, chunks: Iterable[Chunk], what: str | None = None) -> None:
        for c in chunks:
            self.add(c, what)

    def dataset(self, name: str, model: str | None, skip_invalid: bool) -> Dataset:
        """The labeled dataset of one model (``model=None``: the only one), or :class:`InputError`."""
        self.decoder.finish()  # a mapped path that matched none of a short input: one line, not per-record errors
        if self.total == 0:
            raise InputError(f"{name}: empty input, no events")
        if self.first_bad is not None and not skip_invalid:
            b = self.first_bad
            more = f" (and {self.invalid - 1} more invalid {self.what}s)" if self.invalid > 1 else ""
            raise InputError(f"{b.source}: {b.what} {b.number}: {b.rejection.reason}: {b.rejection.detail}{more}"
                             f"{self._hint()}")
        models = {}
        for m in list(self._parts):  # one model at a time, its chunks released as it is concatenated
            models[m] = _concat(self._parts.pop(m), self.decoder.models.get(m, 2) if m else 2)
        chosen = _choose_model(name, models, model)
        return _labeled_dataset(name, models, chosen, dict(self.reasons) if self.first_bad is not None else {})


    def _hint(self) -> str:
        """Where most records are refused and no mapping was given, the records are probably of another shape:
        the ``--map`` options proposed from the records seen (:mod:`calmon.events.suggest`), and where to go on."""
        b = self.first_bad
        if self.decoder.mapping is not None or self.invalid * 2 <= self.total or b is None \
                or b.rejection.reason not in ("missing_field", "bad_type", "unknown_type", "bad_timestamp"):
            return ""
        inputs = " ".join(self._samples)
        try:
            samples = [(name, [_json(r) for r in recs]) for name, recs in self._samples.items()]
            options = suggest_mapping(samples).map_options()
        except (ValueError, TypeError):  # a hint never replaces the error it completes
            return (f"; records of your own shape? map them with --schema FILE or --map FIELD=PATH (`calmon schema "
                    f"suggest {inputs}` proposes a schema file)")
        maps = " ".join(f"--map '{o}'" if set(o) & set(" {}[]") else f"--map {o}" for o in options)
        return (f"; records of your own shape? these look like: {maps} (`calmon schema suggest {inputs} -o "
                "schema.yaml` writes it as a schema file with its evidence, for --schema)")


def _json(record: bytes) -> Any:
    """A sampled record as an object (anything else is no evidence of a shape)."""
    try:
        return _decode_json(record)
    except (msgspec.DecodeError, RecursionError):
        return None


def _concat(parts: list[ModelBatch], classes: int) -> ModelBatch:
    """One model's events of every chunk; events decoded before its classes were known get NaN probs.

    Field by field, each field's chunk arrays released once copied: the peak is the events plus one
    column, not twice the events.
    """
    if len(parts) == 1 and parts[0].classes == classes:
        return parts[0]
    empty = np.zeros(0)

    def take(name: str) -> np.ndarray:
        arrays = [getattr(p, name) for p in parts]
        for p in parts:
            setattr(p, name, empty)
        return np.concatenate(arrays)

    score = probs = None
    if classes == 2:
        for p in parts:
            if p.score is None:
                p.score = np.full(len(p), np.nan)
        score = take("score")
    else:
        for p in parts:
            if p.probs is None or p.classes != classes:
                p.probs = np.full((len(p), classes), np.nan)
        probs = take("probs")
    return ModelBatch(parts[0].model, classes, take("kind"), take("ids"), take("ts"), take("segment"), take("label"),
                      score, probs, take("index"))


def _choose_model(name: str, models: dict[str, ModelBatch], model: str | None) -> str:
    names = sorted(m for m in models if m)
    if model is None:
        if len(names) > 1:
            listed = ", ".join(names[:5])
            raise InputError(f"{name}: events of {len(names)} models ({listed}); choose one with --model")
        if not names:
            raise InputError(f"{name}: no prediction or labeled events")
        model = names[0]
    if model not in models:
        raise InputError(f"{name}: no events of model {model!r} (models: {', '.join(names[:5])})")
    return model


def _join(models: dict[str, ModelBatch], model: str) -> tuple[JoinedBatch | None, int]:
    """The model's predictions joined with outcomes (with or without the model), and the orphan count.

    One batch and no time limit, so event times do not matter (NaN ones are set to 0 because the
    joiner compares them); predictions and outcomes may come in either order.
    """
    groups = {m: models[m] for m in (model, "") if m in models}
    groups = {m: b.select(b.kind != LABELED) for m, b in groups.items()}  # labeled events need no join
    filled = {m: replace(b, ts=np.where(np.isnan(b.ts), 0.0, b.ts)) for m, b in groups.items() if len(b)}
    joiner = Joiner(ttl=math.inf, max_pending=max(1, sum(len(b) for b in groups.values())))
    joined = joiner.process(filled).get(model)
    return joined, joiner.counters.orphans + len(joiner.early)


def _labeled_dataset(name: str, models: dict[str, ModelBatch], model: str, skipped: dict[str, int]) -> Dataset:
    """Labeled events in record order, then joined predictions in the order of the predictions."""
    mb = models[model]
    k = mb.classes
    is_lab = mb.kind == LABELED
    lab = mb if is_lab.all() else mb.select(is_lab)  # (labeled events only: no copy)
    pred = mb.select(mb.kind == PREDICTION)
    joined, orphans = _join(models, model)
    pairs = _in_prediction_order(joined, pred) if joined is not None else None
    n_joined = 0 if pairs is None else len(pairs.label)
    if pairs is not None and (pairs.label >= k).any():
        bad = int(np.flatnonzero(pairs.label >= k)[0])
        raise InputError(f"{name}: outcome for id {pairs.ids[bad]!r}: label must be < {k}")
    unjoined = len(pred) - n_joined
    if len(lab) + n_joined == 0:
        raise InputError(f"{name}: no labeled events (predictions without outcomes: {unjoined})")
    labels = lab.label if pairs is None else np.concatenate([lab.label, pairs.label])
    ids = lab.ids if pairs is None else np.concatenate([lab.ids, pairs.ids])
    ts = lab.ts if pairs is None else np.concatenate([lab.ts, pairs.ts])
    if k == 2:
        z = _stack(lab.score, None if pairs is None else pairs.score)
        return Dataset(name, 2, z, labels.astype(np.float64), ids=ids, ts=ts, model=model, joined=n_joined,
                       unjoined_predictions=unjoined, orphan_outcomes=orphans, skipped=skipped)
    probs = _stack(lab.probs, None if pairs is None else pairs.probs)
    top = probs.argmax(axis=1)
    return Dataset(name, k, probs[np.arange(len(probs)), top], (top == labels).astype(np.float64), probs=probs,
                   labels=labels, ids=ids, ts=ts, model=model, joined=n_joined, unjoined_predictions=unjoined,
                   orphan_outcomes=orphans,
                   skipped=skipped)


@dataclass
class _Pairs:
    label: np.ndarray
    ids: np.ndarray
    ts: np.ndarray
    score: np.ndarray | None
    probs: np.ndarray | None


def _in_prediction_order(joined: JoinedBatch, pred: ModelBatch) -> _Pairs:
    """Reorder joined pairs (completed in outcome order) into the record order of their predictions."""
    first: dict[str, int] = {}
    for i, key in enumerate(pred.ids.tolist()):
        first.setdefault(key, i)
    assert joined.ids is not None
    order = np.argsort([first[key] for key in joined.ids.tolist()], kind="stable")
    return _Pairs(joined.label[order], joined.ids[order], joined.ts[order],
                  None if joined.score is None else joined.score[order],
                  None if joined.probs is None else joined.probs[order])


def _stack(a: np.ndarray | None, b: np.ndarray | None) -> np.ndarray:
    parts = [x for x in (a, b) if x is not None]
    return np.concatenate(parts) if parts else np.zeros(0)
