"""The ADK bridge against the real google-adk: function nodes only, no model, no network."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncGenerator
from pathlib import Path
from typing import Any

import pytest
from google.adk.agents.base_agent import BaseAgent
from google.adk.apps import App
from google.adk.events.event import Event
from google.adk.events.request_input import RequestInput
from google.adk.runners import Runner
from google.adk.sessions import InMemorySessionService
from google.adk.workflow import BaseNode, FunctionNode, JoinNode, Node, RetryConfig, Workflow, node
from google.adk.workflow._errors import NodeTimeoutError as AdkTimeout
from google.adk.workflow._parallel_worker import _ParallelWorker
from google.adk.workflow.utils._workflow_hitl_utils import create_request_input_response
from google.genai import types
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from prometheus_client import CollectorRegistry
from pydantic import ConfigDict, Field

import flowscope
from commands import cli_ok
from flowscope.adapters.adk import FlowscopeADK, UnobservableNodeError
from flowscope.cli import views
from flowscope.cli.history import retry_reasons
from flowscope.errors import NodeTimeoutError as EngineTimeout
from flowscope.events import (
    InputReceived,
    InputRequested,
    NodeCompleted,
    NodeErrorEvent,
    NodeErrorPropagated,
    NodePaused,
    NodeRetrying,
    NodeStarted,
    RunFinished,
    RunStarted,
)
from flowscope.export import session_spans
from flowscope.fold import rebuild
from flowscope.observability import MetricsPlugin, TracingPlugin
from flowscope.store import MemoryEventStore, SqliteEventStore

# imports take seconds (tests/conftest.py: SLOW_TO_IMPORT): the whole module is in the slow set
pytestmark = pytest.mark.slow

APP, USER = "bridge", "u"
RETRY = RetryConfig(max_attempts=3, initial_delay=0.0, jitter=0.0)


class Driver:
    """An ADK Runner over an in-memory session service, with or without the bridge."""

    def __init__(self, workflow: Workflow, bridge: FlowscopeADK | None) -> None:
        self.sessions = InMemorySessionService()
        node = bridge.instrument(workflow) if bridge is not None else workflow
        plugins = [bridge.plugin] if bridge is not None else []
        # ADK 2.13's setup: the plugins go in the App (Runner(plugins=...) is deprecated)
        self.runner = Runner(
            app=App(name=APP, root_agent=node, plugins=plugins), session_service=self.sessions
        )
        self.session_id = ""

    async def start(self, text: str = "go") -> list[Any]:
        return [e async for e in await self.stream(text)]

    async def stream(self, text: str = "go") -> Any:
        """A new session's ``run_async``, for a caller that reads it as far as it likes."""
        self.session_id = (await self.sessions.create_session(app_name=APP, user_id=USER)).id
        return self.runner.run_async(
            user_id=USER,
            session_id=self.session_id,
            new_message=types.Content(role="user", parts=[types.Part(text=text)]),
        )

    async def answer(self, interrupt_id: str, response: dict[str, Any]) -> list[Any]:
        return await self._send(
            types.Content(role="user", parts=[create_request_input_response(interrupt_id, response)])
        )

    async def _send(self, message: Any) -> list[Any]:
        return [
            e
            async for e in self.runner.run_async(
                user_id=USER, session_id=self.session_id, new_message=message
            )
        ]


@pytest.fixture
def store(tmp_path: Path):
    s = SqliteEventStore(str(tmp_path / "adk.db"))
    yield s
    s.close()


def seed_workflow(emails: list[str]) -> Workflow:
    """The seed scenario: a node that sends an email and returns nothing, then a node that asks."""

    def send_email(node_input: Any) -> None:
        emails.append("sent")

    def ask(ctx: Any, node_input: Any) -> Any:
        if "approval" in ctx.resume_inputs:
            return {"approved": ctx.resume_inputs["approval"]["ok"]}
        return RequestInput(interrupt_id="approval", message="send the report?", payload={"to": "ops"})

    return Workflow(
        name="report",
        edges=[
            (
                "START",
                FunctionNode(func=send_email, name="send_email"),
                FunctionNode(func=ask, name="ask", rerun_on_resume=True),
            )
        ],
    )


async def test_seed_scenario_sends_one_email_with_the_bridge_and_two_without(store):
    without: list[str] = []
    plain = Driver(seed_workflow(without), None)
    await plain.start()
    await plain.answer("approval", {"ok": True})
    assert without == ["sent", "sent"]  # ADK 2.13 alone re-runs the node that returned nothing

    emails: list[str] = []
    bridge = FlowscopeADK(store)
    d = Driver(seed_workflow(emails), bridge)
    events = await d.start()
    assert events[-1].long_running_tool_ids == {"approval"}  # ADK paused
    final = await d.answer("approval", {"ok": True})
    assert final[-1].output == {"approved": True}
    assert emails == ["sent"]

    log = store.read(d.session_id)
    marker = [e for e in log if isinstance(e, NodeCompleted) and e.path == "report@1/send_email@1"]
    assert len(marker) == 1 and marker[0].has_output is False and marker[0].completed is True
    started = [e.path for e in log if isinstance(e, NodeStarted)]
    assert started.count("report@1/send_email@1") == 1  # not started again by the resume
    runs = [e for e in log if isinstance(e, RunStarted)]
    assert [r.resumed for r in runs] == [False, True] and runs[0].invocation_id != runs[1].invocation_id
    req = next(e for e in log if isinstance(e, InputRequested))
    assert (req.path, req.interrupt_id, req.prompt, req.payload) == (
        "report@1/ask@1",
        "approval",
        "send the report?",
        {"to": "ops"},
    )
    got = next(e for e in log if isinstance(e, InputReceived))
    assert (got.path, got.value) == ("report@1/ask@1", {"ok": True})
    assert [e.status for e in log if isinstance(e, RunFinished)] == ["paused", "completed"]
    ws = rebuild(log)
    assert ws.status == "completed" and ws.output == {"approved": True}
    assert {p: n.status for p, n in ws.nodes.items()} == {
        "report@1": "completed",
        "report@1/send_email@1": "completed",
        "report@1/ask@1": "completed",
    }


def retry_workflow(calls: dict[str, int]) -> Workflow:
    def flaky(node_input: Any) -> int:
        calls["flaky"] = calls.get("flaky", 0) + 1
        if calls["flaky"] < 3:
            raise ConnectionError(f"upstream down ({calls['flaky']})")
        return calls["flaky"]

    def doomed(node_input: Any) -> None:
        calls["doomed"] = calls.get("doomed", 0) + 1
        raise PermissionError("token revoked")

    return Workflow(
        name="sync",
        edges=[
            (
                "START",
                FunctionNode(func=flaky, name="flaky", retry_config=RETRY),
                FunctionNode(func=doomed, name="doomed", retry_config=RETRY),
            )
        ],
    )


