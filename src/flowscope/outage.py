"""How a worker lives through a store that refuses writes (a full disk, a read-only store).

A :class:`StoreOutage` is told of every write that failed with
:class:`~flowscope.errors.StoreNotWritable` and of every write that succeeded. Failures
close together (no quiet gap of :data:`QUIET_S`) are one *episode*: the worker logs the
first failure of an episode, one line, and nothing more until the next episode. It backs
off exponentially (from the worker's poll interval, doubling, capped at
:data:`BACKOFF_CAP_S`), and when no write has succeeded for ``limit_s`` the outage is
*exhausted*: the worker stops with the store's error as its reason. A write that goes
through ends the outage (and restarts that clock), but not the episode's backoff. Classes are matched,
never message text; any other error is not an outage.
"""

from __future__ import annotations

import time

from .errors import StoreNotWritable

__all__ = ["StoreOutage", "backoff", "BACKOFF_CAP_S", "QUIET_S", "DEFAULT_LIMIT_S"]

#: The longest a worker waits between two writes while its store refuses them.
BACKOFF_CAP_S = 5.0
#: Failures further apart than this (with successes between) are separate episodes.
QUIET_S = 30.0
#: How long a worker goes on without one successful write before it stops.
DEFAULT_LIMIT_S = 60.0


def backoff(first_s: float, n: int, cap_s: float) -> float:
    """The wait after the ``n``-th fault in a row: ``first_s``, doubled per fault after the
    first, at most ``cap_s`` (a worker's every retry of its store)."""
    return min(cap_s, first_s * 2.0 ** max(0, n - 1))


class StoreOutage:
    """The write faults of one worker: episodes, backoff, when to give up.

    Times are ``time.monotonic()`` seconds (a wall clock step must not end an outage).
    """

    __slots__ = ("poll_s", "limit_s", "cap_s", "since", "error", "failures", "last_fault", "said_over")

    def __init__(self, poll_s: float, limit_s: float = DEFAULT_LIMIT_S, cap_s: float = BACKOFF_CAP_S) -> None:
        if limit_s <= 0:
            raise ValueError("limit_s must be positive")
        self.poll_s = poll_s
        self.limit_s = limit_s
        self.cap_s = max(cap_s, poll_s)
        #: When the first write failed since the last one that succeeded, or None.
        self.since: float | None = None
        #: The last write fault (what the worker reports when it stops).
        self.error: StoreNotWritable | None = None
        #: Writes failed in a row (the backoff's exponent).
        self.failures = 0
        self.last_fault: float | None = None
        #: Whether the episode's first write that went through was reported (once).
        self.said_over = False

    @property
    def active(self) -> bool:
        """Whether the last write failed (the worker backs off instead of claiming)."""
        return self.since is not None

    def failed(self, exc: StoreNotWritable, now: float | None = None) -> bool:
        """Note a failed write; True when it starts an episode (the one line to log)."""
        now = time.monotonic() if now is None else now
        new = self.last_fault is None or now - self.last_fault > QUIET_S
        if new:
            self.said_over = False
        if self.since is None:
            self.since = now
        self.error = exc
        self.failures += 1
        self.last_fault = now
        return new

    def succeeded(self, now: float | None = None) -> float | None:
        """Note a write that went through; returns how long writes had failed when this is
        the episode's first write that did (to say once), else None."""
        if self.since is None:
            return None
        now = time.monotonic() if now is None else now
        lasted = now - self.since
        self.since = None
        # The backoff is kept through the episode: a disk that takes a small write and
        # refuses the next append is retried ever more slowly, not at every poll.
        if self.last_fault is None or now - self.last_fault > QUIET_S:
            self.failures = 0
        if self.said_over:
            return None
        self.said_over = True
        return lasted

    def delay(self) -> float:
        """How long to wait before the next write: the poll interval, doubled per failure
        in a row, at most ``cap_s``."""
        return backoff(self.poll_s, self.failures, self.cap_s)

    def exhausted(self, now: float | None = None) -> bool:
        """Whether no write has succeeded for ``limit_s``: time to stop."""
        if self.since is None:
            return False
        now = time.monotonic() if now is None else now
        return now - self.since >= self.limit_s
