"""The SQL the PostgreSQL store runs. Every value is a parameter; the only text built
from names comes from our own constants (column names, the open states)."""

from __future__ import annotations

import dataclasses

from ..base import FINISHED_SESSION_STATUSES, NodeRun
from ..projection_sql import open_where
from ..select_sql import Dialect
from .schema import NODE_STATE_COLUMNS, OPEN_WHERE

__all__ = [
    "SQL_CLAIM_MAILED",
    "SQL_SEND",
    "SQL_INBOX",
    "SQL_DROP_MESSAGES",
    "SQL_MAILED",
    "SQL_NOTIFY_MAILED",
    "SQL_SESSION_FOR_UPDATE",
    "SQL_LAST_SEQ",
    "SQL_INSERT_EVENT",
    "SQL_READ",
    "SQL_READ_SEQS",
    "SQL_UPSERT_SESSION",
    "SQL_UPSERT_NODE",
    "SQL_RENAME_WORKFLOW",
    "SQL_APPEND_CACHED",
    "EVENT_KEYS",
    "SQL_LOAD_ALL_NODES",
    "SQL_LOAD_NODES",
    "SQL_JOB_EVENTS",
    "SQL_NODE_RUNS",
    "SQL_OPEN_RUNS",
    "SQL_OPEN_SUMMARY",
    "SQL_OPEN_SAME_HOST",
    "SQL_SUMMARY_PLANNER",
    "SQL_CHANGE_MARK",
    "DIALECT",
    "SQL_SESSION_INFO",
    "SQL_OWNERSHIP_FOR_UPDATE",
    "SQL_NEW_OWNED",
    "SQL_TAKE",
    "SQL_LEASE_FROM",
    "SQL_RENEW_MANY",
    "SQL_OWNERSHIP_MANY",
    "SQL_HEARTBEAT_MANY",
    "SQL_RELEASE",
    "SQL_CLAIM_FREE",
    "SQL_LEASE_OWNERS",
    "SQL_CLAIM_HELD_BY_DEAD",
    "SQL_CLAIM_LOCK",
    "SQL_QUEUED_SUMMARY",
    "SQL_JOB_RESULTS",
    "SQL_WORKER_SEEN",
    "SQL_WORKERS_FORGET",
    "SQL_WORKERS",
    "SQL_SAVE_SNAPSHOT",
    "SQL_LOAD_SNAPSHOT",
    "SQL_NOTIFY",
    "CHANGES_SUFFIX",
    "SQL_EXPORTED_SEQ",
    "SQL_UNEXPORTED",
    "SQL_SET_EXPORTED_SEQS",
    "CLAIM_ORDER",
    "SQL_PRUNE_LOCK",
    "SQL_PRUNABLE",
    "PRUNE_TABLES",
    "SQL_PRUNE",
    "SQL_PRUNE_VACUUM",
    "STORED_TABLES",
    "SQL_STORAGE_BYTES",
]

