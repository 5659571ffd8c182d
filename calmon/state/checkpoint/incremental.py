"""Incremental checkpoints of the agent: capture what changed under the lock, write it on a writer thread.

Design
------
A generation is a manifest (:mod:`calmon.state.checkpoint.store`) holding the small documents inline --
source and dead-letter positions, counters, decoder state, the join buffers, change detectors,
alert states, calibrators -- and, for every ring of every model, the ring's document in which
each bucket is a blob reference into a pack file (:mod:`calmon.state.checkpoint.packs`).  Only the
buckets whose version (:meth:`calmon.state.windows.TieredRing.entries`) changed since the last
*committed* generation are written, into this generation's pack; the others keep their
reference.  A ring whose :attr:`~calmon.state.windows.TieredRing.version` did not move reuses its
whole document.

:meth:`Checkpointer.capture` runs on the ingestion thread, between two batches (so the state holds
exactly the records up to the positions taken with it).  It copies the join buffers (dict copies:
the entries are immutable tuples) and the small documents, and *freezes* the dirty buckets
instead of copying them (copy-on-write, :meth:`calmon.state.buckets.BucketStats.freeze`): a
frozen bucket keeps its content until the writer has serialised it, and if ingestion is about to
change it first, it copies the claimed content into the slot just before (:meth:`Slot.thaw`) --
so a capture costs a pointer and a version comparison per dirty bucket, and a copy is made only
for a bucket that changes while its checkpoint is being written.  The capture holds
``AgentState.lock`` in slices of at most :data:`SLICE_SECONDS`, releasing it in between so that
scrapes and evaluation rounds never wait long: the ingestion thread is the only writer of the
state and it is busy capturing, so the slices still see the state between the same two batches
(the other threads only read).  Ingestion itself waits for the whole capture (the join buffers are
copied in one hold: a C-level dict copy, ~20 ms per million entries).
:meth:`Checkpointer.submit` then serialises the frozen buckets (or their copies) as packed
documents (:meth:`~calmon.state.buckets.BucketStats.to_packed`), writes the pack, then the
manifest (the commit point), and prunes, on a writer thread; at most one checkpoint is in flight.
If the write fails every claim is released (the previous generation stays on disk).  The caller
commits source offsets (Kafka ``Committable``) only after the manifest is durable
(:meth:`Checkpointer.poll` / :meth:`Checkpointer.wait` return the result on the ingestion thread).
The committed ring documents are remembered (:attr:`Checkpointer.known`), so the next capture
compares versions against them; after a restart :meth:`Checkpointer.adopt`
rebuilds them from the loaded manifest, so the first checkpoint after a restart is incremental too.

Packs fill with dead blobs as buckets are rewritten.  A pack whose live blobs (referenced by the
newest manifest) fall below half its size has them rewritten into later generations (at most
:data:`COMPACT_PER_GENERATION` per generation, re-copied like dirty buckets), so the directory
holds at most about twice the live state plus the last ``keep`` generations' packs, and the cost
of compaction is amortised by the writes that made the garbage.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from calmon.state.checkpoint.packs import PackReader, is_ref, pack_path
from calmon.state.checkpoint.store import CheckpointStore, encode, inline_refs

if TYPE_CHECKING:
    from calmon.state.buckets import BucketStats, ModelWindows
    from calmon.state.join import Joiner
    from calmon.state.windows import TieredRing
__all__ = ["Checkpointer", "CheckpointedState", "Capture", "Result", "COMPACT_PER_GENERATION", "copy_joiner",
           "resolver"]


class CheckpointedState(Protocol):
    """What a checkpoint reads of the agent's state (:class:`~calmon.state.agentstate.AgentState` is one): its
    lock, its models' windows, and its small documents."""

    lock: Any
    models: dict[str, ModelWindows]

    def to_doc(self, models: Callable[[dict[str, ModelWindows]], Any] | None = None,
               join: Callable[[Joiner], Any] | None = None) -> dict[str, Any]: ...


log = logging.getLogger(__name__)

