"""What the console's ``/api/`` serves, as plain data: the CLI's views, selected and paged.

Every row is one of :mod:`flowscope.cli.views` or :mod:`flowscope.cli.history`, built by
the functions the CLI's ``--format json`` prints: ``/api/sessions`` and ``flowscope runs
--format json`` have the same keys. What only the console needs (the attention tabs, from
:mod:`.attention`; a waterfall on a compressed axis, a run's attempts) is built here from
the same rows, the store's projections and the one fold. Nothing here writes (:mod:`.app` calls the writes:
:mod:`flowscope.actions` and :mod:`flowscope.answers`).
"""

from __future__ import annotations

import calendar
import dataclasses
import math
import time
import weakref
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ..cli import views
from ..cli.history import event_rows, request_row, retry_reasons, session_history
from ..cli.waterfall import waterfall_layout
from ..engine.pauses import continued_in
from ..errors import UnknownSessionError
from ..events import TERMINAL_TYPES, Event, NodeRetrying, NodeStarted, RunStarted
from ..fold import rebuild
from ..store.base import EventStore, SessionInfo, SessionQuery
from .attention import ATTENTION, TabReads, Tabs, attention_tabs, read_tabs
from .live import ChangeFeed

__all__ = [
    "ATTENTION",
    "STATUSES",
    "MAX_LIMIT",
    "MAX_OFFSET",
    "SessionFilter",
    "parse_filter",
    "parse_time",
    "Tabs",
    "TabReads",
    "read_tabs",
    "attention_tabs",
    "session_query",
    "list_sessions",
    "session_waterfall",
    "WATERFALL_COLUMNS",
    "run_detail",
    "attempt_rows",
    "session_events",
    "stuck",
    "audit",
]

#: A session's statuses (``flowscope runs --status`` plus the worker's).
STATUSES = ("queued", "running", "paused", "answered", "completed", "failed", "cancelled")
#: The most rows one page of sessions holds.
MAX_LIMIT = 500
#: The furthest page starts: a store's OFFSET is a 64-bit integer (SQLite overflows past it).
MAX_OFFSET = 10**15


@dataclass(frozen=True, slots=True)
class SessionFilter:
    """The list's filters, as the page's URL and ``GET /api/sessions`` carry them."""

    status: str | None = None
    workflow: str | None = None
    since: float | None = None  # updated at or after (epoch seconds)
    until: float | None = None  # updated at or before
    error_code: str | None = None
    owner: str | None = None  # text in the owner's worker id or host
    q: str | None = None  # text in the session id
    attention: str | None = None  # one of ATTENTION
    limit: int = 50
    offset: int = 0


def parse_time(text: str, now: float) -> float:
    """Epoch seconds from ``1700000000``, ``2026-12-02``, ``2026-12-02T13:50:00`` (UTC) or
    a duration ago (``15m``, ``2h``, ``1d``)."""
    s = text.strip()
    try:
        seconds = float(s)
    except ValueError:
        pass
    else:
        if math.isfinite(seconds):
            return seconds
        raise ValueError(f"{text!r} is not a time: give epoch seconds, a UTC date or a duration ago")
    for fmt in ("%Y-%m-%dT%H:%M:%S", "%Y-%m-%dT%H:%M", "%Y-%m-%d %H:%M:%S", "%Y-%m-%d %H:%M", "%Y-%m-%d"):
        try:
            return float(calendar.timegm(time.strptime(s.rstrip("Z"), fmt)))
        except ValueError:
            continue
    try:
        return now - views.parse_duration(s)
    except ValueError:
        raise ValueError(
            f"{text!r} is not a time: give epoch seconds, a UTC date (2026-12-02T13:50), or a duration ago (15m)"
        ) from None


def parse_filter(params: Mapping[str, str], now: float | None = None) -> SessionFilter:
    """A :class:`SessionFilter` from query parameters; ``ValueError`` names a bad one."""
    now = time.time() if now is None else now

    def text(name: str) -> str | None:
        v = (params.get(name) or "").strip()
        return v or None

    status = text("status")
    if status is not None and status not in STATUSES:
        raise ValueError(f"status must be one of {', '.join(STATUSES)}, not {status!r}")
    attention = text("attention")
    if attention is not None and attention not in ATTENTION:
        raise ValueError(f"attention must be one of {', '.join(ATTENTION)}, not {attention!r}")
    try:
        limit = int(params.get("limit") or 50)
        offset = int(params.get("offset") or 0)
    except ValueError:
        raise ValueError("limit and offset are whole numbers") from None
    if not 1 <= limit <= MAX_LIMIT or not 0 <= offset <= MAX_OFFSET:
        raise ValueError(f"limit is 1 to {MAX_LIMIT}, offset 0 to {MAX_OFFSET:,}")
    since, until = text("since"), text("until")
    return SessionFilter(
        status=status,
        workflow=text("workflow"),
        since=parse_time(since, now) if since else None,
        until=parse_time(until, now) if until else None,
        error_code=text("error_code"),
        owner=text("owner"),
        q=text("q"),
        attention=attention,
        limit=limit,
        offset=offset,
    )


