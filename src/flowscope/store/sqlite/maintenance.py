"""Whole-log work in SQLite's SQL, in the caller's transaction: reading a stretch of a log
(a gap is reported, never skipped), rebuilding the projections from the log, pruning
finished sessions (``flowscope prune``), counting job results and the span watermark."""

from __future__ import annotations

import json
import sqlite3
import time
from typing import Any

from ...errors import StoreCorrupt, StoreError
from ...fold import WorkflowState
from ...liveness import owner_alive
from ...ownership import this_host
from ..appending import node_params, owner_from_column, session_write
from ..codec import decode
from . import queries as q
from .writer import Writer

__all__ = [
    "fetch",
    "rebuild_projections",
    "delete_sessions",
    "job_results_after",
    "exported_seq",
    "save_snapshot",
    "load_snapshot",
]


def fetch(conn: sqlite3.Connection, path: str, session_id: str, after_seq: int, last_seq: int) -> list[Any]:
    """The rows of seq ``after_seq + 1 .. last_seq``; a missing one is reported
    (:class:`~flowscope.errors.StoreCorrupt` naming the file at ``path``), not skipped."""
    rows = conn.execute(q.SQL_READ, (session_id, after_seq, last_seq)).fetchall()
    if len(rows) != last_seq - after_seq:
        expected = after_seq + 1
        for (s,) in conn.execute(q.SQL_READ_SEQS, (session_id, after_seq, last_seq)):
            if s != expected:
                break
            expected += 1
        raise StoreCorrupt(
            f"{path}: the log of session {session_id!r} has a gap: seq {expected} is missing "
            f"(the session is at seq {last_seq}); restore the file from a backup"
        )
    return rows


def rebuild_projections(conn: sqlite3.Connection, path: str) -> None:
    """Recompute ``sessions`` and ``node_runs`` from the log (see
    :meth:`~flowscope.store.sqlite.store.SqliteEventStore.rebuild_projections`)."""
    heartbeats = {
        (sid, p): hb
        for sid, p, hb in conn.execute(
            "SELECT session_id, path, heartbeat_at FROM node_runs WHERE status = 'running'"
        )
    }
    conn.execute("DELETE FROM node_runs")
    # sessions rows stay: their ownership columns are not in the log; the upserts
    # below rewrite every column the log defines
    conn.execute("UPDATE sessions SET submitted_at = NULL")
    sessions = conn.execute(
        "SELECT session_id, max(seq) FROM events GROUP BY session_id ORDER BY min(rowid)"
    ).fetchall()
    writer = Writer(conn)
    for session_id, last in sessions:
        events = decode(path, session_id, 0, fetch(conn, path, session_id, 0, last))
        ws = WorkflowState(session_id=session_id)
        apply = ws.apply
        for e in events:
            apply(e)
        rows = []
        for ns in ws.nodes.values():
            hb = heartbeats.get((session_id, ns.path))
            if (
                ns.status == "running"
                and hb is not None
                and (ns.heartbeat_at is None or hb > ns.heartbeat_at)
            ):
                ns.heartbeat_at = hb
            rows.append(node_params(session_id, ws.workflow, ns))
        writer.upsert_nodes(rows)
        writer.write_session(session_write(ws, events, None))  # an upsert of every column the log defines


#: The ``meta`` key of the last prune: ``"N:ROWID"``, the prune's number and the log's last
#: rowid after it.
PRUNE_MARK = "pruned"


def delete_sessions(conn: sqlite3.Connection, ids: list[str]) -> list[str]:
    """Delete those of ``ids`` the prune guard allows (finished, no open run, no live
    owner), checked in this transaction: a resume or a takeover that started after the
    caller chose the sessions keeps its log. The ids deleted, in the order given."""
    now = time.time()
    host = this_host()
    rows = conn.execute(q.SQL_PRUNABLE, {"ids": json.dumps(ids)}).fetchall()
    prunable = {
        sid for sid, owner, lease in rows if not owner_alive(owner_from_column(owner), lease, now, host=host)
    }
    deleted = [sid for sid in ids if sid in prunable]
    if deleted:
        params = {"ids": json.dumps(deleted)}
        for sql in q.SQL_PRUNE:
            conn.execute(sql, params)
        if conn.execute(q.SQL_HAS_SPAN_EXPORTS).fetchone() is not None:
            conn.execute(q.SQL_PRUNE_SPAN_EXPORTS, params)
        # The rowids of rows deleted from the end of the log are used again by the next
        # appends: a count of the rows after a rowid (job_results_after) reads again from
        # the last one left, once per prune (the mark's first part tells prunes apart).
        mark = conn.execute(q.SQL_META, (PRUNE_MARK,)).fetchone()
        n = int(str(mark[0]).split(":")[0]) + 1 if mark is not None else 1
        left = int(conn.execute(q.SQL_LAST_EVENT_ROWID).fetchone()[0])
        conn.execute(q.SQL_SET_META, (PRUNE_MARK, f"{n}:{left}"))
    return deleted


def job_results_after(
    conn: sqlite3.Connection, after: int, pruned: str | None
) -> tuple[list[Any], int, str | None]:
    """The job results appended after rowid ``after``, grouped by (workflow, node, result),
    the log's last rowid now, and the prune mark now (``pruned``: the one seen at ``after``).
    The log's rowids grow with each commit, one writer at a time; a prune since ``after``
    may have deleted rows from the end, whose rowids new rows take again: those are read
    from the last rowid the prune left."""
    row = conn.execute(q.SQL_META, (PRUNE_MARK,)).fetchone()
    mark = None if row is None else str(row[0])
    if mark != pruned and mark is not None:
        after = min(after, int(mark.split(":")[1]))
    upto = int(conn.execute(q.SQL_LAST_EVENT_ROWID).fetchone()[0])
    after = min(after, upto)
    if upto == after:
        return [], upto, mark
    return conn.execute(q.SQL_JOB_RESULTS_AFTER, {"after": after, "upto": upto}).fetchall(), upto, mark


def exported_seq(conn: sqlite3.Connection, session_id: str) -> int:
    """The session's span watermark, 0 if none (no span was ever shipped from this file: no table yet)."""
    try:
        row = conn.execute(q.SQL_EXPORTED_SEQ, (session_id,)).fetchone()
    except sqlite3.OperationalError:
        return 0
    return int(row[0]) if row is not None else 0


def save_snapshot(conn: sqlite3.Connection, path: str, session_id: str, seq: int, data: str) -> None:
    """Keep the session's snapshot at ``seq``; refused if the log is not that far yet."""
    row = conn.execute(q.SQL_LAST_SEQ, (session_id,)).fetchone()
    if row is None or seq > row[0]:
        raise StoreError(f"{path}: a snapshot of session {session_id!r} at seq {seq} is ahead of its log")
    conn.execute(q.SQL_SAVE_SNAPSHOT, (session_id, seq, data))


def load_snapshot(conn: sqlite3.Connection, session_id: str) -> tuple[int, str] | None:
    """The session's last snapshot as ``(seq, data)``, or None."""
    row = conn.execute(q.SQL_LOAD_SNAPSHOT, (session_id,)).fetchone()
    if row is None:
        return None
    seq, data = row
    return int(seq), str(data)
