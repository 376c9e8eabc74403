"""A newcomer's mistakes fail at once, with what to do, and lose nothing: a retry or timeout
of the wrong kind is refused where the node is defined (not at its first failure, hiding
that failure); an input request with an id that is no text, or the same id twice in one
attempt (whose one answer would answer both), fails the node; a ``KeyboardInterrupt``
raised in a body ends the invocation cancelled, as Ctrl-C does, not failed."""

from __future__ import annotations

import math

import pytest

from flowscope import START, RetryConfig, Runner, Workflow, node
from flowscope.errors import RouteNotFoundError, WorkflowError
from flowscope.events import NodeCancelled, NodeErrorEvent, RunFinished
from flowscope.fold import rebuild
from flowscope.store import MemoryEventStore


def _fn(x):
    return x


@pytest.mark.parametrize(
    ("options", "error", "says"),
    [
        ({"retry": 3}, TypeError, r"retry=RetryConfig\(max_attempts=3\)"),
        ({"retry": {"max_attempts": 3}}, TypeError, "retry takes a RetryConfig"),
        ({"timeout": math.nan}, ValueError, "positive number of seconds"),
        ({"timeout": math.inf}, ValueError, "positive number of seconds"),
        ({"timeout": "10"}, ValueError, "positive number of seconds"),
        ({"timeout": True}, ValueError, "positive number of seconds"),
    ],
)
def test_a_retry_or_timeout_of_the_wrong_kind_is_refused_where_the_node_is_defined(options, error, says):
    with pytest.raises(error, match=says):
        node(**options)(_fn)


@pytest.mark.parametrize(
    ("options", "error", "says"),
    [
        ({"max_attempts": 2.5}, TypeError, "whole number"),
        ({"max_attempts": "3"}, TypeError, "whole number"),
        ({"initial_delay": -1}, ValueError, "initial_delay is a number of 0 or more"),
        ({"max_delay": math.nan}, ValueError, "max_delay"),
        ({"backoff_factor": "2"}, ValueError, "backoff_factor"),
    ],
)
def test_a_retry_config_of_the_wrong_numbers_is_refused_when_made(options, error, says):
    with pytest.raises(error, match=says):
        RetryConfig(**options)


async def test_the_same_interrupt_id_twice_in_one_attempt_fails_the_node_before_asking():
    @node
    async def twice(ctx, x):
        first = await ctx.request_input("first?", interrupt_id="same")
        second = await ctx.request_input("second?", interrupt_id="same")
        return [first, second]

    store = MemoryEventStore()
    runner = Runner(Workflow("w", edges=[(START, twice)]), store=store)
    paused = await runner.run(None, session_id="s")
    assert [p.interrupt_id for p in paused.pending] == ["same"]
    with pytest.raises(WorkflowError, match="asked for input 'same' twice in one attempt"):
        await runner.resume("s", inputs={"same": "A"})  # never ['A', 'A']: the second question unasked
    [error] = [e for e in store.read("s") if isinstance(e, NodeErrorEvent)]
    assert (error.path, error.error_code) == ("w@1/twice@1", "WORKFLOW_ERROR")


async def test_an_interrupt_id_that_is_no_text_fails_the_node_and_records_no_request():
    @node
    async def numbered(ctx, x):
        return await ctx.request_input("which?", interrupt_id=123)

    store = MemoryEventStore()
    with pytest.raises(TypeError, match="interrupt_id is a non-empty str"):
        await Runner(Workflow("w", edges=[(START, numbered)]), store=store).run(None, session_id="s")
    state = rebuild(store.read("s"))
    assert state.status == "failed" and state.pending == []


async def test_a_keyboard_interrupt_in_a_body_ends_the_invocation_cancelled_and_it_resumes():
    calls = {"n": 0}

    @node
    async def interrupted(ctx, x):
        calls["n"] += 1
        if calls["n"] == 1:
            raise KeyboardInterrupt
        return "done"

    store = MemoryEventStore()
    runner = Runner(Workflow("w", edges=[(START, interrupted)]), store=store)
    with pytest.raises(KeyboardInterrupt):
        await runner.run(None, session_id="s")
    log = store.read("s")
    [finished] = [e for e in log if isinstance(e, RunFinished)]
    assert (finished.status, finished.error_code, finished.final) == ("cancelled", None, False)
    assert [(e.path, e.reason) for e in log if isinstance(e, NodeCancelled)][0] == (
        "w@1/interrupted@1",
        "interrupted",
    )
    assert not [e for e in log if isinstance(e, NodeErrorEvent)]
    assert (await runner.resume("s")).output == "done"


