"""The ``flowscope`` click group, the options its commands share, and the one error handler.

Every command works on a SQLite file or a PostgreSQL database: ``--db PATH`` or
``--db postgresql://...``, else ``$FLOWSCOPE_DB``, else ``./flowscope.db``. A URL is only
ever printed through :func:`shown_db` (its password masked). The commands live in :mod:`.inspect_cmds`, :mod:`.operate_cmds` and
:mod:`.demo_cmd`; ``flowscope.cli`` adds them to :data:`cli`.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shlex
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn, TypeVar

import click

from ..errors import NotAFlowscopeDatabase, StoreUnavailable, mask_url_credentials
from ..jsontext import lone_surrogate, too_deep
from . import views
from .failures import EXIT_ERROR, CliError, to_cli_error
from .render import render_csv, render_json, use_utc, use_wide

if TYPE_CHECKING:
    from ..store.postgres import PostgresEventStore
    from ..store.sqlite import SqliteEventStore

__all__ = [
    "DEFAULT_DB",
    "ENV_DB",
    "ENV_UTC",
    "ENV_DURABILITY",
    "FORMATS",
    "DURATION",
    "POSITIVE_DURATION",
    "Duration",
    "FlowscopeGroup",
    "cli",
    "db_option",
    "format_option",
    "wide_option",
    "otlp_protocol_option",
    "metrics_host_option",
    "not_empty",
    "resolve_db",
    "open_store",
    "shown_db",
    "emit",
    "json_arg",
    "command_prefix",
    "silence_stdout",
    "main",
]

DEFAULT_DB = "flowscope.db"
ENV_DB = "FLOWSCOPE_DB"
ENV_UTC = "FLOWSCOPE_UTC"
ENV_DURABILITY = "FLOWSCOPE_DURABILITY"
FORMATS = ("table", "json", "csv")

#: Where open_store leaves the path it opened, in the click context's shared ``meta``, so
#: the error handler can name it in advice ("try `sqlite3 PATH .recover`").
_OPENED_DB = "flowscope.db_path"

F = TypeVar("F", bound=Callable[..., Any])


def silence_stdout() -> None:
    """Point stdout at /dev/null: its reader went away (``flowscope runs | head``)."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError, AttributeError):  # pragma: no cover - no real stdout (CliRunner)
        pass


_KEPT = "flowscope.stdout_kept"
#: Commands that change the store: what they print is a report of the change, so a stdout
#: that fails (its reader gone, a full disk) must not stop the change halfway.
WRITE_COMMANDS = frozenset({"resume", "cancel", "retry", "start", "prune"})


class _KeepGoing:
    """A write command's stdout: the first write that fails is kept (``lost``) and the
    rest are dropped, so the command finishes what it changes."""

    def __init__(self, stream: Any) -> None:
        self._stream = stream
        self.lost: OSError | None = None

    def write(self, text: str) -> int:
        if self.lost is None:
            try:
                return int(self._stream.write(text))
            except OSError as exc:
                self.lost = exc
        return len(text)

    def flush(self) -> None:
        if self.lost is None:
            try:
                self._stream.flush()
            except OSError as exc:
                self.lost = exc

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


class FlowscopeGroup(click.Group):
    """Converts any exception escaping a command into a one-line :class:`~.failures.CliError`."""

    def resolve_command(
        self, ctx: click.Context, args: list[str]
    ) -> tuple[str | None, click.Command | None, list[str]]:
        """The command, and for a write command a stdout whose failure does not stop it."""
        name, cmd, rest = super().resolve_command(ctx, args)
        if cmd is not None and cmd.name in WRITE_COMMANDS and not isinstance(sys.stdout, _KeepGoing):
            ctx.meta[_KEPT] = (sys.stdout, _KeepGoing(sys.stdout))
            sys.stdout = ctx.meta[_KEPT][1]
        return name, cmd, rest

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return self._invoke(ctx)
        finally:
            kept = ctx.meta.pop(_KEPT, None)
            if kept is not None:
                self._report_lost(*kept)

    @staticmethod
    def _report_lost(real: Any, out: _KeepGoing) -> None:
        """After a write command: a lost reader (``| true``) is silent, as for a read; any
        other failure of its stdout is said on stderr, after the change, which stands."""
        sys.stdout = real
        if out.lost is None:
            return
        silence_stdout()
        if not isinstance(out.lost, BrokenPipeError):
            why = out.lost.strerror or type(out.lost).__name__
            click.echo(
                f"flowscope: its report was not printed ({why}); the command itself completed", err=True
            )

    def _invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except (click.exceptions.Exit, click.exceptions.Abort, click.ClickException):
            raise
        except KeyboardInterrupt:
            click.echo("flowscope: interrupted", err=True)
            ctx.exit(130)
        except BrokenPipeError:  # `flowscope runs | head`
            silence_stdout()
            ctx.exit(0)
        except Exception as exc:
            if os.environ.get("FLOWSCOPE_DEBUG"):
                raise
            raise to_cli_error(exc, ctx.meta.get(_OPENED_DB)) from None


