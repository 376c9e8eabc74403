"""TracingPlugin (docs/design.md, "Spans").

Every test builds a FRESH SDK TracerProvider with an InMemorySpanExporter behind a
SimpleSpanProcessor and hands it to the plugin: the global provider is never touched.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode

from conftest import of_type
from flowscope import START, JoinNode, Plugin, RetryConfig, Route, Runner, Workflow, node
from flowscope.errors import redact_message
from flowscope.observability import TracingPlugin

SRC = Path(__file__).resolve().parents[2] / "src"


class Tracing:
    """A fresh provider + in-memory exporter, and helpers to look at what was exported."""

    def __init__(self) -> None:
        self.exporter = InMemorySpanExporter()
        self.provider = TracerProvider()
        self.provider.add_span_processor(SimpleSpanProcessor(self.exporter))

    def plugin(self, **kwargs) -> TracingPlugin:
        return TracingPlugin(tracer_provider=self.provider, **kwargs)

    @property
    def spans(self):
        return list(self.exporter.get_finished_spans())

    def node(self, path):
        (span,) = [s for s in self.spans if s.attributes.get("flowscope.node.path") == path]
        return span

    def nodes(self):
        return {
            s.attributes["flowscope.node.path"]: s
            for s in self.spans
            if "flowscope.node.path" in s.attributes
        }

    def invocations(self):
        return [s for s in self.spans if "flowscope.invocation.id" in s.attributes]

    def invocation(self):
        (span,) = self.invocations()
        return span


@pytest.fixture
def tracing():
    t = Tracing()
    yield t
    t.provider.shutdown()


def parent_id(span):
    return span.parent.span_id if span.parent is not None else None


def traceparent_of(span):
    c = span.context
    return f"00-{c.trace_id:032x}-{c.span_id:016x}-{c.trace_flags:02x}"


# -- names, attributes, nesting -------------------------------------------------------------------------------------------


async def test_invocation_and_node_spans_names_and_attributes(store, tracing):
    wf = Workflow(
        "orders", edges=[(START, node(lambda x: x + 1, name="fetch"), node(lambda x: x * 2, name="check"))]
    )
    result = await Runner(wf, store=store, plugins=[tracing.plugin()]).run(1, session_id="sess-1")
    assert result.output == 4

    inv = tracing.invocation()
    assert inv.name == "invoke_workflow orders"
    assert inv.kind.name == "INTERNAL"
    # One span for the invocation and its top workflow's run, with both sets of attributes
    # (no identical child span for the root run under the invocation span).
    assert dict(inv.attributes) == {
        "gen_ai.operation.name": "invoke_workflow",
        "gen_ai.workflow.name": "orders",
        "gen_ai.conversation.id": "sess-1",
        "flowscope.invocation.id": result.invocation_id,
        "flowscope.run.resumed": False,
        "flowscope.run.outcome": "completed",
        "flowscope.node.name": "orders",
        "flowscope.node.path": "orders@1",
        "flowscope.node.kind": "workflow",
        "flowscope.node.outcome": "success",
        "flowscope.node.attempt_count": 1,
        "flowscope.node.completed": True,
        "flowscope.node.has_output": True,
        "flowscope.node.recovered": False,
    }
    assert inv.status.status_code is StatusCode.UNSET
    assert inv.parent is None
    assert len(tracing.spans) == 3

    nodes = tracing.nodes()
    assert set(nodes) == {"orders@1", "orders@1/fetch@1", "orders@1/check@1"}
    root = nodes["orders@1"]
    assert root is inv
    fetch = nodes["orders@1/fetch@1"]
    assert fetch.name == "invoke_node fetch"
    assert dict(fetch.attributes) == {
        "gen_ai.operation.name": "invoke_node",
        "gen_ai.conversation.id": "sess-1",
        "flowscope.node.name": "fetch",
        "flowscope.node.path": "orders@1/fetch@1",
        "flowscope.node.kind": "function",
        "flowscope.node.outcome": "success",
        "flowscope.node.attempt_count": 1,
        "flowscope.node.completed": True,
        "flowscope.node.has_output": True,
        "flowscope.node.recovered": False,
    }
    assert root.attributes["flowscope.node.kind"] == "workflow"
    for span in nodes.values():
        assert span.context.trace_id == inv.context.trace_id
        assert span.status.status_code is StatusCode.UNSET
        assert span.kind.name == "INTERNAL"
    # a chain: both nodes are children of the workflow run, one after the other
    assert parent_id(fetch) == parent_id(nodes["orders@1/check@1"]) == root.context.span_id
    assert fetch.end_time <= nodes["orders@1/check@1"].start_time
    # the invocation span brackets everything
    assert inv.start_time <= root.start_time and root.end_time <= inv.end_time
    # its context is stored on RunStarted, so a resume can link to it
    (started,) = of_type(store.read("sess-1"), "run_started")
    assert started.trace_context["traceparent"] == traceparent_of(inv)


async def test_nested_workflows_dynamic_children_and_parallel_siblings_nest_by_path(store, tracing):
    leaf = node(lambda x: x, name="leaf")
    deep = Workflow("deep", edges=[(START, leaf)])
    inner = Workflow("inner", edges=[(START, node(lambda x: x, name="pre"), deep)])

    @node
    async def dyn(ctx, x):
        a = await ctx.run_node(node(lambda y: [y], name="child"), x)
        return await ctx.run_node(node(lambda y: [y], name="child"), a)

    a = node(lambda x: x, name="a")
    b = node(lambda x: x, name="b")
    join = JoinNode("join")
    wf = Workflow(
        "w",
        edges=[
            (START, node(lambda x: x, name="src"), (a, b)),
            (a, join),
            (b, join),
            (join, inner),
            (inner, dyn),
        ],
    )
    await Runner(wf, store=store, plugins=[tracing.plugin()]).run(1, session_id="s")
    n = tracing.nodes()
    sid = {p: s.context.span_id for p, s in n.items()}
    expected_parent = {
        "w@1": None,  # the top workflow's run is the invocation's span
        "w@1/src@1": sid["w@1"],
        "w@1/a@1": sid["w@1"],  # parallel branches are siblings
        "w@1/b@1": sid["w@1"],
        "w@1/join@1": sid["w@1"],
        "w@1/inner@1": sid["w@1"],
        "w@1/inner@1/pre@1": sid["w@1/inner@1"],
        "w@1/inner@1/deep@1": sid["w@1/inner@1"],
        "w@1/inner@1/deep@1/leaf@1": sid["w@1/inner@1/deep@1"],
        "w@1/dyn@1": sid["w@1"],
        "w@1/dyn@1/child@1": sid["w@1/dyn@1"],  # dynamic children sit under their parent
        "w@1/dyn@1/child@2": sid["w@1/dyn@1"],
    }
    assert {p: parent_id(s) for p, s in n.items()} == expected_parent
    assert n["w@1/inner@1"].name == "invoke_workflow inner"
    assert n["w@1/inner@1/deep@1"].name == "invoke_workflow deep"
    assert n["w@1/join@1"].name == "invoke_node join"
    assert n["w@1/join@1"].attributes["flowscope.node.kind"] == "join"
    assert n["w@1/dyn@1/child@2"].name == "invoke_node child"
    for child, parent in (
        ("w@1/dyn@1/child@1", "w@1/dyn@1"),
        ("w@1/inner@1/deep@1/leaf@1", "w@1/inner@1/deep@1"),
    ):
        assert n[parent].start_time <= n[child].start_time <= n[child].end_time <= n[parent].end_time


async def test_concurrent_invocations_on_one_plugin_keep_their_own_trees(store, tracing):
    @node
    async def step(x):
        await asyncio.sleep(0.01)
        return x

    plugin = tracing.plugin()
    runner = Runner(
        Workflow("w", edges=[(START, step, node(lambda x: x, name="after"))]), store=store, plugins=[plugin]
    )
    r1, r2 = await asyncio.gather(runner.run(1, session_id="one"), runner.run(2, session_id="two"))
    invs = {s.attributes["gen_ai.conversation.id"]: s for s in tracing.invocations()}
    assert set(invs) == {"one", "two"}
    assert invs["one"].context.trace_id != invs["two"].context.trace_id
    for inv in invs.values():
        tree = [s for s in tracing.spans if s.context.trace_id == inv.context.trace_id]
        assert sorted(s.attributes.get("flowscope.node.path", "") for s in tree) == [
            "w@1",
            "w@1/after@1",
            "w@1/step@1",
        ]


# -- retries -----------------------------------------------------------------------------------------------------------------


async def test_retried_node_has_one_span_with_a_retry_event_per_failed_attempt(store, tracing):
    calls = []

    @node(retry=RetryConfig(max_attempts=3, initial_delay=0.001))
    def flaky(x):
        calls.append(x)
        if len(calls) < 3:
            raise ConnectionError(f"refused #{len(calls)}")
        return "ok"

    await Runner(Workflow("w", edges=[(START, flaky)]), store=store, plugins=[tracing.plugin()]).run(
        1, session_id="s"
    )
    spans = [s for s in tracing.spans if s.name == "invoke_node flaky"]
    assert len(spans) == 1
    span = spans[0]
    assert span.attributes["flowscope.node.attempt_count"] == 3
    assert span.attributes["flowscope.node.outcome"] == "success"
    assert span.status.status_code is StatusCode.UNSET
    retries = [e for e in span.events if e.name == "node.retry"]
    assert len(retries) == 2 and len(span.events) == 2
    delays = [e.delay_s for e in of_type(store.read("s"), "node_retrying")]
    for i, ev in enumerate(retries, start=1):
        assert dict(ev.attributes) == {
            "flowscope.node.attempt": i,
            "error.type": "ConnectionError",
            "flowscope.error.code": "UNKNOWN_ERROR",
            "flowscope.error.message": f"refused #{i}",
            "flowscope.retry.delay_s": delays[i - 1],
        }
        assert span.start_time <= ev.timestamp <= span.end_time


async def test_exhausted_retries_end_with_one_exception_event_and_the_attempt_count(store, tracing):
    @node(retry=RetryConfig(max_attempts=3, initial_delay=0.001))
    def always(x):
        raise ConnectionError("down")

    with pytest.raises(ConnectionError):
        await Runner(Workflow("w", edges=[(START, always)]), store=store, plugins=[tracing.plugin()]).run(
            1, session_id="s"
        )
    span = tracing.node("w@1/always@1")
    assert [e.name for e in span.events] == ["node.retry", "node.retry", "exception"]
    assert span.attributes["flowscope.node.attempt_count"] == 3
    assert span.attributes["flowscope.node.outcome"] == "failure"


# -- failures, cancellation -----------------------------------------------------------------------------------------------


async def test_failure_marks_the_failing_span_enclosing_spans_and_cancelled_siblings(store, tracing):
    @node
    async def slow(x):
        await asyncio.sleep(30)

    @node
    async def bad(x):
        await asyncio.sleep(0.01)
        raise ValueError("the ledger does not balance")

    inner = Workflow("inner", edges=[(START, node(lambda x: x, name="src"), (slow, bad))])
    wf = Workflow("outer", edges=[(START, inner)])
    with pytest.raises(ValueError):
        await Runner(wf, store=store, plugins=[tracing.plugin()]).run(1, session_id="s")

    failing = tracing.node("outer@1/inner@1/bad@1")
    assert failing.status.status_code is StatusCode.ERROR
    assert failing.status.description == "the ledger does not balance"
    assert failing.attributes["error.type"] == "ValueError"
    assert failing.attributes["flowscope.error.code"] == "UNKNOWN_ERROR"
    assert failing.attributes["flowscope.node.outcome"] == "failure"
    assert failing.attributes["flowscope.node.completed"] is False
    assert failing.attributes["flowscope.node.has_output"] is False
    assert "flowscope.error.origin_path" not in failing.attributes
    (exc,) = failing.events
    assert exc.name == "exception"
    assert dict(exc.attributes) == {
        "exception.type": "ValueError",
        "exception.message": "the ledger does not balance",
    }

    for path in ("outer@1/inner@1", "outer@1"):
        span = tracing.node(path)
        assert span.status.status_code is StatusCode.ERROR
        assert span.attributes["error.type"] == "ValueError"
        assert span.attributes["flowscope.error.code"] == "UNKNOWN_ERROR"
        assert span.attributes["flowscope.error.origin_path"] == "outer@1/inner@1/bad@1"
        assert span.attributes["flowscope.node.outcome"] == "failure"
        assert span.events == ()  # no second exception event

    sibling = tracing.node("outer@1/inner@1/slow@1")
    assert sibling.status.status_code is StatusCode.UNSET
    assert sibling.attributes["flowscope.node.outcome"] == "cancellation"
    assert sibling.attributes["flowscope.node.completed"] is False
    assert "error.type" not in sibling.attributes and sibling.events == ()

    inv = tracing.invocation()
    assert inv.status.status_code is StatusCode.ERROR
    assert inv.attributes["flowscope.run.outcome"] == "failed"
    assert inv.attributes["error.type"] == "ValueError"
    assert inv.attributes["flowscope.error.origin_path"] == "outer@1/inner@1/bad@1"
    assert inv.events == ()
    exception_events = [e for s in tracing.spans for e in s.events if e.name == "exception"]
    assert len(exception_events) == 1


async def test_error_code_attribute_and_user_mapping_reach_the_span(store, tracing):
    class Declined(Exception):
        error_code = "PAYMENT_DECLINED"

    @node
    def charge(x):
        raise Declined("card declined")

    with pytest.raises(Declined):
        await Runner(Workflow("w", edges=[(START, charge)]), store=store, plugins=[tracing.plugin()]).run(
            1, session_id="a"
        )
    assert tracing.node("w@1/charge@1").attributes["flowscope.error.code"] == "PAYMENT_DECLINED"
    assert tracing.node("w@1").attributes["flowscope.error.code"] == "PAYMENT_DECLINED"
    assert tracing.invocation().attributes["flowscope.error.code"] == "PAYMENT_DECLINED"

    tracing.exporter.clear()

    @node
    def call(x):
        raise TimeoutError("upstream slow")

    runner = Runner(
        Workflow("w", edges=[(START, call)]),
        store=store,
        plugins=[tracing.plugin()],
        error_codes={TimeoutError: "UPSTREAM_TIMEOUT"},
    )
    with pytest.raises(TimeoutError):
        await runner.run(1, session_id="b")
    assert tracing.node("w@1/call@1").attributes["flowscope.error.code"] == "UPSTREAM_TIMEOUT"
    assert tracing.invocation().attributes["flowscope.error.code"] == "UPSTREAM_TIMEOUT"


async def test_stack_trace_only_when_asked(store, tracing):
    def bad(x):
        raise KeyError("missing")

    wf = Workflow("w", edges=[(START, node(bad, name="bad"))])
    with pytest.raises(KeyError):
        await Runner(wf, store=store, plugins=[tracing.plugin(record_stacktrace=True)]).run(1, session_id="s")
    (exc,) = tracing.node("w@1/bad@1").events
    trace_text = exc.attributes["exception.stacktrace"]
    assert "Traceback" in trace_text and "KeyError" in trace_text and "in bad" in trace_text


async def test_a_stack_trace_carries_every_exception_text_as_the_runner_redacts_it(store, tracing):
    # "spans never see the raw exception text": the opt-in adds frames (files, code), not
    # the messages the runner masks, of the failure or of the exceptions it came from
    def bad(x):
        try:
            {}["k"]
        except KeyError as e:
            url, who = "postgres://bob:s3cret@db/app", "alice"  # not on the line a frame shows
            raise RuntimeError(f"login failed for {url} customer={who}") from e

    wf = Workflow("w", edges=[(START, node(bad, name="bad"))])
    hide_customer = lambda text: redact_message(text).replace("alice", "***")  # noqa: E731
    runner = Runner(wf, store=store, plugins=[tracing.plugin(record_stacktrace=True)], redact=hide_customer)
    with pytest.raises(RuntimeError):
        await runner.run(1, session_id="s")
    (exc,) = tracing.node("w@1/bad@1").events
    trace_text = exc.attributes["exception.stacktrace"]
    assert "s3cret" not in trace_text and "alice" not in trace_text
    last = trace_text.rstrip().splitlines()[-1]
    assert last == f"RuntimeError: {exc.attributes['exception.message']}"
    assert "KeyError: 'k'" in trace_text and "direct cause of the following exception" in trace_text
    assert f"{__file__}" in trace_text and ", in bad" in trace_text  # the frames, as asked for


async def test_genuine_timeout_is_an_error_span_with_outcome_timeout(store, tracing):
    @node(timeout=0.02)
    async def hang(x):
        await asyncio.sleep(5)

    from flowscope.errors import NodeTimeoutError

    with pytest.raises(NodeTimeoutError):
        await Runner(Workflow("w", edges=[(START, hang)]), store=store, plugins=[tracing.plugin()]).run(
            1, session_id="s"
        )
    span = tracing.node("w@1/hang@1")
    assert span.attributes["flowscope.node.outcome"] == "timeout"
    assert span.attributes["error.type"] == "flowscope.errors.NodeTimeoutError"
    assert span.attributes["flowscope.error.code"] == "NODE_TIMEOUT"
    assert span.status.status_code is StatusCode.ERROR
    assert tracing.node("w@1").attributes["flowscope.node.outcome"] == "timeout"


async def test_aborted_invocation_is_cancelled_not_failed(store, tracing):
    started = asyncio.Event()

    @node
    async def long(x):
        started.set()
        await asyncio.sleep(30)

    runner = Runner(Workflow("w", edges=[(START, long)]), store=store, plugins=[tracing.plugin()])
    task = asyncio.ensure_future(runner.run(1, session_id="s"))
    await started.wait()
    assert runner.abort("s")
    with pytest.raises(BaseException):
        await task
    inv = tracing.invocation()
    assert inv.attributes["flowscope.run.outcome"] == "cancelled"
    assert inv.status.status_code is StatusCode.UNSET
    for path in ("w@1", "w@1/long@1"):
        span = tracing.node(path)
        assert span.attributes["flowscope.node.outcome"] == "cancellation"
        assert span.status.status_code is StatusCode.UNSET
        assert span.events == ()


# -- pauses, completion marker, jobs ---------------------------------------------------------------------------------------


async def test_paused_node_ends_waiting_with_its_interrupt_id(store, tracing):
    @node
    async def approve(ctx, x):
        return await ctx.request_input("ship it?", interrupt_id="approval-7")

    @node
    async def review(ctx, x):
        return await ctx.request_input("looks right?")  # default interrupt id: the path

    wf = Workflow("w", edges=[(START, node(lambda x: x, name="src"), (approve, review))])
    result = await Runner(wf, store=store, plugins=[tracing.plugin()]).run(1, session_id="s")
    assert result.status == "paused"
    span = tracing.node("w@1/approve@1")
    assert span.attributes["flowscope.node.outcome"] == "waiting"
    assert span.attributes["flowscope.interrupt.id"] == "approval-7"
    assert span.attributes["flowscope.node.completed"] is False
    assert span.status.status_code is StatusCode.UNSET
    assert tracing.node("w@1/review@1").attributes["flowscope.interrupt.id"] == "w@1/review@1"
    root = tracing.node("w@1")  # the enclosing run waits because its children do
    assert root.attributes["flowscope.node.outcome"] == "waiting"
    assert root.attributes["flowscope.interrupt.id"] == "approval-7,w@1/review@1"
    inv = tracing.invocation()
    assert inv.attributes["flowscope.run.outcome"] == "paused"
    assert inv.status.status_code is StatusCode.UNSET


async def test_completion_marker_shows_as_completed_without_output(store, tracing):
    @node
    def side_effect(x):
        return None

    wf = Workflow("w", edges=[(START, side_effect)])
    await Runner(wf, store=store, plugins=[tracing.plugin()]).run(1, session_id="s")
    span = tracing.node("w@1/side_effect@1")
    assert span.attributes["flowscope.node.completed"] is True
    assert span.attributes["flowscope.node.has_output"] is False
    assert span.attributes["flowscope.node.outcome"] == "success"


async def test_user_spans_in_a_node_body_nest_under_the_node_span(store, tracing):
    user_tracer = tracing.provider.get_tracer("user-code")

    @node
    async def fetch(ctx, x):
        with user_tracer.start_as_current_span("http GET /orders"):
            await asyncio.sleep(0)
            with user_tracer.start_as_current_span("parse"):
                pass
        return x

    @node
    def sync_branch(x):
        with user_tracer.start_as_current_span("sync work"):
            return x

    @node
    async def async_branch(x):
        await asyncio.sleep(0.005)
        with user_tracer.start_as_current_span("async work"):
            return x

    @node
    async def dyn(ctx, x):
        await ctx.run_node(node(lambda y: y, name="child"), x)
        with user_tracer.start_as_current_span("after child"):
            return x

    join = JoinNode("join")
    wf = Workflow(
        "w",
        edges=[
            (START, fetch, (sync_branch, async_branch)),
            (sync_branch, join),
            (async_branch, join),
            (join, dyn),
        ],
    )
    await Runner(wf, store=store, plugins=[tracing.plugin()]).run(1, session_id="s")
    by_name = {s.name: s for s in tracing.spans}
    assert parent_id(by_name["http GET /orders"]) == tracing.node("w@1/fetch@1").context.span_id
    assert parent_id(by_name["parse"]) == by_name["http GET /orders"].context.span_id
    assert parent_id(by_name["sync work"]) == tracing.node("w@1/sync_branch@1").context.span_id
    assert parent_id(by_name["async work"]) == tracing.node("w@1/async_branch@1").context.span_id
    # after a dynamic child finished, the parent's span is current again
    assert parent_id(by_name["after child"]) == tracing.node("w@1/dyn@1").context.span_id
    # and nothing is left attached once the run is over
    from opentelemetry import trace

    assert not trace.get_current_span().get_span_context().is_valid


async def test_traceparent_handed_to_a_job_is_the_node_span(store, tracing):
    jobs = []

    @node
    async def enrich(ctx, rows):
        return await ctx.await_job(jobs.append, payload=rows)

    runner = Runner(Workflow("etl", edges=[(START, enrich)]), store=store, plugins=[tracing.plugin()])
    paused = await runner.run([1, 2], session_id="s")
    (job,) = jobs
    span = tracing.node("etl@1/enrich@1")
    assert job.traceparent == traceparent_of(span)
    (dispatched,) = of_type(store.read("s"), "job_dispatched")
    assert dispatched.trace_context["traceparent"] == traceparent_of(span)
    assert span.attributes["flowscope.node.outcome"] == "waiting"
    assert span.attributes["flowscope.interrupt.id"] == job.job_id == paused.pending[0].job_id
    assert tracing.node("etl@1").attributes["flowscope.interrupt.id"] == job.job_id


async def test_resume_in_process_links_to_the_paused_invocation(store, tracing):
    @node
    async def approve(ctx, x):
        return await ctx.request_input("ok?", interrupt_id="go")

    runner = Runner(
        Workflow("w", edges=[(START, node(lambda x: x, name="prep"), approve)]),
        store=store,
        plugins=[tracing.plugin()],
    )
    await runner.run(1, session_id="s")
    (first,) = tracing.invocations()
    tracing.exporter.clear()
    await runner.resume("s", inputs={"go": "yes"})
    (second,) = tracing.invocations()
    assert second.attributes["flowscope.run.resumed"] is True
    (link,) = second.links
    assert (link.context.trace_id, link.context.span_id) == (first.context.trace_id, first.context.span_id)
    # the fast-forwarded run has no span in the resumed invocation
    assert set(tracing.nodes()) == {"w@1", "w@1/approve@1"}


RESUME_SCRIPT = textwrap.dedent(
    """
    import json, sys
    sys.path.insert(0, sys.argv[1])
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
    from flowscope import START, RetryConfig, Runner, Workflow, node
    from flowscope.observability import TracingPlugin
    from flowscope.store import SqliteEventStore

    mode, db, out = sys.argv[2], sys.argv[3], sys.argv[4]

    @node(retry=RetryConfig(max_attempts=3, initial_delay=0.001))
    async def approve(ctx, x):
        if ctx.attempt == 1:
            raise ConnectionError("transient before the pause")
        answer = await ctx.request_input("approve?", interrupt_id="approval")
        if ctx.attempt == 2:
            raise ConnectionError("transient after the pause")
        return answer

    wf = Workflow("orders", edges=[(START, node(lambda x: x, name="prep"), approve, node(lambda x: x, name="ship"))])
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    runner = Runner(wf, store=SqliteEventStore(db), plugins=[TracingPlugin(tracer_provider=provider)])
    if mode == "run":
        result = runner.run_sync("order-1", session_id="s")
    else:
        result = runner.resume_sync("s", inputs={"approval": "yes"})
    provider.shutdown()

    def span_json(s):
        return {
            "name": s.name,
            "trace_id": s.context.trace_id,
            "span_id": s.context.span_id,
            "parent": s.parent.span_id if s.parent else None,
            "attributes": dict(s.attributes),
            "status": s.status.status_code.name,
            "events": [{"name": e.name, "attributes": dict(e.attributes)} for e in s.events],
            "links": [[l.context.trace_id, l.context.span_id] for l in s.links],
        }

    with open(out, "w") as f:
        json.dump({"status": result.status, "spans": [span_json(s) for s in exporter.get_finished_spans()]}, f)
    """
)


def run_process(tmp_path, mode):
    script = tmp_path / "proc.py"
    script.write_text(RESUME_SCRIPT)
    out = tmp_path / f"{mode}.json"
    proc = subprocess.run(
        [sys.executable, str(script), str(SRC), mode, str(tmp_path / "flowscope.db"), str(out)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    return json.loads(out.read_text())


@pytest.mark.slow
def test_resume_in_a_new_process_links_to_the_paused_invocation_and_attempts_continue(tmp_path):
    import flowscope.store.sqlite  # noqa: F401  (the resume below runs on it)

    first = run_process(tmp_path, "run")
    second = run_process(tmp_path, "resume")
    assert (first["status"], second["status"]) == ("paused", "completed")

    def by(doc):
        inv = [s for s in doc["spans"] if s["attributes"].get("gen_ai.operation.name") == "invoke_workflow"]
        nodes = {
            s["attributes"]["flowscope.node.path"]: s
            for s in doc["spans"]
            if "flowscope.node.path" in s["attributes"]
        }
        assert len(inv) == 1
        return inv[0], nodes

    inv1, nodes1 = by(first)
    inv2, nodes2 = by(second)
    assert inv1["attributes"]["flowscope.run.outcome"] == "paused"
    assert inv2["attributes"]["flowscope.run.resumed"] is True
    assert inv2["attributes"]["flowscope.run.outcome"] == "completed"
    assert inv2["links"] == [[inv1["trace_id"], inv1["span_id"]]]
    assert inv2["trace_id"] != inv1["trace_id"]  # a new trace, linked to the old one

    # first process: attempt 1 failed, attempt 2 paused
    a1 = nodes1["orders@1/approve@1"]
    assert a1["attributes"]["flowscope.node.outcome"] == "waiting"
    assert a1["attributes"]["flowscope.interrupt.id"] == "approval"
    assert a1["attributes"]["flowscope.node.attempt_count"] == 2
    assert [e["attributes"]["flowscope.node.attempt"] for e in a1["events"] if e["name"] == "node.retry"] == [
        1
    ]
    # new process: the same attempt 2 continues, fails, and attempt 3 completes
    a2 = nodes2["orders@1/approve@1"]
    assert a2["attributes"]["flowscope.node.outcome"] == "success"
    assert a2["attributes"]["flowscope.node.attempt_count"] == 3
    assert [e["attributes"]["flowscope.node.attempt"] for e in a2["events"] if e["name"] == "node.retry"] == [
        2
    ]
    # prep completed in the first process: fast-forwarded, no span in the second
    assert set(nodes1) == {"orders@1", "orders@1/prep@1", "orders@1/approve@1"}
    assert set(nodes2) == {"orders@1", "orders@1/approve@1", "orders@1/ship@1"}
    assert nodes2["orders@1"] == inv2  # one span for the invocation and its top workflow's run
    assert nodes2["orders@1/approve@1"]["parent"] == nodes2["orders@1"]["span_id"]


# -- input and output stay out of spans unless redaction opts in ------------------------------------------------------------

SECRET = "s3cr3t-4111-1111-1111-1111"


def secret_workflow():
    @node
    async def fetch(ctx, x):
        ctx.state["card"] = SECRET
        child = await ctx.run_node(node(lambda y: {"echo": y}, name="child"), x)
        return {"card": x, "child": child}

    @node
    def route(x):
        return Route("ok", output=[SECRET, x])

    @node
    async def ask(ctx, x):
        return await ctx.request_input(f"confirm {SECRET}?", payload={"card": SECRET}, interrupt_id="confirm")

    inner = Workflow("inner", edges=[(START, route, {"ok": ask})])
    return Workflow("w", edges=[(START, fetch, inner)])


def all_attribute_values(spans):
    for s in spans:
        yield from s.attributes.values()
        for e in s.events:
            yield from e.attributes.values()
        for link in s.links:
            yield from (link.attributes or {}).values()
        yield s.status.description or ""
        yield s.name


async def test_no_node_input_or_output_in_any_attribute(store, tracing):
    runner = Runner(secret_workflow(), store=store, plugins=[tracing.plugin()])
    await runner.run(SECRET, session_id="s")
    await runner.resume("s", inputs={"confirm": SECRET})
    spans = tracing.spans
    assert len(spans) > 8
    values = [repr(v) for v in all_attribute_values(spans)]
    assert values and not [v for v in values if SECRET in v]
    assert not [
        s for s in spans if any(k in s.attributes for k in ("flowscope.node.input", "flowscope.node.output"))
    ]


async def test_redaction_hook_opts_in(store, tracing):
    seen = []

    def redact(kind, value):
        seen.append(kind)
        text = json.dumps(value)
        if "fetch-only" in text:
            raise RuntimeError("broken redactor")  # records nothing, breaks nothing
        return None if value is None else text.replace(SECRET, "****")

    @node
    def fetch(x):
        return {"card": x, "note": "fetch-only"}

    @node
    def mark(x):
        return None

    wf = Workflow("w", edges=[(START, fetch, mark)])
    await Runner(wf, store=store, plugins=[tracing.plugin(redact=redact)]).run(SECRET, session_id="s")
    assert {"input", "output"} <= set(seen)
    fetch_span = tracing.node("w@1/fetch@1")
    assert fetch_span.attributes["flowscope.node.input"] == '"****"'
    assert "flowscope.node.output" not in fetch_span.attributes  # the redactor raised
    mark_span = tracing.node("w@1/mark@1")
    assert "flowscope.node.input" not in mark_span.attributes  # raised on this input too
    assert "flowscope.node.output" not in mark_span.attributes  # None: omitted
    assert tracing.node("w@1").attributes["flowscope.node.input"] == '"****"'
    assert not [v for v in map(repr, all_attribute_values(tracing.spans)) if SECRET in v]


# -- a broken plugin next to tracing -----------------------------------------------------------------------------------------


async def test_a_raising_plugin_does_not_break_tracing(store, tracing):
    class Broken(Plugin):
        name = "broken"

        def before_run(self, run):
            raise RuntimeError("before_run")

        def after_run(self, run, result, error):
            raise RuntimeError("after_run")

        def before_node(self, ctx):
            raise RuntimeError("before_node")

        async def after_node(self, ctx, outcome):
            raise RuntimeError("after_node")

        def on_node_error(self, ctx, event):
            raise RuntimeError("on_node_error")

        def on_event(self, event):
            raise RuntimeError("on_event")

    user_tracer = tracing.provider.get_tracer("user")

    @node(retry=RetryConfig(max_attempts=2, initial_delay=0.001))
    async def work(ctx, x):
        with user_tracer.start_as_current_span("inside"):
            pass
        if ctx.attempt == 1:
            raise ConnectionError("once")
        return x

    wf = Workflow("w", edges=[(START, work, node(lambda x: x, name="after"))])
    runner = Runner(wf, store=store, plugins=[Broken(), tracing.plugin(), Broken()])
    assert (await runner.run(5, session_id="s")).output == 5
    assert runner.plugins.errors[("broken", "before_node")] == 6
    nodes = tracing.nodes()
    assert set(nodes) == {"w@1", "w@1/work@1", "w@1/after@1"}
    work_span = nodes["w@1/work@1"]
    assert work_span.attributes["flowscope.node.attempt_count"] == 2
    assert [e.name for e in work_span.events] == ["node.retry"]
    assert {parent_id(s) for s in tracing.spans if s.name == "inside"} == {work_span.context.span_id}
    assert tracing.invocation().attributes["flowscope.run.outcome"] == "completed"

    with pytest.raises(ValueError):
        await Runner(
            Workflow("w", edges=[(START, node(lambda x: int("nope"), name="bad"))]),
            store=store,
            plugins=[Broken(), tracing.plugin(), Broken()],
        ).run(1, session_id="t")
    bad = tracing.node("w@1/bad@1")
    assert bad.status.status_code is StatusCode.ERROR
    assert [e.name for e in bad.events] == ["exception"]


# -- spans go out while the run is still going ------------------------------------------------------------------------------
# The plugin walks appended events in batches (tracing.WALK_BATCH); these pin that a batch
# never holds back the spans of a run that waits, or of a long run that never waits.


async def test_a_waiting_run_has_shipped_the_spans_it_ended(store, tracing):
    seen: list[set[str]] = []
    release = asyncio.Event()

    async def wait(x):
        await asyncio.sleep(0)  # the loop turns while this node runs
        seen.append(set(tracing.nodes()))
        await release.wait()
        return x

    wf = Workflow(
        "w",
        edges=[
            (
                START,
                node(lambda x: x, name="first"),
                node(lambda x: x, name="second"),
                node(wait, name="wait"),
            )
        ],
    )
    run = asyncio.ensure_future(Runner(wf, store=store, plugins=[tracing.plugin()]).run(1, session_id="s"))
    while not seen and not run.done():  # a run that failed early ends the wait, and the test
        await asyncio.sleep(0.001)
    assert seen and seen[0] == {
        "w@1/first@1",
        "w@1/second@1",
    }  # ended before "wait" started, exported while it waits
    release.set()
    assert (await run).output == 1
    assert set(tracing.nodes()) == {"w@1", "w@1/first@1", "w@1/second@1", "w@1/wait@1"}


async def test_a_long_run_that_never_waits_ships_spans_before_it_ends(store, tracing):
    from flowscope.observability.tracing import WALK_BATCH

    n = WALK_BATCH  # 2 events per node: the batch fills halfway through
    exported_at_end: list[int] = []

    def last(x):
        exported_at_end.append(len(tracing.nodes()))
        return x

    steps = [node(lambda x: x + 1, name=f"n{i}") for i in range(n)]
    wf = Workflow("w", edges=[(START, *steps, node(last, name="last"))], max_steps=n + 10)
    assert (await Runner(wf, store=store, plugins=[tracing.plugin()]).run(0, session_id="s")).output == n
    (before_last,) = exported_at_end
    assert WALK_BATCH // 2 - 2 <= before_last < n  # shipped as batches filled, not all at the end
    assert len(tracing.nodes()) == n + 2  # every node, the last and the workflow's run


async def test_every_span_is_handed_over_once_across_batches_and_loop_turns(store, tracing):
    """Full batches (WALK_BATCH) walked inside on_events and the loop turn's walk of the same
    run: each span reaches the processors exactly once."""
    from flowscope.observability.tracing import WALK_BATCH

    n = WALK_BATCH + 40

    async def turn(x):
        await asyncio.sleep(0)  # the loop turns: the runs waiting are walked
        return x + 1

    steps = [node(lambda x: x + 1, name=f"n{i}") for i in range(n)]
    wf = Workflow("w", edges=[(START, *steps, node(turn, name="turn"))], max_steps=n + 10)
    runs = [Runner(wf, store=store, plugins=[tracing.plugin()]).run(0, session_id=f"s{i}") for i in range(3)]
    assert [r.output for r in await asyncio.gather(*runs)] == [n + 1] * 3
    ids = [s.context.span_id for s in tracing.spans]
    assert len(ids) == len(set(ids)) == 3 * (n + 2)


async def test_a_walk_that_raises_between_hooks_is_logged_and_never_reaches_the_loop(
    store, tracing, monkeypatch, caplog
):
    from flowscope.observability.log_spans import SpanWalk

    def boom(self, event):
        raise RuntimeError("walk")

    monkeypatch.setattr(SpanWalk, "apply", boom)
    loop_errors: list[dict] = []
    asyncio.get_running_loop().set_exception_handler(lambda loop, context: loop_errors.append(context))

    async def wait(x):
        await asyncio.sleep(0)  # the loop turns: the batch is walked here, outside any hook
        return x

    wf = Workflow("w", edges=[(START, node(lambda x: x, name="first"), node(wait, name="wait"))])
    with caplog.at_level("WARNING", logger="flowscope.observability.tracing"):
        assert (await Runner(wf, store=store, plugins=[tracing.plugin()]).run(1, session_id="s")).output == 1
    assert loop_errors == []
    assert "tracing: building spans from the log raised RuntimeError: walk" in caplog.text


async def test_an_event_the_walk_cannot_take_costs_its_own_span_not_the_rest_of_its_batch(
    store, tracing, monkeypatch, caplog
):
    from flowscope.events import NodeStarted
    from flowscope.observability.log_spans import SpanWalk

    real = SpanWalk.apply

    def apply(self, event):
        if isinstance(event, NodeStarted) and event.node == "n1":
            raise RuntimeError("walk")
        real(self, event)

    monkeypatch.setattr(SpanWalk, "apply", apply)
    steps = [node(lambda x: x + 1, name=f"n{i}") for i in range(6)]  # no awaits: one batch holds them all
    wf = Workflow("w", edges=[(START, *steps)])
    with caplog.at_level("WARNING", logger="flowscope.observability.tracing"):
        assert (await Runner(wf, store=store, plugins=[tracing.plugin()]).run(0, session_id="s")).output == 6
    assert "tracing: building spans from the log raised RuntimeError: walk" in caplog.text
    assert set(tracing.nodes()) == {"w@1", *(f"w@1/n{i}@1" for i in range(6) if i != 1)}
    assert len(tracing.invocations()) == 1


@pytest.mark.slow  # timing-bound (threads, processes or sleeps): the full suite runs it
def test_a_loop_closed_before_the_batch_was_walked_is_not_kept_alive(tracing):
    import gc
    import time
    import weakref

    from flowscope import RunInfo
    from flowscope.events import RunStarted

    plugin = tracing.plugin()
    plugin.before_run(
        RunInfo(
            session_id="s", invocation_id="i", workflow="w", input=None, resumed=False, started_at=time.time()
        )
    )
    loop = asyncio.new_event_loop()
    # One loop turn: the event is queued and the walk scheduled for the next turn, which never comes.
    loop.call_soon(
        plugin.on_event, RunStarted(session_id="s", invocation_id="i", seq=1, ts=time.time(), workflow="w")
    )
    loop.call_soon(loop.stop)
    loop.run_forever()
    loop.close()
    closed = weakref.ref(loop)
    del loop
    gc.collect()
    assert closed() is None
