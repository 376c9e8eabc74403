"""What changed in the store, asked at most once a second and shared by every open page.

Pages never poll the store themselves: the console keeps one :class:`ChangeFeed`, whose
``version`` moves when the store changed. It probes at most once per ``interval`` whoever
asks (an API request, the server-sent-events ticker of every open page together), so a
hundred open pages cost the store what one does.

The probe is the cheapest sign of a change the store offers: for a SQLite file, one
``stat`` of the database and its write-ahead log (no query at all: every commit grows or
rewrites them); for any other store, its :meth:`~flowscope.store.log.EventLog.change_mark` (PostgreSQL:
one aggregate row), asked less often when it is slow (ten times its own duration at
least).

A store that can say when it changed (:class:`ChangeNotices`: PostgreSQL listens, ``LISTEN``, on a
channel its appends notify when a session's status moves) wakes the feed: one thread of
the feed waits for its notices, and every open page's ticker (:meth:`ChangeFeed.wait`)
wakes at once; the first to ask probes the store (once, for all of them), so a change
made by another process reaches every open page promptly while the store is still probed
once per notice or per ``interval``, never once per page.

Some changes need no write at all: a lease runs out, an owner's process on this host
dies, a job passes its deadline. What the liveness rule says of the open runs
(:meth:`~flowscope.store.log.EventLog.open_run_summary`: orphaned and overdue runs per
workflow and node) is asked too, at most once per :data:`LIVENESS_INTERVAL_S`, and moves
the version when it changes: a page left open on a session whose worker was killed shows
it orphaned within seconds, not at the store's next write.

The same ``stat`` tells whether the SQLite file is still the one the store opened: a
connection keeps reading the file it opened after that file is deleted or another is put
at its path, so the console would serve the old rows as current and write where nothing
else looks. :meth:`ChangeFeed.check_store` refuses every request then (a 503 that says so).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import threading
import time
from collections.abc import Callable, Hashable
from typing import Any, Protocol, runtime_checkable

from ..errors import StoreUnavailable
from ..store.base import EventStore
from ..store.sqlite import SqliteEventStore
from ..threads import start_thread

__all__ = ["ChangeFeed", "ChangeNotices", "DEFAULT_INTERVAL_S", "LIVENESS_INTERVAL_S", "NOTICE_GAP_S"]

#: The least time between two probes of the store, without a notice.
DEFAULT_INTERVAL_S = 1.0
#: The least time between two probes that notices asked for (a burst of them: one probe).
NOTICE_GAP_S = 0.05
#: The least time between two questions to the liveness rule (a query of the open runs).
LIVENESS_INTERVAL_S = 5.0


@runtime_checkable
class ChangeNotices(Protocol):
    """A store that can wait for another process's change (PostgreSQL: ``LISTEN``)."""

    def wait_for_change(self, timeout: float) -> bool:
        """Block up to ``timeout`` seconds until the store changed; True if it did."""
        ...


def _file_probe(path: str) -> Callable[[], Any]:
    """One ``stat`` of the database and of its write-ahead log: each one's (device, inode,
    size, modification time), or None where the file is missing."""

    def probe() -> Any:
        marks: list[tuple[int, int, int, int] | None] = []
        for p in (path, path + "-wal"):
            try:
                st = os.stat(p)
                marks.append((st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns))
            except OSError:
                marks.append(None)
        return tuple(marks)

    return probe


def _identity(path: str) -> tuple[int, int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_dev, st.st_ino)


