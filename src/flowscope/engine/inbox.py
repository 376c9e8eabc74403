"""Taking in a session's inbox: the messages others sent its owner, as events in its log.

One writer per session: only the owner appends to a live session's log. An answer given
while the session runs (an operator's ``flowscope resume --input``, a job's result) is
sent as a :class:`~flowscope.store.base.Message` instead; the owner takes it in when it
takes the session (a resume, a worker's claim) or when its invocation pauses, so a
running branch's appends never collide with it and nothing is thrown away.

Taking in is idempotent: each answer is checked against the session's state with the
rule ``resume()`` applies (:func:`~flowscope.engine.pauses.validate_answers`), so an
answer that was already recorded, or that another message gave first, is dropped, not
recorded twice.
"""

from __future__ import annotations

import logging
import time
import uuid
from typing import Any, Iterable, Mapping

from ..errors import ResumeError
from ..events import Event
from ..fold import WorkflowState
from ..ownership import Lease
from ..store.base import EventStore, Message
from .pauses import Answer, recorded_result, validate_answers
from .record import json_value

__all__ = ["answer_events", "answer_body", "read_inbox", "take_in"]

log = logging.getLogger("flowscope.engine")


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
    invocation_id = f"answer-{uuid.uuid4().hex}"
    seq = ws.last_seq
    out: list[Event] = []
    for cls, path, node, fields in answers:
        seq += 1
        out.append(cls(session_id=ws.session_id, invocation_id=invocation_id, seq=seq, ts=now, path=path, node=node, **fields))
    return out


def read_inbox(ws: WorkflowState, messages: Iterable[Message]) -> tuple[list[Answer], list[int]]:
    """The answers ``messages`` carry that still apply to ``ws``, and the ids of every
    message read (taken in, or dropped because nothing in it applies any more)."""
    answers: list[Answer] = []
    ids: list[int] = []
    given: set[tuple[str, str]] = set()
    for msg in messages:
        ids.append(msg.message_id)
        if msg.kind != "answer":
            log.warning("session %s: dropped message %d of unknown kind %r", ws.session_id, msg.message_id, msg.kind)
            continue
        body = msg.body
        items = [("input", k, v) for k, v in (body.get("inputs") or {}).items()]
        items += [("job", k, v) for k, v in (body.get("jobs") or {}).items()]
        for what, key, value in items:
            if (what, key) in given:
                continue  # a second message answered the same request: the first counts
            try:
                found = validate_answers(ws, {key: value} if what == "input" else {}, {key: value} if what == "job" else {})
            except ResumeError as exc:  # already answered in the log, or no longer asked
                log.info("session %s: message %d: %s %r not taken in: %s", ws.session_id, msg.message_id, what, key, exc)
                continue
            given.add((what, key))
            answers.extend(found)
    return answers, ids


def take_in(store: EventStore, ws: WorkflowState, lease: Lease) -> list[Event]:
    """Take the session's inbox in under ``lease``: append the answers that apply, delete
    the messages, in one transaction, and fold the events into ``ws``. Returns them."""
    messages = store.inbox(ws.session_id)
    if not messages:
        return []
    answers, ids = read_inbox(ws, messages)
    events = answer_events(ws, answers)
    stored = store.take_in(ws.session_id, events, ws.last_seq, ids, epoch=lease.epoch)
    for e in stored:
        ws.apply(e)
    return stored
