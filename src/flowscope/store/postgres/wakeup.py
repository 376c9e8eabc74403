"""Waking idle workers: a thread that ``LISTEN``\\s on the store's channel, on a connection
of its own (outside the pool, reconnected after a loss), and wakes whoever waits in
:meth:`Wakeup.wait` when an append or a release made a session claimable on any host."""

from __future__ import annotations

import threading

import psycopg
from psycopg import sql

from ...threads import start_thread

__all__ = ["Wakeup"]


class Wakeup:
    """The notifications on ``channel`` of the database at ``conninfo``; the thread starts
    on the first :meth:`wait` and ends at :meth:`close`."""

    def __init__(self, conninfo: str, channel: str) -> None:
        self._conninfo = conninfo
        self._channel = channel
        self._closing = threading.Event()
        self._wake = threading.Condition()
        self._woken = False
        self._listener: threading.Thread | None = None

    def wait(self, timeout: float) -> bool:
        """Block up to ``timeout`` seconds until a notification; True if woken. One that came
        since the last call returns at once, so none is missed between two waits."""
        if self._listener is None:
            with self._wake:
                if self._listener is None:
                    self._listener = start_thread(self._listen, "flowscope-pg-listen")
        with self._wake:
            if not self._woken and not self._closing.is_set():
                self._wake.wait(timeout)
            woken, self._woken = self._woken, False
        return woken

    def sibling(self, channel: str) -> Wakeup:
        """The notifications on another ``channel`` of the same database (a listener of its
        own, started on its first wait), closed with this one."""
        other = Wakeup(self._conninfo, channel)
        other._closing = self._closing
        return other

    def close(self) -> None:
        """Stop listening; a waiter returns at once."""
        self._closing.set()
        with self._wake:
            self._wake.notify_all()

    def _signal(self) -> None:
        with self._wake:
            self._woken = True
            self._wake.notify_all()

    def _listen(self) -> None:
        """The listener thread: one connection outside the pool, reconnected after a loss."""
        channel = sql.SQL("LISTEN {}").format(sql.Identifier(self._channel))
        while not self._closing.is_set():
            try:
                conn = psycopg.connect(self._conninfo, autocommit=True)
            except psycopg.Error:
                self._closing.wait(1.0)  # the server is away: the waiters poll meanwhile
                continue
            try:
                conn.execute(channel)
                self._signal()  # notifications sent while we were not listening are lost: look once
                while not self._closing.is_set():
                    for _ in conn.notifies(timeout=0.5):
                        self._signal()
            except psycopg.Error:
                self._closing.wait(0.2)
            finally:
                conn.close()
