"""Event-time buckets in a tiered ring; sliding windows as sums of buckets.

A :class:`TieredRing` keeps mergeable statistics (anything with ``merge(other)``, e.g.
:class:`~calmon.stats.model.ModelStats` or :class:`~calmon.stats.grid.ScoreGrid`) in
buckets of event time.  Tiers go from fine to coarse, e.g. ``[(300, 12), (3600, 24),
(86400, 7)]``: the last hour in 5-minute buckets, the day before in hours, the week before
in days.  As the watermark (newest event time) advances, a bucket that leaves its tier is
merged into the enclosing bucket of the next tier (each width is a multiple of the previous
one, so buckets nest exactly); leaving the last tier it is merged into the *archive*, so the
``all`` window (everything since the state began) is still a sum.

Given watermark ``W`` and tiers ``(w_i, c_i)``: tier 0 holds the buckets starting in
``[lo_0, cur]`` with ``cur = floor(W / w_0) w_0`` and ``lo_0 = cur - (c_0 - 1) w_0``; tier
``i > 0`` holds the buckets starting in ``[lo_i, lo_{i-1})`` with ``lo_i = floor(lo_{i-1} /
w_i) w_i - c_i w_i``.  Where a bucket lives is a function of the final watermark only, so
the state does not depend on how the stream was cut into batches.

A window of length ``L`` is the sum of the buckets starting at or after ``cur + w_0 - L``:
exact at the tier-0 granularity while ``L`` lies within tier 0, and otherwise at most one
bucket of the coarser tier shorter than ``L`` (never older data than ``L``).

Memory: at most ``sum(c_i) + len(tiers)`` buckets plus the archive exist (only buckets that
received events are allocated).

Versions (for incremental checkpoints and for skipping unchanged windows): ``ring.version`` is a
counter, monotone per ring object, increased on every mutation -- an :meth:`~TieredRing.add` that
lands events, an :meth:`~TieredRing.advance` that moves the watermark (rolling buckets into a
coarser tier or the archive, or dropping them), a restore by :meth:`~TieredRing.from_dict`.
:meth:`~TieredRing.entries` gives each bucket with the ring version at which it was last mutated,
so "what changed since version ``v``" is the buckets with a version ``> v`` plus the buckets that
disappeared (rolled away).  Reading (:meth:`~TieredRing.window_sums`) never changes a version.

Window sums, reused across snapshots where nothing changed
----------------------------------------------------------

A window's sum is a chain of merges, and the order of that chain matters: reservoirs are merged by
seeded sampling (:meth:`calmon.stats.reservoir.Reservoir.merged`), so two orders give two different
(equally valid) samples.  The order is therefore part of the definition, chosen so that the part of a
sum that new events do not touch can be kept from one snapshot to the next:

* the *hot* buckets are the tier-0 buckets starting at or after ``cur - (HOT - 1) w_0`` (``cur``: the
  newest tier-0 bucket start at the watermark) -- where live events land;
* every other bucket (and the archive) is *stable*;
* windows are taken shortest first (``None``, everything, last); the *stable chain* merges the stable
  buckets newest first into an empty state, one window after the other, and ``all`` then merges the
  archive; ``S_k`` is a copy of the chain when it has taken every stable bucket of window ``k``;
* the sum of window ``k`` is a copy of ``S_k`` into which the hot buckets of window ``k`` are merged,
  newest first.

:meth:`TieredRing.window_sums` computes exactly this from scratch.  :func:`capture` does it incrementally:
``S_k`` is kept while the stable buckets of window ``k`` (their tier, start and ring version, see
:meth:`~TieredRing.entries`) and the archive's version are unchanged, and the chain restarts from the
longest kept ``S_k`` otherwise.  Between
two snapshots of a ring that only received live events that is a copy and a merge or two per window
instead of a merge per bucket; the sums are bit for bit those of the from-scratch definition
(``tests/test_windowsums.py``).  A roll (the watermark entering a new tier-0 bucket) changes the stable
buckets of every window and costs what a from-scratch sum costs.

:func:`capture` runs under the state lock and copies only the buckets the sums will read (the hot ones
and the stable ones past the kept ``S_k``); :meth:`Plan.run` merges the copies after the lock is released.
It adds a window's buckets to ``S_{k-1}`` in one call (``summed``, e.g. :meth:`BucketStats.summed
<calmon.state.buckets.BucketStats.summed>`: one pass per grid, as integer sums do not depend on their order,
and the reservoirs merged in the order above), so it needs no copy of the chain; :meth:`Plan.run_reference`
is the copy-and-merge form, the same sums (``tests/test_windowsums_batched.py``).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from copy import deepcopy
from dataclasses import dataclass
from typing import Any, Generic, Protocol, TypeVar

import numpy as np


class Mergeable(Protocol):
    def merge(self, other: Any) -> None: ...


S = TypeVar("S", bound=Mergeable)

#: Tier (and start key) reported for the archive by :meth:`TieredRing.entries`.
ARCHIVE_TIER = -1
ARCHIVE_KEY = -math.inf


class TieredRing(Generic[S]):
    """Tiered ring of event-time buckets of mergeable statistics.

    Parameters
    ----------
    tiers
        ``[(width_seconds, count), ...]`` finest first; each width a multiple of the previous.
    factory
        Creates an empty state.
    archive
        Keep what leaves the last tier in an archive state (for the ``all`` window).

    Examples
    --------
    >>> import numpy as np
    >>> from calmon.stats.grid import ScoreGrid
    >>> ring = TieredRing([(60, 2), (600, 1)], lambda: ScoreGrid(4))
    >>> ts = np.array([0.0, 30.0, 61.0, 1300.0, 1301.0])
    >>> ring.add(ts, lambda g, i: g.update(np.full(i.size, 0.5), np.ones(i.size)))
    >>> ring.window_sum(120).count, ring.window_sum(1200).count, ring.window_sum(None).count
    (2, 2, 5)
    >>> ring.layout()
    [[1260.0], [], 'archive']
    >>> ring.version, [(t, k, v) for t, k, v, _ in ring.entries()]
    (2, [(0, 1260.0, 2), (-1, -inf, 2)])
    """

    def __init__(self, tiers: Iterable[tuple[float, int]], factory: Callable[[], S], archive: bool = True) -> None:
        self.tiers = [(float(w), int(c)) for w, c in tiers]
        if not self.tiers:
            raise ValueError("need at least one tier")
        for i, (w, c) in enumerate(self.tiers):
            if not w > 0 or c < 1:
                raise ValueError(f"tier {i}: width must be > 0 and count >= 1, got ({w}, {c})")
            if i and (w / self.tiers[i - 1][0]) % 1 != 0:
                raise ValueError(f"tier {i}: width {w} is not a multiple of {self.tiers[i - 1][0]}")
        self.factory = factory
        self.keep_archive = archive
        self.buckets: list[dict[float, S]] = [{} for _ in self.tiers]
        self.archive: S | None = None
        self.watermark = -math.inf
        #: Mutation counter (see the module docstring); bucket versions mirror ``buckets``.
        self.version = 0
        self.bucket_versions: list[dict[float, int]] = [{} for _ in self.tiers]
        self.archive_version = 0
        self._bounds_at: int | None = None  # finest bucket index of the cached bounds
        self._bounds: list[float] = []

    # -- geometry ----------------------------------------------------------------------------
    def bounds(self, watermark: float | None = None) -> list[float]:
        """Lower bucket start ``lo_i`` of each tier at ``watermark`` (default: the current one)."""
        wm = self.watermark if watermark is None else watermark
        w0, c0 = self.tiers[0]
        cell = math.floor(wm / w0) if wm > -math.inf else None
        if cell is not None and cell == self._bounds_at:  # bounds move only with the finest bucket
            return list(self._bounds)
        lo = math.floor(wm / w0) * w0 - (c0 - 1) * w0
        out = [lo]
        for w, c in self.tiers[1:]:
            lo = math.floor(lo / w) * w - c * w
            out.append(lo)
        if cell is not None:
            self._bounds_at, self._bounds = cell, list(out)
        return out

    def _target(self, key: float, tier: int, bounds: list[float]) -> tuple[int, float]:
        """Tier and bucket start where a bucket (``key``, ``tier``) belongs under ``bounds``."""
        while tier < len(self.tiers) and key < bounds[tier]:
            tier += 1
            if tier < len(self.tiers):
                w = self.tiers[tier][0]
                key = math.floor(key / w) * w
        return tier, key

    def _put(self, tier: int, key: float, state: S) -> None:
        if tier >= len(self.tiers):
            if self.keep_archive:
                if self.archive is None:
                    self.archive = state
                else:
                    _roll(self.archive, state)
                self.archive_version = self.version
            return
        have = self.buckets[tier].get(key)
        if have is None:
            self.buckets[tier][key] = state
        else:
            _roll(have, state)
        self.bucket_versions[tier][key] = self.version

    def advance(self, watermark: float, bounds: list[float] | None = None) -> None:
        """Move the watermark forward (never back) and roll buckets into coarser tiers (``bounds``: this ring's
        :meth:`bounds` at ``watermark``, when the caller has them -- the rings of a batch share them)."""
        if not watermark > self.watermark:
            return
        same = self.watermark > -math.inf and (
            math.floor(watermark / self.tiers[0][0]) == math.floor(self.watermark / self.tiers[0][0]))
        self.watermark = float(watermark)
        self.version += 1
        if same:  # still in the same finest bucket: the bounds did not move, nothing leaves its tier
            return
        if bounds is None:
            bounds = self.bounds()
        for tier in range(len(self.tiers)):
            held = self.buckets[tier]
            if not held or min(held) >= bounds[tier]:  # the common case, at C speed (once per ring and batch)
                continue
            stale = sorted(k for k in held if k < bounds[tier])
            for key in stale:
                state = self.buckets[tier].pop(key)
                del self.bucket_versions[tier][key]
                t, k = self._target(key, tier, bounds)
                self._put(t, k, state)

    # -- updates ----------------------------------------------------------------------------
    def add(self, ts: np.ndarray | None, update: Callable[[S, Any], None], watermark: float | None = None,
            groups: Sequence[tuple[int, float, Any]] | None = None, bounds: list[float] | None = None) -> None:
        """Add events at times ``ts``: ``update(state, indices)`` is called once per bucket touched.

        Parameters
        ----------
        ts
            Event times (finite), shape ``(n,)``; unused with ``groups``.
        update
            Adds the events ``indices`` (into ``ts``) to ``state``, e.g.
            ``lambda s, i: s.update(score=z[i], labels=y[i])``.
        watermark
            Watermark after these events (default ``max(ts)``); the ring rolls to it first.
        groups
            ``(tier, bucket start, indices)`` of the events, as :func:`bucket_cells` places them under
            :meth:`bounds` at ``watermark`` (which must then be given and not be behind any event): a caller
            that places the events of many rings at once (one vectorised pass for a whole batch) passes them.
            The indices are passed to ``update`` as they are (e.g. a ``slice`` of a batch sorted by bucket).
        bounds
            With ``groups``: the :meth:`bounds` at ``watermark`` they were placed under (computed here if not given).
        """
        if groups is None:
            ts = np.asarray(ts, dtype=np.float64)
            if ts.size == 0:
                return
            self.advance(float(ts.max()) if watermark is None else max(watermark, float(ts.max())))
            groups = self._groups(ts, self.bounds())
        else:
            if watermark is None:
                raise ValueError("add(groups=...) needs the watermark the groups were placed at")
            self.advance(watermark, bounds)
        if not self.keep_archive and all(t >= len(self.tiers) for t, _, _ in groups):
            return  # nothing lands
        self.version += 1
        for t, start, idx in groups:  # (tier, bucket start, event indices)
            if t >= len(self.tiers):
                if not self.keep_archive:
                    continue
                if self.archive is None:
                    self.archive = self.factory()
                update(self.archive, idx)
                self.archive_version = self.version
                continue
            state = self.buckets[t].get(start)
            if state is None:
                state = self.buckets[t][start] = self.factory()
            update(state, idx)
            self.bucket_versions[t][start] = self.version

    def _groups(self, ts: np.ndarray, bounds: list[float]) -> list[tuple[int, float, np.ndarray]]:
        """``(tier, bucket start, event indices)`` of the buckets that events ``ts`` fall in under ``bounds``."""
        tier, key, code = bucket_cells(self.tiers, ts, bounds)
        if tier.size == 1 or int(code.min()) == int(code.max()):  # a single bucket (also: every event in tier 0)
            return [(int(tier[0]), float(key[0]), np.arange(ts.size))]
        order = np.argsort(code, kind="stable")
        sc = code[order]
        cut = np.flatnonzero(sc[1:] != sc[:-1]) + 1
        starts = [0, *cut.tolist()]
        first = order[starts]
        ends = [*starts[1:], order.size]
        return [(int(t), float(k), order[a:b]) for t, k, a, b in zip(tier[first].tolist(), key[first].tolist(),
                                                                      starts, ends)]

    # -- reading ------------------------------------------------------------------------------
    def window_sums(self, lengths: dict[str, float | None], watermark: float | None = None) -> dict[str, S]:
        """Sum of the buckets of each window (``None`` = everything including the archive), in one pass.

        The merge order is the one defined in the module docstring (stable buckets newest first, then the
        buckets new events land in), so the snapshot's incremental sums equal these bit for bit.

        Parameters
        ----------
        lengths
            Window name -> length in seconds, or ``None`` for ``all``.
        watermark
            Where the windows end (default: the ring's own watermark); the ring is not rolled.

        Returns
        -------
        dict
            Window name -> a new state (the ring is not modified).
        """
        out: dict[str, S] = from_scratch(self, lengths, watermark)
        return out

    def window_sum(self, length: float | None) -> S:
        """Sum of the buckets of one window of ``length`` seconds (``None`` = all)."""
        return self.window_sums({"w": length})["w"]

    def layout(self) -> list[Any]:
        """Bucket starts per tier (and ``'archive'`` when present), for inspection and tests."""
        out: list[Any] = [sorted(t) for t in self.buckets]
        if self.archive is not None:
            out.append("archive")
        return out

    def bucket_count(self) -> int:
        return sum(len(t) for t in self.buckets) + (self.archive is not None)

    def copy(self, copy_state: Callable[[S], S] | None = None) -> TieredRing[S]:
        """A copy of the ring with a copy of every bucket (``copy_state``, default the state's ``copy()``).

        The copy has the same geometry, watermark and versions, so its :meth:`window_sums` equal the
        ring's, bit for bit; the snapshot takes it under the state lock (copying a bucket costs a few
        array copies, far less than merging it) and sums it after releasing the lock.
        """
        cp: Callable[[S], S] = _copy if copy_state is None else copy_state
        out: TieredRing[S] = TieredRing.__new__(TieredRing)
        out.tiers, out.factory, out.keep_archive = self.tiers, self.factory, self.keep_archive
        out.buckets = [{k: cp(s) for k, s in tier.items()} for tier in self.buckets]
        out.archive = None if self.archive is None else cp(self.archive)
        out.watermark, out.version, out.archive_version = self.watermark, self.version, self.archive_version
        out.bucket_versions = [dict(v) for v in self.bucket_versions]
        out._bounds_at, out._bounds = self._bounds_at, list(self._bounds)
        return out

    def entries(self) -> list[tuple[int, float, int, S]]:
        """Every bucket as ``(tier, start, version, state)``, finest tier first, then by start.

        ``version`` is the ring's :attr:`version` when that bucket was last mutated (created, added
        to, or merged into by a roll); the archive is reported last as ``(ARCHIVE_TIER,
        ARCHIVE_KEY, version, state)`` = ``(-1, -inf, ...)``.  The states are the ring's own objects
        (not copies): read them under the same lock as the ring (reading a
        :class:`~calmon.state.buckets.BucketStats` may aggregate its folded events in place, which
        changes its storage but never its content or version).  A bucket absent from a later
        call was rolled into a coarser tier (whose bucket then carries a newer version) or dropped.
        """
        out: list[tuple[int, float, int, S]] = []
        for t, (tier, vers) in enumerate(zip(self.buckets, self.bucket_versions)):
            out.extend((t, k, vers[k], tier[k]) for k in sorted(tier))
        if self.archive is not None:
            out.append((ARCHIVE_TIER, ARCHIVE_KEY, self.archive_version, self.archive))
        return out

    # -- serialisation ------------------------------------------------------------------------
    def to_dict(self, dump: Callable[[S], Any]) -> dict[str, Any]:
        return {"tiers": [list(t) for t in self.tiers],
                "watermark": None if self.watermark == -math.inf else self.watermark,
                "buckets": [[[k, dump(s)] for k, s in sorted(t.items())] for t in self.buckets],
                "archive": None if self.archive is None else dump(self.archive)}

    @classmethod
    def from_dict(cls, d: dict[str, Any], factory: Callable[[], S], load: Callable[[Any], S],
                  archive: bool = True) -> TieredRing[S]:
        ring: TieredRing[S] = cls([(w, c) for w, c in d["tiers"]], factory, archive)
        ring.watermark = -math.inf if d["watermark"] is None else float(d["watermark"])
        ring.buckets = [{float(k): load(s) for k, s in tier} for tier in d["buckets"]]
        ring.archive = None if d["archive"] is None else load(d["archive"])
        # a restore is a mutation: every bucket carries the restored version (continuing ``d["version"]``
        # when the caller stored one; to_dict does not, so the document format is unchanged)
        ring.version = int(d.get("version", 0)) + 1
        ring.bucket_versions = [dict.fromkeys(tier, ring.version) for tier in ring.buckets]
        ring.archive_version = ring.version if ring.archive is not None else 0
        return ring


def _roll(into: Any, state: Any) -> None:
    """Merge a bucket leaving its tier into ``into``: its ``absorb`` where it has one (the same result as
    ``merge``, cheaper for a bucket never read, :meth:`BucketStats.absorb
    <calmon.state.buckets.BucketStats.absorb>`), else ``merge``."""
    absorb = getattr(into, "absorb", None)
    if absorb is not None:
        absorb(state)
    else:
        into.merge(state)


def bucket_cells(tiers: list[tuple[float, int]], ts: np.ndarray, bounds: list[float]
                 ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Tier, bucket start and one integer code per (tier, bucket) of each event time ``ts`` under ``bounds``
    (:meth:`TieredRing.bounds`); tier ``len(tiers)`` is the archive.  Vectorised: one call places the events
    of every ring that shares ``tiers`` and ``bounds`` (a whole batch, issue #15).

    Examples
    --------
    >>> tier, key, _ = bucket_cells([(60.0, 2), (600.0, 1)], np.array([1300.0, 1201.0, 5.0]), [1260.0, 600.0])
    >>> tier.tolist(), key.tolist()
    ([0, 1, 2], [1260.0, 1200.0, 0.0])
    """
    w0 = tiers[0][0]
    k0 = np.floor(ts / w0) * w0
    if ts.size and float(k0.min()) >= bounds[0]:  # fast path (live traffic): every event in tier 0
        tier = np.zeros(ts.size, dtype=np.int64)
        key = k0
    else:
        tier = np.full(ts.size, len(tiers), dtype=np.int64)
        key = np.zeros(ts.size)
        for i in range(len(tiers) - 1, -1, -1):
            k = k0 if i == 0 else np.floor(ts / tiers[i][0]) * tiers[i][0]
            ok = k >= bounds[i]
            tier[ok] = i
            key[ok] = k[ok]
    # bucket starts are multiples of the finest width
    return tier, key, tier * (1 << 42) + np.floor(key / w0 + 0.5).astype(np.int64)


