"""Rules R1-R13 of the design (R8/R9 within one process), and the seeds' cases."""

from __future__ import annotations

import asyncio

import pytest

from conftest import of_type
from flowscope import START, JoinNode, Plugin, RetryConfig, Runner, Workflow, node
from flowscope.errors import (
    InvocationAbortedError,
    NodeTimeoutError,
    OutputNotSerializableError,
    WorkflowError,
)
from flowscope.store import rebuild


class Boom(Exception):
    pass


class CodedError(Exception):
    error_code = "PAYMENT_DECLINED"


def failing(exc, name="bad"):
    def fn(x):
        raise exc

    return node(fn, name=name)


# -- R1 / R2: one NodeErrorEvent, appended before the error propagates ----------------------------


async def test_r1_thrown_node_gives_one_error_event_and_run_raises_the_original_object(store):
    exc = Boom("card expired")
    wf = Workflow("w", edges=[(START, node(lambda x: x, name="ok"), failing(exc))])
    with pytest.raises(Boom) as info:
        await Runner(wf, store=store).run(1, session_id="s")
    assert info.value is exc
    (err,) = of_type(store.read("s"), "node_error")
    assert (err.path, err.error_message, err.error_type, err.attempt_count) == (
        "w@1/bad@1",
        "card expired",
        "Boom",
        1,
    )
    finished = store.read("s")[-1]
    assert finished.type == "run_finished" and finished.status == "failed"
    assert (finished.error_code, finished.error_path) == ("UNKNOWN_ERROR", "w@1/bad@1")
    assert rebuild(store.read("s")).nodes["w@1/bad@1"].status == "failed"


async def test_r1_error_event_is_in_the_store_before_the_exception_leaves_the_node(store):
    seen_in_store = []

    class Spy(Plugin):
        def after_node(self, ctx, outcome):
            if outcome.status == "failure" and ctx.path == "w@1/bad@1":
                seen_in_store.extend(e.type for e in store.read(ctx.session_id))

    wf = Workflow("w", edges=[(START, failing(Boom("x")))])
    with pytest.raises(Boom):
        await Runner(wf, store=store, plugins=[Spy()]).run(None, session_id="s")
    assert "node_error" in seen_in_store


async def test_r1_in_flight_siblings_are_cancelled_without_error_events(store):
    sibling_cancelled = asyncio.Event()

    @node
    async def slow(x):
        try:
            await asyncio.sleep(10)
        except asyncio.CancelledError:
            sibling_cancelled.set()
            raise

    @node
    async def bad(x):
        await asyncio.sleep(0.01)
        raise Boom("broken")

    wf = Workflow("w", edges=[(START, (slow, bad))])
    with pytest.raises(Boom):
        await Runner(wf, store=store).run(None, session_id="s")
    assert sibling_cancelled.is_set()
    events = store.read("s")
    assert [e.path for e in of_type(events, "node_error")] == ["w@1/bad@1"]
    (cancelled,) = of_type(events, "node_cancelled")
    assert (cancelled.path, cancelled.reason) == ("w@1/slow@1", "sibling_failed")


async def test_r2_stream_yields_the_error_event_before_raising(store):
    exc = Boom("stream me")
    wf = Workflow("w", edges=[(START, failing(exc))])
    received = []
    with pytest.raises(Boom) as info:
        async for event in Runner(wf, store=store).stream(None, session_id="s"):
            received.append(event.type)
    assert info.value is exc
    assert "node_error" in received
    assert received[-1] == "run_finished"
    assert received == [e.type for e in store.read("s")]


# -- R3: cancellation is not failure ----------------------------------------------------------------


async def test_r3_genuine_timeout_is_a_failure_identified_as_node_timeout(store):
    @node(timeout=0.02)
    async def slow(x):
        await asyncio.sleep(5)

    with pytest.raises(NodeTimeoutError):
        await Runner(Workflow("w", edges=[(START, slow)]), store=store).run(None, session_id="s")
    (err,) = of_type(store.read("s"), "node_error")
    assert (err.error_type, err.error_code, err.path) == ("NodeTimeoutError", "NODE_TIMEOUT", "w@1/slow@1")


