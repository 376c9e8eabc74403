"""The file: its tables, its migrations, and opening and checking a database.

``meta``
    key/value: ``application`` (``"flowscope"``) and ``schema_version`` (the
    :data:`DB_SCHEMA_VERSION` of the tables *and* of the payload format; not to be
    confused with :data:`flowscope.events.SCHEMA_VERSION`, the version of an event's JSON).
``events``
    the log: ``(session_id, seq)`` is the primary key; ``type``, ``ts``,
    ``invocation_id``, ``path`` and ``node`` are columns, the event's other fields are a
    JSON object in ``payload`` (see :mod:`.codec`).
``sessions``
    one row per session (workflow, status, started/updated, ``last_seq``, invocations).
``node_runs``
    the projection: the latest state of every node run, kept by the fold's
    ``NodeState.apply`` in the transaction that appends the events.
``snapshots``
    one folded state per session, so a long session resumes without reading its log.
``workers``
    one row per worker (``workers_seen``): host, pid, the workflows it serves, when seen.
``messages``
    the inbox (schema 5): messages for a session's owner not yet taken in
    (:class:`~flowscope.store.base.Message`), deleted in the transaction that appends
    what they say.

Ownership lives in ``sessions`` beside the fold's columns (schema 3): ``owner`` (the
:class:`~flowscope.ownership.Owner` as JSON), the fencing ``epoch``, ``lease_expires_at``
and ``lease_renewed_at``, ``submitted_at`` and ``recoveries`` (orphan takeovers by
``claim``). Partial indexes hold the queued, answered and running sessions, so a claim
and the queued summary read only those, never the log or the finished sessions; one more
(schema 6) holds the owners of the leases not released, which a claim checks once each.

Opening refuses a directory, a missing file (read-only), a file that is not SQLite,
another application's database and a newer schema, each with its own
:class:`~flowscope.errors.StoreError` subclass; an older schema is migrated.
"""

from __future__ import annotations

import os
import sqlite3
import time
from collections.abc import Callable
from pathlib import Path

import sqlite_utils

from ...errors import (
    NotAFlowscopeDatabase,
    StoreCorrupt,
    StoreError,
    StoreSchemaTooNew,
    StoreSchemaTooOld,
    StoreUnavailable,
)
from ..projection_sql import NODE_STATE_COLUMNS, open_where
from .faults import primary_code, store_error

__all__ = [
    "APPLICATION",
    "DB_SCHEMA_VERSION",
    "MIGRATIONS",
    "NODE_STATE_COLUMNS",
    "OPEN_WHERE",
    "DURABILITY",
    "check_file",
    "connect",
    "read_version",
    "ensure_schema",
    "journal_mode",
    "rollback",
]

APPLICATION = "flowscope"
#: The open-runs predicate of the partial index ``node_runs_open`` (schema 4) and of every
#: query that should use it: the ``OR`` form (see :func:`~flowscope.store.projection_sql.open_where`).
OPEN_WHERE = open_where(as_or=True)
#: ``synchronous`` per durability setting (see ``SqliteEventStore``).
DURABILITY = {"normal": "NORMAL", "full": "FULL"}
#: Small pages: an append rewrites a handful of B-tree pages (the event, the node run, the
#: session and their indexes) and every one of them goes to the WAL whole, so 1 KiB pages
#: make the per-step commit ~20% cheaper than 4 KiB.
PAGE_SIZE = 1024
#: How much WAL a writer lets grow before it checkpoints (SQLite's default is 1,000 pages:
#: 1 MiB at our page size). Each checkpoint syncs both files and copies every page the WAL
#: changed since the last one; a session's hot pages are rewritten at every step, so
#: checkpointing 16x less often copies them 16x less often. Measured on the 200-chain:
#: 15-19% less per node (bench/RESULTS.md). The price is a WAL file of up to ~17 MiB and a
#: checkpoint pause of a few tens of milliseconds every ~1,600 steps instead of a few
#: milliseconds every ~100.
WAL_CHECKPOINT_BYTES = 16 * 1024 * 1024
#: After a checkpoint resets the WAL, SQLite truncates the file to this size (its default
#: keeps a WAL as large as it ever grew, for instance behind a long-running reader).
WAL_SIZE_LIMIT = 2 * WAL_CHECKPOINT_BYTES


