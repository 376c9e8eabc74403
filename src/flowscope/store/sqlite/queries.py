"""The SQL the store runs, and the rows it reads and writes.

Every statement takes its values as parameters; the only text built from names is from
our own constants (column names, the open states).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence
from typing import Any

from ...fold import NodeState
from ..base import FINISHED_SESSION_STATUSES, NodeRun
from ..projection_sql import open_where
from ..select_sql import Dialect
from .schema import NODE_STATE_COLUMNS, OPEN_WHERE

__all__ = [
    "SQL_SESSIONS_IN",
    "SQL_CREATE_SPAN_EXPORTS",
    "SQL_EXPORTED_SEQ",
    "SQL_SET_EXPORTED_SEQ",
    "SQL_SESSION",
    "DIALECT",
    "SQL_LAST_SEQ",
    "SQL_INSERT_EVENT",
    "SQL_READ",
    "SQL_READ_SEQS",
    "SQL_UPSERT_SESSION",
    "SQL_ADVANCE_SESSION",
    "SQL_ADVANCE_GUARDED",
    "SQL_MOVE_GUARDED",
    "SQL_RENAME_WORKFLOW",
    "SQL_UPSERT_NODE",
    "SQL_LOAD_NODES",
    "SQL_JOB_EVENTS",
    "SQL_LOAD_ALL_NODES",
    "SQL_NODE_PAST",
    "SQL_NODE_RUNS",
    "SQL_OPEN_RUNS",
    "SQL_OPEN_SUMMARY",
    "SQL_HEARTBEAT",
    "SQL_SESSIONS",
    "SQL_OPEN_SAME_HOST",
    "SQL_SESSION_INFO",
    "SQL_OWNERSHIP",
    "SQL_OWNERSHIP_SEQ",
    "SQL_MAILED_IN",
    "SQL_TAKE",
    "SQL_RENEW",
    "SQL_RELEASE",
    "SQL_CLAIM_QUEUED",
    "SQL_CLAIM_ANSWERED",
    "SQL_CLAIM_ORPHANED",
    "SQL_CLAIM_MAILED",
    "SQL_LEASE_OWNERS",
    "SQL_CLAIM_HELD_BY_DEAD",
    "SQL_SEND",
    "SQL_INBOX",
    "SQL_DROP_MESSAGES",
    "SQL_MAILED",
    "SQL_QUEUED_SUMMARY",
    "SQL_JOB_RESULTS_AFTER",
    "SQL_LAST_EVENT_ROWID",
    "SQL_META",
    "SQL_SET_META",
    "SQL_WORKER_SEEN",
    "SQL_WORKERS_FORGET",
    "SQL_WORKERS",
    "SQL_SAVE_SNAPSHOT",
    "SQL_LOAD_SNAPSHOT",
    "SQL_PRUNABLE",
    "PRUNE_TABLES",
    "SQL_PRUNE",
    "SQL_HAS_SPAN_EXPORTS",
    "SQL_UNEXPORTED",
    "SQL_PRUNE_SPAN_EXPORTS",
    "SQL_STORAGE_BYTES",
    "node_state",
]

_SESSION_COLUMNS = "workflow, status, started_at, updated_at, last_seq, invocations"
#: The fold's columns (a row made by acquire() before the first append has none yet)
#: and the fence, for an append.
SQL_SESSION = (
    "SELECT coalesce(workflow, ''), coalesce(status, 'new'), started_at, updated_at, last_seq, "
    "coalesce(invocations, 0), epoch, owner FROM sessions WHERE session_id = ?"
)
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
    f"INSERT INTO sessions (session_id, {_SESSION_COLUMNS}, submitted_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?) "
    "ON CONFLICT (session_id) DO UPDATE SET "
    + ", ".join(f"{c} = excluded.{c}" for c in _SESSION_COLUMNS.split(", "))
    + ", submitted_at = coalesce(excluded.submitted_at, sessions.submitted_at)"
)
#: An append that leaves a session's workflow and status as they were: only the columns that
#: move. The upsert above sets ``status`` too, and SQLite rewrites the entries of every partial
#: index on a column the statement sets (``sessions_running`` on each step of a running
#: session), one WAL page more per commit.
SQL_ADVANCE_SESSION = (
    "UPDATE sessions SET started_at = ?, updated_at = ?, last_seq = ?, invocations = ? WHERE session_id = ?"
)
#: A session's next append on the row this store wrote last (the writer's cache): the update
#: applies only if the row is still at the expected ``last_seq`` and ``epoch`` (nobody else
#: appended or took the session since), which is the fence and the seq check in one
#: statement, no read of the row first. ``rowcount`` 0: nothing written, the append reads.
SQL_ADVANCE_GUARDED = SQL_ADVANCE_SESSION + " AND last_seq = ? AND epoch = ?"
#: The same, for an append that moves the session's status or workflow.
SQL_MOVE_GUARDED = (
    "UPDATE sessions SET workflow = ?, status = ?, started_at = ?, updated_at = ?, last_seq = ?, "
    "invocations = ?, submitted_at = coalesce(?, submitted_at) "
    "WHERE session_id = ? AND last_seq = ? AND epoch = ?"
)
#: Another workflow's run in a session: every node run takes its name.
SQL_RENAME_WORKFLOW = "UPDATE node_runs SET workflow = ? WHERE session_id = ?"
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
#: A session's job events at some paths (``?`` marks appended, :func:`~.writer.in_chunks`).
SQL_JOB_EVENTS = (
    "SELECT seq, type, ts, invocation_id, path, node, payload FROM events "
    "WHERE session_id = ? AND type IN ('job_dispatched', 'job_result') AND path IN "
)
#: Followed by ``(?, ?, ...)``, one placeholder per path.
SQL_LOAD_NODES = f"SELECT {', '.join(NODE_STATE_COLUMNS)} FROM node_runs WHERE session_id = ? AND path IN "
#: Every node run of a session.
SQL_LOAD_ALL_NODES = f"SELECT {', '.join(NODE_STATE_COLUMNS)} FROM node_runs WHERE session_id = ?"
#: A row if the session has more than ``?`` node runs (a walk of its key index, no row read).
SQL_NODE_PAST = "SELECT 1 FROM node_runs WHERE session_id = ? LIMIT 1 OFFSET ?"
# In NodeRun field order, so that rows map positionally.
_NODE_RUN_FIELDS = tuple(f.name for f in dataclasses.fields(NodeRun))
SQL_NODE_RUNS = f"SELECT {', '.join(_NODE_RUN_FIELDS)} FROM node_runs"
SQL_OPEN_RUNS = f"{SQL_NODE_RUNS} WHERE {OPEN_WHERE} ORDER BY started_at, rowid"
# flowscope.liveness in SQL, for the scrape: orphaned = a running run whose last heartbeat
# (its start, without one) is missing or before :stale_before (liveness.stale_before);
# overdue = a waiting job with a deadline before :now (liveness.is_overdue). The store
# contract checks that this and liveness.classify_open_run agree case by case.
# A run of a session with an owner is orphaned by the owner rule instead
# (liveness.owner_alive): here, when its lease has ended; SQL_OPEN_SAME_HOST lists the
# running runs of this host's owners whose lease has not, for the process check in Python.
_LAST_BEAT = "coalesce(n.heartbeat_at, n.started_at)"
_OPEN_WHERE_N = open_where("n.status", as_or=True)  # schema.OPEN_WHERE, on the aliased table
# A container is not counted (flowscope.fold.containers: an open run at "path/..." of the
# same session): the paths below n.path, in binary order, are those in [path + "/", path + "0").
# Looked up among the open runs only (the CTE "o", read through the open-runs index, which
# SQLite indexes on the fly): through the primary key it would visit every finished run below
# a root (measured: 1,000,000 events, 2% of sessions open, 7 -> 1.4 ms a scrape). MATERIALIZED
# (SQLite 3.35, as RETURNING): inlined, the lookup goes back to the primary key.
_OPEN_CTE = f"WITH o AS MATERIALIZED (SELECT session_id, path FROM node_runs WHERE {open_where(as_or=True)}) "
_NOT_CONTAINER = (
    "NOT EXISTS (SELECT 1 FROM o WHERE o.session_id = n.session_id "
    "AND o.path > n.path || '/' AND o.path < n.path || '0')"
)
SQL_OPEN_SUMMARY = (
    _OPEN_CTE + "SELECT n.workflow, n.node, n.status, count(*), min(coalesce(n.restarted_at, n.started_at)), "
    "sum(n.status = 'running' AND CASE WHEN s.owner IS NULL "
    f"THEN ({_LAST_BEAT} IS NULL OR {_LAST_BEAT} < :stale_before) "
    "ELSE (s.lease_expires_at IS NULL OR s.lease_expires_at <= :now) END), "
    "sum(n.status = 'waiting_job' AND n.job_deadline_at IS NOT NULL AND n.job_deadline_at < :now) "
    f"FROM node_runs AS n LEFT JOIN sessions AS s ON s.session_id = n.session_id WHERE {_OPEN_WHERE_N} "
    f"AND {_NOT_CONTAINER} "
    "GROUP BY n.workflow, n.node, n.status ORDER BY n.workflow, n.node, n.status"
)
SQL_OPEN_SAME_HOST = (
    _OPEN_CTE + "SELECT n.workflow, n.node, s.owner, count(*) "
    "FROM sessions AS s JOIN node_runs AS n ON n.session_id = s.session_id "
    "WHERE s.status = 'running' AND s.lease_expires_at > :now AND s.owner IS NOT NULL "
    "AND json_extract(s.owner, '$.host') = :host AND n.status = 'running' "
    f"AND {_NOT_CONTAINER} "
    "GROUP BY n.workflow, n.node, s.owner"
)
SQL_HEARTBEAT = (
    "UPDATE node_runs SET heartbeat_at = ? WHERE session_id = ? AND path = ? AND status = 'running'"
)
_INFO_COLUMNS = f"session_id, {_SESSION_COLUMNS}, owner, epoch, lease_expires_at, submitted_at"
_RECENT_FIRST = "ORDER BY coalesce(updated_at, 0.0) DESC, rowid"
#: In SessionInfo field order; rows made by acquire() alone (no event yet) are no session.
SQL_SESSIONS = f"SELECT {_INFO_COLUMNS} FROM sessions WHERE last_seq > 0 {_RECENT_FIRST}"
SQL_SESSION_INFO = f"SELECT {_INFO_COLUMNS} FROM sessions WHERE session_id = ? AND last_seq > 0"


#: How SQLite writes a session query (:mod:`flowscope.store.select_sql`): a list as a JSON
#: array, ``lower()`` folds ASCII letters only (SessionQuery's rule), no limit is -1 (SQLite
#: keeps only ``offset + limit`` rows while it sorts).
DIALECT = Dialect(
    placeholder=":{name}",
    in_list="{col} IN (SELECT value FROM json_each({p}))",
    list_value=json.dumps,
    contains="instr(lower({text}), {p}) > 0",
    owner_field="coalesce(json_extract(owner, '$.{field}'), '')",
    node_runs_template=SQL_NODE_RUNS + " WHERE TRUE{where} ORDER BY rowid",
    root="instr(path, '/') = 0",
    no_limit=-1,
    find_template=f"SELECT {_INFO_COLUMNS} FROM sessions WHERE last_seq > 0{{where}} {_RECENT_FIRST} "
    "LIMIT :limit OFFSET :offset",
)

# -- ownership
SQL_OWNERSHIP = "SELECT owner, epoch, lease_expires_at, lease_renewed_at FROM sessions WHERE session_id = ?"
#: SQL_OWNERSHIP and the last seq: acquire_new's one read.
SQL_OWNERSHIP_SEQ = (
    "SELECT owner, epoch, lease_expires_at, lease_renewed_at, last_seq FROM sessions WHERE session_id = ?"
)
#: The sessions among ``(?, ?, ...)`` with a message in their inbox (the lease keeper's
#: question, and an invocation's last append's).
SQL_MAILED_IN = "SELECT DISTINCT session_id FROM messages WHERE session_id IN "
SQL_TAKE = (
    "INSERT INTO sessions (session_id, last_seq, owner, epoch, lease_expires_at, lease_renewed_at) "
    "VALUES (:sid, 0, :owner, 1, :expires, :now) "
    "ON CONFLICT (session_id) DO UPDATE SET owner = excluded.owner, epoch = sessions.epoch + 1, "
    "lease_expires_at = excluded.lease_expires_at, lease_renewed_at = excluded.lease_renewed_at, "
    "recoveries = sessions.recoveries + :recovered "
    "RETURNING epoch, last_seq"
)
SQL_RENEW = (
    "UPDATE sessions SET lease_expires_at = ?, lease_renewed_at = ? WHERE session_id = ? AND epoch = ?"
)
SQL_RELEASE = "UPDATE sessions SET lease_expires_at = 0 WHERE session_id = ? AND epoch = ?"
# Claim candidates, one statement per reason, each through its partial index, oldest
# first; the claim rule (base.claim_reason) then judges each row in Python. Only rows
# nobody holds are read (no lease, or an ended one): a host's live leases, thousands
# when its workers run thousands of sessions, never reach Python. The queued and
# answered ones are read one workflow at a time, each in its index's order, so a claim
# reads as far as it takes (no sort of the whole queue); the claim merges them.
_FREE = "(lease_expires_at IS NULL OR lease_expires_at <= :now)"
SQL_CLAIM_QUEUED = (
    "SELECT session_id, workflow, owner, lease_expires_at, recoveries, submitted_at, epoch FROM sessions "
    f"WHERE status = 'queued' AND workflow = :workflow AND {_FREE} ORDER BY submitted_at"
)
SQL_CLAIM_ANSWERED = (
    "SELECT session_id, workflow, owner, lease_expires_at, recoveries, updated_at, epoch FROM sessions "
    f"WHERE status = 'answered' AND workflow = :workflow AND {_FREE} ORDER BY updated_at"
)
#: Orphans by when their lease ended (``takeover.claimable_since``), in ``sessions_running``'s order.
SQL_CLAIM_ORPHANED = (
    "SELECT session_id, workflow, owner, lease_expires_at, recoveries, lease_expires_at, epoch FROM sessions "
    "WHERE status = 'running' AND owner IS NOT NULL AND lease_expires_at <= :now "
    "AND workflow IN (SELECT value FROM json_each(:workflows)) "
    "ORDER BY lease_expires_at"
)
#: Paused, failed and completed sessions with a message in their inbox: claimable as answered
#: or queued (base.claim_reason; the status is the row's last column).
SQL_CLAIM_MAILED = (
    "SELECT session_id, workflow, owner, lease_expires_at, recoveries, updated_at, epoch, status FROM sessions "
    "WHERE session_id IN (SELECT session_id FROM messages) AND status IN ('paused', 'failed', 'completed') "
    f"AND workflow IN (SELECT value FROM json_each(:workflows)) AND {_FREE} "
    "ORDER BY updated_at"
)
#: The owners of the leases not released (``sessions_leased``), each once: one index seek
#: per owner, however many sessions it holds (a loose index scan). A claim asks the
#: liveness rule about each; the sessions of a dead one on this host are claimable at once.
SQL_LEASE_OWNERS = (
    "WITH RECURSIVE o(owner) AS ("
    "SELECT (SELECT owner FROM sessions WHERE lease_expires_at > 0 ORDER BY owner LIMIT 1) "
    "UNION ALL SELECT (SELECT owner FROM sessions WHERE lease_expires_at > 0 AND owner > o.owner "
    "ORDER BY owner LIMIT 1) FROM o WHERE o.owner IS NOT NULL) "
    "SELECT owner FROM o WHERE owner IS NOT NULL"
)
#: The sessions whose lease has not ended but whose owner is dead (``:dead``, a JSON
#: array of ``owner`` columns), any claimable status (the row's last column). The
#: ``lease_expires_at > 0`` is ``sessions_leased``'s predicate: with it the planner may
#: read the owners through that index (it cannot tell that ``> :now`` implies it).
SQL_CLAIM_HELD_BY_DEAD = (
    "SELECT session_id, workflow, owner, lease_expires_at, recoveries, "
    "CASE status WHEN 'queued' THEN submitted_at ELSE updated_at END, epoch, status FROM sessions "
    "WHERE lease_expires_at > 0 AND lease_expires_at > :now AND owner IN (SELECT value FROM json_each(:dead)) "
    "AND (status IN ('queued', 'answered', 'running') "
    "OR (status IN ('paused', 'failed', 'completed') AND session_id IN (SELECT session_id FROM messages))) "
    "AND workflow IN (SELECT value FROM json_each(:workflows))"
)
SQL_SEND = "INSERT INTO messages (session_id, kind, body, sent_at) VALUES (?, ?, ?, ?) RETURNING message_id"
SQL_INBOX = "SELECT message_id, kind, body, sent_at FROM messages WHERE session_id = ? ORDER BY message_id"
#: ``:ids`` is a JSON array of message ids.
SQL_DROP_MESSAGES = (
    "DELETE FROM messages WHERE session_id = :sid AND message_id IN (SELECT value FROM json_each(:ids))"
)
#: ``:ids`` is a JSON array of session ids.
SQL_MAILED = (
    "SELECT DISTINCT session_id FROM messages WHERE session_id IN (SELECT value FROM json_each(:ids))"
)
SQL_QUEUED_SUMMARY = (
    "SELECT workflow, count(*), min(submitted_at) FROM sessions WHERE status = 'queued' "
    "GROUP BY workflow ORDER BY workflow"
)
#: Job results appended in (:after, :upto] of the log's rowids, with their session's workflow.
SQL_JOB_RESULTS_AFTER = (
    "SELECT s.workflow, e.node, json_extract(e.payload, '$.result'), count(*) FROM events AS e "
    "LEFT JOIN sessions AS s ON s.session_id = e.session_id "
    "WHERE e.rowid > :after AND e.rowid <= :upto AND e.type = 'job_result' GROUP BY 1, 2, 3"
)
SQL_LAST_EVENT_ROWID = "SELECT coalesce(max(rowid), 0) FROM events"
SQL_META = "SELECT value FROM meta WHERE key = ?"
SQL_SET_META = (
    "INSERT INTO meta (key, value) VALUES (?, ?) ON CONFLICT (key) DO UPDATE SET value = excluded.value"
)
SQL_WORKER_SEEN = (
    "INSERT INTO workers (worker_id, host, pid, started_at, workflows, seen_at) VALUES (?, ?, ?, ?, ?, ?) "
    "ON CONFLICT (worker_id) DO UPDATE SET host = excluded.host, pid = excluded.pid, "
    "started_at = excluded.started_at, workflows = excluded.workflows, seen_at = excluded.seen_at"
)
SQL_WORKERS_FORGET = "DELETE FROM workers WHERE seen_at < ?"
SQL_WORKERS = "SELECT worker_id, host, pid, workflows, seen_at FROM workers ORDER BY seen_at DESC, worker_id"
SQL_SAVE_SNAPSHOT = (
    "INSERT INTO snapshots (session_id, seq, data) VALUES (?, ?, ?) "
    "ON CONFLICT (session_id) DO UPDATE SET seq = excluded.seq, data = excluded.data"
)
SQL_LOAD_SNAPSHOT = "SELECT seq, data FROM snapshots WHERE session_id = ?"

# -- pruning (flowscope prune): ``:ids`` is a JSON array of session ids
#: Sessions among ``:ids`` that may be deleted: finished and without an open run, with
#: their owner and lease, for the owner rule (liveness.owner_alive) in Python.
SQL_PRUNABLE = (
    "SELECT session_id, owner, lease_expires_at FROM sessions "
    "WHERE session_id IN (SELECT value FROM json_each(:ids)) "
    "AND status IN (" + ", ".join(f"'{status}'" for status in FINISHED_SESSION_STATUSES) + ") "
    f"AND session_id NOT IN (SELECT session_id FROM node_runs WHERE {OPEN_WHERE})"
)
#: Every table keyed by session, in the order a prune deletes from them; ``sessions``
#: holds the owner, epoch and lease too. ``workers`` is per worker and stays.
PRUNE_TABLES = ("events", "node_runs", "snapshots", "messages", "sessions")
SQL_PRUNE = tuple(
    f"DELETE FROM {table} WHERE session_id IN (SELECT value FROM json_each(:ids))" for table in PRUNE_TABLES
)
#: A pruned session's span watermark goes too (a new session under the same id ships its
#: spans); ``span_exports`` exists only once a span was shipped from this file.
SQL_HAS_SPAN_EXPORTS = "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'span_exports'"
SQL_PRUNE_SPAN_EXPORTS = "DELETE FROM span_exports WHERE session_id IN (SELECT value FROM json_each(:ids))"
#: Bytes of the file's pages in use: deleted rows' pages become free pages that new
#: events reuse (the file itself shrinks only with ``VACUUM``).
SQL_STORAGE_BYTES = (
    "SELECT (p.page_count - f.freelist_count) * s.page_size "
    "FROM pragma_page_count() AS p, pragma_freelist_count() AS f, pragma_page_size() AS s"
)


def node_state(row: Sequence[Any]) -> NodeState:
    """A NodeState from a row of ``SQL_LOAD_NODES``."""
    return NodeState(**dict(zip(NODE_STATE_COLUMNS, row)))


# -- the span-shipping watermark: a table of its own, created on the first write,
# so that files without it stay valid and the schema version is unchanged.
SQL_CREATE_SPAN_EXPORTS = "CREATE TABLE IF NOT EXISTS span_exports (session_id TEXT PRIMARY KEY, exported_seq INTEGER NOT NULL) WITHOUT ROWID"
SQL_EXPORTED_SEQ = "SELECT exported_seq FROM span_exports WHERE session_id = ?"
#: A span follower's pass: the sessions whose log moved past their watermark, and those running at
#: it (spans a dead owner left open are due), in one query.
SQL_UNEXPORTED = (
    f"SELECT {_INFO_COLUMNS}, coalesce(x.exported_seq, 0) FROM sessions LEFT JOIN span_exports AS x USING (session_id) "
    "WHERE last_seq > coalesce(x.exported_seq, 0) OR (last_seq = x.exported_seq AND status = 'running') "
    "ORDER BY coalesce(updated_at, 0.0)"
)
SQL_SET_EXPORTED_SEQ = (
    "INSERT INTO span_exports (session_id, exported_seq) VALUES (?, ?) "
    "ON CONFLICT(session_id) DO UPDATE SET exported_seq = max(exported_seq, excluded.exported_seq)"
)
#: SQL_SESSION for many sessions at once (group commit): append "(?, ?, ...)".
SQL_SESSIONS_IN = (
    "SELECT session_id, coalesce(workflow, ''), coalesce(status, 'new'), started_at, updated_at, last_seq, "
    "coalesce(invocations, 0), epoch, owner FROM sessions WHERE session_id IN "
)