async def test_r3_timeout_caused_by_the_abort_is_not_reported(store):
    started = asyncio.Event()

    @node(timeout=30)
    async def waits(x):
        # A client whose own deadline shares the abort signal: the abort surfaces as a timeout.
        try:
            started.set()
            await asyncio.sleep(10)
        except asyncio.CancelledError:
            raise NodeTimeoutError("deadline exceeded while aborting") from None

    runner = Runner(Workflow("w", edges=[(START, waits)]), store=store)
    task = asyncio.ensure_future(runner.run(None, session_id="s"))
    await started.wait()
    runner.abort("s")
    with pytest.raises(InvocationAbortedError):
        await task
    events = store.read("s")
    assert of_type(events, "node_error") == []
    assert ("w@1/waits@1", "aborted") in {(e.path, e.reason) for e in of_type(events, "node_cancelled")}


# -- R4: retries -----------------------------------------------------------------------------------------


async def test_r4_exhausted_retry_gives_one_event_counting_every_attempt(store):
    exc = Boom("always")
    calls = []

    @node(retry=RetryConfig(max_attempts=3, initial_delay=0))
    def bad(x):
        calls.append(1)
        raise exc

    with pytest.raises(Boom) as info:
        await Runner(Workflow("w", edges=[(START, bad)]), store=store).run(None, session_id="s")
    assert info.value is exc and len(calls) == 3
    events = store.read("s")
    assert [r.attempt for r in of_type(events, "node_retrying")] == [1, 2]
    (err,) = of_type(events, "node_error")
    assert err.attempt_count == 3


async def test_r4_exception_outside_the_filter_fails_at_once(store):
    calls = []

    @node(retry=RetryConfig(max_attempts=3, initial_delay=0, exceptions=["ConnectionError"]))
    def bad(x):
        calls.append(1)
        raise Boom("not in filter")

    with pytest.raises(Boom):
        await Runner(Workflow("w", edges=[(START, bad)]), store=store).run(None, session_id="s")
    assert calls == [1]
    assert of_type(store.read("s"), "node_error")[0].attempt_count == 1


# -- R5: recorded once, at the deepest path -----------------------------------------------------------------


async def test_r5_nested_failure_recorded_once_at_deepest_path(store):
    inner = Workflow("inner", edges=[(START, failing(Boom("deep")))])
    outer = Workflow("outer", edges=[(START, inner)])
    with pytest.raises(Boom):
        await Runner(outer, store=store).run(None, session_id="s")
    events = store.read("s")
    assert [e.path for e in of_type(events, "node_error")] == ["outer@1/inner@1/bad@1"]
    propagated = {e.path: e.origin_path for e in of_type(events, "node_error_propagated")}
    assert propagated == {"outer@1/inner@1": "outer@1/inner@1/bad@1", "outer@1": "outer@1/inner@1/bad@1"}


async def test_r5_three_levels_deep_still_once(store):
    l3 = Workflow("l3", edges=[(START, failing(Boom("deepest")))])
    l2 = Workflow("l2", edges=[(START, l3)])
    l1 = Workflow("l1", edges=[(START, l2)])
    top = Workflow("top", edges=[(START, l1)])
    with pytest.raises(Boom):
        await Runner(top, store=store).run(None, session_id="s")
    errors = of_type(store.read("s"), "node_error")
    assert [e.path for e in errors] == ["top@1/l1@1/l2@1/l3@1/bad@1"]


async def test_r5_dynamic_child_failure_is_not_recorded_again_by_its_parent(store):
    @node
    async def parent(ctx, x):
        return await ctx.run_node(failing(Boom("child broke"), name="child"), x)

    with pytest.raises(Boom):
        await Runner(Workflow("w", edges=[(START, parent)]), store=store).run(None, session_id="s")
    assert [e.path for e in of_type(store.read("s"), "node_error")] == ["w@1/parent@1/child@1"]


