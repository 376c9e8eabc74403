"""The lease keeper: one daemon thread per Runner that keeps its invocations' leases.

Every ``lease_s / 3`` seconds it renews the leases of all active invocations and writes
the heartbeats of their in-flight runs: one store call each (``renew_many``,
``heartbeat_many``), so a process with a thousand sessions pays one transaction per
round, not a thousand, and a finishing invocation waits for one short round at most.
It runs off the event loop on purpose: a node that blocks the loop (a sync body, a long
computation) keeps its lease while its process lives, so no other process takes over a
live run. A renewal refused with ``LeaseLost`` hands the loss to the invocation's loop
(``call_soon_threadsafe``), which cancels it.
The thread starts with the first active invocation and ends after a period with none.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from typing import Any, Callable, Mapping, Protocol

from ..errors import LeaseLost, StoreNotWritable, describe_exception
from ..ownership import Lease
from ..store.base import EventStore

__all__ = ["LeaseKeeper", "Leased"]

log = logging.getLogger("flowscope.engine")


class Leased(Protocol):
    """What the keeper needs of an invocation: its lease, the runs in flight, and a way
    to tell it, on its own loop, that the lease is gone."""

    lease: Lease

    @property
    def in_flight(self) -> Mapping[str, Any]: ...

    def lose_lease(self, exc: LeaseLost) -> None: ...


#: An active invocation, by id: itself and its loop.
_Item = tuple[int, tuple[Leased, asyncio.AbstractEventLoop]]


class LeaseKeeper:
    """Renews the leases of a Runner's active invocations from a daemon thread."""

    def __init__(self, store: EventStore, lease_s: float, heartbeat_interval: float, name: str) -> None:
        self.store = store
        self.lease_s = lease_s
        self.period = lease_s / 3
        # Heartbeats of in-flight runs (for stores' stale-run views) every
        # heartbeat_interval; 0 turns them off. The thread ticks at the shorter of the two.
        self.heartbeat_interval = heartbeat_interval
        self.name = name
        self._lock = threading.Lock()
        self._active: dict[int, tuple[Leased, asyncio.AbstractEventLoop]] = {}
        self._busy = threading.Lock()  # held through a round of renewals
        self._thread: threading.Thread | None = None

    def add(self, inv: Leased) -> None:
        """Keep ``inv``'s lease from now on (called on the invocation's loop)."""
        loop = asyncio.get_running_loop()
        with self._lock:
            self._active[id(inv)] = (inv, loop)
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name=self.name, daemon=True)
                self._thread.start()

    def remove(self, inv: Leased) -> None:
        """Stop keeping ``inv``'s lease. Returns once no renewal of it is in progress, so
        a release that follows is never undone by a late renewal."""
        with self._lock:
            self._active.pop(id(inv), None)
        with self._busy:
            pass

    def _run(self) -> None:
        hb = self.heartbeat_interval
        tick = min(self.period, hb) if hb > 0 else self.period
        last_renew = last_beat = time.monotonic()
        idle = False
        while True:
            time.sleep(tick)
            with self._lock:
                if not self._active:
                    if idle:  # a whole tick without work: end (the next add starts anew)
                        self._thread = None
                        return
                    idle = True
                    continue
                idle = False
            now = time.monotonic()
            renew = now - last_renew >= self.period * 0.99
            beat = hb > 0 and now - last_beat >= hb * 0.99
            if not (renew or beat):
                continue
            with self._busy:
                with self._lock:
                    items = list(self._active.items())
                # One round, whatever the number of sessions: one store call (one
                # transaction) renews every lease, one more writes every heartbeat.
                if renew:
                    items = self._renew(items)
                if beat:
                    self._beat(items)
            if renew:
                last_renew = now
            if beat:
                last_beat = now

    def _renew(self, items: list[_Item]) -> list[_Item]:
        """Renew the leases of ``items``; returns those still held. A lost one is handed to
        its invocation's loop."""
        try:
            results = self.store.renew_many([inv.lease for _key, (inv, _loop) in items], self.lease_s)
        except Exception as exc:  # a store hiccup: the leases still have two thirds of their time
            log.log(_level(exc), "could not renew the leases of %d sessions: %s", len(items), describe_exception(exc))
            return items
        held = []
        for (key, (inv, loop)), result in zip(items, results):
            if isinstance(result, LeaseLost):
                with self._lock:
                    self._active.pop(key, None)
                _call_on(loop, inv.lose_lease, result)
            else:
                inv.lease = result
                held.append((key, (inv, loop)))
        return held

    def _beat(self, items: list[_Item]) -> None:
        """Write the heartbeats of the runs in flight in ``items``."""
        beats: dict[str, list[str]] = {}
        for _key, (inv, _loop) in items:
            try:
                paths = list(inv.in_flight)  # a copy made under the GIL; the loop mutates it
            except RuntimeError:  # changed size while copying: beat next time
                continue
            if paths:
                beats[inv.lease.session_id] = paths
        if not beats:
            return
        try:
            self.store.heartbeat_many(beats)
        except Exception as exc:  # a missed heartbeat must not kill the run
            log.log(_level(exc), "heartbeats failed for %d sessions: %s", len(beats), describe_exception(exc))


def _level(exc: BaseException) -> int:
    """A store that refuses writes reaches the invocation at its next append (and a worker
    says it once per episode): the keeper notes it at INFO, not at every round."""
    return logging.INFO if isinstance(exc, StoreNotWritable) else logging.WARNING


def _call_on(loop: asyncio.AbstractEventLoop, fn: Callable[[LeaseLost], None], exc: LeaseLost) -> None:
    try:
        loop.call_soon_threadsafe(fn, exc)
    except RuntimeError:  # the loop is closed: the invocation is over anyway
        pass
