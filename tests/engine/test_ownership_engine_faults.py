"""Engine side, in one process: store faults at every append, lost leases,
live owners, sync-node timeouts, submitted runs and answers recorded through the store."""

from __future__ import annotations

import asyncio
import threading
import time
from collections import Counter

import pytest

from flowscope import START, AnswerReceipt, JoinNode, Plugin, RetryConfig, Runner, Workflow, answer, node
from flowscope.errors import (
    ConcurrencyConflict,
    LeaseLost,
    NodeTimeoutError,
    ResumeError,
    StoreDiskFull,
    UnknownSessionError,
    WorkflowError,
)
from flowscope.fold import rebuild
from flowscope.ownership import this_process
from flowscope.store import MemoryEventStore


class FailingStore(MemoryEventStore):
    """Fails its ``fail_at``-th append (counted over its life) with ``error``, writing nothing."""

    def __init__(self, fail_at: int = 0) -> None:
        super().__init__()
        self.fail_at = fail_at
        self.appends = 0
        self.error = StoreDiskFull("database or disk is full (injected)")

    def append(self, session_id, events, expected_last_seq, *, epoch=None):
        self.appends += 1
        if self.appends == self.fail_at:
            raise self.error
        return super().append(session_id, events, expected_last_seq, epoch=epoch)


def rich_workflow(effects: Counter[str]) -> Workflow:
    """Fan-out, a nested workflow, a retry and a pause; every body counts its runs by path."""

    def leaf(name: str) -> object:
        @node(name=name)
        def body(ctx, x):
            effects[ctx.path] += 1
            return f"{x}>{name}"

        return body

    @node(retry=RetryConfig(max_attempts=3, initial_delay=0.001, jitter=0))
    def flaky(ctx, x):
        effects[ctx.path] += 1
        if ctx.attempt == 1:
            raise ConnectionError("first attempt fails")
        return f"{x}>flaky"

    @node
    async def approve(ctx, x):
        effects[ctx.path] += 1
        ok = await ctx.request_input("approve?", interrupt_id="ok")
        return f"{x}>{ok}"

    a, b = leaf("a"), leaf("b")
    join = JoinNode("join")
    inner = Workflow("inner", edges=[(START, leaf("x"), leaf("y"))])
    return Workflow(
        "rich",
        edges=[
            (START, leaf("fetch"), (a, b, flaky)),
            ((a, b, flaky), join),
            (join, inner, approve, leaf("done")),
        ],
    )


async def drive(store: MemoryEventStore, effects: Counter[str], sid: str = "s") -> object:
    """Run, then resume with a new Runner (a new owner) each time, until completed; the
    first store fault is expected once and must be the store's own error."""
    seen: list[BaseException] = []
    for _ in range(10):
        runner = Runner(rich_workflow(effects), store=store, worker_id=f"w{len(seen)}-{time.monotonic_ns()}")
        ws = rebuild(store.read(sid)) if store.last_seq(sid) else None
        try:
            if ws is None:
                result = await runner.run(1, session_id=sid)
            else:
                asked = {e.interrupt_id for e in ws.pending if e.type == "input_requested"}
                result = await runner.resume(sid, inputs={i: "yes" for i in asked})
        except StoreDiskFull as exc:
            seen.append(exc)
            continue
        if result.status == "completed":
            return result.output, seen
    raise AssertionError("the session did not complete")


async def test_a_clean_run_for_reference():
    effects: Counter[str] = Counter()
    store = FailingStore()
    output, seen = await drive(store, effects)
    assert output == str({"a": "1>fetch>a", "b": "1>fetch>b", "flaky": "1>fetch>flaky"}) + ">x>y>yes>done"
    assert not seen and store.appends >= 8
    assert effects["rich@1/flaky@1"] == 2 and effects["rich@1/approve@1"] == 2


