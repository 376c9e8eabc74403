"""The ``flowscope`` command: run the demo, and inspect, audit, resume and export runs.

Every command works on a SQLite store: ``--db PATH``, else ``$FLOWSCOPE_DB``, else
``./flowscope.db``. Listing commands take ``--format table|json|csv``; JSON is a list of
objects whose keys are documented in ``docs/cli.md``. A problem with the database, a
session or an argument is one line on stderr and exit code 2, never a traceback
(``FLOWSCOPE_DEBUG=1`` shows the traceback of an unexpected error).
"""

from __future__ import annotations

import json
import os
import shlex
import signal
import sys
import threading
from pathlib import Path
from typing import Any, Callable, NoReturn

import click

from ..errors import (
    ConcurrencyConflict,
    FlowscopeError,
    ResumeError,
    StoreError,
    UnknownSessionError,
    WorkflowError,
)
from ..events import EventDecodeError
from . import views
from .render import (
    fmt_duration,
    fmt_time,
    render_csv,
    render_json,
    render_table,
    waterfall_lines,
)

__all__ = ["main", "cli", "CliError", "DEFAULT_DB", "ENV_DB"]

DEFAULT_DB = "flowscope.db"
ENV_DB = "FLOWSCOPE_DB"
FORMATS = ("table", "json", "csv")
EXIT_ERROR = 2
EXIT_FAILED = 1


class CliError(click.ClickException):
    """A problem the user can fix: printed as one line on stderr, exit code 2."""

    exit_code = EXIT_ERROR

    def __init__(self, message: str) -> None:
        super().__init__(" ".join(str(message).split()))

    def show(self, file: Any = None) -> None:
        click.echo(f"flowscope: error: {self.message}", err=True)


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split()) or type(exc).__name__


def to_cli_error(exc: BaseException) -> CliError:
    """Turn an exception from flowscope (or anything else) into one actionable line."""
    msg = _one_line(exc)
    if isinstance(exc, CliError):
        return exc
    if isinstance(exc, UnknownSessionError):
        return CliError(msg)
    if isinstance(exc, ConcurrencyConflict):
        if "force=True" in msg:
            return CliError(msg.replace("pass force=True", "pass --force"))
        return CliError(msg)
    if isinstance(exc, StoreError):
        return CliError(msg)
    if isinstance(exc, ResumeError):
        return CliError(msg)
    if isinstance(exc, (WorkflowError, FlowscopeError)):
        return CliError(f"{type(exc).__name__}: {msg}")
    if isinstance(exc, EventDecodeError):
        return CliError(f"the database holds an event this flowscope cannot read: {msg}")
    if isinstance(exc, OSError):
        where = f" ({exc.filename})" if getattr(exc, "filename", None) else ""
        return CliError(f"{exc.strerror or msg}{where}")
    return CliError(
        f"unexpected {type(exc).__name__}: {msg} (this is a bug in flowscope or in the workflow; "
        "FLOWSCOPE_DEBUG=1 shows the traceback)"
    )