# --------------------------------------------------------------------------- the list


class _FeedCache:
    """What the list reuses between requests of one console, per store version: every
    session's error code (from the failed runs alone), and the attention tabs: the store's
    part read once per version (:func:`read_tabs`), so every open page refreshing after a
    change costs the store one read of the open runs, and the rule applied once a second."""

    def __init__(self) -> None:
        self._codes: tuple[int, dict[str, str]] | None = None
        self._reads: tuple[int, TabReads] | None = None
        self._tabs: tuple[tuple[int, int, float, float], Tabs] | None = None

    def tabs(
        self, store: EventStore, version: int, now: float, stale_after_s: float, queued_after_s: float
    ) -> Tabs:
        key = (version, int(now), stale_after_s, queued_after_s)
        if self._tabs is None or self._tabs[0] != key:
            if self._reads is None or self._reads[0] != version:
                self._reads = (version, read_tabs(store))
            tabs = attention_tabs(
                store,
                now=now,
                stale_after_s=stale_after_s,
                queued_after_s=queued_after_s,
                reads=self._reads[1],
            )
            self._tabs = (key, tabs)
        return self._tabs[1]

    def codes(self, store: EventStore, version: int) -> dict[str, str]:
        if self._codes is None or self._codes[0] != version:
            self._codes = (version, views.session_error_codes(store.find_node_runs(frozenset({"failed"}))))
        return self._codes[1]


#: One cache per change feed (per console, per store).
_CACHES: weakref.WeakKeyDictionary[ChangeFeed, _FeedCache] = weakref.WeakKeyDictionary()


def _both(a: frozenset[str] | None, b: frozenset[str] | None) -> frozenset[str] | None:
    return b if a is None else a if b is None else a & b


def session_query(f: SessionFilter, tab: SessionQuery | None = None) -> SessionQuery:
    """The store's query for the list's filters (except ``error_code``), narrowed to an
    attention tab's sessions when one is chosen."""
    query = SessionQuery(
        statuses=frozenset({f.status}) if f.status is not None else None,
        workflow=f.workflow,
        updated_since=f.since,
        updated_until=f.until,
        id_contains=f.q,
        owner_contains=f.owner,
    )
    if tab is None:
        return query
    return dataclasses.replace(
        query,
        statuses=_both(query.statuses, tab.statuses),
        session_ids=tab.session_ids,
        submitted_until=tab.submitted_until,
    )


def list_sessions(
    feed: ChangeFeed,
    f: SessionFilter,
    *,
    now: float | None = None,
    stale_after_s: float = 60.0,
    queued_after_s: float = 60.0,
) -> tuple[list[dict[str, Any]], int, dict[str, int]]:
    """One page of ``runs`` rows (most recently updated first), how many sessions match,
    and the count of every attention tab (over the whole store).

    The store selects, counts and cuts the page: a console beside a million sessions reads
    fifty of them per page, not every one (which took 11 s and 1.6 GB per change)."""
    now = time.time() if now is None else now
    store = feed.store
    cache = _CACHES.setdefault(feed, _FeedCache())
    version = feed.version()
    tabs = cache.tabs(store, version, now, stale_after_s, queued_after_s)
    query = session_query(f, tabs.queries[f.attention] if f.attention is not None else None)
    if f.error_code is not None:
        coded = frozenset(sid for sid, code in cache.codes(store, version).items() if code == f.error_code)
        within = query.session_ids  # an attention tab's sessions (maybe none), or None: all
        query = dataclasses.replace(query, session_ids=coded if within is None else coded & within)
    page = store.find_sessions(query, limit=f.limit, offset=f.offset)
    counts = tabs.statuses if query == SessionQuery() else store.status_counts(query)
    total = sum(counts.values())
    return views.session_rows(store, page), total, dict(tabs.counts)


# --------------------------------------------------------------------------- a session


def _load(store: EventStore, session_id: str) -> list[Event]:
    log = store.read(session_id)
    if not log:
        raise UnknownSessionError(f"no session {session_id!r} in the store")
    return log


def _owner(info: SessionInfo | None) -> dict[str, Any] | None:
    return views.owner_row(info)


