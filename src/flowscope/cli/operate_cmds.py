"""The commands that act: ``resume``, ``cancel`` and ``prune`` sessions, ``serve-metrics``."""

from __future__ import annotations

import json
from typing import Any

import click

from ..engine.pauses import check_own_engine, validate_answers, waiting_on
from ..errors import (
    ConcurrencyConflict,
    OtherEngineError,
    ResumeError,
    StoreError,
    classify,
    mask_url_credentials,
)
from ..events import InputRequested, JobDispatched
from ..fold import WorkflowState
from ..jobs import JOB_RESULT_KEYS
from ..plugins import Plugin
from ..store.base import FINISHED_SESSION_STATUSES
from . import views
from .action_cmds import for_each_target
from .app import (
    DURATION,
    command_prefix,
    db_option,
    emit,
    format_option,
    json_arg,
    not_empty,
    open_store,
    otlp_protocol_option,
)
from .failures import EXIT_FAILED, CliError, failure_line
from .history import redacted
from .render import fmt_duration, fmt_time, render_table, zone_name
from .rowparts import session_command
from .runtime import SpanFollower, configure_cli_tracing, start_metrics_server, wait_for_signal
from .session_ops import SELECTABLE_STATES, check_run_here, live_owner, prune_candidates
from .worker_cmds import cwd_importable, record_answers

__all__ = ["resume", "prune", "serve_metrics_cmd", "parse_answers", "JOB_RESULT_KEYS", "COMMANDS"]

#: The keys a job result may have (docs/cli.md); only ``success: true`` makes it a success.


def parse_answers(values: tuple[str, ...], option: str) -> dict[str, Any]:
    """``ID=JSON`` pairs of ``--input``/``--job`` as a dict; a bad pair is a CliError saying how to quote it.

    The shape of a ``--job`` value is checked by :func:`_check_answers` (the one rule), once
    its id is known to be a job of the session.
    """
    out: dict[str, Any] = {}
    for raw in values:
        key, sep, text = raw.partition("=")
        key = key.strip()
        if not sep or not key:
            raise CliError(f"{option} expects ID=JSON (e.g. {option} 'approval=true'), got {raw!r}")
        out[key] = json_arg(text, option, key)
    return out


def _check_answers(ws: WorkflowState, answers: dict[str, Any], results: dict[str, Any]) -> None:
    """The one rule (:func:`flowscope.engine.pauses.validate_answers`, as ``resume``, the
    console and ``flowscope.answer`` apply it): an unknown id or a job result of the wrong
    shape is one line saying what the session does wait on, and nothing is appended."""
    try:
        validate_answers(ws, answers, results)
    except ResumeError as exc:
        raise CliError(str(exc)) from None


def _is_bundled(name: str, session: str) -> bool:
    """A session ``flowscope demo`` made, of a bundled workflow: its code runs it here."""
    from ..examples import bundled_for

    return bundled_for(name, session) is not None


def _resolve_workflow(name: str, spec: str | None) -> Any:
    from ..examples import bundled_workflow, load_workflow

    try:
        if spec:
            cwd_importable()
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