async def test_retries_and_a_final_failure(store):
    calls: dict[str, int] = {}
    d = Driver(retry_workflow(calls), FlowscopeADK(store))
    with pytest.raises(PermissionError):
        await d.start()
    assert calls == {"flaky": 3, "doomed": 3}
    log = store.read(d.session_id)
    flaky = [e for e in log if e.path == "sync@1/flaky@1"]
    assert [type(e).__name__ for e in flaky] == [
        "NodeStarted",
        "NodeRetrying",
        "NodeRetrying",
        "NodeCompleted",
    ]
    assert [e.attempt for e in flaky if isinstance(e, NodeRetrying)] == [1, 2]
    assert all(
        e.error_type == "ConnectionError" and e.error_code == "UNKNOWN_ERROR"
        for e in flaky
        if isinstance(e, NodeRetrying)
    )
    assert flaky[-1].attempt_count == 3 and flaky[-1].output == 3

    errors = [e for e in log if isinstance(e, NodeErrorEvent)]
    assert len(errors) == 1  # one record, at the deepest path, not one per attempt or per level
    err = errors[0]
    assert (err.path, err.error_type, err.error_code, err.error_message, err.attempt_count) == (
        "sync@1/doomed@1",
        "PermissionError",
        "UNKNOWN_ERROR",
        "token revoked",
        3,
    )
    assert len([e for e in log if isinstance(e, NodeRetrying) and e.path == "sync@1/doomed@1"]) == 2
    finished = log[-1]
    assert isinstance(finished, RunFinished)
    assert (finished.status, finished.error_code, finished.error_path) == (
        "failed",
        "UNKNOWN_ERROR",
        "sync@1/doomed@1",
    )
    ws = rebuild(log)
    assert ws.nodes["sync@1"].status == "failed" and ws.nodes["sync@1"].origin_path == "sync@1/doomed@1"


async def test_attempt_numbers_continue_across_an_adk_resume(store):
    seen: list[int] = []  # ADK's own attempt counter, as the node sees it

    def approve(ctx: Any, node_input: Any) -> Any:
        seen.append(ctx.attempt_count)
        if len(seen) in (1, 3):
            raise TimeoutError("slow approver")
        if "ok" not in ctx.resume_inputs:
            return RequestInput(interrupt_id="ok", message="approve?")
        return {"approved": ctx.resume_inputs["ok"]["yes"]}

    wf = Workflow(
        name="gate",
        edges=[
            ("START", FunctionNode(func=approve, name="approve", retry_config=RETRY, rerun_on_resume=True))
        ],
    )
    d = Driver(wf, FlowscopeADK(store))
    await d.start()
    await d.answer("ok", {"yes": True})
    assert seen == [1, 2, 1, 2]  # ADK restarts its counter at 1 after the resume

    log = [e for e in store.read(d.session_id) if e.path == "gate@1/approve@1"]
    assert [(type(e).__name__, getattr(e, "attempt", getattr(e, "attempt_count", None))) for e in log] == [
        ("NodeStarted", 1),
        ("NodeRetrying", 1),
        ("InputRequested", None),
        ("InputReceived", None),
        ("NodeStarted", 2),  # re-executing after the pause continues attempt 2
        ("NodeRetrying", 2),
        ("NodeCompleted", 3),  # and the audit counts every attempt ever made
    ]
    assert rebuild(store.read(d.session_id)).nodes["gate@1/approve@1"].attempt == 3


async def test_a_fresh_adk_invocation_in_the_same_session_runs_the_nodes_again(store):
    emails: list[str] = []
    d = Driver(seed_workflow(emails), FlowscopeADK(store))
    await d.start()
    await d.answer("approval", {"ok": False})
    await d._send(types.Content(role="user", parts=[types.Part(text="again")]))  # a new run, not a resume
    assert emails == ["sent", "sent"]
    runs = [e for e in store.read(d.session_id) if isinstance(e, RunStarted)]
    assert [r.resumed for r in runs] == [False, True, False]


async def test_each_message_of_a_session_is_a_root_run_of_its_own_and_the_audit_counts_every_turn(store):
    # ADK numbers every invocation's paths from sync@1 again; the log numbers the session's
    # turns, so that a second message does not overwrite the first one's runs.
    calls: dict[str, int] = {}
    d = Driver(retry_workflow(calls), FlowscopeADK(store))
    with pytest.raises(PermissionError):
        await d.start()  # flaky retried twice, doomed fails for good after 3 attempts
    for turn in ("again", "once more"):
        with pytest.raises(PermissionError):
            await d._send(types.Content(role="user", parts=[types.Part(text=turn)]))
    assert calls == {"flaky": 5, "doomed": 9}
    state = rebuild(store.read(d.session_id))
    assert {p: (n.status, n.attempt) for p, n in state.nodes.items()} == {
        "sync@1": ("failed", 1),
        "sync@1/flaky@1": ("completed", 3),
        "sync@1/doomed@1": ("failed", 3),
        "sync@2": ("failed", 1),
        "sync@2/flaky@1": ("completed", 1),
        "sync@2/doomed@1": ("failed", 3),
        "sync@3": ("failed", 1),
        "sync@3/flaky@1": ("completed", 1),
        "sync@3/doomed@1": ("failed", 3),
    }
    rows = audit(store, d.session_id)
    assert (rows["flaky"]["runs"], rows["flaky"]["attempts"], rows["flaky"]["retries"]) == (3, 5, 2)
    assert (rows["doomed"]["runs"], rows["doomed"]["attempts"], rows["doomed"]["failed"]) == (3, 9, 3)
    errors = [e for e in store.read(d.session_id) if isinstance(e, NodeErrorEvent)]
    assert [e.path for e in errors] == ["sync@1/doomed@1", "sync@2/doomed@1", "sync@3/doomed@1"]


async def test_an_answer_to_an_earlier_messages_question_resumes_that_invocations_own_runs(store):
    # ADK resumes the invocation whose question an answer names, even after another
    # message started one of its own: the log continues that invocation's root run.
    asked: list[str] = []

    def ask(ctx: Any, node_input: Any) -> Any:
        if ctx.resume_inputs:
            return {"answers": list(ctx.resume_inputs.values())}
        return RequestInput(message="ok?")

    def ids(events: list[Any]) -> list[str]:
        return [
            p.function_call.id
            for e in events
            if e.content is not None
            for p in (e.content.parts or [])
            if p.function_call is not None and p.function_call.name == "adk_request_input"
        ]

    wf = Workflow(name="chat", edges=[("START", FunctionNode(func=ask, name="ask", rerun_on_resume=True))])
    d = Driver(wf, FlowscopeADK(store))
    first = await d.start()
    second = await d._send(types.Content(role="user", parts=[types.Part(text="start over")]))
    asked += ids(first) + ids(second)
    await d.answer(asked[1], {"ok": 2})
    await d.answer(asked[0], {"ok": 1})  # the first message's question, answered last
    state = rebuild(store.read(d.session_id))
    assert {p: n.status for p, n in state.nodes.items()} == {
        "chat@1": "completed",
        "chat@1/ask@1": "completed",
        "chat@2": "completed",
        "chat@2/ask@1": "completed",
    }
    assert state.nodes["chat@1/ask@1"].output == {"answers": [{"ok": 1}]} and state.pending == []
    runs = [e for e in store.read(d.session_id) if isinstance(e, RunStarted)]
    assert [(r.resumed, r.invocation_id.count("#")) for r in runs] == [
        (False, 0),
        (False, 0),
        (True, 1),
        (True, 1),
    ]
    assert store.open_runs() == []


