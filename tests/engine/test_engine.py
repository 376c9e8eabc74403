"""The engine's graph semantics: chains, routes, fan-out, joins, nesting, dynamic children,
loops, retries, timeouts, abort, pauses, paths and the context."""

from __future__ import annotations

import asyncio

import pytest

from conftest import asking, of_type
from flowscope import START, JoinNode, Node, RetryConfig, Route, Runner, Workflow, node
from flowscope.errors import InvocationAbortedError, NodeTimeoutError, WorkflowError


def paths(store, sid, type_name="node_started"):
    return [e.path for e in of_type(store.read(sid), type_name)]


async def test_chain_passes_outputs_along(store):
    wf = Workflow("w", edges=[(START, node(lambda x: x + 1, name="a"), node(lambda x: x * 10, name="b"))])
    result = await Runner(wf, store=store).run(1, session_id="s")
    assert result.status == "completed" and result.output == 20
    assert paths(store, "s") == ["w@1", "w@1/a@1", "w@1/b@1"]


async def test_a_runners_store_is_fixed_when_it_is_made(store):
    """Its group commit and lease keeper hold the store: swapping the attribute would record
    leases in one store and events in another (a LeaseLost at the next run), so it is read-only."""
    from flowscope.store import MemoryEventStore

    wf = Workflow("w", edges=[(START, node(lambda x: x + 1, name="a"))])
    runner = Runner(wf, store=store)
    with pytest.raises(AttributeError):
        runner.store = MemoryEventStore()  # type: ignore[misc]
    assert runner.store is store
    assert (await runner.run(1, session_id="s1")).output == 2
    assert (await runner.run(2, session_id="s2")).output == 3
    assert paths(store, "s2") == ["w@1", "w@1/a@1"]


async def test_a_plain_function_that_returns_an_awaitable_is_awaited_and_plain_values_are_not(store):
    class Later:
        def __await__(self):
            yield from asyncio.sleep(0).__await__()
            return 7

    loop = asyncio.get_running_loop()

    def future(_x):
        f = loop.create_future()
        loop.call_soon(f.set_result, 8)
        return f

    for body, want in [
        (lambda x: asyncio.sleep(0, result=x + 5), 6),  # a coroutine
        (future, 8),  # a Future
        (lambda _x: Later(), 7),  # anything with __await__
        (lambda x: (x, "t"), [1, "t"]),  # a tuple: a value, recorded as a JSON list
        (lambda _x: b"x".decode(), "x"),
    ]:
        sid = f"s{want!r}"
        result = await Runner(Workflow("w", edges=[(START, node(body, name="a"))]), store=store).run(
            1, session_id=sid
        )
        assert result.output == want, body


async def test_sync_and_async_nodes_with_and_without_ctx(store):
    @node
    def plain(x):
        return x + 1

    @node
    async def with_ctx(ctx, x):
        return [ctx.node_name, ctx.path, x]

    @node
    def no_args():
        return "fixed"

    wf = Workflow("w", edges=[(START, plain, with_ctx, no_args)])
    runner = Runner(wf, store=store)
    assert (await runner.run(1, session_id="s")).output == "fixed"
    done = {e.node: e.output for e in of_type(store.read("s"), "node_completed")}
    assert done["with_ctx"] == ["with_ctx", "w@1/with_ctx@1", 2]


async def test_route_dict_picks_edges_by_label(store):
    @node
    def check(x):
        return Route("ok" if x > 0 else "reject", output=x)

    send = node(lambda x: f"sent {x}", name="send")
    notify = node(lambda x: f"rejected {x}", name="notify")
    wf = Workflow("w", edges=[(START, check, {"ok": send, "reject": notify})])
    runner = Runner(wf, store=store)
    assert (await runner.run(5, session_id="a")).output == "sent 5"
    assert (await runner.run(-1, session_id="b")).output == "rejected -1"
    assert "w@1/notify@1" not in paths(store, "a")
    assert of_type(store.read("a"), "node_completed")[0].route == "ok"


