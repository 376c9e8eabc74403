"""Whole-log work in PostgreSQL's SQL, on the connection it is given: reading a stretch of
a log (a gap is reported, never skipped) and pruning finished sessions (``flowscope
prune``), as :mod:`flowscope.store.sqlite.maintenance` does for SQLite."""

from __future__ import annotations

import time
from typing import Any

import psycopg

from ...errors import StoreCorrupt, StoreError
from ...fold import gc_paused
from ...liveness import owner_alive
from ...ownership import this_host
from ..appending import owner_from_column
from . import queries as q

__all__ = ["fetch", "delete_sessions", "save_snapshot", "load_snapshot", "exported_seq"]

Conn = psycopg.Connection[Any]


def fetch(conn: Conn, where: str, session_id: str, after_seq: int) -> list[Any]:
    """The rows of the session's events after ``after_seq`` up to its ``last_seq`` (none if
    it has none); a missing one is reported (:class:`~flowscope.errors.StoreCorrupt`
    naming the server ``where``), not skipped."""
    found = conn.execute(q.SQL_LAST_SEQ, (session_id,)).fetchone()
    if found is None:
        return []
    (last_seq,) = found
    if last_seq <= after_seq:
        return []
    with gc_paused():  # bounded by last_seq: a concurrent append beyond it cannot tear the read
        rows = conn.execute(q.SQL_READ, (session_id, after_seq, last_seq)).fetchall()
    if len(rows) != last_seq - after_seq:
        expected = after_seq + 1
        for (s,) in conn.execute(q.SQL_READ_SEQS, (session_id, after_seq, last_seq)):
            if s != expected:
                break
            expected += 1
        raise StoreCorrupt(
            f"PostgreSQL at {where}: the log of session {session_id!r} has a gap: seq {expected} is missing "
            f"(the session is at seq {last_seq}); restore the database from a backup"
        )
    return rows


def delete_sessions(conn: Conn, ids: list[str]) -> list[str]:
    """Delete those of ``ids`` the prune guard allows (finished, no open run, no live
    owner), in one transaction that locks their rows first: a resume or a takeover that
    committed before the locks keeps its log. The ids deleted, in the order given."""
    now = time.time()
    host = this_host()
    with conn.transaction():
        conn.execute(q.SQL_PRUNE_LOCK, {"ids": ids})
        # after the locks: a resume or a takeover that committed first keeps its log
        rows = conn.execute(q.SQL_PRUNABLE, {"ids": ids}).fetchall()
        prunable = {
            sid
            for sid, owner, lease in rows
            if not owner_alive(owner_from_column(owner), lease, now, host=host)
        }
        deleted = [sid for sid in ids if sid in prunable]
        if deleted:
            for statement in q.SQL_PRUNE:
                conn.execute(statement, {"ids": deleted})
    return deleted


def save_snapshot(conn: Conn, where: str, session_id: str, seq: int, data: str) -> None:
    """Keep the session's snapshot at ``seq``; refused if the log is not that far yet."""
    with conn.transaction():
        row = conn.execute(q.SQL_LAST_SEQ, (session_id,)).fetchone()
        if row is None or seq > row[0]:
            raise StoreError(
                f"PostgreSQL at {where}: a snapshot of session {session_id!r} at seq {seq} is ahead of its log"
            )
        conn.execute(q.SQL_SAVE_SNAPSHOT, (session_id, seq, data))


def load_snapshot(conn: Conn, session_id: str) -> tuple[int, str] | None:
    """The session's last snapshot as ``(seq, data)``, or None."""
    row = conn.execute(q.SQL_LOAD_SNAPSHOT, (session_id,)).fetchone()
    if row is None:
        return None
    seq, data = row
    return int(seq), str(data)


def exported_seq(conn: Conn, session_id: str) -> int:
    """The session's span watermark, 0 if none."""
    row = conn.execute(q.SQL_EXPORTED_SEQ, (session_id,)).fetchone()
    return int(row[0]) if row is not None else 0
