"""``SqliteEventStore``: the adapter (append, reads, the projection cache, snapshots, pruning).

Every append is one ``BEGIN IMMEDIATE`` transaction: the last-seq check (optimistic
concurrency), the insert and the projection update are atomic across processes. Several
processes may use one file, each through its own ``SqliteEventStore``; a writer that finds
the file locked waits up to ``busy_timeout`` seconds. A store object may be shared by
threads (calls are serialised by a lock; a lease is renewed from another thread than the
event loop's), but not across ``fork()``: open a new one in the child. Acquiring, renewing
and claiming sessions are ``BEGIN IMMEDIATE`` transactions too, so the fence (the epoch an
append is checked against) and a claim are atomic across processes. The file layout is in :mod:`.schema`, the row format in :mod:`.codec`.
"""

from __future__ import annotations

import dataclasses
import json
import os
import sqlite3
import threading
import time
from contextlib import contextmanager
from operator import itemgetter
from typing import Any, Collection, Iterable, Iterator, Mapping, Sequence

import sqlite_utils

from ...errors import ConcurrencyConflict, LeaseLost, StoreCorrupt, StoreError, StoreReadOnly, StoreUnavailable
from ...events import Event, RunFinished, RunSubmitted, UnknownEvent
from ...fold import NodeState, WorkflowState, gc_paused
from ...jsontext import dumps_finite
from ...liveness import owner_alive, stale_before
from ...ownership import Lease, Owner, this_host
from ..base import (
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
from . import queries as q
from . import schema
from .codec import decode, encode
from .faults import store_error, wal_removed

__all__ = ["SqliteEventStore"]

_PATHS_PER_QUERY = 500  # below SQLite's limit on bound parameters
# Sessions whose node states an append keeps for the next one: those in the middle of an
# invocation (an append that ends one drops its entry), so the bound is only a backstop;
# below the number of concurrent sessions, every append would read its rows back.
_NODE_CACHE_SESSIONS = 65536
# How often a writing transaction checks (one stat) that the -wal file it writes to is
# still the one beside the database; a failed write always checks.
_WAL_CHECK_S = 1.0

#: session -> (last_seq, complete, {path: NodeState}) as of this object's last append.
_CacheEntry = tuple[int, bool, dict[str, NodeState]]


def _identity(path: str) -> tuple[int, int] | None:
    """(device, inode) of the file at ``path``, None if there is none (or it is in memory)."""
    if path == ":memory:":
        return None
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return None
    return (st.st_dev, st.st_ino)


class SqliteEventStore(EventStore):
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
        self._node_cache: dict[str, _CacheEntry] = {}
        self._pending_cache: tuple[str, _CacheEntry] | None = None
        self._conn: sqlite3.Connection | None = None
        self._identity: tuple[int, int] | None = None
        self._wal: tuple[int, int] | None = None  # the -wal file this connection writes to
        self._wal_tracked = False  # writable and in WAL mode: _wal is known once the file exists
        self._wal_checked = 0.0
        #: job_result_summary's running count: (counts, last rowid read, file identity).
        self._job_results: tuple[dict[tuple[str, str, str], int], int, tuple[int, int] | None] = ({}, 0, None)
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
            pragma = "PRAGMA journal_mode" if readonly else "PRAGMA journal_mode = WAL"
            self.journal_mode = str(conn.execute(pragma).fetchone()[0]).lower()
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
        self._identity = _identity(self.path)
        if not readonly and self.journal_mode == "wal" and self.path != ":memory:":
            self._wal_tracked = True
            self._wal = _identity(self.path + "-wal")  # None until the first transaction makes it

    def refresh(self) -> None:
        """Reopen the file if the one at :attr:`path` is not the one open (another inode or
        device: restored from a backup, moved into place); ``StoreUnavailable`` if there
        is none. Checked with one ``stat``, so a scrape can call it every time."""
        if self._identity is None:
            return
        now = _identity(self.path)
        if now is None:
            raise StoreUnavailable(f"{self.path} is gone: the flowscope database was deleted or moved")
        if now == self._identity:
            return
        fresh = SqliteEventStore(self.path, self.durability, self.readonly, busy_timeout=self.busy_timeout)
        with self._lock:
            old = self._conn
            self._conn, self.db, self.journal_mode = fresh._conn, fresh.db, fresh.journal_mode
            self._identity = fresh._identity
            self._wal, self._wal_tracked = fresh._wal, fresh._wal_tracked
            self._node_cache.clear()
            self._pending_cache = None
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

    @contextmanager
    def _op(self, action: str) -> Iterator[sqlite3.Connection]:
        with self._lock:
            conn = self._conn
            if conn is None:
                raise self._closed()
            try:
                yield conn
            except sqlite3.Error as exc:
                raise self._error(exc, action) from exc

    def _error(self, exc: sqlite3.Error, action: str) -> StoreError:
        """The :class:`StoreError` for ``exc``: first, whether our -wal file was removed."""
        if self._wal_moved():
            return wal_removed(self.path)
        return store_error(exc, self.path, action, self.busy_timeout)

    def _wal_moved(self) -> bool:
        """Whether the -wal file this connection writes to is not the one at ``path-wal``
        (deleted or replaced under a running process: its commits would be lost)."""
        if not self._wal_tracked:
            return False
        self._wal_checked = time.monotonic()
        now = _identity(self.path + "-wal")
        if self._wal is None:  # the first transaction since open made it: this is ours
            self._wal = now
            return False
        return now != self._wal

    def _check_wal(self) -> None:
        """Before a commit, at most every ``_WAL_CHECK_S``: refuse to commit into a removed
        -wal file (:class:`~flowscope.errors.StoreWalRemoved`; the transaction rolls back)."""
        if self._wal_tracked and time.monotonic() - self._wal_checked >= _WAL_CHECK_S and self._wal_moved():
            raise wal_removed(self.path)

    @contextmanager
    def _write(self, action: str) -> Iterator[sqlite3.Connection]:
        """One ``BEGIN IMMEDIATE`` transaction: committed on success, rolled back on any error."""
        if self.readonly:
            raise self._read_only(action)
        with self._op(action) as conn:
            conn.execute("BEGIN IMMEDIATE")
            try:
                yield conn
                self._check_wal()
                conn.execute("COMMIT")
            except BaseException:
                schema.rollback(conn)
                raise

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

    def _fetch(self, conn: sqlite3.Connection, session_id: str, after_seq: int, last_seq: int) -> list[Any]:
        """The rows of seq ``after_seq + 1 .. last_seq``; a missing one is reported, not skipped."""
        rows = conn.execute(q.SQL_READ, (session_id, after_seq, last_seq)).fetchall()
        if len(rows) != last_seq - after_seq:
            expected = after_seq + 1
            for (s,) in conn.execute(q.SQL_READ_SEQS, (session_id, after_seq, last_seq)):
                if s != expected:
                    break
                expected += 1
            raise StoreCorrupt(
                f"{self.path}: the log of session {session_id!r} has a gap: seq {expected} is missing "
                f"(the session is at seq {last_seq}); restore the file from a backup"
            )
        return rows

    # ------------------------------------------------------------------ appending

    def append(
        self, session_id: str, events: Sequence[Event], expected_last_seq: int, *, epoch: int | None = None
    ) -> list[Event]:
        if not isinstance(events, (list, tuple)):
            events = list(events)  # iterated twice below
        encoded = [encode(self.path, session_id, e) for e in events]  # fails before anything is locked
        if self.readonly:
            raise self._read_only("append events")
        with self._lock:  # the hot path: the same as _write(), without the context-manager overhead
            conn = self._conn
            if conn is None:
                raise self._closed()
            try:
                conn.execute("BEGIN IMMEDIATE")
                self._pending_cache = None
                try:
                    numbered = self._append_in_transaction(conn, session_id, events, encoded, expected_last_seq, epoch)
                    self._check_wal()
                    conn.execute("COMMIT")
                except BaseException:
                    schema.rollback(conn)  # the cache entry was popped: the next append reads the rows
                    raise
                if self._pending_cache is not None:  # committed: keep the states for the next append
                    self._keep([self._pending_cache])
            except sqlite3.Error as exc:
                raise self._error(exc, "append events") from exc
        return numbered

    def _append_in_transaction(
        self,
        conn: sqlite3.Connection,
        session_id: str,
        events: Sequence[Event],
        encoded: list[tuple[str, float, str, str, str, str]],
        expected_last_seq: int,
        epoch: int | None,
        bulk: _Bulk | None = None,
    ) -> list[Event]:
        """Append one batch in the open transaction. With ``bulk`` (group commit), the
        session's row comes from it and the rows to write are added to it, written for
        every session at once by :meth:`append_many`."""
        row = bulk.rows.get(session_id) if bulk is not None else conn.execute(q.SQL_SESSION, (session_id,)).fetchone()
        if epoch is not None and (row[6] if row is not None else 0) != epoch:  # the fence: nothing written
            raise lease_lost(session_id, row[6] if row else 0, _owner(row[7]) if row else None, epoch)
        last = row[4] if row is not None else 0
        numbered = number_events(session_id, events, last, expected_last_seq)  # may raise: nothing written
        if not numbered:
            return numbered
        rows = [(session_id, e.seq) + enc for e, enc in zip(numbered, encoded)]
        if bulk is None:
            conn.executemany(q.SQL_INSERT_EVENT, rows)
        else:
            bulk.events.extend(rows)
        ws = WorkflowState(session_id=session_id)
        new_session = last == 0  # no row, or one acquire() made before the first event
        nodes, complete = self._cached_nodes(session_id, new_session, last)
        ws.nodes = nodes
        if row is not None:
            ws.workflow, ws.status, ws.started_at, ws.updated_at, ws.last_seq, ws.invocations = row[:6]
        workflow_before = ws.workflow
        paths = list(dict.fromkeys(e.path for e in numbered if e.path and type(e) is not UnknownEvent))
        missing = [] if complete else [p for p in paths if p not in nodes]
        for i in range(0, len(missing), _PATHS_PER_QUERY):
            chunk = missing[i : i + _PATHS_PER_QUERY]
            sql = q.SQL_LOAD_NODES + "(" + ", ".join("?" * len(chunk)) + ")"
            for r in conn.execute(sql, (session_id, *chunk)):
                nodes[r[0]] = q.node_state(r)
        apply = ws.apply
        for e in numbered:
            apply(e)  # the one definition of what an event means (flowscope.fold)
        nodes = ws.nodes
        workflow = ws.workflow
        node_rows = [q.node_row(session_id, workflow, nodes[p]) for p in paths if p in nodes]
        if bulk is None:
            conn.executemany(q.SQL_UPSERT_NODE, node_rows)
        else:
            bulk.nodes.extend(node_rows)
        if workflow != workflow_before and not new_session:
            conn.execute("UPDATE node_runs SET workflow = ? WHERE session_id = ?", (workflow, session_id))
        if row is not None and not new_session and row[0] == workflow and row[1] == ws.status:
            if bulk is None:  # the common step: only the columns that move (see SQL_ADVANCE_SESSION)
                conn.execute(q.SQL_ADVANCE_SESSION, q.advance_row(ws))
            else:
                bulk.advances.append(q.advance_row(ws))
        else:
            submitted = _submitted_at(numbered)  # RunSubmitted starts a session, or queues it again (a retry)
            if bulk is None:
                conn.execute(q.SQL_UPSERT_SESSION, q.session_row(ws, submitted))
            else:
                bulk.sessions.append(q.session_row(ws, submitted))
        if type(numbered[-1]) is not RunFinished:  # an invocation that ended appends no more for a while
            self._pending_cache = (session_id, (numbered[-1].seq, complete, nodes))
        return numbered

    def _keep(self, entries: Iterable[tuple[str, _CacheEntry]]) -> None:
        """Remember committed appends' node states for the next append (bounded)."""
        cache = self._node_cache
        cache.update(entries)
        while len(cache) > _NODE_CACHE_SESSIONS:
            cache.pop(next(iter(cache)))

    def _cached_nodes(self, session_id: str, new_session: bool, last: int) -> tuple[dict[str, NodeState], bool]:
        """The node states to fold into, and whether they are all of the session's rows.

        The states this store object wrote last time are still the rows' states if nobody
        appended since (same last_seq): no need to read them back. ``complete`` says the
        cache holds every row of the session (we created it), so a path it lacks is new
        and needs no lookup either. The entry is popped: a failed append leaves none.
        """
        cached = self._node_cache.pop(session_id, None)
        if new_session:
            return {}, True
        if cached is not None and cached[0] == last:
            return cached[2], cached[1]
        return {}, False

    # ------------------------------------------------------------------ reading

    def read(self, session_id: str, after_seq: int = 0) -> list[Event]:
        after = after_seq if after_seq > 0 else 0
        with self._op("read events") as conn:
            row = conn.execute(q.SQL_LAST_SEQ, (session_id,)).fetchone()
            if row is None or row[0] <= after:
                return []
            # Bounded by last_seq: a concurrent append beyond it cannot tear the result.
            with gc_paused():
                rows = self._fetch(conn, session_id, after, row[0])
        return decode(self.path, session_id, after, rows)

    def last_seq(self, session_id: str) -> int:
        with self._op("read the last seq") as conn:
            row = conn.execute(q.SQL_LAST_SEQ, (session_id,)).fetchone()
        return row[0] if row is not None else 0

    def sessions(self) -> list[SessionInfo]:
        with self._op("list sessions") as conn:
            rows = conn.execute(q.SQL_SESSIONS).fetchall()
        return [_session_info(r) for r in rows]

    def session_info(self, session_id: str) -> SessionInfo | None:
        with self._op("read a session") as conn:
            row = conn.execute(q.SQL_SESSION_INFO, (session_id,)).fetchone()
        return _session_info(row) if row is not None else None

    def heartbeat(self, session_id: str, paths: Iterable[str], ts: float | None = None) -> None:
        self.heartbeat_many({session_id: list(paths)}, ts)

    def node_runs(self, session_id: str | None = None) -> list[NodeRun]:
        with self._op("read node runs") as conn:
            if session_id is None:
                rows = conn.execute(q.SQL_NODE_RUNS + " ORDER BY rowid").fetchall()
            else:
                rows = conn.execute(q.SQL_NODE_RUNS + " WHERE session_id = ? ORDER BY rowid", (session_id,)).fetchall()
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
        return count_dead_owners(rows, ((w, n, _owner(o), lease, c) for w, n, o, lease, c in same_host), now, host)

    # ------------------------------------------------------------------ ownership

    def acquire(
        self, session_id: str, owner: Owner, lease_s: float, *, force: bool = False, now: float | None = None
    ) -> Lease:
        now = time.time() if now is None else now
        with self._write("acquire a session") as conn:
            row = conn.execute(q.SQL_OWNERSHIP, (session_id,)).fetchone()
            held = _owner(row[0]) if row is not None else None
            if not force and held is not None and held.worker_id != owner.worker_id and owner_alive(held, row[2], now):
                raise owned_elsewhere(session_id, held, row[2], row[3], now)
            epoch = self._take(conn, session_id, owner, lease_s, now, recovered=False)
        return Lease(session_id, owner, epoch, now + lease_s)

    def _take(
        self, conn: sqlite3.Connection, session_id: str, owner: Owner, lease_s: float, now: float, *, recovered: bool
    ) -> int:
        params = {
            "sid": session_id,
            "owner": json.dumps(owner.to_dict()),
            "expires": now + lease_s,
            "now": now,
            "recovered": int(recovered),
        }
        epoch: int = conn.execute(q.SQL_TAKE, params).fetchone()[0]
        return epoch

    def renew(self, lease: Lease, lease_s: float, *, now: float | None = None) -> Lease:
        return one_renewal(self.renew_many([lease], lease_s, now=now))

    def renew_many(self, leases: Sequence[Lease], lease_s: float, *, now: float | None = None) -> list[Lease | LeaseLost]:
        now = time.time() if now is None else now
        out: list[Lease | LeaseLost] = []
        if not leases:
            return out
        with self._write("renew leases") as conn:  # renew() is a round of one
            for lease in leases:
                cur = conn.execute(q.SQL_RENEW, (now + lease_s, now, lease.session_id, lease.epoch))
                if cur.rowcount == 1:
                    out.append(dataclasses.replace(lease, expires_at=now + lease_s))
                    continue
                row = conn.execute(q.SQL_OWNERSHIP, (lease.session_id,)).fetchone()
                out.append(lease_lost(lease.session_id, row[1] if row else 0, _owner(row[0]) if row else None, lease.epoch))
        return out

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
        now = time.time() if now is None else now
        if limit <= 0 or not workflows:
            return []
        host = this_host()
        params = {"now": now, "host": host, "workflows": json.dumps(sorted(set(workflows)))}
        with self._write("claim sessions") as conn:
            found: list[tuple[float, str, str, ClaimReason]] = []
            for sql, status in ((q.SQL_CLAIM_QUEUED, "queued"), (q.SQL_CLAIM_ANSWERED, "answered"),
                                (q.SQL_CLAIM_MAILED, "mailed"), (q.SQL_CLAIM_ORPHANED, "running")):
                taken = 0
                for sid, workflow, owner_json, lease, recoveries, since, *mailed in conn.execute(sql, params):
                    reason = claim_reason(mailed[0] if mailed else status, _owner(owner_json), lease, now, host=host,
                                          mail=bool(mailed))
                    if reason is None or (reason == "orphaned" and max_recoveries is not None and recoveries > max_recoveries):
                        continue
                    found.append((since or 0.0, sid, workflow, reason))
                    taken += 1
                    if taken >= limit:  # the cursor is lazy: reading stops here
                        break
            found.sort()
            claims = []
            for _since, sid, workflow, reason in found[:limit]:
                epoch = self._take(conn, sid, owner, lease_s, now, recovered=reason == "orphaned")
                claims.append(Claim(sid, workflow, reason, Lease(sid, owner, epoch, now + lease_s)))
        return claims

    # ------------------------------------------------------------------ the inbox

    def send(self, session_id: str, kind: str, body: Mapping[str, Any], *, ts: float | None = None) -> Message:
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
            with self._write("take in messages") as conn:
                self._pending_cache = None
                if events:
                    numbered = self._append_in_transaction(conn, session_id, events, encoded, expected_last_seq, epoch)
                else:
                    numbered = []
                    row = conn.execute(q.SQL_OWNERSHIP, (session_id,)).fetchone()
                    if (row[1] if row else 0) != epoch:  # the fence holds for the deletion too
                        raise lease_lost(session_id, row[1] if row else 0, _owner(row[0]) if row else None, epoch)
                conn.execute(q.SQL_DROP_MESSAGES, {"sid": session_id, "ids": json.dumps(sorted(message_ids))})
            if self._pending_cache is not None:  # committed: keep the states for the next append
                self._keep([self._pending_cache])
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
        return [WorkerInfo(wid, host, pid, tuple(json.loads(wfs or "[]")), seen) for wid, host, pid, wfs, seen in rows]

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
            counts, after, identity = self._job_results
            if identity != self._identity:
                counts, after = {}, 0
            with self._op("count job results") as conn:
                upto = int(conn.execute(q.SQL_LAST_EVENT_ROWID).fetchone()[0])
                if upto < after:  # rows deleted from the end: count from what is there now
                    after = upto
                rows = conn.execute(q.SQL_JOB_RESULTS_AFTER, {"after": after, "upto": upto}).fetchall() if upto > after else []
            counts = dict(counts)
            for workflow, node, result, n in rows:
                key = (workflow or "", node or "", str(result))
                counts[key] = counts.get(key, 0) + int(n)
            self._job_results = (counts, upto, self._identity)
        return [JobResultGroup(*k, n) for k, n in sorted(counts.items())]

    # ------------------------------------------------------------------ snapshots

    def save_snapshot(self, session_id: str, seq: int, data: str) -> None:
        with self._write("save a snapshot") as conn:
            row = conn.execute(q.SQL_LAST_SEQ, (session_id,)).fetchone()
            if row is None or seq > row[0]:
                raise StoreError(f"{self.path}: a snapshot of session {session_id!r} at seq {seq} is ahead of its log")
            conn.execute(q.SQL_SAVE_SNAPSHOT, (session_id, seq, data))

    def load_snapshot(self, session_id: str) -> tuple[int, str] | None:
        with self._op("read a snapshot") as conn:
            row = conn.execute(q.SQL_LOAD_SNAPSHOT, (session_id,)).fetchone()
        return (row[0], row[1]) if row is not None else None

    # ------------------------------------------------------------------ group commit, span shipping (issue 15)

    def append_many(self, batches: Sequence[AppendBatch]) -> list[list[Event] | BaseException]:
        """Every batch in one ``BEGIN IMMEDIATE`` transaction (one fsync for many sessions).
        A batch refused by its fence or its expected ``seq`` is skipped (its exception is its
        result); an error of the store itself rolls everything back and is raised."""
        if type(self).append is not SqliteEventStore.append:  # a subclass that wraps append: go through it
            return super().append_many(batches)
        if len(batches) == 1:
            sid, events, expected, epoch = batches[0]
            try:
                return [self.append(sid, events, expected, epoch=epoch)]
            except (ConcurrencyConflict, LeaseLost) as exc:
                return [exc]
        prepared = []
        for sid, events, expected, epoch in batches:
            evs = events if isinstance(events, (list, tuple)) else list(events)
            prepared.append((sid, evs, [encode(self.path, sid, e) for e in evs], expected, epoch))
        if self.readonly:
            raise self._read_only("append events")
        out: list[list[Event] | BaseException] = []
        kept: list[tuple[str, _CacheEntry]] = []
        # Each session once (the usual case): its rows are collected and written for all
        # sessions with one statement per table. A refused batch has written nothing.
        bulk = _Bulk() if len({p[0] for p in prepared}) == len(prepared) else None
        with self._lock:
            conn = self._conn
            if conn is None:
                raise self._closed()
            try:
                conn.execute("BEGIN IMMEDIATE")
                try:
                    if bulk is not None:
                        ids = [p[0] for p in prepared]
                        for i in range(0, len(ids), _PATHS_PER_QUERY):
                            chunk = ids[i : i + _PATHS_PER_QUERY]
                            for r in conn.execute(q.SQL_SESSIONS_IN + "(" + ", ".join("?" * len(chunk)) + ")", chunk):
                                bulk.rows[r[0]] = r[1:]
                    for sid, evs, encoded, expected, epoch in prepared:
                        self._pending_cache = None
                        if bulk is None:
                            conn.execute("SAVEPOINT batch")
                        try:
                            out.append(self._append_in_transaction(conn, sid, evs, encoded, expected, epoch, bulk))
                        except (ConcurrencyConflict, LeaseLost) as exc:
                            if bulk is None:
                                conn.execute("ROLLBACK TO batch")
                            out.append(exc)
                        else:
                            if self._pending_cache is not None:
                                kept.append(self._pending_cache)
                        if bulk is None:
                            conn.execute("RELEASE batch")
                    if bulk is not None:
                        bulk.write(conn)
                    self._check_wal()
                    conn.execute("COMMIT")
                except BaseException:
                    self._pending_cache = None
                    for sid, *_ in prepared:  # the states of a rolled-back append are not the log's
                        self._node_cache.pop(sid, None)
                    schema.rollback(conn)
                    raise
                self._pending_cache = None
                self._keep(kept)
            except sqlite3.Error as exc:
                raise self._error(exc, "append events") from exc
        return out

    def exported_seq(self, session_id: str) -> int:
        with self._op("read the span watermark") as conn:
            try:
                row = conn.execute(q.SQL_EXPORTED_SEQ, (session_id,)).fetchone()
            except sqlite3.OperationalError:  # no span was ever shipped from this file: no table yet
                return 0
        return int(row[0]) if row is not None else 0

    def unexported(self) -> list[tuple[SessionInfo, int]]:
        with self._op("list sessions with spans to ship") as conn:
            if conn.execute(q.SQL_HAS_SPAN_EXPORTS).fetchone() is None:  # nothing shipped from this file yet
                return [(_session_info(r), 0) for r in conn.execute(q.SQL_SESSIONS).fetchall()]
            rows = conn.execute(q.SQL_UNEXPORTED).fetchall()
        return [(_session_info(r[:-1]), int(r[-1])) for r in rows]

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
        now = time.time()
        host = this_host()
        with self._write("delete sessions") as conn:
            # the guard is re-checked inside the transaction: a resume or a takeover that
            # started after the caller chose the sessions keeps its log
            rows = conn.execute(q.SQL_PRUNABLE, {"ids": json.dumps(ids)}).fetchall()
            prunable = {sid for sid, owner, lease in rows if not owner_alive(_owner(owner), lease, now, host=host)}
            deleted = [sid for sid in ids if sid in prunable]
            if deleted:
                params = {"ids": json.dumps(deleted)}
                for sql in q.SQL_PRUNE:
                    conn.execute(sql, params)
                if conn.execute(q.SQL_HAS_SPAN_EXPORTS).fetchone() is not None:
                    conn.execute(q.SQL_PRUNE_SPAN_EXPORTS, params)
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
            heartbeats = {
                (sid, path): hb
                for sid, path, hb in conn.execute(
                    "SELECT session_id, path, heartbeat_at FROM node_runs WHERE status = 'running'"
                )
            }
            conn.execute("DELETE FROM node_runs")
            # sessions rows stay: their ownership columns are not in the log; the upserts
            # below rewrite every column the log defines
            conn.execute("UPDATE sessions SET submitted_at = NULL")
            sessions = conn.execute(
                "SELECT session_id, max(seq) FROM events GROUP BY session_id ORDER BY min(rowid)"
            ).fetchall()
            for session_id, last in sessions:
                events = decode(self.path, session_id, 0, self._fetch(conn, session_id, 0, last))
                ws = WorkflowState(session_id=session_id)
                apply = ws.apply
                for e in events:
                    apply(e)
                rows = []
                for ns in ws.nodes.values():
                    hb = heartbeats.get((session_id, ns.path))
                    if ns.status == "running" and hb is not None and (ns.heartbeat_at is None or hb > ns.heartbeat_at):
                        ns.heartbeat_at = hb
                    rows.append(q.node_row(session_id, ws.workflow, ns))
                conn.executemany(q.SQL_UPSERT_NODE, rows)
                conn.execute(q.SQL_UPSERT_SESSION, q.session_row(ws, _submitted_at(events)))


class _Bulk:
    """The rows of a group commit (:meth:`SqliteEventStore.append_many`), written at once."""

    __slots__ = ("rows", "events", "nodes", "sessions", "advances")

    def __init__(self) -> None:
        self.rows: dict[str, Any] = {}  # session id -> its SQL_SESSION row, read for all at once
        self.events: list[Any] = []
        self.nodes: list[Any] = []
        self.sessions: list[Any] = []
        self.advances: list[Any] = []

    def write(self, conn: sqlite3.Connection) -> None:
        """One statement per table, rows in key order: SQLite then walks each B-tree once,
        left to right, instead of jumping to a random leaf per session."""
        self.events.sort(key=_BY_SESSION_SEQ)
        self.nodes.sort(key=_BY_SESSION_PATH)
        self.advances.sort(key=_BY_LAST)
        conn.executemany(q.SQL_INSERT_EVENT, self.events)
        conn.executemany(q.SQL_UPSERT_NODE, self.nodes)
        conn.executemany(q.SQL_UPSERT_SESSION, self.sessions)
        conn.executemany(q.SQL_ADVANCE_SESSION, self.advances)


# The keys of the rows a group commit writes: (session_id, seq) of an event row,
# (session_id, path) of a node_runs row, the session id last in SQL_ADVANCE_SESSION's.
_BY_SESSION_SEQ = itemgetter(0, 1)
_BY_SESSION_PATH = itemgetter(0, 2)
_BY_LAST = itemgetter(-1)


def _owner(text: str | None) -> Owner | None:
    """The ``owner`` column (JSON) as an :class:`Owner`."""
    return Owner.from_dict(json.loads(text)) if text else None


def _session_info(row: Sequence[Any]) -> SessionInfo:
    """A row of ``SQL_SESSIONS`` / ``SQL_SESSION_INFO``."""
    sid, workflow, status, started, updated, last_seq, invocations, owner, epoch, lease, submitted = row
    return SessionInfo(sid, workflow, status, started, updated, last_seq, invocations, _owner(owner), epoch, lease, submitted)


def _submitted_at(events: Iterable[Event]) -> float | None:
    """When the last ``RunSubmitted`` of ``events`` was written, if there is one."""
    return next((e.ts for e in reversed(list(events)) if type(e) is RunSubmitted), None)