async def test_parallel_fan_out_runs_concurrently_and_join_collects_by_name(store):
    started = []
    gate = asyncio.Event()

    async def branch(ctx, x):
        started.append(ctx.node_name)
        if len(started) == 2:
            gate.set()
        await asyncio.wait_for(gate.wait(), 2)  # would deadlock if branches ran one after the other
        return f"{ctx.node_name}:{x}"

    a, b = Node(branch, name="a"), Node(branch, name="b")
    join = JoinNode("join")
    report = node(lambda d: sorted([k, v] for k, v in d.items()), name="report")
    wf = Workflow("w", edges=[(START, (a, b)), (a, join), (b, join), (join, report)])
    result = await Runner(wf, store=store).run(1, session_id="s")
    assert result.output == [["a", "a:1"], ["b", "b:1"]]
    # both NodeStarted of the step are appended together, before either body
    types = [(e.type, e.path) for e in store.read("s")]
    assert types.index(("node_started", "w@1/b@1")) < types.index(("node_completed", "w@1/a@1"))


async def test_join_after_a_route_fires_with_the_branches_that_ran(store):
    @node
    def pick(x):
        return Route("left", x)

    left = node(lambda x: "L", name="left")
    right = node(lambda x: "R", name="right")
    join = JoinNode("join")
    wf = Workflow("w", edges=[(START, pick, {"left": left, "right": right}), ((left, right), join)])
    assert (await Runner(wf, store=store).run(0, session_id="s")).output == {"left": "L"}


async def test_nested_workflow_paths_and_output(store):
    inner = Workflow(
        "inner", edges=[(START, node(lambda x: x + 1, name="a"), node(lambda x: x * 2, name="b"))]
    )
    outer = Workflow("outer", edges=[(START, inner, node(lambda x: x - 1, name="c"))])
    assert (await Runner(outer, store=store).run(1, session_id="s")).output == 3
    assert paths(store, "s") == [
        "outer@1",
        "outer@1/inner@1",
        "outer@1/inner@1/a@1",
        "outer@1/inner@1/b@1",
        "outer@1/c@1",
    ]
    kinds = {e.path: e.kind for e in of_type(store.read("s"), "node_started")}
    assert kinds["outer@1/inner@1"] == "workflow"


async def test_dynamic_children_get_paths_under_their_parent(store):
    child = node(lambda x: x * 2, name="child")

    @node
    async def fetch(ctx, x):
        first = await ctx.run_node(child, x)
        second = await ctx.run_node(child, first)
        return second

    wf = Workflow("w", edges=[(START, fetch)])
    assert (await Runner(wf, store=store).run(1, session_id="s")).output == 4
    assert paths(store, "s") == ["w@1", "w@1/fetch@1", "w@1/fetch@1/child@1", "w@1/fetch@1/child@2"]
    started = {e.path: e.parent_path for e in of_type(store.read("s"), "node_started")}
    assert started["w@1/fetch@1/child@2"] == "w@1/fetch@1"


async def test_a_dynamic_childs_completion_is_on_record_before_its_parent_gets_the_output(store):
    """R8: resume never re-runs a dynamic child that completed, so its completion is in the
    log by the time its parent can act on its output (and go on without another flush)."""
    child = node(lambda x: x * 2, name="child")
    seen = []

    @node
    async def parent(ctx, x):
        out = await ctx.run_node(child, x)
        seen.append([(e.type, e.path) for e in store.read("s") if e.type == "node_completed"])
        return out

    wf = Workflow("w", edges=[(START, parent)])
    assert (await Runner(wf, store=store).run(1, session_id="s")).output == 2
    assert seen == [[("node_completed", "w@1/parent@1/child@1")]]


async def test_loop_counts_passes_in_paths_and_stops_at_the_step_limit(store):
    @node
    def check(ctx, n):
        return Route("again" if n < 3 else "done", n)

    inc = node(lambda n: n + 1, name="inc")
    end = node(lambda n: f"n={n}", name="end")
    wf = Workflow("w", edges=[(START, check, {"again": inc, "done": end}), (inc, check)])
    assert (await Runner(wf, store=store).run(0, session_id="s")).output == "n=3"
    assert [p for p in paths(store, "s") if "check" in p] == [
        "w@1/check@1",
        "w@1/check@2",
        "w@1/check@3",
        "w@1/check@4",
    ]

    forever = Workflow("f", edges=[(START, check, {"again": inc, "done": end}), (inc, check)], max_steps=10)
    with pytest.raises(WorkflowError, match="max_steps"):
        await Runner(forever, store=store).run(-10_000, session_id="t")