_SESSION_COLUMNS = ("workflow", "status", "started_at", "updated_at", "last_seq", "invocations")
#: The fold's columns and the fence, locking the row for the append's transaction.
#: ``id`` last: the row's identity, which a cached append checks (a pruned and remade
#: session gets a new one).
SQL_SESSION_FOR_UPDATE = (
    "SELECT coalesce(workflow, ''), coalesce(status, 'new'), started_at, updated_at, last_seq, invocations, "
    "epoch, owner, id FROM sessions WHERE session_id = %s FOR UPDATE"
)
SQL_LAST_SEQ = "SELECT last_seq FROM sessions WHERE session_id = %s"
SQL_INSERT_EVENT = (
    "INSERT INTO events (session_id, seq, type, ts, invocation_id, path, node, payload) "
    "VALUES (%s, %s, %s, %s, %s, %s, %s, %s)"
)
SQL_READ = (
    "SELECT type, ts, invocation_id, path, node, payload FROM events "
    "WHERE session_id = %s AND seq > %s AND seq <= %s ORDER BY seq"
)
SQL_READ_SEQS = "SELECT seq FROM events WHERE session_id = %s AND seq > %s AND seq <= %s ORDER BY seq"
SQL_UPSERT_SESSION = (
    f"INSERT INTO sessions (session_id, {', '.join(_SESSION_COLUMNS)}, submitted_at) "
    "VALUES (%s, %s, %s, %s, %s, %s, %s, %s) ON CONFLICT (session_id) DO UPDATE SET "
    + ", ".join(f"{c} = excluded.{c}" for c in _SESSION_COLUMNS)
    + ", submitted_at = coalesce(excluded.submitted_at, sessions.submitted_at) RETURNING id"
)
_NODE_ROW_COLUMNS = ("session_id", "workflow") + NODE_STATE_COLUMNS
SQL_UPSERT_NODE = (
    f"INSERT INTO node_runs ({', '.join(_NODE_ROW_COLUMNS)}) "
    f"VALUES ({', '.join('%s' for _ in _NODE_ROW_COLUMNS)}) "
    "ON CONFLICT (session_id, path) DO UPDATE SET "
    + ", ".join(f"{c} = excluded.{c}" for c in _NODE_ROW_COLUMNS[1:] if c not in ("path", "heartbeat_at"))
    # heartbeats are written outside the log: an upsert from a cached state never moves one back
    + ", heartbeat_at = greatest(node_runs.heartbeat_at, excluded.heartbeat_at)"
)
#: Another workflow's run in a session: every node run takes its name.
SQL_RENAME_WORKFLOW = "UPDATE node_runs SET workflow = %s WHERE session_id = %s"
#: A session's job events at some paths, in log order.
SQL_JOB_EVENTS = (
    "SELECT seq, type, ts, invocation_id, path, node, payload FROM events "
    "WHERE session_id = %s AND type IN ('job_dispatched', 'job_result') AND path = ANY(%s) ORDER BY seq"
)
SQL_LOAD_NODES = (
    f"SELECT {', '.join(NODE_STATE_COLUMNS)} FROM node_runs WHERE session_id = %s AND path = ANY(%s)"
)
#: Up to ``%s`` node runs of a session: all of them when fewer come back.
SQL_LOAD_ALL_NODES = f"SELECT {', '.join(NODE_STATE_COLUMNS)} FROM node_runs WHERE session_id = %s LIMIT %s"

