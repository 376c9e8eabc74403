"""``PostgresEventStore``: the store for a fleet of workers on many hosts, on one database.

Every append is one transaction that locks its session's row: the last-seq check, the
epoch fence, the events (primary key ``(session_id, seq)``), the ``node_runs`` projection
and the session's row commit together or not at all. A store's first append to a session
locks the row with ``SELECT ... FOR UPDATE`` and reads what the fold needs; it keeps the
state it wrote, and its next append there is one prepared statement (one round trip)
whose update of the row, conditional on the row, seq and epoch it expects, takes the lock
and gates the inserts: on a mismatch nothing is written and the locking path runs. Claims take
rows with ``FOR UPDATE SKIP LOCKED``, so concurrent claimers on any host never get the
same session and never wait for each other. An append that makes a session claimable
(queued, answered) sends a ``NOTIFY``; :meth:`PostgresEventStore.wait_for_work` listens,
so an idle worker wakes at once (polling stays the fallback).

Connections come from a ``psycopg_pool`` pool: every method checks one out for its
duration, so one store object serves the event loop and the lease-renewal thread at once.
The statements and the tables are in :mod:`.queries` and :mod:`.schema`; the rows use the
SQLite store's codec, so a log reads the same from either store.
"""

from __future__ import annotations

import dataclasses
import json
import re
import threading
import time
from contextlib import contextmanager
from typing import Any, Callable, Collection, Iterable, Iterator, Mapping, Sequence, TypeVar

import psycopg
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo
from psycopg.types.json import Jsonb
from psycopg_pool import ConnectionPool, PoolTimeout

from ...errors import ConcurrencyConflict, LeaseLost, StoreCorrupt, StoreError, StoreReadOnly, StoreUnavailable
from ...events import Event, RunSubmitted, UnknownEvent
from ...fold import NodeState, WorkflowState, gc_paused
from ...jsontext import dumps_finite
from ...liveness import owner_alive, stale_before
from ...ownership import Lease, Owner, this_host
from ...states import SessionStatus
from ..base import (
    MAILED_STATUSES,
    WORKER_RETENTION_S,
    AppendBatch,
    Claim,
    ClaimReason,
    EventStore,
    JobResultGroup,
    Message,
    NodeRun,
    OpenRunGroup,
    QueuedGroup,
    SessionInfo,
    WorkerInfo,
    claim_reason,
    count_dead_owners,
    lease_lost,
    number_events,
    one_renewal,
    owned_elsewhere,
)
from ..sqlite.codec import decode, encode
from . import queries as q
from . import schema as sch
from .dsn import redact, server
from .faults import connect_error, is_connection_lost, store_error

__all__ = ["PostgresEventStore", "SYNCHRONOUS_COMMIT"]

T = TypeVar("T")
Conn = psycopg.Connection[Any]
#: ``synchronous_commit`` values a store may set for its connections (None: the server's).
SYNCHRONOUS_COMMIT = ("on", "off", "local", "remote_write", "remote_apply")
_IDENTIFIER = re.compile(r"^[a-z_][a-z0-9_]{0,62}$")
_NODE_CACHE_SESSIONS = 64  # sessions whose state an append keeps for the next one
#: Node runs an append loads at most to know all of a session's (more: the ones it touches).
_FULL_LOAD_MAX = 2000
_CLAIMABLE = ("queued", "answered")


