"""The LangGraph bridge's retries are LangGraph's own: a failed attempt was retried (or, when
the run ended first, cancelled in its backoff) only if its task's ``RetryPolicy`` retries it;
any other failed attempt is a failure of its own, however many fail at once and whatever
exception the graph raises in the end."""

from __future__ import annotations

import asyncio
import operator
from typing import Annotated, Any, TypedDict

import pytest
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import END, START, StateGraph
from langgraph.types import RetryPolicy, Send
from langgraph_testing import config, flaky_beside_broken, lg_store  # noqa: F401 (lg_store: the store fixture)

from flowscope.adapters.langgraph import FlowscopeCallbackHandler
from flowscope.events import NodeCancelled, NodeErrorEvent, NodeErrorPropagated, NodeRetrying
from flowscope.fold import rebuild

# imports take seconds (langgraph): the whole module is in the slow set
pytestmark = pytest.mark.slow


class State(TypedDict, total=False):
    items: list[int]
    out: Annotated[list[Any], operator.add]


class StepFailed(Exception):
    pass


def ends(log: list) -> list[tuple[str, str, str]]:
    """How each run's attempts ended: (event, path, error type), in the log's order."""
    kinds = (NodeRetrying, NodeErrorEvent, NodeErrorPropagated, NodeCancelled)
    return [(type(e).__name__, e.path, getattr(e, "error_type", "")) for e in log if isinstance(e, kinds)]


async def all_arrived(arrived: set[Any], expected: int) -> None:
    """Wait until ``expected`` tasks arrived: they then raise in one turn of the loop,
    before LangGraph hears of the first failure and cancels the rest."""
    while len(arrived) < expected:
        await asyncio.sleep(0)


def test_parallel_tasks_that_fail_for_good_in_one_step_each_record_their_failure_and_none_a_retry(store):
    # a Send fan-out, no RetryPolicy: every branch is refused at once. LangGraph raises one of
    # the failures (whichever it pops); none was retried, each is its branch's final failure
    sizes = (3, 4, 5, 6)  # a thread each: the failure LangGraph raises is any of them

    def fan_out(size: int) -> Any:
        arrived: set[int] = set()

        async def work(s: dict[str, int]) -> State:
            arrived.add(s["x"])
            await all_arrived(arrived, size)
            raise ConnectionRefusedError(f"item {s['x']}: refused")

        g = StateGraph(State)
        g.add_node("work", work)
        g.add_conditional_edges(START, lambda s: [Send("work", {"x": i}) for i in s["items"]], ["work"])
        g.add_edge("work", END)
        return g.compile(checkpointer=InMemorySaver())

    handler = FlowscopeCallbackHandler(store, workflow="fan")

    async def run() -> dict[int, str]:
        raised = {}
        for size in sizes:
            graph = fan_out(size)
            with pytest.raises(ConnectionRefusedError) as caught:
                await graph.ainvoke({"items": list(range(size))}, config(handler, f"n{size}"))
            raised[size] = str(caught.value)
            state = await graph.aget_state({"configurable": {"thread_id": f"n{size}"}})
            assert sum("refused" in (t.error or "") for t in state.tasks) == size  # LangGraph's own count
        return raised

    raised = asyncio.run(run())
    handler.close()
    for size in sizes:
        log = store.read(f"n{size}")
        paths = [f"fan@1/work@{k}" for k in range(1, size + 1)]
        assert sorted(ends(log)) == [
            *(("NodeErrorEvent", p, "ConnectionRefusedError") for p in paths),
            ("NodeErrorPropagated", "fan@1", "ConnectionRefusedError"),  # the one LangGraph raised
        ]
        errors = {e.path: e.error_message for e in log if isinstance(e, NodeErrorEvent)}
        ws = rebuild(log)
        assert ws.status == "failed" and errors[ws.error_path] == raised[size]
        assert {p: (ws.nodes[p].status, ws.nodes[p].attempt) for p in paths} == {
            p: ("failed", 1) for p in paths
        }


