"""The evaluation scheduler: a background thread that runs a round every ``evaluation.every`` seconds.

What a round does is the runtime's business (:meth:`calmon.agent.runtime.Agent.evaluate_round`:
a snapshot of the windows taken under the state lock, then :mod:`calmon.evaluate.round` on
that private copy, so ingestion never waits for a tester).  This module only owns the timing:
periodic rounds, an immediate round on :meth:`Scheduler.trigger`, and waiting for a round.

The first round
---------------
The first round comes as soon as the ingestion has read its backlog (:meth:`Scheduler.caught_up`, called by the
ingestion thread once a poll reads less than a full batch from every source), and at the latest one period
after the start.  So an agent started on an hour of backfill publishes its first evaluations when that hour is
in, not up to a period later (issue #35: at 200 models the testers' pool lost a third of its first three
minutes waiting), and a round is never started on a half-read backlog unless a whole period went by reading it.
Only the first round moves: later ones keep the period, counted from the start of the one before.

Shutdown
--------
The thread is a daemon (a forgotten scheduler never keeps a process alive), but a daemon
thread still inside native code when the interpreter finalises (a tester in HiGHS, a BLAS
call) is torn down under the C++ runtime: ``terminate called without an active exception``,
exit -6.  So :meth:`Scheduler.stop` lets the running round finish: it joins the thread for
``wait`` seconds and, if the round is still running then, registers an :mod:`atexit` join so
that the process exits right after the round instead of in the middle of it.  No new round
starts once stop was asked.
"""

from __future__ import annotations

import atexit
import logging
import threading
import time
from collections.abc import Callable

log = logging.getLogger("calmon.agent")

__all__ = ["Scheduler"]


class Scheduler:
    """Background thread running evaluation rounds.

    Parameters
    ----------
    round_fn
        Runs one round (``round_fn() -> None``); the runtime's ``evaluate_round``.
    every
        Seconds between the starts of rounds (the first round comes one period after the start, or
        earlier: when :meth:`caught_up` or :meth:`trigger` is called).

    Examples
    --------
    >>> calls = []
    >>> s = Scheduler(lambda: calls.append(1), every=3600).start()
    >>> s.trigger(); s.wait_round(0, timeout=10)
    True
    >>> s.stop(), len(calls)
    (True, 1)
    """

    def __init__(self, round_fn: Callable[[], None], every: float,
                 settle_fn: Callable[[float, Callable[[], bool]], bool] | None = None) -> None:
        self.round_fn = round_fn
        #: Between rounds: ``settle_fn(next_at, interrupted)`` collects work a round left running (returns
        #: whether some is still running); called again until it says no, the next round is due or a trigger.
        self.settle_fn = settle_fn
        self.every = float(every)
        #: ``time.monotonic()`` value of the next periodic round (the status page shows when it comes).
        self.next_at = time.monotonic() + self.every
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._done = threading.Condition()
        self.rounds = 0
        self._began = False  # a round has started (caught_up moves only the first)
        self.thread = threading.Thread(target=self._loop, name="calmon-scheduler", daemon=True)

    def start(self) -> Scheduler:
        self.thread.start()
        return self

    def trigger(self) -> None:
        """Run a round now (e.g. when a read-once source is exhausted)."""
        self._wake.set()

    def caught_up(self) -> None:
        """The ingestion has read its backlog: the first round comes now if none has started (module docstring).

        Cheap and idempotent: the ingestion thread may call it after every poll."""
        if not self._began:
            self._began = True
            self._wake.set()

    def wait_round(self, after: int, timeout: float, cancel: threading.Event | None = None) -> bool:
        """Wait until more than ``after`` rounds have completed (or ``cancel`` is set, or ``timeout``)."""
        deadline = time.monotonic() + timeout
        with self._done:
            while self.rounds <= after:
                left = deadline - time.monotonic()
                if left <= 0 or (cancel is not None and cancel.is_set()) or not self.thread.is_alive():
                    return False
                self._done.wait(min(left, 0.2))
            return True

    def stop(self, wait: float = 5.0) -> bool:
        """Start no new round; wait up to ``wait`` s for the running one. True if the thread has ended.

        If a round is still running, the interpreter's exit waits for it (see the module docstring).
        """
        self._stop.set()
        self._wake.set()
        if not self.thread.is_alive() or self.thread is threading.current_thread():
            return True
        self.thread.join(max(0.0, wait))
        if self.thread.is_alive():
            log.info("an evaluation round is still running: the exit waits for it to finish")
            atexit.register(self.thread.join)
            return False
        return True

    def _settle(self, until: float) -> None:
        if self.settle_fn is None:
            return
        stop = lambda: self._wake.is_set() or self._stop.is_set()  # noqa: E731
        while not stop() and time.monotonic() < until:
            try:
                if not self.settle_fn(until, stop):
                    return
            except Exception:  # noqa: BLE001 - keep scheduling; the error is logged
                log.exception("collecting evaluation results failed")
                return

    def alive(self) -> bool:
        return self.thread.is_alive()

    def _loop(self) -> None:
        next_at = self.next_at = time.monotonic() + self.every  # the first round after one period (or triggered)
        while not self._stop.is_set():
            self._settle(next_at)
            self._wake.wait(max(0.0, next_at - time.monotonic()))
            if self._stop.is_set():
                return
            self._wake.clear()
            self._began = True
            next_at = self.next_at = time.monotonic() + self.every
            try:
                self.round_fn()
            except Exception:  # noqa: BLE001 - keep scheduling; the error is logged
                log.exception("evaluation round failed")
            with self._done:
                self.rounds += 1
                self._done.notify_all()