async def test_paths_are_deterministic_across_runs(store):
    child = node(lambda x: x, name="child")

    @node
    async def spawn(ctx, x):
        return await asyncio.gather(*(ctx.run_node(child, i) for i in range(3)))

    a, b = node(lambda x: x, name="a"), node(lambda x: x, name="b")
    j = JoinNode("j")
    wf = Workflow("w", edges=[(START, (a, b, spawn)), ((a, b, spawn), j)])
    runner = Runner(wf, store=store)
    await runner.run(1, session_id="one")
    await runner.run(1, session_id="two")
    assert paths(store, "one") == paths(store, "two")
    assert "w@1/spawn@1/child@3" in paths(store, "one")


async def test_retry_with_backoff_then_success(store):
    calls = []

    @node(retry=RetryConfig(max_attempts=3, initial_delay=0.01, backoff_factor=2, jitter=0))
    def flaky(ctx, x):
        calls.append(ctx.attempt)
        if ctx.attempt < 3:
            raise ConnectionError("try again")
        return "ok"

    wf = Workflow("w", edges=[(START, flaky)])
    assert (await Runner(wf, store=store).run(None, session_id="s")).output == "ok"
    assert calls == [1, 2, 3]
    retries = of_type(store.read("s"), "node_retrying")
    assert [(r.attempt, r.error_type, r.delay_s) for r in retries] == [
        (1, "ConnectionError", 0.01),
        (2, "ConnectionError", 0.02),
    ]
    assert of_type(store.read("s"), "node_completed")[0].attempt_count == 3


def test_retry_delay_is_capped_and_jittered_down():
    cfg = RetryConfig(max_attempts=9, initial_delay=1, backoff_factor=10, max_delay=5, jitter=0.5)
    delays = [cfg.delay(4) for _ in range(50)]
    assert all(2.5 <= d <= 5 for d in delays) and len(set(delays)) > 1
    assert RetryConfig(initial_delay=1, backoff_factor=3, jitter=0).delay(3) == 9
    with pytest.raises(ValueError):
        RetryConfig(max_attempts=0)


@pytest.mark.parametrize(
    "given", ["ValueErrors", "ValueError", (ValueError,), ["TimeoutError", TimeoutError]]
)
def test_retry_exceptions_are_class_names_never_a_string_or_a_class(given):
    """A bare string would be matched by substring, a class never: both are refused."""
    with pytest.raises(TypeError, match="exception class names"):
        RetryConfig(max_attempts=3, exceptions=given)
    assert RetryConfig(exceptions=("ValueError",)).retries("ValueError")


async def test_retry_filter_by_exception_type_name(store):
    calls = []

    @node(retry=RetryConfig(max_attempts=5, initial_delay=0, exceptions=["ConnectionError"]))
    def picky(x):
        calls.append(1)
        raise KeyError("not retryable")

    with pytest.raises(KeyError):
        await Runner(Workflow("w", edges=[(START, picky)]), store=store).run(None, session_id="s")
    assert len(calls) == 1
    assert of_type(store.read("s"), "node_retrying") == []


async def test_timeout_applies_per_attempt(store):
    calls = []

    @node(timeout=0.05, retry=RetryConfig(max_attempts=2, initial_delay=0, exceptions=["NodeTimeoutError"]))
    async def slow_then_fast(ctx, x):
        calls.append(ctx.attempt)
        if ctx.attempt == 1:
            await asyncio.sleep(5)
        return "fast"

    assert (
        await Runner(Workflow("w", edges=[(START, slow_then_fast)]), store=store).run(None, session_id="s")
    ).output == "fast"
    assert calls == [1, 2]
    assert of_type(store.read("s"), "node_retrying")[0].error_code == "NODE_TIMEOUT"


