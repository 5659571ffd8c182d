"""A consumer group that never forms: noticing it, and expiring the departed leader that holds it (Tansu 0.6).

A group forms when its leader -- the member the coordinator named in its ``JoinGroup`` responses -- sends
``SyncGroup`` with the assignment; a follower's ``SyncGroup`` before that is refused with
``REBALANCE_IN_PROGRESS`` and the follower joins again.  Tansu 0.6's coordinator keeps a leader that **leaves**
(``LeaveGroup``) while the group is forming: the member is removed but stays named as the leader, and only the
session expiry of a leader that is still a member (or, by chance, a conflict of two concurrent group writes)
clears it.  No member can then form the group: every ``JoinGroup`` succeeds at the same generation, every
``SyncGroup`` is refused, for ever (docs/cluster.md, "Group rebalances on Tansu").  Closing the consumer and
joining with a fresh member id does not help, since the departed leader stays named.

:class:`GroupWatch` notices the loop from what one member sees -- no stable assignment for
:data:`STALL_SESSIONS` session timeouts while its ``SyncGroup`` s keep being refused and the responses name
another member as the leader -- and asks for one repair: a single bare ``JoinGroup`` carrying the named
leader's member id (:meth:`connectors.kafka.kafkapython.KafkaPythonConsumer.expire_leader`).  The broker
registers that id as a member again; it sends no heartbeat and no ``SyncGroup``, so the broker expires it one
session timeout later and, the leader being a member now, clears the leadership with it: the next member to
join is elected and forms the group.  The repair never takes part in an assignment, so it cannot make two
consumers own one partition.  On a broker that has no such member (Apache Kafka) the request is answered
``UNKNOWN_MEMBER_ID`` and changes nothing, and the condition does not arise there in the first place: its
coordinator holds joins until every member has joined and answers the followers' ``SyncGroup`` once the
leader's arrives.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

__all__ = ["GroupWatch", "STALL_SESSIONS", "MIN_REFUSED"]

#: Session timeouts without a stable assignment (with SyncGroups refused) before a repair, and between repairs.
#: Well above a healthy rebalance on Tansu (a held follower join of 3 s plus the leader's round trip).
STALL_SESSIONS = 3.0
#: Refused SyncGroups since the last stable assignment before a repair (one refusal is an ordinary rebalance).
MIN_REFUSED = 2


@dataclass
class GroupWatch:
    """What one consumer saw of its group since its last stable assignment, and when to repair it.

    The client's IO thread reports :meth:`joined`, :meth:`refused` and :meth:`stable`; the reading thread asks
    :meth:`due` after each poll and reports :meth:`repaired`.

    Parameters
    ----------
    session_timeout
        The consumer's session timeout, seconds (the broker expires a silent member after it).
    clock
        Monotonic clock, seconds.

    Examples
    --------
    >>> now = [0.0]
    >>> w = GroupWatch(10.0, clock=lambda: now[0])
    >>> w.joined("me", "gone", 5); w.refused(); now[0] = 29.0; w.refused(); w.due() is None
    True
    >>> now[0] = 30.0; w.due()
    'gone'
    >>> w.repaired("gone"); w.due() is None, w.repairs
    (True, 1)
    """

    session_timeout: float
    clock: Callable[[], float] = time.monotonic
    #: this consumer's member id and the leader and generation of the last JoinGroup response
    member: str | None = None
    leader: str | None = None
    generation: int = -1
    #: SyncGroups refused with REBALANCE_IN_PROGRESS since the last stable assignment
    refusals: int = 0
    #: when the current unstable stretch began (None while the assignment is stable)
    since: float | None = None
    #: repairs asked for so far (``calmon_cluster_group_repairs_total``)
    repairs: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    @property
    def bound(self) -> float:
        """Seconds without a stable assignment before a repair."""
        return STALL_SESSIONS * self.session_timeout

    def joined(self, member: str, leader: str, generation: int) -> None:
        """A JoinGroup response: this member's id, the leader it names, the generation."""
        with self._lock:
            self.member, self.leader, self.generation = member, leader, generation
            if self.since is None:
                self.since = self.clock()

    def refused(self) -> None:
        """A SyncGroup refused with REBALANCE_IN_PROGRESS (the member joins again)."""
        with self._lock:
            self.refusals += 1
            if self.since is None:
                self.since = self.clock()

    def stable(self) -> None:
        """A SyncGroup answered with an assignment: the group formed."""
        with self._lock:
            self.since, self.refusals = None, 0

    def due(self) -> str | None:
        """The member id to expire -- the leader named by the last JoinGroup response -- when the group has not
        formed for :attr:`bound` seconds with at least :data:`MIN_REFUSED` refused SyncGroups and another member
        named as its leader; else None."""
        with self._lock:
            if self.since is None or self.refusals < MIN_REFUSED or self.clock() - self.since < self.bound:
                return None
            if not self.leader or self.leader == self.member:
                return None  # this member leads: the group forms when its own SyncGroup gets through
            return self.leader

    def repaired(self, leader: str) -> None:
        """A repair was sent for ``leader``: count it, and wait another :attr:`bound` before the next."""
        with self._lock:
            self.repairs += 1
            self.since, self.refusals = self.clock(), 0
