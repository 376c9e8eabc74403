"""What changed in the store, asked at most once a second and shared by every open page.

Pages never poll the store themselves: the console keeps one :class:`ChangeFeed`, whose
``version`` moves when the store changed. It probes at most once per ``interval`` whoever
asks (an API request, the server-sent-events ticker of every open page together), so a
hundred open pages cost the store what one does.

The probe is the cheapest sign of a change the store offers: for a SQLite file, one
``stat`` of the database and its write-ahead log (no query at all: every commit grows or
rewrites them); for any other store, the digest of ``sessions()`` (one query, whose
answer the session list reuses), asked less often when it is slow (ten times its own
duration at least).
"""

from __future__ import annotations

import asyncio
import os
import threading
import time
from collections.abc import Callable
from typing import Any

from ..store.base import EventStore, SessionInfo

__all__ = ["ChangeFeed", "DEFAULT_INTERVAL_S"]

#: The least time between two probes of the store.
DEFAULT_INTERVAL_S = 1.0


def _file_probe(path: str) -> Callable[[], Any]:
    def probe() -> Any:
        marks: list[tuple[int, int, int] | None] = []
        for p in (path, path + "-wal"):
            try:
                st = os.stat(p)
                marks.append((st.st_ino, st.st_size, st.st_mtime_ns))
            except OSError:
                marks.append(None)
        return tuple(marks)

    return probe


class ChangeFeed:
    """The store's change ``version``, probed at most once per ``interval`` seconds."""

    def __init__(self, store: EventStore, interval: float = DEFAULT_INTERVAL_S) -> None:
        self.store = store
        self.interval = interval
        self._lock = threading.Lock()
        self._version = 0
        self._mark: Any = None
        self._probed_at = 0.0
        self._cost = 0.0
        self._sessions: list[SessionInfo] | None = None
        self._sessions_version = -1
        self.probes = 0  # how many times the store was probed (tests read it)
        path = getattr(store, "path", None)
        self._probe_files = _file_probe(path) if isinstance(path, str) and path != ":memory:" else None

    def _probe(self) -> None:
        t = time.monotonic()
        self.probes += 1
        if self._probe_files is not None:
            mark: Any = self._probe_files()
            sessions = None
        else:
            sessions = self.store.sessions()
            mark = tuple((s.session_id, s.last_seq, s.status, s.updated_at, s.epoch) for s in sessions)
        self._cost = time.monotonic() - t
        self._probed_at = time.monotonic()
        if mark != self._mark:
            self._mark = mark
            self._version += 1
        if sessions is not None:
            self._sessions, self._sessions_version = sessions, self._version

    def version(self) -> int:
        """The change version now: probes the store if the last probe is old enough."""
        with self._lock:
            wait = max(self.interval, 10 * self._cost)
            if self._mark is None or time.monotonic() - self._probed_at >= wait:
                self._probe()
            return self._version

    def changed(self) -> int:
        """Our own write changed the store: a new version at once (no probe needed)."""
        with self._lock:
            self._version += 1
            self._mark = None
            return self._version

    def sessions(self) -> tuple[int, list[SessionInfo]]:
        """Every session (``store.sessions()``), read once per version, and the version."""
        v = self.version()
        with self._lock:
            if self._sessions is None or self._sessions_version != v:
                self._sessions, self._sessions_version = self.store.sessions(), v
            return v, self._sessions

    async def changes(self, poll: float | None = None) -> Any:
        """Yield each new version (asynchronously), probing no faster than ``interval``."""
        loop = asyncio.get_running_loop()
        last = await loop.run_in_executor(None, self.version)
        while True:
            await asyncio.sleep(poll if poll is not None else self.interval)
            v = await loop.run_in_executor(None, self.version)
            if v != last:
                last = v
                yield v