#: The SQL types of the node-run columns (migration 1's), for the rows a cached append sends.
_NODE_STATE_TYPES = {
    "path": "text",
    "node": "text",
    "kind": "text",
    "parent_path": "text",
    "status": "text",
    "attempt": "integer",
    "failures": "integer",
    "retries": "integer",
    "recoveries": "integer",
    "started_at": "float8",
    "ended_at": "float8",
    "heartbeat_at": "float8",
    "error_code": "text",
    "error_type": "text",
    "job_deadline_at": "float8",
    "restarted_at": "float8",
}
#: The keys of each event object in SQL_APPEND_CACHED's ``events`` (its columns after the session).
EVENT_KEYS = ("seq", "type", "ts", "invocation_id", "path", "node", "payload")
_EVENT_TYPES = ("bigint", "text", "float8", "text", "text", "text", "text")
#: An append whose fold ran on the state this store wrote last, in one statement (one
#: round trip, one implicit transaction): the session's row is updated only if it is still
#: the row (``id``) at the seq (``last_seq``) and the epoch (the fence) the caller expects,
#: which locks it; the events and the node runs (JSON arrays of objects keyed by
#: EVENT_KEYS and NODE_STATE_COLUMNS: one parameter each) are inserted from that update's
#: result, so when it matches nothing, nothing is written and the first column is 0 (the
#: store then takes the locking path, which says why). It sets the workflow too (a session's
#: first append names it; later ones keep it). ``pg_notify`` is sent at commit.
SQL_APPEND_CACHED = (
    "WITH s AS (UPDATE sessions SET workflow = %(workflow)s, status = %(status)s, started_at = %(started_at)s, "
    "updated_at = %(updated_at)s, last_seq = %(last_seq)s, invocations = %(invocations)s "
    "WHERE session_id = %(sid)s AND id = %(row_id)s AND last_seq = %(expected)s "
    "AND (%(epoch)s::bigint IS NULL OR epoch = %(epoch)s::bigint) RETURNING session_id), "
    "e AS (INSERT INTO events (session_id, seq, type, ts, invocation_id, path, node, payload) "
    f"SELECT s.session_id, {', '.join('x.' + k for k in EVENT_KEYS)} FROM s, json_to_recordset(%(events)s::json) "
    f"AS x({', '.join(f'{k} {t}' for k, t in zip(EVENT_KEYS, _EVENT_TYPES))})), "
    f"n AS (INSERT INTO node_runs ({', '.join(_NODE_ROW_COLUMNS)}) "
    f"SELECT s.session_id, %(workflow)s, {', '.join('x.' + c for c in NODE_STATE_COLUMNS)} "
    "FROM s, json_to_recordset(%(nodes)s::json) "
    f"AS x({', '.join(f'{c} {_NODE_STATE_TYPES[c]}' for c in NODE_STATE_COLUMNS)}) "
    "ON CONFLICT (session_id, path) DO UPDATE SET "
    + SQL_UPSERT_NODE.split(" DO UPDATE SET ", 1)[1]
    + "), w AS (SELECT pg_notify(%(channel)s, %(workflow)s) FROM s WHERE %(notify)s "
    "UNION ALL SELECT pg_notify(%(changes)s, '') FROM s WHERE %(changed)s) "
    "SELECT (SELECT count(*) FROM s), (SELECT count(*) FROM w)"
)
_NODE_RUN_FIELDS = tuple(f.name for f in dataclasses.fields(NodeRun))
SQL_NODE_RUNS = f"SELECT {', '.join(_NODE_RUN_FIELDS)} FROM node_runs"
SQL_OPEN_RUNS = f"{SQL_NODE_RUNS} WHERE {OPEN_WHERE} ORDER BY started_at, id"
# flowscope.liveness in SQL (as the SQLite store's SQL_OPEN_SUMMARY): a running run of a
# session without owner is orphaned when its last sign of life is before stale_before; with
# an owner, when the lease has ended (SQL_OPEN_SAME_HOST lists this host's live leases for
# the process check in Python); a waiting job is overdue past its deadline.
_LAST_BEAT = "coalesce(n.heartbeat_at, n.started_at)"
_OPEN_WHERE_N = open_where("n.status")  # schema.OPEN_WHERE, on the aliased table
# A container is not counted (flowscope.fold.containers: an open run at "path/..." of the
# same session). A prefix compared for equality: a range on the path would depend on the
# database's collation, which orders punctuation as it likes.
_NOT_CONTAINER = (
    "NOT EXISTS (SELECT 1 FROM node_runs AS c WHERE c.session_id = n.session_id "
    f"AND left(c.path, length(n.path) + 1) = n.path || '/' AND {open_where('c.status')})"
)
SQL_OPEN_SUMMARY = (
    "SELECT n.workflow, n.node, n.status, count(*), min(coalesce(n.restarted_at, n.started_at)), "
    "count(*) FILTER (WHERE n.status = 'running' AND CASE WHEN s.owner IS NULL "
    f"THEN ({_LAST_BEAT} IS NULL OR {_LAST_BEAT} < %(stale_before)s) "
    "ELSE (s.lease_expires_at IS NULL OR s.lease_expires_at <= %(now)s) END), "
    "count(*) FILTER (WHERE n.status = 'waiting_job' AND n.job_deadline_at < %(now)s) "
    f"FROM node_runs AS n LEFT JOIN sessions AS s ON s.session_id = n.session_id WHERE {_OPEN_WHERE_N} "
    f"AND {_NOT_CONTAINER} "
    "GROUP BY n.workflow, n.node, n.status ORDER BY n.workflow, n.node, n.status"
)
#: Run before SQL_OPEN_SUMMARY, in its transaction: the default random_page_cost (4, a
#: spinning disk's) makes the planner read every session to join a few hundred open runs
#: (a hash join: O(sessions)); the open runs and their sessions' rows are hot pages, and at
#: an SSD's cost it looks each one up (O(open runs)), keeping the hash join where most
#: sessions have an open run. Measured: 1,000 open runs in 100,000 sessions, 13 -> 3 ms.
SQL_SUMMARY_PLANNER = "SET LOCAL random_page_cost = 1.1"
SQL_OPEN_SAME_HOST = (
    "SELECT n.workflow, n.node, s.owner, count(*) "
    "FROM sessions AS s JOIN node_runs AS n ON n.session_id = s.session_id "
    "WHERE s.status = 'running' AND s.lease_expires_at > %(now)s AND s.owner->>'host' = %(host)s "
    f"AND n.status = 'running' AND {_NOT_CONTAINER} GROUP BY n.workflow, n.node, s.owner"
)
_INFO_COLUMNS = f"session_id, {', '.join(_SESSION_COLUMNS)}, owner, epoch, lease_expires_at, submitted_at"
#: In SessionInfo field order; rows made by acquire() alone (no event yet) are no session.
SQL_SESSION_INFO = f"SELECT {_INFO_COLUMNS} FROM sessions WHERE session_id = %s AND last_seq > 0"