async def test_an_async_body_that_holds_the_loop_past_its_timeout_is_said_and_its_result_counts(
    store, caplog
):
    import time

    @node(timeout=0.02)
    async def blocks(ctx, x):
        time.sleep(0.06)  # no await: nothing can cancel it
        return "late"

    @node(timeout=5)
    async def in_time(ctx, x):
        await asyncio.sleep(0)
        return x

    caplog.set_level("WARNING", logger="flowscope.engine")
    result = await Runner(Workflow("w", edges=[(START, blocks, in_time)]), store=store).run(
        None, session_id="s"
    )
    assert result.output == "late"  # it ended on its own: a result, not a timeout
    [said] = [r.getMessage() for r in caplog.records if "past its timeout" in r.getMessage()]
    assert said.startswith("node blocks (w@1/blocks@1) ended ") and "timeout of 0.02s" in said
    assert "in_time" not in caplog.text


async def test_user_timeout_error_is_not_a_node_timeout(store):
    @node(timeout=10)
    def raises_timeout(x):
        raise TimeoutError("upstream")

    with pytest.raises(TimeoutError) as info:
        await Runner(Workflow("w", edges=[(START, raises_timeout)]), store=store).run(None, session_id="s")
    assert not isinstance(info.value, NodeTimeoutError)
    (err,) = of_type(store.read("s"), "node_error")
    assert err.error_type == "TimeoutError" and err.error_code == "UNKNOWN_ERROR"


async def test_abort_cancels_runs_and_raises_invocation_aborted(store):
    started = asyncio.Event()

    @node
    async def long(x):
        started.set()
        await asyncio.sleep(10)

    runner = Runner(Workflow("w", edges=[(START, long)]), store=store)
    task = asyncio.ensure_future(runner.run(None, session_id="s"))
    await started.wait()
    assert runner.abort("s") is True
    with pytest.raises(InvocationAbortedError):
        await task
    events = store.read("s")
    assert of_type(events, "node_error") == []
    assert {(e.path, e.reason) for e in of_type(events, "node_cancelled")} == {
        ("w@1", "aborted"),
        ("w@1/long@1", "aborted"),
    }
    assert events[-1].type == "run_finished" and events[-1].status == "cancelled"
    assert runner.abort("s") is False


async def test_node_raising_invocation_aborted_aborts_the_run(store):
    @node
    def stop(x):
        raise InvocationAbortedError("operator said stop")

    with pytest.raises(InvocationAbortedError):
        await Runner(Workflow("w", edges=[(START, stop)]), store=store).run(None, session_id="s")
    events = store.read("s")
    assert of_type(events, "node_error") == []
    assert events[-1].status == "cancelled"


async def test_cancelling_the_callers_task_cancels_the_run(store):
    started = asyncio.Event()

    @node
    async def long(x):
        started.set()
        await asyncio.sleep(10)

    task = asyncio.ensure_future(
        Runner(Workflow("w", edges=[(START, long)]), store=store).run(None, session_id="s")
    )
    await started.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    events = store.read("s")
    assert of_type(events, "node_error") == []
    assert len(of_type(events, "node_cancelled")) == 2
    assert events[-1].status == "cancelled"


async def test_request_input_pauses_and_resume_returns_the_value(store):
    seen = []

    @node
    async def approve(ctx, order):
        answer = await ctx.request_input("approve?", payload={"order": order}, interrupt_id="approval")
        seen.append(answer)
        return {"order": order, "approved": answer}

    runner = Runner(Workflow("w", edges=[(START, approve)]), store=store)
    paused = await runner.run(7, session_id="s")
    assert paused.status == "paused" and paused.output is None
    (req,) = paused.pending
    assert (req.type, req.interrupt_id, req.payload) == ("input_requested", "approval", {"order": 7})
    done = await runner.resume("s", inputs={"approval": True})
    assert done.status == "completed" and done.output == {"order": 7, "approved": True}
    assert seen == [True]
    received = of_type(store.read("s"), "input_received")
    assert [(r.interrupt_id, r.value, r.path) for r in received] == [("approval", True, "w@1/approve@1")]


