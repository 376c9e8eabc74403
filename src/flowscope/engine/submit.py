"""The checks a run's ids and input pass once, wherever the run is asked for, and the
record of a run that can never start.

``Runner.submit``, ``flowscope start`` (by name, without the code), ``Runner.run`` and
``resume()``, ``flowscope.answer`` and a worker's claim all check a session id with
:func:`check_session_id` and a run input with :func:`check_input` (the JSON rule of
:func:`~.record.json_value`): what one of them refuses, every one refuses, before anything
is appended. :func:`submit_run` is the one ``RunSubmitted`` writer. :func:`cannot_run_events`
end a session that no worker could ever start (an id the engine refuses, written by a
tool that skipped these checks): failed, with the reason, instead of claimed forever.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping
from typing import Any

from ..errors import (
    OutputNotSerializableError,
    WorkflowError,
    error_code_or_invalid,
    redact_message,
)
from ..events import Event, NodeErrorEvent, NodeStarted, RunFinished, RunStarted, RunSubmitted
from ..jsontext import lone_surrogate
from ..store.base import EventStore
from .graph import MAX_NODE_NAME, MAX_SESSION_ID, Node, Workflow, check_name
from .ids import new_id
from .record import json_value

__all__ = [
    "check_store",
    "check_runner_options",
    "check_workflow",
    "no_running_loop",
    "check_session_id",
    "check_workflow_name",
    "check_input",
    "submit_run",
    "cannot_run_events",
    "CANNOT_RUN",
]

#: The error code of a session ended by :func:`cannot_run_events`.
CANNOT_RUN = "SESSION_CANNOT_RUN"


def check_store(store: object, who: str) -> EventStore:
    """``store`` if it is an ``EventStore``, else a ``TypeError`` that says so for ``who``
    (a path given for a store fails here, not at its first read, deep inside)."""
    if not isinstance(store, EventStore):
        raise TypeError(
            f"{who} takes an EventStore, not {type(store).__name__} {str(store)[:60]!r}: "
            'pass one, e.g. SqliteEventStore("runs.db") (from flowscope.store)'
        )
    return store


def check_workflow(workflow: object) -> None:
    """A Runner's ``workflow`` is a :class:`Workflow`; a bare node is told how to wrap it."""
    if not isinstance(workflow, Workflow):
        hint = (
            f": wrap the node in one, Workflow({workflow.name!r}, edges=[(START, {workflow.name})])"
            if isinstance(workflow, Node)
            else ""
        )
        raise TypeError(f"Runner needs a Workflow, not {type(workflow).__name__}{hint}")


def check_runner_options(max_recoveries: int, error_codes: Mapping[Any, str] | None) -> None:
    """A ``Runner``'s numbers and mappings of the wrong kind, refused when it is made."""
    if max_recoveries < 0:
        raise ValueError(f"max_recoveries is 0 or more, not {max_recoveries!r}")
    for key, code in (error_codes or {}).items():  # matched along an exception's MRO: a name never matches
        if not (isinstance(key, type) and issubclass(key, BaseException)):
            raise TypeError(
                f"error_codes maps exception classes to codes, e.g. {{TimeoutError: ...}}, not {key!r}"
            )
        if not isinstance(code, str) or error_code_or_invalid(code) != code:  # cut or refused there
            raise ValueError(
                f"error_codes maps {key.__name__} to {code!r}, which is no error code: "
                "letters, digits and _.:- (UPSTREAM_TIMEOUT), at most 128 characters"
            )


def no_running_loop(sync: str, method: str) -> None:
    """A ``*_sync`` call inside a running event loop (Jupyter, an ``async def``) cannot
    start another: say what to write instead, before any coroutine is made."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return
    raise RuntimeError(
        f"Runner.{sync}() cannot run inside a running event loop (a notebook, an async function): "
        f"use `await runner.{method}(...)` there"
    )


def check_session_id(value: object) -> str:
    """``value`` if it can be a session id everywhere (a str of 1 to ``MAX_SESSION_ID``
    characters, valid UTF-8, no control character, not ``.`` or ``..``, which every URL,
    the console's included, reads as a step of its path), else ``ValueError`` saying why."""
    sid = check_name(value, "session id", MAX_SESSION_ID)
    if sid in (".", ".."):
        raise ValueError(
            f"session id {sid!r} is a step of a URL's path, which the console cannot open: give another"
        )
    return sid


def check_workflow_name(value: object) -> str:
    """``value`` if a ``Workflow`` can have it as its name (what a worker serves), else
    ``ValueError`` saying why: a session submitted under any other could never run."""
    name = check_name(value, "workflow name", MAX_NODE_NAME)
    if "/" in name or "@" in name:  # a Workflow refuses them (its runs' paths are name@k)
        raise ValueError(f"invalid workflow name {name[:40]!r}: it must be without '/' or '@'")
    return name


def check_input(value: Any, what: str = "the run input") -> Any:
    """The run input as the store keeps it (JSON data), or ``OutputNotSerializableError``:
    NaN, ±Infinity, a non-str key, an object JSON cannot hold, a string that is not
    Unicode text (a lone surrogate: :func:`~flowscope.jsontext.lone_surrogate`)."""
    out = json_value(value, what)
    bad = lone_surrogate(out)
    if bad is not None:
        raise OutputNotSerializableError(
            f"{what} holds {ascii(bad)[:60]}, a lone surrogate: not Unicode text; give valid text"
        )
    return out


def submit_run(store: EventStore, workflow: str, input: Any = None, session_id: str | None = None) -> str:
    """Record a run of ``workflow`` (by name) for a worker or ``resume()`` to start; its id.

    The id and the input pass :func:`check_session_id` and :func:`check_input` first; the
    session must be new (``WorkflowError`` otherwise). Nothing is appended on an error.
    """
    check_workflow_name(workflow)
    input = check_input(input)
    sid = check_session_id(session_id if session_id is not None else new_id())
    if store.last_seq(sid) > 0:
        raise WorkflowError(f"session {sid!r} already exists: submit with a new session id")
    event = RunSubmitted(
        session_id=sid,
        invocation_id=f"submit-{new_id()}",
        seq=1,
        ts=time.time(),
        workflow=workflow,
        input=input,
    )
    store.append(sid, [event], 0)
    return sid


def cannot_run_events(
    session_id: str, workflow: str, exc: BaseException, now: float | None = None
) -> list[Event]:
    """The events that end a session no runner can start: an invocation of its own in
    which the workflow's root run fails with :data:`CANNOT_RUN` and the reason (the
    exception's message, redacted), and ``RunFinished(failed)``. ``flowscope show`` then
    says why, and no worker claims it again."""
    now = time.time() if now is None else now
    inv = f"refused-{new_id()}"
    root = f"{workflow}@1"
    message = redact_message(" ".join(str(exc).split()))
    return [
        RunStarted(session_id=session_id, invocation_id=inv, ts=now, workflow=workflow, resumed=True),
        NodeStarted(
            session_id=session_id, invocation_id=inv, ts=now, path=root, node=workflow, kind="workflow"
        ),
        NodeErrorEvent(
            session_id=session_id,
            invocation_id=inv,
            ts=now,
            path=root,
            node=workflow,
            error_code=CANNOT_RUN,
            error_message=f"the session cannot run: {message}",
            error_type=type(exc).__name__,
        ),
        RunFinished(
            session_id=session_id,
            invocation_id=inv,
            ts=now,
            status="failed",
            error_code=CANNOT_RUN,
            error_path=root,
        ),
    ]
