"""The commands that read the store and never write it: runs, show, audit, stuck, events, export."""

from __future__ import annotations

import shlex
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from ..errors import StoreLocked, StoreUnavailable, mask_url_credentials
from ..fold import WorkflowState, rebuild
from ..store.base import FINISHED_SESSION_STATUSES, SESSION_STATUSES
from . import views
from .app import (
    DURATION,
    POSITIVE_DURATION,
    command_prefix,
    db_option,
    emit,
    format_option,
    open_store,
    otlp_protocol_option,
    resolve_db,
    shown_db,
    wide_option,
)
from .failures import EXIT_FAILED, CliError, one_line, unknown_session
from .history import EVENT_KEYS, event_rows, retry_reasons, session_history
from .render import fmt_time, invocation_label, render_table, waterfall_lines, zone_name
from .runtime import follower_exporter, quiet_exporter_logs
from .tables import audit_table, pending_hint, runs_table, session_header, stuck_table

if TYPE_CHECKING:
    from ..store.base import EventStore

__all__ = ["runs", "show", "audit", "stuck", "events", "export", "COMMANDS"]


@click.command()
@db_option
@format_option
@wide_option
@click.option(
    "--limit",
    type=click.IntRange(0, 2**63 - 1),  # a store's integer: a larger one is a typing slip
    default=50,
    show_default=True,
    help="At most this many sessions (0: all).",
)
@click.option("--status", type=click.Choice(list(SESSION_STATUSES)), help="Only sessions with this status.")
@click.option("--workflow", help="Only sessions of this workflow.")
def runs(db: str | None, fmt: str, limit: int, status: str | None, workflow: str | None) -> None:
    """List sessions, most recently updated first."""
    with open_store(db) as store:
        rows = views.runs_rows(store, limit=limit or None, status=status, workflow=workflow)
    filters = " ".join(
        f"{opt} {shlex.quote(v)}" for opt, v in (("--status", status), ("--workflow", workflow)) if v
    )
    emit(rows, fmt, views.RUN_KEYS, lambda: runs_table(rows, filters))


def _session_view(
    store: EventStore, session: str, where: str, prefix: str
) -> tuple[WorkflowState, list[dict[str, Any]], Callable[[], str]]:
    """A session's state, its ``show`` rows and the table people read (header, waterfall,
    what it waits on), from one read of its log and its owner."""
    log = store.read(session)
    if not log:
        raise unknown_session(session, where)
    ws = rebuild(log)
    history = session_history(log)
    rows = views.show_rows(ws, store.session_info(session), history)

    def table() -> str:
        waterfall = waterfall_lines(rows, end_ts=ws.updated_at, windows=history.windows)
        return "\n".join(session_header(ws) + [""] + waterfall + pending_hint(ws, prefix))

    return ws, rows, table


@click.command()
@click.argument("session")
@db_option
@format_option
@wide_option
@click.option(
    "--follow", "-f", is_flag=True, help="Redraw the table as the session advances, until it ends or Ctrl-C."
)
@click.option(
    "--interval",
    type=POSITIVE_DURATION,
    default="1s",
    show_default=True,
    help="With --follow: how often to look for new events.",
)
def show(session: str, db: str | None, fmt: str, follow: bool, interval: float) -> None:
    """Waterfall of a session's node runs, from its event log.

    Paths indented by depth, start offset, duration, status, attempts, errors (code and
    message), retried attempts (type and code), pauses (interrupt ids, and a failed job's
    fix), jobs (ids, idempotency keys and results) and the last heartbeat of a running run.
    """
    if follow:
        if fmt != "table":
            raise CliError(
                "--follow redraws the table: drop --format, or poll `flowscope show --format json`"
            )
        _follow(db, session, interval)
        return
    store = open_store(db)
    with store:
        _ws, rows, table = _session_view(
            store, session, shown_db(resolve_db(db)), command_prefix(resolve_db(db))
        )
    emit(rows, fmt, views.SHOW_KEYS, table)


