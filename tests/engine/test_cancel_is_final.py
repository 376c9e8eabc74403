"""An operator's cancel ends a session for good in every API: ``Runner.resume`` refuses it
as ``flowscope resume`` does, whether the cancel was recorded at once (no live owner) or
taken in by the invocation running it; an in-process abort is not final."""

from __future__ import annotations

import asyncio

import pytest

import flowscope
from conftest import of_type
from flowscope import START, Runner, Workflow, node
from flowscope.errors import InvocationAbortedError, SessionCancelledError
from flowscope.store import SqliteEventStore
from waiting import until

RAN: list[str] = []


@node
async def ask(ctx, x):
    RAN.append(f"ask {ctx.attempt}")
    return await ctx.request_input("go?", interrupt_id="go")


@node
async def fetch(ctx, x):
    return await ctx.await_job(dispatch=lambda job: None, payload=x)


@node
async def slow(ctx, x):
    RAN.append(f"slow {ctx.attempt}")
    await asyncio.sleep(30)


@pytest.fixture(autouse=True)
def _clear():
    RAN.clear()


def test_a_paused_session_an_operator_cancelled_is_not_resumed_nor_answered(tmp_path):
    store = SqliteEventStore(tmp_path / "c.db")
    wf = Workflow("paused", edges=[(START, (ask, fetch))])
    result = Runner(wf, store).run_sync(1, session_id="s")
    job_id = next(e.job_id for e in result.pending if e.type == "job_dispatched")
    flowscope.cancel(store, "s", reason="not needed")
    last = store.read("s")[-1]
    assert last.type == "run_finished" and last.status == "cancelled" and last.final
    with pytest.raises(SessionCancelledError, match="over for good"):
        Runner(wf, store).resume_sync("s")
    with pytest.raises(SessionCancelledError):
        Runner(wf, store).resume_sync("s", inputs={"go": True}, jobs={job_id: {"success": True}})
    assert RAN == ["ask 1"]  # nothing ran again
    assert store.read("s")[-1] == last  # nothing recorded
    store.close()


async def test_a_cancel_taken_in_by_the_running_invocation_is_final_and_an_abort_is_not(tmp_path):
    store = SqliteEventStore(tmp_path / "live.db")
    wf = Workflow("live", edges=[(START, slow)])
    runner = Runner(wf, store, lease_s=0.3)
    task = asyncio.ensure_future(runner.run(None, session_id="cancelled"))
    await until(lambda: RAN, "the first run")
    flowscope.cancel(store, "cancelled")  # mail for the live owner: taken in within lease_s / 3
    with pytest.raises(SessionCancelledError):
        await asyncio.wait_for(task, 10)
    assert store.read("cancelled")[-1].final
    with pytest.raises(SessionCancelledError):
        await Runner(wf, store).resume("cancelled")

    task = asyncio.ensure_future(runner.run(None, session_id="aborted"))
    await until(lambda: len(RAN) >= 2, "the second session's run")
    assert runner.abort("aborted")
    with pytest.raises(InvocationAbortedError):
        await task
    finished = of_type(store.read("aborted"), "run_finished")
    assert finished[-1].status == "cancelled" and not finished[-1].final
    resumed = asyncio.ensure_future(Runner(wf, store).resume("aborted"))  # runs again
    await until(lambda: len(RAN) >= 3, "the aborted session's run again")
    assert RAN == ["slow 1", "slow 1", "slow 2"]
    resumed.cancel()
    await asyncio.gather(resumed, return_exceptions=True)
    store.close()
