"""What the listing commands show, as rows of plain data (dicts with stable keys).

Every row comes from the store's projections (``sessions()``, ``node_runs()``,
``open_runs()``) or from :func:`flowscope.store.rebuild` over a session's log: the one fold
that interprets events. Nothing here reads event fields itself. The keys are documented in
``docs/cli.md``; renderers (table, JSON, CSV) only format them.
"""

from __future__ import annotations

import json
import re
import shlex
import time
from typing import Any, Callable, Iterable

from ..errors import StoreCorrupt, UnknownSessionError
from ..store.base import EventStore, NodeRun, SessionInfo
from ..liveness import (
    DEFAULT_HEARTBEAT_INTERVAL_S,
    ORPHANED,
    OVERDUE,
    RUNNING,
    WAITING_INPUT,
    WAITING_JOB,
    classify_open_run,
    owner_alive,
    resume_lease_s,
    worker_alive,
)
from ..fold import OPEN_STATES, NodeState, WorkflowState, containers, rebuild
from .history import RetryReasons, SessionHistory, request_row, retry_label

__all__ = [
    "RUN_KEYS",
    "SHOW_KEYS",
    "AUDIT_KEYS",
    "AUDIT_RUN_KEYS",
    "STUCK_KEYS",
    "QUEUED",
    "JOB_RESULT_EXAMPLE",
    "input_hint",
    "job_hint",
    "STUCK_STATES",
    "parse_duration",
    "load_session",
    "runs_rows",
    "session_rows",
    "show_rows",
    "audit_rows",
    "audit_run_rows",
    "stuck_rows",
]

RUN_KEYS = (
    "session_id",
    "workflow",
    "status",
    "started_at",
    "updated_at",
    "duration_s",
    "invocations",
    "events",
    "node_runs",
    "open_runs",
    "failed_runs",
    "error_code",
    "owner",
)

SHOW_KEYS = (
    "session_id",
    "workflow",
    "path",
    "parent_path",
    "node",
    "kind",
    "depth",
    "status",
    "attempts",
    "retries",
    "recoveries",
    "started_at",
    "ended_at",
    "start_offset_s",
    "duration_s",
    "has_output",
    "error_code",
    "error_type",
    "error_message",
    "origin_path",
    "interrupts",
    "open_interrupts",
    "answered_interrupts",
    "jobs",
    "heartbeat_at",
    "requests",
    "retried",
    "segments",
    "owner",
)

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
    "age_s",
    "heartbeat_at",
    "heartbeat_age_s",
    "job_deadline_at",
    "waiting_on",
    "action",
    "owner",
)

#: What ``stuck`` calls a queued session that no worker has started (not a node run's state).
QUEUED = "queued"
#: Every state ``flowscope stuck`` lists: the open runs' classes, and queued sessions.
STUCK_STATES = (RUNNING, ORPHANED, WAITING_INPUT, WAITING_JOB, OVERDUE, QUEUED)

#: The job result the hints print: valid JSON, a success with one item, to edit before use.
JOB_RESULT_EXAMPLE = '{"success": true, "count": 1, "data": {}}'


def _quoted(text: str) -> str:
    """``text`` in single quotes for a POSIX shell, always (a hint reads the same whatever
    it holds), a quote inside it closed, escaped and reopened."""
    return "'" + text.replace("'", "'\"'\"'") + "'"


def input_hint(session_id: str, interrupt_id: str, payload: Any = None, prefix: str = "flowscope") -> str:
    """The ``resume --input`` that answers ``interrupt_id``, quoted for a POSIX shell. The
    value is ``JSON`` (the placeholder to replace), or ``"retry"`` for a failed job's
    pause (its payload lists the actions), which is valid as printed."""
    actions = payload.get("actions") if isinstance(payload, dict) and payload.get("kind") == "job_failed" else None
    value = json.dumps(actions[0]) if actions else "JSON"
    return f"{prefix} resume {shlex.quote(session_id)} --input {_quoted(f'{interrupt_id}={value}')}"


