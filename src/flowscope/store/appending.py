"""An append's steps, written once for the SQL stores: the fence, the numbering, the fold of
the events into the session's node states, and the rows that record them.

SQLite and PostgreSQL differ in how they read and write those rows (their SQL, their
locks, SQLite's group commit collecting rows for one statement per table), not in what an
append is: each hands :func:`append_steps` and :func:`take_in_steps` an :class:`AppendIO`
over its open transaction. Pure Python: no database driver is imported here.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from ..events import Event, RunSubmitted, UnknownEvent
from ..fold import NodeState, WorkflowState
from ..ownership import Owner
from ..states import SessionStatus
from .base import AppendBatch, lease_lost, number_events
from .codec import Row

__all__ = [
    "AppendIO",
    "Cached",
    "OwnerColumn",
    "PreparedBatch",
    "SessionRow",
    "SessionWrite",
    "CLAIMABLE",
    "append_steps",
    "check_fence",
    "event_params",
    "make_session_row",
    "node_params",
    "owner_from_column",
    "prepare_batches",
    "resumed_state",
    "session_write",
    "submitted_at",
    "take_in_steps",
    "touched_paths",
]

#: The ``owner`` column as a driver reads it: JSON text (SQLite), a dict (PostgreSQL's jsonb), or NULL.
OwnerColumn = str | Mapping[str, Any] | None
#: Statuses a worker claims a session in: an append that brings a session to one may wake the workers.
CLAIMABLE = ("queued", "answered")


def owner_from_column(data: OwnerColumn) -> Owner | None:
    """The ``owner`` column as an :class:`~flowscope.ownership.Owner` (None if NULL or empty)."""
    if not data:
        return None
    return Owner.from_dict(json.loads(data) if isinstance(data, str) else data)


@dataclass(frozen=True, slots=True)
class SessionRow:
    """A session's row as an append reads it, before it writes: the fold's columns and the fence.

    A row that :meth:`~flowscope.store.base.EventStore.acquire` made before the first event
    has ``last_seq`` 0, an empty workflow and the status ``new``.
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


@dataclass(frozen=True, slots=True)
class SessionWrite:
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


@dataclass(frozen=True, slots=True)
class Cached:
    """A session as this store object's last append there left it: its next append folds on
    these node states instead of reading them back, while nobody else appended."""

    session: SessionWrite
    #: :attr:`SessionRow.row_id` of the row written.
    row_id: int
    #: ``nodes`` holds every node run of the session (else only some: look up the others).
    complete: bool
    #: The fold's node states, moved on in place by the next append.
    nodes: dict[str, NodeState]


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


def _builder(cls: type[Any]) -> Callable[..., Any]:
    """A positional constructor of the frozen, slotted dataclass ``cls`` that sets each slot
    through its descriptor, as :mod:`.codec` builds events: the dataclass's ``__init__``
    (one ``object.__setattr__`` per field) costs 2.5x as much (measured: 0.9 against 2.3 µs
    for 9 fields), and every append makes three of these records."""
    names = [f.name for f in dataclasses.fields(cls)]
    scope: dict[str, Any] = {"new": object.__new__, "cls": cls}
    body = ["o = new(cls)"]
    for name in names:
        scope[f"set_{name}"] = cls.__dict__[name].__set__
        body.append(f"set_{name}(o, {name})")
    source = (
        f"def build({', '.join(names)}):\n" + "".join(f"    {line}\n" for line in body) + "    return o\n"
    )
    exec(source, scope)  # noqa: S102 - generated from dataclass field names only, no input
    build: Callable[..., Any] = scope["build"]
    return build


#: ``SessionRow(...)`` with every field given, in order, for an adapter's hot path.
make_session_row: Callable[
    [str, SessionStatus, float | None, float | None, int, int, int, OwnerColumn, int], SessionRow
] = _builder(SessionRow)
_make_session_write: Callable[
    [str, str, SessionStatus, float | None, float | None, int, int, float | None, bool, bool], SessionWrite
] = _builder(SessionWrite)
_make_cached: Callable[[SessionWrite, int, bool, dict[str, NodeState]], Cached] = _builder(Cached)


class AppendIO(Protocol):
    """What an append reads and writes in a store's open transaction, in the store's SQL."""

    def session(self, session_id: str) -> SessionRow | None:
        """The session's row (locked until the commit where the store locks rows), None if none."""

    def all_nodes(self, session_id: str) -> tuple[dict[str, NodeState], bool]:
        """Node states to fold on when none are cached, and whether they are all the session's."""

    def nodes(self, session_id: str, paths: list[str]) -> Iterable[NodeState]:
        """The stored states of the runs at ``paths`` (those that exist)."""

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


def node_params(session_id: str, workflow: str, ns: NodeState) -> tuple[Any, ...]:
    """The parameters of a node-runs upsert: session, workflow, then
    :data:`~flowscope.store.projection_sql.NODE_STATE_COLUMNS`."""
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
    return _make_session_write(
        ws.session_id,
        ws.workflow,
        status,
        ws.started_at,
        ws.updated_at,
        ws.last_seq,
        ws.invocations,
        submitted_at(numbered),
        same,
        woke,
    )


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
    """
    row = io.session(session_id)
    check_fence(session_id, row, epoch)
    last = row.last_seq if row is not None else 0
    numbered = number_events(session_id, events, last, expected_last_seq)  # may raise: nothing written
    if not numbered:
        return numbered, cached
    if last == 0:  # a new session: every node run is one this append makes
        nodes: dict[str, NodeState] = {}
        complete = True
    elif (
        cached is not None
        and row is not None
        and cached.session.last_seq == last
        and cached.row_id == row.row_id
    ):
        nodes, complete = cached.nodes, cached.complete  # nobody appended since this store did
    else:
        nodes, complete = io.all_nodes(session_id)
    ws = resumed_state(session_id, row, nodes)
    paths = touched_paths(numbered)
    missing = [] if complete else [p for p in paths if p not in nodes]
    if missing:
        for ns in io.nodes(session_id, missing):
            nodes[ns.path] = ns
    apply = ws.apply
    for e in numbered:
        apply(e)  # the one definition of what an event means (flowscope.fold)
    nodes = ws.nodes
    workflow = ws.workflow
    io.insert_events(event_params(session_id, numbered, encoded))
    io.upsert_nodes([node_params(session_id, workflow, nodes[p]) for p in paths if p in nodes])
    if last != 0 and row is not None and workflow != row.workflow:
        io.rename_workflow(session_id, workflow)
    written = session_write(ws, numbered, row)
    row_id = io.write_session(written)
    return numbered, _make_cached(written, row_id, complete, nodes)


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
