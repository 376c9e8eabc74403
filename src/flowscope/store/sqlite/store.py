"""``SqliteEventStore``: the adapter (append, reads, the projection cache, snapshots, pruning).

Every append is one ``BEGIN IMMEDIATE`` transaction: the last-seq check (optimistic
concurrency), the insert and the projection update are atomic across processes. Several
processes may use one file, each through its own ``SqliteEventStore``; a writer that finds
the file locked waits up to ``busy_timeout`` seconds. A store object may be shared by
threads (calls are serialised by a lock; a lease is renewed from another thread than the
event loop's), but not across ``fork()``: open a new one in the child. Acquiring, renewing
and claiming sessions are ``BEGIN IMMEDIATE`` transactions too, so the fence (the epoch an
append is checked against) and a claim are atomic across processes. The file layout is in
:mod:`.schema`, the row format in :mod:`flowscope.store.codec`; what an append is, and who
may take a session, in :mod:`flowscope.store.appending` and :mod:`flowscope.store.takeover`
(this package gives them its SQL: :mod:`.writer`, :mod:`.ownership`).
"""

from __future__ import annotations

import json
import os
import sqlite3
import threading
import time
from collections.abc import Collection, Iterable, Mapping, Sequence
from typing import Any

import sqlite_utils

from ...errors import ConcurrencyConflict, LeaseLost, StoreError, StoreReadOnly, StoreUnavailable
from ...events import Event
from ...fold import gc_paused
from ...jsontext import dumps_finite
from ...liveness import stale_before
from ...ownership import Lease, Owner, this_host
from ..appending import Cached, keep_states, new_session, owner_from_column, prepare_batches, take_in_steps
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
from ..takeover import LeaseClock
from . import maintenance, ownership, schema
from . import queries as q
from .appends import append_group, append_one
from .connection import Use
from .faults import store_error, wal_removed
from .files import WalWatch, identity
from .writer import Writer

__all__ = ["SqliteEventStore"]

#: job_result_summary's running count (``SqliteEventStore._job_results``).
_JobCounts = tuple[dict[tuple[str, str, str], int], int, str | None, tuple[int, int] | None]