async def test_r5_inner_finalize_failure_is_recorded_at_the_workflow_node(store):
    a, b = node(lambda x: "a", name="a"), node(lambda x: "b", name="b")
    inner = Workflow("inner", edges=[(START, (a, b))])  # two terminal outputs
    outer = Workflow("outer", edges=[(START, inner)])
    with pytest.raises(WorkflowError, match="2 terminal outputs"):
        await Runner(outer, store=store).run(None, session_id="s")
    (err,) = of_type(store.read("s"), "node_error")
    assert err.path == "outer@1/inner@1" and err.error_type == "WorkflowError"


async def test_r5_same_exception_object_in_a_second_invocation_is_recorded_again(store):
    shared = Boom("the same object")
    wf = Workflow("w", edges=[(START, failing(shared))])
    runner = Runner(wf, store=store)
    with pytest.raises(Boom):
        await runner.run(None, session_id="s")
    with pytest.raises(Boom):
        await runner.resume("s")  # an operator's retry of the failed run
    errors = of_type(store.read("s"), "node_error")
    assert len(errors) == 2 and errors[0].invocation_id != errors[1].invocation_id
    other = Runner(wf, store=store)
    with pytest.raises(Boom):
        await other.run(None, session_id="t")
    assert len(of_type(store.read("t"), "node_error")) == 1


# -- R6: naming the failure ----------------------------------------------------------------------------------


async def test_r6_error_code_attribute_mapping_and_fallback(store):
    sessions = iter(range(100))

    async def code_of(exc, **runner_kwargs):
        # a new session each (an id() can come back once its exception has been freed)
        sid = f"s{next(sessions)}"
        with pytest.raises(type(exc)):
            await Runner(Workflow("w", edges=[(START, failing(exc))]), store=store, **runner_kwargs).run(
                None, session_id=sid
            )
        return of_type(store.read(sid), "node_error")[0]

    assert (await code_of(CodedError("declined"))).error_code == "PAYMENT_DECLINED"
    plain = await code_of(Boom("plain"))
    assert plain.error_code == "UNKNOWN_ERROR" and plain.error_type == "Boom"
    assert plain.error_code != plain.error_type  # never the class name

    class SubTimeout(TimeoutError):
        pass

    mapped = await code_of(SubTimeout("slow upstream"), error_codes={TimeoutError: "UPSTREAM_TIMEOUT"})
    assert (mapped.error_code, mapped.error_type) == ("UPSTREAM_TIMEOUT", "SubTimeout")  # along the MRO

    class EmptyCode(Exception):
        error_code = ""

    assert (await code_of(EmptyCode("x"))).error_code == "UNKNOWN_ERROR"


async def test_r6_an_error_code_that_does_not_look_like_one_is_recorded_as_invalid(store):
    class Leaky(Exception):
        error_code = "password=hunter2 /home/alice/x"

    with pytest.raises(Leaky):
        await Runner(Workflow("w", edges=[(START, failing(Leaky("x")))]), store=store).run(
            None, session_id="s"
        )
    events = store.read("s")
    assert of_type(events, "node_error")[0].error_code == "INVALID_ERROR_CODE"
    assert of_type(events, "run_finished")[0].error_code == "INVALID_ERROR_CODE"
    assert "hunter2" not in repr(events) and "alice" not in repr(events)


async def test_r6_empty_or_raising_str_gives_the_class_name(store):
    class Silent(Exception):
        pass

    class Broken(Exception):
        def __str__(self):
            raise RuntimeError("str is broken")

    for exc, sid in ((Silent(), "a"), (Broken("x"), "b")):
        with pytest.raises(type(exc)):
            await Runner(Workflow("w", edges=[(START, failing(exc))]), store=store).run(None, session_id=sid)
        assert of_type(store.read(sid), "node_error")[0].error_message == type(exc).__name__


