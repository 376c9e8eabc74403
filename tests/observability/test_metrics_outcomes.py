"""MetricsPlugin's workflow outcomes (``observability/metrics.py``): an invocation is
counted under its ``RunFinished.status``; an aborted one is ``cancelled``, never
``failed``, and no node run of it is a failure (cancellation is not failure)."""

from __future__ import annotations

import asyncio

import pytest
from prometheus_client import CollectorRegistry

from flowscope import START, Runner, Workflow, node
from flowscope.errors import InvocationAbortedError
from flowscope.observability import MetricsPlugin
from flowscope.store import MemoryEventStore


async def test_an_aborted_invocation_is_a_cancelled_workflow_run_not_a_failed_one():
    registry = CollectorRegistry()
    started = asyncio.Event()

    @node
    async def long(x):
        started.set()
        await asyncio.sleep(30)

    runner = Runner(
        Workflow("orders", edges=[(START, long)]),
        store=MemoryEventStore(),
        plugins=[MetricsPlugin(registry=registry)],
    )
    task = asyncio.ensure_future(runner.run(1, session_id="s"))
    await started.wait()
    assert runner.abort("s")
    with pytest.raises(InvocationAbortedError):
        await task

    def value(name: str, **labels: str) -> float | None:
        return registry.get_sample_value(name, labels)

    assert value("flowscope_workflow_runs_total", workflow="orders", outcome="cancelled") == 1
    assert value("flowscope_workflow_runs_total", workflow="orders", outcome="failed") == 0
    assert value("flowscope_workflow_duration_seconds_count", workflow="orders", outcome="cancelled") == 1
    assert value("flowscope_workflow_duration_seconds_count", workflow="orders", outcome="failed") is None
    assert value("flowscope_node_runs_total", workflow="orders", node="long", outcome="cancellation") == 1
    assert value("flowscope_node_runs_total", workflow="orders", node="long", outcome="failure") == 0
    assert value("flowscope_nodes_running", workflow="orders", node="long") == 0
    errors = [s for f in registry.collect() for s in f.samples if s.name == "flowscope_node_errors_total"]
    assert errors == []