def _copy(state: Any) -> Any:
    """A copy of a bucket's state: its own ``copy()``, a deep copy for states with a ``reservoir``."""
    if hasattr(state, "copy") and not hasattr(state, "reservoir"):
        return state.copy()
    return deepcopy(state)


# -- window sums, reused across snapshots ---------------------------------------------------------
#: Tier-0 buckets at the newest end merged last (the current one and the one before, for late outcomes).
HOT = 2

#: A stable bucket's identity: ``(tier, start, ring version when last mutated)``; the archive is ``(-1, -inf, v)``.
Sig = tuple[int, float, int]


@dataclass(frozen=True)
class RingSums:
    """What :func:`capture` keeps of a ring between snapshots: per window (shortest first) its stable sum."""

    #: ``(name, length)`` of every window, shortest first.
    order: tuple[tuple[str, float | None], ...]
    #: Per window the identities of its stable buckets (and the archive for ``all``).
    sigs: tuple[tuple[Sig, ...], ...]
    #: Per window ``S_k``: never mutated once stored.
    stable: tuple[Any, ...]


@dataclass
class Plan:
    """The work of one ring's window sums, captured under the lock (:func:`capture`), run after it."""

    order: tuple[tuple[str, float | None], ...]
    sigs: tuple[tuple[Sig, ...], ...]
    cutoffs: list[float]
    #: First window whose ``S_k`` must be recomputed (``len(order)``: none).
    restart: int
    #: ``S_k`` kept from the previous snapshot for ``k < restart``.
    kept: tuple[Any, ...]
    #: Stable states to merge from the restart on, per window ``k >= restart`` (the archive last for ``all``).
    todo: list[list[Any]]
    #: Hot buckets ``(start, state)``, newest first.
    hot: list[tuple[float, Any]]
    factory: Callable[[], Any]
    copy: Callable[[Any], Any]

    def run(self) -> tuple[dict[str, Any], RingSums]:
        """The window sums (name -> a new state) and what to keep for the next snapshot.

        States with a ``summed(others)`` method (:meth:`BucketStats.summed
        <calmon.state.buckets.BucketStats.summed>`: a new state equal to a copy merged with ``others`` in
        turn) are summed window by window, one pass per grid and no copies; others by a copy and pairwise
        merges, as :meth:`run_reference` does for every state -- the same sums.
        """
        stable: list[Any] = list(self.kept[: self.restart])
        if self.restart < len(self.order):
            acc = stable[-1] if stable else self.factory()
            for k in range(self.restart, len(self.order)):
                # S_k is never mutated once stored (nor is a window sum): a window adding nothing shares it
                acc = _summed(acc, self.todo[k - self.restart], self.copy)
                stable.append(acc)
        out: dict[str, Any] = {}
        for (name, _), cutoff, s in zip(self.order, self.cutoffs, stable):
            out[name] = _summed(s, [state for start, state in self.hot if start >= cutoff], self.copy)
        return out, RingSums(self.order, self.sigs, tuple(stable))

    def run_reference(self) -> tuple[dict[str, Any], RingSums]:
        """:meth:`run` by a copy of the chain per window and one ``merge`` per bucket (the definition)."""
        stable: list[Any] = list(self.kept[: self.restart])
        if self.restart < len(self.order):
            acc = self.copy(stable[-1]) if stable else self.factory()
            for k in range(self.restart, len(self.order)):
                for state in self.todo[k - self.restart]:
                    acc.merge(state)
                stable.append(acc if k == len(self.order) - 1 else self.copy(acc))
        out: dict[str, Any] = {}
        for (name, _), cutoff, s in zip(self.order, self.cutoffs, stable):
            hot = [state for start, state in self.hot if start >= cutoff]
            if not hot:  # nothing to add: share S_k (neither it nor a window sum is ever mutated)
                out[name] = s
                continue
            total = self.copy(s)
            for state in hot:
                total.merge(state)
            out[name] = total
        return out, RingSums(self.order, self.sigs, tuple(stable))


