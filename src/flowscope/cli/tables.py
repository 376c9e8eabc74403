"""The tables people read: one function per listing, shared by the commands and the demo.

The rows come from :mod:`.views`; :mod:`.render` draws them. ``flowscope demo`` prints the
same header, waterfall and audit table as ``flowscope show`` and ``flowscope audit``.
"""

from __future__ import annotations

from typing import Any

import click

from ..engine.pauses import continued_in, waiting_on
from ..events import InputRequested, JobDispatched
from ..fold import WorkflowState
from .render import fmt_duration, fmt_time, one_line_text, render_table, table_width, zone_name
from .views import input_hint, job_hint

__all__ = ["runs_table", "session_header", "pending_hint", "audit_table", "stuck_table"]


def runs_table(rows: list[dict[str, Any]], filters: str = "") -> str:
    """``flowscope runs``: one line per session; ``filters`` (e.g. ``--status cancelled``)
    are the options that narrowed the list, named when nothing matched them."""
    if not rows:
        if filters:
            return f"no sessions match {filters} (`flowscope runs` lists them all)"
        return "no sessions yet: run `flowscope demo`, or point --db at your database"
    return render_table(
        rows,
        [
            ("SESSION", lambda r: r["session_id"]),
            ("WORKFLOW", lambda r: r["workflow"]),
            ("STATUS", lambda r: r["status"]),
            (f"STARTED ({zone_name()})", lambda r: fmt_time(r["started_at"])),
            ("DURATION", lambda r: fmt_duration(r["duration_s"])),
            ("INVOCATIONS", lambda r: r["invocations"]),
            ("EVENTS", lambda r: r["events"]),
            ("OPEN", lambda r: r["open_runs"]),
            ("ERROR", lambda r: r["error_code"] or ""),
        ],
        color_key="STATUS",
    )


def session_header(ws: WorkflowState) -> list[str]:
    """The lines above a session's waterfall: status, counts, and where it failed.

    They fit the terminal as the tables do (:func:`.render.table_width`): the first line's
    parts go on as many lines as they need, the failure's message is cut with ``…``
    (``--wide``, ``flowscope events`` print it whole)."""
    limit = table_width()
    status = click.style(
        ws.status, fg={"completed": "green", "failed": "red", "paused": "yellow"}.get(ws.status)
    )
    dur = (ws.updated_at - ws.started_at) if ws.started_at is not None and ws.updated_at is not None else None
    parts = [
        (f"session {ws.session_id}", None),
        (f"workflow {ws.workflow}", None),
        (status, ws.status),
        (f"{ws.invocations} invocation(s)", None),
        (f"{ws.last_seq} events", None),
    ]
    lines: list[str] = []
    line, width = "", 0
    for text, plain in parts:
        if plain is None and limit is not None and len(text) > limit:
            text = text[: max(limit - 1, 0)] + "…"
        n = len(plain if plain is not None else text)
        if line and limit is not None and width + 3 + n > limit:
            lines.append(line)
            line, width = "", 0
        line, width = (f"{line}   {text}", width + 3 + n) if line else (text, n)
    lines.append(line)
    lines.append(f"started {fmt_time(ws.started_at, zone=True)}, last event {fmt_duration(dur)} later")
    if ws.status == "failed":
        ns = ws.nodes.get(ws.error_path) if ws.error_path else None
        msg = f": {one_line_text(ns.error_message)}" if ns is not None and ns.error_message else ""
        text = f"failed at {ws.error_path}: {ws.error_code}{msg}"
        if limit is not None and len(text) > limit:
            text = text[: max(limit - 1, 0)] + "…"
        lines.append(click.style(text, fg="red"))
    return lines


