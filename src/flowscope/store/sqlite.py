"""The SQLite :class:`EventStore`: the default, durable store.

One file holds everything, in WAL mode so readers never block the writer:

``meta``
    key/value: ``application`` (``"flowscope"``) and ``schema_version``.
``events``
    the log: ``(session_id, seq)`` is the primary key; ``type``, ``ts``,
    ``invocation_id``, ``path`` and ``node`` are columns, the event's other fields (all of
    them, defaults included, as :func:`flowscope.events.to_dict` gives them) are a JSON
    object in ``payload``, so ``json_extract(payload, '$.error_code')`` works in ad-hoc
    SQL. The file's ``schema_version`` covers the payload format too. Events of a type
    this version does not know are stored and read back as ``UnknownEvent``.
``sessions``
    one row per session (workflow, status, started/updated, ``last_seq``, invocations).
``node_runs``
    the projection: the latest state of every node run, kept by the same
    :meth:`NodeState.apply <flowscope.fold.NodeState.apply>` the fold uses,
    updated in the transaction that appends the events, indexed by status so the
    open-runs and stuck queries never scan the log.

Every append is one ``BEGIN IMMEDIATE`` transaction: the last-seq check (optimistic
concurrency), the insert and the projection update are atomic across processes. Several
processes may use one file, each through its own ``SqliteEventStore``; a writer that finds
the file locked waits up to ``busy_timeout`` seconds. A store object may be shared by
threads (calls are serialised by a lock), but not across ``fork()``: open a new one in the
child.

``read()`` is the resume path, so it is tuned: one JSON parse for all payloads of the
read (a corrupt row falls back to row-by-row parsing to name its seq), events built by
setting their slots directly (equivalent to ``from_dict``), and the cyclic GC paused
while the ~10 objects per event are created.
"""

from __future__ import annotations

import dataclasses
import json
import os
import sqlite3
import threading
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Sequence

import sqlite_utils

from ..errors import StoreError
from ..events import (
    COMMON_FIELDS,
    EVENT_TYPES,
    Event,
    EventDecodeError,
    UnknownEvent,
    from_dict,
    to_dict,
)
from .base import FINISHED_SESSION_STATUSES, EventStore, NodeRun, SessionInfo, number_events
from ..fold import OPEN_STATES, NodeState, WorkflowState, gc_paused

__all__ = [
    "SqliteEventStore",
    "EventNotSerializableError",
    "SCHEMA_VERSION",
    "MIGRATIONS",
    "APPLICATION",
]

APPLICATION = "flowscope"
DURABILITY = {"normal": "NORMAL", "full": "FULL"}


class EventNotSerializableError(StoreError, TypeError):
    """An event field cannot be written as JSON; nothing was appended."""


# --------------------------------------------------------------------------- schema

# The ``node_runs`` columns that hold a NodeState (besides session_id and workflow).
_NODE_STATE_COLUMNS = (
    "path",
    "node",
    "kind",
    "parent_path",
    "status",
    "attempt",
    "failures",
    "retries",
    "recoveries",
    "started_at",
    "ended_at",
    "heartbeat_at",
    "error_code",
    "error_type",
    "job_deadline_at",
)