async def test_a_failed_append_at_every_point_reaches_the_caller_and_nothing_completed_runs_twice():
    reference = FailingStore()
    expected, _ = await drive(reference, Counter())
    total = reference.appends
    assert total >= 8
    for k in range(1, total + 1):
        effects: Counter[str] = Counter()
        store = FailingStore(fail_at=k)
        output, seen = await drive(store, effects)
        where = f"append {k} of {total}"
        assert output == expected, where
        assert len(seen) == 1 and seen[0] is store.error, (
            where
        )  # the store's own error, never a numbering one
        events = store.read("s")
        assert [e.seq for e in events] == list(range(1, len(events) + 1)), where
        assert rebuild(events).status == "completed", where
        started = Counter(e.path for e in events if e.type == "node_started")
        retried = Counter(e.path for e in events if e.type == "node_retrying")
        completed = Counter(e.path for e in events if e.type == "node_completed")
        assert all(n == 1 for n in completed.values()), where
        for path in completed:  # a completed run is never started again
            done = next(e.seq for e in events if e.type == "node_completed" and e.path == path)
            assert not any(e.type == "node_started" and e.path == path and e.seq > done for e in events), (
                where,
                path,
            )
        for path, n in effects.items():  # every body that ran is on record: no unrecorded work
            assert n == started[path] + retried[path], (where, path, n, started[path], retried[path])
        # the failed invocation appended nothing after its failure and no RunFinished
        failed_inv = {e.invocation_id for e in events if e.type == "run_started"} - {
            e.invocation_id for e in events if e.type == "run_finished"
        }
        assert len(failed_inv) <= 1, where


async def test_a_store_fault_is_raised_as_is_the_lease_released_and_plugins_told():
    calls: list[tuple[str, object]] = []

    class Spy(Plugin):
        def after_node(self, ctx, outcome):
            calls.append(("after_node", outcome.status))

        def on_node_error(self, ctx, event):
            calls.append(("on_node_error", event.error_code))

        def after_run(self, run, result, error):
            calls.append(("after_run", error))

    effects: Counter[str] = Counter()
    store = FailingStore(fail_at=3)  # RunStarted+fetch; fetch's end + the fan-out's starts
    runner = Runner(rich_workflow(effects), store=store, plugins=[Spy()])
    with pytest.raises(StoreDiskFull) as info:
        await runner.run(1, session_id="s")
    assert info.value is store.error
    assert ("after_run", store.error) in calls
    assert not any(c[0] == "on_node_error" for c in calls)
    info_s = store.session_info("s")
    assert info_s is not None and info_s.lease_expires_at == 0  # released: anyone may resume now
    other = Runner(rich_workflow(effects), store=store, worker_id="other")
    assert (await other.resume("s")).status == "paused"


class Gate:
    """A node that signals it started and waits until released."""

    def __init__(self) -> None:
        self.started = asyncio.Event()
        self.release = asyncio.Event()
        self.runs: Counter[int] = Counter()

    def workflow(self) -> Workflow:
        @node
        async def wait(ctx, x):
            self.runs[ctx.attempt] += 1
            self.started.set()
            await self.release.wait()
            return x + 1

        @node
        async def after(ctx, x):
            return x + 1

        return Workflow("gated", edges=[(START, wait, after)])


