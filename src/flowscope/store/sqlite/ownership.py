"""Owners, leases and claims in SQLite's SQL, each in the caller's ``BEGIN IMMEDIATE``
transaction (:class:`~flowscope.store.sqlite.store.SqliteEventStore` opens it): the rows
read as records, the rules (who may take a session, which a claim takes) in
:mod:`flowscope.store.takeover`.
"""

from __future__ import annotations

import heapq
import json
import sqlite3
from collections.abc import Collection, Iterable, Sequence
from functools import lru_cache
from typing import Any

from ...errors import LeaseLost
from ...ownership import Lease, Owner, this_host
from ..appending import owner_from_column
from ..base import Claim, dead_owners
from ..takeover import (
    ClaimPick,
    LeaseClock,
    LeaseRow,
    check_acquire,
    claim_candidates,
    claim_cut,
    claim_picks,
    lost_lease,
)
from . import queries as q

__all__ = ["lease_row", "acquire", "acquire_new", "renew", "claim"]

#: The candidates read one workflow at a time, in their index's order, and merged.
_BY_WORKFLOW = ((q.SQL_CLAIM_QUEUED, "queued"), (q.SQL_CLAIM_ANSWERED, "answered"))


def lease_row(conn: sqlite3.Connection, session_id: str) -> LeaseRow | None:
    """The session's ownership columns (``SQL_OWNERSHIP``), None without a row."""
    row = conn.execute(q.SQL_OWNERSHIP, (session_id,)).fetchone()
    if row is None:
        return None
    owner, epoch, lease_expires_at, lease_renewed_at = row
    return LeaseRow(owner_from_column(owner), epoch, lease_expires_at, lease_renewed_at)


@lru_cache(maxsize=64)
def _owner_text(owner: Owner) -> str:
    """The ``owner`` column of ``owner`` (a process's owners are few and immutable)."""
    return json.dumps(owner.to_dict())


def _take(
    conn: sqlite3.Connection,
    session_id: str,
    owner: Owner,
    lease_s: float,
    clock: LeaseClock,
    *,
    recovered: bool,
) -> tuple[Lease, int]:
    """Record ``owner``'s lease on the session (made if missing), epoch + 1, from
    ``clock``'s grant; the lease and the session's last seq."""
    start = clock.grant()
    params = {
        "sid": session_id,
        "owner": _owner_text(owner),
        "expires": start + lease_s,
        "now": start,
        "recovered": int(recovered),
    }
    epoch, last_seq = conn.execute(q.SQL_TAKE, params).fetchone()
    return Lease(session_id, owner, int(epoch), start + lease_s), int(last_seq)


def acquire(
    conn: sqlite3.Connection, session_id: str, owner: Owner, lease_s: float, clock: LeaseClock, *, force: bool
) -> tuple[Lease, int]:
    """:meth:`~flowscope.store.base.EventStore.acquire` in the open transaction: the lease,
    and the session's last seq (0: no events yet)."""
    check_acquire(session_id, owner, lease_row(conn, session_id), clock.now, force=force)
    return _take(conn, session_id, owner, lease_s, clock, recovered=False)


def acquire_new(
    conn: sqlite3.Connection, session_id: str, owner: Owner, lease_s: float, clock: LeaseClock
) -> Lease | None:
    """:meth:`~flowscope.store.base.EventStore.acquire_new` in the open transaction: None,
    with nothing written, if the session has events."""
    row = conn.execute(q.SQL_OWNERSHIP_SEQ, (session_id,)).fetchone()
    held = None
    if row is not None:
        stored, epoch, lease_expires_at, lease_renewed_at, last_seq = row
        if last_seq > 0:
            return None
        held = LeaseRow(owner_from_column(stored), epoch, lease_expires_at, lease_renewed_at)
    check_acquire(session_id, owner, held, clock.now, force=False)
    return _take(conn, session_id, owner, lease_s, clock, recovered=False)[0]


def renew(
    conn: sqlite3.Connection, leases: Sequence[Lease], lease_s: float, now: float
) -> list[Lease | LeaseLost]:
    """:meth:`~flowscope.store.base.EventStore.renew_many` in the open transaction: every
    lease in one ``executemany`` (a worker renews thousands at once, and the loop's
    appends wait for this transaction); only a round that lost one reads the rows back."""
    expires = now + lease_s
    cur = conn.executemany(q.SQL_RENEW, [(expires, now, lease.session_id, lease.epoch) for lease in leases])
    if cur.rowcount == len(leases):  # the usual round: every lease still ours, each renewed
        return [Lease(lease.session_id, lease.owner, lease.epoch, expires) for lease in leases]
    out: list[Lease | LeaseLost] = []
    for lease in leases:  # a lease is ours exactly when the row still has its epoch
        row = lease_row(conn, lease.session_id)
        if row is not None and row.epoch == lease.epoch:
            out.append(Lease(lease.session_id, lease.owner, lease.epoch, expires))
        else:
            out.append(lost_lease(lease.session_id, row, lease.epoch))
    return out


def _since(row: tuple[Any, ...]) -> float:
    return row[5] or 0.0  # NULL first, as ORDER BY has it


def claim(
    conn: sqlite3.Connection,
    owner: Owner,
    workflows: Collection[str],
    lease_s: float,
    *,
    limit: int,
    max_recoveries: int | None,
    clock: LeaseClock,
) -> list[Claim]:
    """:meth:`~flowscope.store.base.EventStore.claim` in the open transaction: up to
    ``limit`` candidates of each reason, then the claim cut. What it reads grows with
    what it takes, not with the queue or the sessions held: the queued and answered
    sessions of each workflow in their index's order (merged, read until ``limit`` are
    found), the ended leases through their index, and the live leases only of owners
    the liveness rule finds dead (asked once per owner, :func:`dead_owners`). Each lease
    starts from ``clock``'s grant as it is taken."""
    now = clock.now
    host = this_host()
    names = sorted(set(workflows))
    params = {"now": now, "workflows": json.dumps(names)}
    found: list[ClaimPick] = []

    def read(rows: Iterable[Any], status: str) -> None:
        found.extend(
            claim_picks(
                claim_candidates(rows, status), now, host=host, max_recoveries=max_recoveries, limit=limit
            )
        )

    for sql, status in _BY_WORKFLOW:
        read(
            heapq.merge(*(conn.execute(sql, {"now": now, "workflow": w}) for w in names), key=_since), status
        )
    read(conn.execute(q.SQL_CLAIM_MAILED, params), "")
    read(conn.execute(q.SQL_CLAIM_ORPHANED, params), "running")
    owners = ((text, owner_from_column(text)) for (text,) in conn.execute(q.SQL_LEASE_OWNERS))
    dead = dead_owners(owners, host)
    if dead:
        read(conn.execute(q.SQL_CLAIM_HELD_BY_DEAD, {**params, "dead": json.dumps(dead)}), "")
    claims = []
    for pick in claim_cut(found, limit):
        lease, _last_seq = _take(conn, pick.session_id, owner, lease_s, clock, recovered=pick.recovers)
        claims.append(Claim(pick.session_id, pick.workflow, pick.reason, lease, handed_back=pick.handed_back))
    return claims
