"""The heartbeats of a bridge's runs in flight, refreshed from a thread of their own.

A thread, not a task: a node that blocks the event loop (a sync ADK function) or runs in
a worker thread (LangGraph) is still alive, and its heartbeat says so. A round writes the
heartbeats of every session in flight in one store call (``heartbeat_many``: one
transaction on SQLite and PostgreSQL), as a runner's lease keeper does, so a bridge with a
thousand threads in flight pays one transaction per interval, not a thousand. A missed
heartbeat never fails the run it observes.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterable

from ..errors import describe_exception
from ..store.base import EventStore
from ..threads import start_thread

__all__ = ["BridgeHeartbeats"]

log = logging.getLogger("flowscope.adapters")


class BridgeHeartbeats:
    """Marks the runs in flight alive every ``interval`` seconds (0 turns it off)."""

    def __init__(self, store: EventStore, interval: float) -> None:
        self._store = store
        self._interval = interval
        self._lock = threading.Lock()
        self._beating: dict[tuple[str, str], None] = {}  # (session, path) of runs in flight
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()

    def beat(self, session_id: str, paths: Iterable[str]) -> None:
        """Mark ``paths`` of ``session_id`` alive now."""
        try:
            self._store.heartbeat(session_id, list(paths))
        except Exception as exc:  # a missed heartbeat must not fail the run
            log.warning("heartbeat failed for session %s: %s", session_id, describe_exception(exc))

    def track(self, session_id: str, path: str, running: bool) -> None:
        """The run at ``path`` started (``running``) or ended."""
        with self._lock:
            if running:
                self._beating[(session_id, path)] = None
                if self._interval > 0 and self._thread is None:
                    self._thread = start_thread(self._loop, "flowscope-bridge-heartbeat")
            else:
                self._beating.pop((session_id, path), None)

    def _loop(self) -> None:
        while not self._stop.wait(self._interval):
            with self._lock:
                by_session: dict[str, list[str]] = {}
                for sid, path in self._beating:
                    by_session.setdefault(sid, []).append(path)
            if not by_session:
                continue
            try:
                self._store.heartbeat_many(by_session)
            except Exception as exc:  # a missed heartbeat must not fail the run: the next round beats
                log.warning("heartbeats failed for %d sessions: %s", len(by_session), describe_exception(exc))

    def close(self) -> None:
        """Stop the thread."""
        self._stop.set()
        thread = self._thread
        if thread is not None:
            thread.join(timeout=5)