@pytest.mark.slow
async def test_a_live_owner_is_refused_with_host_pid_and_lease_age_and_force_fences_it_off():
    store = MemoryEventStore()
    gate = Gate()
    outcomes: list[str] = []
    lost: list[tuple[str, str]] = []

    class Spy(Plugin):
        def after_node(self, ctx, outcome):
            outcomes.append(outcome.status)

        def on_lease_lost(self, session_id, workflow):
            lost.append((session_id, workflow))

    first = Runner(gate.workflow(), store=store, plugins=[Spy()], lease_s=0.6)
    task = asyncio.ensure_future(first.run(1, session_id="s"))
    await gate.started.wait()
    second = Runner(gate.workflow(), store=store, worker_id="second", lease_s=0.6)
    with pytest.raises(ConcurrencyConflict) as refused:
        await second.resume("s")
    owner = first.owner
    assert owner.host in str(refused.value) and f"pid {owner.pid}" in str(refused.value)
    assert "ago" in str(refused.value) and not isinstance(refused.value, LeaseLost)
    await asyncio.sleep(1.0)  # past lease_s: the lease thread keeps renewing it
    with pytest.raises(ConcurrencyConflict):
        await second.resume("s")
    taken_at = store.last_seq("s")
    gate.release.set()
    result = await second.resume("s", force=True)  # takes it: the first is fenced off
    assert result.status == "completed"
    with pytest.raises(LeaseLost):
        await task
    events = store.read("s")
    first_inv = events[0].invocation_id
    assert all(e.seq <= taken_at for e in events if e.invocation_id == first_inv)
    assert not any(e.type == "node_error" for e in events)
    assert lost == [("s", "gated")]
    assert outcomes[-1] == "cancellation" and "failure" not in outcomes  # the root run: cancelled, not failed


async def test_a_lease_taken_over_while_a_node_runs_cancels_the_run_and_raises_lease_lost():
    store = MemoryEventStore()
    gate = Gate()
    statuses: list[tuple[str, str]] = []

    class Spy(Plugin):
        def after_node(self, ctx, outcome):
            statuses.append((ctx.node_name, outcome.status))

        def on_node_error(self, ctx, event):
            statuses.append((ctx.node_name, "on_node_error"))

    runner = Runner(gate.workflow(), store=store, plugins=[Spy()], lease_s=0.3)
    task = asyncio.ensure_future(runner.run(1, session_id="s"))
    await gate.started.wait()
    before = store.last_seq("s")
    store.acquire("s", this_process("thief"), 30.0, force=True)  # another owner takes it
    t0 = time.monotonic()
    with pytest.raises(LeaseLost):
        await asyncio.wait_for(task, 5)
    assert time.monotonic() - t0 < 0.5  # found by the next renewal (every lease_s / 3)
    assert store.last_seq("s") == before  # nothing appended after the takeover
    assert statuses == [("wait", "cancellation"), ("gated", "cancellation")]


@pytest.mark.slow
async def test_a_sync_node_with_a_timeout_is_cut_off_without_holding_up_its_sibling():
    store = MemoryEventStore()
    finished = threading.Event()

    @node(timeout=0.5)
    def slow(x):
        time.sleep(2)
        finished.set()
        return "late"

    @node
    async def quick(x):
        await asyncio.sleep(0.2)
        return "quick"

    wf = Workflow("t", edges=[(START, (slow, quick))])
    t0 = time.monotonic()
    with pytest.raises(NodeTimeoutError):
        await Runner(wf, store=store).run(1, session_id="s")
    elapsed = time.monotonic() - t0
    assert 0.45 < elapsed < 0.9, elapsed
    events = store.read("s")
    err = next(e for e in events if e.type == "node_error")
    assert err.path == "t@1/slow@1" and err.error_code == "NODE_TIMEOUT"
    done = next(e for e in events if e.type == "node_completed" and e.path == "t@1/quick@1")
    assert done.ts - events[0].ts < 0.45  # the sibling was not held up by the sync body
    n = store.last_seq("s")
    assert finished.wait(3)  # the abandoned thread ran on...
    await asyncio.sleep(0.05)
    assert store.last_seq("s") == n  # ...and its result was discarded


async def test_a_sync_node_without_a_timeout_runs_inline_on_the_loop():
    seen: list[int] = []

    @node
    def body(x):
        seen.append(threading.get_ident())
        return x

    await Runner(Workflow("w", edges=[(START, body)]), store=MemoryEventStore()).run(1)
    assert seen == [threading.get_ident()]