class Duration(click.ParamType):
    """``15m``, ``90s``, ``1h30m``, ``500ms`` or a number of seconds; with ``positive``,
    zero is a usage error (a lease or a poll interval of nothing)."""

    name = "duration"

    def __init__(self, positive: bool = False) -> None:
        self.positive = positive

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> float:
        if isinstance(value, (int, float)):
            seconds = float(value)
        else:
            try:
                seconds = views.parse_duration(value)
            except ValueError as exc:
                self.fail(str(exc), param, ctx)
        if self.positive and not seconds > 0:
            self.fail(f"{value!r} is not a positive duration (e.g. 500ms, 15s)", param, ctx)
        return seconds


DURATION = Duration()
#: A duration that must be more than zero.
POSITIVE_DURATION = Duration(positive=True)

# --------------------------------------------------------------------------- shared options


def not_empty(ctx: click.Context, param: click.Parameter, value: Any) -> Any:
    """A text option or argument given as ``''`` (``--db "$DB"`` with ``DB`` unset) is
    refused: taken as absent it would fall back to the current folder, or, as an address,
    bind every interface."""
    if isinstance(value, (str, Path)) and not str(value).strip():
        if isinstance(param, click.Argument):
            raise click.BadParameter(f"{param.human_readable_name} is empty: give one")
        raise click.BadParameter(
            f"{param.opts[0]} is empty: give a value, or leave the option out for its default"
        )
    return value


def db_option(f: F) -> F:
    """``--db PATH|URL`` on a command (it overrides the group's ``--db``)."""
    return click.option(
        "--db",
        "db",
        default=None,
        callback=not_empty,
        metavar="PATH|URL",
        help=f"A SQLite file or a postgresql:// URL (default: ${ENV_DB}, else ./{DEFAULT_DB}).",
    )(f)


def format_option(f: F) -> F:
    """``--format table|json|csv`` on a listing command."""
    return click.option(
        "--format",
        "fmt",
        type=click.Choice(FORMATS),
        default="table",
        show_default=True,
        help="table for people; json (a list of objects, keys in docs/cli.md) or csv for programs.",
    )(f)


def metrics_host_option(f: F) -> F:
    """``--metrics-host`` beside a command's ``--metrics-port``: the address its metrics
    endpoint binds. Loopback by default; a Prometheus in a container (docker-compose) needs
    an address it can reach (``0.0.0.0``, or the bridge's)."""
    return click.option(
        "--metrics-host",
        default="127.0.0.1",
        show_default=True,
        callback=not_empty,
        metavar="ADDRESS",
        help="Address the metrics endpoint binds (0.0.0.0 exposes it: nothing there authenticates).",
    )(f)


def wide_option(f: F) -> F:
    """``--wide`` on a command that prints a table: every cell whole, however wide the terminal."""
    return click.option(
        "--wide",
        is_flag=True,
        expose_value=False,
        callback=lambda _ctx, _param, on: use_wide(on),
        help="Print every cell whole; without it the table fits the terminal ($COLUMNS), long cells cut with '…'.",
    )(f)


def otlp_protocol_option(f: F) -> F:
    """``--otlp-protocol`` beside a command's ``--otlp-endpoint``."""
    return click.option(
        "--otlp-protocol",
        type=click.Choice(["http/protobuf", "grpc"]),
        default=None,
        help="OTLP protocol (default: grpc for port 4317, else http/protobuf).",
    )(f)


# --------------------------------------------------------------------------- the store


def _group_option(name: str) -> str | None:
    """The group's option ``name`` (``--db``, ``--durability``) as the running command's
    context chain holds it; None outside a command or when it was not given."""
    ctx = click.get_current_context(silent=True)
    while ctx is not None:
        if ctx.obj and ctx.obj.get(name):
            return str(ctx.obj[name])
        ctx = ctx.parent
    return None


def resolve_db(db: str | None) -> str:
    """The command's ``--db``, else the group's (which reads ``$FLOWSCOPE_DB``), else the default."""
    return db or _group_option("db") or os.environ.get(ENV_DB) or DEFAULT_DB