async def test_a_task_failing_its_last_attempt_beside_a_sibling_failing_for_good_records_its_failure(store):
    # flaky's RetryPolicy allows 2 attempts: its second failure is final, in the same turn of
    # the loop as broken's, whichever of the two LangGraph raises
    for thread in ("t1", "t2", "t3", "t4"):
        arrived: set[str] = set()
        calls = {"flaky": 0}

        async def flaky(s: State) -> State:
            calls["flaky"] += 1
            if calls["flaky"] == 2:
                arrived.add("flaky")
                await all_arrived(arrived, 2)
            raise ConnectionError(f"upstream down ({calls['flaky']})")

        async def broken(s: State) -> State:
            arrived.add("broken")
            await all_arrived(arrived, 2)
            raise ValueError("hard failure")

        g = flaky_beside_broken(State, flaky, broken, 2, 0.001)
        handler = FlowscopeCallbackHandler(store, workflow="par")
        with pytest.raises((ConnectionError, ValueError)):
            await g.compile(checkpointer=InMemorySaver()).ainvoke({"out": []}, config(handler, thread))
        handler.close()
        log = store.read(thread)
        assert [e for e in ends(log) if e[1] == "par@1/flaky@1"] == [
            ("NodeRetrying", "par@1/flaky@1", "ConnectionError"),
            ("NodeErrorEvent", "par@1/flaky@1", "ConnectionError"),
        ]
        assert [e for e in ends(log) if e[1] == "par@1/broken@1"] == [
            ("NodeErrorEvent", "par@1/broken@1", "ValueError")
        ]
        ws = rebuild(log)
        assert {p: (n.status, n.attempt) for p, n in ws.nodes.items() if p != "par@1"} == {
            "par@1/flaky@1": ("failed", 2),
            "par@1/broken@1": ("failed", 1),
        }


def wrapping_graph(on_loop: bool) -> Any:
    """A node calls a subgraph and wraps its failure (``raise StepFailed(...) from e``)."""

    async def afetch(s: State) -> State:
        raise ConnectionError("upstream down")

    def fetch(s: State) -> State:
        raise ConnectionError("upstream down")

    inner = StateGraph(State)
    inner.add_node("fetch", afetch if on_loop else fetch)
    inner.add_edge(START, "fetch")
    sub = inner.compile(name="inner")

    async def astep(s: State) -> State:
        try:
            return await sub.ainvoke(s)
        except ConnectionError as e:
            raise StepFailed("step could not fetch") from e

    def step(s: State) -> State:
        try:
            return sub.invoke(s)
        except ConnectionError as e:
            raise StepFailed("step could not fetch") from e

    g = StateGraph(State)
    g.add_node("step", astep if on_loop else step)
    g.add_edge(START, "step")
    return g.compile(checkpointer=InMemorySaver(), name="wrap")


@pytest.mark.parametrize("on_loop", [True, False], ids=["ainvoke", "invoke"])
def test_a_node_that_wraps_its_subgraphs_failure_records_the_leafs_failure_on_the_loop_as_off_it(
    store, on_loop
):
    graph = wrapping_graph(on_loop)
    handler = FlowscopeCallbackHandler(store)
    with pytest.raises(StepFailed):
        if on_loop:
            asyncio.run(graph.ainvoke({"out": []}, config(handler, "t1")))
        else:
            graph.invoke({"out": []}, config(handler, "t1"))
    handler.close()
    log = store.read("t1")
    # two failures of their own (no RetryPolicy anywhere): the leaf's, and the node's own
    assert ends(log) == [
        ("NodeErrorEvent", "wrap@1/step@1/fetch@1", "ConnectionError"),
        ("NodeErrorEvent", "wrap@1/step@1", "StepFailed"),
        ("NodeErrorPropagated", "wrap@1", "StepFailed"),
    ]
    assert rebuild(log).error_path == "wrap@1/step@1"


async def test_a_retried_subgraph_node_ends_a_task_inside_waiting_out_its_backoff_retrying_then_cancelled(
    store,
):
    # inside the subgraph, flaky fails once and waits out a long backoff when broken fails for
    # good: LangGraph cancels flaky there, and retries the subgraph's node, which then succeeds
    calls = {"flaky": 0, "broken": 0}

    async def flaky(s: State) -> State:
        calls["flaky"] += 1
        if calls["flaky"] == 1:
            raise ConnectionError("transient")
        return {"out": ["flaky"]}

    async def broken(s: State) -> State:
        calls["broken"] += 1
        if calls["broken"] == 1:
            while calls["flaky"] == 0:
                await asyncio.sleep(0.001)  # flaky has failed once and waits out its backoff
            raise ValueError("hard failure")
        return {"out": ["broken"]}

    inner = flaky_beside_broken(State, flaky, broken, 3, 5.0)
    g = StateGraph(State)
    g.add_node(
        "sub",
        inner.compile(),
        retry_policy=RetryPolicy(max_attempts=2, initial_interval=0.001, jitter=False, retry_on=ValueError),
    )
    g.add_edge(START, "sub")
    handler = FlowscopeCallbackHandler(store)
    result = await g.compile(name="outer").ainvoke({"out": []}, config(handler, "t1"))
    handler.close()
    assert sorted(result["out"]) == ["broken", "flaky"] and calls == {"flaky": 2, "broken": 2}
    log = store.read("t1")
    assert ends(log) == [
        ("NodeErrorEvent", "outer@1/sub@1/broken@1", "ValueError"),
        ("NodeRetrying", "outer@1/sub@1/flaky@1", "ConnectionError"),
        ("NodeCancelled", "outer@1/sub@1/flaky@1", ""),
        ("NodeRetrying", "outer@1/sub@1", "ValueError"),
    ]
    ws = rebuild(log)
    assert ws.status == "completed"
    assert ws.nodes["outer@1/sub@1/flaky@1"].status == "cancelled"
    assert ws.nodes["outer@1/sub@1/flaky@2"].status == "completed"


