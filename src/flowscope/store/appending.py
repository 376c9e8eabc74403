"""An append's steps, written once for the SQL stores: the fence, the numbering, the fold of
the events into the session's node states, and the rows that record them.

SQLite and PostgreSQL differ in how they read and write those rows (their SQL, their
locks, SQLite's group commit collecting rows for one statement per table), not in what an
append is: each hands :func:`append_steps` and :func:`take_in_steps` an :class:`AppendIO`
over its open transaction. Pure Python: no database driver is imported here.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from operator import attrgetter
from typing import Any, NamedTuple, Protocol

from ..events import Event, JobDispatched, JobResultReceived, RunSubmitted, UnknownEvent
from ..fold import NodeState, WorkflowState
from ..ownership import Owner
from ..states import SessionStatus
from .base import AppendBatch, lease_lost, number_events
from .codec import Row
from .projection_sql import NODE_STATE_COLUMNS

__all__ = [
    "AppendIO",
    "Cached",
    "OwnerColumn",
    "PreparedBatch",
    "SessionRow",
    "SessionWrite",
    "CLAIMABLE",
    "FULL_LOAD_MAX",
    "KEPT_SESSIONS_MAX",
    "append_steps",
    "check_fence",
    "event_params",
    "guarded_row",
    "keep_states",
    "new_session",
    "node_params",
    "owner_from_column",
    "UNREADABLE_OWNER",
    "prepare_batches",
    "recall_jobs",
    "resumed_state",
    "session_columns",
    "session_row_of",
    "session_write",
    "submitted_at",
    "take_in_steps",
    "touched_paths",
]

#: The ``owner`` column as a driver reads it: JSON text (SQLite), a dict (PostgreSQL's jsonb), or NULL.
OwnerColumn = str | Mapping[str, Any] | None
#: Statuses a worker claims a session in: an append that brings a session to one may wake the workers.
CLAIMABLE = ("queued", "answered")
#: Node runs an SQL store's append reads at most, when it has no state of the session at
#: hand (a resumed session's first append), to know all of them (:meth:`AppendIO.all_nodes`):
#: its later appends then read none. With more, each append reads the runs it touches.
FULL_LOAD_MAX = 2000


#: Sessions whose state an SQL store keeps at most for their next append
#: (:func:`keep_states`): only sessions in the middle of an invocation are kept, so this is
#: a backstop; below the number of a process's concurrent sessions, appends would read
#: their rows back.
KEPT_SESSIONS_MAX = 65536


#: An ``owner`` column that cannot be read (not JSON, not an owner's fields). Its host is
#: none, so its lease alone speaks for it: one bad row neither breaks the listing of every
#: session nor frees a session whose lease still runs.
UNREADABLE_OWNER = Owner(worker_id="(unreadable owner record)", host="", pid=0, started_at=None)


def owner_from_column(data: OwnerColumn) -> Owner | None:
    """The ``owner`` column as an :class:`~flowscope.ownership.Owner` (None if NULL or
    empty, :data:`UNREADABLE_OWNER` if it is no owner's record)."""
    if not data:
        return None
    try:
        return Owner.from_dict(json.loads(data) if isinstance(data, str) else data)
    except (ValueError, TypeError, AttributeError, OverflowError, RecursionError):
        return UNREADABLE_OWNER


class SessionRow(NamedTuple):
    """A session's row as an append reads it, before it writes: the fold's columns and the fence.

    A row that :meth:`~flowscope.store.base.EventStore.acquire` made before the first event
    has ``last_seq`` 0, an empty workflow and the status ``new``. A named tuple: an append
    reads one, and building it is one C call (:func:`session_row_of`), where a frozen
    dataclass's ``__init__`` sets each field through ``object.__setattr__``.
    """

    workflow: str
    #: One the fold wrote (``new`` for a row acquire() made), read back as text.
    status: SessionStatus
    started_at: float | None
    updated_at: float | None
    last_seq: int
    invocations: int
    epoch: int
    #: Who holds the session, as stored: decoded only to name a takeover in an error.
    owner: OwnerColumn
    #: The row's identity where the store has one (PostgreSQL's ``sessions.id``: a session
    #: pruned and made again is another row), else 0.
    row_id: int = 0


class SessionWrite(NamedTuple):
    """A session's row as an append leaves it: the fold's columns, and what moved."""

    session_id: str
    workflow: str
    status: SessionStatus
    started_at: float | None
    updated_at: float | None
    last_seq: int
    invocations: int
    #: The last ``RunSubmitted``'s time (a first submit, or a retry that queues the session
    #: again), else None: the stored one is kept.
    submitted_at: float | None
    #: The row existed with this workflow and status: only the columns that move change.
    same_status: bool
    #: The append made the session claimable (:data:`CLAIMABLE`; it was not): a store that
    #: can wake its workers does.
    woke: bool


#: Node statuses a run does not leave within an invocation: the append cache lets them go.
_ENDED = frozenset({"completed", "failed", "cancelled"})


class Cached:
    """A session as this store object's last append there left it: its next append folds on
    this state instead of reading it back, while nobody else appended. That append moves it
    on in place (no new record per append); a store keeps it only once its transaction
    committed, and drops it on any failure."""

    __slots__ = ("session", "row_id", "complete", "ws", "finished")

    def __init__(
        self, session: SessionWrite, row_id: int, complete: bool, ws: WorkflowState, finished: set[str]
    ) -> None:
        self.session = session
        #: :attr:`SessionRow.row_id` of the row written.
        self.row_id = row_id
        #: ``nodes`` holds every node run of the session still open (else only some: look up
        #: the others).
        self.complete = complete
        #: The store's fold after that append (its columns are ``session``'s), moved on in
        #: place by the next append: no new ``WorkflowState`` per append. It holds the runs
        #: still open: a run that ended (completed, failed, cancelled) is written and let go.
        self.ws = ws
        #: The paths of the runs let go: with ``complete``, a path in neither ``ws.nodes`` nor
        #: here is a new run; one here is read back if an append touches it again.
        self.finished = finished

    @property
    def nodes(self) -> dict[str, NodeState]:
        """The fold's node states (of the runs still open)."""
        return self.ws.nodes


def keep_states(cache: dict[str, Cached], entries: Mapping[str, Cached | None]) -> None:
    """Keep committed appends' states in ``cache`` (an SQL store's, under its lock) for the
    sessions' next appends. Only a session in the middle of an invocation (``running``)
    appends again soon: one its append queued (a submit), paused or ended is not kept, so
    a process that submits sessions for workers, or has run thousands, holds none of
    theirs. At most :data:`KEPT_SESSIONS_MAX`, the oldest let go first."""
    for session_id, entry in entries.items():
        if entry is not None and entry.session.status == "running":
            cache[session_id] = entry
    while len(cache) > KEPT_SESSIONS_MAX:
        cache.pop(next(iter(cache)))


@dataclass(frozen=True, slots=True)
class PreparedBatch:
    """One batch of a group commit, its events encoded before anything is locked."""

    session_id: str
    events: Sequence[Event]
    encoded: list[Row]
    expected_last_seq: int
    epoch: int | None


def prepare_batches(
    batches: Sequence[AppendBatch], encode: Callable[[str, str, Event], Row], where: str
) -> list[PreparedBatch]:
    """``batches`` with their events encoded by ``encode(where, session_id, event)``: an
    event that cannot be written fails the group commit before anything is locked."""
    out = []
    for session_id, events, expected, epoch in batches:
        evs = events if isinstance(events, (list, tuple)) else list(events)
        out.append(
            PreparedBatch(session_id, evs, [encode(where, session_id, e) for e in evs], expected, epoch)
        )
    return out


_new = tuple.__new__

_session_columns = attrgetter("workflow", "status", "started_at", "updated_at", "last_seq", "invocations")


def session_columns(
    ws: WorkflowState | SessionWrite,
) -> tuple[str, SessionStatus, float | None, float | None, int, int]:
    """A session's state as its row and :class:`~flowscope.store.records.SessionInfo` hold
    it, in their order: ``(workflow, status, started_at, updated_at, last_seq,
    invocations)`` (the one place that lists them)."""
    return _session_columns(ws)  # attrgetter: one C call


def session_row_of(values: tuple[Any, ...]) -> SessionRow:
    """A :class:`SessionRow` of a tuple of its nine fields, in order (one C call: an
    adapter's hot path, e.g. a fetched row plus its row id)."""
    return _new(SessionRow, values)


def guarded_row(cached: Cached, epoch: int) -> SessionRow:
    """The session's row as this store's last append left it (``cached``), under ``epoch``:
    what a guarded append takes instead of reading the row (written only if the stored row
    still is this one)."""
    return _new(SessionRow, (*session_columns(cached.session), epoch, None, cached.row_id))


def new_session(session_id: str, row_id: int = 0) -> Cached:
    """What a store may keep for a session it just acquired with no events yet (its row's
    ``last_seq`` 0, no workflow, status ``new``; ``row_id`` its :attr:`SessionRow.row_id`
    where the guard reads it): the first append folds on this, and an SQL store can guard
    that row instead of reading it back."""
    ws = WorkflowState(session_id=session_id)
    written = _new(SessionWrite, (session_id, "", "new", None, None, 0, 0, None, False, False))
    return Cached(written, row_id, True, ws, set())


class AppendIO(Protocol):
    """What an append reads and writes in a store's open transaction, in the store's SQL."""

    def session(self, session_id: str) -> SessionRow | None:
        """The session's row (locked until the commit where the store locks rows), None if none."""

    def all_nodes(self, session_id: str) -> tuple[dict[str, NodeState], bool]:
        """Node states to fold on when none are cached, and whether they are all the session's."""

    def nodes(self, session_id: str, paths: list[str]) -> Iterable[NodeState]:
        """The stored states of the runs at ``paths`` (those that exist)."""

    def job_events(self, session_id: str, paths: list[str]) -> Iterable[Event]:
        """The session's ``JobDispatched`` and ``JobResultReceived`` events at ``paths``, in
        log order (read only for a run whose row has a job deadline: :func:`recall_jobs`)."""

    def insert_events(self, rows: list[tuple[Any, ...]]) -> None:
        """Insert the events' rows (:func:`event_params`)."""

    def upsert_nodes(self, rows: list[tuple[Any, ...]]) -> None:
        """Write node runs' rows (:func:`node_params`); a stored heartbeat never moves back."""

    def rename_workflow(self, session_id: str, workflow: str) -> None:
        """Give every node run of the session its new workflow (another workflow's run in it)."""

    def write_session(self, row: SessionWrite) -> int:
        """Write the session's row; its :attr:`SessionRow.row_id`."""

    def drop_messages(self, session_id: str, message_ids: list[int]) -> None:
        """Delete the session's messages ``message_ids`` (taken in)."""


def check_fence(session_id: str, row: SessionRow | None, epoch: int | None) -> None:
    """Raise :class:`~flowscope.errors.LeaseLost` if ``epoch`` is given and is not the
    session's (it was taken over): the fence, checked before anything is written."""
    current = row.epoch if row is not None else 0
    if epoch is not None and current != epoch:
        raise lease_lost(
            session_id, current, owner_from_column(row.owner) if row is not None else None, epoch
        )


def touched_paths(numbered: Sequence[Event]) -> list[str]:
    """The node paths ``numbered`` moves, once each, in order: the node runs an append writes."""
    return list(dict.fromkeys(e.path for e in numbered if e.path and type(e) is not UnknownEvent))


def submitted_at(events: Sequence[Event]) -> float | None:
    """When the last ``RunSubmitted`` of ``events`` was written, if there is one."""
    for e in reversed(events):
        if type(e) is RunSubmitted:
            return e.ts
    return None


def event_params(session_id: str, numbered: Sequence[Event], encoded: Sequence[Row]) -> list[tuple[Any, ...]]:
    """The parameters of an events insert: ``(session_id, seq, type, ts, invocation_id, path, node, payload)``."""
    return [(session_id, e.seq) + enc for e, enc in zip(numbered, encoded)]


#: A node state's :data:`~flowscope.store.projection_sql.NODE_STATE_COLUMNS`, as a tuple (one C call).
_node_columns = attrgetter(*NODE_STATE_COLUMNS)


def node_params(session_id: str, workflow: str, ns: NodeState) -> tuple[Any, ...]:
    """The parameters of a node-runs upsert: session, workflow, then
    :data:`~flowscope.store.projection_sql.NODE_STATE_COLUMNS`."""
    return (session_id, workflow) + _node_columns(ns)


def resumed_state(
    session_id: str, row: SessionRow | SessionWrite | None, nodes: dict[str, NodeState]
) -> WorkflowState:
    """The fold to apply an append to: the session's columns from ``row``, its node states ``nodes``."""
    ws = WorkflowState(session_id=session_id)
    ws.nodes = nodes
    if row is not None:
        ws.workflow, ws.status, ws.started_at, ws.updated_at = (
            row.workflow,
            row.status,
            row.started_at,
            row.updated_at,
        )
        ws.last_seq, ws.invocations = row.last_seq, row.invocations
    return ws


def session_write(
    ws: WorkflowState, numbered: Sequence[Event], before: SessionRow | SessionWrite | None
) -> SessionWrite:
    """The session's row after ``numbered`` moved it from ``before`` (None: a new session) to ``ws``."""
    status = ws.status
    if before is None:
        same, woke = False, status in CLAIMABLE
    else:  # last_seq 0: a row acquire() made before the first event, none of the fold's columns
        same = before.last_seq != 0 and before.workflow == ws.workflow and before.status == status
        woke = status in CLAIMABLE and before.status != status
    return _new(SessionWrite, (ws.session_id, *session_columns(ws), submitted_at(numbered), same, woke))


def append_steps(
    io: AppendIO,
    session_id: str,
    events: Sequence[Event],
    encoded: Sequence[Row],
    expected_last_seq: int,
    epoch: int | None,
    cached: Cached | None,
) -> tuple[list[Event], Cached | None]:
    """One append in the open transaction of ``io``: the events as stored, and what the
    store may keep for the session's next append (``cached`` itself if nothing was written).

    Raises :class:`~flowscope.errors.LeaseLost` (the fence) or
    :class:`~flowscope.errors.ConcurrencyConflict` (the expected seq) before it writes anything.
    The hot path of every store that uses it (once per node run): the steps are written out
    here rather than as a call each, and a session's next append folds on the
    ``WorkflowState`` its last one left (``cached``) rather than on a new one.
    """
    row = io.session(session_id)
    if row is None:
        last = 0
        if epoch is not None and epoch != 0:
            check_fence(session_id, row, epoch)  # raises
    else:
        last = row.last_seq
        if epoch is not None and row.epoch != epoch:
            check_fence(session_id, row, epoch)  # raises
    numbered = number_events(session_id, events, last, expected_last_seq)  # may raise: nothing written
    if not numbered:
        return numbered, cached
    if last == 0:  # a new session: every node run is one this append makes
        if (
            cached is not None
            and cached.session.last_seq == 0
            and cached.ws.last_seq == 0
            and not cached.ws.nodes
        ):
            ws, finished = cached.ws, cached.finished  # new_session()'s
        else:
            ws, finished = resumed_state(session_id, row, {}), set()
        complete = True
    elif (
        cached is not None
        and row is not None
        and cached.session.last_seq == last
        and cached.row_id == row.row_id
    ):
        ws, complete, finished = cached.ws, cached.complete, cached.finished  # nobody appended since
    else:
        nodes, complete = io.all_nodes(session_id)
        recall_jobs(io, session_id, nodes.values())
        finished = set()
        _let_go(nodes, finished, list(nodes))  # the runs read that had ended, at once
        ws = resumed_state(session_id, row, nodes)
    nodes = ws.nodes
    apply = ws.apply
    if complete and (not finished or finished.isdisjoint(e.path for e in numbered)):
        # the node runs an append writes: the paths it moves, once each, in order
        touched: dict[str, None] = {}
        for e in numbered:
            apply(e)  # the one definition of what an event means (flowscope.fold)
            if e.path and type(e) is not UnknownEvent:
                touched[e.path] = None
        paths: Iterable[str] = touched
    else:  # node states to read first: the session's runs not at hand (or let go, below)
        paths = touched_paths(numbered)
        missing = [p for p in paths if p not in nodes and (not complete or p in finished)]
        if missing:
            for ns in io.nodes(session_id, missing):
                nodes[ns.path] = ns
            recall_jobs(io, session_id, (nodes[p] for p in missing if p in nodes))
            finished.difference_update(missing)
        for e in numbered:
            apply(e)
    workflow = ws.workflow
    io.insert_events(event_params(session_id, numbered, encoded))
    io.upsert_nodes([node_params(session_id, workflow, nodes[p]) for p in paths if p in nodes])
    if last != 0 and row is not None and workflow != row.workflow:
        io.rename_workflow(session_id, workflow)
    written = session_write(ws, numbered, row)
    row_id = io.write_session(written)
    _let_go(nodes, finished, paths)
    if cached is not None and cached.ws is ws:  # the same state, moved on: the same record
        cached.session, cached.row_id, cached.complete, cached.finished = written, row_id, complete, finished
        return numbered, cached
    return numbered, Cached(written, row_id, complete, ws, finished)


def recall_jobs(io: AppendIO, session_id: str, states: Iterable[NodeState]) -> None:
    """Give the states read from their rows that wait on a job with a deadline their jobs
    from the log (a row keeps the first deadline, not the jobs): rare, a read of a run's
    job events only when it has a deadline, and never on a node step's append."""
    unknown = {ns.path: ns for ns in states if ns.jobs_unknown}
    if not unknown:
        return
    by_path: dict[str, list[JobDispatched | JobResultReceived]] = {}
    for e in io.job_events(session_id, list(unknown)):
        if isinstance(e, (JobDispatched, JobResultReceived)):  # an unknown event type says nothing of a job
            by_path.setdefault(e.path, []).append(e)
    for path, ns in unknown.items():
        ns.recall_jobs(by_path.get(path, ()))


def _let_go(nodes: dict[str, NodeState], finished: set[str], paths: Iterable[str]) -> None:
    """Let go of the states of the runs at ``paths`` that ended (into ``finished``: read back
    if touched again), so that a session's cached state keeps its open runs only."""
    for p in paths:
        state = nodes.get(p)
        if state is not None and state.status in _ENDED:
            del nodes[p]
            finished.add(p)


def take_in_steps(
    io: AppendIO,
    session_id: str,
    events: Sequence[Event],
    encoded: Sequence[Row],
    expected_last_seq: int,
    message_ids: Collection[int],
    epoch: int,
    cached: Cached | None,
) -> tuple[list[Event], Cached | None]:
    """:meth:`~flowscope.store.base.EventStore.take_in` in the open transaction of ``io``:
    the append (:func:`append_steps`; with no events, the fence alone: it holds for the
    deletion too), then the messages deleted."""
    if events:
        numbered, cached = append_steps(io, session_id, events, encoded, expected_last_seq, epoch, cached)
    else:
        check_fence(session_id, io.session(session_id), epoch)
        numbered = []
    io.drop_messages(session_id, sorted(message_ids))
    return numbered, cached
