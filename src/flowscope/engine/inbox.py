"""Taking in a session's inbox: the messages others sent its owner, as events in its log.

One writer per session: only the owner appends to a live session's log. An answer given
while the session runs (an operator's ``flowscope resume --input``, a job's result) is
sent as a :class:`~flowscope.store.base.Message` instead; the owner takes it in when it
takes the session (a resume, a worker's claim) or when its invocation pauses, so a
running branch's appends never collide with it and nothing is thrown away.

Taking in is idempotent: each answer is checked against the session's state with the
rule ``resume()`` applies (:func:`~flowscope.engine.pauses.validate_answers`), so an
answer that was already recorded, or that another message gave first, is dropped, not
recorded twice. The operator's requests are messages too: a cancel (the owner of a live
run stops it at once, :class:`~flowscope.engine.runner.Runner` watches the inbox) and a
retry (a finished session queued again, the runs from a path reopened), applied only to
the session as its sender saw it (:func:`retry_dropped`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ..errors import ResumeError
from ..events import Event, NodeCancelled, RunFinished, RunStarted, RunSubmitted
from ..fold import WorkflowState
from ..ownership import Lease
from ..store.base import EventStore, Message
from .ids import new_id
from .pauses import FINISHED, Answer, recorded_result, validate_answers
from .record import json_value

__all__ = [
    "CANCEL_REASON",
    "RETRY_REASON",
    "RETRYABLE",
    "Intake",
    "RetryRequest",
    "MERGED_REASONS",
    "answer_events",
    "answer_body",
    "cancel_events",
    "merged_reasons",
    "retried_since",
    "retry_dropped",
    "retry_events",
    "reopened_paths",
    "read_inbox",
    "intake_events",
    "take_in",
]

log = logging.getLogger("flowscope.engine")

#: The ``NodeCancelled.reason`` of a cancel given no reason.
CANCEL_REASON = "cancelled by an operator (flowscope cancel)"
#: The reason recorded for a retry given none.
RETRY_REASON = "retried by an operator (flowscope retry)"
#: Session statuses a retry applies to: failed, or (from a path) completed.
RETRYABLE = ("failed", "completed")


def answer_body(inputs: Mapping[str, Any], jobs: Mapping[str, Any]) -> dict[str, Any]:
    """The body of an ``answer`` message: the values as the log will hold them, with a
    job's error text redacted before it is stored anywhere."""
    return {
        "inputs": {i: json_value(v, f"the input for {i!r}") for i, v in inputs.items()},
        "jobs": {j: recorded_result(j, r) for j, r in jobs.items()},
    }


def answer_events(ws: WorkflowState, answers: Iterable[Answer], now: float | None = None) -> list[Event]:
    """The events recording ``answers`` outside any invocation (``invocation_id``
    ``answer-...``), numbered after the session's last event."""
    now = time.time() if now is None else now
    invocation_id = f"answer-{new_id()}"
    seq = ws.last_seq
    out: list[Event] = []
    for a in answers:
        seq += 1
        sid = ws.session_id
        out.append(
            a.cls(
                session_id=sid,
                invocation_id=invocation_id,
                seq=seq,
                ts=now,
                path=a.path,
                node=a.node,
                **a.fields,
            )
        )
    return out


@dataclass(frozen=True, slots=True)
class RetryRequest:
    """A retry message read: the path to run again from (None: the failed runs), why, and
    ``seen``: the log's last seq its sender's checks read (None in a message sent before
    retries carried it: only the session's status counts then)."""

    from_path: str | None
    reason: str
    seen: int | None = None

    @classmethod
    def of(cls, body: Mapping[str, Any]) -> RetryRequest:
        """The request a retry message's ``body`` makes."""
        seen = body.get("seen")
        return cls(
            body.get("from_path"),
            str(body.get("reason") or RETRY_REASON),
            seen if isinstance(seen, int) and not isinstance(seen, bool) else None,
        )


@dataclass(frozen=True, slots=True)
class Intake:
    """What a session's inbox asks, read against its state: the answers that still apply,
    a cancel (the reasons of all, :func:`merged_reasons`), the retry requests in the order
    sent (:func:`intake_events` applies those :func:`retry_dropped` keeps), and the ids of
    every message read, taken in or dropped."""

    answers: tuple[Answer, ...] = ()
    cancel: str | None = None  # the reason
    retries: tuple[RetryRequest, ...] = ()
    ids: tuple[int, ...] = ()


