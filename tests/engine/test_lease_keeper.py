"""The lease keeper renews every active invocation's lease in one store call per round
(one transaction in the SQLite and PostgreSQL stores), and a lease lost in a round ends
only its own invocation."""

from __future__ import annotations

import asyncio
import gc
import threading
from typing import Any

import pytest

from flowscope import START, Runner, Workflow, node
from flowscope.errors import LeaseLost
from flowscope.ownership import this_process
from flowscope.store import MemoryEventStore
from flowscope.store.sqlite import SqliteEventStore


class Counting:
    """Counts the keeper's store calls (the thread it makes them from included)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.calls: list[tuple[str, int]] = []

    def note(self, name: str, n: int) -> None:
        with self.lock:
            self.calls.append((name, n))

    def of(self, name: str) -> list[int]:
        with self.lock:
            return [n for c, n in self.calls if c == name]


def counting(base: type) -> tuple[Any, Counting]:
    seen = Counting()

    class Store(base):  # type: ignore[misc, valid-type]
        def renew(self, lease: Any, lease_s: float, **kw: Any) -> Any:
            seen.note("renew", 1)
            return super().renew(lease, lease_s, **kw)

        def renew_many(self, leases: Any, lease_s: float, **kw: Any) -> Any:
            seen.note("renew_many", len(leases))
            return super().renew_many(leases, lease_s, **kw)

        def heartbeat(self, session_id: str, paths: Any, ts: Any = None) -> None:
            seen.note("heartbeat", 1)
            super().heartbeat(session_id, paths, ts)

        def heartbeat_many(self, beats: Any, ts: Any = None) -> None:
            seen.note("heartbeat_many", len(beats))
            super().heartbeat_many(beats, ts)

    return Store, seen


def slow_workflow(release: asyncio.Event) -> Workflow:
    @node
    async def hold(ctx: Any, x: int) -> int:
        await release.wait()
        return x + 1

    return Workflow("held", edges=[(START, hold)])


@pytest.mark.parametrize("kind", ["memory", "sqlite"])
async def test_one_round_renews_every_lease_and_beats_every_run_in_one_call_each(kind, tmp_path):
    cls, seen = counting(MemoryEventStore if kind == "memory" else SqliteEventStore)
    store = cls() if kind == "memory" else cls(str(tmp_path / "f.db"))
    release = asyncio.Event()
    runner = Runner(slow_workflow(release), store=store, lease_s=0.3, heartbeat_interval=0.1)
    runs = [asyncio.ensure_future(runner.run(i, session_id=f"s{i}")) for i in range(20)]
    for _ in range(200):  # until a round has seen all 20 in flight
        await asyncio.sleep(0.02)
        if 20 in seen.of("renew_many") and 20 in seen.of("heartbeat_many"):
            break
    release.set()
    results = await asyncio.gather(*runs)
    assert [r.output for r in results] == [i + 1 for i in range(20)]
    assert 20 in seen.of("renew_many"), seen.calls
    assert 20 in seen.of("heartbeat_many"), seen.calls
    assert max(seen.of("renew_many")) == 20
    if kind == "sqlite":  # one transaction per round: never a session at a time
        assert seen.of("renew") == [] and seen.of("heartbeat") == [], seen.calls
        store.close()


@pytest.mark.slow  # timing-bound (threads, processes or sleeps): the full suite runs it
async def test_a_lease_lost_in_a_round_ends_only_its_own_invocation(tmp_path):
    store = SqliteEventStore(str(tmp_path / "f.db"))
    release = asyncio.Event()
    runner = Runner(slow_workflow(release), store=store, lease_s=0.3, heartbeat_interval=0.1)
    runs = {f"s{i}": asyncio.ensure_future(runner.run(i, session_id=f"s{i}")) for i in range(5)}
    await asyncio.sleep(0.15)
    store.acquire("s2", this_process("someone-else"), 30.0, force=True)  # a takeover mid-run
    for _ in range(100):
        await asyncio.sleep(0.02)
        if runs["s2"].done():
            break
    release.set()
    with pytest.raises(LeaseLost):
        await runs["s2"]
    done = {sid: (await fut).output for sid, fut in runs.items() if sid != "s2"}
    assert done == {"s0": 1, "s1": 2, "s3": 4, "s4": 5}
    store.close()


@pytest.mark.slow  # timing-bound (threads, processes or sleeps): the full suite runs it
async def test_a_round_that_takes_most_of_the_lease_does_not_delay_the_next_renewal(tmp_path):
    """The keeper's rounds are due a tick after the last one started: a round slowed by the
    store (here, heartbeats that take 1.9 s of a 3 s lease, renewed every second) leaves the
    next renewal 0.8 s inside the lease's safe end, where a tick counted from the round's end
    would come 0.2 s after it; a healthy process does not lose its lease for being busy."""
    cls, seen = counting(SqliteEventStore)

    class SlowBeats(cls):  # type: ignore[misc, valid-type]
        def heartbeat_many(self, beats: Any, ts: Any = None) -> None:
            super().heartbeat_many(beats, ts)
            threading.Event().wait(1.9)  # the store takes its time, off the loop

    store = SlowBeats(str(tmp_path / "f.db"))

    @node
    async def long(ctx: Any, x: int) -> int:
        await asyncio.sleep(6.0)  # several rounds
        return x + 1

    runner = Runner(Workflow("long", edges=[(START, long)]), store=store, lease_s=3.0, heartbeat_interval=1.0)
    result = await runner.run(1, session_id="s")
    assert result.status == "completed", result
    assert result.output == 2
    assert len(seen.of("renew_many")) >= 3  # renewed on time all along


@pytest.mark.slow  # timing-bound (threads, processes or sleeps): the full suite runs it
async def test_an_ended_invocation_is_not_kept_alive_by_the_keepers_last_round(tmp_path):
    """The keeper's thread sleeps a tick between rounds; what a round took of the
    invocations (their records, folds and node states) must not outlive the round, or each
    tick keeps the last round's invocations alive after they end, for the garbage
    collector to walk (at 10,000 concurrent sessions, another 10,000 sessions' state)."""
    from flowscope.engine.record import Recorder

    cls, seen = counting(SqliteEventStore)
    store = cls(str(tmp_path / "f.db"))

    @node
    async def until_renewed(ctx: Any, x: int) -> int:
        for _ in range(300):  # until a round (one a second) has renewed this lease
            if seen.of("renew_many"):
                break
            await asyncio.sleep(0.01)
        return x + 1

    runner = Runner(
        Workflow("held", edges=[(START, until_renewed)]), store=store, lease_s=3.0, heartbeat_interval=0
    )
    result = await runner.run(1, session_id="s")
    assert result.output == 2 and set(seen.of("renew_many")) == {1}  # rounds that met it
    del result
    gc.collect()
    # the thread lives on, between rounds (one that finds no invocation renews nothing)
    assert runner._keeper._thread is not None
    assert [o for o in gc.get_objects() if isinstance(o, Recorder)] == []
    store.close()


@pytest.mark.slow
async def test_a_loop_an_async_body_blocks_is_said_once_with_its_runs_and_a_waiting_one_is_not(caplog):
    import time

    @node
    async def blocks(ctx, x):
        time.sleep(1.6)  # the mistake: a blocking call in an async body
        return x

    @node
    async def waits(ctx, x):
        await asyncio.sleep(1.6)
        return x

    caplog.set_level("WARNING", logger="flowscope.engine")
    store = MemoryEventStore()
    for body in (waits, blocks):
        runner = Runner(
            Workflow("w", edges=[(START, body)]), store=store, lease_s=0.9, heartbeat_interval=0.3
        )
        assert (await runner.run(1, session_id=body.name)).status == "completed"
    await asyncio.sleep(0.05)  # the loop's turn that runs the keeper's last callback
    said = [r.getMessage() for r in caplog.records if "event loop" in r.getMessage()]
    assert len(said) == 2, said  # blocked once (however many ticks it lasted), then running again
    assert said[0].startswith("the event loop has not turned for ")
    assert "(runs in flight: blocks: w@1/blocks@1)" in said[0]  # the innermost: the one whose code runs
    assert "make it a sync node" in said[0] and "waits" not in said[0]
    assert said[1].startswith("the event loop runs again, after ")


@pytest.mark.slow
async def test_a_loop_a_sync_body_blocks_is_said_with_the_advice_for_a_sync_node(caplog):
    import time

    @node
    def holds(ctx, x):
        time.sleep(1.6)  # a sync body without a timeout runs on the loop
        return x

    caplog.set_level("WARNING", logger="flowscope.engine")
    runner = Runner(
        Workflow("w", edges=[(START, holds)]), store=MemoryEventStore(), lease_s=0.9, heartbeat_interval=0.3
    )
    assert (await runner.run(1, session_id="s")).status == "completed"
    said = [r.getMessage() for r in caplog.records if "has not turned" in r.getMessage()]
    assert len(said) == 1 and "(runs in flight: s: w@1/holds@1)" in said[0], said
    assert "a sync node without a timeout runs on the loop" in said[0] and "give it a timeout=" in said[0]
    assert "an async node" not in said[0]


def test_a_process_that_stood_still_is_not_said_to_have_a_blocked_loop(monkeypatch, caplog):
    """A tick that comes more than two ticks late (SIGSTOP, a suspended VM): the loop stood
    still with the whole process, so the probe's wait counts from then; a loop that still
    runs nothing a tick later is blocked."""
    from types import SimpleNamespace

    from flowscope.engine import lease

    now = [100.0]
    monkeypatch.setattr(lease.time, "monotonic", lambda: now[0])
    caplog.set_level("WARNING", logger="flowscope.engine")
    keeper = lease.LeaseKeeper(MemoryEventStore(), 15.0, 5.0, "t")
    loop = asyncio.new_event_loop()  # never run: its probes wait, as a blocked loop's do
    inv: Any = SimpleNamespace(lease=SimpleNamespace(session_id="s"), in_flight={"w@1": 0, "w@1/n@1": 0})
    keeper._active[1] = lease._Kept(inv, loop)
    try:
        said = lambda: [r.getMessage() for r in caplog.records]  # noqa: E731
        for at in (101.0, 102.0):  # a probe sent, then a tick on time: blocked for 1 s
            now[0] = at
            keeper._probe(1.0)
        assert len(said()) == 1 and "not turned for 1.0 s (runs in flight: s: w@1/n@1)" in said()[0]
        caplog.clear()
        keeper._probes.clear()
        for at in (103.0, 110.0):  # a probe sent, then the next tick 7 s late: the process stood
            now[0] = at
            keeper._probe(1.0)
        assert said() == []
        now[0] = 111.0  # a tick on time, and the loop still ran nothing
        keeper._probe(1.0)
        assert len(said()) == 1 and "not turned for 1.0 s" in said()[0]
    finally:
        loop.close()
