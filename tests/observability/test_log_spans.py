"""The walk from a session's log to its spans (``observability/log_spans.py``): what the
span of a run, or of an invocation, says when its terminal event does not say it all."""

from __future__ import annotations

import asyncio

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode

from flowscope import START, RetryConfig, Runner, Workflow, node
from flowscope.errors import WorkflowError
from flowscope.events import RunFinished, RunStarted
from flowscope.export import session_spans
from flowscope.observability import TracingPlugin
from flowscope.store import MemoryEventStore


def _traced() -> tuple[TracingPlugin, InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return TracingPlugin(tracer_provider=provider), exporter


def _by_path(spans) -> dict:
    return {s.attributes["flowscope.node.path"]: s for s in spans if "flowscope.node.path" in s.attributes}


def test_a_failed_invocation_whose_log_records_no_error_code_has_the_code_unknown_error():
    # A failed RunFinished without an error code or path (what a bridge records when the
    # failure came from no node it knows of): nothing better is known than UNKNOWN_ERROR.
    log = [
        RunStarted(session_id="s", invocation_id="i", seq=1, ts=1.0, workflow="w"),
        RunFinished(session_id="s", invocation_id="i", seq=2, ts=2.0, status="failed"),
    ]
    (inv,) = session_spans(log)
    assert inv.name == "invoke_workflow w"
    assert inv.attributes["flowscope.run.outcome"] == "failed"
    assert inv.attributes["flowscope.error.code"] == "UNKNOWN_ERROR"
    assert inv.status.status_code is StatusCode.ERROR


async def test_a_failure_recorded_at_the_top_workflows_run_is_the_invocations_origin_path():
    # The top workflow fails in its own finalize (two terminal outputs): the failure is
    # recorded at its run, w@1, and the invocation span says so, live and exported.
    @node
    def a(x):
        return 1

    @node
    def b(x):
        return 2

    store = MemoryEventStore()
    plugin, exporter = _traced()
    with pytest.raises(WorkflowError):
        await Runner(Workflow("w", edges=[(START, (a, b))]), store=store, plugins=[plugin]).run(
            1, session_id="s"
        )
    for spans in (exporter.get_finished_spans(), session_spans(store.read("s"))):
        (inv,) = [s for s in spans if "flowscope.invocation.id" in s.attributes]
        assert inv.attributes["flowscope.run.outcome"] == "failed"
        assert inv.attributes["flowscope.error.code"] == "WORKFLOW_ERROR"
        assert inv.attributes["flowscope.error.origin_path"] == "w@1"
        assert inv.status.status_code is StatusCode.ERROR


async def test_a_run_that_pauses_on_its_second_attempt_ends_with_attempt_count_two():
    # InputRequested carries no attempt count: the span counts the retry it saw.
    calls: list[int] = []

    @node(retry=RetryConfig(max_attempts=3, initial_delay=0.001, jitter=0.0))
    async def ask(ctx, x):
        calls.append(ctx.attempt)
        if len(calls) == 1:
            raise ConnectionError("flaky upstream")
        return await ctx.request_input("ship it?", interrupt_id="approval")

    store = MemoryEventStore()
    plugin, exporter = _traced()
    result = await Runner(Workflow("w", edges=[(START, ask)]), store=store, plugins=[plugin]).run(
        1, session_id="s"
    )
    assert result.status == "paused" and calls == [1, 2]
    await asyncio.sleep(0)
    for spans in (exporter.get_finished_spans(), session_spans(store.read("s"))):
        span = _by_path(spans)["w@1/ask@1"]
        assert span.attributes["flowscope.node.outcome"] == "waiting"
        assert span.attributes["flowscope.node.attempt_count"] == 2
        assert [e.name for e in span.events] == ["node.retry"]