async def test_two_requests_in_one_node_pause_twice(store):
    @node
    async def two(ctx, x):
        a = await ctx.request_input("first?")
        b = await ctx.request_input("second?")
        return [a, b]

    runner = Runner(Workflow("w", edges=[(START, two)]), store=store)
    first = await runner.run(None, session_id="s")
    assert first.pending[0].interrupt_id == "w@1/two@1"
    second = await runner.resume("s", inputs={"w@1/two@1": 1})
    assert second.status == "paused" and second.pending[0].interrupt_id == "w@1/two@1#2"
    assert (await runner.resume("s", inputs={"w@1/two@1#2": 2})).output == [1, 2]


async def test_a_run_still_waiting_after_a_partial_answer_names_what_it_still_waits_on(store):
    """A resume that answers some of a session's requests pauses again; each run that still
    waits records the ids it waits on, as its first pause did: its own open request or job,
    or, for a container not re-entered, its descendants'."""

    ask1, ask2, ask3 = (asking(f"ask{i}", f"q{i}") for i in (1, 2, 3))

    jobs = []

    @node
    async def enrich(ctx, x):
        return await ctx.await_job(jobs.append, payload=x)

    j, end = JoinNode("j"), JoinNode("end")
    both = Workflow("both", edges=[(START, (ask1, ask2)), (ask1, j), (ask2, j)])
    other = Workflow("other", edges=[(START, ask3)])
    root = Workflow("root", edges=[(START, (both, other, enrich)), (both, end), (other, end), (enrich, end)])
    runner = Runner(root, store=store)
    first = await runner.run(0, session_id="s")
    (job,) = jobs
    assert sorted(getattr(p, "interrupt_id", None) or p.job_id for p in first.pending) == sorted(
        ["q1", "q2", "q3", job.job_id]
    )
    second = await runner.resume("s", inputs={"q1": 1})
    assert second.status == "paused"
    events = store.read("s")
    paused = {
        e.path: set(e.interrupt_ids)
        for e in of_type(events, "node_paused")
        if e.invocation_id == second.invocation_id
    }
    assert paused == {
        "root@1/both@1": {"q2"},  # re-entered: ask2 keeps waiting
        "root@1": {"q2", "q3", job.job_id},  # other@1 (not re-entered) and enrich@1 keep waiting too
    }


async def test_context_identity_state_and_idempotency_key(store):
    keys = []

    @node
    async def a(ctx, x):
        keys.append(ctx.idempotency_key)
        ctx.state["seen"] = ctx.state.get("seen", 0) + 1
        if ctx.attempt == 1:
            await ctx.request_input("go?")
        return ctx.state["seen"]

    runner = Runner(Workflow("w", edges=[(START, a)]), store=store)
    await runner.run(None, session_id="s")
    result = await runner.resume("s", inputs={"w@1/a@1": "go"})
    assert len(set(keys)) == 1 and len(keys[0]) == 32
    assert result.output == 2  # ctx.state survived the pause through the log
    updates = of_type(store.read("s"), "state_updated")
    assert [u.values for u in updates] == [{"seen": 1}, {"seen": 2}]


async def test_run_refuses_an_existing_session(store):
    wf = Workflow("w", edges=[(START, node(lambda x: x, name="a"))])
    runner = Runner(wf, store=store)
    await runner.run(1, session_id="s")
    with pytest.raises(WorkflowError, match="already exists"):
        await runner.run(1, session_id="s")


def test_run_sync_and_resume_sync(store):
    @node
    async def ask(ctx, x):
        return await ctx.request_input("?")

    runner = Runner(Workflow("w", edges=[(START, ask)]), store=store)
    assert runner.run_sync(None, session_id="s").status == "paused"
    assert runner.resume_sync("s", inputs={"w@1/ask@1": 42}).output == 42


