"""The lease keeper: one daemon thread per Runner that keeps its invocations' leases.

Every ``lease_s / 3`` seconds it renews the leases of all active invocations and writes
the heartbeats of their in-flight runs: one store call each (``renew_many``,
``heartbeat_many``), so a process with a thousand sessions pays one transaction per
round, not a thousand, and a finishing invocation waits for one short round at most.
It runs off the event loop on purpose: a node that blocks the loop (a sync body, a long
computation) keeps its lease while its process lives, so no other process takes over a
live run. A renewal refused with ``LeaseLost`` hands the loss to the invocation's loop
(``call_soon_threadsafe``), which cancels it.

A lease is trusted only while it is *safe by this process's own clocks*
(:func:`safe_until`): until ``t0 + lease_s`` by ``time.monotonic()``, where ``t0`` is when
the renewal that produced it was requested, and until its ``expires_at`` by
``time.time()`` (the clock other processes judge it by), each less a small margin
(:func:`lease_margin`). Past that, another process may already have taken the session
over, whatever the store would say to a renewal now: the keeper renews no such lease and
hands the invocation :class:`~flowscope.errors.LeaseExpired` instead. The same instants
are checked by the invocation itself before each node body, each retry and each flush
(``Recorder.check_lease`` in ``record.py``: a read of each clock), by a timer on its loop at the lease's
safe end (:meth:`LeaseKeeper._watch`), and on every tick of the keeper. A tick that comes late (the process was stopped, the clock jumped) therefore
ends the invocations whose leases it finds unsafe, and the keeper wakes at the earliest
such instant, so a lease whose renewals keep failing ends on time.
The thread starts with the first active invocation and ends after a period with none.

Because the lease outlives a blocked loop, the keeper also says when a loop is blocked: at
each tick it sends each loop a callback, and one still not run a tick later means the loop
has run nothing since (a sync body without a timeout, or an ``async`` body running blocking
code). It logs that once per stall, with the runs in flight and advice for their kind of
body, since neither their timeouts nor any other session of the process can move until the
loop runs again, and ``stuck`` still sees fresh heartbeats.
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple, Protocol

from ..errors import LeaseExpired, LeaseLost, StoreNotWritable, describe_exception
from ..ownership import Lease
from ..store.base import EventStore
from ..threads import start_thread

__all__ = [
    "LeaseKeeper",
    "Leased",
    "SafeUntil",
    "safe_until",
    "lease_margin",
    "lease_expired",
    "LEASE_MARGIN",
    "MAX_LEASE_MARGIN_S",
    "MIN_BLOCKED_S",
]

log = logging.getLogger("flowscope.engine")


#: The part of a lease not trusted, as a fraction of ``lease_s`` (at most
#: :data:`MAX_LEASE_MARGIN_S`): an owner stops that much before its lease ends by its own
#: clocks, so that it has stopped before another process may take the session over.
LEASE_MARGIN = 0.1
MAX_LEASE_MARGIN_S = 1.0
#: A loop that has not run the keeper's callback for a tick, and at least this long, is
#: said to be blocked (the tick is the shorter of the renewal and heartbeat periods).
MIN_BLOCKED_S = 1.0


def lease_margin(lease_s: float) -> float:
    """How long before its end by this process's clocks a lease of ``lease_s`` is no longer trusted."""
    return min(LEASE_MARGIN * lease_s, MAX_LEASE_MARGIN_S)


#: How many times this process is a fork's child: a keeper started before the fork has no
#: thread in the child (threads do not survive fork()), so it starts one.
_forks = [0]
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=lambda: _forks.__setitem__(0, _forks[0] + 1))


class SafeUntil(NamedTuple):
    """The instants until which a lease is safe to act under: by ``time.monotonic()``
    and by ``time.time()`` (the clock other processes judge it by)."""

    monotonic: float
    wall: float


def safe_until(lease: Lease, lease_s: float, t0: float | None = None) -> SafeUntil:
    """The instants, by ``time.monotonic()`` and by ``time.time()``, until which ``lease``
    (of ``lease_s``) is safe to act under.

    ``t0`` is the ``time.monotonic()`` at which the acquisition or renewal that produced
    the lease was requested (the store counts ``lease_s`` from a wall-clock instant taken
    after it). Without it (a lease taken before the invocation began: a worker's claim,
    ``Runner._take``'s acquire), the lease is taken to run, from now, for what its
    ``expires_at`` says is left by the wall clock, and never for longer than ``lease_s``.
    The monotonic instant is also no later than the wall-clock expiry as the wall clock
    reads now (what the loop's timer waits for); a later jump of the wall clock is seen by
    the wall-clock instant.
    """
    margin = lease_margin(lease_s)
    mono, wall = time.monotonic(), time.time()
    left = lease.expires_at - wall  # by the wall clock, from now
    until = mono + min(left, lease_s) if t0 is None else min(t0 + lease_s, mono + left)
    return SafeUntil(until - margin, lease.expires_at - margin)