async def test_r6_message_is_capped_and_has_no_traceback(store):
    with pytest.raises(Boom):
        await Runner(Workflow("w", edges=[(START, failing(Boom("x" * 5000)))]), store=store).run(
            None, session_id="s"
        )
    (err,) = of_type(store.read("s"), "node_error")
    assert len(err.error_message) == 1024
    for event in store.read("s"):
        text = repr(event)
        assert "Traceback" not in text and ".py" not in text


# -- R7: completion marker ---------------------------------------------------------------------------------------


async def test_r7_every_finished_run_appends_node_completed_and_none_gets_the_marker(store):
    wf = Workflow("w", edges=[(START, node(lambda x: None, name="quiet"), node(lambda x: 1, name="loud"))])
    await Runner(wf, store=store).run(None, session_id="s")
    done = {e.path: e for e in of_type(store.read("s"), "node_completed")}
    assert set(done) == {"w@1", "w@1/quiet@1", "w@1/loud@1"}
    assert done["w@1/quiet@1"].has_output is False and done["w@1/quiet@1"].completed is True
    assert done["w@1/loud@1"].has_output is True


async def test_every_node_started_has_exactly_one_terminal_event(store):
    inner = Workflow("inner", edges=[(START, (node(lambda x: 1, name="a"), failing(Boom("x"))))])
    outer = Workflow("outer", edges=[(START, inner)])
    with pytest.raises(Boom):
        await Runner(outer, store=store).run(None, session_id="s")
    from flowscope.events import TERMINAL_TYPES

    events = store.read("s")
    starts = of_type(events, "node_started")
    assert {e.path for e in starts} == {
        "outer@1",
        "outer@1/inner@1",
        "outer@1/inner@1/a@1",
        "outer@1/inner@1/bad@1",
    }
    for started in starts:
        terminals = [e for e in events if e.path == started.path and e.type in TERMINAL_TYPES]
        assert len(terminals) == 1, started.path


# -- R8 / R9 within one process -------------------------------------------------------------------------------------


def _marker_side_effects():
    sent: list[str] = []

    @node
    def send_email(ctx, x):
        sent.append(ctx.path)
        return None  # completion marker

    @node
    async def approve(ctx, x):
        return await ctx.request_input("approve?", interrupt_id="approval")

    return sent, send_email, approve


async def test_r8_marker_run_is_not_rerun_on_resume_sequential(store):
    sent, send_email, approve = _marker_side_effects()
    runner = Runner(Workflow("w", edges=[(START, send_email, approve)]), store=store)
    assert (await runner.run(None, session_id="s")).status == "paused"
    assert (await runner.resume("s", inputs={"approval": "yes"})).output == "yes"
    assert sent == ["w@1/send_email@1"]
    resumed = of_type(store.read("s"), "run_started")[-1]
    assert resumed.resumed and resumed.replayed >= 1


async def test_r8_marker_run_is_not_rerun_in_a_parallel_branch(store):
    sent, send_email, approve = _marker_side_effects()
    join = JoinNode("join")
    runner = Runner(
        Workflow("w", edges=[(START, (send_email, approve)), ((send_email, approve), join)]), store=store
    )
    await runner.run(None, session_id="s")
    result = await runner.resume("s", inputs={"approval": "ok"})
    assert result.output == {"send_email": None, "approve": "ok"}
    assert sent == ["w@1/send_email@1"]


async def test_r8_dynamic_child_with_marker_is_not_rerun(store):
    sent, send_email, _ = _marker_side_effects()

    @node
    async def parent(ctx, x):
        await ctx.run_node(send_email, x)  # the side effect lives in a dynamic child
        return await ctx.request_input("approve?", interrupt_id="approval")

    runner = Runner(Workflow("w", edges=[(START, parent)]), store=store)
    await runner.run(None, session_id="s")
    assert (await runner.resume("s", inputs={"approval": 1})).output == 1
    assert sent == ["w@1/parent@1/send_email@1"]


