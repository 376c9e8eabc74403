"""The database: its tables, their migrations, and checking and migrating a database.

All tables live in one PostgreSQL schema (``public`` unless ``PostgresEventStore(schema=)``
says otherwise; the connections' ``search_path`` points at it):

``meta``
    ``application`` (``"flowscope"``) and ``schema_version`` (:data:`DB_SCHEMA_VERSION`).
``events``
    the log, primary key ``(session_id, seq)``: hot fields in columns, the rest a JSON
    ``payload`` in the SQLite store's format (:mod:`flowscope.store.codec`).
``sessions``
    one row per session: the fold's columns (workflow, status, ``last_seq``, ...) and
    ownership (``owner`` JSON, the fencing ``epoch``, ``lease_expires_at``,
    ``lease_renewed_at``, ``submitted_at``, ``recoveries``). An append locks its session's
    row (``FOR UPDATE``), so the last-seq check and the epoch fence hold for the whole
    transaction; partial indexes hold the queued, answered and running sessions, so a
    claim and the queued summary read only those.
``node_runs``
    the projection kept in the append's transaction; a partial index holds the open runs
    (the stuck queries and the metrics scrape read only those).
``snapshots``, ``workers``
    one folded state per session; one row per worker (``workers_seen``).
``span_exports``
    each session's span-shipping watermark (schema 2): the ``seq`` up to which its spans
    were accepted by an exporter (:mod:`flowscope.observability.shipping`).
``messages``
    the inbox (schema 3): messages for a session's owner not yet taken in
    (:class:`~flowscope.store.base.Message`), deleted in the transaction that appends
    what they say.

A migration runs under ``pg_advisory_xact_lock`` in the transaction that records the new
version: several workers starting at once against a new database apply it once; the
others wait for the lock, then find the schema current.
"""

from __future__ import annotations

from typing import Any

import psycopg

from ...errors import (
    NotAFlowscopeDatabase,
    StoreCorrupt,
    StoreSchemaTooNew,
    StoreSchemaTooOld,
    StoreUnavailable,
)
from ..projection_sql import NODE_STATE_COLUMNS, OPEN_WHERE

__all__ = [
    "APPLICATION",
    "DB_SCHEMA_VERSION",
    "MIGRATIONS",
    "NODE_STATE_COLUMNS",
    "OPEN_WHERE",
    "MIGRATION_LOCK",
    "read_version",
    "ensure_schema",
]

APPLICATION = "flowscope"
#: The first key of the advisory lock migrations take (the second is the schema's hash):
#: ``'flow'`` as an int, so the lock is recognisable in ``pg_locks``.
MIGRATION_LOCK = 0x666C6F77


_MIGRATION_1 = [
    "CREATE TABLE meta (key text PRIMARY KEY, value text NOT NULL)",
    """CREATE TABLE events (
        session_id text NOT NULL,
        seq bigint NOT NULL,
        type text NOT NULL,
        ts double precision NOT NULL,
        invocation_id text NOT NULL,
        path text NOT NULL,
        node text NOT NULL,
        payload text NOT NULL,
        PRIMARY KEY (session_id, seq)
    )""",
    # fillfactor: room on each page for the updated version of a row, so an append's
    # update of its session (and a heartbeat's of its run) stays a HOT update
    """CREATE TABLE sessions (
        id bigint GENERATED ALWAYS AS IDENTITY,
        session_id text PRIMARY KEY,
        workflow text,
        status text,
        started_at double precision,
        updated_at double precision,
        last_seq bigint NOT NULL DEFAULT 0,
        invocations integer NOT NULL DEFAULT 0,
        owner jsonb,
        epoch bigint NOT NULL DEFAULT 0,
        lease_expires_at double precision,
        lease_renewed_at double precision,
        submitted_at double precision,
        recoveries integer NOT NULL DEFAULT 0
    ) WITH (fillfactor = 70)""",
    "CREATE INDEX sessions_queued ON sessions (workflow, submitted_at) WHERE status = 'queued'",
    "CREATE INDEX sessions_answered ON sessions (workflow) WHERE status = 'answered'",
    "CREATE INDEX sessions_running ON sessions (lease_expires_at) WHERE status = 'running'",
    """CREATE TABLE node_runs (
        id bigint GENERATED ALWAYS AS IDENTITY,
        session_id text NOT NULL,
        path text NOT NULL,
        workflow text,
        node text,
        kind text,
        parent_path text,
        status text NOT NULL,
        attempt integer,
        failures integer,
        retries integer,
        recoveries integer,
        started_at double precision,
        ended_at double precision,
        heartbeat_at double precision,
        error_code text,
        error_type text,
        job_deadline_at double precision,
        PRIMARY KEY (session_id, path)
    ) WITH (fillfactor = 70)""",
    f"CREATE INDEX node_runs_open ON node_runs (status, workflow, node) WHERE {OPEN_WHERE}",
    "CREATE TABLE snapshots (session_id text PRIMARY KEY, seq bigint NOT NULL, data text NOT NULL)",
    """CREATE TABLE workers (
        worker_id text PRIMARY KEY,
        host text,
        pid integer,
        started_at double precision,
        workflows jsonb NOT NULL,
        seen_at double precision NOT NULL
    )""",
    "CREATE INDEX workers_seen ON workers (seen_at)",
]

#: Schema 2: each session's span-shipping watermark
#: (:meth:`~flowscope.store.base.EventStore.exported_seq`).
_MIGRATION_2 = [
    "CREATE TABLE span_exports (session_id text PRIMARY KEY, exported_seq bigint NOT NULL)",
]