async def test_a_node_whose_every_edge_is_labelled_and_that_returns_no_route_fails_with_the_labels():
    ran: list[str] = []

    @node
    def check(x):
        return "ok"  # meant Route("ok", ...)

    @node
    def ship(x):
        ran.append("ship")

    @node
    def review(x):
        ran.append("review")

    store = MemoryEventStore()
    wf = Workflow("orders", edges=[(START, check), (check, {"ok": ship, "review": review})])
    with pytest.raises(
        RouteNotFoundError, match=r"returned no Route.*'ok', 'review'.*return Route\(label, output\)"
    ):
        await Runner(wf, store=store).run(None, session_id="s")
    assert ran == []  # not a silent "completed" with no branch taken
    [error] = [e for e in store.read("s") if isinstance(e, NodeErrorEvent)]
    assert (error.path, error.error_code) == ("orders@1/check@1", "ROUTE_NOT_FOUND")


async def test_a_node_with_an_unlabelled_edge_besides_labelled_ones_may_return_a_plain_value():
    @node
    def check(x):
        return x

    @node
    def always(x):
        return "always"

    @node
    def only_ok(x):
        return "ok"

    wf = Workflow("orders", edges=[(START, check, always), (check, {"ok": only_ok})])
    assert (await Runner(wf, store=MemoryEventStore()).run(1)).output == "always"


def test_plugins_given_the_wrong_way_are_refused_with_how_to_pass_them():
    from prometheus_client import CollectorRegistry

    from flowscope.observability import MetricsPlugin

    wf = Workflow("w", edges=[(START, node(_fn))])
    for plugins, says in (
        (MetricsPlugin(registry=CollectorRegistry()), r"plugins=\[MetricsPlugin\(\)\]"),
        ([MetricsPlugin], r"MetricsPlugin\(\), not the class"),
        (["metrics"], "is no plugin"),
        ("metrics", "list of plugin instances"),
    ):
        with pytest.raises(TypeError, match=says):
            Runner(wf, store=MemoryEventStore(), plugins=plugins)

    class Counting:  # no Plugin subclass: the hooks it defines are called
        def __init__(self) -> None:
            self.runs = 0

        def after_run(self, run, result, error):
            self.runs += 1

    counting = Counting()
    Runner(wf, store=MemoryEventStore(), plugins=[counting]).run_sync(1)
    assert counting.runs == 1


def test_a_node_given_to_a_runner_is_refused_with_how_to_wrap_it():
    with pytest.raises(TypeError, match=r"Workflow\('_fn', edges=\[\(START, _fn\)\]\)"):
        Runner(node(_fn), store=MemoryEventStore())


async def test_a_pause_in_the_default_in_memory_store_says_once_that_it_lives_only_here(caplog):
    @node
    async def ask(ctx, x):
        return await ctx.request_input("go?", interrupt_id=f"go-{x}")

    runner = Runner(Workflow("w", edges=[(START, ask)]))  # no store: in memory
    await runner.run(1, session_id="a")
    await runner.run(2, session_id="b")
    said = [r.getMessage() for r in caplog.records if "in-memory store" in r.getMessage()]
    assert len(said) == 1 and "session a paused" in said[0] and "SqliteEventStore" in said[0]
    caplog.clear()
    await Runner(Workflow("w", edges=[(START, ask)]), store=MemoryEventStore()).run(1, session_id="c")
    assert not [r for r in caplog.records if "in-memory store" in r.getMessage()]  # chosen: no word


