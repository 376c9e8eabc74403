"""The commands of run ownership: ``worker`` serves workflows, ``start`` submits a run.

``flowscope worker MODULE:ATTR ...`` imports the workflows (the current directory is
importable, as with ``python -m``) and runs a :class:`~flowscope.worker.Worker` on the
database until SIGTERM or Ctrl-C, then drains and exits 0. ``flowscope start WORKFLOW``
records a run by the workflow's name, without its code, for a worker to pick up.
:func:`worker_hint` is what ``resume`` says about workers when it records answers.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import os
import signal
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

import click

from ..engine.graph import MAX_SESSION_ID, check_name
from ..engine.submit import check_input, check_session_id, check_workflow_name, submit_run
from ..errors import OutputNotSerializableError, StoreNotWritable
from ..fold import WorkflowState
from ..liveness import WORKER_SEEN_WITHIN_S, worker_alive
from ..store.base import EventStore
from ..threads import block_sigcont, sigcont_blocked
from .app import (
    DURATION,
    POSITIVE_DURATION,
    command_prefix,
    db_option,
    json_arg,
    metrics_host_option,
    open_store,
    otlp_protocol_option,
)
from .failures import EXIT_STORE_OUTAGE, CliError, to_cli_error
from .rowparts import serving_worker, session_command
from .runtime import configure_cli_tracing

if TYPE_CHECKING:
    from ..store.postgres import PostgresEventStore
    from ..store.sqlite import SqliteEventStore

__all__ = [
    "worker_cmd",
    "start",
    "load_workflows",
    "worker_hint",
    "worker_command",
    "submit_by_name",
    "record_answers",
    "cwd_importable",
    "tune_gc",
    "worker_gc_thresholds",
    "WORKER_GC_THRESHOLDS",
    "WORKER_GC_YOUNG_PER_SESSION",
    "untune_gc",
    "StoreOutageStop",
    "COMMANDS",
]

#: How recently a worker must have recorded itself to count as serving a workflow (the
#: one rule, :func:`flowscope.liveness.worker_alive`).
SEEN_WITHIN_S = WORKER_SEEN_WITHIN_S


def load_workflows(specs: tuple[str, ...]) -> list[Any]:
    """The workflows ``MODULE:ATTR`` name (each a Workflow or a list/tuple of them), with
    the current directory importable; a bad spec is a CliError
    (:func:`flowscope.examples.load_target` and :func:`~flowscope.examples.as_workflow`,
    the rules ``resume --workflow`` applies)."""
    from ..examples import as_workflow, load_target

    cwd_importable()
    out: list[Any] = []
    for spec in specs:
        try:
            obj = load_target(spec)
            out.extend(
                as_workflow(item, spec) for item in (list(obj) if isinstance(obj, (list, tuple)) else [obj])
            )
        except ValueError as exc:
            raise CliError(f"{exc}" if str(exc).startswith(spec) else f"{spec}: {exc}") from None
    return out


def cwd_importable() -> None:
    """Make the current directory importable, as ``python -m`` does (console scripts do not)."""
    cwd = os.getcwd()
    if cwd not in sys.path and "" not in sys.path:
        sys.path.insert(0, cwd)


def worker_command(workflow: str, prefix: str = "flowscope", session_id: str = "") -> str:
    """The ``flowscope worker`` command line for ``workflow``: its module:attr when it is
    bundled and ``flowscope demo`` made the session (:func:`~flowscope.examples.bundled_for`)."""
    from ..examples import bundled_for

    return f"{prefix} worker {bundled_for(workflow, session_id) or 'MODULE:ATTR'}"


def worker_hint(
    store: EventStore,
    workflow: str,
    now: float | None = None,
    prefix: str = "flowscope",
    session_id: str = "",
) -> tuple[bool, str]:
    """Whether a live worker serves ``workflow``, and the sentence that says so.

    Alive is :func:`flowscope.liveness.worker_alive`: recorded within
    :data:`SEEN_WITHIN_S` and, on this host, its process still there. A worker record
    that fails it is named as gone, never as the worker that will pick the session up;
    when live workers serve only other workflows, the sentence names those (a typo in
    the workflow's name shows at once). The command to start a worker ends every
    sentence that finds none.
    """
    now = time.time() if now is None else now
    records = store.workers()
    alive = [w for w in records if worker_alive(w.host, w.pid, w.seen_at, now)]
    w = serving_worker(alive, workflow)
    if w is not None:
        return True, (
            f"a worker will pick it up: {w.worker_id} on {w.host} pid {w.pid} serves {workflow!r} "
            f"(alive, seen {max(0.0, now - w.seen_at):.1f}s ago)"
        )
    start = f"start one with {worker_command(workflow, prefix, session_id)}"
    gone = [w for w in records if workflow in w.workflows]
    if gone:
        w = max(gone, key=lambda w: w.seen_at)
        return False, (
            f"no live worker for {workflow!r}: {w.worker_id} on {w.host} pid {w.pid} (seen "
            f"{max(0.0, now - w.seen_at):.1f}s ago) is gone; {start}"
        )
    others = sorted({name for w in alive for name in w.workflows})
    if others:
        return (
            False,
            f"no worker serves {workflow!r}: the live workers serve {', '.join(others)}; check the name, or {start}",
        )
    return False, f"no worker for {workflow!r} seen in the last {SEEN_WITHIN_S:g}s: {start}"


def record_answers(
    store: SqliteEventStore | PostgresEventStore,
    session: str,
    ws: WorkflowState,
    inputs: dict[str, Any],
    jobs: dict[str, Any],
) -> None:
    """``flowscope resume`` without the workflow's code: record the answers with
    :func:`flowscope.answer` and say whether a worker will pick the session up."""
    from ..answers import answer
    from ..examples import bundled_for
    from ..liveness import owner_alive

    prefix = command_prefix(store.path)
    here = session_command(
        prefix,
        "resume",
        session,
        *([] if bundled_for(ws.workflow, session) else ["--workflow", "MODULE:ATTR"]),
    )
    if not inputs and not jobs:
        info = store.session_info(session)
        orphaned = (
            ws.status == "running"
            and info is not None
            and not owner_alive(info.owner, info.lease_expires_at, time.time())
        )
        seen, hint = worker_hint(store, ws.workflow, prefix=prefix, session_id=session)
        if seen and (ws.status in ("queued", "answered") or orphaned):
            click.echo(f"nothing to record for {session} ({ws.workflow}, {ws.status}); {hint}")
            return
        raise CliError(
            f"session {session!r} ({ws.workflow}, {ws.status}) has nothing to record and its workflow's code is "
            f"not here: run it in this process with {here}"
            + (f"; {hint}" if ws.status in ("queued", "answered") or orphaned else "")
        )
    receipt = answer(store, session, inputs or None, jobs or None)
    what = ", ".join([*(f"input {i}" for i in receipt.inputs), *(f"job {j}" for j in receipt.jobs)])
    if receipt.owner is not None:  # one writer per session: its live owner records it
        click.echo(
            f"sent {what} to {session} ({receipt.workflow}): its owner, {receipt.owner.describe()}, is still running it "
            "and records the answer when its invocation pauses (or the next owner does); nothing else to do"
        )
        return
    click.echo(f"recorded {what} for {session} ({receipt.workflow})")
    seen, hint = worker_hint(store, receipt.workflow, prefix=prefix, session_id=session)
    click.echo(hint)
    if not seen:
        click.echo(f"or run it in this process: {here}")


def submit_by_name(store: EventStore, workflow: str, input: Any, session_id: str | None = None) -> str:
    """Record a run of ``workflow`` (by name: no code needed) to be started by a worker:
    :func:`flowscope.engine.submit.submit_run`, the checks ``Runner.submit`` applies."""
    return submit_run(store, workflow, input, session_id)


@click.command("start")
@click.argument("workflow")
@db_option
@click.option(
    "--input", "input_json", default="null", metavar="JSON", help="The run input, as JSON (default null)."
)
@click.option(
    "--session", "session_id", metavar="ID", help="The session id (default: a new time-ordered one)."
)
def start(workflow: str, db: str | None, input_json: str, session_id: str | None) -> None:
    """Submit a run of WORKFLOW (its name: no code needed) for a worker to start.

    Prints the session id on stdout, and on stderr whether a live worker serves WORKFLOW
    (`flowscope worker MODULE:ATTR`). The input and the id pass the checks Runner.submit
    applies; a bad one is refused (exit 2) and nothing is recorded. Exit 0 once queued,
    with a warning when no live worker serves WORKFLOW (see docs/cli.md).
    """
    value = json_arg(input_json, "--input")
    try:
        check_workflow_name(workflow)
    except ValueError as exc:
        raise CliError(f"WORKFLOW: {exc}") from None
    try:
        check_session_id(session_id) if session_id is not None else None
        check_input(value)
    except (ValueError, OutputNotSerializableError) as exc:
        option = "--session" if isinstance(exc, ValueError) else "--input"
        raise CliError(f"{option}: {exc}") from None
    store = open_store(db, write=True, create=True)
    with store:
        sid = submit_by_name(store, workflow, value, session_id)
        prefix = command_prefix(store.path)
        seen, hint = worker_hint(store, workflow, prefix=prefix, session_id=sid)
        click.echo(sid)
        if seen:
            click.echo(f"queued {workflow} as session {sid}; {hint}", err=True)
        else:
            click.echo(f"warning: queued {workflow} as session {sid}, but {hint}", err=True)
        click.echo(f"see: {session_command(prefix, 'show', sid)}", err=True)


#: The largest --concurrency and --max-recoveries, far above what a process holds or a
#: session survives: a larger number is a typing slip, refused in one line.
MAX_CONCURRENCY = 1_000_000


def _warn_if_twin(store: EventStore, worker_id: str, host: str, pid: int) -> None:
    """Say it when another live process records itself under this worker id: twins take
    each other's live sessions (a lease is its worker id's) and overwrite each other's
    record, so ``start`` and ``stuck`` may say nobody serves what one of them does."""
    try:
        records = store.workers()
    except Exception:  # the worker's own first round says a store that does not answer
        return
    now = time.time()
    for r in records:
        if (
            r.worker_id == worker_id
            and (r.host, r.pid) != (host, pid)
            and worker_alive(r.host, r.pid, r.seen_at, now)
        ):
            click.echo(
                f"warning: worker id {worker_id} is in use by a live worker on {r.host} pid {r.pid} "
                f"(seen {max(0.0, now - r.seen_at):.1f}s ago): two workers with one id take each other's "
                "sessions; give each worker its own --worker-id",
                err=True,
            )


def _worker_id(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    """``--worker-id`` as a session id is checked (printed in every log line and ``runs``
    row: no control character, valid UTF-8, at most ``MAX_SESSION_ID`` characters)."""
    if value is None:
        return None
    try:
        return check_name(value, "--worker-id", MAX_SESSION_ID)
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from None


@click.command("worker")
@click.argument("specs", nargs=-1, required=True, metavar="MODULE:ATTR...")
@db_option
@click.option(
    "--concurrency",
    type=click.IntRange(1, MAX_CONCURRENCY),
    default=64,
    show_default=True,
    help="Sessions run at once.",
)
@click.option(
    "--lease",
    "lease_s",
    type=POSITIVE_DURATION,
    default="15s",
    show_default=True,
    help="The lease each session is held under (renewed every third).",
)
@click.option(
    "--drain",
    "drain_s",
    type=DURATION,
    default="30s",
    show_default=True,
    help="On SIGTERM, how long sessions in hand may run on before they are handed back.",
)
@click.option(
    "--poll",
    "poll_s",
    type=POSITIVE_DURATION,
    default="500ms",
    show_default=True,
    help="How often to look for work when there was none.",
)
@click.option(
    "--worker-id", metavar="ID", callback=_worker_id, help="This worker's id (default: host-pid-random)."
)
@click.option(
    "--max-recoveries",
    type=click.IntRange(0, MAX_CONCURRENCY),
    default=3,
    show_default=True,
    help="Orphaned sessions recovered more often are left alone.",
)
@click.option(
    "--max-store-outage",
    "max_store_outage_s",
    type=DURATION,
    default="60s",
    show_default=True,
    help="Stop (exit 3) when the database has refused every write for this long (a full disk, a read-only database); a server that does not answer is waited for.",
)
@click.option(
    "--metrics-port",
    type=click.IntRange(0, 65535),
    default=None,
    help="Serve this worker's Prometheus metrics on --metrics-host:PORT.",
)
@metrics_host_option
@click.option(
    "--otlp-endpoint",
    metavar="URL",
    help="Send the spans of the sessions it runs to this OTLP endpoint (and those a killed worker had not sent); default: OTEL_EXPORTER_OTLP_ENDPOINT.",
)
@otlp_protocol_option
@click.option(
    "--log-level",
    type=click.Choice(["debug", "info", "warning", "error"]),
    default="warning",
    show_default=True,
)
def worker_cmd(
    specs: tuple[str, ...],
    db: str | None,
    concurrency: int,
    lease_s: float,
    drain_s: float,
    poll_s: float,
    worker_id: str | None,
    max_recoveries: int,
    max_store_outage_s: float,
    metrics_port: int | None,
    metrics_host: str,
    otlp_endpoint: str | None,
    otlp_protocol: str | None,
    log_level: str,
) -> None:
    """Serve the workflows MODULE:ATTR (a Workflow, or a list of them) from the database.

    Claims queued sessions (`flowscope start`), sessions answered with `flowscope resume`
    and sessions whose owner died, until SIGTERM or Ctrl-C; then stops claiming, lets the
    sessions in hand run for up to --drain, hands back the rest and exits 0. If the
    database refuses writes (a full disk, a read-only file or server) for
    --max-store-outage, it stops at once and exits 3.
    """
    from ..plugins import Plugin
    from ..worker import Worker

    logging.basicConfig(level=log_level.upper(), format="%(asctime)s %(name)s %(levelname)s %(message)s")
    # psycopg's own lines only at --log-level debug (open_store quiets them else)
    if log_level.upper() == "DEBUG":
        logging.getLogger("psycopg").setLevel(logging.DEBUG)
    workflows = load_workflows(specs)
    # The threads started here (the database pool's, the span exporter's) inherit a mask
    # that leaves SIGCONT to the main thread, whose handler checks the leases (threads.py).
    with sigcont_blocked():
        store = open_store(db, write=True, create=True)
        tracing = configure_cli_tracing(
            otlp_endpoint,
            otlp_protocol,
            "flowscope-worker",
            warn=lambda t: click.echo(f"warning: {t}", err=True),
        )
    server = None
    with store:
        plugins: list[Plugin] = [tracing.plugin()] if tracing is not None else []
        if metrics_port is not None:
            from prometheus_client import CollectorRegistry

            from ..observability.metrics import MetricsPlugin
            from ..observability.serve import start_metrics_http

            registry = CollectorRegistry(auto_describe=True)
            # Job results are counted from the log by serve-metrics (StoreCollector), whichever
            # process reported them: counting them here too would count them twice.
            plugins.append(MetricsPlugin(registry=registry, job_results=False))
            try:
                server = start_metrics_http(metrics_port, metrics_host, registry)
            except OSError as exc:
                raise CliError(
                    f"cannot listen on {metrics_host}:{metrics_port}: {exc.strerror or exc}"
                ) from None
        w = Worker(
            store,
            workflows,
            plugins,
            concurrency=concurrency,
            lease_s=lease_s,
            drain_s=drain_s,
            poll_s=poll_s,
            worker_id=worker_id,
            max_recoveries=max_recoveries,
            max_store_outage_s=max_store_outage_s,
        )
        names = ", ".join(sorted(w.workflows))
        click.echo(
            f"worker {w.owner.worker_id} (pid {w.owner.pid}) serving {names} from {store.path}; SIGTERM or Ctrl-C drains",
            err=True,
        )
        _warn_if_twin(store, w.owner.worker_id, w.owner.host, w.owner.pid)
        outage: StoreNotWritable | None = None
        thresholds = tune_gc(concurrency)
        try:
            asyncio.run(_serve(w))
        except StoreNotWritable as exc:  # Worker.run drained and raised it: say it once, below
            outage = exc
        finally:
            untune_gc(thresholds)  # as it was (the command may run inside a host: a test)
            if tracing is not None:
                tracing.shutdown()
        done = ", ".join(f"{k} {v}" for k, v in sorted(w.outcomes.items())) or "no sessions"
        if outage is not None:
            raise StoreOutageStop(
                f"worker {w.owner.worker_id} stopped after {max_store_outage_s:g}s without a write going through "
                f"({done}): {to_cli_error(outage, store.path).message}"
            )
        click.echo(f"worker {w.owner.worker_id} stopped ({done})", err=True)
    if isinstance(server, tuple):  # prometheus-client >= 0.20 returns (server, thread)
        server[0].shutdown()


#: The collector's thresholds in a ``flowscope worker`` holding few sessions (generation
#: 0, 1, 2; CPython's defaults are 700, 10, 10): see :func:`tune_gc`.
WORKER_GC_THRESHOLDS = (10_000, 10, 100)

#: Allocations of generation 0 per session a worker may hold (``--concurrency``) between
#: two young collections, when that is more than :data:`WORKER_GC_THRESHOLDS`' first.
WORKER_GC_YOUNG_PER_SESSION = 30


def worker_gc_thresholds(concurrency: int) -> tuple[int, int, int]:
    """The collector's thresholds :func:`tune_gc` sets in a worker that runs up to
    ``concurrency`` sessions at once: generation 0 at :data:`WORKER_GC_YOUNG_PER_SESSION`
    allocations per session, at least :data:`WORKER_GC_THRESHOLDS`' first."""
    young, middle, old = WORKER_GC_THRESHOLDS
    return (max(young, WORKER_GC_YOUNG_PER_SESSION * concurrency), middle, old)