def _migrate_0_to_1(db: sqlite_utils.Database) -> None:
    """The first schema: the log, the sessions and the node-runs projection."""
    db["events"].create(
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
    db["sessions"].create(
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
    db["node_runs"].create(
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
    db["node_runs"].create_index(["status", "started_at"], index_name="node_runs_status")


#: ``MIGRATIONS[i]`` takes a database at schema ``i`` to schema ``i + 1``; each runs in the
#: transaction that records the new version, so a failed migration leaves the file as it was.
_OPEN_WHERE = "status IN (" + ", ".join(f"'{state}'" for state in OPEN_STATES) + ")"


def _migrate_1_to_2(db: sqlite_utils.Database) -> None:
    """Snapshots of a session's folded state, so a long session resumes without reading its whole log."""
    db["snapshots"].create({"session_id": str, "seq": int, "data": str}, pk="session_id", not_null={"seq", "data"})
    # Open runs (stuck, orphaned, overdue; the StoreCollector's scrape) through a partial
    # index that holds only them: finished runs, nearly every row, are not in it, so an
    # append touches it only when a run opens or closes, and a heartbeat never does. It
    # replaces the index on the status of every row.
    db.execute("DROP INDEX IF EXISTS node_runs_status")
    db.execute(f"CREATE INDEX node_runs_open ON node_runs (status, workflow, node) WHERE {_OPEN_WHERE}")


MIGRATIONS: list[Callable[[sqlite_utils.Database], None]] = [_migrate_0_to_1, _migrate_1_to_2]
SCHEMA_VERSION = len(MIGRATIONS)


# --------------------------------------------------------------------------- codec

_COMMON = frozenset(COMMON_FIELDS)
_NOT_PAYLOAD = _COMMON | {"type", "schema_version"}
#: Payload fields per catalog class: what ``to_dict`` gives minus the hot columns (JSON
#: writes the one tuple field, ``interrupt_ids``, as a list, just as ``to_dict`` does).
_PAYLOAD_FIELDS: dict[type, tuple[str, ...]] = {
    cls: tuple(f.name for f in dataclasses.fields(cls) if f.name not in _NOT_PAYLOAD)
    for cls in EVENT_TYPES.values()
}
_MISSING = object()


def _make_builder(cls: type[Event], strict: bool) -> Callable[..., Event] | None:
    """A fast constructor for ``cls`` from the hot columns and the payload dict.

    Equivalent to ``from_dict`` (missing fields take their defaults, unknown keys are
    ignored, ``interrupt_ids`` becomes a tuple) but sets the slots directly instead of
    going through the frozen dataclass ``__init__``, which is most of the cost of a
    100,000-event resume. The ``strict`` variant expects every field in the payload (what
    this version writes) and raises ``KeyError`` otherwise; the other fills in defaults
    (rows from an older writer). Returns None (use ``from_dict``) if the class is not a
    plain slotted dataclass.
    """
    if hasattr(cls, "__post_init__"):
        return None
    g: dict[str, Any] = {"new": object.__new__, "cls": cls, "MISSING": _MISSING, "tuple": tuple}
    lines = ["def build(sid, seq, ts, inv, path, node, d):", " o = new(cls)"]
    if not strict:
        lines.append(" get = d.get")
    values = {"session_id": "sid", "seq": "seq", "ts": "ts", "invocation_id": "inv", "path": "path", "node": "node"}
    for i, f in enumerate(dataclasses.fields(cls)):
        desc = next((k.__dict__[f.name] for k in cls.__mro__ if f.name in k.__dict__), None)
        if desc is None or type(desc).__name__ != "member_descriptor":
            return None
        g[f"s{i}"] = desc.__set__
        if f.name in values:
            lines.append(f" s{i}(o, {values[f.name]})")
            continue
        if strict:
            value = f"d[{f.name!r}]"
        elif f.default is not dataclasses.MISSING:
            g[f"d{i}"] = f.default
            value = f"get({f.name!r}, d{i})"
        elif f.default_factory is not dataclasses.MISSING:
            g[f"f{i}"] = f.default_factory
            lines.append(f" v = get({f.name!r}, MISSING)")
            value = f"f{i}() if v is MISSING else v"
        else:
            return None
        if f.name == "interrupt_ids":  # from_dict turns the JSON list back into a tuple
            lines.append(f" v = {value}")
            value = "v if type(v) is tuple else tuple(v)"
        lines.append(f" s{i}(o, {value})")
    lines.append(" return o")
    exec("\n".join(lines), g)  # noqa: S102 - generated from dataclass field names only
    return g["build"]


_BUILDERS: dict[str, Callable[..., Event]] = {}  # strict: the payload has every field
_TOLERANT_BUILDERS: dict[str, Callable[..., Event]] = {}  # missing fields take their defaults
for _type, _cls in EVENT_TYPES.items():
    _strict, _tolerant = _make_builder(_cls, True), _make_builder(_cls, False)
    if _strict is not None and _tolerant is not None:
        _BUILDERS[_type] = _strict
        _TOLERANT_BUILDERS[_type] = _tolerant
del _type, _cls, _strict, _tolerant




_dumps = json.JSONEncoder(separators=(",", ":")).encode  # json.dumps would build an encoder per call


# --------------------------------------------------------------------------- SQL

_SESSION_COLUMNS = "workflow, status, started_at, updated_at, last_seq, invocations"
_SQL_SESSION = f"SELECT {_SESSION_COLUMNS} FROM sessions WHERE session_id = ?"
_SQL_LAST_SEQ = "SELECT last_seq FROM sessions WHERE session_id = ?"
_SQL_INSERT_EVENT = (
    "INSERT INTO events (session_id, seq, type, ts, invocation_id, path, node, payload) "
    "VALUES (?, ?, ?, ?, ?, ?, ?, ?)"
)
_SQL_READ = (
    "SELECT type, ts, invocation_id, path, node, payload FROM events "
    "WHERE session_id = ? AND seq > ? AND seq <= ? ORDER BY seq"
)
_SQL_UPSERT_SESSION = (
    f"INSERT INTO sessions (session_id, {_SESSION_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?) "
    "ON CONFLICT (session_id) DO UPDATE SET "
    + ", ".join(f"{c} = excluded.{c}" for c in _SESSION_COLUMNS.split(", "))
)
_NODE_ROW_COLUMNS = ("session_id", "workflow") + _NODE_STATE_COLUMNS
_SQL_UPSERT_NODE = (
    f"INSERT INTO node_runs ({', '.join(_NODE_ROW_COLUMNS)}) "
    f"VALUES ({', '.join('?' for _ in _NODE_ROW_COLUMNS)}) "
    "ON CONFLICT (session_id, path) DO UPDATE SET "
    + ", ".join(f"{c} = excluded.{c}" for c in _NODE_ROW_COLUMNS[1:] if c not in ("path", "heartbeat_at"))
    # heartbeats are written outside the log (heartbeat()): an upsert from a cached state
    # must not move one backwards
    + ", heartbeat_at = CASE WHEN node_runs.heartbeat_at IS NULL OR excluded.heartbeat_at > node_runs.heartbeat_at"
    " THEN excluded.heartbeat_at ELSE node_runs.heartbeat_at END"
)
_SQL_LOAD_NODES = f"SELECT {', '.join(_NODE_STATE_COLUMNS)} FROM node_runs WHERE session_id = ? AND path IN "
# In NodeRun field order, so that rows map positionally.
_NODE_RUN_FIELDS = tuple(f.name for f in dataclasses.fields(NodeRun))
_SQL_NODE_RUNS = f"SELECT {', '.join(_NODE_RUN_FIELDS)} FROM node_runs"
# Literal states (our constants, not input): only a literal WHERE lets SQLite use the
# partial index node_runs_open, whose condition is this same text.
_SQL_OPEN_RUNS = f"{_SQL_NODE_RUNS} WHERE {_OPEN_WHERE} ORDER BY started_at, rowid"
_SQL_OPEN_SUMMARY = (
    "SELECT workflow, node, status, count(*), min(started_at), "
    "sum(status = 'running' AND coalesce(heartbeat_at, started_at, 0) < :stale_before), "
    "sum(status = 'waiting_job' AND job_deadline_at IS NOT NULL AND job_deadline_at < :now) "
    f"FROM node_runs WHERE {_OPEN_WHERE} "
    "GROUP BY workflow, node, status ORDER BY workflow, node, status"
)
_SQL_HEARTBEAT = (
    "UPDATE node_runs SET heartbeat_at = ? WHERE session_id = ? AND path = ? AND status = 'running'"
)
#: Sessions among the given ids that may be deleted: finished, and no open run (pruning).
_SQL_PRUNABLE = (
    "SELECT session_id FROM sessions WHERE status IN ("
    + ", ".join("?" * len(FINISHED_SESSION_STATUSES))
    + ") AND session_id IN ({marks}) "
    f"AND session_id NOT IN (SELECT session_id FROM node_runs WHERE {_OPEN_WHERE})"
)
#: Every table keyed by session, in the order a prune deletes from them.
_PRUNE_TABLES = ("events", "node_runs", "snapshots", "sessions")
_SQL_SESSIONS = (
    f"SELECT session_id, {_SESSION_COLUMNS} FROM sessions ORDER BY coalesce(updated_at, 0.0) DESC, rowid"
)
_PATHS_PER_QUERY = 500
_PAGE_SIZE = 1024
_NODE_CACHE_SESSIONS = 16  # sessions whose node states an append keeps for the next one


def _rollback(conn: sqlite3.Connection) -> None:
    if conn.in_transaction:
        try:
            conn.execute("ROLLBACK")
        except sqlite3.Error:  # pragma: no cover - the error that led here matters more
            pass


def _node_state(row: Sequence[Any]) -> NodeState:
    return NodeState(**dict(zip(_NODE_STATE_COLUMNS, row)))


def _node_row(session_id: str, workflow: str, ns: NodeState) -> tuple[Any, ...]:
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


def _session_row(ws: WorkflowState) -> tuple[Any, ...]:
    return (ws.session_id, ws.workflow, ws.status, ws.started_at, ws.updated_at, ws.last_seq, ws.invocations)


# --------------------------------------------------------------------------- the store


class SqliteEventStore(EventStore):
    """An :class:`EventStore` in one SQLite file.

    ``durability="normal"`` (``synchronous=NORMAL`` in WAL mode: a commit survives a
    process crash; an OS crash or power loss may lose the last transactions, never corrupt
    the file) or ``"full"`` (fsync on every commit). ``readonly=True`` opens an existing
    file without ever writing to it. ``busy_timeout`` (seconds) is how long a writer waits
    for another process's transaction before giving up with a :class:`StoreError`.

    Opening a file that is missing (read-only), not SQLite, another application's
    database, or from a newer flowscope raises :class:`StoreError` naming the file; an
    older schema is migrated; a new or empty file gets the schema.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        durability: str = "normal",
        readonly: bool = False,
        *,
        busy_timeout: float = 5.0,
    ) -> None:
        if durability not in DURABILITY:
            raise ValueError(f"durability must be 'normal' or 'full', not {durability!r}")
        self.path = os.fspath(path)
        self.durability = durability
        self.readonly = readonly
        self.busy_timeout = busy_timeout
        self._lock = threading.RLock()
        # session -> (last_seq, complete, {path: NodeState}) as of this object's last append
        self._node_cache: dict[str, tuple[int, bool, dict[str, NodeState]]] = {}
        self._pending_cache: tuple[str, tuple[int, bool, dict[str, NodeState]]] | None = None
        self._conn: sqlite3.Connection | None = None
        new_file = self.path == ":memory:" or not os.path.exists(self.path) or os.path.getsize(self.path) == 0
        self._check_file()
        conn = self._connect()
        self._conn = conn
        if new_file and not readonly:
            # Small pages: an append rewrites a handful of B-tree pages (the event, the
            # node run, the session and their indexes) and every one of them goes to the
            # WAL whole, so 1 KiB pages make the per-step commit ~20% cheaper than 4 KiB.
            conn.execute(f"PRAGMA page_size = {_PAGE_SIZE}")
        try:
            self.db = sqlite_utils.Database(conn, recursive_triggers=False, execute_plugins=False)
            conn.execute(f"PRAGMA busy_timeout = {int(busy_timeout * 1000)}")
            self._open_schema()
            if not readonly:
                mode = conn.execute("PRAGMA journal_mode = WAL").fetchone()[0]
                self.journal_mode = str(mode).lower()
            else:
                self.journal_mode = str(conn.execute("PRAGMA journal_mode").fetchone()[0]).lower()
            conn.execute(f"PRAGMA synchronous = {DURABILITY[durability]}")
        except StoreError:
            self._close_quietly()
            raise
        except sqlite3.Error as exc:
            self._close_quietly()
            raise self._error(exc, "open") from exc

    # ------------------------------------------------------------------ opening

    def __repr__(self) -> str:
        return f"SqliteEventStore({self.path!r})"

    def _check_file(self) -> None:
        p = Path(self.path)
        if self.path == ":memory:":
            if self.readonly:
                raise StoreError("an in-memory flowscope store cannot be opened read-only")
            return
        if p.is_dir():
            raise StoreError(f"{self.path} is a directory, not a flowscope database")
        if not p.exists():
            if self.readonly:
                raise StoreError(f"flowscope database {self.path} does not exist")
            if not p.parent.is_dir():
                raise StoreError(f"cannot create flowscope database {self.path}: directory {p.parent} does not exist")
            return
        # No peeking at the header with open()/close() here: closing any descriptor of a
        # database file drops every POSIX lock this process holds on it, including those of
        # other connections still open in this process, and another process can then
        # checkpoint the WAL under them ("database disk image is malformed"). SQLite's own
        # "file is not a database" error says the same thing safely (see _error).
        if not os.access(p, os.R_OK):
            raise StoreError(f"cannot read {self.path}: permission denied")

    def _connect(self) -> sqlite3.Connection:
        try:
            if self.readonly:
                uri = Path(self.path).resolve().as_uri() + "?mode=ro"
                return sqlite3.connect(
                    uri, uri=True, isolation_level=None, check_same_thread=False, timeout=self.busy_timeout
                )
            return sqlite3.connect(
                self.path, isolation_level=None, check_same_thread=False, timeout=self.busy_timeout
            )
        except sqlite3.Error as exc:
            raise StoreError(f"cannot open flowscope database {self.path}: {exc}") from exc

    def _close_quietly(self) -> None:
        if self._conn is not None:
            try:
                self._conn.close()
            except sqlite3.Error:  # pragma: no cover
                pass
            self._conn = None

    def _read_version(self) -> int:
        """The schema version recorded in the file (0 for a new, empty database)."""
        tables = set(self.db.table_names())
        if "meta" not in tables:
            if tables - {"sqlite_sequence", "sqlite_stat1", "sqlite_stat4"}:
                raise StoreError(f"{self.path} is not a flowscope database (it has no flowscope meta table)")
            return 0
        try:
            meta = dict(self._conn.execute("SELECT key, value FROM meta").fetchall())  # type: ignore[union-attr]
        except sqlite3.OperationalError as exc:
            raise StoreError(f"{self.path} is not a flowscope database (unexpected meta table: {exc})") from exc
        if meta.get("application") != APPLICATION:
            raise StoreError(f"{self.path} is not a flowscope database")
        try:
            return int(meta.get("schema_version", 0))
        except (TypeError, ValueError):
            raise StoreError(
                f"{self.path}: corrupt flowscope meta table (schema_version={meta.get('schema_version')!r})"
            ) from None

    def _open_schema(self) -> None:
        version = self._check_version()
        if version == SCHEMA_VERSION:
            return
        if self.readonly:
            raise StoreError(
                f"{self.path} has flowscope schema {version}; this version uses schema {SCHEMA_VERSION}: "
                "open it once without readonly to migrate it"
            )
        conn = self._conn
        assert conn is not None
        conn.execute("BEGIN IMMEDIATE")
        try:
            version = self._check_version()  # another process may have migrated meanwhile
            if version < SCHEMA_VERSION:
                if "meta" not in self.db.table_names():
                    self.db["meta"].create({"key": str, "value": str}, pk="key")
                for step in range(version, SCHEMA_VERSION):
                    MIGRATIONS[step](self.db)
                conn.executemany(
                    "INSERT INTO meta (key, value) VALUES (?, ?) "
                    "ON CONFLICT (key) DO UPDATE SET value = excluded.value",
                    [("application", APPLICATION), ("schema_version", str(SCHEMA_VERSION))],
                )
            conn.execute("COMMIT")
        except BaseException as exc:
            _rollback(conn)
            if isinstance(exc, sqlite3.Error):
                raise self._error(exc, f"migrating the schema from version {version} to {SCHEMA_VERSION}") from exc
            raise

    def _check_version(self) -> int:
        version = self._read_version()
        if version > SCHEMA_VERSION:
            raise StoreError(
                f"{self.path} was written by a newer flowscope (schema {version}, "
                f"this version supports {SCHEMA_VERSION}): upgrade flowscope"
            )
        return version

    @property
    def schema_version(self) -> int:
        """The schema version of the open file (always :data:`SCHEMA_VERSION` once open)."""
        with self._op("read the schema version"):
            return self._read_version()

    # ------------------------------------------------------------------ plumbing

    def _error(self, exc: BaseException, action: str) -> StoreError:
        msg = str(exc)
        low = msg.lower()
        if "not a database" in low:
            return StoreError(f"{self.path} is not a SQLite database")
        if "locked" in low or "busy" in low:
            return StoreError(
                f"{self.path} is locked by another process: could not {action} within {self.busy_timeout:g} s"
            )
        if "malformed" in low or "corrupt" in low:
            return StoreError(f"{self.path} is corrupt: {msg}")
        if "readonly" in low or "read-only" in low:
            return StoreError(f"{self.path} is read-only: cannot {action}")
        if "closed" in low:
            return StoreError(f"{self.path}: the store is closed")
        return StoreError(f"{self.path}: cannot {action}: {msg}")

    @contextmanager
    def _op(self, action: str) -> Iterator[sqlite3.Connection]:
        with self._lock:
            conn = self._conn
            if conn is None:
                raise StoreError(f"{self.path}: the store is closed")
            try:
                yield conn
            except sqlite3.Error as exc:
                raise self._error(exc, action) from exc

    @contextmanager
    def _write(self, action: str) -> Iterator[sqlite3.Connection]:
        """One ``BEGIN IMMEDIATE`` transaction: committed on success, rolled back on any error."""
        if self.readonly:
            raise StoreError(f"{self.path} is open read-only: cannot {action}")
        with self._op(action) as conn:
            conn.execute("BEGIN IMMEDIATE")
            try:
                yield conn
                conn.execute("COMMIT")
            except BaseException:
                _rollback(conn)
                raise

    def close(self) -> None:
        with self._lock:
            self._close_quietly()

    # ------------------------------------------------------------------ encoding

    def _encode(self, session_id: str, e: Event) -> tuple[Any, ...]:
        """The columns of one event, its payload as JSON (raising before anything is written)."""
        names = _PAYLOAD_FIELDS.get(type(e))
        if names is not None:  # the hot path: the class's own fields, in declaration order
            payload = {k: getattr(e, k) for k in names}
        elif type(e) is UnknownEvent:
            payload = {k: v for k, v in to_dict(e).items() if k not in _COMMON and k != "type"}
        else:
            payload = {k: v for k, v in to_dict(e).items() if k not in _NOT_PAYLOAD}
        try:
            text = _dumps(payload)
        except (TypeError, ValueError, OverflowError, RecursionError) as exc:
            raise self._not_serializable(session_id, e, payload, exc) from None
        return (e.type, e.ts, e.invocation_id, e.path, e.node, text)

    def _not_serializable(self, session_id: str, e: Event, payload: dict[str, Any], exc: Exception) -> StoreError:
        bad = ""
        for name, value in payload.items():
            try:
                _dumps(value)
            except (TypeError, ValueError, OverflowError, RecursionError):
                bad = f" field {name!r}"
                break
        where = f" at {e.path}" if e.path else ""
        return EventNotSerializableError(
            f"cannot append {e.type} event{where} to session {session_id!r} in {self.path}:{bad} "
            f"is not JSON-serialisable ({exc}); nothing was written"
        )

    def _decode(self, session_id: str, after_seq: int, rows: list[tuple[Any, ...]]) -> list[Event]:
        """Events from ``(type, ts, invocation_id, path, node, payload)`` rows with seq after_seq+1..."""
        if not rows:
            return []
        with gc_paused():
            types, tss, invs, paths, nodes, payloads = zip(*rows)
            try:
                dicts = json.loads("[" + ",".join(payloads) + "]")
                if len(dicts) != len(rows):
                    raise ValueError("payload count mismatch")
            except (ValueError, TypeError):
                dicts = self._decode_payloads(session_id, after_seq, payloads)
            out: list[Event] = []
            append = out.append
            builders = _BUILDERS
            seq = after_seq
            for typ, ts, inv, path, node, d in zip(types, tss, invs, paths, nodes, dicts):
                seq += 1
                build = builders.get(typ)
                if build is not None and type(d) is dict:
                    try:
                        append(build(session_id, seq, ts, inv, path, node, d))
                    except KeyError:  # a row written before a field was added
                        append(_TOLERANT_BUILDERS[typ](session_id, seq, ts, inv, path, node, d))
                else:
                    append(self._decode_slow(session_id, seq, typ, ts, inv, path, node, payloads[seq - after_seq - 1]))
            return out

    def _decode_payloads(self, session_id: str, after_seq: int, payloads: Sequence[Any]) -> list[Any]:
        return [self._payload(session_id, after_seq + i + 1, text) for i, text in enumerate(payloads)]

    def _payload(self, session_id: str, seq: int, text: Any) -> dict[str, Any]:
        """One row's payload as a dict, or a StoreError naming the file, session and seq."""
        try:
            d = json.loads(text)
        except (ValueError, TypeError) as exc:
            raise self._bad_row(session_id, seq, f"corrupt payload JSON ({exc})") from None
        if type(d) is not dict:
            raise self._bad_row(session_id, seq, f"payload is not a JSON object: {text!r:.80}")
        return d

    def _decode_slow(
        self, session_id: str, seq: int, typ: Any, ts: Any, inv: Any, path: Any, node: Any, text: Any
    ) -> Event:
        d = self._payload(session_id, seq, text)
        d.update(type=typ, session_id=session_id, seq=seq, ts=ts, invocation_id=inv, path=path, node=node)
        try:
            return from_dict(d)
        except (EventDecodeError, TypeError, ValueError) as exc:
            raise self._bad_row(session_id, seq, str(exc)) from None

    def _bad_row(self, session_id: str, seq: int, problem: str) -> StoreError:
        return StoreError(f"{self.path}: bad event in session {session_id!r} at seq {seq}: {problem}")

    def _fetch(self, conn: sqlite3.Connection, session_id: str, after_seq: int, last_seq: int) -> list[tuple[Any, ...]]:
        """The rows of seq ``after_seq + 1 .. last_seq``; a missing one is reported, not skipped."""
        rows = conn.execute(_SQL_READ, (session_id, after_seq, last_seq)).fetchall()
        if len(rows) != last_seq - after_seq:
            seqs = [r[0] for r in conn.execute(
                "SELECT seq FROM events WHERE session_id = ? AND seq > ? AND seq <= ? ORDER BY seq",
                (session_id, after_seq, last_seq),
            )]
            expected = after_seq + 1
            for s in seqs:
                if s != expected:
                    break
                expected += 1
            raise StoreError(
                f"{self.path}: the log of session {session_id!r} has a gap: seq {expected} is missing "
                f"(the session is at seq {last_seq})"
            )
        return rows

    # ------------------------------------------------------------------ the port

    def append(self, session_id: str, events: Sequence[Event], expected_last_seq: int) -> list[Event]:
        if not isinstance(events, (list, tuple)):
            events = list(events)  # iterated twice below
        encoded = [self._encode(session_id, e) for e in events]  # fails before anything is locked
        if self.readonly:
            raise StoreError(f"{self.path} is open read-only: cannot append events")
        with self._lock:  # the hot path: the same as _write(), without the context-manager overhead
            conn = self._conn
            if conn is None:
                raise StoreError(f"{self.path}: the store is closed")
            try:
                conn.execute("BEGIN IMMEDIATE")
                self._pending_cache = None
                try:
                    numbered = self._append_in_transaction(conn, session_id, events, encoded, expected_last_seq)
                    conn.execute("COMMIT")
                except BaseException:
                    _rollback(conn)  # the cache entry was popped: the next append reads the rows
                    raise
                if self._pending_cache is not None:  # committed: keep the states for the next append
                    sid, entry = self._pending_cache
                    cache = self._node_cache
                    cache[sid] = entry
                    while len(cache) > _NODE_CACHE_SESSIONS:
                        cache.pop(next(iter(cache)))
            except sqlite3.Error as exc:
                raise self._error(exc, "append events") from exc
        return numbered

    def _append_in_transaction(
        self,
        conn: sqlite3.Connection,
        session_id: str,
        events: Sequence[Event],
        encoded: list[tuple[Any, ...]],
        expected_last_seq: int,
    ) -> list[Event]:
        row = conn.execute(_SQL_SESSION, (session_id,)).fetchone()
        last = row[4] if row is not None else 0
        numbered = number_events(session_id, events, last, expected_last_seq)  # may raise: nothing written
        if not numbered:
            return numbered
        conn.executemany(_SQL_INSERT_EVENT, [(session_id, e.seq) + enc for e, enc in zip(numbered, encoded)])
        ws = WorkflowState(session_id=session_id)
        # The node states this store object wrote last time are still the rows' states if
        # nobody appended since (same last_seq): no need to read them back. ``complete``
        # says the cache holds every row of the session (we created it), so a path it
        # lacks is new and needs no lookup either.
        cached = self._node_cache.pop(session_id, None)
        if row is None:
            complete, nodes = True, {}
        elif cached is not None and cached[0] == last:
            complete, nodes = cached[1], cached[2]
        else:
            complete, nodes = False, {}
        ws.nodes = nodes
        if row is not None:
            ws.workflow, ws.status, ws.started_at, ws.updated_at, ws.last_seq, ws.invocations = row
        workflow_before = ws.workflow
        paths = list(dict.fromkeys(e.path for e in numbered if e.path and type(e) is not UnknownEvent))
        missing = [] if complete else [p for p in paths if p not in nodes]
        for i in range(0, len(missing), _PATHS_PER_QUERY):
            chunk = missing[i : i + _PATHS_PER_QUERY]
            sql = _SQL_LOAD_NODES + "(" + ", ".join("?" * len(chunk)) + ")"
            for r in conn.execute(sql, (session_id, *chunk)):
                nodes[r[0]] = _node_state(r)
        apply = ws.apply
        for e in numbered:
            apply(e)  # the one definition of what an event means (projection.py)
        nodes = ws.nodes
        workflow = ws.workflow
        conn.executemany(_SQL_UPSERT_NODE, [_node_row(session_id, workflow, nodes[p]) for p in paths if p in nodes])
        if workflow != workflow_before and row is not None:
            conn.execute("UPDATE node_runs SET workflow = ? WHERE session_id = ?", (workflow, session_id))
        conn.execute(_SQL_UPSERT_SESSION, _session_row(ws))
        self._pending_cache = (session_id, (numbered[-1].seq, complete, nodes))
        return numbered

    def read(self, session_id: str, after_seq: int = 0) -> list[Event]:
        after = after_seq if after_seq > 0 else 0
        with self._op("read events") as conn:
            row = conn.execute(_SQL_LAST_SEQ, (session_id,)).fetchone()
            if row is None or row[0] <= after:
                return []
            # Bounded by last_seq: a concurrent append beyond it cannot tear the result.
            with gc_paused():
                rows = self._fetch(conn, session_id, after, row[0])
        return self._decode(session_id, after, rows)

    def last_seq(self, session_id: str) -> int:
        with self._op("read the last seq") as conn:
            row = conn.execute(_SQL_LAST_SEQ, (session_id,)).fetchone()
        return row[0] if row is not None else 0

    def sessions(self) -> list[SessionInfo]:
        with self._op("list sessions") as conn:
            rows = conn.execute(_SQL_SESSIONS).fetchall()
        return [SessionInfo(*r) for r in rows]

    def heartbeat(self, session_id: str, paths: Iterable[str], ts: float | None = None) -> None:
        now = time.time() if ts is None else ts
        params = [(now, session_id, p) for p in paths]
        if not params:
            return
        with self._write("record heartbeats") as conn:
            conn.executemany(_SQL_HEARTBEAT, params)

    def open_run_summary(self, now: float, stale_after_s: float) -> list[tuple[Any, ...]]:
        """Open runs aggregated per (workflow, node, state), for the StoreCollector's scrape.

        Rows of ``(workflow, node, state, count, oldest_started_at, orphaned, overdue)``:
        ``orphaned`` counts running runs whose heartbeat (or start, without one) is more than
        ``stale_after_s`` before ``now``; ``overdue`` counts jobs past their deadline. The
        same numbers as folding :meth:`open_runs`, without one object per open run.
        """
        with self._op("summarise open runs") as conn:
            return conn.execute(_SQL_OPEN_SUMMARY, {"now": now, "stale_before": now - stale_after_s}).fetchall()

    def save_snapshot(self, session_id: str, seq: int, data: str) -> None:
        with self._write("save a snapshot") as conn:
            row = conn.execute(_SQL_LAST_SEQ, (session_id,)).fetchone()
            if row is None or seq > row[0]:
                raise StoreError(f"{self.path}: a snapshot of session {session_id!r} at seq {seq} is ahead of its log")
            conn.execute(
                "INSERT INTO snapshots (session_id, seq, data) VALUES (?, ?, ?) "
                "ON CONFLICT (session_id) DO UPDATE SET seq = excluded.seq, data = excluded.data",
                (session_id, seq, data),
            )

    def load_snapshot(self, session_id: str) -> tuple[int, str] | None:
        with self._op("read a snapshot") as conn:
            row = conn.execute("SELECT seq, data FROM snapshots WHERE session_id = ?", (session_id,)).fetchone()
        return (row[0], row[1]) if row is not None else None

    def node_runs(self, session_id: str | None = None) -> list[NodeRun]:
        with self._op("read node runs") as conn:
            if session_id is None:
                rows = conn.execute(_SQL_NODE_RUNS + " ORDER BY rowid").fetchall()
            else:
                rows = conn.execute(_SQL_NODE_RUNS + " WHERE session_id = ? ORDER BY rowid", (session_id,)).fetchall()
        return [NodeRun(*r) for r in rows]

    def open_runs(self) -> list[NodeRun]:
        with self._op("query open runs") as conn:
            rows = conn.execute(_SQL_OPEN_RUNS).fetchall()
        return [NodeRun(*r) for r in rows]

    # ------------------------------------------------------------------ pruning (flowscope prune)
    # One block, for the move into store/sqlite/: delete_sessions() and storage_bytes(),
    # with the two statements they use (_SQL_PRUNABLE, _PRUNE_TABLES) just below them.

    def delete_sessions(self, session_ids: Iterable[str]) -> list[str]:
        ids = list(dict.fromkeys(session_ids))
        deleted: list[str] = []
        with self._write("delete sessions") as conn:
            for i in range(0, len(ids), _PATHS_PER_QUERY):
                chunk = ids[i : i + _PATHS_PER_QUERY]
                marks = ", ".join("?" * len(chunk))
                # the guard is re-checked inside the transaction: a resume that started
                # after the caller chose the sessions keeps its log
                prunable = {r[0] for r in conn.execute(_SQL_PRUNABLE.format(marks=marks), (*FINISHED_SESSION_STATUSES, *chunk))}
                gone = [sid for sid in chunk if sid in prunable]
                if not gone:
                    continue
                gone_marks = ", ".join("?" * len(gone))
                for table in _PRUNE_TABLES:
                    conn.execute(f"DELETE FROM {table} WHERE session_id IN ({gone_marks})", gone)  # noqa: S608 - table names are constants
                deleted.extend(gone)
        for sid in deleted:
            self._node_cache.pop(sid, None)
        return deleted

    def storage_bytes(self) -> int | None:
        """Bytes of the file's pages in use (deleted rows' pages become free pages that new
        events reuse; the file itself shrinks only with ``VACUUM``)."""
        with self._op("measure the database") as conn:
            page_size = conn.execute("PRAGMA page_size").fetchone()[0]
            pages = conn.execute("PRAGMA page_count").fetchone()[0]
            free = conn.execute("PRAGMA freelist_count").fetchone()[0]
        return int((pages - free) * page_size)

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
            conn.execute("DELETE FROM sessions")
            sessions = conn.execute(
                "SELECT session_id, max(seq) FROM events GROUP BY session_id ORDER BY min(rowid)"
            ).fetchall()
            for session_id, last in sessions:
                events = self._decode(session_id, 0, self._fetch(conn, session_id, 0, last))
                ws = WorkflowState(session_id=session_id)
                apply = ws.apply
                for e in events:
                    apply(e)
                rows = []
                for ns in ws.nodes.values():
                    hb = heartbeats.get((session_id, ns.path))
                    if ns.status == "running" and hb is not None and (ns.heartbeat_at is None or hb > ns.heartbeat_at):
                        ns.heartbeat_at = hb
                    rows.append(_node_row(session_id, ws.workflow, ns))
                conn.executemany(_SQL_UPSERT_NODE, rows)
                conn.execute(_SQL_UPSERT_SESSION, _session_row(ws))
