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
from dataclasses import dataclass, replace
from typing import Any

from .engine.inbox import CANCEL_REASON, RETRY_REASON, retried_since, take_in
from .engine.pauses import FINISHED, check_own_engine
from .engine.submit import check_store
from .errors import ConcurrencyConflict, ResumeError, UnknownSessionError, redact_message
from .events import Event, InputReceived, JobResultReceived, NodeCancelled, RunFinished, RunSubmitted
from .fold import WorkflowState, rebuild
from .jsontext import lone_surrogate
from .liveness import DEFAULT_HEARTBEAT_INTERVAL_S, resume_lease_s
from .ownership import Owner, this_host, this_process
from .store.base import EventStore

__all__ = ["ActionReceipt", "deliver", "earlier_answer", "load", "retry", "cancel", "operator", "MAX_REASON"]

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


#: How long a sender waits out another sender's moment (a busy store's lock wait).
SENDER_WAIT_S = 5.0


def deliver(store: EventStore, ws: WorkflowState, kind: str, body: Mapping[str, Any]) -> ActionReceipt:
    """Send a ``kind`` message to the session's inbox, then take the inbox in at once if no
    live owner holds the session (through the fence: acquire, append, release).

    Raises :class:`~flowscope.errors.ResumeError` when the message was taken in (by this
    call or another sender's at the same moment) and dropped: another request had already
    done what it asks (answered the same input, cancelled or queued the session). It is
    then not on record, and "done" would be untrue."""
    sid = ws.session_id
    was, seen = ws.status, ws.last_seq
    sent = store.send(sid, kind, body)
    me = replace(this_process(), sender=True)  # a holder for a moment, not the session's owner
    give_up = time.monotonic() + SENDER_WAIT_S
    holder: Owner | None = None  # the live owner that takes the message in
    while True:
        try:
            lease = store.acquire(sid, me, resume_lease_s(DEFAULT_HEARTBEAT_INTERVAL_S))
            break
        except ConcurrencyConflict:
            lease = None
            if not any(m.message_id == sent.message_id for m in store.inbox(sid)):
                break  # another sender took it in meanwhile: checked below
            info = store.session_info(sid)
            owner = info.owner if info is not None else None
            if owner is None or not owner.sender or time.monotonic() >= give_up:
                holder = owner or this_process()
                break
            time.sleep(0.01)  # another sender's moment
    if holder is not None:  # it takes the message in, unless it is bound to drop it: said now
        _check_pending(store, ws, kind, body, sent.message_id)
        return ActionReceipt(sid, ws.workflow, kind, ws.last_seq, holder, was)
    if lease is not None:
        try:
            if store.last_seq(sid) != ws.last_seq:
                ws = rebuild(store.read(sid))
            take_in(store, ws, lease)
        finally:
            store.release(lease)
    after = store.read(sid, seen)
    _check_recorded(ws, after, kind, body)
    last = after[-1].seq if after else seen
    return ActionReceipt(sid, ws.workflow, kind, last, None, was)


def _check_recorded(ws: WorkflowState, after: list[Event], kind: str, body: Mapping[str, Any]) -> None:
    """Raise unless the log's events ``after`` what the operator saw record this message:
    messages taken in together all are; one that arrives after another request did the
    same is dropped (the first answer counts, a session is cancelled or queued once)."""
    sid = ws.session_id
    if kind == "retry":
        reason = str(body["reason"])
        if not any(
            isinstance(e, RunSubmitted) and e.reason is not None and reason in e.reason for e in after
        ):
            raise ResumeError(
                f"session {sid!r} was queued to run again by another request at the same moment; "
                "yours was not needed, and is not recorded (flowscope events shows who asked)"
            )
    elif kind == "cancel":
        reason = str(body["reason"])
        ended = {e.invocation_id for e in after if isinstance(e, RunFinished) and e.final}
        reasons = [e.reason for e in after if isinstance(e, NodeCancelled) and e.invocation_id in ended]
        if not ended or (reasons and not any(reason in r for r in reasons)):
            over = [e.status for e in after if isinstance(e, RunFinished)]
            if over and over[-1] != "cancelled":  # it ended by itself meanwhile
                raise ResumeError(
                    f"session {sid!r} {over[-1]} meanwhile; there was nothing left to cancel, "
                    "and yours is not recorded"
                )
            raise ResumeError(
                f"session {sid!r} was cancelled by another request at the same moment; "
                "yours is not recorded (flowscope events shows who asked)"
            )
    elif kind == "answer":
        for what, key in _not_recorded(after, body):
            raise _answered_by_another(sid, what, key)