def lease_expired(session_id: str, cause: BaseException | None = None) -> BaseException:
    """Why an invocation whose lease on ``session_id`` is no longer safe stops:
    ``LeaseExpired``, or ``cause`` itself when the renewals failed because the store refused
    the writes (a full disk): that is the store's fault, and the caller gets the store's
    error, as for a failed append."""
    if cause is not None:
        return cause
    return LeaseExpired(
        f"the lease on session {session_id!r} may have expired by this process's clock before it was renewed "
        "(the process was stopped, or its renewals failed or came too late): another owner may have taken "
        "the session over, so this one stopped and recorded nothing more"
    )


class Leased(Protocol):
    """What the keeper needs of an invocation's record: its lease and until when it is
    safe, the runs in flight, and ways to tell it, on its own loop, that the lease is
    gone or that mail arrived (``engine/record.py``'s ``Recorder``)."""

    @property
    def lease(self) -> Lease: ...

    @property
    def renew_fault(self) -> BaseException | None:
        """Why the last renewal failed, when the store refused the write (else None)."""

    @property
    def lease_until(self) -> SafeUntil:
        """``safe_until`` of the lease."""

    @property
    def in_flight(self) -> Mapping[str, Any]: ...

    def lease_ok(self) -> bool: ...

    def renewed(self, lease: Lease, t0: float) -> None: ...

    def renew_refused(self, fault: BaseException) -> None: ...

    def lose_lease(self, exc: BaseException) -> None: ...

    def mail_found(self) -> None:
        """Called from the keeper's thread, before ``mail_arrived`` is sent to the loop."""

    def mail_arrived(self) -> None: ...