def _migrate_0_to_1(db: sqlite_utils.Database) -> None:
    """The first schema: the log, the sessions and the node-runs projection."""
    db.table("events").create(
        {
            "session_id": str,
            "seq": int,
            "type": str,
            "ts": float,
            "invocation_id": str,
            "path": str,
            "node": str,
            "payload": str,
        },
        pk=("session_id", "seq"),
        not_null={"session_id", "seq", "type", "payload"},
    )
    db.table("sessions").create(
        {
            "session_id": str,
            "workflow": str,
            "status": str,
            "started_at": float,
            "updated_at": float,
            "last_seq": int,
            "invocations": int,
        },
        pk="session_id",
        not_null={"session_id", "last_seq"},
    )
    db.table("node_runs").create(
        {
            "session_id": str,
            "path": str,
            "workflow": str,
            "node": str,
            "kind": str,
            "parent_path": str,
            "status": str,
            "attempt": int,
            "failures": int,
            "retries": int,
            "recoveries": int,
            "started_at": float,
            "ended_at": float,
            "heartbeat_at": float,
            "error_code": str,
            "error_type": str,
            "job_deadline_at": float,
        },
        pk=("session_id", "path"),
        not_null={"session_id", "path", "status"},
    )
    # open_runs(), the stuck/orphaned/overdue queries and audits by status.
    db.table("node_runs").create_index(["status", "started_at"], index_name="node_runs_status")


def _migrate_1_to_2(db: sqlite_utils.Database) -> None:
    """Snapshots of a session's folded state, so a long session resumes without reading its whole log."""
    db.table("snapshots").create(
        {"session_id": str, "seq": int, "data": str}, pk="session_id", not_null={"seq", "data"}
    )
    # Open runs (stuck, orphaned, overdue; the StoreCollector's scrape) through a partial
    # index that holds only them: finished runs, nearly every row, are not in it, so an
    # append touches it only when a run opens or closes, and a heartbeat never does. It
    # replaces the index on the status of every row.
    db.execute("DROP INDEX IF EXISTS node_runs_status")
    db.execute(f"CREATE INDEX node_runs_open ON node_runs (status, workflow, node) WHERE {open_where()}")


def _migrate_2_to_3(db: sqlite_utils.Database) -> None:
    """Run ownership: owner, lease and fence per session; queued runs; workers.

    Existing sessions get no owner (epoch 0): the liveness rule falls back to their
    heartbeats, as before.
    """
    for column in (
        "owner TEXT",
        "epoch INTEGER NOT NULL DEFAULT 0",
        "lease_expires_at REAL",
        "lease_renewed_at REAL",
        "submitted_at REAL",
        "recoveries INTEGER NOT NULL DEFAULT 0",
    ):
        db.execute(f"ALTER TABLE sessions ADD COLUMN {column}")
    # claim() and queued_summary(): one small index per claimable state. An append to a
    # running session leaves the queued and answered ones untouched.
    db.execute("CREATE INDEX sessions_queued ON sessions (workflow, submitted_at) WHERE status = 'queued'")
    db.execute("CREATE INDEX sessions_answered ON sessions (workflow, updated_at) WHERE status = 'answered'")
    # Orphan candidates: running sessions by the end of their lease.
    db.execute("CREATE INDEX sessions_running ON sessions (lease_expires_at) WHERE status = 'running'")
    db.table("workers").create(
        {"worker_id": str, "host": str, "pid": int, "started_at": float, "workflows": str, "seen_at": float},
        pk="worker_id",
        not_null={"worker_id", "seen_at"},
    )
    db.execute("CREATE INDEX workers_seen ON workers (seen_at)")


def _migrate_3_to_4(db: sqlite_utils.Database) -> None:
    """The open-runs index with an ``OR`` predicate instead of an ``IN`` list: SQLite
    checks the predicate for every row it writes, and the ``IN`` list cost an ephemeral
    table each time. Same rows, same queries; the rebuild scans ``node_runs`` once and
    writes an entry for each open run only."""
    db.execute("DROP INDEX IF EXISTS node_runs_open")
    db.execute(f"CREATE INDEX node_runs_open ON node_runs (status, workflow, node) WHERE {OPEN_WHERE}")


def _migrate_4_to_5(db: sqlite_utils.Database) -> None:
    """The inbox: one writer per session, so an answer for a session its owner is running
    waits here, not in the log, until the owner takes it in. Small: only messages not
    yet taken in are kept."""
    db.execute(
        "CREATE TABLE messages (message_id INTEGER PRIMARY KEY AUTOINCREMENT, session_id TEXT NOT NULL, "
        "kind TEXT NOT NULL, body TEXT NOT NULL, sent_at REAL NOT NULL)"
    )
    db.execute("CREATE INDEX messages_session ON messages (session_id, message_id)")