def test_graph_validation_errors():
    a = node(lambda x: x, name="a")
    with pytest.raises(WorkflowError, match="no edge from START"):
        Workflow("w", edges=[(a, node(lambda x: x, name="b"))])
    with pytest.raises(WorkflowError, match="two different nodes"):
        Workflow("w", edges=[(START, a, node(lambda x: x, name="a"))])
    with pytest.raises(WorkflowError, match="not a node"):
        Workflow("w", edges=[(START, lambda x: x)])
    with pytest.raises(ValueError):
        Node(lambda x: x, name="bad/name")


# ------------------------------------------------------------------ counting once, at the deepest path


async def test_a_crash_inside_a_nested_workflow_is_one_recovery_of_the_run_it_cut_off():
    """A dead process left ``outer > inner > leaf`` running: the resume recovers ``leaf``
    (one recovery, in ``RunStarted``/``RunFinished`` and the fold); ``outer`` and ``inner``
    are re-entered containers of it, not recoveries of their own (docs/design.md)."""
    from flowscope.cli.views import audit_rows
    from flowscope.events import NodeCompleted, RunFinished, RunStarted
    from flowscope.events import NodeStarted as Started
    from flowscope.store import MemoryEventStore

    @node
    def first(x):
        return x

    @node
    def leaf(x):
        return x + 1

    inner = Workflow("inner", edges=[(START, leaf)])
    outer = Workflow("outer", edges=[(START, first, inner)])
    store = MemoryEventStore()
    sid, inv = "crashed", "dead-process"
    log = [RunStarted(session_id=sid, invocation_id=inv, ts=1.0, workflow="outer", input=1)]
    for path, name, kind, parent in (
        ("outer@1", "outer", "workflow", ""),
        ("outer@1/first@1", "first", "function", "outer@1"),
    ):
        log.append(
            Started(
                session_id=sid,
                invocation_id=inv,
                ts=1.0,
                path=path,
                node=name,
                attempt=1,
                kind=kind,
                parent_path=parent,
            )
        )
    log.append(
        NodeCompleted(
            session_id=sid,
            invocation_id=inv,
            ts=1.1,
            path="outer@1/first@1",
            node="first",
            output=1,
            has_output=True,
            attempt_count=1,
        )
    )
    for path, name, kind, parent in (
        ("outer@1/inner@1", "inner", "workflow", "outer@1"),
        ("outer@1/inner@1/leaf@1", "leaf", "function", "outer@1/inner@1"),
    ):
        log.append(
            Started(
                session_id=sid,
                invocation_id=inv,
                ts=1.2,
                path=path,
                node=name,
                attempt=1,
                kind=kind,
                parent_path=parent,
            )
        )
    store.append(sid, log, 0)

    result = await Runner(outer, store=store).resume(sid)
    assert result.status == "completed" and result.output == 2
    events = store.read(sid)[len(log) :]
    [started] = [e for e in events if isinstance(e, RunStarted)]
    [finished] = [e for e in events if isinstance(e, RunFinished)]
    assert (started.recovered, finished.recovered, result.recovered) == (1, 1, 1)
    assert {e.path: e.recovered for e in events if isinstance(e, Started)} == {
        "outer@1": False,
        "outer@1/inner@1": False,
        "outer@1/inner@1/leaf@1": True,
    }
    rows = audit_rows(store.node_runs(sid))
    assert {r["node"]: r["recoveries"] for r in rows} == {"outer": 0, "first": 0, "inner": 0, "leaf": 1}


async def test_a_retried_attempt_gets_its_input_as_it_came_not_as_the_failed_one_left_it():
    seen = []

    @node(retry=RetryConfig(max_attempts=2, initial_delay=0, jitter=0))
    def flaky(inp):
        seen.append(dict(inp))
        inp["n"] += 1
        if len(seen) == 1:
            raise RuntimeError("first attempt fails")
        return inp

    wf = Workflow("w", edges=[(START, node(lambda x: {"n": 0}, name="produce"), flaky)])
    result = await Runner(wf).run(0, session_id="s")
    assert seen == [{"n": 0}, {"n": 0}]  # as a resume after the failed attempt would give it
    assert result.output == {"n": 1}