#: Buckets of sparse packs re-copied per generation at most (bounds the extra lock hold of compaction).
COMPACT_PER_GENERATION = 128
#: A pack is compacted when its live blobs hold less than this fraction of its bytes.
COMPACT_BELOW = 0.5
#: Longest hold of the state lock by one slice of a capture (the lock is released between slices).
SLICE_SECONDS = 0.02

T = TypeVar("T")
RingKey = tuple[str, str]  #: (model, segment)
BucketKey = tuple[int, float]  #: (tier, start) as in TieredRing.entries


class Slot(dict[str, Any]):
    """A bucket's blob reference in a ring document (a JSON object, filled by the writer).

    Until the writer has serialised it, the slot holds the ring's own bucket (``source``, frozen:
    see :meth:`calmon.state.buckets.BucketStats.freeze`) -- or, when ingestion changed that bucket
    first, the copy of the captured content it took just before (``state``).  ``guard`` (one lock
    per capture) orders the two: the writer serialises under it, :meth:`thaw` copies under it.
    """

    __slots__ = ("source", "state", "guard")

    def __init__(self, source: BucketStats, guard: threading.Lock) -> None:
        super().__init__()
        self.source: BucketStats | None = source
        self.state: BucketStats | None = None
        self.guard = guard

    def freeze(self) -> None:
        """Claim the bucket's current content (under the state lock)."""
        assert self.source is not None
        self.source.freeze(self)

    def thaw(self, bucket: BucketStats) -> None:
        """The bucket is about to change (ingestion, under the state lock): copy it unless already written."""
        with self.guard:
            if self.source is bucket:
                self.state, self.source = bucket.copy(), None

    def serialise(self) -> bytes:
        """The claimed content as a packed bucket document (on the writer thread, without the state lock)."""
        with self.guard:
            bucket = self.state if self.state is not None else self.source
            assert bucket is not None
            raw = bucket.packed_json()  # restored and untouched: its bytes as read
            data = raw if raw is not None else encode(bucket.to_packed())
            self.abandon()
        return data

    def abandon(self) -> None:
        """Drop the claim (written, or the write failed) and the copy."""
        if self.source is not None:
            self.source.release(self)
        self.source = self.state = None


class _Slices:
    """Run work under a lock in slices of at most :data:`SLICE_SECONDS`, releasing it in between.

    Between two slices the scheduler and the HTTP threads may take the lock; they only read (a
    read may fold a bucket's buffered updates into it, which does not change its content), and the
    ingestion thread -- the only writer -- is the one running the slices, so the state captured
    across slices is still the state between the same two batches.
    """

    def __init__(self, lock: Any) -> None:
        self.lock = lock
        self.longest = 0.0

    @contextmanager
    def hold(self) -> Iterator[None]:
        t = time.perf_counter()
        with self.lock:
            yield
            self.longest = max(self.longest, time.perf_counter() - t)

    def run(self, items: Sequence[T], fn: Callable[[T], Any]) -> None:
        i = 0
        while i < len(items):
            with self.hold():
                t = time.perf_counter()
                while i < len(items):
                    fn(items[i])
                    i += 1
                    if time.perf_counter() - t > SLICE_SECONDS:
                        break


@dataclass
class RingRecord:
    """A ring as last captured: its object, version, document (buckets as slots) and per-bucket slots."""

    ring: TieredRing[Any]
    version: int
    doc: dict[str, Any]
    refs: dict[BucketKey, tuple[int, dict[str, Any]]]  #: (tier, start) -> (bucket version, slot or reference)


@dataclass
class Capture:
    """What :meth:`Checkpointer.capture` took under the lock; serialised and written by the writer."""

    doc: dict[str, Any]
    dirty: list[Slot]  #: the buckets to write, frozen (copy-on-write)
    records: dict[RingKey, RingRecord]
    positions: dict[str, Any]
    lock_seconds: float = 0.0  #: the longest single hold of the lock
    capture_seconds: float = 0.0  #: the whole capture (the ingestion thread's stall)


