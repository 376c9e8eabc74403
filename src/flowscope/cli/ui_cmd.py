"""``flowscope ui``: the operator's console, a local web page over the store.

The server is :mod:`flowscope.console` (Starlette, served by uvicorn: the extra
``flowscope[ui]``); without them the command says in one line how to install them. The
first line printed is the URL to open, with the per-start token.
"""

from __future__ import annotations

import socket
from typing import Any

import click

from .app import POSITIVE_DURATION, command_prefix, db_option, not_empty, open_store, resolve_db, shown_db
from .failures import CliError

__all__ = ["ui", "COMMANDS"]

INSTALL_HINT = "the console needs its extra: pip install 'flowscope[ui]' (Starlette and uvicorn)"


@click.command()
@db_option
@click.option(
    "--host",
    default="127.0.0.1",
    show_default=True,
    callback=not_empty,
    help="The address to listen on (keep it on loopback unless you know why).",
)
@click.option(
    "--port",
    type=click.IntRange(0, 65535),
    default=8765,
    show_default=True,
    help="The port (0: any free port).",
)
@click.option(
    "--read-only",
    is_flag=True,
    help="Serve no write at all (answers, retry, cancel are refused); the store is opened read-only.",
)
@click.option(
    "--allow-host",
    "allow_hosts",
    multiple=True,
    metavar="NAME",
    help="Also accept this Host header (a name this machine is reached by; repeatable).",
)
@click.option(
    "--stale-after",
    type=POSITIVE_DURATION,
    default=60.0,
    show_default=True,
    help="Seconds after which a running run without an owner and with an old heartbeat counts as orphaned.",
)
@click.option(
    "--queued-after",
    type=POSITIVE_DURATION,
    default=60.0,
    show_default=True,
    help="Seconds queued after which a session is 'queued too long'.",
)
def ui(
    db: str | None,
    host: str,
    port: int,
    read_only: bool,
    allow_hosts: tuple[str, ...],
    stale_after: float,
    queued_after: float,
) -> None:
    """Serve the operator's console on http://127.0.0.1:8765 (the first line is its URL).

    Sessions with filters and attention tabs, one waterfall per session across its
    invocations, attempts and events per node, answers, retry, cancel and bulk actions,
    live as the store changes. Everything goes through the same functions as the CLI.
    See docs/ui.md.
    """
    try:
        import uvicorn

        from ..console.app import ConsoleConfig, create_app
    except ImportError:
        raise CliError(INSTALL_HINT) from None
    path = resolve_db(db)
    store = open_store(db, write=not read_only, settle_s=2.0)  # a file a worker creates now
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
        # listen before the URL is printed: a browser that opens it at once waits in the
        # backlog until uvicorn accepts, where a bound socket not yet listening refuses it
        sock.listen(2048)
    except OSError as exc:
        sock.close()
        store.close()
        raise CliError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None
    bound = sock.getsockname()[1]
    config = ConsoleConfig(
        store=store,
        db_shown=shown_db(path),
        prefix=command_prefix(path),
        host=host,
        port=bound,
        read_only=read_only,
        allowed_hosts=allow_hosts,
        stale_after_s=stale_after,
        queued_after_s=queued_after,
    )
    app = create_app(config)
    click.echo(config.url())
    mode = "read-only" if read_only else "read-write"
    click.echo(f"flowscope ui: {shown_db(path)} ({mode}); Ctrl-C stops it", err=True)

    class Server(uvicorn.Server):
        def handle_exit(self, sig: int, frame: Any) -> None:
            config.stopping.set()  # the open pages' change streams end (not cancelled mid-stream)
            super().handle_exit(sig, frame)

    # the graceful wait outlasts one turn of a change stream (live_interval_s)
    server = Server(
        uvicorn.Config(
            app, log_level="warning", access_log=False, lifespan="off", timeout_graceful_shutdown=3
        )
    )
    try:
        server.run(sockets=[sock])
    finally:
        sock.close()
        store.close()


COMMANDS = (ui,)
