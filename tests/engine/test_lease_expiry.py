"""An owner whose lease may have expired by its own clocks stops (engine/lease.py): it
starts no node body, resumes no retry after its backoff and records no result once the
lease is no longer safe, and the bodies in flight are cancelled (they see
``CancelledError`` at their ``await``). The run raises ``LeaseExpired``, a ``LeaseLost``.

Two ways in: the invocation's own clock jumps past the lease (a fake clock in
``engine/record.py``: what a stop or a wall-clock jump looks like to it), or the lease
keeper stalls (its renewals hang or fail) while the real clocks run on. Every test runs on
a real SQLite file.
"""

from __future__ import annotations

import asyncio
import os
import signal
import threading
import time
from typing import Any

import pytest

from flowscope import START, JoinNode, Plugin, RetryConfig, Runner, Worker, Workflow, node
from flowscope.engine import record
from flowscope.errors import LeaseExpired, LeaseLost, StoreUnavailable
from flowscope.fold import rebuild
from flowscope.store.sqlite import SqliteEventStore


class Clock:
    """``engine/record.py``'s clocks, ``offset`` seconds ahead of the real ones once jumped."""

    def __init__(self) -> None:
        self.offset = 0.0
        self.wall_only = False

    def jump(self, seconds: float) -> None:
        self.offset += seconds

    def monotonic(self) -> float:
        return time.monotonic() + (0.0 if self.wall_only else self.offset)

    def time(self) -> float:
        return time.time() + self.offset


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    c = Clock()
    monkeypatch.setattr(record, "time", c)
    return c


@pytest.fixture
def db(tmp_path):
    store = SqliteEventStore(str(tmp_path / "f.db"))
    yield store
    store.close()