async def test_spans_nest_by_path_live_and_from_the_log(store):
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    calls: dict[str, int] = {}

    def flaky(node_input: Any) -> int:
        calls["n"] = calls.get("n", 0) + 1
        if calls["n"] < 3:
            raise ConnectionError("again")
        return 1

    inner = Workflow(
        name="inner", edges=[("START", FunctionNode(func=flaky, name="flaky", retry_config=RETRY))]
    )
    wf = Workflow(
        name="outer", edges=[("START", inner, FunctionNode(func=lambda node_input: None, name="tail"))]
    )
    metrics = MetricsPlugin()
    d = Driver(wf, FlowscopeADK(store, plugins=[TracingPlugin(tracer_provider=provider), metrics]))
    await d.start()

    mine = [s for s in exporter.get_finished_spans() if s.instrumentation_scope.name == "flowscope"]
    by_path = {s.attributes["flowscope.node.path"]: s for s in mine if "flowscope.node.path" in s.attributes}
    assert set(by_path) == {"outer@1", "outer@1/inner@1", "outer@1/inner@1/flaky@1", "outer@1/tail@1"}
    # one span for the invocation and its top workflow's run
    (inv,) = [
        s for s in mine if s.attributes.get("gen_ai.operation.name") == "invoke_workflow" and s.parent is None
    ]
    assert inv.name == "invoke_workflow outer" and inv.attributes["flowscope.run.outcome"] == "completed"

    def parent(path: str) -> int:
        return by_path[path].parent.span_id

    assert by_path["outer@1"] is inv
    assert parent("outer@1/inner@1") == parent("outer@1/tail@1") == by_path["outer@1"].context.span_id
    assert parent("outer@1/inner@1/flaky@1") == by_path["outer@1/inner@1"].context.span_id
    flaky_span = by_path["outer@1/inner@1/flaky@1"]
    assert (
        flaky_span.name == "invoke_node flaky" and flaky_span.attributes["flowscope.node.attempt_count"] == 3
    )
    assert [e.name for e in flaky_span.events] == ["node.retry", "node.retry"]
    tail = by_path["outer@1/tail@1"].attributes
    assert tail["flowscope.node.completed"] is True and tail["flowscope.node.has_output"] is False

    exported = {s.attributes.get("flowscope.node.path"): s for s in session_spans(store.read(d.session_id))}
    for path in by_path:
        if "/" not in path:
            assert exported[path].parent is None and exported[path].context == inv.context
            continue
        assert exported[path].parent.span_id == exported[path.rsplit("/", 1)[0]].context.span_id
    assert exported["outer@1/inner@1/flaky@1"].attributes["flowscope.node.attempt_count"] == 3

    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for m in metrics.registry.collect()
        for s in m.samples
    }
    assert (
        samples[
            (
                "flowscope_node_retries_total",
                (("error_type", "ConnectionError"), ("node", "flaky"), ("workflow", "outer")),
            )
        ]
        == 2
    )
    assert (
        samples[
            ("flowscope_node_runs_total", (("node", "tail"), ("outcome", "success"), ("workflow", "outer")))
        ]
        == 1
    )


@pytest.mark.slow
async def test_flowscope_cli_audits_an_adk_session(store, tmp_path):
    calls: dict[str, int] = {}
    d = Driver(retry_workflow(calls), FlowscopeADK(store))
    with pytest.raises(PermissionError):
        await d.start()
    emails: list[str] = []
    d2 = Driver(seed_workflow(emails), FlowscopeADK(store))
    await d2.start()  # left waiting for input
    db = str(tmp_path / "adk.db")
    audit = json.loads(cli_ok("audit", "--db", db, "--format", "json"))
    rows = {(r["workflow"], r["node"]): r for r in audit}
    assert rows[("sync", "flaky")]["attempts"] == 3 and rows[("sync", "flaky")]["retries"] == 2
    assert rows[("sync", "doomed")]["attempts"] == 3 and rows[("sync", "doomed")]["errors"] == 1
    assert rows[("sync", "sync")]["kind"] == "workflow"
    assert rows[("report", "send_email")]["completed"] == 1

    stuck = json.loads(cli_ok("stuck", "--db", db, "--format", "json", "--older-than", "0s"))
    assert [(r["session_id"], r["path"], r["state"]) for r in stuck] == [
        (d2.session_id, "report@1/ask@1", "waiting_input")
    ]
    for cmd in (["runs"], ["show", d.session_id], ["export", d.session_id]):
        cli_ok(*cmd, "--db", db)


# -- node kinds from ADK's own tests and samples ----------------------------------------
# google/adk-python tests/unittests/workflow/test_workflow_failures.py (commit 5a7c9b5:
# _FlakyNode, a BaseNode subclass overriding run, and test_attempt_count_populated_correctly),
# test_workflow_parallel_worker.py and contributing/samples/workflows (parallel_worker,
# nested workflows of agents and a join), trimmed to nodes that need no model; run on the
# installed google-adk (2.13.0).


@pytest.fixture
def otel_errors(caplog):
    """The ERROR lines OpenTelemetry logs during a test (a context detached in another context)."""
    caplog.set_level(logging.ERROR, logger="opentelemetry")
    yield lambda: [
        r.getMessage()
        for r in caplog.records
        if r.name.startswith("opentelemetry") and r.levelno >= logging.ERROR
    ]


def observed(store) -> tuple[FlowscopeADK, MetricsPlugin]:
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(InMemorySpanExporter()))
    metrics = MetricsPlugin(registry=CollectorRegistry())  # this test's counts only
    return FlowscopeADK(store, plugins=[TracingPlugin(tracer_provider=provider), metrics]), metrics


def samples(metrics: MetricsPlugin, name: str) -> dict[tuple, float]:
    return {
        tuple(sorted(s.labels.items())): s.value
        for m in metrics.registry.collect()
        for s in m.samples
        if s.name == name
    }


def audit(store, sid: str) -> dict[str, dict[str, Any]]:
    runs = store.node_runs(sid)
    return {
        r["node"]: r for r in views.audit_rows(runs, retry_reasons(store, runs)) if r["kind"] != "workflow"
    }


def square_workflow(calls: dict[int, int], fail_until: int) -> Workflow:
    @node(parallel_worker=True, retry_config=RETRY)
    def square(node_input: int) -> int:
        calls[node_input] = calls.get(node_input, 0) + 1
        if node_input == 2 and calls[node_input] < fail_until:
            raise ConnectionError("flaky upstream")
        return node_input * node_input

    return Workflow(
        name="fan", edges=[("START", FunctionNode(func=lambda node_input: [1, 2, 3], name="items"), square)]
    )


async def test_parallel_worker_items_are_runs_under_the_worker_path(store, otel_errors):
    calls: dict[int, int] = {}
    bridge, metrics = observed(store)
    d = Driver(square_workflow(calls, fail_until=3), bridge)
    events = await d.start()
    assert events[-1].output == [1, 4, 9] and calls == {1: 1, 2: 3, 3: 1}
    log = store.read(d.session_id)
    items = sorted({e.path for e in log if isinstance(e, NodeStarted) and e.parent_path == "fan@1/square@1"})
    assert items == ["fan@1/square@1/square@1", "fan@1/square@1/square@2", "fan@1/square@1/square@3"]
    flaky = [e for e in log if e.path == "fan@1/square@1/square@2"]
    assert [type(e).__name__ for e in flaky] == [
        "NodeStarted",
        "NodeRetrying",
        "NodeRetrying",
        "NodeCompleted",
    ]
    assert flaky[-1].attempt_count == 3 and flaky[-1].output == 4
    ws = rebuild(log)
    assert ws.nodes["fan@1/square@1"].status == "completed" and ws.nodes["fan@1/square@1"].output == [1, 4, 9]
    rows = audit(store, d.session_id)
    assert (rows["square"]["runs"], rows["square"]["attempts"], rows["square"]["retries"]) == (
        4,
        6,
        2,
    )  # the worker and 3 items
    assert (
        samples(metrics, "flowscope_node_retries_total")[
            (("error_type", "ConnectionError"), ("node", "square"), ("workflow", "fan"))
        ]
        == 2
    )
    assert otel_errors() == []