@click.command()
@click.argument("session", required=False)
@db_option
@click.option(
    "--input",
    "inputs",
    multiple=True,
    metavar="ID=JSON",
    help="Answer the input request ID (repeatable), e.g. approval=true.",
)
@click.option(
    "--job",
    "jobs",
    multiple=True,
    metavar="ID=JSON",
    help='Deliver the result of job ID (repeatable), e.g. JOB=\'{"success": true, "count": 3}\'.',
)
@click.option(
    "--workflow",
    "workflow_spec",
    metavar="MODULE:ATTR",
    help="Run the session here with this workflow's code (without it, --input/--job are recorded for a worker).",
)
@click.option(
    "--force",
    is_flag=True,
    help="Take the session from its owner even if that owner looks alive (it is known to be dead).",
)
@click.option(
    "--otlp-endpoint",
    metavar="URL",
    help="Send the spans of this invocation to an OTLP endpoint; default: OTEL_EXPORTER_OTLP_ENDPOINT.",
)
@otlp_protocol_option
@click.option(
    "--state",
    type=click.Choice(SELECTABLE_STATES),
    help="Without SESSION: every session in this state (with --workflow NAME or MODULE:ATTR, of that workflow).",
)
@click.option(
    "--older-than",
    type=DURATION,
    default=None,
    help="Without SESSION: only sessions last updated this long ago (e.g. 10m).",
)
@click.option(
    "--dry-run",
    is_flag=True,
    help="Say whether SESSION (or which sessions the filters select) it would resume, and why not; change nothing.",
)
@click.option("--yes", is_flag=True, help="Without SESSION: resume every session the filters select.")
@click.option(
    "--show-payloads",
    is_flag=True,
    help="Print the answers given and the output as they are, not as <redacted: N bytes> (they may hold personal data).",
)
def resume(
    session: str | None,
    db: str | None,
    inputs: tuple[str, ...],
    jobs: tuple[str, ...],
    workflow_spec: str | None,
    force: bool,
    otlp_endpoint: str | None,
    otlp_protocol: str | None,
    state: str | None,
    older_than: float | None,
    dry_run: bool,
    yes: bool,
    show_payloads: bool,
) -> None:
    """Continue a paused, failed or crashed session from the store.

    Without the workflow's code (no --workflow, not a bundled workflow), --input/--job are
    recorded in the store for a worker of the session's workflow to pick up, and the
    command says whether one was seen. With --workflow MODULE:ATTR (or a bundled
    workflow) the session runs here: finished node runs are kept (fast-forwarded from the log), a run
    whose worker died is re-executed as a new attempt. Exit code 0 when the answers were
    recorded or the session completed or paused again, 1 when it failed.

    Without SESSION it resumes, one after another, every session --state, --older-than and
    --workflow (a name, or MODULE:ATTR to run them here) select: --dry-run lists them,
    --yes acts; a session that cannot be resumed is skipped with one line. --dry-run with
    SESSION says whether it would be resumed (exit 0), or why not (exit 2).
    """
    answers = parse_answers(inputs, "--input")
    results = parse_answers(jobs, "--job")
    rest = (answers, results, force, otlp_endpoint, otlp_protocol, show_payloads)
    if session is not None:
        if state or older_than is not None or yes:
            raise CliError("resume: give SESSION or filters (--state, --older-than, --workflow), not both")
        if not dry_run:
            with open_store(db, write=True) as store:
                _resume_one(store, session, workflow_spec, *rest)
            return
    code = workflow_spec if workflow_spec and ":" in workflow_spec else None
    if session is not None:  # --workflow is SESSION's code then, never a filter
        code, name = workflow_spec, None
    else:
        name = _resolve_workflow("", code).name if code else workflow_spec
    failed = 0

    def one(target: Any, sid: str) -> None:
        nonlocal failed
        try:
            _resume_one(target, sid, code, *rest)
        except click.exceptions.Exit as exc:
            if exc.exit_code != EXIT_FAILED:
                raise
            failed += 1  # said already; the others go on

    with open_store(db, write=not dry_run) as store:
        for_each_target(
            store,
            session,
            one,
            "resume",
            workflow=name,
            state=state,
            older_than=older_than,
            dry_run=dry_run,
            yes=yes,
        )
    if failed:
        raise click.exceptions.Exit(EXIT_FAILED)


