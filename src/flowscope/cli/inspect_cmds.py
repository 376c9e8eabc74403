"""The commands that read the store and never write it: runs, show, audit, stuck, export."""

from __future__ import annotations

from pathlib import Path

import click

from . import views
from .app import DURATION, db_option, emit, format_option, open_store, otlp_protocol_option, resolve_db
from .failures import CliError, unknown_session
from .render import waterfall_lines
from .tables import audit_table, pending_hint, runs_table, session_header, stuck_table

__all__ = ["runs", "show", "audit", "stuck", "export", "COMMANDS"]


@click.command()
@db_option
@format_option
@click.option("--limit", type=click.IntRange(min=0), default=50, show_default=True, help="At most this many sessions (0: all).")
@click.option("--status", type=click.Choice(["running", "paused", "completed", "failed", "cancelled"]), help="Only sessions with this status.")
@click.option("--workflow", help="Only sessions of this workflow.")
def runs(db: str | None, fmt: str, limit: int, status: str | None, workflow: str | None) -> None:
    """List sessions, most recently updated first."""
    with open_store(db) as store:
        rows = views.runs_rows(store, limit=limit or None, status=status, workflow=workflow)
    emit(rows, fmt, views.RUN_KEYS, lambda: runs_table(rows))


@click.command()
@click.argument("session", required=False)
@db_option
@format_option
def show(session: str, db: str | None, fmt: str) -> None:
    """Waterfall of a session's node runs, from its event log.

    Paths indented by depth, start offset, duration, status, attempts, errors (code and
    message), pauses (interrupt ids) and jobs (job ids and results).
    """
    with open_store(db) as store:
        ws = views.load_session(store, session)
        info = store.session_info(session)
    rows = views.show_rows(ws, info)

    def table() -> str:
        return "\n".join(session_header(ws) + [""] + waterfall_lines(rows, end_ts=ws.updated_at) + pending_hint(ws))

    emit(rows, fmt, views.SHOW_KEYS, table)


@click.command()
@db_option
@format_option
@click.option("--session", "sessions", multiple=True, metavar="SESSION", help="Only this session (repeatable).")
@click.option("--workflow", help="Only this workflow.")
@click.option("--by", type=click.Choice(["node", "run"]), default="node", show_default=True, help="One row per workflow and node, or per node run.")
def audit(db: str | None, fmt: str, sessions: tuple[str, ...], workflow: str | None, by: str) -> None:
    """Attempts, retries, recoveries and errors per workflow and node.

    From the store's node_runs projection (never a scan of the log). ERRORS counts the
    failures where they began; an enclosing workflow that failed because of them is in
    FAILED only.
    """
    store = open_store(db)
    with store:
        if sessions:
            for sid in sessions:
                if not store.has_session(sid):
                    raise unknown_session(sid, store.path)
            node_runs = [r for sid in sessions for r in store.node_runs(sid)]
        else:
            node_runs = store.node_runs()
    if workflow:
        node_runs = [r for r in node_runs if r.workflow == workflow]
    if by == "run":
        rows = views.audit_run_rows(node_runs)
        keys: tuple[str, ...] = views.AUDIT_RUN_KEYS
    else:
        rows = views.audit_rows(node_runs)
        keys = views.AUDIT_KEYS
    emit(rows, fmt, keys, lambda: audit_table(rows, by))