class SqliteEventStore(SelectsInSql, EventStore):
    """An :class:`EventStore` in one SQLite file, in WAL mode so readers never block the writer.

    ``durability="normal"`` (``synchronous=NORMAL`` in WAL mode: a commit survives a
    process crash; an OS crash or power loss may lose the last transactions, never corrupt
    the file) or ``"full"`` (fsync on every commit). ``readonly=True`` opens an existing
    file without ever writing to it. ``busy_timeout`` (seconds) is how long a writer waits
    for another process's transaction before giving up with :class:`StoreLocked`.

    Opening a file that is missing (read-only), not SQLite, another application's
    database, or from a newer flowscope raises a :class:`StoreError` subclass naming the
    file; an older schema is migrated; a new or empty file gets the schema.
    """

    dialect = q.DIALECT

    def __init__(
        self,
        path: str | os.PathLike[str],
        durability: str = "normal",
        readonly: bool = False,
        *,
        busy_timeout: float = 5.0,
    ) -> None:
        if durability not in schema.DURABILITY:
            raise ValueError(f"durability must be 'normal' or 'full', not {durability!r}")
        self.path = os.fspath(path)
        self.durability = durability
        self.readonly = readonly
        self.busy_timeout = busy_timeout
        self._lock = threading.RLock()
        #: Per session in the middle of an invocation, the state this object's last append left
        #: (:func:`~flowscope.store.appending.keep_states`).
        self._node_cache: dict[str, Cached] = {}
        self._conn: sqlite3.Connection | None = None
        self._identity: tuple[int, int] | None = None
        self._wal = WalWatch(self.path, False)  # the -wal file this connection writes to
        #: job_result_summary's running count: (counts, last rowid read, prune mark then, file identity).
        self._job_results: _JobCounts = ({}, 0, None, None)
        new_file = self.path == ":memory:" or not os.path.exists(self.path) or os.path.getsize(self.path) == 0
        schema.check_file(self.path, readonly)
        conn = schema.connect(self.path, readonly, busy_timeout)
        self._conn = conn
        try:
            if new_file and not readonly:
                conn.execute(f"PRAGMA page_size = {schema.PAGE_SIZE}")
            self.db = sqlite_utils.Database(conn, recursive_triggers=False, execute_plugins=False)
            conn.execute(f"PRAGMA busy_timeout = {int(busy_timeout * 1000)}")
            schema.ensure_schema(conn, self.db, self.path, readonly, busy_timeout)
            self.journal_mode = schema.journal_mode(conn, readonly, busy_timeout)
            conn.execute(f"PRAGMA synchronous = {schema.DURABILITY[durability]}")
            if not readonly and self.journal_mode == "wal":
                page_size = int(conn.execute("PRAGMA page_size").fetchone()[0])
                conn.execute(f"PRAGMA wal_autocheckpoint = {schema.WAL_CHECKPOINT_BYTES // page_size}")
                conn.execute(f"PRAGMA journal_size_limit = {schema.WAL_SIZE_LIMIT}")
        except StoreError:
            self._close_quietly()
            raise
        except sqlite3.Error as exc:
            self._close_quietly()
            raise store_error(exc, self.path, "open it", busy_timeout) from exc
        self._identity = identity(self.path)
        self._wal = WalWatch(
            self.path, not readonly and self.journal_mode == "wal" and self.path != ":memory:"
        )

    def refresh(self) -> None:
        """Reopen the file if the one at :attr:`path` is not the one open (another inode or
        device: restored from a backup, moved into place); ``StoreUnavailable`` if there
        is none. Checked with one ``stat``, so a scrape can call it every time."""
        if self._identity is None:
            return
        now = identity(self.path)
        if now is None:
            raise StoreUnavailable(f"{self.path} is gone: the flowscope database was deleted or moved")
        if now == self._identity:
            return
        fresh = SqliteEventStore(self.path, self.durability, self.readonly, busy_timeout=self.busy_timeout)
        with self._lock:
            old = self._conn
            self._conn, self.db, self.journal_mode = fresh._conn, fresh.db, fresh.journal_mode
            self._identity = fresh._identity
            self._wal = fresh._wal
            self._node_cache.clear()
            fresh._conn = None
        if old is not None:
            try:
                old.close()  # the replaced inode: its locks are not the new file's
            except sqlite3.Error:  # pragma: no cover
                pass

    def __repr__(self) -> str:
        return f"SqliteEventStore({self.path!r})"

    @property
    def schema_version(self) -> int:
        """The schema version of the open file (always ``DB_SCHEMA_VERSION`` once open)."""
        with self._op("read the schema version") as conn:
            return schema.read_version(conn, self.db, self.path)

    # ------------------------------------------------------------------ plumbing

    def _closed(self) -> StoreUnavailable:
        return StoreUnavailable(f"{self.path}: the store is closed; open a new SqliteEventStore")

    def _read_only(self, action: str) -> StoreReadOnly:
        return StoreReadOnly(f"{self.path} is open read-only: cannot {action}; open it without readonly=True")

    def _op(self, action: str) -> Use:
        """``with self._op(action) as conn``: the connection under the store's lock; a
        sqlite3 error in the block is raised as the :class:`StoreError` for ``action``."""
        return Use(self, action, False)

    def _select(self, action: str, sql: str, params: Any) -> list[Any]:
        with self._op(action) as conn:
            return conn.execute(sql, params).fetchall()

    def _error(self, exc: sqlite3.Error, action: str) -> StoreError:
        """The :class:`StoreError` for ``exc``: first, whether our -wal file was removed."""
        if self._wal.moved():
            return wal_removed(self.path)
        return store_error(exc, self.path, action, self.busy_timeout)

    def _write(self, action: str) -> Use:
        """One ``BEGIN IMMEDIATE`` transaction: committed on success, rolled back on any error."""
        if self.readonly:
            raise self._read_only(action)
        return Use(self, action, True)

    def _close_quietly(self) -> None:
        if self._conn is not None:
            try:
                self._conn.close()
            except sqlite3.Error:  # pragma: no cover
                pass
            self._conn = None

    def close(self) -> None:
        with self._lock:
            self._close_quietly()

    # ------------------------------------------------------------------ appending

    def append(
        self, session_id: str, events: Sequence[Event], expected_last_seq: int, *, epoch: int | None = None
    ) -> list[Event]:
        return self._append(session_id, events, expected_last_seq, epoch, None)[0]

    def _append(
        self,
        session_id: str,
        events: Sequence[Event],
        expected_last_seq: int,
        epoch: int | None,
        release: Lease | None,
    ) -> tuple[list[Event], bool]:
        """One append in its own transaction (:func:`.appends.append_one`); with ``release``,
        the lease ends in it too unless the session has mail (True if it did)."""
        if not isinstance(events, (list, tuple)):
            events = list(events)  # iterated twice below
        encoded = [encode(self.path, session_id, e) for e in events]  # fails before anything is locked
        if self.readonly:
            raise self._read_only("append events")
        with self._lock:  # the hot path: the same as _write(), without a context manager
            conn = self._conn
            if conn is None:
                raise self._closed()
            # a failed append leaves none: the next reads the rows
            cached = self._node_cache.pop(session_id, None)
            try:
                numbered, entry, released = append_one(
                    conn,
                    self._wal.check,
                    session_id,
                    events,
                    encoded,
                    expected_last_seq,
                    epoch,
                    cached,
                    release,
                )
            except sqlite3.Error as exc:
                raise self._error(exc, "append events") from exc
            self._keep({session_id: entry})  # committed: the state for the next append
        return numbered, released

    def _keep(self, entries: Mapping[str, Cached | None]) -> None:
        """Remember committed appends' node states for the next append (:func:`keep_states`)."""
        keep_states(self._node_cache, entries)

    # ------------------------------------------------------------------ reading

    def read(self, session_id: str, after_seq: int = 0) -> list[Event]:
        after = after_seq if after_seq > 0 else 0
        with self._op("read events") as conn:
            row = conn.execute(q.SQL_LAST_SEQ, (session_id,)).fetchone()
            if row is None or row[0] <= after:
                return []
            # Bounded by last_seq: a concurrent append beyond it cannot tear the result.
            with gc_paused():
                rows = maintenance.fetch(conn, self.path, session_id, after, row[0])
        return decode(self.path, session_id, after, rows)

    def last_seq(self, session_id: str) -> int:
        with self._op("read the last seq") as conn:
            row = conn.execute(q.SQL_LAST_SEQ, (session_id,)).fetchone()
        return row[0] if row is not None else 0

    def sessions(self) -> list[SessionInfo]:
        return self.find_sessions()

    def session_info(self, session_id: str) -> SessionInfo | None:
        with self._op("read a session") as conn:
            row = conn.execute(q.SQL_SESSION_INFO, (session_id,)).fetchone()
        return session_info_of(row) if row is not None else None

    def heartbeat(self, session_id: str, paths: Iterable[str], ts: float | None = None) -> None:
        self.heartbeat_many({session_id: list(paths)}, ts)

    def node_runs(self, session_id: str | None = None) -> list[NodeRun]:
        with self._op("read node runs") as conn:
            if session_id is None:
                rows = conn.execute(q.SQL_NODE_RUNS + " ORDER BY rowid").fetchall()
            else:
                rows = conn.execute(
                    q.SQL_NODE_RUNS + " WHERE session_id = ? ORDER BY rowid", (session_id,)
                ).fetchall()
        return [NodeRun(*r) for r in rows]

    def open_runs(self) -> list[NodeRun]:
        with self._op("query open runs") as conn:
            rows = conn.execute(q.SQL_OPEN_RUNS).fetchall()
        return [NodeRun(*r) for r in rows]

    def open_run_summary(self, now: float, stale_after_s: float) -> list[OpenRunGroup]:
        """The port's summary in one ``GROUP BY`` over the open-runs index, without one
        object per open run; ordered by (workflow, node, state)."""
        params = {"now": now, "stale_before": stale_before(now, stale_after_s)}
        host = this_host()
        with self._op("summarise open runs") as conn:
            rows = conn.execute(q.SQL_OPEN_SUMMARY, params).fetchall()
            same_host = conn.execute(q.SQL_OPEN_SAME_HOST, {"now": now, "host": host}).fetchall()
        return count_dead_owners(rows, ((w, n, owner_from_column(o), c) for w, n, o, c in same_host), host)

    # ------------------------------------------------------------------ ownership

    def acquire(
        self, session_id: str, owner: Owner, lease_s: float, *, force: bool = False, now: float | None = None
    ) -> Lease:
        with self._write("acquire a session") as conn:  # the clock read once the write lock is ours
            lease, last_seq = ownership.acquire(
                conn, session_id, owner, lease_s, LeaseClock(now), force=force
            )
            if last_seq == 0:  # no events yet: the first append is guarded on this row, not read
                self._node_cache[session_id] = new_session(session_id)
            else:
                self._node_cache.pop(session_id, None)
        return lease

    def acquire_new(
        self, session_id: str, owner: Owner, lease_s: float, *, now: float | None = None
    ) -> Lease | None:
        """The port's, in one transaction (the check, the lease)."""
        if wraps_acquire(self, SqliteEventStore):
            return super().acquire_new(session_id, owner, lease_s, now=now)
        return one_start(self._acquire_new([session_id], owner, lease_s, now))

    def acquire_new_many(
        self, session_ids: Sequence[str], owner: Owner, lease_s: float, *, now: float | None = None
    ) -> list[Lease | None | ConcurrencyConflict]:
        """The port's, in one transaction: each session's check and lease."""
        if wraps_acquire(self, SqliteEventStore, new=True):
            return super().acquire_new_many(session_ids, owner, lease_s, now=now)
        return self._acquire_new(session_ids, owner, lease_s, now)

    def _acquire_new(
        self, session_ids: Sequence[str], owner: Owner, lease_s: float, now: float | None
    ) -> list[Lease | None | ConcurrencyConflict]:
        out: list[Lease | None | ConcurrencyConflict] = []
        with self._write("acquire a session") as conn:
            clock = LeaseClock(now)  # once the write lock is ours
            for session_id in session_ids:
                try:  # a refusal writes nothing (the check comes first) and refuses no other
                    out.append(ownership.acquire_new(conn, session_id, owner, lease_s, clock))
                except ConcurrencyConflict as exc:
                    out.append(exc)
        for got in out:  # no events yet: the first append is guarded on this row
            if isinstance(got, Lease):
                self._node_cache[got.session_id] = new_session(got.session_id)
        return out

    def renew(self, lease: Lease, lease_s: float, *, now: float | None = None) -> Lease:
        return one_renewal(self.renew_many([lease], lease_s, now=now))

    def renew_many(
        self, leases: Sequence[Lease], lease_s: float, *, now: float | None = None
    ) -> list[Lease | LeaseLost]:
        now = time.time() if now is None else now
        if not leases:
            return []
        with self._write("renew leases") as conn:  # renew() is a round of one
            return ownership.renew(conn, leases, lease_s, now)

    def heartbeat_many(self, beats: Mapping[str, Iterable[str]], ts: float | None = None) -> None:
        now = time.time() if ts is None else ts
        params = [(now, sid, p) for sid, paths in beats.items() for p in paths]
        if not params:
            return
        with self._write("record heartbeats") as conn:
            conn.executemany(q.SQL_HEARTBEAT, params)

    def release(self, lease: Lease) -> None:
        with self._write("release a lease") as conn:
            conn.execute(q.SQL_RELEASE, (lease.session_id, lease.epoch))

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
        with self._write("claim sessions") as conn:  # the clock read once the write lock is ours
            return ownership.claim(
                conn,
                owner,
                workflows,
                lease_s,
                limit=limit,
                max_recoveries=max_recoveries,
                clock=LeaseClock(now),
            )

    # ------------------------------------------------------------------ the inbox

    def send(
        self, session_id: str, kind: str, body: Mapping[str, Any], *, ts: float | None = None
    ) -> Message:
        now = time.time() if ts is None else ts
        text = dumps_finite(body)
        with self._write("send a message") as conn:
            (message_id,) = conn.execute(q.SQL_SEND, (session_id, kind, text, now)).fetchone()
        return Message(session_id, message_id, kind, json.loads(text), now)

    def inbox(self, session_id: str) -> list[Message]:
        with self._op("read the inbox") as conn:
            rows = conn.execute(q.SQL_INBOX, (session_id,)).fetchall()
        return [Message(session_id, mid, kind, json.loads(body), sent) for mid, kind, body, sent in rows]

    def sessions_with_mail(self, session_ids: Collection[str]) -> set[str]:
        if not session_ids:
            return set()
        with self._op("read the inbox") as conn:
            return {r[0] for r in conn.execute(q.SQL_MAILED, {"ids": json.dumps(list(session_ids))})}

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
        encoded = [encode(self.path, session_id, e) for e in events]
        with self._lock:
            cached = self._node_cache.pop(session_id, None)
            with self._write("take in messages") as conn:
                numbered, entry = take_in_steps(
                    Writer(conn), session_id, events, encoded, expected_last_seq, message_ids, epoch, cached
                )
            self._keep({session_id: entry})  # committed: the state for the next append
        return numbered

    def workers_seen(self, owner: Owner, workflows: Collection[str], ts: float | None = None) -> None:
        now = time.time() if ts is None else ts
        row = (owner.worker_id, owner.host, owner.pid, owner.started_at, json.dumps(sorted(workflows)), now)
        with self._write("record a worker") as conn:
            conn.execute(q.SQL_WORKER_SEEN, row)
            conn.execute(q.SQL_WORKERS_FORGET, (now - WORKER_RETENTION_S,))

    def workers(self) -> list[WorkerInfo]:
        with self._op("list workers") as conn:
            rows = conn.execute(q.SQL_WORKERS).fetchall()
        return [
            WorkerInfo(wid, host, pid, tuple(json.loads(wfs or "[]")), seen)
            for wid, host, pid, wfs, seen in rows
        ]

    def queued_summary(self) -> list[QueuedGroup]:
        with self._op("summarise queued sessions") as conn:
            rows = conn.execute(q.SQL_QUEUED_SUMMARY).fetchall()
        return [QueuedGroup(*r) for r in rows]

    def job_result_summary(self) -> list[JobResultGroup]:
        """The port's count, kept per store object: each call reads only the job results
        appended since the last (the log's rowids grow with each commit, one writer at a
        time), so a scrape costs what was appended since the one before, never a scan of
        the log. A file replaced by another (:meth:`refresh`) starts the count again."""
        with self._lock:
            counts, after, pruned, identity = self._job_results
            if identity != self._identity:
                counts, after, pruned = {}, 0, None
            with self._op("count job results") as conn:
                rows, upto, pruned = maintenance.job_results_after(conn, after, pruned)
            counts = dict(counts)
            for workflow, node, result, n in rows:
                key = (workflow or "", node or "", str(result))
                counts[key] = counts.get(key, 0) + int(n)
            self._job_results = (counts, upto, pruned, self._identity)
        return [JobResultGroup(*k, n) for k, n in sorted(counts.items())]

    # ------------------------------------------------------------------ snapshots

    def save_snapshot(self, session_id: str, seq: int, data: str) -> None:
        with self._write("save a snapshot") as conn:
            maintenance.save_snapshot(conn, self.path, session_id, seq, data)

    def load_snapshot(self, session_id: str) -> tuple[int, str] | None:
        with self._op("read a snapshot") as conn:
            return maintenance.load_snapshot(conn, session_id)

    # ------------------------------------------------------------------ group commit, span shipping

    def append_many(self, batches: Sequence[AppendBatch]) -> list[list[Event] | BaseException]:
        """Every batch in one ``BEGIN IMMEDIATE`` transaction (one fsync for many sessions).
        A batch refused by its fence or its expected ``seq`` is skipped (its exception is its
        result); an error of the store itself rolls everything back and is raised."""
        if type(self).append is not SqliteEventStore.append:  # a subclass that wraps append: go through it
            return super().append_many(batches)
        return self._group(batches, None)[0]

    def append_and_release(
        self, batches: Sequence[AppendBatch], leases: Mapping[str, Lease]
    ) -> tuple[list[list[Event] | BaseException], set[str]]:
        """The port's, in one transaction: the appends, the inbox check, the releases."""
        if (
            type(self).append is not SqliteEventStore.append
            or type(self).release is not SqliteEventStore.release
        ):
            return super().append_and_release(batches, leases)
        return self._group(batches, leases)

    def _group(
        self, batches: Sequence[AppendBatch], leases: Mapping[str, Lease] | None
    ) -> tuple[list[list[Event] | BaseException], set[str]]:
        if len(batches) == 1:  # one session's append, guarded on its cached row
            sid, events, expected, epoch = batches[0]
            lease = leases.get(sid) if leases else None
            try:
                numbered, one_released = self._append(sid, events, expected, epoch, lease)
            except (ConcurrencyConflict, LeaseLost) as exc:
                return [exc], set()
            return [numbered], {sid} if one_released else set()
        prepared = prepare_batches(batches, encode, self.path)
        if self.readonly:
            raise self._read_only("append events")
        ids = [p.session_id for p in prepared]
        with self._lock:
            conn = self._conn
            if conn is None:
                raise self._closed()
            cached = {sid: self._node_cache.pop(sid, None) for sid in ids}
            try:
                out, kept, released = append_group(
                    conn, self._wal.check, prepared, cached, unique=len(cached) == len(ids), leases=leases
                )
            except sqlite3.Error as exc:
                raise self._error(exc, "append events") from exc
            self._keep(kept)
        return out, released

    def exported_seq(self, session_id: str) -> int:
        with self._op("read the span watermark") as conn:
            return maintenance.exported_seq(conn, session_id)

    def unexported(self) -> list[tuple[SessionInfo, int]]:
        with self._op("list sessions with spans to ship") as conn:
            if conn.execute(q.SQL_HAS_SPAN_EXPORTS).fetchone() is None:  # nothing shipped from this file yet
                return [(session_info_of(r), 0) for r in conn.execute(q.SQL_SESSIONS).fetchall()]
            rows = conn.execute(q.SQL_UNEXPORTED).fetchall()
        return [(session_info_of(info), int(exported)) for *info, exported in rows]

    def set_exported_seq(self, session_id: str, seq: int) -> None:
        self.set_exported_seqs({session_id: seq})

    def set_exported_seqs(self, marks: Mapping[str, int]) -> None:
        if not marks:
            return
        with self._write("advance the span watermarks") as conn:
            conn.execute(q.SQL_CREATE_SPAN_EXPORTS)
            conn.executemany(q.SQL_SET_EXPORTED_SEQ, sorted(marks.items()))

    # ------------------------------------------------------------------ pruning (flowscope prune)

    def delete_sessions(self, session_ids: Iterable[str]) -> list[str]:
        ids = list(dict.fromkeys(session_ids))
        if not ids:
            return []
        with self._write("delete sessions") as conn:
            deleted = maintenance.delete_sessions(conn, ids)
        for sid in deleted:
            self._node_cache.pop(sid, None)
        return deleted

    def storage_bytes(self) -> int | None:
        """Bytes of the file's pages in use (deleted rows' pages become free pages that new
        events reuse; the file itself shrinks only with ``VACUUM``)."""
        with self._op("measure the database") as conn:
            return int(conn.execute(q.SQL_STORAGE_BYTES).fetchone()[0])

    # ------------------------------------------------------------------ maintenance

    def rebuild_projections(self) -> None:
        """Recompute ``sessions`` and ``node_runs`` from the log, in one transaction.

        The result equals what the appends maintained incrementally. Heartbeats are not
        events, so a run still ``running`` keeps the newer of its recorded heartbeat and the
        one the log implies.
        """
        self._node_cache.clear()
        with self._write("rebuild the projections") as conn:
            maintenance.rebuild_projections(conn, self.path)
