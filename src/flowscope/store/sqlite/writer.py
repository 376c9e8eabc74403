"""An append's reads and writes in SQLite's SQL (:class:`~flowscope.store.appending.AppendIO`).

:class:`Writer` runs each statement at once; :class:`Bulk`, for a group commit
(:meth:`~flowscope.store.sqlite.store.SqliteEventStore.append_many`), reads every
session's row with one query and collects the rows to write, then writes them with one
statement per table. What an append is lives in :mod:`flowscope.store.appending`.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterable, Iterator, Sequence
from operator import itemgetter
from typing import Any

from ...fold import NodeState
from ...states import SessionStatus
from ..appending import OwnerColumn, SessionRow, SessionWrite, make_session_row
from . import queries as q

__all__ = ["Writer", "Bulk", "PATHS_PER_QUERY", "session_row", "in_chunks"]

PATHS_PER_QUERY = 500  # below SQLite's limit on bound parameters


def session_row(
    row: tuple[str, SessionStatus, float | None, float | None, int, int, int, OwnerColumn],
) -> SessionRow:
    """A row of ``SQL_SESSION``: workflow, status, started_at, updated_at, last_seq,
    invocations, epoch, owner (:class:`SessionRow`'s fields, in order; no row id)."""
    return make_session_row(*row, 0)


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
        return session_row(row) if row is not None else None

    def all_nodes(self, session_id: str) -> tuple[dict[str, NodeState], bool]:
        return {}, False  # none read ahead: the append looks up the runs it touches

    def nodes(self, session_id: str, paths: list[str]) -> Iterable[NodeState]:
        for marks, chunk in in_chunks(paths):
            for r in self.conn.execute(q.SQL_LOAD_NODES + marks, (session_id, *chunk)):
                yield q.node_state(r)

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


class Bulk(Writer):
    """A group commit's statements: the sessions' rows read for all at once
    (:meth:`read_sessions`), the rows to write collected and written by :meth:`write`.
    Each session once: a session's second append would not see its first one's rows."""

    __slots__ = ("rows", "event_rows", "node_rows", "session_rows", "advance_rows")

    def __init__(self, conn: sqlite3.Connection) -> None:
        super().__init__(conn)
        self.rows: dict[str, SessionRow] = {}
        self.event_rows: list[tuple[Any, ...]] = []
        self.node_rows: list[tuple[Any, ...]] = []
        self.session_rows: list[tuple[Any, ...]] = []
        self.advance_rows: list[tuple[Any, ...]] = []

    def read_sessions(self, session_ids: Sequence[str]) -> None:
        for marks, chunk in in_chunks(session_ids):
            for (
                sid,
                workflow,
                status,
                started_at,
                updated_at,
                last_seq,
                invocations,
                epoch,
                owner,
            ) in self.conn.execute(q.SQL_SESSIONS_IN + marks, chunk):
                self.rows[sid] = make_session_row(
                    workflow, status, started_at, updated_at, last_seq, invocations, epoch, owner, 0
                )

    def session(self, session_id: str) -> SessionRow | None:
        return self.rows.get(session_id)

    def insert_events(self, rows: list[tuple[Any, ...]]) -> None:
        self.event_rows.extend(rows)

    def upsert_nodes(self, rows: list[tuple[Any, ...]]) -> None:
        self.node_rows.extend(rows)

    def write_session(self, row: SessionWrite) -> int:
        if row.same_status:
            self.advance_rows.append(_advance_params(row))
        else:
            self.session_rows.append(_upsert_params(row))
        return 0

    def write(self) -> None:
        """One statement per table, rows in key order: SQLite then walks each B-tree once,
        left to right, instead of jumping to a random leaf per session."""
        self.event_rows.sort(key=_BY_SESSION_SEQ)
        self.node_rows.sort(key=_BY_SESSION_PATH)
        self.advance_rows.sort(key=_BY_LAST)
        conn = self.conn
        conn.executemany(q.SQL_INSERT_EVENT, self.event_rows)
        conn.executemany(q.SQL_UPSERT_NODE, self.node_rows)
        conn.executemany(q.SQL_UPSERT_SESSION, self.session_rows)
        conn.executemany(q.SQL_ADVANCE_SESSION, self.advance_rows)


# The keys of the rows a group commit writes: (session_id, seq) of an event row,
# (session_id, path) of a node_runs row, the session id last in SQL_ADVANCE_SESSION's.
_BY_SESSION_SEQ = itemgetter(0, 1)
_BY_SESSION_PATH = itemgetter(0, 2)
_BY_LAST = itemgetter(-1)