class PostgresEventStore(EventStore):
    """An :class:`EventStore` in a PostgreSQL database, shared by every worker of a fleet.

    ``dsn``: a ``postgresql://`` URL or a libpq conninfo string (a password is best kept in
    ``PGPASSWORD`` or ``~/.pgpass``; it never appears in a message either way). ``schema``:
    the PostgreSQL schema holding the tables (created if missing). ``min_size`` /
    ``max_size``: the connection pool. ``timeout``: seconds to connect, or to wait for a
    pooled connection, before :class:`~flowscope.errors.StoreUnavailable`.
    ``synchronous_commit``: set it for these connections (``"off"`` trades the last few
    hundred milliseconds of commits on a server crash for ~40% faster appends; the
    database is never corrupted). ``readonly=True`` opens read-only transactions.

    Opening an unreachable server, refused credentials, another application's database
    or a newer schema raises a one-line :class:`~flowscope.errors.StoreError` naming
    ``host:port/dbname``; an empty database gets the schema, an older one is migrated.
    """

    def __init__(
        self,
        dsn: str,
        *,
        schema: str = "public",
        readonly: bool = False,
        min_size: int = 1,
        max_size: int = 8,
        timeout: float = 10.0,
        synchronous_commit: str | None = None,
        application_name: str = "flowscope",
    ) -> None:
        if not _IDENTIFIER.match(schema):
            raise ValueError(f"schema must be a lower-case SQL identifier, not {schema!r}")
        if synchronous_commit is not None and synchronous_commit not in SYNCHRONOUS_COMMIT:
            raise ValueError(f"synchronous_commit must be one of {SYNCHRONOUS_COMMIT}, not {synchronous_commit!r}")
        self.schema = schema
        self.readonly = readonly
        self.timeout = timeout
        self.where = server(dsn) + ("" if schema == "public" else f" (schema {schema})")
        #: The URL with its password masked: what messages and hints print.
        self.path = redact(dsn)
        self._channel = f"flowscope.{schema}"
        self._conninfo, self._target = self._build_conninfo(dsn, schema, readonly, timeout, synchronous_commit, application_name)
        self._cache_lock = threading.Lock()
        self._node_cache: dict[str, _Cached] = {}
        self._pool: ConnectionPool[Conn] | None = None
        self._closing = threading.Event()
        self._wake = threading.Condition()
        self._woken = False
        self._listener: threading.Thread | None = None
        conn = self._connect()
        try:
            self.schema_version_found = sch.ensure_schema(conn, self.where, schema, readonly)
        except psycopg.Error as exc:
            raise store_error(exc, self.where, "check the schema") from exc
        finally:
            conn.close()
        self._pool = ConnectionPool(
            self._conninfo,
            min_size=min_size,
            max_size=max(max_size, min_size),
            timeout=timeout,
            kwargs={"autocommit": True},
            name=f"flowscope {self.where}",
            open=True,
        )

    def __repr__(self) -> str:
        return f"PostgresEventStore({self.path!r})"

    @property
    def schema_version(self) -> int:
        """The schema version of the database (``DB_SCHEMA_VERSION`` once open)."""
        return self._run("read the schema version", lambda c: sch.read_version(c, self.where), retry=True)

    # ------------------------------------------------------------------ plumbing

    @staticmethod
    def _build_conninfo(
        dsn: str, schema: str, readonly: bool, timeout: float, synchronous_commit: str | None, application_name: str
    ) -> tuple[str, tuple[str, int, str]]:
        try:
            info = conninfo_to_dict(dsn)
        except psycopg.ProgrammingError as exc:
            raise StoreError(f"not a PostgreSQL URL or conninfo: {redact(dsn)}: {exc.__class__.__name__}") from None
        options = [str(info.get("options") or ""), f"-c search_path={schema}"]
        if synchronous_commit is not None:
            options.append(f"-c synchronous_commit={synchronous_commit}")
        if readonly:
            options.append("-c default_transaction_read_only=on")
        extra: dict[str, Any] = {"options": " ".join(o for o in options if o), "application_name": application_name}
        if "connect_timeout" not in info:
            extra["connect_timeout"] = max(1, int(timeout))
        host = str(info.get("host") or info.get("hostaddr") or "localhost").split(",")[0]
        port = int(str(info.get("port") or 5432).split(",")[0])
        return make_conninfo(dsn, **extra), (host, port, str(info.get("user") or ""))

    def _connect(self) -> Conn:
        """One connection outside the pool (schema checks, the listener), typed errors."""
        try:
            return psycopg.connect(self._conninfo, autocommit=True)
        except psycopg.Error as exc:
            host, port, user = self._target
            raise connect_error(exc, self.where, host, port, user, min(self.timeout, 3.0)) from None

    def _closed(self) -> StoreUnavailable:
        return StoreUnavailable(f"PostgreSQL at {self.where}: the store is closed; open a new PostgresEventStore")

    @contextmanager
    def _op(self, action: str) -> Iterator[Conn]:
        """A pooled connection for one operation; psycopg's errors become StoreErrors."""
        pool = self._pool
        if pool is None:
            raise self._closed()
        try:
            with pool.connection() as conn:
                yield conn
        except (psycopg.Error, PoolTimeout) as exc:
            raise store_error(exc, self.where, action) from exc

    def _run(self, action: str, fn: Callable[[Conn], T], *, retry: bool = False) -> T:
        """``fn`` on a pooled connection; with ``retry`` (operations that change nothing, or
        change it idempotently) once more on a fresh connection if the first was lost, as
        after a server restart (the pool drops a broken connection when it comes back)."""
        try:
            with self._op(action) as conn:
                return fn(conn)
        except StoreUnavailable as exc:
            if not retry or exc.__cause__ is None or not is_connection_lost(exc.__cause__):
                raise
        with self._op(action) as conn:
            return fn(conn)

    def _writable(self, action: str) -> None:
        if self.readonly:
            raise StoreReadOnly(f"PostgreSQL at {self.where} is open read-only: cannot {action}; open it without readonly=True")

    def close(self) -> None:
        self._closing.set()
        pool, self._pool = self._pool, None
        if pool is not None:
            pool.close()
        with self._wake:
            self._wake.notify_all()

    # ------------------------------------------------------------------ appending

    def append(
        self, session_id: str, events: Sequence[Event], expected_last_seq: int, *, epoch: int | None = None
    ) -> list[Event]:
        if not isinstance(events, (list, tuple)):
            events = list(events)
        encoded = [encode(self.where, session_id, e) for e in events]  # fails before anything is sent
        self._writable("append events")
        with self._cache_lock:
            cached = self._node_cache.pop(session_id, None)  # a failed append leaves none
        with self._op("append events") as conn:
            try:
                done = None
                if cached is not None and events and cached.last_seq == expected_last_seq:
                    done = self._append_cached(conn, session_id, events, encoded, epoch, cached)
                    cached = None  # tried: its node states may have moved on with the fold
                if done is None:
                    with conn.pipeline(), conn.transaction():
                        numbered, entry = self._append_tx(conn, session_id, events, encoded, expected_last_seq, epoch, cached)
                else:
                    numbered, entry = done
            except psycopg.errors.UniqueViolation as exc:
                if exc.diag.constraint_name != "events_pkey":
                    raise
                raise _appended_first(session_id, expected_last_seq) from None
        if entry is not None:
            self._keep({session_id: entry})
        return numbered

    def _append_cached(
        self,
        conn: Conn,
        session_id: str,
        events: Sequence[Event],
        encoded: list[tuple[str, float, str, str, str, str]],
        epoch: int | None,
        cached: _Cached,
    ) -> tuple[list[Event], _Cached] | None:
        """The append in one statement (:data:`~.queries.SQL_APPEND_CACHED`), folded on the
        state this store wrote last; None, with nothing written, when the session's row is
        no longer that state or the fence fails: the caller takes the locking path."""
        numbered = number_events(session_id, events, cached.last_seq, cached.last_seq)  # may raise: nothing sent
        nodes = cached.nodes
        paths = list(dict.fromkeys(e.path for e in numbered if e.path and type(e) is not UnknownEvent))
        if not cached.complete and any(p not in nodes for p in paths):
            return None  # a node state to read first
        ws = WorkflowState(session_id=session_id)
        ws.nodes = nodes
        ws.workflow, ws.status, ws.started_at, ws.updated_at, ws.invocations = cached.session
        ws.last_seq = cached.last_seq
        status_before = ws.status
        apply = ws.apply
        for e in numbered:
            apply(e)  # the one definition of what an event means (flowscope.fold)
        if ws.workflow != cached.session[0]:
            return None  # rare (another workflow's run in this session): the locking path renames the runs
        keys, columns = q.EVENT_KEYS, sch.NODE_STATE_COLUMNS
        try:  # allow_nan=False: JSON has no NaN, and the column types would refuse its text
            events_json = dumps_finite([dict(zip(keys, (e.seq,) + enc)) for e, enc in zip(numbered, encoded)])
            nodes_json = dumps_finite(
                [dict(zip(columns, _node_row(session_id, ws.workflow, ws.nodes[p])[2:])) for p in paths if p in ws.nodes]
            )
        except ValueError:
            return None  # a NaN or an infinity: the locking path sends it as a float
        params = {
            "sid": session_id, "row_id": cached.row_id, "expected": cached.last_seq, "epoch": epoch,
            "status": ws.status, "started_at": ws.started_at, "updated_at": ws.updated_at,
            "last_seq": ws.last_seq, "invocations": ws.invocations, "workflow": ws.workflow,
            "channel": self._channel, "notify": ws.status in _CLAIMABLE and ws.status != status_before,
            "events": events_json, "nodes": nodes_json,
        }
        row = conn.execute(q.SQL_APPEND_CACHED, params, prepare=True).fetchone()
        if row is None or row[0] != 1:
            return None
        return numbered, _Cached(cached.row_id, ws.last_seq, cached.complete, ws.nodes, _session_columns(ws))

    def append_many(self, batches: Sequence[AppendBatch]) -> list[list[Event] | BaseException]:
        """Every batch in one transaction (one commit for many sessions, issue 15's group
        commit), each in a savepoint: a batch refused by its fence or its expected ``seq``
        writes nothing and its exception is its result; an error of the store itself rolls
        everything back and is raised. Sessions' rows are locked in session-id order, so
        two group commits cannot deadlock."""
        if len(batches) <= 1 or type(self).append is not PostgresEventStore.append:
            return super().append_many(batches)  # one batch: append (its one-statement path); a wrapped append: through it
        prepared = []
        for sid, events, expected, epoch in batches:
            evs = events if isinstance(events, (list, tuple)) else list(events)
            prepared.append((sid, evs, [encode(self.where, sid, e) for e in evs], expected, epoch))
        self._writable("append events")
        with self._cache_lock:
            cached = {p[0]: self._node_cache.pop(p[0], None) for p in prepared}  # a failed append leaves none
        out: list[list[Event] | BaseException | None] = [None] * len(prepared)
        entries: dict[str, _Cached | None] = {}
        with self._op("append events") as conn:
            with conn.transaction():
                for i in sorted(range(len(prepared)), key=lambda i: prepared[i][0]):
                    sid, evs, encoded, expected, epoch = prepared[i]
                    known = entries[sid] if sid in entries else cached.pop(sid, None)
                    try:
                        with conn.transaction():  # a savepoint; the locking path, so rows lock in id order
                            numbered, entry = self._append_tx(conn, sid, evs, encoded, expected, epoch, known)
                    except psycopg.errors.UniqueViolation as exc:
                        if exc.diag.constraint_name != "events_pkey":
                            raise
                        out[i] = _appended_first(sid, expected)
                    except (ConcurrencyConflict, LeaseLost) as exc:
                        out[i] = exc
                    else:
                        out[i] = numbered
                        entries[sid] = entry
        self._keep({sid: entry for sid, entry in entries.items() if entry is not None})
        return [r for r in out if r is not None]

    def _keep(self, entries: dict[str, _Cached]) -> None:
        """Remember committed appends' node states (bounded)."""
        with self._cache_lock:
            cache = self._node_cache
            cache.update(entries)
            while len(cache) > _NODE_CACHE_SESSIONS:
                cache.pop(next(iter(cache)))

    def _append_tx(
        self,
        conn: Conn,
        session_id: str,
        events: Sequence[Event],
        encoded: list[tuple[str, float, str, str, str, str]],
        expected_last_seq: int,
        epoch: int | None,
        cached: _Cached | None,
    ) -> tuple[list[Event], _Cached | None]:
        """The append in a transaction that locks the session's row first: a new session,
        one this store has no state of, or one whose cached append did not match."""
        cur = conn.cursor()
        row = cur.execute(q.SQL_SESSION_FOR_UPDATE, (session_id,)).fetchone()  # the row stays locked
        current_epoch = row[6] if row is not None else 0
        if epoch is not None and current_epoch != epoch:  # the fence: nothing written
            raise lease_lost(session_id, current_epoch, _owner(row[7]) if row else None, epoch)
        last = row[4] if row is not None else 0
        numbered = number_events(session_id, events, last, expected_last_seq)  # may raise: nothing written
        if not numbered:
            return numbered, cached
        new_session = last == 0
        if new_session:
            nodes, complete = {}, True
        elif cached is not None and row is not None and cached.last_seq == last and cached.row_id == row[8]:  # nobody appended since
            nodes, complete = cached.nodes, cached.complete
        else:  # all the session's node states, unless there are many: then the ones touched
            found = cur.execute(q.SQL_LOAD_ALL_NODES, (session_id, _FULL_LOAD_MAX + 1)).fetchall()
            complete = len(found) <= _FULL_LOAD_MAX
            nodes = {r[0]: NodeState(**dict(zip(sch.NODE_STATE_COLUMNS, r))) for r in found} if complete else {}
        ws = WorkflowState(session_id=session_id)
        ws.nodes = nodes
        if row is not None:
            ws.workflow, ws.status, ws.started_at, ws.updated_at, ws.last_seq, ws.invocations = row[:6]
        status_before = ws.status
        workflow_before = ws.workflow
        paths = list(dict.fromkeys(e.path for e in numbered if e.path and type(e) is not UnknownEvent))
        missing = [] if complete else [p for p in paths if p not in nodes]
        if missing:
            for r in cur.execute(q.SQL_LOAD_NODES, (session_id, missing)).fetchall():
                nodes[r[0]] = NodeState(**dict(zip(sch.NODE_STATE_COLUMNS, r)))
        apply = ws.apply
        for e in numbered:
            apply(e)  # the one definition of what an event means (flowscope.fold)
        nodes = ws.nodes
        cur.executemany(q.SQL_INSERT_EVENT, [(session_id, e.seq) + enc for e, enc in zip(numbered, encoded)])
        cur.executemany(q.SQL_UPSERT_NODE, [_node_row(session_id, ws.workflow, nodes[p]) for p in paths if p in nodes])
        if ws.workflow != workflow_before and not new_session:
            cur.execute("UPDATE node_runs SET workflow = %s WHERE session_id = %s", (ws.workflow, session_id))
        submitted = next((e.ts for e in reversed(numbered) if type(e) is RunSubmitted), None)  # a first submit, or a retry
        made = cur.execute(
            q.SQL_UPSERT_SESSION,
            (session_id, ws.workflow, ws.status, ws.started_at, ws.updated_at, ws.last_seq, ws.invocations, submitted),
        ).fetchone()
        if ws.status in _CLAIMABLE and ws.status != status_before:
            cur.execute(q.SQL_NOTIFY, (self._channel, ws.workflow))  # delivered at commit
        row_id = int(made[0]) if made is not None else 0
        return numbered, _Cached(row_id, numbered[-1].seq, complete, nodes, _session_columns(ws))

    # ------------------------------------------------------------------ reading

    def read(self, session_id: str, after_seq: int = 0) -> list[Event]:
        after = after_seq if after_seq > 0 else 0

        def fetch(conn: Conn) -> list[Any]:
            row = conn.execute(q.SQL_LAST_SEQ, (session_id,)).fetchone()
            if row is None or row[0] <= after:
                return []
            last = row[0]
            with gc_paused():  # bounded by last_seq: a concurrent append beyond it cannot tear the read
                rows = conn.execute(q.SQL_READ, (session_id, after, last)).fetchall()
            if len(rows) != last - after:
                raise self._gap(conn, session_id, after, last)
            return rows

        rows = self._run("read events", fetch, retry=True)
        return decode(self.where, session_id, after, rows)

    def _gap(self, conn: Conn, session_id: str, after: int, last: int) -> StoreCorrupt:
        expected = after + 1
        for (s,) in conn.execute(q.SQL_READ_SEQS, (session_id, after, last)):
            if s != expected:
                break
            expected += 1
        return StoreCorrupt(
            f"PostgreSQL at {self.where}: the log of session {session_id!r} has a gap: seq {expected} is missing "
            f"(the session is at seq {last}); restore the database from a backup"
        )

    def last_seq(self, session_id: str) -> int:
        row = self._run("read the last seq", lambda c: c.execute(q.SQL_LAST_SEQ, (session_id,)).fetchone(), retry=True)
        return int(row[0]) if row is not None else 0

    def sessions(self) -> list[SessionInfo]:
        rows = self._run("list sessions", lambda c: c.execute(q.SQL_SESSIONS).fetchall(), retry=True)
        return [_session_info(r) for r in rows]

    def session_info(self, session_id: str) -> SessionInfo | None:
        row = self._run("read a session", lambda c: c.execute(q.SQL_SESSION_INFO, (session_id,)).fetchone(), retry=True)
        return _session_info(row) if row is not None else None

    def heartbeat(self, session_id: str, paths: Iterable[str], ts: float | None = None) -> None:
        self.heartbeat_many({session_id: list(paths)}, ts)

    def node_runs(self, session_id: str | None = None) -> list[NodeRun]:
        def fetch(conn: Conn) -> list[Any]:
            if session_id is None:
                return conn.execute(q.SQL_NODE_RUNS + " ORDER BY id").fetchall()
            return conn.execute(q.SQL_NODE_RUNS + " WHERE session_id = %s ORDER BY id", (session_id,)).fetchall()

        return [NodeRun(*r) for r in self._run("read node runs", fetch, retry=True)]

    def open_runs(self) -> list[NodeRun]:
        rows = self._run("query open runs", lambda c: c.execute(q.SQL_OPEN_RUNS).fetchall(), retry=True)
        return [NodeRun(*r) for r in rows]

    def open_run_summary(self, now: float, stale_after_s: float) -> list[OpenRunGroup]:
        """The port's summary in one ``GROUP BY`` over the open-runs index (the SQLite
        store's query), plus this host's live leases checked against their processes: it
        reads the open runs and their sessions' rows, not every session's."""
        host = this_host()

        def fetch(conn: Conn) -> tuple[list[Any], list[Any]]:
            # one round trip (pipelined) for the planner setting, both queries and the commit;
            # prepare=False: a plan for these values, never a generic one cached on the connection
            params = {"now": now, "stale_before": stale_before(now, stale_after_s)}
            with conn.pipeline(), conn.transaction():
                conn.execute(q.SQL_SUMMARY_PLANNER)
                summary = conn.execute(q.SQL_OPEN_SUMMARY, params, prepare=False)
                same_host = conn.execute(q.SQL_OPEN_SAME_HOST, {"now": now, "host": host}, prepare=False)
            return summary.fetchall(), same_host.fetchall()

        rows, same_host = self._run("summarise open runs", fetch, retry=True)
        return count_dead_owners(rows, ((w, n, _owner(o), lease, c) for w, n, o, lease, c in same_host), now, host)

    # ------------------------------------------------------------------ ownership

    def acquire(
        self, session_id: str, owner: Owner, lease_s: float, *, force: bool = False, now: float | None = None
    ) -> Lease:
        now = time.time() if now is None else now
        self._writable("acquire a session")
        expires = now + lease_s

        def take(conn: Conn) -> int:
            with conn.transaction():
                row = conn.execute(q.SQL_OWNERSHIP_FOR_UPDATE, (session_id,)).fetchone()
                if row is None:
                    made = conn.execute(q.SQL_NEW_OWNED, (session_id, Jsonb(owner.to_dict()), expires, now)).fetchone()
                    if made is not None:
                        return int(made[0])
                    row = conn.execute(q.SQL_OWNERSHIP_FOR_UPDATE, (session_id,)).fetchone()  # made meanwhile
                    if row is None:  # made and removed meanwhile: nothing holds it
                        raise ConcurrencyConflict(f"session {session_id!r} changed while being acquired; retry")
                held = _owner(row[0])
                if not force and held is not None and held.worker_id != owner.worker_id and owner_alive(held, row[2], now):
                    raise owned_elsewhere(session_id, held, row[2], row[3], now)
                return self._take(conn, [session_id], owner, expires, now, [])[session_id]

        return Lease(session_id, owner, self._run("acquire a session", take), expires)

    @staticmethod
    def _take(conn: Conn, sids: list[str], owner: Owner, expires: float, now: float, recovered: list[str]) -> dict[str, int]:
        params = {"owner": Jsonb(owner.to_dict()), "expires": expires, "now": now, "sids": sids, "recovered": recovered}
        return {sid: int(epoch) for sid, epoch in conn.execute(q.SQL_TAKE, params).fetchall()}

    def renew(self, lease: Lease, lease_s: float, *, now: float | None = None) -> Lease:
        return one_renewal(self.renew_many([lease], lease_s, now=now))

    def renew_many(self, leases: Sequence[Lease], lease_s: float, *, now: float | None = None) -> list[Lease | LeaseLost]:
        now = time.time() if now is None else now
        if not leases:
            return []
        self._writable("renew leases")
        params = {
            "expires": now + lease_s,
            "now": now,
            "sids": [lease.session_id for lease in leases],
            "epochs": [lease.epoch for lease in leases],
        }

        def extend(conn: Conn) -> tuple[set[str], dict[str, Any]]:
            with conn.transaction():
                renewed = {r[0] for r in conn.execute(q.SQL_RENEW_MANY, params).fetchall()}
                lost = [lease.session_id for lease in leases if lease.session_id not in renewed]
                rows = conn.execute(q.SQL_OWNERSHIP_MANY, (lost,)).fetchall() if lost else []
            return renewed, {r[0]: r[1:] for r in rows}

        renewed, owners = self._run("renew leases", extend, retry=True)  # idempotent: the same expiry twice
        out: list[Lease | LeaseLost] = []
        for lease in leases:
            if lease.session_id in renewed:
                out.append(dataclasses.replace(lease, expires_at=now + lease_s))
            else:
                row = owners.get(lease.session_id)
                out.append(lease_lost(lease.session_id, row[1] if row else 0, _owner(row[0]) if row else None, lease.epoch))
        return out

    def heartbeat_many(self, beats: Mapping[str, Iterable[str]], ts: float | None = None) -> None:
        now = time.time() if ts is None else ts
        pairs = [(sid, p) for sid, paths in beats.items() for p in paths]
        if not pairs:
            return
        self._writable("record heartbeats")
        params = {"now": now, "sids": [sid for sid, _ in pairs], "paths": [p for _, p in pairs]}
        self._run("record heartbeats", lambda c: c.execute(q.SQL_HEARTBEAT_MANY, params), retry=True)

    def release(self, lease: Lease) -> None:
        self._writable("release a lease")

        def end(conn: Conn) -> None:
            with conn.transaction():
                row = conn.execute(q.SQL_RELEASE, (lease.session_id, lease.epoch)).fetchone()
                if row is not None and row[0] in ("queued", "answered", "running"):  # claimable at once now
                    conn.execute(q.SQL_NOTIFY, (self._channel, row[1] or ""))

        self._run("release a lease", end, retry=True)

    def claim(
        self,
        owner: Owner,
        workflows: Collection[str],
        lease_s: float,
        *,
        limit: int,
        max_recoveries: int | None = None,
        now: float | None = None,
    ) -> list[Claim]:
        now = time.time() if now is None else now
        if limit <= 0 or not workflows:
            return []
        self._writable("claim sessions")
        host = this_host()
        params = {
            "workflows": sorted(set(workflows)),
            "now": now,
            "limit": limit,
            "host": host,
            "max_recoveries": max_recoveries if max_recoveries is not None else 2**31 - 1,
        }

        def take(conn: Conn) -> list[Claim]:
            # (since, session_id, workflow, reason)
            found: list[tuple[float, str, str, ClaimReason]] = []
            with conn.transaction():
                for status, statement in (*q.SQL_CLAIM_FREE.items(), ("mailed", q.SQL_CLAIM_MAILED)):
                    for sid, workflow, owner_json, lease, _rec, since, _epoch, *mailed in conn.execute(statement, params):
                        reason = claim_reason(mailed[0] if mailed else status, _owner(owner_json), lease, now, host=host,
                                              mail=bool(mailed))
                        if reason is not None:
                            found.append((since or 0.0, sid, workflow, reason))
                # this host's live leases: claimable if the owner's process is gone
                dead: list[tuple[float, str, str, ClaimReason, int]] = []
                for sid, workflow, owner_json, lease, rec, since, epoch, status in conn.execute(q.SQL_CLAIM_SAME_HOST, params):
                    # a paused, failed or completed row is here only with mail (the query's condition)
                    reason = claim_reason(status, _owner(owner_json), lease, now, host=host, mail=status in MAILED_STATUSES)
                    if reason is None or (reason == "orphaned" and max_recoveries is not None and rec > max_recoveries):
                        continue
                    dead.append((since or 0.0, sid, workflow, reason, epoch))
                if dead:
                    locked = {r[0] for r in conn.execute(q.SQL_CLAIM_LOCK, ([d[1] for d in dead], [d[4] for d in dead]))}
                    found += [d[:4] for d in dead if d[1] in locked]
                found.sort()
                chosen = found[:limit]
                if not chosen:
                    return []
                recovered = [sid for _s, sid, _w, reason in chosen if reason == "orphaned"]
                epochs = self._take(conn, [c[1] for c in chosen], owner, now + lease_s, now, recovered)
            return [Claim(sid, wf, reason, Lease(sid, owner, epochs[sid], now + lease_s)) for _s, sid, wf, reason in chosen]

        return self._run("claim sessions", take)

    # ------------------------------------------------------------------ the inbox

    def send(self, session_id: str, kind: str, body: Mapping[str, Any], *, ts: float | None = None) -> Message:
        now = time.time() if ts is None else ts
        text = dumps_finite(body)
        self._writable("send a message")

        def send(conn: Conn) -> int:
            with conn.transaction():
                row = conn.execute(q.SQL_SEND, (session_id, kind, text, now)).fetchone()
                conn.execute(q.SQL_NOTIFY_MAILED, (self._channel, session_id))  # delivered at commit
            assert row is not None  # INSERT ... RETURNING gives its row
            return int(row[0])

        return Message(session_id, self._run("send a message", send), kind, json.loads(text), now)

    def inbox(self, session_id: str) -> list[Message]:
        def read(conn: Conn) -> list[Any]:
            return conn.execute(q.SQL_INBOX, (session_id,)).fetchall()

        rows = self._run("read the inbox", read, retry=True)
        return [Message(session_id, int(mid), kind, body, sent) for mid, kind, body, sent in rows]

    def sessions_with_mail(self, session_ids: Collection[str]) -> set[str]:
        if not session_ids:
            return set()
        ids = list(session_ids)

        def read(conn: Conn) -> set[str]:
            return {r[0] for r in conn.execute(q.SQL_MAILED, (ids,))}

        return self._run("read the inbox", read, retry=True)

    def take_in(
        self,
        session_id: str,
        events: Sequence[Event],
        expected_last_seq: int,
        message_ids: Collection[int],
        *,
        epoch: int,
    ) -> list[Event]:
        events = list(events)
        encoded = [encode(self.where, session_id, e) for e in events]
        self._writable("take in messages")
        with self._cache_lock:
            cached = self._node_cache.pop(session_id, None)
        ids = sorted(message_ids)
        with self._op("take in messages") as conn:
            with conn.transaction():
                if events:
                    try:
                        numbered, entry = self._append_tx(conn, session_id, events, encoded, expected_last_seq, epoch, cached)
                    except psycopg.errors.UniqueViolation as exc:
                        if exc.diag.constraint_name != "events_pkey":
                            raise
                        raise _appended_first(session_id, expected_last_seq) from None
                else:
                    numbered, entry = [], None
                    row = conn.execute(q.SQL_SESSION_FOR_UPDATE, (session_id,)).fetchone()
                    if (row[6] if row is not None else 0) != epoch:  # the fence holds for the deletion too
                        raise lease_lost(session_id, row[6] if row else 0, _owner(row[7]) if row else None, epoch)
                conn.execute(q.SQL_DROP_MESSAGES, (session_id, ids))
        if entry is not None:
            self._keep({session_id: entry})
        return numbered

    def workers_seen(self, owner: Owner, workflows: Collection[str], ts: float | None = None) -> None:
        now = time.time() if ts is None else ts
        self._writable("record a worker")
        row = (owner.worker_id, owner.host, owner.pid, owner.started_at, Jsonb(sorted(workflows)), now)

        def seen(conn: Conn) -> None:
            with conn.pipeline():
                conn.execute(q.SQL_WORKER_SEEN, row)
                conn.execute(q.SQL_WORKERS_FORGET, (now - WORKER_RETENTION_S,))

        self._run("record a worker", seen, retry=True)

    def workers(self) -> list[WorkerInfo]:
        rows = self._run("list workers", lambda c: c.execute(q.SQL_WORKERS).fetchall(), retry=True)
        return [WorkerInfo(wid, host, pid, tuple(wfs or ()), seen) for wid, host, pid, wfs, seen in rows]

    def queued_summary(self) -> list[QueuedGroup]:
        rows = self._run("summarise queued sessions", lambda c: c.execute(q.SQL_QUEUED_SUMMARY).fetchall(), retry=True)
        return [QueuedGroup(wf, int(n), oldest) for wf, n, oldest in rows]

    def job_result_summary(self) -> list[JobResultGroup]:
        """The port's count in one ``GROUP BY`` over the log's job results."""
        rows = self._run("count job results", lambda c: c.execute(q.SQL_JOB_RESULTS).fetchall(), retry=True)
        return [JobResultGroup(wf or "", node or "", str(result), int(n)) for wf, node, result, n in sorted(rows, key=lambda r: (r[0] or "", r[1] or "", str(r[2])))]

    # ------------------------------------------------------------------ waking workers

    def wait_for_work(self, timeout: float) -> bool:
        """Block up to ``timeout`` seconds until an append or a release makes a session
        claimable (a ``NOTIFY`` from any host); True if woken. A notification that came
        since the last call returns at once, so none is missed between two waits."""
        if self._pool is None:
            raise self._closed()
        if self._listener is None:
            with self._wake:
                if self._listener is None:
                    self._listener = threading.Thread(target=self._listen, name="flowscope-pg-listen", daemon=True)
                    self._listener.start()
        with self._wake:
            if not self._woken and not self._closing.is_set():
                self._wake.wait(timeout)
            woken, self._woken = self._woken, False
        return woken

    def _signal(self) -> None:
        with self._wake:
            self._woken = True
            self._wake.notify_all()

    def _listen(self) -> None:
        """The listener thread: one connection outside the pool, reconnected after a loss."""
        channel = sql.SQL("LISTEN {}").format(sql.Identifier(self._channel))
        while not self._closing.is_set():
            try:
                conn = psycopg.connect(self._conninfo, autocommit=True)
            except psycopg.Error:
                self._closing.wait(1.0)  # the server is away: the waiters poll meanwhile
                continue
            try:
                conn.execute(channel)
                self._signal()  # notifications sent while we were not listening are lost: look once
                while not self._closing.is_set():
                    for _ in conn.notifies(timeout=0.5):
                        self._signal()
            except psycopg.Error:
                self._closing.wait(0.2)
            finally:
                conn.close()

    # ------------------------------------------------------------------ snapshots

    def save_snapshot(self, session_id: str, seq: int, data: str) -> None:
        self._writable("save a snapshot")

        def save(conn: Conn) -> None:
            with conn.transaction():
                row = conn.execute(q.SQL_LAST_SEQ, (session_id,)).fetchone()
                if row is None or seq > row[0]:
                    raise StoreError(f"PostgreSQL at {self.where}: a snapshot of session {session_id!r} at seq {seq} is ahead of its log")
                conn.execute(q.SQL_SAVE_SNAPSHOT, (session_id, seq, data))

        self._run("save a snapshot", save, retry=True)

    def load_snapshot(self, session_id: str) -> tuple[int, str] | None:
        row = self._run("read a snapshot", lambda c: c.execute(q.SQL_LOAD_SNAPSHOT, (session_id,)).fetchone(), retry=True)
        return (int(row[0]), str(row[1])) if row is not None else None

    # ------------------------------------------------------------------ span shipping (issue 15)

    def exported_seq(self, session_id: str) -> int:
        row = self._run("read the span watermark", lambda c: c.execute(q.SQL_EXPORTED_SEQ, (session_id,)).fetchone(), retry=True)
        return int(row[0]) if row is not None else 0

    def unexported(self) -> list[tuple[SessionInfo, int]]:
        rows = self._run("list sessions with spans to ship", lambda c: c.execute(q.SQL_UNEXPORTED).fetchall(), retry=True)
        return [(_session_info(r[:-1]), int(r[-1])) for r in rows]

    def set_exported_seq(self, session_id: str, seq: int) -> None:
        self.set_exported_seqs({session_id: seq})

    def set_exported_seqs(self, marks: Mapping[str, int]) -> None:
        if not marks:
            return
        self._writable("advance the span watermarks")
        items = sorted(marks.items())  # rows locked in session-id order: two exporters never deadlock
        params = {"sids": [sid for sid, _ in items], "seqs": [seq for _, seq in items]}
        # one statement; retried: the upsert keeps the larger watermark, so running it twice changes nothing
        self._run("advance the span watermarks", lambda c: c.execute(q.SQL_SET_EXPORTED_SEQS, params), retry=True)

    # ------------------------------------------------------------------ pruning (flowscope prune)

    def delete_sessions(self, session_ids: Iterable[str]) -> list[str]:
        """The port's prune in one transaction that locks the sessions' rows, then checks
        the guard (finished, no open run, no live owner) and deletes; a plain ``VACUUM``
        of the tables follows the commit, so new rows reuse the space at once."""
        ids = list(dict.fromkeys(session_ids))
        if not ids:
            return []
        self._writable("delete sessions")
        now = time.time()
        host = this_host()

        def prune(conn: Conn) -> list[str]:
            with conn.transaction():
                conn.execute(q.SQL_PRUNE_LOCK, {"ids": ids})
                # after the locks: a resume or a takeover that committed first keeps its log
                rows = conn.execute(q.SQL_PRUNABLE, {"ids": ids}).fetchall()
                prunable = {sid for sid, owner, lease in rows if not owner_alive(_owner(owner), lease, now, host=host)}
                deleted = [sid for sid in ids if sid in prunable]
                if deleted:
                    for statement in q.SQL_PRUNE:
                        conn.execute(statement, {"ids": deleted})
            return deleted

        deleted = self._run("delete sessions", prune)  # no retry: a lost commit would report nothing deleted
        with self._cache_lock:
            for sid in deleted:
                self._node_cache.pop(sid, None)
        if deleted:
            try:
                self._run("vacuum the pruned tables", lambda c: c.execute(q.SQL_PRUNE_VACUUM))
            except StoreError:
                pass  # the deletion is committed; autovacuum frees the space later instead
        return deleted

    def storage_bytes(self) -> int | None:
        """Bytes of the live rows of every flowscope table (what ``delete_sessions``
        frees), not of the files: PostgreSQL reuses a deleted row's space for new rows and
        shrinks a file only with ``VACUUM FULL``. It reads every row: an operator's query."""
        row = self._run("measure the database", lambda c: c.execute(q.SQL_STORAGE_BYTES).fetchone(), retry=True)
        return int(row[0]) if row is not None else None


