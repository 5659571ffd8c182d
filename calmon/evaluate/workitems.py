"""Evaluation as a scheduler of work items: which expensive tester calls a round runs.

A *work item* is one scheduled tester on one window, ``(model, segment, window, tester)``.
Metrics and the cheap testers (``evaluation.cheap``, T-Cal by default: ~1 ms) run on every window
whose statistics changed, every round.  The others (smCE ~0.4 s, LDTC ~0.6 s per window, or a
cheap tester measured slower than ``evaluation.cheap_cost``) are work items:

* **incremental** -- an item is a candidate only when its window's statistics changed since its
  last result (the snapshot's stamp differs) and that result is at least ``cadence[tester]``
  rounds old; an unchanged window keeps its last result, with its ``evaluated_at``;
* **fair** -- candidates are ordered by staleness: no result first, then the oldest result, then
  (among equals) the window whose statistics changed first, then a fixed hash of the window (no
  alphabetical favourites; a window's testers next to each other);
* **cost-aware** -- the round takes candidates in that order while their measured cost (a moving
  average per tester, :class:`CostModel`) fits what the pool can do before the next round
  (:func:`horizon`) times the workers; an item too large for what is left is passed over for a
  smaller one behind it.

The pool's workers run scheduled calls in the background and the scheduler thread publishes their
results as they arrive, between rounds, so a process or thread pool may be given the whole period
until the next round (``max(budget, every)``), not only what is left of the round's budget: with the
budget alone the workers idled for half of every period (``every`` 60 s, budget 30 s), and the first
round, after a refresh of every window, had a few seconds left (issue #35: 3 of 2,400 windows got
smCE within three minutes at 200 models).  An inline pool runs the calls in the round's own thread,
so there the budget is the horizon.

Starvation bound
----------------
Each round either runs every candidate or fills at least ``C - c_max`` seconds of work, with
``C = budget x workers x FILL`` and ``c_max`` the largest tester cost; an item that ran goes to
the back of the order.  So every window with enough data gets every configured tester at least
every ``N = max(cadence, ceil(sum_items c / (C - c_max)))`` rounds (:func:`starvation_bound`;
``None`` when ``C <= c_max``: the budget cannot hold one call).  Example (README): 1000 models x 3
segments x 3 windows, smCE 0.4 s + LDTC 0.6 s per window, budget 30 s on 2 workers: ``C = 48 s``,
``N = ceil(9000 / 47.4) = 190`` rounds; with the period as horizon (``every`` 60 s, ``C = 96 s``) and
the costs of docs/statistics/fast-nulls.md (smCE 0.042 s, LDTC 0.108 s a window)
``N = ceil(9000 x 0.15 / 95.9) = 15`` rounds, 8 where windows share their grid (identical jobs run once,
:mod:`calmon.evaluate.pool`).

Examples
--------
>>> costs = CostModel()
>>> costs.observe("smce", 0.4); costs.observe("ldtc", 0.6)
>>> last = {("1h", "smce"): 3, ("1h", "ldtc"): -1, ("24h", "smce"): 0, ("24h", "ldtc"): 5}
>>> items = [Candidate(("m", "all", w), t, r, 0) for (w, t), r in last.items()]
>>> [(c.key[2], c.test) for c in choose(order(items), costs, capacity=1.1)]
[('1h', 'ldtc'), ('24h', 'smce')]
>>> starvation_bound({"smce": 2, "ldtc": 2}, costs, capacity=1.1, cadence=1)
4
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from calmon.evaluate.types import Evaluation

__all__ = ["DEFAULT_COST", "FILL", "Candidate", "CostModel", "Stamp", "TestRecord", "WindowEntry", "WindowKey",
           "choose", "horizon", "order", "starvation_bound"]

#: ``(model, segment, window)``.
WindowKey = tuple[str, str, str]
#: What the statistics of a window were computed from (see :class:`calmon.state.agentstate.WindowSnapshot`).
Stamp = tuple[int, float] | None
#: Share of ``budget x workers`` the scheduled testers may fill (the rest absorbs estimation error).
FILL = 0.8
#: Cost assumed for a tester never measured (seconds; the first results correct it).  About twice what the
#: built-in scheduled testers cost on a window (docs/statistics/fast-nulls.md): 1.0 s let the first round start
#: only ~50 calls at 200 models, so no window had smCE or LDTC before the second round (issue #35).
DEFAULT_COST = 0.2


@dataclass
class TestRecord:
    """One tester's last result on one window."""

    __test__ = False  # not a pytest test class despite the name

    #: :meth:`calmon.testers.TestResult.to_dict`.
    result: dict[str, Any]
    #: When the result was computed (unix seconds).
    evaluated_at: float
    #: The statistics it was computed on; ``None`` never equals the window's stamp.
    stamp: Stamp
    #: Evaluation round that produced it.
    round: int

    def as_json(self) -> dict[str, Any]:
        return {**self.result, "evaluated_at": self.evaluated_at}