def _summed(base: Any, states: list[Any], copy: Callable[[Any], Any]) -> Any:
    """``base`` with ``states`` merged in turn, as a new state (``base`` itself when there is nothing to add)."""
    if not states:
        return base
    summed = getattr(base, "summed", None)
    if summed is not None:
        return summed(states)
    out = copy(base)
    for state in states:
        out.merge(state)
    return out


def capture(ring: TieredRing[Any], lengths: Mapping[str, float | None], watermark: float | None = None,
            previous: RingSums | None = None, copy: Callable[[Any], Any] | None = None) -> Plan:
    """Plan the window sums of ``ring`` at ``watermark``, reusing ``previous`` where it still holds.

    Parameters
    ----------
    ring
        The ring (read only; call under the lock that guards it).
    lengths
        Window name -> length in seconds (``None``: everything).
    watermark
        Where the windows end (default and at least the ring's own watermark).
    previous
        What the previous :meth:`Plan.run` of this ring returned (``None``: compute from scratch).
    copy
        How a bucket the plan reads is copied now (``None``: not copied -- the plan must then run before
        the ring changes, as :func:`from_scratch` does).

    Examples
    --------
    >>> import numpy as np
    >>> from calmon.state.windows import TieredRing
    >>> from calmon.stats.grid import ScoreGrid
    >>> ring = TieredRing([(60, 3), (600, 2)], lambda: ScoreGrid(4))
    >>> add = lambda ts: ring.add(np.array(ts), lambda g, i: g.update(np.full(i.size, 0.5), np.ones(i.size)))
    >>> add([0.0, 650.0, 1190.0])
    >>> sums, keep = capture(ring, {"2m": 120.0, "all": None}, copy=ScoreGrid.copy).run()
    >>> add([1195.0])  # a live event: the stable sums are kept
    >>> plan = capture(ring, {"2m": 120.0, "all": None}, previous=keep, copy=ScoreGrid.copy)
    >>> plan.restart, {k: v.count for k, v in plan.run()[0].items()}
    (2, {'2m': 2, 'all': 4})
    """
    wm = ring.watermark if watermark is None else max(watermark, ring.watermark)
    w0 = ring.tiers[0][0]
    cur = math.floor(wm / w0) * w0 if wm > -math.inf else 0.0
    hot_from = cur - (HOT - 1) * w0
    cp: Callable[[Any], Any] = copy if copy is not None else (lambda s: s)
    hot: list[tuple[float, Any]] = []
    stable: list[tuple[Sig, Any]] = []
    for t, (tier, vers) in enumerate(zip(ring.buckets, ring.bucket_versions)):
        for key, state in tier.items():
            if t == 0 and key >= hot_from:
                hot.append((key, state))
            else:
                stable.append(((t, key, vers[key]), state))
    hot.sort(key=lambda kv: -kv[0])
    stable.sort(key=lambda x: -x[0][1])
    order = tuple(sorted(lengths.items(), key=lambda kv: math.inf if kv[1] is None else kv[1]))
    cutoffs = [-math.inf if length is None else cur + w0 - length for _, length in order]
    ends: list[int] = []
    sigs: list[tuple[Sig, ...]] = []
    pos = 0
    for (_, length), cutoff in zip(order, cutoffs):
        while pos < len(stable) and stable[pos][0][1] >= cutoff:
            pos += 1
        ends.append(pos)
        arch: tuple[Sig, ...] = ()
        if length is None and ring.archive is not None:
            arch = ((-1, -math.inf, ring.archive_version),)
        sigs.append(tuple(s for s, _ in stable[:pos]) + arch)
    restart = 0
    if previous is not None and previous.order == order:
        while restart < len(order) and previous.sigs[restart] == sigs[restart]:
            restart += 1
    todo: list[list[Any]] = []
    for k in range(restart, len(order)):
        states = [cp(s) for _, s in stable[(ends[k - 1] if k else 0): ends[k]]]
        if order[k][1] is None and ring.archive is not None:
            states.append(cp(ring.archive))
        todo.append(states)
    kept = previous.stable if previous is not None and restart else ()
    return Plan(order, tuple(sigs), cutoffs, restart, kept, todo, [(k, cp(s)) for k, s in hot],
                ring.factory, _copy)


def from_scratch(ring: TieredRing[Any], lengths: Mapping[str, float | None],
                 watermark: float | None = None) -> dict[str, Any]:
    """The window sums by the definition above, with nothing kept (reads the ring's own buckets)."""
    return capture(ring, lengths, watermark).run()[0]