def read_inbox(ws: WorkflowState, messages: Iterable[Message]) -> Intake:
    """Read ``messages`` against ``ws``: what they ask that still applies."""
    answers: list[Answer] = []
    ids: list[int] = []
    given: set[tuple[str, str]] = set()
    cancels: list[str] = []
    retries: list[RetryRequest] = []
    for msg in messages:
        ids.append(msg.message_id)
        body = msg.body
        if msg.kind == "cancel":
            cancels.append(str(body.get("reason") or CANCEL_REASON))
            continue
        if msg.kind == "retry":
            retries.append(RetryRequest.of(body))
            continue
        if msg.kind != "answer":
            log.warning(
                "session %s: dropped message %d of unknown kind %r", ws.session_id, msg.message_id, msg.kind
            )
            continue
        items = [("input", k, v) for k, v in (body.get("inputs") or {}).items()]
        items += [("job", k, v) for k, v in (body.get("jobs") or {}).items()]
        for what, key, value in items:
            if (what, key) in given:
                continue  # a second message answered the same request: the first counts
            try:
                found = validate_answers(
                    ws, {key: value} if what == "input" else {}, {key: value} if what == "job" else {}
                )
            except ResumeError as exc:  # already answered in the log, or no longer asked
                log.info(
                    "session %s: message %d: %s %r not taken in: %s",
                    ws.session_id,
                    msg.message_id,
                    what,
                    key,
                    exc,
                )
                continue
            given.add((what, key))
            answers.extend(found)
    cancel = merged_reasons(cancels) if cancels else None
    return Intake(tuple(answers), cancel, tuple(retries), tuple(ids))


#: How many requests of one kind taken in together the log names one by one.
MERGED_REASONS = 4


def merged_reasons(reasons: list[str]) -> str:
    """The reasons of the requests of one kind taken in together (operators who asked at
    the same moment): each of them, so that the log says who asked and why, not only the
    first; the same reason once; past :data:`MERGED_REASONS`, how many more."""
    unique = list(dict.fromkeys(reasons))
    text = "; also: ".join(unique[:MERGED_REASONS])
    if len(unique) > MERGED_REASONS:
        text += f"; and {len(unique) - MERGED_REASONS} more"
    return text


def cancel_events(ws: WorkflowState, reason: str, now: float | None = None) -> list[Event]:
    """The events that end ``ws`` for good: an invocation of its own that records a
    ``NodeCancelled`` for every open run (innermost first) and ``RunFinished(cancelled)``."""
    now = time.time() if now is None else now
    inv = new_id()
    sid = ws.session_id
    seq = ws.last_seq
    out: list[Event] = [
        RunStarted(session_id=sid, invocation_id=inv, seq=seq + 1, ts=now, workflow=ws.workflow, resumed=True)
    ]
    open_runs = sorted((ns for ns in ws.nodes.values() if ns.is_open), key=lambda ns: -ns.path.count("/"))
    for i, ns in enumerate(open_runs, start=seq + 2):
        out.append(
            NodeCancelled(
                session_id=sid, invocation_id=inv, seq=i, ts=now, path=ns.path, node=ns.node, reason=reason
            )
        )
    out.append(
        RunFinished(
            session_id=sid, invocation_id=inv, seq=seq + len(out) + 1, ts=now, status="cancelled", final=True
        )
    )
    return out


def reopened_paths(ws: WorkflowState, from_path: str | None) -> list[str]:
    """The finished runs a retry from ``from_path`` runs again: the path, what it contains,
    every run that started at or after it (what follows it in the log), and the runs that
    contain it; only completed ones (a failed run is run again anyway, with a fresh budget).
    Without a path, none: the failed runs and what they cut off run again."""
    if from_path is None:
        return []
    start = ws.nodes[from_path].started_at or 0.0
    prefix = from_path + "/"
    out = []
    for path, ns in ws.nodes.items():
        if ns.status != "completed":
            continue
        contains = from_path.startswith(path + "/")
        if path == from_path or path.startswith(prefix) or contains or (ns.started_at or 0.0) >= start:
            out.append(path)
    return sorted(out, key=lambda p: -p.count("/"))  # innermost first, as a cancel records them


