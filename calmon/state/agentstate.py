"""The agent's ingestion state: windowed statistics, join buffers, change detectors, decoder state and counters.

Locking rule
------------
One lock, :attr:`AgentState.lock`, guards every attribute of this object that another thread
reads: ``models``, ``joiner``, ``counters``, ``changes`` and ``sources``.  The ingestion thread holds it while
it applies a decoded batch (milliseconds); the scheduler holds it only inside :meth:`snapshot`
(window sums, then it works on its private copy); the views hold it only to copy counters.
``decoder`` is used by the ingestion thread alone (decode runs outside the lock) and needs none.
Evaluation results never live here: the scheduler publishes them as one immutable
:class:`~calmon.agent.views.Published` object (see :mod:`calmon.agent.views`).
"""

from __future__ import annotations

import gc
import logging
import math
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

from calmon.config import Config
from calmon.events.decoder import Decoder
from calmon.formats.collection import collection_paused
from calmon.state.buckets import BucketStats, ModelWindows
from calmon.state.checkpoint.schema import SchemaError, validate_checkpoint
from calmon.state.counters import Counters, SourceInfo
from calmon.state.delays import JoinAdvisor
from calmon.state.join import Joiner
from calmon.state.monitors import ChangeMonitor
from calmon.state.windows import RingSums, capture

__all__ = ["AgentState", "WindowSnapshot", "StateError", "StateLock"]

_log = logging.getLogger("calmon.agent")


class StateLock:
    """The state's re-entrant lock, holding off the cyclic garbage collector while it is held.

    A full collection traverses every tracked object of the process -- about eight per bucket, a
    million at a thousand models -- and takes a second or more on two busy cores; triggered by an
    allocation made under the lock (a checkpoint's bucket copies, a snapshot's ring copies, a batch)
    it made every other thread wait that long.  So automatic collection is disabled while the lock is
    held and re-enabled by the outermost release: a collection that fell due runs at the next
    allocation, outside the lock.  Holds are milliseconds, so the garbage deferred is small; if
    collection was already disabled (by the application) it is left alone.

    Examples
    --------
    >>> import gc
    >>> lock = StateLock()
    >>> with lock:
    ...     with lock:
    ...         inside = gc.isenabled()
    >>> inside, gc.isenabled()
    (False, True)
    """

    __slots__ = ("_lock", "_depth", "_restore")

    def __init__(self) -> None:
        self._lock = threading.RLock()
        self._depth = 0  # re-entrant holds of the owner (only the owner changes it)
        self._restore = False

    def acquire(self, blocking: bool = True, timeout: float = -1) -> bool:
        if not self._lock.acquire(blocking, timeout):
            return False
        self._depth += 1
        if self._depth == 1:
            self._restore = gc.isenabled()
            if self._restore:
                gc.disable()
        return True

    def release(self) -> None:
        if self._depth <= 0:
            raise RuntimeError("cannot release un-acquired lock")
        self._depth -= 1
        if self._depth == 0 and self._restore:
            self._restore = False
            gc.enable()
        self._lock.release()

    def __enter__(self) -> bool:
        return self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()


class StateError(ValueError):
    """A checkpoint does not fit the configuration (one line naming the key)."""


@dataclass(frozen=True)
class WindowSnapshot:
    """The summed statistics of one (model, segment, window), owned by whoever took the snapshot."""

    model: str
    segment: str
    window: str
    bucket: BucketStats
    #: ``(ring version, start of the newest tier-0 bucket)``: equal stamps, equal sums (``None``: unknown).
    stamp: tuple[int, float] | None = None


#: A ring (the object: a restore replaces it), its stamp, its window sums at that stamp and the stable
#: sums kept for the next snapshot (:mod:`calmon.state.windows`).
_RingSums = tuple[Any, "tuple[int, float] | None", dict[str, BucketStats], "RingSums | None"]


