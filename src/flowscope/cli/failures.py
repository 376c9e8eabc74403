"""How an exception becomes the CLI's one line on stderr and its exit code.

Errors are told apart by class, never by the words of their message: a typed store error
(:mod:`flowscope.errors`) gets its own message followed by what to do about it, from
:data:`STORE_ERRORS`; a plain :class:`~flowscope.errors.StoreError` prints its own message.
"""

from __future__ import annotations

import shlex
from typing import IO, Any

import click

from ..errors import (
    MAX_ERROR_MESSAGE,
    ConcurrencyConflict,
    FlowscopeError,
    NotAFlowscopeDatabase,
    ResumeError,
    StoreCorrupt,
    StoreDiskFull,
    StoreError,
    StoreLocked,
    StoreReadOnly,
    StoreSchemaTooNew,
    StoreSchemaTooOld,
    StoreUnavailable,
    UnknownSessionError,
    classify,
    mask_url_credentials,
)
from ..events import EventDecodeError
from ..store.postgres.dsn import is_postgres_url

__all__ = [
    "EXIT_ERROR",
    "EXIT_FAILED",
    "EXIT_STORE_OUTAGE",
    "DB_HINT",
    "CliError",
    "STORE_ERROR_ADVICE",
    "POSTGRES_ERROR_ADVICE",
    "ADVICE_GIVEN",
    "one_line",
    "failure_line",
    "unknown_session",
    "to_cli_error",
]

#: A problem the user can fix (a bad database, session or argument).
EXIT_ERROR = 2
#: The workflow itself failed (``flowscope resume``).
EXIT_FAILED = 1
#: ``flowscope worker`` stopped because its database refused writes for ``--max-store-outage``.
EXIT_STORE_OUTAGE = 3

DB_HINT = "point --db (or FLOWSCOPE_DB) at a flowscope database, or run `flowscope demo` to create one"


class CliError(click.ClickException):
    """A problem the user can fix: printed as one line on stderr, exit code 2."""

    exit_code = EXIT_ERROR

    def __init__(self, message: str) -> None:
        # a URL's password never reaches the terminal, whichever message names the URL
        super().__init__(_cap(mask_url_credentials(" ".join(str(message)[: 8 * MAX_ERROR_MESSAGE].split()))))

    def show(self, file: IO[Any] | None = None) -> None:
        click.echo(f"flowscope: error: {self.message}", err=True)


#: The one table: store error class -> what to do, printed after the error's own message
#: (which says what is wrong); ``{db}`` is the database the command opened. Every row exits
#: with EXIT_ERROR, like every CliError. Looked up along the exception's MRO, so a subclass
#: an adapter adds inherits its parent's row; a class with no row prints its message alone.
#: One piece of advice per error: a message that gives the advice already (it holds one
#: of :data:`ADVICE_GIVEN`'s phrases for its class, as the adapters' messages do) gets none
#: from here. A PostgreSQL database takes its rows from :data:`POSTGRES_ERROR_ADVICE` first.
STORE_ERROR_ADVICE: dict[type[StoreError], str] = {
    StoreLocked: "another process holds the database; retry in a moment, or stop the other writer",
    StoreCorrupt: "restore it from a backup (or try `sqlite3 {db} .recover`)",
    NotAFlowscopeDatabase: DB_HINT,
    StoreSchemaTooNew: "upgrade flowscope (pip install -U flowscope) to use this database",
    StoreSchemaTooOld: "run a command that writes to it once (flowscope worker, start or resume) to migrate it, "
    "after upgrading every worker that uses it (docs/scaling.md)",
    StoreReadOnly: "check the permissions of the file and its folder (SQLite writes -wal and -shm files beside it)",
    StoreDiskFull: "free disk space, then run the command again (flowscope resume continues a session)",
    StoreUnavailable: DB_HINT,
}

#: The rows that differ for a ``postgresql://`` database: no SQLite file to recover or to
#: create with ``flowscope demo``. Its adapter's messages say what to do about a server
#: that cannot be reached, refuses the credentials or has no such database.
POSTGRES_ERROR_ADVICE: dict[type[StoreError], str] = {
    StoreCorrupt: "restore it from a backup",
    NotAFlowscopeDatabase: "point --db (or FLOWSCOPE_DB) at a flowscope database",
    StoreReadOnly: "connect as a role that may write, to a server that takes writes",
    StoreUnavailable: "check that the server is running and that the URL's host, port, database and user are right",
}