def job_hint(session_id: str, job_id: str, prefix: str = "flowscope") -> str:
    """The ``resume --job`` that reports ``job_id``'s result, quoted for a POSIX shell:
    pasted, its value is :data:`JOB_RESULT_EXAMPLE`, valid JSON."""
    return f"{prefix} resume {shlex.quote(session_id)} --job {_quoted(f'{job_id}={JOB_RESULT_EXAMPLE}')}"


_UNITS = {"ms": 0.001, "s": 1.0, "sec": 1.0, "m": 60.0, "min": 60.0, "h": 3600.0, "d": 86400.0, "w": 604800.0}
_PART = re.compile(r"(\d+(?:\.\d+)?|\.\d+)\s*(ms|sec|min|s|m|h|d|w)?", re.IGNORECASE)


def parse_duration(text: str) -> float:
    """Seconds from ``"15m"``, ``"90s"``, ``"1h30m"``, ``"500ms"``, ``"2d"`` or a bare number of seconds."""
    s = str(text).strip().lower()
    if not s:
        raise ValueError("empty duration")
    pos = 0
    total = 0.0
    while pos < len(s):
        m = _PART.match(s, pos)
        if m is None:
            raise ValueError(f"{text!r} is not a duration (use e.g. 90s, 15m, 1h30m, 500ms, or seconds)")
        total += float(m.group(1)) * _UNITS[(m.group(2) or "s").lower()]
        pos = m.end()
        while pos < len(s) and s[pos] == " ":
            pos += 1
    return total


def _round(x: float | None, nd: int = 3) -> float | None:
    return None if x is None else round(x, nd)


def load_session(store: EventStore, session_id: str) -> WorkflowState:
    """The session's state from its log (the fold), or :class:`UnknownSessionError`."""
    events = store.read(session_id)
    if not events:
        raise UnknownSessionError(f"no session {session_id!r} in {_where(store)}: `flowscope runs` lists the sessions")
    return rebuild(events)


def owner_row(info: SessionInfo | None) -> dict[str, Any] | None:
    """The session's ``owner`` as the listings show it, or None if no owner ever took it;
    ``alive`` is :func:`flowscope.liveness.owner_alive`, the rule every command applies."""
    if info is None or info.owner is None:
        return None
    o = info.owner
    alive = owner_alive(o, info.lease_expires_at, time.time())
    return {"worker_id": o.worker_id, "host": o.host, "pid": o.pid, "lease_expires_at": info.lease_expires_at, "alive": alive}


def _where(store: EventStore) -> str:
    path = getattr(store, "path", None)
    return str(path) if path else "the store"


def _open_containers(runs: Iterable[NodeRun]) -> set[tuple[str, str]]:
    """(session, path) of open runs that contain another open run (:func:`flowscope.fold.containers`):
    their open state is the descendant's, which is the one listed and counted."""
    open_paths: dict[str, list[str]] = {}
    for r in runs:
        if r.status in OPEN_STATES:
            open_paths.setdefault(r.session_id, []).append(r.path)
    return {(sid, p) for sid, paths in open_paths.items() if len(paths) > 1 for p in containers(paths)}


def _origin_failures(runs: Iterable[NodeRun]) -> set[tuple[str, str]]:
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


# --------------------------------------------------------------------------- runs


def runs_rows(
    store: EventStore, *, limit: int | None = None, status: str | None = None, workflow: str | None = None
) -> list[dict[str, Any]]:
    """One row per session, most recently updated first."""
    sessions = store.sessions()
    if status:
        sessions = [s for s in sessions if s.status == status]
    if workflow:
        sessions = [s for s in sessions if s.workflow == workflow]
    if limit:
        sessions = sessions[:limit]
    return session_rows(store, sessions)


