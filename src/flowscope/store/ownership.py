"""The ownership role: owners, leases, claims and the fence that keeps one writer per
session (:mod:`flowscope.ownership`, :mod:`flowscope.liveness`).

A worker fleet needs it; a store for one process at a time (a notebook, the bridges) may
leave it out. :class:`flowscope.store.testing.OwnershipContract` tests it.
"""

from __future__ import annotations

import dataclasses
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from typing import Any, TypeVar

from ..errors import ConcurrencyConflict, LeaseLost
from ..liveness import owner_alive, process_gone
from ..ownership import Lease, Owner
from .records import MAILED_STATUSES, Claim, ClaimReason, OpenRunGroup, WorkerInfo

__all__ = [
    "Ownership",
    "claim_reason",
    "owned_elsewhere",
    "lease_lost",
    "one_renewal",
    "one_start",
    "wraps_acquire",
    "unmailed",
    "dead_owners",
    "count_dead_owners",
]


def claim_reason(
    status: str,
    owner: Owner | None,
    lease_expires_at: float | None,
    now: float,
    *,
    host: str | None = None,
    mail: bool = False,
) -> ClaimReason | None:
    """Why a worker may claim a session in this state, or None: the claim rule, one copy.

    ``queued`` and ``answered`` sessions nobody holds (with ``mail``, a message in its
    inbox, a ``paused`` one counts as answered and a ``failed`` or ``completed`` one, which
    only a retry can have mail for, as queued), and ``running`` sessions whose recorded
    owner is no longer alive (:func:`~flowscope.liveness.owner_alive`). A running session
    without an owner (a bridge, an older flowscope) is never claimed: only ``flowscope
    resume`` takes it over.
    """
    if mail and status in MAILED_STATUSES:
        status = "answered" if status == "paused" else "queued"
    if status == "queued":
        return None if owner_alive(owner, lease_expires_at, now, host=host) else "queued"
    if status == "answered":
        return None if owner_alive(owner, lease_expires_at, now, host=host) else "answered"
    if status == "running" and owner is not None and not owner_alive(owner, lease_expires_at, now, host=host):
        return "orphaned"
    return None


def owned_elsewhere(
    session_id: str, owner: Owner, lease_expires_at: float | None, renewed_at: float | None, now: float
) -> ConcurrencyConflict:
    """The error :meth:`EventStore.acquire` raises for a session a live owner holds."""
    renewed = f"lease renewed {now - renewed_at:.1f}s ago, " if renewed_at is not None else ""
    left = (lease_expires_at or 0.0) - now
    return ConcurrencyConflict(
        f"session {session_id!r} is owned by {owner.describe()} ({renewed}expires in {left:.1f}s); "
        "wait for it, or stop that process"
    )


def lease_lost(session_id: str, current_epoch: int, current_owner: Owner | None, epoch: int) -> LeaseLost:
    """The error for an append or renewal under ``epoch`` when the session is at ``current_epoch``."""
    by = f" by {current_owner.describe()}" if current_owner is not None else ""
    return LeaseLost(
        f"session {session_id!r} was taken over{by} (its epoch is {current_epoch}, this lease's is {epoch}); "
        "nothing was written"
    )


K = TypeVar("K")


def dead_owners(owners: Iterable[tuple[K, Owner | None]], host: str) -> list[K]:
    """The keys of ``owners`` (each an owner of leases not ended yet) whose process is gone
    from this ``host``: the process half of the liveness rule
    (:func:`~flowscope.liveness.process_gone`) asked once per owner, so a claim or a scrape
    reads /proc once for a worker that holds thousands of sessions, not once per session."""
    return [key for key, o in owners if o is not None and process_gone(o, host=host)]


def count_dead_owners(
    rows: Iterable[Sequence[Any]],
    same_host: Iterable[tuple[str, str, Owner | None, int]],
    host: str,
) -> list[OpenRunGroup]:
    """A SQL open-run summary (``rows`` of :class:`OpenRunGroup` fields) with the running
    runs of dead same-host owners added to ``orphaned``.

    SQL can compare a lease with the clock, but only this process can tell whether an
    owner's process on this host is gone: ``same_host`` holds, per (workflow, node,
    owner), the count of running runs whose lease has not ended, and the owner rule
    decides (:func:`dead_owners`, once per owner).
    """
    counts = list(same_host)
    gone = set(dead_owners(((o, o) for o in {o for _w, _n, o, _c in counts}), host))
    dead: dict[tuple[str, str], int] = {}
    for workflow, node, owner, count in counts:
        if owner in gone:
            dead[(workflow, node)] = dead.get((workflow, node), 0) + count
    groups = [OpenRunGroup(*r) for r in rows]
    if dead:
        groups = [
            dataclasses.replace(g, orphaned=g.orphaned + dead.get((g.workflow, g.node), 0))
            if g.state == "running"
            else g
            for g in groups
        ]
    return groups


