"""Event stores and the fold that rebuilds state from them."""

from typing import TYPE_CHECKING

from ..fold import NodeState, WorkflowState, rebuild
from .base import EventStore, NodeRun, SessionInfo, SessionQuery
from .memory import MemoryEventStore

if TYPE_CHECKING:  # for type checkers; at run time __getattr__ below imports it on first use
    from .postgres import PostgresEventStore
    from .sqlite import SqliteEventStore

__all__ = [
    "EventStore",
    "NodeRun",
    "SessionInfo",
    "SessionQuery",
    "MemoryEventStore",
    "SqliteEventStore",
    "PostgresEventStore",
    "NodeState",
    "WorkflowState",
    "rebuild",
]


def __getattr__(name: str) -> type[EventStore]:  # adapters import their drivers only when asked for
    if name == "SqliteEventStore":
        from .sqlite import SqliteEventStore

        return SqliteEventStore
    if name == "PostgresEventStore":  # psycopg: the `postgres` extra
        from .postgres import PostgresEventStore

        return PostgresEventStore
    raise AttributeError(name)
