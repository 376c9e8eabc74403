"""Who may take a session, one copy for every adapter: the acquire check, the lost lease,
the claim cut (which candidates a claim takes, in which order, how many), and when a
lease it grants starts (:class:`LeaseClock`).

A store reads its rows its own way (SQL with ``FOR UPDATE SKIP LOCKED``, a dict under a
lock) and turns them into the records here; the rules decide. Pure Python: no database
driver is imported here.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from operator import attrgetter
from typing import Any, Protocol

from ..errors import LeaseLost
from ..liveness import owner_alive
from ..ownership import Owner
from .appending import owner_from_column
from .base import MAILED_STATUSES, ClaimReason, claim_reason, lease_lost, owned_elsewhere

__all__ = [
    "LeaseClock",
    "HeldLease",
    "LeaseRow",
    "ClaimCandidate",
    "ClaimPick",
    "check_acquire",
    "lost_lease",
    "claim_rule",
    "claim_picks",
    "handed_back_orphan",
    "claim_cut",
    "claimable_since",
    "claim_candidates",
]


class LeaseClock:
    """The clock of one acquire or claim, made when it begins (in a store with a lock or a
    transaction, once it has it).

    :attr:`now` is the instant it judges the leases it finds by: the caller's ``now``, else
    the wall clock as it begins. :meth:`grant` is the instant a lease it grants starts from:
    the caller's ``now`` again, else the wall clock read at that call, which a store makes
    once the rows are locked, just before the write that takes them. An acquire or a claim
    may wait longer than the lease (for a row or table lock another transaction holds, a
    pooled connection, a slow server): a lease counted from when it began would be over
    when granted, its taker would stop before running anything, and a claim would have
    counted a recovery for a session nobody runs."""

    #: A write that took the rows and then took longer than this (it waited, for a lock
    #: it had to take) grants its leases again, from after it (:meth:`regrant`).
    REGRANT_AFTER_S = 0.05

    __slots__ = ("now", "_given")

    def __init__(self, now: float | None = None) -> None:
        self._given = now
        self.now: float = time.time() if now is None else now

    def grant(self) -> float:
        """When a lease granted now starts: the caller's ``now``, else the wall clock (never
        before :attr:`now`, should the wall clock have stepped back meanwhile)."""
        if self._given is not None:
            return self._given
        return max(self.now, time.time())

    def regrant(self, start: float) -> float | None:
        """A later start for leases granted from ``start`` whose write took long enough to
        have waited (a statement that makes or takes the rows may wait, inside it, for a
        lock): the wall clock now, read after it; None if it did not wait (or the caller
        gave ``now``)."""
        later = self.grant()
        return later if later - start > self.REGRANT_AFTER_S else None


class HeldLease(Protocol):
    """A session's ownership as a store keeps it: its owner, fence and lease."""

    @property
    def owner(self) -> Owner | None: ...

    @property
    def epoch(self) -> int: ...

    @property
    def lease_expires_at(self) -> float | None: ...

    @property
    def lease_renewed_at(self) -> float | None: ...


@dataclass(frozen=True, slots=True)
class LeaseRow:
    """A session's ownership columns as an SQL store reads them (a :class:`HeldLease`)."""

    owner: Owner | None
    epoch: int
    lease_expires_at: float | None = None
    lease_renewed_at: float | None = None


def check_acquire(session_id: str, owner: Owner, held: HeldLease | None, now: float, *, force: bool) -> None:
    """Raise :func:`~flowscope.store.base.owned_elsewhere`'s error if another owner (another
    ``worker_id``) holds the session and is alive, unless ``force``: the acquire rule.
    ``held`` is the session's ownership now (None: nobody ever held it)."""
    if force or held is None:
        return
    holder = held.owner
    if (
        holder is not None
        and holder.worker_id != owner.worker_id
        and owner_alive(holder, held.lease_expires_at, now)
    ):
        raise owned_elsewhere(session_id, holder, held.lease_expires_at, held.lease_renewed_at, now)


def lost_lease(session_id: str, held: HeldLease | None, epoch: int) -> LeaseLost:
    """The error for a write or a renewal under ``epoch`` that the session's ownership
    ``held`` (None: no row) no longer matches."""
    return lease_lost(
        session_id, held.epoch if held is not None else 0, held.owner if held is not None else None, epoch
    )


