"""What the LangGraph bridge's test modules share: a store on a fresh SQLite file (the
``store`` fixture, :func:`lg_store`) and the config of a run through a handler."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from langgraph.graph import START, StateGraph
from langgraph.types import RetryPolicy

from flowscope.adapters.langgraph import FlowscopeCallbackHandler
from flowscope.store import SqliteEventStore

__all__ = ["config", "flaky_beside_broken", "lg_store"]


@pytest.fixture(name="store")
def lg_store(tmp_path: Path) -> Iterator[SqliteEventStore]:
    """The ``store`` fixture of a module that imports this function."""
    s = SqliteEventStore(str(tmp_path / "lg.db"))
    yield s
    s.close()


def config(handler: FlowscopeCallbackHandler, thread: str) -> dict[str, Any]:
    return {"configurable": {"thread_id": thread}, "callbacks": [handler]}


def flaky_beside_broken(
    state: Any, flaky: Any, broken: Any, max_attempts: int, initial_interval: float
) -> StateGraph:
    """A graph (not compiled) that runs ``flaky``, retried on ``ConnectionError``, and
    ``broken``, never retried, side by side from ``START``."""
    g = StateGraph(state)
    retry = RetryPolicy(
        max_attempts=max_attempts, initial_interval=initial_interval, jitter=False, retry_on=ConnectionError
    )
    g.add_node("flaky", flaky, retry_policy=retry)
    g.add_node("broken", broken)
    g.add_edge(START, "flaky")
    g.add_edge(START, "broken")
    return g