@dataclass
class Result:
    """A committed generation."""

    path: os.PathLike[str]
    generation: int
    blobs: int  #: buckets written into this generation's pack
    bytes: int  #: pack + manifest bytes written
    lock_seconds: float  #: the longest hold of the lock by the capture
    capture_seconds: float  #: the whole capture (ingestion waits for it)
    seconds: float  #: capture to commit
    positions: dict[str, Any] = field(default_factory=dict)  #: the sources' positions it holds


class Checkpointer:
    """Incremental, off-lock checkpoints of an :class:`~calmon.state.agentstate.AgentState` into a store.

    Parameters
    ----------
    store
        Where generations go.

    Examples
    --------
    >>> import tempfile, numpy as np
    >>> from calmon.state.agentstate import AgentState
    >>> from calmon.config import build_config
    >>> st = AgentState(build_config({"sources": [{"path": "x.jsonl"}]}, env={}))
    >>> ck = Checkpointer(CheckpointStore(tempfile.mkdtemp()))
    >>> st.windows_of("m", 2).add(np.array([10.0]), np.array(["web"], dtype=object), np.array([1]),
    ...                           np.array([0.8]), None, 10.0)
    >>> ck.submit(ck.capture(st, {"sources": {}}))
    >>> ck.wait().blobs  # the new bucket of ring "all" (segment "web" is not allow-listed)
    1
    >>> ck.submit(ck.capture(st, {"sources": {}}))
    >>> ck.wait().blobs  # nothing changed
    0
    """

    def __init__(self, store: CheckpointStore) -> None:
        self.store = store
        #: Ring documents of the last committed generation (replaced by the writer on commit).
        self.known: dict[RingKey, RingRecord] = {}
        self._rewrite: dict[RingKey, set[BucketKey]] = {}
        self._thread: threading.Thread | None = None
        self._outcome: Result | BaseException | None = None

    @property
    def busy(self) -> bool:
        """A checkpoint is being written."""
        return self._thread is not None

    # -- under the lock ---------------------------------------------------------------------------
    def capture(self, state: CheckpointedState, extra: dict[str, Any]) -> Capture:
        """Copy what changed since the last committed generation (takes ``state.lock``).

        Parameters
        ----------
        state
            The agent's state (call on the ingestion thread, between batches).
        extra
            Documents added to the manifest as they are (positions, alert states, calibrators).
            ``extra["sources"]`` is returned in :attr:`Result.positions` for the offset commit.
        """
        if self.busy:
            raise RuntimeError("a checkpoint is still being written (at most one in flight)")
        dirty: list[Slot] = []
        records: dict[RingKey, RingRecord] = {}
        t0 = time.perf_counter()
        slices = _Slices(state.lock)
        with slices.hold():
            doc = state.to_doc(models=list, join=copy_joiner)  # the small documents; model names only
        budget = [COMPACT_PER_GENERATION]
        models: dict[str, Any] = {}
        guard = threading.Lock()
        slices.run(doc["models"], lambda name: self._model(name, state.models[name], dirty, records, budget, models,
                                                           guard))
        slices.run(dirty, Slot.freeze)
        doc["models"] = models
        return Capture({**extra, **doc}, dirty, records, dict(extra.get("sources") or {}), slices.longest,
                       time.perf_counter() - t0)

    def _model(self, name: str, mw: ModelWindows, dirty: list[Slot], records: dict[RingKey, RingRecord],
               budget: list[int], out: dict[str, Any], guard: threading.Lock) -> None:
        """Capture one model's rings: unchanged rings reuse their document, changed ones mark dirty buckets."""
        rings: dict[str, Any] = {}
        for seg, ring in mw.rings.items():
            key = (name, seg)
            rec = self.known.get(key)
            if rec is not None and rec.ring is not ring:
                rec = None
            redo = self._take_rewrite(key, budget)
            if rec is None or rec.version != ring.version or redo:
                rec = _capture_ring(ring, rec, redo, dirty, guard)
            records[key] = rec
            rings[seg] = rec.doc
        out[name] = {"name": mw.name, "params": dict(mw.params), "tiers": [list(t) for t in mw.tiers],
                     "segments": list(mw.segments), "rings": rings}

    def _take_rewrite(self, key: RingKey, budget: list[int]) -> set[BucketKey]:
        want = self._rewrite.get(key)
        if not want or budget[0] <= 0:
            return set()
        take = set(list(want)[:budget[0]])
        budget[0] -= len(take)
        want -= take
        if not want:
            del self._rewrite[key]
        return take

    # -- on the writer thread ---------------------------------------------------------------------
    def submit(self, cap: Capture) -> None:
        """Write ``cap`` on a writer thread (see :meth:`poll` and :meth:`wait` for the outcome)."""
        if self.busy:
            raise RuntimeError("a checkpoint is still being written (at most one in flight)")
        self._outcome = None
        self._thread = threading.Thread(target=self._run, args=(cap,), name="calmon-checkpoint", daemon=True)
        self._thread.start()

    def _run(self, cap: Capture) -> None:
        try:
            self._outcome = self.write(cap)
        except BaseException as exc:  # noqa: BLE001 - handed to the ingestion thread, which re-raises it
            self._outcome = exc

    def write(self, cap: Capture) -> Result:
        """Serialise the captured copies, write the pack, then the manifest; remember what was committed."""
        t0 = time.perf_counter()
        store = self.store
        gen = store.next_generation()
        pack = store.open_pack(gen)
        try:
            for slot in cap.dirty:
                slot.update(pack.append(slot.serialise()))
            has_pack = pack.commit()
        except BaseException:
            pack.abort()
            for slot in cap.dirty:  # nothing of this generation will be committed: release every claim
                slot.abandon()
            raise
        join = cap.doc.get("join")
        if join is not None and not isinstance(join, dict):  # the joiner's copy (see copy_joiner)
            cap.doc["join"] = join.to_dict()
        live, rewrite = _plan(cap.records, store, gen)
        body = encode(cap.doc)
        path = store.save(cap.doc, generation=gen, packs=live, state=body)
        self.known, self._rewrite = cap.records, rewrite
        return Result(path, gen, len(cap.dirty), (pack.size if has_pack else 0) + len(body), cap.lock_seconds,
                      cap.capture_seconds, cap.capture_seconds + time.perf_counter() - t0, cap.positions)

    def poll(self) -> Result | None:
        """The finished checkpoint's result (once), None while one is running or none was submitted.

        Raises the writer's exception if it failed (the state on disk is then the previous generation).
        """
        if self._thread is None or self._thread.is_alive():
            return None
        return self._collect()

    def wait(self, timeout: float | None = None) -> Result | None:
        """Wait for the checkpoint in flight (if any) and return :meth:`poll`'s result."""
        if self._thread is not None:
            self._thread.join(timeout)
        return self.poll()

    def _collect(self) -> Result | None:
        self._thread = None
        out, self._outcome = self._outcome, None
        if isinstance(out, BaseException):
            raise out
        return out

    # -- after a restore --------------------------------------------------------------------------
    def adopt(self, state: CheckpointedState, doc: dict[str, Any]) -> None:
        """Remember the restored rings as committed (``doc``: the manifest state they were loaded from).

        A ring whose document has no blob references (a version-1 checkpoint) is left out: its
        buckets are all written by the next generation.
        """
        known: dict[RingKey, RingRecord] = {}
        for name, mw in state.models.items():
            rings = (doc.get("models") or {}).get(name, {}).get("rings", {})
            for seg, ring in mw.rings.items():
                rec = _adopt_ring(ring, rings.get(seg))
                if rec is not None:
                    known[(name, seg)] = rec
        self.known, self._rewrite = known, {}


