"""``flowscope demo``: the bundled workflows end to end, then what the log says about them."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections.abc import Callable
from typing import Any

import click

from ..errors import mask_url_credentials
from ..events import JobDispatched
from ..fold import rebuild
from ..store.postgres.dsn import is_postgres_url
from . import views
from .app import (
    DURATION,
    command_prefix,
    db_option,
    metrics_host_option,
    open_store,
    otlp_protocol_option,
    resolve_db,
    shown_db,
)
from .history import retry_reasons, session_history
from .progress import ProgressPlugin
from .render import waterfall_lines
from .rowparts import quoted, session_command
from .runtime import configure_cli_tracing, resolve_otlp_protocol, start_metrics_server, wait_for_signal
from .tables import audit_table, session_header

__all__ = ["demo", "run_demo", "DemoStopped", "WORKER_HANG_S", "COMMANDS"]

#: How long the doomed worker's node hangs (it is killed long before: a day is "forever").
WORKER_HANG_S = 86400.0


@click.command()
@db_option
@click.option(
    "--otlp-endpoint",
    metavar="URL",
    help="Send spans to a collector, Jaeger or Tempo (e.g. http://localhost:4318); default: OTEL_EXPORTER_OTLP_ENDPOINT.",
)
@otlp_protocol_option
@click.option(
    "--interactive",
    is_flag=True,
    help="Ask you for the approval (and the failed job's retry) instead of answering automatically.",
)
@click.option(
    "--metrics-port",
    type=click.IntRange(0, 65535),
    default=None,
    metavar="PORT",
    help="Serve metrics (in-process and store) on --metrics-host:PORT, and keep serving after the run until Ctrl-C/SIGTERM.",
)
@metrics_host_option
@click.option(
    "--repeat",
    type=click.IntRange(min=1),
    default=1,
    show_default=True,
    help="Run the demo workflows this many times (traffic for dashboards).",
)
@click.option(
    "--stale-after",
    type=DURATION,
    default="5s",
    show_default=True,
    help="When the killed worker's run counts as orphaned (for the metrics endpoint and the hints).",
)
def demo(
    db: str | None,
    otlp_endpoint: str | None,
    otlp_protocol: str | None,
    interactive: bool,
    metrics_port: int | None,
    metrics_host: str,
    repeat: int,
    stale_after: float,
) -> None:
    """Run the bundled order-fulfilment demo end to end on a SQLite file (no server needed).

    \b
    It shows, in one go: a flaky node that succeeds on a retry; parallel branches and a
    join; a nested workflow; a long-running job whose first result is empty and is
    retried through the actionable pause; a human approval; a node that returns nothing
    (the completion marker); a second batch that fails with PAYMENT_DECLINED; a queue
    served by a worker (and one session left queued); and a worker killed mid-run, so
    that `flowscope stuck` has something to find.
    """
    run_demo(
        db=resolve_db(db),
        otlp_endpoint=otlp_endpoint,
        otlp_protocol=otlp_protocol,
        interactive=interactive,
        metrics_port=metrics_port,
        metrics_host=metrics_host,
        repeat=repeat,
        stale_after=stale_after,
    )


def _section(title: str) -> None:
    click.echo("")
    click.echo(click.style(f"== {title}", bold=True))


class DemoStopped(KeyboardInterrupt):
    """Ctrl-C or Ctrl-D at an ``--interactive`` prompt: the demo stops, the session stays
    paused. A KeyboardInterrupt, so the driver's handler of node failures lets it through."""


def _asking(ask: Callable[[Any], Any], prefix: str) -> Callable[[Any], Any]:
    """``ask`` with Ctrl-C and Ctrl-D meaning "stop the demo" on the first press; the line
    that says so names the commands to go on with after ``prefix`` (the demo's database).

    The prompt runs inside ``asyncio.run``, whose SIGINT handler only cancels the main
    task on a first Ctrl-C (unseen while blocked in input()); the default handler is put
    back for the prompt. click reports either key as ``Abort``.
    """

    def asked(request: Any) -> Any:
        try:
            previous = signal.signal(signal.SIGINT, signal.default_int_handler)
        except ValueError:  # not the main thread
            previous = None
        try:
            return ask(request)
        except (click.exceptions.Abort, KeyboardInterrupt, EOFError):
            click.echo("")
            click.echo(
                click.style(f"stopped at the prompt: session {request.session_id} stays paused", fg="yellow")
                + f" ({session_command(prefix, 'show', request.session_id)}; "
                + f"{views.input_hint(request.session_id, request.interrupt_id, request.payload, prefix=prefix)})",
                err=True,
            )
            raise DemoStopped() from None
        finally:
            if previous is not None:
                signal.signal(signal.SIGINT, previous)

    return asked