def test_a_node_function_the_engine_cannot_call_is_refused_where_it_is_defined():
    def three(ctx, a, b):
        return a

    def keyword(ctx, *, x):
        return x

    class Shop:
        def charge(self, ctx, order):
            return order

    for fn in (three, keyword, Shop.charge):
        with pytest.raises(
            TypeError, match=r"a node's function takes \(ctx, input\), \(input\), \(ctx\) or nothing"
        ):
            node(fn)
    assert node(Shop().charge).name == "charge"  # the bound method takes (ctx, order)


def test_runner_and_workflow_options_of_the_wrong_kind_are_refused_when_made():
    wf = Workflow("w", edges=[(START, node(_fn))])
    with pytest.raises(TypeError, match=r"error_codes maps exception classes to codes"):
        Runner(wf, store=MemoryEventStore(), error_codes={"TimeoutError": "SLOW"})
    with pytest.raises(ValueError, match="which is no error code"):
        Runner(wf, store=MemoryEventStore(), error_codes={TimeoutError: "slow upstream"})
    with pytest.raises(ValueError, match="max_recoveries is 0 or more"):
        Runner(wf, store=MemoryEventStore(), max_recoveries=-1)
    with pytest.raises(ValueError, match="max_steps is a whole number of 1 or more"):
        Workflow("w", edges=[(START, node(_fn))], max_steps=0)


async def test_await_job_with_no_function_to_start_the_job_fails_the_node_and_asks_nobody():
    @node
    async def enrich(ctx, x):
        return await ctx.await_job("https://jobs.example/start", payload=x)

    store = MemoryEventStore()
    with pytest.raises(TypeError, match="dispatch is a function of the job"):
        await Runner(Workflow("w", edges=[(START, enrich)]), store=store).run(1, session_id="s")
    state = rebuild(store.read("s"))
    assert state.status == "failed" and state.pending == []  # no retry-or-abort question for it


async def test_a_job_deadline_of_zero_is_overdue_at_once_and_a_negative_one_is_refused():
    @node
    async def enrich(ctx, x):
        return await ctx.await_job(lambda job: None, payload=x, deadline_s=x)

    store = MemoryEventStore()
    paused = await Runner(Workflow("w", edges=[(START, enrich)]), store=store).run(0, session_id="due")
    assert paused.status == "paused"  # its deadline is its dispatch: overdue at once
    with pytest.raises(ValueError, match="deadline_s is a number of seconds, 0 or more"):
        await Runner(Workflow("w", edges=[(START, enrich)]), store=store).run(-5, session_id="neg")


async def test_a_node_that_returns_a_call_it_forgot_to_await_fails_saying_the_await_is_missing(recwarn):
    from flowscope.errors import OutputNotSerializableError

    @node
    async def forgot(ctx, x):
        return ctx.request_input("ok?", interrupt_id="ok")  # no await: a coroutine, never run

    store = MemoryEventStore()
    with pytest.raises(OutputNotSerializableError, match="is a coroutine, not a value: an await is missing"):
        await Runner(Workflow("w", edges=[(START, forgot)]), store=store).run(None, session_id="s")
    [error] = [e for e in store.read("s") if isinstance(e, NodeErrorEvent)]
    assert (error.path, error.error_code) == ("w@1/forgot@1", "OUTPUT_NOT_SERIALIZABLE")
    assert "await is missing" in error.error_message
    assert rebuild(store.read("s")).pending == []  # nothing asked: the question was never put
    import gc

    gc.collect()
    assert not [w for w in recwarn if "never awaited" in str(w.message)]  # said once, in the error


def test_a_node_no_edge_from_start_leads_to_is_refused_where_the_workflow_is_defined():
    @node
    async def a(ctx, x):
        return x

    @node
    async def b(ctx, x):
        return x

    @node
    async def c(ctx, x):
        return x

    with pytest.raises(WorkflowError, match=r"workflow 'w': no edge from START leads to 'b', 'c'; link it"):
        Workflow("w", edges=[(START, a), (b, c)])  # (a, b) forgotten: b and c could never run
    with pytest.raises(WorkflowError, match="no edge from START leads to 'b', 'c'"):
        Workflow("w", edges=[(START, a), (b, c, b)])  # a loop of its own, entered from nowhere
    loop = Workflow("w", edges=[(START, a, {"again": b, "done": c}), (b, a)])  # reached through a route
    assert set(loop.nodes) == {"a", "b", "c"}