def _resume_one(
    store: Any,
    session: str,
    workflow_spec: str | None,
    answers: dict[str, Any],
    results: dict[str, Any],
    force: bool,
    otlp_endpoint: str | None,
    otlp_protocol: str | None,
    show_payloads: bool,
) -> None:
    """``flowscope resume SESSION`` on the open ``store`` (a :class:`~.session_ops.DryRunStore`
    for ``--dry-run``: every check below runs, and nothing is written): see :func:`resume`."""
    from .. import Runner
    from .progress import ProgressPlugin

    prefix = command_prefix(store.path)
    ws = views.load_session(store, session)
    try:
        check_own_engine(ws)  # before anything else is said of it
    except OtherEngineError as exc:
        raise CliError(str(exc)) from None
    if ws.status == "completed":
        raise CliError(f"session {session!r} already completed; there is nothing to resume")
    if ws.final:  # an operator's cancel; an interrupted or aborted run resumes (Runner.resume's rule)
        raise CliError(
            f"session {session!r} was cancelled by an operator; it is over for good "
            "(flowscope runs --status cancelled)"
        )
    if ws.status == "paused" and not answers and not results:
        raise CliError(
            f"session {session!r} is paused waiting for {waiting_on(ws) or 'nothing'}: answer with --input ID=JSON or --job ID=JSON"
        )
    _check_answers(ws, answers, results)
    if workflow_spec is None and not _is_bundled(ws.workflow, session):
        record_answers(store, session, ws, answers, results)  # no code here: through the store
        return
    if (answers or results) and not force and live_owner(store, session) is not None:
        record_answers(store, session, ws, answers, results)  # its live owner takes them in
        return
    wf = _resolve_workflow(ws.workflow, workflow_spec)
    try:
        check_run_here(store, session, force=force)
    except ConcurrencyConflict as exc:  # said before "resuming"; in a bulk resume, a skip, not the end
        raise CliError(str(exc)) from None
    tracing = configure_cli_tracing(
        otlp_endpoint,
        otlp_protocol,
        "flowscope",
        warn=lambda text: click.echo(f"warning: {text}", err=True),
    )
    plugins: list[Plugin] = [ProgressPlugin(click.echo, show_payloads=show_payloads)]
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
        origin = after.nodes.get(after.error_path or "")
        code = after.error_code or classify(exc).code
        line = failure_line(exc, origin.error_message if origin is not None else None)
        click.echo(click.style(f"failed at {after.error_path}: {code}: {line}", fg="red"))
        click.echo(f"see: {session_command(prefix, 'show', session)}")
        raise click.exceptions.Exit(EXIT_FAILED) from None
    finally:
        if tracing is not None:
            tracing.shutdown()
    kept, recovered = _resume_record(store, session, result.invocation_id)
    if result.status == "paused":
        click.echo(click.style("paused again", fg="yellow") + f" ({session})")
        for p in result.pending:
            if isinstance(p, InputRequested):
                click.echo(f"  input {p.interrupt_id!r}: {p.prompt}")
                click.echo(f"    {views.input_hint(session, p.interrupt_id, p.payload, prefix=prefix)}")
            elif isinstance(p, JobDispatched):
                click.echo(f"  job {p.job_id} at {p.path}")
                click.echo(f"    {views.job_hint(session, p.job_id, prefix=prefix)}")
    else:
        out = json.dumps(result.output, ensure_ascii=False) if show_payloads else redacted(result.output)
        if len(out) > 300:
            out = out[:297] + "..."
        click.echo(
            click.style("completed", fg="green")
            + f" ({session}, {kept} finished run(s) kept, {recovered} recovered): {out}"
        )


def _resume_record(store: Any, session: str, invocation_id: str) -> tuple[int, int]:
    """The invocation's resume audit record as its ``RunStarted`` wrote it (the progress
    line printed the same numbers): finished runs kept from the log, crashed runs re-run."""
    for e in reversed(store.read(session)):
        if e.type == "run_started" and e.invocation_id == invocation_id:
            return e.replayed, e.recovered
    return 0, 0


PRUNE_KEYS = ("session_id", "workflow", "status", "updated_at", "events")


@click.command()
@db_option
@format_option
@click.option(
    "--older-than",
    type=DURATION,
    required=True,
    help="Only sessions whose last event is older than this (e.g. 30d).",
)
@click.option(
    "--status",
    "statuses",
    multiple=True,
    type=click.Choice(list(FINISHED_SESSION_STATUSES)),
    help="Only sessions with this status (repeatable; default: all three).",
)
@click.option("--dry-run", is_flag=True, help="List what would be deleted; delete nothing.")
def prune(db: str | None, fmt: str, older_than: float, statuses: tuple[str, ...], dry_run: bool) -> None:
    """Delete whole finished sessions (completed, failed, cancelled) older than --older-than.

    A session with an open run (running, paused, waiting for a job) or a live owner is
    never deleted. The
    freed pages are reused by new events; `sqlite3 DB VACUUM` shrinks the file itself.
    """
    store = open_store(db, write=not dry_run)
    with store:
        candidates = prune_candidates(store, older_than, statuses or None)
        before = store.storage_bytes()
        deleted = (
            set(store.delete_sessions([c.session_id for c in candidates]))
            if not dry_run and candidates
            else set()
        )
        after = store.storage_bytes()
    chosen = [c for c in candidates if dry_run or c.session_id in deleted]
    rows = [
        {
            "session_id": c.session_id,
            "workflow": c.workflow,
            "status": c.status,
            "updated_at": c.updated_at,
            "events": c.events,
        }
        for c in chosen
    ]
    events = sum(c.events for c in chosen)
    if fmt != "table":
        emit(rows, fmt, PRUNE_KEYS, lambda: "")
        return
    if rows:
        click.echo(
            render_table(
                rows,
                [
                    ("SESSION", lambda r: r["session_id"]),
                    ("WORKFLOW", lambda r: r["workflow"]),
                    ("STATUS", lambda r: r["status"]),
                    (f"LAST EVENT ({zone_name()})", lambda r: fmt_time(r["updated_at"])),
                    ("EVENTS", lambda r: r["events"]),
                ],
                color_key="STATUS",
            )
        )
    age = fmt_duration(older_than)
    if dry_run:
        click.echo(
            f"would delete {len(rows)} session(s), {events} event(s), last updated more than {age} ago (--dry-run: nothing deleted)"
        )
        return
    freed = ""
    if before is not None and after is not None:
        freed = f"; freed {max(before - after, 0) / 1024:.0f} KiB of {before / 1024:.0f} KiB in use"
    skipped = len(candidates) - len(rows)
    note = f" ({skipped} skipped: resumed or taken by a live owner meanwhile)" if skipped else ""
    click.echo(
        f"deleted {len(rows)} session(s), {events} event(s), last updated more than {age} ago{freed}{note}"
    )


