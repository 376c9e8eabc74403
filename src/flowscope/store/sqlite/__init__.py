"""The SQLite :class:`~flowscope.store.base.EventStore`: the default, durable store.

One file holds the log, the projections and the snapshots. The package, by concern:

:mod:`.schema`
    the tables, their migrations, ``DB_SCHEMA_VERSION``, opening and checking a file;
:mod:`.codec`
    events to rows (hot columns plus a JSON payload) and back, fast;
:mod:`.queries`
    the SQL statements and the rows they bind;
:mod:`.faults`
    sqlite3 exceptions as typed :class:`~flowscope.errors.StoreError` subclasses;
:mod:`.store`
    :class:`SqliteEventStore`: appends, reads, the projection cache, snapshots.
"""

from .codec import EventNotSerializableError
from .schema import APPLICATION, DB_SCHEMA_VERSION, MIGRATIONS
from .store import SqliteEventStore

__all__ = [
    "SqliteEventStore",
    "EventNotSerializableError",
    "DB_SCHEMA_VERSION",
    "MIGRATIONS",
    "APPLICATION",
]