@dataclasses.dataclass(frozen=True)
class _Cached:
    """A session as this store's last append there left it: the next append folds on it
    and sends one statement, which checks in the database that the row is still this one."""

    row_id: int  #: ``sessions.id``: a session pruned and made again is another row
    last_seq: int
    complete: bool  #: ``nodes`` holds every node run of the session (else only some)
    nodes: dict[str, NodeState]  #: the fold's node states, moved on by the next append
    session: tuple[str, SessionStatus, float | None, float | None, int]  #: workflow, status, started_at, updated_at, invocations


def _session_columns(ws: WorkflowState) -> tuple[str, SessionStatus, float | None, float | None, int]:
    return ws.workflow, ws.status, ws.started_at, ws.updated_at, ws.invocations


def _appended_first(session_id: str, expected_last_seq: int) -> ConcurrencyConflict:
    return ConcurrencyConflict(
        f"session {session_id!r}: another process appended first (seq {expected_last_seq + 1} exists); "
        "reload the session and retry"
    )


def _owner(data: Any) -> Owner | None:
    """The ``owner`` column (jsonb, read as a dict) as an :class:`Owner`."""
    return Owner.from_dict(data) if data else None


def _session_info(row: Sequence[Any]) -> SessionInfo:
    sid, workflow, status, started, updated, last_seq, invocations, owner, epoch, lease, submitted = row
    return SessionInfo(
        sid, workflow, status, started, updated, int(last_seq), int(invocations), _owner(owner), int(epoch), lease, submitted
    )


def _node_row(session_id: str, workflow: str, ns: NodeState) -> tuple[Any, ...]:
    return (
        session_id, workflow, ns.path, ns.node, ns.kind, ns.parent_path, ns.status, ns.attempt, ns.failures,
        ns.retries, ns.recoveries, ns.started_at, ns.ended_at, ns.heartbeat_at, ns.error_code, ns.error_type,
        ns.job_deadline_at,
    )