#: A libpq keyword/value conninfo (``host=db dbname=x``): a name no one gives a SQLite file.
_CONNINFO = re.compile(r"\s*(host|hostaddr|dbname|user|port|password|service|sslmode)\s*=", re.IGNORECASE)


def shown_db(db: str) -> str:
    """``db`` as messages and hints print it: a PostgreSQL URL's password masked."""
    from ..store.postgres.dsn import redact

    return redact(db)


def open_store(
    db: str | None, *, write: bool = False, create: bool = False, settle_s: float = 0.0
) -> SqliteEventStore | PostgresEventStore:
    """Open the store ``db`` names: a SQLite file, or a PostgreSQL database for a
    ``postgresql://`` URL. Read commands never create or modify anything. ``settle_s``:
    how long an empty file may take to become a database (a server started beside the
    worker that creates it: SQLite's file is empty until its header is written).

    Problems raise the typed store errors of :mod:`flowscope.errors`; the group's handler
    turns them into one line.
    """
    from ..store.postgres.dsn import is_postgres_url

    path = resolve_db(db)
    ctx = click.get_current_context(silent=True)
    if ctx is not None:
        ctx.meta[_OPENED_DB] = shown_db(path)
    durability = _group_option("durability")  # --durability, or $FLOWSCOPE_DURABILITY
    if "://" in path and not is_postgres_url(path):  # not a file name either: say so, not "no folder"
        raise CliError(
            f"--db {shown_db(path)}: flowscope opens a SQLite file or a postgresql:// (or postgres://) URL"
        )
    if _CONNINFO.match(path):  # a libpq "host=... dbname=..." string: never a file to create
        raise CliError(
            f"--db {shown_db(path)} is a libpq keyword/value string: flowscope takes PostgreSQL as a URL, "
            "postgresql://user@host:port/dbname (the password in $PGPASSWORD or ~/.pgpass)"
        )
    if is_postgres_url(path):
        if durability is not None:
            raise CliError(
                f"--durability (or ${ENV_DURABILITY}) sets how a SQLite file commits; {shown_db(path)} is "
                "PostgreSQL, whose commits follow its synchronous_commit setting (docs/scaling.md): drop it"
            )
        try:
            from ..store.postgres import PostgresEventStore
        except ImportError:
            raise StoreUnavailable(
                f"{shown_db(path)} is a PostgreSQL URL, and psycopg is not installed: pip install 'flowscope[postgres]'"
            ) from None
        # psycopg and its pool say each lost connection and failed reconnect in lines of
        # libpq's words; the command says the outage itself, once, redacted (a worker's
        # --log-level debug keeps theirs).
        driver_log = logging.getLogger("psycopg")
        if driver_log.getEffectiveLevel() >= logging.WARNING:  # (psycopg sets WARNING itself)
            driver_log.setLevel(logging.ERROR)
        return PostgresEventStore(path, readonly=not (write or create))
    from ..store.sqlite import SqliteEventStore

    p = Path(path)
    if not create and not p.exists():
        raise StoreUnavailable(f"no flowscope database at {shown_db(path)}")
    if p.is_dir():
        # not DB_HINT: running `flowscope demo` with this --db would fail the same way
        raise CliError(
            f"{shown_db(path)} is a directory: --db takes a file, e.g. --db {shlex.quote(shown_db(str(p / DEFAULT_DB)))}"
        )
    if not create and _empty_for_good(p, settle_s):
        raise NotAFlowscopeDatabase(f"{shown_db(path)} is an empty file, not a flowscope database")
    if not (write or create):  # a reader commits nothing: its durability does not matter
        return SqliteEventStore(path, readonly=True)
    return SqliteEventStore(path, durability=durability or "normal")


def _empty_for_good(p: Path, wait_s: float) -> bool:
    """Whether ``p`` is an empty file and stays so for ``wait_s``: a process creating the
    database writes its header within moments."""
    deadline = time.monotonic() + wait_s
    while p.exists() and p.stat().st_size == 0:
        if time.monotonic() >= deadline:
            return True
        time.sleep(0.05)
    return False


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def json_arg(text: str, option: str, key: str | None = None) -> Any:
    """The JSON an option was given (``--input``, ``--job``, ``key`` its ``ID=`` part), or a
    CliError saying how to quote it. Strict JSON: ``NaN`` and ``Infinity`` are refused here,
    as the store would refuse them, not recorded."""
    what = f"{option} {key}" if key is not None else option
    try:
        value = json.loads(text, parse_constant=_no_constant)
    except RecursionError:
        raise CliError(too_deep(what)) from None
    except ValueError as exc:
        example = f"{key}=" + json.dumps(text) if key is not None else json.dumps(text)
        raise CliError(
            f"{what}: {text!r} is not valid JSON ({exc}); quote a string as JSON: {option} {shlex.quote(example)}"
        ) from None
    bad = lone_surrogate(value)
    if bad is not None:  # "\ud800", or an undecodable byte: not text any store or terminal keeps
        raise CliError(f"{what}: {ascii(bad)[:60]} holds a lone surrogate, not Unicode text; give valid text")
    return value


