"""An append's reads and writes in SQLite's SQL (:class:`~flowscope.store.appending.AppendIO`).

:class:`Writer` runs each statement at once. :class:`Bulk`, for appends
(:meth:`~flowscope.store.sqlite.store.SqliteEventStore.append` and the group commit's
``append_many``), reads the sessions' rows with one query, or takes a session's row from
what this store wrote last (:meth:`Bulk.guard`), collects the rows to write, then writes
them with one statement per table (:meth:`Bulk.write`). A guarded session's row is updated
only if it is still at the ``last_seq`` and ``epoch`` expected: the fence and the seq check
in the update itself, with no read of the row before it. What an append is lives in
:mod:`flowscope.store.appending`.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterable, Iterator, Sequence
from operator import itemgetter
from typing import Any

from ...events import Event
from ...fold import NodeState
from ...states import SessionStatus
from ..appending import (
    FULL_LOAD_MAX,
    Cached,
    OwnerColumn,
    SessionRow,
    SessionWrite,
    guarded_row,
    session_row_of,
)
from ..codec import decode_numbered
from . import queries as q

__all__ = ["Writer", "Bulk", "PATHS_PER_QUERY", "session_row", "in_chunks"]

_SEQ = itemgetter(0)
PATHS_PER_QUERY = 500  # below SQLite's limit on bound parameters


def session_row(
    row: tuple[str, SessionStatus, float | None, float | None, int, int, int, OwnerColumn],
) -> SessionRow:
    """A row of ``SQL_SESSION``: workflow, status, started_at, updated_at, last_seq,
    invocations, epoch, owner (:class:`SessionRow`'s fields, in order; no row id)."""
    return session_row_of(row + (0,))


def in_chunks(values: Sequence[str]) -> Iterator[tuple[str, Sequence[str]]]:
    """``values`` in chunks SQLite can bind, each with its ``(?, ?, ...)`` list."""
    for i in range(0, len(values), PATHS_PER_QUERY):
        chunk = values[i : i + PATHS_PER_QUERY]
        yield "(" + ", ".join("?" * len(chunk)) + ")", chunk


def _advance_params(w: SessionWrite) -> tuple[Any, ...]:
    """The parameters of ``SQL_ADVANCE_SESSION``."""
    return (w.started_at, w.updated_at, w.last_seq, w.invocations, w.session_id)


def _upsert_params(w: SessionWrite) -> tuple[Any, ...]:
    """The parameters of ``SQL_UPSERT_SESSION`` (``submitted_at`` is kept once set)."""
    return (
        w.session_id,
        w.workflow,
        w.status,
        w.started_at,
        w.updated_at,
        w.last_seq,
        w.invocations,
        w.submitted_at,
    )


class Writer:
    """An append's statements on ``conn``, in its open transaction, each run at once."""

    __slots__ = ("conn",)

    def __init__(self, conn: sqlite3.Connection) -> None:
        self.conn = conn

    def session(self, session_id: str) -> SessionRow | None:
        row = self.conn.execute(q.SQL_SESSION, (session_id,)).fetchone()
        return session_row_of(row + (0,)) if row is not None else None

    def all_nodes(self, session_id: str) -> tuple[dict[str, NodeState], bool]:
        # all the session's node states, unless there are many: then the ones the append
        # touches. (A resumed session's appends, a worker's every one, each read the run
        # they start otherwise: a lookup per node.)
        if self.conn.execute(q.SQL_NODE_PAST, (session_id, FULL_LOAD_MAX)).fetchone() is not None:
            return {}, False  # many: counted on the key index, none of their rows read
        found = self.conn.execute(q.SQL_LOAD_ALL_NODES, (session_id,)).fetchall()
        return {ns.path: ns for ns in map(q.node_state, found)}, True

    def nodes(self, session_id: str, paths: list[str]) -> Iterable[NodeState]:
        for marks, chunk in in_chunks(paths):
            for r in self.conn.execute(q.SQL_LOAD_NODES + marks, (session_id, *chunk)):
                yield q.node_state(r)

    def job_events(self, session_id: str, paths: list[str]) -> Iterable[Event]:
        rows = [
            r
            for marks, chunk in in_chunks(paths)
            for r in self.conn.execute(q.SQL_JOB_EVENTS + marks, (session_id, *chunk))
        ]
        rows.sort(key=_SEQ)
        return decode_numbered("the event log", session_id, rows)

    def insert_events(self, rows: list[tuple[Any, ...]]) -> None:
        self.conn.executemany(q.SQL_INSERT_EVENT, rows)

    def upsert_nodes(self, rows: list[tuple[Any, ...]]) -> None:
        self.conn.executemany(q.SQL_UPSERT_NODE, rows)

    def rename_workflow(self, session_id: str, workflow: str) -> None:
        self.conn.execute(q.SQL_RENAME_WORKFLOW, (workflow, session_id))

    def write_session(self, row: SessionWrite) -> int:
        if row.same_status:  # the common step: only the columns that move (see SQL_ADVANCE_SESSION)
            self.conn.execute(q.SQL_ADVANCE_SESSION, _advance_params(row))
        else:
            self.conn.execute(q.SQL_UPSERT_SESSION, _upsert_params(row))
        return 0

    def drop_messages(self, session_id: str, message_ids: list[int]) -> None:
        self.conn.execute(q.SQL_DROP_MESSAGES, {"sid": session_id, "ids": json.dumps(message_ids)})

    def write(self) -> bool:
        """Nothing left to write (each statement ran at once): True, as :meth:`Bulk.write`
        says of rows it wrote."""
        return True


class Bulk(Writer):
    """Appends' statements, collected: the sessions' rows read for all at once
    (:meth:`read_sessions`) or taken from this store's last append (:meth:`guard`), the
    rows to write collected and written by :meth:`write`. Each session once: a session's
    second append would not see its first one's rows."""

    __slots__ = (
        "rows",
        "guarded",
        "event_rows",
        "node_rows",
        "session_rows",
        "advance_rows",
        "advance_guarded",
        "move_guarded",
    )

    def __init__(self, conn: sqlite3.Connection) -> None:
        super().__init__(conn)
        self.rows: dict[str, SessionRow] = {}
        #: The sessions whose row is the one this store wrote last (:meth:`guard`).
        self.guarded: set[str] = set()
        self.event_rows: list[tuple[Any, ...]] = []
        self.node_rows: list[tuple[Any, ...]] = []
        self.session_rows: list[tuple[Any, ...]] = []
        self.advance_rows: list[tuple[Any, ...]] = []
        self.advance_guarded: list[tuple[Any, ...]] = []
        self.move_guarded: list[tuple[Any, ...]] = []

    def read_sessions(self, session_ids: Sequence[str]) -> None:
        rows = self.rows
        for marks, chunk in in_chunks(session_ids):
            for r in self.conn.execute(q.SQL_SESSIONS_IN + marks, chunk):
                rows[r[0]] = session_row_of(r[1:] + (0,))

    def guard(self, session_id: str, cached: Cached, epoch: int) -> None:
        """Take the session's row as this store's last append wrote it (``cached``), under
        ``epoch``: not read, but written only if the stored row still is that one
        (:meth:`write` says whether every guarded row was)."""
        self.rows[session_id] = guarded_row(cached, epoch)
        self.guarded.add(session_id)

    def session(self, session_id: str) -> SessionRow | None:
        return self.rows.get(session_id)

    def insert_events(self, rows: list[tuple[Any, ...]]) -> None:
        self.event_rows += rows

    def upsert_nodes(self, rows: list[tuple[Any, ...]]) -> None:
        self.node_rows += rows

    def write_session(self, row: SessionWrite) -> int:
        sid = row.session_id
        if sid in self.guarded:
            before = self.rows[sid]
            if row.same_status:
                self.advance_guarded.append(
                    (
                        row.started_at,
                        row.updated_at,
                        row.last_seq,
                        row.invocations,
                        sid,
                        before.last_seq,
                        before.epoch,
                    )
                )
            else:
                self.move_guarded.append(
                    (
                        row.workflow,
                        row.status,
                        row.started_at,
                        row.updated_at,
                        row.last_seq,
                        row.invocations,
                        row.submitted_at,
                        sid,
                        before.last_seq,
                        before.epoch,
                    )
                )
        elif row.same_status:
            self.advance_rows.append(_advance_params(row))
        else:
            self.session_rows.append(_upsert_params(row))
        return 0

    def write(self) -> bool:
        """Write the collected rows, one statement per table, the guarded sessions' rows
        first. False, with none of the events and node runs written, if a guarded row was
        not the one expected (another process appended or took the session over): the
        caller rolls the transaction back and appends again reading the rows.

        Rows go in key order: SQLite then walks each B-tree once, left to right, instead of
        jumping to a random leaf per session."""
        conn = self.conn
        guarded = len(self.advance_guarded) + len(self.move_guarded)
        if guarded:
            done = 0
            if self.advance_guarded:
                self.advance_guarded.sort(key=_BY_SESSION_OF_GUARDED_ADVANCE)
                done += conn.executemany(q.SQL_ADVANCE_GUARDED, self.advance_guarded).rowcount
            if self.move_guarded:
                done += conn.executemany(q.SQL_MOVE_GUARDED, self.move_guarded).rowcount
            if done != guarded:
                return False
        event_rows, node_rows = self.event_rows, self.node_rows
        if len(event_rows) > 1:
            event_rows.sort(key=_BY_SESSION_SEQ)
        if len(node_rows) > 1:
            node_rows.sort(key=_BY_SESSION_PATH)
        conn.executemany(q.SQL_INSERT_EVENT, event_rows)
        conn.executemany(q.SQL_UPSERT_NODE, node_rows)
        if self.session_rows:
            conn.executemany(q.SQL_UPSERT_SESSION, self.session_rows)
        if self.advance_rows:
            self.advance_rows.sort(key=_BY_LAST)
            conn.executemany(q.SQL_ADVANCE_SESSION, self.advance_rows)
        return True


# The keys of the rows a group commit writes: (session_id, seq) of an event row,
# (session_id, path) of a node_runs row, the session id last in SQL_ADVANCE_SESSION's
# (fifth in SQL_ADVANCE_GUARDED's).
_BY_SESSION_SEQ = itemgetter(0, 1)
_BY_SESSION_PATH = itemgetter(0, 2)
_BY_LAST = itemgetter(-1)
_BY_SESSION_OF_GUARDED_ADVANCE = itemgetter(4)
