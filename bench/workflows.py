"""The benchmark workflows, as flowscope graphs, and the flowscope configurations.

Every framework in the harness builds the *same* graphs (see ``peers_langgraph.py`` and
``peers_adk.py``): trivial nodes that add one to an integer, so what is measured is the
engine's own cost per node, not the work inside it.

- ``chain20`` / ``chain200`` / ``chain2000``: START -> n0 -> n1 -> ... -> n{N-1}
- ``fanout50``: START -> (b0 .. b49 in parallel) -> join (waits for all) -> count
- ``nested``: a chain of 10 inner workflows of 20 nodes each (200 leaf nodes)
- ``pause200``: a 200-node chain whose node 100 asks for input; the run pauses there and
  a resume with the answer finishes it (one measurement = run + resume)
"""

from __future__ import annotations

import os
import tempfile
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

from flowscope import START, JoinNode, Runner, Workflow, node

__all__ = [
    "WORKFLOWS",
    "WorkflowSpec",
    "chain",
    "fanout",
    "nested",
    "pause_chain",
    "FlowscopeConfig",
    "flowscope_configs",
    "NoopSpanExporter",
]


@dataclass(frozen=True)
class WorkflowSpec:
    key: str
    title: str
    nodes: int  # leaf nodes run per measurement (the divisor of µs/node)
    expected: int  # the workflow's output, checked after every run
    description: str


FAN = 50
INNER, INNER_LEN = 10, 20
PAUSE_LEN = 200

WORKFLOWS: dict[str, WorkflowSpec] = {
    "chain20": WorkflowSpec("chain20", "Chain of 20 nodes", 20, 20, "START -> n0 -> ... -> n19"),
    "chain200": WorkflowSpec("chain200", "Chain of 200 nodes", 200, 200, "START -> n0 -> ... -> n199"),
    "chain2000": WorkflowSpec("chain2000", "Chain of 2,000 nodes", 2000, 2000, "START -> n0 -> ... -> n1999"),
    "fanout50": WorkflowSpec(
        "fanout50",
        "Fan-out of 50 parallel nodes with a join",
        FAN + 2,
        FAN,
        "START -> 50 parallel nodes -> join (waits for all 50) -> count; 52 nodes",
    ),
    "nested": WorkflowSpec(
        "nested",
        "Nested: 10 inner workflows of 20 nodes",
        INNER * INNER_LEN,
        INNER * INNER_LEN,
        "a chain of 10 inner workflows, each a chain of 20 nodes; 200 leaf nodes (µs/node divides by 200)",
    ),
    "pause200": WorkflowSpec(
        "pause200",
        "Chain of 200 that pauses for input halfway and resumes",
        PAUSE_LEN,
        PAUSE_LEN,
        "node 100 of a 200-chain requests input: run (pauses), then resume with the answer; "
        "one measurement is run + resume",
    ),
}


# ---------------------------------------------------------------- flowscope graphs


def _inc(x: int) -> int:
    return x + 1


def _step(name: str) -> Any:
    return node(_inc, name=name)


def chain(n: int, name: str = "chain") -> Workflow:
    return Workflow(name, edges=[(START, *[_step(f"n{i}") for i in range(n)])], max_steps=max(10_000, n + 10))


def fanout(n: int = FAN) -> Workflow:
    branches = tuple(_step(f"b{i}") for i in range(n))
    join = JoinNode("join")  # input: {branch name: output}
    count = node(lambda d: len(d), name="count")
    return Workflow("fanout", edges=[(START, branches, join, count)])


def nested(inner: int = INNER, length: int = INNER_LEN) -> Workflow:
    inners = [chain(length, name=f"inner{j}") for j in range(inner)]
    return Workflow("nested", edges=[(START, *inners)])


async def _ask(ctx: Any, x: int) -> int:
    await ctx.request_input("continue?", payload=x, interrupt_id="approval")
    return x + 1