async def test_r8_child_of_a_retried_nested_workflow_is_not_rerun(store):
    sent, send_email, _ = _marker_side_effects()
    attempts = []

    @node
    def shaky(ctx, x):
        attempts.append(ctx.attempt)
        if len(attempts) < 3:
            raise ConnectionError("flaky")
        return "ok"

    inner = Workflow(
        "inner", edges=[(START, send_email, shaky)], retry=RetryConfig(max_attempts=3, initial_delay=0)
    )
    runner = Runner(Workflow("w", edges=[(START, inner)]), store=store)
    assert (await runner.run(None, session_id="s")).output == "ok"
    assert sent == ["w@1/inner@1/send_email@1"]
    assert attempts == [1, 2, 3]  # the failed child's numbering continues across the parent's retries
    events = store.read("s")
    assert [r.path for r in of_type(events, "node_retrying")] == ["w@1/inner@1", "w@1/inner@1"]


async def test_r8_retried_nested_workflow_with_marker_then_pause(store):
    sent, send_email, approve = _marker_side_effects()
    failed_once = []

    @node
    def shaky(x):
        if not failed_once:
            failed_once.append(1)
            raise ConnectionError("flaky")
        return x

    inner = Workflow(
        "inner",
        edges=[(START, send_email, shaky, approve)],
        retry=RetryConfig(max_attempts=2, initial_delay=0),
    )
    runner = Runner(Workflow("w", edges=[(START, inner)]), store=store)
    assert (await runner.run(None, session_id="s")).status == "paused"
    assert (await runner.resume("s", inputs={"approval": "go"})).output == "go"
    assert sent == ["w@1/inner@1/send_email@1"]


async def test_r9_attempts_continue_after_a_pause_and_after_a_failed_run_resume(store):
    seen = []

    @node(retry=RetryConfig(max_attempts=3, initial_delay=0))
    async def worker(ctx, x):
        seen.append(ctx.attempt)
        if ctx.attempt == 1:
            raise ConnectionError("first attempt fails")
        if ctx.attempt == 2:
            await ctx.request_input("continue?", interrupt_id="go")
        raise Boom("still broken")

    runner = Runner(Workflow("w", edges=[(START, worker)]), store=store)
    assert (await runner.run(None, session_id="s")).status == "paused"
    # after the pause the node runs again as the SAME attempt 2, then fails and retries as 3
    with pytest.raises(Boom):
        await runner.resume("s", inputs={"go": True})
    assert seen == [1, 2, 2, 3]
    # one failure left after the pause: 3 attempts in all, budget exhausted at attempt 3
    state = rebuild(store.read("s"))
    assert state.nodes["w@1/worker@1"].attempt == 3 and state.nodes["w@1/worker@1"].status == "failed"
    # an operator's resume of the failed run: fresh budget, numbering continues
    with pytest.raises(Boom):
        await runner.resume("s", inputs={})
    assert seen[4:] == [4, 5, 6]
    assert of_type(store.read("s"), "node_error")[-1].attempt_count == 6


# -- R11: plugins never fail a run ---------------------------------------------------------------------------------------


async def test_r11_raising_plugin_never_fails_the_run(store, caplog):
    class Broken(Plugin):
        name = "broken"

        def before_run(self, run):
            raise RuntimeError("before_run")

        def before_node(self, ctx):
            raise RuntimeError("before_node")

        async def after_node(self, ctx, outcome):
            raise RuntimeError("after_node")

        def on_event(self, event):
            raise RuntimeError("on_event")

    errors = []

    class Watcher(Plugin):
        def on_plugin_error(self, plugin, hook, error):
            errors.append((plugin, hook))

    wf = Workflow("w", edges=[(START, node(lambda x: x + 1, name="a"))])
    runner = Runner(wf, store=store, plugins=[Broken(), Watcher()])
    assert (await runner.run(1, session_id="s")).output == 2
    assert runner.plugins.errors[("broken", "before_node")] == 2  # root workflow + a
    assert runner.plugins.errors[("broken", "before_run")] == 1
    assert ("broken", "after_node") in errors and ("broken", "on_event") in errors
    assert "plugin 'broken' raised in before_node" in caplog.text