class AgentState:
    """Everything ingestion builds and a checkpoint must hold (see the module docstring for the lock).

    Parameters
    ----------
    cfg
        Validated configuration (tiers, models, limits, join settings).

    Examples
    --------
    >>> import numpy as np
    >>> from calmon.config import build_config
    >>> st = AgentState(build_config({"sources": [{"path": "x.jsonl"}]}, env={}))
    >>> mw = st.windows_of("m", 2)
    >>> mw.add(np.array([10.0]), np.array(["web"], dtype=object), np.array([1]), np.array([0.8]), None, 10.0)
    >>> [(s.model, s.segment, s.window, s.bucket.count) for s in st.snapshot()][:2]
    [('m', 'all', '1h', 1), ('m', 'all', '24h', 1)]
    """

    def __init__(self, cfg: Config) -> None:
        self.cfg = cfg
        self.lock = StateLock()
        self.windows = cfg.windows.window_seconds()
        self.tiers = [(float(t.width), int(t.count)) for t in cfg.windows.tiers]
        declared = {n: m.classes for n, m in cfg.models.items() if n != "default" and m.classes}
        lim = cfg.limits
        self.decoder = Decoder(models=declared, max_models=lim.max_models, max_segments=lim.max_segments,
                               discover=cfg.accept_unknown_models, max_classes=lim.max_classes,
                               max_record_bytes=lim.max_record_bytes, max_id_bytes=lim.max_id_bytes,
                               future_skew=float(lim.future_skew), past_horizon=float(lim.past_horizon))
        #: per source with a ``schema``: a decoder of its record shape sharing ``decoder``'s state (issue #16)
        self.decoders = build_decoders(cfg, self.decoder)
        self.joiner = Joiner(cfg.join.ttl, cfg.join.max_pending, cfg.limits.max_join_bytes)
        #: The rate-limited "join.ttl too short" warning (not checkpointed: a restart may say it once more).
        self.join_advisor = JoinAdvisor(lambda msg: _log.warning("%s", msg))
        self.models: dict[str, ModelWindows] = {}
        self.counters = Counters()
        #: Per-model change detectors on the calibration stream (checkpointed like the windows).
        self.changes = ChangeMonitor(cfg.changes)
        self.sources: dict[str, SourceInfo] = {}
        #: The scheduler's previous sums per ring, reused by :meth:`snapshot` while a ring is unchanged.
        self._snap_cache: dict[tuple[str, str], _RingSums] = {}

    def decoder_for(self, source: str) -> Decoder:
        """The decoder of a source's records (its schema mapping's, else the canonical one)."""
        return self.decoders.get(source, self.decoder)

    @property
    def watermark(self) -> float | None:
        """Newest event time seen (``None`` before the first event)."""
        wm = self.joiner.watermark
        return None if wm == -math.inf else wm

    def windows_of(self, name: str, classes: int) -> ModelWindows:
        """The rings of model ``name``, created on its first labeled event (call under the lock)."""
        mw = self.models.get(name)
        if mw is None:
            m = self.cfg.model(name)
            mw = self.models[name] = ModelWindows(
                name, classes, self.tiers, m.segments, bins=m.bins, reservoir=m.reservoir,
                levelset_lambda=m.levelset_lambda, reliability_bins=self.cfg.evaluation.reliability_bins)
        return mw

    def source(self, name: str) -> SourceInfo:
        info = self.sources.get(name)
        if info is None:
            info = self.sources[name] = SourceInfo()
        return info

    def snapshot(self) -> list[WindowSnapshot]:
        """Window sums of every (model, segment, window), in model order, taking the lock one ring at a time.

        Under the lock, one ring at a time, :func:`~calmon.state.windows.capture` copies the buckets
        the ring's sums will read -- the ones new events land in, and those whose window changed since
        the previous snapshot -- and the sums are merged from the copies after the lock is released, so
        a snapshot is consistent *per ring*: every window of one (model, segment) reflects the same
        batches, two rings may differ by the batches ingested in between.  A ring whose ``version``
        and window bounds did not change since the previous snapshot is not summed again: its previous
        sums are reused (they are never mutated, see :class:`WindowSnapshot`), and
        :attr:`WindowSnapshot.stamp` tells the evaluator so; a ring that changed reuses the sums of its
        unchanged buckets (:mod:`calmon.state.windows`).  Called by one thread (the scheduler); the
        reuse cache is that thread's.

        Automatic garbage collection is paused meanwhile
        (:func:`~calmon.formats.collection.collection_paused`): the sums allocate a
        few tracked objects per bucket, nearly all freed by reference counting within the ring, and
        collections triggered on the way traversed the whole state (a full one per snapshot at a thousand
        models, about a fifth of its time) and promoted those short-lived copies, bringing the next on.
        """
        with collection_paused():
            return self._snapshot()

    def _snapshot(self) -> list[WindowSnapshot]:
        """:meth:`snapshot`'s work (the collector paused by the caller)."""
        with self.lock:
            wm = self.joiner.watermark
            rings = [(name, seg, ring) for name in sorted(self.models) for seg, ring in self.models[name].rings.items()]
        w0 = self.tiers[0][0]
        cache = self._snap_cache
        fresh: dict[tuple[str, str], _RingSums] = {}
        out: list[WindowSnapshot] = []
        for name, seg, ring in rings:
            hit = cache.get((name, seg))
            kept = hit[3] if hit is not None and hit[0] is ring else None
            with self.lock:
                end = max(wm, ring.watermark)
                cur = math.floor(end / w0) * w0 if end > -math.inf else 0.0
                version = getattr(ring, "version", None)  # TieredRing.version: +1 on every mutation
                stamp = None if version is None else (int(version), cur)
                reuse = stamp is not None and hit is not None and hit[0] is ring and hit[1] == stamp
                # copying a bucket is a few array copies, merging it (reservoir sampling) far more: copy what
                # the sums read under the lock (only merged from: no reservoir generator), sum after releasing it
                plan = None if reuse else capture(ring, self.windows, wm, kept, BucketStats.read_copy)
            if plan is None:
                assert hit is not None
                sums, kept = hit[2], hit[3]
            else:
                sums, kept = plan.run()
            fresh[(name, seg)] = (ring, stamp, sums, kept)
            out.extend(WindowSnapshot(name, seg, w, sums[w], stamp) for w in self.windows)
        self._snap_cache = fresh
        return out

    def change_view(self) -> tuple[dict[str, dict[str, Any]], float | None]:
        """The change detectors' view (model -> events, per-signal detections) and the watermark, under the lock."""
        with self.lock:
            return self.changes.view(), self.watermark

    def nbytes(self) -> dict[str, int]:
        with self.lock:
            return {name: mw.nbytes() for name, mw in self.models.items()}

    # -- checkpoint ----------------------------------------------------------------------------
    def to_doc(self, models: Callable[[dict[str, ModelWindows]], Any] | None = None,
               join: Callable[[Joiner], Any] | None = None) -> dict[str, Any]:
        """The checkpoint's state part (decoder, join, models, counters, change detectors), under the lock.

        Parameters
        ----------
        models, join
            How the models and the joiner are taken (default: their full documents).  The incremental
            checkpoint (:mod:`calmon.state.checkpoint.incremental`) passes functions that only copy what changed
            and serialises the copies outside the lock.
        """
        with self.lock:
            return {"decoder": self.decoder.state(),
                    "join": self.joiner.to_dict() if join is None else join(self.joiner),
                    "models": ({name: mw.to_dict() for name, mw in self.models.items()} if models is None
                               else models(self.models)),
                    "counters": self.counters.to_dict(), "changes": self.changes.to_dict()}

    def load_doc(self, doc: Mapping[str, Any], resolve: Callable[[str, Any], Any] | None = None) -> None:
        """Restore :meth:`to_doc`'s output (checked against the checkpoint schema first).

        Parameters
        ----------
        doc
            The state document (a checkpoint manifest's ``state``).
        resolve
            ``resolve(field, rings)``: the rings of one model with their blob references replaced by the
            bucket documents (see :mod:`calmon.state.checkpoint.incremental`); called one model at a time, so
            only one model's documents are in memory besides the state.

        Raises
        ------
        StateError
            One line naming the field: the document does not fit the schema, a part of it
            cannot be read, or it was written with other tiers.
        """
        try:
            validate_checkpoint(doc)
        except SchemaError as exc:
            raise StateError(str(exc)) from None
        with collection_paused():
            models = self._load_models(doc["models"], resolve)
        joiner = _read("join", lambda d: Joiner.from_dict(d, self.cfg.limits.max_join_bytes), doc["join"])
        joiner.ttl = self.cfg.join.ttl
        joiner.max_pending = self.cfg.join.max_pending
        counters = _read("counters", Counters.from_dict, doc["counters"])
        changes = ChangeMonitor(self.cfg.changes)
        _read("changes", changes.load, doc.get("changes"))
        with self.lock:
            self.changes = changes
            self.models = models
            _read("decoder", self.decoder.load_state, doc["decoder"])
            self.joiner = joiner
            self.counters = counters

    def advise_join(self, now: float, final: bool = False) -> None:
        """Log the join advice if due (:class:`~calmon.state.delays.JoinAdvisor`; ``final``: the input is
        exhausted).  Call under the lock."""
        j = self.joiner
        self.join_advisor.tick(j.ttl, j.counters.expired, j.delays, now, final)

    def _load_models(self, docs: Mapping[str, Any],
                     resolve: Callable[[str, Any], Any] | None) -> dict[str, ModelWindows]:
        """Every model's rings from the checkpoint (blob references resolved one model at a time)."""
        models = {}
        for name, md in docs.items():
            if [(float(w), int(c)) for w, c in md["tiers"]] != self.tiers:
                raise StateError(f"windows.tiers: the checkpoint in {self.cfg.state_dir} was written with tiers "
                                 f"{md['tiers']}; restore them or start with an empty state directory")
            if resolve is not None:
                try:
                    md = {**md, "rings": resolve(f"models.{name}.rings", md["rings"])}
                except ValueError as exc:  # a damaged or edited blob: the message names the pack and the field
                    raise StateError(str(exc)) from None
            models[name] = _read(f"models.{name}", ModelWindows.from_dict, md)
        return models


T = TypeVar("T")


def _read(field: str, read: Callable[[Any], T], part: Any) -> T:
    """``read(part)``, with any error of a malformed part reported as one line naming ``field``."""
    try:
        return read(part)
    except (KeyError, TypeError, ValueError, IndexError, AttributeError) as exc:
        why = f"missing key {exc}" if isinstance(exc, KeyError) else str(exc)
        raise StateError(f"field {field}: cannot be read ({type(exc).__name__}: {why})") from None


def build_decoders(cfg: Config, base: Decoder) -> dict[str, Decoder]:
    """One decoder per source with a ``schema`` (by source name), sharing ``base``'s state and limits.

    Sources without a schema use ``base`` itself. A bad mapping raises :class:`ConfigError` naming the
    key (``sources.0.schema.fields.x``).
    """
    out: dict[str, Decoder] = {}
    for i, scfg in enumerate(cfg.sources):
        mapping = scfg.mapping(f"sources.{i}")
        if mapping is not None:
            out[scfg.name] = base.for_mapping(mapping)
    return out