def one_renewal(results: Sequence[Lease | LeaseLost]) -> Lease:
    """:meth:`EventStore.renew` as a round of one :meth:`~EventStore.renew_many`: the
    renewed lease, or its ``LeaseLost`` raised (adapters renew one way, not two)."""
    [result] = results
    if isinstance(result, LeaseLost):
        raise result
    return result


def one_start(results: Sequence[Lease | None | ConcurrencyConflict]) -> Lease | None:
    """:meth:`EventStore.acquire_new` as :meth:`~EventStore.acquire_new_many` of one: the
    lease, None, or its refusal raised (adapters start sessions one way, not two)."""
    [result] = results
    if isinstance(result, ConcurrencyConflict):
        raise result
    return result


def wraps_acquire(store: Any, base: type[Any], *, new: bool = False) -> bool:
    """Whether ``store``'s class overrides ``base``'s ``acquire`` (and, with ``new``, its
    ``acquire_new``): a store that takes several starts in one transaction then goes through
    the port's default, one call at a time, so that the wrapper sees each start."""
    cls = type(store)
    return cls.acquire is not base.acquire or (new and cls.acquire_new is not base.acquire_new)


def unmailed(
    leases: Mapping[str, Lease], appended: Iterable[str], mailed: Callable[[list[str]], Collection[str]]
) -> list[Lease]:
    """The leases an invocation's last append ends (``append_and_release``): those in
    ``leases`` of the ``appended`` sessions with no message in their inbox (``mailed`` of
    them, one read): their owner takes a message in first, :mod:`flowscope.engine.inbox`."""
    sids = [sid for sid in appended if sid in leases]
    if not sids:
        return []
    has_mail = mailed(sids)
    return [leases[sid] for sid in sids if sid not in has_mail]


class Ownership(ABC):
    """Leases and claims: who may write a session, and which sessions a worker may take."""

    @abstractmethod
    def acquire(
        self, session_id: str, owner: Owner, lease_s: float, *, force: bool = False, now: float | None = None
    ) -> Lease:
        """Take the session (it need not exist yet) for ``owner`` until ``now + lease_s``.

        If another owner (another ``worker_id``) holds it and is alive
        (:func:`~flowscope.liveness.owner_alive`) and not ``force``, raises
        :class:`~flowscope.errors.ConcurrencyConflict` naming its host, pid and lease
        (:func:`owned_elsewhere`). Otherwise advances the epoch and records the owner and
        lease, atomically; re-acquiring by the same owner advances the epoch too.
        """

    @abstractmethod
    def renew(self, lease: Lease, lease_s: float, *, now: float | None = None) -> Lease:
        """Extend ``lease`` to ``now + lease_s``; :class:`~flowscope.errors.LeaseLost` if the
        session's epoch is no longer ``lease.epoch``. Callable from any thread."""

    def renew_many(
        self, leases: Sequence[Lease], lease_s: float, *, now: float | None = None
    ) -> list[Lease | LeaseLost]:
        """Renew each of ``leases`` (one round of a lease keeper): in order, the renewed
        lease or the :class:`~flowscope.errors.LeaseLost` of one whose epoch moved on.

        This default calls :meth:`renew` for each; the SQLite and PostgreSQL stores renew
        them all in one transaction, so a process running many sessions pays one commit
        per round rather than one per session. Callable from any thread."""
        out: list[Lease | LeaseLost] = []
        for lease in leases:
            try:
                out.append(self.renew(lease, lease_s, now=now))
            except LeaseLost as exc:
                out.append(exc)
        return out

    @abstractmethod
    def release(self, lease: Lease) -> None:
        """End ``lease`` (expiry 0, the owner stays recorded) if its epoch is still current;
        a superseded lease is ignored."""

    @abstractmethod
    def claim(
        self,
        owner: Owner,
        workflows: Collection[str],
        lease_s: float,
        *,
        limit: int,
        max_recoveries: int | None = None,
        now: float | None = None,
    ) -> list[Claim]:
        """Take up to ``limit`` sessions of ``workflows`` that :func:`claim_reason` allows.

        Each gets epoch + 1 and ``owner``'s lease, all in one atomic step, so two claimers
        never get the same session. Oldest first: queued by submit time, answered and
        orphaned by their last event. With ``max_recoveries``, a session
        already taken over as orphaned more than that many times is left alone (it shows
        as orphaned in ``flowscope stuck``).
        """

    @abstractmethod
    def workers_seen(self, owner: Owner, workflows: Collection[str], ts: float | None = None) -> None:
        """Record that worker ``owner`` serves ``workflows`` as of ``ts`` (now); workers not
        seen for :data:`WORKER_RETENTION_S` are forgotten."""

    @abstractmethod
    def workers(self) -> list[WorkerInfo]:
        """The workers recorded by :meth:`workers_seen`, most recently seen first."""

    def wait_for_work(self, timeout: float) -> bool:
        """Block up to ``timeout`` seconds, or less if the store learns that a session became
        claimable (an append made one queued or answered, a lease was released); True if
        woken so. A worker calls it between claims, off the event loop. The default sleeps
        (polling); a store with notifications (PostgreSQL's LISTEN) wakes at once."""
        time.sleep(timeout)
        return False