class ChangeFeed:
    """The store's change ``version``, probed at most once per ``interval`` seconds."""

    def __init__(
        self,
        store: EventStore,
        interval: float = DEFAULT_INTERVAL_S,
        *,
        stale_after_s: float = 60.0,
        liveness_interval: float = LIVENESS_INTERVAL_S,
    ) -> None:
        self.store = store
        self.interval = interval
        self.stale_after_s = stale_after_s
        self.liveness_interval = liveness_interval
        self._liveness: Hashable = None
        self._liveness_at = 0.0
        self._liveness_cost = 0.0
        self._lock = threading.Lock()
        self._version = 0
        self._mark: Any = None
        self._probed_at = 0.0
        self._cost = 0.0
        self.probes = 0  # how many times the store was probed (tests read it)
        # a SQLite file's own files; never a path-like name of another store (a URL)
        path = store.path if isinstance(store, SqliteEventStore) else None
        self._probe_files = _file_probe(path) if path is not None and path != ":memory:" else None
        #: The database file the store opened (device, inode): the store's connection still
        #: reads it once deleted or replaced, which would be served as if it were current.
        self._path = path
        self._opened = _identity(path) if self._probe_files is not None and path is not None else None
        #: A notice came since the last probe: the next one need not wait for ``interval``.
        self._noticed = False
        self._waiters: set[tuple[asyncio.AbstractEventLoop, asyncio.Event]] = set()
        self._listener: threading.Thread | None = None
        self._closing = threading.Event()
        self._notices = store if self._probe_files is None and isinstance(store, ChangeNotices) else None

    def _listen(self) -> None:
        """The feed's one listening thread: each notice marks the feed and wakes every ticker."""
        assert self._notices is not None
        while not self._closing.is_set():
            t = time.monotonic()
            try:
                noticed = self._notices.wait_for_change(1.0)
            except Exception:  # the store failed: the tickers poll on
                return
            if not noticed and time.monotonic() - t < 0.5:  # a closed store answers at once
                self._closing.wait(1.0)
            if noticed:
                with self._lock:
                    self._noticed = True
                    waiters = list(self._waiters)
                for loop, ev in waiters:
                    with contextlib.suppress(RuntimeError):  # its loop has closed
                        loop.call_soon_threadsafe(ev.set)

    def close(self) -> None:
        """Stop listening for notices (the thread ends within a second)."""
        self._closing.set()

    async def wait(self, timeout: float) -> None:
        """Sleep up to ``timeout`` seconds, less if the store gives notice of a change (then
        the next :meth:`version` probes it). Without notices, a plain sleep."""
        if self._notices is None:
            await asyncio.sleep(timeout)
            return
        if self._listener is None:
            with self._lock:
                if self._listener is None:
                    self._listener = start_thread(self._listen, "flowscope-ui-listen")
        if self._noticed:  # a notice the last probe was too soon for: probe after the gap
            timeout = min(timeout, NOTICE_GAP_S)
        entry = (asyncio.get_running_loop(), asyncio.Event())
        with self._lock:
            self._waiters.add(entry)
        try:
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(entry[1].wait(), timeout)
        finally:
            with self._lock:
                self._waiters.discard(entry)

    def _probe(self) -> None:
        t = time.monotonic()
        self.probes += 1
        self._noticed = False  # a notice during the probe marks it again
        mark: Any
        if self._probe_files is not None:
            mark = self._probe_files()
        else:
            mark = self.store.change_mark()
        self._cost = time.monotonic() - t
        self._probed_at = time.monotonic()
        if mark != self._mark:
            self._mark = mark
            self._version += 1

    def _ask_liveness(self) -> None:
        """What the liveness rule says of the open runs now; a new version if it changed."""
        t = time.monotonic()
        groups = self.store.open_run_summary(time.time(), self.stale_after_s)
        mark = tuple(sorted((g.workflow, g.node, g.state, g.orphaned, g.overdue) for g in groups))
        self._liveness_at = time.monotonic()
        self._liveness_cost = self._liveness_at - t
        if mark != self._liveness:
            if self._liveness is not None:
                self._version += 1
            self._liveness = mark

    def version(self) -> int:
        """The change version now: probes the store if the last probe is old enough, and
        asks the liveness rule if its last answer is."""
        with self._lock:
            wait = max(NOTICE_GAP_S if self._noticed else self.interval, 10 * self._cost)
            if self._mark is None or time.monotonic() - self._probed_at >= wait:
                self._probe()
            if time.monotonic() - self._liveness_at >= max(self.liveness_interval, 10 * self._liveness_cost):
                self._ask_liveness()
            return self._version

    def _file_fault(self, now: tuple[int, int] | None) -> str | None:
        """What is wrong with the database file now at the store's path, or None: it was
        deleted, or another file (another inode) stands there, since the store opened it."""
        if self._opened is None:
            return None
        if now is None:
            return (
                f"the database {self._path} was deleted while the console had it open: what it read is in "
                "no file any more; restart `flowscope ui` with --db at a database that exists"
            )
        if now != self._opened:
            return (
                f"the database {self._path} was replaced by another file while the console had it open "
                "(it would go on reading the old one): restart `flowscope ui` to open the new one"
            )
        return None

    def check_store(self) -> None:
        """Raise :class:`~flowscope.errors.StoreUnavailable` when the SQLite file the store
        opened is deleted or replaced at its path. Reads would answer from the old file and
        writes go where nothing else looks, so neither is served (a 503 with the line). One
        ``stat`` of the file, at every request: not the probe's, which is rate-limited."""
        if self._probe_files is None or self._path is None:
            return
        fault = self._file_fault(_identity(self._path))
        if fault is not None:
            raise StoreUnavailable(fault)

    def changed(self) -> int:
        """Our own write changed the store: a new version at once (no probe needed)."""
        with self._lock:
            self._version += 1
            self._mark = None
            return self._version

    async def changes(self, poll: float | None = None) -> Any:
        """Yield each new version (asynchronously), probing no faster than ``interval``."""
        loop = asyncio.get_running_loop()
        last = await loop.run_in_executor(None, self.version)
        while True:
            await self.wait(poll if poll is not None else self.interval)
            v = await loop.run_in_executor(None, self.version)
            if v != last:
                last = v
                yield v
