"""The commands that act: ``resume`` a session, ``serve-metrics`` over the store."""

from __future__ import annotations

import json
from typing import Any

import click

from ..errors import ResumeError, StoreError
from ..events import InputRequested, JobDispatched
from ..plugins import Plugin
from . import views
from .app import DURATION, command_prefix, db_option, open_store, otlp_protocol_option
from .failures import EXIT_FAILED, CliError, one_line
from .runtime import configure_cli_tracing, start_metrics_server, wait_for_signal
from .worker_cmds import cwd_importable, record_answers

__all__ = ["resume", "serve_metrics_cmd", "parse_answers", "COMMANDS"]


def parse_answers(values: tuple[str, ...], option: str) -> dict[str, Any]:
    """``ID=JSON`` pairs of ``--input``/``--job`` as a dict; a bad pair is a CliError saying how to quote it."""
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


def _is_bundled(name: str) -> bool:
    from ..examples import BUNDLED

    return name in BUNDLED


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
@click.argument("session")
@db_option
@click.option("--input", "inputs", multiple=True, metavar="ID=JSON", help="Answer the input request ID (repeatable), e.g. approval=true.")
@click.option("--job", "jobs", multiple=True, metavar="ID=JSON", help='Deliver the result of job ID (repeatable), e.g. JOB=\'{"success": true, "count": 3}\'.')
@click.option("--workflow", "workflow_spec", metavar="MODULE:ATTR", help="Run the session here with this workflow's code (without it, --input/--job are recorded for a worker).")
@click.option("--force", is_flag=True, help="Take the session from its owner even if that owner looks alive (it is known to be dead).")
@click.option("--otlp-endpoint", metavar="URL", help="Send the spans of this invocation to an OTLP endpoint.")
@otlp_protocol_option
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

    Without the workflow's code (no --workflow, not a bundled workflow), --input/--job are
    recorded in the store for a worker of the session's workflow to pick up, and the
    command says whether one was seen. With --workflow MODULE:ATTR (or a bundled
    workflow) the session runs here: finished node runs are kept (fast-forwarded from the log), a run
    whose worker died is re-executed as a new attempt. Exit code 0 when the answers were
    recorded or the session completed or paused again, 1 when it failed.
    """
    from .. import Runner
    from .progress import ProgressPlugin

    answers = parse_answers(inputs, "--input")
    results = parse_answers(jobs, "--job")
    store = open_store(db, write=True)
    with store:
        ws = views.load_session(store, session)
        if ws.status == "completed":
            raise CliError(f"session {session!r} already completed; there is nothing to resume")
        if ws.status == "paused" and not answers and not results:
            waiting = ", ".join(
                f"input {p.interrupt_id}" if isinstance(p, InputRequested) else f"job {p.job_id}"
                for p in ws.pending
                if isinstance(p, (InputRequested, JobDispatched))
            )
            raise CliError(
                f"session {session!r} is paused waiting for {waiting or 'nothing'}: answer with --input ID=JSON or --job ID=JSON"
            )
        if workflow_spec is None and not _is_bundled(ws.workflow):
            record_answers(store, session, ws, answers, results)  # no code here: through the store
            return
        wf = _resolve_workflow(ws.workflow, workflow_spec)
        tracing = configure_cli_tracing(otlp_endpoint, otlp_protocol, "flowscope")
        plugins: list[Plugin] = [ProgressPlugin(click.echo)]
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
            click.echo(click.style(f"failed at {after.error_path}: {code}: {one_line(exc)}", fg="red"))
            click.echo(f"see: {command_prefix(store.path)} show {session}")
            raise click.exceptions.Exit(EXIT_FAILED) from None
        finally:
            if tracing is not None:
                tracing.shutdown()
    if result.status == "paused":
        click.echo(click.style("paused again", fg="yellow") + f" ({session})")
        for p in result.pending:
            if isinstance(p, InputRequested):
                click.echo(f"  input {p.interrupt_id!r}: {p.prompt}")
                click.echo(f"    flowscope resume {session} --input '{p.interrupt_id}=JSON'")
            elif isinstance(p, JobDispatched):
                click.echo(f"  job {p.job_id} at {p.path}")
                click.echo(f"    flowscope resume {session} --job '{p.job_id}={{\"success\": true, \"count\": 1, \"data\": ...}}'")
    else:
        out = json.dumps(result.output, ensure_ascii=False)
        if len(out) > 300:
            out = out[:297] + "..."
        click.echo(click.style("completed", fg="green") + f" ({session}, {result.replayed} run(s) kept, {result.recovered} recovered): {out}")


@click.command("serve-metrics")
@db_option
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to bind (0.0.0.0 exposes it: nothing here authenticates).")
@click.option("--port", type=click.IntRange(0, 65535), default=9464, show_default=True, help="Port (0 picks a free one).")
@click.option("--stale-after", type=DURATION, default="60s", show_default=True, help="A running run whose heartbeat is older than this counts as orphaned.")
def serve_metrics_cmd(db: str | None, host: str, port: int, stale_after: float) -> None:
    """Serve Prometheus metrics read from the store (flowscope_store_*) until Ctrl-C or SIGTERM.

    Open runs by state, the oldest open run, orphaned runs and overdue jobs of every worker
    that writes to this database, read at scrape time.
    """
    from prometheus_client import CollectorRegistry

    store = open_store(db)
    try:
        registry = CollectorRegistry(auto_describe=True)
        server = start_metrics_server(store, registry, host=host, port=port, stale_after=stale_after)
        click.echo(f"serving {server.url} (store {store.path}, orphaned after {stale_after:g}s); Ctrl-C to stop")
        try:
            wait_for_signal()
        finally:
            server.shutdown()
        click.echo("stopped")
    finally:
        store.close()


COMMANDS = (resume, serve_metrics_cmd)
