"""What the LangGraph bridge's test modules share: a store on a fresh SQLite file (the
``store`` fixture, :func:`lg_store`) and the config of a run through a handler."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from flowscope.adapters.langgraph import FlowscopeCallbackHandler
from flowscope.store import SqliteEventStore

__all__ = ["config", "lg_store"]


@pytest.fixture(name="store")
def lg_store(tmp_path: Path) -> Iterator[SqliteEventStore]:
    """The ``store`` fixture of a module that imports this function."""
    s = SqliteEventStore(str(tmp_path / "lg.db"))
    yield s
    s.close()


def config(handler: FlowscopeCallbackHandler, thread: str) -> dict[str, Any]:
    return {"configurable": {"thread_id": thread}, "callbacks": [handler]}