class _Kept(NamedTuple):
    """An invocation whose lease the keeper keeps, and the loop it runs on."""

    inv: Leased
    loop: asyncio.AbstractEventLoop


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
        self._active: dict[int, _Kept] = {}  # by id of the invocation
        self._busy = threading.Lock()  # held through a round of renewals
        self._thread: threading.Thread | None = None
        self._forks = _forks[0]  # the process's forks when the thread started (a child has none)
        # On each loop, one timer at the earliest instant one of its invocations' leases
        # stops being safe, and that instant in the loop's time (touched only on the loop:
        # add and the timer itself). A loop closed with its timer armed is dropped at the
        # next add.
        self._watches: dict[asyncio.AbstractEventLoop, tuple[float, asyncio.TimerHandle]] = {}
        # Per loop, the probe sent and not run yet: [sent at (monotonic), said blocked]
        self._probes: dict[asyncio.AbstractEventLoop, list[Any]] = {}
        self._probed_at = time.monotonic()  # the keeper's last probe (its thread only)

    def add(self, inv: Leased) -> None:
        """Keep ``inv``'s lease from now on (called on the invocation's loop)."""
        loop = asyncio.get_running_loop()
        with self._lock:
            self._active[id(inv)] = _Kept(inv, loop)
            if self._thread is None or self._forks != _forks[0]:  # none yet, or one of the parent's
                self._thread = start_thread(self._run, self.name)
                self._forks = _forks[0]
        self._watch_at(inv, loop)

    def remove(self, inv: Leased) -> None:
        """Stop keeping ``inv``'s lease. Returns once no renewal of it is in progress, so
        a release that follows is never undone by a late renewal. (The loop's timer stays
        armed: when it fires, it finds the invocations still kept.)"""
        with self._lock:
            self._active.pop(id(inv), None)
        with self._busy:
            pass

    # -- on the loop: a lease that stops being safe while the thread cannot tell (it waits
    # on a renewal the store does not answer), or that expired while the process was stopped

    def _watch_at(self, inv: Leased, loop: asyncio.AbstractEventLoop) -> None:
        """Make sure ``loop``'s timer fires no later than the instant ``inv``'s lease stops
        being safe (one timer per loop, at the earliest of its invocations')."""
        until = inv.lease_until
        at = loop.time() + max(min(until.monotonic - time.monotonic(), until.wall - time.time()), 0.0)
        armed = self._watches.get(loop)
        if armed is not None:
            if armed[0] <= at:
                return  # it fires first, and then looks at every invocation of the loop
            armed[1].cancel()
        elif len(self._watches) > 0:
            for other in [lp for lp in self._watches if lp.is_closed()]:  # its timer will never fire
                del self._watches[other]
        self._watches[loop] = (at, loop.call_at(at, self._watch, loop))

    def _watch(self, loop: asyncio.AbstractEventLoop) -> None:
        """The earliest instant one of ``loop``'s invocations' leases stops being safe: each
        invocation whose lease is no longer safe loses it; the timer moves to the earliest
        instant of those left. A timer of the loop, so after a stop it runs in the same turn
        as the timers of the bodies' ``await``s that expired with it, and cancels those
        bodies before they take their step."""
        self._watches.pop(loop, None)
        with self._lock:
            mine = [k.inv for k in self._active.values() if k.loop is loop]
        for inv in mine:
            if inv.lease_ok():
                self._watch_at(inv, loop)
                continue
            with self._lock:
                self._active.pop(id(inv), None)
            inv.lose_lease(lease_expired(inv.lease.session_id, inv.renew_fault))

    # -- the thread

    def _run(self) -> None:
        try:
            self._rounds()
        finally:  # however it ends, the next add starts a new one
            with self._lock:
                if self._thread is threading.current_thread():
                    self._thread = None

    def _rounds(self) -> None:
        hb = self.heartbeat_interval
        tick = min(self.period, hb) if hb > 0 else self.period
        last_renew = last_beat = time.monotonic()
        idle = False
        wait = tick
        while True:
            time.sleep(wait)
            wait = tick
            with self._lock:
                if not self._active:
                    if idle:  # a whole tick without work: end (the next add starts anew)
                        self._thread = None
                        return
                    idle = True
                    continue
                idle = False
            now = time.monotonic()
            self._probe(tick)
            renew = now - last_renew >= self.period * 0.99
            beat = hb > 0 and now - last_beat >= hb * 0.99
            soonest = self._round(renew, beat)
            if renew:
                last_renew = now
            if beat:
                last_beat = now
            # The next round is due a tick after this one started, not after it ended: a
            # round that takes seconds (thousands of sessions, a slow store) must not push
            # the next renewal past the leases' safe end.
            done = time.monotonic()
            wait = max(now + tick - done, 0.001)
            if soonest is not None:  # wake when a lease whose renewals failed stops being safe
                wait = min(wait, max(soonest - done, 0.001))

    def _probe(self, tick: float) -> None:
        """Send each loop of the kept invocations a callback; say once when one sent a
        tick ago or more has not run: its loop is blocked."""
        now = time.monotonic()
        # A tick this late means the whole process stood still (SIGSTOP, a suspended VM):
        # the loop did too, not blocked by a body; its probes count from now.
        stood_still = now - self._probed_at > 2 * tick
        self._probed_at = now
        blocked: list[tuple[float, list[_Kept]]] = []
        with self._lock:
            by_loop: dict[asyncio.AbstractEventLoop, list[_Kept]] = {}
            for k in self._active.values():
                by_loop.setdefault(k.loop, []).append(k)
            for loop in [lp for lp in self._probes if lp not in by_loop]:  # no invocation left on it
                del self._probes[loop]
            for loop, kept in by_loop.items():
                probe = self._probes.get(loop)
                if probe is None:
                    self._probes[loop] = [now, False]
                    _call_on(loop, self._probed, loop)
                elif stood_still:
                    probe[0] = now
                elif not probe[1] and now - probe[0] >= max(tick * 0.99, MIN_BLOCKED_S):
                    probe[1] = True
                    blocked.append((now - probe[0], kept))
        for waited, kept in blocked:
            runs, inline = [], False
            for k in kept:
                in_flight = k.inv.in_flight
                for path in _innermost(in_flight):
                    runs.append(f"{k.inv.lease.session_id}: {path}")
                    inline = inline or _runs_inline(in_flight.get(path))
            listed = ", ".join(runs[:5]) + (f" and {len(runs) - 5} more" if len(runs) > 5 else "")
            log.warning(
                "the event loop has not turned for %.1f s (runs in flight: %s): %s",
                waited,
                listed or "none",
                _BLOCKED_BY_SYNC if inline else _BLOCKED_BY_ASYNC,
            )

    def _probed(self, loop: asyncio.AbstractEventLoop) -> None:
        """On the loop: the probe ran (and the next tick sends another)."""
        with self._lock:
            probe = self._probes.pop(loop, None)
        if probe is not None and probe[1]:
            log.warning("the event loop runs again, after %.1f s blocked", time.monotonic() - probe[0])

    def _round(self, renew: bool, beat: bool) -> float | None:
        """One round over the invocations kept now; the earliest instant (monotonic) one of
        their leases stops being safe. Its own call so that the list it takes of them dies
        with it: held in ``_rounds``' frame through the sleep, it would keep every
        invocation of the last round (its fold, its node states) alive for a tick after it
        ended, for the garbage collector to walk."""
        with self._busy:
            with self._lock:
                items = list(self._active.values())
            # A lease no longer safe by this process's clocks (a late tick, renewals
            # that failed) is not renewed: its invocation stops (LeaseExpired).
            items = self._unsafe(items)
            # One round, whatever the number of sessions: one store call (one
            # transaction) renews every lease, one more writes every heartbeat.
            if renew:
                items = self._renew(items)
                self._mail(items)
            if beat:
                self._beat(items)
            return min((k.inv.lease_until.monotonic for k in items), default=None)

    def _renew(self, items: list[_Kept]) -> list[_Kept]:
        """Renew the leases of ``items``; returns those still held. A lost one is handed to
        its invocation's loop."""
        if not items:
            return items
        t0 = time.monotonic()  # the renewed leases are safe until t0 + lease_s (safe_until)
        try:
            results = self.store.renew_many([k.inv.lease for k in items], self.lease_s)
        except Exception as exc:  # a store hiccup: the leases still have two thirds of their time
            log.log(
                _level(exc),
                "could not renew the leases of %d sessions: %s",
                len(items),
                describe_exception(exc),
            )
            if isinstance(exc, StoreNotWritable):
                for k in items:
                    k.inv.renew_refused(exc)  # why their leases may end: the store, not a takeover
            return items
        held = []
        for k, result in zip(items, results):
            if isinstance(result, LeaseLost):
                with self._lock:
                    self._active.pop(id(k.inv), None)
                _call_on(k.loop, k.inv.lose_lease, result)
            else:
                k.inv.renewed(result, t0)
                held.append(k)
        return held

    def _mail(self, items: list[_Kept]) -> None:
        """Tell the invocations whose session has a message (a cancel, an answer) so, on
        their loop: one store call per round, so an operator's cancel reaches a live run
        within a lease."""
        if not items:
            return
        try:
            mailed = self.store.sessions_with_mail([k.inv.lease.session_id for k in items])
        except Exception as exc:  # the next round asks again
            log.warning("could not read the inboxes of %d sessions: %s", len(items), describe_exception(exc))
            return
        for k in items:
            if k.inv.lease.session_id in mailed:
                k.inv.mail_found()  # seen by the next body start, should a sync body hold the loop
                _call_on(k.loop, k.inv.mail_arrived)

    def _unsafe(self, items: list[_Kept]) -> list[_Kept]:
        """Hand the invocations of ``items`` whose leases are no longer safe their
        ``LeaseExpired``; returns the others."""
        kept = []
        for k in items:
            inv = k.inv
            if inv.lease_ok():
                kept.append(k)
                continue
            with self._lock:
                self._active.pop(id(inv), None)
            _call_on(k.loop, inv.lose_lease, lease_expired(inv.lease.session_id, inv.renew_fault))
        return kept

    def _beat(self, items: list[_Kept]) -> None:
        """Write the heartbeats of the runs in flight in ``items``."""
        beats: dict[str, list[str]] = {}
        for k in items:
            try:
                paths = list(k.inv.in_flight)  # a copy made under the GIL; the loop mutates it
            except RuntimeError:  # changed size while copying: beat next time
                continue
            if paths:
                beats[k.inv.lease.session_id] = paths
        if not beats:
            return
        try:
            self.store.heartbeat_many(beats)
        except Exception as exc:  # a missed heartbeat must not kill the run
            log.log(_level(exc), "heartbeats failed for %d sessions: %s", len(beats), describe_exception(exc))