def _migrate_5_to_6(db: sqlite_utils.Database) -> None:
    """The owners of the leases not released, for a claim's liveness check: it reads each
    owner once through this index (a loose index scan) instead of every session a live
    worker holds. Only held sessions are in it; a release (expiry 0) takes one out."""
    db.execute("CREATE INDEX sessions_leased ON sessions (owner) WHERE lease_expires_at > 0")


def _migrate_6_to_7(db: sqlite_utils.Database) -> None:
    """A node run's latest start when it started more than once (``NodeState.restarted_at``):
    a run resumed after an hour's wait for an answer is not an hour old. Filled from the
    log for the runs already restarted (one pass over its ``node_started`` events)."""
    db.execute("ALTER TABLE node_runs ADD COLUMN restarted_at REAL")
    db.execute(SQL_FILL_RESTARTED_AT)


#: The ``ts`` of each restarted run's last ``NodeStarted`` (SQLite takes the bare column
#: ``ts`` from the row of ``max(seq)``), written to its row.
SQL_FILL_RESTARTED_AT = (
    "WITH r AS (SELECT session_id, path, ts, max(seq) FROM events WHERE type = 'node_started' "
    "GROUP BY session_id, path HAVING count(*) > 1) "
    "UPDATE node_runs SET restarted_at = r.ts FROM r "
    "WHERE node_runs.session_id = r.session_id AND node_runs.path = r.path"
)


#: ``MIGRATIONS[i]`` takes a database at schema ``i`` to schema ``i + 1``; each runs in the
#: transaction that records the new version, so a failed migration leaves the file as it was.
MIGRATIONS: list[Callable[[sqlite_utils.Database], None]] = [
    _migrate_0_to_1,
    _migrate_1_to_2,
    _migrate_2_to_3,
    _migrate_3_to_4,
    _migrate_4_to_5,
    _migrate_5_to_6,
    _migrate_6_to_7,
]
#: The version of this file format (tables and payloads) that this code writes.
DB_SCHEMA_VERSION = len(MIGRATIONS)


def rollback(conn: sqlite3.Connection) -> None:
    """Roll back the open transaction, if any, keeping the error that led here."""
    if conn.in_transaction:
        try:
            conn.execute("ROLLBACK")
        except sqlite3.Error:  # pragma: no cover - the error that led here matters more
            pass


def check_file(path: str, readonly: bool) -> None:
    """Refuse, before SQLite sees it, a path that cannot be a flowscope database."""
    if path == ":memory:":
        if readonly:
            raise StoreError("an in-memory flowscope store cannot be opened read-only: drop readonly=True")
        return
    p = Path(path)
    if p.is_dir():
        raise NotAFlowscopeDatabase(f"{path} is a directory, not a flowscope database")
    if not p.exists():
        if readonly:
            raise StoreUnavailable(f"flowscope database {path} does not exist: check the path")
        if not p.parent.is_dir():
            raise StoreUnavailable(
                f"cannot create flowscope database {path}: directory {p.parent} does not exist; create it first"
            )
        return
    # No peeking at the header with open()/close() here: closing any descriptor of a
    # database file drops every POSIX lock this process holds on it, including those of
    # other connections still open in this process, and another process can then
    # checkpoint the WAL under them ("database disk image is malformed"). SQLite's own
    # SQLITE_NOTADB says the same thing safely (see faults.store_error).
    if not os.access(p, os.R_OK):
        raise StoreUnavailable(f"cannot read {path}: permission denied; check its permissions")


def connect(path: str, readonly: bool, busy_timeout: float) -> sqlite3.Connection:
    """A connection in autocommit mode (transactions are explicit), shareable by threads."""
    try:
        if readonly:
            return _connect_read_only(path, busy_timeout)
        return sqlite3.connect(path, isolation_level=None, check_same_thread=False, timeout=busy_timeout)
    except sqlite3.Error as exc:
        raise store_error(exc, path, "open it", busy_timeout) from exc


def _connect_read_only(path: str, busy_timeout: float) -> sqlite3.Connection:
    """``mode=ro``; on storage that cannot be written (a read-only mount, an immutable
    folder), where SQLite cannot create the WAL's ``-shm`` file beside the database,
    ``immutable=1``: nobody can be writing a file that cannot be written."""
    uri = Path(path).resolve().as_uri()
    conn = sqlite3.connect(
        uri + "?mode=ro", uri=True, isolation_level=None, check_same_thread=False, timeout=busy_timeout
    )
    try:
        conn.execute("SELECT count(*) FROM sqlite_master").fetchone()
        return conn
    except sqlite3.OperationalError as exc:
        if primary_code(exc) not in (sqlite3.SQLITE_CANTOPEN, sqlite3.SQLITE_READONLY) or _writable(path):
            conn.close()
            raise
        conn.close()  # no writer can hold a lock on a file nobody can write
    return sqlite3.connect(
        uri + "?mode=ro&immutable=1",
        uri=True,
        isolation_level=None,
        check_same_thread=False,
        timeout=busy_timeout,
    )