def copy_joiner(joiner: Joiner) -> Joiner:
    """A copy of the join state for a checkpoint: buffer entries are immutable tuples, so copying the two
    dicts is enough (``to_dict`` of the copy runs on the writer thread).  One ``dict`` copy is a C-level
    copy of the table (~20 ms per million entries): far cheaper in total than copying in slices."""
    import copy

    from calmon.state.join import JoinCounters
    out = copy.copy(joiner)
    out.pending, out.early, out.classes = dict(joiner.pending), dict(joiner.early), dict(joiner.classes)
    out.counters = JoinCounters.from_dict(joiner.counters.to_dict())
    out.source_times, out.untimed, out.delays = dict(joiner.source_times), set(joiner.untimed), joiner.delays.copy()
    return out


def resolver(reader: PackReader) -> Callable[[str, Any], Any]:
    """``resolve(field, node)``: ``node`` with its blob references read through ``reader`` (for ``load_doc``).

    The blobs come back as their bytes (CRC checked): :meth:`calmon.state.buckets.BucketStats.load`
    keeps a packed bucket as it is until first use and parses any other.
    """
    return lambda fld, node: inline_refs(node, reader, fld, raw=True)


def _capture_ring(ring: TieredRing[Any], rec: RingRecord | None, redo: set[BucketKey],
                  dirty: list[Slot], guard: threading.Lock) -> RingRecord:
    old = rec.refs if rec is not None else {}
    by_id: dict[int, dict[str, Any]] = {}
    refs: dict[BucketKey, tuple[int, dict[str, Any]]] = {}
    for tier, start, version, st in ring.entries():
        prev = old.get((tier, start))
        slot: dict[str, Any]
        if prev is not None and prev[0] == version and (tier, start) not in redo:
            slot = prev[1]
        else:
            new = Slot(st, guard)
            dirty.append(new)
            slot = new
        by_id[id(st)] = slot
        refs[(tier, start)] = (version, slot)

    def dump(s: Any) -> dict[str, Any]:
        got = by_id.get(id(s))
        if got is None:  # a state the ring serialises but does not list in entries(): written every time
            got = Slot(s, guard)
            dirty.append(got)
        return got

    return RingRecord(ring, ring.version, ring.to_dict(dump), refs)


