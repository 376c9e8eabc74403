"""The LangGraph bridge's telemetry for a subgraph, which LangGraph runs as a node (its run is
``kind=function``): its node running inside is the one node running, as the store's open
runs say, and its failure is named in full on every enclosing run."""

from __future__ import annotations

from typing import Any, TypedDict

import pytest
from langgraph.graph import START, StateGraph
from langgraph_testing import lg_store  # noqa: F401 (the store fixture)
from prometheus_client import CollectorRegistry

from flowscope.adapters.langgraph import FlowscopeCallbackHandler
from flowscope.events import NodeErrorEvent, NodeErrorPropagated
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