async def test_a_parallel_worker_item_that_fails_for_good_is_the_error_with_every_attempt(store, otel_errors):
    calls: dict[int, int] = {}
    bridge, metrics = observed(store)
    d = Driver(square_workflow(calls, fail_until=99), bridge)
    with pytest.raises(ConnectionError):
        await d.start()
    assert calls[2] == 3
    log = store.read(d.session_id)
    (err,) = [e for e in log if isinstance(e, NodeErrorEvent)]
    assert (err.path, err.error_type, err.attempt_count) == ("fan@1/square@1/square@2", "ConnectionError", 3)
    propagated = {e.path: e.origin_path for e in log if isinstance(e, NodeErrorPropagated)}
    assert propagated == {"fan@1/square@1": err.path, "fan@1": err.path}
    assert (log[-1].status, log[-1].error_path) == ("failed", err.path)
    errors = samples(metrics, "flowscope_node_errors_total")
    assert errors == {
        (
            ("error_code", "UNKNOWN_ERROR"),
            ("error_type", "ConnectionError"),
            ("node", "square"),
            ("workflow", "fan"),
        ): 1
    }
    assert otel_errors() == []


async def test_an_input_request_in_a_parallel_worker_item_pauses_the_worker(store, otel_errors):
    runs: list[int] = []

    @node(parallel_worker=True, rerun_on_resume=True)
    def review(ctx: Any, node_input: int) -> Any:
        runs.append(node_input)
        if node_input == 2 and "ok-2" not in ctx.resume_inputs:
            return RequestInput(interrupt_id="ok-2", message="approve 2?")
        return {"i": node_input}

    bridge, _ = observed(store)
    d = Driver(
        Workflow(
            name="rev",
            edges=[("START", FunctionNode(func=lambda node_input: [1, 2, 3], name="items"), review)],
        ),
        bridge,
    )
    await d.start()
    log = store.read(d.session_id)
    (req,) = [e for e in log if isinstance(e, InputRequested)]
    assert req.path == "rev@1/review@1/review@2"
    assert {e.path: e.interrupt_ids for e in log if isinstance(e, NodePaused)} == {
        "rev@1/review@1": ("ok-2",),
        "rev@1": ("ok-2",),
    }
    final = await d.answer("ok-2", {"yes": True})
    assert final[-1].output == [{"i": 1}, {"i": 2}, {"i": 3}]
    log = store.read(d.session_id)
    assert [e.path for e in log if isinstance(e, InputReceived)] == [req.path]
    started = [e.path for e in log if isinstance(e, NodeStarted) and e.path.startswith("rev@1/review@1/")]
    assert sorted(started) == [
        "rev@1/review@1/review@1",
        "rev@1/review@1/review@2",
        "rev@1/review@1/review@2",
        "rev@1/review@1/review@3",
    ]
    assert rebuild(log).status == "completed" and runs.count(1) == 1
    assert otel_errors() == []


async def test_a_parallel_worker_item_that_does_not_rerun_on_resume_takes_its_answer_as_its_output(
    store, otel_errors
):
    runs: list[int] = []

    @node(parallel_worker=True)  # ADK's default: rerun_on_resume=False
    def review(ctx: Any, node_input: int) -> Any:
        runs.append(node_input)
        if node_input == 2:
            return RequestInput(interrupt_id="ok-2", message="approve 2?")
        return {"i": node_input}

    bridge, _ = observed(store)
    items = FunctionNode(func=lambda node_input: [1, 2, 3], name="items")
    d = Driver(Workflow(name="rev", edges=[("START", items, review)]), bridge)
    await d.start()
    final = await d.answer("ok-2", {"yes": True})
    assert final[-1].output == [{"i": 1}, {"yes": True}, {"i": 3}]  # ADK took the answer as item 2's output
    state = rebuild(store.read(d.session_id))
    item = state.nodes["rev@1/review@1/review@2"]
    assert (item.status, item.output) == ("completed", {"yes": True})  # as the log records such a node
    assert state.status == "completed" and store.open_runs() == []
    assert otel_errors() == []


class FlakyNode(BaseNode):
    """test_workflow_failures.py's _FlakyNode: a BaseNode subclass that overrides run."""

    model_config = ConfigDict(arbitrary_types_allowed=True)
    succeed_on_iteration: int = Field(default=0)
    tracker: dict[str, Any] = Field(default_factory=dict)

    async def run(self, *, ctx: Any, node_input: Any) -> AsyncGenerator[Any, None]:  # type: ignore[override]
        n = self.tracker["iteration_count"] = self.tracker.get("iteration_count", 0) + 1
        self.tracker.setdefault("attempt_counts", []).append(ctx.attempt_count)
        if n < self.succeed_on_iteration:
            raise ConnectionError(f"iteration {n}")
        yield Event(output={"iteration": n})


class Doubler(Node):
    """A Node subclass (run_node_impl), fanned out with parallel_worker=True."""

    async def run_node_impl(self, *, ctx: Any, node_input: Any) -> AsyncGenerator[Any, None]:
        yield node_input * 2


async def test_basenode_and_node_subclasses_are_observed(store, otel_errors):
    flaky = FlakyNode(name="flaky", succeed_on_iteration=3, retry_config=RETRY)
    tracker = flaky.tracker  # shared with the bridge's copy of the node
    wf = Workflow(
        name="custom",
        edges=[
            (
                "START",
                flaky,
                FunctionNode(func=lambda node_input: [1, 2], name="pair"),
                Doubler(name="double", parallel_worker=True),
            )
        ],
    )
    bridge, metrics = observed(store)
    d = Driver(wf, bridge)
    events = await d.start()
    assert events[-1].output == [2, 4] and tracker["attempt_counts"] == [1, 2, 3]
    log = store.read(d.session_id)
    mine = [e for e in log if e.path == "custom@1/flaky@1"]
    assert [type(e).__name__ for e in mine] == [
        "NodeStarted",
        "NodeRetrying",
        "NodeRetrying",
        "NodeCompleted",
    ]
    assert mine[-1].attempt_count == 3 and mine[-1].output == {"iteration": 3}
    doubled = {
        e.path: e.output
        for e in log
        if isinstance(e, NodeCompleted) and e.path.startswith("custom@1/double@1")
    }
    assert doubled == {
        "custom@1/double@1/double@1": 2,
        "custom@1/double@1/double@2": 4,
        "custom@1/double@1": [2, 4],
    }
    assert (
        samples(metrics, "flowscope_node_retries_total")[
            (("error_type", "ConnectionError"), ("node", "flaky"), ("workflow", "custom"))
        ]
        == 2
    )
    assert otel_errors() == []


class Echo(BaseAgent):
    """An agent that needs no model: it says its name."""

    async def _run_async_impl(self, ctx: Any) -> AsyncGenerator[Any, None]:
        yield Event(
            author=self.name,
            content=types.Content(role="model", parts=[types.Part(text=f"hi from {self.name}")]),
        )


async def test_a_nested_workflow_of_agents_and_a_join_is_recorded(store, otel_errors):
    join = JoinNode(name="join")
    inner = Workflow(name="inner", edges=[("START", Echo(name="a"), join), ("START", Echo(name="b"), join)])
    wf = Workflow(
        name="outer", edges=[("START", inner, FunctionNode(func=lambda node_input: None, name="tail"))]
    )
    bridge, _ = observed(store)
    d = Driver(wf, bridge)
    await d.start()
    log = store.read(d.session_id)
    kinds = {e.path: e.kind for e in log if isinstance(e, NodeStarted)}
    assert kinds == {
        "outer@1": "workflow",
        "outer@1/inner@1": "workflow",
        "outer@1/inner@1/a@1": "agent",
        "outer@1/inner@1/b@1": "agent",
        "outer@1/inner@1/join@1": "join",
        "outer@1/tail@1": "function",
    }
    ended = [e.path for e in log if isinstance(e, NodeCompleted)]
    assert (
        ended.index("outer@1/inner@1/join@1") < ended.index("outer@1/inner@1") < ended.index("outer@1")
    )  # children first
    ws = rebuild(log)
    assert all(n.status == "completed" for n in ws.nodes.values()) and len(ws.nodes) == 6
    assert otel_errors() == []