#: Phrases by which a message gives the advice of its class's row itself.
ADVICE_GIVEN: dict[type[StoreError], tuple[str, ...]] = {
    StoreLocked: ("retry",),
    StoreCorrupt: ("from a backup",),
    NotAFlowscopeDatabase: ("point flowscope at", "point --db"),
    StoreSchemaTooNew: ("upgrade",),
    StoreReadOnly: ("make the file", "use a writable", "grant it"),
    StoreDiskFull: ("free space", "free disk space"),
    StoreUnavailable: ("PostgreSQL", "check the path", "pip install", "point --db", "create it first"),
}


def _cap(text: str) -> str:
    """At most ``MAX_ERROR_MESSAGE`` characters: the CLI never prints a 5 MB message."""
    return text if len(text) <= MAX_ERROR_MESSAGE else text[: MAX_ERROR_MESSAGE - 3] + "..."


def one_line(exc: BaseException) -> str:
    """``str(exc)`` with its whitespace (newlines included) folded and cut to 1,024
    characters, or the class name when it is empty or ``str()`` itself raises."""
    try:
        text = str(exc)
    except Exception:  # a hostile __str__: the class still names the problem
        text = ""
    return _cap(" ".join(text[: 8 * MAX_ERROR_MESSAGE].split())) or type(exc).__name__


def failure_line(exc: BaseException, recorded: str | None) -> str:
    """The one line for a workflow failure: the message as the runner recorded it
    (redacted, R13), else the exception classified the same way."""
    return _cap(" ".join((recorded or classify(exc).message).split()))


def unknown_session(session_id: str, where: str) -> UnknownSessionError:
    """The error for a session id with no events in the database at ``where``."""
    return UnknownSessionError(f"no session {session_id!r} in {where}: `flowscope runs` lists the sessions")


def _store_error(exc: StoreError, db: str | None) -> CliError:
    msg = one_line(exc)
    postgres = db is not None and is_postgres_url(db)
    for klass in type(exc).__mro__:
        advice = (POSTGRES_ERROR_ADVICE.get(klass) if postgres else None) or STORE_ERROR_ADVICE.get(klass)
        if advice is not None:
            if any(phrase in msg for phrase in ADVICE_GIVEN.get(klass, ())):
                return CliError(msg)  # the message says what to do already: once is enough
            return CliError(f"{msg}: {advice.format(db=shlex.quote(db) if db else 'FILE')}")
    if isinstance(exc, ConcurrencyConflict):  # the engine's wording names the API's flag
        return CliError(msg.replace("pass force=True", "pass --force"))
    return CliError(msg)


def to_cli_error(exc: BaseException, db: str | None = None) -> CliError:
    """Turn an exception from flowscope (or anything else) into one actionable line.

    ``db`` is the database the command opened, when known (the corruption advice names it).
    """
    if isinstance(exc, CliError):
        return exc
    if isinstance(exc, StoreError):  # UnknownSessionError and ConcurrencyConflict included
        return _store_error(exc, db)
    msg = one_line(exc)
    if isinstance(exc, ResumeError):
        return CliError(msg)
    if isinstance(exc, FlowscopeError):
        return CliError(f"{type(exc).__name__}: {msg}")
    if isinstance(exc, EventDecodeError):
        return CliError(f"the database holds an event this flowscope cannot read: {msg}")
    if isinstance(exc, UnicodeError):  # a bit-flipped or mistyped argument: not UTF-8 text
        return CliError(
            f"an argument is not valid UTF-8 text ({type(exc).__name__}); check it for a typo or a corrupted byte"
        )
    if isinstance(exc, OSError):
        where = f" ({exc.filename})" if getattr(exc, "filename", None) else ""
        return CliError(f"{exc.strerror or msg}{where}")
    return CliError(
        f"unexpected {type(exc).__name__}: {msg} (this is a bug in flowscope or in the workflow; "
        "FLOWSCOPE_DEBUG=1 shows the traceback)"
    )
