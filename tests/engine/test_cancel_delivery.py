"""A cancel for a live run stops it before its next body starts, even when a sync body
held the event loop while the lease keeper found the message; a cancel taken in after its
session ended by itself is dropped with a line at INFO."""

from __future__ import annotations

import asyncio
import logging

import pytest

import flowscope
from conftest import of_type
from flowscope import START, Runner, Workflow, node
from flowscope.errors import SessionCancelledError
from flowscope.store import SqliteEventStore
from waiting import wait_for

LEASE_S = 0.3
RAN: list[str] = []


class WatchedStore(SqliteEventStore):
    """Counts the lease keeper's rounds that found mail."""

    def __init__(self, path):
        super().__init__(path)
        self.rounds_with_mail = 0

    def sessions_with_mail(self, session_ids):
        found = super().sessions_with_mail(session_ids)
        self.rounds_with_mail += bool(found)
        return found


STORE: list[WatchedStore] = []


@node
def hold(ctx, x):
    """A sync body (no timeout: it runs on the loop) that sends its session a cancel and
    holds the loop until two keeper rounds found it (so the first one's work is done)."""
    RAN.append("hold")
    store = STORE[0]
    flowscope.cancel(store, ctx.run.session_id, reason="not needed")
    wait_for(lambda: store.rounds_with_mail >= 2, timeout=20, what="two keeper rounds finding the cancel")
    return x


@node
def then_sync(ctx, x):
    RAN.append("then_sync")
    return x


@node
async def then_async(ctx, x):
    RAN.append("then_async")
    await asyncio.sleep(0)
    return x


@pytest.fixture
def store(tmp_path):
    RAN.clear()
    s = WatchedStore(tmp_path / "c.db")
    STORE[:] = [s]
    yield s
    STORE.clear()
    s.close()


@pytest.mark.parametrize("then", [then_sync, then_async], ids=["sync", "async"])
async def test_a_cancel_found_while_a_sync_body_held_the_loop_stops_the_run_before_the_next_body(
    store, then, caplog
):
    runner = Runner(Workflow("held", edges=[(START, hold, then)]), store, lease_s=LEASE_S)
    with caplog.at_level(logging.INFO, logger="flowscope.engine"):
        with pytest.raises(SessionCancelledError):
            await asyncio.wait_for(runner.run(None, session_id="s"), 30)
    assert RAN == ["hold"]  # the next body never started
    events = store.read("s")
    cancelled = of_type(events, "node_cancelled")  # the next node's run, then the workflow's
    assert [e.node for e in cancelled] == [then.name, "held"]
    assert all(e.reason.startswith("not needed") for e in cancelled)
    last = events[-1]
    assert last.type == "run_finished" and last.status == "cancelled" and last.final
    assert store.inbox("s") == []
    assert not [r for r in caplog.records if "dropped" in r.getMessage()]  # taken in, not dropped


async def test_a_cancel_found_after_the_last_body_is_dropped_with_an_info_line(store, caplog):
    runner = Runner(Workflow("held_last", edges=[(START, hold)]), store, lease_s=LEASE_S)
    with caplog.at_level(logging.INFO, logger="flowscope.engine"):
        result = await asyncio.wait_for(runner.run(None, session_id="s"), 30)
    assert result.status == "completed" and RAN == ["hold"]  # nothing was left to cancel
    assert store.read("s")[-1].status == "completed" and store.inbox("s") == []
    (line,) = [r for r in caplog.records if "dropped" in r.getMessage()]
    assert line.levelno == logging.INFO and "cancel" in line.getMessage()
    assert "completed" in line.getMessage()
