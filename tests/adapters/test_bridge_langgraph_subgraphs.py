"""The LangGraph bridge's telemetry for a subgraph, which LangGraph runs as a node (its run is
``kind=function``): its node running inside is the one node running, as the store's open
runs say, and its failure is named in full on every enclosing run."""

from __future__ import annotations

import asyncio
from typing import Any, TypedDict

import pytest
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import START, StateGraph
from langgraph.types import RetryPolicy, interrupt
from langgraph_testing import lg_store  # noqa: F401 (the store fixture)
from prometheus_client import CollectorRegistry

from flowscope.adapters.langgraph import FlowscopeCallbackHandler
from flowscope.events import NodeCancelled, NodeCompleted, NodeErrorEvent, NodeErrorPropagated
from flowscope.fold import rebuild
from flowscope.observability import MetricsPlugin

# imports take seconds (langgraph): the whole module is in the slow set
pytestmark = pytest.mark.slow


class State(TypedDict, total=False):
    n: int


class CardDeclined(Exception):
    pass


def running(metrics: MetricsPlugin) -> dict[str, float]:
    assert metrics.registry is not None
    return {
        s.labels["node"]: s.value
        for family in metrics.registry.collect()
        for s in family.samples
        if s.name == "flowscope_nodes_running" and s.value
    }


def with_subgraph(body: Any) -> Any:
    inner = StateGraph(State)
    inner.add_node("deep", body)
    inner.add_edge(START, "deep")
    outer = StateGraph(State)
    outer.add_node("sub", inner.compile())
    outer.add_edge(START, "sub")
    return outer.compile(name="outer")


def test_a_node_inside_a_subgraph_is_the_one_node_running(store):
    metrics = MetricsPlugin(registry=CollectorRegistry())
    seen: list[dict[str, float]] = []

    def deep(s: State) -> State:
        seen.append(running(metrics))
        return {"n": 1}

    handler = FlowscopeCallbackHandler(store, plugins=[metrics])
    with_subgraph(deep).invoke({"n": 0}, {"configurable": {"thread_id": "t"}, "callbacks": [handler]})
    assert seen == [{"deep": 1.0}]  # not the subgraph's node beside it
    assert [r.path for r in store.open_runs()] == [] and running(metrics) == {}


def test_a_failure_inside_a_subgraph_is_named_in_full_on_every_enclosing_run(store):
    def deep(s: State) -> State:
        raise CardDeclined("card ending 0002 declined")

    handler = FlowscopeCallbackHandler(store)
    with pytest.raises(CardDeclined):
        with_subgraph(deep).invoke({"n": 0}, {"configurable": {"thread_id": "t"}, "callbacks": [handler]})
    log = store.read("t")
    qualname = f"{__name__}.CardDeclined"
    [error] = [e for e in log if isinstance(e, NodeErrorEvent)]
    assert (error.path, error.error_qualname) == ("outer@1/sub@1/deep@1", qualname)
    propagated = [(e.path, e.error_type, e.error_qualname) for e in log if isinstance(e, NodeErrorPropagated)]
    assert propagated == [
        ("outer@1/sub@1", "CardDeclined", qualname),
        ("outer@1", "CardDeclined", qualname),
    ]


def test_new_input_supersedes_a_waiting_subgraphs_runs_deepest_first(store):
    inner = StateGraph(State)
    inner.add_node("ask", lambda s: {"n": interrupt("approve?")})
    inner.add_edge(START, "ask")
    outer = StateGraph(State)
    outer.add_node("sub", inner.compile())
    outer.add_edge(START, "sub")
    graph = outer.compile(name="outer", checkpointer=InMemorySaver())
    handler = FlowscopeCallbackHandler(store)
    graph.invoke({"n": 1}, {"configurable": {"thread_id": "t"}, "callbacks": [handler]})
    graph.invoke({"n": 2}, {"configurable": {"thread_id": "t"}, "callbacks": [handler]})  # LangGraph drops it
    dropped = [(e.path, e.reason) for e in store.read("t") if isinstance(e, NodeCancelled)]
    assert dropped == [("outer@1/sub@1/ask@1", "superseded"), ("outer@1/sub@1", "superseded")]