#: How PostgreSQL writes a session query (:mod:`flowscope.store.select_sql`): ``lower()``
#: under the "C" collation folds ASCII letters only (SessionQuery's rule); a NULL limit is
#: none (a top-N sort keeps only ``offset + limit`` rows).
DIALECT = Dialect(
    placeholder="%({name})s",
    in_list="{col} = ANY({p}::text[])",
    list_value=list,
    contains='strpos(lower(({text}) COLLATE "C"), {p}) > 0',
    owner_field="coalesce(owner->>'{field}', '')",
    node_runs_template=SQL_NODE_RUNS + " WHERE TRUE{where} ORDER BY id",
    root="strpos(path, '/') = 0",
    no_limit=None,
    find_template=f"SELECT {_INFO_COLUMNS} FROM sessions WHERE last_seq > 0{{where}} "
    "ORDER BY coalesce(updated_at, 0) DESC, id LIMIT %(limit)s OFFSET %(offset)s",
)
#: The change mark: appends grow the sum of ``last_seq``, deletions the count, takeovers
#: the sum of epochs (rows of owned sessions without events included).
SQL_CHANGE_MARK = (
    "SELECT count(*), coalesce(sum(last_seq), 0), coalesce(sum(epoch), 0), max(updated_at) FROM sessions"
)


# -- ownership
SQL_OWNERSHIP_FOR_UPDATE = (
    "SELECT owner, epoch, lease_expires_at, lease_renewed_at FROM sessions WHERE session_id = %s FOR UPDATE"
)
#: A session acquired before its first event: epoch 1. Nothing if another made it first.
SQL_NEW_OWNED = (
    "INSERT INTO sessions (session_id, owner, epoch, lease_expires_at, lease_renewed_at) "
    "VALUES (%s, %s, 1, %s, %s) ON CONFLICT (session_id) DO NOTHING RETURNING epoch"
)
#: Sessions acquired before their first event, in one statement (``acquire_new_many``):
#: epoch 1 each, made in key order (concurrent batches wait for each other in one order);
#: the ones another made first are left out.
SQL_NEW_OWNED_MANY = (
    "INSERT INTO sessions (session_id, owner, epoch, lease_expires_at, lease_renewed_at) "
    "SELECT sid, %(owner)s, 1, %(expires)s, %(now)s FROM unnest(%(sids)s::text[]) AS sid ORDER BY sid "
    "ON CONFLICT (session_id) DO NOTHING RETURNING session_id, epoch, id"
)
#: The ownership, last seq and row id of sessions that exist, locked in key order.
SQL_OWNERSHIP_SEQ_FOR_UPDATE_MANY = (
    "SELECT session_id, owner, epoch, lease_expires_at, lease_renewed_at, last_seq, id FROM sessions "
    "WHERE session_id = ANY(%s) ORDER BY session_id FOR UPDATE"
)
#: Take sessions (locked by the caller): epoch + 1, the owner and the lease.
SQL_TAKE = (
    "UPDATE sessions SET owner = %(owner)s, epoch = epoch + 1, lease_expires_at = %(expires)s, "
    "lease_renewed_at = %(now)s, recoveries = recoveries + (session_id = ANY(%(recovered)s))::int "
    "WHERE session_id = ANY(%(sids)s) RETURNING session_id, epoch"
)
#: A lease granted again, from later, to sessions this transaction took (its rows, locked):
#: the statement that took them waited (``LeaseClock.regrant``).
SQL_LEASE_FROM = (
    "UPDATE sessions SET lease_expires_at = %(expires)s, lease_renewed_at = %(now)s "
    "WHERE session_id = ANY(%(sids)s)"
)
#: A lease keeper's round (renew() is a round of one): every lease whose epoch still holds, in one statement; the
#: sessions it returns were renewed, the others' leases are lost.
#: The rows are locked first, in session-id order: an UPDATE over a join locks them in
#: whatever order its plan visits them, and two rounds (or a round and a claim) that visit
#: the same rows in different orders deadlock (40P01).
SQL_RENEW_MANY = (
    "WITH v AS (SELECT * FROM unnest(%(sids)s::text[], %(epochs)s::bigint[]) AS v(session_id, epoch)), "
    "locked AS (SELECT s.session_id FROM sessions AS s JOIN v ON s.session_id = v.session_id "
    "AND s.epoch = v.epoch ORDER BY s.session_id FOR UPDATE OF s) "
    "UPDATE sessions AS s SET lease_expires_at = %(expires)s, lease_renewed_at = %(now)s "
    "FROM v, locked WHERE s.session_id = v.session_id AND s.epoch = v.epoch "
    "AND locked.session_id = s.session_id RETURNING s.session_id"
)
SQL_OWNERSHIP_MANY = "SELECT session_id, owner, epoch FROM sessions WHERE session_id = ANY(%s)"
#: Heartbeats of several sessions' running runs (heartbeat() is one session's).
SQL_HEARTBEAT_MANY = (
    "WITH v AS (SELECT * FROM unnest(%(sids)s::text[], %(paths)s::text[]) AS v(session_id, path)), "
    "locked AS (SELECT n.session_id, n.path FROM node_runs AS n JOIN v ON n.session_id = v.session_id "
    "AND n.path = v.path WHERE n.status = 'running' ORDER BY n.session_id, n.path FOR UPDATE OF n) "
    "UPDATE node_runs AS n SET heartbeat_at = %(now)s "
    "FROM locked WHERE n.session_id = locked.session_id AND n.path = locked.path AND n.status = 'running'"
)
SQL_RELEASE = (
    "UPDATE sessions AS s SET lease_expires_at = 0 FROM unnest(%(sids)s::text[], %(epochs)s::bigint[]) "
    "AS r(sid, epoch) WHERE s.session_id = r.sid AND s.epoch = r.epoch RETURNING s.status, s.workflow"
)
#: What orders the candidates of each claim reason, oldest first: when each became
#: claimable (``takeover.claimable_since``, every store's order).
CLAIM_ORDER = {"queued": "submitted_at", "answered": "updated_at", "running": "lease_expires_at"}
_CLAIM_COLUMNS = "session_id, workflow, owner, lease_expires_at, recoveries, {order}, epoch"
#: Claimable at once: no lease, or an ended one. SKIP LOCKED: rows another claimer (or an
#: append) holds are passed over, never waited for; two claimers never take the same row.
#: Queued and answered sessions are read one workflow at a time (LATERAL) up to the
#: limit: the queued ones through their index in order, so a claim reads what it takes,
#: not the whole queue sorted (12 ms beside 20,000 queued sessions, 0.6 ms so). The
#: answered ones are sorted per workflow: an index on ``updated_at``, which every append
#: changes, would cost every append its HOT update.
_FREE = "(lease_expires_at IS NULL OR lease_expires_at <= %(now)s)"


