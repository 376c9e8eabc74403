"""psycopg exceptions as typed :class:`~flowscope.errors.StoreError` subclasses.

The class is chosen from the SQLSTATE the server sent (``exc.sqlstate``: its two-letter
class, or the exact code), never from the message text. A failed connection attempt
carries no SQLSTATE (libpq gives none), so :func:`connect_error` tells an unreachable
server from one that refused the login by trying the TCP port itself. Every message is
one line naming ``host:port/dbname`` and never a password.
"""

from __future__ import annotations

import socket

import psycopg
from psycopg_pool import PoolTimeout

from ...errors import StoreCorrupt, StoreDiskFull, StoreError, StoreLocked, StoreReadOnly, StoreUnavailable
from .dsn import redact

__all__ = ["store_error", "connect_error", "is_connection_lost", "one_line", "not_answered", "closed_store"]

#: Serialization failures, deadlocks, lock timeouts: retry.
_LOCKED = {"40001", "40P01", "55P03"}
#: The server is shutting down, restarting or not yet accepting connections.
_GOING_AWAY = {"57P01", "57P02", "57P03", "57P05"}


def one_line(exc: BaseException) -> str:
    text = redact(" ".join(str(exc).split()))
    return text or type(exc).__name__


def is_connection_lost(exc: BaseException) -> bool:
    """Whether ``exc`` means the connection is gone (the server restarted, the network
    dropped): an operation that changes nothing may be retried on another connection. A
    pool that gave no connection within its timeout is not: it waited the timeout already
    (``PoolTimeout`` is an ``OperationalError`` without a SQLSTATE)."""
    if not isinstance(exc, psycopg.OperationalError) or isinstance(exc, PoolTimeout):
        return False
    state = exc.sqlstate
    return state is None or state[:2] == "08" or state in _GOING_AWAY


def closed_store(where: str) -> StoreUnavailable:
    return StoreUnavailable(f"PostgreSQL at {where}: the store is closed; open a new PostgresEventStore")


def not_answered(where: str, seconds: float | None, action: str) -> StoreUnavailable:
    """The error for a call the store's deadline cut off (:mod:`.deadline`)."""
    return StoreUnavailable(
        f"PostgreSQL at {where} did not answer within {seconds:g} s (call_timeout) while trying to "
        f"{action}: the server is frozen or unreachable, or a lock was held that long; the connection "
        "was closed; retry (a run resumes where its log ends)"
    )


def store_error(exc: BaseException, where: str, action: str) -> StoreError:
    """The :class:`StoreError` for ``exc``, raised while trying to ``action`` on ``where``
    (``host:port/dbname``). The caller chains it (``raise ... from exc``)."""
    if isinstance(exc, StoreError):
        return exc
    if isinstance(exc, PoolTimeout):
        return StoreUnavailable(
            f"PostgreSQL at {where}: no connection to {action} within the pool timeout: "
            "the server is down or unreachable, or every pooled connection is busy (raise max_size)"
        )
    state = getattr(exc, "sqlstate", None)
    klass = state[:2] if isinstance(state, str) else None
    if state in _LOCKED:
        return StoreLocked(
            f"PostgreSQL at {where}: could not {action}: a lock or serialization conflict ({state}); retry"
        )
    if state == "57014":  # statement_timeout (or pg_cancel_backend): a slow moment, not a fault of the data
        return StoreLocked(
            f"PostgreSQL at {where}: could not {action}: the statement was cancelled, past statement_timeout "
            f"or by an operator ({state}); retry"
        )
    if is_connection_lost(exc):
        return StoreUnavailable(
            f"lost the connection to PostgreSQL at {where} while trying to {action}: "
            "the server restarted or the network dropped; retry (a run resumes where its log ends)"
        )
    if state == "25006":
        return StoreReadOnly(
            f"PostgreSQL at {where} refuses writes ({state}): cannot {action}; use a writable server"
        )
    if state == "42501":
        return StoreReadOnly(
            f"PostgreSQL at {where}: this role may not {action} ({state}): grant it the privileges"
        )
    if state == "53100":
        return StoreDiskFull(
            f"PostgreSQL at {where}: the server's disk is full: cannot {action}; free space and retry"
        )
    if klass == "53":
        return StoreUnavailable(
            f"PostgreSQL at {where} is out of resources ({state}): cannot {action}; retry, or lower the pool sizes"
        )
    if klass == "XX":
        return StoreCorrupt(
            f"PostgreSQL at {where} reports corrupt data ({state}) while trying to {action}: restore from a backup"
        )
    if klass == "28":
        return StoreUnavailable(
            f"PostgreSQL at {where} refused the credentials ({state}): check the user and password"
        )
    if state == "3D000":
        return StoreUnavailable(f"PostgreSQL at {where}: no such database: create it first (createdb)")
    return StoreError(f"PostgreSQL at {where}: cannot {action}: {one_line(exc)}")


def _reachable(host: str, port: int, timeout: float) -> bool:
    if host.startswith("/"):  # a unix socket directory
        path = f"{host}/.s.PGSQL.{port}"
        with socket.socket(socket.AF_UNIX) as s:
            s.settimeout(timeout)
            try:
                s.connect(path)
                return True
            except OSError:
                return False
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def connect_error(
    exc: BaseException, where: str, host: str, port: int, user: str, timeout: float
) -> StoreError:
    """The error for a connection attempt that failed (``psycopg.connect`` raised ``exc``)."""
    if isinstance(exc, psycopg.OperationalError) and exc.sqlstate is None:
        if not _reachable(host, port, timeout):
            return StoreUnavailable(
                f"cannot reach PostgreSQL at {where}: nothing answers on {host}:{port}; "
                "is the server running, and are the host and port right?"
            )
        if isinstance(exc, psycopg.errors.ConnectionTimeout):  # the port took it; the server said nothing
            return StoreUnavailable(
                f"PostgreSQL at {where} took the connection on {host}:{port} but did not answer it within "
                "connect_timeout: the server is frozen, overloaded or still starting; check that it answers "
                f"(pg_isready -h {host} -p {port})"
            )
        who = f" for user {user!r}" if user else ""
        # libpq gives no SQLSTATE here: the server's own words say which (credentials, no
        # free connection slot, a server starting or stopping); the advice names them all
        return StoreUnavailable(
            f"PostgreSQL at {where} refused the connection{who}: {_reason(exc)}; "
            "check the user, the password (PGPASSWORD or ~/.pgpass) and the database name, "
            "or whether the server has a free connection slot (max_connections) and is up"
        )
    return store_error(exc, where, "connect")


def _reason(exc: BaseException) -> str:
    """The server's own words (libpq's last line), for the operator; never parsed."""
    text = one_line(exc)
    _, sep, tail = text.rpartition("FATAL:")
    return tail.strip() if sep else text
