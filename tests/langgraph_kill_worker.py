"""Runs a LangGraph graph whose second node sleeps, recorded by the bridge into a SQLite store;
the test kills this process with SIGKILL while that node runs.

Usage: python langgraph_kill_worker.py DB THREAD_ID
"""

from __future__ import annotations

import sys
import time
from typing import TypedDict

from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import END, START, StateGraph

from flowscope.adapters.langgraph import FlowscopeCallbackHandler
from flowscope.store import SqliteEventStore


class State(TypedDict):
    rows: int


def load(state: State) -> State:
    return {"rows": 10}


def enrich(state: State) -> State:
    time.sleep(60)  # killed here
    return {"rows": state["rows"] * 2}


def main() -> None:
    db, thread = sys.argv[1], sys.argv[2]
    g = StateGraph(State)
    g.add_node("load", load)
    g.add_node("enrich", enrich)
    g.add_edge(START, "load")
    g.add_edge("load", "enrich")
    g.add_edge("enrich", END)
    graph = g.compile(checkpointer=InMemorySaver(), name="etl")
    handler = FlowscopeCallbackHandler(SqliteEventStore(db), heartbeat_interval=0.2)
    graph.invoke({"rows": 0}, {"configurable": {"thread_id": thread}, "callbacks": [handler]})


if __name__ == "__main__":
    main()
