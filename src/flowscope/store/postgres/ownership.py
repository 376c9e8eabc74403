"""Owners, leases and claims in PostgreSQL's SQL, each one transaction on the connection
it is given (:class:`~flowscope.store.postgres.store.PostgresEventStore` runs it on a
pooled one): the rows read as records, the rules (who may take a session, which a claim
takes) in :mod:`flowscope.store.takeover`. Rows are locked ``FOR UPDATE``; claims pass
over locked ones (``SKIP LOCKED``), so concurrent claimers never wait for each other.
A lease starts from its :class:`~flowscope.store.takeover.LeaseClock`'s grant, read just
before the statement that takes the rows: a transaction that waited (for a pooled
connection, a lock an operator holds, a slow server) still grants a whole lease.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Collection, Iterable, Mapping, Sequence
from typing import Any

import psycopg
from psycopg.types.json import Jsonb

from ...errors import ConcurrencyConflict, LeaseLost
from ...ownership import Lease, Owner
from ..appending import owner_from_column
from ..base import Claim, dead_owners, unmailed
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
from . import inbox
from . import queries as q

__all__ = ["acquire", "acquire_new_many", "release", "release_unmailed", "renew", "claim"]

Conn = psycopg.Connection[Any]


def _take(
    conn: Conn, sids: list[str], owner: Owner, lease_s: float, clock: LeaseClock, recovered: list[str]
) -> dict[str, Lease]:
    """Record ``owner``'s lease, from ``clock``'s grant, on the (locked) sessions, epoch + 1
    each; their new leases."""
    start = clock.grant()
    params = {
        "owner": Jsonb(owner.to_dict()),
        "expires": start + lease_s,
        "now": start,
        "sids": sids,
        "recovered": recovered,
    }
    epochs = conn.execute(q.SQL_TAKE, params).fetchall()
    start = _regranted(conn, sids, lease_s, clock, start)
    return {sid: Lease(sid, owner, int(epoch), start + lease_s) for sid, epoch in epochs}


def _regranted(conn: Conn, sids: list[str], lease_s: float, clock: LeaseClock, start: float) -> float:
    """When the leases just granted to ``sids`` from ``start`` start: later, and so
    recorded, if the statement that made or took them waited (for a lock it had to take)."""
    later = clock.regrant(start)
    if later is None or not sids:
        return start
    conn.execute(q.SQL_LEASE_FROM, {"expires": later + lease_s, "now": later, "sids": sids})
    return later


def _changed(session_id: str) -> ConcurrencyConflict:
    """A session made and removed while being acquired: nothing holds it."""
    return ConcurrencyConflict(f"session {session_id!r} changed while being acquired; retry")


def _check(session_id: str, owner: Owner, row: Sequence[Any], now: float, *, force: bool) -> None:
    """The acquire rule on a row's ``(owner, epoch, lease_expires_at, lease_renewed_at)``."""
    held, epoch, lease_expires_at, lease_renewed_at = row
    lease = LeaseRow(owner_from_column(held), epoch, lease_expires_at, lease_renewed_at)
    check_acquire(session_id, owner, lease, now, force=force)


def acquire(
    conn: Conn, session_id: str, owner: Owner, lease_s: float, now: float | None, *, force: bool
) -> Lease:
    """:meth:`~flowscope.store.base.EventStore.acquire` in one transaction; the new lease."""
    clock = LeaseClock(now)
    with conn.transaction():
        row = conn.execute(q.SQL_OWNERSHIP_FOR_UPDATE, (session_id,)).fetchone()
        if row is None:
            start = clock.grant()
            made = conn.execute(
                q.SQL_NEW_OWNED, (session_id, Jsonb(owner.to_dict()), start + lease_s, start)
            ).fetchone()
            if made is not None:
                start = _regranted(conn, [session_id], lease_s, clock, start)
                return Lease(session_id, owner, int(made[0]), start + lease_s)
            row = conn.execute(q.SQL_OWNERSHIP_FOR_UPDATE, (session_id,)).fetchone()  # made meanwhile
            if row is None:
                raise _changed(session_id)
        _check(session_id, owner, row, clock.now, force=force)
        return _take(conn, [session_id], owner, lease_s, clock, [])[session_id]


def acquire_new_many(
    conn: Conn, session_ids: Sequence[str], owner: Owner, lease_s: float, now: float | None
) -> tuple[list[Lease | None | ConcurrencyConflict], dict[str, int]]:
    """:meth:`~flowscope.store.base.EventStore.acquire_new_many` of distinct ``session_ids``
    in one transaction: each one's lease, None (it has events: nothing written) or the
    refusal; and the row id of each session it leased. New sessions are made in one insert;
    the rows that exist are locked in key order, checked by the acquire rule and taken in
    one update."""
    if not session_ids:
        return [], {}
    clock = LeaseClock(now)
    ordered = sorted(session_ids)
    answers: dict[str, Lease | None | ConcurrencyConflict] = {}
    with conn.transaction():
        start = clock.grant()
        made = conn.execute(
            q.SQL_NEW_OWNED_MANY,
            {"sids": ordered, "owner": Jsonb(owner.to_dict()), "expires": start + lease_s, "now": start},
        ).fetchall()
        start = _regranted(conn, [sid for sid, _epoch, _id in made], lease_s, clock, start)
        answers.update((sid, Lease(sid, owner, int(epoch), start + lease_s)) for sid, epoch, _id in made)
        row_ids = {sid: int(row_id) for sid, _epoch, row_id in made}
        rest = [sid for sid in ordered if sid not in answers]
        rows = (
            {r[0]: r[1:] for r in conn.execute(q.SQL_OWNERSHIP_SEQ_FOR_UPDATE_MANY, (rest,))} if rest else {}
        )
        take: list[str] = []
        for sid in rest:
            row = rows.get(sid)
            if row is None:
                answers[sid] = _changed(sid)
                continue
            *held, last_seq, row_ids[sid] = row
            if last_seq > 0:
                answers[sid] = None
                continue
            try:  # a refusal writes nothing (the check comes first) and refuses no other
                _check(sid, owner, held, clock.now, force=False)
            except ConcurrencyConflict as exc:
                answers[sid] = exc
            else:
                take.append(sid)
        if take:
            answers.update(_take(conn, take, owner, lease_s, clock, []))
    got = [answers[sid] for sid in session_ids]
    return got, {sid: row_ids[sid] for sid, g in zip(session_ids, got) if isinstance(g, Lease)}