def emit(rows: list[dict[str, Any]], fmt: str, keys: tuple[str, ...], table: Callable[[], str]) -> None:
    """Print ``rows`` as JSON or CSV (with ``keys``), or the ``table`` people read."""
    if fmt == "json":
        click.echo(render_json(rows, keys))
    elif fmt == "csv":
        click.echo(render_csv(rows, keys))
    else:
        click.echo(table())


def command_prefix(db: str) -> str:
    """``flowscope`` or ``flowscope --db PATH`` for the hints we print (a URL's password masked:
    keep it in PGPASSWORD or ~/.pgpass and the hint runs as printed)."""
    if db in (os.environ.get(ENV_DB) or DEFAULT_DB, shown_db(os.environ.get(ENV_DB) or DEFAULT_DB)):
        return "flowscope"
    return f"flowscope --db {shlex.quote(shown_db(db))}"


# --------------------------------------------------------------------------- the group


@click.group(
    cls=FlowscopeGroup,
    invoke_without_command=True,
    no_args_is_help=False,
    context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100},
)
@click.option(
    "--db",
    "db",
    envvar=ENV_DB,
    default=DEFAULT_DB,
    show_default=True,
    callback=not_empty,
    metavar="PATH|URL",
    help=f"The flowscope database: a SQLite file or a postgresql:// URL (also ${ENV_DB}).",
)
@click.option(
    "--utc",
    is_flag=True,
    envvar=ENV_UTC,
    help=f"Print every time in UTC instead of local time (also {ENV_UTC}=1); tables name the zone.",
)
@click.option(
    "--durability",
    type=click.Choice(["normal", "full"]),
    envvar=ENV_DURABILITY,
    default=None,
    help="How a SQLite file's commits last (also $FLOWSCOPE_DURABILITY): normal, the default, through a "
    "process crash (an OS crash or power loss may lose the last ones); full, synced to disk at every "
    "commit. PostgreSQL's follow its synchronous_commit.",
)
@click.version_option(package_name="flowscope", prog_name="flowscope")
@click.pass_context
def cli(ctx: click.Context, db: str, utc: bool, durability: str | None) -> None:
    """flowscope: run, inspect, audit, resume and export workflow runs.

    \b
    Start here:   flowscope demo
    Then:         flowscope runs | show SESSION | audit | stuck | resume SESSION | export SESSION
    Docs:         docs/cli.md, docs/concepts.md, docs/operations.md
    """
    ctx.ensure_object(dict)
    ctx.obj["db"] = db
    ctx.obj["durability"] = durability
    use_utc(utc)
    if ctx.invoked_subcommand is None:  # bare `flowscope`: the overview, and success
        click.echo(ctx.get_help())
        ctx.exit(0)


def _usage_line(exc: click.UsageError) -> str:
    """A usage error as the CLI's one line: what is wrong, and the help to read."""
    where = exc.ctx.command_path if exc.ctx is not None else "flowscope"
    return f"flowscope: error: {mask_url_credentials(' '.join(exc.format_message().split()))} (see `{where} --help`)"


def main(argv: list[str] | None = None) -> NoReturn:
    """The ``flowscope`` console script (importing ``flowscope.cli`` has added the commands)."""
    for stream in (sys.stdout, sys.stderr):  # text a log holds that no terminal can show: escaped
        reconfigure = getattr(stream, "reconfigure", None)
        if reconfigure is not None:
            reconfigure(errors="backslashreplace")
    try:
        code = cli.main(args=argv, prog_name="flowscope", standalone_mode=False)
    except click.UsageError as exc:  # click's own four lines (usage, try, blank, error) as one
        click.echo(_usage_line(exc), err=True)
        sys.exit(exc.exit_code)
    except click.ClickException as exc:
        exc.show()
        sys.exit(exc.exit_code)
    except click.exceptions.Abort:  # Ctrl-C or Ctrl-D at a prompt
        click.echo("flowscope: interrupted", err=True)
        sys.exit(130)
    except SystemExit:
        raise
    except Exception as exc:  # pragma: no cover - the group catches these already
        if os.environ.get("FLOWSCOPE_DEBUG"):
            raise
        to_cli_error(exc).show()
        sys.exit(EXIT_ERROR)
    sys.exit(code if isinstance(code, int) else 0)