def _follow(db: str | None, session: str, interval: float) -> None:
    """Draw the session's table, then again each time its log grows, until it is over."""
    tty = sys.stdout.isatty()
    last = -1
    said = False  # that the store does not answer, once per outage
    try:
        while True:
            try:
                with open_store(db) as store:
                    changed = store.last_seq(session) != last
                    view = (
                        _session_view(
                            store, session, shown_db(resolve_db(db)), command_prefix(resolve_db(db))
                        )
                        if changed
                        else None
                    )
            except (StoreUnavailable, StoreLocked) as exc:
                if last < 0:  # nothing drawn yet: a wrong URL, not a restart
                    raise
                if not said:  # once following, a server that went away (a restart) is waited for
                    click.echo(f"{one_line(exc)} (retrying every {max(interval, 1.0):g}s)", err=True)
                    said = True
                time.sleep(max(interval, 1.0))
                continue
            said = False
            if view is not None:
                ws, _rows, table = view
                last = ws.last_seq
                if tty:
                    click.clear()
                click.echo(table())
                click.echo(
                    click.style(
                        f"-- {fmt_time(time.time(), zone=True)}: {ws.status}, {last} events", dim=True
                    )
                )
                if ws.status in FINISHED_SESSION_STATUSES:  # over: --follow stops
                    return
                click.echo("")
            time.sleep(max(interval, 0.05))
    except KeyboardInterrupt:  # the way to stop following a session that is still going
        return


@click.command()
@db_option
@format_option
@wide_option
@click.option(
    "--session", "sessions", multiple=True, metavar="SESSION", help="Only this session (repeatable)."
)
@click.option("--workflow", help="Only this workflow.")
@click.option(
    "--by",
    type=click.Choice(["node", "run"]),
    default="node",
    show_default=True,
    help="One row per workflow and node, or per node run.",
)
def audit(db: str | None, fmt: str, sessions: tuple[str, ...], workflow: str | None, by: str) -> None:
    """Attempts, retries, recoveries and errors per workflow and node.

    From the store's node_runs projection; the type and code of every retried attempt
    come from the logs of the sessions that retried. A workflow's root run and a node of
    the same name are separate rows (KIND). ERRORS counts the failures where they began;
    an enclosing workflow that failed because of them is in FAILED only.
    """
    store = open_store(db)
    keys: tuple[str, ...] = views.AUDIT_RUN_KEYS if by == "run" else views.AUDIT_KEYS
    with store:
        if not sessions and by == "node":  # the store counts: no run is held
            rows = views.store_audit_rows(store, workflow or None)
            emit(rows, fmt, keys, lambda: audit_table(rows, by))
            return
        if sessions:
            for sid in sessions:
                if not store.has_session(sid):
                    raise unknown_session(sid, shown_db(resolve_db(db)))
            node_runs = [r for sid in sessions for r in store.node_runs(sid)]
            node_runs = [r for r in node_runs if not workflow or r.workflow == workflow]
        else:
            node_runs = store.find_node_runs(workflow=workflow or None)
        retried = retry_reasons(store, node_runs)
    by_run = by == "run"
    rows = views.audit_run_rows(node_runs, retried) if by_run else views.audit_rows(node_runs, retried)
    emit(rows, fmt, keys, lambda: audit_table(rows, by))


@click.command()
@db_option
@format_option
@wide_option
@click.option(
    "--older-than",
    type=DURATION,
    default="15m",
    show_default=True,
    help="Only running and waiting runs started, and queued sessions submitted, longer ago than this (orphaned runs: at once).",
)
@click.option(
    "--stale-after",
    type=DURATION,
    default="60s",
    show_default=True,
    help="A running run whose heartbeat is older than this is orphaned (its worker died).",
)
@click.option(
    "--state",
    "states",
    multiple=True,
    type=click.Choice(list(views.STUCK_STATES)),
    help="Only these states (repeatable).",
)
@click.option(
    "--all",
    "include_parents",
    is_flag=True,
    help="Also list enclosing runs (workflow nodes, parents of dynamic children).",
)
@click.option("--fail-if-any", is_flag=True, help="Exit 1 when anything is listed (for cron and CI checks).")
def stuck(
    db: str | None,
    fmt: str,
    older_than: float,
    stale_after: float,
    states: tuple[str, ...],
    include_parents: bool,
    fail_if_any: bool,
) -> None:
    """What needs an operator: orphaned runs at once; running and waiting runs, and queued
    sessions, older than --older-than.

    \b
    running        started, no end yet, heartbeat fresh: slow, blocked or looping
    orphaned       running, but its owner is gone (or, without one, its heartbeat is older than --stale-after)
    waiting_input  paused for an answer (flowscope resume SESSION --input ID=JSON)
    waiting_job    waiting for an external job's result (--job JOB_ID=JSON)
    overdue        waiting for a job that is past its deadline_s
    queued         submitted (flowscope start) and not started: no live worker serves it, or its claims fail
    """
    with open_store(db) as store:
        rows = views.stuck_rows(
            store,
            older_than,
            stale_after,
            include_parents=include_parents,
            states=states or None,
            on_skip=_warn_skipped,
            prefix=command_prefix(resolve_db(db)),
        )
    emit(rows, fmt, views.STUCK_KEYS, lambda: stuck_table(rows))
    if fail_if_any and rows:
        raise click.exceptions.Exit(EXIT_FAILED)


