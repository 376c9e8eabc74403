"""Runs nest at most ``MAX_DEPTH`` deep: a workflow nested deeper is refused when it is
defined, and a dynamic child that would run deeper (a node that runs itself without end)
fails its parent with ``WORKFLOW_ERROR``, recorded like any failure, where Python's stack
used to end the invocation with a ``RecursionError`` that no event recorded."""

from __future__ import annotations

import pytest

from conftest import of_type
from flowscope import START, Runner, Workflow, node
from flowscope.engine.graph import MAX_DEPTH
from flowscope.errors import WorkflowError
from flowscope.store import SqliteEventStore


@node
def leaf(x):
    return x


def nested(workflows: int) -> Workflow:
    """``workflows`` workflows, each the only node of the next, around ``leaf``."""
    wf = Workflow("w0", edges=[(START, leaf)])
    for i in range(1, workflows):
        wf = Workflow(f"w{i}", edges=[(START, wf)])
    return wf


@node
async def down(ctx, n):
    """Runs itself as its own child, ``n`` more times (``None``: without end)."""
    if n == 0:
        return 0
    return 1 + await ctx.run_node(down, None if n is None else n - 1)


def test_a_workflow_nested_past_the_limit_is_refused_when_it_is_defined():
    assert nested(MAX_DEPTH - 1).depth == MAX_DEPTH  # its leaf's run is the deepest
    with pytest.raises(WorkflowError, match=f"nests its runs {MAX_DEPTH + 1} deep"):
        nested(MAX_DEPTH)


async def test_a_workflow_nested_to_the_limit_runs(tmp_path):
    store = SqliteEventStore(tmp_path / "runs.db")
    result = await Runner(nested(MAX_DEPTH - 1), store).run(7, session_id="s")
    assert (result.status, result.output) == ("completed", 7)
    deepest = max(e.path.count("/") + 1 for e in of_type(store.read("s"), "node_completed"))
    assert deepest == MAX_DEPTH


async def test_a_node_that_runs_itself_without_end_fails_with_workflow_error_recorded(tmp_path):
    store = SqliteEventStore(tmp_path / "runs.db")
    with pytest.raises(WorkflowError, match=f"would run {MAX_DEPTH + 1} deep"):
        await Runner(Workflow("w", edges=[(START, down)]), store).run(None, session_id="s")
    events = store.read("s")
    [finished] = of_type(events, "run_finished")
    assert (finished.status, finished.error_code) == ("failed", "WORKFLOW_ERROR")
    [error] = of_type(events, "node_error")  # once, at the deepest run: the one refused its child
    assert (error.path.count("/") + 1, error.error_code) == (MAX_DEPTH, "WORKFLOW_ERROR")
    started = {e.path for e in of_type(events, "node_started")}
    ended = {e.path for e in events if e.type in ("node_completed", "node_error", "node_error_propagated")}
    assert started == ended  # nothing left running
    assert store.open_runs() == []


async def test_a_dynamic_child_counts_the_depth_of_the_workflow_it_runs(store):
    inner = nested(10)  # 10 workflows and a leaf: 11 deep below the run that runs it
    assert inner.depth == 11

    @node
    async def runs_inner(ctx, x):
        return await ctx.run_node(inner, x)

    def around(workflows: int) -> Workflow:  # runs_inner's run is workflows + 1 deep
        wf = Workflow("p0", edges=[(START, runs_inner)])
        for i in range(1, workflows):
            wf = Workflow(f"p{i}", edges=[(START, wf)])
        return wf

    assert (await Runner(around(MAX_DEPTH - 12), store).run(1)).output == 1  # the leaf at the limit
    with pytest.raises(WorkflowError, match=f"'w9' would run {MAX_DEPTH + 1} deep"):
        await Runner(around(MAX_DEPTH - 11), store).run(1)


async def test_run_node_refuses_what_is_not_a_node(store):
    @node
    async def parent(ctx, x):
        return await ctx.run_node(lambda y: y, x)

    with pytest.raises(TypeError, match="decorate it with @node"):
        await Runner(Workflow("w", edges=[(START, parent)]), store).run(1)
