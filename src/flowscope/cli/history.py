"""What only the log itself knows, for ``show``, ``audit`` and ``events``.

The projections keep the latest state of a run; the waterfall's segments (one per
invocation that ran a node), the error of every retried attempt and the events as
written need the log. Everything here reads event fields by the catalog's names
(:mod:`flowscope.events`) and never interprets them beyond that: what a run *is* stays the
fold's business.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..events import TERMINAL_TYPES, Event, InputRequested, NodeRetrying, RunStarted, to_dict
from ..store.base import EventLog, NodeRun

__all__ = [
    "EVENT_KEYS",
    "PAYLOAD_FIELDS",
    "RetryReasons",
    "SessionHistory",
    "session_history",
    "retry_reasons",
    "retry_label",
    "request_row",
    "event_rows",
    "redacted",
]

#: (session, path) -> the retried attempts of that run, oldest first.
RetryReasons = dict[tuple[str, str], list[dict[str, Any]]]

#: The columns of ``flowscope events`` (every other field of an event is in ``fields``).
EVENT_KEYS = ("session_id", "seq", "ts", "type", "invocation_id", "path", "node", "fields")

#: Event fields that carry what a node received or returned, or what a person or a job
#: answered: printed as a size marker unless ``--show-payloads`` (spans never carry them).
PAYLOAD_FIELDS = frozenset({"input", "output", "value", "payload", "data", "values"})


@dataclass(frozen=True, slots=True)
class SessionHistory:
    """Per path: the retried attempts and the segments (one per invocation that ran it, with
    that invocation's ``owner``); and the invocations' windows, ``(started_at, ended_at)`` in order."""

    retried: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    segments: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    windows: list[tuple[float, float]] = field(default_factory=list)


def _retry(e: NodeRetrying) -> dict[str, Any]:
    return {"attempt": e.attempt, "error_type": e.error_type, "error_code": e.error_code}


def session_history(events: Sequence[Event]) -> SessionHistory:
    """Retried attempts, segments and invocation windows of one session's log."""
    retried: dict[str, list[dict[str, Any]]] = {}
    segments: dict[str, list[dict[str, Any]]] = {}
    open_segment: dict[str, dict[str, Any]] = {}
    seg: dict[str, Any] | None
    windows: dict[str, list[float]] = {}
    owners: dict[str, dict[str, Any] | None] = {}  # invocation -> its RunStarted's owner
    for e in events:
        w = windows.setdefault(e.invocation_id, [e.ts, e.ts])
        w[1] = max(w[1], e.ts)
        if not e.path:
            if isinstance(e, RunStarted):
                owners[e.invocation_id] = e.owner
            continue
        if isinstance(e, NodeRetrying):
            retried.setdefault(e.path, []).append(_retry(e))
        elif e.type == "node_started":
            previous = open_segment.pop(e.path, None)
            if previous is not None and previous["ended_at"] is None:  # its process died: no end
                previous["ended_at"] = windows[previous["invocation_id"]][1]
            seg = {
                "invocation_id": e.invocation_id,
                "started_at": e.ts,
                "ended_at": None,
                "owner": owners.get(e.invocation_id),
            }
            segments.setdefault(e.path, []).append(seg)
            open_segment[e.path] = seg
        elif e.type in TERMINAL_TYPES:
            seg = open_segment.pop(e.path, None)
            if seg is not None:
                seg["ended_at"] = e.ts
    ordered = sorted((a, b) for a, b in windows.values())
    return SessionHistory(retried, segments, ordered)


def retry_reasons(store: EventLog, runs: Iterable[NodeRun]) -> RetryReasons:
    """The retried attempts of ``runs``, read from the logs of the sessions that retried."""
    wanted = {(r.session_id, r.path) for r in runs if r.retries}
    out: RetryReasons = {}
    for sid in sorted({sid for sid, _path in wanted}):
        for e in store.read(sid):
            if isinstance(e, NodeRetrying) and (sid, e.path) in wanted:
                out.setdefault((sid, e.path), []).append(_retry(e))
    return out


def retry_label(attempt: dict[str, Any]) -> str:
    """``InventoryUnavailable [INVENTORY_UNAVAILABLE]``: one retried attempt's reason."""
    return f"{attempt['error_type'] or 'Exception'} [{attempt['error_code']}]"


def request_row(req: InputRequested) -> dict[str, Any]:
    """An open input request: its id and prompt, and for a failed job the problem and the fix."""
    payload = req.payload if isinstance(req.payload, dict) else {}
    return {
        "interrupt_id": req.interrupt_id,
        "prompt": req.prompt,
        "problem": payload.get("problem"),
        "fix": payload.get("fix"),
    }


def redacted(value: Any) -> str:
    """The marker printed instead of a payload: its size as JSON, never its content."""
    try:
        size = len(json.dumps(value, ensure_ascii=False, default=str).encode("utf-8"))
    except (TypeError, ValueError):
        size = len(repr(value).encode("utf-8"))
    return f"<redacted: {size} bytes>"


def event_rows(events: Iterable[Event], *, show_payloads: bool = False) -> list[dict[str, Any]]:
    """Every event with every field; payload fields (:data:`PAYLOAD_FIELDS`) redacted unless asked."""
    rows = []
    for e in events:
        d = to_dict(e)
        extra = {
            k: (v if show_payloads or k not in PAYLOAD_FIELDS or v is None else redacted(v))
            for k, v in d.items()
            if k not in EVENT_KEYS and k != "schema_version"
        }
        rows.append(
            {
                "session_id": e.session_id,
                "seq": e.seq,
                "ts": e.ts,
                "type": e.type,
                "invocation_id": e.invocation_id,
                "path": e.path,
                "node": e.node,
                "fields": extra,
            }
        )
    return rows
