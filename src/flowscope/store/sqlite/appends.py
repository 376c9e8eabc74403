"""An append's transactions in SQLite: one session's (:func:`append_one`) and a group
commit's (:func:`append_group`), each ``BEGIN IMMEDIATE`` ... ``COMMIT`` on the store's
connection, its lock held by the caller.

A session's next append on the state this store wrote last (its cached fold, at the seq
the caller expects) does not read the session's row: the row is *guarded*
(:meth:`~.writer.Bulk.guard`), written only if it is still at the expected ``last_seq``
and ``epoch``, so the fence and the seq check cost no statement of their own. If another
process moved the row meanwhile, nothing was written: the transaction is rolled back and
the append runs again, reading the row, and raises what a read finds
(``ConcurrencyConflict``, ``LeaseLost``). What an append is lives in
:mod:`flowscope.store.appending`; the statements in :mod:`.writer`.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Mapping, Sequence

from ...errors import ConcurrencyConflict, LeaseLost
from ...events import Event
from ...ownership import Lease
from ..appending import Cached, PreparedBatch, append_steps
from ..codec import Row
from ..ownership import unmailed
from . import queries as q
from . import schema
from .writer import Bulk, Writer, in_chunks

__all__ = ["append_one", "append_group", "release_unmailed", "Outcome"]

#: A group commit's result per batch (its events as stored, or why it was refused), the
#: states its appends left (for :func:`~flowscope.store.appending.keep_states`), and the
#: sessions whose lease it ended.
Outcome = tuple[list[list[Event] | BaseException], dict[str, Cached], set[str]]


def append_one(
    conn: sqlite3.Connection,
    check: Callable[[], None],
    session_id: str,
    events: Sequence[Event],
    encoded: list[Row],
    expected_last_seq: int,
    epoch: int | None,
    cached: Cached | None,
    release: Lease | None = None,
) -> tuple[list[Event], Cached | None, bool]:
    """One append in a transaction of its own; ``check`` runs before the commit (the
    store's -wal watch). Guarded on ``cached`` when it is at ``expected_last_seq`` and the
    append is fenced. With ``release``, the lease ends in the same transaction unless the
    session has mail (:func:`release_unmailed`); the last value says whether it did."""
    if cached is not None and epoch is not None and events and cached.session.last_seq == expected_last_seq:
        bulk = Bulk(conn)
        bulk.guard(session_id, cached, epoch)
        done = _one(conn, check, bulk, session_id, events, encoded, expected_last_seq, epoch, cached, release)
        if done is not None:
            return done
        cached = None  # the row moved: its state moved on with the fold, read the rows
    done = _one(
        conn, check, Writer(conn), session_id, events, encoded, expected_last_seq, epoch, cached, release
    )
    assert done is not None  # a Writer guards nothing
    return done


def _one(
    conn: sqlite3.Connection,
    check: Callable[[], None],
    io: Writer,
    session_id: str,
    events: Sequence[Event],
    encoded: list[Row],
    expected_last_seq: int,
    epoch: int | None,
    cached: Cached | None,
    release: Lease | None,
) -> tuple[list[Event], Cached | None, bool] | None:
    """:func:`append_one`'s transaction through ``io``; None, with nothing written, if a
    row ``io`` guarded had moved."""
    conn.execute("BEGIN IMMEDIATE")
    try:
        numbered, entry = append_steps(io, session_id, events, encoded, expected_last_seq, epoch, cached)
        if not io.write():
            schema.rollback(conn)
            return None
        released = release is not None and bool(release_unmailed(conn, {session_id: release}, [session_id]))
        check()
        conn.execute("COMMIT")
    except BaseException:
        schema.rollback(conn)
        raise
    return numbered, entry, released


def release_unmailed(
    conn: sqlite3.Connection, leases: Mapping[str, Lease], appended: Sequence[str]
) -> set[str]:
    """In the open transaction: end the leases of the ``appended`` sessions that have one in
    ``leases`` and no message in their inbox; the sessions released."""

    def mailed(sids: list[str]) -> set[str]:
        return {
            r[0] for marks, chunk in in_chunks(sids) for r in conn.execute(q.SQL_MAILED_IN + marks, chunk)
        }

    rows = [(lease.session_id, lease.epoch) for lease in unmailed(leases, appended, mailed)]
    if rows:
        conn.executemany(q.SQL_RELEASE, rows)
    return {sid for sid, _epoch in rows}


def append_group(
    conn: sqlite3.Connection,
    check: Callable[[], None],
    prepared: list[PreparedBatch],
    cached: dict[str, Cached | None],
    *,
    unique: bool,
    leases: Mapping[str, Lease] | None = None,
) -> Outcome:
    """A group commit in one transaction. Sessions that come once each (``unique``, the
    usual case) are collected and written with one statement per table; otherwise each
    batch runs in a savepoint. A refused batch writes nothing; its exception is its result.
    With ``leases``, those of the appended sessions without mail end in the same
    transaction (:func:`release_unmailed`)."""
    if not unique:
        return _each(conn, check, prepared, cached, leases)
    done = _bulk(conn, check, prepared, cached, leases, guard=True)
    if done is None:  # a guarded row had moved: nothing written, read them all
        done = _bulk(conn, check, prepared, {}, leases, guard=False)
        assert done is not None
    return done


def _bulk(
    conn: sqlite3.Connection,
    check: Callable[[], None],
    prepared: list[PreparedBatch],
    cached: dict[str, Cached | None],
    leases: Mapping[str, Lease] | None,
    *,
    guard: bool,
) -> Outcome | None:
    """Sessions that each come once, collected (:class:`Bulk`). With ``guard``, a session's
    row this store wrote last is not read but guarded; None, with nothing written, if one
    of them had moved."""
    bulk = Bulk(conn)
    unread = []
    for p in prepared:
        c = cached.get(p.session_id)
        if guard and c is not None and p.epoch is not None and c.session.last_seq == p.expected_last_seq:
            bulk.guard(p.session_id, c, p.epoch)
        else:
            unread.append(p.session_id)
    out: list[list[Event] | BaseException] = []
    kept: dict[str, Cached] = {}
    conn.execute("BEGIN IMMEDIATE")
    try:
        bulk.read_sessions(unread)
        for p in prepared:
            sid = p.session_id
            try:
                numbered, entry = append_steps(
                    bulk, sid, p.events, p.encoded, p.expected_last_seq, p.epoch, cached.get(sid)
                )
            except (ConcurrencyConflict, LeaseLost) as exc:
                out.append(exc)
            else:
                out.append(numbered)
                if entry is not None:
                    kept[sid] = entry
        if not bulk.write():
            schema.rollback(conn)
            return None
        released = release_unmailed(conn, leases, _appended(prepared, out)) if leases else set()
        check()
        conn.execute("COMMIT")
    except BaseException:
        schema.rollback(conn)
        raise
    return out, kept, released


def _each(
    conn: sqlite3.Connection,
    check: Callable[[], None],
    prepared: list[PreparedBatch],
    cached: dict[str, Cached | None],
    leases: Mapping[str, Lease] | None,
) -> Outcome:
    """A session more than once: each batch in a savepoint, its statements run at once, so
    a session's second batch sees its first."""
    out: list[list[Event] | BaseException] = []
    kept: dict[str, Cached] = {}
    io = Writer(conn)
    conn.execute("BEGIN IMMEDIATE")
    try:
        for p in prepared:
            sid = p.session_id
            known = kept.pop(sid, None) or cached.pop(sid, None)
            conn.execute("SAVEPOINT batch")
            try:
                numbered, entry = append_steps(
                    io, sid, p.events, p.encoded, p.expected_last_seq, p.epoch, known
                )
            except (ConcurrencyConflict, LeaseLost) as exc:
                conn.execute("ROLLBACK TO batch")
                out.append(exc)
            else:
                out.append(numbered)
                if entry is not None:
                    kept[sid] = entry
            conn.execute("RELEASE batch")
        released = release_unmailed(conn, leases, _appended(prepared, out)) if leases else set()
        check()
        conn.execute("COMMIT")
    except BaseException:
        schema.rollback(conn)
        raise
    return out, kept, released


def _appended(prepared: list[PreparedBatch], out: list[list[Event] | BaseException]) -> list[str]:
    """The sessions of the batches that were appended (not refused), once each."""
    return list(
        dict.fromkeys(p.session_id for p, r in zip(prepared, out) if not isinstance(r, BaseException))
    )