class _Mark:
    __slots__ = ("state",)

    def __init__(self, state: Any) -> None:
        self.state = state


def _adopt_ring(ring: TieredRing[Any], doc: Any) -> RingRecord | None:
    """Pair the restored ring's buckets with the references of the document they were loaded from."""
    if not isinstance(doc, dict):
        return None
    ids: dict[int, dict[str, Any]] = {}
    _pair(doc, ring.to_dict(_Mark), ids)
    refs: dict[BucketKey, tuple[int, dict[str, Any]]] = {}
    for tier, start, version, st in ring.entries():
        ref = ids.get(id(st))
        if ref is None:
            return None
        refs[(tier, start)] = (version, ref)
    return RingRecord(ring, ring.version, doc, refs)


def _pair(doc: Any, marked: Any, out: dict[int, dict[str, Any]]) -> None:
    if isinstance(marked, _Mark):
        if is_ref(doc):
            out[id(marked.state)] = doc
    elif isinstance(marked, dict) and isinstance(doc, dict):
        for k, v in marked.items():
            if k in doc:
                _pair(doc[k], v, out)
    elif isinstance(marked, list) and isinstance(doc, list) and len(doc) == len(marked):
        for a, b in zip(doc, marked):
            _pair(a, b, out)


def _plan(records: dict[RingKey, RingRecord], store: CheckpointStore,
          gen: int) -> tuple[set[int], dict[RingKey, set[BucketKey]]]:
    """Packs the manifest refers to, and the buckets of sparse older packs to rewrite later."""
    live: dict[int, int] = {}
    for rec in records.values():
        for _, ref in rec.refs.values():
            p = ref["pack"]
            live[p] = live.get(p, 0) + ref["len"]
    sparse = set()
    for p, n in live.items():
        if p == gen:
            continue
        try:
            size = os.stat(pack_path(store.directory, p)).st_size
        except OSError:
            continue
        if n < COMPACT_BELOW * size:
            sparse.add(p)
    rewrite: dict[RingKey, set[BucketKey]] = {}
    if sparse:
        for key, rec in records.items():
            todo = {bk for bk, (_, ref) in rec.refs.items() if ref["pack"] in sparse}
            if todo:
                rewrite[key] = todo
    return set(live), rewrite