@click.command()
@click.argument("session")
@db_option
@format_option
@wide_option
@click.option(
    "--show-payloads",
    is_flag=True,
    help="Print inputs, outputs, answers and job data as written (they may hold personal data).",
)
def events(session: str, db: str | None, fmt: str, show_payloads: bool) -> None:
    """The session's event log itself: every event, every field, in order.

    For when the waterfall is not enough. Payloads (a node's input and output, an answer,
    a request's payload, a job's data, state values) are printed as their size, like the
    spans leave them out, unless --show-payloads.
    """
    store = open_store(db)
    with store:
        log = store.read(session)
        if not log:
            raise unknown_session(session, shown_db(resolve_db(db)))
    rows = event_rows(log, show_payloads=show_payloads)

    def table() -> str:
        return render_table(
            rows,
            [
                ("SEQ", lambda r: r["seq"]),
                (f"TIME ({zone_name()})", lambda r: fmt_time(r["ts"]) + f".{int(r['ts'] * 1000) % 1000:03d}"),
                ("TYPE", lambda r: r["type"]),
                ("INVOCATION", lambda r: invocation_label(r["invocation_id"])),
                ("PATH", lambda r: r["path"] or "-"),
                ("FIELDS", lambda r: _fields_cell(r["fields"])),
            ],
            max_width=120,
        )

    emit(rows, fmt, EVENT_KEYS, table)


def _fields_cell(fields: dict[str, Any]) -> str:
    import json

    return " ".join(f"{k}={json.dumps(v, ensure_ascii=False, default=str)}" for k, v in fields.items())


def _warn_skipped(session_id: str, exc: Exception) -> None:
    click.echo(f"flowscope: warning: skipped session {session_id!r}: {one_line(exc)}", err=True)