def retry_events(
    ws: WorkflowState, from_path: str | None, reason: str, now: float | None = None
) -> list[Event]:
    """The events a retry records outside any invocation (``retry-...``): a
    ``NodeCancelled(reason)`` for every run it reopens, then a ``RunSubmitted`` that queues
    the session again for a worker, with who asked and why in its ``reason``."""
    now = time.time() if now is None else now
    inv = f"retry-{new_id()}"
    sid = ws.session_id
    seq = ws.last_seq
    out: list[Event] = []
    for path in reopened_paths(ws, from_path):
        seq += 1
        out.append(
            NodeCancelled(
                session_id=sid,
                invocation_id=inv,
                seq=seq,
                ts=now,
                path=path,
                node=ws.nodes[path].node,
                reason=reason,
            )
        )
    out.append(
        RunSubmitted(
            session_id=sid,
            invocation_id=inv,
            seq=seq + 1,
            ts=now,
            workflow=ws.workflow,
            input=ws.input,
            reason=reason,
        )
    )
    return out


def retried_since(after: Iterable[Event]) -> bool:
    """Whether the log's events ``after`` what a retry's sender saw queue the session again
    (a ``RunSubmitted``): another retry did, and the run it asked for is that one's, run or
    to run; the session it saw is gone."""
    return any(isinstance(e, RunSubmitted) for e in after)


def retry_dropped(ws: WorkflowState, retry: RetryRequest, after: Sequence[Event]) -> str | None:
    """Why an owner taking ``retry`` in, with the session at ``ws``, drops it (None: it
    applies): the log moved past what its sender saw by another retry (``after``: the log's
    events after at least ``retry.seen``), or the session is not one a retry applies to, a
    failed one or, with a path, a completed one (the checks of :func:`flowscope.retry`)."""
    if retry.seen is not None and retried_since(e for e in after if e.seq > retry.seen):
        return "another retry queued the session again since its sender looked"
    if ws.status not in RETRYABLE:
        return f"the session is {ws.status}"
    if ws.status == "completed" and retry.from_path is None:
        return "the session completed, and it gives no path to run it again from"
    if retry.from_path is not None and retry.from_path not in ws.nodes:  # a message not made by retry()
        return f"the session has no run at {retry.from_path!r}"
    return None


def intake_events(ws: WorkflowState, intake: Intake, after: Sequence[Event] = ()) -> list[Event]:
    """The events that record ``intake`` in ``ws``'s log: a cancel wins over everything;
    the retries :func:`retry_dropped` keeps (``after``: the log's events after the earliest
    retry's ``seen``) queue the session again, from the first one's path, with every one's
    reason; otherwise the answers. What is dropped is logged at INFO."""
    sid = ws.session_id
    if intake.cancel is not None:
        if ws.status not in FINISHED or any(ns.is_open for ns in ws.nodes.values()):
            if intake.retries:
                log.info("session %s: %d retry message(s) dropped: it is cancelled", sid, len(intake.retries))
            return cancel_events(ws, intake.cancel)
        if not ws.final:  # else the owner stopped it for this very message
            log.info("session %s: a cancel was dropped: the session %s first", sid, ws.status)
    applied: list[RetryRequest] = []
    for r in intake.retries:
        why = retry_dropped(ws, r, after)
        if why is None:
            applied.append(r)
        else:
            log.info("session %s: a retry was dropped: %s (%s)", sid, why, r.reason)
    if applied:
        return retry_events(ws, applied[0].from_path, merged_reasons([r.reason for r in applied]))
    return answer_events(ws, intake.answers)


def take_in(store: EventStore, ws: WorkflowState, lease: Lease) -> list[Event]:
    """Take the session's inbox in under ``lease``: append what its messages ask that still
    applies, delete the messages, in one transaction, and fold the events into ``ws``.
    Returns them."""
    messages = store.inbox(ws.session_id)
    if not messages:
        return []
    intake = read_inbox(ws, messages)
    seen = [r.seen for r in intake.retries if r.seen is not None and r.seen < ws.last_seq]
    after = store.read(ws.session_id, min(seen)) if seen else []  # what their senders did not see
    events = intake_events(ws, intake, after)
    stored = store.take_in(ws.session_id, events, ws.last_seq, intake.ids, epoch=lease.epoch)
    for e in stored:
        ws.apply(e)
    return stored