#: The fields of each row :func:`session_waterfall` gives, in order.
WATERFALL_COLUMNS: tuple[str, ...] = ("path", "name", "depth", "status", "kind", "attempts", "retries")
WATERFALL_COLUMNS += ("recoveries", "start_offset_s", "duration_s", "segments", "has_children", "error_code")


def session_waterfall(
    store: EventStore, session_id: str, *, width: float = 1000.0, gap_width: float = 40.0
) -> dict[str, Any]:
    """Everything the session page draws, from one read of the log: the session (status,
    times, owner, its error), a row per node path in ``show`` order (depth-first, the
    fold's fields), each row's segments (one per invocation that ran it) on the compressed
    axis of :func:`flowscope.cli.waterfall.waterfall_layout` (the layout ``flowscope show``
    draws), the gaps, and what the session waits on.

    It reads the fold's node states directly rather than building every ``show`` row
    (``GET /api/sessions/{id}`` serves those) and the session's ``runs`` row (which reads
    every node run again): for a session of 10,000 runs that halves the server's time
    (measured: 1.8 s to 0.4-1.0 s on a loaded 2-core machine); a run's full ``show`` row
    comes with its detail (:func:`run_detail`)."""
    log = _load(store, session_id)
    ws = rebuild(log)
    info = store.session_info(session_id)
    history = session_history(log)
    tree = views.node_tree(ws)
    t0 = ws.started_at
    parents = {ns.parent_path for ns, _depth in tree}
    light = [
        {"started_at": ns.started_at, "ended_at": ns.ended_at, "segments": history.segments.get(ns.path)}
        for ns, _depth in tree
    ]
    layout = waterfall_layout(
        light, width=width, gap_width=gap_width, end_ts=ws.updated_at, windows=history.windows
    )
    compact = []
    for (ns, depth), segs in zip(tree, layout.pop("segments")):
        start, end = ns.started_at, ns.ended_at
        compact.append(
            [
                ns.path,
                ns.path.rsplit("/", 1)[-1],
                depth,
                ns.status,
                ns.kind,
                ns.attempt,
                ns.retries,
                ns.recoveries,
                round(start - t0, 3) if start is not None and t0 is not None else None,
                round(end - start, 3) if start is not None and end is not None else None,
                segs,
                ns.path in parents,
                ns.error_code if ns.status == "failed" else None,
            ]
        )
    waiting: list[dict[str, Any]] = []
    for ns, _depth in tree:
        if ns.status == "waiting_input":
            for req in ns.requests.values():
                waiting.append(
                    {
                        "kind": "input",
                        "path": ns.path,
                        **request_row(req),
                        "actions": _actions(ws, ns.path, req.interrupt_id),
                    }
                )
        elif ns.status == "waiting_job":
            for job in ns.open_jobs:
                waiting.append(
                    {
                        "kind": "job",
                        "path": ns.path,
                        "job_id": job.job_id,
                        "expect_count": job.expect_count,
                        "deadline_s": job.deadline_s,
                        "keys": ["success", "count", "data", "error"]
                        if job.expect_count
                        else ["success", "data", "error"],
                    }
                )
    return {
        "session": {
            "session_id": session_id,
            "workflow": ws.workflow,
            "status": info.status if info is not None else ws.status,
            "started_at": ws.started_at,
            "updated_at": ws.updated_at,
            "error_code": ws.error_code,
            "error_path": ws.error_path,
            "owner": _owner(info),
            # a bridge's session: its engine continues it, flowscope's actions are refused
            "engine": ws.engine,
            "continued_in": continued_in(ws.engine) if ws.engine is not None else None,
        },
        "status": info.status if info is not None else ws.status,
        "workflow": ws.workflow,
        "last_seq": ws.last_seq,
        # the store's count, as `flowscope runs` shows it: a queued session has run none
        "invocations": info.invocations if info is not None else len(history.windows),
        "columns": list(WATERFALL_COLUMNS),
        "rows": compact,
        "axis": layout,
        "waiting": waiting,
    }


def _actions(ws: Any, path: str, interrupt_id: str) -> list[str]:
    ns = ws.nodes.get(path)
    req = ns.requests.get(interrupt_id) if ns is not None else None
    payload = req.payload if req is not None and isinstance(req.payload, dict) else {}
    return list(payload.get("actions") or ()) if payload.get("kind") == "job_failed" else []


def _attempt(
    attempt: int, invocation_id: str, started_at: float, recovered: bool, owner: dict[str, Any] | None
) -> dict[str, Any]:
    return {
        "attempt": attempt,
        "invocation_id": invocation_id,
        "owner": owner,
        "started_at": started_at,
        "ended_at": None,
        "recovered": recovered,
        "outcome": None,
        "error_type": None,
        "error_code": None,
        "error_message": None,
    }


