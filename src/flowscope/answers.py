"""Answers through the store: record input values and job results for a paused session.

:func:`answer` needs no workflow code: it folds the session's log, checks the answers
with the rule ``Runner.resume()`` uses (:func:`flowscope.engine.pauses.validate_answers`)
and appends them durably, outside any invocation. The session then waits for a runner
(a worker, or ``runner.resume()``), which consumes the recorded answers as if they had
been passed to ``resume()``.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass
from typing import Any, Mapping

from .engine.pauses import FINISHED, validate_answers
from .errors import ResumeError, UnknownSessionError
from .fold import rebuild
from .store.base import EventStore

__all__ = ["answer", "AnswerReceipt"]


@dataclass(frozen=True, slots=True)
class AnswerReceipt:
    """What :func:`answer` recorded: which ids, for which workflow, up to which ``seq``."""

    session_id: str
    workflow: str
    inputs: tuple[str, ...]
    jobs: tuple[str, ...]
    last_seq: int


def answer(
    store: EventStore,
    session_id: str,
    inputs: Mapping[str, Any] | None = None,
    jobs: Mapping[str, Any] | None = None,
) -> AnswerReceipt:
    """Record answers to a session's open input requests (``inputs``, by interrupt id) and
    results of its dispatched jobs (``jobs``, by job id), appending nothing on error.

    Raises :class:`~flowscope.errors.UnknownSessionError` for an unknown session,
    :class:`~flowscope.errors.ResumeError` for a finished session, nothing to answer, an
    unknown id, an input already answered or a job already reported, and
    :class:`~flowscope.errors.ConcurrencyConflict` if the session's owner appended in
    between (fold again and retry).
    """
    inputs = dict(inputs or {})
    jobs = dict(jobs or {})
    events = store.read(session_id)
    if not events:
        raise UnknownSessionError(f"no session {session_id!r} in the store: check the id (flowscope runs lists them)")
    ws = rebuild(events)
    if ws.status in FINISHED:
        raise ResumeError(f"session {session_id!r} has {ws.status}; it takes no more answers")
    if not inputs and not jobs:
        raise ResumeError(f"nothing to answer for session {session_id!r}: give inputs or jobs")
    answers = validate_answers(ws, inputs, jobs)
    invocation_id = f"answer-{uuid.uuid4().hex}"
    now = time.time()
    seq = ws.last_seq
    batch = []
    for cls, path, node, fields in answers:
        seq += 1
        batch.append(cls(session_id=session_id, invocation_id=invocation_id, seq=seq, ts=now, path=path, node=node, **fields))
    store.append(session_id, batch, ws.last_seq)
    return AnswerReceipt(session_id, ws.workflow, tuple(inputs), tuple(jobs), seq)
