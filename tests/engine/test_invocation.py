"""The scheduler (engine/invocation.py): how one pass through a graph is bounded."""

from __future__ import annotations

import asyncio

import pytest

from conftest import of_type
from flowscope import START, JoinNode, Plugin, Route, Runner, Workflow, node
from flowscope.errors import WorkflowError


async def test_a_pass_runs_at_most_max_steps_steps_each_node_of_a_chain_one(store):
    """A loop of a chain (``a`` then ``b``, which always routes back to ``a``) stopped at
    ``max_steps=5`` has run five nodes: each node of a chain is a step."""
    a = node(lambda x: x, name="a")
    b = node(lambda x: Route("again", x), name="b")
    end = node(lambda x: x, name="end")
    wf = Workflow("w", edges=[(START, a, b), (b, {"again": a, "done": end})], max_steps=5)
    with pytest.raises(WorkflowError, match="max_steps=5"):
        await Runner(wf, store=store).run(0, session_id="s")
    ran = [e.path for e in of_type(store.read("s"), "node_started") if e.path != "w@1"]
    assert ran == ["w@1/a@1", "w@1/b@1", "w@1/a@2", "w@1/b@2", "w@1/a@3"]


async def test_a_step_of_several_nodes_is_one_step_and_the_bound_is_exact(store):
    """``(a, b)`` then their join is two steps: ``max_steps=2`` runs it, ``max_steps=1`` does not."""

    def make(max_steps: int) -> Workflow:
        a, b = node(lambda x: 1, name="a"), node(lambda x: 2, name="b")
        return Workflow("w", edges=[(START, (a, b)), ((a, b), JoinNode("j"))], max_steps=max_steps)

    assert (await Runner(make(2), store=store).run(0, session_id="two")).output == {"a": 1, "b": 2}
    with pytest.raises(WorkflowError, match="max_steps=1"):
        await Runner(make(1), store=store).run(0, session_id="one")
    assert "w@1/j@1" not in [e.path for e in store.read("one")]  # the second step never began


async def test_a_branch_cancelled_before_its_body_began_still_gets_its_terminal_event(store):
    """``late``'s run is held in an async ``before_node`` hook when its sibling fails: it is
    cancelled before its body begins, and its ``NodeStarted`` is still followed by one
    terminal event, ``NodeCancelled``, never an error."""
    ran = []

    class SlowStart(Plugin):
        name = "slow-start"

        async def before_node(self, ctx):
            if ctx.node_name == "late":
                await asyncio.sleep(0.05)

    @node
    def boom(x):
        raise RuntimeError("boom")

    @node
    def late(x):
        ran.append(x)
        return x

    wf = Workflow("w", edges=[(START, (boom, late)), ((boom, late), JoinNode("j"))])
    with pytest.raises(RuntimeError, match="boom"):
        await Runner(wf, store=store, plugins=[SlowStart()]).run(1, session_id="s")
    assert ran == []
    events = store.read("s")
    started = [e.path for e in of_type(events, "node_started")]
    ended = [
        e.path
        for e in events
        if e.type in ("node_completed", "node_error", "node_error_propagated", "node_cancelled")
    ]
    assert sorted(started) == sorted(ended)
    [cancelled] = of_type(events, "node_cancelled")
    assert (cancelled.path, cancelled.reason) == ("w@1/late@1", "sibling_failed")
    assert [e.path for e in of_type(events, "node_error")] == ["w@1/boom@1"]