def test_instrument_refuses_a_workflow_subclass_that_overrides_how_it_runs(store):
    class Custom(Workflow):
        async def _run_impl(self, *, ctx: Any, node_input: Any) -> AsyncGenerator[Any, None]:
            yield "done my way"

    class Plain(Workflow):
        """A subclass that only names defaults: instrumented as a Workflow."""

    inner = Custom(name="special", edges=[("START", FunctionNode(func=lambda node_input: 1, name="one"))])
    with pytest.raises(
        UnobservableNodeError, match="'special' is a Custom, a Workflow subclass that overrides how it runs"
    ):
        FlowscopeADK(store).instrument(Workflow(name="outer", edges=[("START", inner)]))
    plain = Plain(name="plain", edges=[("START", FunctionNode(func=lambda node_input: 1, name="one"))])
    FlowscopeADK(store).instrument(Workflow(name="outer", edges=[("START", plain)]))


async def test_a_parallel_worker_of_workflows_records_each_item_workflow_and_its_nodes(store, otel_errors):
    per = Workflow(
        name="per",
        edges=[
            (
                "START",
                FunctionNode(func=lambda node_input: node_input + 1, name="inc"),
                FunctionNode(func=lambda node_input: node_input * 10, name="ten"),
            )
        ],
    )
    wf = Workflow(
        name="top",
        edges=[
            ("START", FunctionNode(func=lambda node_input: [1, 2], name="items"), _ParallelWorker(node=per))
        ],
    )
    bridge, _ = observed(store)
    d = Driver(wf, bridge)
    assert (await d.start())[-1].output == [20, 30]
    done = {e.path: e.output for e in store.read(d.session_id) if isinstance(e, NodeCompleted)}
    assert done == {
        "top@1/items@1": [1, 2],
        "top@1/per@1/per@1/inc@1": 2,
        "top@1/per@1/per@1/ten@1": 20,
        "top@1/per@1/per@1": 20,
        "top@1/per@1/per@2/inc@1": 3,
        "top@1/per@1/per@2/ten@1": 30,
        "top@1/per@1/per@2": 30,
        "top@1/per@1": [20, 30],
        "top@1": [20, 30],
    }
    assert otel_errors() == []


async def test_a_dynamic_node_the_bridge_never_met_is_reported_loudly(store, caplog):
    hidden = FunctionNode(func=lambda node_input: "inner", name="hidden", rerun_on_resume=True)

    async def caller(ctx: Any, node_input: Any) -> Any:
        return await ctx.run_node(hidden, node_input=1)

    d = Driver(
        Workflow(
            name="dyn", edges=[("START", FunctionNode(func=caller, name="caller", rerun_on_resume=True))]
        ),
        FlowscopeADK(store),
    )
    with caplog.at_level(logging.WARNING, logger="flowscope.adapters.adk"):
        await d.start()
    (msg,) = [r.getMessage() for r in caplog.records if r.name == "flowscope.adapters.adk"]
    assert "'hidden'" in msg and "not recorded" in msg


async def test_an_adk_timeout_is_a_retried_attempt_and_a_final_timeout_is_a_timeout(store, otel_errors):
    tries = {"slow": 0, "hung": 0}

    async def slow(node_input: Any) -> int:
        tries["slow"] += 1
        if tries["slow"] < 2:
            await asyncio.sleep(5)
        return 1

    async def hung(node_input: Any) -> int:
        tries["hung"] += 1
        await asyncio.sleep(5)
        return 2

    retry2 = RetryConfig(max_attempts=2, initial_delay=0.0, jitter=0.0)
    wf = Workflow(
        name="slowpoke",
        edges=[
            (
                "START",
                FunctionNode(func=slow, name="slow", timeout=0.1, retry_config=retry2),
                FunctionNode(func=hung, name="hung", timeout=0.1, retry_config=retry2),
            )
        ],
    )
    bridge, metrics = observed(store)
    d = Driver(wf, bridge)
    with pytest.raises(Exception) as raised:
        await d.start()
    assert type(raised.value).__name__ == "NodeTimeoutError" and tries == {"slow": 2, "hung": 2}
    log = store.read(d.session_id)
    slow_log = [e for e in log if e.path == "slowpoke@1/slow@1"]
    assert [type(e).__name__ for e in slow_log] == ["NodeStarted", "NodeRetrying", "NodeCompleted"]
    assert (slow_log[1].error_type, slow_log[1].error_code, slow_log[-1].attempt_count) == (
        "NodeTimeoutError",
        "NODE_TIMEOUT",
        2,
    )
    (err,) = [e for e in log if isinstance(e, NodeErrorEvent)]
    assert (err.path, err.error_type, err.error_code, err.attempt_count) == (
        "slowpoke@1/hung@1",
        "NodeTimeoutError",
        "NODE_TIMEOUT",
        2,
    )
    assert err.error_message == str(raised.value)
    assert not [e for e in log if type(e).__name__ == "NodeCancelled"]
    runs = samples(metrics, "flowscope_node_runs_total")
    assert runs[(("node", "hung"), ("outcome", "timeout"), ("workflow", "slowpoke"))] == 1
    assert otel_errors() == []


async def test_the_recorder_holds_only_the_sessions_being_recorded(store):
    """A session's fold is kept while an invocation of it is recorded and let go when it
    ends (the next one folds the log again), so a process serving thousands of sessions
    holds none of those done; a paused one, let go, resumes exactly."""
    emails: list[str] = []
    bridge = FlowscopeADK(store)
    drivers = [Driver(seed_workflow(emails), bridge) for _ in range(10)]
    for d in drivers:
        await d.start()  # pauses at "ask"
    assert bridge.recorder._sessions == {}
    d = drivers[3]
    assert (await d.answer("approval", {"ok": True}))[-1].output == {"approved": True}
    assert bridge.recorder._sessions == {}
    assert emails == ["sent"] * 10  # the resume folded the log: the email is not sent again
    log = store.read(d.session_id)
    assert [e.status for e in log if isinstance(e, RunFinished)] == ["paused", "completed"]
    assert [r.resumed for r in log if isinstance(r, RunStarted)] == [False, True]