_BLOCKED_BY_SYNC = (
    "a sync node without a timeout runs on the loop, so no timeout fires and no other session of "
    "this process moves until it returns; give it a timeout= (it then runs in a thread) or make it "
    "async and await asyncio.to_thread(...) in it"
)
_BLOCKED_BY_ASYNC = (
    "an async node is likely running blocking code (time.sleep, a sync client, a long computation), "
    "so no timeout fires and no other session of this process moves; await asyncio.to_thread(...) "
    "in it, or make it a sync node with a timeout= (it then runs in a thread)"
)


def _runs_inline(run: Any) -> bool:
    """Is ``run`` (a run in flight) a sync body without a timeout: one run on the loop itself?"""
    node = getattr(run, "node", None)
    return bool(getattr(node, "is_sync", False)) and getattr(node, "timeout", None) is None


def _innermost(in_flight: Mapping[str, Any]) -> list[str]:
    """The runs in flight that enclose none of the others: the ones whose code runs."""
    paths = list(in_flight)  # a copy made under the GIL; the loop mutates it
    return [p for p in paths if not any(q.startswith(p + "/") for q in paths)]


def _level(exc: BaseException) -> int:
    """A store that refuses writes reaches the invocation at its next append (and a worker
    says it once per episode): the keeper notes it at INFO, not at every round."""
    return logging.INFO if isinstance(exc, StoreNotWritable) else logging.WARNING


def _call_on(loop: asyncio.AbstractEventLoop, fn: Callable[..., None], *args: Any) -> None:
    try:
        loop.call_soon_threadsafe(fn, *args)
    except RuntimeError:  # the loop is closed: the invocation is over anyway
        pass
