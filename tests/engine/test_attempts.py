"""A node run's attempts (engine/attempts.py): each attempt within the node's timeout, the
retry's delay waited before the next, and the recovery budget of a run its process died in."""

from __future__ import annotations

import asyncio
import time

import pytest

from conftest import of_type
from flowscope import START, RetryConfig, Runner, Workflow, node
from flowscope.errors import NodeTimeoutError, RecoveryLimitError
from flowscope.events import NodeStarted, RunStarted
from flowscope.store import MemoryEventStore


async def test_the_timeout_bounds_every_attempt_not_only_the_first(store):
    calls = []

    @node(timeout=0.05, retry=RetryConfig(max_attempts=2, initial_delay=0))
    async def always_slow(ctx, x):
        calls.append(ctx.attempt)
        await asyncio.sleep(2)  # past the timeout, every attempt
        return "late"

    started = time.monotonic()
    with pytest.raises(NodeTimeoutError):
        await Runner(Workflow("w", edges=[(START, always_slow)]), store=store).run(None, session_id="s")
    assert time.monotonic() - started < 1.5  # the second attempt was cut off too
    assert calls == [1, 2]
    [failed] = of_type(store.read("s"), "node_error")
    assert (failed.error_code, failed.attempt_count) == ("NODE_TIMEOUT", 2)


async def test_a_retry_waits_its_delay_growing_by_the_backoff_factor(store):
    at = []

    @node(retry=RetryConfig(max_attempts=3, initial_delay=0.05, backoff_factor=2, jitter=0))
    def flaky(ctx, x):
        at.append(time.monotonic())
        if ctx.attempt < 3:
            raise ConnectionError("not yet")
        return "ok"

    result = await Runner(Workflow("w", edges=[(START, flaky)]), store=store).run(None, session_id="s")
    assert result.output == "ok"
    assert [e.delay_s for e in of_type(store.read("s"), "node_retrying")] == [0.05, 0.1]
    assert at[1] - at[0] >= 0.05 and at[2] - at[1] >= 0.1


def _crashed(store: MemoryEventStore, sid: str, crashes: int) -> None:
    """A log whose run ``w@1/leaf@1`` was cut off by ``crashes`` dead processes in turn, the
    later ones each recovering it."""
    log = []
    for i in range(1, crashes + 1):
        inv = f"dead-{i}"
        log.append(
            RunStarted(session_id=sid, invocation_id=inv, ts=float(i), workflow="w", input=1, resumed=i > 1)
        )
        for path, name, kind, parent in (
            ("w@1", "w", "workflow", ""),
            ("w@1/leaf@1", "leaf", "function", "w@1"),
        ):
            log.append(
                NodeStarted(
                    session_id=sid,
                    invocation_id=inv,
                    ts=float(i),
                    path=path,
                    node=name,
                    attempt=i,
                    kind=kind,
                    parent_path=parent,
                    recovered=i > 1 and kind == "function",
                )
            )
    store.append(sid, log, 0)


async def test_a_run_is_recovered_max_recoveries_times_and_fails_with_recovery_limit_after():
    """``max_recoveries=2``: the resume after two crashes is the run's second recovery and
    runs it; the resume after three would be its third, more than allowed."""
    leaf = node(lambda x: x + 1, name="leaf")
    wf = Workflow("w", edges=[(START, leaf)])
    store = MemoryEventStore()
    _crashed(store, "twice", 2)
    result = await Runner(wf, store=store, max_recoveries=2).resume("twice")
    assert result.status == "completed" and result.output == 2 and result.recovered == 1

    _crashed(store, "thrice", 3)
    with pytest.raises(RecoveryLimitError):
        await Runner(wf, store=store, max_recoveries=2).resume("thrice")
    [failed] = of_type(store.read("thrice"), "node_error")
    assert (failed.path, failed.error_code) == ("w@1/leaf@1", "RECOVERY_LIMIT")