def side_by_side(boom: Any, slow: Any) -> Any:
    """A subgraph running ``boom`` and ``slow`` at once from its start (LangGraph cancels
    ``slow`` when ``boom`` fails)."""
    inner = StateGraph(State)
    inner.add_node("boom", boom)
    inner.add_node("slow", slow)
    inner.add_edge(START, "boom")
    inner.add_edge(START, "slow")
    return inner.compile()


async def test_a_task_cancelled_in_a_retried_subgraph_nodes_attempt_ends_cancelled_not_failed(store):
    calls = {"boom": 0}
    finished: list[str] = []

    async def boom(s: State) -> State:
        calls["boom"] += 1
        if calls["boom"] == 1:
            await asyncio.sleep(0.05)
            raise ConnectionError("upstream down")
        return {"n": 1}

    async def slow(s: State) -> State:
        if calls["boom"] == 1:
            await asyncio.sleep(5)  # LangGraph cancels it when boom fails
            finished.append("slow")
        return {}

    outer = StateGraph(State)
    retry = RetryPolicy(max_attempts=2, initial_interval=0.01, jitter=False, retry_on=ConnectionError)
    outer.add_node("sub", side_by_side(boom, slow), retry_policy=retry)
    outer.add_edge(START, "sub")
    graph = outer.compile(name="outer")
    handler = FlowscopeCallbackHandler(store)
    await graph.ainvoke({"n": 0}, {"configurable": {"thread_id": "t"}, "callbacks": [handler]})
    assert finished == []
    log = store.read("t")
    assert [(e.path, e.error_type) for e in log if isinstance(e, NodeErrorEvent)] == [
        ("outer@1/sub@1/boom@1", "ConnectionError")
    ]
    assert [(e.path, e.reason) for e in log if isinstance(e, NodeCancelled)] == [
        ("outer@1/sub@1/slow@1", "cancelled")
    ]
    state = rebuild(log)
    assert state.status == "completed" and state.nodes["outer@1/sub@1"].attempt == 2


async def test_a_subgraph_whose_failure_a_node_caught_ends_its_tasks_before_the_node_completes(store):
    finished: list[str] = []

    async def boom(s: State) -> State:
        await asyncio.sleep(0.05)
        raise ConnectionError("upstream down")

    async def slow(s: State) -> State:
        await asyncio.sleep(5)  # LangGraph cancels it when boom fails
        finished.append("slow")
        return {}

    sub = side_by_side(boom, slow)

    async def call(s: State) -> State:
        try:
            await sub.ainvoke(s)
        except ConnectionError:
            return {"n": -1}
        return {}

    outer = StateGraph(State)
    outer.add_node("call", call)
    outer.add_edge(START, "call")
    graph = outer.compile(name="outer")
    config: Any = {"configurable": {"thread_id": "t"}, "callbacks": [FlowscopeCallbackHandler(store)]}
    assert await graph.ainvoke({"n": 0}, config) == {"n": -1}
    assert finished == []  # slow never returned
    ends = [
        (type(e).__name__, e.path)
        for e in store.read("t")
        if isinstance(e, (NodeCompleted, NodeErrorEvent, NodeCancelled))
        and e.path.startswith("outer@1/call@1")
    ]
    # the subgraph's tasks end before the node that ran it, as the engine records a node's children
    assert sorted(ends[:2]) == [
        ("NodeCancelled", "outer@1/call@1/slow@1"),
        ("NodeErrorEvent", "outer@1/call@1/boom@1"),
    ]
    assert ends[2:] == [("NodeCompleted", "outer@1/call@1")]
    ws = rebuild(store.read("t"))
    assert ws.status == "completed" and ws.nodes["outer@1/call@1/slow@1"].status == "cancelled"
