"""How a body's end is recorded when it is not a return or an exception: a ``sys.exit()``
(argparse on bad arguments) or another ``BaseException`` that is no signal of the engine's
is the node's failure, recorded once under its own type and raised on as
``NodeExitError``, never the end of the process or of the other sessions it runs; a
``CancelledError`` out of a body cancels the run, in a chain and in a step; dynamic
children still running in tasks of their own when their parent's body ends are stopped
first, each with its end. A request for input is recorded only if its run pauses: one
made beside a call that fails first (``asyncio.gather``), or swallowed by the body, was
never put to anyone."""

from __future__ import annotations

import asyncio
import sys

import pytest

from conftest import of_type
from flowscope import START, JoinNode, Runner, Worker, Workflow, node
from flowscope.errors import NodeExitError
from flowscope.export import session_spans
from flowscope.store import SqliteEventStore, rebuild


class Stop(BaseException):
    """A library's own exit signal (gevent's GreenletExit is one)."""


@node
async def exits(ctx, x):
    await asyncio.sleep(0)
    sys.exit("usage: tool --flag")


@node
async def stops(ctx, x):
    raise Stop("stopped")


@node
async def sibling(ctx, x):
    await asyncio.sleep(5)
    return "late"


@pytest.mark.parametrize(("body", "type_name"), [(exits, "SystemExit"), (stops, "Stop")])
async def test_a_base_exception_in_a_body_is_the_nodes_failure_recorded_once(store, body, type_name):
    join = JoinNode("j")
    wf = Workflow("w", edges=[(START, (body, sibling)), (body, join), (sibling, join)])
    with pytest.raises(NodeExitError) as raised:
        await Runner(wf, store).run(None, session_id="s")
    assert type(raised.value.__cause__).__name__ == type_name
    events = store.read("s")
    [error] = of_type(events, "node_error")
    assert (error.path, error.error_type) == (f"w@1/{body.name}@1", type_name)
    assert [(e.path, e.origin_path) for e in of_type(events, "node_error_propagated")] == [
        ("w@1", error.path)
    ]
    assert [(e.path, e.reason) for e in of_type(events, "node_cancelled")] == [
        ("w@1/sibling@1", "sibling_failed")
    ]
    started = {e.path for e in of_type(events, "node_started")}
    ended = {e.path for e in events if e.type in ("node_error", "node_error_propagated", "node_cancelled")}
    assert started == ended  # every run has its terminal event
    assert events[-1].status == "failed" and events[-1].error_path == error.path


@node
async def long_task(ctx, x):
    await asyncio.sleep(0.5)
    return "done"


@pytest.mark.slow
def test_a_worker_lives_on_when_a_node_calls_sys_exit_and_its_other_sessions_complete(tmp_path):
    store = SqliteEventStore(tmp_path / "w.db")
    victim, exiter = (
        Workflow("victim", edges=[(START, long_task)]),
        Workflow("exiter", edges=[(START, exits)]),
    )
    victims = [Runner(victim, store).submit(None) for _ in range(2)]
    doomed = Runner(exiter, store).submit(None)
    w = Worker(store, [victim, exiter], poll_s=0.02, lease_s=3.0)

    async def main() -> None:
        task = asyncio.ensure_future(w.run())
        for _ in range(500):
            if all(store.session_info(s).status in ("completed", "failed") for s in [*victims, doomed]):
                break
            await asyncio.sleep(0.02)
        w.stop()
        await task

    asyncio.run(main())
    assert [store.session_info(s).status for s in victims] == ["completed", "completed"]
    assert store.session_info(doomed).status == "failed"
    assert w.outcomes == {"completed": 2, "failed": 1}
    store.close()


@node
async def awaits_a_cancelled_task(ctx, x):
    t = asyncio.ensure_future(asyncio.sleep(10))
    asyncio.get_running_loop().call_later(0.01, t.cancel)  # a shared client's request, cancelled elsewhere
    await t  # CancelledError out of the body


@pytest.mark.parametrize("parallel", [False, True])
async def test_a_cancelled_error_out_of_a_body_cancels_the_run_in_a_chain_and_in_a_step(store, parallel):
    """As in a chain, a step whose branch's body raises ``CancelledError`` is cancelled,
    its other branches with it: no error is recorded (R3), every run has its end."""
    body = awaits_a_cancelled_task
    if parallel:
        join = JoinNode("j")
        wf = Workflow("w", edges=[(START, (body, sibling)), (body, join), (sibling, join)])
    else:
        wf = Workflow("w", edges=[(START, body, sibling)])
    with pytest.raises(asyncio.CancelledError):
        await Runner(wf, store).run(None, session_id="s")
    events = store.read("s")
    assert of_type(events, "node_error") == [] and of_type(events, "node_error_propagated") == []
    started = {e.path for e in of_type(events, "node_started")}
    assert started == {e.path for e in of_type(events, "node_cancelled")}
    assert events[-1].type == "run_finished" and events[-1].status == "cancelled"


# -- dynamic children run concurrently -------------------------------------------------------

COUNTS: dict[str, int] = {}


@node
async def child(ctx, x):
    COUNTS[x] = COUNTS.get(x, 0) + 1
    if x == "bad":
        raise ValueError("child failed")
    if x == "ask":
        return await ctx.request_input("q", interrupt_id="q")
    await asyncio.sleep(0.2)
    return x


