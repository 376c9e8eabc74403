"""How outputs reach the next step: a join runs once per complete set of its predecessors'
outputs, whatever the timing; activations never share one value."""

from __future__ import annotations

import asyncio

from flowscope import START, JoinNode, Runner, Workflow, node
from flowscope.store import SqliteEventStore


def _nodes():
    x, y, u, v = (node(lambda _, n=n: n, name=n) for n in ("x", "y", "u", "v"))
    c = node(lambda s: f"c({s})", name="c")
    w = node(lambda s: f"w({s})", name="w")
    return x, y, u, v, c, w


def _join(seen: list) -> JoinNode:
    return JoinNode("j", lambda outs: seen.append(outs))  # no output: not a terminal


async def _join_inputs(store, longer: str = "") -> list:
    """``c`` reached from ``x`` and ``y``, ``w`` from ``u`` and ``v``, both joined by ``j``;
    the branch through ``longer`` has one more node (its outputs come a step later)."""
    x, y, u, v, c, w = _nodes()
    seen: list = []
    j = _join(seen)
    first = {n.name: n for n in (x, y, u, v)}
    edges: list = [(START, (x, y, u, v))]
    for src, dst in (("x", c), ("y", c), ("u", w), ("v", w)):
        if src == longer:
            edges.append((first[src], node(lambda s: s, name=f"{src}2"), dst))
        else:
            edges.append((first[src], dst))
    edges.append(((c, w), j))
    result = await Runner(Workflow("wf", edges=edges), store=store).run(1, session_id=f"s{longer}")
    assert result.status == "completed"
    return seen


async def test_a_join_runs_once_per_complete_set_of_its_predecessors_outputs(store):
    """``c`` and ``w`` each run twice in one step, both runs of ``c`` first: the join runs
    twice, each run with one output of each, in the order they ran, none overwritten."""
    assert await _join_inputs(store) == [{"c": "c(x)", "w": "w(u)"}, {"c": "c(y)", "w": "w(v)"}]


async def test_a_join_runs_as_often_with_every_output_whatever_the_timing(store):
    """The same graph with one branch a step longer: the join still runs twice, each time
    with a complete set, and gets every output once (which ``c`` pairs with which ``w``
    follows the order they completed in)."""
    for longer in ("x", "y", "u", "v"):
        seen = await _join_inputs(store, longer)
        assert [sorted(s) for s in seen] == [["c", "w"], ["c", "w"]], longer
        assert sorted(v for s in seen for v in s.values()) == ["c(x)", "c(y)", "w(u)", "w(v)"], longer


async def test_a_second_output_of_a_predecessor_is_never_dropped(store):
    """``c`` runs twice and ``w`` once, in the same step: the first run of ``c`` completes the
    join's set with ``w``; the second waits in the next set, which fires with what it has
    when nothing else can run."""
    x, y, u, _v, c, w = _nodes()
    seen: list = []
    wf = Workflow("wf", edges=[(START, (x, y, u)), (x, c), (y, c), (u, w), ((c, w), _join(seen))])
    await Runner(wf, store=store).run(1, session_id="s")
    assert seen == [{"c": "c(x)", "w": "w(u)"}, {"c": "c(y)"}]


async def test_an_output_goes_to_the_oldest_set_without_one_from_its_predecessor(store):
    """``c`` and ``w`` each run twice in one step (both runs of ``c`` first), ``z`` once: the
    second ``w`` goes to the second set, which already holds the second ``c``, never to the
    first set in place of the first ``w``; every output reaches the join once."""
    x, y, u, v, c, w = _nodes()
    p = node(lambda _: "p", name="p")
    z = node(lambda s: f"z({s})", name="z")
    seen: list = []
    edges = [(START, (x, y, u, v, p)), (x, c), (y, c), (u, w), (v, w), (p, z), ((c, w, z), _join(seen))]
    await Runner(Workflow("wf", edges=edges), store=store).run(1, session_id="s")
    assert seen == [{"c": "c(x)", "w": "w(u)", "z": "z(p)"}, {"c": "c(y)", "w": "w(v)"}]


def _appends(name: str):
    def body(d):
        d["rows"].append(name)  # edits its input in place
        return name

    return node(body, name=name)


async def test_parallel_branches_never_share_an_input(store):
    """``a``'s output goes to ``b`` and ``c`` in one step: ``b`` edits its input, and ``c``
    (reading after it) still gets what ``a`` returned, as it would after a resume."""
    seen = []

    @node
    async def c(d):
        await asyncio.sleep(0)  # b has run
        seen.append(list(d["rows"]))
        return "c"

    a, b = node(lambda _: {"rows": [1]}, name="a"), _appends("b")
    wf = Workflow("w", edges=[(START, a, (b, c)), ((b, c), JoinNode("j"))])
    result = await Runner(wf, store=store).run(None, session_id="s")
    assert result.status == "completed" and seen == [[1]]


async def test_the_run_input_is_each_first_nodes_own(store):
    seen = []

    @node
    async def second(d):
        await asyncio.sleep(0)
        seen.append(list(d["rows"]))
        return "second"

    first = _appends("first")
    wf = Workflow("w", edges=[(START, (first, second)), ((first, second), JoinNode("j"))])
    await Runner(wf, store=store).run({"rows": [0]}, session_id="s")
    assert seen == [[0]]


async def test_a_branch_gets_the_same_input_live_and_after_resume(tmp_path):
    """The value each branch gets from a fan-out, live and after resume (read from the log)."""
    store = SqliteEventStore(str(tmp_path / "s.db"))
    seen = []

    @node
    async def c(ctx, d):
        await asyncio.sleep(0)
        seen.append(list(d["rows"]))
        await ctx.request_input("go?", interrupt_id="go")
        return "c"

    b = _appends("b")
    wf = Workflow(
        "w", edges=[(START, node(lambda _: {"rows": [1]}, name="a"), (b, c)), ((b, c), JoinNode("j"))]
    )
    await Runner(wf, store=store).run(None, session_id="s")
    result = await Runner(wf, store=store).resume("s", inputs={"go": 1})
    assert result.status == "completed"
    assert seen == [[1], [1]]
    store.close()
