"""StoreCollector and run ownership: queued sessions, and orphaned runs by the
owner rule, scraped through a real prometheus-client registry."""

from __future__ import annotations

import os
import time

import pytest
from prometheus_client import CollectorRegistry

from flowscope import ownership
from flowscope.events import NodeStarted, RunStarted, RunSubmitted
from flowscope.observability.store_collector import StoreCollector
from flowscope.ownership import Owner, process_start_time, this_host, this_process
from flowscope.store import EventStore, MemoryEventStore, SqliteEventStore
from flowscope.store.testing import dead_owner, ev, node_ev

QUEUED = "flowscope_store_queued_sessions"
OLDEST_QUEUED = "flowscope_store_oldest_queued_timestamp_seconds"
ORPHANED = "flowscope_store_orphaned_runs"
OPEN = "flowscope_store_open_runs"


@pytest.fixture(params=["memory", "sqlite"])
def store(request, tmp_path):
    s: EventStore = MemoryEventStore() if request.param == "memory" else SqliteEventStore(tmp_path / "own.db")
    yield s
    s.close()


def submit(store: EventStore, sid: str, workflow: str, ts: float) -> None:
    store.append(
        sid, [RunSubmitted(session_id=sid, invocation_id="submit", ts=ts, workflow=workflow, input=1)], 0
    )


def test_queued_sessions_and_the_oldest_submit_time_per_workflow(store):
    registry = CollectorRegistry()
    registry.register(StoreCollector(store))
    assert registry.get_sample_value(QUEUED, {"workflow": "orders"}) is None
    submit(store, "o1", "orders", 1000.0)
    submit(store, "o2", "orders", 900.0)
    submit(store, "b1", "billing", 950.0)
    assert registry.get_sample_value(QUEUED, {"workflow": "orders"}) == 2
    assert registry.get_sample_value(OLDEST_QUEUED, {"workflow": "orders"}) == 900.0
    assert registry.get_sample_value(QUEUED, {"workflow": "billing"}) == 1
    assert registry.get_sample_value(OLDEST_QUEUED, {"workflow": "billing"}) == 950.0
    # a worker starts them: the series stay, at 0
    store.append("o2", [ev(RunStarted, sid="o2", workflow="orders", ts=1100.0)], 1)
    assert registry.get_sample_value(QUEUED, {"workflow": "orders"}) == 1
    assert registry.get_sample_value(OLDEST_QUEUED, {"workflow": "orders"}) == 1000.0
    store.append("o1", [ev(RunStarted, sid="o1", workflow="orders", ts=1100.0)], 1)
    store.append("b1", [ev(RunStarted, sid="b1", workflow="billing", ts=1100.0)], 1)
    assert registry.get_sample_value(QUEUED, {"workflow": "orders"}) == 0
    assert registry.get_sample_value(OLDEST_QUEUED, {"workflow": "orders"}) == 0
    assert registry.get_sample_value(QUEUED, {"workflow": "billing"}) == 0


def test_a_dead_same_host_owner_is_orphaned_at_once_and_a_live_one_never(store):
    now = time.time()
    registry = CollectorRegistry()
    registry.register(StoreCollector(store, stale_after_s=300.0))  # heartbeats would wait 5 minutes
    gone = dead_owner("w-killed")
    lease = store.acquire("dead", gone, 3600.0, now=now)
    store.append(
        "dead",
        [
            ev(RunStarted, sid="dead", workflow="shop", ts=now),
            node_ev(NodeStarted, "shop@1/charge@1", ts=now, sid="dead"),
        ],
        0,
        epoch=lease.epoch,
    )
    live = store.acquire("live", this_process("w-live"), 60.0, now=now)
    store.append(
        "live",
        [
            ev(RunStarted, sid="live", workflow="shop", ts=now - 3600),
            node_ev(NodeStarted, "shop@1/charge@1", ts=now - 3600, sid="live"),
        ],
        0,
        epoch=live.epoch,
    )
    labels = {"workflow": "shop", "node": "charge"}
    assert registry.get_sample_value(OPEN, {**labels, "state": "running"}) == 2
    assert registry.get_sample_value(ORPHANED, labels) == 1  # the dead one, with a fresh heartbeat
    store.release(live)  # its lease ended with the run still open: orphaned too
    assert registry.get_sample_value(ORPHANED, labels) == 2


class WallClockAt:
    """The clocks as :mod:`flowscope.ownership` reads them, with the wall clock set so that
    this host booted at ``boot_at`` (epoch seconds); ``CLOCK_BOOTTIME`` is the real one."""

    CLOCK_BOOTTIME = time.CLOCK_BOOTTIME
    CLOCK_REALTIME = time.CLOCK_REALTIME

    def __init__(self, boot_at: float) -> None:
        self.boot_at = boot_at

    def clock_gettime(self, clock: int) -> float:
        up = time.clock_gettime(time.CLOCK_BOOTTIME)
        return up if clock == self.CLOCK_BOOTTIME else self.boot_at + up


def test_a_live_owner_stays_alive_when_the_wall_clock_is_adjusted_across_a_second(store, monkeypatch):
    # A CI flake: a live worker counted as orphaned. Its start time had been derived from
    # /proc/stat's whole-second btime, and a wall-clock adjustment of a few milliseconds
    # moved btime by a second between the worker recording it and the scrape.
    whole = int(time.clock_gettime(time.CLOCK_REALTIME) - time.clock_gettime(time.CLOCK_BOOTTIME))
    clock = WallClockAt(whole + 0.995)
    monkeypatch.setattr(ownership, "time", clock)
    started = process_start_time(os.getpid())
    clock.boot_at = whole + 1.005  # stepped 10 ms forward, across the second
    now = time.time()
    registry = CollectorRegistry()
    registry.register(StoreCollector(store, stale_after_s=300.0))
    owners = {
        "live": Owner("w-live", this_host(), os.getpid(), started),
        # the same pid under a start time 5 s away: another process, its owner gone
        "reused": Owner("w-reused", this_host(), os.getpid(), started - 5.0),
    }
    for sid, owner in owners.items():
        lease = store.acquire(sid, owner, 60.0, now=now)
        store.append(
            sid,
            [
                ev(RunStarted, sid=sid, workflow="shop", ts=now),
                node_ev(NodeStarted, "shop@1/charge@1", ts=now, sid=sid),
            ],
            0,
            epoch=lease.epoch,
        )
    labels = {"workflow": "shop", "node": "charge"}
    assert registry.get_sample_value(OPEN, {**labels, "state": "running"}) == 2
    assert registry.get_sample_value(ORPHANED, labels) == 1  # the reused pid's, never the live owner's