# -- R12: outputs must be JSON ------------------------------------------------------------------------------------------------


async def test_r12_non_serialisable_output_fails_the_node_with_a_code(store):
    @node(retry=RetryConfig(max_attempts=3, initial_delay=0))
    def returns_a_set(x):
        return {1, 2}

    with pytest.raises(OutputNotSerializableError, match="returns_a_set"):
        await Runner(Workflow("w", edges=[(START, returns_a_set)]), store=store).run(None, session_id="s")
    (err,) = of_type(store.read("s"), "node_error")
    assert err.error_code == "OUTPUT_NOT_SERIALIZABLE" and err.path == "w@1/returns_a_set@1"
    assert err.attempt_count == 1  # a deterministic failure is not retried
    assert "returns_a_set" in err.error_message


async def test_r12_non_serialisable_run_input_is_refused_before_anything_is_written(store):
    wf = Workflow("w", edges=[(START, node(lambda x: x, name="a"))])
    with pytest.raises(OutputNotSerializableError, match="run input"):
        await Runner(wf, store=store).run(object(), session_id="s")
    assert store.read("s") == []


# -- R10: two writers of one session: one wins, the other appends nothing ----------------------


async def test_r10_a_second_writer_mid_run_wins_and_the_runner_appends_nothing_after(store):
    """Another process appends to the session while a node runs: the runner's next append
    is refused with ConcurrencyConflict, and nothing of it reaches the log."""
    from flowscope.errors import ConcurrencyConflict
    from flowscope.events import StateUpdated

    intruder = {}

    def meddle(x):
        seq = store.last_seq("s")
        [e] = store.append("s", [StateUpdated(session_id="s", ts=1.0, values={"k": 1})], seq)
        intruder["seq"] = e.seq
        return x

    wf = Workflow("w", edges=[(START, node(meddle, name="a"), node(lambda x: x, name="b"))])
    with pytest.raises(ConcurrencyConflict):
        await Runner(wf, store=store).run(1, session_id="s")
    log = store.read("s")
    assert log[-1].seq == intruder["seq"] and log[-1].type == "state_updated"


def test_r10_an_append_under_a_superseded_epoch_raises_lease_lost_and_writes_nothing(store):
    from flowscope.errors import LeaseLost
    from flowscope.events import RunStarted
    from flowscope.ownership import this_process

    first = store.acquire("s", this_process("w1"), 30.0)
    store.append("s", [RunStarted(session_id="s", ts=1.0, workflow="w")], 0, epoch=first.epoch)
    second = store.acquire("s", this_process("w2"), 30.0, force=True)
    assert second.epoch > first.epoch
    with pytest.raises(LeaseLost):
        store.append("s", [RunStarted(session_id="s", ts=2.0, workflow="w")], 1, epoch=first.epoch)
    assert store.last_seq("s") == 1


# -- R13: messages leave the process redacted, redacted where they are recorded ---------------


async def test_r13_a_failure_message_is_redacted_where_it_is_recorded(store):
    secret = "hunter2-very-secret"
    exc = Boom(f"login failed for postgres://app:{secret}@db/x, see /home/alice/app/pay.py password={secret}")
    wf = Workflow("w", edges=[(START, failing(exc))])
    with pytest.raises(Boom):
        await Runner(wf, store=store).run(1, session_id="s")
    (err,) = of_type(store.read("s"), "node_error")
    assert secret not in err.error_message and "/home/alice" not in err.error_message
    assert err.error_message.startswith("login failed")  # the rest of the message is kept
    # every event of the log, not only the error event, is free of the secret
    assert all(secret not in repr(e) for e in store.read("s"))