def session_rows(store: EventStore, sessions: list[SessionInfo]) -> list[dict[str, Any]]:
    """The ``runs`` rows of ``sessions`` (already selected, in the order given)."""
    if not sessions:
        return []
    wanted = {s.session_id for s in sessions}
    runs = [r for s in sessions for r in store.node_runs(s.session_id)]  # indexed by session
    origins = _origin_failures(runs)
    enclosing = _open_containers(runs)
    per: dict[str, dict[str, Any]] = {sid: {"node_runs": 0, "open_runs": 0, "failed_runs": 0, "error_code": None} for sid in wanted}
    for r in runs:
        acc = per[r.session_id]
        acc["node_runs"] += 1
        if r.status in OPEN_STATES and (r.session_id, r.path) not in enclosing:
            acc["open_runs"] += 1
        if (r.session_id, r.path) in origins:
            acc["failed_runs"] += 1
            if acc["error_code"] is None:
                acc["error_code"] = r.error_code
    rows = []
    for s in sessions:
        duration = (s.updated_at - s.started_at) if s.started_at is not None and s.updated_at is not None else None
        rows.append(
            {
                "session_id": s.session_id,
                "workflow": s.workflow,
                "status": s.status,
                "started_at": s.started_at,
                "updated_at": s.updated_at,
                "duration_s": _round(duration),
                "invocations": s.invocations,
                "events": s.last_seq,
                **per[s.session_id],
                "owner": owner_row(s),
            }
        )
    return rows


# --------------------------------------------------------------------------- show


def _tree(ws: WorkflowState) -> list[tuple[NodeState, int]]:
    """Node states depth-first, children in the order they first appear in the log."""
    children: dict[str, list[NodeState]] = {}
    for ns in ws.nodes.values():
        parent = ns.parent_path if ns.parent_path in ws.nodes else ""
        children.setdefault(parent, []).append(ns)
    out: list[tuple[NodeState, int]] = []
    seen: set[str] = set()

    def walk(parent: str, depth: int) -> None:
        for ns in children.get(parent, ()):
            if ns.path in seen:
                continue
            seen.add(ns.path)
            out.append((ns, depth))
            walk(ns.path, depth + 1)

    walk("", 0)
    for ns in ws.nodes.values():  # anything not reached (a broken parent link) still shows
        if ns.path not in seen:
            out.append((ns, ns.path.count("/")))
    return out


def show_rows(
    ws: WorkflowState, info: SessionInfo | None = None, history: SessionHistory | None = None
) -> list[dict[str, Any]]:
    """The session's node runs as a timeline (depth-first by path).

    ``info`` (the store's :class:`SessionInfo`) gives each row the session's ``owner``;
    ``history`` (from :func:`.history.session_history` over the same log) adds each run's
    retried attempts and its segments, one per invocation that ran it.
    """
    t0 = ws.started_at
    owner = owner_row(info)
    rows = []
    for ns, depth in _tree(ws):
        start = ns.started_at
        end = ns.ended_at
        jobs = []
        for job_id, job in ns.jobs.items():
            res = ns.job_results.get(job_id)
            jobs.append(
                {
                    "job_id": job_id,
                    "dispatch_attempt": job.dispatch_attempt,
                    "idempotency_key": job.idempotency_key,
                    "result": res.result if res is not None else "pending",
                }
            )
        rows.append(
            {
                "session_id": ws.session_id,
                "workflow": ws.workflow,
                "path": ns.path,
                "parent_path": ns.parent_path,
                "node": ns.node,
                "kind": ns.kind,
                "depth": depth,
                "status": ns.status,
                "attempts": ns.attempt,
                "retries": ns.retries,
                "recoveries": ns.recoveries,
                "started_at": start,
                "ended_at": end,
                "start_offset_s": _round(start - t0) if start is not None and t0 is not None else None,
                "duration_s": _round(end - start) if start is not None and end is not None else None,
                "has_output": ns.has_output if ns.status == "completed" else None,
                "error_code": ns.error_code,
                "error_type": ns.error_type,
                "error_message": ns.error_message,
                "origin_path": ns.origin_path if ns.status == "failed" or ns.is_open else None,
                "interrupts": sorted(set(ns.inputs) | set(ns.requests)),
                "open_interrupts": sorted(ns.requests) if ns.status == "waiting_input" else [],
                "answered_interrupts": sorted(ns.inputs),
                "jobs": jobs,
                "heartbeat_at": ns.heartbeat_at if ns.status == "running" else None,
                "requests": [request_row(req) for req in ns.requests.values()] if ns.status == "waiting_input" else [],
                "retried": list(history.retried.get(ns.path, ())) if history is not None else [],
                "segments": list(history.segments.get(ns.path, ())) if history is not None else [],
                "owner": owner,
            }
        )
    return rows


