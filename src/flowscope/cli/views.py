"""What the listing commands show, as rows of plain data (dicts with stable keys).

Every row comes from the store's projections (``sessions()``, ``node_runs()``,
``open_runs()``) or from :func:`flowscope.store.rebuild` over a session's log: the one fold
that interprets events. Nothing here reads event fields itself. The keys are documented in
``docs/cli.md``; renderers (table, JSON, CSV) only format them.
"""

from __future__ import annotations

import math
import re
from typing import Any

from ..errors import UnknownSessionError
from ..fold import OPEN_STATES, NodeState, WorkflowState, rebuild
from ..store.base import EventLog, SessionInfo, SessionQuery
from .history import SessionHistory, request_row
from .rowparts import (
    JOB_RESULT_EXAMPLE,
    input_hint,
    job_hint,
    open_containers,
    origin_failures,
    owner_row,
    round_or_none,
    session_error_codes,
)
from .stuck_views import (
    AUDIT_KEYS,
    AUDIT_RUN_KEYS,
    QUEUED,
    STUCK_KEYS,
    STUCK_STATES,
    audit_rows,
    audit_run_rows,
    store_audit_rows,
    stuck_rows,
)

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
    "session_error_codes",
    "show_rows",
    "node_tree",
    "audit_rows",
    "audit_run_rows",
    "store_audit_rows",
    "stuck_rows",
    "owner_row",
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

_UNITS = {"ms": 0.001, "s": 1.0, "sec": 1.0, "m": 60.0, "min": 60.0, "h": 3600.0, "d": 86400.0, "w": 604800.0}
_PART = re.compile(r"(\d+(?:\.\d+)?|\.\d+)\s*(ms|sec|min|s|m|h|d|w)?", re.IGNORECASE)
#: The longest duration any option takes: a century. Longer ones are mistakes, and
#: overflow what a sleep, a timer or a timestamp can hold.
MAX_DURATION_S = 100 * 365 * 86400.0


def parse_duration(text: str) -> float:
    """Seconds from ``"15m"``, ``"90s"``, ``"1h30m"``, ``"500ms"``, ``"2d"`` or a bare number of seconds."""
    s = str(text).strip().lower()
    if not s:
        raise ValueError("empty duration")
    pos = 0
    total = 0.0
    while pos < len(s):
        m = _PART.match(s, pos)
        if m is None or (m.group(2) is None and (pos > 0 or m.end() < len(s))):
            # a bare number is seconds only alone: "1h30" (30 what?) and "1.5.5s" are refused
            raise ValueError(f"{text!r} is not a duration (use e.g. 90s, 15m, 1h30m, 500ms, or seconds)")
        total += float(m.group(1)) * _UNITS[(m.group(2) or "s").lower()]
        pos = m.end()
        while pos < len(s) and s[pos] == " ":
            pos += 1
    if not math.isfinite(total) or total > MAX_DURATION_S:
        raise ValueError(f"{text[:40]!r} is longer than a century, the longest duration flowscope takes")
    return total


def load_session(store: EventLog, session_id: str) -> WorkflowState:
    """The session's state from its log (the fold), or :class:`UnknownSessionError`."""
    events = store.read(session_id)
    if not events:
        raise UnknownSessionError(
            f"no session {session_id!r} in {_where(store)}: `flowscope runs` lists the sessions"
        )
    return rebuild(events)


def _where(store: EventLog) -> str:
    path = getattr(store, "path", None)
    return str(path) if path else "the store"


# --------------------------------------------------------------------------- runs


def runs_rows(
    store: EventLog, *, limit: int | None = None, status: str | None = None, workflow: str | None = None
) -> list[dict[str, Any]]:
    """One row per session, most recently updated first."""
    query = SessionQuery(statuses=frozenset({status}) if status else None, workflow=workflow or None)
    return session_rows(store, store.find_sessions(query, limit=limit))


def session_rows(store: EventLog, sessions: list[SessionInfo]) -> list[dict[str, Any]]:
    """The ``runs`` rows of ``sessions`` (already selected, in the order given)."""
    if not sessions:
        return []
    wanted = {s.session_id for s in sessions}
    runs = [r for s in sessions for r in store.node_runs(s.session_id)]  # indexed by session
    origins = origin_failures(runs)
    enclosing = open_containers(runs)
    codes = session_error_codes(runs, origins)
    per: dict[str, dict[str, Any]] = {
        sid: {"node_runs": 0, "open_runs": 0, "failed_runs": 0, "error_code": codes.get(sid)}
        for sid in wanted
    }
    for r in runs:
        acc = per[r.session_id]
        acc["node_runs"] += 1
        if r.status in OPEN_STATES and (r.session_id, r.path) not in enclosing:
            acc["open_runs"] += 1
        if (r.session_id, r.path) in origins:
            acc["failed_runs"] += 1
    rows = []
    for s in sessions:
        duration = (
            (s.updated_at - s.started_at) if s.started_at is not None and s.updated_at is not None else None
        )
        rows.append(
            {
                "session_id": s.session_id,
                "workflow": s.workflow,
                "status": s.status,
                "started_at": s.started_at,
                "updated_at": s.updated_at,
                "duration_s": round_or_none(duration),
                "invocations": s.invocations,
                "events": s.last_seq,
                **per[s.session_id],
                "owner": owner_row(s),
            }
        )
    return rows


# --------------------------------------------------------------------------- show


def node_tree(ws: WorkflowState) -> list[tuple[NodeState, int]]:
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
    for ns, depth in node_tree(ws):
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
                "start_offset_s": round_or_none(start - t0) if start is not None and t0 is not None else None,
                "duration_s": round_or_none(end - start) if start is not None and end is not None else None,
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
                "requests": [request_row(req) for req in ns.requests.values()]
                if ns.status == "waiting_input"
                else [],
                "retried": list(history.retried.get(ns.path, ())) if history is not None else [],
                "segments": list(history.segments.get(ns.path, ())) if history is not None else [],
                "owner": owner,
            }
        )
    return rows
