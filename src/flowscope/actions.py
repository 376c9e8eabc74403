"""Operator actions through the store: retry and cancel a session without its code.

One writer per session: an action is a message to the session's inbox
(:meth:`~flowscope.store.base.EventStore.send`), durable when the call returns.
:func:`deliver` then takes the session for a moment and takes its inbox in when no live
owner holds it; otherwise the owner takes it in (a cancel within one lease renewal, the
rest when its invocation ends), or the next owner when it takes the session. The CLI
(``flowscope retry``, ``flowscope cancel``) and the console call these functions.
"""

from __future__ import annotations

import getpass
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from .engine.inbox import CANCEL_REASON, RETRY_REASON, take_in
from .engine.pauses import FINISHED, check_own_engine
from .engine.submit import check_store
from .errors import ConcurrencyConflict, ResumeError, UnknownSessionError, redact_message
from .events import RunSubmitted
from .fold import WorkflowState, rebuild
from .jsontext import lone_surrogate
from .liveness import DEFAULT_HEARTBEAT_INTERVAL_S, resume_lease_s
from .ownership import Owner, this_host, this_process
from .store.base import EventStore

__all__ = ["ActionReceipt", "deliver", "load", "retry", "cancel", "operator", "MAX_REASON"]

#: Longest reason kept (the rest is cut): it is recorded on every run it touches.
MAX_REASON = 500


@dataclass(frozen=True, slots=True)
class ActionReceipt:
    """What an action did: ``owner`` is None when it is in the log already (``last_seq``
    is the log's after it); otherwise the live owner that takes it in."""

    session_id: str
    workflow: str
    kind: str
    last_seq: int
    owner: Owner | None = None
    #: The session's status before the action (``retry``: what was retried).
    was: str = ""

    @property
    def pending(self) -> bool:
        """The action waits in the inbox for the session's live owner."""
        return self.owner is not None


def operator() -> str:
    """Who asks, for the log: ``user@host``."""
    try:
        user = getpass.getuser()
    except Exception:  # no user name in this container: the host still says where
        user = "unknown"
    return f"{user}@{this_host()}"


def load(store: EventStore, session_id: str) -> WorkflowState:
    """The state of a session an operator may act on: :class:`~flowscope.errors.UnknownSessionError`
    for an unknown one, :class:`~flowscope.errors.OtherEngineError` for one another engine
    runs (a bridge records it: the action would reach the log, never that engine)."""
    if not callable(getattr(store, "read", None)):  # a path given for the store, a store left out
        check_store(store, "the store argument")
    events = store.read(session_id)
    if not events:
        raise UnknownSessionError(
            f"no session {session_id!r} in the store: check the id (flowscope runs lists them)"
        )
    ws = rebuild(events)
    check_own_engine(ws)
    return ws


def deliver(store: EventStore, ws: WorkflowState, kind: str, body: Mapping[str, Any]) -> ActionReceipt:
    """Send a ``kind`` message to the session's inbox, then take the inbox in at once if no
    live owner holds the session (through the fence: acquire, append, release)."""
    sid = ws.session_id
    was, seen = ws.status, ws.last_seq
    store.send(sid, kind, body)
    try:
        lease = store.acquire(sid, this_process(), resume_lease_s(DEFAULT_HEARTBEAT_INTERVAL_S))
    except ConcurrencyConflict:  # a live owner: it takes the message in
        info = store.session_info(sid)
        owner = info.owner if info is not None and info.owner is not None else this_process()
        return ActionReceipt(sid, ws.workflow, kind, ws.last_seq, owner, was)
    try:
        if store.last_seq(sid) != ws.last_seq:
            ws = rebuild(store.read(sid))
        take_in(store, ws, lease)
    finally:
        store.release(lease)
    if kind == "retry":
        _check_queued(store, ws, seen, str(body["reason"]))
    return ActionReceipt(sid, ws.workflow, kind, ws.last_seq, None, was)