@dataclass(frozen=True, slots=True)
class ClaimCandidate:
    """A session a claim may take, as the store read it."""

    session_id: str
    workflow: str
    #: The session's status (for a row read for its mail, that row's own).
    status: str
    owner: Owner | None
    lease_expires_at: float | None
    #: Times a claim took it over as orphaned.
    recoveries: int
    #: What orders it among the claim's candidates, oldest first (the store's column: the
    #: submit time of a queued session, the last event of an answered one...).
    since: float | None
    #: A message is in its inbox (:func:`~flowscope.store.base.claim_reason`'s ``mail``).
    mail: bool = False
    #: The epoch it was read at (a store that locks the row later checks it has not moved).
    epoch: int = 0


@dataclass(frozen=True, slots=True)
class ClaimPick:
    """A candidate the claim rule allows, and why."""

    since: float
    session_id: str
    workflow: str
    reason: ClaimReason
    epoch: int = 0
    #: an orphan its owner handed back as it drained (``Owner.handed_back``)
    handed_back: bool = False

    @property
    def recovers(self) -> bool:
        """Taking it is a recovery: an orphan whose owner died, not one handed back."""
        return self.reason == "orphaned" and not self.handed_back


def claim_candidates(rows: Iterable[Sequence[Any]], status: str = "") -> Iterator[ClaimCandidate]:
    """An SQL store's claim rows as candidates, read as they are asked for (a lazy cursor
    reads no further row than the claim takes). A row is ``session_id, workflow, owner``
    (the column), ``lease_expires_at, recoveries, since, epoch``, and then its own status
    or none (then ``status``); a row in a mailed status is there for its mail."""
    for sid, workflow, owner, lease_expires_at, recoveries, since, epoch, *own in rows:
        row_status = own[0] if own else status
        yield ClaimCandidate(
            sid,
            workflow,
            row_status,
            owner_from_column(owner),
            lease_expires_at,
            recoveries,
            since,
            mail=row_status in MAILED_STATUSES,
            epoch=epoch,
        )


def claim_rule(
    c: ClaimCandidate, now: float, *, host: str | None, max_recoveries: int | None
) -> ClaimReason | None:
    """Why a claim may take ``c`` (:func:`~flowscope.store.base.claim_reason`), or None; an
    orphan taken over more than ``max_recoveries`` times is left alone."""
    reason = claim_reason(c.status, c.owner, c.lease_expires_at, now, host=host, mail=c.mail)
    if reason == "orphaned" and max_recoveries is not None and c.recoveries > max_recoveries:
        return None
    return reason


def claim_picks(
    candidates: Iterable[ClaimCandidate],
    now: float,
    *,
    host: str | None,
    max_recoveries: int | None,
    limit: int | None = None,
) -> list[ClaimPick]:
    """The ``candidates`` that :func:`claim_rule` allows, in the order given; with ``limit``
    the first ``limit`` of them, and reading stops there (a lazy cursor reads no further row)."""
    out: list[ClaimPick] = []
    if limit is not None and limit <= 0:
        return out
    for c in candidates:
        reason = claim_rule(c, now, host=host, max_recoveries=max_recoveries)
        if reason is None:
            continue
        out.append(
            ClaimPick(
                c.since or 0.0, c.session_id, c.workflow, reason, c.epoch, handed_back_orphan(c, reason)
            )
        )
        if limit is not None and len(out) >= limit:
            break
    return out


def handed_back_orphan(c: ClaimCandidate, reason: ClaimReason) -> bool:
    """Is ``c`` (claimable for ``reason``) an orphan its owner handed back as it drained?"""
    return reason == "orphaned" and c.owner is not None and c.owner.handed_back


def claimable_since(
    status: str,
    submitted_at: float | None,
    updated_at: float | None,
    lease_expires_at: float | None,
    now: float,
) -> float:
    """When a session became claimable: what a claim orders by, oldest first. A queued
    session since its submission; a running one whose lease ended (an orphan) since the
    lease ended, about when its owner stopped; any other since its last event (the answer
    or message that made it claimable, or the last sign of life of an owner found dead
    before its lease ended). The SQL stores' claim queries say the same."""
    if status == "queued" and submitted_at is not None:
        return submitted_at
    if status == "running" and lease_expires_at and lease_expires_at <= now:
        return lease_expires_at
    return updated_at or 0.0


_OLDEST_FIRST = attrgetter("since", "session_id", "workflow", "reason")


def claim_cut(picks: Iterable[ClaimPick], limit: int) -> list[ClaimPick]:
    """What a claim takes of ``picks``: oldest first (``since``, then the session id), at most ``limit``."""
    return sorted(picks, key=_OLDEST_FIRST)[: max(limit, 0)]