async def test_a_route_is_recorded_with_the_run_that_took_it_and_the_loop_ends_the_same(store):
    """A node that routes without an output (``Event(route=...)``, a loop's check) records
    its route on its ``NodeCompleted``; the workflow's result is the same as without the bridge."""

    def build(calls: dict[str, int]) -> Workflow:
        def tick(node_input: Any) -> None:
            calls["tick"] = calls.get("tick", 0) + 1

        def check(ctx: Any, node_input: Any) -> Event:
            n = ctx.state.get("n", 0) + 1
            return Event(state={"n": n}, route="again" if n < 3 else "done")

        def done(node_input: Any) -> dict[str, str]:
            return {"result": "looped"}

        check_n = FunctionNode(func=check, name="check")
        tick_n = FunctionNode(func=tick, name="tick")
        return Workflow(
            name="loop",
            edges=[
                ("START", tick_n, check_n),
                (check_n, {"again": tick_n, "done": FunctionNode(func=done, name="done")}),
            ],
        )

    plain: dict[str, int] = {}
    without = [e.output for e in await Driver(build(plain), None).start() if e.output is not None]
    seen: dict[str, int] = {}
    driver = Driver(build(seen), FlowscopeADK(store))
    with_bridge = [e.output for e in await driver.start() if e.output is not None]
    assert with_bridge == without and seen == plain == {"tick": 3}
    routes = [
        (e.path, e.route)
        for e in store.read(driver.session_id)
        if isinstance(e, NodeCompleted) and e.node == "check"
    ]
    assert routes == [("loop@1/check@1", "again"), ("loop@1/check@2", "again"), ("loop@1/check@3", "done")]


async def test_a_caller_that_stops_reading_run_async_ends_the_invocation_cancelled(store):
    ran: list[str] = []

    async def a(node_input: Any) -> str:
        ran.append("a")
        return "A"

    async def b(node_input: Any) -> str:
        ran.append("b")
        return "B"

    wf = Workflow(
        name="chain", edges=[("START", FunctionNode(func=a, name="a"), FunctionNode(func=b, name="b"))]
    )
    d = Driver(wf, FlowscopeADK(store))
    events = await d.stream()
    async for ev in events:
        if ev.output is not None:
            break  # a page that shows the first result and moves on
    await events.aclose()
    assert ran == ["a"]
    log = store.read(d.session_id)
    [finished] = [e for e in log if isinstance(e, RunFinished)]
    assert finished.status == "cancelled"
    state = rebuild(log)
    assert state.status == "cancelled" and state.nodes["chain@1"].status == "cancelled"
    assert store.open_runs() == []


async def test_a_caller_that_stops_reading_during_a_retry_backoff_leaves_the_node_to_run_again(store):
    ran: list[str] = []

    def flaky(node_input: Any) -> str:
        ran.append("flaky")
        if ran.count("flaky") == 1:
            raise ConnectionError("upstream down")
        return "fetched"

    def after(node_input: Any) -> str:
        ran.append(f"after({node_input})")
        return "done"

    retry = RetryConfig(max_attempts=3, initial_delay=2.0, jitter=0.0)
    wf = Workflow(
        name="bk",
        edges=[
            (
                "START",
                FunctionNode(func=flaky, name="flaky", retry_config=retry),
                FunctionNode(func=after, name="after"),
            )
        ],
    )
    d = Driver(wf, FlowscopeADK(store))
    events = await d.stream()
    async for ev in events:
        if ev.error_code is not None:
            adk_invocation = ev.invocation_id
            break  # a page that shows the first error and moves on, during the backoff
    await events.aclose()
    assert ran == ["flaky"]
    log = store.read(d.session_id)
    [finished] = [e for e in log if isinstance(e, RunFinished)]
    assert finished.status == "cancelled"  # not completed: the node never succeeded
    state = rebuild(log)
    assert state.nodes["bk@1/flaky@1"].status == "cancelled", state.nodes["bk@1/flaky@1"]
    assert [e.type for e in log if e.path == "bk@1/flaky@1"][-2:] == ["node_retrying", "node_cancelled"]
    assert store.open_runs() == []
    # ADK's resume of that invocation runs the node again, as it does without the bridge
    [e async for e in d.runner.run_async(user_id=USER, session_id=d.session_id, invocation_id=adk_invocation)]
    assert ran == ["flaky", "flaky", "after(fetched)"]
    resumed = rebuild(store.read(d.session_id))
    assert resumed.status == "completed" and resumed.nodes["bk@1/flaky@1"].status == "completed"


@pytest.mark.parametrize("fail_first", [2, 5])
async def test_a_nested_workflows_retry_config_is_its_retry_of_the_childs_failure(
    store, otel_errors, fail_first
):
    calls = {"pre": 0, "flaky": 0}

    def pre(node_input: Any) -> int:
        calls["pre"] += 1
        return 1

    def flaky(node_input: Any) -> str:
        calls["flaky"] += 1
        if calls["flaky"] <= fail_first:
            raise ConnectionError(f"upstream down ({calls['flaky']})")
        return "ok"

    inner = Workflow(
        name="inner",
        retry_config=RETRY,
        edges=[("START", FunctionNode(func=pre, name="pre"), FunctionNode(func=flaky, name="flaky"))],
    )
    d = Driver(Workflow(name="outer", edges=[("START", inner)]), FlowscopeADK(store))
    if fail_first < 3:
        await d.start()
    else:
        with pytest.raises(ConnectionError):
            await d.start()
    assert calls == {"pre": 1, "flaky": 3}  # ADK ran the workflow again, its completed child replayed
    log = store.read(d.session_id)
    retries = [(e.path, e.attempt, e.error_type) for e in log if isinstance(e, NodeRetrying)]
    assert retries == [("outer@1/inner@1", 1, "ConnectionError"), ("outer@1/inner@1", 2, "ConnectionError")]
    errors = [e.attempt_count for e in log if isinstance(e, NodeErrorEvent)]
    assert errors == ([1, 2] if fail_first < 3 else [1, 2, 3])  # each failed attempt of the child's run
    state = rebuild(log)
    assert state.nodes["outer@1/inner@1"].attempt == 3
    assert state.status == ("completed" if fail_first < 3 else "failed")


@pytest.mark.parametrize("timeout", [None, 20.0], ids=["no-timeout", "timeout"])
async def test_a_cancelled_task_reading_run_async_ends_the_invocation_cancelled(store, otel_errors, timeout):
    # ADK calls neither after_run nor on_run_error then: the task's end closes what is open
    started = asyncio.Event()

    async def a(node_input: Any) -> str:
        return "A"

    async def slow(node_input: Any) -> str:
        started.set()
        await asyncio.sleep(30)
        return "B"

    slow_node = FunctionNode(func=slow, name="slow", **({"timeout": timeout} if timeout else {}))
    bridge, metrics = observed(store)
    d = Driver(Workflow(name="chain", edges=[("START", FunctionNode(func=a, name="a"), slow_node)]), bridge)
    reading = asyncio.create_task(d.start())
    await asyncio.wait_for(started.wait(), 10)
    reading.cancel()
    with pytest.raises(asyncio.CancelledError):
        await reading
    log = store.read(d.session_id)
    [finished] = [e for e in log if isinstance(e, RunFinished)]
    assert finished.status == "cancelled"
    state = rebuild(log)
    assert (state.nodes["chain@1"].status, state.nodes["chain@1/slow@1"].status) == ("cancelled", "cancelled")
    assert store.open_runs() == []  # nothing left "running" with a heartbeat that says it is alive
    assert set(samples(metrics, "flowscope_nodes_running").values()) == {0.0}
    assert (
        samples(metrics, "flowscope_workflow_runs_total")[(("outcome", "cancelled"), ("workflow", "chain"))]
        == 1
    )