def _check_queued(store: EventStore, ws: WorkflowState, seen: int, reason: str) -> None:
    """A retry sent at the same moment as another operator's is taken in with it (their
    reasons merged), by either of them; but one that arrives after the other queued the
    session is dropped, the session no longer failed. Say so rather than "queued"."""
    for e in store.read(ws.session_id, seen):
        if isinstance(e, RunSubmitted) and e.reason is not None and reason in e.reason:
            return
    raise ResumeError(
        f"session {ws.session_id!r} was queued to run again by another request at the same moment; "
        "yours was not needed, and is not recorded (flowscope events shows who asked)"
    )


def _reason(reason: str | None, default: str) -> str:
    if reason is not None and not isinstance(reason, str):
        raise TypeError(f"reason must be a str, not {type(reason).__name__}")
    if reason is not None and lone_surrogate(reason) is not None:  # no store or page can hold it
        raise ValueError("the reason holds an undecodable byte (a lone surrogate): give it as UTF-8 text")
    # recorded on every run it touches and printed by the CLI: the default redaction, as a message's
    text = redact_message(" ".join((reason or "").split())) or default
    return text[:MAX_REASON]


def _path(ws: WorkflowState, from_path: str) -> str:
    """``from_path`` as a path of the session: a path, or a node name that has one run."""
    if from_path in ws.nodes:
        return from_path
    named = sorted(p for p, ns in ws.nodes.items() if ns.node == from_path)
    if len(named) == 1:
        return named[0]
    if named:
        raise ResumeError(
            f"node {from_path!r} ran at {len(named)} paths in session {ws.session_id!r}: give one of {', '.join(named[:5])}"
        )
    raise ResumeError(
        f"session {ws.session_id!r} has no run at {from_path!r}: give a path that `flowscope show` lists"
    )


def retry(
    store: EventStore, session_id: str, from_path: str | None = None, reason: str | None = None
) -> ActionReceipt:
    """Run a failed session again, or, from ``from_path``, a finished one (failed or
    completed): finished runs before the path are kept, the path and what follows it run
    again as new attempts (numbers continue). The session is queued for a worker of its
    workflow, and the log says who asked and why (``reason``).

    Raises :class:`~flowscope.errors.UnknownSessionError` for an unknown session and
    :class:`~flowscope.errors.ResumeError` for one that is not failed (or completed, with
    a path), or a path it has no run at; nothing is sent then.
    """
    ws = load(store, session_id)
    path = _path(ws, from_path) if from_path is not None else None
    if ws.status == "completed" and path is None:
        raise ResumeError(
            f"session {session_id!r} completed; give a path to run it again from (retry --from PATH)"
        )
    if ws.final:
        raise ResumeError(f"session {session_id!r} was cancelled by an operator; it is over for good")
    if ws.status not in ("failed", "completed"):
        raise ResumeError(
            f"session {session_id!r} is {ws.status}, not failed: retry runs a failed session again; "
            "resume or cancel this one"
        )
    where = f" from {path}" if path else ""
    text = f"{_reason(reason, RETRY_REASON)} (retry{where}, asked by {operator()})"
    return deliver(store, ws, "retry", {"from_path": path, "reason": text})


def cancel(store: EventStore, session_id: str, reason: str | None = None) -> ActionReceipt:
    """End a session for good: its open runs are cancelled (never failed) and it ends
    cancelled. A session a live owner runs is stopped by that owner within one renewal of
    its lease (``lease_s / 3``); any other at once.

    Raises :class:`~flowscope.errors.UnknownSessionError` for an unknown session and
    :class:`~flowscope.errors.ResumeError` for one that is already over.
    """
    ws = load(store, session_id)
    if ws.status in FINISHED:
        raise ResumeError(f"session {session_id!r} is already {ws.status}; there is nothing to cancel")
    text = f"{_reason(reason, CANCEL_REASON)} (asked by {operator()})"
    return deliver(store, ws, "cancel", {"reason": text, "sent_at": time.time()})
