"""``PostgresEventStore``: the store for a fleet of workers on many hosts, on one database.

Every append is one transaction that locks its session's row: the last-seq check, the
epoch fence, the events (primary key ``(session_id, seq)``), the ``node_runs`` projection
and the session's row commit together or not at all. A first append to a session locks
the row (``SELECT ... FOR UPDATE``) and reads what the fold needs; the store keeps the
state it wrote, and its next append there is one prepared statement whose conditional
update of the row takes the lock and gates the inserts (on a mismatch nothing is written
and the locking path runs). Claims take rows with ``FOR UPDATE SKIP LOCKED``: claimers on
any host never get the same session nor wait for each other. An append that makes a
session claimable sends a ``NOTIFY``, so an idle worker (:meth:`wait_for_work`) wakes.

Connections come from a ``psycopg_pool`` pool, one per method call, so one store serves
the event loop and the lease-renewal thread at once. SQL: :mod:`.queries`, :mod:`.schema`;
what an append is and who may take a session: :mod:`flowscope.store.appending`,
:mod:`flowscope.store.takeover`; rows: the shared :mod:`flowscope.store.codec`.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Collection, Hashable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager, suppress
from operator import attrgetter
from typing import Any, TypeVar

import psycopg
from psycopg.types.json import Jsonb
from psycopg_pool import ConnectionPool, PoolTimeout

from ...errors import ConcurrencyConflict, LeaseLost, StoreError, StoreReadOnly, StoreUnavailable
from ...events import Event
from ...jsontext import dumps_finite
from ...liveness import stale_before
from ...ownership import Lease, Owner, this_host
from ..appending import (
    Cached,
    append_steps,
    keep_states,
    new_session,
    owner_from_column,
    prepare_batches,
    take_in_steps,
)
from ..base import (
    WORKER_RETENTION_S,
    AppendBatch,
    Claim,
    EventStore,
    JobResultGroup,
    Message,
    NodeRun,
    OpenRunGroup,
    QueuedGroup,
    SessionInfo,
    WorkerInfo,
    count_dead_owners,
    one_renewal,
    one_start,
    wraps_acquire,
)
from ..codec import decode, encode
from ..select_sql import SelectsInSql, session_info_of
from . import inbox as mail
from . import maintenance, ownership
from . import queries as q
from . import schema as sch
from .conninfo import SYNCHRONOUS_COMMIT, build_conninfo, check_options, url_schema
from .deadline import CALL_TIMEOUT_S, Deadlines
from .dsn import redact, server
from .faults import closed_store, connect_error, is_connection_lost, not_answered, store_error
from .wakeup import Wakeup
from .writer import Writer, append_cached, append_many_cached, append_many_locking, appended_first

__all__ = ["PostgresEventStore", "SYNCHRONOUS_COMMIT"]

T = TypeVar("T")
Conn = psycopg.Connection[Any]
#: The order of job_result_summary's groups: by workflow, node, then verdict.
_BY_WORKFLOW_NODE_RESULT = attrgetter("workflow", "node", "result")


class PostgresEventStore(SelectsInSql, EventStore):
    """An :class:`EventStore` in a PostgreSQL database, shared by every worker of a fleet.

    ``dsn``: a ``postgresql://`` URL or a libpq conninfo string (a password is best kept in
    ``PGPASSWORD`` or ``~/.pgpass``; it never appears in a message either way). ``schema``:
    the PostgreSQL schema holding the tables (created if missing; default: the URL's
    ``?options=-csearch_path%3D...``, how the CLI reaches one, else public). ``min_size`` /
    ``max_size``: the connection pool. ``timeout``: seconds to connect, or to wait for a
    pooled connection, before :class:`~flowscope.errors.StoreUnavailable`; ``call_timeout``:
    seconds one call may wait for the server (a frozen host, a lock held that long) before
    its connection is closed and it raises that (``None``: as long as the server takes), so
    that no caller, a worker's event loop among them, waits for ever.
    ``synchronous_commit``: set it for these connections (``"off"`` trades the last few
    hundred milliseconds of commits on a server crash for ~40% faster appends; the
    database is never corrupted). ``readonly=True`` opens read-only transactions.

    Opening an unreachable server, refused credentials, another application's database
    or a newer schema raises a one-line :class:`~flowscope.errors.StoreError` naming
    ``host:port/dbname``; an empty database gets the schema, an older one is migrated.
    """

    dialect = q.DIALECT

    def __init__(
        self,
        dsn: str,
        *,
        schema: str | None = None,
        readonly: bool = False,
        min_size: int = 1,
        max_size: int = 8,
        timeout: float = 10.0,
        synchronous_commit: str | None = None,
        application_name: str = "flowscope",
        call_timeout: float | None = CALL_TIMEOUT_S,
    ) -> None:
        schema = schema or url_schema(dsn) or "public"
        check_options(schema, synchronous_commit)
        self._deadlines = Deadlines(call_timeout)
        self.schema, self.readonly, self.timeout = schema, readonly, timeout
        self.where = server(dsn) + ("" if schema == "public" else f" (schema {schema})")
        #: The URL with its password masked: what messages and hints print.
        self.path = redact(dsn)
        self._channel = f"flowscope.{schema}"
        self._conninfo, self._target = build_conninfo(
            dsn, schema, readonly, timeout, synchronous_commit, application_name
        )
        self._cache_lock = threading.Lock()
        self._node_cache: dict[str, Cached] = {}
        self._pool: ConnectionPool[Conn] | None = None
        self._wakeup = Wakeup(self._conninfo, self._channel)
        #: The console's notices (an append moved a session's status), closed with the workers'.
        self.wait_for_change = self._wakeup.sibling(self._channel + q.CHANGES_SUFFIX).wait
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

    def _connect(self) -> Conn:
        """One connection outside the pool (schema checks, the listener), typed errors."""
        try:
            return psycopg.connect(self._conninfo, autocommit=True)
        except psycopg.Error as exc:
            host, port, user = self._target
            raise connect_error(exc, self.where, host, port, user, min(self.timeout, 3.0)) from None

    @contextmanager
    def _op(self, action: str, *, watched: bool = True) -> Iterator[Conn]:
        """A pooled connection for one operation, cut off past ``call_timeout`` unless not
        ``watched``; psycopg's errors become StoreErrors. A lost connection has the pool
        test its idle ones (after a restart all are dead, each found only when handed out),
        so that the next call, this one's retry, gets a live one; a call cut off is not
        retried: the server did not answer it, and would not answer the retry."""
        pool = self._pool
        if pool is None:
            raise closed_store(self.where)
        call = None
        try:
            with pool.connection() as conn, self._deadlines.watch(conn, watched) as call:
                yield conn
        except (psycopg.Error, PoolTimeout) as exc:
            if call is not None and call.expired:
                raise not_answered(self.where, self._deadlines.seconds, action) from None
            if is_connection_lost(exc):
                with suppress(Exception):  # a server still away: the next call says so
                    pool.check()
            raise store_error(exc, self.where, action) from exc

    def _run(self, action: str, fn: Callable[[Conn], T], *, retry: bool = False) -> T:
        """``fn`` on a pooled connection; with ``retry`` (operations that change nothing, or
        change it idempotently) once more on a live connection if the first was lost, as
        after a server restart (:meth:`_op` has the pool test its idle ones)."""
        try:
            with self._op(action) as conn:
                return fn(conn)
        except StoreUnavailable as exc:
            if not retry or exc.__cause__ is None or not is_connection_lost(exc.__cause__):
                raise
        with self._op(action) as conn:
            return fn(conn)

    def _rows(self, action: str, sql: str, params: Any = None) -> list[Any]:
        """The rows of one read-only query, retried on a new connection like every read."""
        return self._run(action, lambda c: c.execute(sql, params).fetchall(), retry=True)

    _select = _rows

    def _writable(self, action: str) -> None:
        if self.readonly:
            raise StoreReadOnly(
                f"PostgreSQL at {self.where} is open read-only: cannot {action}; open it without readonly=True"
            )

    def close(self) -> None:
        pool, self._pool = self._pool, None
        if pool is not None:
            pool.close()
        self._wakeup.close()
        self._deadlines.close()

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
                if cached is not None and events and cached.session.last_seq == expected_last_seq:
                    done = append_cached(conn, self._channel, session_id, events, encoded, epoch, cached)
                    cached = None  # tried: its node states may have moved on with the fold
                if done is None:
                    with conn.pipeline(), conn.transaction():
                        io = Writer(conn, self._channel)
                        numbered, entry = append_steps(
                            io, session_id, events, encoded, expected_last_seq, epoch, cached
                        )
                else:
                    numbered, entry = done
            except psycopg.errors.UniqueViolation as exc:
                if exc.diag.constraint_name != "events_pkey":
                    raise
                raise appended_first(session_id, expected_last_seq) from None
        self._keep({session_id: entry})
        return numbered

    def append_many(self, batches: Sequence[AppendBatch]) -> list[list[Event] | BaseException]:
        """Every batch in one transaction (the group commit): a batch refused by its fence
        or its expected ``seq`` writes nothing and its exception is its result; an error of
        the store itself rolls everything back and is raised. Rows are locked in session-id
        order, so two group commits cannot deadlock (:mod:`.writer`'s two paths)."""
        if len(batches) <= 1 or type(self).append is not PostgresEventStore.append:
            return super().append_many(batches)  # one: append's one-statement path; a wrapped append
        return self._append_group(batches, {})[0]

    def append_and_release(
        self, batches: Sequence[AppendBatch], leases: Mapping[str, Lease]
    ) -> tuple[list[list[Event] | BaseException], set[str]]:
        """The port's, in one transaction for a group: the appends, the inbox check, the
        releases (one commit, not one per lease)."""
        cls, pg = type(self), PostgresEventStore
        if len(batches) <= 1 or cls.append is not pg.append or cls.release is not pg.release:
            return super().append_and_release(batches, leases)
        return self._append_group(batches, leases)

    def _append_group(
        self, batches: Sequence[AppendBatch], leases: Mapping[str, Lease]
    ) -> tuple[list[list[Event] | BaseException], set[str]]:
        prepared = prepare_batches(batches, encode, self.where)
        self._writable("append events")
        with self._cache_lock:  # a failed append leaves none
            cached = {p.session_id: self._node_cache.pop(p.session_id, None) for p in prepared}
        with self._op("append events") as conn, conn.transaction():
            # the usual group (every session's next append on the state kept): one round trip
            done = append_many_cached(conn, self._channel, prepared, cached)
            out, entries = done or append_many_locking(conn, self._channel, prepared, cached)
            appended = (p.session_id for p, r in zip(prepared, out) if not isinstance(r, BaseException))
            released = ownership.release_unmailed(conn, self._channel, leases, appended) if leases else set()
        self._keep(entries)
        return out, released

    def _keep(self, entries: Mapping[str, Cached | None]) -> None:
        """Remember committed appends' node states for the next append (:func:`keep_states`)."""
        with self._cache_lock:
            keep_states(self._node_cache, entries)

    # ------------------------------------------------------------------ reading

    def read(self, session_id: str, after_seq: int = 0) -> list[Event]:
        after = after_seq if after_seq > 0 else 0
        rows = self._run(
            "read events", lambda c: maintenance.fetch(c, self.where, session_id, after), retry=True
        )
        return decode(self.where, session_id, after, rows)

    def last_seq(self, session_id: str) -> int:
        rows = self._rows("read the last seq", q.SQL_LAST_SEQ, (session_id,))
        return int(rows[0][0]) if rows else 0

    def sessions(self) -> list[SessionInfo]:
        return self.find_sessions()

    def change_mark(self) -> Hashable:
        return tuple(self._rows("read the change mark", q.SQL_CHANGE_MARK)[0])

    def session_info(self, session_id: str) -> SessionInfo | None:
        rows = self._rows("read a session", q.SQL_SESSION_INFO, (session_id,))
        return session_info_of(rows[0]) if rows else None

    def heartbeat(self, session_id: str, paths: Iterable[str], ts: float | None = None) -> None:
        self.heartbeat_many({session_id: list(paths)}, ts)

    def node_runs(self, session_id: str | None = None) -> list[NodeRun]:
        def fetch(conn: Conn) -> list[Any]:
            if session_id is None:
                return conn.execute(q.SQL_NODE_RUNS + " ORDER BY id").fetchall()
            return conn.execute(
                q.SQL_NODE_RUNS + " WHERE session_id = %s ORDER BY id", (session_id,)
            ).fetchall()

        return [NodeRun(*r) for r in self._run("read node runs", fetch, retry=True)]

    def open_runs(self) -> list[NodeRun]:
        return [NodeRun(*r) for r in self._rows("query open runs", q.SQL_OPEN_RUNS)]

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
        return count_dead_owners(rows, ((w, n, owner_from_column(o), c) for w, n, o, c in same_host), host)

    # ------------------------------------------------------------------ ownership

    def acquire(
        self, session_id: str, owner: Owner, lease_s: float, *, force: bool = False, now: float | None = None
    ) -> Lease:
        self._writable("acquire a session")  # the lease starts once the row is locked: LeaseClock
        return self._run(
            "acquire a session", lambda c: ownership.acquire(c, session_id, owner, lease_s, now, force=force)
        )

    def acquire_new(
        self, session_id: str, owner: Owner, lease_s: float, *, now: float | None = None
    ) -> Lease | None:
        """The port's, in one transaction (the check, the lease)."""
        if wraps_acquire(self, PostgresEventStore):
            return super().acquire_new(session_id, owner, lease_s, now=now)
        return one_start(self._acquire_new([session_id], owner, lease_s, now))

    def acquire_new_many(
        self, session_ids: Sequence[str], owner: Owner, lease_s: float, *, now: float | None = None
    ) -> list[Lease | None | ConcurrencyConflict]:
        """The port's, in one transaction (one at a time, as the port's default does, for a
        subclass that wraps ``acquire`` or ``acquire_new``, or a session named twice)."""
        if wraps_acquire(self, PostgresEventStore, new=True) or len(set(session_ids)) < len(session_ids):
            return super().acquire_new_many(session_ids, owner, lease_s, now=now)
        return self._acquire_new(session_ids, owner, lease_s, now)

    def _acquire_new(
        self, session_ids: Sequence[str], owner: Owner, lease_s: float, now: float | None
    ) -> list[Lease | None | ConcurrencyConflict]:
        self._writable("acquire a session")
        got, row_ids = self._run(
            "acquire sessions", lambda c: ownership.acquire_new_many(c, session_ids, owner, lease_s, now)
        )
        with self._cache_lock:  # no events yet: each first append is guarded on its row, not read
            for sid, row_id in row_ids.items():
                self._node_cache[sid] = new_session(sid, row_id)
        return got

    def renew(self, lease: Lease, lease_s: float, *, now: float | None = None) -> Lease:
        return one_renewal(self.renew_many([lease], lease_s, now=now))

    def renew_many(
        self, leases: Sequence[Lease], lease_s: float, *, now: float | None = None
    ) -> list[Lease | LeaseLost]:
        now = time.time() if now is None else now
        if not leases:
            return []
        self._writable("renew leases")
        # idempotent: the same expiry twice
        return self._run("renew leases", lambda c: ownership.renew(c, leases, lease_s, now), retry=True)

    def heartbeat_many(self, beats: Mapping[str, Iterable[str]], ts: float | None = None) -> None:
        now = time.time() if ts is None else ts
        pairs = [(sid, p) for sid, paths in beats.items() for p in paths]
        if not pairs:
            return
        self._writable("record heartbeats")
        params = {"now": now, "sids": [sid for sid, _ in pairs], "paths": [p for _, p in pairs]}
        self._run("record heartbeats", lambda c: c.execute(q.SQL_HEARTBEAT_MANY, params), retry=True)

    def release(self, lease: Lease) -> None:
        self._writable("release a lease")  # then a NOTIFY if claimable: after the release is visible
        self._run("release a lease", lambda c: ownership.release(c, self._channel, [lease]), retry=True)

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
        if limit <= 0 or not workflows:
            return []
        self._writable("claim sessions")  # the clock read in the transaction: LeaseClock
        host = this_host()

        def take(conn: Conn) -> list[Claim]:
            return ownership.claim(
                conn,
                owner,
                workflows,
                lease_s,
                limit=limit,
                max_recoveries=max_recoveries,
                now=now,
                host=host,
            )

        return self._run("claim sessions", take)

    # ------------------------------------------------------------------ the inbox

    def send(
        self, session_id: str, kind: str, body: Mapping[str, Any], *, ts: float | None = None
    ) -> Message:
        now = time.time() if ts is None else ts
        text = dumps_finite(body)
        self._writable("send a message")
        message_id = self._run(
            "send a message", lambda c: mail.send(c, self._channel, session_id, kind, text, now)
        )
        return Message(session_id, message_id, kind, json.loads(text), now)

    def inbox(self, session_id: str) -> list[Message]:
        return self._run("read the inbox", lambda c: mail.messages(c, session_id), retry=True)

    def sessions_with_mail(self, session_ids: Collection[str]) -> set[str]:
        if not session_ids:
            return set()
        ids = list(session_ids)
        return self._run("read the inbox", lambda c: mail.mailed(c, ids), retry=True)

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
        with self._op("take in messages") as conn:
            try:
                with conn.transaction():
                    io = Writer(conn, self._channel)
                    numbered, entry = take_in_steps(
                        io, session_id, events, encoded, expected_last_seq, message_ids, epoch, cached
                    )
            except psycopg.errors.UniqueViolation as exc:
                if exc.diag.constraint_name != "events_pkey":
                    raise
                raise appended_first(session_id, expected_last_seq) from None
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
        rows = self._rows("list workers", q.SQL_WORKERS)
        return [WorkerInfo(wid, host, pid, tuple(wfs or ()), seen) for wid, host, pid, wfs, seen in rows]

    def queued_summary(self) -> list[QueuedGroup]:
        rows = self._rows("summarise queued sessions", q.SQL_QUEUED_SUMMARY)
        return [QueuedGroup(wf, int(n), oldest) for wf, n, oldest in rows]

    def job_result_summary(self) -> list[JobResultGroup]:
        """The port's count in one ``GROUP BY`` over the log's job results."""
        rows = self._rows("count job results", q.SQL_JOB_RESULTS)
        groups = [JobResultGroup(wf or "", node or "", str(result), int(n)) for wf, node, result, n in rows]
        return sorted(groups, key=_BY_WORKFLOW_NODE_RESULT)

    # ------------------------------------------------------------------ waking workers

    def wait_for_work(self, timeout: float) -> bool:
        """Block up to ``timeout`` seconds until an append or a release makes a session
        claimable (a ``NOTIFY`` from any host); True if woken. A notification that came
        since the last call returns at once, so none is missed between two waits."""
        if self._pool is None:
            raise closed_store(self.where)
        return self._wakeup.wait(timeout)

    # ------------------------------------------------------------------ snapshots

    def save_snapshot(self, session_id: str, seq: int, data: str) -> None:
        self._writable("save a snapshot")
        save = lambda c: maintenance.save_snapshot(c, self.where, session_id, seq, data)
        self._run("save a snapshot", save, retry=True)

    def load_snapshot(self, session_id: str) -> tuple[int, str] | None:
        return self._run("read a snapshot", lambda c: maintenance.load_snapshot(c, session_id), retry=True)

    # ------------------------------------------------------------------ span shipping

    def exported_seq(self, session_id: str) -> int:
        return self._run(
            "read the span watermark", lambda c: maintenance.exported_seq(c, session_id), retry=True
        )

    def unexported(self) -> list[tuple[SessionInfo, int]]:
        rows = self._rows("list sessions with spans to ship", q.SQL_UNEXPORTED)
        return [(session_info_of(info), int(exported)) for *info, exported in rows]

    def set_exported_seq(self, session_id: str, seq: int) -> None:
        self.set_exported_seqs({session_id: seq})

    def set_exported_seqs(self, marks: Mapping[str, int]) -> None:
        if not marks:
            return
        self._writable("advance the span watermarks")
        items = sorted(marks.items())  # rows locked in session-id order: two exporters never deadlock
        params = {"sids": [sid for sid, _ in items], "seqs": [seq for _, seq in items]}
        # one statement; retried: the upsert keeps the larger watermark, so running it twice changes nothing
        self._run(
            "advance the span watermarks", lambda c: c.execute(q.SQL_SET_EXPORTED_SEQS, params), retry=True
        )

    # ------------------------------------------------------------------ pruning (flowscope prune)

    def delete_sessions(self, session_ids: Iterable[str]) -> list[str]:
        """The port's prune in one transaction that locks the sessions' rows, then checks
        the guard (finished, no open run, no live owner) and deletes; a plain ``VACUUM``
        of the tables follows the commit, so new rows reuse the space at once."""
        ids = list(dict.fromkeys(session_ids))
        if not ids:
            return []
        self._writable("delete sessions")
        # no retry: a lost commit would report nothing deleted
        deleted = self._run("delete sessions", lambda c: maintenance.delete_sessions(c, ids))
        with self._cache_lock:
            for sid in deleted:
                self._node_cache.pop(sid, None)
        if deleted:  # committed: if the VACUUM fails, autovacuum frees the space later; not cut
            # off past call_timeout, as a large table's may rightly take longer
            with suppress(StoreError), self._op("vacuum the pruned tables", watched=False) as conn:
                conn.execute(q.SQL_PRUNE_VACUUM)
        return deleted

    def storage_bytes(self) -> int | None:
        """Bytes of the live rows of every flowscope table (what ``delete_sessions``
        frees), not of the files: PostgreSQL reuses a deleted row's space for new rows and
        shrinks a file only with ``VACUUM FULL``. It reads every row: an operator's query."""
        row = self._run(
            "measure the database", lambda c: c.execute(q.SQL_STORAGE_BYTES).fetchone(), retry=True
        )
        return int(row[0]) if row is not None else None
