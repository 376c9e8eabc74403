"""The SQLite :class:`~flowscope.store.base.EventStore`: the default, durable store.

One file holds the log, the projections and the snapshots. The package, by concern:

:mod:`.schema`
    the tables, their migrations, ``DB_SCHEMA_VERSION``, opening and checking a file;
:mod:`.queries`
    the SQL statements and the rows they bind;
:mod:`.faults`
    sqlite3 exceptions as typed :class:`~flowscope.errors.StoreError` subclasses;
:mod:`.files`
    which file is open, and whether its ``-wal`` is still the one beside it;
:mod:`.writer`
    an append's reads and writes (:mod:`flowscope.store.appending` decides them), and a
    group commit's rows written with one statement per table;
:mod:`.ownership`
    acquiring, renewing and claiming (:mod:`flowscope.store.takeover` decides who);
:mod:`.maintenance`
    reading a stretch of a log, rebuilding the projections, pruning;
:mod:`.store`
    :class:`SqliteEventStore`: appends, reads, the projection cache, snapshots.

The row format is :mod:`flowscope.store.codec` (:mod:`.codec` is its former name).
"""

from ..codec import EventNotSerializableError
from .schema import APPLICATION, DB_SCHEMA_VERSION, MIGRATIONS
from .store import SqliteEventStore

__all__ = [
    "SqliteEventStore",
    "EventNotSerializableError",
    "DB_SCHEMA_VERSION",
    "MIGRATIONS",
    "APPLICATION",
]
