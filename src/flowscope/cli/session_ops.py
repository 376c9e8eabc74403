"""What ``flowscope cancel`` and ``flowscope prune`` do to a store, apart from printing.

:func:`live_owner` is the one place the CLI asks "is a process still running this
session?": the ownership rule ``resume()`` applies (the session's recorded owner and
lease, :func:`flowscope.liveness.owner_alive`), so cancel refuses exactly the sessions a
resume would refuse. :func:`cancel_session` appends the cancel through the fence.
:class:`DryRunStore` is what ``--dry-run`` hands an action instead of the store: the
action runs its own checks, and stops at its first write.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, cast

from ..engine.inbox import CANCEL_REASON, cancel_events, take_in
from ..engine.pauses import check_own_engine
from ..errors import ConcurrencyConflict
from ..events import Event
from ..fold import WorkflowState, rebuild
from ..liveness import DEFAULT_HEARTBEAT_INTERVAL_S, owner_alive, resume_lease_s
from ..ownership import this_process
from ..store.base import FINISHED_SESSION_STATUSES, EventStore, SessionInfo, SessionQuery, owned_elsewhere

__all__ = [
    "CANCEL_REASON",
    "SessionOwned",
    "SessionFinished",
    "live_owner",
    "cancel_events",
    "cancel_session",
    "PruneCandidate",
    "prune_candidates",
    "SELECTABLE_STATES",
    "select_sessions",
    "WouldAct",
    "DryRunStore",
    "check_run_here",
]


class SessionOwned(Exception):
    """A live owner holds the session: cancel refuses it without ``force``. The message is
    the store's (:func:`flowscope.store.base.owned_elsewhere`: host, pid and lease age)."""


class SessionFinished(Exception):
    """The session is already over (its status is in ``FINISHED_SESSION_STATUSES``)."""

    def __init__(self, session_id: str, status: str) -> None:
        super().__init__(f"session {session_id!r} is already {status}; there is nothing to cancel")
        self.status = status


def live_owner(store: EventStore, session_id: str, now: float | None = None) -> SessionInfo | None:
    """The session as the store lists it if a live owner holds its lease
    (:func:`~flowscope.liveness.owner_alive`), else None (no owner, released, expired, or
    its process is gone)."""
    info = store.session_info(session_id)
    if info is None:
        return None
    now = time.time() if now is None else now
    return info if owner_alive(info.owner, info.lease_expires_at, now) else None


def cancel_session(
    store: EventStore, ws: WorkflowState, reason: str, *, force: bool = False
) -> tuple[WorkflowState, list[Event]]:
    """End the session for good, through the inbox and the fence: send a cancel, take the
    session (refused with :class:`SessionOwned` while a live owner holds it, unless
    ``force``), take the inbox in under the new epoch (:func:`cancel_events`, with every
    message it holds), release. Returns the state it cancelled (folded again if the
    session moved meanwhile) and the events appended.

    Taking the session first advances its epoch, so an owner thought dead that wakes up
    appends nothing more (``LeaseLost``); the append itself is checked against that epoch.
    """
    sid = ws.session_id
    check_own_engine(ws)
    if ws.status in FINISHED_SESSION_STATUSES:
        raise SessionFinished(sid, ws.status)
    try:
        lease = store.acquire(sid, this_process(), resume_lease_s(DEFAULT_HEARTBEAT_INTERVAL_S), force=force)
    except ConcurrencyConflict as exc:
        raise SessionOwned(str(exc)) from None
    try:
        if store.last_seq(sid) != ws.last_seq:  # the owner appended before we took it
            ws = rebuild(store.read(sid))
            if ws.status in FINISHED_SESSION_STATUSES:
                raise SessionFinished(sid, ws.status)
        before = dataclasses.replace(ws)  # its status and workflow as they were (take_in folds into ws)
        store.send(sid, "cancel", {"reason": reason})
        events = take_in(store, ws, lease)
    finally:
        store.release(lease)
    return before, events


@dataclass(frozen=True, slots=True)
class PruneCandidate:
    """A finished session old enough to delete."""

    session_id: str
    workflow: str
    status: str
    updated_at: float | None
    events: int