# --------------------------------------------------------------------------- audit


def audit_rows(runs: list[NodeRun], retried: RetryReasons | None = None) -> list[dict[str, Any]]:
    """Attempts, retries, recoveries and errors per workflow, path kind and node.

    A workflow's root run and a node of the same name are two rows: the key is
    (workflow, root or not, kind, node), never the name alone. ``retried`` (from
    :func:`.history.retry_reasons`) adds the error type and code of every retried attempt.
    """
    origins = _origin_failures(runs)
    enclosing = _open_containers(runs)
    groups: dict[tuple[str, bool, str, str], dict[str, Any]] = {}
    for r in runs:
        root = "/" not in r.path
        key = (r.workflow, root, r.kind, r.node)
        g = groups.get(key)
        if g is None:
            g = groups[key] = {
                "workflow": r.workflow,
                "node": r.node,
                "kind": r.kind,
                "root": root,
                "runs": 0,
                "completed": 0,
                "failed": 0,
                "errors": 0,
                "cancelled": 0,
                "open": 0,
                "attempts": 0,
                "max_attempt": 0,
                "retries": 0,
                "recoveries": 0,
                "error_codes": {},
                "retry_errors": {},
            }
        g["runs"] += 1
        if r.status == "completed":
            g["completed"] += 1
        elif r.status == "failed":
            g["failed"] += 1
            if (r.session_id, r.path) in origins:
                g["errors"] += 1
                code = r.error_code or "UNKNOWN_ERROR"
                g["error_codes"][code] = g["error_codes"].get(code, 0) + 1
        elif r.status == "cancelled":
            g["cancelled"] += 1
        elif r.status in OPEN_STATES and (r.session_id, r.path) not in enclosing:
            g["open"] += 1
        g["attempts"] += r.attempt
        g["max_attempt"] = max(g["max_attempt"], r.attempt)
        g["retries"] += r.retries
        g["recoveries"] += r.recoveries
        for attempt in (retried or {}).get((r.session_id, r.path), ()):
            label = retry_label(attempt)
            g["retry_errors"][label] = g["retry_errors"].get(label, 0) + 1
    return list(groups.values())


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
) -> list[dict[str, Any]]:
    """Open runs older than ``older_than_s``, oldest first, classified by :mod:`flowscope.liveness`,
    then queued sessions submitted longer ago than that (state ``queued``: no worker started them).

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
        enclosing = _open_containers(all_open)
        runs = [r for r in runs if (r.session_id, r.path) not in enclosing]
    wanted = set(states) if states else None
    rows = []
    states_cache: dict[str, WorkflowState] = {}
    infos: dict[str, SessionInfo | None] = {}
    skipped: set[str] = set()
    for r in runs:
        if r.session_id in skipped:
            continue
        young = r.started_at is not None and now - r.started_at < older_than_s
        if young and r.status != RUNNING:  # only a running run can be an orphan
            continue
        if r.session_id not in infos:
            infos[r.session_id] = store.session_info(r.session_id)
        info = infos[r.session_id]
        state = classify_open_run(
            r.status, r.started_at, r.heartbeat_at, r.job_deadline_at, now, stale_after_s,
            owner=info.owner if info is not None else None,
            lease_expires_at=info.lease_expires_at if info is not None else None,
        )
        if wanted is not None and state not in wanted:
            continue
        if young and state != ORPHANED:
            continue  # an orphan is known at once; the age is for runs that may still move
        waiting_on: list[str] = []
        payload: Any = None
        if r.status in ("waiting_input", "waiting_job"):
            ws = states_cache.get(r.session_id)
            if ws is None:
                try:
                    ws = states_cache[r.session_id] = rebuild(store.read(r.session_id))
                except StoreCorrupt as exc:
                    skipped.add(r.session_id)
                    if on_skip is not None:
                        on_skip(r.session_id, exc)
                    continue
            ns = ws.nodes.get(r.path)
            if ns is not None:
                waiting_on = sorted(ns.requests) if r.status == "waiting_input" else [j.job_id for j in ns.open_jobs]
                if waiting_on and waiting_on[0] in ns.requests:
                    payload = ns.requests[waiting_on[0]].payload
        beat_age = now - r.heartbeat_at if r.heartbeat_at is not None else None
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
                "age_s": _round(now - r.started_at) if r.started_at is not None else None,
                "heartbeat_at": r.heartbeat_at if r.status == "running" else None,
                "heartbeat_age_s": _round(beat_age) if r.status == "running" and beat_age is not None else None,
                "job_deadline_at": r.job_deadline_at,
                "waiting_on": waiting_on,
                "action": _action(r, state, waiting_on, beat_age, info, payload),
                "owner": owner_row(info),
            }
        )
    if skipped:
        rows = [row for row in rows if row["session_id"] not in skipped]
    if wanted is None or QUEUED in wanted:
        rows.extend(_queued_rows(store, older_than_s, now))
    return rows


def _queued_rows(store: EventStore, older_than_s: float, now: float) -> list[dict[str, Any]]:
    """Sessions submitted longer ago than ``older_than_s`` that no worker has started, with
    what to do: start a worker for the workflow, or look at the live one's log (its claims
    fail). Workers are alive by :func:`flowscope.liveness.worker_alive`."""
    from ..examples import BUNDLED

    cutoff = now - older_than_s
    if not any(g.oldest_submitted_at is None or g.oldest_submitted_at <= cutoff for g in store.queued_summary()):
        return []  # the store's index says nothing queued is old enough: no scan of every session
    queued = [s for s in store.sessions() if s.status == QUEUED]
    old = [s for s in queued if (s.submitted_at or s.started_at or now) <= cutoff]
    if not old:
        return []
    live = [w for w in store.workers() if worker_alive(w.host, w.pid, w.seen_at, now)]
    rows = []
    for s in sorted(old, key=lambda s: s.submitted_at or 0.0):
        since = s.submitted_at if s.submitted_at is not None else s.started_at
        serving = [w for w in live if s.workflow in w.workflows]
        if serving:
            w = max(serving, key=lambda w: w.seen_at)
            action = f"a live worker serves it ({w.worker_id} on {w.host} pid {w.pid}): its log says why it does not start"
        else:
            action = f"no live worker serves {s.workflow!r}: flowscope worker {BUNDLED.get(s.workflow, 'MODULE:ATTR')}"
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
                "age_s": _round(now - since) if since is not None else None,
                "heartbeat_at": None,
                "heartbeat_age_s": None,
                "job_deadline_at": None,
                "waiting_on": ["a worker"],
                "action": action,
                "owner": owner_row(s),
            }
        )
    return rows


def _action(
    r: NodeRun, state: str, waiting_on: list[str], beat_age: float | None, info: SessionInfo | None, payload: Any = None
) -> str:
    sid = r.session_id
    owner = info.owner if info is not None else None
    if state == ORPHANED:
        # An owned session is free once orphaned; one without an owner is refused to a
        # resume while its heartbeat looks fresh.
        fresh = owner is None and beat_age is not None and beat_age < resume_lease_s(DEFAULT_HEARTBEAT_INTERVAL_S)
        return f"flowscope resume {sid}{' --force' if fresh else ''}"
    if state == RUNNING:
        if owner is not None:
            return f"alive ({owner.describe()} holds the lease): check that worker; it is slow, blocked or looping"
        return "alive (fresh heartbeat): check the worker; it is slow, blocked or looping"
    if state == WAITING_INPUT:
        return input_hint(sid, waiting_on[0] if waiting_on else "ID", payload)
    if state in (WAITING_JOB, OVERDUE):
        return job_hint(sid, waiting_on[0] if waiting_on else "JOB_ID")
    return f"flowscope show {sid}"