def pause_chain(n: int = PAUSE_LEN) -> Workflow:
    steps = [_step(f"n{i}") for i in range(n)]
    steps[n // 2] = node(_ask, name="ask")
    return Workflow("pause", edges=[(START, *steps)], max_steps=max(10_000, n + 10))


def build_flowscope(key: str) -> Workflow:
    if key.startswith("chain"):
        return chain(int(key[len("chain") :]))
    if key == "fanout50":
        return fanout()
    if key == "nested":
        return nested()
    if key == "pause200":
        return pause_chain()
    raise KeyError(key)


# ---------------------------------------------------------------- configurations


class NoopSpanExporter(SpanExporter):
    """An OpenTelemetry span exporter that drops every span (the SDK still builds and batches
    them) after reading what any exporter's encoder reads of it: a span whose fields are
    made when first read (flowscope's) is made here, as a real exporter would make it."""

    def export(self, spans: Any) -> SpanExportResult:
        for s in spans:
            _read = (
                s.name,
                s.context,
                s.parent,
                s.attributes,
                s.events,
                s.links,
                s.status,
                s.start_time,
                s.end_time,
            )
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        pass

    def force_flush(self, timeout_millis: int = 30_000) -> bool:
        return True


def _tracer_provider() -> Any:
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    tp = TracerProvider()
    tp.add_span_processor(BatchSpanProcessor(NoopSpanExporter()))
    return tp


@dataclass
class FlowscopeConfig:
    """One flowscope configuration: how to make a Runner for a workflow."""

    key: str
    label: str
    sqlite: bool = False
    durability: str = "normal"
    tracing: bool = False
    metrics: bool = False
    heartbeat_interval: float = 5.0

    def make(self, wf: Workflow, tmpdir: str) -> tuple[Runner, Callable[[], None], Callable[[], None]]:
        """A runner, an ``after_run`` hook (flushes spans, outside the timing) and a closer."""
        closers: list[Callable[[], None]] = []
        after: list[Callable[[], None]] = []
        store = None
        if self.sqlite:
            from flowscope.store.sqlite import SqliteEventStore

            path = os.path.join(tmpdir, f"{self.key}-{wf.name}-{uuid.uuid4().hex[:8]}.db")
            store = SqliteEventStore(path, durability=self.durability)
            closers.append(store.close)
        plugins: list[Any] = []
        if self.tracing:
            from flowscope.observability.tracing import TracingPlugin

            tp = _tracer_provider()
            plugins.append(TracingPlugin(tracer_provider=tp))
            after.append(lambda: tp.force_flush())
            closers.append(tp.shutdown)
        if self.metrics:
            from prometheus_client import CollectorRegistry

            from flowscope.observability.metrics import MetricsPlugin

            plugins.append(MetricsPlugin(registry=CollectorRegistry()))
        runner = Runner(wf, store=store, plugins=plugins, heartbeat_interval=self.heartbeat_interval)

        def after_run() -> None:
            # The memory store keeps every run's events (a few MB over a whole harness run);
            # a runner's store is fixed when it is made, as its group commit holds it.
            for f in after:
                f()

        def close() -> None:
            for f in closers:
                try:
                    f()
                except Exception:
                    pass

        return runner, after_run, close

    @property
    def available(self) -> str | None:
        """None if this configuration can run, else why not."""
        try:
            if self.sqlite:
                import flowscope.store.sqlite  # noqa: F401
            if self.tracing:
                import opentelemetry.sdk.trace  # noqa: F401

                import flowscope.observability.tracing  # noqa: F401
            if self.metrics:
                import flowscope.observability.metrics  # noqa: F401
        except Exception as exc:  # a module that has not landed yet
            return f"{type(exc).__name__}: {exc}"
        return None


def flowscope_configs() -> list[FlowscopeConfig]:
    return [
        FlowscopeConfig("fs_engine", "flowscope engine alone (memory store, no plugins)"),
        FlowscopeConfig("fs_sqlite", "flowscope + SQLite store", sqlite=True),
        FlowscopeConfig("fs_tracing", "flowscope + tracing (memory store)", tracing=True),
        FlowscopeConfig("fs_metrics", "flowscope + metrics (memory store)", metrics=True),
        FlowscopeConfig(
            "fs_full",
            "flowscope full stack (SQLite + tracing + metrics)",
            sqlite=True,
            tracing=True,
            metrics=True,
        ),
    ]


def new_tmpdir() -> str:
    return tempfile.mkdtemp(prefix="flowscope-bench-")