def prune_candidates(
    store: EventStore, older_than_s: float, statuses: Iterable[str] | None = None, now: float | None = None
) -> list[PruneCandidate]:
    """Finished sessions (``statuses``, default all finished ones) last updated more than
    ``older_than_s`` ago that have no open run and no live owner (the store's prune guard:
    ``--dry-run`` lists what it would delete), oldest first."""
    now = time.time() if now is None else now
    wanted = frozenset(statuses or FINISHED_SESSION_STATUSES) & frozenset(FINISHED_SESSION_STATUSES)
    with_open = {r.session_id for r in store.open_runs()}
    old = store.find_sessions(SessionQuery(statuses=wanted, updated_until=now - older_than_s))
    out = [
        PruneCandidate(s.session_id, s.workflow, s.status, s.updated_at, s.last_seq)
        for s in old
        if s.session_id not in with_open and not owner_alive(s.owner, s.lease_expires_at, now)
    ]
    out.sort(key=lambda c: c.updated_at or 0.0)
    return out


#: What ``--state`` of a bulk action may name: a session status, or ``orphaned`` (running,
#: its owner gone by the liveness rule).
SELECTABLE_STATES = (
    "queued",
    "running",
    "orphaned",
    "paused",
    "answered",
    "failed",
    "completed",
    "cancelled",
)


def select_sessions(
    store: EventStore,
    *,
    workflow: str | None = None,
    state: str | None = None,
    older_than_s: float | None = None,
    now: float | None = None,
) -> list[SessionInfo]:
    """The sessions a bulk action acts on: of ``workflow``, in ``state``, last updated at
    least ``older_than_s`` ago (each filter only when given), oldest first."""
    now = time.time() if now is None else now

    status = "running" if state == "orphaned" else state
    query = SessionQuery(
        statuses=frozenset({status}) if status is not None else None,
        workflow=workflow,
        updated_until=now - older_than_s if older_than_s is not None else None,
    )

    def wanted(s: SessionInfo) -> bool:
        if state == "orphaned":
            return s.owner is not None and not owner_alive(s.owner, s.lease_expires_at, now)
        if state == "running":
            return owner_alive(s.owner, s.lease_expires_at, now)
        return True

    out = [s for s in store.find_sessions(query) if wanted(s)]
    out.sort(key=lambda s: s.updated_at or 0.0)
    return out


class WouldAct(Exception):
    """A dry run's action got past every check it makes: it would act (write) now."""


class DryRunStore:
    """``store`` as a dry run hands it to an action (``retry``, ``cancel``, ``resume``): its
    reads go through, and anything else, a write first of all, raises :class:`WouldAct`
    before it happens. The action runs unchanged, so its dry run refuses exactly what the
    action refuses, with the action's own words (one copy of each rule), and says "would"
    only of what passed them all.

    Only the names in :data:`READS` are let through: a method added to the store later
    stops the dry run (an answer of "would act" too early) rather than write."""

    #: The store's read-only methods (and its ``path``, which hints name).
    READS = frozenset(
        {
            "path",
            "read",
            "last_seq",
            "sessions",
            "session_info",
            "has_session",
            "find_sessions",
            "status_counts",
            "node_runs",
            "open_runs",
            "find_node_runs",
            "inbox",
            "sessions_with_mail",
            "workers",
        }
    )

    def __init__(self, store: Any) -> None:
        self._store = store

    def __getattr__(self, name: str) -> Any:
        if name in self.READS:
            return getattr(self._store, name)
        raise WouldAct(name)


def check_run_here(store: Any, session_id: str, *, force: bool) -> None:
    """Before ``resume`` hands the session to a Runner in this process. A session a live
    owner holds is refused with the store's own refusal
    (:func:`~flowscope.store.base.owned_elsewhere`), unless ``force``: the Runner's first
    write, which takes the lease, would raise it too, but only after the command had said
    it was resuming. A dry run (:class:`DryRunStore`) stops here with :class:`WouldAct`:
    from here the Runner writes out of sight, in an event loop of its own, where WouldAct
    would read as the workflow's failure."""
    held = None if force else live_owner(cast(EventStore, store), session_id)
    if held is not None and held.owner is not None:
        raise owned_elsewhere(session_id, held.owner, held.lease_expires_at, None, time.time())
    if isinstance(store, DryRunStore):
        raise WouldAct("acquire")