@node
async def gathers(ctx, x):
    return await asyncio.gather(*(ctx.run_node(child, c) for c in x))


def _ends_once_in_their_invocation(events) -> None:
    """Every NodeStarted has exactly one terminal event, in its invocation, before its
    ``RunFinished``; nothing is appended after the last ``RunFinished``."""
    ends = ("node_completed", "node_error", "node_error_propagated", "node_cancelled", "node_paused")
    ends += ("input_requested",)
    open_: dict[str, str] = {}
    for e in events:
        if e.type == "node_started":
            assert e.path not in open_, e.path
            open_[e.path] = e.invocation_id
        elif e.type in ends:
            assert open_.pop(e.path) == e.invocation_id, e.path
        elif e.type == "run_finished":
            assert not open_, f"left open by its invocation: {sorted(open_)}"
    assert events[-1].type == "run_finished"


@pytest.mark.slow
async def test_children_gathered_are_stopped_with_their_parent_when_one_fails(store):
    COUNTS.clear()
    wf = Workflow("w", edges=[(START, gathers)])
    with pytest.raises(ValueError):
        await Runner(wf, store).run(["slow", "bad"], session_id="s")
    await asyncio.sleep(0.4)  # a long-lived loop: the slow child must not go on and append
    events = store.read("s")
    _ends_once_in_their_invocation(events)
    assert [(e.path, e.reason) for e in of_type(events, "node_cancelled")] == [
        ("w@1/gathers@1/child@1", "parent_ended")
    ]


async def test_children_gathered_are_stopped_when_one_pauses_and_none_is_recovered_on_resume(store):
    COUNTS.clear()
    wf = Workflow("w", edges=[(START, gathers)])
    assert (await Runner(wf, store).run(["slow", "ask"], session_id="s")).status == "paused"
    result = await Runner(wf, store).resume("s", inputs={"q": "A"})
    assert (result.status, result.output) == ("completed", ["slow", "A"])
    events = store.read("s")
    _ends_once_in_their_invocation(events)
    assert not any(e.recovered for e in of_type(events, "node_started"))  # a pause is no crash


@node
async def leaves_a_child(ctx, x):
    asyncio.ensure_future(ctx.run_node(child, "slow"))  # started, never awaited
    return "done"


@pytest.mark.slow
async def test_a_child_task_the_body_left_before_it_began_is_not_run_after_its_parent(store):
    COUNTS.clear()
    await Runner(Workflow("w", edges=[(START, leaves_a_child)]), store).run(None, session_id="s")
    await asyncio.sleep(0.4)
    events = store.read("s")
    _ends_once_in_their_invocation(events)
    assert COUNTS == {} and not any("/child@" in e.path for e in events)


async def _fails_at_once() -> None:
    raise ValueError("no stock")


@node
async def asks_beside_a_failure(ctx, x):
    return await asyncio.gather(_fails_at_once(), ctx.request_input("ship?", interrupt_id="ship"))


@node
async def swallows_its_request(ctx, x):
    answers = await asyncio.gather(ctx.request_input("ship?", interrupt_id="ship"), return_exceptions=True)
    return len(answers)


@node
async def asks_twice_at_once(ctx, x):
    a, b = await asyncio.gather(
        ctx.request_input("ship?", interrupt_id="ship"), ctx.request_input("bill?", interrupt_id="bill")
    )
    return f"{a}+{b}"


async def test_a_request_made_beside_a_call_that_fails_first_is_not_recorded(store):
    with pytest.raises(ValueError):
        await Runner(Workflow("w", edges=[(START, asks_beside_a_failure)]), store).run(1, session_id="s")
    events = store.read("s")
    path = "w@1/asks_beside_a_failure@1"
    assert [e.type for e in events if e.path == path] == ["node_started", "node_error"]
    assert rebuild(events).nodes[path].requests == {}  # no request left open on a failed run
    # its span says what happened to it: a failure, not a pause
    [span] = [s for s in session_spans(events) if s.name == "invoke_node asks_beside_a_failure"]
    assert span.attributes["flowscope.node.outcome"] == "failure"
    assert span.attributes["error.type"] == "ValueError"


async def test_a_request_the_body_swallowed_is_not_recorded_and_the_run_completes(store):
    result = await Runner(Workflow("w", edges=[(START, swallows_its_request)]), store).run(1, session_id="s")
    assert (result.status, result.output) == ("completed", 1)
    assert [e.type for e in store.read("s") if e.type == "input_requested"] == []


async def test_two_requests_made_at_once_are_both_recorded_when_the_run_pauses(store):
    wf = Workflow("w", edges=[(START, asks_twice_at_once)])
    paused = await Runner(wf, store).run(1, session_id="s")
    assert paused.status == "paused"
    path = "w@1/asks_twice_at_once@1"
    assert [(e.type, getattr(e, "interrupt_id", None)) for e in store.read("s") if e.path == path] == [
        ("node_started", None),
        ("input_requested", "ship"),
        ("input_requested", "bill"),
    ]
    done = await Runner(wf, store).resume("s", inputs={"ship": "yes", "bill": "later"})
    assert (done.status, done.output) == ("completed", "yes+later")
