"""The PostgreSQL :class:`~flowscope.store.base.EventStore`: one database for a fleet of
workers on many hosts (``pip install 'flowscope[postgres]'``: psycopg 3 and psycopg_pool).

:mod:`.schema`
    the tables, their migrations (applied once under an advisory lock), checking a database;
:mod:`.queries`
    the SQL statements;
:mod:`.faults`
    psycopg exceptions as typed :class:`~flowscope.errors.StoreError` subclasses, by SQLSTATE;
:mod:`.dsn`
    telling a URL from a path, and naming a server without its password (no psycopg);
:mod:`.conninfo`
    the options of the store's connections;
:mod:`.writer`
    an append's reads and writes (:mod:`flowscope.store.appending` decides them), and the
    one-statement append on the state this store wrote last;
:mod:`.ownership`
    acquiring, renewing and claiming (:mod:`flowscope.store.takeover` decides who);
:mod:`.wakeup`
    the ``LISTEN`` thread that wakes idle workers;
:mod:`.deadline`
    the watchdog that cuts off a call the server does not answer (``call_timeout``);
:mod:`.store`
    :class:`PostgresEventStore`: appends, fences, claims, reads, snapshots, waking workers.

Only :mod:`.dsn` is imported eagerly: the CLI asks it about a ``--db`` value on machines
without psycopg; the rest loads on first use.
"""

from typing import TYPE_CHECKING, Any

from .dsn import is_postgres_url, redact, server

if TYPE_CHECKING:
    from .schema import APPLICATION, DB_SCHEMA_VERSION, MIGRATIONS
    from .store import PostgresEventStore

__all__ = [
    "PostgresEventStore",
    "DB_SCHEMA_VERSION",
    "MIGRATIONS",
    "APPLICATION",
    "is_postgres_url",
    "redact",
    "server",
]


def __getattr__(name: str) -> Any:  # psycopg is imported only when the store is asked for
    if name == "PostgresEventStore":
        from .store import PostgresEventStore

        return PostgresEventStore
    if name in ("DB_SCHEMA_VERSION", "MIGRATIONS", "APPLICATION"):
        from . import schema

        return getattr(schema, name)
    raise AttributeError(name)