@dataclass
class WindowEntry:
    """What the evaluator keeps of one window between rounds."""

    stamp: Stamp = None
    #: Round in which the window's statistics last changed.
    changed_round: int = 0
    #: Round of the window's last refresh (its ``base``); changed windows are refreshed least recently first.
    refreshed: int = 0
    #: The evaluation without tester results (metrics, reliability, estimates) at ``stamp``.
    base: dict[str, Any] | None = None
    #: The calibrator the estimates of ``base`` used (a new one recomputes them).
    predictor: Any = None
    tests: dict[str, TestRecord] = field(default_factory=dict)
    #: Bumped whenever ``base`` or a record changes; the assembled evaluation is cached per version.
    version: int = 0
    assembled: tuple[int, Evaluation] | None = None

    def unchanged(self, stamp: Stamp, predictor: Any) -> bool:
        return stamp is not None and stamp == self.stamp and predictor is self.predictor and self.base is not None

    def record(self, name: str, rec: TestRecord) -> None:
        self.tests[name] = rec
        self.version += 1


@dataclass(frozen=True)
class Candidate:
    """A work item that may run this round."""

    key: WindowKey
    test: str
    #: Round of the item's last result (``-1``: none).
    last_round: int
    #: Round in which the window's statistics last changed.
    changed_round: int

    def priority(self) -> tuple[int, int, int, str]:
        # the hash of the window only, then the tester: a window's testers run together, so a pass that is
        # cut short leaves windows with every tester rather than every window with some (issue #35 counts the
        # windows holding a result of every tester)
        return self.last_round, self.changed_round, zlib.crc32("\0".join(self.key).encode()), self.test


class CostModel:
    """Measured seconds per tester call: an exponential moving average per tester.

    Examples
    --------
    >>> c = CostModel(); c.estimate("smce")
    0.2
    >>> c.observe("smce", 0.5); c.observe("smce", 0.3); round(c.estimate("smce"), 3)
    0.44
    """

    def __init__(self, weight: float = 0.3) -> None:
        self.weight = weight
        self.seconds: dict[str, float] = {}

    def observe(self, test: str, seconds: float) -> None:
        old = self.seconds.get(test)
        self.seconds[test] = seconds if old is None else (1 - self.weight) * old + self.weight * seconds

    def estimate(self, test: str) -> float:
        return self.seconds.get(test, DEFAULT_COST)


def order(candidates: Iterable[Candidate]) -> list[Candidate]:
    """Candidates by staleness: no result first, oldest result, earliest change, then a fixed hash."""
    return sorted(candidates, key=Candidate.priority)


def choose(ordered: Iterable[Candidate], costs: CostModel, capacity: float) -> list[Candidate]:
    """The prefix-greedy selection: in order, every candidate whose estimated cost still fits ``capacity``."""
    out = []
    left = capacity
    for c in ordered:
        cost = costs.estimate(c.test)
        if cost <= left:
            out.append(c)
            left -= cost
    return out


def horizon(budget: float, every: float, background: bool) -> float:
    """Seconds from a round's start the scheduled calls may fill: the period until the next round when they
    run in the background (a process or thread pool), else (inline, or a round that must be complete) the
    budget.

    Examples
    --------
    >>> horizon(30.0, 60.0, background=True), horizon(30.0, 60.0, background=False)
    (60.0, 30.0)
    """
    return max(budget, every) if background else budget


def starvation_bound(items: Mapping[str, int], costs: CostModel, capacity: float, cadence: int = 1) -> int | None:
    """Rounds within which every item runs at least once (see the module docstring); ``None``: unbounded.

    Parameters
    ----------
    items
        Tester -> number of windows it is scheduled on.
    capacity
        Seconds of work one round can hold (``budget x workers x FILL``).
    cadence
        The largest configured cadence.
    """
    if not items:
        return cadence
    c_max = max(costs.estimate(t) for t in items)
    if capacity <= c_max:
        return None
    total = sum(n * costs.estimate(t) for t, n in items.items())
    return max(cadence, math.ceil(total / (capacity - c_max)))
