"""Event stores and the fold that rebuilds state from them."""

from typing import TYPE_CHECKING

from .base import EventStore, NodeRun, SessionInfo
from .memory import MemoryEventStore
from ..fold import NodeState, WorkflowState, rebuild

if TYPE_CHECKING:  # for type checkers; at run time __getattr__ below imports it on first use
    from .sqlite import SqliteEventStore

__all__ = [
    "EventStore",
    "NodeRun",
    "SessionInfo",
    "MemoryEventStore",
    "SqliteEventStore",
    "NodeState",
    "WorkflowState",
    "rebuild",
]


def __getattr__(name: str) -> type[EventStore]:  # the SQLite adapter imports sqlite-utils only when asked for
    if name == "SqliteEventStore":
        from .sqlite import SqliteEventStore

        return SqliteEventStore
    raise AttributeError(name)