async def test_submit_records_a_queued_run_that_resume_starts_as_a_first_run():
    store = MemoryEventStore()
    runner = Runner(Gate().workflow(), store=store)
    sid = runner.submit(41, session_id="q")
    assert sid == "q" and [e.type for e in store.read("q")] == ["run_submitted"]
    assert rebuild(store.read("q")).status == "queued"
    with pytest.raises(WorkflowError):
        runner.submit(1, session_id="q")
    with pytest.raises(WorkflowError):
        await runner.run(1, session_id="q")
    assert store.last_seq("q") == 1
    gate = Gate()
    gate.release.set()
    result = await Runner(gate.workflow(), store=store).resume("q")
    assert result.status == "completed" and result.output == 43
    started = [e for e in store.read("q") if e.type == "run_started"]
    assert len(started) == 1 and started[0].resumed is False and started[0].input == 41
    assert len({runner.submit(None), runner.submit(None)}) == 2  # a new id each time


def pausing_workflow() -> Workflow:
    @node
    async def ask(ctx, x):
        a = await ctx.request_input("a?", interrupt_id="a")
        return [x, a]

    @node
    async def job(ctx, x):
        return await ctx.await_job(lambda j: None, payload=x)

    return Workflow("p", edges=[(START, (ask, job)), ((ask, job), JoinNode("j"))])


async def test_answer_records_answers_that_resume_consumes():
    store = MemoryEventStore()
    runner = Runner(pausing_workflow(), store=store)
    assert (await runner.run(1, session_id="s")).status == "paused"
    job_id = next(e.job_id for e in store.read("s") if e.type == "job_dispatched")
    receipt = answer(store, "s", inputs={"a": "A"})
    assert isinstance(receipt, AnswerReceipt) and receipt == AnswerReceipt(
        "s", "p", ("a",), (), store.last_seq("s")
    )
    assert rebuild(store.read("s")).status == "answered"
    answer(store, "s", jobs={job_id: {"success": True, "data": "D"}})
    result = await runner.resume("s")  # consumes both, as if given to resume()
    assert result.status == "completed" and result.output == {"ask": [1, "A"], "job": "D"}
    assert len([e for e in store.read("s") if e.type == "input_received"]) == 1


async def test_answer_errors_append_nothing():
    store = MemoryEventStore()
    runner = Runner(pausing_workflow(), store=store)
    await runner.run(1, session_id="s")
    job_id = next(e.job_id for e in store.read("s") if e.type == "job_dispatched")
    with pytest.raises(UnknownSessionError):
        answer(store, "nope", inputs={"a": 1})
    answer(store, "s", inputs={"a": "A"}, jobs={job_id: {"success": True, "data": "D"}})
    n = store.last_seq("s")
    cases = [
        ({"zzz": 1}, {}, "no open input request 'zzz'"),
        ({"a": "again"}, {}, "already answered"),
        ({}, {job_id: {"success": True}}, "already reported"),
        ({}, {"job-unknown": {"success": True}}, "no dispatched job"),
        ({}, {}, "nothing to answer"),
    ]
    for inputs, jobs, what in cases:
        with pytest.raises(ResumeError, match=what):
            answer(store, "s", inputs=inputs, jobs=jobs)
        assert store.last_seq("s") == n, what
    with pytest.raises(ResumeError, match="already reported"):  # the same rule in resume()
        await runner.resume("s", jobs={job_id: {"success": True}})
    assert store.last_seq("s") == n
    await runner.resume("s")
    n = store.last_seq("s")
    with pytest.raises(ResumeError, match="completed"):
        answer(store, "s", inputs={"a": 1})
    assert store.last_seq("s") == n


async def test_a_claimed_lease_is_used_as_given_and_released():
    store = MemoryEventStore()
    gate = Gate()
    gate.release.set()
    runner = Runner(gate.workflow(), store=store, worker_id="worker-1")
    sid = runner.submit(1)
    lease = store.acquire(sid, runner.owner, 15.0)
    result = await runner.resume(sid, lease=lease)
    assert result.status == "completed"
    info = store.session_info(sid)
    assert info is not None and info.epoch == lease.epoch and info.lease_expires_at == 0
    with pytest.raises(ValueError):
        await runner.resume("other", lease=lease)
