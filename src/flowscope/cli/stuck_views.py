"""The rows of ``flowscope audit`` and ``flowscope stuck``: attempts per node, and every
open run that needs a person, each with its fix."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from typing import Any

from ..engine.pauses import continued_in
from ..errors import StoreCorrupt
from ..fold import OPEN_STATES, WorkflowState, rebuild
from ..liveness import (
    DEFAULT_HEARTBEAT_INTERVAL_S,
    ORPHANED,
    OVERDUE,
    QUEUED,
    RUNNING,
    WAITING_INPUT,
    WAITING_JOB,
    resume_lease_s,
    worker_alive,
)
from ..store.base import EventLog, EventStore, NodeRun, NodeRunGroup, SessionInfo, SessionQuery, WorkerInfo
from ..store.log import group_node_runs
from .history import RetryReasons, retry_label, retry_reasons
from .rowparts import (
    classify_run,
    input_hint,
    job_hint,
    open_containers,
    origin_failures,
    owner_row,
    round_or_none,
    serving_worker,
    session_command,
)

__all__ = [
    "AUDIT_KEYS",
    "AUDIT_RUN_KEYS",
    "STUCK_KEYS",
    "QUEUED",
    "STUCK_STATES",
    "audit_rows",
    "store_audit_rows",
    "audit_group_rows",
    "audit_run_rows",
    "stuck_rows",
]

AUDIT_KEYS = (
    "workflow",
    "node",
    "kind",
    "root",
    "runs",
    "completed",
    "failed",
    "errors",
    "cancelled",
    "open",
    "attempts",
    "max_attempt",
    "retries",
    "recoveries",
    "error_codes",
    "retry_errors",
)

AUDIT_RUN_KEYS = (
    "session_id",
    "workflow",
    "node",
    "path",
    "kind",
    "status",
    "attempts",
    "retries",
    "recoveries",
    "error_code",
    "error_type",
    "retried",
    "started_at",
    "ended_at",
)

STUCK_KEYS = (
    "session_id",
    "workflow",
    "node",
    "path",
    "state",
    "status",
    "attempt",
    "started_at",
    "restarted_at",
    "age_s",
    "heartbeat_at",
    "heartbeat_age_s",
    "job_deadline_at",
    "waiting_on",
    "action",
    "owner",
)

#: Every state ``flowscope stuck`` lists: the open runs' classes, and queued sessions.
STUCK_STATES = (RUNNING, ORPHANED, WAITING_INPUT, WAITING_JOB, OVERDUE, QUEUED)

#: The job result the hints print: valid JSON, a success with one item, to edit before use.


# --------------------------------------------------------------------------- audit


def audit_rows(runs: Iterable[NodeRun], retried: RetryReasons | None = None) -> list[dict[str, Any]]:
    """Attempts, retries, recoveries and errors per workflow, path kind and node, of
    ``runs`` (a few sessions' runs; :func:`store_audit_rows` counts a whole store).
    ``retried`` (from :func:`.history.retry_reasons`) adds the error type and code of
    every retried attempt."""
    runs = list(runs)
    return audit_group_rows(
        group_node_runs(runs),
        [r for r in runs if r.status == "failed"],
        [r for r in runs if r.status in OPEN_STATES],
        [r for r in runs if r.retries],
        retried or {},
    )


def store_audit_rows(store: EventLog, workflow: str | None = None) -> list[dict[str, Any]]:
    """:func:`audit_rows` of every node run in the store (of ``workflow``), without holding
    them: the store counts the groups and gives only the failed, open and retried runs
    (at two million runs: 20 s and 1.7 GB before, when every run was read)."""
    retried = store.find_node_runs(workflow=workflow, retried=True)
    return audit_group_rows(
        store.node_run_groups(workflow),
        store.find_node_runs(frozenset({"failed"}), workflow=workflow),
        store.find_node_runs(frozenset(OPEN_STATES), workflow=workflow),
        retried,
        retry_reasons(store, retried),
    )


def audit_group_rows(
    groups: Iterable[NodeRunGroup],
    failed: Iterable[NodeRun],
    open_runs: Iterable[NodeRun],
    retried: Iterable[NodeRun],
    reasons: RetryReasons,
) -> list[dict[str, Any]]:
    """The audit's rows from the groups' counts and the runs that need more than a count:
    ``failed`` (every failed run of their sessions: ERRORS counts only where a failure
    began, not the workflows it failed around), ``open_runs`` (every open run of their
    sessions: an enclosing run's open state is its descendant's, counted there) and the
    ``retried`` runs with their ``reasons``. Sorted by workflow, the root run first, node."""
    rows: dict[tuple[str, bool, str, str], dict[str, Any]] = {}
    for g in sorted(groups, key=lambda g: (g.workflow, not g.root, g.node, g.kind)):
        rows[(g.workflow, g.root, g.kind, g.node)] = {
            "workflow": g.workflow,
            "node": g.node,
            "kind": g.kind,
            "root": g.root,
            "runs": g.runs,
            "completed": g.completed,
            "failed": g.failed,
            "errors": 0,
            "cancelled": g.cancelled,
            "open": 0,
            "attempts": g.attempts,
            "max_attempt": g.max_attempt,
            "retries": g.retries,
            "recoveries": g.recoveries,
            "error_codes": {},
            "retry_errors": {},
        }

    def row_of(r: NodeRun) -> dict[str, Any]:
        return rows[(r.workflow, "/" not in r.path, r.kind, r.node)]

    failed, open_runs = list(failed), list(open_runs)
    origins = origin_failures(failed)
    for r in failed:
        if (r.session_id, r.path) in origins:
            row = row_of(r)
            row["errors"] += 1
            code = r.error_code or "UNKNOWN_ERROR"
            row["error_codes"][code] = row["error_codes"].get(code, 0) + 1
    enclosing = open_containers(open_runs)
    for r in open_runs:
        if (r.session_id, r.path) not in enclosing:
            row_of(r)["open"] += 1
    for r in retried:
        for attempt in reasons.get((r.session_id, r.path), ()):
            counts = row_of(r)["retry_errors"]
            label = retry_label(attempt)
            counts[label] = counts.get(label, 0) + 1
    return list(rows.values())


def audit_run_rows(runs: list[NodeRun], retried: RetryReasons | None = None) -> list[dict[str, Any]]:
    """One row per node run (``flowscope audit --by run``)."""
    return [
        {
            "session_id": r.session_id,
            "workflow": r.workflow,
            "node": r.node,
            "path": r.path,
            "kind": r.kind,
            "status": r.status,
            "attempts": r.attempt,
            "retries": r.retries,
            "recoveries": r.recoveries,
            "error_code": r.error_code,
            "error_type": r.error_type,
            "retried": list((retried or {}).get((r.session_id, r.path), ())),
            "started_at": r.started_at,
            "ended_at": r.ended_at,
        }
        for r in runs
    ]


# --------------------------------------------------------------------------- stuck


def stuck_rows(
    store: EventStore,
    older_than_s: float,
    stale_after_s: float,
    *,
    include_parents: bool = False,
    states: Iterable[str] | None = None,
    now: float | None = None,
    on_skip: Callable[[str, StoreCorrupt], None] | None = None,
    prefix: str,
) -> list[dict[str, Any]]:
    """Open runs older than ``older_than_s``, oldest first, classified by :mod:`flowscope.liveness`,
    then queued sessions submitted longer ago than that (state ``queued``: no worker started them).

    Each row's ``action`` is a command that starts with ``prefix``: pass
    :func:`.app.command_prefix` of the database ``store`` is, so that the command pasted as
    printed acts on it (``flowscope --db other.db resume ...``). The bare ``flowscope`` of the
    default names ``./flowscope.db`` (or ``$FLOWSCOPE_DB``), right only for that database.

    An orphaned run is listed whatever its age: its owner is known to be gone, so there is
    nothing to wait for. The age applies to running and waiting runs, which may still move.

    A session whose log cannot be read (a corrupt row) is left out, and ``on_skip`` told
    why, so that one bad row does not hide every other stuck run of the database.

    By default an enclosing run (a workflow node, or the parent of a dynamic child) is
    left out when a run below it is listed: the innermost run is the one to act on.
    """
    now = time.time() if now is None else now
    all_open = store.open_runs()
    runs = list(all_open)
    if not include_parents:
        enclosing = open_containers(all_open)
        runs = [r for r in runs if (r.session_id, r.path) not in enclosing]
    wanted = set(states) if states else None
    rows = []
    states_cache: dict[str, WorkflowState] = {}
    infos: dict[str, SessionInfo | None] = {}
    skipped: set[str] = set()
    live: list[WorkerInfo] | None = None  # the live workers, read once a run waits for one
    for r in runs:
        if r.session_id in skipped:
            continue
        since = r.last_started_at  # a resumed run is as old as its restart, not its first start
        young = since is not None and now - since < older_than_s
        if young and r.status != RUNNING:  # only a running run can be an orphan
            continue
        if r.session_id not in infos:
            infos[r.session_id] = store.session_info(r.session_id)
        info = infos[r.session_id]
        state = classify_run(r, info, now, stale_after_s)
        waiting = r.status in (WAITING_INPUT, WAITING_JOB)
        # a waiting run with nothing left open waits for a worker: known once its log is read
        if wanted is not None and state not in wanted and not (waiting and QUEUED in wanted):
            continue
        if young and state != ORPHANED:
            continue  # an orphan is known at once; the age is for runs that may still move
        waiting_on: list[str] = []
        payload: Any = None
        ws: WorkflowState | None = None
        # the log is read for what a run waits on, and for an orphan's engine: a session a
        # bridge records is continued by its engine, never by a flowscope command
        if waiting or state == ORPHANED:
            ws = states_cache.get(r.session_id)
            if ws is None:
                try:
                    ws = states_cache[r.session_id] = rebuild(store.read(r.session_id))
                except StoreCorrupt as exc:
                    skipped.add(r.session_id)
                    if on_skip is not None:
                        on_skip(r.session_id, exc)
                    continue
        if ws is not None and waiting:
            ns = ws.nodes.get(r.path)
            if ns is not None:
                waiting_on = (
                    sorted(ns.requests) if r.status == "waiting_input" else [j.job_id for j in ns.open_jobs]
                )
                if waiting_on and waiting_on[0] in ns.requests:
                    payload = ns.requests[waiting_on[0]].payload
                state = classify_run(r, info, now, stale_after_s, waiting_on)
            if wanted is not None and state not in wanted:
                continue
        action: str | None = None
        if state == QUEUED:  # its wait is over: it waits for a worker, as a queued session does
            since = info.updated_at if info is not None and info.updated_at is not None else since
            if since is not None and now - since < older_than_s:
                continue
            waiting_on = ["a worker"]
            if live is None:
                live = _live_workers(store, now)
            action = _worker_hint(live, r.workflow, r.session_id, prefix=prefix)
        beat_age = now - r.heartbeat_at if r.heartbeat_at is not None else None
        if state == ORPHANED:
            if live is None:
                live = _live_workers(store, now)
            action = _orphan_hint(live, r, info, beat_age, prefix=prefix)
        rows.append(
            {
                "session_id": r.session_id,
                "workflow": r.workflow,
                "node": r.node,
                "path": r.path,
                "state": state,
                "status": r.status,
                "attempt": r.attempt,
                "started_at": r.started_at,
                "restarted_at": r.restarted_at,
                "age_s": round_or_none(now - since) if since is not None else None,
                "heartbeat_at": r.heartbeat_at if r.status == "running" else None,
                "heartbeat_age_s": round_or_none(beat_age)
                if r.status == "running" and beat_age is not None
                else None,
                "job_deadline_at": r.job_deadline_at,
                "waiting_on": waiting_on,
                "action": continued_in(ws.engine)
                if ws is not None and ws.engine is not None
                else action or _action(r, state, waiting_on, beat_age, info, payload, prefix=prefix),
                "owner": owner_row(info),
            }
        )
    if skipped:
        rows = [row for row in rows if row["session_id"] not in skipped]
    if wanted is None or QUEUED in wanted:
        rows.extend(_queued_rows(store, older_than_s, now, prefix=prefix))
    return rows


def _queued_rows(store: EventStore, older_than_s: float, now: float, *, prefix: str) -> list[dict[str, Any]]:
    """Sessions submitted longer ago than ``older_than_s`` that no worker has started, with
    what to do: start a worker for the workflow (after ``prefix``: a worker of another
    database would not serve them), or look at the live one's log (its claims fail).
    Workers are alive by :func:`flowscope.liveness.worker_alive`."""
    cutoff = now - older_than_s
    if not any(
        g.oldest_submitted_at is None or g.oldest_submitted_at <= cutoff for g in store.queued_summary()
    ):
        return []  # the store's index says nothing queued is old enough: no scan of every session
    queued = store.find_sessions(SessionQuery(statuses=frozenset({QUEUED})))
    old = [s for s in queued if (s.submitted_at or s.started_at or now) <= cutoff]
    if not old:
        return []
    live = _live_workers(store, now)
    rows = []
    for s in sorted(old, key=lambda s: s.submitted_at or 0.0):
        since = s.submitted_at if s.submitted_at is not None else s.started_at
        action = _worker_hint(live, s.workflow, s.session_id, prefix=prefix)
        rows.append(
            {
                "session_id": s.session_id,
                "workflow": s.workflow,
                "node": None,
                "path": "",
                "state": QUEUED,
                "status": QUEUED,
                "attempt": 0,
                "started_at": since,
                "restarted_at": None,
                "age_s": round_or_none(now - since) if since is not None else None,
                "heartbeat_at": None,
                "heartbeat_age_s": None,
                "job_deadline_at": None,
                "waiting_on": ["a worker"],
                "action": action,
                "owner": owner_row(s),
            }
        )
    return rows


def _live_workers(store: EventStore, now: float) -> list[WorkerInfo]:
    """The workers alive by :func:`flowscope.liveness.worker_alive`."""
    return [w for w in store.workers() if worker_alive(w.host, w.pid, w.seen_at, now)]


def _worker_hint(live: list[WorkerInfo], workflow: str, session_id: str, *, prefix: str) -> str:
    """What to do for work of ``workflow`` that waits for a worker: look at the log of the
    live worker that serves it (its claims fail), or start one (after ``prefix``: a worker
    of another database would not serve it)."""
    from ..examples import bundled_for

    w = serving_worker(live, workflow)
    if w is not None:
        return f"a live worker serves it ({w.worker_id} on {w.host} pid {w.pid}): its log says why it does not start"
    code = bundled_for(workflow, session_id) or "MODULE:ATTR"
    return f"no live worker serves {workflow!r}: {prefix} worker {code}"


def _orphan_hint(
    live: list[WorkerInfo], r: NodeRun, info: SessionInfo | None, beat_age: float | None, *, prefix: str
) -> str:
    """What to do about an orphaned run: nothing while a live worker serves its workflow
    (it takes the session over at its next claim), else the ``resume`` that runs it here,
    with the ``--workflow`` it needs for code that is not the demo's."""
    w = serving_worker(live, r.workflow)
    if w is not None:
        return f"a live worker serves it ({w.worker_id} on {w.host} pid {w.pid}): it takes it over at its next claim"
    # An owned session is free once orphaned; one without an owner is refused to a resume
    # while its heartbeat looks fresh.
    from ..examples import bundled_for

    fresh = (
        (info is None or info.owner is None)
        and beat_age is not None
        and beat_age < resume_lease_s(DEFAULT_HEARTBEAT_INTERVAL_S)
    )
    code = [] if bundled_for(r.workflow, r.session_id) else ["--workflow", "MODULE:ATTR"]
    return session_command(prefix, "resume", r.session_id, *code, *(["--force"] if fresh else []))


def _action(
    r: NodeRun,
    state: str,
    waiting_on: list[str],
    beat_age: float | None,
    info: SessionInfo | None,
    payload: Any = None,
    *,
    prefix: str,
) -> str:
    """What to do about the open run ``r`` in ``state``: a command after ``prefix`` where
    one helps, else what to look at."""
    sid = r.session_id
    owner = info.owner if info is not None else None
    if state == RUNNING:
        if owner is not None:
            return f"alive ({owner.describe()} holds the lease): check that worker; it is slow, blocked or looping"
        return "alive (fresh heartbeat): check the worker; it is slow, blocked or looping"
    if state == WAITING_INPUT:
        return input_hint(sid, waiting_on[0] if waiting_on else "ID", payload, prefix=prefix)
    if state in (WAITING_JOB, OVERDUE):
        return job_hint(sid, waiting_on[0] if waiting_on else "JOB_ID", prefix=prefix)
    return session_command(prefix, "show", sid)