def _ask_approval(request: Any) -> Any:
    return click.confirm(f"  {request.prompt}", default=True)


def _ask_job_failure(request: Any) -> Any:
    payload = request.payload if isinstance(request.payload, dict) else {}
    click.echo(f"  the geocoding job needs a decision: {payload.get('problem')}")
    click.echo(f"  fix: {payload.get('fix')}")
    return click.prompt("  retry or abort?", type=click.Choice(["retry", "abort"]), default="retry")


def run_demo(
    *,
    db: str,
    otlp_endpoint: str | None,
    otlp_protocol: str | None,
    interactive: bool,
    metrics_port: int | None,
    repeat: int,
    stale_after: float,
    metrics_host: str = "127.0.0.1",
) -> None:
    """The demo on the database at ``db`` (created if missing), printing as it goes."""
    from prometheus_client import CollectorRegistry

    from ..examples.demo import DemoDriver, batch_input, new_tag
    from ..examples.worker import HANGING_PATH, kill_worker, start_worker, wait_until_running
    from ..observability import MetricsPlugin

    db_path = db if is_postgres_url(db) else os.path.abspath(db)
    store = open_store(db, create=True)
    previous_term = _term_as_interrupt()
    prefix = command_prefix(db)
    tracing = None
    server = None
    proc = None
    t_start = time.monotonic()
    try:
        registry = CollectorRegistry()
        progress = ProgressPlugin(click.echo, show_payloads=True)  # the demo's own data
        plugins: list[Any] = []
        tracing = configure_cli_tracing(otlp_endpoint, otlp_protocol, "flowscope-demo", warn=_warn)
        spans_to = ""
        if tracing is not None:
            plugins.append(tracing.plugin())
            if otlp_endpoint:
                spans_to = f", spans to {mask_url_credentials(otlp_endpoint)} ({resolve_otlp_protocol(otlp_endpoint, otlp_protocol)})"
            elif tracing.exporters:  # from the OTEL_* variables
                spans_to = ", spans to " + ", ".join(tracing.exporters)
        # Job results are counted from the log by the metrics endpoint's StoreCollector.
        metrics = MetricsPlugin(registry=registry, job_results=False)
        worker_plugins = [*plugins, metrics]  # the in-process worker's: no progress lines
        plugins += [metrics, progress]

        click.echo(f"flowscope demo: database {shown_db(db)}" + spans_to)
        if metrics_port is not None:
            server = start_metrics_server(
                store, registry, host=metrics_host, port=metrics_port, stale_after=stale_after
            )
            click.echo(f"metrics (in-process and store): {server.url}")

        tag = new_tag()
        worker_session = f"demo-{tag}-export"
        # The worker that will be killed starts now, in its own process, while the batches
        # run; its first export attempt hangs far longer than any demo (--repeat, prompts)
        # takes, so it is still inside the node when it is killed.
        proc = start_worker(db_path, worker_session, hang_s=WORKER_HANG_S, heartbeat_s=0.2)

        driver = DemoDriver(
            store,
            plugins,
            echo=click.echo,
            ask_approval=_asking(_ask_approval, prefix) if interactive else None,
            ask_job_failure=_asking(_ask_job_failure, prefix) if interactive else None,
        )
        main_session = f"demo-{tag}-orders"
        failed_session = f"demo-{tag}-declined"
        reports = []

        async def batches() -> None:
            for i in range(repeat):
                suffix = "" if i == 0 else f"-{i + 1}"
                progress.enabled = i == 0
                for session, scenario, title in (
                    (main_session + suffix, "normal", "a batch of orders, end to end"),
                    (
                        failed_session + suffix,
                        "card_declined",
                        "a second batch, with a card that is declined",
                    ),
                ):
                    if i == 0:
                        _section(f"{title}: session {session}")
                    rep = await driver.run_batch(
                        session, batch_input(f"B-{tag}{suffix}-{scenario[:4]}", scenario)
                    )
                    reports.append(rep)
                    if rep.status == "completed":
                        line = (
                            click.style("completed", fg="green")
                            + f" after {rep.invocations} invocation(s): {rep.output}"
                        )
                    elif rep.status == "failed":
                        meant = " (as intended)" if scenario == "card_declined" else ""
                        line = (
                            click.style("failed", fg="red")
                            + f"{meant} after {rep.invocations} invocation(s): {rep.error}"
                        )
                    else:
                        line = (
                            click.style(rep.status, fg="yellow") + f" after {rep.invocations} invocation(s)"
                        )
                    click.echo(("  => " if i == 0 else f"  run {i + 1}/{repeat} {session}: ") + line)

        lost_session = f"demo-{tag}-lost"

        async def lost_job() -> Any:
            _section(f"a third batch, whose geocoding job the worker loses: session {lost_session}")
            progress.enabled = True
            rep = await driver.run_batch(
                lost_session,
                batch_input(f"B-{tag}-lost", "normal", geocoding_deadline_s=stale_after),
                answer=False,
            )
            return rep

        asyncio.run(batches())
        lost = asyncio.run(lost_job())
        lost_jobs = [p.job_id for p in lost.extra.get("pending", []) if isinstance(p, JobDispatched)]
        if lost_jobs:
            click.echo(f"  the worker never reports {lost_jobs[0]}: the session waits (waiting_job), and is")
            click.echo(
                f"  overdue once the job is past its deadline_s={stale_after:g}s (flowscope stuck, flowscope_store_overdue_jobs)"
            )

        queue = [f"demo-{tag}-queued-{i + 1}" for i in range(QUEUED_SESSIONS)]
        _section(
            f"a queue served by a worker: {len(queue)} sessions submitted, claimed and run by flowscope.Worker"
        )
        outcomes = asyncio.run(_serve_queue(store, worker_plugins, queue))
        done = ", ".join(f"{n} {k}" for k, n in sorted(outcomes.items())) or "nothing"
        click.echo(
            f"  the worker claimed them from the queue and ran them: {done} (flowscope_worker_claims_total)"
        )
        left_queued = f"demo-{tag}-queued-later"
        _submit_export(store, left_queued)
        click.echo(f"  {left_queued}, submitted after the worker stopped, stays queued until a worker serves")
        click.echo(
            "  nightly_export (flowscope_store_queued_sessions; flowscope worker flowscope.examples.worker:nightly_export)"
        )

        _section(f"a worker killed mid-run: session {worker_session}")
        running = wait_until_running(store, worker_session, proc, timeout=30.0)
        pid = proc.pid
        err = kill_worker(proc)
        if running:
            click.echo(
                f"  worker pid {pid} started nightly_export; killed with SIGKILL inside {HANGING_PATH}"
            )
            click.echo("  its run stays 'running' in the store with no end, and its heartbeat stops:")
            click.echo(
                "  its owner's process is gone, so it is orphaned at once (flowscope stuck, flowscope_store_orphaned_runs)"
            )
        else:
            run = next((r for r in store.node_runs(worker_session) if r.path == HANGING_PATH), None)
            where = (
                f"{HANGING_PATH} was {run.status} when it was stopped"
                if run is not None
                else f"it never reached {HANGING_PATH}"
            )
            detail = f": {err.splitlines()[-1]}" if err else ""
            click.echo(click.style(f"  warning: no orphaned run this time: {where}{detail}", fg="yellow"))

        if tracing is not None:
            tracing.force_flush(3_000)

        _section(f"the main run, from the event log ({session_command(prefix, 'show', main_session)})")
        log = store.read(main_session)
        ws = rebuild(log)
        history = session_history(log)
        waterfall = waterfall_lines(
            views.show_rows(ws, history=history), end_ts=ws.updated_at, windows=history.windows
        )
        for line in session_header(ws) + [""] + waterfall:
            click.echo(line)

        demo_sessions = [rep.session_id for rep in reports] + [lost_session, *queue, worker_session]
        runs = [r for sid in demo_sessions for r in store.node_runs(sid)]
        repeats = f", all {repeat} repeats" if repeat > 1 else ""
        _section(f"the attempt audit of this demo ({prefix} audit; --format json for programs{repeats})")
        rows = views.audit_rows(runs, retry_reasons(store, runs))
        click.echo(audit_table(rows, "node"))  # the same table as `flowscope audit`

        elapsed = time.monotonic() - t_start
        _section(f"done in {elapsed:.1f}s; next, try")
        stale = f"{stale_after:g}s"
        hints = [
            (f"{prefix} runs", "every session in the database"),
            (session_command(prefix, "show", main_session), "the waterfall above"),
            (session_command(prefix, "show", failed_session), "the PAYMENT_DECLINED failure, where it began"),
            (f"{prefix} audit --format json", "attempts, retries, recoveries, errors per node"),
            (
                f"{prefix} stuck --older-than 0s --stale-after {stale}",
                "the killed worker's orphaned run, the overdue job",
            ),
            (
                session_command(prefix, "resume", worker_session),
                "recover the orphaned run (no --force): a new attempt, finished nodes kept",
            ),
            (
                session_command(prefix, "export", main_session, "-o", "spans.json"),
                "its spans as OTLP JSON, rebuilt from the log",
            ),
            (f"{prefix} serve-metrics", "Prometheus metrics over the store on 127.0.0.1:9464"),
        ]
        if lost_jobs:
            result = '{"success": true, "count": 3, "data": {"geocoded": [1, 2, 3]}}'
            hints.insert(
                6,
                (
                    session_command(
                        prefix, "resume", lost_session, "--job", quoted(f"{lost_jobs[0]}={result}")
                    ),
                    "report the lost job",
                ),
            )
        width = min(56, max(len(c) for c, _ in hints))
        for command, what in hints:
            if len(command) > width:
                click.echo(f"  {command}")
                click.echo(f"  {'':<{width}}   # {what}")
            else:
                click.echo(f"  {command:<{width}}   # {what}")
        click.echo("")
        click.echo("  The same spans in Jaeger (UI on http://localhost:16686):")
        click.echo(
            "    docker run -d --name jaeger -p 16686:16686 -p 4317:4317 -p 4318:4318 jaegertracing/all-in-one"
        )
        click.echo(f"    {prefix} demo --otlp-endpoint http://localhost:4318")
        click.echo(
            f"    {session_command(prefix, 'export', main_session, '--otlp-endpoint', 'http://localhost:4318')}"
        )
        click.echo(
            "  The full stack (collector, Jaeger, Tempo, Prometheus, Grafana): flowscope deploy-files DIR writes its configs; docs/operations.md"
        )

        if server is not None:
            if tracing is not None:
                tracing.shutdown()
                tracing = None
            click.echo("")
            click.echo(f"serving metrics at {server.url} until Ctrl-C or SIGTERM")
            wait_for_signal()
            click.echo("stopped")
    finally:
        if proc is not None and proc.poll() is None:
            kill_worker(proc)
        if server is not None:
            server.shutdown()
        if tracing is not None:
            tracing.shutdown()
        store.close()
        if previous_term is not None:
            signal.signal(signal.SIGTERM, previous_term)