@click.command()
@click.argument("session", required=False)
@db_option
@click.option(
    "-o",
    "--output",
    type=click.Path(dir_okay=False, writable=True),
    help="Write the OTLP JSON here (default: stdout).",
)
@click.option(
    "--otlp-endpoint",
    metavar="URL",
    help="Send the spans to this OTLP endpoint instead (e.g. http://localhost:4318).",
)
@otlp_protocol_option
@click.option(
    "--service-name", default="flowscope", show_default=True, help="The service.name resource attribute."
)
@click.option(
    "--timeout",
    type=POSITIVE_DURATION,
    default=10.0,
    show_default=True,
    help="Seconds to wait for the endpoint.",
)
@click.option(
    "--follow",
    is_flag=True,
    help="Tail the store and send spans as they are appended (needs --otlp-endpoint).",
)
@click.option(
    "--interval",
    type=POSITIVE_DURATION,
    default=1.0,
    show_default=True,
    help="With --follow: seconds between passes (after a pass that sent nothing, at least 9x what it took).",
)
@click.option(
    "--rounds", type=int, default=None, hidden=True, help="With --follow: stop after this many passes."
)
def export(
    session: str | None,
    db: str | None,
    output: str | None,
    otlp_endpoint: str | None,
    otlp_protocol: str | None,
    service_name: str,
    timeout: float,
    follow: bool,
    interval: float,
    rounds: int | None,
) -> None:
    """Spans of a session rebuilt from its event log, as OTLP JSON or sent to an endpoint.

    The span ids are derived from the session, invocation and path: exporting twice gives
    the same output. The spans mirror what TracingPlugin records live (docs/telemetry.md).

    With --follow (and no SESSION): send the spans of every session as the log ends them,
    from each session's shipping watermark, so spans a killed worker never sent arrive
    once, with the ids its node bodies saw.
    """
    from ..export import ExportError, export_request, send_spans, session_spans, to_otlp_json

    if follow:
        if session is not None or output is not None:  # it sends every session: never dropped unsaid
            dropped = repr(session) if session is not None else "-o"
            raise CliError(
                f"export --follow sends the spans of every session to --otlp-endpoint: drop {dropped} "
                "(export SESSION without --follow writes or sends one session's)"
            )
        _export_follow(db, otlp_endpoint, otlp_protocol, service_name, timeout, interval, rounds)
        return
    if session is None:
        raise CliError("export needs a SESSION (or --follow --otlp-endpoint URL to tail every session)")

    with open_store(db) as store:
        events = store.read(session)
        lost, alive_at = _owner_lost(store, session) if events else (False, None)
    if not events:
        raise unknown_session(session, shown_db(resolve_db(db)))
    if otlp_endpoint:
        spans = session_spans(events, service_name, lost=lost, alive_at=alive_at)
        try:
            send_spans(spans, otlp_endpoint, otlp_protocol, timeout=timeout)
        except ExportError as exc:
            raise CliError(str(exc)) from None
        traces = len({s.context.trace_id for s in spans})
        click.echo(
            f"sent {len(spans)} spans ({traces} traces, one per invocation) of session {session} to {mask_url_credentials(otlp_endpoint)}",
            err=output is None,
        )
    if output or not otlp_endpoint:
        text = to_otlp_json(export_request(events, service_name, lost=lost, alive_at=alive_at))
        if output:
            try:
                Path(output).write_text(text, encoding="utf-8")
            except OSError as exc:
                raise CliError(f"cannot write {output}: {exc.strerror or exc}") from None
            click.echo(f"wrote {output}", err=True)
        else:
            click.echo(text, nl=False)


def _owner_lost(store: Any, session: str) -> tuple[bool, float | None]:
    """Whether the session's owner is gone (a run the log does not end was cut off by its
    death: an error in the export), and the session's last heartbeat in the store."""
    from ..liveness import owner_alive
    from ..observability.shipping import last_heartbeat

    info = store.session_info(session)
    if info is None or owner_alive(info.owner, info.lease_expires_at, time.time()):
        return False, None
    return True, last_heartbeat(store, session)


def _export_follow(
    db: str | None,
    endpoint: str | None,
    protocol: str | None,
    service_name: str,
    timeout: float,
    interval: float,
    rounds: int | None,
) -> None:
    from ..export import ExportError
    from ..observability.export import follow

    if not endpoint:
        raise CliError("--follow sends spans: give --otlp-endpoint URL (e.g. http://localhost:4318)")
    exporter = follower_exporter(endpoint, protocol, timeout)
    said: set[str] = set()
    try:
        with open_store(db, write=True) as store, quiet_exporter_logs():
            while True:
                try:
                    follow(
                        store,
                        exporter,
                        service_name=service_name,
                        interval=interval,
                        rounds=rounds,
                        on_sent=lambda n: click.echo(
                            f"sent {n} spans to {mask_url_credentials(endpoint)}", err=True
                        ),
                    )
                    break
                except (StoreUnavailable, StoreLocked) as exc:  # a restart: waited for, said once
                    if rounds is not None:
                        raise
                    if one_line(exc) not in said:
                        said.add(one_line(exc))
                        click.echo(f"{one_line(exc)} (retrying every {max(interval, 1.0):g}s)", err=True)
                    time.sleep(max(interval, 1.0))
    except ExportError as exc:
        raise CliError(str(exc)) from None
    except KeyboardInterrupt:
        pass
    finally:
        exporter.shutdown()


COMMANDS = (runs, show, audit, stuck, events, export)