def attempt_rows(log: Sequence[Event], path: str) -> list[dict[str, Any]]:
    """The attempts of the run at ``path``, oldest first: each one's number, invocation,
    ``owner`` (the worker that ran it, as its invocation's ``RunStarted`` recorded it), start,
    end, outcome (completed, retried, failed, cancelled, paused, lost: its process
    died before it ended), and for a failed or retried attempt its error type, code and
    message (redacted where it was recorded)."""
    out: list[dict[str, Any]] = []
    current: dict[str, Any] | None = None
    owners: dict[str, dict[str, Any] | None] = {}
    for e in log:
        if e.path != path:
            if isinstance(e, RunStarted):
                owners[e.invocation_id] = e.owner
            continue
        if isinstance(e, NodeStarted):
            if current is not None and current["outcome"] is None:
                current["outcome"] = "lost"
            current = _attempt(e.attempt, e.invocation_id, e.ts, e.recovered, owners.get(e.invocation_id))
            out.append(current)
        elif current is None:
            continue
        elif isinstance(e, NodeRetrying):
            # the next attempt starts after the delay, inside the same run: no NodeStarted
            current.update(
                ended_at=e.ts,
                outcome="retried",
                error_type=e.error_type,
                error_code=e.error_code,
                error_message=e.error_message,
            )
            current = _attempt(e.attempt + 1, e.invocation_id, e.ts + e.delay_s, False, current["owner"])
            out.append(current)
        elif e.type in TERMINAL_TYPES and current["outcome"] is None:
            outcome = {
                "node_completed": "completed",
                "node_error": "failed",
                "node_error_propagated": "failed",
                "node_cancelled": "cancelled",
            }.get(e.type, "paused")
            current.update(
                ended_at=e.ts,
                outcome=outcome,
                error_type=getattr(e, "error_type", None) or current["error_type"],
                error_code=getattr(e, "error_code", None) or current["error_code"],
                error_message=getattr(e, "error_message", None) or current["error_message"],
            )
    for a in out:
        a["duration_s"] = round(a["ended_at"] - a["started_at"], 3) if a["ended_at"] is not None else None
    return out


def run_detail(store: EventStore, session_id: str, path: str) -> dict[str, Any]:
    """One run: its ``show`` row, its attempts (:func:`attempt_rows`) and its ``events``
    rows (payloads redacted, as ``flowscope events`` prints them)."""
    log = _load(store, session_id)
    ws = rebuild(log)
    if path not in ws.nodes:
        raise UnknownSessionError(f"session {session_id!r} has no run at {path!r}")
    history = session_history([e for e in log if e.path in ("", path)])
    row = next(r for r in views.show_rows(ws, store.session_info(session_id), history) if r["path"] == path)
    return {
        "row": row,
        "attempts": attempt_rows(log, path),
        "events": event_rows([e for e in log if e.path == path]),
    }


def session_events(
    store: EventStore,
    session_id: str,
    *,
    types: Iterable[str] = (),
    path: str | None = None,
    failures: bool = False,
) -> list[dict[str, Any]]:
    """The session's ``events`` rows (payloads redacted), narrowed by type, by path (the
    path and everything below it) and to failures (errors and retried attempts)."""
    wanted = set(types)
    log = _load(store, session_id)
    if wanted:
        log = [e for e in log if e.type in wanted]
    if path:
        log = [e for e in log if e.path == path or e.path.startswith(path + "/")]
    if failures:
        log = [
            e
            for e in log
            if e.type in ("node_error", "node_error_propagated", "node_retrying")
            or getattr(e, "status", None) == "failed"
        ]
    return event_rows(log)


def stuck(
    store: EventStore,
    *,
    older_than_s: float = 0.0,
    stale_after_s: float = 60.0,
    states: Iterable[str] = (),
    prefix: str,
) -> list[dict[str, Any]]:
    """The rows of ``flowscope stuck`` (a corrupt session left out, as the CLI does), each
    ``action`` after ``prefix``."""
    states = list(states)
    unknown = [s for s in states if s not in views.STUCK_STATES]
    if unknown:
        raise ValueError(f"state must be one of {', '.join(views.STUCK_STATES)}, not {unknown[0]!r}")
    return views.stuck_rows(store, older_than_s, stale_after_s, states=list(states) or None, prefix=prefix)


def audit(store: EventStore, *, workflow: str | None = None, by: str = "node") -> list[dict[str, Any]]:
    """The rows of ``flowscope audit`` (``by="run"``: of ``audit --by run``)."""
    if by != "run":
        return views.store_audit_rows(store, workflow or None)
    runs = store.find_node_runs(workflow=workflow or None)
    return views.audit_run_rows(runs, retry_reasons(store, runs))
