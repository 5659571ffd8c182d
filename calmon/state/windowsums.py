"""Window sums of a :class:`~calmon.state.windows.TieredRing`, reused across snapshots where nothing changed.

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

:class:`TieredRing.window_sums <calmon.state.windows.TieredRing.window_sums>` computes exactly this from
scratch.  :func:`capture` does it incrementally: ``S_k`` is kept while the stable buckets of window ``k``
(their tier, start and ring version, see :meth:`~calmon.state.windows.TieredRing.entries`) and the
archive's version are unchanged, and the chain restarts from the longest kept ``S_k`` otherwise.  Between
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
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from calmon.state.windows import TieredRing
__all__ = ["HOT", "REFERENCE", "Plan", "RingSums", "capture", "from_scratch"]

#: Sum windows by copies and pairwise merges (:meth:`Plan.run_reference`) instead of :meth:`Plan.run`'s batched
#: sums -- the same statistics; for benchmarks and tests.
REFERENCE = False

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
        turn) are summed window by window, one pass per grid and no copies; others, or with
        :data:`REFERENCE` set, by a copy and pairwise merges (:meth:`run_reference`) -- the same sums.
        """
        if REFERENCE:
            return self.run_reference()
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


def _copy(state: Any) -> Any:
    from calmon.state.windows import _copy as copy_state
    return copy_state(state)
