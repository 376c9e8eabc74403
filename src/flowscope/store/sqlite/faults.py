"""sqlite3 exceptions as typed :class:`~flowscope.errors.StoreError` subclasses.

The class is chosen from the SQLite result code (``sqlite_errorcode``, Python 3.11+),
never from the message text: a file under a folder named ``corrupt/`` or ``locked/``
must not change the advice. Extended codes (``SQLITE_BUSY_SNAPSHOT``, ...) are reduced to
their primary code. Every message is one line naming the file and saying what to do.
"""

from __future__ import annotations

import sqlite3

from ...errors import (
    NotAFlowscopeDatabase,
    StoreCorrupt,
    StoreDiskFull,
    StoreError,
    StoreLocked,
    StoreReadOnly,
    StoreUnavailable,
)

__all__ = ["store_error", "primary_code"]


def primary_code(exc: BaseException) -> int | None:
    """The primary SQLite result code of ``exc`` (``SQLITE_BUSY``, ...), None if SQLite gave none.

    An error raised by Python code (not by the SQLite library) carries no code.
    """
    code = getattr(exc, "sqlite_errorcode", None)  # absent on errors not raised by SQLite
    return code & 0xFF if isinstance(code, int) else None


def store_error(exc: BaseException, path: str, action: str, busy_timeout: float) -> StoreError:
    """The :class:`StoreError` that stands for ``exc``, raised while trying to ``action``.

    The caller chains it (``raise store_error(...) from exc``) so the original stays
    available as ``__cause__``.
    """
    code = primary_code(exc)
    if code in (sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED):
        return StoreLocked(
            f"{path} is locked by another process: could not {action} within {busy_timeout:g} s; "
            "retry, or raise busy_timeout"
        )
    if code == sqlite3.SQLITE_NOTADB:
        return NotAFlowscopeDatabase(f"{path} is not a SQLite database: point flowscope at its own database file")
    if code == sqlite3.SQLITE_CORRUPT:
        return StoreCorrupt(f"{path} is corrupt (could not {action}): restore it from a backup")
    if code == sqlite3.SQLITE_READONLY:
        return StoreReadOnly(f"{path} is read-only: cannot {action}; open it writable or with readonly=True")
    if code == sqlite3.SQLITE_FULL:
        return StoreDiskFull(f"{path}: the disk or the database size limit is full: cannot {action}; free space and retry")
    if code == sqlite3.SQLITE_CANTOPEN:
        return StoreUnavailable(f"cannot open flowscope database {path} (to {action}): check the path and its permissions")
    return StoreError(f"{path}: cannot {action}: {_one_line(exc)}")


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return text or type(exc).__name__
