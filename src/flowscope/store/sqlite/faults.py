"""sqlite3 exceptions as typed :class:`~flowscope.errors.StoreError` subclasses.

The class is chosen from the SQLite result code (``sqlite_errorcode``, Python 3.11+),
never from the message text: a file under a folder named ``corrupt/`` or ``locked/``
must not change the advice. Extended codes (``SQLITE_BUSY_SNAPSHOT``, ...) are reduced to
their primary code. Every message is one line naming the file and saying what to do.
"""

from __future__ import annotations

import os
import sqlite3

from ...errors import (
    NotAFlowscopeDatabase,
    StoreCorrupt,
    StoreDiskFull,
    StoreError,
    StoreLocked,
    StoreNotWritable,
    StoreReadOnly,
    StoreUnavailable,
    StoreWalRemoved,
)

__all__ = ["store_error", "primary_code", "wal_removed", "wal_looks_removed", "mounted_read_only"]


def wal_removed(path: str) -> StoreWalRemoved:
    """This process's connection writes to a ``-wal`` file that is no longer the one at
    ``path-wal`` (deleted or replaced under it)."""
    return StoreWalRemoved(
        f"{path}-wal was deleted or replaced while this process had the database open: the commits since "
        "the last checkpoint are only in the removed file and are lost when this process exits; stop every "
        f"process using {path}, keep a copy of it, and restore it from a backup if those commits matter; "
        "never delete a database's -wal or -shm file while it is in use"
    )


def wal_looks_removed(path: str) -> bool:
    """At open: a ``-shm`` file (another process has the database open) beside a ``-wal``
    file that is missing or empty, the trace a deleted ``-wal`` leaves."""
    try:
        os.stat(path + "-shm")
    except OSError:
        return False
    try:
        return os.stat(path + "-wal").st_size == 0
    except FileNotFoundError:
        return True
    except OSError:
        return False


def mounted_read_only(path: str) -> bool:
    """Whether the filesystem that holds ``path``'s folder is mounted read-only now."""
    try:
        return bool(os.statvfs(os.path.dirname(os.path.abspath(path))).f_flag & os.ST_RDONLY)
    except OSError:
        return False


def _wal_removed_elsewhere(path: str, action: str) -> StoreWalRemoved:
    return StoreWalRemoved(
        f"{path}: disk I/O error (could not {action}), and its -wal file is missing or empty beside its -shm file: it "
        "was most likely deleted while another process had the database open, which still writes commits "
        f"nobody else can see; stop every process using {path}, then open it again (the commits only the "
        "deleted -wal held are lost); never delete a database's -wal or -shm file while it is in use"
    )


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
        return NotAFlowscopeDatabase(
            f"{path} is not a SQLite database: point flowscope at its own database file"
        )
    if code == sqlite3.SQLITE_CORRUPT:
        return StoreCorrupt(f"{path} is corrupt (could not {action}): restore it from a backup")
    if code == sqlite3.SQLITE_READONLY:
        return StoreReadOnly(
            f"{path} is read-only: cannot {action}; make the file and its folder writable "
            "(SQLite writes -wal and -shm files beside it)"
        )
    if code == sqlite3.SQLITE_FULL:
        return StoreDiskFull(
            f"{path}: the disk or the database size limit is full: cannot {action}; free space and retry"
        )
    if code == sqlite3.SQLITE_IOERR:
        if wal_looks_removed(path):
            return _wal_removed_elsewhere(path, action)
        # A connection opened before its filesystem went read-only (ext4's errors=remount-ro
        # after a disk error) gets an I/O error, not SQLITE_READONLY as a new one would.
        if mounted_read_only(path):
            return StoreReadOnly(
                f"{path}: disk I/O error (could not {action}): its filesystem is mounted read-only now "
                "(after a disk error?); check the disk (dmesg), then remount it writable"
            )
        # A failing disk refuses writes as surely: a worker backs off and stops when it lasts.
        return StoreNotWritable(
            f"{path}: disk I/O error (could not {action}): check the disk and its filesystem"
        )
    if code == sqlite3.SQLITE_CANTOPEN:
        return StoreUnavailable(
            f"cannot open flowscope database {path} (to {action}): check the path and its permissions"
        )
    return StoreError(f"{path}: cannot {action}: {_one_line(exc)}")


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return text or type(exc).__name__