async def test_a_sibling_adk_cancelled_and_ran_again_leaves_a_completed_run_completed(store, otel_errors):
    ran: list[str] = []

    async def flaky(node_input: Any) -> str:
        ran.append("flaky")
        await asyncio.sleep(0.05)
        if ran.count("flaky") == 1:
            raise ConnectionError("blip")  # ADK cancels its sibling, then retries the workflow
        return "F"

    async def slow(node_input: Any) -> str:
        ran.append("slow")
        await asyncio.sleep(0.3)
        return "S"

    def tail(node_input: Any) -> None:  # the run's output is None
        ran.append("tail")

    join = JoinNode(name="join")
    inner = Workflow(
        name="inner",
        retry_config=RETRY,
        edges=[
            ("START", FunctionNode(func=flaky, name="flaky"), join),
            ("START", FunctionNode(func=slow, name="slow"), join),
        ],
    )
    d = Driver(
        Workflow(name="outer", edges=[("START", inner, FunctionNode(func=tail, name="tail"))]),
        FlowscopeADK(store),
    )
    await d.start()
    assert sorted(ran) == ["flaky", "flaky", "slow", "slow", "tail"]
    log = store.read(d.session_id)
    [finished] = [e for e in log if isinstance(e, RunFinished)]
    assert finished.status == "completed"  # the cancelled sibling ran again: nobody stopped reading
    state = rebuild(log)
    assert state.nodes["outer@1"].status == "completed" and state.nodes["outer@1/inner@1/slow@1"].attempt == 2


@pytest.mark.filterwarnings("ignore::DeprecationWarning", "ignore::UserWarning")
@pytest.mark.parametrize("kind", ["SequentialAgent", "ParallelAgent", "LoopAgent"])
def test_instrument_refuses_an_agent_as_the_root_and_says_how_to_make_it_a_node(store, kind):
    import google.adk.agents as agents

    class Say(BaseAgent):
        async def _run_async_impl(self, ctx: Any) -> AsyncGenerator[Any, None]:
            yield Event(author=self.name, content=types.Content(role="model", parts=[types.Part(text="hi")]))

    options = {"max_iterations": 1} if kind == "LoopAgent" else {}
    root = getattr(agents, kind)(name="root", sub_agents=[Say(name="a")], **options)
    with pytest.raises(
        UnobservableNodeError,
        match=f"^{kind} 'root' is not an ADK Workflow: .*edges=\\[\\(START, agent\\)\\]",
    ):
        FlowscopeADK(store).instrument(root)
    FlowscopeADK(store).instrument(Workflow(name="outer", edges=[("START", root)]))  # as a node it is one run


@pytest.mark.parametrize(
    "attempts, child_timeout",
    [(1, None), (2, None), (2, 20.0)],
    ids=["final", "retried", "retried-child-timeout"],
)
async def test_a_nested_workflow_that_overruns_its_timeout_is_a_timeout_of_its_own_run(
    store, otel_errors, attempts, child_timeout
):
    # ADK cancels the workflow's children, then raises its NodeTimeoutError outside them:
    # the engine's record (a child cancelled, the workflow's own timeout retried or final,
    # the root's failure propagated from it), whether or not the child has a timeout too
    ran = {"work": 0}

    async def work(node_input: Any) -> str:
        ran["work"] += 1
        await asyncio.sleep(5)
        return "W"

    retry = RetryConfig(max_attempts=attempts, initial_delay=0.0, jitter=0.0)
    child = FunctionNode(func=work, name="work", **({"timeout": child_timeout} if child_timeout else {}))
    inner = Workflow(name="inner", timeout=0.1, retry_config=retry, edges=[("START", child)])
    bridge, metrics = observed(store)
    d = Driver(Workflow(name="outer", edges=[("START", inner)]), bridge)
    with pytest.raises(Exception) as raised:
        await d.start()
    assert type(raised.value).__name__ == "NodeTimeoutError" and ran == {"work": attempts}
    inner_path, work_path = "outer@1/inner@1", "outer@1/inner@1/work@1"
    tried: list[tuple[str, str, Any]] = []
    for attempt in range(1, attempts + 1):
        tried += [("NodeStarted", work_path, attempt), ("NodeCancelled", work_path, "cancelled")]
        if attempt < attempts:  # the last attempt's timeout is the run's failure
            tried.append(("NodeRetrying", inner_path, (attempt, "NodeTimeoutError", "NODE_TIMEOUT")))
    expected = [
        ("RunStarted", "", None),
        ("NodeStarted", "outer@1", 1),
        ("NodeStarted", inner_path, 1),
        *tried,
        ("NodeErrorEvent", inner_path, (attempts, "NodeTimeoutError", "NODE_TIMEOUT")),
        ("NodeErrorPropagated", "outer@1", (inner_path, 1, "NodeTimeoutError", "NODE_TIMEOUT")),
        ("RunFinished", "", ("failed", inner_path, "NODE_TIMEOUT")),
    ]

    log = store.read(d.session_id)
    assert record(log) == expected
    [err] = [e for e in log if isinstance(e, NodeErrorEvent)]
    assert err.error_message == str(raised.value)
    state = rebuild(log)
    assert {p: n.status for p, n in state.nodes.items()} == {
        "outer@1": "failed",
        inner_path: "failed",
        work_path: "cancelled",
    }
    runs = samples(metrics, "flowscope_node_runs_total")
    assert runs[(("node", "inner"), ("outcome", "timeout"), ("workflow", "outer"))] == 1
    assert runs[(("node", "work"), ("outcome", "cancellation"), ("workflow", "outer"))] == attempts
    assert otel_errors() == []


def record(log: list[Any]) -> list[tuple[str, str, Any]]:
    """A log as (event, path, what it says), to compare the bridge's with the engine's."""

    def detail(e: Any) -> Any:
        if isinstance(e, NodeStarted):
            return e.attempt
        if isinstance(e, NodeRetrying):
            return (e.attempt, e.error_type, e.error_code)
        if isinstance(e, NodeErrorEvent):
            return (e.attempt_count, e.error_type, e.error_code)
        if isinstance(e, NodeErrorPropagated):
            return (e.origin_path, e.attempt_count, e.error_type, e.error_code)
        if isinstance(e, NodeCompleted):
            return e.output
        if isinstance(e, RunFinished):
            return (e.status, e.error_path, e.error_code)
        return getattr(e, "reason", None)

    return [(type(e).__name__, getattr(e, "path", ""), detail(e)) for e in log]