def _free_by_workflow(status: str) -> str:
    order = CLAIM_ORDER[status]
    return (
        "SELECT c.* FROM unnest(%(workflows)s::text[]) AS w(name) CROSS JOIN LATERAL ("
        f"SELECT {_CLAIM_COLUMNS.format(order=order)} FROM sessions "
        f"WHERE status = '{status}' AND workflow = w.name AND {_FREE} "
        f"ORDER BY {order} LIMIT %(limit)s FOR UPDATE SKIP LOCKED) c "
        f"ORDER BY c.{order} LIMIT %(limit)s"
    )


SQL_CLAIM_FREE = {
    "queued": _free_by_workflow("queued"),
    "answered": _free_by_workflow("answered"),
    "running": (
        f"SELECT {_CLAIM_COLUMNS.format(order=CLAIM_ORDER['running'])} FROM sessions "
        f"WHERE status = 'running' AND workflow = ANY(%(workflows)s) AND {_FREE} "
        "AND owner IS NOT NULL AND recoveries <= %(max_recoveries)s "
        f"ORDER BY {CLAIM_ORDER['running']} LIMIT %(limit)s FOR UPDATE SKIP LOCKED"
    ),
}
#: Paused, failed and completed sessions with a message in their inbox, claimable as answered
#: or queued (base.claim_reason; the status is the row's last column).
SQL_CLAIM_MAILED = (
    f"SELECT {_CLAIM_COLUMNS.format(order='updated_at')}, status FROM sessions "
    "WHERE session_id IN (SELECT session_id FROM messages) AND status IN ('paused', 'failed', 'completed') "
    "AND workflow = ANY(%(workflows)s) "
    "AND (lease_expires_at IS NULL OR lease_expires_at <= %(now)s) "
    "ORDER BY updated_at LIMIT %(limit)s FOR UPDATE SKIP LOCKED"
)
#: The owners of the leases not released (``sessions_leased``), each once: one index seek
#: per owner, however many sessions it holds (a loose index scan). A claim asks the
#: liveness rule about each; the sessions of a dead one on this host are claimable at once.
SQL_LEASE_OWNERS = (
    "WITH RECURSIVE o(owner) AS ("
    "SELECT (SELECT owner FROM sessions WHERE lease_expires_at > 0 ORDER BY owner LIMIT 1) "
    "UNION ALL SELECT (SELECT s.owner FROM sessions s WHERE s.lease_expires_at > 0 AND s.owner > o.owner "
    "ORDER BY s.owner LIMIT 1) FROM o WHERE o.owner IS NOT NULL) "
    "SELECT owner FROM o WHERE owner IS NOT NULL"
)
#: The sessions whose lease has not ended but whose owner is dead (``dead``: their
#: ``owner`` values), any claimable status; then locked with SQL_CLAIM_LOCK. The
#: ``lease_expires_at > 0`` is ``sessions_leased``'s predicate, for the planner.
#: A dead owner's session, its lease not ended: a queued one since its submission, any
#: other since its last event (``takeover.claimable_since``).
_SINCE_HELD = "CASE status WHEN 'queued' THEN submitted_at ELSE updated_at END"
SQL_CLAIM_HELD_BY_DEAD = (
    f"SELECT {_CLAIM_COLUMNS.format(order=_SINCE_HELD)}, status "
    "FROM sessions WHERE lease_expires_at > 0 AND lease_expires_at > %(now)s AND owner = ANY(%(dead)s::jsonb[]) "
    "AND (status IN ('queued', 'answered', 'running') "
    "OR (status IN ('paused', 'failed', 'completed') AND session_id IN (SELECT session_id FROM messages))) "
    "AND workflow = ANY(%(workflows)s)"
)
#: Lock the same-host candidates whose epoch has not moved since they were read.
SQL_CLAIM_LOCK = (
    "SELECT session_id FROM sessions "
    "WHERE (session_id, epoch) IN (SELECT * FROM unnest(%s::text[], %s::bigint[])) FOR UPDATE SKIP LOCKED"
)
SQL_SEND = (
    "INSERT INTO messages (session_id, kind, body, sent_at) VALUES (%s, %s, %s, %s) RETURNING message_id"
)
SQL_INBOX = "SELECT message_id, kind, body, sent_at FROM messages WHERE session_id = %s ORDER BY message_id"
SQL_DROP_MESSAGES = "DELETE FROM messages WHERE session_id = %s AND message_id = ANY(%s::bigint[])"
#: A sent message makes a paused session claimable: wake the workers of its workflow.
SQL_NOTIFY_MAILED = "SELECT pg_notify(%s, workflow) FROM sessions WHERE session_id = %s AND status = 'paused'"
SQL_MAILED = "SELECT DISTINCT session_id FROM messages WHERE session_id = ANY(%s)"
SQL_JOB_RESULTS = (
    "SELECT s.workflow, e.node, e.payload::json->>'result', count(*) FROM events AS e "
    "LEFT JOIN sessions AS s ON s.session_id = e.session_id WHERE e.type = 'job_result' GROUP BY 1, 2, 3"
)
SQL_QUEUED_SUMMARY = (
    "SELECT workflow, count(*), min(submitted_at) FROM sessions WHERE status = 'queued' "
    "GROUP BY workflow ORDER BY workflow"
)
SQL_WORKER_SEEN = (
    "INSERT INTO workers (worker_id, host, pid, started_at, workflows, seen_at) VALUES (%s, %s, %s, %s, %s, %s) "
    "ON CONFLICT (worker_id) DO UPDATE SET host = excluded.host, pid = excluded.pid, "
    "started_at = excluded.started_at, workflows = excluded.workflows, seen_at = excluded.seen_at"
)
SQL_WORKERS_FORGET = "DELETE FROM workers WHERE seen_at < %s"
SQL_WORKERS = "SELECT worker_id, host, pid, workflows, seen_at FROM workers ORDER BY seen_at DESC, worker_id"
SQL_SAVE_SNAPSHOT = (
    "INSERT INTO snapshots (session_id, seq, data) VALUES (%s, %s, %s) "
    "ON CONFLICT (session_id) DO UPDATE SET seq = excluded.seq, data = excluded.data"
)
SQL_LOAD_SNAPSHOT = "SELECT seq, data FROM snapshots WHERE session_id = %s"
#: Wake listening workers (the payload is the workflow's name); sent at commit.
SQL_NOTIFY = "SELECT pg_notify(%s, %s)"
#: The channel (the workers' own plus this) on which an append that moved a session's
#: status says so, for the console's open pages: an empty payload, so a transaction
#: that moves many sessions sends one notification; at commit, with the status change only
#: (not every append: a notifying commit takes the database's notify lock).
CHANGES_SUFFIX = ".changes"

