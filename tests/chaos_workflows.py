"""Workflows for the worker chaos test (tests/test_worker_chaos.py), served by
``flowscope worker tests.chaos_workflows:ALL`` from the repository root.

Every node records its side effect as one line of JSON (session, path, attempt, pid, time)
appended to the file named by ``$CHAOS_LOG``, after the work it stands for, so the test
can count how often each node run really executed. Nodes that pause write their line
after the pause is answered (their body runs again from the start on resume, by design).
The sleeps are short: a session takes a few tenths of a second, so a worker killed every
second is usually killed in the middle of some node.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from typing import Any

from flowscope import START, JoinNode, NodeContext, RetryConfig, Workflow, node

__all__ = [
    "ALL",
    "chain",
    "fanout",
    "retrying",
    "asking",
    "job",
    "racing",
    "side_effect",
    "resume_args",
    "stop_workers",
]

STEP_S = float(os.environ.get("CHAOS_STEP_S", "0.08"))
#: How long race_slow works (tests/engine/test_answer_while_running.py gives it seconds, for the CLI).
RACE_SLOW_S = float(os.environ.get("RACE_SLOW_S", str(STEP_S * 5)))


def side_effect(ctx: NodeContext, what: str) -> None:
    """Append this run's line to $CHAOS_LOG in one write (O_APPEND: lines never interleave)."""
    line = (
        json.dumps(
            {
                "session": ctx.run.session_id,
                "path": ctx.path,
                "attempt": ctx.attempt,
                "what": what,
                "pid": os.getpid(),
                "ts": time.time(),
            }
        )
        + "\n"
    )
    fd = os.open(os.environ["CHAOS_LOG"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line.encode())
    finally:
        os.close(fd)


def _step(name: str) -> Any:
    async def body(ctx: NodeContext, x: Any) -> Any:
        await asyncio.sleep(STEP_S)
        side_effect(ctx, name)
        return (x or 0) + 1

    body.__name__ = name
    return node(body, name=name)


# -- a chain of three
c1, c2, c3 = _step("c1"), _step("c2"), _step("c3")
chain = Workflow("chaos_chain", edges=[(START, c1, c2, c3)])

# -- fan-out to three branches and a join
f0, fa, fb, fc = _step("f0"), _step("fa"), _step("fb"), _step("fc")
fjoin = JoinNode("fjoin")


@node
async def fsum(ctx: NodeContext, joined: Any) -> Any:
    await asyncio.sleep(STEP_S)
    side_effect(ctx, "fsum")
    return sum(joined.values())


fanout = Workflow("chaos_fanout", edges=[(START, f0, (fa, fb, fc), fjoin, fsum)])


# -- a node that fails its first attempt and succeeds on the retry
class Flaky(ConnectionError):
    error_code = "FLAKY"


@node(retry=RetryConfig(max_attempts=4, initial_delay=0.02, jitter=0.0, exceptions=["Flaky"]))
async def flaky(ctx: NodeContext, x: Any) -> Any:
    await asyncio.sleep(STEP_S)
    side_effect(ctx, "flaky")
    if ctx.attempt == 1:
        raise Flaky("the first attempt always fails")
    return (x or 0) + 1


r0, r2 = _step("r0"), _step("r2")
retrying = Workflow("chaos_retry", edges=[(START, r0, flaky, r2)])


# -- a human input pause, answered with `flowscope resume SESSION --input go=true`
@node
async def ask(ctx: NodeContext, x: Any) -> Any:
    go = await ctx.request_input("go on?", interrupt_id="go")
    side_effect(ctx, "ask")
    return {"x": x, "go": go}


a0, a2 = _step("a0"), _step("a2")


@node
async def after_ask(ctx: NodeContext, data: Any) -> Any:
    await asyncio.sleep(STEP_S)
    side_effect(ctx, "after_ask")
    return data["x"] if data["go"] is True else -1


asking = Workflow("chaos_ask", edges=[(START, a0, ask, after_ask)])


# -- an external job, reported with `flowscope resume SESSION --job JOB='{"success": true, ...}'`
def _dispatch(job: Any) -> None:
    """The job goes nowhere: the test plays the external system and reports it."""


@node
async def external(ctx: NodeContext, x: Any) -> Any:
    result = await ctx.await_job(dispatch=_dispatch, payload={"x": x}, expect_count=True)
    side_effect(ctx, "external")
    return result


j0 = _step("j0")


@node
async def after_job(ctx: NodeContext, result: Any) -> Any:
    await asyncio.sleep(STEP_S)
    side_effect(ctx, "after_job")
    return result


job = Workflow("chaos_job", edges=[(START, j0, external, after_job)])


# -- an input asked for while another branch runs on: answered while the session runs
@node
async def race_ask(ctx: NodeContext, x: Any) -> Any:
    go = await ctx.request_input("go on?", interrupt_id="go")
    side_effect(ctx, "race_ask")
    return go


@node
async def race_slow(ctx: NodeContext, x: Any) -> Any:
    await asyncio.sleep(RACE_SLOW_S)  # long enough for an answer to arrive while it runs
    side_effect(ctx, "race_slow")
    return x


@node
async def race_fin(ctx: NodeContext, joined: Any) -> Any:
    await asyncio.sleep(STEP_S)
    side_effect(ctx, "race_fin")
    return joined


racing = Workflow("chaos_race", edges=[(START, (race_ask, race_slow), JoinNode("race_join"), race_fin)])

#: What ``flowscope worker tests.chaos_workflows:ALL`` serves.
ALL = [chain, fanout, retrying, asking, job, racing]


def resume_args(pending: list[Any]) -> list[str]:
    """The ``flowscope resume`` options that answer a paused session's ``pending`` events
    (``WorkflowState.pending``): every input with ``true``, every job with a success."""
    from flowscope.events import InputRequested, JobDispatched

    args: list[str] = []
    for p in pending:
        if isinstance(p, InputRequested):
            args += ["--input", f"{p.interrupt_id}=true"]
        elif isinstance(p, JobDispatched):
            args += ["--job", f'{p.job_id}={{"success": true, "count": 1, "data": {{"n": 1}}}}']
    return args


def stop_workers(workers: list[Any]) -> None:
    """SIGTERM every worker process still running (they drain and exit 0), then wait for
    each; one that does not exit within 20 s is killed."""
    import signal
    import subprocess

    for w in workers:
        if w.poll() is None:
            w.send_signal(signal.SIGTERM)
    for w in workers:
        try:
            w.wait(20)
        except subprocess.TimeoutExpired:
            w.kill()
            w.wait(10)
