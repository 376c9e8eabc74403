"""An append's reads and writes in PostgreSQL's SQL (:class:`~flowscope.store.appending.AppendIO`),
for both of the store's paths through the one append (:func:`~flowscope.store.appending.append_steps`).

:class:`Writer` runs in a transaction that locks the session's row first (``FOR UPDATE``).
:class:`OneStatement`, for a session's next append on the state this store wrote last
(:func:`append_cached`), collects the rows the same steps write and sends them as one
statement whose update of the row, conditional on the row, seq and epoch it expects, takes
the lock and gates the inserts. Numbering, fold and session row are the shared steps' in
both: this module only reads and writes rows."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import psycopg

from ...errors import ConcurrencyConflict
from ...events import Event
from ...fold import NodeState
from ...jsontext import dumps_finite
from ..appending import (
    FULL_LOAD_MAX,
    Cached,
    SessionRow,
    SessionWrite,
    append_steps,
    guarded_row,
    session_row_of,
)
from ..codec import Row
from . import queries as q
from . import schema as sch

__all__ = [
    "Writer",
    "OneStatement",
    "NeedsLock",
    "append_cached",
    "appended_first",
    "session_row",
    "FULL_LOAD_MAX",
]

Conn = psycopg.Connection[Any]


def session_row(row: Sequence[Any]) -> SessionRow:
    """A row of ``SQL_SESSION_FOR_UPDATE`` (:class:`SessionRow`'s columns, in order)."""
    return session_row_of(tuple(row))


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
        return {ns.path: ns for ns in map(_node_state, found)}, True

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
            (
                row.session_id,
                row.workflow,
                row.status,
                row.started_at,
                row.updated_at,
                row.last_seq,
                row.invocations,
                row.submitted_at,
            ),
        ).fetchone()
        if row.woke:
            self.cur.execute(q.SQL_NOTIFY, (self.channel, row.workflow))  # delivered at commit
        if not row.same_status:  # the console's pages: a status moved (one payload: one per commit)
            self.cur.execute(q.SQL_NOTIFY, (self.channel + q.CHANGES_SUFFIX, ""))
        if made is None:
            return 0
        (row_id,) = made
        return int(row_id)

    def drop_messages(self, session_id: str, message_ids: list[int]) -> None:
        self.cur.execute(q.SQL_DROP_MESSAGES, (session_id, message_ids))


class NeedsLock(Exception):
    """The one-statement path cannot make this append: nothing was sent, the locking path runs."""


class OneStatement:
    """The one-statement path's :class:`~flowscope.store.appending.AppendIO`: the session's
    row is the state this store wrote last (``cached``), and the rows :func:`append_steps`
    writes are collected for :data:`~.queries.SQL_APPEND_CACHED`, which :meth:`send` sends.

    The fence and the seq are checked by the statement itself (its update matches the row,
    seq and epoch it expects, or nothing is written), so the row the steps read carries the
    caller's epoch. What only the locking path does (read a node state, rename the runs for
    another workflow) raises :class:`NeedsLock` before anything is sent.
    """

    __slots__ = ("row", "epoch", "event_rows", "node_rows", "written")

    def __init__(self, cached: Cached, epoch: int | None) -> None:
        self.row = guarded_row(cached, epoch if epoch is not None else 0)
        self.epoch = epoch
        self.event_rows: list[tuple[Any, ...]] = []
        self.node_rows: list[tuple[Any, ...]] = []
        self.written: SessionWrite | None = None

    def session(self, session_id: str) -> SessionRow | None:
        return self.row

    def all_nodes(self, session_id: str) -> tuple[dict[str, NodeState], bool]:
        raise NeedsLock  # not reached: the row is the cached one, so the steps fold on its node states

    def nodes(self, session_id: str, paths: list[str]) -> Iterable[NodeState]:
        raise NeedsLock  # a node state to read first

    def insert_events(self, rows: list[tuple[Any, ...]]) -> None:
        self.event_rows = rows

    def upsert_nodes(self, rows: list[tuple[Any, ...]]) -> None:
        self.node_rows = rows

    def rename_workflow(self, session_id: str, workflow: str) -> None:
        raise NeedsLock  # rare (another workflow's run in this session): the locking path renames the runs

    def write_session(self, row: SessionWrite) -> int:
        self.written = row
        return self.row.row_id

    def drop_messages(self, session_id: str, message_ids: list[int]) -> None:
        raise NeedsLock  # not reached: a take-in always locks

    def send(self, conn: Conn, channel: str) -> bool:
        """The collected rows in one :data:`~.queries.SQL_APPEND_CACHED`; False, with
        nothing written, if the session's row is no longer the cached one (or the fence
        fails), or if a value has no JSON text (a NaN or an infinity: the locking path
        sends it as a float)."""
        written = self.written
        if written is None:
            return False
        keys, columns = q.EVENT_KEYS, sch.NODE_STATE_COLUMNS
        try:  # allow_nan=False: JSON has no NaN, and the column types would refuse its text
            # an event row after its session id, a node run's after its session and workflow:
            # the statement takes those from the session's row it updates
            events_json = dumps_finite([dict(zip(keys, r[1:])) for r in self.event_rows])
            nodes_json = dumps_finite([dict(zip(columns, r[2:])) for r in self.node_rows])
        except ValueError:
            return False
        row = self.row
        params = {
            "sid": written.session_id,
            "row_id": row.row_id,
            "expected": row.last_seq,
            "epoch": self.epoch,
            "status": written.status,
            "started_at": written.started_at,
            "updated_at": written.updated_at,
            "last_seq": written.last_seq,
            "invocations": written.invocations,
            "workflow": written.workflow,
            "channel": channel,
            "notify": written.woke,
            "events": events_json,
            "nodes": nodes_json,
            "changes": channel + q.CHANGES_SUFFIX,
            "changed": not written.same_status,
        }
        found = conn.execute(q.SQL_APPEND_CACHED, params, prepare=True).fetchone()
        if found is None:
            return False
        updated, _notified = found
        return bool(updated == 1)


def append_cached(
    conn: Conn,
    channel: str,
    session_id: str,
    events: Sequence[Event],
    encoded: Sequence[Row],
    epoch: int | None,
    cached: Cached,
) -> tuple[list[Event], Cached | None] | None:
    """The append's shared steps (:func:`~flowscope.store.appending.append_steps`) on the
    state this store wrote last, sent as one statement (:class:`OneStatement`); None, with
    nothing written, when that statement cannot make it: the caller takes the locking path.
    The fold moves ``cached``'s node states on either way: the caller drops it."""
    io = OneStatement(cached, epoch)
    last = cached.session.last_seq
    try:
        numbered, entry = append_steps(
            io, session_id, events, encoded, last, epoch, cached
        )  # may raise: nothing sent
    except NeedsLock:
        return None
    if not io.send(conn, channel):
        return None
    return numbered, entry