#: Schema 3: the inbox, one writer per session (:meth:`~flowscope.store.base.EventStore.send`).
_MIGRATION_3 = [
    """CREATE TABLE messages (
        message_id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
        session_id text NOT NULL,
        kind text NOT NULL,
        body jsonb NOT NULL,
        sent_at double precision NOT NULL
    )""",
    "CREATE INDEX messages_session ON messages (session_id, message_id)",
]

#: Schema 4: the owners of the leases not released, for a claim's liveness check: it
#: reads each owner once through this index (a loose index scan) instead of every
#: session a live worker holds. A release (expiry 0) takes a session out of it.
_MIGRATION_4 = [
    "CREATE INDEX sessions_leased ON sessions (owner) WHERE lease_expires_at > 0",
]

#: Schema 5: a message's body as the JSON text sent, as SQLite keeps it: ``jsonb`` sorted
#: an answer's keys, made ``1e16`` an integer and refused a ``\u0000`` in a string.
_MIGRATION_5 = [
    "ALTER TABLE messages ALTER COLUMN body TYPE text USING body::text",
]

#: Schema 6: a node run's latest start when it started more than once
#: (``NodeState.restarted_at``), filled from the log for the runs already restarted.
_MIGRATION_6 = [
    "ALTER TABLE node_runs ADD COLUMN restarted_at double precision",
    "UPDATE node_runs AS n SET restarted_at = r.ts FROM ("
    "SELECT DISTINCT ON (session_id, path) session_id, path, ts FROM events WHERE type = 'node_started' "
    "AND (session_id, path) IN (SELECT session_id, path FROM events WHERE type = 'node_started' "
    "GROUP BY session_id, path HAVING count(*) > 1) ORDER BY session_id, path, seq DESC) AS r "
    "WHERE n.session_id = r.session_id AND n.path = r.path",
]

#: ``MIGRATIONS[i]`` takes a database at schema ``i`` to ``i + 1``: statements run in the
#: transaction that records the new version (PostgreSQL's DDL is transactional).
MIGRATIONS: list[list[str]] = [
    _MIGRATION_1,
    _MIGRATION_2,
    _MIGRATION_3,
    _MIGRATION_4,
    _MIGRATION_5,
    _MIGRATION_6,
]
#: The version of the tables this code writes.
DB_SCHEMA_VERSION = len(MIGRATIONS)


def read_version(conn: psycopg.Connection[Any], where: str) -> int:
    """The schema version recorded in the database's schema (0 for an empty one)."""
    tables = {
        r[0]
        for r in conn.execute(
            # pg_tables, not information_schema: that one hides the tables this role may not read
            "SELECT tablename FROM pg_tables WHERE schemaname = current_schema()"
        )
    }
    if "meta" not in tables:
        if tables:
            shown = ", ".join(sorted(tables)[:5])
            raise NotAFlowscopeDatabase(
                f"PostgreSQL at {where} is not a flowscope database: it holds another application's tables "
                f"({shown}); use an empty database, or a schema of its own: PostgresEventStore(schema=...), "
                "or in a URL ?options=-csearch_path%3D..."
            )
        return 0
    meta = dict(conn.execute("SELECT key, value FROM meta").fetchall())
    if meta.get("application") != APPLICATION:
        raise NotAFlowscopeDatabase(
            f"PostgreSQL at {where} is not a flowscope database (its meta table is another's)"
        )
    try:
        return int(meta.get("schema_version", 0))
    except (TypeError, ValueError):
        raise StoreCorrupt(
            f"PostgreSQL at {where}: corrupt flowscope meta table (schema_version={meta.get('schema_version')!r})"
        ) from None


def _check(version: int, where: str) -> int:
    if version > DB_SCHEMA_VERSION:
        raise StoreSchemaTooNew(
            f"PostgreSQL at {where} was written by a newer flowscope (schema {version}, "
            f"this version supports {DB_SCHEMA_VERSION}): upgrade flowscope"
        )
    return version


def ensure_schema(conn: psycopg.Connection[Any], where: str, schema: str, readonly: bool) -> int:
    """Check the schema version and migrate to :data:`DB_SCHEMA_VERSION`; returns the
    version found (under the migration lock, when one was needed: 0 for the one opener
    that made the tables, the current version for those that waited for it). ``conn`` is in autocommit mode; the migration is one transaction."""
    exists = conn.execute("SELECT 1 FROM pg_namespace WHERE nspname = %s", (schema,)).fetchone() is not None
    version = _check(read_version(conn, where), where) if exists else 0
    if version == DB_SCHEMA_VERSION:
        return version
    if readonly:
        if version == 0:
            raise StoreUnavailable(
                f"PostgreSQL at {where} has no flowscope tables yet: start a worker or run something first"
            )
        raise StoreSchemaTooOld(
            f"PostgreSQL at {where} has flowscope schema {version}; this version uses schema {DB_SCHEMA_VERSION}, "
            "and a read-only open cannot migrate it"
        )
    with conn.transaction():
        conn.execute("SELECT pg_advisory_xact_lock(%s, hashtext(%s))", (MIGRATION_LOCK, schema))
        if not exists:
            conn.execute(
                psycopg.sql.SQL("CREATE SCHEMA IF NOT EXISTS {}").format(psycopg.sql.Identifier(schema))
            )
        found = _check(read_version(conn, where), where)  # another worker may have migrated meanwhile
        for step in range(found, DB_SCHEMA_VERSION):
            for statement in MIGRATIONS[step]:
                conn.execute(statement)
        if found < DB_SCHEMA_VERSION:
            conn.execute(
                "INSERT INTO meta (key, value) VALUES ('application', %s), ('schema_version', %s) "
                "ON CONFLICT (key) DO UPDATE SET value = excluded.value",
                (APPLICATION, str(DB_SCHEMA_VERSION)),
            )
    return found