@click.command("serve-metrics")
@db_option
@click.option(
    "--host",
    "--metrics-host",
    "host",
    default="127.0.0.1",
    show_default=True,
    callback=not_empty,
    help="Address to bind (0.0.0.0 exposes it: nothing here authenticates).",
)
@click.option(
    "--port",
    type=click.IntRange(0, 65535),
    default=9464,
    show_default=True,
    help="Port (0 picks a free one).",
)
@click.option(
    "--stale-after",
    type=DURATION,
    default="60s",
    show_default=True,
    help="A running run whose heartbeat is older than this counts as orphaned.",
)
@click.option(
    "--otlp-endpoint",
    metavar="URL",
    help="Also ship the spans no live worker will send (a killed worker's, say) to this OTLP endpoint.",
)
@otlp_protocol_option
@click.option(
    "--service-name",
    default="flowscope",
    show_default=True,
    help="With --otlp-endpoint: the service.name of the spans it ships.",
)
@click.option(
    "--ship-interval",
    type=DURATION,
    default="1s",
    show_default=True,
    help="With --otlp-endpoint: how often to look for spans to ship.",
)
def serve_metrics_cmd(
    db: str | None,
    host: str,
    port: int,
    stale_after: float,
    otlp_endpoint: str | None,
    otlp_protocol: str | None,
    service_name: str,
    ship_interval: float,
) -> None:
    """Serve Prometheus metrics read from the store (flowscope_store_*) until Ctrl-C or SIGTERM.

    Open runs by state, the oldest open run, orphaned runs and overdue jobs of every worker
    that writes to this database, read at scrape time. With --otlp-endpoint it also tails
    the store as `flowscope export --follow` does: the spans of sessions whose owner died
    (or does not ship its own) reach the endpoint once, with the ids their node bodies saw.
    """
    from prometheus_client import CollectorRegistry

    # shipping records its watermarks; a server started beside the first worker may find
    # the file it creates still empty
    store = open_store(db, write=otlp_endpoint is not None, settle_s=2.0)
    follower = None
    try:
        registry = CollectorRegistry(auto_describe=True)
        server = start_metrics_server(store, registry, host=host, port=port, stale_after=stale_after)
        if otlp_endpoint:
            from ..observability.metrics import report_span_losses

            report_span_losses(registry)  # the spans the endpoint refuses, pass after pass
            follower = SpanFollower(
                store,
                otlp_endpoint,
                otlp_protocol,
                service_name,
                ship_interval,
                warn=lambda t: click.echo(f"warning: {t}", err=True),
            )
        shipping = f"; shipping spans to {mask_url_credentials(otlp_endpoint)}" if otlp_endpoint else ""
        click.echo(
            f"serving {server.url} (store {store.path}, orphaned after {stale_after:g}s{shipping}); Ctrl-C to stop"
        )
        try:
            wait_for_signal()
        finally:
            if follower is not None:
                follower.stop()
            server.shutdown()
        click.echo("stopped")
    finally:
        store.close()


COMMANDS = (resume, prune, serve_metrics_cmd)
