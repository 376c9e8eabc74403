"""Workflows and stores the console's tests open: a session of 10,000 node runs across two
invocations (a pause between them), and sessions in every state an operator acts on."""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path
from typing import Any

from flowscope import START, NodeContext, Runner, Workflow, node
from flowscope.examples.demo import batch_input, geocoding_result, order_fulfilment

__all__ = [
    "big",
    "leaf",
    "make_big_session",
    "make_operator_sessions",
    "APPROVAL_SESSION",
    "FAILED_SESSION",
    "PAUSED_SESSION",
    "recovering",
    "HOLD_ENV",
    "split",
    "OVERDUE_SESSION",
    "make_overdue_session",
    "BRIDGE_ASKING",
    "BRIDGE_ORPHANED",
    "make_bridge_sessions",
]

APPROVAL_SESSION = "ops-approval"
FAILED_SESSION = "ops-failed"
PAUSED_SESSION = "ops-paused"


@node
async def leaf(ctx: NodeContext, i: Any) -> Any:
    return i


@node
async def fan(ctx: NodeContext, n: Any) -> Any:
    half = int(n) // 2
    for i in range(half):
        await ctx.run_node(leaf, i)
    await ctx.request_input("go on with the second half?", interrupt_id="half")
    for i in range(half, int(n)):
        await ctx.run_node(leaf, i)
    return n


@node
async def asks(ctx: NodeContext, x: Any) -> Any:
    return await ctx.request_input("ship it?", interrupt_id="ship")


@node
async def ticks(ctx: NodeContext, n: Any) -> Any:
    for i in range(int(n)):
        await ctx.run_node(leaf, i)
        await asyncio.sleep(0.25)
    return n


#: One branch waits for an answer while the other goes on appending runs (``n`` of them).
split = Workflow("split", edges=[(START, (asks, ticks))])


#: One node that runs ``n`` dynamic children, pausing for input half-way.
big = Workflow("big", edges=[(START, fan)])


def make_big_session(
    db: Any, session_id: str = "big-10k", children: int = 9_998, pause_s: float = 1.2
) -> None:
    """A session of ``children + 2`` node runs (the workflow, ``fan``, its children), run in
    two invocations ``pause_s`` apart."""
    from flowscope.store import SqliteEventStore

    store = db if not isinstance(db, (str, Path)) else SqliteEventStore(db)
    try:
        runner = Runner(big, store)
        asyncio.run(runner.run(children, session_id=session_id))
        time.sleep(pause_s)
        asyncio.run(runner.resume(session_id, inputs={"half": True}))
    finally:
        if isinstance(db, (str, Path)):
            store.close()


#: The file ``hold`` creates when its first attempt is inside its body (the test then kills it).
HOLD_ENV = "CONSOLE_HOLD_FILE"


@node
async def hold(ctx: NodeContext, x: Any) -> Any:
    if not ctx.recovered:  # the first attempt says it is inside, then waits to be killed
        open(os.environ[HOLD_ENV], "w").close()
        await asyncio.sleep(60)
    return x


#: A node whose first attempt never ends by itself; the attempt that recovers it returns.
recovering = Workflow("recovering", edges=[(START, leaf, hold)])


@node
async def explode(ctx: NodeContext, x: Any) -> Any:
    raise ValueError("the export failed: token=abc123secret at /home/ops/run.sh")


failing = Workflow("failing_export", edges=[(START, explode)])


def make_operator_sessions(store: Any, pause_s: float = 1.1) -> None:
    """Three sessions: one of the demo workflow waiting for its approval (after a job, in a
    second invocation ``pause_s`` later: a gap in its waterfall), one failed, one paused."""
    runner = Runner(order_fulfilment, store)
    first = asyncio.run(runner.run(batch_input("B-ui"), session_id=APPROVAL_SESSION))
    [job] = [p for p in first.pending if p.type == "job_dispatched"]
    time.sleep(pause_s)
    second = asyncio.run(runner.resume(APPROVAL_SESSION, jobs={job.job_id: geocoding_result(2)}))
    assert second.status == "paused" and [p.interrupt_id for p in second.pending] == ["approval"], (
        second.pending
    )
    try:
        asyncio.run(Runner(failing, store).run(1, session_id=FAILED_SESSION))
    except ValueError:
        pass
    asyncio.run(Runner(big, store).run(2, session_id=PAUSED_SESSION))


OVERDUE_SESSION = "ops-overdue"


def make_overdue_session(store: Any, session_id: str = OVERDUE_SESSION) -> str:
    """A session of the demo workflow waiting on its geocoding job, whose deadline (0 s) has
    passed: ``stuck`` calls its run overdue. Returns the job's id."""
    paused = asyncio.run(
        Runner(order_fulfilment, store).run(
            batch_input("B-late", geocoding_deadline_s=0.0), session_id=session_id
        )
    )
    [job] = [p for p in paused.pending if p.type == "job_dispatched"]
    return job.job_id


#: The sessions :func:`make_bridge_sessions` records: a LangGraph thread paused on a
#: question, and an ADK session whose process died mid-run (no owner, a stale heartbeat).
BRIDGE_ASKING = "lg-asking"
BRIDGE_ORPHANED = "adk-orphaned"


def make_bridge_sessions(store: Any, now: float | None = None) -> tuple[str, str]:
    """Record, as the bridges record them, a LangGraph session waiting on input ``approve``
    and an ADK session left running by a dead process an hour ago."""
    from flowscope.events import InputRequested, NodeStarted, RunFinished, RunStarted
    from flowscope.store.testing import ev, node_ev

    t = (time.time() if now is None else now) - 3600.0
    asking = "ab@1/ask@1"
    store.append(
        BRIDGE_ASKING,
        [
            ev(RunStarted, sid=BRIDGE_ASKING, workflow="ab", ts=t, engine="langgraph"),
            node_ev(NodeStarted, asking, ts=t + 1, sid=BRIDGE_ASKING),
            node_ev(InputRequested, asking, ts=t + 2, sid=BRIDGE_ASKING, interrupt_id="approve"),
            ev(RunFinished, sid=BRIDGE_ASKING, status="paused", ts=t + 3),
        ],
        0,
    )
    store.append(
        BRIDGE_ORPHANED,
        [
            ev(RunStarted, sid=BRIDGE_ORPHANED, workflow="helper", ts=t, engine="adk"),
            node_ev(NodeStarted, "helper@1/lookup@1", ts=t + 1, sid=BRIDGE_ORPHANED),
        ],
        0,
    )
    return BRIDGE_ASKING, BRIDGE_ORPHANED