# -- pruning (flowscope prune): ``%(ids)s`` is a text[] of session ids
#: Lock the sessions' rows first, in one order (two prunes never deadlock): an append,
#: acquire or claim of one of them waits, or (SKIP LOCKED) passes it over, until the
#: prune commits. SQL_PRUNABLE then runs on a snapshot taken after the locks, so it sees
#: every append that committed before them.
SQL_PRUNE_LOCK = (
    "SELECT session_id FROM sessions WHERE session_id = ANY(%(ids)s) ORDER BY session_id FOR UPDATE"
)
#: Sessions among ``%(ids)s`` that may be deleted: finished and without an open run, with
#: their owner and lease, for the owner rule (liveness.owner_alive) in Python.
SQL_PRUNABLE = (
    "SELECT s.session_id, s.owner, s.lease_expires_at FROM sessions AS s "
    "WHERE s.session_id = ANY(%(ids)s) "
    "AND s.status IN (" + ", ".join(f"'{status}'" for status in FINISHED_SESSION_STATUSES) + ") "
    f"AND NOT EXISTS (SELECT 1 FROM node_runs AS n WHERE n.session_id = s.session_id AND {_OPEN_WHERE_N})"
)
#: Every table keyed by session, in the order a prune deletes from them; ``sessions``
#: holds the owner, epoch and lease too. ``workers`` is per worker and stays.
PRUNE_TABLES = ("events", "node_runs", "snapshots", "span_exports", "messages", "sessions")
SQL_PRUNE = tuple(f"DELETE FROM {table} WHERE session_id = ANY(%(ids)s)" for table in PRUNE_TABLES)
#: After a prune's commit (VACUUM cannot run in a transaction): makes the deleted rows'
#: space reusable by new rows now, rather than when autovacuum gets to the tables.
SQL_PRUNE_VACUUM = f"VACUUM {', '.join(PRUNE_TABLES)}"
#: Every table of the schema, for SQL_STORAGE_BYTES.
STORED_TABLES = ("meta",) + PRUNE_TABLES + ("workers",)
#: Bytes of the live rows (``pg_column_size`` of each), not of the files: PostgreSQL keeps a deleted row's space in the table for new rows (after VACUUM)
#: and returns it to the file system only with VACUUM FULL, as SQLite keeps free pages.
SQL_STORAGE_BYTES = "SELECT " + " + ".join(
    f"(SELECT coalesce(sum(pg_column_size(t.*)), 0) FROM {table} AS t)" for table in STORED_TABLES
)
#: The span-shipping watermark of a session; advancing it never moves it back.
SQL_EXPORTED_SEQ = "SELECT exported_seq FROM span_exports WHERE session_id = %s"
#: A span follower's pass: the sessions whose log moved past their watermark, and those running at
#: it (spans a dead owner left open are due), in one query.
SQL_UNEXPORTED = (
    f"SELECT {_INFO_COLUMNS}, coalesce(x.exported_seq, 0) FROM sessions LEFT JOIN span_exports AS x USING (session_id) "
    "WHERE last_seq > coalesce(x.exported_seq, 0) OR (last_seq = x.exported_seq AND status = 'running') "
    "ORDER BY coalesce(updated_at, 0)"
)
SQL_SET_EXPORTED_SEQS = (
    "INSERT INTO span_exports (session_id, exported_seq) "
    "SELECT * FROM unnest(%(sids)s::text[], %(seqs)s::bigint[]) "
    "ON CONFLICT (session_id) DO UPDATE SET exported_seq = greatest(span_exports.exported_seq, excluded.exported_seq)"
)