def release(conn: Conn, channel: str, leases: Sequence[Lease]) -> None:
    """End ``leases`` (those whose epoch still holds); a session claimable at once now
    wakes a listening worker (at the commit of the open transaction, if there is one)."""
    params = {"sids": [lease.session_id for lease in leases], "epochs": [lease.epoch for lease in leases]}
    for status, workflow in conn.execute(q.SQL_RELEASE, params).fetchall():
        if status in ("queued", "answered", "running"):  # claimable at once now
            conn.execute(q.SQL_NOTIFY, (channel, workflow or ""))


def release_unmailed(
    conn: Conn, channel: str, leases: Mapping[str, Lease], appended: Iterable[str]
) -> set[str]:
    """In the open transaction: end the leases of the ``appended`` sessions that have one in
    ``leases`` and no message in their inbox (their owner takes those in first); the
    sessions released."""
    free = unmailed(leases, appended, lambda sids: inbox.mailed(conn, sids))
    if free:
        release(conn, channel, free)
    return {lease.session_id for lease in free}


def renew(conn: Conn, leases: Sequence[Lease], lease_s: float, now: float) -> list[Lease | LeaseLost]:
    """:meth:`~flowscope.store.base.EventStore.renew_many` in one transaction (idempotent:
    run twice, it sets the same expiry)."""
    params = {
        "expires": now + lease_s,
        "now": now,
        "sids": [lease.session_id for lease in leases],
        "epochs": [lease.epoch for lease in leases],
    }
    with conn.transaction():
        renewed = {r[0] for r in conn.execute(q.SQL_RENEW_MANY, params).fetchall()}
        lost = [lease.session_id for lease in leases if lease.session_id not in renewed]
        rows = conn.execute(q.SQL_OWNERSHIP_MANY, (lost,)).fetchall() if lost else []
    held = {sid: LeaseRow(owner_from_column(owner), int(epoch)) for sid, owner, epoch in rows}
    out: list[Lease | LeaseLost] = []
    for lease in leases:
        if lease.session_id in renewed:
            out.append(dataclasses.replace(lease, expires_at=now + lease_s))
        else:
            out.append(lost_lease(lease.session_id, held.get(lease.session_id), lease.epoch))
    return out


def claim(
    conn: Conn,
    owner: Owner,
    workflows: Collection[str],
    lease_s: float,
    *,
    limit: int,
    max_recoveries: int | None,
    now: float | None,
    host: str,
) -> list[Claim]:
    """:meth:`~flowscope.store.base.EventStore.claim` in one transaction: the free rows (no
    lease, or an ended one) and the held ones of owners whose process is gone from this
    host (the liveness rule asked once per owner, :func:`dead_owners`, not once per
    session a live worker holds), then the claim cut; the leases start as they are taken."""
    clock = LeaseClock(now)
    now = clock.now
    params = {
        "workflows": sorted(set(workflows)),
        "now": now,
        "limit": limit,
        "host": host,
        "max_recoveries": max_recoveries if max_recoveries is not None else 2**31 - 1,
    }
    found: list[ClaimPick] = []
    with conn.transaction():
        for status, statement in (*q.SQL_CLAIM_FREE.items(), ("", q.SQL_CLAIM_MAILED)):
            rows = conn.execute(statement, params)
            found += claim_picks(
                claim_candidates(rows, status), now, host=host, max_recoveries=max_recoveries
            )
        owners = [row[0] for row in conn.execute(q.SQL_LEASE_OWNERS)]
        gone = dead_owners(((json.dumps(o), owner_from_column(o)) for o in owners), host)
        if gone:
            rows = conn.execute(q.SQL_CLAIM_HELD_BY_DEAD, {**params, "dead": gone})
            dead = claim_picks(claim_candidates(rows), now, host=host, max_recoveries=max_recoveries)
            if dead:
                sids, epochs = [d.session_id for d in dead], [d.epoch for d in dead]
                locked = {
                    r[0] for r in conn.execute(q.SQL_CLAIM_LOCK, (sids, epochs))
                }  # if their epoch has not moved
                found += [d for d in dead if d.session_id in locked]
        chosen = claim_cut(found, limit)
        if not chosen:
            return []
        recovered = [c.session_id for c in chosen if c.recovers]
        taken = _take(conn, [c.session_id for c in chosen], owner, lease_s, clock, recovered)
    return [
        Claim(c.session_id, c.workflow, c.reason, taken[c.session_id], handed_back=c.handed_back)
        for c in chosen
    ]
