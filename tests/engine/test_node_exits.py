"""A node's ``sys.exit()`` (argparse on bad arguments) or any other ``BaseException`` that
is no signal of the engine's is the node's failure: one ``NodeErrorEvent`` under its own
type name at the deepest path, a terminal event for every run, raised on as
``NodeExitError``, and never the end of the process or of the other sessions it runs."""

from __future__ import annotations

import asyncio
import sys

import pytest

from conftest import of_type
from flowscope import START, JoinNode, Runner, Worker, Workflow, node
from flowscope.errors import NodeExitError
from flowscope.store import SqliteEventStore


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