#: Sessions the demo submits to its queue for the in-process worker.
QUEUED_SESSIONS = 2


def _submit_export(store: Any, session_id: str) -> None:
    """Queue a run of the bundled ``nightly_export`` (no hang) for a worker."""
    from ..engine.runner import Runner
    from ..examples.worker import export_input, nightly_export

    Runner(nightly_export, store=store).submit(export_input(0.0), session_id=session_id)


async def _serve_queue(
    store: Any, plugins: list[Any], sessions: list[str], timeout: float = 30.0
) -> dict[str, int]:
    """Submit ``sessions`` and let a :class:`~flowscope.Worker` claim and run them, then stop
    it: the queue and the worker series (``flowscope_worker_*``) get real traffic. Returns
    the worker's outcomes."""
    from ..examples.worker import nightly_export
    from ..worker import Worker

    for sid in sessions:
        _submit_export(store, sid)
    worker = Worker(store, [nightly_export], plugins, concurrency=4, drain_s=5.0, poll_s=0.05)
    task = asyncio.create_task(worker.run())
    deadline = time.monotonic() + timeout
    while not task.done() and time.monotonic() < deadline:
        infos = [store.session_info(sid) for sid in sessions]
        if all(i is not None and i.status not in ("queued", "running") for i in infos):
            break
        await asyncio.sleep(0.05)
    worker.stop()
    await task
    return dict(worker.outcomes)


def _warn(text: str) -> None:
    click.echo(click.style(f"warning: {text}", fg="yellow"), err=True)


def _term_as_interrupt() -> Any:
    """While the demo runs, SIGTERM stops it like Ctrl-C (the worker is killed, the store closed)."""
    try:
        return signal.signal(signal.SIGTERM, signal.default_int_handler)
    except ValueError:  # not the main thread (embedded use): leave signals alone
        return None


COMMANDS = (demo,)