class Log:
    """What the bodies did: ``(event, name, attempt)`` in order."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, str, int]] = []

    def __call__(self, what: str, ctx: Any) -> None:
        self.seen.append((what, ctx.node_name, ctx.attempt))

    def of(self, what: str) -> list[tuple[str, int]]:
        return [(n, a) for w, n, a in self.seen if w == what]


def types_after(events: list[Any], seq: int) -> list[str]:
    return [e.type for e in events if e.seq > seq]


@pytest.mark.parametrize("jump", ["stopped", "wall_clock"])
async def test_no_result_is_recorded_and_no_next_body_starts_once_the_lease_may_have_expired(db, clock, jump):
    """``stopped``: both clocks move on (a SIGSTOP, a frozen VM); ``wall_clock``: only the
    wall clock jumps forward (other processes judge the lease by it)."""
    clock.wall_only = jump == "wall_clock"
    log = Log()

    @node
    async def a(ctx, x):
        log("start", ctx)
        if ctx.attempt == 1:
            clock.jump(60)  # the process was stopped past its lease while a ran
        log("effect", ctx)
        return x + 1

    @node
    async def b(ctx, x):
        log("start", ctx)
        return x + 1

    outcomes: list[tuple[str, str]] = []

    class Spy(Plugin):
        def after_node(self, ctx, outcome):
            outcomes.append((ctx.node_name, outcome.status))

    runner = Runner(Workflow("w", edges=[(START, a, b)]), store=db, plugins=[Spy()], lease_s=5.0)
    with pytest.raises(LeaseExpired) as info:
        await runner.run(1, session_id="s")
    assert isinstance(info.value, LeaseLost)
    assert log.of("start") == [("a", 1)]  # b never started
    # plugins (spans, metrics) are told that a stopped, not that it succeeded
    assert outcomes == [("a", "cancellation"), ("w", "cancellation")]
    events = db.read("s")
    assert [e.type for e in events] == [
        "run_started",
        "node_started",
        "node_started",
    ]  # a's result: not recorded
    assert db.session_info("s").lease_expires_at == 0  # released: another owner may take it at once
    # the next owner re-runs a as a new attempt and goes on
    clock.offset = 0.0
    assert (await Runner(runner.workflow, store=db, worker_id="next").resume("s")).output == 3
    assert log.of("start")[1:] == [("a", 2), ("b", 1)]


async def test_a_wall_clock_jump_past_the_lease_ends_the_invocation_at_the_keepers_next_tick(db, clock):
    """Only the wall clock jumps (other processes judge the lease by it): the keeper's next
    tick finds the lease unsafe, the body in flight is cancelled and nothing is recorded."""
    clock.wall_only = True
    log = Log()
    lease_s = 0.3

    @node
    async def a(ctx, x):
        log("start", ctx)
        clock.jump(60)
        try:
            await asyncio.sleep(3)
        except asyncio.CancelledError:
            log("cancelled", ctx)
            raise
        log("effect", ctx)
        return x + 1

    @node
    async def b(ctx, x):
        log("start", ctx)
        return x + 1

    runner = Runner(Workflow("w", edges=[(START, a, b)]), store=db, lease_s=lease_s)
    t0 = time.monotonic()
    with pytest.raises(LeaseExpired):
        await runner.run(1, session_id="s")
    assert time.monotonic() - t0 < lease_s / 3 + 0.3  # within a tick, not after the sleep
    assert log.of("start") == [("a", 1)] and log.of("cancelled") == [("a", 1)]
    assert [e.type for e in db.read("s")] == ["run_started", "node_started", "node_started"]


async def test_no_failure_is_recorded_once_the_lease_may_have_expired(db, clock):
    @node(retry=RetryConfig(max_attempts=3, initial_delay=0.0, jitter=0.0))
    async def fails(ctx, x):
        clock.jump(60)
        raise ConnectionError("fails after the stop")

    runner = Runner(Workflow("w", edges=[(START, fails)]), store=db, lease_s=5.0)
    with pytest.raises(LeaseExpired):  # not the body's error: it is not this owner's to report
        await runner.run(1, session_id="s")
    assert [e.type for e in db.read("s")] == [
        "run_started",
        "node_started",
        "node_started",
    ]  # no node_retrying


@pytest.mark.slow  # timing-bound (threads, processes or sleeps): the full suite runs it
async def test_no_retry_goes_on_after_its_backoff_once_the_lease_may_have_expired(db, clock):
    log = Log()

    @node(retry=RetryConfig(max_attempts=3, initial_delay=0.2, jitter=0.0))
    async def flaky(ctx, x):
        log("start", ctx)
        raise ConnectionError("fails")

    async def jump_in_the_backoff() -> None:
        await asyncio.sleep(0.05)
        clock.jump(60)

    runner = Runner(Workflow("w", edges=[(START, flaky)]), store=db, lease_s=5.0)
    jumper = asyncio.ensure_future(jump_in_the_backoff())
    with pytest.raises(LeaseExpired):
        await runner.run(1, session_id="s")
    await jumper
    assert log.of("start") == [("flaky", 1)]  # attempt 2 never began
    # attempt 1's failure is on record (flushed before the backoff); nothing after it
    assert [e.type for e in db.read("s")] == ["run_started", "node_started", "node_started", "node_retrying"]


async def test_a_lost_lease_cancels_every_branch_in_flight_at_its_await(db, clock):
    log = Log()

    def waiter(name: str) -> Any:
        @node(name=name)
        async def body(ctx, x):
            log("start", ctx)
            try:
                await asyncio.sleep(5)
            except asyncio.CancelledError:
                log("cancelled", ctx)
                raise
            log("effect", ctx)
            return x

        return body

    @node
    async def jumper(ctx, x):
        log("start", ctx)
        await asyncio.sleep(0.05)
        clock.jump(60)
        return x

    slow1, slow2 = waiter("slow1"), waiter("slow2")
    join = JoinNode("j")
    wf = Workflow("w", edges=[(START, (slow1, slow2, jumper)), ((slow1, slow2, jumper), join)])
    runner = Runner(wf, store=db, lease_s=5.0)
    t0 = time.monotonic()
    with pytest.raises(LeaseExpired):
        await runner.run(1, session_id="s")
    assert time.monotonic() - t0 < 1.0  # not after the 5 s sleeps
    assert sorted(log.of("cancelled")) == [("slow1", 1), ("slow2", 1)]
    assert log.of("effect") == []
    assert not any(e.type in ("node_completed", "node_cancelled") for e in db.read("s"))  # nothing recorded


async def test_check_leases_cancels_the_bodies_of_an_invocation_whose_lease_may_have_expired(db, clock):
    """What the worker's SIGCONT handler calls: outside any task, no store call."""
    log = Log()
    started = asyncio.Event()

    @node
    async def hold(ctx, x):
        log("start", ctx)
        started.set()
        try:
            await asyncio.sleep(5)
        except asyncio.CancelledError:
            log("cancelled", ctx)
            raise
        log("effect", ctx)
        return x

    runner = Runner(Workflow("w", edges=[(START, hold)]), store=db, lease_s=5.0)
    run = asyncio.ensure_future(runner.run(1, session_id="s"))
    await started.wait()
    assert runner.check_leases() == 0  # the lease is safe: nothing happens
    clock.jump(60)
    assert runner.check_leases() == 1
    with pytest.raises(LeaseExpired):
        await run
    assert log.of("cancelled") == [("hold", 1)] and log.of("effect") == []