def pending_hint(ws: WorkflowState, prefix: str) -> list[str]:
    """What a paused session waits on, each with the ``resume`` that answers it, after
    ``prefix``: pass :func:`.app.command_prefix` of the database the session was read
    from, so that the command pasted as printed answers it there. The bare ``flowscope``
    of the default names ``./flowscope.db`` (or ``$FLOWSCOPE_DB``), right only for that."""
    pending = ws.pending
    if not pending:
        return []
    if ws.engine is not None:  # a bridge's session: only its engine answers it
        return ["", f"waiting on {waiting_on(ws)}: {continued_in(ws.engine)}"]
    out = ["", "waiting on:"]
    for p in pending:
        if isinstance(p, InputRequested):
            prompt = one_line_text(p.prompt)
            out.append(
                f"  input {p.interrupt_id!r}: {prompt}   -> {input_hint(ws.session_id, p.interrupt_id, p.payload, prefix=prefix)}"
            )
            payload = p.payload if isinstance(p.payload, dict) else {}
            if payload.get("fix"):
                out.append(f"    fix: {one_line_text(str(payload['fix']))}")
        elif isinstance(p, JobDispatched):
            out.append(f"  job {p.job_id} ({p.path})   -> {job_hint(ws.session_id, p.job_id, prefix=prefix)}")
            out.append(
                f"    idempotency key {p.idempotency_key or '-'}; dispatched {fmt_time(p.ts, zone=True)}"
            )
    return out


def audit_table(rows: list[dict[str, Any]], by: str) -> str:
    """``flowscope audit``: one row per workflow and node (``by="node"``) or per node run."""
    if by == "run":
        return render_table(
            rows,
            [
                ("SESSION", lambda r: r["session_id"]),
                ("PATH", lambda r: r["path"]),
                ("STATUS", lambda r: r["status"]),
                ("ATTEMPTS", lambda r: r["attempts"]),
                ("RETRIES", lambda r: r["retries"]),
                ("RECOVERIES", lambda r: r["recoveries"]),
                ("ERROR", lambda r: r["error_code"] or ""),
                (
                    "RETRIED",
                    lambda r: ", ".join(
                        f"{a['attempt']}: {a['error_type']} [{a['error_code']}]" for a in r["retried"]
                    ),
                ),
            ],
            color_key="STATUS",
            empty="no node runs",
        )
    return render_table(
        rows,
        [
            ("WORKFLOW", lambda r: r["workflow"]),
            ("NODE", lambda r: r["node"]),
            ("KIND", lambda r: ("root " if r["root"] else "") + r["kind"]),
            ("RUNS", lambda r: r["runs"]),
            ("ATTEMPTS", lambda r: r["attempts"]),
            ("MAX", lambda r: r["max_attempt"]),
            ("RETRIES", lambda r: r["retries"]),
            ("RECOVERIES", lambda r: r["recoveries"]),
            ("OK", lambda r: r["completed"]),
            ("FAILED", lambda r: r["failed"]),
            ("OPEN", lambda r: r["open"]),
            ("ERRORS", lambda r: r["error_codes"] or ""),
            ("RETRIED FOR", lambda r: r["retry_errors"] or ""),
        ],
        empty="no node runs",
    )


def stuck_table(rows: list[dict[str, Any]]) -> str:
    """``flowscope stuck``: open runs with their state and the next thing to do."""
    return render_table(
        rows,
        [
            ("SESSION", lambda r: r["session_id"]),
            ("PATH", lambda r: r["path"]),
            ("STATE", lambda r: r["state"]),
            ("AGE", lambda r: fmt_duration(r["age_s"])),
            (
                "HEARTBEAT",
                lambda r: (
                    (fmt_duration(r["heartbeat_age_s"]) + " ago") if r["heartbeat_age_s"] is not None else "-"
                ),
            ),
            ("ATT", lambda r: r["attempt"]),
            ("WAITING ON", lambda r: r["waiting_on"] or ""),
            ("NEXT", lambda r: r["action"]),
        ],
        color_key="STATE",
        empty="nothing stuck",
        fixed=("NEXT",),  # a command to paste is never cut: the other columns give way
    )