class FlowscopeGroup(click.Group):
    """Converts any exception escaping a command into a one-line :class:`CliError`."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except (click.exceptions.Exit, click.exceptions.Abort, click.ClickException):
            raise
        except KeyboardInterrupt:
            click.echo("flowscope: interrupted", err=True)
            ctx.exit(130)
        except BrokenPipeError:  # `flowscope runs | head`
            _silence_stdout()
            ctx.exit(0)
        except Exception as exc:
            if os.environ.get("FLOWSCOPE_DEBUG"):
                raise
            raise to_cli_error(exc) from None


def _silence_stdout() -> None:
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError, AttributeError):  # pragma: no cover - no real stdout (CliRunner)
        pass


class Duration(click.ParamType):
    """``15m``, ``90s``, ``1h30m``, ``500ms`` or a number of seconds."""

    name = "duration"

    def convert(self, value: Any, param: Any, ctx: Any) -> float:
        if isinstance(value, (int, float)):
            return float(value)
        try:
            return views.parse_duration(value)
        except ValueError as exc:
            self.fail(str(exc), param, ctx)


DURATION = Duration()

# --------------------------------------------------------------------------- options and the store


def _db_option(f: Callable[..., Any]) -> Callable[..., Any]:
    return click.option(
        "--db",
        "db",
        default=None,
        metavar="PATH",
        help=f"The SQLite database (default: ${ENV_DB}, else ./{DEFAULT_DB}).",
    )(f)


def _format_option(f: Callable[..., Any]) -> Callable[..., Any]:
    return click.option(
        "--format",
        "fmt",
        type=click.Choice(FORMATS),
        default="table",
        show_default=True,
        help="table for people; json (a list of objects, keys in docs/cli.md) or csv for programs.",
    )(f)


def _resolve_db(db: str | None) -> str:
    if db:
        return db
    ctx = click.get_current_context(silent=True)
    while ctx is not None:
        if ctx.obj and ctx.obj.get("db"):
            return ctx.obj["db"]
        ctx = ctx.parent
    return os.environ.get(ENV_DB) or DEFAULT_DB


_HINT = "point --db (or FLOWSCOPE_DB) at a flowscope database, or run `flowscope demo` to create one"


def open_store(db: str | None, *, write: bool = False, create: bool = False) -> Any:
    """Open the SQLite store. Read commands never create or modify the file."""
    from ..store.sqlite import SqliteEventStore

    path = _resolve_db(db)
    p = Path(path)
    if not create and not p.exists():
        raise CliError(f"no flowscope database at {path}: {_HINT}")
    if p.is_dir():
        raise CliError(f"{path} is a directory, not a flowscope database: {_HINT}")
    if p.exists() and p.stat().st_size == 0 and not create:
        raise CliError(f"{path} is an empty file, not a flowscope database: {_HINT}")
    try:
        return SqliteEventStore(path, readonly=not (write or create))
    except StoreError as exc:
        msg = _one_line(exc)
        if "corrupt" in msg or "malformed" in msg:
            raise CliError(f"{msg}: restore it from a backup (or try `sqlite3 {path} .recover`)") from None
        if "not a flowscope database" in msg or "not a SQLite database" in msg:
            raise CliError(f"{msg}: {_HINT}") from None
        raise CliError(msg) from None


def _emit(rows: list[dict[str, Any]], fmt: str, keys: tuple[str, ...], table: Callable[[], str]) -> None:
    if fmt == "json":
        click.echo(render_json(rows, keys))
    elif fmt == "csv":
        click.echo(render_csv(rows, keys))
    else:
        click.echo(table())


def _command_prefix(db: str) -> str:
    """``flowscope`` or ``flowscope --db PATH`` for the hints we print."""
    if db == (os.environ.get(ENV_DB) or DEFAULT_DB):
        return "flowscope"
    return f"flowscope --db {shlex.quote(db)}"


# --------------------------------------------------------------------------- the group


@click.group(cls=FlowscopeGroup, context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.option(
    "--db",
    "db",
    envvar=ENV_DB,
    default=DEFAULT_DB,
    show_default=True,
    metavar="PATH",
    help=f"The SQLite database of flowscope events (also ${ENV_DB}).",
)
@click.version_option(package_name="flowscope", prog_name="flowscope")
@click.pass_context
def cli(ctx: click.Context, db: str) -> None:
    """flowscope: run, inspect, audit, resume and export workflow runs.

    \b
    Start here:   flowscope demo
    Then:         flowscope runs | show SESSION | audit | stuck | resume SESSION | export SESSION
    Docs:         docs/cli.md, docs/concepts.md, docs/operations.md
    """
    ctx.ensure_object(dict)
    ctx.obj["db"] = db


# --------------------------------------------------------------------------- runs


@cli.command()
@_db_option
@_format_option
@click.option("--limit", type=click.IntRange(min=0), default=50, show_default=True, help="At most this many sessions (0: all).")
@click.option("--status", type=click.Choice(["running", "paused", "completed", "failed", "cancelled"]), help="Only sessions with this status.")
@click.option("--workflow", help="Only sessions of this workflow.")
def runs(db: str | None, fmt: str, limit: int, status: str | None, workflow: str | None) -> None:
    """List sessions, most recently updated first."""
    with open_store(db) as store:
        rows = views.runs_rows(store, limit=limit or None, status=status, workflow=workflow)

    def table() -> str:
        if not rows:
            return "no sessions yet: run `flowscope demo`, or point --db at your database"
        return render_table(
            rows,
            [
                ("SESSION", lambda r: r["session_id"]),
                ("WORKFLOW", lambda r: r["workflow"]),
                ("STATUS", lambda r: r["status"]),
                ("STARTED", lambda r: fmt_time(r["started_at"])),
                ("DURATION", lambda r: fmt_duration(r["duration_s"])),
                ("INVOCATIONS", lambda r: r["invocations"]),
                ("EVENTS", lambda r: r["events"]),
                ("OPEN", lambda r: r["open_runs"]),
                ("ERROR", lambda r: r["error_code"] or ""),
            ],
            color_key="STATUS",
        )

    _emit(rows, fmt, views.RUN_KEYS, table)


# --------------------------------------------------------------------------- show


@cli.command()
@click.argument("session")
@_db_option
@_format_option
def show(session: str, db: str | None, fmt: str) -> None:
    """Waterfall of a session's node runs, from its event log.

    Paths indented by depth, start offset, duration, status, attempts, errors (code and
    message), pauses (interrupt ids) and jobs (job ids and results).
    """
    with open_store(db) as store:
        ws = views.load_session(store, session)
    rows = views.show_rows(ws)

    def table() -> str:
        return "\n".join(session_header(ws) + [""] + waterfall_lines(rows, end_ts=ws.updated_at) + _pending_hint(ws))

    _emit(rows, fmt, views.SHOW_KEYS, table)


def session_header(ws: Any) -> list[str]:
    status = click.style(ws.status, fg={"completed": "green", "failed": "red", "paused": "yellow"}.get(ws.status))
    dur = (ws.updated_at - ws.started_at) if ws.started_at is not None and ws.updated_at is not None else None
    lines = [
        f"session {ws.session_id}   workflow {ws.workflow}   {status}   "
        f"{ws.invocations} invocation(s)   {ws.last_seq} events",
        f"started {fmt_time(ws.started_at)}, last event {fmt_duration(dur)} later",
    ]
    if ws.status == "failed":
        ns = ws.nodes.get(ws.error_path) if ws.error_path else None
        msg = f": {ns.error_message}" if ns is not None and ns.error_message else ""
        lines.append(click.style(f"failed at {ws.error_path}: {ws.error_code}{msg}", fg="red"))
    return lines


def _pending_hint(ws: Any) -> list[str]:
    pending = ws.pending
    if not pending:
        return []
    out = ["", "waiting on:"]
    for p in pending:
        if p.type == "input_requested":
            out.append(f"  input {p.interrupt_id!r}: {p.prompt}   -> flowscope resume {ws.session_id} --input '{p.interrupt_id}=JSON'")
        else:
            out.append(f"  job {p.job_id} ({p.path})   -> flowscope resume {ws.session_id} --job '{p.job_id}=JSON'")
    return out


# --------------------------------------------------------------------------- audit


def _audit_table(rows: list[dict[str, Any]], by: str) -> str:
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
            ],
            color_key="STATUS",
            empty="no node runs",
        )
    return render_table(
        rows,
        [
            ("WORKFLOW", lambda r: r["workflow"]),
            ("NODE", lambda r: r["node"]),
            ("RUNS", lambda r: r["runs"]),
            ("ATTEMPTS", lambda r: r["attempts"]),
            ("MAX", lambda r: r["max_attempt"]),
            ("RETRIES", lambda r: r["retries"]),
            ("RECOVERIES", lambda r: r["recoveries"]),
            ("OK", lambda r: r["completed"]),
            ("FAILED", lambda r: r["failed"]),
            ("OPEN", lambda r: r["open"]),
            ("ERRORS", lambda r: r["error_codes"] or ""),
        ],
        empty="no node runs",
    )


@cli.command()
@_db_option
@_format_option
@click.option("--session", "sessions", multiple=True, metavar="SESSION", help="Only this session (repeatable).")
@click.option("--workflow", help="Only this workflow.")
@click.option("--by", type=click.Choice(["node", "run"]), default="node", show_default=True, help="One row per workflow and node, or per node run.")
def audit(db: str | None, fmt: str, sessions: tuple[str, ...], workflow: str | None, by: str) -> None:
    """Attempts, retries, recoveries and errors per workflow and node.

    From the store's node_runs projection (never a scan of the log). ERRORS counts the
    failures where they began; an enclosing workflow that failed because of them is in
    FAILED only.
    """
    with open_store(db) as store:
        if sessions:
            node_runs = []
            for sid in sessions:
                if not store.has_session(sid):
                    raise UnknownSessionError(f"no session {sid!r} in {store.path}: `flowscope runs` lists the sessions")
                node_runs.extend(store.node_runs(sid))
        else:
            node_runs = store.node_runs()
    if workflow:
        node_runs = [r for r in node_runs if r.workflow == workflow]
    if by == "run":
        rows = views.audit_run_rows(node_runs)
        keys = views.AUDIT_RUN_KEYS
    else:
        rows = views.audit_rows(node_runs)
        keys = views.AUDIT_KEYS
    _emit(rows, fmt, keys, lambda: _audit_table(rows, by))


# --------------------------------------------------------------------------- stuck


def _stuck_table(rows: list[dict[str, Any]]) -> str:
    return render_table(
        rows,
        [
            ("SESSION", lambda r: r["session_id"]),
            ("PATH", lambda r: r["path"]),
            ("STATE", lambda r: r["state"]),
            ("AGE", lambda r: fmt_duration(r["age_s"])),
            ("HEARTBEAT", lambda r: (fmt_duration(r["heartbeat_age_s"]) + " ago") if r["heartbeat_age_s"] is not None else "-"),
            ("ATT", lambda r: r["attempt"]),
            ("WAITING ON", lambda r: r["waiting_on"] or ""),
            ("NEXT", lambda r: r["action"]),
        ],
        color_key="STATE",
        empty="nothing stuck",
    )


@cli.command()
@_db_option
@_format_option
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
    _emit(rows, fmt, views.STUCK_KEYS, lambda: _stuck_table(rows))


# --------------------------------------------------------------------------- resume


def _parse_answers(values: tuple[str, ...], option: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for raw in values:
        key, sep, text = raw.partition("=")
        key = key.strip()
        if not sep or not key:
            raise CliError(f"{option} expects ID=JSON (e.g. {option} 'approval=true'), got {raw!r}")
        try:
            out[key] = json.loads(text)
        except ValueError as exc:
            raise CliError(
                f"{option} {key}: {text!r} is not valid JSON ({exc}); "
                f"quote a string as JSON: {option} '{key}=\"{text}\"'"
            ) from None
    return out


def _resolve_workflow(name: str, spec: str | None) -> Any:
    from ..examples import bundled_workflow, load_workflow

    try:
        if spec:
            wf = load_workflow(spec)
        else:
            wf = bundled_workflow(name)
    except ValueError as exc:
        raise CliError(f"--workflow {spec}: {exc}") from None
    if wf is None:
        raise CliError(
            f"the session ran workflow {name!r}, which is not bundled with flowscope: "
            "pass --workflow module:attr (the Workflow object your worker runs)"
        )
    return wf


def _tracing(endpoint: str | None, protocol: str | None, service: str) -> Any:
    if not endpoint:
        return None
    from ..export import guess_protocol
    from ..observability import configure_tracing

    try:
        return configure_tracing(service, otlp_endpoint=endpoint, protocol=protocol or guess_protocol(endpoint), timeout=5.0)
    except ValueError as exc:
        raise CliError(f"--otlp-endpoint {endpoint}: {exc}") from None


_OTLP_PROTOCOL = click.option(
    "--otlp-protocol",
    type=click.Choice(["http/protobuf", "grpc"]),
    default=None,
    help="OTLP protocol (default: grpc for port 4317, else http/protobuf).",
)


@cli.command()
@click.argument("session")
@_db_option
@click.option("--input", "inputs", multiple=True, metavar="ID=JSON", help="Answer the input request ID (repeatable), e.g. approval=true.")
@click.option("--job", "jobs", multiple=True, metavar="ID=JSON", help='Deliver the result of job ID (repeatable), e.g. JOB=\'{"success": true, "count": 3}\'.')
@click.option("--workflow", "workflow_spec", metavar="MODULE:ATTR", help="The workflow to resume with (default: the bundled workflow of that name).")
@click.option("--force", is_flag=True, help="Resume even if the session's heartbeat is recent (its worker is known to be dead).")
@click.option("--otlp-endpoint", metavar="URL", help="Send the spans of this invocation to an OTLP endpoint.")
@_OTLP_PROTOCOL
def resume(
    session: str,
    db: str | None,
    inputs: tuple[str, ...],
    jobs: tuple[str, ...],
    workflow_spec: str | None,
    force: bool,
    otlp_endpoint: str | None,
    otlp_protocol: str | None,
) -> None:
    """Continue a paused, failed or crashed session from the store.

    Finished node runs are kept (fast-forwarded from the log), a run whose worker died is
    re-executed as a new attempt, and --input/--job answer what the session waits on.
    Exit code 0 when the session completed or paused again, 1 when it failed.
    """
    from .. import Runner
    from .progress import ProgressPlugin

    answers = _parse_answers(inputs, "--input")
    results = _parse_answers(jobs, "--job")
    with open_store(db, write=True) as store:
        ws = views.load_session(store, session)
        if ws.status == "completed":
            raise CliError(f"session {session!r} already completed; there is nothing to resume")
        if ws.status == "paused" and not answers and not results:
            waiting = ", ".join(
                f"input {p.interrupt_id}" if p.type == "input_requested" else f"job {p.job_id}" for p in ws.pending
            )
            raise CliError(
                f"session {session!r} is paused waiting for {waiting or 'nothing'}: answer with --input ID=JSON or --job ID=JSON"
            )
        wf = _resolve_workflow(ws.workflow, workflow_spec)
        tracing = _tracing(otlp_endpoint, otlp_protocol, "flowscope")
        plugins: list[Any] = [ProgressPlugin(click.echo)]
        if tracing is not None:
            plugins.insert(0, tracing.plugin())
        runner = Runner(wf, store=store, plugins=plugins)
        click.echo(f"resuming {session} ({ws.workflow}, {ws.status})")
        try:
            result = runner.resume_sync(session, inputs=answers, jobs=results, force=force)
        except (StoreError, ResumeError):  # nothing ran: a problem with the session or the store
            raise
        except Exception as exc:  # the workflow failed: the node's own exception
            after = views.load_session(store, session)
            code = after.error_code or getattr(exc, "error_code", None) or "UNKNOWN_ERROR"
            click.echo(click.style(f"failed at {after.error_path}: {code}: {_one_line(exc)}", fg="red"))
            click.echo(f"see: {_command_prefix(store.path)} show {session}")
            raise click.exceptions.Exit(EXIT_FAILED) from None
        finally:
            if tracing is not None:
                tracing.shutdown()
    if result.status == "paused":
        click.echo(click.style("paused again", fg="yellow") + f" ({session})")
        for p in result.pending:
            if p.type == "input_requested":
                click.echo(f"  input {p.interrupt_id!r}: {p.prompt}")
                click.echo(f"    flowscope resume {session} --input '{p.interrupt_id}=JSON'")
            else:
                click.echo(f"  job {p.job_id} at {p.path}")
                click.echo(f"    flowscope resume {session} --job '{p.job_id}={{\"success\": true, \"count\": 1, \"data\": ...}}'")
    else:
        out = json.dumps(result.output, ensure_ascii=False)
        if len(out) > 300:
            out = out[:297] + "..."
        click.echo(click.style("completed", fg="green") + f" ({session}, {result.replayed} run(s) kept, {result.recovered} recovered): {out}")


# --------------------------------------------------------------------------- serve-metrics


def _wait_for_signal() -> None:
    """Block until SIGINT or SIGTERM."""
    stop = threading.Event()

    def handler(signum: int, frame: Any) -> None:
        stop.set()

    previous = {}
    for sig in (signal.SIGINT, signal.SIGTERM):
        try:
            previous[sig] = signal.signal(sig, handler)
        except ValueError:  # pragma: no cover - not the main thread
            pass
    try:
        while not stop.wait(0.25):
            pass
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


@cli.command("serve-metrics")
@_db_option
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to bind (0.0.0.0 exposes it: nothing here authenticates).")
@click.option("--port", type=click.IntRange(0, 65535), default=9464, show_default=True, help="Port (0 picks a free one).")
@click.option("--stale-after", type=DURATION, default="60s", show_default=True, help="A running run whose heartbeat is older than this counts as orphaned.")
def serve_metrics_cmd(db: str | None, host: str, port: int, stale_after: float) -> None:
    """Serve Prometheus metrics read from the store (flowscope_store_*) until Ctrl-C or SIGTERM.

    Open runs by state, the oldest open run, orphaned runs and overdue jobs of every worker
    that writes to this database, read at scrape time.
    """
    from ..observability import serve_metrics

    store = open_store(db)
    try:
        try:
            server = serve_metrics(store=store, registry=_empty_registry(), host=host, port=port, stale_after_s=stale_after)
        except OSError as exc:
            raise CliError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None
        click.echo(f"serving {server.url} (store {store.path}, orphaned after {stale_after:g}s); Ctrl-C to stop")
        try:
            _wait_for_signal()
        finally:
            server.shutdown()
        click.echo("stopped")
    finally:
        store.close()


def _empty_registry() -> Any:
    from prometheus_client import CollectorRegistry

    return CollectorRegistry(auto_describe=True)


# --------------------------------------------------------------------------- export


@cli.command()
@click.argument("session")
@_db_option
@click.option("-o", "--output", type=click.Path(dir_okay=False, writable=True), help="Write the OTLP JSON here (default: stdout).")
@click.option("--otlp-endpoint", metavar="URL", help="Send the spans to this OTLP endpoint instead (e.g. http://localhost:4318).")
@_OTLP_PROTOCOL
@click.option("--service-name", default="flowscope", show_default=True, help="The service.name resource attribute.")
@click.option("--timeout", type=float, default=10.0, show_default=True, help="Seconds to wait for the endpoint.")
def export(
    session: str,
    db: str | None,
    output: str | None,
    otlp_endpoint: str | None,
    otlp_protocol: str | None,
    service_name: str,
    timeout: float,
) -> None:
    """Spans of a session rebuilt from its event log, as OTLP JSON or sent to an endpoint.

    The span ids are derived from the session, invocation and path: exporting twice gives
    the same output. The spans mirror what TracingPlugin records live (docs/telemetry.md).
    """
    from ..export import ExportError, export_request, send_spans, session_spans, to_otlp_json

    with open_store(db) as store:
        events = store.read(session)
    if not events:
        raise UnknownSessionError(f"no session {session!r} in {_resolve_db(db)}: `flowscope runs` lists the sessions")
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


# --------------------------------------------------------------------------- demo


@cli.command()
@_db_option
@click.option("--otlp-endpoint", metavar="URL", help="Send spans to a collector, Jaeger or Tempo (e.g. http://localhost:4318).")
@_OTLP_PROTOCOL
@click.option("--interactive", is_flag=True, help="Ask you for the approval (and the failed job's retry) instead of answering automatically.")
@click.option("--metrics-port", type=click.IntRange(0, 65535), default=None, metavar="PORT", help="Serve metrics (in-process and store) on 127.0.0.1:PORT, and keep serving after the run until Ctrl-C/SIGTERM.")
@click.option("--repeat", type=click.IntRange(min=1), default=1, show_default=True, help="Run the demo workflows this many times (traffic for dashboards).")
@click.option("--stale-after", type=DURATION, default="5s", show_default=True, help="When the killed worker's run counts as orphaned (for the metrics endpoint and the hints).")
def demo(
    db: str | None,
    otlp_endpoint: str | None,
    otlp_protocol: str | None,
    interactive: bool,
    metrics_port: int | None,
    repeat: int,
    stale_after: float,
) -> None:
    """Run the bundled order-fulfilment demo end to end on a SQLite file (no server needed).

    \b
    It shows, in one go: a flaky node that succeeds on a retry; parallel branches and a
    join; a nested workflow; a long-running job whose first result is empty and is
    retried through the actionable pause; a human approval; a node that returns nothing
    (the completion marker); a second batch that fails with PAYMENT_DECLINED; and a
    worker killed mid-run, so that `flowscope stuck` has something to find.
    """
    from .demo_cmd import run_demo

    run_demo(
        db=_resolve_db(db),
        otlp_endpoint=otlp_endpoint,
        otlp_protocol=otlp_protocol,
        interactive=interactive,
        metrics_port=metrics_port,
        repeat=repeat,
        stale_after=stale_after,
        prefix_for=_command_prefix,
        open_store=open_store,
        wait_for_signal=_wait_for_signal,
    )


# --------------------------------------------------------------------------- entry point


def main(argv: list[str] | None = None) -> NoReturn:
    """The ``flowscope`` console script."""
    try:
        cli.main(args=argv, prog_name="flowscope", standalone_mode=True)
    except SystemExit:
        raise
    except Exception as exc:  # pragma: no cover - the group catches these already
        if os.environ.get("FLOWSCOPE_DEBUG"):
            raise
        to_cli_error(exc).show()
        sys.exit(EXIT_ERROR)
    sys.exit(0)  # pragma: no cover - standalone_mode always exits
