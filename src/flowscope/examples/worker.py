"""A worker process that dies mid-run, so that ``flowscope stuck`` has something to find.

    python -m flowscope.examples.worker --db flowscope.db --session SESSION [--hang 30]

runs the bundled ``nightly_export`` workflow in a new session on the SQLite file. Its
``export_rows`` node works through partitions slowly (``--hang`` seconds in all) on its
first attempt, heartbeating as it goes; ``flowscope demo`` kills the process with SIGKILL
in the middle of it. The run is left ``running`` in the store, its heartbeat goes stale,
and it becomes *orphaned*. ``flowscope resume SESSION`` (from any process) re-executes the
node as a new, recovered attempt, which finishes at once; the nodes that had completed
(``snapshot``) are not run again.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import subprocess
import sys
import time
from typing import Any

from .. import START, NodeContext, Runner, Workflow, node

__all__ = ["nightly_export", "export_input", "start_worker", "wait_until_running", "kill_worker", "main"]


def export_input(hang_s: float = 0.0) -> dict[str, Any]:
    """The run input: which table to export; ``simulate_hang_s`` slows the first attempt."""
    return {"table": "orders", "partitions": 4, "simulate_hang_s": hang_s}


@node
async def snapshot(ctx: NodeContext, request: Any) -> Any:
    await asyncio.sleep(0.01)
    return {**request, "snapshot": f"snap-{ctx.idempotency_key[:8]}", "rows": 1200}


@node
async def export_rows(ctx: NodeContext, snap: Any) -> Any:
    hang = float(snap.get("simulate_hang_s") or 0.0)
    partitions = int(snap.get("partitions") or 1)
    for _part in range(partitions):
        if ctx.attempt == 1 and hang > 0:  # the first attempt is slow: long enough to be killed in
            await asyncio.sleep(hang / partitions)
        ctx.heartbeat()  # a long step tells the store it is alive
    return {
        "snapshot": snap["snapshot"],
        "rows": snap["rows"],
        "files": [f"part-{i}.parquet" for i in range(partitions)],
    }


@node
async def publish_report(ctx: NodeContext, exported: Any) -> Any:
    await asyncio.sleep(0.005)
    return {"exported_rows": exported["rows"], "files": len(exported["files"])}


#: The bundled workflow of the killed worker.
nightly_export = Workflow("nightly_export", edges=[(START, snapshot, export_rows, publish_report)])

HANGING_PATH = "nightly_export@1/export_rows@1"
#: Where :func:`start_worker` gives its child the database (the CLI's variable).
DB_ENV = "FLOWSCOPE_DB"


def start_worker(
    db: str, session_id: str, hang_s: float = 30.0, heartbeat_s: float = 0.2
) -> subprocess.Popen[bytes]:
    """Start ``python -m flowscope.examples.worker`` on ``db`` (the caller kills it). The
    database goes in the child's environment, never its command line, which any local user
    can read (``ps``, ``/proc/PID/cmdline``): a URL's password stays where the caller kept it."""
    cmd = [
        sys.executable,
        "-m",
        "flowscope.examples.worker",
        "--session",
        session_id,
        "--hang",
        str(hang_s),
        "--heartbeat",
        str(heartbeat_s),
    ]
    return subprocess.Popen(
        cmd,
        env={**os.environ, DB_ENV: db},
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )


def wait_until_running(
    store: Any, session_id: str, proc: subprocess.Popen[bytes], timeout: float = 20.0
) -> bool:
    """Poll the store until the worker's ``export_rows`` run is ``running`` (True), or the
    worker exited or the timeout passed (False)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            return False
        for run in store.node_runs(session_id):
            if run.path == HANGING_PATH and run.status == "running":
                return True
        time.sleep(0.02)
    return False


def kill_worker(proc: subprocess.Popen[bytes]) -> str:
    """SIGKILL the worker (no cleanup, no final events: a real crash); its stderr, if any."""
    if proc.poll() is None:
        try:
            os.kill(proc.pid, signal.SIGKILL)
        except ProcessLookupError:  # pragma: no cover - it died on its own meanwhile
            pass
    try:
        _out, err = proc.communicate(timeout=10)
    except subprocess.TimeoutExpired:  # pragma: no cover
        return ""
    return (err or b"").decode(errors="replace").strip()


def _open(db: str) -> Any:
    """The store at ``db``: psycopg is imported only for a ``postgresql://`` URL, so a SQLite
    file works on an install without the ``postgres`` extra."""
    from ..store.postgres.dsn import is_postgres_url  # no psycopg

    if is_postgres_url(db):
        from ..store.postgres import PostgresEventStore

        return PostgresEventStore(db)
    from ..store.sqlite import SqliteEventStore

    return SqliteEventStore(db)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m flowscope.examples.worker", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument(
        "--db",
        default=os.environ.get(DB_ENV),
        help=f"the SQLite file, or a postgresql:// URL (default: ${DB_ENV}, which keeps a password off the command line)",
    )
    parser.add_argument("--session", required=True, help="the session id to start")
    parser.add_argument(
        "--hang", type=float, default=30.0, help="seconds the first attempt of export_rows takes"
    )
    parser.add_argument(
        "--heartbeat", type=float, default=0.2, help="the runner's heartbeat interval in seconds"
    )
    args = parser.parse_args(argv)
    if not args.db:
        parser.error(f"give --db or set ${DB_ENV}")

    store = _open(args.db)
    try:
        runner = Runner(nightly_export, store=store, heartbeat_interval=args.heartbeat)
        result = runner.run_sync(export_input(args.hang), session_id=args.session)
        print(f"{args.session}: {result.status}")
    finally:
        store.close()
    return 0


if __name__ == "__main__":  # pragma: no cover - run as a subprocess
    sys.exit(main())
