"""The SQLite store's connection for one operation or one transaction (:class:`Use`)."""

from __future__ import annotations

import sqlite3
import threading
from typing import Any, Protocol

from ...errors import StoreError
from . import schema
from .files import WalWatch

__all__ = ["Use", "Owning"]


class Owning(Protocol):
    """What :class:`Use` needs of the store (``SqliteEventStore``)."""

    _lock: threading.RLock
    _conn: sqlite3.Connection | None
    _wal: WalWatch

    def _closed(self) -> StoreError: ...

    def _error(self, exc: sqlite3.Error, action: str) -> StoreError: ...


class Use:
    """The store's connection for one operation (``_op``) or one ``BEGIN IMMEDIATE``
    transaction (``_write``): a plain context manager, a call less and no generator per
    use than ``contextlib.contextmanager`` (every store call goes through one)."""

    __slots__ = ("store", "action", "write", "conn")

    def __init__(self, store: Owning, action: str, write: bool) -> None:
        self.store = store
        self.action = action
        self.write = write
        self.conn: sqlite3.Connection | None = None

    def __enter__(self) -> sqlite3.Connection:
        store = self.store
        store._lock.acquire()
        try:
            conn = store._conn
            if conn is None:
                raise store._closed()
            if self.write:
                conn.execute("BEGIN IMMEDIATE")
                self.conn = conn
        except sqlite3.Error as exc:
            store._lock.release()
            raise store._error(exc, self.action) from exc
        except BaseException:
            store._lock.release()
            raise
        return conn

    def __exit__(self, typ: type[BaseException] | None, exc: BaseException | None, tb: Any) -> None:
        store = self.store
        try:
            conn = self.conn
            if conn is not None:  # a transaction of ours is open
                if exc is None:
                    try:
                        store._wal.check()
                        conn.execute("COMMIT")
                    except BaseException as error:
                        schema.rollback(conn)
                        if isinstance(error, sqlite3.Error):
                            raise store._error(error, self.action) from error
                        raise
                    return
                schema.rollback(conn)
            if isinstance(exc, sqlite3.Error):
                raise store._error(exc, self.action) from exc
        finally:
            store._lock.release()
