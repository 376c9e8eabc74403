"""The SQL the store runs, and the rows it reads and writes.

Every statement takes its values as parameters; the only text built from names is from
our own constants (column names, the open states).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Sequence

from ...fold import NodeState, WorkflowState
from ..base import NodeRun
from .schema import NODE_STATE_COLUMNS, OPEN_WHERE

__all__ = [
    "SQL_SESSION",
    "SQL_LAST_SEQ",
    "SQL_INSERT_EVENT",
    "SQL_READ",
    "SQL_READ_SEQS",
    "SQL_UPSERT_SESSION",
    "SQL_UPSERT_NODE",
    "SQL_LOAD_NODES",
    "SQL_NODE_RUNS",
    "SQL_OPEN_RUNS",
    "SQL_OPEN_SUMMARY",
    "SQL_HEARTBEAT",
    "SQL_SESSIONS",
    "SQL_SAVE_SNAPSHOT",
    "SQL_LOAD_SNAPSHOT",
    "node_state",
    "node_row",
    "session_row",
]

_SESSION_COLUMNS = "workflow, status, started_at, updated_at, last_seq, invocations"
SQL_SESSION = f"SELECT {_SESSION_COLUMNS} FROM sessions WHERE session_id = ?"
SQL_LAST_SEQ = "SELECT last_seq FROM sessions WHERE session_id = ?"
SQL_INSERT_EVENT = (
    "INSERT INTO events (session_id, seq, type, ts, invocation_id, path, node, payload) "
    "VALUES (?, ?, ?, ?, ?, ?, ?, ?)"
)
SQL_READ = (
    "SELECT type, ts, invocation_id, path, node, payload FROM events "
    "WHERE session_id = ? AND seq > ? AND seq <= ? ORDER BY seq"
)
SQL_READ_SEQS = "SELECT seq FROM events WHERE session_id = ? AND seq > ? AND seq <= ? ORDER BY seq"
SQL_UPSERT_SESSION = (
    f"INSERT INTO sessions (session_id, {_SESSION_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?) "
    "ON CONFLICT (session_id) DO UPDATE SET "
    + ", ".join(f"{c} = excluded.{c}" for c in _SESSION_COLUMNS.split(", "))
)
_NODE_ROW_COLUMNS = ("session_id", "workflow") + NODE_STATE_COLUMNS
SQL_UPSERT_NODE = (
    f"INSERT INTO node_runs ({', '.join(_NODE_ROW_COLUMNS)}) "
    f"VALUES ({', '.join('?' for _ in _NODE_ROW_COLUMNS)}) "
    "ON CONFLICT (session_id, path) DO UPDATE SET "
    + ", ".join(f"{c} = excluded.{c}" for c in _NODE_ROW_COLUMNS[1:] if c not in ("path", "heartbeat_at"))
    # heartbeats are written outside the log (heartbeat()): an upsert from a cached state
    # must not move one backwards
    + ", heartbeat_at = CASE WHEN node_runs.heartbeat_at IS NULL OR excluded.heartbeat_at > node_runs.heartbeat_at"
    " THEN excluded.heartbeat_at ELSE node_runs.heartbeat_at END"
)
#: Followed by ``(?, ?, ...)``, one placeholder per path.
SQL_LOAD_NODES = f"SELECT {', '.join(NODE_STATE_COLUMNS)} FROM node_runs WHERE session_id = ? AND path IN "
# In NodeRun field order, so that rows map positionally.
_NODE_RUN_FIELDS = tuple(f.name for f in dataclasses.fields(NodeRun))
SQL_NODE_RUNS = f"SELECT {', '.join(_NODE_RUN_FIELDS)} FROM node_runs"
SQL_OPEN_RUNS = f"{SQL_NODE_RUNS} WHERE {OPEN_WHERE} ORDER BY started_at, rowid"
# flowscope.liveness in SQL, for the scrape: orphaned = a running run whose last heartbeat
# (its start, without one) is missing or before :stale_before (liveness.stale_before);
# overdue = a waiting job with a deadline before :now (liveness.is_overdue). The store
# contract checks that this and liveness.classify_open_run agree case by case.
_LAST_BEAT = "coalesce(heartbeat_at, started_at)"
SQL_OPEN_SUMMARY = (
    "SELECT workflow, node, status, count(*), min(started_at), "
    f"sum(status = 'running' AND ({_LAST_BEAT} IS NULL OR {_LAST_BEAT} < :stale_before)), "
    "sum(status = 'waiting_job' AND job_deadline_at IS NOT NULL AND job_deadline_at < :now) "
    f"FROM node_runs WHERE {OPEN_WHERE} "
    "GROUP BY workflow, node, status ORDER BY workflow, node, status"
)
SQL_HEARTBEAT = "UPDATE node_runs SET heartbeat_at = ? WHERE session_id = ? AND path = ? AND status = 'running'"
SQL_SESSIONS = f"SELECT session_id, {_SESSION_COLUMNS} FROM sessions ORDER BY coalesce(updated_at, 0.0) DESC, rowid"
SQL_SAVE_SNAPSHOT = (
    "INSERT INTO snapshots (session_id, seq, data) VALUES (?, ?, ?) "
    "ON CONFLICT (session_id) DO UPDATE SET seq = excluded.seq, data = excluded.data"
)
SQL_LOAD_SNAPSHOT = "SELECT seq, data FROM snapshots WHERE session_id = ?"


def node_state(row: Sequence[Any]) -> NodeState:
    """A NodeState from a row of ``SQL_LOAD_NODES``."""
    return NodeState(**dict(zip(NODE_STATE_COLUMNS, row)))


def node_row(session_id: str, workflow: str, ns: NodeState) -> tuple[Any, ...]:
    """The parameters of ``SQL_UPSERT_NODE`` for one node state."""
    return (
        session_id,
        workflow,
        ns.path,
        ns.node,
        ns.kind,
        ns.parent_path,
        ns.status,
        ns.attempt,
        ns.failures,
        ns.retries,
        ns.recoveries,
        ns.started_at,
        ns.ended_at,
        ns.heartbeat_at,
        ns.error_code,
        ns.error_type,
        ns.job_deadline_at,
    )


def session_row(ws: WorkflowState) -> tuple[Any, ...]:
    """The parameters of ``SQL_UPSERT_SESSION``."""
    return (ws.session_id, ws.workflow, ws.status, ws.started_at, ws.updated_at, ws.last_seq, ws.invocations)