def _check_pending(
    store: EventStore, ws: WorkflowState, kind: str, body: Mapping[str, Any], message_id: int
) -> None:
    """Raise when the live owner that takes this message in is bound to drop it, by the rule
    of :func:`_check_recorded` applied to what is decided already: an answer to a request
    that an earlier answer in the inbox answers, or that the log recorded another answer to
    since the operator looked (``ws``); a cancel of a session that is over by now (a finished
    session's cancel is dropped); a retry of a session the log shows queued again since the
    operator looked (:func:`~flowscope.engine.inbox.retry_dropped`: the session it saw is
    gone). A message taken in meanwhile is checked as :func:`_check_recorded` does."""
    sid = ws.session_id
    if kind == "answer":
        first = earlier_answer(store, sid, body, message_id)
        if first is not None:
            raise ResumeError(
                f"session {sid!r}: {first[0]} {first[1]!r} was answered by another request at the "
                "same moment; its owner takes that answer in, and drops yours (flowscope events shows it then)"
            )
        for what, key in _answered_otherwise(store.read(sid, ws.last_seq), body):
            raise _answered_by_another(sid, what, key)
    elif kind == "cancel":
        events = store.read(sid)
        now = rebuild(events)
        if now.status in FINISHED and not any(ns.is_open for ns in now.nodes.values()):  # as intake_events
            _check_recorded(now, [e for e in events if e.seq > ws.last_seq], kind, body)
    elif kind == "retry" and retried_since(store.read(sid, ws.last_seq)):
        if any(m.message_id == message_id for m in store.inbox(sid)):  # read after the log: it drops it
            raise ResumeError(
                f"session {sid!r} was retried by another request at the same moment; its owner "
                "drops yours, and it is not recorded (flowscope events shows who asked)"
            )
        _check_recorded(ws, store.read(sid, ws.last_seq), kind, body)  # taken in meanwhile


def _answered_by_another(sid: str, what: str, key: str) -> ResumeError:
    return ResumeError(
        f"session {sid!r}: {what} {key!r} was answered by another request at the same moment; "
        "yours is not recorded (flowscope events shows the answer recorded)"
    )


def _requests(body: Mapping[str, Any]) -> list[tuple[str, str]]:
    """The requests an answer's ``body`` answers: ``("input", interrupt id)``, ``("job", job id)``."""
    return [("input", i) for i in body.get("inputs") or {}] + [("job", j) for j in body.get("jobs") or {}]


def _given(after: list[Event], body: Mapping[str, Any]) -> dict[tuple[str, str], bool]:
    """The inputs and jobs of an answer's ``body`` that an event ``after`` records as given,
    each with whether it records this body's value (else another answer's)."""
    given = {("input", e.interrupt_id): e.value for e in after if isinstance(e, InputReceived)}
    given |= {("job", e.job_id): e.data for e in after if isinstance(e, JobResultReceived)}
    inputs, jobs = body.get("inputs") or {}, body.get("jobs") or {}
    # a job's result is told apart by its data (the rest of it is how the guard read it)
    sent = {("input", i): v for i, v in inputs.items()}
    sent |= {("job", j): r.get("data") if isinstance(r, Mapping) else None for j, r in jobs.items()}
    return {k: given[k] == sent[k] for k in _requests(body) if k in given}


def _not_recorded(after: list[Event], body: Mapping[str, Any]) -> list[tuple[str, str]]:
    """The inputs and jobs of an answer's ``body`` that no event ``after`` records as given."""
    given = _given(after, body)
    return [k for k in _requests(body) if not given.get(k, False)]


def _answered_otherwise(after: list[Event], body: Mapping[str, Any]) -> list[tuple[str, str]]:
    """The inputs and jobs of an answer's ``body`` that an event ``after`` records another
    answer to: the log keeps the first, so an owner taking this one in drops them."""
    return [k for k, mine in _given(after, body).items() if not mine]


def earlier_answer(
    store: EventStore, sid: str, body: Mapping[str, Any], before: int | None = None
) -> tuple[str, str] | None:
    """The first request of an answer's ``body`` that another answer, still in the inbox
    (sent before message ``before``), already answers: its owner takes that one in and
    drops this one."""
    wanted = _requests(body)
    for msg in store.inbox(sid):
        if msg.kind != "answer" or (before is not None and msg.message_id >= before):
            continue
        earlier = set(_requests(msg.body))
        for request in wanted:
            if request in earlier:
                return request
    return None


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
    # seen: the log as these checks read it; its owner drops the retry if another one
    # queued the session again since (engine.inbox.retry_dropped)
    return deliver(store, ws, "retry", {"from_path": path, "reason": text, "seen": ws.last_seq})


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
