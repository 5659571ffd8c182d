"""The evaluator's snapshot thread: snapshots are taken and written off the poll thread.

Writing a round of snapshots waits for the broker's acknowledgements (seconds for a large model, a chunked
one more), and the poll thread must keep polling well within ``max_poll_interval_ms`` and keep merging
deltas meanwhile.  So an evaluator runs a :class:`SnapshotWriter`: a daemon thread that calls its
``round`` every ``every`` seconds (the evaluator's ``_maybe_snapshot``, which copies each changed model
under a short per-model hold of the state lock and encodes and sends outside it) and logs a failed round
instead of dying (the next round retries: the models stay dirty).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

log = logging.getLogger("calmon.cluster")

__all__ = ["SnapshotWriter"]


class SnapshotWriter:
    """Call ``round()`` every ``every`` seconds on a daemon thread until :meth:`stop`.

    Parameters
    ----------
    every
        Seconds between two rounds (> 0).
    round
        One snapshot round; an exception is logged and the thread goes on.
    name
        The thread's name (for stack dumps).
    """

    def __init__(self, every: float, round: Callable[[], None], name: str = "calmon-snapshots") -> None:
        if every <= 0:
            raise ValueError(f"snapshot period must be > 0, got {every}")
        self.every, self.round = every, round
        self.rounds = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout: float = 60.0) -> None:
        """Stop after the current round (waiting at most ``timeout`` seconds for it)."""
        self._stop.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout)

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    def _run(self) -> None:
        while not self._stop.wait(self.every):
            try:
                self.round()
            except Exception:  # noqa: BLE001 - a failed round must not end the thread; it is retried
                log.exception("snapshot round failed; retrying in %.1f s", self.every)
            self.rounds += 1
