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

from ...errors import ConcurrencyConflict, LeaseLost
from ...events import Event
from ...fold import NodeState
from ...jsontext import dumps_finite
from ..appending import (
    FULL_LOAD_MAX,
    Cached,
    PreparedBatch,
    SessionRow,
    SessionWrite,
    append_steps,
    guarded_row,
    session_row_of,
)
from ..codec import Row, decode_numbered
from . import queries as q
from . import schema as sch

__all__ = [
    "Writer",
    "OneStatement",
    "NeedsLock",
    "append_cached",
    "append_many_cached",
    "append_many_locking",
    "applied",
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

    def job_events(self, session_id: str, paths: list[str]) -> Iterable[Event]:
        rows = self.cur.execute(q.SQL_JOB_EVENTS, (session_id, paths)).fetchall()
        return decode_numbered("the event log", session_id, rows)

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

    def job_events(self, session_id: str, paths: list[str]) -> Iterable[Event]:
        raise NeedsLock  # not reached: only states read from rows recall their jobs

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
        params = self.params(channel)
        if params is None:
            return False
        return applied(conn.execute(q.SQL_APPEND_CACHED, params, prepare=True))

    def params(self, channel: str) -> dict[str, Any] | None:
        """:data:`~.queries.SQL_APPEND_CACHED`'s parameters for the collected rows; None if
        there are none or a value has no JSON text."""
        written = self.written
        if written is None:
            return None
        keys, columns = q.EVENT_KEYS, sch.NODE_STATE_COLUMNS
        try:  # allow_nan=False: JSON has no NaN, and the column types would refuse its text
            # an event row after its session id, a node run's after its session and workflow:
            # the statement takes those from the session's row it updates
            events_json = dumps_finite([dict(zip(keys, r[1:])) for r in self.event_rows])
            nodes_json = dumps_finite([dict(zip(columns, r[2:])) for r in self.node_rows])
        except ValueError:
            return None
        row = self.row
        return {
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


def applied(cur: psycopg.Cursor[Any]) -> bool:
    """Did the :data:`~.queries.SQL_APPEND_CACHED` that ``cur`` ran write its append?"""
    found = cur.fetchone()
    return found is not None and found[0] == 1


Appended = tuple[list[list[Event] | BaseException], dict[str, Cached | None]]


def append_many_cached(
    conn: Conn, channel: str, prepared: Sequence[PreparedBatch], cached: dict[str, Cached | None]
) -> Appended | None:
    """A group commit's batches (of distinct sessions, each at the state this store wrote
    last) as one :data:`~.queries.SQL_APPEND_CACHED` each, in session-id order, sent in
    one pipeline (one round trip for the group, not several per session) in a savepoint of
    the caller's open transaction: each batch's events, and the states to keep.

    None, with nothing written, when one of them cannot be made so: a batch without its
    state, or not at its seq, or one that needs the locking path, or whose row moved on
    (its statement matched nothing): the savepoint is rolled back, so the rows the others
    locked are let go and the locking path (:func:`append_many_locking`) locks every row in
    order again. The states it folded on are taken out of ``cached`` (they moved on)."""
    if len({p.session_id for p in prepared}) < len(prepared) or not all(
        p.events and (c := cached.get(p.session_id)) is not None and c.session.last_seq == p.expected_last_seq
        for p in prepared
    ):
        return None
    sent: list[tuple[int, dict[str, Any], list[Event], Cached | None]] = []
    for i in sorted(range(len(prepared)), key=lambda i: prepared[i].session_id):
        p = prepared[i]
        state = cached.pop(p.session_id)
        assert state is not None  # checked above
        io = OneStatement(state, p.epoch)
        try:
            numbered, entry = append_steps(
                io, p.session_id, p.events, p.encoded, p.expected_last_seq, p.epoch, state
            )
        except (NeedsLock, ConcurrencyConflict, LeaseLost):  # the locking path says why
            return None
        params = io.params(channel)
        if params is None:
            return None
        sent.append((i, params, numbered, entry))
    out: list[list[Event] | BaseException] = [[] for _ in prepared]
    entries: dict[str, Cached | None] = {}
    try:
        with conn.transaction():  # a savepoint
            with conn.pipeline():
                cursors = [
                    conn.execute(q.SQL_APPEND_CACHED, params, prepare=True) for _, params, _, _ in sent
                ]
            if not all([applied(cur) for cur in cursors]):
                raise psycopg.Rollback()  # to the savepoint: nothing written, no row held
            for i, _, numbered, entry in sent:
                out[i] = numbered
                entries[prepared[i].session_id] = entry
            return out, entries
    except psycopg.errors.UniqueViolation:  # another process appended first: the locking path says so
        pass
    return None


def append_many_locking(
    conn: Conn, channel: str, prepared: Sequence[PreparedBatch], cached: dict[str, Cached | None]
) -> Appended:
    """A group commit's batches through the locking path in the caller's open transaction,
    in session-id order (so two group commits cannot deadlock), each in a savepoint: a batch
    refused by its fence or its expected ``seq`` writes nothing and its exception is its
    result; an error of the store itself is raised."""
    out: list[list[Event] | BaseException | None] = [None] * len(prepared)
    entries: dict[str, Cached | None] = {}
    io = Writer(conn, channel)
    for i in sorted(range(len(prepared)), key=lambda i: prepared[i].session_id):
        p = prepared[i]
        sid = p.session_id
        known = entries[sid] if sid in entries else cached.pop(sid, None)
        try:
            with conn.transaction():  # a savepoint; the locking path, so rows lock in id order
                numbered, entry = append_steps(
                    io, sid, p.events, p.encoded, p.expected_last_seq, p.epoch, known
                )
        except psycopg.errors.UniqueViolation as exc:
            if exc.diag.constraint_name != "events_pkey":
                raise
            out[i] = appended_first(sid, p.expected_last_seq)
        except (ConcurrencyConflict, LeaseLost) as exc:
            out[i] = exc
        else:
            out[i] = numbered
            entries[sid] = entry
    return [r for r in out if r is not None], entries


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