async def test_a_resumed_tasks_attempts_count_anew_for_its_retry_policy_as_langgraphs_do(store):
    # flaky failed for good once (ValueError: its policy retries ConnectionError only). On the
    # resume LangGraph runs it under its policy afresh: the resume's first attempt (flaky's
    # second) fails with ConnectionError and is retried, cancelled in its backoff when broken
    # fails for good in the same turn of the loop
    arrived: set[str] = set()
    calls = {"flaky": 0, "broken": 0}

    async def flaky(s: State) -> State:
        calls["flaky"] += 1
        arrived.add(f"flaky{calls['flaky']}")
        await all_arrived(arrived, 2 * calls["flaky"])
        raise (ValueError if calls["flaky"] == 1 else ConnectionError)(f"flaky ({calls['flaky']})")

    async def broken(s: State) -> State:
        calls["broken"] += 1
        arrived.add(f"broken{calls['broken']}")
        await all_arrived(arrived, 2 * calls["broken"])
        raise ValueError(f"broken ({calls['broken']})")

    graph = flaky_beside_broken(State, flaky, broken, 2, 5.0).compile(checkpointer=InMemorySaver())
    handler = FlowscopeCallbackHandler(store, workflow="par")
    with pytest.raises(ValueError):
        await graph.ainvoke({"out": []}, config(handler, "t1"))
    with pytest.raises(ValueError, match="broken"):
        await graph.ainvoke(None, config(handler, "t1"))
    handler.close()
    assert calls == {"flaky": 2, "broken": 2}
    log = store.read("t1")
    assert [e for e in ends(log) if e[1] == "par@1/flaky@1"] == [
        ("NodeErrorEvent", "par@1/flaky@1", "ValueError"),
        ("NodeRetrying", "par@1/flaky@1", "ConnectionError"),
        ("NodeCancelled", "par@1/flaky@1", ""),
    ]
    assert [e for e in ends(log) if e[1] == "par@1/broken@1"] == [
        ("NodeErrorEvent", "par@1/broken@1", "ValueError"),
        ("NodeErrorEvent", "par@1/broken@1", "ValueError"),
    ]


@pytest.mark.parametrize("how", ["caller_timeout", "sibling_failed"])
def test_subgraph_nodes_cancelled_with_their_child_count_one_cancellation_the_childs(store, how):
    """Two levels of subgraph nodes around a leaf, cancelled together (the caller's timeout,
    or a sibling's failure): one ``cancellation``, the leaf's; the subgraph nodes are its
    containers, as nested workflows are."""
    from prometheus_client import CollectorRegistry

    from flowscope.observability import MetricsPlugin

    async def leaf(s: State) -> dict[str, Any]:
        await asyncio.sleep(5)
        return {"out": ["leaf"]}

    async def boom(s: State) -> dict[str, Any]:
        await asyncio.sleep(0.05)
        raise RuntimeError("boom")

    inner = StateGraph(State)
    inner.add_node("leaf", leaf)
    inner.add_edge(START, "leaf")
    mid = StateGraph(State)
    mid.add_node("inner", inner.compile())
    mid.add_edge(START, "inner")
    top = StateGraph(State)
    top.add_node("mid", mid.compile())
    top.add_edge(START, "mid")
    if how == "sibling_failed":
        top.add_node("boom", boom)
        top.add_edge(START, "boom")
    graph = top.compile(checkpointer=InMemorySaver(), name="nest")
    registry = CollectorRegistry()
    handler = FlowscopeCallbackHandler(
        store, plugins=[MetricsPlugin(registry=registry)], heartbeat_interval=0
    )
    with pytest.raises((asyncio.TimeoutError, RuntimeError)):
        asyncio.run(
            asyncio.wait_for(
                graph.ainvoke({"out": []}, config(handler, "t")), 0.3 if how == "caller_timeout" else 5
            )
        )
    cancelled = [e.path for e in store.read("t") if isinstance(e, NodeCancelled)]
    assert cancelled[:3] == ["nest@1/mid@1/inner@1/leaf@1", "nest@1/mid@1/inner@1", "nest@1/mid@1"]

    def runs(node: str, outcome: str) -> float | None:
        labels = {"workflow": "nest", "node": node, "outcome": outcome}
        return registry.get_sample_value("flowscope_node_runs_total", labels)

    assert runs("leaf", "cancellation") == 1
    assert [runs(n, "cancellation") for n in ("inner", "mid")] == [None, None]
