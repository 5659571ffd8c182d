"""Bounded exponential backoff with jitter between connection attempts."""

from __future__ import annotations

import random
from dataclasses import dataclass


@dataclass
class Backoff:
    """Delay after the n-th consecutive failure: ``min(maximum, initial * 2**(n-1))``, jittered by +-20%.

    Examples
    --------
    >>> b = Backoff(0.5, 30.0)
    >>> 0.4 <= b.fail(now=100.0) <= 0.6, b.failures
    (True, 1)
    >>> 0.0 < b.wait(now=100.0) <= 0.6, b.wait(now=101.0)
    (True, 0.0)
    >>> b.succeed(); b.failures
    0
    """

    initial: float
    maximum: float
    failures: int = 0
    next_attempt: float = 0.0

    def __post_init__(self) -> None:
        if not (0 < self.initial <= self.maximum):
            raise ValueError("need 0 < backoff_initial <= backoff_max")

    def fail(self, now: float) -> float:
        """Count a failure; return the delay before the next attempt (which is then due at ``now + delay``)."""
        self.failures += 1
        delay = min(self.maximum, self.initial * 2 ** min(self.failures - 1, 30))
        delay *= 0.8 + 0.4 * random.random()
        self.next_attempt = now + delay
        return delay

    def succeed(self) -> None:
        """Reset the failure count after a successful call."""
        self.failures = 0

    def wait(self, now: float) -> float:
        """Seconds until the next attempt is due (0 when it is)."""
        return max(0.0, self.next_attempt - now)
