"""Answers through the store: record input values and job results for a session.

:func:`answer` needs no workflow code: it folds the session's log, checks the answers
with the rule ``Runner.resume()`` uses (:func:`flowscope.engine.pauses.validate_answers`)
and sends them to the session's inbox, durable at once. One writer per session: if no
live owner holds the session, :func:`answer` takes it for a moment and takes its inbox
in (the answers are in the log when it returns); if one does (another branch is still
running), the owner takes them in when its invocation pauses, or the next owner when it
takes the session, and nothing the owner does collides with them. The session then
waits for a runner (a worker, or ``runner.resume()``), which consumes the recorded
answers as if they had been passed to ``resume()``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from .actions import deliver, earlier_answer, load
from .engine.inbox import answer_body
from .engine.pauses import FINISHED, validate_answers
from .engine.submit import check_session_id
from .errors import ResumeError
from .ownership import Owner
from .store.base import EventStore

__all__ = ["answer", "check_answer", "AnswerReceipt"]


@dataclass(frozen=True, slots=True)
class AnswerReceipt:
    """What :func:`answer` recorded: which ids, for which workflow, up to which ``seq``.

    ``owner`` is None when the answers are in the log (``last_seq`` is the last event
    they wrote); otherwise the live owner whose process takes them in from the inbox
    (``last_seq`` is the log's when they were sent).
    """

    session_id: str
    workflow: str
    inputs: tuple[str, ...]
    jobs: tuple[str, ...]
    last_seq: int
    owner: Owner | None = None

    @property
    def pending(self) -> bool:
        """The answers wait in the inbox for the session's live owner."""
        return self.owner is not None


def answer(
    store: EventStore,
    session_id: str,
    inputs: Mapping[str, Any] | None = None,
    jobs: Mapping[str, Any] | None = None,
) -> AnswerReceipt:
    """Record answers to a session's open input requests (``inputs``, by interrupt id) and
    results of its dispatched jobs (``jobs``, by job id), sending nothing on error.

    Raises :class:`~flowscope.errors.UnknownSessionError` for an unknown session,
    :class:`~flowscope.errors.ResumeError` for a finished session, nothing to answer, an
    unknown id, an input already answered or a job already reported. Once it returns the
    answers are durable: in the log, or in the inbox of the live owner
    (:attr:`AnswerReceipt.pending`), which takes them in at its next pause or the next
    owner when it takes the session.
    """
    inputs = dict(inputs or {})
    jobs = dict(jobs or {})
    ws, body = _checked(store, session_id, inputs, jobs)
    done = deliver(store, ws, "answer", body)
    return AnswerReceipt(session_id, ws.workflow, tuple(inputs), tuple(jobs), done.last_seq, done.owner)


def check_answer(
    store: EventStore,
    session_id: str,
    inputs: Mapping[str, Any] | None = None,
    jobs: Mapping[str, Any] | None = None,
) -> None:
    """Raise what :func:`answer` would raise for these answers, sending nothing: a dry run
    (the console's form checks an answer with it before asking to confirm)."""
    _checked(store, session_id, dict(inputs or {}), dict(jobs or {}))


def _checked(
    store: EventStore, session_id: str, inputs: dict[str, Any], jobs: dict[str, Any]
) -> tuple[Any, dict[str, Any]]:
    """The session's state and the message body, once every check :func:`answer` makes has
    passed: a clear error before anything is sent."""
    check_session_id(session_id)  # the check start, submit and resume apply
    ws = load(store, session_id)
    if ws.status in FINISHED:
        raise ResumeError(f"session {session_id!r} has {ws.status}; it takes no more answers")
    if not inputs and not jobs:
        raise ResumeError(f"nothing to answer for session {session_id!r}: give inputs or jobs")
    validate_answers(ws, inputs, jobs)
    _not_sent_already(store, session_id, inputs, jobs)
    return ws, answer_body(inputs, jobs)


def _not_sent_already(
    store: EventStore, session_id: str, inputs: Mapping[str, Any], jobs: Mapping[str, Any]
) -> None:
    """Refuse an answer to a request that another answer, still in the inbox for the live
    owner to take in, already answers: the owner takes the first and drops this one, so
    "sent" would be untrue (the log alone does not show it yet)."""
    first = earlier_answer(store, session_id, {"inputs": inputs, "jobs": jobs})
    if first is not None:
        what, key = first
        raise ResumeError(
            f"session {session_id!r}: {what} {key!r} was already answered by another request; "
            "its owner takes that answer in at its next step (flowscope events shows it then)"
        )