@pytest.mark.slow  # ADK and the engine each wait out two to four timeouts
@pytest.mark.parametrize("shape", ["timeout", "failure", "retried-timeout"])
async def test_a_nested_workflow_run_again_by_an_enclosing_retry_starts_at_its_next_attempt(
    store, otel_errors, shape
):
    # outer -> middle (retry_config) -> inner -> work. The inner workflow's run ends in
    # each run of middle (its own timeout, final or after its own retry; or work's failure
    # propagated through it) before middle's NodeRetrying, and ADK's next run of middle
    # starts it again at its next attempt: the record flowscope's engine makes of the same
    # graph (checked below), in which a path's attempt numbers never go back
    async def slow(node_input: Any) -> str:
        await asyncio.sleep(5)
        return "W"

    def failing(node_input: Any) -> str:
        raise ConnectionError("upstream down")

    body, timeout = (failing, None) if shape == "failure" else (slow, 0.05)
    twice = RetryConfig(max_attempts=2, initial_delay=0.0, jitter=0.0)
    own_retry = twice if shape == "retried-timeout" else None
    inner = Workflow(
        name="inner",
        timeout=timeout,
        retry_config=own_retry,
        edges=[("START", FunctionNode(func=body, name="work"))],
    )
    middle = Workflow(name="middle", retry_config=twice, edges=[("START", inner)])
    bridge, _metrics = observed(store)
    d = Driver(Workflow(name="outer", edges=[("START", middle)]), bridge)
    with pytest.raises(ConnectionError if shape == "failure" else AdkTimeout):
        await d.start()

    m, i, w = "outer@1/middle@1", "outer@1/middle@1/inner@1", "outer@1/middle@1/inner@1/work@1"
    failed = (
        ("ConnectionError", "UNKNOWN_ERROR") if shape == "failure" else ("NodeTimeoutError", "NODE_TIMEOUT")
    )
    origin = w if shape == "failure" else i

    def inner_run(attempt: int, work: int) -> list[tuple[str, str, Any]]:
        """Inner's run from ``attempt`` (work's from ``work``), to its end."""
        if shape == "failure":
            return [
                ("NodeStarted", i, attempt),
                ("NodeStarted", w, work),
                ("NodeErrorEvent", w, (work, *failed)),
                ("NodeErrorPropagated", i, (w, attempt, *failed)),
            ]
        tries = [("NodeStarted", i, attempt), ("NodeStarted", w, work), ("NodeCancelled", w, "cancelled")]
        if shape == "retried-timeout":  # inner's own retry: work's attempts go on inside this run
            tries += [
                ("NodeRetrying", i, (attempt, *failed)),
                ("NodeStarted", w, work + 1),
                ("NodeCancelled", w, "cancelled"),
            ]
            attempt += 1
        return [*tries, ("NodeErrorEvent", i, (attempt, *failed))]

    again = 3 if shape == "retried-timeout" else 2  # the attempt after the last one that ended
    expected = [
        ("RunStarted", "", None),
        ("NodeStarted", "outer@1", 1),
        ("NodeStarted", m, 1),
        *inner_run(1, 1),
        ("NodeRetrying", m, (1, *failed)),
        *inner_run(again, again),
        ("NodeErrorPropagated", m, (origin, 2, *failed)),
        ("NodeErrorPropagated", "outer@1", (origin, 1, *failed)),
        ("RunFinished", "", ("failed", origin, failed[1])),
    ]

    log = store.read(d.session_id)
    assert record(log) == expected
    last = 2 * again - 2  # inner's (and work's) last attempt
    assert {p: (n.status, n.attempt) for p, n in rebuild(log).nodes.items()} == {
        "outer@1": ("failed", 1),
        m: ("failed", 2),
        i: ("failed", last),
        w: ("failed" if shape == "failure" else "cancelled", last),
    }
    assert otel_errors() == []

    # the reference: flowscope's own engine running the same graph (the same function)
    start = flowscope.START
    engine_twice = flowscope.RetryConfig(max_attempts=2, initial_delay=0.0, jitter=0.0)
    work = flowscope.node(body, name="work")
    ref_inner = flowscope.Workflow(
        "inner", [(start, work)], timeout=timeout, retry=engine_twice if own_retry else None
    )
    ref_root = flowscope.Workflow(
        "outer", [(start, flowscope.Workflow("middle", [(start, ref_inner)], retry=engine_twice))]
    )
    ref_store = MemoryEventStore()
    with pytest.raises(ConnectionError if shape == "failure" else EngineTimeout):
        await flowscope.Runner(ref_root, ref_store).run(session_id="ref")
    assert record(ref_store.read("ref")) == expected


@pytest.mark.parametrize("shape", ["retried", "final"])
async def test_a_sibling_of_a_retried_failure_ends_cancelled_before_the_retry_and_starts_again(
    store, otel_errors, shape
):
    # outer -> middle (retry_config) -> flaky || side (a nested workflow) -> slow. flaky's
    # failure makes ADK cancel side and what runs in it, then retry middle: slow and side
    # end cancelled because a sibling failed, before middle's NodeRetrying, and ADK's next
    # run of middle starts side again at its next attempt; flaky's second failure ("final")
    # ends them so again, then middle and outer fail: the engine's record of the same graph
    calls: list[str] = []

    async def flaky(node_input: Any) -> str:
        calls.append("flaky")
        await asyncio.sleep(0.05)
        if shape == "final" or calls.count("flaky") == 1:
            raise ConnectionError("upstream down")
        return "F"

    async def slow(node_input: Any) -> str:
        await asyncio.sleep(0.5)
        return "S"

    twice = RetryConfig(max_attempts=2, initial_delay=0.0, jitter=0.0)
    side = Workflow(name="side", edges=[("START", FunctionNode(func=slow, name="slow"))])
    join = JoinNode(name="join")
    middle = Workflow(
        name="middle",
        retry_config=twice,
        edges=[("START", FunctionNode(func=flaky, name="flaky"), join), ("START", side, join)],
    )
    bridge, _metrics = observed(store)
    d = Driver(Workflow(name="outer", edges=[("START", middle)]), bridge)
    if shape == "final":
        with pytest.raises(ConnectionError):
            await d.start()
    else:
        await d.start()

    m = "outer@1/middle@1"
    f, s, sl, j = f"{m}/flaky@1", f"{m}/side@1", f"{m}/side@1/slow@1", f"{m}/join@1"
    failed = ("ConnectionError", "UNKNOWN_ERROR")
    first_run = [
        ("NodeStarted", f, 1),
        ("NodeStarted", s, 1),
        ("NodeStarted", sl, 1),
        ("NodeErrorEvent", f, (1, *failed)),
        ("NodeCancelled", sl, "sibling_failed"),
        ("NodeCancelled", s, "sibling_failed"),
    ]
    second_start = [("NodeStarted", f, 2), ("NodeStarted", s, 2), ("NodeStarted", sl, 2)]
    joined = {"flaky": "F", "side": "S"}
    second_end = (
        [
            ("NodeCompleted", f, "F"),
            ("NodeCompleted", sl, "S"),
            ("NodeCompleted", s, "S"),
            ("NodeStarted", j, 1),
            ("NodeCompleted", j, joined),
            ("NodeCompleted", m, joined),
            ("NodeCompleted", "outer@1", joined),
            ("RunFinished", "", ("completed", None, None)),
        ]
        if shape == "retried"
        else [
            ("NodeErrorEvent", f, (2, *failed)),
            ("NodeCancelled", sl, "sibling_failed"),
            ("NodeCancelled", s, "sibling_failed"),
            ("NodeErrorPropagated", m, (f, 2, *failed)),
            ("NodeErrorPropagated", "outer@1", (f, 1, *failed)),
            ("RunFinished", "", ("failed", f, failed[1])),
        ]
    )
    expected = [
        ("RunStarted", "", None),
        ("NodeStarted", "outer@1", 1),
        ("NodeStarted", m, 1),
        *first_run,
        ("NodeRetrying", m, (1, *failed)),
        *second_start,
        *second_end,
    ]
    log = store.read(d.session_id)
    assert record(log) == expected
    ended = "completed" if shape == "retried" else "cancelled"
    assert {p: (n.status, n.attempt) for p, n in rebuild(log).nodes.items() if p.startswith(s)} == {
        s: (ended, 2),
        sl: (ended, 2),
    }
    assert otel_errors() == []

    # the reference: flowscope's own engine running the same graph (the same functions)
    calls.clear()
    start = flowscope.START
    ref_side = flowscope.Workflow("side", [(start, flowscope.node(slow, name="slow"))])
    ref_middle = flowscope.Workflow(
        "middle",
        [(start, (flowscope.node(flaky, name="flaky"), ref_side), flowscope.JoinNode("join"))],
        retry=flowscope.RetryConfig(max_attempts=2, initial_delay=0.0, jitter=0.0),
    )
    ref_store = MemoryEventStore()
    run = flowscope.Runner(flowscope.Workflow("outer", [(start, ref_middle)]), ref_store).run(
        session_id="ref"
    )
    if shape == "final":
        with pytest.raises(ConnectionError):
            await run
    else:
        await run
    assert record(ref_store.read("ref")) == expected
