"""The pieces every listing's rows are made of: owners, answer and job hints, rounding, and
which open or failed runs are counted (once, at the deepest path).

Every hint takes the command it starts with (``prefix``, what :func:`.app.command_prefix`
gives for the database the rows were read from) as a required argument: a hint pasted
as printed must act on that database, and a bare ``flowscope`` names another one
whenever ``--db`` chose it."""

from __future__ import annotations

import json
import shlex
import time
from collections.abc import Iterable
from typing import Any

from ..fold import OPEN_STATES, containers
from ..liveness import classify_open_run, owner_alive
from ..store.base import NodeRun, SessionInfo, WorkerInfo

__all__ = [
    "JOB_RESULT_EXAMPLE",
    "quoted",
    "input_hint",
    "job_hint",
    "round_or_none",
    "owner_row",
    "classify_run",
    "serving_worker",
    "open_containers",
    "origin_failures",
    "session_error_codes",
]

JOB_RESULT_EXAMPLE = '{"success": true, "count": 1, "data": {}}'


def quoted(text: str) -> str:
    """``text`` in single quotes for a POSIX shell, always (a hint reads the same whatever
    it holds), a quote inside it closed, escaped and reopened."""
    return "'" + text.replace("'", "'\"'\"'") + "'"


def session_command(prefix: str, verb: str, session_id: str, *options: str) -> str:
    """``prefix verb SESSION options...``, valid shell as printed: the session id quoted
    (any text may be one: ``x; rm -rf ~`` pasted runs no second command), and one that
    starts with ``-``, which a command line reads as an option, after ``--`` and the
    options. ``options`` come quoted already."""
    sid = shlex.quote(session_id)
    opts = "".join(f" {o}" for o in options)
    if session_id.startswith("-"):
        return f"{prefix} {verb}{opts} -- {sid}"
    return f"{prefix} {verb} {sid}{opts}"


def input_hint(session_id: str, interrupt_id: str, payload: Any = None, *, prefix: str) -> str:
    """The ``resume --input`` that answers ``interrupt_id``, after ``prefix`` (``flowscope``
    and the ``--db`` the hint is for), quoted for a POSIX shell. The
    value is ``JSON`` (the placeholder to replace), or ``"retry"`` for a failed job's
    pause (its payload lists the actions), which is valid as printed."""
    actions = (
        payload.get("actions") if isinstance(payload, dict) and payload.get("kind") == "job_failed" else None
    )
    value = json.dumps(actions[0]) if actions else "JSON"
    return session_command(prefix, "resume", session_id, "--input", quoted(f"{interrupt_id}={value}"))


def job_hint(session_id: str, job_id: str, *, prefix: str) -> str:
    """The ``resume --job`` that reports ``job_id``'s result, after ``prefix`` (``flowscope``
    and the ``--db`` the hint is for), quoted for a POSIX shell: pasted, its value is
    :data:`JOB_RESULT_EXAMPLE`, valid JSON."""
    return session_command(prefix, "resume", session_id, "--job", quoted(f"{job_id}={JOB_RESULT_EXAMPLE}"))


def round_or_none(x: float | None, nd: int = 3) -> float | None:
    return None if x is None else round(x, nd)


def owner_row(info: SessionInfo | None) -> dict[str, Any] | None:
    """The session's ``owner`` as the listings show it, or None if no owner ever took it;
    ``alive`` is :func:`flowscope.liveness.owner_alive`, the rule every command applies."""
    if info is None or info.owner is None:
        return None
    o = info.owner
    alive = owner_alive(o, info.lease_expires_at, time.time())
    return {
        "worker_id": o.worker_id,
        "host": o.host,
        "pid": o.pid,
        "lease_expires_at": info.lease_expires_at,
        "alive": alive,
    }


def classify_run(
    r: NodeRun,
    info: SessionInfo | None,
    now: float,
    stale_after_s: float,
    waiting_on: list[str] | None = None,
) -> str:
    """``r``'s state by :func:`flowscope.liveness.classify_open_run`, given its session
    (its owner, its lease, its status) and, once its log is read, what it waits on: what
    ``stuck`` and the console's tabs call it."""
    return classify_open_run(
        r.status,
        r.started_at,
        r.heartbeat_at,
        r.job_deadline_at,
        now,
        stale_after_s,
        owner=info.owner if info is not None else None,
        lease_expires_at=info.lease_expires_at if info is not None else None,
        session_status=info.status if info is not None else None,
        waiting_on=waiting_on,
    )


def serving_worker(live: Iterable[WorkerInfo], workflow: str) -> WorkerInfo | None:
    """The live worker that serves ``workflow`` and was seen last, or None: the one a hint
    names as the worker that will take its work."""
    serving = [w for w in live if workflow in w.workflows]
    return max(serving, key=lambda w: w.seen_at) if serving else None


def open_containers(runs: Iterable[NodeRun]) -> set[tuple[str, str]]:
    """(session, path) of open runs that contain another open run (:func:`flowscope.fold.containers`):
    their open state is the descendant's, which is the one listed and counted."""
    open_paths: dict[str, list[str]] = {}
    for r in runs:
        if r.status in OPEN_STATES:
            open_paths.setdefault(r.session_id, []).append(r.path)
    return {(sid, p) for sid, paths in open_paths.items() if len(paths) > 1 for p in containers(paths)}


def origin_failures(runs: Iterable[NodeRun]) -> set[tuple[str, str]]:
    """(session, path) of failed runs that are where a failure began: no failed run below them.

    An enclosing workflow (or the parent of a failed dynamic child) is failed too, with the
    same error code; counting it again would double the errors.
    """
    failed: dict[str, list[str]] = {}
    for r in runs:
        if r.status == "failed":
            failed.setdefault(r.session_id, []).append(r.path)
    out: set[tuple[str, str]] = set()
    for sid, paths in failed.items():
        enclosing = containers(paths)
        out.update((sid, p) for p in paths if p not in enclosing)
    return out


def session_error_codes(
    runs: Iterable[NodeRun], origins: set[tuple[str, str]] | None = None
) -> dict[str, str]:
    """Each session's error code, from its runs in the store's order: the first code of a
    run where a failure began (``origins``, :func:`origin_failures` of ``runs`` unless
    given); sessions without one are left out. The ``error_code`` of ``flowscope runs`` and
    what the console filters by."""
    if origins is None:
        runs = list(runs)  # iterated twice
        origins = origin_failures(runs)
    out: dict[str, str] = {}
    for r in runs:
        if r.error_code is not None and r.session_id not in out and (r.session_id, r.path) in origins:
            out[r.session_id] = r.error_code
    return out