@click.command()
@db_option
@format_option
@click.option("--older-than", type=DURATION, default="15m", show_default=True, help="Only open runs started longer ago than this.")
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
    type=click.Choice(["running", "orphaned", "waiting_input", "waiting_job", "overdue"]),
    help="Only these states (repeatable).",
)
@click.option("--all", "include_parents", is_flag=True, help="Also list enclosing runs (workflow nodes, parents of dynamic children).")
def stuck(db: str | None, fmt: str, older_than: float, stale_after: float, states: tuple[str, ...], include_parents: bool) -> None:
    """Open runs older than a threshold: running, orphaned, waiting_input, waiting_job, overdue.

    \b
    running        started, no end yet, heartbeat fresh: slow, blocked or looping
    orphaned       running, but its heartbeat is older than --stale-after: the worker died
    waiting_input  paused for an answer (flowscope resume SESSION --input ID=JSON)
    waiting_job    waiting for an external job's result (--job JOB_ID=JSON)
    overdue        waiting for a job that is past its deadline_s
    """
    with open_store(db) as store:
        rows = views.stuck_rows(store, older_than, stale_after, include_parents=include_parents, states=states or None)
    emit(rows, fmt, views.STUCK_KEYS, lambda: stuck_table(rows))


@click.command()
@click.argument("session", required=False)
@db_option
@click.option("-o", "--output", type=click.Path(dir_okay=False, writable=True), help="Write the OTLP JSON here (default: stdout).")
@click.option("--otlp-endpoint", metavar="URL", help="Send the spans to this OTLP endpoint instead (e.g. http://localhost:4318).")
@otlp_protocol_option
@click.option("--service-name", default="flowscope", show_default=True, help="The service.name resource attribute.")
@click.option("--timeout", type=float, default=10.0, show_default=True, help="Seconds to wait for the endpoint.")
@click.option("--follow", is_flag=True, help="Tail the store and send spans as they are appended (needs --otlp-endpoint).")
@click.option("--interval", type=float, default=1.0, show_default=True, help="With --follow: seconds between passes.")
@click.option("--rounds", type=int, default=None, hidden=True, help="With --follow: stop after this many passes.")
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
        _follow(db, otlp_endpoint, otlp_protocol, service_name, timeout, interval, rounds)
        return
    if session is None:
        raise CliError("export needs a SESSION (or --follow --otlp-endpoint URL to tail every session)")

    with open_store(db) as store:
        events = store.read(session)
    if not events:
        raise unknown_session(session, resolve_db(db))
    if otlp_endpoint:
        spans = session_spans(events, service_name)
        try:
            send_spans(spans, otlp_endpoint, otlp_protocol, timeout=timeout)
        except ExportError as exc:
            raise CliError(str(exc)) from None
        traces = len({s.context.trace_id for s in spans})
        click.echo(f"sent {len(spans)} spans ({traces} traces, one per invocation) of session {session} to {otlp_endpoint}", err=output is None)
    if output or not otlp_endpoint:
        text = to_otlp_json(export_request(events, service_name))
        if output:
            try:
                Path(output).write_text(text, encoding="utf-8")
            except OSError as exc:
                raise CliError(f"cannot write {output}: {exc.strerror or exc}") from None
            click.echo(f"wrote {output}", err=True)
        else:
            click.echo(text, nl=False)


def _follow(
    db: str | None, endpoint: str | None, protocol: str | None, service_name: str, timeout: float, interval: float, rounds: int | None
) -> None:
    from ..export import ExportError
    from ..observability import otlp
    from ..observability.export import follow

    if not endpoint:
        raise CliError("--follow sends spans: give --otlp-endpoint URL (e.g. http://localhost:4318)")
    try:
        proto = otlp.resolve_protocol(protocol or otlp.guess_protocol(endpoint))
    except ValueError as exc:
        raise CliError(str(exc)) from None
    exporter = otlp.span_exporter(proto, endpoint, timeout=timeout, plaintext_unless_https=True)
    try:
        with open_store(db, write=True) as store:
            follow(
                store,
                exporter,
                service_name=service_name,
                interval=interval,
                rounds=rounds,
                on_sent=lambda n: click.echo(f"sent {n} spans to {endpoint}", err=True),
            )
    except ExportError as exc:
        raise CliError(str(exc)) from None
    except KeyboardInterrupt:
        pass
    finally:
        exporter.shutdown()


COMMANDS = (runs, show, audit, stuck, export)
