"""A LangGraph graph recorded by flowscope: retries, an interrupt and its resume, audited.

pip install 'flowscope[langgraph]'
python examples/langgraph_example.py          # writes langgraph-example.db
flowscope audit --db langgraph-example.db
flowscope show release-1 --db langgraph-example.db
"""

from __future__ import annotations

from typing import Any, TypedDict

from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import END, START, StateGraph
from langgraph.types import Command, RetryPolicy, interrupt

from flowscope.adapters.langgraph import FlowscopeCallbackHandler
from flowscope.observability import MetricsPlugin, TracingPlugin
from flowscope.store import SqliteEventStore


class State(TypedDict, total=False):
    rows: int
    approved: Any


calls = {"fetch": 0}


def fetch(state: State) -> State:
    calls["fetch"] += 1
    if calls["fetch"] < 3:
        raise ConnectionError("upstream busy")
    return {"rows": 42}


def approve(state: State) -> State:
    return {"approved": interrupt({"prompt": f"publish {state['rows']} rows?"})}


def main() -> None:
    g = StateGraph(State)
    g.add_node(
        "fetch",
        fetch,
        retry_policy=RetryPolicy(max_attempts=3, initial_interval=0.01, retry_on=ConnectionError),
    )
    g.add_node("approve", approve)
    g.add_edge(START, "fetch")
    g.add_edge("fetch", "approve")
    g.add_edge("approve", END)
    graph = g.compile(checkpointer=InMemorySaver(), name="release")

    store = SqliteEventStore("langgraph-example.db")
    handler = FlowscopeCallbackHandler(store, plugins=[TracingPlugin(), MetricsPlugin()])
    config = {"configurable": {"thread_id": "release-1"}, "callbacks": [handler]}
    first = graph.invoke({"rows": 0}, config)
    print("paused:", first["__interrupt__"][0].value)
    print("output:", graph.invoke(Command(resume=True), config))
    handler.close()
    store.close()


if __name__ == "__main__":
    main()