@pytest.mark.slow  # timing-bound (threads, processes or sleeps): the full suite runs it
async def test_branches_whose_timers_fire_with_the_lease_loss_are_cancelled_before_their_step(tmp_path):
    """The loop was held past both a branch's sleep and the lease's end (what a stop
    looks like to it); its timers fire in one turn, the branch's first. The branches are
    cancelled directly, so they see ``CancelledError``; cancelling only the root task
    would let each take its step (and write its effect) before the root's cancellation
    reached it."""
    store = StallingStore(str(tmp_path / "f.db"))
    store.stall.set()  # the keeper hangs in its first renewal: only the loop's watch is left
    log = Log()
    lease_s = 0.5

    def branch(name: str) -> Any:
        @node(name=name)
        async def body(ctx, x):
            log("start", ctx)
            try:
                await asyncio.sleep(0.25)
            except asyncio.CancelledError:
                log("cancelled", ctx)
                raise
            log("effect", ctx)
            return x

        return body

    b1, b2 = branch("b1"), branch("b2")
    wf = Workflow("w", edges=[(START, (b1, b2)), ((b1, b2), JoinNode("j"))])
    runner = Runner(wf, store=store, lease_s=lease_s)
    asyncio.get_running_loop().call_later(0.15, time.sleep, 0.5)  # past 0.25 and the lease's 0.45
    threading.Timer(0.8, store.unstall.set).start()  # the run's end waits for the keeper's round
    try:
        with pytest.raises(LeaseExpired):
            await runner.run(1, session_id="s")
    finally:
        store.unstall.set()
    assert sorted(log.of("cancelled")) == [("b1", 1), ("b2", 1)] and log.of("effect") == []
    store.close()


class StallingStore(SqliteEventStore):
    """Renewals hang until ``unstall`` (``stall``), or fail (``fail``); ``renewed`` lists the
    sessions of every renewal made."""

    def __init__(self, path: str) -> None:
        super().__init__(path)
        self.stall = threading.Event()
        self.fail = False
        self.unstall = threading.Event()
        self.renewed: list[tuple[float, list[str]]] = []

    def renew_many(self, leases, lease_s, **kw):
        if self.stall.is_set():
            self.unstall.wait(10)
        if self.fail:
            raise StoreUnavailable("the database is unreachable (injected)")
        self.renewed.append((time.monotonic(), [lease.session_id for lease in leases]))
        return super().renew_many(leases, lease_s, **kw)


@pytest.mark.slow  # timing-bound (threads, processes or sleeps): the full suite runs it
async def test_a_stalled_keeper_cannot_keep_bodies_running_past_the_lease(tmp_path):
    """The keeper's renewal hangs: the lease runs out by the real clocks, and the body mid-
    ``await`` is cancelled then (the loop's own watch), not when its sleep ends."""
    store = StallingStore(str(tmp_path / "f.db"))
    log = Log()
    lease_s = 0.4

    cancelled_at: list[float] = []

    @node
    async def hold(ctx, x):
        log("start", ctx)
        store.stall.set()
        try:
            await asyncio.sleep(3)
        except asyncio.CancelledError:
            cancelled_at.append(time.monotonic())
            log("cancelled", ctx)
            store.unstall.set()  # the invocation's end waits for the keeper's round to finish
            raise
        log("effect", ctx)
        return x

    runner = Runner(Workflow("w", edges=[(START, hold)]), store=store, lease_s=lease_s)
    t0 = time.monotonic()
    try:
        with pytest.raises(LeaseExpired):
            await runner.run(1, session_id="s")
    finally:
        store.unstall.set()
    elapsed = cancelled_at[0] - t0
    assert lease_s * 0.8 < elapsed < lease_s + 0.2, elapsed  # at the lease's safe end, less its margin
    assert log.of("cancelled") == [("hold", 1)] and log.of("effect") == []
    assert types_after(store.read("s"), 2) == ["node_started"]  # nothing after hold's start
    store.close()


