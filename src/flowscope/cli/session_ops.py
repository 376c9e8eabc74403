"""What ``flowscope cancel`` and ``flowscope prune`` do to a store, apart from printing.

:func:`live_owner` is the one place the CLI asks "is a process still running this
session?" (cancel refuses then, unless forced). It applies the rule ``resume()`` applies
today (:func:`flowscope.liveness.resume_lease_s` over the session's last write and its
runs' heartbeats); an ownership lease can replace it here alone.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass
from typing import Iterable

from ..events import Event, NodeCancelled, RunFinished, RunStarted
from ..fold import WorkflowState
from ..liveness import DEFAULT_HEARTBEAT_INTERVAL_S, resume_lease_s
from ..store.base import FINISHED_SESSION_STATUSES, EventStore, SessionInfo

__all__ = ["CANCEL_REASON", "live_owner", "cancel_events", "PruneCandidate", "prune_candidates"]

#: The ``NodeCancelled.reason`` of a run ended by ``flowscope cancel`` without ``--reason``.
CANCEL_REASON = "cancelled by an operator (flowscope cancel)"


def live_owner(store: EventStore, ws: WorkflowState, now: float | None = None) -> float | None:
    """Seconds since the session's last sign of life if a process may still be running it
    (within the resume lease of the default heartbeat interval), else None."""
    if ws.status != "running":
        return None
    now = time.time() if now is None else now
    beats = [r.heartbeat_at for r in store.node_runs(ws.session_id) if r.status == "running" and r.heartbeat_at]
    last = max([ws.updated_at or 0.0, *beats])
    age = now - last
    return age if age < resume_lease_s(DEFAULT_HEARTBEAT_INTERVAL_S) else None


def cancel_events(ws: WorkflowState, reason: str, now: float | None = None) -> list[Event]:
    """The events that end ``ws`` for good: an invocation of its own that records a
    ``NodeCancelled`` for every open run (innermost first) and ``RunFinished(cancelled)``."""
    now = time.time() if now is None else now
    inv = uuid.uuid4().hex
    sid = ws.session_id
    out: list[Event] = [RunStarted(session_id=sid, invocation_id=inv, ts=now, workflow=ws.workflow, resumed=True)]
    open_runs = sorted((ns for ns in ws.nodes.values() if ns.is_open), key=lambda ns: -ns.path.count("/"))
    for ns in open_runs:
        out.append(NodeCancelled(session_id=sid, invocation_id=inv, ts=now, path=ns.path, node=ns.node, reason=reason))
    out.append(RunFinished(session_id=sid, invocation_id=inv, ts=now, status="cancelled"))
    return out


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
    ``older_than_s`` ago that have no open run, oldest first."""
    now = time.time() if now is None else now
    wanted = set(statuses) if statuses else set(FINISHED_SESSION_STATUSES)
    with_open = {r.session_id for r in store.open_runs()}

    def old(s: SessionInfo) -> bool:
        return s.updated_at is not None and now - s.updated_at >= older_than_s

    out = [
        PruneCandidate(s.session_id, s.workflow, s.status, s.updated_at, s.last_seq)
        for s in store.sessions()
        if s.status in wanted and s.status in FINISHED_SESSION_STATUSES and old(s) and s.session_id not in with_open
    ]
    out.sort(key=lambda c: c.updated_at or 0.0)
    return out
