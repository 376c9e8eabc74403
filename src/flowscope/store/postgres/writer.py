"""An append's reads and writes in PostgreSQL's SQL (:class:`~flowscope.store.appending.AppendIO`),
and the one-statement append on the state this store wrote last.

:class:`Writer` runs in a transaction that locks the session's row first (``FOR UPDATE``);
:func:`append_cached` sends a session's next append as one statement whose update of the
row, conditional on the row, seq and epoch it expects, takes the lock and gates the
inserts. What an append is lives in :mod:`flowscope.store.appending`.
"""

from __future__ import annotations

from typing import Any, Iterable, Sequence

import psycopg

from ...errors import ConcurrencyConflict
from ...events import Event
from ...fold import NodeState
from ...jsontext import dumps_finite
from ..appending import (
    Cached,
    SessionRow,
    SessionWrite,
    make_session_row,
    node_params,
    resumed_state,
    session_write,
    touched_paths,
)
from ..base import number_events
from ..codec import Row
from . import queries as q
from . import schema as sch

__all__ = ["Writer", "append_cached", "appended_first", "session_row", "FULL_LOAD_MAX"]

Conn = psycopg.Connection[Any]
#: Node runs an append loads at most to know all of a session's (more: the ones it touches).
FULL_LOAD_MAX = 2000


def session_row(row: Sequence[Any]) -> SessionRow:
    """A row of ``SQL_SESSION_FOR_UPDATE`` (:class:`SessionRow`'s columns, in order)."""
    workflow, status, started_at, updated_at, last_seq, invocations, epoch, owner, row_id = row
    return make_session_row(workflow, status, started_at, updated_at, last_seq, invocations, epoch, owner, row_id)


def _node_state(row: Sequence[Any]) -> NodeState:
    return NodeState(**dict(zip(sch.NODE_STATE_COLUMNS, row)))


def appended_first(session_id: str, expected_last_seq: int) -> ConcurrencyConflict:
    """The conflict for an append whose first seq another process wrote (``events_pkey``)."""
    return ConcurrencyConflict(
        f"session {session_id!r}: another process appended first (seq {expected_last_seq + 1} exists); "
        "reload the session and retry"
    )


class Writer:
    """An append's statements on one cursor of ``conn``, in its open transaction; a session
    that became claimable sends a ``NOTIFY`` on ``channel`` (delivered at commit)."""

    __slots__ = ("cur", "channel")

    def __init__(self, conn: Conn, channel: str) -> None:
        self.cur = conn.cursor()
        self.channel = channel

    def session(self, session_id: str) -> SessionRow | None:
        row = self.cur.execute(q.SQL_SESSION_FOR_UPDATE, (session_id,)).fetchone()  # the row stays locked
        return session_row(row) if row is not None else None

    def all_nodes(self, session_id: str) -> tuple[dict[str, NodeState], bool]:
        # all the session's node states, unless there are many: then the ones the append touches
        found = self.cur.execute(q.SQL_LOAD_ALL_NODES, (session_id, FULL_LOAD_MAX + 1)).fetchall()
        if len(found) > FULL_LOAD_MAX:
            return {}, False
        return {r[0]: _node_state(r) for r in found}, True

    def nodes(self, session_id: str, paths: list[str]) -> Iterable[NodeState]:
        return [_node_state(r) for r in self.cur.execute(q.SQL_LOAD_NODES, (session_id, paths)).fetchall()]

    def insert_events(self, rows: list[tuple[Any, ...]]) -> None:
        self.cur.executemany(q.SQL_INSERT_EVENT, rows)

    def upsert_nodes(self, rows: list[tuple[Any, ...]]) -> None:
        self.cur.executemany(q.SQL_UPSERT_NODE, rows)

    def rename_workflow(self, session_id: str, workflow: str) -> None:
        self.cur.execute(q.SQL_RENAME_WORKFLOW, (workflow, session_id))

    def write_session(self, row: SessionWrite) -> int:
        made = self.cur.execute(
            q.SQL_UPSERT_SESSION,
            (row.session_id, row.workflow, row.status, row.started_at, row.updated_at, row.last_seq,
             row.invocations, row.submitted_at),
        ).fetchone()
        if row.woke:
            self.cur.execute(q.SQL_NOTIFY, (self.channel, row.workflow))  # delivered at commit
        return int(made[0]) if made is not None else 0

    def drop_messages(self, session_id: str, message_ids: list[int]) -> None:
        self.cur.execute(q.SQL_DROP_MESSAGES, (session_id, message_ids))


def append_cached(
    conn: Conn,
    channel: str,
    session_id: str,
    events: Sequence[Event],
    encoded: Sequence[Row],
    epoch: int | None,
    cached: Cached,
) -> tuple[list[Event], Cached] | None:
    """The append in one statement (:data:`~.queries.SQL_APPEND_CACHED`), folded on the
    state this store wrote last; None, with nothing written, when the session's row is no
    longer that state or the fence fails: the caller takes the locking path. The fold moves
    ``cached``'s node states on either way: the caller drops it."""
    numbered = number_events(session_id, events, cached.session.last_seq, cached.session.last_seq)  # may raise: nothing sent
    nodes = cached.nodes
    paths = touched_paths(numbered)
    if not cached.complete and any(p not in nodes for p in paths):
        return None  # a node state to read first
    before = cached.session
    ws = resumed_state(session_id, before, nodes)
    apply = ws.apply
    for e in numbered:
        apply(e)  # the one definition of what an event means (flowscope.fold)
    if ws.workflow != before.workflow:
        return None  # rare (another workflow's run in this session): the locking path renames the runs
    written = session_write(ws, numbered, before)
    keys, columns = q.EVENT_KEYS, sch.NODE_STATE_COLUMNS
    try:  # allow_nan=False: JSON has no NaN, and the column types would refuse its text
        events_json = dumps_finite([dict(zip(keys, (e.seq,) + enc)) for e, enc in zip(numbered, encoded)])
        nodes_json = dumps_finite(
            [dict(zip(columns, node_params(session_id, ws.workflow, ws.nodes[p])[2:])) for p in paths if p in ws.nodes]
        )
    except ValueError:
        return None  # a NaN or an infinity: the locking path sends it as a float
    params = {
        "sid": session_id, "row_id": cached.row_id, "expected": cached.session.last_seq, "epoch": epoch,
        "status": written.status, "started_at": written.started_at, "updated_at": written.updated_at,
        "last_seq": written.last_seq, "invocations": written.invocations, "workflow": written.workflow,
        "channel": channel, "notify": written.woke, "events": events_json, "nodes": nodes_json,
    }
    row = conn.execute(q.SQL_APPEND_CACHED, params, prepare=True).fetchone()
    if row is None or row[0] != 1:
        return None
    return numbered, Cached(written, cached.row_id, cached.complete, ws.nodes)