def _writable(path: str) -> bool:
    """Can this process write the database file and create files beside it?"""
    folder = os.path.dirname(os.path.abspath(path))
    return os.access(path, os.W_OK) and os.access(folder, os.W_OK)


def read_version(conn: sqlite3.Connection, db: sqlite_utils.Database, path: str) -> int:
    """The schema version recorded in the file (0 for a new, empty database)."""
    tables = set(db.table_names())
    if "meta" not in tables:
        if tables - {"sqlite_sequence", "sqlite_stat1", "sqlite_stat4"}:
            raise NotAFlowscopeDatabase(
                f"{path} is not a flowscope database (it has no flowscope meta table)"
            )
        return 0
    try:
        meta = dict(conn.execute("SELECT key, value FROM meta").fetchall())
    except sqlite3.OperationalError as exc:
        raise NotAFlowscopeDatabase(
            f"{path} is not a flowscope database (unexpected meta table: {exc})"
        ) from exc
    if meta.get("application") != APPLICATION:
        raise NotAFlowscopeDatabase(f"{path} is not a flowscope database")
    try:
        return int(meta.get("schema_version", 0))
    except (TypeError, ValueError):
        raise StoreCorrupt(
            f"{path}: corrupt flowscope meta table (schema_version={meta.get('schema_version')!r}): "
            "restore it from a backup"
        ) from None


def _check_version(conn: sqlite3.Connection, db: sqlite_utils.Database, path: str) -> int:
    version = read_version(conn, db, path)
    if version > DB_SCHEMA_VERSION:
        raise StoreSchemaTooNew(
            f"{path} was written by a newer flowscope (schema {version}, "
            f"this version supports {DB_SCHEMA_VERSION}): upgrade flowscope"
        )
    return version


def ensure_schema(
    conn: sqlite3.Connection, db: sqlite_utils.Database, path: str, readonly: bool, busy_timeout: float
) -> None:
    """Check the file's schema and migrate it to :data:`DB_SCHEMA_VERSION` (a new file gets it all)."""
    version = _check_version(conn, db, path)
    if version == DB_SCHEMA_VERSION:
        return
    if readonly:
        raise StoreSchemaTooOld(
            f"{path} has flowscope schema {version}; this version uses schema {DB_SCHEMA_VERSION}, "
            "and a read-only open cannot migrate it"
        )
    conn.execute("BEGIN IMMEDIATE")
    try:
        version = _check_version(conn, db, path)  # another process may have migrated meanwhile
        if version < DB_SCHEMA_VERSION:
            if "meta" not in db.table_names():
                db.table("meta").create({"key": str, "value": str}, pk="key")
            for step in range(version, DB_SCHEMA_VERSION):
                MIGRATIONS[step](db)
            conn.executemany(
                "INSERT INTO meta (key, value) VALUES (?, ?) ON CONFLICT (key) DO UPDATE SET value = excluded.value",
                [("application", APPLICATION), ("schema_version", str(DB_SCHEMA_VERSION))],
            )
        conn.execute("COMMIT")
    except BaseException as exc:
        rollback(conn)
        if isinstance(exc, sqlite3.Error):
            action = f"migrate the schema from version {version} to {DB_SCHEMA_VERSION}"
            raise store_error(exc, path, action, busy_timeout) from exc
        raise


def journal_mode(conn: sqlite3.Connection, readonly: bool, busy_timeout: float) -> str:
    """The file's journal mode, switched to WAL first unless ``readonly``.

    The switch needs the file to itself, and SQLite returns ``SQLITE_BUSY`` at once, without
    calling the busy handler, when another connection holds a lock that could deadlock with it
    (processes creating the same new file at once meet this). So the switch is retried here
    until ``busy_timeout`` runs out.
    """
    if readonly:
        return str(conn.execute("PRAGMA journal_mode").fetchone()[0]).lower()
    deadline = time.monotonic() + busy_timeout
    pause = 0.001
    while True:
        try:
            return str(conn.execute("PRAGMA journal_mode = WAL").fetchone()[0]).lower()
        except sqlite3.OperationalError as exc:
            if (
                primary_code(exc) not in (sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED)
                or time.monotonic() >= deadline
            ):
                raise
        time.sleep(pause)
        pause = min(pause * 2, 0.05)
