"""Workflows for the stalled-owner test (tests/test_worker_stall.py), served by
``flowscope worker tests.stall_workflows:ALL`` from the repository root.

Every node body appends one line of JSON to ``$CHAOS_LOG`` (session, invocation, path,
attempt, pid, and ``ts``: the wall clock read first thing after the body's last ``await``),
so the test can tell which process, and which of its invocations, did what when. Each workflow puts a SIGSTOP at a different point
of a run: mid-body (a long ``await``), in a retry's backoff, between the nodes of a chain,
in parallel branches.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from typing import Any

from flowscope import START, JoinNode, NodeContext, RetryConfig, Workflow, node

__all__ = ["ALL", "KINDS", "STOPPED", "effect"]


def effect(ctx: NodeContext) -> None:
    """Append this run's line to $CHAOS_LOG in one write (O_APPEND: lines never interleave).
    The time is read before anything else, so a line stamped before a takeover was decided
    on before it."""
    ts = time.time()
    line = (
        json.dumps(
            {
                "session": ctx.run.session_id,
                "invocation": ctx.run.invocation_id,
                "path": ctx.path,
                "attempt": ctx.attempt,
                "pid": os.getpid(),
                "ts": ts,
            }
        )
        + "\n"
    )
    fd = os.open(os.environ["CHAOS_LOG"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line.encode())
    finally:
        os.close(fd)


def _sleeper(name: str, seconds: float, first: bool = False) -> Any:
    """A node that sleeps ``seconds`` and writes its line after the sleep (a body that was
    mid-``await``), or with ``first`` before it (a body that started)."""

    async def body(ctx: NodeContext, x: Any) -> Any:
        if first:
            # The body's first await: a stop that falls between the engine's last lease
            # check and this point is the documented limit (code runs on to its next
            # await, docs/workers.md); after it, a stopped owner's body is cancelled here.
            await asyncio.sleep(0)
            effect(ctx)
        await asyncio.sleep(seconds)
        if not first:
            effect(ctx)
        return (x or 0) + 1

    body.__name__ = name
    return node(body, name=name)


# -- mid-body: a long await between two short nodes
long_wait = Workflow(
    "stall_long", edges=[(START, _sleeper("l0", 0.05), _sleeper("l1", 0.6), _sleeper("l2", 0.05))]
)

# -- a chain of short nodes that write as they start: a stop lands between nodes as often
# as inside one
chain = Workflow("stall_chain", edges=[(START, *[_sleeper(f"c{i}", 0.04, first=True) for i in range(12)])])


# -- a retry's backoff: attempt 1 fails at once, attempt 2 comes 0.7 s later
class Flaky(ConnectionError):
    error_code = "FLAKY"


@node(retry=RetryConfig(max_attempts=3, initial_delay=0.7, jitter=0.0, exceptions=["Flaky"]))
async def flaky(ctx: NodeContext, x: Any) -> Any:
    effect(ctx)  # as each attempt starts: attempt 2's line is a retry that went on
    await asyncio.sleep(0.01)
    if ctx.attempt == 1:
        raise Flaky("the first attempt always fails")
    return (x or 0) + 1


retrying = Workflow("stall_retry", edges=[(START, _sleeper("r0", 0.05), flaky, _sleeper("r2", 0.05))])

# -- parallel branches, each in a task of its own
branches = [_sleeper(f"b{i}", 0.3 + 0.1 * i) for i in range(3)]
join = JoinNode("bjoin")


@node
async def bsum(ctx: NodeContext, joined: Any) -> Any:
    await asyncio.sleep(0.02)
    effect(ctx)
    return sum(joined.values())


fanout = Workflow(
    "stall_fanout", edges=[(START, _sleeper("b_", 0.02), tuple(branches)), (tuple(branches), join, bsum)]
)


# -- threads: a body hands work to asyncio.to_thread, a sync body with a timeout runs in a
# thread of its own, then the run waits long enough for a test to look at every thread
@node
async def to_thread(ctx: NodeContext, x: Any) -> Any:
    return await asyncio.to_thread(lambda: (x or 0) + 1)


@node(timeout=5.0)
def sync_step(ctx: NodeContext, x: Any) -> Any:
    return x + 1


threads = Workflow("stall_threads", edges=[(START, to_thread, sync_step, _sleeper("t_wait", 30.0))])

#: What ``flowscope worker tests.stall_workflows:ALL`` serves.
ALL = [long_wait, chain, retrying, fanout, threads]
#: The workflows the SIGSTOP rounds submit.
STOPPED = [long_wait, chain, retrying, fanout]
#: The workflows by name, for submitting.
KINDS = {wf.name: wf for wf in ALL}
