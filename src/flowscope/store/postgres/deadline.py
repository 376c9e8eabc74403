"""A deadline on every call a store makes to PostgreSQL.

A server that stops answering (its host frozen or SIGSTOPped, a network that drops packets
without a reset) leaves a connection waiting for ever on the caller's thread, which for a
worker is its event loop: no session steps, SIGTERM does not drain, nothing is logged.
TCP keepalives cover a lost network, not a stopped server process, whose kernel still
acknowledges them; and psycopg's waits take no deadline. So one watchdog thread per store
shuts the socket of a call that has lasted past its deadline: libpq's wait returns at once
with the connection lost, and the call fails (:class:`~flowscope.errors.StoreUnavailable`),
which the worker handles as any outage. The server may still carry out what it was sent
(a commit among it): as after a connection lost mid-commit, the caller learns the outcome
from the log, which the fence and the expected ``seq`` keep exact.
"""

from __future__ import annotations

import os
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from typing import Any

from ...threads import start_thread

__all__ = ["Deadlines", "Call", "CALL_TIMEOUT_S"]

#: How long one call may wait for the server by default: longer than any one statement of
#: the store takes on a server that answers, and than the locks an operator's maintenance
#: of a small table holds; short enough that a worker whose server froze drains and says
#: so. (Ecto's default query timeout, which also closes the connection.)
CALL_TIMEOUT_S = 15.0


class Call:
    """One call in flight: its connection's socket, when it is due, and whether the watchdog
    cut it off (read by the caller once the call has ended)."""

    __slots__ = ("fd", "due", "expired")

    def __init__(self, fd: int, due: float) -> None:
        self.fd, self.due, self.expired = fd, due, False


class Deadlines:
    """The calls in flight on one store's connections, and the thread that cuts off those
    past ``seconds`` (``None``: none is ever cut off, and no thread runs)."""

    def __init__(self, seconds: float | None) -> None:
        if seconds is not None and not seconds > 0:
            raise ValueError(f"call_timeout must be a number of seconds above 0, or None, not {seconds!r}")
        self.seconds = seconds
        self._calls: set[Call] = set()
        self._lock = threading.Lock()
        self._closed = threading.Event()
        self._thread: threading.Thread | None = None

    @contextmanager
    def watch(self, conn: Any, watched: bool = True) -> Iterator[Call | None]:
        """Watch a call on ``conn`` (a psycopg connection) for as long as the block runs,
        unless not ``watched``; a connection cut off is closed at the end, not reused."""
        if self.seconds is None or not watched:
            yield None
            return
        call = Call(conn.pgconn.socket, time.monotonic() + self.seconds)
        with self._lock:
            self._calls.add(call)
            if self._thread is None:
                self._start()
        try:
            yield call
        finally:
            # under the lock: once the call is off the set, the watchdog cannot shut the
            # socket of a connection the pool has handed to the next caller
            with self._lock:
                self._calls.discard(call)
            if call.expired:  # the call may have ended as it was cut off
                conn.close()

    def _start(self) -> None:
        # with SIGCONT blocked, as every thread flowscope starts (threads.py)
        self._thread = start_thread(self._watch, "flowscope-pg-deadlines")

    def _watch(self) -> None:
        assert self.seconds is not None
        nap = self.seconds
        # a call that begins while it naps is due a whole deadline later, after it wakes
        while not self._closed.wait(nap):
            now = time.monotonic()
            nap = self.seconds
            with self._lock:
                for call in self._calls:
                    if call.expired:
                        continue
                    if call.due <= now:
                        call.expired = True
                        _shut(call.fd)
                    else:
                        nap = min(nap, call.due - now)

    def close(self) -> None:
        self._closed.set()


def _shut(fd: int) -> None:
    """Shut down the socket ``fd`` (both ways) without closing the descriptor, which the
    connection still owns: its wait wakes with the connection lost."""
    with suppress(OSError):
        sock = socket.socket(fileno=os.dup(fd))
        try:
            sock.shutdown(socket.SHUT_RDWR)
        finally:
            sock.close()