def tune_gc(concurrency: int = 1) -> tuple[int, int, int]:
    """Tune the garbage collector of this process, a ``flowscope worker`` running up to
    ``concurrency`` sessions at once: a process of flowscope's own (the library never
    touches a host's collector).

    What is loaded before serving (modules, the workflows, plugins, the store) is frozen
    out of the collector's walks (``gc.freeze``). A worker serving thousands of sessions
    keeps each one's invocation alive across loop turns, and every object alive across a
    turn (the events of a flush, a node run's context) is promoted to the oldest generation,
    which CPython then walks whole each time a quarter of it is new: at 10,000 sessions,
    every second or so. The oldest generation is collected at most every 100 collections
    of generation 1, so a full walk is rare. Generation 0 is collected every 10,000
    allocations instead of 700, and with more sessions in hand every 30 per session
    (:func:`worker_gc_thresholds`): a young collection that comes before the sessions of
    a loop turn have taken their steps finds their objects still in use, promotes them and
    walks them again in generation 1 (at 10,000 sessions its walks of generations 0 and 1
    took about 22 µs per node run at 10,000 allocations, 9 at 300,000). What waits for a young
    collection, cycles that died, is bounded by the same 30 objects per session beside the
    sixty or more each holds. ``gc.get_threshold()`` shows the values in force. Returns the
    thresholds before, for :func:`untune_gc`."""
    before = gc.get_threshold()
    gc.collect()
    gc.freeze()
    gc.set_threshold(*worker_gc_thresholds(concurrency))
    return before


def untune_gc(thresholds: tuple[int, int, int]) -> None:
    """Undo :func:`tune_gc` when the worker stops."""
    gc.set_threshold(*thresholds)
    gc.unfreeze()


class StoreOutageStop(CliError):
    """``flowscope worker`` stopped because its database refused writes for too long."""

    exit_code = EXIT_STORE_OUTAGE


async def _serve(w: Any) -> None:
    """Run the worker with SIGTERM and SIGINT calling its stop()."""
    loop = asyncio.get_running_loop()
    # what node bodies hand to asyncio.to_thread: threads that leave SIGCONT to the main thread
    loop.set_default_executor(
        ThreadPoolExecutor(thread_name_prefix="flowscope-to-thread", initializer=block_sigcont)
    )
    installed = []
    for sig in (signal.SIGTERM, signal.SIGINT):
        try:
            loop.add_signal_handler(sig, w.stop)
            installed.append(sig)
        except (NotImplementedError, RuntimeError, ValueError):  # pragma: no cover - not the main thread
            pass
    try:
        await w.run()
    finally:
        for sig in installed:
            loop.remove_signal_handler(sig)


COMMANDS = (worker_cmd, start)