@pytest.mark.slow  # timing-bound (threads, processes or sleeps): the full suite runs it
async def test_the_keeper_renews_no_lease_that_expired_while_its_renewals_failed(tmp_path):
    """Renewals fail while a sync body holds the loop past the lease; when the store is back,
    the keeper does not renew the expired lease (the store would accept it: no one took the
    session), it ends the invocation instead; the body's result is not recorded."""
    store = StallingStore(str(tmp_path / "f.db"))
    lease_s = 0.25
    back_at: list[float] = []

    @node
    def block(ctx, x):
        store.fail = True
        time.sleep(lease_s * 1.5)  # holds the loop: no loop-side watch can run meanwhile
        store.fail = False
        back_at.append(time.monotonic())
        time.sleep(lease_s * 0.5)  # the keeper's rounds after the store is back
        return x

    runner = Runner(Workflow("w", edges=[(START, block)]), store=store, lease_s=lease_s)
    with pytest.raises(LeaseExpired):
        await runner.run(1, session_id="s")
    assert back_at and not any(at > back_at[0] and "s" in sids for at, sids in store.renewed), store.renewed
    assert types_after(store.read("s"), 2) == ["node_started"]
    store.close()


@pytest.mark.slow  # a lease long enough for the keeper's thread on a loaded machine
async def test_a_renewed_lease_keeps_a_blocked_loop_running(tmp_path):
    """The other side of the rule: a sync body that holds the loop for several leases keeps
    its lease (the keeper's thread renews it), and the run completes."""
    store = SqliteEventStore(str(tmp_path / "f.db"))
    lease_s = 0.6

    @node
    def block(ctx, x):
        time.sleep(lease_s * 3)
        return x + 1

    @node
    async def after(ctx, x):
        await asyncio.sleep(0.01)
        return x + 1

    runner = Runner(Workflow("w", edges=[(START, block, after)]), store=store, lease_s=lease_s)
    result = await runner.run(1, session_id="s")
    assert result.output == 3
    assert rebuild(store.read("s")).status == "completed"
    store.close()


async def test_the_worker_checks_its_leases_on_sigcont(tmp_path, clock):
    """Worker.run installs a SIGCONT handler (a Python one: it runs before the loop steps
    the bodies whose timers expired during a stop) that stops the invocations whose leases
    may have expired; it is removed when the worker stops."""
    store = SqliteEventStore(str(tmp_path / "f.db"))
    log = Log()
    started = threading.Event()

    @node
    async def hold(ctx, x):
        log("start", ctx)
        if ctx.attempt > 1:
            return x  # the run the worker claims again, with its clock put back
        started.set()
        try:
            await asyncio.sleep(5)
        except asyncio.CancelledError:
            log("cancelled", ctx)
            raise
        log("effect", ctx)
        return x

    wf = Workflow("held", edges=[(START, hold)])
    Runner(wf, store).submit(1, session_id="s")
    before = signal.getsignal(signal.SIGCONT)
    worker = Worker(store, [wf], lease_s=5.0, poll_s=0.02, drain_s=0.0)
    serving = asyncio.ensure_future(worker.run())
    for _ in range(200):
        if started.is_set():
            break
        await asyncio.sleep(0.01)
    assert started.is_set()
    assert signal.getsignal(signal.SIGCONT) is not before
    clock.jump(60)
    os.kill(os.getpid(), signal.SIGCONT)  # as after a SIGSTOP: the handler runs before the next line
    clock.offset = 0.0
    for _ in range(200):  # released: the worker claims it again and completes it
        if "completed" in worker.outcomes:
            break
        await asyncio.sleep(0.01)
    worker.stop()
    await serving
    assert worker.outcomes == {"lease_lost": 1, "completed": 1}
    assert log.of("cancelled") == [("hold", 1)] and log.of("effect") == []
    assert log.of("start") == [("hold", 1), ("hold", 2)]
    assert signal.getsignal(signal.SIGCONT) is before
    store.close()
